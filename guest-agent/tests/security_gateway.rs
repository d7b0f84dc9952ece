//! Attacks of a hostile guest on the control-plane gateway, in network namespaces with the
//! real binaries: management namespace M (hcp-olm-gateway, a dnsmasq for management names,
//! a decoy "metadata" HTTP server, an allowed HCP catalog stand-in) and guest namespace G
//! (hcp-olm-agent, a dnsmasq for guest `svc` names).
//!
//! Stand-ins (named): `python3` TCP servers play the management-side decoy and the HCP
//! catalog (the tests only need "was it reached" and "does it answer"); a `python3` client in
//! G plays a guest pod opening many streams; a bash `/dev/tcp` client plays catalog-operator
//! speaking CONNECT/SOCKS5 to the gateway.
//!
//! Underlay 198.18.50.0/30 (M .1, G .2); guest "Services" 198.18.52.0/24 on G's lo;
//! management addresses 198.18.51.0/24 on M's lo. All addresses exist only in the namespaces.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hcp_olm_e2e::netns::{Netns, NsProcess, connect};
use hcp_olm_guest_agent::tunnel::PrivateKey;

const GATEWAY: &str = env!("CARGO_BIN_EXE_hcp-olm-gateway");
const AGENT: &str = env!("CARGO_BIN_EXE_hcp-olm-agent");
const DNSMASQ: &str = "/usr/sbin/dnsmasq";

const M_ADDR: &str = "198.18.50.1";
const G_ADDR: &str = "198.18.50.2";
const GUEST_CAT: &str = "198.18.52.10";
const GUEST_DNS: &str = "198.18.52.53";
/// The HCP's own catalog Service (allow-listed for the gateway).
const MGMT_CAT: &str = "198.18.51.10";
/// The decoy "metadata" server on the management side.
const DECOY: &str = "198.18.51.254";
const HCP_NS: &str = "clusters-sec";
const GUEST_NS: &str = "team-a";
const CONNECT_PROXY: &str = "127.0.0.1:3128";
const SOCKS_PROXY: &str = "127.0.0.1:1080";
const GW_HEALTH: &str = "127.0.0.1:9101";
const AGENT_HEALTH: &str = "127.0.0.1:9102";
const EXPOSED_PORT: u16 = 50061;

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    loop {
        if f() {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn dnsmasq(ns: &Netns, name: &str, listen: &str, port: u16, records: &[(&str, &str)]) -> NsProcess {
    let mut cmd = ns.command(DNSMASQ);
    cmd.args([
        "--no-daemon",
        "--conf-file=/dev/null",
        &format!("--port={port}"),
        &format!("--listen-address={listen}"),
        "--bind-interfaces",
        "--no-resolv",
        "--no-hosts",
        "--pid-file=",
        "--user=",
        "--local=/cluster.local/",
        "--local=/example.com/",
    ]);
    for (n, ip) in records {
        cmd.arg(format!("--host-record={n},{ip}"));
    }
    ns.spawn(name, cmd).unwrap()
}

/// Stand-in for a management-side service nobody in the guest may reach: logs every
/// accepted connection to `log` and answers like a metadata endpoint.
const DECOY_PY: &str = r#"
import socket, sys
addr, port, log = sys.argv[1], int(sys.argv[2]), sys.argv[3]
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port)); s.listen(128)
open(log, "a").close()
while True:
    c, a = s.accept()
    with open(log, "a") as f:
        f.write("hit from %s\n" % (a,))
    try:
        c.sendall(b"HTTP/1.0 200 OK\r\n\r\nmetadata-secret")
    except OSError:
        pass
    c.close()
"#;

/// Stand-in for the HCP's catalog: answers `pong` at once, then `pushed` bytes more, and
/// keeps every connection open (never reads).
const PUSH_PY: &str = r#"
import socket, sys
addr, port, pushed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((addr, port)); s.listen(4096)
keep = []
data = b"pong\n" + b"x" * pushed
while True:
    c, _ = s.accept()
    c.setblocking(False)
    try:
        c.send(data)
    except OSError:
        pass
    keep.append(c)
"#;

/// A guest pod opening `n` streams to `addr` that send a request and never read; writes
/// the number opened to `progress` as it goes, then holds them for `hold` seconds.
const FLOOD_PY: &str = r#"
import socket, sys, time
host, port, n, hold, progress = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
conns = []
deadline = time.time() + 120
for i in range(n):
    if time.time() > deadline:
        break
    c = socket.socket()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        c.connect((host, port))
        c.setblocking(False)
        c.send(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    except OSError:
        c.close()
        continue
    conns.append(c)
    if i % 500 == 0:
        with open(progress, "w") as f:
            f.write(str(i))
with open(progress, "w") as f:
    f.write("done %d" % len(conns))
time.sleep(hold)
"#;

fn python(ns: &Netns, name: &str, script: &str, args: &[&str]) -> NsProcess {
    let mut cmd = ns.command("python3");
    cmd.arg("-c").arg(script).args(args);
    ns.spawn(name, cmd).unwrap()
}

/// A raw TCP exchange inside `ns` through bash's /dev/tcp: sends `input`, returns what
/// comes back within 3 s.
fn raw_exchange(ns: &Netns, addr: &str, input: &[u8]) -> Vec<u8> {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in");
    std::fs::write(&inp, input).unwrap();
    let script = format!(
        "exec 3<>/dev/tcp/{host}/{port} || exit 1; cat {} >&3 2>/dev/null; timeout 3 cat <&3",
        inp.display()
    );
    ns.output("bash", &["-c", &script]).unwrap().stdout
}

fn http_get(ns: &Netns, url: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (hostport, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let req = format!("GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n");
    let r = String::from_utf8_lossy(&raw_exchange(ns, hostport, req.as_bytes())).into_owned();
    let code = r
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = r.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("").into();
    (code, body)
}

fn metric(ns: &Netns, health: &str, prefix: &str) -> u64 {
    let (_, body) = http_get(ns, &format!("http://{health}/metrics"));
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn connect_req(target: &str) -> Vec<u8> {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes()
}

fn socks_req(host: &str, port: u16) -> Vec<u8> {
    let mut r = vec![5, 1, 0, 5, 1, 0];
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => {
            r.push(1);
            r.extend_from_slice(&ip.octets());
        }
        Err(_) => {
            r.push(3);
            r.push(host.len() as u8);
            r.extend_from_slice(host.as_bytes());
        }
    }
    r.extend_from_slice(&port.to_be_bytes());
    r
}

/// What a proxy client sees: the CONNECT status line, or the SOCKS reply code.
fn proxy_outcome(ns: &Netns, proto: &str, host: &str, port: u16) -> String {
    if proto == "connect" {
        let r = raw_exchange(ns, CONNECT_PROXY, &connect_req(&format!("{host}:{port}")));
        let r = String::from_utf8_lossy(&r);
        r.lines().next().unwrap_or("").to_string()
    } else {
        let r = raw_exchange(ns, SOCKS_PROXY, &socks_req(host, port));
        format!("socks reply {:?}", r.get(..4))
    }
}

fn vm_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0)
}

struct World {
    m: Netns,
    g: Netns,
    dir: tempfile::TempDir,
    gateway: NsProcess,
    agent: NsProcess,
}

impl World {
    fn logs(&self) -> String {
        format!(
            "--- gateway\n{}\n--- agent\n{}",
            self.gateway.log_tail(40),
            self.agent.log_tail(40)
        )
    }
}

fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    if let (Some(b), serde_json::Value::Object(e)) = (base.as_object_mut(), extra) {
        b.extend(e);
    }
}

/// The gateway config of this test (the HCP catalog allow-listed as the controller renders
/// it), with `extra` fields merged in.
fn gateway_config(
    dir: &Path,
    gw_key: &PrivateKey,
    agent_key: &PrivateKey,
    extra: serde_json::Value,
) -> PathBuf {
    // One key file per gateway: the gateway re-reads its key file (key_reload_seconds).
    let id = rand::random::<u32>();
    let gw_key_file = dir.join(format!("gw-{id}.key"));
    std::fs::write(&gw_key_file, gw_key.to_base64()).unwrap();
    let mut gw = serde_json::json!({
        "listen_port": 51820,
        "private_key_file": gw_key_file,
        "agent_public_key": agent_key.public_key().to_string(),
        "tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "agent_tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "guest_cidrs": ["198.18.52.0/24"],
        "hcp_namespace": HCP_NS,
        "connect_listen": CONNECT_PROXY,
        "socks_listen": SOCKS_PROXY,
        "health_listen": GW_HEALTH,
        "persistent_keepalive_seconds": 2,
        "dns": {"local_upstreams": ["127.0.0.1:5354"]},
        "allowed_services": [{"namespace": GUEST_NS, "name": "*", "port": 50051}],
        "allowed_local_services": [{"namespace": HCP_NS, "name": "cat", "port": 50051}],
        "exposed_services": [
            {"name": "cat", "listen_port": EXPOSED_PORT, "target": format!("{MGMT_CAT}:50051")}
        ],
        "drain_timeout_seconds": 1,
    });
    merge(&mut gw, extra);
    let p = dir.join(format!("gateway-{id}.json"));
    std::fs::write(&p, serde_json::to_vec_pretty(&gw).unwrap()).unwrap();
    p
}

fn setup(gw_extra: serde_json::Value, agent_extra: serde_json::Value, pushed: usize) -> World {
    let m = Netns::create("secm").unwrap();
    let g = Netns::create("secg").unwrap();
    connect(&m, &format!("{M_ADDR}/30"), &g, &format!("{G_ADDR}/30")).unwrap();
    for a in [GUEST_CAT, GUEST_DNS] {
        g.ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"])
            .unwrap();
    }
    for a in [MGMT_CAT, DECOY] {
        m.ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"])
            .unwrap();
    }
    let dir = tempfile::tempdir().unwrap();
    let gw_key = PrivateKey::generate();
    let agent_key = PrivateKey::generate();
    let gw_conf = gateway_config(dir.path(), &gw_key, &agent_key, gw_extra);
    let agent_key_file = dir.path().join("agent.key");
    std::fs::write(&agent_key_file, agent_key.to_base64()).unwrap();
    let mut agent = serde_json::json!({
        "gateway_endpoint": format!("{M_ADDR}:51820"),
        "gateway_public_key": gw_key.public_key().to_string(),
        "private_key_file": agent_key_file,
        "tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "gateway_tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "persistent_keepalive_seconds": 2,
        "allowed_services": [{"namespace": "*", "name": "*", "port": 50051}],
        "allowed_cidrs": ["198.18.52.0/24"],
        "guest_dns": [GUEST_DNS],
        "exposed_services": [{"name": "cat", "listen_port": EXPOSED_PORT, "target": "-"}],
        "exposed_listen_address": "127.0.0.1",
        "health_listen": AGENT_HEALTH,
        "drain_timeout_seconds": 1,
    });
    merge(&mut agent, agent_extra);
    let agent_conf = dir.path().join("agent.json");
    std::fs::write(&agent_conf, serde_json::to_vec_pretty(&agent).unwrap()).unwrap();

    let decoy_log = dir.path().join("decoy.log");
    for port in ["80", "50051"] {
        python(
            &m,
            &format!("decoy-{port}"),
            DECOY_PY,
            &[DECOY, port, decoy_log.to_str().unwrap()],
        );
    }
    python(
        &m,
        "hcp-catalog",
        PUSH_PY,
        &[MGMT_CAT, "50051", &pushed.to_string()],
    );
    python(&g, "guest-catalog", PUSH_PY, &[GUEST_CAT, "50051", "0"]);
    dnsmasq(
        &g,
        "dnsmasq-guest",
        GUEST_DNS,
        53,
        &[
            (&format!("cat.{GUEST_NS}.svc.cluster.local"), GUEST_CAT),
            // A guest-owned name pointing at the management decoy.
            (&format!("evil.{GUEST_NS}.svc.cluster.local"), DECOY),
        ],
    );
    dnsmasq(
        &m,
        "dnsmasq-mgmt",
        "127.0.0.1",
        5354,
        &[
            (&format!("cat.{HCP_NS}.svc.cluster.local"), MGMT_CAT),
            // a public wildcard-DNS style name resolving to a management address
            ("metadata.example.com", DECOY),
            // stand-in for a rebinding name: answers an allowed address and the decoy
            ("rebind.example.com", MGMT_CAT),
            ("rebind.example.com", DECOY),
            // pod-DNS form and a Service of the HCP namespace that is not allow-listed
            (&format!("198-18-51-254.{HCP_NS}.pod.cluster.local"), DECOY),
            (&format!("metadata.{HCP_NS}.svc.cluster.local"), DECOY),
        ],
    );
    let mut cmd = m.command(GATEWAY);
    cmd.arg("--config").arg(&gw_conf);
    let gateway = m.spawn("gateway", cmd).unwrap();
    let mut cmd = g.command(AGENT);
    cmd.arg("--config").arg(&agent_conf);
    let agent = g.spawn("agent", cmd).unwrap();
    let w = World {
        m,
        g,
        dir,
        gateway,
        agent,
    };
    wait_for("agent ready (handshake)", Duration::from_secs(30), || {
        http_get(&w.g, &format!("http://{AGENT_HEALTH}/readyz")).0 == 200
    });
    wait_for("decoy up", Duration::from_secs(20), || {
        !raw_exchange(&w.m, &format!("{DECOY}:80"), b"probe").is_empty()
    });
    // The catalogs listen (checked without connecting: they hold every connection). On a
    // loaded machine the first CONNECT once met the HCP catalog before python had bound.
    let listening = |ns: &Netns, addr: &str| {
        ns.output("ss", &["-Hltn", "src", addr])
            .is_ok_and(|o| !o.stdout.is_empty())
    };
    wait_for("catalogs listening", Duration::from_secs(20), || {
        listening(&w.m, &format!("{MGMT_CAT}:50051"))
            && listening(&w.g, &format!("{GUEST_CAT}:50051"))
    });
    // The probe itself was a hit; start counting from here.
    std::fs::write(w.dir.path().join("decoy.log"), "").unwrap();
    w
}

/// Hole 1 (SSRF): a guest chooses CatalogSource addresses that resolve to management-side
/// addresses; catalog-operator dials them through the gateway. None may reach the decoy, and
/// each must fail exactly like an address that does not exist; the HCP's own catalog
/// (allow-listed) still works.
#[test]
fn security_gateway_guest_names_never_reach_the_management_network() {
    let w = setup(serde_json::json!({}), serde_json::json!({}), 0);
    let decoy_log = w.dir.path().join("decoy.log");

    // The allow-listed HCP catalog answers through both proxies.
    let r = raw_exchange(
        &w.m,
        CONNECT_PROXY,
        &connect_req(&format!("cat.{HCP_NS}.svc:50051")),
    );
    let r = String::from_utf8_lossy(&r);
    assert!(
        r.starts_with("HTTP/1.1 200") && r.contains("pong"),
        "allowed HCP catalog via CONNECT: {r}\n{}",
        w.logs()
    );
    let r = raw_exchange(
        &w.m,
        SOCKS_PROXY,
        &socks_req(&format!("cat.{HCP_NS}.svc"), 50051),
    );
    assert_eq!(r.get(..4), Some(&[5, 0, 5, 0][..]), "{r:?}\n{}", w.logs());
    // And a guest catalog by its guest Service name.
    let r = raw_exchange(
        &w.m,
        CONNECT_PROXY,
        &connect_req(&format!("cat.{GUEST_NS}.svc:50051")),
    );
    assert!(
        String::from_utf8_lossy(&r).contains("pong"),
        "guest catalog: {r:?}\n{}",
        w.logs()
    );

    let names = [
        "metadata.example.com".to_string(),
        "rebind.example.com".to_string(),
        format!("198-18-51-254.{HCP_NS}.pod.cluster.local"),
        format!("metadata.{HCP_NS}.svc"),
        format!("metadata.{HCP_NS}.svc.cluster.local"),
        format!("evil.{GUEST_NS}.svc.cluster.local"),
    ];
    for proto in ["connect", "socks"] {
        for port in [80u16, 50051] {
            let missing = proxy_outcome(&w.m, proto, "does-not-exist.example.com", port);
            for name in &names {
                let got = proxy_outcome(&w.m, proto, name, port);
                assert_eq!(
                    got,
                    missing,
                    "{proto} {name}:{port} must fail like a missing name\n{}",
                    w.logs()
                );
            }
            let missing_ip = proxy_outcome(&w.m, proto, "198.18.51.77", port);
            let got = proxy_outcome(&w.m, proto, DECOY, port);
            assert_eq!(got, missing_ip, "{proto} IP literal {DECOY}:{port}");
        }
    }
    let hits = std::fs::read_to_string(&decoy_log).unwrap();
    assert!(
        hits.is_empty(),
        "the management decoy was reached through the gateway:\n{hits}\n{}",
        w.logs()
    );
    assert!(
        metric(
            &w.m,
            GW_HEALTH,
            "hcp_olm_tunnel_proxy_connections_total{proto=\"connect\",result=\"denied\"}"
        ) >= 10,
        "refusals are counted for the operator"
    );
}

/// Hole 6(a): a guest pod opens 10,000 streams to a management catalog the agent exposes,
/// sends a request on each and never reads, while the catalog pushes 1 MiB on each. The
/// agent here has no effective cap and tiny socket send buffers in the guest namespace
/// (stand-in for a hostile agent that stops reading: a guest can run any agent), so data
/// backs up into the gateway. The gateway must bound itself: at most `max_connections`
/// (default 128) relayed at once, refusals counted, resident memory under 256 MiB (bound:
/// ~1 MiB of buffers and allocator overhead per stalled stream × 128 + the process;
/// measured 94 MiB), and
/// another hosted cluster's gateway keeps serving.
#[test]
fn security_gateway_stream_flood_keeps_memory_bounded() {
    const STREAMS: usize = 10_000;
    const RSS_BOUND_KIB: u64 = 256 * 1024;
    let w = setup(
        serde_json::json!({}),
        serde_json::json!({"max_connections": 20_000}),
        1024 * 1024,
    );
    // Guest: the agent's sockets to the never-reading pod take almost nothing, so the
    // agent's stack (and then the gateway's) fills. Management: the catalog's 1 MiB fits
    // its socket buffer at once.
    for (ns, v) in [(&w.g, "4096 4096 4096"), (&w.m, "4096 2097152 4194304")] {
        let out = ns
            .output("sysctl", &["-w", &format!("net.ipv4.tcp_wmem={v}")])
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    // Another hosted cluster's gateway in the same management network.
    let other_conf = gateway_config(
        w.dir.path(),
        &PrivateKey::generate(),
        &PrivateKey::generate(),
        serde_json::json!({
            "listen_port": 51821,
            "connect_listen": "127.0.0.1:3129",
            "socks_listen": "127.0.0.1:1081",
            "health_listen": "127.0.0.1:9111",
        }),
    );
    let mut cmd = w.m.command(GATEWAY);
    cmd.arg("--config").arg(&other_conf);
    let other = w.m.spawn("gateway-other-hcp", cmd).unwrap();
    let other_serves = || {
        let r = raw_exchange(
            &w.m,
            "127.0.0.1:3129",
            &connect_req(&format!("cat.{HCP_NS}.svc:50051")),
        );
        String::from_utf8_lossy(&r).contains("pong")
    };
    wait_for(
        "other HCP's gateway serves",
        Duration::from_secs(20),
        other_serves,
    );

    let progress = w.dir.path().join("flood.progress");
    python(
        &w.g,
        "flood",
        FLOOD_PY,
        &[
            "127.0.0.1",
            &EXPOSED_PORT.to_string(),
            &STREAMS.to_string(),
            "60",
            progress.to_str().unwrap(),
        ],
    );
    let pid = w.gateway.pid();
    let start = Instant::now();
    let mut peak = 0;
    // Bounded: 150 s, sampling every 200 ms.
    loop {
        assert!(
            w.gateway.exited().is_none(),
            "gateway died under the flood\n{}",
            w.logs()
        );
        peak = peak.max(vm_kib(pid, "VmHWM:"));
        assert!(
            peak <= RSS_BOUND_KIB,
            "gateway resident memory {peak} KiB > {RSS_BOUND_KIB} KiB after {:?} ({} streams opened)",
            start.elapsed(),
            std::fs::read_to_string(&progress).unwrap_or_default()
        );
        let p = std::fs::read_to_string(&progress).unwrap_or_default();
        if p.starts_with("done") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(150),
            "flood did not finish ({p})"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // Let the relays fill their buffers, then measure again.
    std::thread::sleep(Duration::from_secs(5));
    peak = peak.max(vm_kib(pid, "VmHWM:"));
    eprintln!(
        "flood: {} in {:?}; gateway peak RSS {peak} KiB (bound {RSS_BOUND_KIB} KiB)",
        std::fs::read_to_string(&progress).unwrap_or_default(),
        start.elapsed()
    );
    assert!(peak <= RSS_BOUND_KIB, "gateway peak RSS {peak} KiB");
    let refused = metric(
        &w.m,
        GW_HEALTH,
        "hcp_olm_tunnel_proxy_connections_total{proto=\"exposed\",result=\"over_limit\"}",
    );
    assert!(
        refused > 0,
        "refusals over the cap are counted\n{}",
        w.logs()
    );
    assert!(other_serves(), "the other HCP's gateway stopped serving");
    assert!(other.exited().is_none());
}

/// Hole 6(a): the proxy handshake has a total deadline (a client dripping one byte at a
/// time is cut at `handshake_timeout_seconds`), and a relayed stream on which nothing
/// moves is closed after `idle_timeout_seconds`.
#[test]
fn security_gateway_slow_handshake_and_idle_stream_are_cut() {
    let w = setup(
        serde_json::json!({"handshake_timeout_seconds": 2, "idle_timeout_seconds": 3}),
        serde_json::json!({}),
        0,
    );
    // Slowloris: one byte every 500 ms of a never-ending request head, for up to 12 s.
    let script = "trap '' PIPE; exec 3<>/dev/tcp/127.0.0.1/3128 || exit 1; start=$(date +%s%N); \
         for i in $(seq 1 24); do printf a >&3 2>/dev/null || break; sleep 0.5; done; \
         end=$(date +%s%N); echo $(( (end - start) / 1000000 ))";
    let out = w.m.output("bash", &["-c", script]).unwrap();
    let ms: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(u64::MAX);
    assert!(
        ms < 5_000,
        "a dripping CONNECT head was held open for {ms} ms (total handshake deadline 2 s)"
    );
    // Idle relay: CONNECT to the HCP catalog, read its greeting, then stay silent.
    let script = format!(
        "exec 3<>/dev/tcp/127.0.0.1/3128 || exit 1; \
         printf 'CONNECT cat.{HCP_NS}.svc:50051 HTTP/1.1\\r\\n\\r\\n' >&3; \
         start=$(date +%s%N); timeout 12 cat <&3 >/dev/null; rc=$?; end=$(date +%s%N); \
         echo $rc $(( (end - start) / 1000000 ))"
    );
    let out = w.m.output("bash", &["-c", &script]).unwrap();
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (rc, ms) = s.split_once(' ').unwrap_or(("?", "0"));
    let ms: u64 = ms.parse().unwrap_or(u64::MAX);
    assert_eq!(
        rc,
        "0",
        "idle relay not closed within 12 s ({s})\n{}",
        w.logs()
    );
    assert!(
        (2_500..8_000).contains(&ms),
        "idle relay closed after {ms} ms, expected ~3 s"
    );
}

/// Stand-in for forged WireGuard senders (named): `n` UDP sockets on 127.0.0.11.. each
/// send a well-sized *data* message (type 4, random session index) to the gateway every
/// 5 ms for `secs` seconds and throw away whatever comes back (the handshake offers).
const SPOOF_PY: &str = r#"
import os, socket, sys, time
target, port, n, secs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for i in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.%d" % (11 + i), 40000))
    s.setblocking(False)
    socks.append(s)
end = time.time() + secs
while time.time() < end:
    for s in socks:
        try:
            s.sendto(b"\x04\x00\x00\x00" + os.urandom(60), (target, port))
        except OSError:
            pass
        try:
            while True:
                s.recv(2048)
        except OSError:
            pass
    time.sleep(0.005)
"#;

/// Issue 35 item 8: a gateway without the agent's session (a restarted replica, or the
/// survivor of an HA pair) answers data for a session it does not hold with a handshake
/// offer. Eight forged senders flooding data from their own addresses must not keep every
/// offer for themselves: the agent's next keepalive (every 2 s here) has to win an offer, so
/// the session is back long before the agent's own dead-peer re-handshake (3 × 2 s + 5 s =
/// 11 s). The gateway is killed (-9) and started again while the forgers flood it.
#[test]
fn security_gateway_spoofed_senders_cannot_starve_the_agents_handshake_offer() {
    let mut w = setup(serde_json::json!({}), serde_json::json!({}), 0);
    let gw_conf = std::fs::read_dir(w.dir.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("gateway-"))
        })
        .expect("the gateway config");
    // The forgers stop on their own after 45 s (longer than the test waits).
    let _spoofers = python(
        &w.m,
        "spoofers",
        SPOOF_PY,
        &["127.0.0.1", "51820", "8", "45"],
    );
    std::thread::sleep(Duration::from_millis(500));
    w.gateway.kill();
    let mut cmd = w.m.command(GATEWAY);
    cmd.arg("--config").arg(&gw_conf);
    w.gateway = w.m.spawn("gateway-restarted", cmd).unwrap();
    let t0 = Instant::now();
    let handshake = wait_for(
        "a handshake on the restarted gateway",
        Duration::from_secs(30),
        || metric(&w.m, GW_HEALTH, "hcp_olm_tunnel_last_handshake_timestamp") > 0,
    );
    let offers = metric(&w.m, GW_HEALTH, "hcp_olm_tunnel_handshake_offers_total");
    eprintln!(
        "offer-fairness: session back {:.1} s after the restart (8 forged senders, 2 s keepalive; the agent's own re-handshake comes after 11 s); {offers} offers sent",
        handshake.as_secs_f64()
    );
    assert!(
        t0.elapsed() < Duration::from_secs(6),
        "the agent got its session back only after {:?}: forged senders held every handshake offer\n{}",
        t0.elapsed(),
        w.logs()
    );
}
