#!/usr/bin/env bash
# Packs the kubectl plugin for one platform as the release publishes it and krew
# installs it: kubectl-herald[.exe] and LICENSE at the archive's top, a .tar.gz (a .zip
# for Windows), reproducible (sorted, owner 0, mtime SOURCE_DATE_EPOCH, default 0).
#
#   scripts/plugin-archive.sh BINARY VERSION OS ARCH OUT_DIR
set -euo pipefail
[ $# -eq 5 ] || { echo "usage: scripts/plugin-archive.sh BINARY VERSION OS ARCH OUT_DIR" >&2; exit 2; }
binary="$1" version="$2" os="$3" arch="$4" out="$(cd "$5" && pwd)"
repo="$(cd "$(dirname "$0")/.." && pwd)"
[ -x "$binary" ] || { echo "plugin-archive: $binary is not an executable" >&2; exit 1; }
stage="$(mktemp -d "${TMPDIR:-/tmp}/herald-plugin.XXXXXX")"
trap 'rm -rf "$stage"' EXIT
exe=kubectl-herald
[ "$os" != windows ] || exe=kubectl-herald.exe
install -m 0755 "$binary" "$stage/$exe"
install -m 0644 "$repo/LICENSE" "$stage/LICENSE"
touch -d "@${SOURCE_DATE_EPOCH:-0}" "$stage/$exe" "$stage/LICENSE"
name="kubectl-herald_${version}_${os}_${arch}"
if [ "$os" = windows ]; then
	(cd "$stage" && zip -X -q "$out/$name.zip" LICENSE "$exe")
	echo "$out/$name.zip"
else
	tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@${SOURCE_DATE_EPOCH:-0}" \
		-cf - LICENSE "$exe" | gzip -n >"$out/$name.tar.gz"
	echo "$out/$name.tar.gz"
fi
