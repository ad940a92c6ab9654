#!/usr/bin/env bash
# Makes a release of Herald: what a platform team pulls, signed so it can check where it
# came from.
#
#   make release VERSION=X.Y.Z REGISTRY=HOST[/PATH]
#   scripts/release.sh --version X.Y.Z --registry HOST[/PATH] [--out DIR] [--bin-dir DIR]
#                      [--arch-images amd64,arm64] [--plugins DIR] [--keyless]
#
#   --version      the release; must be the workspace's version (Cargo.toml) and the
#                  chart's version and appVersion: bump those first, in a commit
#   --registry     where the images and the chart go: HOST[/PATH]/herald-{operator,
#                  dispatcher,api}:X.Y.Z and oci://HOST[/PATH]/charts/herald:X.Y.Z
#                  (a loopback registry is spoken to over plain HTTP)
#   --out          the release's files (default: $CARGO_TARGET_DIR/release-X.Y.Z)
#   --bin-dir      take the binaries from DIR instead of building them (`cargo build
#                  --release`); the e2e test passes its debug binaries
#   --arch-images  the images were built and pushed per architecture, as
#                  HOST[/PATH]/herald-*:X.Y.Z-<arch> (scripts/image.sh on each
#                  architecture's machine): join them into one multi-architecture
#                  X.Y.Z instead of building this machine's
#   --plugins      plugin archives built elsewhere (scripts/plugin-archive.sh on each
#                  platform), released beside this machine's
#   --keyless      sign with the CI's identity (Sigstore's keyless signing, recorded in
#                  its public transparency log); the release workflow does
#
# Signing without --keyless: with COSIGN_KEY (a cosign private key file; COSIGN_PASSWORD
# its password) the images, their SBOM attestations and the chart are signed with that
# key; without it a key pair is made for this one release (a trial), its private half
# deleted at the end. Such signatures are not uploaded to a transparency log; verify
# them with the release's cosign.pub:
#   cosign verify --key cosign.pub --insecure-ignore-tlog HOST/herald-operator:X.Y.Z
#
# What OUT holds afterwards:
#   images.txt                 every image and the chart: tag, then digest reference
#   sbom/herald-*.cdx.json     a CycloneDX SBOM per image: the crates its binary is
#                              built from, as Cargo.lock resolves them (cargo-cyclonedx),
#                              also attested to the image
#   herald-X.Y.Z.tgz           the chart, as pushed; its default image tag is X.Y.Z
#   kubectl-herald_X.Y.Z_<os>_<arch>.tar.gz (.zip on Windows)   the plugin
#   krew/herald.yaml           the krew manifest for those archives
#   SHA256SUMS                 of every file above
#   cosign.pub                 the public key the signatures verify with (not keyless)
set -euo pipefail
source "$(dirname "$0")/lib.sh"

version="${VERSION:-}"
registry="${REGISTRY:-}"
out="${OUT:-}"
bin_dir=""
arch_images=""
plugins=""
keyless=false
usage="usage: scripts/release.sh --version X.Y.Z --registry HOST[/PATH] [--out DIR] [--bin-dir DIR] [--arch-images A,B] [--plugins DIR] [--keyless]"
while [ $# -gt 0 ]; do
	case "$1" in
	--version) version="$2"; shift 2 ;;
	--registry) registry="$2"; shift 2 ;;
	--out) out="$2"; shift 2 ;;
	--bin-dir) bin_dir="$2"; shift 2 ;;
	--arch-images) arch_images="$2"; shift 2 ;;
	--plugins) plugins="$2"; shift 2 ;;
	--keyless) keyless=true; shift ;;
	*) echo "$usage" >&2; exit 2 ;;
	esac
done
fail() { echo "release: $*" >&2; exit 1; }
[ -n "$version" ] || fail "no version given ($usage)"
[ -n "$registry" ] || fail "no registry given ($usage)"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
	fail "version $version is not X.Y.Z (semantic versioning, without a leading v)"

# One version everywhere, or the images, the chart's default tag and the plugin disagree.
workspace="$(workspace_version)"
chart_version="$(sed -n 's/^version: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/herald/Chart.yaml")"
app_version="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/herald/Chart.yaml")"
for pair in "Cargo.toml's workspace version:$workspace" "Chart.yaml's version:$chart_version" \
	"Chart.yaml's appVersion:$app_version"; do
	[ "${pair##*:}" = "$version" ] ||
		fail "$version is not ${pair%:*} (${pair##*:}); bump it and commit first"
done

out="${out:-$CARGO_TARGET_DIR/release-$version}"
rm -rf "$out"
mkdir -p "$out/sbom" "$out/krew"
out="$(cd "$out" && pwd)"

"$repo/scripts/build-e2e.sh" ocibuild crane helm cosign cargo-cyclonedx
crane="$HERALD_BIN_DIR/crane"
cosign="$HERALD_BIN_DIR/cosign"
helm="$HERALD_BIN_DIR/helm"
[ -x "$helm" ] || helm="$(command -v helm)"
export PATH="$HERALD_BIN_DIR:$PATH" # cargo finds cargo-cyclonedx there

# A loopback registry speaks plain HTTP.
host="${registry%%/*}"
insecure=()
plain=()
case "$host" in
127.* | localhost | localhost:*)
	insecure=(--allow-insecure-registry --allow-http-registry)
	plain=(--plain-http)
	;;
esac

os="$(uname -s | tr '[:upper:]' '[:lower:]')"
arch="$(host_arch)"

if [ -z "$bin_dir" ]; then
	packages=(-p kubectl-herald)
	[ -n "$arch_images" ] || packages+=(-p herald-operator -p herald-dispatcher -p herald-api)
	(cd "$repo" && cargo build --release --locked "${packages[@]}")
	bin_dir="$CARGO_TARGET_DIR/release"
fi
[ -x "$bin_dir/kubectl-herald" ] || fail "$bin_dir/kubectl-herald is not built"

# The signing key: the CI's identity, the release manager's key, or one for this trial.
# With a key, the signatures go to the registry only: a signing config naming no
# transparency log or timestamp service.
scratch="$(mktemp -d "${TMPDIR:-/tmp}/herald-release.XXXXXX")"
sbom_name="herald-release-sbom-$$"
trap 'rm -rf "$scratch"; find "$repo" -name "$sbom_name.json" -delete' EXIT
if $keyless; then
	signing=()
else
	"$cosign" signing-config create --out "$scratch/signing-config.json" >/dev/null
	if [ -n "${COSIGN_KEY:-}" ]; then
		key="$COSIGN_KEY"
		export COSIGN_PASSWORD="${COSIGN_PASSWORD:-}"
		"$cosign" public-key --key "$COSIGN_KEY" >"$out/cosign.pub"
	else
		export COSIGN_PASSWORD=""
		(cd "$out" && "$cosign" generate-key-pair >/dev/null 2>&1)
		key="$out/cosign.key"
	fi
	signing=(--key "$key" --signing-config "$scratch/signing-config.json")
fi
# cosign's chatter (and, without network, its warning that Sigstore's trust root cannot
# be fetched, which signing with a key does not need) is kept for when it fails.
sign() { quiet "$cosign" sign --yes "${signing[@]}" "${insecure[@]}" "$@"; }
attest() { quiet "$cosign" attest --yes "${signing[@]}" "${insecure[@]}" "$@"; }
quiet() { local log; log="$("$@" 2>&1)" || fail "$1 ${2:-}: $log"; }

# The images: this machine's, or the architectures' joined under one tag.
if [ -n "$arch_images" ]; then
	for image in operator dispatcher api; do
		manifests=()
		IFS=, read -r -a arches <<<"$arch_images"
		for a in "${arches[@]}"; do
			manifests+=(-m "$registry/herald-$image:$version-$a")
		done
		"$crane" index append "${manifests[@]}" -t "$registry/herald-$image:$version" >/dev/null
	done
else
	"$repo/scripts/image.sh" --bin-dir "$bin_dir" --tag "$version" --registry "$registry" \
		--out "$out/images" >/dev/null
	rm -rf "$out/images"
fi

# The SBOMs: cargo-cyclonedx writes one beside every workspace member's Cargo.toml; the
# images' three are kept, the others removed (also when this fails).
(cd "$repo" && cargo cyclonedx --quiet --format json --spec-version 1.5 --no-build-deps \
	--override-filename "$sbom_name" >/dev/null)
for image in operator dispatcher api; do
	mv "$repo/$image/$sbom_name.json" "$out/sbom/herald-$image.cdx.json"
done

# Each image signed by digest (a tag can move, a digest cannot), with its SBOM attested.
: >"$out/images.txt"
for image in operator dispatcher api; do
	name="herald-$image"
	ref="$registry/$name@$("$crane" digest "$registry/$name:$version")"
	echo "$registry/$name:$version $ref" >>"$out/images.txt"
	sbom="$out/sbom/$name.cdx.json"
	sign "$ref"
	attest --type cyclonedx --predicate "$sbom" "$ref"
	echo "release: $ref signed, its SBOM attested"
done

# The chart, as an OCI artifact; its default image tag is its version.
"$helm" package "$repo/charts/herald" --version "$version" --app-version "$version" \
	--destination "$out" >/dev/null
pushed="$("$helm" push "$out/herald-$version.tgz" "oci://$registry/charts" "${plain[@]}" 2>&1)" ||
	fail "helm push: $pushed"
chart_digest="$(printf '%s\n' "$pushed" | sed -n 's/^Digest: //p')"
[ -n "$chart_digest" ] || fail "helm push printed no digest: $pushed"
echo "oci://$registry/charts/herald:$version $registry/charts/herald@$chart_digest" >>"$out/images.txt"
sign "$registry/charts/herald@$chart_digest"
echo "release: chart $registry/charts/herald@$chart_digest signed"

# The plugin: this machine's archive and any built elsewhere; the krew manifest for all.
"$repo/scripts/plugin-archive.sh" "$bin_dir/kubectl-herald" "$version" "$os" "$arch" "$out" >/dev/null
if [ -n "$plugins" ]; then
	find "$plugins" -maxdepth 1 -name "kubectl-herald_${version}_*" -exec cp -n {} "$out/" \;
fi
"$repo/scripts/krew-manifest.sh" "$version" "$out" >"$out/krew/herald.yaml"

rm -f "$out/cosign.key"
(cd "$out" && find . -type f ! -name SHA256SUMS | sed 's|^\./||' | sort | xargs sha256sum >SHA256SUMS)
echo "release: $version in $out"
