#!/usr/bin/env bash
# Builds the end-to-end test tools into ${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}
# (outside the repo):
#   testenv  - e2e/testenv: etcd + kube-apiserver + kube-controller-manager + NATS JetStream
#   helm     - Helm CLI, from its Go module (pinned below)
#   helm-docs - generates charts/herald/README.md (`make chart-docs`), pinned below
#   promtool - Prometheus's rule checker and tester (charts/herald/tests), pinned below
#   crane    - OCI registry client and loopback registry (e2e/tests/image.rs), pinned below
#   ocibuild - scripts/ocibuild: assembles the OCI images (scripts/image.sh, `make image`)
#   cosign   - signs the release's images, SBOM attestations and chart (scripts/release.sh,
#              e2e/tests/release_artifacts.rs), pinned below
#   cargo-cyclonedx - the release's SBOMs, from Cargo.lock (crates.io), pinned below
#   actionlint - checks the release workflow (.github/workflows), pinned below
#   nats-server-old - a nats-server older than Herald supports, pinned below: the test
#              that Herald refuses it (e2e/tests/nats_requirements.rs)
#   nats-server-oldest, kube-apiserver-oldest - the oldest nats-server and Kubernetes
#              Herald claims to support (the README's table), pinned below and in
#              e2e/kube-oldest/go.mod: e2e/tests/oldest_versions.rs runs Herald on them
#   kubectl  - only if none is on PATH; built from the pinned Kubernetes module
#   node     - kubelet, kube-scheduler and kube-controller-manager from the pinned
#              Kubernetes module, for a real node (e2e/node/, e2e/tests/node.rs)
# Needs only Go; every dependency comes from the Go module proxy. Cheap when
# nothing changed: each step is skipped when its binary is up to date.
# With arguments, builds only the tools named (e.g. `scripts/build-e2e.sh helm-docs`).
set -euo pipefail

HELM_VERSION=v3.22.0
HELM_DOCS_VERSION=v1.14.2
CRANE_VERSION=v0.22.1
COSIGN_VERSION=v3.1.3
ACTIONLINT_VERSION=v1.7.12
CYCLONEDX_VERSION=0.5.9
# The newest nats-server without per-message schedules (2.12 added them).
OLD_NATS_VERSION=v2.11.17
# The oldest nats-server Herald supports: the newest patch of 2.12.
OLDEST_NATS_VERSION=v2.12.15
# Prometheus 3.x is published as Go module v0.3MM.P (3.16.0 = v0.316.0).
PROMETHEUS_VERSION=3.16.0
PROMETHEUS_MODULE_VERSION=v0.316.0

repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}"
mkdir -p "$bin"

only=" $* "
want() { [ "$only" = "  " ] || [[ "$only" == *" $1 "* ]]; }

go=go
if ! command -v go >/dev/null 2>&1; then
	if [ -x /usr/local/go/bin/go ]; then go=/usr/local/go/bin/go; else
		echo "build-e2e: Go is required (https://go.dev/dl)" >&2; exit 1
	fi
fi
# The VCS stamp would make the binary depend on git state, not on sources.
export GOFLAGS="${GOFLAGS:-} -buildvcs=false"

testenv_src="$repo/e2e/testenv"

# Built from the module cache, Kubernetes reports version
# "v0.0.0-master+$Format:%H$", which kubectl and Helm cannot parse. Stamp
# the real one (the k8s.io/kubernetes version pinned in the go.mod of the
# module directory $1, by default e2e/testenv).
k8s_ldflags() {
	local v major minor pkg flags=""
	v="$(cd "${1:-$testenv_src}" && "$go" list -m -f '{{.Version}}' k8s.io/kubernetes)"
	major="${v#v}"; major="${major%%.*}"
	minor="${v#v*.}"; minor="${minor%%.*}"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
		flags+=" -X $pkg.gitTreeState=clean -X $pkg.gitCommit=$v"
	done
	echo "$flags"
}
if ! want testenv; then :
elif [ -x "$bin/testenv" ] && [ -z "$(find "$testenv_src" "$repo/scripts/build-e2e.sh" -type f -newer "$bin/testenv" -print -quit)" ]; then
	echo "build-e2e: testenv is up to date ($bin/testenv)"
else
	echo "build-e2e: building testenv (first build compiles Kubernetes: several minutes) ..."
	start=$(date +%s)
	(cd "$testenv_src" && "$go" build -ldflags "$(k8s_ldflags)" -o "$bin/testenv.tmp" .)
	mv "$bin/testenv.tmp" "$bin/testenv"
	echo "build-e2e: built $bin/testenv in $(($(date +%s) - start))s"
fi

if ! want helm; then :
elif [ -x "$bin/helm" ] && [ "$("$bin/helm" version --template '{{.Version}}' 2>/dev/null)" = "$HELM_VERSION" ]; then
	echo "build-e2e: helm $HELM_VERSION is up to date ($bin/helm)"
else
	echo "build-e2e: building helm $HELM_VERSION ..."
	start=$(date +%s)
	# Same -X stamps as Helm's release Makefile: without them `helm version`
	# says "v3.22" and offline templating assumes Kubernetes 1.20.
	helm_gomod="$("$go" mod download -json "helm.sh/helm/v3@$HELM_VERSION" |
		sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
	cg="$(sed -n 's#^[[:space:]]*k8s.io/client-go v0\.\([0-9]*\)\..*#\1#p' "$helm_gomod")"
	ldflags="-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
	ldflags+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
	for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
		ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$cg"
	done
	GOBIN="$bin" "$go" install -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
	echo "build-e2e: built $bin/helm in $(($(date +%s) - start))s"
fi

# `helm-docs --version` says "helm-docs version 1.14.2" only when stamped (as its
# release builds are); unstamped it has no --version flag at all.
if ! want helm-docs; then :
elif [ -x "$bin/helm-docs" ] && [ "$("$bin/helm-docs" --version 2>/dev/null)" = "helm-docs version ${HELM_DOCS_VERSION#v}" ]; then
	echo "build-e2e: helm-docs $HELM_DOCS_VERSION is up to date ($bin/helm-docs)"
else
	echo "build-e2e: building helm-docs $HELM_DOCS_VERSION ..."
	start=$(date +%s)
	GOBIN="$bin" "$go" install -ldflags "-X main.version=${HELM_DOCS_VERSION#v}" \
		"github.com/norwoodj/helm-docs/cmd/helm-docs@$HELM_DOCS_VERSION"
	echo "build-e2e: built $bin/helm-docs in $(($(date +%s) - start))s"
fi

# promtool links most of Prometheus: the first build takes minutes, so it is skipped
# when the binary reports the pinned version (stamped, as release builds are).
if ! want promtool; then :
elif [ -x "$bin/promtool" ] && [[ "$("$bin/promtool" --version 2>/dev/null)" == "promtool, version $PROMETHEUS_VERSION "* ]]; then
	echo "build-e2e: promtool $PROMETHEUS_VERSION is up to date ($bin/promtool)"
else
	echo "build-e2e: building promtool $PROMETHEUS_VERSION (a few minutes the first time) ..."
	start=$(date +%s)
	GOBIN="$bin" "$go" install -ldflags "-X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
		"github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_MODULE_VERSION"
	echo "build-e2e: built $bin/promtool in $(($(date +%s) - start))s"
fi

if ! want crane; then :
elif [ -x "$bin/crane" ] && [ "$("$bin/crane" version 2>/dev/null)" = "$CRANE_VERSION" ]; then
	echo "build-e2e: crane $CRANE_VERSION is up to date ($bin/crane)"
else
	echo "build-e2e: building crane $CRANE_VERSION ..."
	start=$(date +%s)
	GOBIN="$bin" "$go" install "github.com/google/go-containerregistry/cmd/crane@$CRANE_VERSION"
	echo "build-e2e: built $bin/crane in $(($(date +%s) - start))s"
fi

# cosign links the clients of every cloud's key service: minutes the first time.
if ! want cosign; then :
elif [ -x "$bin/cosign" ] && "$bin/cosign" version 2>/dev/null | grep -q "GitVersion: *$COSIGN_VERSION\$"; then
	echo "build-e2e: cosign $COSIGN_VERSION is up to date ($bin/cosign)"
else
	echo "build-e2e: building cosign $COSIGN_VERSION (a few minutes the first time) ..."
	start=$(date +%s)
	GOBIN="$bin" "$go" install \
		-ldflags "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" \
		"github.com/sigstore/cosign/v3/cmd/cosign@$COSIGN_VERSION"
	echo "build-e2e: built $bin/cosign in $(($(date +%s) - start))s"
fi

if ! want actionlint; then :
elif [ -x "$bin/actionlint" ] && [ "$("$bin/actionlint" -version 2>/dev/null | head -1)" = "$ACTIONLINT_VERSION" ]; then
	echo "build-e2e: actionlint $ACTIONLINT_VERSION is up to date ($bin/actionlint)"
else
	echo "build-e2e: building actionlint $ACTIONLINT_VERSION ..."
	start=$(date +%s)
	GOBIN="$bin" "$go" install \
		-ldflags "-X github.com/rhysd/actionlint.version=$ACTIONLINT_VERSION" \
		"github.com/rhysd/actionlint/cmd/actionlint@$ACTIONLINT_VERSION"
	echo "build-e2e: built $bin/actionlint in $(($(date +%s) - start))s"
fi

# A cargo subcommand, from crates.io; installed beside the Go tools.
if ! want cargo-cyclonedx; then :
elif [ -x "$bin/cargo-cyclonedx" ] && [[ "$("$bin/cargo-cyclonedx" cyclonedx --version 2>/dev/null)" == *" $CYCLONEDX_VERSION" ]]; then
	echo "build-e2e: cargo-cyclonedx $CYCLONEDX_VERSION is up to date ($bin/cargo-cyclonedx)"
else
	echo "build-e2e: building cargo-cyclonedx $CYCLONEDX_VERSION ..."
	start=$(date +%s)
	root="$(mktemp -d "${TMPDIR:-/tmp}/herald-cyclonedx.XXXXXX")"
	cargo install --quiet --locked --root "$root" --version "$CYCLONEDX_VERSION" cargo-cyclonedx
	mv "$root/bin/cargo-cyclonedx" "$bin/cargo-cyclonedx"
	rm -rf "$root"
	echo "build-e2e: built $bin/cargo-cyclonedx in $(($(date +%s) - start))s"
fi

ocibuild_src="$repo/scripts/ocibuild"
if ! want ocibuild; then :
elif [ -x "$bin/ocibuild" ] && [ -z "$(find "$ocibuild_src" -type f -newer "$bin/ocibuild" -print -quit)" ]; then
	echo "build-e2e: ocibuild is up to date ($bin/ocibuild)"
else
	echo "build-e2e: building ocibuild ..."
	(cd "$ocibuild_src" && "$go" build -o "$bin/ocibuild.tmp" .)
	mv "$bin/ocibuild.tmp" "$bin/ocibuild"
fi

if ! want nats-server-old; then :
elif [ -x "$bin/nats-server-old" ] && [[ "$("$bin/nats-server-old" --version 2>/dev/null)" == *"${OLD_NATS_VERSION}" ]]; then
	echo "build-e2e: nats-server-old $OLD_NATS_VERSION is up to date ($bin/nats-server-old)"
else
	echo "build-e2e: building nats-server $OLD_NATS_VERSION as nats-server-old ..."
	start=$(date +%s)
	tmp_bin="$(mktemp -d)"
	GOBIN="$tmp_bin" "$go" install "github.com/nats-io/nats-server/v2@$OLD_NATS_VERSION"
	mv "$tmp_bin/nats-server" "$bin/nats-server-old"
	rmdir "$tmp_bin"
	echo "build-e2e: built $bin/nats-server-old in $(($(date +%s) - start))s"
fi

if ! want nats-server-oldest; then :
elif [ -x "$bin/nats-server-oldest" ] && [[ "$("$bin/nats-server-oldest" --version 2>/dev/null)" == *"${OLDEST_NATS_VERSION}" ]]; then
	echo "build-e2e: nats-server-oldest $OLDEST_NATS_VERSION is up to date ($bin/nats-server-oldest)"
else
	echo "build-e2e: building nats-server $OLDEST_NATS_VERSION as nats-server-oldest ..."
	start=$(date +%s)
	tmp_bin="$(mktemp -d)"
	GOBIN="$tmp_bin" "$go" install "github.com/nats-io/nats-server/v2@$OLDEST_NATS_VERSION"
	mv "$tmp_bin/nats-server" "$bin/nats-server-oldest"
	rmdir "$tmp_bin"
	echo "build-e2e: built $bin/nats-server-oldest in $(($(date +%s) - start))s"
fi

oldest_src="$repo/e2e/kube-oldest"
if ! want kube-apiserver-oldest; then :
elif [ -x "$bin/kube-apiserver-oldest" ] && [ -z "$(find "$oldest_src" -type f -newer "$bin/kube-apiserver-oldest" -print -quit)" ]; then
	echo "build-e2e: kube-apiserver-oldest is up to date ($bin/kube-apiserver-oldest)"
else
	echo "build-e2e: building kube-apiserver-oldest (the Kubernetes of e2e/kube-oldest/go.mod: several minutes the first time) ..."
	start=$(date +%s)
	(cd "$oldest_src" && "$go" build -ldflags "$(k8s_ldflags "$oldest_src")" -o "$bin/kube-apiserver-oldest.tmp" k8s.io/kubernetes/cmd/kube-apiserver)
	mv "$bin/kube-apiserver-oldest.tmp" "$bin/kube-apiserver-oldest"
	echo "build-e2e: built $bin/kube-apiserver-oldest in $(($(date +%s) - start))s"
fi

if ! want kubectl; then :
elif command -v kubectl >/dev/null 2>&1; then
	echo "build-e2e: using kubectl from PATH ($(command -v kubectl))"
elif [ -x "$bin/kubectl" ] && [ -z "$(find "$testenv_src/go.mod" -newer "$bin/kubectl" -print -quit)" ]; then
	echo "build-e2e: kubectl is up to date ($bin/kubectl); add $bin to PATH"
else
	# kubectl's main package lives in k8s.io/kubernetes/cmd/kubectl (the
	# k8s.io/kubectl module has none), and `go install ...@version` refuses
	# k8s.io/kubernetes because of its replace directives. So build it inside
	# the testenv module, which pins k8s.io/kubernetes and k8s.io/kubectl
	# (go.mod "tool" directive).
	echo "build-e2e: no kubectl on PATH; building it from k8s.io/kubernetes/cmd/kubectl ..."
	start=$(date +%s)
	(cd "$testenv_src" && "$go" build -ldflags "$(k8s_ldflags)" -o "$bin/kubectl.tmp" k8s.io/kubernetes/cmd/kubectl)
	mv "$bin/kubectl.tmp" "$bin/kubectl"
	echo "build-e2e: built $bin/kubectl in $(($(date +%s) - start))s; add $bin to PATH"
fi

# A real node's components (e2e/node/).
if want node; then
	for tool in kubelet kube-scheduler kube-controller-manager; do
		if [ -x "$bin/$tool" ] && [ -z "$(find "$testenv_src/go.mod" -newer "$bin/$tool" -print -quit)" ]; then
			echo "build-e2e: $tool is up to date ($bin/$tool)"
			continue
		fi
		echo "build-e2e: building $tool from k8s.io/kubernetes/cmd/$tool ..."
		start=$(date +%s)
		(cd "$testenv_src" && "$go" build -ldflags "$(k8s_ldflags)" -o "$bin/$tool.tmp" "k8s.io/kubernetes/cmd/$tool")
		mv "$bin/$tool.tmp" "$bin/$tool"
		echo "build-e2e: built $bin/$tool in $(($(date +%s) - start))s"
	done
fi
