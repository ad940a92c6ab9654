//! Herald's dispatcher, the data plane: consumes events from NATS JetStream, fans them
//! out to matching endpoints, signs and delivers them with per-endpoint isolation.
//!
//! The delivery pipeline is built in the dispatcher issue; see `docs/architecture.md`.

#![forbid(unsafe_code)]
