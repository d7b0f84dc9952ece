#!/usr/bin/env bash
# Run every cargo-fuzz target (hcp-olm-guest-agent parsers and the hcp-olm-oci manifest parser) for a bounded time.
# Usage: guest-agent/fuzz/run.sh SECONDS   (per target; needs a nightly toolchain and cargo-fuzz)
# Corpora live in a temporary directory seeded from fuzz/seeds/<target>; crashes are written to
# fuzz/artifacts/<target>/ and make the script exit non-zero.
set -euo pipefail
secs="${1:?usage: run.sh SECONDS}"
case "$secs" in ''|*[!0-9]*) echo "SECONDS must be a positive integer" >&2; exit 64;; esac
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/.."
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  echo "cargo-fuzz missing: cargo install cargo-fuzz --locked (and rustup toolchain install nightly)" >&2
  exit 1
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for target in $(cargo +nightly fuzz list); do
  mkdir -p "$work/$target"
  if [ -d "fuzz/seeds/$target" ]; then cp -r "fuzz/seeds/$target/." "$work/$target/"; fi
  echo "== fuzz $target for ${secs}s"
  cargo +nightly fuzz run "$target" "$work/$target" -- \
    -max_total_time="$secs" -max_len=4096 -rss_limit_mb=1024 -print_final_stats=1
done
