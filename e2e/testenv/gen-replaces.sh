#!/usr/bin/env bash
# Regenerates the k8s.io staging-module pins in e2e/testenv/go.mod.
#
# k8s.io/kubernetes' own go.mod replaces every staging module (k8s.io/api,
# k8s.io/apiserver, ...) with a local ./staging/src/k8s.io/... path. Replace
# directives of a dependency are ignored by Go, so a module that imports
# k8s.io/kubernetes must pin each staging module itself. The staging modules
# are published with tag v0.<minor>.<patch> for kubernetes v1.<minor>.<patch>.
#
# Usage: ./gen-replaces.sh [KUBERNETES_VERSION] [MODULE_DIR]
#   (defaults: v1.37.2, this directory; e2e/kube-oldest pins the oldest
#   Kubernetes Herald supports the same way)
# Prints the go mod edit commands it runs; run from anywhere.
set -euo pipefail
cd "${2:-$(dirname "$0")}"

kver="${1:-v1.37.2}"
sver="v0.${kver#v1.}"

gomod="$(go mod download -json "k8s.io/kubernetes@${kver}" |
	sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
[ -n "$gomod" ] || { echo "gen-replaces: cannot locate go.mod of k8s.io/kubernetes@${kver}" >&2; exit 1; }

# Lines look like: "	k8s.io/api => ./staging/src/k8s.io/api"
mods="$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/.*#\1#p' "$gomod")"
[ -n "$mods" ] || { echo "gen-replaces: no staging replaces found in $gomod" >&2; exit 1; }

args=(-require="k8s.io/kubernetes@${kver}")
for m in $mods; do
	# A few staging modules are samples that are never published (e.g.
	# k8s.io/sample-cli-plugin). Nothing we import can need those, so skip
	# them with a warning; a needed one that is missing fails the build anyway.
	if ! go list -m "${m}@${sver}" >/dev/null 2>&1; then
		echo "gen-replaces: skipping ${m}: ${m}@${sver} is not on the module proxy" >&2
		continue
	fi
	args+=(-require="${m}@${sver}" -replace="${m}=${m}@${sver}")
done
echo "go mod edit ${args[*]}"
go mod edit "${args[@]}"
