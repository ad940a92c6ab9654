#!/usr/bin/env bash
# The tour (`make demo`): Herald end to end on this machine.
#   - builds the test environment, the operator, the dispatcher and the example programs;
#   - starts the test environment (kube-apiserver + NATS JetStream on 127.0.0.1) unless up;
#   - installs the CRDs, runs herald-operator and herald-dispatcher in the background;
#   - starts the example receiver (which verifies signatures; /failing always answers 500);
#   - applies the tenant examples (examples/demo: examples/tenant pointed at the receiver,
#     plus an endpoint that always fails) into namespace `shop`;
#   - publishes events with herald-producer and shows what a tenant sees: live status,
#     the delivery log, and the failing endpoint's circuit opening (and the operational
#     event about it reaching the tenant's alerts endpoint);
#   - starts herald-api and, as a tenant (a ServiceAccount token, a namespaced Role),
#     uses the kubectl plugin: the delivery log, a delivery's attempts, a dry-run replay
#     and a replay that sends.
# Everything keeps running afterwards; `make demo-down` (scripts/demo.sh down) stops it
# all. Ctrl-C while the demo is starting stops everything it started.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
cd "$repo"
dir="${TESTENV_DIR:-$repo/.testenv}"
ns=shop
shards=4
bin="$CARGO_TARGET_DIR/debug"
pids="$dir/demo.pids"

say() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
show() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }
die() { printf '\ndemo: %s\n' "$*" >&2; exit 1; }

# Stops the processes the demo started (newest first), TERM then KILL after 15 s.
stop_processes() {
	[ -f "$pids" ] || return 0
	local pid
	for pid in $(tac "$pids"); do kill -TERM "$pid" 2>/dev/null || true; done
	for pid in $(tac "$pids"); do
		for _ in $(seq 1 150); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "$pid" 2>/dev/null || true
	done
	rm -f "$pids"
}

if [ "${1:-}" = down ]; then
	stop_processes
	scripts/testenv.sh down "$dir"
	echo "demo: stopped (operator, dispatcher, receiver, test environment)"
	exit 0
fi

# Polls `check` (a command) every 0.5 s until it succeeds; fails after `seconds`.
wait_for() {
	local what="$1" seconds="$2"
	shift 2
	local deadline=$((SECONDS + seconds))
	until "$@" >/dev/null 2>&1; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			die "timed out after ${seconds}s waiting for $what (logs: $dir/*.log)"
		fi
		sleep 0.5
	done
}

# Starts a program in the background, logging to $dir/<name>.log; records its pid.
start() {
	local name="$1"
	shift
	nohup "$@" >"$dir/$name.log" 2>&1 &
	echo $! >>"$pids"
	eval "${name//-/_}_pid=$!"
}

alive() { kill -0 "$1" 2>/dev/null; }

# Ctrl-C reaches the whole process group: the programs stop themselves on SIGINT, and
# this tidies up (pid files, stragglers, the test environment). A failure leaves
# everything running for a look at the logs.
interrupted=0
on_interrupt() {
	interrupted=1
	exit 130
}
on_exit() {
	local rc=$?
	[ "$rc" -eq 0 ] && return
	# The test environment got the Ctrl-C too (before this shell could run its trap).
	if [ "$interrupted" = 1 ] || grep -q '^testenv: stopping' "$dir/testenv.log" 2>/dev/null; then
		echo
		echo "demo: interrupted; stopping everything it started"
		stop_processes
		scripts/testenv.sh down "$dir" || true
	else
		echo "demo: failed; what it started keeps running for a look at $dir/*.log; make demo-down stops it" >&2
	fi
}
trap on_interrupt INT TERM
trap on_exit EXIT

say "Building (the first run compiles Kubernetes and the Rust workspace: 10-15 minutes)"
scripts/build-e2e.sh
cargo build -q -p herald-operator -p herald-dispatcher -p herald-api -p kubectl-herald -p herald-examples --bins
begin=$SECONDS

mkdir -p "$dir"
stop_processes # a previous demo's processes, if any
if [ -f "$dir/ready" ] && [ -f "$dir/launcher.pid" ] && alive "$(cat "$dir/launcher.pid")"; then
	say "Test environment already running in $dir"
else
	say "Starting the test environment (etcd, kube-apiserver, NATS JetStream on 127.0.0.1)"
	scripts/testenv.sh up "$dir"
fi
export KUBECONFIG="$dir/kubeconfig"
nats="$(cat "$dir/nats-url")"
export HERALD_NATS_URL="$nats"

say "Installing the CRDs"
kubectl apply --server-side -f crds/ 2>&1 >/dev/null | grep -v 'unrecognized format' >&2 || true
kubectl wait --for condition=Established --timeout=60s -f crds/ >/dev/null
kubectl create namespace "$ns" --dry-run=client -o yaml | kubectl apply -f - >/dev/null

say "Starting herald-operator (log: $dir/operator.log)"
start operator "$bin/herald-operator" run --kubeconfig "$KUBECONFIG" --nats-url "$nats" \
	--shards "$shards" --allow-network 127.0.0.0/8 --allow-http --status-interval 2s \
	--lease-namespace default --listen 127.0.0.1:0
operator_leads() { alive "$operator_pid" && grep -q 'leading' "$dir/operator.log"; }
wait_for "herald-operator to lead (see $dir/operator.log)" 60 operator_leads

say "The tenant's signing secret: Herald generates the key into the Secret 'orders'"
show kubectl apply --server-side -n "$ns" -f examples/tenant/signing-secret.yaml
wait_for "the SigningSecret to be Ready" 60 \
	kubectl wait --for condition=Ready --timeout=1s -n "$ns" signingsecret/orders
secret="$(kubectl get secret -n "$ns" orders -o jsonpath='{.data.current}' | base64 -d)"

say "Starting the example receiver (verifies signatures; /failing always answers 500)"
start receiver env WEBHOOK_SECRET="$secret" "$bin/herald-receiver" --listen 127.0.0.1:0 \
	--fail-path failing
wait_for "the receiver to listen" 20 grep -q 'listening on' "$dir/receiver.log"
receiver="$(grep -o 'http://[0-9.:]*' "$dir/receiver.log" | head -1)"
echo "receiver: $receiver (log: $dir/receiver.log)"

say "Applying the tenant's endpoints (examples/demo = examples/tenant with URLs of $receiver)"
kubectl kustomize examples/demo | sed "s#http://RECEIVER#$receiver#" |
	kubectl apply --server-side -f -
wait_for "every WebhookEndpoint but 'alerts' to be Ready" 60 \
	kubectl wait --for condition=Ready --timeout=1s -n "$ns" webhookendpoints -l 'herald.dev/demo!=verify'
show kubectl get webhookendpoints -n "$ns"
echo "Ready: the operator accepted them and published their configuration to NATS."
echo "'alerts' asks to be verified (spec.verify) and waits for a dispatcher to challenge its receiver:"
show kubectl get webhookendpoint -n "$ns" alerts \
	-o jsonpath='{range .status.conditions[?(@.type=="Ready")]}{.reason}: {.message}{"\n"}{end}'

say "Starting herald-dispatcher (log: $dir/dispatcher.log)"
start dispatcher "$bin/herald-dispatcher" --nats-url "$nats" --replica-id demo-0 \
	--shards "$shards" --allow-network 127.0.0.0/8 --allow-http --health-interval 2s \
	--listen 127.0.0.1:0
dispatcher_runs() { alive "$dispatcher_pid" && grep -q 'dispatcher running' "$dir/dispatcher.log"; }
wait_for "herald-dispatcher to run (see $dir/dispatcher.log)" 60 dispatcher_runs
wait_for "the alerts endpoint's receiver to echo the verification challenge" 60 \
	kubectl wait --for condition=Verified --timeout=1s -n "$ns" webhookendpoint alerts
show kubectl get webhookendpoint -n "$ns" alerts \
	-o jsonpath='{range .status.conditions[?(@.type=="Verified")]}{.reason}: {.message}{"\n"}{end}'

say "Publishing events to NATS (herald.events.$ns.<type>) with herald-producer"
show "$bin/herald-producer" -n "$ns" -t order.created --count 5
show "$bin/herald-producer" -n "$ns" -t invoice.paid --count 4
show "$bin/herald-producer" -n "$ns" -t shipment.created --count 2
echo "Publishing the same event twice with one Nats-Msg-Id stores it once:"
show "$bin/herald-producer" -n "$ns" -t order.cancelled --data '{"id":"order-42"}' --msg-id order-42-cancelled
show "$bin/herald-producer" -n "$ns" -t order.cancelled --data '{"id":"order-42"}' --msg-id order-42-cancelled

say "Waiting for the deliveries, and for the failing endpoint's circuit to open"
delivered() { [ "$(grep -c ' 204 ' "$dir/receiver.log")" -ge 13 ]; }
wait_for "13 verified deliveries at the receiver" 60 delivered
circuit_open() { [ "$(kubectl get whe -n "$ns" failing -o jsonpath='{.status.circuit}')" = Open ]; }
wait_for "the failing endpoint's circuit to open (status.circuit=Open)" 90 circuit_open
orders_reported() { [ -n "$(kubectl get whe -n "$ns" orders -o jsonpath='{.status.lastDelivery}')" ]; }
wait_for "the orders endpoint's status to report its deliveries" 30 orders_reported

say "What the receiver got (verified signatures; order.* went to /orders and /failing)"
head -20 "$dir/receiver.log"

say "What a tenant sees: live status of the endpoints"
show kubectl get webhookendpoints -n "$ns" -o wide

say "The delivery log of 'orders' (the attempt log in JetStream stream HERALD_ATTEMPTS)"
show "$bin/herald-delivery-log" -n "$ns" -e orders --last 6

say "The delivery log of 'failing': every attempt got a 500 and waits for its retry; after 3 failures in a row the circuit opened"
show "$bin/herald-delivery-log" -n "$ns" -e failing --last 8

say "The failing endpoint: Degraded, circuit Open"
show kubectl get whe -n "$ns" failing -o jsonpath='{"state: "}{.status.state}{"   circuit: "}{.status.circuit}{"\n"}{range .status.conditions[*]}{.type}={.status} ({.reason}): {.message}{"\n"}{end}'

say "Operational events: the tenant's own 'alerts' endpoint (eventTypes herald.*) heard it, as a signed webhook"
alerted() { grep -q '^/alerts .*herald.endpoint.degraded' "$dir/receiver.log"; }
wait_for "herald.endpoint.degraded at /alerts" 60 alerted
grep '^/alerts ' "$dir/receiver.log" | head -5

say "Starting herald-api, Herald's HTTP API (log: $dir/api.log)"
start api "$bin/herald-api" --nats-url "$nats" --listen 127.0.0.1:0 --kubeconfig "$KUBECONFIG"
api_serves() { alive "$api_pid" && grep -q 'herald-api serving' "$dir/api.log"; }
wait_for "herald-api to serve (see $dir/api.log)" 60 api_serves
api_addr="$(sed 's/\x1b\[[0-9;]*m//g' "$dir/api.log" | grep -o 'listen=[0-9.:]*' | head -1)"
export HERALD_API_URL="http://${api_addr#listen=}"
echo "herald-api: $HERALD_API_URL"

say "A tenant's identity: ServiceAccount demo-tenant, a Role for deliveries and replays, a token"
kubectl apply --server-side -n "$ns" -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: demo-tenant}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: demo-tenant}
rules:
  - {apiGroups: [herald.dev], resources: [deliveries], verbs: [get, list]}
  - {apiGroups: [herald.dev], resources: [webhookendpoints/redeliver], verbs: [create]}
  - {apiGroups: [herald.dev], resources: [webhookendpoints], verbs: [get, list, watch]}
  - {apiGroups: [herald.dev], resources: [webhookreplays], verbs: [get, list, watch, create]}
  - {apiGroups: [herald.dev], resources: [signingsecrets], verbs: [get, list, watch, patch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: demo-tenant}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: demo-tenant}
subjects: [{kind: ServiceAccount, name: demo-tenant, namespace: $ns}]
EOF
tenant_kubeconfig="$dir/tenant.kubeconfig"
cp "$KUBECONFIG" "$tenant_kubeconfig"
KUBECONFIG="$tenant_kubeconfig" kubectl config set-credentials demo-tenant \
	--token="$(kubectl create token -n "$ns" demo-tenant --duration 24h)" >/dev/null
KUBECONFIG="$tenant_kubeconfig" kubectl config set-context --current --user demo-tenant \
	--namespace "$ns" >/dev/null
echo "the tenant's kubeconfig: $tenant_kubeconfig (user demo-tenant, namespace $ns)"
# kubectl runs kubectl-herald from PATH as `kubectl herald`.
export PATH="$bin:$PATH"
herald() { show env KUBECONFIG="$tenant_kubeconfig" kubectl herald "$@"; }

say "kubectl herald: the delivery log of 'orders', as the tenant (its token, its RBAC)"
herald deliveries orders

say "kubectl herald: what is failing, and one delivery's attempts"
herald deliveries failing
failed_id="$(KUBECONFIG="$tenant_kubeconfig" kubectl herald deliveries failing --status retrying,inFlight --limit 1 -o json |
	grep -o '"eventId": *"[^"]*"' | head -1 | cut -d'"' -f4)"
herald attempts failing "$failed_id"

say "kubectl herald replay: a dry run counts, then a replay sends the orders again (same webhook-ids)"
herald replay orders --from 10m --type order.created --dry-run --timeout 2m
herald replay orders --from 10m --type order.created --timeout 2m

trap - INT TERM EXIT
cat <<EOF

Demo ready in $((SECONDS - begin)) s (after the build). Everything keeps running; explore:

  export KUBECONFIG=$KUBECONFIG HERALD_NATS_URL=$nats HERALD_API_URL=$HERALD_API_URL PATH=$bin:\$PATH
  kubectl get webhookendpoints -n $ns -w            # live status (State, Success, Backlog...)
  kubectl describe whe -n $ns failing               # conditions and events
  herald-producer -n $ns -t order.created --count 3 # publish more
  herald-delivery-log -n $ns -e ledger              # an endpoint's attempts
  tail -f $dir/receiver.log   # what the receiver gets
  kubectl get secret -n $ns orders -o jsonpath='{.data.current}' | base64 -d   # the key
  kubectl annotate signingsecret -n $ns orders herald.dev/rotate=\$(date +%s)  # rotate it
  kubectl herald --kubeconfig $tenant_kubeconfig tail orders     # attempts live, as the tenant
  kubectl herald --kubeconfig $tenant_kubeconfig rotate orders   # rotate, wait for the new key
  kubectl herald --help                             # every command (docs/plugin.md)

Logs: $dir/{operator,dispatcher,api,receiver,testenv}.log
Stop everything: make demo-down
EOF
