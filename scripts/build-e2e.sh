#!/usr/bin/env bash
# Builds the end-to-end test tools into ${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}
# (outside the repo):
#   testenv  - e2e/testenv: etcd + kube-apiserver + kube-controller-manager + NATS JetStream
#   helm     - Helm CLI, from its Go module (pinned below)
#   helm-docs - generates charts/herald/README.md (`make chart-docs`), pinned below
#   promtool - Prometheus's rule checker and tester (charts/herald/tests), pinned below
#   crane    - OCI registry client and loopback registry (e2e/tests/image.rs), pinned below
#   ocibuild - scripts/ocibuild: assembles the OCI images (scripts/image.sh, `make image`)
#   nats-server-old - a nats-server older than Herald supports, pinned below: the test
#              that Herald refuses it (e2e/tests/nats_requirements.rs)
#   kubectl  - only if none is on PATH; built from the pinned Kubernetes module
# Needs only Go; every dependency comes from the Go module proxy. Cheap when
# nothing changed: each step is skipped when its binary is up to date.
# With arguments, builds only the tools named (e.g. `scripts/build-e2e.sh helm-docs`).
set -euo pipefail

HELM_VERSION=v3.22.0
HELM_DOCS_VERSION=v1.14.2
CRANE_VERSION=v0.22.1
# The newest nats-server without per-message schedules (2.12 added them).
OLD_NATS_VERSION=v2.11.17
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
# the real one (the k8s.io/kubernetes version pinned in e2e/testenv/go.mod).
k8s_ldflags() {
	local v major minor pkg flags=""
	v="$(cd "$testenv_src" && "$go" list -m -f '{{.Version}}' k8s.io/kubernetes)"
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
