//! The plugin's client logic against a stub of Herald's API (axum, on loopback) and
//! kubeconfig files of each kind of identity: what is sent (path, query, bearer token),
//! how answers and errors are read, and where the token comes from. The real API is
//! exercised by `e2e/tests/plugin.rs`.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kubectl_herald::api::{Api, ApiError, Query, Token};
use kubectl_herald::context::{Context, ContextError, KubeArgs};
use serde_json::json;

/// What the stub saw: (method and path with query, Authorization header).
type Seen = Arc<Mutex<Vec<(String, String)>>>;

fn note(seen: &Seen, what: String, headers: &HeaderMap) {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    seen.lock().unwrap().push((what, auth));
}

async fn list(
    State(seen): State<Seen>,
    Path((ns, name)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let query = query.unwrap_or_default();
    note(
        &seen,
        format!("GET {ns}/{name}/deliveries?{query}"),
        &headers,
    );
    if name == "forbidden" {
        let body = json!({"error": {"code": "Forbidden", "message": "alice may not list deliveries.herald.dev in namespace shop"}});
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    if name == "busy" {
        let body = json!({"error": {"code": "TooManyRequests", "message": "namespace shop is over its request rate"}});
        return (
            StatusCode::TOO_MANY_REQUESTS,
            [("retry-after", "2")],
            axum::Json(body),
        )
            .into_response();
    }
    let item = |id: &str| {
        json!({"eventId": id, "type": "order.created", "state": "dead", "attempts": 3,
               "lastStatus": 500, "lastLatencyMs": 4, "lastAttemptTime": "2026-12-01T10:00:00Z",
               "nextAttemptTime": null})
    };
    let page = if query.contains("cursor=c2") {
        json!({"items": [item("e3")], "nextCursor": null})
    } else {
        json!({"items": [item("e1"), item("e2")], "nextCursor": "c2"})
    };
    axum::Json(page).into_response()
}

async fn detail(
    State(seen): State<Seen>,
    Path((ns, name, id)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    note(&seen, format!("GET {ns}/{name}/deliveries/{id}"), &headers);
    axum::Json(json!({"eventId": id, "type": "order.created", "state": "succeeded", "attempts": [
        {"attempt": 2, "time": "2026-12-01T10:00:05Z", "outcome": "Success", "status": 200, "latencyMs": 3, "response": "ok"},
        {"attempt": 1, "time": "2026-12-01T10:00:00Z", "outcome": "HttpError", "status": 503, "latencyMs": 8, "response": ""}
    ]}))
    .into_response()
}

async fn act(
    State(seen): State<Seen>,
    Path(rest): Path<Vec<String>>,
    headers: HeaderMap,
) -> Response {
    note(&seen, format!("POST {}", rest.join("/")), &headers);
    let body = match rest.get(2).map(String::as_str) {
        Some("redrive-dead") => json!({"requestId": "r2", "count": 2, "eventIds": ["a", "b"]}),
        _ => json!({"eventId": "e9", "requestId": "r1"}),
    };
    (StatusCode::ACCEPTED, axum::Json(body)).into_response()
}

async fn stub() -> (String, Seen) {
    let seen = Seen::default();
    let app = Router::new()
        .route("/v1/namespaces/{ns}/endpoints/{name}/deliveries", get(list))
        .route(
            "/v1/namespaces/{ns}/endpoints/{name}/deliveries/{id}",
            get(detail),
        )
        .route(
            "/v1/namespaces/{ns}/endpoints/{name}/redeliver/{id}",
            post(act3),
        )
        .route("/v1/namespaces/{ns}/endpoints/{name}/{action}", post(act2))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    (url, seen)
}

async fn act2(
    state: State<Seen>,
    Path((ns, name, action)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    act(state, Path(vec![ns, name, action]), headers).await
}

async fn act3(
    state: State<Seen>,
    Path((ns, name, id)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    act(state, Path(vec![ns, name, "redeliver".into(), id]), headers).await
}

fn fixed(token: &str) -> Token {
    let _ = rustls::crypto::ring::default_provider().install_default();
    Token::Fixed(token.into())
}

#[tokio::test]
async fn the_log_pages_with_the_query_and_the_bearer_token() {
    let (url, seen) = stub().await;
    let api = Api::new(Some(&url), "shop", fixed("t0k")).unwrap();
    let query = Query {
        status: Some("failed".into()),
        since: Some("2026-12-01T08:00:00Z".parse().unwrap()),
        limit: Some(2),
        ..Default::default()
    };
    let (page, raw) = api.deliveries("orders", &query).await.unwrap();
    assert_eq!(page.items.len(), 2);
    assert_eq!(page.next_cursor.as_deref(), Some("c2"));
    assert_eq!(raw["items"][0]["lastLatencyMs"], 4);
    let next = Query {
        cursor: page.next_cursor,
        ..query
    };
    let (page, _) = api.deliveries("orders", &next).await.unwrap();
    assert_eq!(&*page.items[0].event_id, "e3");
    assert!(page.next_cursor.is_none());
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[0],
        (
            "GET shop/orders/deliveries?status=failed&since=2026-12-01T08%3A00%3A00Z&limit=2"
                .into(),
            "Bearer t0k".into()
        )
    );
    assert!(seen[1].0.ends_with("&cursor=c2"), "{seen:?}");
}

#[tokio::test]
async fn attempts_and_actions() {
    let (url, seen) = stub().await;
    let api = Api::new(Some(&url), "shop", fixed("t")).unwrap();
    let (detail, _) = api.delivery("orders", "e1").await.unwrap();
    assert_eq!(detail.attempts.len(), 2);
    assert_eq!(detail.attempts[1].response, "");
    assert_eq!(detail.attempts[1].outcome.to_string(), "HttpError");
    let (accepted, _) = api.redeliver("orders", "e1").await.unwrap();
    assert_eq!(accepted.event_id, "e9");
    let (accepted, _) = api.redrive_dead("orders").await.unwrap();
    assert_eq!((accepted.count, accepted.event_ids.len()), (2, 2));
    api.test("orders").await.unwrap();
    let calls: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|(c, _)| c.clone())
        .collect();
    assert_eq!(
        calls,
        [
            "GET shop/orders/deliveries/e1",
            "POST shop/orders/redeliver/e1",
            "POST shop/orders/redrive-dead",
            "POST shop/orders/test"
        ]
    );
}

#[tokio::test]
async fn refusals_carry_the_api_message_and_retry_after() {
    let (url, _) = stub().await;
    let api = Api::new(Some(&url), "shop", fixed("t")).unwrap();
    let err = api
        .deliveries("forbidden", &Query::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, ApiError::Status { status: 403, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "alice may not list deliveries.herald.dev in namespace shop (HTTP 403, Forbidden)"
    );
    let err = api.deliveries("busy", &Query::default()).await.unwrap_err();
    assert_eq!(err.retry_after(), Some(2));
    // Nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let api = Api::new(
        Some(&format!("http://127.0.0.1:{port}")),
        "shop",
        fixed("t"),
    )
    .unwrap();
    let err = api
        .deliveries("orders", &Query::default())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("cannot reach Herald's API at http://127.0.0.1:"),
        "{err}"
    );
}

/// A kubeconfig with one context whose user is `user` (YAML of an AuthInfo).
fn kubeconfig(dir: &std::path::Path, user: serde_json::Value) -> KubeArgs {
    let config = json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u", "namespace": "tenant-a"}}],
        "users": [{"name": "u", "user": user}],
    });
    let path = dir.join("kubeconfig");
    std::fs::write(&path, serde_json::to_string(&config).unwrap()).unwrap();
    KubeArgs {
        kubeconfig: Some(path),
        ..Default::default()
    }
}

fn temp_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("kubectl-herald-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[tokio::test]
async fn the_token_comes_from_the_kubeconfig_identity() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = temp_dir("identity");

    let args = kubeconfig(&dir, json!({"token": "static-token"}));
    let context = Context::load(&args).await.unwrap();
    assert_eq!(context.namespace, "tenant-a", "the context's namespace");
    assert_eq!(context.bearer_token().await.unwrap(), "static-token");

    // Written without a newline: kube sends the file as it is (client-go trims it).
    std::fs::write(dir.join("token"), "file-token").unwrap();
    let args = kubeconfig(&dir, json!({"tokenFile": dir.join("token")}));
    let context = Context::load(&args).await.unwrap();
    assert_eq!(context.bearer_token().await.unwrap(), "file-token");

    // An exec credential plugin, as cloud providers' kubeconfigs have.
    let script = dir.join("credential.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\necho '{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":\"exec-token\"}}'\n",
    )
    .unwrap();
    std::process::Command::new("chmod")
        .arg("+x")
        .arg(&script)
        .status()
        .unwrap();
    let args = kubeconfig(
        &dir,
        json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": script,
                         "interactiveMode": "Never"}}),
    );
    let context = Arc::new(Context::load(&args).await.unwrap());
    assert_eq!(context.bearer_token().await.unwrap(), "exec-token");
    // And the API client sends it.
    let (url, seen) = stub().await;
    let api = Api::new(
        Some(&url),
        &context.namespace,
        Token::Kubeconfig(context.clone()),
    )
    .unwrap();
    api.deliveries("orders", &Query::default()).await.unwrap();
    assert_eq!(seen.lock().unwrap()[0].1, "Bearer exec-token");
    assert!(
        seen.lock().unwrap()[0]
            .0
            .starts_with("GET tenant-a/orders/")
    );

    // A client certificate cannot be sent to another server: say so, and what to do.
    let args = kubeconfig(
        &dir,
        json!({"client-certificate-data": "Zm9v", "client-key-data": "YmFy"}),
    );
    let context = Context::load(&args).await.unwrap();
    let err = context.bearer_token().await.unwrap_err();
    assert!(matches!(err, ContextError::NoBearerToken { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("client certificate") && text.contains("--token"),
        "{text}"
    );

    let mut args = kubeconfig(&dir, json!({"token": "t"}));
    args.namespace = Some("other".into());
    assert_eq!(
        Context::load(&args).await.unwrap().namespace,
        "other",
        "-n wins"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
