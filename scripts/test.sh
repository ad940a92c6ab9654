#!/usr/bin/env bash
# Runs every check and test: formatting, lints, the CRD drift check, unit tests, and the
# end-to-end tests against a real kube-apiserver and nats-server started once for the run.
# Works on a fresh machine with Rust and Go: everything else is built by the scripts.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"

step() { printf '\n==> %s\n' "$*"; }

step "format"
cargo fmt --all --check
# The Rust receiver example is a workspace of its own (examples/receivers/README.md).
cargo fmt --check --manifest-path examples/receivers/rust-standardwebhooks/Cargo.toml
unformatted="$(gofmt -l e2e/testenv scripts/ocibuild examples/receivers/go)"
[ -z "$unformatted" ] || { echo "gofmt needed: $unformatted" >&2; exit 1; }

step "e2e and release tools (testenv, helm, helm-docs, crane, ocibuild, cosign, cargo-cyclonedx, actionlint, kubectl, kubelet)"
scripts/build-e2e.sh

step "a real node's packages (containerd, runc, CNI plugins, busybox-static)"
# e2e/tests/node.rs installs the chart on a real node (e2e/node/README.md): Debian's
# containerd, runc and CNI plugins, and a static busybox for the pod sandbox image.
# Installed here when missing (root on Debian); elsewhere that test reports itself skipped.
node_packages=(containerd runc containernetworking-plugins busybox-static)
missing=()
for package in "${node_packages[@]}"; do
	dpkg -s "$package" >/dev/null 2>&1 || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
	if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
	else
		echo "not installing ${missing[*]} (needs root and apt-get); e2e/tests/node.rs will report itself skipped" >&2
	fi
fi

step "receiver examples' packages (examples/receivers)"
# e2e/tests/receivers.rs builds each receiver example (Go, TypeScript, Python, Java, Rust)
# and runs it against real deliveries; here their packages are fetched into each tool's
# cache outside the clone (the Go module cache, ~/.npm, ~/.m2, ~/.cargo; node_modules is
# the exception, ignored by git). Builds go to ~/.cache/herald/receivers and
# ~/.cache/herald/receivers-target. Without a toolchain, or when a fetch fails, that
# language's tests report themselves skipped.
receivers=examples/receivers
skipped() { echo "could not fetch the packages of $receivers/$1; its tests will report themselves skipped" >&2; }
if command -v python3 >/dev/null 2>&1; then
	python3 -c 'import standardwebhooks, cryptography' 2>/dev/null ||
		python3 -m pip install --quiet -r "$receivers/python/requirements.txt" || skipped python
fi
if command -v go >/dev/null 2>&1; then
	(cd "$receivers/go" && go mod download) || skipped go
fi
if command -v npm >/dev/null 2>&1; then
	(cd "$receivers/typescript" && npm ci --no-audit --no-fund --silent) || skipped typescript
fi
if command -v mvn >/dev/null 2>&1; then
	(cd "$receivers/java" && mvn -B -q -Dstyle.color=never dependency:go-offline -DbuildDirectory="$HOME/.cache/herald/receivers/java") ||
		skipped java
fi
cargo fetch --locked --manifest-path "$receivers/rust-standardwebhooks/Cargo.toml" || skipped rust-standardwebhooks

step "lint"
cargo clippy --workspace --all-targets --locked -- -D warnings
(cd e2e/testenv && go vet ./...)
(cd scripts/ocibuild && go vet ./...)
(cd examples/receivers/go && go vet ./...)
CARGO_TARGET_DIR="$HOME/.cache/herald/receivers-target" \
	cargo clippy --locked --manifest-path examples/receivers/rust-standardwebhooks/Cargo.toml -- -D warnings

step "build tests"
# The binaries too: e2e/tests/chart_pods.rs starts the real herald-operator and
# herald-dispatcher the way the chart's pods run them.
cargo build --workspace --bins --locked
cargo test --workspace --locked --no-run

step "fuzz (short run)"
# Each fuzz target of fuzz/ for a fixed number of inputs from the committed corpus with a
# fixed seed (docs/fuzzing.md): reproducible, so it fails only when the code changed; the
# build is incremental in ~/.cache/herald/fuzz-target. A crash fails the run and is kept
# in fuzz/artifacts/. Exploring is `make fuzz`.
scripts/fuzz.sh --runs "${HERALD_FUZZ_RUNS:-100000}"

step "start the test environment"
state="$(mktemp -d "${TMPDIR:-/tmp}/herald-testenv.XXXXXX")"
cleanup() { scripts/testenv.sh down "$state" || true; rm -rf "$state"; }
trap cleanup EXIT
scripts/testenv.sh up "$state"
export HERALD_TESTENV_DIR="$state"

step "tests"
log="$state/cargo-test.log"
cargo test --workspace --locked 2>&1 | tee "$log"
# One closing line for the whole run (cargo prints one per test binary, the last of
# which is usually an empty doc-test run).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "\nherald: %d passed, %d failed\n", p, f }' "$log"
