#!/usr/bin/env bash
# Starts or stops the e2e test environment (etcd, kube-apiserver, kube-controller-manager,
# NATS JetStream on 127.0.0.1) in the background.
#   scripts/testenv.sh up DIR     start it, wait until ready (prints the kubeconfig path)
#   scripts/testenv.sh down DIR   stop it and wait until every process and port is gone
set -euo pipefail
source "$(dirname "$0")/lib.sh"

cmd="${1:?usage: testenv.sh up|down DIR}"
dir="${2:?usage: testenv.sh up|down DIR}"
mkdir -p "$dir"

case "$cmd" in
up)
	rm -f "$dir/ready"
	nohup "$HERALD_BIN_DIR/testenv" run --dir "$dir" >"$dir/testenv.log" 2>&1 &
	echo $! >"$dir/launcher.pid"
	for _ in $(seq 1 240); do
		if [ -f "$dir/ready" ]; then
			echo "testenv: ready; export KUBECONFIG=$dir/kubeconfig (NATS: $(cat "$dir/nats-url"))"
			exit 0
		fi
		if ! kill -0 "$(cat "$dir/launcher.pid")" 2>/dev/null; then
			echo "testenv: exited before it was ready; last lines of $dir/testenv.log:" >&2
			tail -40 "$dir/testenv.log" >&2
			exit 1
		fi
		sleep 0.5
	done
	echo "testenv: not ready after 120 s; see $dir/testenv.log" >&2
	exit 1
	;;
down)
	[ -f "$dir/launcher.pid" ] || exit 0
	pid="$(cat "$dir/launcher.pid")"
	kill -TERM "$pid" 2>/dev/null || true
	for _ in $(seq 1 60); do
		kill -0 "$pid" 2>/dev/null || { rm -f "$dir/launcher.pid"; exit 0; }
		sleep 0.5
	done
	echo "testenv: still running after 30 s; killing it" >&2
	kill -KILL "$pid" 2>/dev/null || true
	rm -f "$dir/launcher.pid"
	;;
*)
	echo "usage: testenv.sh up|down DIR" >&2
	exit 2
	;;
esac
