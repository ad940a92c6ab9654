//! A client of Herald's HTTP API (`herald-api`): the delivery log, redelivery,
//! re-driving dead deliveries and test events, for one namespace.
//!
//! The contract is the API's (`api/openapi.yaml`): JSON in camelCase, times in RFC 3339,
//! errors as `{"error": {"code", "message"}}` with the HTTP status (and `Retry-After` on
//! 429). Every request carries `Authorization: Bearer <token>`: the API checks it with a
//! TokenReview and the route's verb with a SubjectAccessReview, so the plugin can do
//! exactly what the user's RBAC allows. Responses are kept as JSON too, so `-o json`
//! prints what the API said, fields this version does not know included.

use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use url::Url;

use crate::context::{Context, ContextError};

mod types;
pub use types::{
    Attempt, Delivery, DeliveryDetail, HeaderField, Lenient, Page, Query, Queued, Redrive, State,
};

/// Where the bearer token comes from.
#[derive(Clone)]
pub enum Token {
    /// `--token`.
    Fixed(String),
    /// The kubeconfig identity, asked before every request (refreshed when needed).
    Kubeconfig(Arc<Context>),
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "Herald's API address is not set: pass --api-url or set HERALD_API_URL (for example `kubectl port-forward -n herald-system svc/herald-api 8080:8080` and --api-url http://127.0.0.1:8080)"
    )]
    NoUrl,
    #[error("--api-url {0:?} is not an http(s) URL")]
    BadUrl(String),
    #[error("cannot reach Herald's API at {url}: {source}")]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    /// The API answered with an error.
    #[error("{message} (HTTP {status}{}{})",
        code.as_deref().map(|c| format!(", {c}")).unwrap_or_default(),
        retry_after.map(|s| format!("; retry after {s} s")).unwrap_or_default())]
    Status {
        status: u16,
        code: Option<String>,
        message: String,
        retry_after: Option<u64>,
    },
    #[error("Herald's API answered {url} with JSON this plugin cannot read: {source}")]
    Decode {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(transparent)]
    Token(#[from] ContextError),
}

impl ApiError {
    /// `Retry-After` of a 429, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        match self {
            Self::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// Herald's API for one namespace.
#[derive(Clone)]
pub struct Api {
    http: reqwest::Client,
    base: Url,
    namespace: String,
    token: Token,
}

impl Api {
    /// `base` is `--api-url` (`http(s)://host[:port][/prefix]`).
    pub fn new(base: Option<&str>, namespace: &str, token: Token) -> Result<Self, ApiError> {
        let text = base.map(str::trim).filter(|b| !b.is_empty());
        let text = text.ok_or(ApiError::NoUrl)?;
        let base = Url::parse(text)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base())
            .ok_or_else(|| ApiError::BadUrl(text.to_owned()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|source| ApiError::Unreachable {
                url: text.to_owned(),
                source,
            })?;
        Ok(Self {
            http,
            base,
            namespace: namespace.to_owned(),
            token,
        })
    }

    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// `<base>/v1/namespaces/<ns>/endpoints/<endpoint>/<rest...>`, every segment escaped.
    pub fn url(&self, endpoint: &str, rest: &[&str]) -> Url {
        let mut url = self.base.clone();
        {
            let mut segments = url.path_segments_mut().expect("checked in new");
            segments
                .pop_if_empty()
                .extend(["v1", "namespaces", &self.namespace]);
            segments.extend(["endpoints", endpoint]).extend(rest);
        }
        url
    }

    /// One page of an endpoint's delivery log, and the JSON as sent.
    pub async fn deliveries(
        &self,
        endpoint: &str,
        query: &Query,
    ) -> Result<(Page, Value), ApiError> {
        let mut url = self.url(endpoint, &["deliveries"]);
        let pairs = query.pairs();
        if !pairs.is_empty() {
            url.query_pairs_mut().extend_pairs(pairs);
        }
        self.call(reqwest::Method::GET, url).await
    }

    /// One delivery with all its attempts.
    pub async fn delivery(
        &self,
        endpoint: &str,
        event_id: &str,
    ) -> Result<(DeliveryDetail, Value), ApiError> {
        let url = self.url(endpoint, &["deliveries", event_id]);
        self.call(reqwest::Method::GET, url).await
    }

    /// Delivers one event to the endpoint again, with its original id.
    pub async fn redeliver(
        &self,
        endpoint: &str,
        event_id: &str,
    ) -> Result<(Queued, Value), ApiError> {
        let url = self.url(endpoint, &["redeliver", event_id]);
        self.call(reqwest::Method::POST, url).await
    }

    /// Delivers every dead delivery of the endpoint again.
    pub async fn redrive_dead(&self, endpoint: &str) -> Result<(Redrive, Value), ApiError> {
        let url = self.url(endpoint, &["redrive-dead"]);
        self.call(reqwest::Method::POST, url).await
    }

    /// Sends a test event to the endpoint.
    pub async fn test(&self, endpoint: &str) -> Result<(Queued, Value), ApiError> {
        let url = self.url(endpoint, &["test"]);
        self.call(reqwest::Method::POST, url).await
    }

    async fn token(&self) -> Result<String, ApiError> {
        Ok(match &self.token {
            Token::Fixed(token) => token.clone(),
            Token::Kubeconfig(context) => context.bearer_token().await?,
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        url: Url,
    ) -> Result<(T, Value), ApiError> {
        let token = self.token().await?;
        let shown = url.to_string();
        let unreachable = |source| ApiError::Unreachable {
            url: shown.clone(),
            source,
        };
        let mut request = self.http.request(method.clone(), url).bearer_auth(token);
        if method == reqwest::Method::POST {
            request = request.header(http::header::CONTENT_LENGTH, "0");
        }
        let response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let retry_after = response
            .headers()
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse().ok());
        let body = response.bytes().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(error_of(status.as_u16(), &body, retry_after, &shown));
        }
        let decode = |source| ApiError::Decode {
            url: shown.clone(),
            source,
        };
        let value: Value = serde_json::from_slice(&body).map_err(decode)?;
        let typed = T::deserialize(&value).map_err(decode)?;
        Ok((typed, value))
    }
}

/// The error an answer other than 2xx stands for: the API's `{"error": {...}}`, or
/// (from something that is not Herald's API, e.g. a wrong `--api-url`) the status and
/// the start of the body.
pub fn error_of(status: u16, body: &[u8], retry_after: Option<u64>, url: &str) -> ApiError {
    #[derive(Deserialize)]
    struct Envelope {
        error: Inner,
    }
    #[derive(Deserialize)]
    struct Inner {
        #[serde(default)]
        code: Option<String>,
        #[serde(default)]
        message: String,
    }
    match serde_json::from_slice::<Envelope>(body) {
        Ok(Envelope { error }) if !error.message.is_empty() => ApiError::Status {
            status,
            code: error.code,
            message: error.message,
            retry_after,
        },
        _ => {
            let text = String::from_utf8_lossy(body);
            let text = crate::table::snippet(text.trim(), 200);
            let message = if text.is_empty() {
                format!("{url} answered without a Herald error body; is --api-url Herald's API?")
            } else {
                format!("{url} answered {text:?}; is --api-url Herald's API?")
            };
            ApiError::Status {
                status,
                code: None,
                message,
                retry_after,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(base: &str) -> Api {
        let _ = rustls::crypto::ring::default_provider().install_default();
        Api::new(Some(base), "shop", Token::Fixed("t".into())).unwrap()
    }

    #[test]
    fn urls_follow_the_contract_and_escape_segments() {
        let a = api("http://127.0.0.1:8080");
        assert_eq!(
            a.url("orders", &["deliveries"]).as_str(),
            "http://127.0.0.1:8080/v1/namespaces/shop/endpoints/orders/deliveries"
        );
        assert_eq!(
            a.url("orders", &["redeliver", "01J/x y"]).as_str(),
            "http://127.0.0.1:8080/v1/namespaces/shop/endpoints/orders/redeliver/01J%2Fx%20y"
        );
        // A path prefix (an ingress route, the API server's service proxy) is kept.
        let a = api("https://example.com/herald/");
        assert_eq!(
            a.url("o", &["test"]).as_str(),
            "https://example.com/herald/v1/namespaces/shop/endpoints/o/test"
        );
    }

    #[test]
    fn the_address_must_be_given_and_http() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let token = || Token::Fixed("t".into());
        assert!(matches!(
            Api::new(None, "ns", token()),
            Err(ApiError::NoUrl)
        ));
        assert!(matches!(
            Api::new(Some(" "), "ns", token()),
            Err(ApiError::NoUrl)
        ));
        for bad in ["localhost:8080", "ftp://x", "not a url"] {
            assert!(
                matches!(Api::new(Some(bad), "ns", token()), Err(ApiError::BadUrl(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn errors_show_the_api_message() {
        let body = br#"{"error":{"code":"Forbidden","message":"user \"x\" cannot list deliveries in namespace \"shop\""}}"#;
        let e = error_of(403, body, None, "u");
        assert_eq!(
            e.to_string(),
            "user \"x\" cannot list deliveries in namespace \"shop\" (HTTP 403, Forbidden)"
        );
        let e = error_of(
            429,
            br#"{"error":{"code":"TooManyRequests","message":"slow down"}}"#,
            Some(3),
            "u",
        );
        assert_eq!(
            e.to_string(),
            "slow down (HTTP 429, TooManyRequests; retry after 3 s)"
        );
        assert_eq!(e.retry_after(), Some(3));
        let e = error_of(404, b"404 page not found", None, "http://x/v1");
        assert!(e.to_string().contains("is --api-url Herald's API?"), "{e}");
        assert!(e.to_string().contains("HTTP 404"), "{e}");
    }
}
