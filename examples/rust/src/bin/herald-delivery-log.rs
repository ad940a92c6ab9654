//! Prints the last attempts of one endpoint from Herald's attempt log (the JetStream
//! stream `HERALD_ATTEMPTS`, subject `herald.attempts.<namespace>.<name>`).
//!
//!     herald-delivery-log --namespace shop --endpoint orders --last 10

use anyhow::Context as _;
use async_nats::jetstream::consumer::{DeliverPolicy, pull::OrderedConfig};
use clap::Parser;
use futures::StreamExt as _;
use herald_core::dataplane::{ATTEMPTS_STREAM, AttemptRecord, EndpointKey};
use std::collections::VecDeque;

#[derive(Parser)]
#[command(about = "Prints the last delivery attempts of a WebhookEndpoint")]
struct Args {
    #[arg(long, env = "HERALD_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[arg(long, short)]
    namespace: String,
    /// The WebhookEndpoint's name.
    #[arg(long, short)]
    endpoint: String,
    /// How many attempts to show (the newest last).
    #[arg(long, default_value_t = 20)]
    last: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = async_nats::connect(&args.nats_url).await?;
    let js = async_nats::jetstream::new(client);
    let subject = EndpointKey::new(&args.namespace, &args.endpoint).attempts_subject();
    let stream = js
        .get_stream(ATTEMPTS_STREAM)
        .await
        .context("no attempt log yet (is a dispatcher running?)")?;
    let Ok(last) = stream.get_last_raw_message_by_subject(&subject).await else {
        println!(
            "no attempts recorded for {}/{} yet",
            args.namespace, args.endpoint
        );
        return Ok(());
    };
    // An ordered consumer reads the endpoint's subject from the start, in one stream of
    // messages; keep only the newest `last` records.
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: subject,
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await?;
    let mut messages = consumer.messages().await?;
    let mut rows: VecDeque<AttemptRecord> = VecDeque::with_capacity(args.last + 1);
    while let Some(message) = messages.next().await {
        let message = message?;
        for line in message
            .payload
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
        {
            rows.push_back(serde_json::from_slice(line)?);
            if rows.len() > args.last {
                rows.pop_front();
            }
        }
        if message.info().map_err(anyhow::Error::msg)?.stream_sequence >= last.sequence {
            break;
        }
    }
    println!(
        "{:<12} {:<32} {:>3} {:<10} {:>4} {:>8}  {:<10} {:<12} RESPONSE",
        "TIME", "EVENT (webhook-id)", "TRY", "OUTCOME", "HTTP", "LATENCY", "STATE", "NEXT TRY"
    );
    for a in rows {
        println!(
            "{:<12} {:<32} {:>3} {:<10} {:>4} {:>6}ms  {:<10} {:<12} {}",
            clock(a.time_ms),
            a.event_id,
            a.attempt,
            a.outcome.as_str(),
            a.http_status.map_or("-".to_owned(), |s| s.to_string()),
            a.latency_ms,
            a.state.as_str(),
            a.next_attempt_ms.map_or("-".to_owned(), clock),
            a.response
                .chars()
                .take(40)
                .collect::<String>()
                .replace('\n', " "),
        );
    }
    Ok(())
}

/// `HH:MM:SS.mmm` UTC.
fn clock(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map(|t| t.strftime("%H:%M:%S%.3f").to_string())
        .unwrap_or_else(|| ms.to_string())
}
