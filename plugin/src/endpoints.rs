//! `endpoints`: the namespace's `WebhookEndpoint`s with their state, health and last
//! delivery, read from the Kubernetes API with the user's identity (the status the
//! operator writes; the same as `kubectl get whe` with more columns).

use herald_core::v1alpha1::WebhookEndpoint;
use jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::table::{Output, Table};
use crate::time::age;

/// The table of endpoints.
pub fn table(endpoints: &[WebhookEndpoint], now: Timestamp, wide: bool) -> Table {
    let mut headers = vec![
        "name",
        "state",
        "success",
        "backlog",
        "last status",
        "last delivery",
        "age",
    ];
    if wide {
        headers.extend(["url", "circuit", "limit", "p95", "shard"]);
    }
    let mut table = Table::new(headers);
    for e in endpoints {
        let status = e.status.clone().unwrap_or_default();
        let last = status.last_delivery.as_ref();
        let mut row = vec![
            e.metadata.name.clone().unwrap_or_default(),
            status.state.map(|s| format!("{s:?}")).unwrap_or_default(),
            status.success_rate.clone().unwrap_or_default(),
            status.backlog.map(|b| b.to_string()).unwrap_or_default(),
            last.map(|l| {
                l.http_status
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| l.outcome.clone())
            })
            .unwrap_or_default(),
            last.map(|l| age(l.time.0, now)).unwrap_or_default(),
            e.metadata
                .creation_timestamp
                .as_ref()
                .map(|t| age(t.0, now))
                .unwrap_or_default(),
        ];
        if wide {
            row.extend([
                e.spec.url.clone(),
                status.circuit.map(|c| format!("{c:?}")).unwrap_or_default(),
                status
                    .concurrency_limit
                    .map(|l| l.to_string())
                    .unwrap_or_default(),
                status.p95_latency.clone().unwrap_or_default(),
                status.shard.map(|s| s.to_string()).unwrap_or_default(),
            ]);
        }
        table.row(row);
    }
    table
}

/// `endpoints`.
pub async fn run(client: Client, namespace: &str, output: Output) -> Result<(), crate::Error> {
    let api: Api<WebhookEndpoint> = Api::namespaced(client, namespace);
    let list = api.list(&ListParams::default()).await?;
    if output.print_document(&serde_json::to_value(&list)?)? {
        return Ok(());
    }
    if list.items.is_empty() {
        eprintln!("No WebhookEndpoints found in namespace {namespace}.");
        return Ok(());
    }
    print!(
        "{}",
        table(&list.items, Timestamp::now(), output.wide()).render()
    );
    Ok(())
}
