//! `kubectl herald`: what a tenant asks Herald when something goes wrong — "did you
//! send it?" and "send it again" — from the command line, with the user's own
//! Kubernetes identity and RBAC.
//!
//! - [`deliveries`], [`tail`]: the delivery log, redelivery, re-driving dead deliveries,
//!   test events, through Herald's HTTP API ([`api`]);
//! - [`replay`], [`rotate`], [`endpoints`]: Herald's resources, through the Kubernetes
//!   API ([`context`]);
//! - [`verify`]: a Standard Webhooks signature checked locally, no cluster needed;
//! - [`doctor`]: the installation checked, a line per part (CRDs, operator, NATS, shards,
//!   streams, HTTP API), for the platform team;
//! - [`table`], [`time`]: kubectl-like output and time flags.
//!
//! `main.rs` only parses the flags and calls [`run`].

#![forbid(unsafe_code)]

pub mod api;
pub mod context;
pub mod deliveries;
pub mod doctor;
pub mod endpoints;
pub mod replay;
pub mod rotate;
pub mod table;
pub mod tail;
pub mod time;
pub mod verify;

use std::io::{IsTerminal as _, Read as _};
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::api::{Api, ApiError, Token};
use crate::context::{Context, ContextError, KubeArgs};
use crate::table::Output;

/// kubectl plugin for Herald webhook delivery: the delivery log, redelivery, replays,
/// key rotation and signature checks.
///
/// Commands that read the delivery log or act on deliveries talk to Herald's HTTP API
/// (--api-url or HERALD_API_URL) with the bearer token of your kubeconfig identity
/// (or --token); the others talk to the Kubernetes API like kubectl. Either way your
/// RBAC in the namespace decides what you may see and do.
#[derive(Parser, Debug)]
#[command(name = "kubectl-herald", bin_name = "kubectl herald", version)]
pub struct Cli {
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Herald's HTTP API, e.g. http://127.0.0.1:8080 after
    /// `kubectl port-forward -n herald-system svc/herald-api 8080:8080`.
    #[arg(long, env = "HERALD_API_URL", global = true, value_name = "URL")]
    pub api_url: Option<String>,
    /// A bearer token for Herald's API instead of the kubeconfig identity's.
    #[arg(
        long,
        env = "HERALD_TOKEN",
        global = true,
        hide_env_values = true,
        value_name = "TOKEN"
    )]
    pub token: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List an endpoint's deliveries, newest first.
    Deliveries {
        endpoint: String,
        #[command(flatten)]
        filters: deliveries::Filters,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show every attempt of one delivery.
    Attempts {
        endpoint: String,
        event_id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Deliver one event to an endpoint again (same webhook-id).
    Redeliver {
        endpoint: String,
        event_id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Deliver every dead delivery of an endpoint again.
    RedriveDead {
        endpoint: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Send a test event to an endpoint.
    Test {
        endpoint: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Follow an endpoint's attempts as they happen (Ctrl-C stops).
    Tail {
        endpoint: String,
        /// Also print attempts of events since this time (RFC 3339 or a duration ago);
        /// by default only attempts made from now on.
        #[arg(long, value_name = "TIME")]
        since: Option<time::TimeArg>,
        /// `json` prints one JSON object per attempt.
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Replay an endpoint's events of a time range (creates a WebhookReplay and follows it).
    Replay(replay::ReplayArgs),
    /// Rotate a SigningSecret's key now and wait for the new key.
    Rotate(rotate::RotateArgs),
    /// Check a webhook request's signature (raw HTTP request on stdin).
    Verify(verify::VerifyArgs),
    /// List the namespace's WebhookEndpoints with their state.
    Endpoints {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Check the installation: CRDs, operator leadership, NATS, shards, streams and
    /// Herald's API, one line each (exit status 1 when any check fails).
    Doctor(doctor::DoctorArgs),
}

/// Everything that ends a command with an error message and exit status 1.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Api(ApiError),
    #[error(transparent)]
    Context(#[from] ContextError),
    #[error("{}", kube_message(.0))]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Usage(String),
    #[error("reading stdin: {0}")]
    Stdin(#[source] std::io::Error),
    #[error("printing JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("printing YAML: {0}")]
    Yaml(#[from] serde_norway::Error),
}

/// The API server's own message for a refused request (what kubectl shows).
pub(crate) fn kube_message(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!(
            "{} (HTTP {}, {})",
            status.message, status.code, status.reason
        ),
        other => other.to_string(),
    }
}

/// Runs a command. `Ok(false)`: it ran and the answer is "no" (an invalid signature, a
/// replay that cannot go on): exit status 1 without an error message.
pub async fn run(cli: Cli) -> Result<bool, Error> {
    let Cli {
        kube,
        api_url,
        token,
        command,
    } = cli;
    let api = |context: Option<Arc<Context>>, namespace: String| {
        let token = match (token.clone(), context) {
            (Some(token), _) => Token::Fixed(token),
            (None, Some(context)) => Token::Kubeconfig(context),
            (None, None) => unreachable!("a kubeconfig is loaded when there is no --token"),
        };
        Api::new(api_url.as_deref(), &namespace, token).map_err(Error::Api)
    };
    match command {
        Command::Verify(args) => {
            if std::io::stdin().is_terminal() {
                return Err(Error::Usage(
                    "verify reads the raw HTTP request from stdin: kubectl herald verify --secret whsec_... < request".into(),
                ));
            }
            let mut raw = Vec::new();
            std::io::stdin()
                .read_to_end(&mut raw)
                .map_err(Error::Stdin)?;
            let now = jiff::Timestamp::now().as_second();
            Ok(verify::run(&args, &raw, now))
        }
        Command::Replay(args) => {
            let context = Context::load(&kube).await?;
            replay::run(context.client()?, &context.namespace, &args).await
        }
        Command::Rotate(args) => {
            let context = Context::load(&kube).await?;
            rotate::run(context.client()?, &context.namespace, &args).await
        }
        Command::Endpoints { output } => {
            let context = Context::load(&kube).await?;
            endpoints::run(context.client()?, &context.namespace, output).await?;
            Ok(true)
        }
        Command::Doctor(args) => {
            // A missing or unusable kubeconfig fails the Kubernetes checks, not the run:
            // the NATS and API checks still say what they see.
            let client = match Context::load(&kube).await {
                Ok(context) => context.client().map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            doctor::run(&args, client, api_url.as_deref()).await
        }
        command => {
            // With --token and -n the kubeconfig is not needed at all (a CI job, a pod).
            let (context, namespace) = match (&token, &kube.namespace) {
                (Some(_), Some(ns)) => (None, ns.clone()),
                _ => {
                    let context = Context::load(&kube).await?;
                    let namespace = context.namespace.clone();
                    (Some(Arc::new(context)), namespace)
                }
            };
            let api = api(context, namespace)?;
            match command {
                Command::Deliveries {
                    endpoint,
                    filters,
                    output,
                } => deliveries::list(&api, &endpoint, &filters, output).await?,
                Command::Attempts {
                    endpoint,
                    event_id,
                    output,
                } => deliveries::attempts(&api, &endpoint, &event_id, output).await?,
                Command::Redeliver {
                    endpoint,
                    event_id,
                    output,
                } => deliveries::act(&api, "redeliver", &endpoint, Some(&event_id), output).await?,
                Command::RedriveDead { endpoint, output } => {
                    deliveries::act(&api, "redrive-dead", &endpoint, None, output).await?
                }
                Command::Test { endpoint, output } => {
                    deliveries::act(&api, "test", &endpoint, None, output).await?
                }
                Command::Tail {
                    endpoint,
                    since,
                    output,
                } => tail::run(&api, &endpoint, since, output).await?,
                Command::Verify(_)
                | Command::Replay(_)
                | Command::Rotate(_)
                | Command::Endpoints { .. }
                | Command::Doctor(_) => {
                    unreachable!("handled above")
                }
            }
            Ok(true)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        <Cli as clap::CommandFactory>::command().debug_assert();
    }

    #[test]
    fn global_flags_go_anywhere_and_output_takes_kubectl_names() {
        let cli = Cli::try_parse_from([
            "kubectl-herald",
            "deliveries",
            "orders",
            "-n",
            "shop",
            "--status",
            "dead,retrying",
            "--since",
            "2h",
            "-o",
            "wide",
            "--api-url",
            "http://127.0.0.1:1",
        ])
        .unwrap();
        assert_eq!(cli.kube.namespace.as_deref(), Some("shop"));
        let Command::Deliveries {
            filters, output, ..
        } = cli.command
        else {
            panic!("deliveries");
        };
        assert_eq!(output, Output::Wide);
        assert_eq!(filters.status, ["dead", "retrying"]);
        assert!(
            Cli::try_parse_from(["kubectl-herald", "deliveries", "o", "--status", "lost"]).is_err()
        );
        assert!(Cli::try_parse_from(["kubectl-herald", "deliveries", "o", "-o", "xml"]).is_err());
    }
}
