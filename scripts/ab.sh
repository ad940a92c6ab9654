#!/usr/bin/env bash
# Before/after of one change, measured in one session (docs/bench/profile.md, "Fixes"):
#   scripts/ab.sh [--runs N] [--seconds S] NAME=HERALD_BENCH ... 
# Runs each herald-bench binary's steady throughput load (`--profile-seconds`: the
# benchmark's 10 endpoints, at most 20,000 events published and not yet delivered) in
# turn, N rounds (default 3) of S seconds (default 30) after a warm-up, each run on a
# fresh test environment, and prints per run and per binary (median):
#   - deliveries per second in the window;
#   - CPU time per delivered event, of the benchmark process (dispatcher, receiver,
#     publisher) and of the testenv process (nats-server; etcd and kube-apiserver idle),
#     from /proc/<pid>/stat — CPU time is what a change saves, and is far less disturbed
#     than the rate by other work on a shared machine (the load average is printed too).
# Environment: AB_WARMUP (seconds of load before the window, default 15); GOGC reaches
# the test environment (the benchmark runs it at 400; Go's default is 100).
set -euo pipefail
# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"

runs=3
seconds=30
warmup="${AB_WARMUP:-15}"
benches=()
while [ $# -gt 0 ]; do
	case "$1" in
	--runs) runs="$2"; shift 2 ;;
	--seconds) seconds="$2"; shift 2 ;;
	*=*) benches+=("$1"); shift ;;
	*) echo "usage: scripts/ab.sh [--runs N] [--seconds S] NAME=HERALD_BENCH ..." >&2; exit 2 ;;
	esac
done
[ ${#benches[@]} -ge 1 ] || { echo "ab: name at least one NAME=HERALD_BENCH" >&2; exit 2; }
"$repo/scripts/build-e2e.sh" testenv >/dev/null

work="$(mktemp -d "${TMPDIR:-/tmp}/herald-ab.XXXXXX")"
bench_pid=""
cleanup() {
	[ -z "$bench_pid" ] || kill "$bench_pid" 2>/dev/null || true
	"$repo/scripts/testenv.sh" down "$work/env" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT

ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
counter() { awk -v k="$2" '$1 == k { print $2 }' "$1"; }
hz="$(getconf CLK_TCK)"

results="$work/results"
: >"$results"
printf '| run | binary | deliveries/s | bench µs/event | nats µs/event | total µs/event | load avg |\n|---|---|---:|---:|---:|---:|---:|\n'
for round in $(seq 1 "$runs"); do
	for entry in "${benches[@]}"; do
		name="${entry%%=*}"
		bench="${entry#*=}"
		"$repo/scripts/testenv.sh" up "$work/env" >/dev/null
		env_pid="$(cat "$work/env/launcher.pid")"
		rm -f "$work/stats"
		HERALD_TESTENV_DIR="$work/env" "$bench" \
			--profile-seconds $((warmup + seconds + 60)) --profile-stats "$work/stats" \
			>"$work/bench.log" 2>&1 &
		bench_pid=$!
		for _ in $(seq 1 240); do
			if [ -f "$work/stats" ] && ! grep -q '^delivered 0$' "$work/stats"; then break; fi
			kill -0 "$bench_pid" || { cat "$work/bench.log" >&2; exit 1; }
			sleep 0.5
		done
		sleep "$warmup"
		cp "$work/stats" "$work/stats.start"
		b0="$(ticks "$bench_pid")"; n0="$(ticks "$env_pid")"; t0="$(date +%s.%N)"
		sleep "$seconds"
		cp "$work/stats" "$work/stats.end"
		b1="$(ticks "$bench_pid")"; n1="$(ticks "$env_pid")"; t1="$(date +%s.%N)"
		load="$(cut -d' ' -f1 /proc/loadavg)"
		kill "$bench_pid" 2>/dev/null || true
		wait "$bench_pid" 2>/dev/null || true
		bench_pid=""
		"$repo/scripts/testenv.sh" down "$work/env" >/dev/null
		d0="$(counter "$work/stats.start" delivered)"; d1="$(counter "$work/stats.end" delivered)"
		python3 - "$round" "$name" "$d0" "$d1" "$b0" "$b1" "$n0" "$n1" "$t0" "$t1" "$hz" "$load" >>"$results" <<'PY'
import sys
r, name, d0, d1, b0, b1, n0, n1, t0, t1, hz, load = sys.argv[1:]
d = float(d1) - float(d0)
hz = float(hz)
bench_us = (float(b1) - float(b0)) / hz / d * 1e6
nats_us = (float(n1) - float(n0)) / hz / d * 1e6
print(f"{r} {name} {d / (float(t1) - float(t0)):.0f} {bench_us:.1f} {nats_us:.1f} {bench_us + nats_us:.1f} {load}")
PY
		tail -n 1 "$results" | awk '{ printf "| %s | %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, $5, $6, $7 }'
	done
done
printf '\nMedians:\n\n| binary | deliveries/s | bench µs/event | nats µs/event | total µs/event |\n|---|---:|---:|---:|---:|\n'
python3 - "$results" <<'PY'
import statistics
import sys
rows = {}
for line in open(sys.argv[1]):
    _, name, *values = line.split()
    rows.setdefault(name, []).append([float(v) for v in values[:4]])
for name, runs in rows.items():
    med = [statistics.median(col) for col in zip(*runs)]
    print(f"| {name} | {med[0]:.0f} | {med[1]:.1f} | {med[2]:.1f} | {med[3]:.1f} |")
PY
