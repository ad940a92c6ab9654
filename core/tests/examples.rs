//! Every Herald manifest under `examples/` parses into the API types, so examples cannot
//! rot. (The API server's own validation of them is checked by `e2e/tests/examples.rs`.)
//! Kustomizations and the GitOps tools' own resources (Argo CD, Flux) are skipped here.

use std::path::{Path, PathBuf};

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use serde_json::Value;

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            yaml_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "yaml") {
            out.push(path);
        }
    }
}

#[test]
fn examples_parse_as_herald_resources() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut files = Vec::new();
    yaml_files(&dir, &mut files);
    let mut seen = 0;
    for path in files {
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in text.split("\n---\n") {
            let value: Value = serde_norway::from_str(doc).unwrap();
            let api_version = value["apiVersion"].as_str().unwrap_or_default();
            if !api_version.starts_with("herald.dev/") {
                continue;
            }
            let kind = value["kind"].as_str().unwrap_or_default().to_owned();
            let parsed = match kind.as_str() {
                "WebhookEndpoint" => serde_json::from_value::<WebhookEndpoint>(value).map(drop),
                "SigningSecret" => serde_json::from_value::<SigningSecret>(value).map(drop),
                "WebhookReplay" => serde_json::from_value::<WebhookReplay>(value).map(drop),
                other => panic!("{}: unexpected kind {other:?}", path.display()),
            };
            parsed.unwrap_or_else(|e| panic!("{} ({kind}): {e}", path.display()));
            seen += 1;
        }
    }
    assert!(
        seen >= 6,
        "expected the examples to hold at least 6 Herald resources, found {seen}"
    );
}
