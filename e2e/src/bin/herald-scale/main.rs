//! The control plane at scale, measured against the real API server: N `WebhookEndpoint`s
//! created, Ready and receiving traffic, with the release operator and a dispatcher as
//! processes of their own. Reports time to Ready, the operator's memory and CPU, API
//! requests by verb, etcd bytes per object and status writes per minute at steady state.
//! `make scale` builds it in release mode and runs it; `docs/scale.md` holds the results.
//!
//! Phases: baseline (operator leading, no endpoints) → create N endpoints (K namespaces,
//! one `SigningSecret` each) → all Ready → one event to every endpoint (the first sweep)
//! → a steady trickle for `--steady`. The harness's own API requests are the creates
//! (POST), one watch of the endpoints and `kubectl get --raw /metrics` scrapes; the report
//! says which rows are its own.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use clap::Parser;
use futures::stream::{FuturesUnordered, StreamExt};
use herald_core::dataplane::event_subject;
use herald_core::v1alpha1::{SigningSecret, WebhookEndpoint};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::PostParams;
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::json;

mod measure;

use measure::*;

#[derive(Parser)]
struct Args {
    /// WebhookEndpoints to create.
    #[arg(long, default_value_t = 20_000)]
    endpoints: usize,
    /// Namespaces (tenants) they are spread over, one SigningSecret each.
    #[arg(long, default_value_t = 20)]
    namespaces: usize,
    /// Events per second of the trickle (each goes to one endpoint, round robin).
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// Length of the steady-state window after every endpoint received an event.
    #[arg(long, default_value = "180s", value_parser = herald_core::duration::parse_std)]
    steady: Duration,
    /// Give up waiting for Ready (or for the first sweep) after this long.
    #[arg(long, default_value = "40m", value_parser = herald_core::duration::parse_std)]
    timeout: Duration,
    /// Creates in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// A title for the report (e.g. "before" / "after").
    #[arg(long, default_value = "run")]
    label: String,
    /// Append the Markdown report to this file (else stdout only).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Extra flags for the operator (after `--`).
    #[arg(last = true)]
    operator_args: Vec<String>,
}

/// What the harness's watch of the endpoints saw.
#[derive(Default)]
struct Watched {
    ready: HashSet<String>,
    /// Every ADDED/MODIFIED event: a write that changed an object.
    changes: u64,
    all_ready_at: Option<Instant>,
}

/// What the receiver saw.
#[derive(Default)]
struct Seen {
    paths: HashSet<String>,
    requests: u64,
}

async fn receive(State(seen): State<Arc<Mutex<Seen>>>, Path(path): Path<String>) -> StatusCode {
    let mut seen = seen.lock().unwrap();
    seen.requests += 1;
    seen.paths.insert(path);
    StatusCode::OK
}

fn is_ready(ep: &WebhookEndpoint) -> bool {
    ep.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    })
}

/// Endpoint `i`: its namespace index and name; it receives event type `scale.e<i>`.
fn placement(i: usize, namespaces: usize) -> (usize, String) {
    (i % namespaces, format!("ep-{i}"))
}

fn per_sec(n: f64, d: Duration) -> f64 {
    n / d.as_secs_f64().max(1e-9)
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    herald_dispatcher::install_crypto_provider();
    // `HERALD_TESTENV_DIR` (as `make scale` sets): that environment, else a fresh one.
    let env = herald_e2e::env();
    let client = env.client().await;
    herald_e2e::install_crds(&client).await;
    let run = format!("{:x}", std::process::id());
    let logs = std::env::temp_dir().join(format!("herald-scale-{run}"));
    std::fs::create_dir_all(&logs).expect("log dir");
    eprintln!("herald-scale: logs in {}", logs.display());

    // Receiver.
    let seen = Arc::new(Mutex::new(Seen::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("receiver port");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let app = Router::new()
        .route("/{*path}", post(receive))
        .with_state(seen.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Dispatcher and operator.
    let dport = herald_e2e::free_port();
    let dispatcher = spawn(
        "herald-test-dispatcher",
        &[
            "--listen",
            &format!("127.0.0.1:{dport}"),
            "--nats-url",
            env.nats_url(),
            "--replica-id",
            "scale",
            "--allow-http",
            "--allow-network",
            "127.0.0.0/8",
            "--shards",
            "4",
        ]
        .map(str::to_owned),
        &logs.join("dispatcher.log"),
    );
    let oport = herald_e2e::free_port();
    let operator_metrics = format!("http://127.0.0.1:{oport}/metrics");
    let mut operator_args = [
        "--nats-url",
        env.nats_url(),
        "--kubeconfig",
        &env.kubeconfig().display().to_string(),
        "--lease-namespace",
        "default",
        "--listen",
        &format!("127.0.0.1:{oport}"),
        "--shards",
        "4",
        "--allow-network",
        "127.0.0.0/8",
        "--allow-http",
    ]
    .map(str::to_owned)
    .to_vec();
    operator_args.extend(args.operator_args.iter().cloned());
    let operator = spawn(
        "herald-test-operator",
        &operator_args,
        &logs.join("operator.log"),
    );
    let pid = operator.id();
    let leading = herald_e2e::eventually("the operator leading", Duration::from_secs(120), || {
        let url = operator_metrics.clone();
        async move {
            let text = reqwest::get(&url).await.ok()?.text().await.ok()?;
            text.lines()
                .any(|l| l == "herald_operator_leader 1")
                .then_some(())
        }
    });
    leading.await;
    // Let start-up settle (first lists, NATS watches) before the baseline.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let base_snap = snapshot(env, pid, &operator_metrics).await;

    // Peak RSS, sampled every second.
    let peak = Arc::new(Mutex::new(0u64));
    {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                let (rss, _) = proc_usage(pid);
                {
                    let mut p = peak.lock().unwrap();
                    *p = (*p).max(rss);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    // Namespaces and SigningSecrets.
    let namespaces: Vec<String> = (0..args.namespaces)
        .map(|i| format!("scale-{run}-{i}"))
        .collect();
    for ns in &namespaces {
        let obj: Namespace =
            serde_json::from_value(json!({"metadata": {"name": ns}})).expect("namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &obj)
            .await
            .expect("creating a namespace");
        let secret: SigningSecret = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "SigningSecret",
            "metadata": {"name": "signing", "namespace": ns}, "spec": {}
        }))
        .expect("signing secret");
        Api::<SigningSecret>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .expect("creating a SigningSecret");
    }

    // The harness's one watch of every endpoint.
    let watched = Arc::new(Mutex::new(Watched::default()));
    let label = format!("herald.dev/scale={run}");
    {
        let watched = watched.clone();
        let api: Api<WebhookEndpoint> = Api::all(client.clone());
        let total = args.endpoints;
        let stream = watcher(api, watcher::Config::default().labels(&label))
            .default_backoff()
            .applied_objects();
        tokio::spawn(async move {
            futures::pin_mut!(stream);
            while let Some(Ok(ep)) = stream.next().await {
                let mut w = watched.lock().unwrap();
                w.changes += 1;
                let name = format!(
                    "{}/{}",
                    ep.metadata.namespace.as_deref().unwrap_or(""),
                    ep.metadata.name.as_deref().unwrap_or("")
                );
                if is_ready(&ep) {
                    w.ready.insert(name);
                } else {
                    w.ready.remove(&name);
                }
                if w.ready.len() >= total && w.all_ready_at.is_none() {
                    w.all_ready_at = Some(Instant::now());
                }
            }
        });
    }

    // Create the endpoints.
    eprintln!("herald-scale: creating {} endpoints", args.endpoints);
    let created_from = Instant::now();
    let mut inflight = FuturesUnordered::new();
    for i in 0..args.endpoints {
        let (n, name) = placement(i, args.namespaces);
        let ns = namespaces[n].clone();
        let ep: WebhookEndpoint = serde_json::from_value(json!({
            "apiVersion": "herald.dev/v1alpha1", "kind": "WebhookEndpoint",
            "metadata": {"name": name, "namespace": ns, "labels": {"herald.dev/scale": run}},
            "spec": {
                "url": format!("{base}/{ns}/{name}"),
                "eventTypes": [format!("scale.e{i}")],
                "secretRef": {"name": "signing"}
            }
        }))
        .expect("endpoint");
        let api: Api<WebhookEndpoint> = Api::namespaced(client.clone(), &ns);
        inflight.push(async move {
            for _ in 0..5 {
                match api.create(&PostParams::default(), &ep).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(e)) if e.code == 409 => return,
                    Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
                }
            }
            panic!("creating an endpoint failed five times");
        });
        if inflight.len() >= args.concurrency {
            inflight.next().await;
        }
        if i > 0 && i % 5000 == 0 {
            eprintln!("herald-scale: {i} created");
        }
    }
    while inflight.next().await.is_some() {}
    let created = created_from.elapsed();
    eprintln!("herald-scale: created in {created:?}; waiting for Ready");

    let deadline = Instant::now() + args.timeout;
    loop {
        let (ready, done) = {
            let w = watched.lock().unwrap();
            (w.ready.len(), w.all_ready_at)
        };
        if done.is_some() {
            break;
        }
        if Instant::now() > deadline {
            panic!(
                "only {ready} of {} Ready after {:?}",
                args.endpoints, args.timeout
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let ready_at = watched.lock().unwrap().all_ready_at.expect("ready");
    let to_ready = ready_at - created_from;
    eprintln!("herald-scale: all Ready {to_ready:?} after the first create");
    let ready_snap = snapshot(env, pid, &operator_metrics).await;
    let sample_obj = Api::<WebhookEndpoint>::namespaced(client.clone(), &namespaces[0])
        .get("ep-0")
        .await
        .expect("one endpoint");
    let object_bytes = serde_json::to_vec(&sample_obj)
        .map(|v| v.len())
        .unwrap_or(0);
    let managed_bytes = serde_json::to_vec(&sample_obj.metadata.managed_fields)
        .map(|v| v.len())
        .unwrap_or(0);
    let status_bytes = serde_json::to_vec(&sample_obj.status)
        .map(|v| v.len())
        .unwrap_or(0);

    // Traffic: round robin over the endpoints at `rate`, until every endpoint received
    // one event, then for `steady`.
    let js = async_nats::jetstream::new(env.nats().await);
    let publisher = {
        let js = js.clone();
        let namespaces = namespaces.clone();
        let (n, rate) = (args.endpoints, args.rate);
        let k = args.namespaces;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate.max(0.1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut acks = FuturesUnordered::new();
            let mut i = 0usize;
            loop {
                tokio::select! {
                    _ = tick.tick() => {
                        let (ns, _) = placement(i % n, k);
                        let ty = format!("scale.e{}", i % n);
                        let body = json!({"type": ty, "data": {"i": i}}).to_string();
                        let js = js.clone();
                        let subject = event_subject(&namespaces[ns], &ty);
                        acks.push(async move {
                            if let Ok(ack) = js.publish(subject, body.into()).await {
                                let _ = ack.await;
                            }
                        });
                        i += 1;
                    }
                    Some(()) = acks.next(), if !acks.is_empty() => {}
                }
            }
        })
    };
    let sweep_from = Instant::now();
    eprintln!("herald-scale: traffic started; waiting until every endpoint received an event");
    loop {
        let got = seen.lock().unwrap().paths.len();
        if got >= args.endpoints {
            break;
        }
        if Instant::now() > sweep_from + args.timeout {
            panic!(
                "only {got} of {} endpoints received an event",
                args.endpoints
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let sweep = sweep_from.elapsed();
    let sweep_snap = snapshot(env, pid, &operator_metrics).await;
    let changes_before = watched.lock().unwrap().changes;
    let requests_before = seen.lock().unwrap().requests;
    eprintln!(
        "herald-scale: first sweep in {sweep:?}; steady state for {:?}",
        args.steady
    );
    tokio::time::sleep(args.steady).await;
    let end_snap = snapshot(env, pid, &operator_metrics).await;
    let changes = watched.lock().unwrap().changes - changes_before;
    let delivered = seen.lock().unwrap().requests - requests_before;
    publisher.abort();
    let peak_kib = *peak.lock().unwrap();

    stop_child(operator, "-TERM");
    stop_child(dispatcher, "-INT");

    // The report.
    let n = args.endpoints as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "### {}: {} endpoints in {} namespaces\n",
        args.label, args.endpoints, args.namespaces
    );
    let _ = writeln!(
        out,
        "Operator flags beyond the harness's: `{}`; trickle {} events/s; steady window {:?}.\n",
        if args.operator_args.is_empty() {
            "(none)".into()
        } else {
            args.operator_args.join(" ")
        },
        args.rate,
        args.steady
    );
    let _ = writeln!(out, "| Measure | Value |\n|---|---|");
    let _ = writeln!(
        out,
        "| Creating {} endpoints (harness, {} in flight) | {:.1} s |",
        args.endpoints,
        args.concurrency,
        created.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| First create → all Ready | {:.1} s |",
        to_ready.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| First event → every endpoint received one | {:.1} s |",
        sweep.as_secs_f64()
    );
    let grown = ready_snap.rss_kib.saturating_sub(base_snap.rss_kib);
    let grown_end = end_snap.rss_kib.saturating_sub(base_snap.rss_kib);
    let _ = writeln!(
        out,
        "| Operator RSS: baseline / all Ready / end / peak | {} / {} / {} / {} |",
        mib(base_snap.rss_kib),
        mib(ready_snap.rss_kib),
        mib(end_snap.rss_kib),
        mib(peak_kib)
    );
    let _ = writeln!(
        out,
        "| Operator RSS per endpoint (all Ready − baseline) | {:.2} KiB |",
        grown as f64 / n
    );
    let _ = writeln!(
        out,
        "| Operator RSS per endpoint (end − baseline) | {:.2} KiB |",
        grown_end as f64 / n
    );
    let _ = writeln!(
        out,
        "| Operator anonymous RSS (heap; no binary pages): baseline / all Ready / end | {} / {} / {} |",
        mib(base_snap.anon_kib),
        mib(ready_snap.anon_kib),
        mib(end_snap.anon_kib)
    );
    let anon_per = |s: &Snapshot| s.anon_kib.saturating_sub(base_snap.anon_kib) as f64 / n;
    let _ = writeln!(
        out,
        "| Operator anonymous RSS per endpoint: all Ready / end | {:.2} KiB / {:.2} KiB |",
        anon_per(&ready_snap),
        anon_per(&end_snap)
    );
    let cpu_ready = ready_snap.cpu.saturating_sub(base_snap.cpu);
    let steady = end_snap.at - sweep_snap.at;
    let cpu_steady = end_snap.cpu.saturating_sub(sweep_snap.cpu);
    let _ = writeln!(
        out,
        "| Operator CPU, baseline → all Ready | {:.1} s ({:.2} ms per endpoint) |",
        cpu_ready.as_secs_f64(),
        cpu_ready.as_secs_f64() * 1000.0 / n
    );
    let _ = writeln!(
        out,
        "| Operator CPU at steady state | {:.1}% of a core |",
        100.0 * cpu_steady.as_secs_f64() / steady.as_secs_f64()
    );
    let storage_ready = ready_snap.storage - base_snap.storage;
    let storage_end = end_snap.storage - base_snap.storage;
    let _ = writeln!(
        out,
        "| etcd DB growth per endpoint: all Ready / end | {:.0} B / {:.0} B |",
        storage_ready / n,
        storage_end / n
    );
    let _ = writeln!(
        out,
        "| One endpoint as stored (JSON): whole / managedFields / status | {object_bytes} B / {managed_bytes} B / {status_bytes} B |"
    );
    // Status is written with server-side apply (verb APPLY); PATCH counted too.
    let steady_requests = delta(&end_snap.requests, &sweep_snap.requests);
    let status_writes: f64 = [
        "APPLY webhookendpoints/status",
        "PATCH webhookendpoints/status",
    ]
    .iter()
    .filter_map(|k| steady_requests.get(*k))
    .sum();
    let _ = writeln!(
        out,
        "| Status writes at steady state | {:.0}/min ({:.2} per endpoint per hour) |",
        status_writes * 60.0 / steady.as_secs_f64(),
        status_writes * 3600.0 / steady.as_secs_f64() / n
    );
    let _ = writeln!(
        out,
        "| Object changes seen by a watcher at steady state | {:.0}/min |",
        changes as f64 * 60.0 / steady.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "| Deliveries at steady state | {:.0}/s |",
        per_sec(delivered as f64, steady)
    );
    let rec_steady = delta(&end_snap.reconciles, &sweep_snap.reconciles);
    let rec_text: Vec<String> = rec_steady
        .iter()
        .map(|(k, v)| format!("{k} {:.1}/s", per_sec(*v, steady)))
        .collect();
    let _ = writeln!(
        out,
        "| Operator reconciles at steady state | {} |",
        rec_text.join(", ")
    );
    let _ = writeln!(out);

    let phases = [
        ("create → all Ready", &base_snap, &ready_snap),
        ("first sweep", &ready_snap, &sweep_snap),
        ("steady state", &sweep_snap, &end_snap),
    ];
    let _ = writeln!(
        out,
        "API requests per second by verb and resource (harness's own: POST of endpoints, namespaces and SigningSecrets, one LIST/WATCH; kubectl's metrics scrapes are not resource requests):\n"
    );
    let mut keys: Vec<String> = phases
        .iter()
        .flat_map(|(_, a, b)| delta(&b.requests, &a.requests).into_keys())
        .collect();
    keys.sort();
    keys.dedup();
    let _ = writeln!(out, "| Request | {} |", phases.map(|p| p.0).join(" | "));
    let _ = writeln!(out, "|---|{}", "---:|".repeat(phases.len()));
    for key in keys {
        let cells: Vec<String> = phases
            .iter()
            .map(|(_, a, b)| {
                let d = delta(&b.requests, &a.requests)
                    .get(&key)
                    .copied()
                    .unwrap_or(0.0);
                format!("{:.2}", per_sec(d, b.at - a.at))
            })
            .collect();
        // The controller-manager's own watches restarting now and then are noise.
        if cells.iter().all(|c| c.parse::<f64>().unwrap_or(0.0) < 0.05) {
            continue;
        }
        let _ = writeln!(out, "| {key} | {} |", cells.join(" | "));
    }
    let _ = writeln!(out);
    print!("{out}");
    if let Some(path) = args.report {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("report file");
        file.write_all(out.as_bytes()).expect("writing the report");
    }
}
