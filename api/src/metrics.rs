//! The API's Prometheus metrics (`docs/metrics.md`, section API). Labels are the route's
//! fixed name, the status code and small fixed sets — never a namespace, endpoint or
//! token.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabel {
    pub route: &'static str,
    pub code: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabel {
    pub route: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabel, Counter>,
    pub duration: Family<RouteLabel, Histogram>,
    pub ingested: Family<ResultLabel, Counter>,
    pub enqueued: Family<KindLabel, Counter>,
    pub reviews: Family<KindLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("herald_api");
        let requests = Family::<RequestLabel, Counter>::default();
        let duration = Family::<RouteLabel, Histogram>::new_with_constructor(|| {
            // 1 ms × 2ⁿ, n = 0..15 (to 16 s).
            Histogram::new(exponential_buckets(0.001, 2.0, 15))
        });
        let ingested = Family::<ResultLabel, Counter>::default();
        let enqueued = Family::<KindLabel, Counter>::default();
        let reviews = Family::<KindLabel, Counter>::default();
        registry.register(
            "requests",
            "API requests by route and HTTP status code",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time to answer an API request, by route",
            duration.clone(),
        );
        registry.register(
            "events_ingested",
            "Events accepted by HTTP ingest: accepted (stored) or duplicate (an Idempotency-Key seen within the duplicate window)",
            ingested.clone(),
        );
        registry.register(
            "enqueued",
            "Events queued on an endpoint's retry lane by redeliver, redrive-dead or test",
            enqueued.clone(),
        );
        registry.register(
            "reviews",
            "TokenReviews and SubjectAccessReviews sent to the Kubernetes API (cache misses)",
            reviews.clone(),
        );
        Self {
            registry,
            requests,
            duration,
            ingested,
            enqueued,
            reviews,
        }
    }
}

impl Metrics {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}
