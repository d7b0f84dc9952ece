# hcp-olm — entry points. `make help` lists them.
SHELL := /bin/bash
CARGO ?= cargo
export HCP_OLM_CACHE ?= $(HOME)/.cache/hcp-olm

.PHONY: help build lint fmt tools tools-bench test fuzz demo images test-images bench-catalog bench-controller bench-fleet bench-tunnel prereqs-demo prereqs-test prereqs-bench chart-sync cross-arm64 release

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s "$$(printf '\t')"

build: ## build every crate and test
	$(CARGO) build --workspace --all-targets --locked

lint: ## rustfmt check + clippy -D warnings
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	@# The fuzz crate is its own workspace (built only by cargo-fuzz on nightly): compile it here so an
	@# API change that breaks a fuzz target fails in seconds, not after the whole test run.
	$(CARGO) check --manifest-path guest-agent/fuzz/Cargo.toml --bins --locked --target-dir target --quiet

fmt: ## format the code
	$(CARGO) fmt --all

prereqs-demo: ## check (as root: install) the system packages, Go and Rust that make demo needs; seconds
	@scripts/prereqs.sh demo

prereqs-test: ## the same for make test (adds the tunnel peers, nightly Rust and cargo-fuzz)
	@scripts/prereqs.sh test

prereqs-bench: ## the same for the benchmarks (adds dnsperf, iperf3)
	@scripts/prereqs.sh bench

tools: ## build the pinned upstream binaries (kube-apiserver, etcd, OLM, opm, registry, node binaries, CoreDNS, kube-router, wireguard-go, promtool, helm, kustomize, kubectl) into $(HCP_OLM_CACHE)
	@e2e/tools/build.sh

tools-bench: ## also build the benchmark-only peers (Konnectivity proxy-server/agent)
	@e2e/tools/build.sh --bench

chart-sync: ## copy manifests/ (CRD, RBAC, admission policies, PrometheusRule, dashboard) into charts/hcp-olm (a test fails on drift)
	@cp manifests/crds/hostedolm.yaml charts/hcp-olm/crds/
	@for f in serviceaccount clusterrole clusterrolebinding auth-delegator leader-election-role admission-policy; do cp manifests/controller/$$f.yaml charts/hcp-olm/files/; done
	@cp manifests/monitoring/prometheusrule.yaml charts/hcp-olm/files/
	@cp manifests/monitoring/dashboards/hcp-olm.json charts/hcp-olm/files/dashboard.json

FUZZ_SECONDS ?= 20

cross-arm64: ## build the shipped binaries for arm64 (static, profile cross: unoptimised, stripped) for the image and qemu tests
	@echo "== make cross-arm64: cargo build --profile cross --target aarch64-unknown-linux-gnu (static; about 4 minutes cold on 2 cores)"
	$(CARGO) build --locked --profile cross --target aarch64-unknown-linux-gnu $(SHIPPED) --bins

test: prereqs-test lint tools cross-arm64 ## everything CI runs: lint, unit tests, real API servers, network namespaces, bounded fuzzing
	@echo "== make test: cargo nextest (unit, real control planes, registries, network namespaces; three tests at a time, see .config/nextest.toml)"
	@mkdir -p target && set -o pipefail && $(CARGO) nextest run --workspace --locked --no-fail-fast 2>&1 | tee target/make-test.log
	@echo "== make test: doc tests"
	@$(CARGO) test --workspace --locked --doc >target/make-test-doc.log 2>&1 || { tail -40 target/make-test-doc.log; exit 1; }
	@cat target/make-test-doc.log >>target/make-test.log
	@$(MAKE) --no-print-directory fuzz
	@awk '/tests run:/ {for (i = 1; i <= NF; i++) {if ($$i ~ /^passed/) p += $$(i-1); if ($$i ~ /^(failed|timed)/) f += $$(i-1)}} /^test result:/ {p+=$$4; f+=$$6} END {printf "tests: %d passed, %d failed\n", p, f}' target/make-test.log

fuzz: ## run every cargo-fuzz target for FUZZ_SECONDS each (nightly + cargo-fuzz)
	@echo "== make fuzz: $(FUZZ_SECONDS)s per target"
	guest-agent/fuzz/run.sh $(FUZZ_SECONDS)

# One cargo invocation builds every binary the demo runs; the demo is then started from the target
# directory (a second `cargo run -p` would resolve features differently and compile crates again).
TARGET_DIR := $(or $(CARGO_TARGET_DIR),target)

# DEMO_GUEST=ipv6: the variant with an IPv6-only guest (issue 19; docs/test-environment.md).
DEMO_GUEST ?= ipv4

demo: prereqs-demo tools ## the end-to-end scenario with real OLM on two local control planes (up until Ctrl-C on a terminal; DEMO_GUEST=ipv6: an IPv6-only guest)
	@echo "== make demo: building the controller, gateway, agent, CLI and demo (cargo, debug profile;"
	@echo "   a first build takes about 15 minutes on 2 cores, later ones seconds)"
	$(CARGO) build --locked -p hcp-olm-controlplane -p hcp-olm-guest-agent -p hcp-olm-cli -p hcp-olm-e2e --bins
	@echo "== make demo: running the scenario"
	$(TARGET_DIR)/debug/hcp-olm-demo --guest $(DEMO_GUEST)

# Container images (no container engine needed): release binaries packed by hcp-olm-images into an
# OCI layout under target/images; with REGISTRY=host/org they are also pushed there (credentials
# from REGISTRY_AUTH_FILE or ~/.docker/config.json). Tags are v<workspace version>; the default
# names (quay.io/hcp-olm/...) are what the controller renders and manifests/ installs.
REGISTRY ?=
SHIPPED = -p hcp-olm-controlplane -p hcp-olm-guest-agent -p hcp-olm-catalog -p hcp-olm-cli
images: ## build the container images (amd64 and arm64, one index each, SBOMs, provenance) from release binaries into target/images; REGISTRY=host/org also pushes them
	@echo "== make images: cargo build --profile dist (release, stripped, static) of the shipped binaries for amd64 and arm64 (a first build takes about 16 minutes on 2 cores)"
	RUSTFLAGS="-C target-feature=+crt-static" $(CARGO) build --profile dist --locked --target x86_64-unknown-linux-gnu --target aarch64-unknown-linux-gnu $(SHIPPED) --bins
	$(CARGO) build --profile dist --locked -p hcp-olm-images
	@echo "== make images: packing"
	$(TARGET_DIR)/dist/hcp-olm-images --bin-dir '$(TARGET_DIR)/{target}/dist' --out $(TARGET_DIR)/images \
	  --revision "$$(git rev-parse HEAD 2>/dev/null || echo unknown)" \
	  --source-date-epoch "$$(git log -1 --format=%ct 2>/dev/null || echo 0)" \
	  $(if $(REGISTRY),--registry $(REGISTRY) --push,)

VERSION ?=
release: tools ## a release into target/release-$(VERSION): image indexes (pushed with REGISTRY=host/org), binaries for both arches with SHA256SUMS, the chart and manifests pinned by digest, SBOMs, provenance, a CHANGELOG entry (docs/release.md)
	@VERSION=$(VERSION) REGISTRY=$(REGISTRY) PATH="$$(e2e/tools/build.sh --bin-dir):$$PATH" scripts/release.sh

test-images: prereqs-test tools ## build every test image (OLM, opm, registry, CoreDNS, pause, index images, an operator bundle) into target/test-images
	@echo "== make test-images: building hcp-olm-test-images"
	$(CARGO) build --locked -p hcp-olm-e2e --bin hcp-olm-test-images
	$(TARGET_DIR)/debug/hcp-olm-test-images --out $(TARGET_DIR)/test-images

bench-catalog: prereqs-bench tools ## our catalog server vs opm serve on the large real catalog (prints catalog-bench: ...)
	scripts/bench-catalog.sh

BENCH_ROUNDS ?= 3
BENCH_SECONDS ?= 6

bench-tunnel: prereqs-bench tools-bench ## catalog path vs Konnectivity, TUN mode vs wireguard-go, cached DNS vs dnsmasq/CoreDNS (prints tunnel-bench: ...)
	scripts/bench-tunnel.sh $(BENCH_ROUNDS) $(BENCH_SECONDS)

bench-tenancy: prereqs-bench tools ## issue 35's fairness goals, asserted: a bystander's catalog p99 under one hostile client <= 2x quiet (prints catalog-dos: ...), a normal cluster's convergence beside 4 hostile registries <= 2x alone (prints slots-fairness: ...)
	HCP_OLM_DOS_BENCH=1 $(CARGO) test --release --locked -p hcp-olm-catalog --test dos -- --nocapture --exact security_catalog_one_client_cannot_starve_or_exhaust_the_server
	HCP_OLM_FAIRNESS_BENCH=1 $(CARGO) test --locked -p hcp-olm-controlplane --test slots_fairness -- --nocapture

BENCH_N ?= 100
IDLE_SECONDS ?= 300

bench-controller: prereqs-bench tools ## N hosted clusters vs the controller process (BENCH_N=100, IDLE_SECONDS=300; prints controller-bench: ...)
	BENCH_N=$(BENCH_N) IDLE_SECONDS=$(IDLE_SECONDS) scripts/bench-controller.sh

# BENCH_N above is bench-controller's default (100); bench-fleet defaults to 50 hosted clusters
# (50 opm processes take about 9 GiB) and takes BENCH_N only from the command line or environment.
FLEET_N = $(if $(findstring file,$(origin BENCH_N)),50,$(BENCH_N))

bench-fleet: prereqs-bench tools ## one shared catalog Deployment (2 replicas of ours) vs one opm per hosted cluster, N of them (BENCH_N=50; prints fleet-bench: ...)
	scripts/bench-fleet.sh $(FLEET_N) $(BENCH_ROUNDS)
