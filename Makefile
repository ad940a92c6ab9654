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

bench: e2e-tools ## Run the benchmark (release build) and write docs/benchmark.md
	cargo build --release -p herald-e2e --bins
	$(CARGO_TARGET_DIR)/release/herald-bench --report docs/benchmark.md

.PHONY: scale
scale: e2e-tools ## The control plane at scale against a fresh test environment: ENDPOINTS (default 20000) WebhookEndpoints Ready and receiving traffic; report appended to SCALE_REPORT (docs/scale.md explains)
	cargo build --release -p herald-e2e --bin herald-scale --bin herald-test-operator --bin herald-test-dispatcher
	scripts/testenv.sh up $(TESTENV_DIR)-scale
	HERALD_TESTENV_DIR=$(TESTENV_DIR)-scale $(CARGO_TARGET_DIR)/release/herald-scale \
		--endpoints $(or $(ENDPOINTS),20000) --report $(or $(SCALE_REPORT),scale-report.md) $(SCALE_FLAGS); \
		rc=$$?; scripts/testenv.sh down $(TESTENV_DIR)-scale; exit $$rc
