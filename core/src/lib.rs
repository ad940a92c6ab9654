//! Herald's shared library, used by both the operator and the dispatcher.
//!
//! - [`v1alpha1`]: the `herald.dev/v1alpha1` custom resources (`WebhookEndpoint`,
//!   `SigningSecret`, `WebhookReplay`) whose doc comments become `kubectl explain` text;
//! - [`signing`]: Standard Webhooks signatures and `whsec_` secrets;
//! - [`pattern`]: event-type patterns such as `order.*`;
//! - [`duration`]: the Go-style durations (`30s`, `1h30m`) used in specs;
//! - [`dataplane`]: the contract between operator and dispatcher: NATS stream, subject,
//!   bucket and record names;
//! - [`flags`]: the NATS and destination-policy flags both binaries take;
//! - [`ssrf`]: which destination addresses endpoints may use;
//! - [`names`]: the API group, field manager, finalizer, label and condition names that
//!   both binaries must agree on.

#![forbid(unsafe_code)]

pub mod api;
pub mod clock;
pub mod dataplane;
pub mod duration;
pub mod egress;
pub mod envelope;
pub mod flags;
pub mod names;
pub mod operational;
pub mod pattern;
pub mod redact;
pub mod signing;
pub mod ssrf;
pub mod v1alpha1;
pub mod verification;
