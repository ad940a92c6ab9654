#!/usr/bin/env bash
# Builds Herald's three OCI images (herald-operator, herald-dispatcher, herald-api) without a container
# engine, reproducibly, and pushes them when a registry is given.
#
#   scripts/image.sh [--bin-dir DIR] [--out DIR] [--tag TAG] [--registry HOST[/PATH]]
#
#   --bin-dir   take herald-operator, herald-dispatcher and herald-api from DIR instead of building
#               them (`cargo build --release`); the e2e test passes the debug binaries
#   --out       where the images go, one OCI image layout per image
#               (default: $CARGO_TARGET_DIR/images; OUT=... works too)
#   --tag       the tag (default: the workspace version; TAG=...)
#   --registry  push all to HOST[/PATH]/herald-{operator,dispatcher,api}:TAG with crane
#               (REGISTRY=...; loopback registries are spoken to over plain HTTP)
#
# Each image is what the Dockerfile's stage of the same name builds, without the
# distroless base: the binary in /usr/local/bin, exactly the shared libraries it links
# (as `ldd` lists them: glibc, libgcc_s, the loader; the same as distroless `cc`),
# /etc/passwd and /etc/group with "nonroot" 65532, /etc/nsswitch.conf for name
# resolution from /etc/hosts and DNS, and the CA bundle (rustls-native-certs and
# rustls-platform-verifier read the system roots from the filesystem). Config: USER
# 65532:65532, EXPOSE 8080, the Dockerfile's ENTRYPOINT and CMD. Nothing in the image
# needs to be written, so it runs with a read-only root filesystem.
#
# Reproducible: the same binaries, libraries and CA bundle give the same digests (every
# file 0:0 with mtime SOURCE_DATE_EPOCH, default 0; see scripts/ocibuild). The libraries
# and the CA bundle come from the build machine (CA_BUNDLE=... overrides the bundle):
# build on Debian 12 for the images distroless cc-debian12 would give.
#
# Why dynamic binaries and their libraries rather than static ones: a static glibc build
# (`-C target-feature=+crt-static`) does resolve names from /etc/hosts and DNS (glibc
# 2.34+ has those NSS modules built in), but needs `--target` and a second full release
# build, and would ship binaries other than the ones the tests run. This way the image is
# the binary the rest of the project tests, plus what it links, like distroless cc.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

bin_dir=""
out="${OUT:-$CARGO_TARGET_DIR/images}"
tag="${TAG:-}"
registry="${REGISTRY:-}"
while [ $# -gt 0 ]; do
	case "$1" in
	--bin-dir) bin_dir="$2"; shift 2 ;;
	--out) out="$2"; shift 2 ;;
	--tag) tag="$2"; shift 2 ;;
	--registry) registry="$2"; shift 2 ;;
	*) echo "usage: scripts/image.sh [--bin-dir DIR] [--out DIR] [--tag TAG] [--registry HOST[/PATH]]" >&2; exit 2 ;;
	esac
done
if [ -z "$tag" ]; then
	tag="$(workspace_version)"
fi
ca_bundle="${CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}"
created="${SOURCE_DATE_EPOCH:-0}"

arch="$(host_arch)"

tools=(ocibuild)
[ -z "$registry" ] || tools+=(crane)
"$repo/scripts/build-e2e.sh" "${tools[@]}"

if [ -z "$bin_dir" ]; then
	(cd "$repo" && cargo build --release --locked -p herald-operator -p herald-dispatcher -p herald-api)
	bin_dir="$CARGO_TARGET_DIR/release"
fi
binaries=("$bin_dir/herald-operator" "$bin_dir/herald-dispatcher" "$bin_dir/herald-api")
for b in "${binaries[@]}"; do
	[ -x "$b" ] || { echo "image: $b is not built" >&2; exit 1; }
done
[ -f "$ca_bundle" ] || { echo "image: no CA bundle at $ca_bundle (set CA_BUNDLE)" >&2; exit 1; }

stage="$(mktemp -d "${TMPDIR:-/tmp}/herald-image.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
# Modes are set explicitly: the layers keep the permission bits found here, whatever
# the umask of the build.
umask 022

# The base layer, shared by every image.
base="$stage/base"
install -d -m 0755 "$base/etc" "$base/etc/ssl/certs"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
	'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$base/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$base/etc/group"
printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$base/etc/nsswitch.conf"
chmod 0644 "$base/etc/passwd" "$base/etc/group" "$base/etc/nsswitch.conf"
install -m 0644 "$ca_bundle" "$base/etc/ssl/certs/ca-certificates.crt"
# Every library either binary links, at the path the loader finds it (the loader at the
# ELF interpreter path). A statically linked binary adds nothing here.
libs="$(for b in "${binaries[@]}"; do ldd "$b" 2>/dev/null || true; done |
	sed -n -e 's/^.*=> \(\/[^ ]*\) (0x.*$/\1/p' -e 's/^[[:space:]]*\(\/[^ ]*\) (0x.*$/\1/p' | sort -u)"
for lib in $libs; do
	install -D -m 0755 "$(readlink -f "$lib")" "$base$lib"
done

# Name, Dockerfile stage and CMD of each image. Keep in step with the Dockerfile
# (e2e/tests/image.rs compares them).
for image in operator dispatcher api; do
	binary="herald-$image"
	app="$stage/$image"
	install -D -m 0755 "$bin_dir/$binary" "$app/usr/local/bin/$binary"
	cmd=()
	[ "$image" != operator ] || cmd=(--cmd '["run"]')
	digest="$("$HERALD_BIN_DIR/ocibuild" \
		--layer "$base" --layer "$app" \
		--entrypoint "[\"/usr/local/bin/$binary\"]" "${cmd[@]}" \
		--user 65532:65532 --port 8080/tcp \
		--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		--env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
		--label "org.opencontainers.image.title=$binary" \
		--label "org.opencontainers.image.version=$tag" \
		--label "org.opencontainers.image.source=https://github.com/herald-dev/herald" \
		--created "$created" --arch "$arch" \
		--tag "$binary:$tag" --out "$out/$binary")"
	echo "image: $binary:$tag $digest ($out/$binary)"
	if [ -n "$registry" ]; then
		"$HERALD_BIN_DIR/crane" push "$out/$binary" "$registry/$binary:$tag"
	fi
done
