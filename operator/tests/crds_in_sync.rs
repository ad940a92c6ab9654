//! `crds/` and the Helm chart's `templates/crds/` must be exactly what the Rust types
//! generate.

use std::path::Path;

/// Compares `dir` (relative to the repository root) with `rendered`: same files, same
/// bytes.
fn assert_in_sync(dir: &str, rendered: &[(&'static str, String)]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir);
    let mut stale = Vec::new();
    for (file, yaml) in rendered {
        let committed = std::fs::read_to_string(path.join(file)).unwrap_or_default();
        if &committed != yaml {
            stale.push(*file);
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&path)
        .unwrap_or_else(|e| panic!("reading {dir}: {e}; run `make crds`"))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = rendered.iter().map(|(f, _)| f.to_string()).collect();
    expected.sort();
    assert_eq!(
        on_disk, expected,
        "{dir}/ holds files the types do not generate"
    );
    assert!(
        stale.is_empty(),
        "{dir}/ is out of date for {stale:?}; run `make crds` and commit the result"
    );
}

#[test]
fn committed_crds_match_the_rust_types() {
    let rendered = herald_operator::crdgen::render_all().unwrap();
    assert_in_sync("crds", &rendered);
}

#[test]
fn chart_crds_match_the_rust_types() {
    let rendered = herald_operator::crdgen::render_chart_all().unwrap();
    assert_in_sync("charts/herald/templates/crds", &rendered);
    for (file, yaml) in &rendered {
        assert!(
            yaml.starts_with("{{- if .Values.crds.install }}\n")
                && yaml.trim_end().ends_with("{{- end }}"),
            "{file}: not wrapped in crds.install"
        );
        assert!(
            yaml.contains("helm.sh/resource-policy: keep"),
            "{file}: Helm would delete the CRD (and every resource) on uninstall"
        );
    }
}
