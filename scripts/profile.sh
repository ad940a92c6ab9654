#!/usr/bin/env bash
# Where the CPU of a delivered event goes (`make profile`, docs/bench/profile.md).
#   scripts/profile.sh [SECONDS]   record SECONDS (default 20) of steady load
#   PROFILE_ENDPOINTS=N            over N endpoints (default 10); other than 10 the files
#                                  get a suffix: docs/bench/profile-N-endpoints.md, ...
# Builds herald-bench (release), starts a test environment of its own, runs the benchmark's
# throughput set-up as a steady load (`herald-bench --profile-seconds`: dispatcher,
# receiver and publisher in one process), and records both processes with perf
# (cpu-clock, 999 Hz): the benchmark with DWARF unwinding (release builds keep no frame
# pointers), the testenv (nats-server embedded; Go keeps frame pointers) with them.
# JetStream operations come from the benchmark's counter snapshots (stream sequences,
# consumer deliveries and acks, API requests) and bytes from the kernel's counters of
# every TCP connection to the NATS port, both taken when the recording starts and ends.
# Writes docs/bench/flamegraph-dispatcher.svg, docs/bench/flamegraph-nats.svg and
# docs/bench/profile.md. Needs perf; installs inferno (`cargo install inferno --root
# ~/.cache/herald/tools`) when it is missing. perf.data stays in PROFILE_DIR (default ~/.cache/herald/profile), outside git.
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

seconds="${1:-20}"
endpoints="${PROFILE_ENDPOINTS:-10}"
suffix=""
[ "$endpoints" = 10 ] || suffix="-$endpoints-endpoints"
warmup="${PROFILE_WARMUP:-20}"
work="${PROFILE_DIR:-$HOME/.cache/herald/profile}"
out="$repo/docs/bench"
tools="${INFERNO_BIN:-$HOME/.cache/herald/tools/bin}"
command -v perf >/dev/null || {
	echo "profile: perf is missing (Debian: apt-get install linux-perf)" >&2
	exit 1
}
if [ ! -x "$tools/inferno-flamegraph" ] || [ ! -x "$tools/inferno-collapse-perf" ]; then
	echo "profile: installing inferno into $(dirname "$tools") (once)"
	cargo install --locked inferno --root "$(dirname "$tools")"
fi

# PROFILE_BENCH: a herald-bench already built (for a machine whose shared target directory
# is busy); by default it is built here.
bench="${PROFILE_BENCH:-}"
if [ -z "$bench" ]; then
	cargo build --release -p herald-e2e --bin herald-bench
	bench="$CARGO_TARGET_DIR/release/herald-bench"
fi
"$repo/scripts/build-e2e.sh" testenv
mkdir -p "$work" "$out"
rm -f "$work"/stats "$work"/stats.* "$work"/*.perf.data

bench_pid=""
perf_pids=()
cleanup() {
	for pid in "${perf_pids[@]}" $bench_pid; do
		kill "$pid" 2>/dev/null || true
	done
	"$repo/scripts/testenv.sh" down "$work/env"
}
trap cleanup EXIT

# The benchmark's collector setting (herald_e2e::private_benchmark_env, docs/bench/profile.md).
GOGC="${GOGC:-400}" "$repo/scripts/testenv.sh" up "$work/env"
env_pid="$(cat "$work/env/launcher.pid")"
nats_port="$(sed 's/.*://' "$work/env/nats-url")"

HERALD_TESTENV_DIR="$work/env" "$bench" \
	--profile-seconds $((warmup + seconds + 30)) --profile-stats "$work/stats" \
	--profile-endpoints "$endpoints" \
	>"$work/bench.log" 2>&1 &
bench_pid=$!

# Warm up: until deliveries flow, then $warmup seconds more.
for _ in $(seq 1 240); do
	if [ -f "$work/stats" ] && ! grep -q '^delivered 0$' "$work/stats"; then
		break
	fi
	kill -0 "$bench_pid" || { cat "$work/bench.log" >&2; exit 1; }
	sleep 0.5
done
sleep "$warmup"

nats_bytes() {
	ss -tinH state established "( dport = :$nats_port )" |
		awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^bytes_(acked|received):/) { split($i, kv, ":"); sum[kv[1]] += kv[2] } }
			END { printf "tcp.to_nats %d\ntcp.from_nats %d\n", sum["bytes_acked"], sum["bytes_received"] }'
}

snapshot() {
	{
		cat "$work/stats"
		nats_bytes
		awk '{ print "loadavg " $1 }' /proc/loadavg
	} >"$1"
}

snapshot "$work/stats.start"
perf record -q -e cpu-clock -F 999 --call-graph dwarf -p "$bench_pid" \
	-o "$work/bench.perf.data" -- sleep "$seconds" 2>"$work/perf-bench.log" &
perf_pids+=($!)
perf record -q -e cpu-clock -F 999 -g -p "$env_pid" \
	-o "$work/nats.perf.data" -- sleep "$seconds" 2>"$work/perf-nats.log" &
perf_pids+=($!)
wait "${perf_pids[@]}"
perf_pids=()
snapshot "$work/stats.end"
kill "$bench_pid" 2>/dev/null || true
wait "$bench_pid" 2>/dev/null || true
bench_pid=""

echo "profile: folding the stacks (DWARF unwinding takes a few minutes)"
perf script --no-inline -i "$work/bench.perf.data" 2>/dev/null |
	"$tools/inferno-collapse-perf" --all >"$work/bench.folded"
perf script --no-inline -i "$work/nats.perf.data" 2>/dev/null |
	"$tools/inferno-collapse-perf" --all >"$work/nats.folded"

"$tools/inferno-flamegraph" --title "herald-bench: dispatcher, receiver, publisher (cpu-clock, ${seconds} s, $endpoints endpoints)" \
	--width 1600 --minwidth 0.2 <"$work/bench.folded" >"$out/flamegraph-dispatcher$suffix.svg"
"$tools/inferno-flamegraph" --title "testenv: nats-server 2.15 (cpu-clock, ${seconds} s)" \
	--width 1600 --minwidth 0.2 <"$work/nats.folded" >"$out/flamegraph-nats$suffix.svg"

python3 - "$work" "$seconds" "$out/profile$suffix.md" "$endpoints" <<'PY'
"""Attributes every sample to a component and writes the table of docs/bench/profile.md."""
import re
import sys
from collections import Counter

work, seconds, report, endpoints = sys.argv[1], float(sys.argv[2]), sys.argv[3], int(sys.argv[4])


def counters(path):
    out = {}
    for line in open(path):
        key, _, value = line.strip().rpartition(" ")
        if key:
            out[key] = float(value)
    return out


start, end = counters(f"{work}/stats.start"), counters(f"{work}/stats.end")
delta = {k: end[k] - start[k] for k in end if k in start}
delivered = delta["delivered"]
published = delta["published"]

# Herald's benchmark process: the first rule that matches any frame of a stack wins, so
# the specific parts (signing inside an attempt, the attempt log inside the shard loop)
# come before the task they run in. Kernel frames count for the user code that entered.
BENCH = [
    ("dispatcher: signing (herald_core::signing, HMAC-SHA256, base64)",
     r"herald_core::signing|hmac::|sha2::|ring::digest|ring::hmac|base64::"),
    ("dispatcher: attempt log (shard::log)", r"herald_dispatcher::shard::log"),
    ("dispatcher: HTTP client (dispatcher::http, reqwest, hyper client)",
     r"herald_dispatcher::http|reqwest::|hyper_util::client|hyper::client|hyper::proto::h1::role::Client"),
    ("receiver (herald-bench: hyper server)",
     r"herald_e2e::bench::receiver|herald_bench::receive|axum::|hyper::server|hyper_util::server|hyper::proto::h1::role::Server"),
    ("publisher (herald-bench)", r"herald_bench::profile_load|herald_bench::profile_counters"),
    ("dispatcher: fan-out (herald_dispatcher::fanout, index)",
     r"herald_dispatcher::fanout|herald_dispatcher::index|herald_core::envelope"),
    ("dispatcher: lane consumption (shard::consume, shard::read)",
     r"herald_dispatcher::shard::consume|herald_dispatcher::shard::read"),
    ("dispatcher: attempt task and decision (shard::attempts, attempt, retry)",
     r"herald_dispatcher::shard::attempts|herald_dispatcher::attempt::|herald_dispatcher::retry"),
    ("async-nats client (connection task, parsing, publish futures)", r"async_nats::"),
    ("dispatcher: bookkeeping (shard loop, endpoint state, upkeep, ring)",
     r"herald_dispatcher::|herald_core::"),
    ("tokio runtime (scheduler, timers, I/O driver, idle)", r"tokio::"),
    ("allocator and other", r"."),
]
NATS = [
    ("etcd / kube-apiserver (not NATS)", r"k8s\.io/|go\.etcd\.io|etcd|apiserver"),
    ("nats: JetStream file store (filestore.go)", r"\(\*fileStore\)|\(\*msgBlock\)"),
    ("nats: JetStream consumers (deliver, acks)", r"\(\*consumer\)"),
    ("nats: JetStream streams (publish, dedup, purge)", r"\(\*stream\)|\(\*jetStream\)|\(\*Server\)\.jsStream|jsapi|processJSAPI"),
    ("nats: client connections (parse, route, flush)", r"\(\*client\)|\(\*Sublist\)|\(\*Account\)"),
    ("nats: other server code", r"nats-server"),
    ("Go runtime (GC, scheduler) and other", r"."),
]


def classify(folded, rules):
    totals, samples = Counter(), 0
    compiled = [(name, re.compile(rx)) for name, rx in rules]
    for line in open(folded):
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack:
            continue
        n = int(count)
        samples += n
        for name, rx in compiled:
            if rx.search(stack):
                totals[name] += n
                break
    return totals, samples


bench, bench_samples = classify(f"{work}/bench.folded", BENCH)
nats, nats_samples = classify(f"{work}/nats.folded", NATS)
not_nats = nats["etcd / kube-apiserver (not NATS)"]


def us(ns):
    # inferno-collapse-perf weighs each cpu-clock sample by its period, in nanoseconds.
    return ns / 1000 / delivered


def ms(ns):
    return f"{ns / 1e6:,.0f}"


publishes = sum(v for k, v in delta.items() if k.startswith("stream.") and k.endswith(".msgs"))
deliveries = sum(v for k, v in delta.items() if k.startswith("consumer.") and k.endswith(".delivered"))
acks = sum(v for k, v in delta.items() if k.startswith("consumer.") and k.endswith(".acked"))
api = delta.get("api", 0)
ops = publishes + deliveries + acks
to_nats, from_nats = delta["tcp.to_nats"], delta["tcp.from_nats"]
total_us = us(bench_samples) + us(nats_samples - not_nats)

md = []
w = md.append
w("# Where a delivered event's CPU goes\n")
run = f"PROFILE_ENDPOINTS={endpoints} " if endpoints != 10 else ""
w(f"Generated by `{run}make profile` (`scripts/profile.sh {int(seconds)}`): the benchmark's throughput set-up "
  f"({endpoints:,} endpoints, each event matches one, HMAC-signed POSTs to a local receiver, attempts logged) as a "
  "steady load, at most 20,000 events published and not yet delivered, recorded with "
  f"`perf record -e cpu-clock -F 999` for {seconds:.0f} s: the benchmark process (dispatcher, receiver "
  "and publisher; DWARF call graphs) and the testenv process (nats-server 2.15 embedded, file storage; "
  "frame pointers). µs per event = CPU time of the component's samples (each sample weighs its "
  "period, about 1 ms) / deliveries in the window.\n")
w(f"Deliveries in the window: **{delivered:.0f}** ({delivered / seconds:,.0f}/s); events published "
  f"{published:.0f} ({published / seconds:,.0f}/s). Load average {start.get('loadavg', 0):.1f} at the "
  f"start, {end.get('loadavg', 0):.1f} at the end (2 cores shared with other work: the rates are low "
  "for that reason, the proportions hold).\n")
fanned = sum(
    v for k, v in delta.items() if k.startswith("consumer.HERALD_EVENTS.") and k.endswith(".acked"))
w(f"Stages in balance: {fanned / delivered:.2f} events fanned out (fan-out acks) per delivery in the "
  "window (1.00 is a steady state; above it, fan-out was still turning the initial backlog into lane "
  "messages and its share, and JetStream's, are overstated by that factor).\n")
w("## CPU per delivered event\n")
w("| component | CPU ms | µs per event | share |\n|---|---|---|---|")
for name, _ in BENCH:
    w(f"| {name} | {ms(bench[name])} | {us(bench[name]):.1f} | {100 * us(bench[name]) / total_us:.0f} % |")
w(f"| **benchmark process** | {ms(bench_samples)} | **{us(bench_samples):.1f}** | "
  f"{100 * us(bench_samples) / total_us:.0f} % |")
for name, _ in NATS[1:]:
    w(f"| {name} | {ms(nats[name])} | {us(nats[name]):.1f} | {100 * us(nats[name]) / total_us:.0f} % |")
w(f"| **nats-server (testenv minus etcd and kube-apiserver)** | {ms(nats_samples - not_nats)} | "
  f"**{us(nats_samples - not_nats):.1f}** | {100 * us(nats_samples - not_nats) / total_us:.0f} % |")
w(f"| **total** | | **{total_us:.1f}** | 100 % |")
w(f"| (etcd and kube-apiserver in the testenv, idle, not counted) | {ms(not_nats)} | {us(not_nats):.1f} | |\n")
w(f"At {total_us:.1f} µs per event, two fully used cores would deliver about "
  f"{2e6 / total_us:,.0f} events/s.\n")
w("## JetStream operations and bytes per delivered event\n")
w("From the counters of the server (the benchmark's snapshots at the start and end of the window) "
  "and of the kernel (bytes of every TCP connection to the NATS port).\n")
w("| stream or consumer | per event |\n|---|---|")
for k in sorted(delta):
    if (k.startswith("stream.") and k.endswith(".msgs")) or k.startswith("consumer."):
        if delta[k]:
            w(f"| {k} | {delta[k] / delivered:.3f} |")
w(f"| **stored messages (publish + ack)** | **{publishes / delivered:.2f}** |")
w(f"| **consumer deliveries** | **{deliveries / delivered:.2f}** |")
w(f"| **acks** | **{acks / delivered:.2f}** |")
w(f"| **JetStream operations** | **{ops / delivered:.2f}** |")
w(f"| JetStream API requests (purges, infos, direct gets counted by the server) | {api / delivered:.3f} |")
w(f"| bytes to NATS | {to_nats / delivered:,.0f} |")
w(f"| bytes from NATS | {from_nats / delivered:,.0f} |\n")

# Against the cost budget of the brief: 6 µs per JetStream operation (server and client
# together), 20 µs per loopback POST (client and receiver together).
js_side = sum(bench[n] for n, _ in BENCH if n.startswith(("async-nats", "dispatcher: fan-out",
                                                           "dispatcher: lane", "publisher")))
post_side = sum(bench[n] for n, _ in BENCH if n.startswith(("dispatcher: HTTP", "receiver")))
rest = bench_samples - js_side - post_side
w("## Against the cost budget\n")
w("The budget: about 6 µs of CPU per JetStream operation, server and client together, and 20 µs "
  "per loopback POST, client and receiver together. Signing, the attempt log, bookkeeping and the "
  "runtime are outside both and count in full against the target.\n")
w("| part | budget µs | measured µs | over |\n|---|---|---|---|")
js_us = us(nats_samples - not_nats) + us(js_side)
w(f"| JetStream: {ops / delivered:.2f} operations (nats-server + async-nats + fan-out + lane "
  f"consumption + publisher) | {6 * ops / delivered:.0f} | {js_us:.1f} | ×{js_us / (6 * ops / delivered):.1f} |")
w(f"| one POST (HTTP client + receiver) | 20 | {us(post_side):.1f} | ×{us(post_side) / 20:.1f} |")
w(f"| everything else (signing, attempt log, attempt task, bookkeeping, tokio, allocator) | 0 | "
  f"{us(rest):.1f} | |")
budget = 6 * ops / delivered + 20
w(f"| **total** | **{budget:.0f}** ({2e6 / budget:,.0f} events/s on 2 cores) | **{total_us:.1f}** "
  f"({2e6 / total_us:,.0f} events/s) | ×{total_us / budget:.1f} |\n")

# The hand-written analysis below the marker survives a new run.
MARK = "<!-- analysis: written by hand, kept by scripts/profile.sh -->"
try:
    old = open(report).read()
    kept = old[old.index(MARK):] if MARK in old else MARK + "\n"
except FileNotFoundError:
    kept = MARK + "\n"
md.append(kept)
open(report, "w").write("\n".join(md))
print("\n".join(md))
PY
echo "profile: wrote $out/profile$suffix.md and the flame graphs; perf data in $work"
