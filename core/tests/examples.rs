//! Every manifest under `examples/` parses into the API types, so examples cannot rot.
//! (The API server's own validation of them is checked by the e2e tests.)

use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use serde_json::Value;

#[test]
fn examples_parse_as_herald_resources() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "yaml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        for doc in text.split("\n---\n") {
            let value: Value = serde_norway::from_str(doc).unwrap();
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
        seen >= 4,
        "expected the examples to hold at least 4 resources, found {seen}"
    );
}
