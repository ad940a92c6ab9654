//! `replay ENDPOINT --from T [--to T]`: creates a `WebhookReplay` and follows its status
//! (phase, matched, enqueued, delivered, failed) until it completes or cannot go on,
//! a line per change.
//!
//! The replay itself is the operator's and the dispatcher's work (docs/architecture.md,
//! Replay); the plugin only creates the resource, with the user's identity (so their
//! RBAC on `webhookreplays` decides), and watches it. [`progress`] decides from a status
//! alone whether to go on, and is pure.

use futures::StreamExt;
use herald_core::names::{condition, reason};
use herald_core::v1alpha1::{ReplayPhase, WebhookReplay, WebhookReplaySpec, WebhookReplayStatus};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};

use crate::table::{NONE, line};
use crate::time::TimeArg;

/// Flags of `replay`.
#[derive(Clone, Debug, clap::Args)]
pub struct ReplayArgs {
    /// The WebhookEndpoint to deliver to again.
    pub endpoint: String,
    /// Events published at or after this time: RFC 3339 or a duration ago (2h).
    #[arg(long, value_name = "TIME")]
    pub from: TimeArg,
    /// Events published before this time (default: now).
    #[arg(long, value_name = "TIME")]
    pub to: Option<TimeArg>,
    /// Only events of this type (exact or a pattern such as `order.*`); repeatable.
    #[arg(long = "type", value_name = "TYPE")]
    pub event_types: Vec<String>,
    /// Only events whose delivery failed or is dead.
    #[arg(long)]
    pub only_failed: bool,
    /// Count what would be sent, send nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// The WebhookReplay's name (default: generated from the endpoint's).
    #[arg(long)]
    pub name: Option<String>,
    /// Create the replay and return, without following it.
    #[arg(long)]
    pub no_follow: bool,
    /// Give up following after this long (the replay goes on).
    #[arg(long, default_value = "30m", value_parser = crate::time::parse_duration)]
    pub timeout: std::time::Duration,
}

impl ReplayArgs {
    /// The resource to create.
    pub fn resource(&self, now: Timestamp) -> WebhookReplay {
        let time = |t: Timestamp| Time(convert(t));
        let spec = WebhookReplaySpec {
            endpoint: self.endpoint.clone(),
            from: time(self.from.resolve(now)),
            to: self.to.map(|t| time(t.resolve(now))),
            event_types: self.event_types.clone(),
            only_failed: self.only_failed,
            dry_run: self.dry_run,
        };
        let mut replay = WebhookReplay::new("", spec);
        replay.metadata = match &self.name {
            Some(name) => ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            None => ObjectMeta {
                generate_name: Some(format!("{}-", prefix(&self.endpoint))),
                ..Default::default()
            },
        };
        replay
    }
}

/// k8s-openapi's `Time` holds its own jiff; the same instant either way.
fn convert(t: Timestamp) -> k8s_openapi::jiff::Timestamp {
    k8s_openapi::jiff::Timestamp::from_nanosecond(t.as_nanosecond())
        .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH)
}

/// `generateName` of a replay: the endpoint's name (shortened to leave room for the
/// suffix the API server adds) and `-replay`.
fn prefix(endpoint: &str) -> String {
    let short: String = endpoint.chars().take(40).collect();
    format!("{}-replay", short.trim_end_matches('-'))
}

/// What a status says about following on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    Going,
    /// Completed: exit 0.
    Done,
    /// It cannot go on (the message says why): exit 1.
    Stuck(String),
}

/// Whether the replay is done, stuck or still going, from its status alone.
pub fn progress(status: &WebhookReplayStatus) -> Progress {
    let find = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let is_true = |c: Option<&Condition>| c.is_some_and(|c| c.status == "True");
    if status.phase == Some(ReplayPhase::Completed) || is_true(find(condition::COMPLETE)) {
        return Progress::Done;
    }
    if status.phase == Some(ReplayPhase::Failed) {
        return Progress::Stuck(message(status).unwrap_or_else(|| "the replay failed".into()));
    }
    if let Some(c) = find(condition::STALLED).filter(|c| c.status == "True") {
        return Progress::Stuck(format!("{}: {}", c.reason, c.message));
    }
    for c in &status.conditions {
        // Conditions that no waiting changes: a range outside the retention window, a
        // spec the operator refuses.
        let terminal = [reason::OUTSIDE_RETENTION, reason::INVALID_SPEC];
        if c.status == "False" && terminal.contains(&c.reason.as_str()) {
            return Progress::Stuck(format!("{}: {}", c.reason, c.message));
        }
    }
    Progress::Going
}

/// The message of the condition that says most: `Complete`, else `Ready`.
fn message(status: &WebhookReplayStatus) -> Option<String> {
    [condition::COMPLETE, condition::READY]
        .iter()
        .filter_map(|t| status.conditions.iter().find(|c| c.type_ == *t))
        .find(|c| !c.message.is_empty())
        .map(|c| format!("{}: {}", c.reason, c.message))
}

fn widths() -> Vec<usize> {
    vec![20, 9, 7, 8, 9, 6]
}

/// The header of the progress lines.
pub fn header() -> String {
    let headers = [
        "TIME",
        "PHASE",
        "MATCHED",
        "ENQUEUED",
        "DELIVERED",
        "FAILED",
        "MESSAGE",
    ];
    line(&headers.map(str::to_owned), &widths())
}

/// One progress line; the caller prints it when it differs from the last one.
pub fn progress_line(status: &WebhookReplayStatus, now: Timestamp) -> String {
    let count = |n: Option<u64>| n.map(|n| n.to_string()).unwrap_or_else(|| NONE.into());
    let phase = status
        .phase
        .map(|p| format!("{p:?}"))
        .unwrap_or_else(|| "Pending".into());
    line(
        &[
            now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
            phase,
            count(status.matched),
            count(status.enqueued),
            count(status.delivered),
            count(status.failed),
            message(status).unwrap_or_default(),
        ],
        &widths(),
    )
}

/// `replay`: create, then follow. Returns whether it completed.
pub async fn run(client: Client, namespace: &str, args: &ReplayArgs) -> Result<bool, crate::Error> {
    let api: Api<WebhookReplay> = Api::namespaced(client, namespace);
    let created = api
        .create(&PostParams::default(), &args.resource(Timestamp::now()))
        .await?;
    let name = created.metadata.name.clone().unwrap_or_default();
    println!("webhookreplay.herald.dev/{name} created");
    if args.no_follow {
        println!("follow it with: kubectl get webhookreplay {name} -n {namespace} -w");
        return Ok(true);
    }
    let follow = async {
        println!("{}", header());
        let mut last = String::new();
        let mut changes = std::pin::pin!(kube::runtime::watcher::watch_object(api.clone(), &name));
        while let Some(change) = changes.next().await {
            let Some(replay) = change.map_err(watch_error)? else {
                return Err(crate::Error::Usage(format!(
                    "webhookreplay {name} was deleted"
                )));
            };
            let status = replay.status.unwrap_or_default();
            // Nothing to say until the operator has looked at it.
            if status.phase.is_none() && status.conditions.is_empty() {
                continue;
            }
            let text = progress_line(&status, Timestamp::now());
            // The time column changes on every line; compare the rest.
            if text.get(20..) != last.get(20..) {
                println!("{text}");
                last = text;
            }
            match progress(&status) {
                Progress::Going => {}
                Progress::Done => return Ok(true),
                Progress::Stuck(why) => {
                    eprintln!("replay {name} cannot go on: {why}");
                    return Ok(false);
                }
            }
        }
        Ok(false)
    };
    match tokio::time::timeout(args.timeout, follow).await {
        Ok(done) => done,
        Err(_) => Err(crate::Error::Usage(format!(
            "replay {name} did not finish within {:?}; it goes on: kubectl get webhookreplay {name} -n {namespace} -w",
            args.timeout
        ))),
    }
}

fn watch_error(e: watcher::Error) -> crate::Error {
    crate::Error::Usage(format!("watching the replay: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: ReplayArgs,
    }

    fn parse(args: &[&str]) -> ReplayArgs {
        Cli::try_parse_from(std::iter::once("replay").chain(args.iter().copied()))
            .unwrap()
            .args
    }

    fn cond(type_: &str, status: &str, reason: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: format!("{reason} message"),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            observed_generation: None,
        }
    }

    #[test]
    fn the_resource_from_the_flags() {
        let now: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let r = parse(&[
            "orders",
            "--from",
            "2h",
            "--type",
            "order.*",
            "--type",
            "invoice.paid",
            "--dry-run",
        ])
        .resource(now);
        assert_eq!(r.metadata.generate_name.as_deref(), Some("orders-replay-"));
        assert_eq!(r.metadata.name, None);
        assert_eq!(r.spec.from.0.to_string(), "2026-12-01T10:00:00Z");
        assert_eq!(r.spec.to, None);
        assert_eq!(r.spec.event_types, ["order.*", "invoice.paid"]);
        assert!(r.spec.dry_run && !r.spec.only_failed);
        let r = parse(&[
            "orders",
            "--from",
            "2026-11-30T00:00:00Z",
            "--to",
            "1h",
            "--only-failed",
            "--name",
            "again",
        ])
        .resource(now);
        assert_eq!(r.metadata.name.as_deref(), Some("again"));
        assert_eq!(r.spec.to.unwrap().0.to_string(), "2026-12-01T11:00:00Z");
        assert!(r.spec.only_failed);
        assert_eq!(prefix(&"x".repeat(80)).len(), 47);
    }

    #[test]
    fn progress_from_the_status() {
        let mut s = WebhookReplayStatus {
            phase: Some(ReplayPhase::Pending),
            conditions: vec![
                cond("Ready", "True", "Valid"),
                cond("Complete", "False", "Waiting"),
            ],
            ..Default::default()
        };
        assert_eq!(progress(&s), Progress::Going);
        s.conditions[0] = cond("Ready", "False", "EndpointNotFound");
        assert_eq!(
            progress(&s),
            Progress::Going,
            "the endpoint may still be created"
        );
        s.conditions[0] = cond("Ready", "False", "OutsideRetention");
        assert!(matches!(progress(&s), Progress::Stuck(m) if m.starts_with("OutsideRetention")));
        s.conditions[0] = cond("Ready", "True", "Valid");
        s.conditions[1] = cond("Complete", "False", "Running");
        s.phase = Some(ReplayPhase::Running);
        assert_eq!(progress(&s), Progress::Going);
        s.conditions.push(cond("Stalled", "True", "Whatever"));
        assert!(matches!(progress(&s), Progress::Stuck(_)));
        s.conditions.pop();
        s.phase = Some(ReplayPhase::Completed);
        assert_eq!(progress(&s), Progress::Done);
        s.phase = Some(ReplayPhase::Failed);
        s.conditions[1] = cond("Complete", "False", "Boom");
        assert_eq!(progress(&s), Progress::Stuck("Boom: Boom message".into()));
    }

    #[test]
    fn progress_lines() {
        let now: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let s = WebhookReplayStatus {
            phase: Some(ReplayPhase::Running),
            matched: Some(120),
            enqueued: Some(80),
            conditions: vec![cond("Complete", "False", "Running")],
            ..Default::default()
        };
        let text = progress_line(&s, now);
        assert_eq!(
            text,
            "2026-12-01T12:00:00Z   Running     120       80         <none>      <none>   Running: Running message"
        );
        assert_eq!(header().find("MATCHED"), text.find("120"));
    }
}
