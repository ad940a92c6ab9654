#!/usr/bin/env bash
# The long chaos soak: new seeds, one after another, for SOAK_MINUTES (default 60), each
# schedule SOAK_SECONDS long (default 300), against a 3-node NATS cluster the test starts
# itself (e2e/tests/chaos.rs). Seeds alternate between the data plane (configuration
# written to NATS directly) and the control plane (resources, two operators, herald-api,
# API blackouts); SOAK_PLANE=data or control keeps to one. SOAK_SEEDS (comma-separated)
# replays given seeds instead.
# One line per seed goes to SOAK_REPORT (default soak-report.md); a failing seed stops the
# soak with its seed, its schedule and what was violated, and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/herald/target}"
export HERALD_BIN_DIR="${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}"
minutes="${SOAK_MINUTES:-60}"
seconds="${SOAK_SECONDS:-300}"
report="$(realpath -m "${SOAK_REPORT:-soak-report.md}")"
[[ -s "$report" ]] || printf '| seed | schedule | steps | events | kills | peak dispatcher memory | result |\n|---|---|---|---|---|---|---|\n' >"$report"
cargo build -p herald-e2e --tests --bins
cargo build -p herald-api
scripts/build-e2e.sh
if [[ -n "${SOAK_SEEDS:-}" ]]; then
  IFS=, read -r -a seeds <<<"$SOAK_SEEDS"
else
  seeds=()
fi
deadline=$(( $(date +%s) + minutes * 60 ))
i=0
while :; do
  if (( ${#seeds[@]} )); then
    (( i < ${#seeds[@]} )) || break
    seed="${seeds[$i]}"
  else
    (( $(date +%s) < deadline )) || break
    seed="$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')"
  fi
  i=$((i + 1))
  plane="${SOAK_PLANE:-$([[ $((i % 2)) == 1 ]] && echo data || echo control)}"
  if [[ "$plane" == control ]]; then
    data=none control="$seed"
  else
    data="$seed" control=none
  fi
  echo "== soak: seed $seed ($plane plane), ${seconds} s schedule"
  HERALD_CHAOS_SEEDS="$data" HERALD_CHAOS_CONTROL_SEEDS="$control" HERALD_CHAOS_SECONDS="$seconds" \
    HERALD_CHAOS_REPORT="$report" cargo test -p herald-e2e --test chaos -- --nocapture
done
echo "== soak: $i seeds clean; report in $report"
