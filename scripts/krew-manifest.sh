#!/usr/bin/env bash
# Writes the krew manifest (plugins/herald.yaml in krew-index) for the plugin archives of
# VERSION found in DIR (scripts/plugin-archive.sh), one platform each, with their
# sha256, pointing at the GitHub release's downloads (RELEASE_URL overrides the base).
#
#   scripts/krew-manifest.sh VERSION DIR > herald.yaml
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: scripts/krew-manifest.sh VERSION DIR" >&2; exit 2; }
version="$1" dir="$2"
base="${RELEASE_URL:-https://github.com/herald-dev/herald/releases/download/v$version}"
shopt -s nullglob
archives=("$dir"/kubectl-herald_"${version}"_*.tar.gz "$dir"/kubectl-herald_"${version}"_*.zip)
[ ${#archives[@]} -gt 0 ] || { echo "krew-manifest: no kubectl-herald_${version}_* archive in $dir" >&2; exit 1; }
cat <<YAML
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: herald
spec:
  version: v$version
  homepage: https://github.com/herald-dev/herald
  shortDescription: Inspect and steer Herald webhook deliveries
  description: |
    The kubectl plugin for Herald, the Kubernetes-native webhook delivery system:
    the delivery log of an endpoint, redelivery of failed deliveries, replays,
    signing key rotation, local signature checks, and a check of the installation
    (doctor), with the identity of your kubeconfig.
  platforms:
YAML
for archive in "${archives[@]}"; do
	file="$(basename "$archive")"
	platform="${file#kubectl-herald_"${version}"_}"
	platform="${platform%.tar.gz}"
	platform="${platform%.zip}"
	os="${platform%_*}" arch="${platform##*_}"
	exe=kubectl-herald
	[ "$os" != windows ] || exe=kubectl-herald.exe
	cat <<YAML
  - selector:
      matchLabels:
        os: $os
        arch: $arch
    uri: $base/$file
    sha256: $(sha256sum "$archive" | cut -d' ' -f1)
    bin: $exe
YAML
done
