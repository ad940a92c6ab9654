#!/usr/bin/env bash
# Starts a test environment and a real node for it (see README.md): containerd, local
# images, a kubelet, kube-scheduler and the controllers Deployments need. Run as root.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
D="${NODE_DIR:-/tmp/herald-node}"
bin="${HERALD_BIN_DIR:-$HOME/.cache/herald/bin}"
mkdir -p "$D"/{img,cni/net.d,fakesys,manifests,containerd}
"$bin/testenv" run --dir "$D/env" >"$D/testenv.log" 2>&1 &
echo $! >"$D/testenv.pid"
until grep -q "testenv: ready" "$D/testenv.log"; do sleep 1; done

containerd config default |
	sed -e "s#^root = .*#root = \"$D/containerd/root\"#" \
		-e 's#restrict_oom_score_adj = false#restrict_oom_score_adj = true#' \
		-e 's#sandbox_image = .*#sandbox_image = "localhost/pause:local"#' \
		-e 's#bin_dir = "/opt/cni/bin"#bin_dir = "/usr/lib/cni"#' \
		-e "s#conf_dir = \"/etc/cni/net.d\"#conf_dir = \"$D/cni/net.d\"#" >"$D/containerd.toml"
sed "s#@NODE_DIR@#$D#g" "$here/10-bridge.conflist" >"$D/cni/net.d/10-bridge.conflist"
sed "s#@NODE_DIR@#$D#g" "$here/kubelet-config.yaml" >"$D/kubelet-config.yaml"
containerd --config "$D/containerd.toml" >"$D/containerd.log" 2>&1 &
echo $! >"$D/containerd.pid"
until ctr version >/dev/null 2>&1; do sleep 1; done

python3 "$here/mkimg.py" localhost/pause:local "$D/img/pause.tar" \
	'["/bin/sh","-c","trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"]'
python3 "$here/mkimg.py" localhost/busybox:local "$D/img/busybox.tar" '["/bin/sh"]'
ctr -n k8s.io images import "$D/img/pause.tar"
ctr -n k8s.io images import "$D/img/busybox.tar"

NODE_DIR="$D" HERALD_BIN_DIR="$bin" "$here/run-kubelet.sh" >"$D/kubelet.log" 2>&1 &
echo $! >"$D/kubelet.pid"
export KUBECONFIG="$D/env/kubeconfig"
"$bin/kube-scheduler" --kubeconfig="$KUBECONFIG" --leader-elect=false --secure-port=0 >"$D/scheduler.log" 2>&1 &
echo $! >"$D/scheduler.pid"
"$bin/kube-controller-manager" --kubeconfig="$KUBECONFIG" --leader-elect=false --secure-port=0 \
	--controllers=deployment-controller,replicaset-controller,node-lifecycle-controller >"$D/kcm.log" 2>&1 &
echo $! >"$D/kcm.pid"
node="$(hostname)"
until kubectl get node "$node" >/dev/null 2>&1; do sleep 1; done
kubectl wait --for=condition=Ready "node/$node" --timeout=120s
