#!/usr/bin/env bash
# Runs the kubelet in a mount namespace of its own where the sysctl files it insists on
# writing (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory, ...) are plain files
# bind-mounted over /proc/sys, so the host keeps its values. The kubelet's root dir is a
# shared mount (the kubelet makes it so): volume mounts still reach containerd.
set -euo pipefail
export D="${NODE_DIR:-/tmp/herald-node}"
export BIN="${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}"
ip="$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1)"
export IP="$ip"
exec unshare -m --propagation unchanged /bin/sh -c '
set -e
for f in kernel/panic kernel/panic_on_oops vm/overcommit_memory vm/panic_on_oom kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  n="$D/fakesys/$(echo $f | tr / _)"; cat /proc/sys/$f >"$n"; mount --bind "$n" /proc/sys/$f
done
exec nice -n 10 "$BIN/kubelet" --config="$D/kubelet-config.yaml" --kubeconfig="$D/env/kubeconfig" \
  --root-dir="$D/kubelet-root" --cert-dir="$D/kubelet-pki" --node-ip="$IP" --v=2
'
