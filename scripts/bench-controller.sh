#!/usr/bin/env bash
# Controller benchmark (not a test): N HostedClusters against the real management
# kube-apiserver, the controller as a real process (release build) under its
# ServiceAccount and the RBAC from manifests/. See docs/controller-bench.md.
# Prints progress on stderr and, last on stdout, the line
#   controller-bench: n=<N> guests=<real|standin> rollout=standin registry=local converge_s=<s> writes_per_hc=<w> idle_writes=<i> resync_requests_per_s=<q> idle_requests_per_s=<r> idle_reconciles=<c> rss_mib=<m> registry_requests_converge=<k> registry_requests_per_min_idle=<p> own_pull_secrets=<bool> controller_args="<BENCH_CONTROLLER_ARGS>"
# Environment: BENCH_N (100), IDLE_SECONDS (300), BENCH_GUESTS (auto|real|standin), and the
# other BENCH_* knobs documented in e2e/src/bin/hcp-olm-bench-controller.rs.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
export BENCH_N="${BENCH_N:-100}" IDLE_SECONDS="${IDLE_SECONDS:-300}"
# One invocation, so both binaries share one feature resolution (no second build of kube).
cargo build --release --locked -q -p hcp-olm-controlplane --bin hcp-olm-controller \
  -p hcp-olm-e2e --bin hcp-olm-bench-controller
target="${CARGO_TARGET_DIR:-$root/target}/release"
export HCP_OLM_CONTROLLER_BIN="${HCP_OLM_CONTROLLER_BIN:-$target/hcp-olm-controller}"
exec "$target/hcp-olm-bench-controller"
