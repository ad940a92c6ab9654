//! Who is calling and what they may do: the bearer token is checked with a
//! `TokenReview`, the route's resource and verb in the route's namespace with a
//! `SubjectAccessReview` — the tenant's own RBAC decides. Both answers are cached for
//! [`CACHE_TTL`] in a bounded map keyed by a SHA-256 of the token (never the token), so
//! a busy client costs the API server two reviews per 10 s, not two per request; a full
//! cache forgets its oldest answers first.
//!
//! What a caller can make the API server do is bounded: reviews not answered from the
//! cache are limited per connection source ([`TOKEN_REVIEWS_PER_SOURCE`]: a flood of
//! made-up tokens), per user ([`ACCESS_REVIEWS_PER_USER`]: a valid token rotating
//! namespaces or endpoints) and in total (`--max-reviews-per-second`); over a limit the
//! request is answered 429 `TooManyReviews` without a review. Behind a proxy every caller
//! shares the proxy's source; the total still holds.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::StatusCode;
use axum::http::request::Parts;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Api;
use kube::api::PostParams;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use sha2::{Digest, Sha256};

use crate::error::ApiError;
use crate::limit::{Limits, Quota, retry_after_secs};
use crate::metrics::KindLabel;

/// How long a token's review and an access decision are reused.
pub const CACHE_TTL: Duration = Duration::from_secs(10);
/// Token reviews one connection source may cause (tokens not in the cache).
pub const TOKEN_REVIEWS_PER_SOURCE: Quota = Quota {
    rate: 5.0,
    burst: 20.0,
};
/// Access reviews one user may cause (decisions not in the cache): enough for a person
/// or a controller working through dozens of endpoints.
pub const ACCESS_REVIEWS_PER_USER: Quota = Quota {
    rate: 10.0,
    burst: 50.0,
};
/// Most entries per cache.
const CACHE_MAX: usize = 10_000;

/// A resource and verb of the `herald.dev` API group that a route needs, checked in
/// the route's namespace (and for the endpoint routes with the endpoint as the name,
/// so RBAC `resourceNames` can narrow a grant to some endpoints).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Access {
    pub resource: &'static str,
    pub subresource: &'static str,
    pub verb: &'static str,
}

/// `GET .../deliveries`.
pub const LIST_DELIVERIES: Access = Access {
    resource: "deliveries",
    subresource: "",
    verb: "list",
};
/// `GET .../deliveries/{eventId}`.
pub const GET_DELIVERY: Access = Access {
    resource: "deliveries",
    subresource: "",
    verb: "get",
};
/// `POST /v1/namespaces/{ns}/events`: a producer's verb, nothing else.
pub const CREATE_EVENTS: Access = Access {
    resource: "events",
    subresource: "",
    verb: "create",
};
/// `POST .../redeliver/{eventId}`, `.../redrive-dead`, `.../test`.
pub const REDELIVER: Access = Access {
    resource: "webhookendpoints",
    subresource: "redeliver",
    verb: "create",
};

/// The caller, as the API server told it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct User {
    pub username: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// A small map whose entries expire.
struct TtlCache<V> {
    entries: Mutex<HashMap<String, (Instant, V)>>,
}

impl<V: Clone> TtlCache<V> {
    fn new() -> Self {
        Self {
            entries: Mutex::default(),
        }
    }

    fn get(&self, key: &str, now: Instant) -> Option<V> {
        let entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let (at, value) = entries.get(key)?;
        (now.saturating_duration_since(*at) < CACHE_TTL).then(|| value.clone())
    }

    /// Adds an answer; a full cache first forgets the expired ones, then the oldest
    /// quarter (never everything at once: a flood of new keys cannot make every caller
    /// pay a review again).
    fn put(&self, key: String, value: V, now: Instant) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if entries.len() >= CACHE_MAX {
            entries.retain(|_, (at, _)| now.saturating_duration_since(*at) < CACHE_TTL);
        }
        if entries.len() >= CACHE_MAX {
            let mut ages: Vec<Instant> = entries.values().map(|(at, _)| *at).collect();
            let (_, cutoff, _) = ages.select_nth_unstable(CACHE_MAX / 4);
            let cutoff = *cutoff;
            entries.retain(|_, (at, _)| *at > cutoff);
        }
        entries.insert(key, (now, value));
    }
}

/// Authentication and authorization against the Kubernetes API.
pub struct KubeAuth {
    client: kube::Client,
    /// `herald_api_reviews_total`, by `kind` (`token`, `access`).
    reviews: Family<KindLabel, Counter>,
    tokens: TtlCache<Option<Arc<User>>>,
    decisions: TtlCache<Result<(), String>>,
    /// Reviews not answered from the caches, per source, per user and in total.
    reviews_left: Limits,
    total: Quota,
}

/// How requests are checked.
pub enum Auth {
    Kube(Box<KubeAuth>),
    /// `--insecure-dev-no-auth`: everyone may do everything (loopback only).
    Disabled,
}

impl Auth {
    /// Reviews against the API server, at most `reviews_per_second` of them not answered
    /// from the caches (bursts of twice that).
    pub fn kube(
        client: kube::Client,
        reviews: Family<KindLabel, Counter>,
        reviews_per_second: f64,
    ) -> Self {
        Self::Kube(Box::new(KubeAuth {
            client,
            reviews,
            tokens: TtlCache::new(),
            decisions: TtlCache::new(),
            reviews_left: Limits::default(),
            total: Quota {
                rate: reviews_per_second,
                burst: (2.0 * reviews_per_second).max(1.0),
            },
        }))
    }

    /// Checks the caller's token and the access it needs.
    pub async fn check(
        &self,
        caller: &Caller,
        namespace: &str,
        access: Access,
        name: Option<&str>,
    ) -> Result<(), ApiError> {
        let Self::Kube(kube) = self else {
            return Ok(());
        };
        let user = kube.authenticate(caller).await?;
        kube.authorize(&user, namespace, access, name).await
    }
}

/// Who sent a request: its `Authorization` header and where it came from.
#[derive(Clone, Debug)]
pub struct Caller {
    pub authorization: Option<String>,
    pub source: IpAddr,
}

impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let authorization = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let source = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.0.ip());
        Ok(Self {
            authorization,
            source,
        })
    }
}

fn too_many_reviews(wait: Duration, whose: &str) -> ApiError {
    let secs = retry_after_secs(wait);
    ApiError {
        retry_after: Some(secs),
        ..ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "TooManyReviews",
            format!(
                "{whose} asked the Kubernetes API server to review too many new tokens or permissions; retry after {secs} s"
            ),
        )
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "Unauthorized", message)
}

/// The token of `Authorization: Bearer <token>`.
pub fn bearer(authorization: Option<&str>) -> Option<&str> {
    let value = authorization?.trim();
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl KubeAuth {
    /// Takes one review from `key`'s allowance and the total, or says who is over.
    fn may_review(&self, key: &str, quota: Quota, whose: &str) -> Result<(), ApiError> {
        let now = Instant::now();
        self.reviews_left
            .take(key, quota, now)
            .and_then(|()| self.reviews_left.take("\u{0}total", self.total, now))
            .map_err(|wait| too_many_reviews(wait, whose))
    }

    async fn authenticate(&self, caller: &Caller) -> Result<Arc<User>, ApiError> {
        let token = bearer(caller.authorization.as_deref()).ok_or_else(|| {
            unauthorized("send a Kubernetes bearer token: Authorization: Bearer <token>")
        })?;
        let key: String = Sha256::digest(token.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let now = Instant::now();
        let reviewed = match self.tokens.get(&key, now) {
            Some(user) => user,
            None => {
                let source = caller.source;
                self.may_review(
                    &format!("source\u{0}{source}"),
                    TOKEN_REVIEWS_PER_SOURCE,
                    &format!("source {source}"),
                )?;
                let user = self.review_token(token).await?;
                self.tokens.put(key, user.clone(), now);
                user
            }
        };
        reviewed.ok_or_else(|| {
            unauthorized("the bearer token was not accepted by the Kubernetes API server")
        })
    }

    async fn review_token(&self, token: &str) -> Result<Option<Arc<User>>, ApiError> {
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..Default::default()
        };
        self.reviews
            .get_or_create(&KindLabel { kind: "token" })
            .inc();
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let review = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ApiError::unavailable("the TokenReview", e))?;
        let Some(status) = review.status.filter(|s| s.authenticated == Some(true)) else {
            return Ok(None);
        };
        let user = status.user.unwrap_or_default();
        tracing::debug!(
            user = user.username.as_deref().unwrap_or_default(),
            "token reviewed"
        );
        Ok(Some(Arc::new(User {
            username: user.username.unwrap_or_default(),
            uid: user.uid.unwrap_or_default(),
            groups: user.groups.unwrap_or_default(),
            extra: user.extra.unwrap_or_default(),
        })))
    }

    async fn authorize(
        &self,
        user: &User,
        namespace: &str,
        access: Access,
        name: Option<&str>,
    ) -> Result<(), ApiError> {
        let key = format!(
            "{}\u{0}{}\u{0}{:?}\u{0}{namespace}\u{0}{access:?}\u{0}{name:?}",
            user.username, user.uid, user.groups
        );
        let now = Instant::now();
        let decision = match self.decisions.get(&key, now) {
            Some(decision) => decision,
            None => {
                self.may_review(
                    &format!("user\u{0}{}", user.username),
                    ACCESS_REVIEWS_PER_USER,
                    &user.username,
                )?;
                let decision = self.review_access(user, namespace, access, name).await?;
                self.decisions.put(key, decision.clone(), now);
                decision
            }
        };
        decision.map_err(|reason| ApiError::new(StatusCode::FORBIDDEN, "Forbidden", reason))
    }

    async fn review_access(
        &self,
        user: &User,
        namespace: &str,
        access: Access,
        name: Option<&str>,
    ) -> Result<Result<(), String>, ApiError> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.username.clone()),
                uid: Some(user.uid.clone()).filter(|u| !u.is_empty()),
                groups: Some(user.groups.clone()),
                extra: Some(user.extra.clone()).filter(|e| !e.is_empty()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(herald_core::names::GROUP.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    resource: Some(access.resource.to_owned()),
                    subresource: Some(access.subresource.to_owned()).filter(|s| !s.is_empty()),
                    verb: Some(access.verb.to_owned()),
                    name: name.map(str::to_owned),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        self.reviews
            .get_or_create(&KindLabel { kind: "access" })
            .inc();
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let review = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| ApiError::unavailable("the SubjectAccessReview", e))?;
        let status = review.status.unwrap_or_default();
        tracing::debug!(
            user = user.username,
            namespace,
            resource = access.resource,
            subresource = access.subresource,
            verb = access.verb,
            allowed = status.allowed,
            "access reviewed"
        );
        if status.allowed {
            return Ok(Ok(()));
        }
        let resource = match access.subresource {
            "" => access.resource.to_owned(),
            sub => format!("{}/{sub}", access.resource),
        };
        let mut message = format!(
            "{} may not {} {resource}.{} in namespace {namespace}",
            user.username,
            access.verb,
            herald_core::names::GROUP
        );
        if let Some(reason) = status.reason.filter(|r| !r.is_empty()) {
            message.push_str(": ");
            message.push_str(&reason);
        }
        Ok(Err(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bearer_tokens_are_taken() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[test]
    fn cached_answers_expire() {
        let cache = TtlCache::new();
        let t = Instant::now();
        cache.put("k".into(), 1, t);
        assert_eq!(cache.get("k", t + Duration::from_secs(9)), Some(1));
        assert_eq!(cache.get("k", t + CACHE_TTL), None);
    }

    #[test]
    fn a_full_cache_forgets_its_oldest_answers_not_all() {
        let cache = TtlCache::new();
        let t = Instant::now();
        for i in 0..CACHE_MAX {
            cache.put(format!("k{i}"), i, t + Duration::from_micros(i as u64));
        }
        let later = t + Duration::from_secs(1);
        cache.put("new".into(), 0, later);
        let kept = cache.entries.lock().unwrap().len();
        assert!(kept > CACHE_MAX / 2 && kept < CACHE_MAX, "{kept}");
        assert_eq!(cache.get("k0", later), None, "the oldest went");
        assert_eq!(
            cache.get(&format!("k{}", CACHE_MAX - 1), later),
            Some(CACHE_MAX - 1)
        );
        assert_eq!(cache.get("new", later), Some(0));
    }
}
