#!/usr/bin/env bash
# The tour, as far as it goes today: starts the test environment (kube-apiserver + NATS on
# 127.0.0.1), installs the CRDs, applies the examples, and shows what a tenant sees.
# Leaves the environment running; `make testenv-down` stops it.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"
dir="${TESTENV_DIR:-$repo/.testenv}"

scripts/build-e2e.sh
if [ ! -f "$dir/ready" ]; then
	scripts/testenv.sh up "$dir"
fi
export KUBECONFIG="$dir/kubeconfig"
set -x
kubectl apply --server-side -f crds/
kubectl wait --for condition=Established --timeout=60s -f crds/
kubectl create namespace shop --dry-run=client -o yaml | kubectl apply -f -
kubectl apply -n shop -f examples/
kubectl get webhookendpoints,signingsecrets,webhookreplays -n shop
kubectl explain webhookendpoint.spec.delivery.retry
set +x
echo
echo "The environment keeps running: export KUBECONFIG=$KUBECONFIG"
echo "Stop it with: make testenv-down"
