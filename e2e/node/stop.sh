#!/usr/bin/env bash
# Stops what start.sh started and removes the host state the kubelet left behind.
D="${NODE_DIR:-/tmp/herald-node}"
export KUBECONFIG="$D/env/kubeconfig"
kubectl delete deploy --all --wait=true --timeout=60s
kubectl delete pod --all --wait=true --timeout=60s
for p in kcm scheduler kubelet; do [ -f "$D/$p.pid" ] && kill "$(cat "$D/$p.pid")"; done
sleep 3
ids="$(ctr -n k8s.io c ls -q)"
[ -n "$ids" ] && ctr -n k8s.io c rm $ids # stopped sandboxes not collected yet
kill "$(cat "$D/containerd.pid")"
sleep 2
pgrep -a containerd-shim && echo "stop: containerd shims left over" >&2
kill "$(cat "$D/testenv.pid")"
umount "$D/kubelet-root" 2>/dev/null # the kubelet bind-mounts its root onto itself
ip link del cni-herald0 2>/dev/null
for c in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/k8s.io; do
	[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} \;
done
# Paths the kubelet does not let one choose.
rm -rf /var/lib/kubelet /var/log/pods /var/log/containers /run/containerd "$D/cni/ipam"
