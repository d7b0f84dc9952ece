#!/usr/bin/env bash
# Checks (and, as root with apt-get, installs) what `make demo`, `make test` and the benchmarks need
# from the system, before any long build starts. One list for the Makefile and .ci/run.
#   scripts/prereqs.sh demo|test|bench     check, install what is missing, exit 0 when all is there
#   HCP_OLM_NO_INSTALL=1 scripts/prereqs.sh …   only check: print the exact install command and exit 2
# Exit status: 0 ready; 2 something is missing that this script cannot install (the message says what
# to run). It takes seconds when everything is present.
set -euo pipefail
# The cargo-nextest release make test runs (its .config/nextest.toml needs 0.9.91 or later).
NEXTEST_VERSION=0.9.151
what=${1:-}
case "$what" in demo | test | bench) ;; *)
  echo "usage: scripts/prereqs.sh demo|test|bench" >&2
  exit 64
  ;;
esac

# command → Debian package. The demo needs network namespaces and mounts (ip, setpriv, nsenter,
# unshare), firewall rules (nft, conntrack) and the real nodes' container runtime (runc); the
# tests also run real DNS servers (dnsmasq), WireGuard peers (wg) and, on the real node that
# enforces NetworkPolicy, kube-router's firewall (iptables, ipset).
declare -A pkg_of=(
  [ip]=iproute2 [setpriv]=util-linux [nsenter]=util-linux [unshare]=util-linux
  [nft]=nftables [conntrack]=conntrack [dnsmasq]=dnsmasq-base
  [curl]=curl [git]=git [make]=make [python3]=python3 [ping]=iputils-ping
  [wireguard-go]=wireguard-go [wg]=wireguard-tools [dnsperf]=dnsperf [iperf3]=iperf3
  [runc]=runc [iptables]=iptables [ipset]=ipset
  [aarch64-linux-gnu-gcc]=gcc-aarch64-linux-gnu [qemu-aarch64]=qemu-user
)
cmds=(ip setpriv nsenter unshare nft conntrack runc git make)
case "$what" in
test) cmds+=(curl python3 ping wg dnsmasq iptables ipset aarch64-linux-gnu-gcc qemu-aarch64) ;;
bench) cmds+=(curl python3 ping wg dnsmasq dnsperf iperf3) ;;
esac
# file → Debian package: the CA bundle the image tests (and make images) put in every image.
declare -A pkg_of_file=([/etc/ssl/certs/ca-certificates.crt]=ca-certificates
  [/usr/lib/cni/bridge]=containernetworking-plugins
  [/usr/aarch64-linux-gnu/lib/libc.a]=libc6-dev-arm64-cross)
files=()
# The arm64 builds (make cross-arm64, make images) link glibc statically.
if [ "$what" = test ]; then files+=(/usr/aarch64-linux-gnu/lib/libc.a); fi
# The real nodes (e2e/src/realnode.rs): containerd runs pods with runc and wires them with the
# CNI bridge, host-local and loopback plugins.
files+=(/etc/ssl/certs/ca-certificates.crt /usr/lib/cni/bridge)

say() { echo "prereqs($what): $*" >&2; }
missing_pkgs() {
  local c f out=()
  for c in "${cmds[@]}"; do
    command -v "$c" >/dev/null 2>&1 || out+=("${pkg_of[$c]}")
  done
  for f in "${files[@]}"; do
    [ -e "$f" ] || out+=("${pkg_of_file[$f]}")
  done
  [ "${#out[@]}" -eq 0 ] || printf '%s\n' "${out[@]}" | sort -u | tr '\n' ' '
}

fail=0
miss=$(missing_pkgs)
if [ -n "$miss" ]; then
  install_cmd="apt-get update && apt-get install -y --no-install-recommends $miss"
  if [ "${HCP_OLM_NO_INSTALL:-0}" != 1 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing $miss(apt-get, about a minute)"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $miss >/dev/null; }; then
      say "installing failed; run as root: $install_cmd"
      exit 2
    fi
    miss=$(missing_pkgs)
    [ -z "$miss" ] || { say "still missing after install: $miss"; exit 2; }
  else
    say "missing system packages: $miss"
    say "install them as root:  $install_cmd"
    fail=1
  fi
fi

if [ "$(id -u)" != 0 ]; then
  say "the test environments create network namespaces and mounts: run as root"
  fail=1
fi

need_go=1.26.7
if ! command -v go >/dev/null 2>&1; then
  say "no 'go' on PATH: install Go >= $need_go (the upstream binaries build from Go modules)"
  fail=1
else
  have_go=$(go env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$need_go" "$have_go" | sort -V | head -n1)" != "$need_go" ]; then
    say "Go $have_go is too old: install Go >= $need_go"
    fail=1
  fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  say "no 'cargo' on PATH: install Rust with rustup (the toolchain is pinned in rust-toolchain.toml)"
  fail=1
fi

if [ "$what" = test ] && [ "$fail" = 0 ]; then
  # The arm64 binaries (make cross-arm64): the Rust standard library for aarch64.
  if ! rustup target list --installed 2>/dev/null | grep -qx aarch64-unknown-linux-gnu; then
    if [ "${HCP_OLM_NO_INSTALL:-0}" != 1 ] && command -v rustup >/dev/null 2>&1; then
      say "installing the Rust target aarch64-unknown-linux-gnu (rustup, a minute)"
      rustup target add aarch64-unknown-linux-gnu >/dev/null || {
        say "failed; run: rustup target add aarch64-unknown-linux-gnu"
        exit 2
      }
    else
      say "the Rust target aarch64-unknown-linux-gnu is missing; run: rustup target add aarch64-unknown-linux-gnu"
      fail=1
    fi
  fi
  # make fuzz: cargo-fuzz on the nightly toolchain
  if ! cargo +nightly --version >/dev/null 2>&1; then
    if [ "${HCP_OLM_NO_INSTALL:-0}" != 1 ] && command -v rustup >/dev/null 2>&1; then
      say "installing the nightly Rust toolchain for fuzzing (rustup, a few minutes)"
      rustup toolchain install nightly --profile minimal >/dev/null || {
        say "failed; run: rustup toolchain install nightly --profile minimal"
        exit 2
      }
    else
      say "the nightly Rust toolchain is missing (fuzzing); run: rustup toolchain install nightly --profile minimal"
      fail=1
    fi
  fi
  if [ "$fail" = 0 ] && ! command -v cargo-fuzz >/dev/null 2>&1; then
    if [ "${HCP_OLM_NO_INSTALL:-0}" != 1 ]; then
      say "installing cargo-fuzz (cargo install, about 2 minutes)"
      cargo install cargo-fuzz --locked --quiet || {
        say "failed; run: cargo install cargo-fuzz --locked"
        exit 2
      }
    else
      say "cargo-fuzz is missing (fuzzing); run: cargo install cargo-fuzz --locked"
      fail=1
    fi
  fi
  # make test runs the tests with cargo-nextest (one process per test, several at once);
  # pinned, and installed again when another version is found.
  if [ "$fail" = 0 ] && [ "$(cargo nextest --version 2>/dev/null | awk 'NR==1 {print $2}')" != "$NEXTEST_VERSION" ]; then
    if [ "${HCP_OLM_NO_INSTALL:-0}" != 1 ]; then
      say "installing cargo-nextest $NEXTEST_VERSION (cargo install: a cold build, several minutes on 2 cores)"
      cargo install cargo-nextest --version "$NEXTEST_VERSION" --locked --quiet || {
        say "failed; run: cargo install cargo-nextest --version $NEXTEST_VERSION --locked"
        exit 2
      }
    else
      say "cargo-nextest $NEXTEST_VERSION is missing (make test); run: cargo install cargo-nextest --version $NEXTEST_VERSION --locked"
      fail=1
    fi
  fi
fi

[ "$fail" = 0 ] || exit 2
say "ready"
