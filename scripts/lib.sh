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

# The workspace's version (Cargo.toml's [workspace.package]): what images, chart and
# plugin of a release carry.
workspace_version() {
	sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml"
}

# This machine's architecture as OCI images and krew name it.
host_arch() {
	case "$(uname -m)" in
	x86_64) echo amd64 ;;
	aarch64) echo arm64 ;;
	*) echo "unsupported architecture $(uname -m)" >&2; return 1 ;;
	esac
}
