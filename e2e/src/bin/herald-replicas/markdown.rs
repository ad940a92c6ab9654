//! The Markdown report and JSON summary of the runs, with the extrapolation to a
//! billion events a day.

use super::*;

pub(crate) fn machine() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("model name"))?.to_owned();
            Some(line.split(':').nth(1)?.trim().to_owned())
        })
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    format!("{cores} cores ({model}), load average before the run {load}")
}

/// Each run's figures for `herald-bench` (`--json`).
pub(crate) fn json_summary(runs: &[Run]) -> serde_json::Value {
    let runs: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| {
            json!({
                "replicas": r.replicas,
                "published": r.published,
                "delivered": r.delivered,
                "drained": r.drained,
                "seconds": r.drain_secs,
                "rate": r.rate(),
                "us_dispatchers": r.us(r.cpu_dispatchers),
                "us_nats": r.us(r.cpu_nats),
                "us_harness": r.us(r.cpu_harness),
                "us_total": r.us(r.total_cpu()),
                "cores_busy": r.total_cpu() / r.drain_secs,
                "owned": r.per_replica.iter().map(|(_, _, s)| s.owned).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "runs": runs })
}

pub(crate) fn report(args: &Args, setup: &Setup, runs: &[Run]) -> String {
    let mut md = String::new();
    let nats = if args.nats_cluster >= 2 {
        format!(
            "a JetStream cluster of {} nats-server 2.15 processes, streams with {} replicas",
            setup.nats_pids.len(),
            setup.js_replicas
        )
    } else {
        "one nats-server 2.15 (embedded in the test environment), streams with 1 replica".to_owned()
    };
    let namespaces = setup.counts.len();
    writeln!(md, "## NATS: {nats}\n").unwrap();
    writeln!(md, "Machine: {}. {} shards (= ingest partitions), {namespaces} namespaces ({} per partition), {} endpoints ({} per namespace, one event type each: one delivery per event), release build of `herald-test-dispatcher` per replica, receiver and publisher in the harness process; events published as fast as JetStream acknowledges (up to 4096 unacknowledged) for {} s per run, then drained.\n",
        machine(), setup.shards, args.namespaces_per_partition, setup.targets.len(), args.endpoints_per_namespace, args.seconds).unwrap();
    writeln!(md, "| replicas | published | publish rate | delivered | delivered/s while publishing | delivered/s (publish start → last delivery) | all delivered |\n|---|---|---|---|---|---|---|").unwrap();
    for r in runs {
        writeln!(
            md,
            "| {} | {} | {:.0}/s | {} | {:.0} | **{:.0}** | {} |",
            r.replicas,
            r.published,
            r.published as f64 / r.publish_secs,
            r.delivered,
            r.during_publish as f64 / r.publish_secs,
            r.rate(),
            if r.drained { "yes" } else { "no (300 s)" }
        )
        .unwrap();
    }
    writeln!(md, "\nCPU time per delivered event (µs), from /proc over the measured run (publish start → last delivery); NATS without its idle cost ({:.3} cores measured over {} s with no traffic, subtracted):\n\n| replicas | dispatchers (all) | NATS | harness (publisher + receiver) | total | cores busy (total CPU ÷ wall) | machine cap at this cost (cores ÷ µs) |\n|---|---|---|---|---|---|---|", setup.idle_nats, args.idle_seconds.max(1)).unwrap();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get()) as f64;
    for r in runs {
        writeln!(
            md,
            "| {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.2} | {:.0}/s |",
            r.replicas,
            r.us(r.cpu_dispatchers),
            r.us(r.cpu_nats),
            r.us(r.cpu_harness),
            r.us(r.total_cpu()),
            r.total_cpu() / r.drain_secs,
            cores * 1e6 / r.us(r.total_cpu())
        )
        .unwrap();
    }
    if runs.iter().any(|r| r.cpu_testenv > 0.0) {
        let rest: Vec<String> = runs
            .iter()
            .map(|r| format!("{:.1} µs", r.us(r.cpu_testenv)))
            .collect();
        writeln!(md, "\nNot counted above: the test environment's own process (API server, etcd, control server; NATS runs in child processes here): {} per event.", rest.join(" / ")).unwrap();
    }
    writeln!(md, "\nPer replica (deltas over the run):\n\n| replicas | replica | owned shards | events fanned out (ingested) | attempts | attempts/s | CPU s | CPU µs per attempt |\n|---|---|---|---|---|---|---|---|").unwrap();
    for r in runs {
        for (id, a, b) in &r.per_replica {
            let attempts = b.attempts - a.attempts;
            let cpu = (b.cpu - a.cpu).as_secs_f64();
            writeln!(
                md,
                "| {} | {id} | {:.0} | {:.0} | {attempts:.0} | {:.0} | {cpu:.1} | {:.1} |",
                r.replicas,
                b.owned,
                b.ingested - a.ingested,
                attempts / r.drain_secs,
                cpu * 1e6 / attempts.max(1.0)
            )
            .unwrap();
        }
    }
    writeln!(md, "\nPer partition (namespace → partition by `partition_of`; deliveries counted by the receiver, fan-out by the ack floor of `herald-fanout-<p>`; owner = holder of the shard's lease at the end):\n").unwrap();
    write!(md, "| partition |").unwrap();
    for r in runs {
        write!(
            md,
            " R={0}: delivered/s | R={0}: fan-out acks/s | R={0}: owner |",
            r.replicas
        )
        .unwrap();
    }
    writeln!(md, "\n|---|{}", "---|---|---|".repeat(runs.len())).unwrap();
    for p in 0..setup.shards as usize {
        write!(md, "| {p} |").unwrap();
        for r in runs {
            let (_, n, fan, owner) = &r.per_partition[p];
            write!(
                md,
                " {:.0} | {:.0} | {owner} |",
                *n as f64 / r.drain_secs,
                *fan as f64 / r.drain_secs
            )
            .unwrap();
        }
        writeln!(md).unwrap();
    }
    // The extrapolation, from the costliest run per event (sharding's overhead included).
    let worst = runs
        .iter()
        .max_by(|a, b| a.us(a.cpu_dispatchers).total_cmp(&b.us(b.cpu_dispatchers)))
        .expect("a run");
    let nats_worst = runs.iter().map(|r| r.us(r.cpu_nats)).fold(0.0, f64::max);
    writeln!(md, "\nExtrapolation to 1 billion events a day ({DAILY_AVERAGE:.0}/s average) and its 5× burst ({:.0}/s), one delivery per event, from the highest measured CPU cost per event (dispatchers {:.1} µs at {} replicas, NATS {nats_worst:.1} µs); a replica gets {} cores, used to 70 % at the burst, plus one spare replica for a lost node:\n", DAILY_AVERAGE * 5.0, worst.us(worst.cpu_dispatchers), worst.replicas, args.cores_per_replica).unwrap();
    writeln!(
        md,
        "| load | events/s | dispatcher cores | replicas (N+1) | NATS cores (all nodes) |\n|---|---|---|---|---|"
    )
    .unwrap();
    for (label, rate) in [
        ("average", DAILY_AVERAGE),
        ("5× burst", DAILY_AVERAGE * 5.0),
    ] {
        let disp = rate * worst.us(worst.cpu_dispatchers) / 1e6;
        let replicas = (disp / (args.cores_per_replica * 0.7)).ceil() + 1.0;
        writeln!(
            md,
            "| {label} | {rate:.0} | {disp:.1} | {replicas:.0} | {:.1} |",
            rate * nats_worst / 1e6
        )
        .unwrap();
    }
    md
}
