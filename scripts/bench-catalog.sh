#!/usr/bin/env bash
# Catalog benchmark (not a test): our catalog server against `opm serve` on the
# large real catalog, same run, same machine. Prints per-server figures on
# stderr and, last, the line
#   catalog-bench: rss_ratio=... startup_ratio=... listbundles_ratio=... getbundle_p99_ratio=...
# each as the median (min..max) of ROUNDS rounds in alternating order, opm with its prebuilt
# cache as production runs it, on the packages `opm validate` accepts.
# Usage: scripts/bench-catalog.sh [CATALOG_DIR] [GETBUNDLE_SAMPLES] [ROUNDS]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
catalog="${1:-$("$root/scripts/fixture-catalog.sh" large)}"
samples="${2:-2000}"
rounds="${3:-4}"
tools="${HCP_OLM_TOOLS_DIR:-${HCP_OLM_CACHE:-$HOME/.cache/hcp-olm}/bin}"
opm="$tools/opm"
if [[ ! -x "$opm" ]]; then
  echo "bench-catalog: opm not found at $opm: run 'make tools' first" >&2
  exit 1
fi
cd "$root"
cargo build --release -q -p hcp-olm-catalog --bin hcp-olm-catalog-server -p hcp-olm-e2e --bin hcp-olm-bench-catalog
target="${CARGO_TARGET_DIR:-$root/target}/release"
exec "$target/hcp-olm-bench-catalog" "$catalog" "$target/hcp-olm-catalog-server" "$opm" "$samples" "$rounds"
