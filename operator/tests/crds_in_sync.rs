//! `crds/` must be exactly what the Rust types generate.

use std::path::Path;

#[test]
fn committed_crds_match_the_rust_types() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crds");
    let rendered = herald_operator::crdgen::render_all().unwrap();
    let mut stale = Vec::new();
    for (file, yaml) in &rendered {
        let committed = std::fs::read_to_string(dir.join(file)).unwrap_or_default();
        if &committed != yaml {
            stale.push(*file);
        }
    }
    let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".yaml"))
        .collect();
    on_disk.sort();
    let mut expected: Vec<String> = rendered.iter().map(|(f, _)| f.to_string()).collect();
    expected.sort();
    assert_eq!(
        on_disk, expected,
        "crds/ holds files the types do not generate"
    );
    assert!(
        stale.is_empty(),
        "crds/ is out of date for {stale:?}; run `make crds` and commit the result"
    );
}
