#!/usr/bin/env bash
# Runs the fuzz targets of fuzz/ (docs/fuzzing.md) with cargo-fuzz and libFuzzer:
#
#   scripts/fuzz.sh [seconds-per-target] [target...]   explore (15 s per target by default)
#   scripts/fuzz.sh --runs N [target...]                the test command's regression run
#
# Exploring keeps what the fuzzer learns and finds new inputs: docs/fuzzing.md records a
# long run. The regression run (scripts/test.sh) is reproducible: N inputs per target from
# the committed corpus with a fixed seed, so a test run fails only when the code changed
# (a finding of an exploration is added to fuzz/corpus/ when it is fixed). Installs the pinned cargo-fuzz when missing. The toolchain is the stable one:
# cargo-fuzz passes nightly-only flags (-Zsanitizer, -Cpasses=sancov-module), which
# RUSTC_BOOTSTRAP=1 lets stable accept; the fuzz crate is outside the workspace, so the
# flag never reaches the workspace's builds.
#
# What the fuzzer learns (its corpus) is kept in $HOME/.cache/herald/fuzz/corpus/<target>,
# seeded from the committed fuzz/corpus/<target>; crashes land in fuzz/artifacts/<target>/
# and fail the run, with the command that replays them.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"

CARGO_FUZZ_VERSION=0.13.2
runs=""
if [ "${1:-}" = "--runs" ]; then
	runs="${2:?--runs needs a number}"
	shift 2
fi
seconds="${1:-15}"
[ -n "$runs" ] || shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(signature envelope address pattern duration)

cache="$HOME/.cache/herald"
tools="$cache/tools"
fuzz_target_dir="$cache/fuzz-target"
export PATH="$tools/bin:$PATH"
export RUSTC_BOOTSTRAP=1

if ! cargo fuzz --version 2>/dev/null | grep -qx "cargo-fuzz $CARGO_FUZZ_VERSION"; then
	echo "installing cargo-fuzz $CARGO_FUZZ_VERSION into $tools"
	CARGO_TARGET_DIR="$cache/tools-target" \
		cargo install cargo-fuzz --version "=$CARGO_FUZZ_VERSION" --locked --root "$tools"
fi

# cargo-fuzz's defaults: AddressSanitizer (Herald forbids unsafe code, but serde_json,
# regex and url under the targets do not) and debug assertions, so overflows panic.
fuzz_flags=(--target-dir "$fuzz_target_dir")
cargo fuzz build "${fuzz_flags[@]}"

summary=()
failed=()
for target in "${targets[@]}"; do
	artifacts="$repo/fuzz/artifacts/$target"
	if [ -n "$runs" ]; then
		# New inputs go to a scratch directory and are dropped: the next run starts from
		# the same corpus, with the same seed.
		corpus="$(mktemp -d "${TMPDIR:-/tmp}/herald-fuzz-corpus.XXXXXX")"
		limit=(-runs="$runs" -seed=1)
		echo "==> fuzz $target: $runs inputs from the committed corpus (seed 1)"
	else
		corpus="$cache/fuzz/corpus/$target"
		limit=(-max_total_time="$seconds")
		echo "==> fuzz $target for ${seconds}s"
	fi
	mkdir -p "$corpus" "$artifacts"
	log="$(mktemp "${TMPDIR:-/tmp}/herald-fuzz-$target.XXXXXX")"
	# The first corpus directory receives new inputs; the committed seeds are only read.
	if cargo fuzz run "${fuzz_flags[@]}" "$target" "$corpus" "$repo/fuzz/corpus/$target" -- \
		"${limit[@]}" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
		-artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
		status=ok
	else
		status=FAILED
		failed+=("$target")
		grep -v '^#' "$log" | tail -40 >&2
		echo "replay: RUSTC_BOOTSTRAP=1 cargo fuzz run ${fuzz_flags[*]} $target $artifacts/<crash-file>" >&2
	fi
	runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
	speed="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)"
	cov="$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)"
	units="$(find "$corpus" -type f | wc -l)"
	[ -z "$runs" ] || rm -rf "$corpus"
	summary+=("$(printf '%-10s %-6s %12s runs %8s/s  cov %6s  corpus %6s' \
		"$target" "$status" "${runs:-?}" "${speed:-?}" "${cov:-?}" "$units")")
	rm -f "$log"
done

echo
printf '%s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzz: failed: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
	exit 1
fi
