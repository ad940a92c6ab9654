# Herald — `make help` lists the targets.
SHELL := /usr/bin/env bash
export CARGO_TARGET_DIR ?= $(HOME)/.cache/herald/target
export HERALD_BIN_DIR ?= $(HOME)/.cache/herald/bin
TESTENV_DIR ?= $(CURDIR)/.testenv

.PHONY: help test demo crds e2e-tools testenv-up testenv-down fmt lint bench

help: ## List the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

test: ## Run every check and test (fmt, clippy, CRD drift, unit and e2e tests)
	scripts/test.sh

demo: ## The tour: test environment, operator, dispatcher, examples, receiver, events, live status
	scripts/demo.sh

.PHONY: demo-down
demo-down: ## Stop what `make demo` started (operator, dispatcher, receiver, test environment)
	scripts/demo.sh down

crds: ## Regenerate crds/ and the chart's CRD templates from the Rust types
	cargo run -q -p herald-operator -- crd --out crds --chart-out charts/herald/templates/crds

# The same flags as e2e/tests/chart.rs `readme_is_generated_from_values`, which fails when the
# committed README differs from what this writes. helm-docs exits 0 on errors (it only logs a
# warning and skips the chart), so anything it logs at warning level fails the target.
HELM_DOCS_FLAGS := --chart-search-root charts/herald --sort-values-order file --log-level warning

.PHONY: chart-docs
chart-docs: ## Regenerate charts/herald/README.md from README.md.gotmpl and the values.yaml comments (helm-docs)
	scripts/build-e2e.sh helm-docs
	@log="$$($(HERALD_BIN_DIR)/helm-docs $(HELM_DOCS_FLAGS) 2>&1)"; \
		if [ -n "$$log" ]; then echo "$$log" >&2; exit 1; fi
	@echo "chart-docs: wrote charts/herald/README.md"

.PHONY: image
image: ## Build the operator and dispatcher OCI images without Docker (release) into $(CARGO_TARGET_DIR)/images; REGISTRY=host[/path] pushes them
	scripts/image.sh $(if $(REGISTRY),--registry $(REGISTRY)) $(if $(TAG),--tag $(TAG))

.PHONY: release
release: ## Make a release into $(CARGO_TARGET_DIR)/release-$(VERSION): images, SBOMs, signatures, the chart as an OCI artifact, the plugin's archive, krew manifest, checksums (VERSION=x.y.z REGISTRY=host[/path]; scripts/release.sh)
	scripts/release.sh --version "$(VERSION)" --registry "$(REGISTRY)"

e2e-tools: ## Build testenv, helm, helm-docs (and kubectl when missing) into $(HERALD_BIN_DIR)
	scripts/build-e2e.sh

testenv-up: e2e-tools ## Start the test environment in $(TESTENV_DIR) (KUBECONFIG=$(TESTENV_DIR)/kubeconfig)
	scripts/testenv.sh up $(TESTENV_DIR)

testenv-down: ## Stop the test environment started by testenv-up
	scripts/testenv.sh down $(TESTENV_DIR)

fmt: ## Format Rust and Go code
	cargo fmt --all
	gofmt -w e2e/testenv scripts/ocibuild

.PHONY: fuzz
fuzz: ## Fuzz each target of fuzz/ for FUZZ_SECONDS (default 300) with cargo-fuzz; docs/fuzzing.md
	scripts/fuzz.sh $(or $(FUZZ_SECONDS),300) $(FUZZ_TARGETS)

lint: ## Clippy with warnings as errors
	cargo clippy --workspace --all-targets -- -D warnings

# Every scenario of issue 14 at its size, 3 runs each (recovery, memory and replicas once):
# about 30 minutes on 2 cores, 17 of them the recovery runs (2 x 100,000 events at 200/s).
# BENCH_FLAGS changes sizes and runs, e.g. '--runs 5 --recovery-runs 2' or
# '--scenarios throughput,latency'; `herald-bench --help` lists them.
bench: e2e-tools ## Run the benchmark (release build): docs/benchmark.md, its plots and data in docs/bench/ (BENCH_FLAGS)
	cargo build --release -p herald-e2e --bins
	$(CARGO_TARGET_DIR)/release/herald-bench --report docs/benchmark.md --plots docs/bench $(BENCH_FLAGS)

# The isolation scenarios alone, more rounds, for a confidence interval narrow enough to
# tell a case from the baseline's own noise (about 25 minutes on 2 cores).
.PHONY: bench-isolation
bench-isolation: e2e-tools ## The isolation scenarios alone, 10 rounds: docs/bench/isolation.md (BENCH_FLAGS)
	cargo build --release -p herald-e2e --bins
	$(CARGO_TARGET_DIR)/release/herald-bench --scenarios isolation,isolation-scale,burst --runs $(or $(ROUNDS),10) --report docs/bench/isolation.md --plots docs/bench/isolation $(BENCH_FLAGS)

.PHONY: replay-bulk
replay-bulk: e2e-tools ## The bulk replay test at its full size: 50,000 events at 200/s (about 5 minutes; make test runs 20,000)
	HERALD_REPLAY_BULK_EVENTS=50000 cargo test -p herald-e2e --test replay a_bulk_replay -- --nocapture

.PHONY: bench-smoke
bench-smoke: e2e-tools ## Every benchmark scenario at a tiny size, once; fails unless each delivered everything (the e2e test bench.rs runs the same)
	cargo build --release -p herald-e2e --bins
	$(CARGO_TARGET_DIR)/release/herald-bench --smoke --report $(or $(SMOKE_REPORT),/tmp/herald-bench-smoke.md) --plots $(or $(SMOKE_PLOTS),/tmp/herald-bench-smoke)

.PHONY: soak
soak: ## The seeded chaos soak for SOAK_MINUTES (default 60): new seeds, SOAK_SECONDS (default 300) each; SOAK_SEEDS replays seeds; report in SOAK_REPORT (docs/reliability.md explains)
	scripts/soak.sh

.PHONY: profile
profile: e2e-tools ## Profile a steady throughput load (perf, release build) for PROFILE_SECONDS (default 20) over PROFILE_ENDPOINTS (default 10); writes docs/bench/profile.md (profile-N-endpoints.md) and flame graphs
	PROFILE_ENDPOINTS=$(or $(PROFILE_ENDPOINTS),10) scripts/profile.sh $(or $(PROFILE_SECONDS),20)

.PHONY: scale
scale: e2e-tools ## The control plane at scale against a fresh test environment: ENDPOINTS (default 20000) WebhookEndpoints Ready and receiving traffic; report appended to SCALE_REPORT (docs/scale.md explains)
	cargo build --release -p herald-e2e --bin herald-scale --bin herald-test-operator --bin herald-test-dispatcher
	scripts/testenv.sh up $(TESTENV_DIR)-scale
	HERALD_TESTENV_DIR=$(TESTENV_DIR)-scale $(CARGO_TARGET_DIR)/release/herald-scale \
		--endpoints $(or $(ENDPOINTS),20000) --report $(or $(SCALE_REPORT),scale-report.md) $(SCALE_FLAGS); \
		rc=$$?; scripts/testenv.sh down $(TESTENV_DIR)-scale; exit $$rc

.PHONY: replicas
replicas: e2e-tools ## Capacity across dispatcher replicas (1 and 3) on a fresh single NATS, then a fresh 3-node NATS cluster, each a private test environment that stops with the run; report appended to REPLICAS_REPORT (docs/capacity.md explains)
	cargo build --release -p herald-e2e --bin herald-replicas --bin herald-test-dispatcher
	$(CARGO_TARGET_DIR)/release/herald-replicas --nats-cluster 1 --report $(or $(REPLICAS_REPORT),replicas-report.md) $(REPLICAS_FLAGS)
	$(CARGO_TARGET_DIR)/release/herald-replicas --nats-cluster 3 --report $(or $(REPLICAS_REPORT),replicas-report.md) $(REPLICAS_FLAGS)
