#!/usr/bin/env bash
# Runs the kubelet in a mount namespace of its own where the sysctl files it insists on
# writing (kernel.panic, kernel.panic_on_oops, vm.overcommit_memory, ...) are plain files
# bind-mounted over /proc/sys, so the host keeps its values. The kubelet's root dir is
# made a shared mount here, before the new namespace copies it: the volumes the kubelet
# mounts under it (a projected ServiceAccount token is a tmpfs) then appear in this
# namespace too, where containerd bind-mounts them into the containers.
set -euo pipefail
export D="${NODE_DIR:-/tmp/herald-node}"
export BIN="${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}"
# The node's address (NODE_IP), by default the first global address of this machine;
# its kubeconfig (KUBELET_KUBECONFIG), by default the test environment's in NODE_DIR/env.
export IP="${NODE_IP:-$(ip -4 -o addr show scope global | awk '{print $4}' | cut -d/ -f1 | head -1)}"
export KC="${KUBELET_KUBECONFIG:-$D/env/kubeconfig}"
mkdir -p "$D/kubelet-root"
mountpoint -q "$D/kubelet-root" || mount --bind "$D/kubelet-root" "$D/kubelet-root"
mount --make-rshared "$D/kubelet-root"
exec unshare -m --propagation unchanged /bin/sh -c '
set -e
for f in kernel/panic kernel/panic_on_oops vm/overcommit_memory vm/panic_on_oom kernel/keys/root_maxkeys kernel/keys/root_maxbytes; do
  n="$D/fakesys/$(echo $f | tr / _)"; cat /proc/sys/$f >"$n"; mount --bind "$n" /proc/sys/$f
done
exec nice -n 10 "$BIN/kubelet" --config="$D/kubelet-config.yaml" --kubeconfig="$KC" \
  --root-dir="$D/kubelet-root" --cert-dir="$D/kubelet-pki" --node-ip="$IP" --v=2
'
