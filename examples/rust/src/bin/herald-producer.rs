//! Publishes events to Herald the way any producer does: `{"type", "data"}` to
//! `herald.events.<namespace>.<type>` on NATS JetStream, with a `Nats-Msg-Id` header so a
//! publish retried after a timeout is stored once.
//!
//!     herald-producer --namespace shop --type order.created --count 5
//!     herald-producer --namespace shop --type order.created --data '{"orderId":"o-1"}' --msg-id o-1-created

use async_nats::HeaderMap;
use clap::Parser;
use serde_json::{Value, json};

#[derive(Parser)]
#[command(about = "Publishes events to Herald's ingest subjects")]
struct Args {
    #[arg(long, env = "HERALD_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// The tenant namespace whose endpoints receive the event.
    #[arg(long, short)]
    namespace: String,
    /// The event type, e.g. `order.created`.
    #[arg(long = "type", short = 't')]
    event_type: String,
    /// The event's `data` (JSON). Default: a sample order/invoice numbered 1..=count.
    #[arg(long)]
    data: Option<String>,
    /// How many events to publish.
    #[arg(long, default_value_t = 1)]
    count: u32,
    /// Idempotency key (`Nats-Msg-Id`); publishing the same id again within JetStream's
    /// duplicate window stores nothing. Default: `<type>-<data.id>` for generated data.
    #[arg(long)]
    msg_id: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let client = async_nats::connect(&args.nats_url).await?;
    let js = async_nats::jetstream::new(client);
    let subject = herald_core::dataplane::event_subject(&args.namespace, &args.event_type);
    let stamp = jiff::Timestamp::now().as_millisecond();
    for i in 1..=args.count {
        let data: Value = match &args.data {
            Some(text) => serde_json::from_str(text)?,
            None => json!({
                "id": format!("{}-{stamp}-{i}", args.event_type.split('.').next().unwrap_or("ev")),
                "customerId": format!("cus-{}", i % 3),
                "amount": 1000 + i * 250,
            }),
        };
        let msg_id = match &args.msg_id {
            Some(id) if args.count == 1 => id.clone(),
            Some(id) => format!("{id}-{i}"),
            None => format!("{}-{}", args.event_type, data["id"].as_str().unwrap_or("x")),
        };
        let body = serde_json::to_vec(&json!({"type": args.event_type, "data": data}))?;
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", msg_id.as_str());
        // The first await sends; the second waits for JetStream's acknowledgement. Only an
        // acknowledged event is guaranteed to be delivered.
        let ack = js
            .publish_with_headers(subject.clone(), headers, body.into())
            .await?
            .await?;
        println!(
            "published {subject} seq={} msg-id={msg_id}{}",
            ack.sequence,
            if ack.duplicate {
                " (duplicate: already stored, not stored again)"
            } else {
                ""
            }
        );
    }
    Ok(())
}
