//! Herald's replacements for four stock kube-runtime pieces, kept behind this one
//! boundary so a reader knows where the operator departs from what kube-rs users expect.
//!
//! Each exists for one measured reason — memory per endpoint at tens of thousands of
//! endpoints (docs/scale.md), or a wait that could hang — and each keeps the contract
//! of the piece it replaces; its own module doc says exactly what it keeps and drops.
//!
//! | module | replaces | why |
//! |---|---|---|
//! | [`cached`] | the reflector store's whole `WebhookEndpoint` per object | the decoded object was ~2.3 KB; [`cached::Cached`] keeps identity, the spec as JSON without defaults, and fingerprints of the status (a few hundred bytes) |
//! | [`relevance`] | `predicate_filter` (generation, annotations, finalizers) | its cache holds name, namespace and uid as strings per object (~220 bytes); [`relevance::Fingerprints`] keeps two `u64`s |
//! | [`listed`] | `Store::wait_until_ready` | kube's readiness keeps one waker: of two tasks waiting on one store, the first to poll is never woken |
//! | [`events`] | `events::Recorder` | the recorder keeps every published Event whole (~1.7 KB) for six minutes; [`events::Publisher`] keeps a bounded LRU of under 100 bytes per entry |
//!
//! [`cached`] and [`relevance`] know the shape of a `WebhookEndpoint` (the endpoint
//! controller's and health writer's parts of the status); [`listed`] and [`events`] are
//! generic and serve every controller. Were kube-runtime to gain the same economies,
//! each module can be replaced by the stock piece on its own.

pub mod cached;
pub mod events;
pub mod listed;
pub mod relevance;
