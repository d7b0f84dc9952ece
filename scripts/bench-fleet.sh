#!/usr/bin/env bash
# Fleet catalog benchmark (not a test; issue 18): N hosted clusters' worth of one default
# catalog, served by one shared catalog Deployment (2 replicas of our catalog server) against
# one `opm serve` per hosted cluster as HyperShift runs it, on the large real catalog, same
# run, same machine, every server a real process on 127.0.0.1. Prints per-system figures on
# stderr and, last, the line
#   fleet-bench: n=... catalog_pods_shared=... catalog_pods_per_hc=... memory_ratio=... getbundle_p99_ratio=... servers=processes
# (docs/fleet-bench.md). N opm processes need about N x 220 MiB of memory.
# Usage: scripts/bench-fleet.sh [N] [ROUNDS]
#   N       hosted clusters (default $BENCH_N, else 50)
#   ROUNDS  rounds of client load, order alternated (default $BENCH_ROUNDS, else 3)
#   env FLEET_CALLS        GetBundle calls per client per round (default 200; solo: 5x)
#   env FLEET_INTERVAL_MS  mean gap between one client's calls, Poisson (default 50)
#   env FLEET_CATALOG      catalog directory (default the large fixture catalog)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
n="${1:-${BENCH_N:-50}}"
rounds="${2:-${BENCH_ROUNDS:-3}}"
calls="${FLEET_CALLS:-200}"
interval="${FLEET_INTERVAL_MS:-50}"
catalog="${FLEET_CATALOG:-$("$root/scripts/fixture-catalog.sh" large)}"
tools="${HCP_OLM_TOOLS_DIR:-${HCP_OLM_CACHE:-$HOME/.cache/hcp-olm}/bin}"
opm="$tools/opm"
if [[ ! -x "$opm" ]]; then
  echo "bench-fleet: opm not found at $opm: run 'make tools' first" >&2
  exit 1
fi
cd "$root"
cargo build --release -q --locked -p hcp-olm-catalog --bin hcp-olm-catalog-server -p hcp-olm-e2e --bin hcp-olm-bench-fleet
target="${CARGO_TARGET_DIR:-$root/target}/release"
exec "$target/hcp-olm-bench-fleet" "$catalog" "$target/hcp-olm-catalog-server" "$opm" "$n" "$rounds" "$calls" "$interval"
