//! Are Herald's CRDs installed, established, and the ones this plugin was built with?
//!
//! The CRDs carry no version label, so "the version this plugin expects" is the CRD
//! itself: each one is compared with the CRD generated from the Rust types compiled into
//! the plugin (`herald_core::v1alpha1`, the same types `crds/` and the chart's CRDs are
//! generated from): the API versions served and stored, then each version's schema,
//! subresources and printer columns, and the names. Descriptions are left out (they are
//! documentation, reflowed on the way into `crds/`), and so is what the API server drops
//! when it stores a CRD (`false` flags, empty lists and maps). Pure: the installed CRD is
//! passed in.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt as _;
use serde_json::{Map, Value};

use super::report::Verdict;
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};

/// The CRDs this plugin was built with.
pub fn expected() -> Vec<CustomResourceDefinition> {
    vec![
        WebhookEndpoint::crd(),
        SigningSecret::crd(),
        WebhookReplay::crd(),
    ]
}

/// What to do when the CRDs are missing or differ.
const UPGRADE: &str = "install or upgrade the chart's CRDs (crds.install=true, the default) to the release of this plugin, or use the kubectl-herald of the installed release";

/// The verdict on one CRD: `installed` is what the API server has (`None`: no such CRD;
/// `Err`: it could not be read).
pub fn verdict(
    expected: &CustomResourceDefinition,
    installed: &Result<Option<CustomResourceDefinition>, String>,
) -> Verdict {
    let name = expected.metadata.name.clone().unwrap_or_default();
    let check = format!("crd/{name}");
    let installed = match installed {
        Err(error) => return Verdict::fail(check, format!("cannot read the CRD: {error}")),
        Ok(None) => return Verdict::fail(check, format!("not installed: {UPGRADE}")),
        Ok(Some(crd)) => crd,
    };
    if let Some(problem) = not_established(installed) {
        return Verdict::fail(check, problem);
    }
    let group = &expected.spec.group;
    let mut served = Vec::new();
    for version in &expected.spec.versions {
        let v = &version.name;
        let Some(theirs) = installed.spec.versions.iter().find(|t| &t.name == v) else {
            let has: Vec<&str> = installed
                .spec
                .versions
                .iter()
                .map(|t| t.name.as_str())
                .collect();
            return Verdict::fail(
                check,
                format!(
                    "has no version {group}/{v} (only {}): {UPGRADE}",
                    has.join(", ")
                ),
            );
        };
        if version.served && !theirs.served {
            return Verdict::fail(check, format!("{group}/{v} is not served: {UPGRADE}"));
        }
        if version.storage && !theirs.storage {
            let stored = installed
                .spec
                .versions
                .iter()
                .find(|t| t.storage)
                .map(|t| t.name.as_str())
                .unwrap_or("none");
            return Verdict::fail(
                check,
                format!("stores {group}/{stored}, this plugin expects {group}/{v}: {UPGRADE}"),
            );
        }
        let ours = comparable_version(serde_json::to_value(version).unwrap_or_default());
        let theirs = comparable_version(serde_json::to_value(theirs).unwrap_or_default());
        if let Some(difference) = first_difference(&ours, &theirs) {
            return Verdict::fail(
                check,
                format!("{group}/{v} differs from this plugin's: {difference}: {UPGRADE}"),
            );
        }
        served.push(format!("{group}/{v}"));
    }
    let ours = comparable_names(serde_json::to_value(&expected.spec.names).unwrap_or_default());
    let theirs = comparable_names(serde_json::to_value(&installed.spec.names).unwrap_or_default());
    if let Some(difference) = first_difference(&ours, &theirs) {
        return Verdict::fail(
            check,
            format!("its names differ from this plugin's: names.{difference}: {UPGRADE}"),
        );
    }
    Verdict::ok(
        check,
        format!(
            "{} served and stored, schema as this plugin expects",
            served.join(", ")
        ),
    )
}

/// Why the API server does not serve the CRD yet, if it does not (a name conflict, or
/// it was just created or is being deleted).
fn not_established(crd: &CustomResourceDefinition) -> Option<String> {
    if crd.metadata.deletion_timestamp.is_some() {
        return Some(format!("being deleted: {UPGRADE}"));
    }
    let conditions = crd
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default();
    let condition = |kind: &str| conditions.iter().find(|c| c.type_ == kind);
    if let Some(names) = condition("NamesAccepted")
        && names.status == "False"
    {
        return Some(format!(
            "its names are not accepted: {} (another CRD takes them)",
            names.message.as_deref().unwrap_or_default()
        ));
    }
    match condition("Established") {
        Some(c) if c.status == "True" => None,
        Some(c) => Some(format!(
            "not Established ({}): the API server does not serve it yet",
            c.message.as_deref().unwrap_or_default()
        )),
        None => Some("not Established yet: the API server does not serve it yet".into()),
    }
}

/// A CRD version without what [`verdict`] checks apart (served, storage) and what does
/// not change behaviour (deprecation texts), normalized.
fn comparable_version(mut version: Value) -> Value {
    if let Value::Object(map) = &mut version {
        for key in [
            "name",
            "served",
            "storage",
            "deprecated",
            "deprecationWarning",
        ] {
            map.remove(key);
        }
    }
    normalize(version)
}

/// A CRD's names with the defaults the API server fills in (`singular`: the kind in
/// lower case, `listKind`: the kind and `List`), normalized.
fn comparable_names(mut names: Value) -> Value {
    if let Value::Object(map) = &mut names
        && let Some(kind) = map.get("kind").and_then(Value::as_str).map(str::to_owned)
    {
        map.entry("singular")
            .or_insert_with(|| Value::String(kind.to_lowercase()));
        map.entry("listKind")
            .or_insert_with(|| Value::String(format!("{kind}List")));
    }
    normalize(names)
}

/// Flags the API server omits when `false` (Go `bool` with `omitempty`).
const OMITTED_WHEN_FALSE: &[&str] = &[
    "nullable",
    "uniqueItems",
    "exclusiveMaximum",
    "exclusiveMinimum",
    "x-kubernetes-embedded-resource",
    "x-kubernetes-int-or-string",
];

/// Descriptions removed, and everything the API server does not keep: `false` flags,
/// empty lists and maps, nulls. Applied to both sides, so it can only make the
/// comparison less strict, never report a difference that is not there.
fn normalize(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut out = Map::new();
            for (key, child) in map {
                if key == "description" {
                    continue;
                }
                if OMITTED_WHEN_FALSE.contains(&key.as_str()) && child == Value::Bool(false) {
                    continue;
                }
                let child = normalize(child);
                let empty = match &child {
                    Value::Null => true,
                    Value::Array(items) => items.is_empty(),
                    Value::Object(map) => map.is_empty() && key != "status",
                    _ => false,
                };
                if !empty {
                    out.insert(key, child);
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.into_iter().map(normalize).collect()),
        other => other,
    }
}

/// Where `ours` and `theirs` first differ, as a person reads it: the field path inside
/// the schema (`spec.delivery.timeout`), the keyword that differs (`pattern`), and which
/// side has what the other lacks.
fn first_difference(ours: &Value, theirs: &Value) -> Option<String> {
    let mut path = Vec::new();
    walk(ours, theirs, &mut path)
}

fn walk(ours: &Value, theirs: &Value, path: &mut Vec<String>) -> Option<String> {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
            keys.sort();
            keys.dedup();
            for key in keys {
                path.push(key.clone());
                let found = match (a.get(key), b.get(key)) {
                    (Some(x), Some(y)) => walk(x, y, path),
                    (Some(_), None) => Some(format!("{} is only in this plugin's", render(path))),
                    (None, Some(_)) => Some(format!("{} is only in the cluster's", render(path))),
                    (None, None) => None,
                };
                path.pop();
                if found.is_some() {
                    return found;
                }
            }
            None
        }
        (a, b) if a == b => None,
        (a, b) => Some(format!(
            "{} is {} here and {} in the cluster",
            render(path),
            short(a),
            short(b)
        )),
    }
}

/// A JSON path through a CRD version as field names: `schema.openAPIV3Schema.properties.
/// spec.properties.url.pattern` reads `spec.url (pattern)`.
fn render(path: &[String]) -> String {
    let mut fields: Vec<String> = Vec::new();
    let mut keyword = None;
    let mut segments = path.iter().peekable();
    while let Some(segment) = segments.next() {
        match segment.as_str() {
            "schema" | "openAPIV3Schema" => {}
            "properties" => {
                if let Some(field) = segments.next() {
                    fields.push(field.clone());
                    keyword = None;
                } else {
                    keyword = Some("properties".to_owned());
                }
            }
            "items" => {
                if let Some(last) = fields.last_mut() {
                    last.push_str("[]");
                } else {
                    fields.push("[]".into());
                }
                keyword = None;
            }
            other => match &mut keyword {
                None => keyword = Some(other.to_owned()),
                Some(k) => {
                    k.push('.');
                    k.push_str(other);
                }
            },
        }
    }
    match (fields.is_empty(), keyword) {
        (true, None) => "the schema".into(),
        (true, Some(k)) => k,
        (false, None) => format!("field {}", fields.join(".")),
        (false, Some(k)) => format!("field {} ({k})", fields.join(".")),
    }
}

/// A value cut short for a message.
fn short(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        format!("{}…", text.chars().take(59).collect::<String>())
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;
    use serde_json::json;

    fn endpoint_crd() -> CustomResourceDefinition {
        expected().remove(0)
    }

    /// The CRD as the API server hands it back: stored with its descriptions reflowed,
    /// Established.
    fn installed(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
        let mut value = serde_json::to_value(&crd).unwrap();
        reword_descriptions(&mut value);
        // What the API server fills in.
        let kind = value["spec"]["names"]["kind"].as_str().unwrap().to_owned();
        value["spec"]["names"]["listKind"] = json!(format!("{kind}List"));
        value["spec"]["names"]["singular"] = json!(kind.to_lowercase());
        crd = serde_json::from_value(value).unwrap();
        crd.status = serde_json::from_value(json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": "2026-01-01T00:00:00Z"},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]
        }))
        .unwrap();
        crd
    }

    fn reword_descriptions(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, child) in map.iter_mut() {
                    if key == "description" {
                        *child = json!("reworded");
                    } else {
                        reword_descriptions(child);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(reword_descriptions),
            _ => {}
        }
    }

    /// `f` applied to the installed CRD's JSON.
    fn altered(f: impl FnOnce(&mut Value)) -> CustomResourceDefinition {
        let mut value = serde_json::to_value(installed(endpoint_crd())).unwrap();
        f(&mut value);
        serde_json::from_value(value).unwrap()
    }

    fn spec_schema(value: &mut Value) -> &mut Value {
        &mut value["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    }

    #[test]
    fn the_generated_crd_installed_is_ok_whatever_its_descriptions() {
        for crd in expected() {
            let v = verdict(&crd, &Ok(Some(installed(crd.clone()))));
            assert_eq!(v.status, Status::Ok, "{v:?}");
            assert!(
                v.message
                    .starts_with("herald.dev/v1alpha1 served and stored")
            );
        }
    }

    #[test]
    fn what_the_api_server_drops_is_no_difference() {
        let stripped = altered(|crd| {
            fn strip(value: &mut Value) {
                if let Value::Object(map) = value {
                    map.retain(|k, v| !(k == "nullable" && *v == json!(false)));
                    map.values_mut().for_each(strip);
                }
            }
            strip(crd);
        });
        let crd = endpoint_crd();
        let mut value = serde_json::to_value(&crd).unwrap();
        spec_schema(&mut value)["properties"]["url"]["nullable"] = json!(false);
        let with_false: CustomResourceDefinition = serde_json::from_value(value).unwrap();
        assert_eq!(verdict(&with_false, &Ok(Some(stripped))).status, Status::Ok);
    }

    #[test]
    fn missing_unreadable_or_not_established_crds_fail_with_what_to_do() {
        let crd = endpoint_crd();
        let v = verdict(&crd, &Ok(None));
        assert_eq!(v.check, "crd/webhookendpoints.herald.dev");
        assert_eq!(v.status, Status::Fail);
        assert!(
            v.message
                .starts_with("not installed: install or upgrade the chart's CRDs")
        );
        let v = verdict(&crd, &Err("forbidden".into()));
        assert_eq!(v.message, "cannot read the CRD: forbidden");
        let pending = altered(|crd| {
            crd["status"]["conditions"][1]["status"] = json!("False");
            crd["status"]["conditions"][1]["message"] = json!("not yet");
        });
        let v = verdict(&crd, &Ok(Some(pending)));
        assert!(v.message.starts_with("not Established (not yet)"), "{v:?}");
        let conflict = altered(|crd| {
            crd["status"]["conditions"][0]["status"] = json!("False");
            crd["status"]["conditions"][0]["message"] = json!("\"whe\" is already in use");
        });
        let v = verdict(&crd, &Ok(Some(conflict)));
        assert!(v.message.contains("names are not accepted"), "{v:?}");
    }

    #[test]
    fn another_version_or_storage_version_fails() {
        let crd = endpoint_crd();
        let renamed = altered(|crd| crd["spec"]["versions"][0]["name"] = json!("v1beta1"));
        let v = verdict(&crd, &Ok(Some(renamed)));
        assert!(
            v.message
                .starts_with("has no version herald.dev/v1alpha1 (only v1beta1)"),
            "{v:?}"
        );
        let unserved = altered(|crd| crd["spec"]["versions"][0]["served"] = json!(false));
        let v = verdict(&crd, &Ok(Some(unserved)));
        assert!(v.message.starts_with("herald.dev/v1alpha1 is not served"));
        let other_storage = altered(|crd| {
            let mut v2 = crd["spec"]["versions"][0].clone();
            v2["name"] = json!("v1alpha2");
            crd["spec"]["versions"][0]["storage"] = json!(false);
            crd["spec"]["versions"].as_array_mut().unwrap().push(v2);
        });
        let v = verdict(&crd, &Ok(Some(other_storage)));
        assert!(
            v.message
                .starts_with("stores herald.dev/v1alpha2, this plugin expects herald.dev/v1alpha1"),
            "{v:?}"
        );
    }

    /// A change made to the installed CRD's JSON.
    type Change = Box<dyn FnOnce(&mut Value)>;

    #[test]
    fn a_changed_schema_names_the_field_and_says_upgrade() {
        let crd = endpoint_crd();
        let cases: [(&str, Change); 4] = [
            (
                "field spec.url is only in this plugin's",
                Box::new(|crd| {
                    spec_schema(crd)["properties"]
                        .as_object_mut()
                        .unwrap()
                        .remove("url");
                }),
            ),
            (
                "field spec.legacyField is only in the cluster's",
                Box::new(|crd| {
                    spec_schema(crd)["properties"]["legacyField"] = json!({"type": "string"});
                }),
            ),
            (
                "field spec.url (type) is \"string\" here and \"integer\" in the cluster",
                Box::new(|crd| spec_schema(crd)["properties"]["url"]["type"] = json!("integer")),
            ),
            (
                "field spec.eventTypes[] (maxLength)",
                Box::new(|crd| {
                    spec_schema(crd)["properties"]["eventTypes"]["items"]["maxLength"] = json!(7)
                }),
            ),
        ];
        for (expected, change) in cases {
            let v = verdict(&crd, &Ok(Some(altered(change))));
            assert_eq!(v.status, Status::Fail);
            assert!(
                v.message.starts_with(&format!(
                    "herald.dev/v1alpha1 differs from this plugin's: {expected}"
                )),
                "{expected}: {v:?}"
            );
            assert!(v.message.ends_with(UPGRADE), "{v:?}");
        }
        let columns = altered(|crd| {
            crd["spec"]["versions"][0]["additionalPrinterColumns"][0]["jsonPath"] =
                json!(".status.phase")
        });
        let v = verdict(&crd, &Ok(Some(columns)));
        assert!(v.message.contains("additionalPrinterColumns"), "{v:?}");
        let names = altered(|crd| crd["spec"]["names"]["shortNames"] = json!(["wh"]));
        let v = verdict(&crd, &Ok(Some(names)));
        assert!(v.message.contains("names.shortNames"), "{v:?}");
    }
}
