# Shared settings for the project's scripts; sourced, not run.
# Build outputs live outside the clone so CI runs are incremental and `git clean` is cheap.
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/herald/target}"
export HERALD_BIN_DIR="${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}"
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
	export PATH="$PATH:/usr/local/go/bin"
fi
# kubectl and helm built by scripts/build-e2e.sh, after anything already on PATH.
export PATH="$PATH:$HERALD_BIN_DIR"
