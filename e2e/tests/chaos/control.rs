//! The control plane of a soak through the Kubernetes API: endpoints, replays and the
//! signing secret are resources reconciled by two operator replicas (leader election,
//! a 5 s Lease) against the test environment's API server; herald-api runs beside them
//! (in development mode: no credentials, loopback) for HTTP publishing and
//! redeliveries. Every API call is retried until it is done (the API may be blacked
//! out, the leading operator dead) within [`PATIENCE`].

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use herald_core::api::Queued;
use herald_core::dataplane::EndpointKey;
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint, WebhookReplay};
use herald_e2e::chaos::{ConfigChange, OPERATORS};
use herald_e2e::faults::{KvLog, Operators};
use herald_e2e::{TestContext, TestEnv, eventually, free_port, workspace_binary};
use k8s_openapi::api::core::v1::Namespace;
use kube::Resource;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

const OPERATOR: &str = env!("CARGO_BIN_EXE_herald-test-operator");

/// How long one change may take to go through while the API is away or the operators
/// elect a leader.
const PATIENCE: Duration = Duration::from_secs(90);
/// One API call.
const CALL: Duration = Duration::from_secs(3);

/// The control plane of one seed.
pub struct Control {
    pub ctx: TestContext,
    pub operators: Operators,
    api: Child,
    pub api_base: String,
    pub http: reqwest::Client,
    /// `ep.<ns>.*` of `herald-config` as the operators write it.
    config: KvLog,
    rotations: u32,
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.api.kill();
        let _ = self.api.wait();
    }
}

impl Control {
    /// A fresh namespace with its `SigningSecret` `signing`, both operator replicas
    /// running, herald-api ready; `label` names the logs.
    pub async fn start(env: &'static TestEnv, label: &str) -> Self {
        let ctx = TestContext::new_in(env, "chaos").await;
        let ns = ctx.namespace.clone();
        let js = async_nats::jetstream::new(ctx.nats.clone());
        let bucket = js
            .get_key_value(herald_core::dataplane::CONFIG_BUCKET)
            .await
            .expect("herald-config");
        let config = KvLog::start(&bucket, &format!("ep.{ns}.>")).await;
        let mut operators = Operators::new(OPERATOR, env, &ns, label);
        for id in OPERATORS {
            operators.start(id);
        }
        let secret: SigningSecret = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "signing"}, "spec": {}
        }))
        .expect("a SigningSecret");
        ctx.api::<SigningSecret>()
            .create(&PostParams::default(), &secret)
            .await
            .expect("creating the SigningSecret");
        let port = free_port();
        let log = std::env::temp_dir().join(format!("herald-fault-{label}-api.log"));
        let file = std::fs::File::create(&log).expect("the API's log");
        let kubeconfig = env.kubeconfig().display().to_string();
        let api = Command::new(workspace_binary("herald-api"))
            .args(["--nats-url", env.nats_url(), "--kubeconfig", &kubeconfig])
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--insecure-dev-no-auth")
            .env("RUST_LOG", "info,herald_api=debug")
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("the log file"))
            .stderr(file)
            .spawn()
            .expect("starting herald-api");
        let control = Self {
            ctx,
            operators,
            api,
            api_base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("an HTTP client"),
            config,
            rotations: 0,
        };
        let (http, url) = (control.http.clone(), format!("{}/readyz", control.api_base));
        eventually("herald-api ready", Duration::from_secs(60), || {
            let (http, url) = (http.clone(), url.clone());
            async move {
                let response = http.get(url).send().await.ok()?;
                response.status().is_success().then_some(())
            }
        })
        .await;
        control
    }

    pub fn ns(&self) -> &str {
        &self.ctx.namespace
    }

    /// Applies endpoint `name` with `spec` (server-side apply: a new spec, or a new
    /// endpoint once any deleted one of that name is gone).
    pub async fn apply(&self, name: &str, spec: Value) {
        let mut spec = spec;
        spec["secretRef"] = json!({"name": "signing"});
        spec["eventTypes"] = json!(["*"]);
        let object = json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name}, "spec": spec,
        });
        let api = self.ctx.api::<WebhookEndpoint>();
        patiently(&format!("applying WebhookEndpoint {name}"), || async {
            // A deleted endpoint waits for its finalizer: apply would edit it, not make
            // a new one.
            if let Some(old) = api.get_opt(name).await.map_err(|e| e.to_string())?
                && old.meta().deletion_timestamp.is_some()
            {
                return Err("the deleted one is not gone yet".to_owned());
            }
            let params = PatchParams::apply("chaos").force();
            api.patch(name, &params, &Patch::Apply(&object))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await;
    }

    pub async fn delete_endpoint(&self, name: &str) {
        delete(&self.ctx.api::<WebhookEndpoint>(), name).await;
    }

    /// A `WebhookReplay` of what was published between the two times to `endpoint`.
    pub async fn replay(&self, name: &str, endpoint: &str, from_ms: u64, to_ms: u64) {
        let time = |ms: u64| {
            jiff::Timestamp::from_second((ms / 1000) as i64)
                .expect("a time")
                .to_string()
        };
        let object: WebhookReplay = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookReplay",
            "metadata": {"name": name},
            "spec": {"endpoint": endpoint, "from": time(from_ms), "to": time(to_ms + 999)},
        }))
        .expect("a WebhookReplay");
        let api = self.ctx.api::<WebhookReplay>();
        patiently(&format!("creating WebhookReplay {name}"), || async {
            match api.create(&PostParams::default(), &object).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await;
    }

    pub async fn delete_replay(&self, name: &str) {
        delete(&self.ctx.api::<WebhookReplay>(), name).await;
    }

    /// Asks for a new signing key (the previous one stays verifiable for the overlap).
    pub async fn rotate(&mut self) {
        self.rotations += 1;
        let patch =
            json!({"metadata": {"annotations": {"herald.dev/rotate": self.rotations.to_string()}}});
        let api = self.ctx.api::<SigningSecret>();
        patiently("asking for a rotation", || async {
            api.patch("signing", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(drop)
                .map_err(|e| e.to_string())
        })
        .await;
    }

    /// Sends `event_id` to endpoint `name` again through herald-api: what it answered.
    pub async fn redeliver(&self, name: &str, event_id: &str) -> Result<(), String> {
        let url = format!(
            "{}/v1/namespaces/{}/endpoints/{name}/redeliver/{event_id}",
            self.api_base,
            self.ns()
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let answer = async {
                let response = self
                    .http
                    .post(&url)
                    .send()
                    .await
                    .map_err(|e| e.to_string())?;
                let status = response.status();
                let body = response.bytes().await.map_err(|e| e.to_string())?;
                if status.as_u16() != 202 {
                    return Err(format!("{status}: {}", String::from_utf8_lossy(&body)));
                }
                serde_json::from_slice::<Queued>(&body)
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
            .await;
            match answer {
                Err(e) if Instant::now() < deadline && !e.starts_with("404") => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                done => return done,
            }
        }
    }

    /// The configuration entry of endpoint `name`, change by change.
    pub fn changes(&self, name: &str) -> Vec<ConfigChange> {
        let key = EndpointKey::new(self.ns(), name).config_key();
        self.config
            .of(&key)
            .into_iter()
            .map(|c| ConfigChange {
                at: c.at,
                url: c
                    .value
                    .as_ref()
                    .and_then(|v| v["url"].as_str().map(str::to_owned)),
                paused: c.value.as_ref().is_some_and(|v| v["paused"] == true),
            })
            .collect()
    }

    /// Waits until endpoint `name` is configured in NATS for `url`, not held.
    pub async fn until_configured(&self, name: &str, url: &str) {
        let key = EndpointKey::new(self.ns(), name).config_key();
        eventually(
            &format!("endpoint {name} configured in NATS"),
            PATIENCE,
            || async {
                let last = self.config.of(&key).pop()?.value?;
                (last["url"] == url && last["held"].is_null()).then_some(())
            },
        )
        .await;
    }

    /// Whether herald-api exited on its own: how.
    pub fn api_exited(&mut self) -> Option<String> {
        match self.api.try_wait() {
            Ok(Some(status)) => Some(status.to_string()),
            _ => None,
        }
    }

    /// Stops the operators and deletes the namespace.
    pub async fn cleanup(&mut self) {
        self.operators.stop_all().await;
        let namespaces = Api::<Namespace>::all(self.ctx.client.clone());
        let _ = namespaces.delete(self.ns(), &DeleteParams::default()).await;
    }
}

async fn delete<K>(api: &Api<K>, name: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    patiently(&format!("deleting {name}"), || async {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
}

/// Runs `call` (each try bounded by [`CALL`]) until it succeeds; panics after
/// [`PATIENCE`].
async fn patiently<F, Fut>(what: &str, mut call: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    loop {
        let error = match tokio::time::timeout(CALL, call()).await {
            Ok(Ok(())) => return,
            Ok(Err(e)) => e,
            Err(_) => format!("no answer within {CALL:?}"),
        };
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: still failing after {PATIENCE:?}: {error}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
