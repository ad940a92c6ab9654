//! The API's settings (flags with environment fallbacks), shaped like the dispatcher's
//! and the operator's: the NATS flags are `herald_core::flags::NatsArgs`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use herald_core::flags::NatsArgs;

/// Herald's HTTP API: the delivery log, redelivery, test events and HTTP ingest, each
/// authorized by the caller's Kubernetes RBAC.
#[derive(Parser, Debug, Clone)]
#[command(version, about, args_override_self = true)]
pub struct Config {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Address of the API, /metrics, /healthz, /readyz and /openapi.json.
    #[arg(long, env = "HERALD_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: SocketAddr,
    /// kubeconfig for TokenReview and SubjectAccessReview (default: in-cluster, else
    /// `$KUBECONFIG`).
    #[arg(long, env = "HERALD_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Largest event accepted by `POST .../events`, in bytes (the dispatcher's
    /// `--max-event-bytes`; keep them equal).
    #[arg(long, env = "HERALD_MAX_EVENT_BYTES", default_value_t = herald_core::envelope::DEFAULT_MAX_EVENT_BYTES)]
    pub max_event_bytes: usize,
    /// How long an `Idempotency-Key` of HTTP ingest is remembered: a retry within it is
    /// answered with the original event, after it stores a new one. Kept in the
    /// `herald-idempotency` bucket this API creates (on disk in NATS, one small entry a
    /// key, not in this process's memory).
    #[arg(long, env = "HERALD_API_IDEMPOTENCY_WINDOW", default_value = "24h", value_parser = herald_core::duration::parse_std)]
    pub idempotency_window: std::time::Duration,
    /// Requests per second each namespace may make (token bucket; refused with 429 and
    /// `Retry-After` above it).
    #[arg(long, env = "HERALD_API_RATE", default_value_t = 20.0)]
    pub rate_per_namespace: f64,
    /// Requests a namespace may make at once above its rate (the bucket's size).
    #[arg(long, env = "HERALD_API_BURST", default_value_t = 40)]
    pub burst_per_namespace: u32,
    /// Most deliveries one list page may hold (`limit` above it is a 400).
    #[arg(long, env = "HERALD_API_MAX_PAGE", default_value_t = 500)]
    pub max_page: usize,
    /// Most TokenReviews and SubjectAccessReviews per second the API asks of the
    /// Kubernetes API server for answers it has not cached (bursts of twice that); each
    /// connection source and each user also has a share of its own. Over it, requests
    /// are answered 429 without a review.
    #[arg(long, env = "HERALD_API_MAX_REVIEWS", default_value_t = 100.0)]
    pub max_reviews_per_second: f64,
    /// Most attempt-log records one request reads (a list, a lookup, a redrive of the
    /// dead). The log is read back from now; a request that reaches the bound answers
    /// what it found and says how far back it read (`truncated`).
    #[arg(long, env = "HERALD_API_MAX_SCAN", default_value_t = 200_000)]
    pub max_scan_records: usize,
    /// Longest one request reads the delivery log, in seconds (the same answer as
    /// `--max-scan-records` when reached).
    #[arg(long, env = "HERALD_API_MAX_SCAN_SECONDS", default_value_t = 10.0)]
    pub max_scan_seconds: f64,
    /// Most reads of the delivery log (lists, lookups, redrives) running at once in this
    /// process; each namespace may have two of them running or waiting. herald-api's
    /// memory for reads is this many times one read's bound.
    #[arg(long, env = "HERALD_API_MAX_CONCURRENT_SCANS", default_value_t = 4)]
    pub max_concurrent_scans: usize,
    /// Development only: no authentication and no authorization at all. Refused unless
    /// `--listen` is a loopback address.
    #[arg(long)]
    pub insecure_dev_no_auth: bool,
    /// Log as JSON lines.
    #[arg(long, env = "HERALD_JSON_LOGS")]
    pub json_logs: bool,
}

/// Settings that cannot work together.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(
        "--insecure-dev-no-auth serves every tenant's deliveries to anyone who can connect: it needs a loopback --listen address (127.0.0.1 or ::1), not {0}"
    )]
    DevModeNotLoopback(SocketAddr),
    #[error(
        "--rate-per-namespace and --max-reviews-per-second must be above 0 and --burst-per-namespace at least 1"
    )]
    Rate,
    #[error(
        "--max-scan-records must be at least 1 and --max-scan-seconds above 0, not {0} and {1}"
    )]
    Scan(usize, f64),
}

impl Config {
    /// Checks the settings as a whole.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.insecure_dev_no_auth && !self.listen.ip().is_loopback() {
            return Err(ConfigError::DevModeNotLoopback(self.listen));
        }
        if self.rate_per_namespace.is_nan()
            || self.rate_per_namespace <= 0.0
            || self.burst_per_namespace == 0
        {
            return Err(ConfigError::Rate);
        }
        if self.max_reviews_per_second.is_nan() || self.max_reviews_per_second <= 0.0 {
            return Err(ConfigError::Rate);
        }
        if self.max_scan_records == 0
            || self.max_scan_seconds.is_nan()
            || self.max_scan_seconds <= 0.0
        {
            return Err(ConfigError::Scan(
                self.max_scan_records,
                self.max_scan_seconds,
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_mode_needs_a_loopback_address() {
        let parse = |args: &[&str]| Config::try_parse_from(args).unwrap().validate();
        assert!(matches!(
            parse(&["x", "--insecure-dev-no-auth"]),
            Err(ConfigError::DevModeNotLoopback(_))
        ));
        assert!(parse(&["x", "--insecure-dev-no-auth", "--listen", "127.0.0.1:0"]).is_ok());
        assert!(parse(&["x", "--insecure-dev-no-auth", "--listen", "[::1]:0"]).is_ok());
        assert!(parse(&["x"]).is_ok());
        assert!(matches!(
            parse(&["x", "--rate-per-namespace", "0"]),
            Err(ConfigError::Rate)
        ));
    }
}
