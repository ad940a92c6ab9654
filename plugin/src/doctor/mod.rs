//! `doctor`: is Herald installed and running the way this plugin expects? One line per
//! check, each `OK` or what is wrong and what to change; exit status 1 when any fails.
//!
//! With the user's own identity (the kubeconfig, and NATS credentials from the flags a
//! platform team's admin identity needs), it checks:
//! - [`crds`]: each CRD installed, established, with the versions and schema compiled
//!   into this plugin;
//! - [`leader`]: an operator holds the leader Lease and renews it;
//! - [`nats`]: NATS reachable, JetStream on, the server new enough with a large enough
//!   `max_payload`; Herald's streams there with the installation's replicas, a leader,
//!   and room for its largest messages;
//! - [`shards`]: every shard leased by a live dispatcher;
//! - [`readyz`]: herald-api ready, when `--api-url` is given.
//!
//! Every verdict is a pure function of observed facts ([`verdicts`]); [`observe`] does
//! all the IO, read-only.

pub mod crds;
pub mod leader;
pub mod nats;
pub mod observe;
pub mod readyz;
pub mod report;
pub mod shards;

use std::time::Duration;

use herald_core::dataplane::layout::{self, StreamSpec};
use herald_core::flags::NatsArgs;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::table::Output;
use leader::LeaseFacts;
use nats::{ServerFacts, StreamFacts, Wanted};
use report::Verdict;
use shards::ShardFacts;

/// Flags of `doctor`.
#[derive(Clone, Debug, clap::Args)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// The largest event the dispatchers accept (their --max-event-bytes): the NATS
    /// server and the streams must carry it with Herald's headers.
    #[arg(long, env = "HERALD_MAX_EVENT_BYTES", value_name = "BYTES",
          default_value_t = herald_core::envelope::DEFAULT_MAX_EVENT_BYTES)]
    pub max_event_bytes: usize,
    /// The namespace Herald's operator runs in (the chart's release namespace): its
    /// leader Lease is there.
    #[arg(
        long,
        env = "HERALD_OPERATOR_NAMESPACE",
        default_value = "herald-system",
        value_name = "NAMESPACE"
    )]
    pub operator_namespace: String,
    /// The operator's leader Lease (default: the chart's, herald-operator-leader, else
    /// the operator's own default, herald-operator).
    #[arg(long, env = "HERALD_LEASE_NAME", value_name = "NAME")]
    pub lease_name: Option<String>,
    /// How long each check may wait for an answer.
    #[arg(long, default_value = "10s", value_parser = crate::time::parse_duration)]
    pub timeout: Duration,
    /// `json` or `yaml` print the checks as a document.
    #[arg(short, long, value_enum, default_value_t)]
    pub output: Output,
}

/// What the verdicts are judged against, from the flags.
#[derive(Clone, Debug)]
pub struct Settings {
    pub namespace: String,
    pub lease_names: Vec<String>,
    pub wanted: Wanted,
    pub api_url: Option<String>,
    pub timeout: Duration,
}

/// Everything observed, each part either what was seen or why it could not be.
#[derive(Clone, Debug)]
pub struct Facts {
    /// The installed CRD for each of [`crds::expected`], in order.
    pub crds: Vec<Result<Option<CustomResourceDefinition>, String>>,
    pub lease: Result<Option<LeaseFacts>, String>,
    pub server: Result<ServerFacts, String>,
    /// `None`: not looked at, because NATS or JetStream did not answer.
    pub shards: Option<Result<ShardFacts, String>>,
    /// For each of [`stream_specs`], in order; `None` as for `shards`.
    pub streams: Option<Vec<Result<Option<StreamFacts>, String>>>,
    /// herald-api's `/readyz`, when an address was given.
    pub api: Option<readyz::Answer>,
    pub now: jiff::Timestamp,
}

/// Herald's streams (names and what each must allow; retention and partitions do not
/// matter here).
pub fn stream_specs() -> [StreamSpec; 4] {
    layout::streams(layout::DEFAULT_RETENTION, 1)
}

/// Every verdict, in the order printed: CRDs, operator, NATS, shards, streams, API.
pub fn verdicts(facts: &Facts, settings: &Settings) -> Vec<Verdict> {
    let mut out: Vec<Verdict> = crds::expected()
        .iter()
        .zip(&facts.crds)
        .map(|(expected, installed)| crds::verdict(expected, installed))
        .collect();
    out.push(leader::verdict(
        &settings.namespace,
        &settings.lease_names,
        &facts.lease,
        facts.now,
    ));
    out.push(nats::server_verdict(
        &facts.server,
        settings.wanted.max_event_bytes,
    ));
    const UNUSABLE: &str = "not checked: NATS did not answer (see the nats line)";
    out.push(match &facts.shards {
        Some(shards) => shards::verdict(shards, &settings.namespace),
        None => Verdict::skip("shards", UNUSABLE),
    });
    for (i, spec) in stream_specs().iter().enumerate() {
        out.push(match facts.streams.as_ref().and_then(|s| s.get(i)) {
            Some(stream) => nats::stream_verdict(spec, stream, settings.wanted),
            None => Verdict::skip(format!("stream/{}", spec.name), UNUSABLE),
        });
    }
    out.push(readyz::verdict(
        settings.api_url.as_deref(),
        facts.api.as_ref(),
        &settings.namespace,
    ));
    out
}

/// `doctor`. Returns whether every check passed. `kube` is a client with the user's
/// identity, or why there is none (every Kubernetes check then says so).
pub async fn run(
    args: &DoctorArgs,
    kube: Result<kube::Client, String>,
    api_url: Option<&str>,
) -> Result<bool, crate::Error> {
    let DoctorArgs {
        nats,
        max_event_bytes,
        operator_namespace,
        lease_name,
        timeout,
        output,
    } = args;
    let settings = Settings {
        namespace: operator_namespace.clone(),
        lease_names: leader::candidates(lease_name.as_deref()),
        wanted: Wanted {
            replicas: usize::from(nats.replicas),
            max_event_bytes: *max_event_bytes,
        },
        api_url: api_url
            .map(str::trim)
            .filter(|u| !u.is_empty())
            .map(str::to_owned),
        timeout: *timeout,
    };
    let facts = observe::observe(&settings, nats, kube).await;
    let verdicts = verdicts(&facts, &settings);
    if !output.print_document(&report::document(&verdicts))? {
        print!("{}", report::lines(&verdicts));
    }
    Ok(report::passed(&verdicts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use report::Status;

    fn settings() -> Settings {
        Settings {
            namespace: "herald-system".into(),
            lease_names: leader::candidates(None),
            wanted: Wanted {
                replicas: 1,
                max_event_bytes: herald_core::envelope::DEFAULT_MAX_EVENT_BYTES,
            },
            api_url: None,
            timeout: Duration::from_secs(10),
        }
    }

    fn healthy() -> Facts {
        let now: jiff::Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let installed = |mut crd: CustomResourceDefinition| {
            crd.status = serde_json::from_value(serde_json::json!({"conditions": [
                {"type": "Established", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}))
            .unwrap();
            Ok(Some(crd))
        };
        let stream = StreamFacts {
            replicas: 1,
            file: true,
            max_message_size: -1,
            schedules: true,
            leader: Some("n0".into()),
            clustered: true,
            offline: vec![],
            messages: 0,
        };
        Facts {
            crds: crds::expected().into_iter().map(installed).collect(),
            lease: Ok(Some(LeaseFacts {
                name: "herald-operator-leader".into(),
                holder: Some("op-0".into()),
                renewed: Some(now),
                duration_secs: Some(15),
            })),
            server: Ok(ServerFacts {
                version: "2.15.1".into(),
                max_payload: 1 << 20,
                jetstream: Ok(()),
            }),
            shards: Some(Ok(ShardFacts {
                count: Some(1),
                holders: [(0, "d0".to_owned())].into(),
                members: ["d0".to_owned()].into(),
            })),
            streams: Some(vec![Ok(Some(stream)); 4]),
            api: None,
            now,
        }
    }

    fn lines(verdicts: &[Verdict]) -> Vec<(String, Status)> {
        verdicts
            .iter()
            .map(|v| (v.check.clone(), v.status))
            .collect()
    }

    #[test]
    fn a_healthy_installation_passes_with_a_line_per_check() {
        let verdicts = verdicts(&healthy(), &settings());
        let checks: Vec<&str> = verdicts.iter().map(|v| v.check.as_str()).collect();
        assert_eq!(
            checks,
            [
                "crd/webhookendpoints.herald.dev",
                "crd/signingsecrets.herald.dev",
                "crd/webhookreplays.herald.dev",
                "operator",
                "nats",
                "shards",
                "stream/HERALD_EVENTS",
                "stream/HERALD_DELIVERIES",
                "stream/HERALD_ATTEMPTS",
                "stream/HERALD_DEADLETTER",
                "herald-api",
            ]
        );
        assert!(report::passed(&verdicts), "{verdicts:#?}");
        assert_eq!(verdicts.last().unwrap().status, Status::Skip);
    }

    #[test]
    fn without_nats_the_data_plane_checks_are_skipped_and_the_run_fails() {
        let facts = Facts {
            server: Err("cannot connect to NATS at nats://127.0.0.1:4222: refused".into()),
            shards: None,
            streams: None,
            ..healthy()
        };
        let verdicts = verdicts(&facts, &settings());
        assert!(!report::passed(&verdicts));
        let by_check = lines(&verdicts);
        assert!(by_check.contains(&("nats".into(), Status::Fail)));
        assert!(by_check.contains(&("shards".into(), Status::Skip)));
        assert!(by_check.contains(&("stream/HERALD_EVENTS".into(), Status::Skip)));
        assert!(by_check.contains(&("operator".into(), Status::Ok)));
    }

    #[test]
    fn without_a_kubeconfig_the_kubernetes_checks_fail_and_the_rest_still_run() {
        let no_kube = "reading the kubeconfig: no such file".to_owned();
        let facts = Facts {
            crds: vec![Err(no_kube.clone()); 3],
            lease: Err(no_kube),
            ..healthy()
        };
        let verdicts = verdicts(&facts, &settings());
        let failed: Vec<&str> = verdicts
            .iter()
            .filter(|v| v.status == Status::Fail)
            .map(|v| v.check.as_str())
            .collect();
        assert_eq!(
            failed,
            [
                "crd/webhookendpoints.herald.dev",
                "crd/signingsecrets.herald.dev",
                "crd/webhookreplays.herald.dev",
                "operator"
            ]
        );
        assert!(verdicts[0].message.contains("no such file"));
    }

    #[test]
    fn the_flags_parse_like_the_other_binaries() {
        use clap::Parser as _;
        let cli = crate::Cli::try_parse_from([
            "kubectl-herald",
            "doctor",
            "--nats-url",
            "nats://127.0.0.1:4222",
            "--jetstream-replicas",
            "3",
            "--max-event-bytes",
            "1000",
            "--operator-namespace",
            "herald",
            "--api-url",
            "http://127.0.0.1:8080",
            "-o",
            "json",
        ])
        .unwrap();
        let crate::Command::Doctor(args) = cli.command else {
            panic!("doctor");
        };
        assert_eq!(args.nats.replicas, 3);
        assert_eq!(args.max_event_bytes, 1000);
        assert_eq!(args.operator_namespace, "herald");
        assert_eq!(args.output, Output::Json);
        assert_eq!(cli.api_url.as_deref(), Some("http://127.0.0.1:8080"));
    }
}
