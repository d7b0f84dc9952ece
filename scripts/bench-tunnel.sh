#!/usr/bin/env bash
# Tunnel benchmark (not a test), same run, same machine. Three legs:
# - Catalog path: a management namespace M and a guest namespace G joined by a veth; `opm serve`
#   of the large real catalog in G behind a guest Service name (dnsmasq in G). A client in M
#   (cli/examples/catalog-rpc-bench.rs: full ListBundles stream, repeated, then sequential
#   GetPackage calls) reads it through our gateway (HTTP CONNECT, WireGuard to our agent in G)
#   and through Konnectivity (proxy-server in M in http-connect mode on a Unix socket, as
#   HyperShift's clients reach it, proxy-agent in G over mTLS to the server); `direct` is the
#   same client inside G. The same three paths are then measured against our catalog server
#   (hcp-olm-catalog-server, HostedOLM catalogServer: HcpOlm) serving the same catalog, where
#   the catalog no longer bounds the stream: the final line's bulk ratios come from this leg;
#   the opm leg is printed for information (opm bounds its own stream).
# - TUN mode: iperf3 single-stream TCP through our `hcp-olm-tunnel` pair against a
#   wireguard-go pair, each pair in two fresh network namespaces joined by a veth (MTU 1500,
#   tunnel MTU 1420), medians compared; twice in the same rounds: IPv4 underlay with IPv4
#   inside (198.18.46.0/30, 198.18.47.0/24), and IPv6 underlay with IPv6 inside (issue 19:
#   fd00:46::/64, fd00:47::/64; the IPv4 inner address is configured too, as ours requires
#   one, but iperf3 runs over IPv6). The four systems (wireguard-go v4, ours v4, wireguard-go
#   v6, ours v6) run in a rotating order per round.
# - DNS, cached answers: dnsperf (4 clients, SECONDS per run, after a warm-up) against our
#   split-DNS engine (`hcp-olm-dns`, the engine the gateway embeds), dnsmasq and CoreDNS, all
#   three configured for the same split (svc.cluster.local -> a "guest" dnsmasq, the rest ->
#   a "management" dnsmasq, answers with TTL 300, caching on), on loopback, rounds alternating.
# Fairness: the systems compared run in a rotating order (round i starts with system i mod n);
# every system's runs are printed as min/median/max; a failed or erroring run (no figure, a
# DNS answer that is not NOERROR) fails the whole benchmark instead of entering a median as 0.
# DNS efficiency is answers per CPU-second of the server process (from /proc), so the load
# generator sharing the two cores does not decide it; raw qps is printed too.
# Per-run figures go to stderr (with `tun-bench:` and `tun6-bench:` summary lines); the last
# line is
#   tunnel-bench: bulk_vs_konnectivity=<r> bulk_vs_direct=<r> rpc_p99_vs_konnectivity=<r> rpc_p99_opm_vs_konnectivity=<r> tun_vs_wireguard_go=<r> dns_cpu_vs_coredns=<r> dns_cpu_vs_dnsmasq=<r> tun6_vs_wireguard_go=<r> multi_aggregate_vs_single=<r> multi_udp_rcvbuf_drops=<n>
# (bulk and small-RPC p99: the catalog-server backend leg, where the transport is what is
# measured: opm's own latency, and its Go garbage collector's pauses, land in whichever
# system's run they hit; the opm leg is printed for information, its p99 ratio as
# rpc_p99_opm_vs_konnectivity), or with BENCH_LEGS=tun
#   tunnel-bench: tun_vs_wireguard_go=<r> tun6_vs_wireguard_go=<r> ours_v6_vs_v4=<r> (legs: tun)
# - Many HCPs on one node (issue 17): 8 gateway/agent pairs, the 8 gateways in one management
#   namespace (one node), each agent in a guest namespace of its own (the same guest
#   addresses and names in each: guests overlap), each guest serving the catalog from
#   hcp-olm-catalog-server; 8 clients in the management namespace stream ListBundles through
#   their own gateway at once. With net.core.rmem_max/wmem_max at the kernel default
#   (212992; set for the leg and restored after, as real nodes rarely raise them). Printed:
#   aggregate Mbit/s (all bytes / wall time) against one pair alone in the same rounds, and
#   the UDP receive-buffer drops (`RcvbufErrors`) of every namespace over the leg:
#     multi-bench: tunnels=8 aggregate_mbit(min/median/max)=.. single_mbit=.. aggregate_vs_single=.. udp_rcvbuf_drops=.. rmem_max=212992
# Usage: [BENCH_LEGS=all|tun|multi|catalog|dns] scripts/bench-tunnel.sh [ROUNDS] [SECONDS]
#   BENCH_LEGS=all (default): every leg. BENCH_LEGS=tun: only the TUN legs (both families);
#   the catalog, Konnectivity and DNS legs, their tool checks and builds are skipped (needs
#   iperf3, wg, the pinned wireguard-go and the release hcp-olm-tunnel only).
#   HCP_OLM_BENCH_GATEWAY / HCP_OLM_BENCH_AGENT: other gateway and agent binaries (an A/B run).
#   HCP_OLM_BENCH_TUNNEL: another hcp-olm-tunnel binary for the TUN legs (an A/B run).
#   BENCH_LEGS=multi: only the many-HCPs leg. BENCH_LEGS=catalog: the catalog legs (opm and
#   catalog-server backends) and the many-HCPs leg, no TUN or DNS. BENCH_LEGS=dns: only the
#   DNS leg; its last line is
#   tunnel-bench: dns_cpu_vs_coredns=<r> dns_cpu_vs_dnsmasq=<r> (legs: dns)
#   HCP_OLM_BENCH_DNS: another hcp-olm-dns binary (an A/B run).
set -euo pipefail
umask 077
root="$(cd "$(dirname "$0")/.." && pwd)"
rounds="${1:-3}"
secs="${2:-6}"
legs="${BENCH_LEGS:-all}"
case "$legs" in all | tun | multi | catalog | dns) ;; *) echo "bench-tunnel: BENCH_LEGS must be all, tun, multi, catalog or dns, not '$legs'" >&2; exit 64 ;; esac
[[ "$rounds" -ge 3 ]] || { echo "bench-tunnel: at least 3 rounds" >&2; exit 64; }
fail() { echo "bench-tunnel: FAILED: $*" >&2; exit 1; }
need=(iperf3 wg ip python3)
[[ $legs == all || $legs == dns ]] && need+=(dnsperf dnsmasq)
[[ $legs == multi || $legs == catalog ]] && need+=(dnsmasq)
for t in "${need[@]}"; do
  command -v "$t" >/dev/null || { echo "bench-tunnel: $t not installed" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "bench-tunnel: needs root (network namespaces)" >&2; exit 1; }
cd "$root"
echo "bench-tunnel: building hcp-olm-tunnel (release; legs: $legs)" >&2
if [[ $legs == dns ]]; then
  cargo build --release -q -p hcp-olm-guest-agent --bin hcp-olm-dns
elif [[ $legs != tun ]]; then
  cargo build --release -q -p hcp-olm-guest-agent --bin hcp-olm-tunnel --bin hcp-olm-dns \
    --bin hcp-olm-gateway --bin hcp-olm-agent
  cargo build --release -q -p hcp-olm-cli --example catalog-rpc-bench
  cargo build --release -q -p hcp-olm-catalog --bin hcp-olm-catalog-server
else
  cargo build --release -q -p hcp-olm-guest-agent --bin hcp-olm-tunnel
fi
rel="${CARGO_TARGET_DIR:-$root/target}/release"
# Another build of the gateway and agent for an A/B run (e.g. a commit before a change).
gwbin="${HCP_OLM_BENCH_GATEWAY:-$rel/hcp-olm-gateway}" agbin="${HCP_OLM_BENCH_AGENT:-$rel/hcp-olm-agent}"
tools="${HCP_OLM_TOOLS_DIR:-${HCP_OLM_CACHE:-$HOME/.cache/hcp-olm}/bin}"
need_tools=(wireguard-go)
[[ $legs == all ]] && need_tools=(opm proxy-server proxy-agent wireguard-go)
[[ $legs == multi ]] && need_tools=(opm)
[[ $legs == catalog ]] && need_tools=(opm proxy-server proxy-agent)
[[ $legs == dns ]] && need_tools=()
for b in "${need_tools[@]}"; do
  [[ -x "$tools/$b" ]] || { echo "bench-tunnel: $tools/$b missing: run 'make tools-bench'" >&2; exit 1; }
done
# Binaries other than this tree's builds (an A/B run) are named in the last line.
builds=""
for v in HCP_OLM_BENCH_TUNNEL HCP_OLM_BENCH_GATEWAY HCP_OLM_BENCH_AGENT HCP_OLM_BENCH_DNS; do
  if [[ -n "${!v:-}" ]]; then builds+=" ${v#HCP_OLM_BENCH_}=${!v}"; fi
done
if [[ -n $builds ]]; then builds=" (other builds:${builds})"; fi
catalog="${HCP_OLM_BENCH_CATALOG:-$("$root/scripts/fixture-catalog.sh" large)}"
tunnel="${HCP_OLM_BENCH_TUNNEL:-${CARGO_TARGET_DIR:-$root/target}/release/hcp-olm-tunnel}"
ourdns="${HCP_OLM_BENCH_DNS:-${CARGO_TARGET_DIR:-$root/target}/release/hcp-olm-dns}"
coredns="${HCP_OLM_TOOLS_DIR:-${HCP_OLM_CACHE:-$HOME/.cache/hcp-olm}/bin}/coredns"
if [[ $legs == all || $legs == dns ]]; then
  [[ -x "$coredns" ]] || { echo "bench-tunnel: CoreDNS not built: run 'make tools-bench'" >&2; exit 1; }
fi

tag="bt$$"
na="${tag}a" nb="${tag}b"
work="$(mktemp -d /tmp/hcp-olm-bench-tunnel-XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  pids=()
  ip netns del "$na" 2>/dev/null || true
  ip netns del "$nb" 2>/dev/null || true
  rm -f /var/run/wireguard/"${tag}"*.sock
}
trap 'catalog_stop; multi_stop; rm -rf "$work"' EXIT
# An interrupted run still deletes its namespaces and restores the sysctls it changed.
trap 'exit 130' INT
trap 'exit 143' TERM

A=198.18.46.1 B=198.18.46.2 TA=198.18.47.1 TB=198.18.47.2 PORT=51820
# IPv6 leg (issue 19): underlay and inner addresses, test-only (fd00::/8)
A6=fd00:46::1 B6=fd00:46::2 TA6=fd00:47::1 TB6=fd00:47::2

netns_up() {  # [6]: IPv6 underlay (no duplicate address detection, addresses usable at once)
  ip netns add "$na"; ip netns add "$nb"
  if [[ ${1:-} == 6 ]]; then
    for n in "$na" "$nb"; do
      for k in all default; do ip netns exec "$n" sysctl -qw "net.ipv6.conf.$k.accept_dad=0"; done
    done
  fi
  ip link add "${tag}va" netns "$na" type veth peer name "${tag}vb" netns "$nb"
  if [[ ${1:-} == 6 ]]; then
    ip -n "$na" addr add "$A6/64" dev "${tag}va" nodad; ip -n "$nb" addr add "$B6/64" dev "${tag}vb" nodad
  else
    ip -n "$na" addr add "$A/30" dev "${tag}va"; ip -n "$nb" addr add "$B/30" dev "${tag}vb"
  fi
  for n in "$na" "$nb"; do ip -n "$n" link set lo up; done
  ip -n "$na" link set "${tag}va" up; ip -n "$nb" link set "${tag}vb" up
}

keys() {
  wg genkey > "$work/a.key"; wg pubkey < "$work/a.key" > "$work/a.pub"
  wg genkey > "$work/b.key"; wg pubkey < "$work/b.key" > "$work/b.pub"
}

wggo_up() {  # netns ifname key peer_pub addr peer_tunnel endpoint [addr6 peer_tunnel6]
  local ns=$1 ifn=$2 key=$3 peer=$4 addr=$5 ptun=$6 ep=$7 addr6=${8:-} ptun6=${9:-}
  WG_PROCESS_FOREGROUND=1 ip netns exec "$ns" "$tools/wireguard-go" -f "$ifn" >"$work/$ifn.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do [[ -S /var/run/wireguard/$ifn.sock ]] && break; sleep 0.1; done
  local epargs=()
  [[ -n "$ep" ]] && epargs=(endpoint "$ep")
  local allowed="$ptun/32"
  [[ -n "$ptun6" ]] && allowed+=",$ptun6/128"
  ip netns exec "$ns" wg set "$ifn" private-key "$key" listen-port $PORT peer "$(cat "$peer")" allowed-ips "$allowed" "${epargs[@]}"
  ip -n "$ns" addr add "$addr/24" dev "$ifn"
  [[ -n "$addr6" ]] && ip -n "$ns" addr add "$addr6/64" dev "$ifn" nodad
  ip -n "$ns" link set "$ifn" mtu 1420 up
}

ours_up() {  # netns ifname key peer_pub addr peer_tunnel endpoint listen_addr [addr6 peer_tunnel6]
  local ns=$1 ifn=$2 key=$3 peer=$4 addr=$5 ptun=$6 ep=$7 listen=$8 addr6=${9:-} ptun6=${10:-}
  local cfg="$work/$ifn.toml"
  {
    echo "listen = \"$listen:$PORT\""
    echo "admin = \"127.0.0.1:9313\""
    echo "private_key_file = \"$key\""
    echo "[tun]"; echo "name = \"$ifn\""; echo "address = \"$addr/24\""; echo "routes = []"
    [[ -n "$addr6" ]] && echo "address6 = \"$addr6/64\""
    echo "[peer]"; echo "public_key = \"$(cat "$peer")\""
    [[ -n "$ep" ]] && { echo "endpoint = \"$ep\""; echo "persistent_keepalive = 5"; }
    if [[ -n "$ptun6" ]]; then echo "allowed_ips = [\"$ptun/32\", \"$ptun6/128\"]"
    else echo "allowed_ips = [\"$ptun/32\"]"; fi
  } > "$cfg"
  ip netns exec "$ns" "$tunnel" --config "$cfg" >"$work/$ifn.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do grep -q "tunnel up" "$work/$ifn.log" 2>/dev/null && break; sleep 0.1; done
}

iperf() {  # target -> prints Mbit/s of one single-stream run A -> B through the tunnel
  local TB=$1
  ip netns exec "$nb" iperf3 -s -1 -B "$TB" -p 5201 >/dev/null 2>&1 &
  local srv=$!
  pids+=($srv)
  sleep 0.5
  # first ping-like probe: let the handshake finish before timing
  for _ in $(seq 50); do ip netns exec "$na" bash -c "echo > /dev/tcp/$TB/5201" 2>/dev/null && break; sleep 0.2; done
  sleep 0.3
  ip netns exec "$nb" iperf3 -s -1 -B "$TB" -p 5202 >/dev/null 2>&1 &
  pids+=($!)
  sleep 0.3
  ip netns exec "$na" timeout $((secs + 15)) iperf3 -c "$TB" -p 5202 -t "$secs" -J 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin); e=d["end"]; print("%.1f" % (e["sum_received"]["bits_per_second"]/1e6)); print("bench-tunnel:   retransmits %s, sender cpu %.0f%%, receiver cpu %.0f%%" % (e["sum_sent"].get("retransmits"), e["cpu_utilization_percent"]["host_total"], e["cpu_utilization_percent"]["remote_total"]), file=sys.stderr)'
}

run_pair() {  # kind [6] -> Mbit/s (6: IPv6 underlay, IPv6 inside)
  local r
  if [[ ${2:-} == 6 ]]; then
    netns_up 6
    if [[ $1 == wggo ]]; then
      wggo_up "$nb" "${tag}w6b" "$work/b.key" "$work/a.pub" "$TB" "$TA" "" "$TB6" "$TA6"
      wggo_up "$na" "${tag}w6a" "$work/a.key" "$work/b.pub" "$TA" "$TB" "[$B6]:$PORT" "$TA6" "$TB6"
    else
      ours_up "$nb" "${tag}o6b" "$work/b.key" "$work/a.pub" "$TB" "$TA" "" "[$B6]" "$TB6" "$TA6"
      ours_up "$na" "${tag}o6a" "$work/a.key" "$work/b.pub" "$TA" "$TB" "[$B6]:$PORT" "[$A6]" "$TA6" "$TB6"
    fi
    r="$(iperf "$TB6")" || r=""
  else
    netns_up
    if [[ $1 == wggo ]]; then
      wggo_up "$nb" "${tag}wb" "$work/b.key" "$work/a.pub" "$TB" "$TA" ""
      wggo_up "$na" "${tag}wa" "$work/a.key" "$work/b.pub" "$TA" "$TB" "$B:$PORT"
    else
      ours_up "$nb" "${tag}ob" "$work/b.key" "$work/a.pub" "$TB" "$TA" "" "$B"
      ours_up "$na" "${tag}oa" "$work/a.key" "$work/b.pub" "$TA" "$TB" "$B:$PORT" "$A"
    fi
    r="$(iperf "$TB")" || r=""
  fi
  cleanup
  [[ -n "$r" ]] && python3 -c "import sys; sys.exit(0 if float('$r') > 0 else 1)" || return 1
  echo "$r"
}

# --- catalog leg ---------------------------------------------------------------------------
M_ADDR=198.18.48.1 G_ADDR=198.18.48.2 CAT_IP=198.18.49.10 GDNS_IP=198.18.49.53
CAT_NAME=cat.bench.svc.cluster.local CAT2_IP=198.18.49.11 CAT2_NAME=ours.bench.svc.cluster.local
nm="${tag}m" ng="${tag}g"
cat_bg() { "$@" >>"$work/catalog.log" 2>&1 & pids+=($!); }
# The servable part of the catalog, in $work/catalog (once): opm refuses a few packages of the
# real catalog (stranded bundles), and so does our catalog server; leave those out, as the
# catalog benchmark does.
prepare_catalog() {
  [[ -d "$work/catalog" ]] && return 0
  mkdir -p "$work/catalog"
  # (copies, hard-linked where possible: opm does not follow directory symlinks)
  for d in "$catalog"/*/; do cp -al "${d%/}" "$work/catalog/" 2>/dev/null || cp -r "${d%/}" "$work/catalog/"; done
  local out bad left=()
  for _ in $(seq 40); do
    if out="$("$tools/opm" serve "$work/catalog" --cache-only --pprof-addr= \
        --cache-dir "$work/opm-cache" --cache-enforce-integrity=false 2>&1)"; then
      break
    fi
    bad="$(sed -n 's/.*process package \\"\([^\\]*\)\\".*/\1/p' <<<"$out" | head -1)"
    [[ -n "$bad" && -d "$work/catalog/$bad" ]] || { echo "bench-tunnel: opm: $out" >&2; break; }
    rm -rf "${work:?}/catalog/$bad" "$work/opm-cache"; left+=("$bad")
  done
  echo "bench-tunnel:   catalog $(basename "$catalog"): $(ls "$work/catalog" | wc -l) packages (left out, refused by opm: ${left[*]:-none})" >&2
}

catalog_setup() {
  ip netns add "$nm"; ip netns add "$ng"
  ip link add "${tag}vm" netns "$nm" type veth peer name "${tag}vg" netns "$ng"
  ip -n "$nm" addr add "$M_ADDR/30" dev "${tag}vm"; ip -n "$ng" addr add "$G_ADDR/30" dev "${tag}vg"
  for n in "$nm" "$ng"; do ip -n "$n" link set lo up; done
  ip -n "$nm" link set "${tag}vm" up; ip -n "$ng" link set "${tag}vg" up
  ip -n "$ng" addr add "$CAT_IP/32" dev lo; ip -n "$ng" addr add "$GDNS_IP/32" dev lo
  ip -n "$ng" addr add "$CAT2_IP/32" dev lo
  mkdir -p "/etc/netns/$ng"; echo "nameserver $GDNS_IP" > "/etc/netns/$ng/resolv.conf"
  cat_bg ip netns exec "$ng" dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts \
    --bind-interfaces --listen-address="$GDNS_IP" --pid-file= --host-record="$CAT_NAME,$CAT_IP" --host-record="$CAT2_NAME,$CAT2_IP"
  prepare_catalog
  cat_bg ip netns exec "$ng" "$tools/opm" serve "$work/catalog" --port 50051 --pprof-addr= \
    --cache-dir "$work/opm-cache" --cache-enforce-integrity=false
  cat_bg ip netns exec "$ng" "$rel/hcp-olm-catalog-server" --catalog "$work/catalog" \
    --listen "$CAT2_IP:50052"
  wg genkey > "$work/gw.key"; wg genkey > "$work/ag.key"
  cat >"$work/gateway.json" <<EOF_
{ "listen_port": 51820, "private_key_file": "$work/gw.key",
  "agent_public_key": "$(wg pubkey < "$work/ag.key")",
  "tunnel_address": "100.127.255.1/30", "agent_tunnel_address": "100.127.255.2/30",
  "guest_cidrs": ["198.18.49.0/24"], "hcp_namespace": "clusters-bench",
  "connect_listen": "127.0.0.1:3128", "health_listen": "127.0.0.1:9090",
  "dns": { "local_upstreams": ["127.0.0.1:5354"] },
  "allowed_services": [{ "namespace": "bench", "name": "*", "port": 50051 }, { "namespace": "bench", "name": "*", "port": 50052 }],
  "exposed_services": [] }
EOF_
  cat >"$work/agent.json" <<EOF_
{ "gateway_endpoint": "$M_ADDR:51820", "gateway_public_key": "$(wg pubkey < "$work/gw.key")",
  "private_key_file": "$work/ag.key",
  "tunnel_address": "100.127.255.2/30", "gateway_tunnel_address": "100.127.255.1/30",
  "persistent_keepalive_seconds": 10,
  "allowed_services": [{ "namespace": "*", "name": "*", "port": 50051 }, { "namespace": "*", "name": "*", "port": 50052 }],
  "allowed_cidrs": ["198.18.49.0/24"], "guest_dns": ["$GDNS_IP"],
  "exposed_services": [], "health_listen": "127.0.0.1:9091" }
EOF_
  cat_bg ip netns exec "$nm" "$gwbin" --config "$work/gateway.json"
  cat_bg ip netns exec "$ng" "$agbin" --config "$work/agent.json"
  # Konnectivity's agent link is mTLS: a throwaway CA, a server cert for M_ADDR, an agent cert
  local k="$work/konn"; mkdir -p "$k"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$k/ca.key" -out "$k/ca.crt" -subj /CN=bench-ca -days 1 2>/dev/null
  for who in server agent; do
    openssl req -newkey rsa:2048 -nodes -keyout "$k/$who.key" -out "$k/$who.csr" -subj "/CN=proxy-$who" 2>/dev/null
    printf 'subjectAltName=IP:%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$M_ADDR" > "$k/$who.ext"
    openssl x509 -req -in "$k/$who.csr" -CA "$k/ca.crt" -CAkey "$k/ca.key" -CAcreateserial \
      -out "$k/$who.crt" -days 1 -extfile "$k/$who.ext" 2>/dev/null
  done
  cat_bg ip netns exec "$nm" "$tools/proxy-server" --mode=http-connect --server-port=0 \
    --uds-name="$k/konn.sock" --agent-port=8091 --admin-port=8095 --health-port=8092 \
    --server-count=1 --cluster-cert="$k/server.crt" --cluster-key="$k/server.key" \
    --cluster-ca-cert="$k/ca.crt"
  cat_bg ip netns exec "$ng" "$tools/proxy-agent" --proxy-server-host="$M_ADDR" \
    --proxy-server-port=8091 --admin-server-port=8094 --health-server-port=8093 \
    --ca-cert="$k/ca.crt" --agent-cert="$k/agent.crt" --agent-key="$k/agent.key"
  echo "bench-tunnel: catalog leg: waiting for opm (large catalog) and both tunnels" >&2
  local ok
  for path in "$ng $CAT_NAME:50051 -" "$nm $CAT_NAME:50051 127.0.0.1:3128" "$nm $CAT_NAME:50051 unix:$k/konn.sock" "$ng $CAT2_NAME:50052 -"; do
    read -r ns addr proxy <<<"$path"
    ok=no
    for _ in $(seq 240); do
      if ip netns exec "$ns" "$rel/examples/catalog-rpc-bench" "$addr" "$proxy" 0 1 >/dev/null 2>>"$work/catalog.log"; then
        ok=yes; break
      fi
      sleep 0.5
    done
    echo "bench-tunnel:   path via ${proxy} ready: $ok" >&2
  done
}
# Sequential small RPCs (GetPackage) per run: p99 is the 20th slowest of 2,000.
RPC_CALLS=2000
# ListBundles streams per run; the run's Mbit/s is from their median time. (It was 3 before
# 2026-11-27 night: a 2.2 MB stream takes 8-45 ms through the fast backend, depending on the
# path and the machine, and the median of three such short streams moved by about 15% between
# runs of the same build.)
LB_REPS=15
rpc_bench() {  # label netns addr proxy -> "mbit p99" (figures on stderr)
  local out
  out="$(ip netns exec "$2" timeout 300 "$rel/examples/catalog-rpc-bench" "$3" "$4" "$LB_REPS" "$RPC_CALLS" 2>>"$work/catalog.log" | tail -1)"
  echo "bench-tunnel:   $1: ${out:-failed}" >&2
  [[ -n "$out" ]] || grep -E -m6 "panicked|rror" "$work/catalog.log" | cut -c1-300 | sed 's/^/bench-tunnel:     /' >&2
  local mbit p99
  mbit="$(sed -n 's/.*mbit_per_s=\([0-9.]*\).*/\1/p' <<<"$out")"
  p99="$(sed -n 's/.*small_p99_ms=\([0-9.]*\).*/\1/p' <<<"$out")"
  [[ -n "$mbit" && -n "$p99" ]] || return 1
  echo "$mbit $p99"
}
catalog_stop() {
  cleanup
  ip netns del "$nm" 2>/dev/null || true
  ip netns del "$ng" 2>/dev/null || true
  rm -rf "/etc/netns/$ng"
}

# --- many HCPs on one node ------------------------------------------------------------------
MULTI="${BENCH_MULTI:-8}"
nmm="${tag}mm"
multi_pids=()
rmem_saved="" wmem_saved=""
multi_stop() {
  for p in "${multi_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${multi_pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null || true
  done
  for p in "${multi_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  multi_pids=()
  ip netns del "$nmm" 2>/dev/null || true
  for i in $(seq 0 $((MULTI - 1))); do
    ip netns del "${tag}g$i" 2>/dev/null || true
    rm -rf "/etc/netns/${tag}g$i"
  done
  if [[ -n "$rmem_saved" ]]; then
    sysctl -qw "net.core.rmem_max=$rmem_saved" "net.core.wmem_max=$wmem_saved" || true
    rmem_saved=""
  fi
}
multi_bg() { "$@" >>"$work/multi.log" 2>&1 & multi_pids+=($!); }
udp_drops() {  # netns -> Udp RcvbufErrors
  ip netns exec "$1" awk '/^Udp: / {n++; if (n == 1) {for (i = 1; i <= NF; i++) if ($i == "RcvbufErrors") c = i} else {print $c; exit}}' /proc/net/snmp
}
multi_drops() {  # -> RcvbufErrors summed over the management and every guest namespace
  local sum=0 i
  sum=$((sum + $(udp_drops "$nmm")))
  for i in $(seq 0 $((MULTI - 1))); do sum=$((sum + $(udp_drops "${tag}g$i"))); done
  echo "$sum"
}
multi_setup() {
  rmem_saved="$(sysctl -n net.core.rmem_max)" wmem_saved="$(sysctl -n net.core.wmem_max)"
  sysctl -qw net.core.rmem_max=212992 net.core.wmem_max=212992
  ip netns add "$nmm"; ip -n "$nmm" link set lo up
  local i ng ma ga
  for i in $(seq 0 $((MULTI - 1))); do
    ng="${tag}g$i" ma="198.18.56.$((4 * i + 1))" ga="198.18.56.$((4 * i + 2))"
    ip netns add "$ng"
    ip link add "${tag}n$i" netns "$nmm" type veth peer name "${tag}x$i" netns "$ng"
    ip -n "$nmm" addr add "$ma/30" dev "${tag}n$i"; ip -n "$ng" addr add "$ga/30" dev "${tag}x$i"
    ip -n "$ng" link set lo up; ip -n "$nmm" link set "${tag}n$i" up; ip -n "$ng" link set "${tag}x$i" up
    ip -n "$ng" addr add "$CAT2_IP/32" dev lo; ip -n "$ng" addr add "$GDNS_IP/32" dev lo
    mkdir -p "/etc/netns/$ng"; echo "nameserver $GDNS_IP" > "/etc/netns/$ng/resolv.conf"
    multi_bg ip netns exec "$ng" dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts \
      --bind-interfaces --listen-address="$GDNS_IP" --pid-file= --host-record="$CAT2_NAME,$CAT2_IP"
    multi_bg ip netns exec "$ng" "$rel/hcp-olm-catalog-server" --catalog "$work/catalog" \
      --listen "$CAT2_IP:50052"
    wg genkey > "$work/mgw$i.key"; wg genkey > "$work/mag$i.key"
    cat >"$work/mgateway$i.json" <<EOF_
{ "listen_port": $((51830 + i)), "private_key_file": "$work/mgw$i.key",
  "agent_public_key": "$(wg pubkey < "$work/mag$i.key")",
  "tunnel_address": "100.127.255.1/30", "agent_tunnel_address": "100.127.255.2/30",
  "guest_cidrs": ["198.18.49.0/24"], "hcp_namespace": "clusters-bench$i",
  "connect_listen": "127.0.0.1:$((3140 + i))", "health_listen": "127.0.0.1:$((9140 + i))",
  "dns": { "local_upstreams": ["127.0.0.1:5354"] },
  "allowed_services": [{ "namespace": "bench", "name": "*", "port": 50052 }],
  "exposed_services": [] }
EOF_
    cat >"$work/magent$i.json" <<EOF_
{ "gateway_endpoint": "$ma:$((51830 + i))", "gateway_public_key": "$(wg pubkey < "$work/mgw$i.key")",
  "private_key_file": "$work/mag$i.key",
  "tunnel_address": "100.127.255.2/30", "gateway_tunnel_address": "100.127.255.1/30",
  "persistent_keepalive_seconds": 10,
  "allowed_services": [{ "namespace": "*", "name": "*", "port": 50052 }],
  "allowed_cidrs": ["198.18.49.0/24"], "guest_dns": ["$GDNS_IP"],
  "exposed_services": [], "health_listen": "127.0.0.1:9091" }
EOF_
    multi_bg ip netns exec "$nmm" "$gwbin" --config "$work/mgateway$i.json"
    multi_bg ip netns exec "$ng" "$agbin" --config "$work/magent$i.json"
  done
  echo "bench-tunnel: many-HCPs leg: waiting for $MULTI catalog servers and tunnels (rmem_max/wmem_max 212992 for the leg, was $rmem_saved/$wmem_saved)" >&2
  local ok
  for i in $(seq 0 $((MULTI - 1))); do
    ok=no
    for _ in $(seq 240); do
      if ip netns exec "$nmm" "$rel/examples/catalog-rpc-bench" "$CAT2_NAME:50052" "127.0.0.1:$((3140 + i))" 0 0 >/dev/null 2>>"$work/multi.log"; then
        ok=yes; break
      fi
      sleep 0.5
    done
    [[ $ok == yes ]] || fail "many-HCPs leg: pair $i never served (see the log: $(tail -3 "$work/multi.log" | cut -c1-200))"
  done
}
multi_run() {  # pairs repeats -> aggregate Mbit/s (all payload bytes / wall time)
  local n=$1 rep=$2 i t0 t1 cpids=() bytes=0 b out
  t0="$(date +%s.%N)"
  for i in $(seq 0 $((n - 1))); do
    ip netns exec "$nmm" timeout 300 "$rel/examples/catalog-rpc-bench" "$CAT2_NAME:50052" \
      "127.0.0.1:$((3140 + i))" "$rep" 0 >"$work/multi-out$i" 2>>"$work/multi.log" &
    cpids+=($!)
  done
  for i in "${!cpids[@]}"; do wait "${cpids[$i]}" || { echo "bench-tunnel: many-HCPs client $i failed" >&2; return 1; }; done
  t1="$(date +%s.%N)"
  for i in $(seq 0 $((n - 1))); do
    out="$(tail -1 "$work/multi-out$i")"
    b="$(sed -n 's/.*stream_bytes=\([0-9]*\).*/\1/p' <<<"$out")"
    [[ -n "$b" && "$b" -gt 0 ]] || { echo "bench-tunnel: many-HCPs client $i: no result ($out)" >&2; return 1; }
    bytes=$((bytes + b * (rep + 1)))  # the warm-up stream moves the payload too
  done
  python3 -c "print('%.1f' % ($bytes * 8 / 1e6 / ($t1 - $t0)))"
}
multi_leg() {
  echo "bench-tunnel: many HCPs on one node: $MULTI gateway/agent pairs, ListBundles x20 each at once, against one pair alone" >&2
  prepare_catalog
  multi_setup
  local d0 d1 i k r agg=() one=()
  d0="$(multi_drops)"
  for i in $(seq "$rounds"); do
    for k in $(rotated "$i" 2); do
      if [[ $k == 0 ]]; then r="$(multi_run "$MULTI" 20)" || fail "round $i: $MULTI pairs at once"; agg+=("$r")
      else r="$(multi_run 1 20)" || fail "round $i: one pair alone"; one+=("$r"); fi
    done
    echo "bench-tunnel: round $i: $MULTI pairs at once ${agg[-1]} Mbit/s in all, one pair alone ${one[-1]} Mbit/s" >&2
  done
  d1="$(multi_drops)"
  multi_stop
  multi_line="multi-bench: tunnels=$MULTI aggregate_mbit(min/median/max)=$(spread "${agg[@]}") single_mbit=$(spread "${one[@]}") aggregate_vs_single=$(ratio "$(median "${agg[@]}")" "$(median "${one[@]}")") udp_rcvbuf_drops=$((d1 - d0)) rmem_max=212992"
  echo "$multi_line" >&2
}

# --- DNS leg -------------------------------------------------------------------------------
dns_pids=()
dns_stop() {
  for p in "${dns_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${dns_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  dns_pids=()
}
dns_bg() { "$@" >>"$work/dns.log" 2>&1 & dns_pids+=($!); pids+=($!); }

dns_setup() {
  # upstreams: "management" answers *.bench.mgmt, "guest" answers *.svc.cluster.local
  dns_bg dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.0.1 --port=5401 --local-ttl=300 --address=/bench.mgmt/198.18.60.1 --pid-file=
  dns_bg dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.0.1 --port=5403 --local-ttl=300 --address=/svc.cluster.local/198.19.60.1 --pid-file=
  cat >"$work/ours.yaml" <<EOF_
listen: 127.0.0.1:5402
dns:
  cluster_domain: cluster.local
  upstreams: { local: ["127.0.0.1:5401"], guest: ["127.0.0.1:5403"] }
  rules:
    - { suffix: svc.cluster.local, owner: guest }
    - { suffix: ".", owner: local }
  # All load comes from one client here: the per-client limit (200 qps by default, a
  # tenant-isolation setting that dnsmasq and CoreDNS do not have) is raised out of the way.
  clients: { rate_limit_qps: 100000000, rate_limit_burst: 100000000 }
EOF_
  cat >"$work/Corefile" <<EOF_
svc.cluster.local:5405 {
  bind 127.0.0.1
  cache 300
  forward . 127.0.0.1:5403
}
.:5405 {
  bind 127.0.0.1
  cache 300
  forward . 127.0.0.1:5401
}
EOF_
  dns_bg "$ourdns" --config "$work/ours.yaml"
  pid_ours=$!
  dns_bg dnsmasq --no-daemon --conf-file=/dev/null --no-resolv --no-hosts --bind-interfaces \
    --listen-address=127.0.0.1 --port=5404 --cache-size=10000 --pid-file= \
    --server=/svc.cluster.local/127.0.0.1#5403 --server=127.0.0.1#5401
  pid_dnsmasq=$!
  dns_bg "$coredns" -conf "$work/Corefile"
  pid_coredns=$!
  : >"$work/queries"
  for i in $(seq 25); do
    echo "host$i.bench.mgmt A" >>"$work/queries"
    echo "cat$i.ns$i.svc.cluster.local A" >>"$work/queries"
  done
  sleep 1.5
}

cpu_ticks() {  # pid -> utime + stime in clock ticks; fails for a process gone or a zombie
  awk '$3 == "Z" {exit 1} {print $14 + $15}' "/proc/$1/stat"
}

dnsperf_qps() {  # port seconds label name pid -> "qps answers_per_cpu_second" (details on stderr)
  local out t0 t1
  # the server under test must be the one answering: if it is not running (it failed to
  # bind, or exited), its CPU time cannot be read and the run fails
  t0="$(cpu_ticks "$5")" && [[ -n $t0 ]] || { echo "bench-tunnel: $4 (pid $5) is not running" >&2; return 1; }
  out="$(dnsperf -s 127.0.0.1 -p "$1" -d "$work/queries" -c 4 -l "$2" 2>&1)"
  t1="$(cpu_ticks "$5")" && [[ -n $t1 ]] || { echo "bench-tunnel: $4 (pid $5) exited during the run" >&2; return 1; }
  local qps lat lost codes done_
  qps="$(awk '/Queries per second:/ {print $4}' <<<"$out")"
  lat="$(awk '/Average Latency/ {print $4}' <<<"$out")"
  lost="$(awk '/Queries lost:/ {print $3}' <<<"$out")"
  done_="$(awk '/Queries completed:/ {print $3}' <<<"$out")"
  codes="$(awk -F': ' '/Response codes:/ {print $2}' <<<"$out" | sed 's/^ *//')"
  local per_cpu
  # no CPU time at all means the process measured is not the one that answered
  per_cpu="$(python3 -c "t=($t1-$t0)/$(getconf CLK_TCK); assert t > 0, 'no server CPU time'; print('%.0f' % (${done_:-0}/t))")" || return 1
  echo "bench-tunnel:   ${3:-run} port $1 ($4): ${qps:-0} qps, ${per_cpu} answers per server CPU-second, avg latency ${lat:-?} s, lost ${lost:-?}, codes ${codes:-?}" >&2
  # only answers count: a server that fails fast must not look fast
  if [[ -z "$qps" || "$codes" != NOERROR* ]] || [[ "$codes" == *SERVFAIL* || "$codes" == *NXDOMAIN* || "$codes" == *REFUSED* ]]; then
    echo "bench-tunnel: port $1 ($4) answered with errors: $codes" >&2
    return 1
  fi
  # unanswered queries are failures too (beyond dnsperf's in-flight tail at the end)
  if [[ "${lost:-0}" -gt $(( ${done_:-0} / 100 + 8 )) ]]; then
    echo "bench-tunnel: port $1 ($4) lost ${lost} queries" >&2
    return 1
  fi
  echo "$qps $per_cpu"
}

median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
spread() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {m=(NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2; printf "%s/%s/%s", a[1], m, a[NR]}'; }
ratio() { python3 -c "print('%.3f' % ($1 / $2))"; }
# rotated I N: the N system indexes of round I (1-based), starting with system I mod N
rotated() { local i=$1 n=$2 k; for k in $(seq 0 $((n - 1))); do echo $(( (i - 1 + k) % n )); done; }

if [[ $legs == multi ]]; then
  multi_leg
  echo "tunnel-bench: ${multi_line#multi-bench: } (legs: multi)$builds"
  exit 0
fi

[[ $legs == dns ]] || keys
ours=() wggo=() ours6=() wggo6=()
[[ $legs == catalog || $legs == dns ]] && tun_rounds=0 || tun_rounds=$rounds
for i in $(seq "$tun_rounds"); do
  for k in $(rotated "$i" 4); do
    case $k in
      0) w="$(run_pair wggo)" || fail "round $i: wireguard-go iperf3 run (IPv4)"; wggo+=("$w") ;;
      1) o="$(run_pair ours)" || fail "round $i: hcp-olm-tunnel iperf3 run (IPv4)"; ours+=("$o") ;;
      2) w6="$(run_pair wggo 6)" || fail "round $i: wireguard-go iperf3 run (IPv6)"; wggo6+=("$w6") ;;
      3) o6="$(run_pair ours 6)" || fail "round $i: hcp-olm-tunnel iperf3 run (IPv6)"; ours6+=("$o6") ;;
    esac
  done
  echo "bench-tunnel: round $i: IPv4 wireguard-go ${w} Mbit/s, ours ${o} Mbit/s; IPv6 wireguard-go ${w6} Mbit/s, ours ${o6} Mbit/s (iperf3 single stream, ${secs}s)" >&2
done
if [[ $legs != catalog && $legs != dns ]]; then
  mo="$(median "${ours[@]}")" mw="$(median "${wggo[@]}")"
  mo6="$(median "${ours6[@]}")" mw6="$(median "${wggo6[@]}")"
  r_tun="$(ratio "$mo" "$mw")" r_tun6="$(ratio "$mo6" "$mw6")" r_v6v4="$(ratio "$mo6" "$mo")"
  echo "tun-bench: ours_mbit(min/median/max)=$(spread "${ours[@]}") wireguard_go_mbit=$(spread "${wggo[@]}") tun_vs_wireguard_go=$r_tun" >&2
  echo "tun6-bench: ours_mbit(min/median/max)=$(spread "${ours6[@]}") wireguard_go_mbit=$(spread "${wggo6[@]}") tun6_vs_wireguard_go=$r_tun6 ours_v6_vs_v4=$r_v6v4" >&2
fi
if [[ $legs == tun ]]; then
  echo "tunnel-bench: tun_vs_wireguard_go=$r_tun tun6_vs_wireguard_go=$r_tun6 ours_v6_vs_v4=$r_v6v4 (legs: tun)$builds"
  exit 0
fi

if [[ $legs != dns ]]; then
echo "bench-tunnel: catalog path: ListBundles of $(basename "$catalog") x$LB_REPS and $RPC_CALLS GetPackage, per round" >&2
catalog_setup
declare -a c_m c_p s_m s_p
names=(ours konnectivity direct)
ns_of=("$nm" "$nm" "$ng")
proxy_of=(127.0.0.1:3128 "unix:$work/konn/konn.sock" -)
for leg in opm server; do
  for i in $(seq "$rounds"); do
    for k in $(rotated "$i" 3); do
      if [[ $leg == opm ]]; then addr="$CAT_NAME:50051"; label="round $i ${names[$k]} (opm backend)"
      else addr="$CAT2_NAME:50052"; label="round $i ${names[$k]} (catalog-server backend)"; fi
      r="$(rpc_bench "$label" "${ns_of[$k]}" "$addr" "${proxy_of[$k]}")" || fail "$label"
      read -r m p <<<"$r"
      if [[ $leg == opm ]]; then c_m[$k]+="$m "; c_p[$k]+="$p "
      else s_m[$k]+="$m "; s_p[$k]+="$p "; fi
    done
  done
done
catalog_stop
multi_leg
# shellcheck disable=SC2086
{
  co="$(median ${c_m[0]})" ck="$(median ${c_m[1]})" cd_="$(median ${c_m[2]})"
  po="$(median ${c_p[0]})" pk="$(median ${c_p[1]})"
  spo="$(median ${s_p[0]})" spk="$(median ${s_p[1]})"
  so="$(median ${s_m[0]})" sk="$(median ${s_m[1]})" sd="$(median ${s_m[2]})"
  echo "catalog-bench-path (opm backend, for information): Mbit/s min/median/max ours=$(spread ${c_m[0]}) konnectivity=$(spread ${c_m[1]}) direct=$(spread ${c_m[2]}); small-RPC p99 ms ours=$(spread ${c_p[0]}) konnectivity=$(spread ${c_p[1]}) direct=$(spread ${c_p[2]})" >&2
  echo "catalog-bench-path (hcp-olm-catalog-server backend): Mbit/s min/median/max ours=$(spread ${s_m[0]}) konnectivity=$(spread ${s_m[1]}) direct=$(spread ${s_m[2]}); small-RPC p99 ms ours=$(spread ${s_p[0]}) konnectivity=$(spread ${s_p[1]}) direct=$(spread ${s_p[2]})" >&2
}
r_bulk_k="$(ratio "$so" "$sk")" r_bulk_d="$(ratio "$so" "$sd")" r_p99="$(ratio "$spo" "$spk")" r_p99_opm="$(ratio "$po" "$pk")"
if [[ $legs == catalog ]]; then
  echo "tunnel-bench: bulk_vs_konnectivity=$r_bulk_k bulk_vs_direct=$r_bulk_d rpc_p99_vs_konnectivity=$r_p99 rpc_p99_opm_vs_konnectivity=$r_p99_opm multi_aggregate_vs_single=$(sed -n 's/.*aggregate_vs_single=\([^ ]*\).*/\1/p' <<<"$multi_line") multi_udp_rcvbuf_drops=$(sed -n 's/.*udp_rcvbuf_drops=\([^ ]*\).*/\1/p' <<<"$multi_line") (legs: catalog)$builds"
  exit 0
fi
fi

echo "bench-tunnel: DNS, cached answers (dnsperf -c 4, ${secs}s per run; ours with its per-client rate limit raised)" >&2
dns_setup
dns_names=(ours dnsmasq coredns)
dns_ports=(5402 5404 5405)
dns_pid_of=("$pid_ours" "$pid_dnsmasq" "$pid_coredns")
for k in 0 1 2; do
  dnsperf_qps "${dns_ports[$k]}" 2 warm-up "${dns_names[$k]}" "${dns_pid_of[$k]}" >/dev/null || fail "DNS warm-up ${dns_names[$k]}"
done
declare -a dq dc
for i in $(seq "$rounds"); do
  for k in $(rotated "$i" 3); do
    r="$(dnsperf_qps "${dns_ports[$k]}" "$secs" "round $i" "${dns_names[$k]}" "${dns_pid_of[$k]}")" || fail "round $i DNS ${dns_names[$k]}"
    read -r q c <<<"$r"
    dq[$k]+="$q "; dc[$k]+="$c "
  done
done
dns_stop
# shellcheck disable=SC2086
{
  echo "dns-bench: qps min/median/max ours=$(spread ${dq[0]}) dnsmasq=$(spread ${dq[1]}) coredns=$(spread ${dq[2]}); answers per server CPU-second ours=$(spread ${dc[0]}) dnsmasq=$(spread ${dc[1]}) coredns=$(spread ${dc[2]})" >&2
  co_="$(median ${dc[0]})" cm="$(median ${dc[1]})" cc="$(median ${dc[2]})"
}
r_dns_c="$(ratio "$co_" "$cc")" r_dns_m="$(ratio "$co_" "$cm")"
if [[ $legs == dns ]]; then
  echo "tunnel-bench: dns_cpu_vs_coredns=$r_dns_c dns_cpu_vs_dnsmasq=$r_dns_m (legs: dns)$builds"
  exit 0
fi
echo "tunnel-bench: bulk_vs_konnectivity=$r_bulk_k bulk_vs_direct=$r_bulk_d rpc_p99_vs_konnectivity=$r_p99 rpc_p99_opm_vs_konnectivity=$r_p99_opm tun_vs_wireguard_go=$r_tun dns_cpu_vs_coredns=$r_dns_c dns_cpu_vs_dnsmasq=$r_dns_m tun6_vs_wireguard_go=$r_tun6 multi_aggregate_vs_single=$(sed -n 's/.*aggregate_vs_single=\([^ ]*\).*/\1/p' <<<"$multi_line") multi_udp_rcvbuf_drops=$(sed -n 's/.*udp_rcvbuf_drops=\([^ ]*\).*/\1/p' <<<"$multi_line")$builds"
