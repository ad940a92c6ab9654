//! `rotate SIGNINGSECRET`: rotates a tenant's signing key now and waits until the status
//! shows the new key.
//!
//! The request is the resource's own "rotate now" field, `spec.rotation.request`, set to
//! a value it has not had (the time now, unless `--request` gives one): the operator
//! rotates once per distinct value and records the one it acted on in
//! `status.observedRotationRequest`. The plugin patches that one field with a merge
//! patch (nothing else of the spec changes, so GitOps tools see one field drift, which
//! is what a manual rotation is) and watches the status. [`rotated`] is pure.

use futures::StreamExt;
use herald_core::v1alpha1::{SigningSecret, SigningSecretStatus};
use jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

/// Flags of `rotate`.
#[derive(Clone, Debug, clap::Args)]
pub struct RotateArgs {
    /// The SigningSecret whose key to rotate.
    pub signing_secret: String,
    /// The value of `spec.rotation.request` (default: the time now); rotation happens
    /// once per distinct value.
    #[arg(long, value_name = "VALUE")]
    pub request: Option<String>,
    /// Request the rotation and return, without waiting for the new key.
    #[arg(long)]
    pub no_wait: bool,
    /// Give up waiting after this long.
    #[arg(long, default_value = "2m", value_parser = crate::time::parse_duration)]
    pub timeout: std::time::Duration,
}

/// The merge patch that asks for a rotation.
pub fn patch(request: &str) -> serde_json::Value {
    serde_json::json!({"spec": {"rotation": {"request": request}}})
}

/// The new key's id once the status shows that the operator acted on `request`.
pub fn rotated<'a>(status: &'a SigningSecretStatus, request: &str) -> Option<&'a str> {
    if status.observed_rotation_request.as_deref() != Some(request) {
        return None;
    }
    status.active_key_id.as_deref()
}

/// `rotate`. Returns whether the new key is in place (or, with `--no-wait`, requested).
pub async fn run(client: Client, namespace: &str, args: &RotateArgs) -> Result<bool, crate::Error> {
    let RotateArgs {
        signing_secret: name,
        request,
        no_wait,
        timeout,
    } = args;
    let api: Api<SigningSecret> = Api::namespaced(client, namespace);
    let before = api.get(name).await?;
    let old_key = before.status.as_ref().and_then(|s| s.active_key_id.clone());
    let request = request
        .clone()
        .unwrap_or_else(|| Timestamp::now().to_string());
    if before.spec.rotation.request.as_deref() == Some(request.as_str()) {
        return Err(crate::Error::Usage(format!(
            "signingsecret {name} already has rotation request {request:?}; a rotation needs a new value"
        )));
    }
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(patch(&request)),
    )
    .await?;
    println!("signingsecret.herald.dev/{name} rotation requested ({request})");
    if *no_wait {
        return Ok(true);
    }
    let wait = async {
        let mut changes = std::pin::pin!(kube::runtime::watcher::watch_object(api.clone(), name));
        while let Some(change) = changes.next().await {
            let change = change
                .map_err(|e| crate::Error::Usage(format!("watching the signing secret: {e}")))?;
            let Some(secret) = change else {
                return Err(crate::Error::Usage(format!(
                    "signingsecret {name} was deleted"
                )));
            };
            let status = secret.status.unwrap_or_default();
            if let Some(key) = rotated(&status, &request) {
                let old = old_key.as_deref().unwrap_or("none");
                println!("active key {key} (was {old})");
                if let Some(until) = &status.previous_key_valid_until {
                    println!("the previous key {old} keeps signing until {}", until.0);
                }
                return Ok(true);
            }
        }
        Ok(false)
    };
    match tokio::time::timeout(*timeout, wait).await {
        Ok(done) => done,
        Err(_) => Err(crate::Error::Usage(format!(
            "the status of signingsecret {name} did not show the rotation within {timeout:?}; is herald-operator running? (kubectl describe signingsecret {name} -n {namespace})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_touches_only_the_request() {
        assert_eq!(
            patch("2026-12-01T12:00:00Z"),
            serde_json::json!({"spec": {"rotation": {"request": "2026-12-01T12:00:00Z"}}})
        );
    }

    #[test]
    fn rotated_once_the_operator_acted_on_this_request() {
        let mut s = SigningSecretStatus {
            active_key_id: Some("aaaaaaaaaaaa".into()),
            observed_rotation_request: Some("earlier".into()),
            ..Default::default()
        };
        assert_eq!(rotated(&s, "now"), None);
        s.observed_rotation_request = Some("now".into());
        s.active_key_id = Some("bbbbbbbbbbbb".into());
        assert_eq!(rotated(&s, "now"), Some("bbbbbbbbbbbb"));
    }
}
