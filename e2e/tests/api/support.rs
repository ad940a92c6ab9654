//! The API as a process of its own for `api.rs`, tokens of real ServiceAccounts bound
//! to the roles the chart ships, and the OpenAPI check of every answer.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use herald_e2e::{TestContext, env, eventually, free_port, workspace_binary};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};

pub const WAIT: Duration = Duration::from_secs(60);

/// The tests that load the machine (a long log read back, the hostile-tenant suite,
/// which measures a victim's latency) one at a time.
pub async fn heavy() -> tokio::sync::MutexGuard<'static, ()> {
    static HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    HEAVY.lock().await
}

/// A running `herald-api`, stopped when dropped.
pub struct ApiProcess {
    child: Child,
    /// Its output (at debug level for Herald and kube), removed with it.
    pub log: std::path::PathBuf,
    pub base: String,
    pub http: reqwest::Client,
    openapi: Option<Value>,
}

impl Drop for ApiProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The command line of the API against the test environment on a free loopback port.
pub fn command(port: u16, extra: &[&str]) -> Command {
    let mut command = Command::new(workspace_binary("herald-api"));
    command
        .args(["--nats-url", env().nats_url()])
        .args(["--listen", &format!("127.0.0.1:{port}")])
        .args(extra)
        .env(
            "RUST_LOG",
            "info,herald_api=debug,kube=debug,async_nats=warn",
        )
        .stdin(Stdio::null());
    command
}

impl ApiProcess {
    /// Starts the API (`extra` flags added) and waits until it is ready.
    pub async fn start(extra: &[&str]) -> Self {
        let kubeconfig = env().kubeconfig().display().to_string();
        let port = free_port();
        let log = std::env::temp_dir().join(format!("herald-api-{port}.log"));
        let file = std::fs::File::create(&log).expect("the API's log file");
        let mut args = vec!["--kubeconfig", kubeconfig.as_str()];
        args.extend_from_slice(extra);
        let child = command(port, &args)
            // Logs go to stdout, errors to stderr: both into the file.
            .stdout(file.try_clone().expect("the log file"))
            .stderr(file)
            .spawn()
            .expect("starting herald-api");
        let mut api = Self {
            log,
            child,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("an HTTP client"),
            openapi: None,
        };
        let (http, base) = (api.http.clone(), api.base.clone());
        eventually("herald-api ready", WAIT, || {
            let (http, url) = (http.clone(), format!("{base}/readyz"));
            async move {
                let response = http.get(url).send().await.ok()?;
                response.status().is_success().then_some(())
            }
        })
        .await;
        let doc = api.get_json("/openapi.json", None).await;
        api.openapi = Some(doc.1);
        api
    }

    async fn get_json(&self, path: &str, token: Option<&str>) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, token, None, &[])
            .await
    }

    /// Sends a request; returns the status and the JSON body.
    pub async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        token: Option<&str>,
        body: Option<Vec<u8>>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await.expect("the API answers");
        let status = response.status().as_u16();
        let bytes = response.bytes().await.expect("a body");
        let value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        (status, value)
    }

    /// A request whose answer must be `expected` and validate against the OpenAPI
    /// document's schema for the route (`template`, e.g.
    /// `/v1/namespaces/{ns}/events`).
    #[allow(clippy::too_many_arguments)]
    pub async fn call(
        &self,
        method: reqwest::Method,
        template: &str,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
        headers: &[(&str, &str)],
        expected: u16,
    ) -> Value {
        let body = body.map(|b| serde_json::to_vec(&b).expect("JSON"));
        let (status, value) = self.send(method.clone(), path, token, body, headers).await;
        assert_eq!(status, expected, "{method} {path}: {value}");
        let doc = self.openapi.as_ref().expect("the document");
        let method = method.as_str().to_lowercase();
        let schema = herald_api::openapi::response_schema(doc, &method, template, status)
            .unwrap_or_else(|| panic!("{method} {template} documents no JSON answer {status}"));
        let problems = herald_api::openapi::check(doc, schema, &value);
        assert!(
            problems.is_empty(),
            "{method} {path} {status}: {problems:?} in {value}"
        );
        value
    }

    /// The most memory the process has held (its peak resident set), KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        herald_e2e::faults::peak_rss_kib(self.child.id())
    }

    pub async fn metrics(&self) -> String {
        let url = format!("{}/metrics", self.base);
        self.http
            .get(url)
            .send()
            .await
            .expect("metrics")
            .text()
            .await
            .expect("text")
    }
}

/// The rules of the chart's ClusterRoles (charts/herald/templates/api-rbac.yaml), as
/// Roles in one namespace.
pub fn rules(role: &str) -> Value {
    let deliveries =
        json!({"apiGroups": ["herald.dev"], "resources": ["deliveries"], "verbs": ["get", "list"]});
    let redeliver = json!({"apiGroups": ["herald.dev"], "resources": ["webhookendpoints/redeliver"], "verbs": ["create"]});
    let events = json!({"apiGroups": ["herald.dev"], "resources": ["events"], "verbs": ["create"]});
    match role {
        "herald-delivery-viewer" => json!([deliveries]),
        "herald-delivery-operator" => json!([deliveries, redeliver]),
        "herald-event-producer" => json!([events]),
        other => panic!("no role {other}"),
    }
}

/// A token of ServiceAccount `name` in the test's namespace, bound to `role` there.
pub async fn token(ctx: &TestContext, name: &str, role: &str) -> String {
    let ns = &ctx.namespace;
    let pp = PostParams::default();
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    ctx.api::<ServiceAccount>()
        .create(&pp, &sa)
        .await
        .expect("ServiceAccount");
    let r: Role =
        serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules(role)})).unwrap();
    ctx.api::<Role>().create(&pp, &r).await.expect("Role");
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}],
    }))
    .unwrap();
    ctx.api::<RoleBinding>()
        .create(&pp, &binding)
        .await
        .expect("RoleBinding");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let accounts: Api<ServiceAccount> = ctx.api();
    let answer = accounts
        .create_token_request(name, &pp, &request)
        .await
        .expect("a token");
    answer
        .status
        .and_then(|s| s.token)
        .expect("a token in the TokenRequest's status")
}
