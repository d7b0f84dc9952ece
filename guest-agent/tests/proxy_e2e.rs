//! The unprivileged data path end to end, in network namespaces with real parts:
//! management namespace M (hcp-olm-gateway, a dnsmasq for management names, an `opm serve`
//! standing in for a control-plane catalog) and guest namespace G (hcp-olm-agent, `opm serve`
//! of a guest catalog, a dnsmasq answering guest `svc` names). A gRPC client (our CLI) in M
//! lists packages through the gateway's CONNECT proxy; the reverse direction goes through the
//! agent's exposed port; isolation and bad input are checked against live processes.
//!
//! Underlay 198.18.50.0/30 (M .1, G .2); guest "Services" 198.18.52.0/24 on G's lo;
//! management "Services" 198.18.51.0/24 on M's lo. All addresses exist only in the namespaces.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hcp_olm_e2e::netns::{Netns, NsProcess, connect};
use hcp_olm_guest_agent::tunnel::PrivateKey;

const GATEWAY: &str = env!("CARGO_BIN_EXE_hcp-olm-gateway");
const AGENT: &str = env!("CARGO_BIN_EXE_hcp-olm-agent");
/// The UDP relay with loss and delay, a test tool of the hcp-olm-testtools package.
fn impair() -> PathBuf {
    hcp_olm_e2e::tools::workspace_bin("hcp-olm-udp-impair", "hcp-olm-testtools")
        .unwrap_or_else(|e| panic!("{e}"))
}
const RELAY_PORT: u16 = 51900;
const DNSMASQ: &str = "/usr/sbin/dnsmasq";

const M_ADDR: &str = "198.18.50.1";
const G_ADDR: &str = "198.18.50.2";
const GUEST_CAT: &str = "198.18.52.10";
const GUEST_DNS: &str = "198.18.52.53";
const MGMT_CAT: &str = "198.18.51.10";
const HCP_NS: &str = "clusters-e2e";
const GUEST_NS: &str = "team-a";
const CONNECT_PROXY: &str = "127.0.0.1:3128";
const SOCKS_PROXY: &str = "127.0.0.1:1080";
const GW_HEALTH: &str = "127.0.0.1:9101";
const AGENT_HEALTH: &str = "127.0.0.1:9102";
const EXPOSED_PORT: u16 = 50061;
/// A guest service that pushes a large answer at once (see `bulk_push_...`).
const BULK_PORT: u16 = 50052;
/// The gateway's split DNS for pods' `dnsConfig`.
const GW_DNS: &str = "127.0.0.1:5355";

/// The CLI binary, built next to this test by `cargo test --workspace` (or
/// `cargo build -p hcp-olm-cli`).
fn cli() -> PathBuf {
    hcp_olm_e2e::tools::workspace_bin("hcp-olm", "hcp-olm-cli").unwrap_or_else(|e| panic!("{e}"))
}

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

/// A catalog directory holding only `packages` from the small fixture catalog.
fn catalog_subset(out: &Path, packages: &[&str]) {
    let src = hcp_olm_e2e::tools::fixtures_dir().join("catalogs/small");
    for p in packages {
        let to = out.join(p);
        std::fs::create_dir_all(&to).unwrap();
        for f in std::fs::read_dir(src.join(p)).unwrap().flatten() {
            std::os::unix::fs::symlink(f.path(), to.join(f.file_name())).unwrap();
        }
    }
}

fn opm(ns: &Netns, name: &str, dir: &Path, addr: &str) -> NsProcess {
    let opm = hcp_olm_e2e::tools::bin("opm").unwrap();
    let port = addr.rsplit_once(':').unwrap().1;
    let mut cmd = ns.command(opm);
    // opm binds every address; the namespace keeps it private.
    cmd.arg("serve")
        .arg(dir)
        .args(["-p", port, "--pprof-addr=", "-t", "/dev/null"])
        .env("GRPC_PROXY", "");
    ns.spawn(name, cmd).unwrap()
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
    ]);
    for (n, ip) in records {
        cmd.arg(format!("--host-record={n},{ip}"));
    }
    ns.spawn(name, cmd).unwrap()
}

/// `hcp-olm catalog packages` in `ns`; Ok(stdout) or Err(stderr).
fn packages(ns: &Netns, addr: &str, proxy: Option<&str>) -> Result<String, String> {
    packages_within(ns, addr, proxy, "5s")
}

fn packages_within(
    ns: &Netns,
    addr: &str,
    proxy: Option<&str>,
    timeout: &str,
) -> Result<String, String> {
    let mut cmd = ns.command(cli());
    cmd.args([
        "catalog",
        "--addr",
        addr,
        "--timeout",
        timeout,
        "-o",
        "json",
    ]);
    if let Some(p) = proxy {
        cmd.args(["--proxy", p]);
    }
    cmd.arg("packages").env_remove("HCP_OLM_CATALOG_PROXY");
    let out = cmd.output().unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// A plain HTTP/1.0 GET inside `ns` (bash's /dev/tcp; no curl needed): (status, body).
fn http_get(ns: &Netns, url: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (hostport, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let req = format!("GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n");
    let r = raw_exchange(ns, hostport, req.as_bytes());
    let r = String::from_utf8_lossy(&r).into_owned();
    let code = r
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = r
        .split_once("\r\n\r\n")
        .map(|x| x.1)
        .unwrap_or("")
        .to_string();
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

/// A raw TCP exchange inside `ns` (only bash and coreutils are assumed),
/// through a tiny inline client on /dev/tcp.
fn raw_exchange(ns: &Netns, addr: &str, input: &[u8]) -> Vec<u8> {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let dir = tempfile::tempdir().unwrap();
    let inp = dir.path().join("in");
    std::fs::write(&inp, input).unwrap();
    let script = format!(
        "exec 3<>/dev/tcp/{host}/{port} || exit 1; cat {} >&3 2>/dev/null; timeout 3 cat <&3",
        inp.display()
    );
    let out = ns.output("bash", &["-c", &script]).unwrap();
    out.stdout
}

struct World {
    m: Netns,
    g: Netns,
    dir: tempfile::TempDir,
    gw_conf: PathBuf,
    agent_conf: PathBuf,
    gateway: Option<NsProcess>,
    agent: Option<NsProcess>,
}

impl World {
    fn start_gateway(&mut self) {
        let mut cmd = self.m.command(GATEWAY);
        cmd.arg("--config").arg(&self.gw_conf);
        self.gateway = Some(self.m.spawn("gateway", cmd).unwrap());
    }

    fn start_agent(&mut self) {
        let mut cmd = self.g.command(AGENT);
        cmd.arg("--config").arg(&self.agent_conf);
        self.agent = Some(self.g.spawn("agent", cmd).unwrap());
    }

    fn logs(&self) -> String {
        format!(
            "--- gateway\n{}\n--- agent\n{}",
            self.gateway
                .as_ref()
                .map(|p| p.log_tail(40))
                .unwrap_or_default(),
            self.agent
                .as_ref()
                .map(|p| p.log_tail(40))
                .unwrap_or_default()
        )
    }
}

fn setup() -> World {
    setup_with(false)
}

/// `impaired`: the agent dials a relay in M that drops 5% and delays 50 ms each way.
fn setup_with(impaired: bool) -> World {
    let m = Netns::create("gwm").unwrap();
    let g = Netns::create("gwg").unwrap();
    connect(&m, &format!("{M_ADDR}/30"), &g, &format!("{G_ADDR}/30")).unwrap();
    for a in [GUEST_CAT, GUEST_DNS] {
        g.ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"])
            .unwrap();
    }
    m.ip(&["addr", "add", &format!("{MGMT_CAT}/32"), "dev", "lo"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw_key = PrivateKey::generate();
    let agent_key = PrivateKey::generate();
    let gw_key_file = dir.path().join("gw.key");
    let agent_key_file = dir.path().join("agent.key");
    std::fs::write(&gw_key_file, gw_key.to_base64()).unwrap();
    std::fs::write(&agent_key_file, agent_key.to_base64()).unwrap();
    let gw = serde_json::json!({
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
        "dns": {"local_upstreams": ["127.0.0.1:5354"], "listen": GW_DNS},
        "allowed_services": [
            {"namespace": GUEST_NS, "name": "*", "port": 50051},
            {"namespace": GUEST_NS, "name": "bulk", "port": BULK_PORT},
            // Allowed here but not by the agent's ports: the agent must refuse it.
            {"namespace": GUEST_NS, "name": "dns", "port": 53}
        ],
        "allowed_local_services": [{"namespace": HCP_NS, "name": "cat", "port": 50051}],
        "exposed_services": [
            {"name": "mgmt-catalog", "listen_port": EXPOSED_PORT, "target": format!("{MGMT_CAT}:50051")}
        ],
        "drain_timeout_seconds": 3,
        "key_reload_seconds": 1
    });
    let agent = serde_json::json!({
        "gateway_endpoint": if impaired {
            format!("{M_ADDR}:{RELAY_PORT}")
        } else {
            format!("{M_ADDR}:51820")
        },
        "gateway_public_key": gw_key.public_key().to_string(),
        "private_key_file": agent_key_file,
        "tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "gateway_tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "persistent_keepalive_seconds": 2,
        "allowed_services": [
            {"namespace": "*", "name": "*", "port": 50051},
            {"namespace": "*", "name": "bulk", "port": BULK_PORT}
        ],
        "allowed_cidrs": ["198.18.52.0/24"],
        "guest_dns": [GUEST_DNS],
        "exposed_services": [
            {"name": "mgmt-catalog", "listen_port": EXPOSED_PORT, "target": "ignored-by-agent:1"}
        ],
        "exposed_listen_address": "127.0.0.1",
        "health_listen": AGENT_HEALTH,
        "drain_timeout_seconds": 3,
        "key_reload_seconds": 1
    });
    let gw_conf = dir.path().join("gateway.json");
    let agent_conf = dir.path().join("agent.json");
    std::fs::write(&gw_conf, serde_json::to_vec_pretty(&gw).unwrap()).unwrap();
    std::fs::write(&agent_conf, serde_json::to_vec_pretty(&agent).unwrap()).unwrap();

    let guest_cat = dir.path().join("guest-catalog");
    let mgmt_cat = dir.path().join("mgmt-catalog");
    catalog_subset(
        &guest_cat,
        &["eda-openshift-operator", "nvidia-network-operator"],
    );
    catalog_subset(
        &mgmt_cat,
        &["operator-certification-operator", "tigera-operator"],
    );
    opm(&g, "opm-guest", &guest_cat, "0.0.0.0:50051");
    opm(&m, "opm-mgmt", &mgmt_cat, "0.0.0.0:50051");
    let cat = format!("cat.{GUEST_NS}.svc.cluster.local");
    let dns_name = format!("dns.{GUEST_NS}.svc.cluster.local");
    dnsmasq(
        &g,
        "dnsmasq-guest",
        GUEST_DNS,
        53,
        &[
            (&cat, GUEST_CAT),
            (&dns_name, GUEST_DNS),
            (&format!("bulk.{GUEST_NS}.svc.cluster.local"), GUEST_CAT),
        ],
    );
    let local_cat = format!("cat.{HCP_NS}.svc.cluster.local");
    // Management DNS also has a record for the guest name with a wrong address: the split
    // must never ask it about guest names.
    dnsmasq(
        &m,
        "dnsmasq-mgmt",
        "127.0.0.1",
        5354,
        &[
            (&local_cat, MGMT_CAT),
            (&cat, "198.18.51.99"),
            (
                &format!("ghost.{GUEST_NS}.svc.cluster.local"),
                "198.18.51.98",
            ),
        ],
    );
    if impaired {
        let mut cmd = m.command(impair());
        cmd.args([
            "--listen",
            &format!("{M_ADDR}:{RELAY_PORT}"),
            "--server",
            "127.0.0.1:51820",
            "--loss-percent",
            "5",
            "--delay-ms",
            "50",
            "--duration-secs",
            "300",
        ]);
        m.spawn("impair", cmd).unwrap();
    }
    let mut w = World {
        m,
        g,
        dir,
        gw_conf,
        agent_conf,
        gateway: None,
        agent: None,
    };
    w.start_gateway();
    w.start_agent();
    // Both catalogs up (directly, inside their own namespaces).
    let mut last = String::new();
    wait_for("guest opm", Duration::from_secs(60), || {
        packages(&w.g, &format!("{GUEST_CAT}:50051"), None)
            .map_err(|e| last = e)
            .is_ok()
    });
    wait_for("management opm", Duration::from_secs(60), || {
        packages(&w.m, &format!("{MGMT_CAT}:50051"), None)
            .map_err(|e| last = e)
            .is_ok()
    });
    drop(last);
    w
}

fn ready(ns: &Netns, health: &str) -> bool {
    http_get(ns, &format!("http://{health}/readyz")).0 == 200
}

#[test]
fn forward_reverse_isolation_and_bad_input() {
    let w = setup();
    let t = wait_for("agent ready (handshake)", Duration::from_secs(20), || {
        ready(&w.g, AGENT_HEALTH)
    });
    eprintln!("agent ready after {t:?}");
    wait_for("gateway ready", Duration::from_secs(10), || {
        ready(&w.m, GW_HEALTH)
    });
    assert_eq!(
        http_get(&w.m, &format!("http://{GW_HEALTH}/healthz")).0,
        200
    );

    // Forward: a guest catalog by its guest Service name, through the CONNECT proxy.
    let guest_name = format!("cat.{GUEST_NS}.svc.cluster.local:50051");
    let start = Instant::now();
    let out = packages(&w.m, &guest_name, Some(CONNECT_PROXY))
        .unwrap_or_else(|e| panic!("forward via CONNECT: {e}\n{}", w.logs()));
    eprintln!("forward packages via CONNECT in {:?}", start.elapsed());
    assert!(out.contains("nvidia-network-operator"), "{out}");
    assert!(!out.contains("tigera-operator"), "{out}");
    // Short form `<name>.<ns>.svc` is qualified with the cluster domain.
    let out = packages(
        &w.m,
        &format!("cat.{GUEST_NS}.svc:50051"),
        Some(CONNECT_PROXY),
    )
    .unwrap_or_else(|e| panic!("short name: {e}"));
    assert!(out.contains("eda-k8s-operator"), "{out}");

    // The same Service name in the HCP namespace resolves locally (management catalog).
    let out = packages(
        &w.m,
        &format!("cat.{HCP_NS}.svc.cluster.local:50051"),
        Some(CONNECT_PROXY),
    )
    .unwrap_or_else(|e| panic!("local name: {e}\n{}", w.logs()));
    assert!(out.contains("tigera-operator"), "{out}");
    assert!(!out.contains("nvidia-network-operator"), "{out}");

    // Reverse: a guest client reaches the management catalog through the agent's port.
    let out = packages(&w.g, &format!("127.0.0.1:{EXPOSED_PORT}"), None)
        .unwrap_or_else(|e| panic!("reverse: {e}\n{}", w.logs()));
    assert!(out.contains("operator-certification-operator"), "{out}");

    // SOCKS5 with a domain name, to the guest catalog.
    let mut req = vec![5, 1, 0, 5, 1, 0, 3, guest_name.len() as u8 - 6];
    req.extend_from_slice(guest_name.trim_end_matches(":50051").as_bytes());
    req.extend_from_slice(&50051u16.to_be_bytes());
    let reply = raw_exchange(&w.m, SOCKS_PROXY, &req);
    assert!(reply.len() >= 12, "{reply:?}");
    assert_eq!(&reply[..2], &[5, 0]);
    assert_eq!(
        reply[3], 0,
        "SOCKS CONNECT to an allowed guest service: {reply:?}"
    );

    // Isolation, CONNECT: wrong port, other namespace, IP literal → 502, the answer for a
    // name that does not resolve (refusals are told apart only in metrics and logs).
    let denied_before = metric(
        &w.m,
        GW_HEALTH,
        "hcp_olm_tunnel_proxy_connections_total{proto=\"connect\",result=\"denied\"}",
    );
    for target in [
        format!("cat.{GUEST_NS}.svc.cluster.local:22"),
        "cat.other-ns.svc.cluster.local:50051".to_string(),
        format!("{GUEST_CAT}:50051"),
        "[fd00::1]:50051".to_string(),
    ] {
        let r = raw_exchange(
            &w.m,
            CONNECT_PROXY,
            format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
        );
        let r = String::from_utf8_lossy(&r);
        assert!(r.starts_with("HTTP/1.1 502"), "{target}: {r}");
    }
    let denied_after = metric(
        &w.m,
        GW_HEALTH,
        "hcp_olm_tunnel_proxy_connections_total{proto=\"connect\",result=\"denied\"}",
    );
    assert_eq!(denied_after - denied_before, 4);
    // Isolation, SOCKS: IPv4 and IPv6 literals → reply 0x04 (as for a name that does not
    // resolve).
    let mut v6 = vec![5, 1, 0, 5, 1, 0, 4];
    v6.extend_from_slice(&"fd00::1".parse::<std::net::Ipv6Addr>().unwrap().octets());
    v6.extend_from_slice(&50051u16.to_be_bytes());
    for req in [vec![5, 1, 0, 5, 1, 0, 1, 198, 18, 52, 10, 0xc3, 0x83], v6] {
        let r = raw_exchange(&w.m, SOCKS_PROXY, &req);
        assert_eq!(r.get(..4), Some(&[5, 0, 5, 4][..]), "{r:?}");
    }
    // A refused guest target (allowed, nothing listening: the bulk port before the bulk
    // leg) is a refusal at the proxy, not `200` and then an empty stream: the agent dials the
    // guest first and only then completes the tunnel's TCP handshake.
    let bulk = format!("bulk.{GUEST_NS}.svc.cluster.local:{BULK_PORT}");
    let r = raw_exchange(
        &w.m,
        CONNECT_PROXY,
        format!("CONNECT {bulk} HTTP/1.1\r\nHost: {bulk}\r\n\r\n").as_bytes(),
    );
    let r = String::from_utf8_lossy(&r);
    assert!(
        r.starts_with("HTTP/1.1 502"),
        "CONNECT to a refused guest target: {r}"
    );
    let mut req = vec![5, 1, 0, 5, 1, 0, 3];
    let host = format!("bulk.{GUEST_NS}.svc.cluster.local");
    req.push(host.len() as u8);
    req.extend_from_slice(host.as_bytes());
    req.extend_from_slice(&BULK_PORT.to_be_bytes());
    let r = raw_exchange(&w.m, SOCKS_PROXY, &req);
    assert_eq!(
        r.get(..4),
        Some(&[5, 0, 5, 5][..]),
        "SOCKS to a refused guest target: connection refused (0x05): {r:?}"
    );

    // Isolation at the agent: the gateway allows dns.<ns>:53, the agent's ports do not.
    let refused_before = metric(&w.g, AGENT_HEALTH, "hcp_olm_tunnel_inbound_refused_total");
    let r = raw_exchange(
        &w.m,
        CONNECT_PROXY,
        format!("CONNECT dns.{GUEST_NS}.svc.cluster.local:53 HTTP/1.1\r\n\r\n").as_bytes(),
    );
    let r = String::from_utf8_lossy(&r);
    assert!(r.starts_with("HTTP/1.1 502"), "{r}");
    std::thread::sleep(Duration::from_millis(1200)); // metrics refresh every second
    assert!(metric(&w.g, AGENT_HEALTH, "hcp_olm_tunnel_inbound_refused_total") > refused_before);

    // Bad input: garbage, oversized, wrong method → error replies, counted; still serving.
    let bad_before = metric(
        &w.m,
        GW_HEALTH,
        "hcp_olm_tunnel_proxy_connections_total{proto=\"connect\",result=\"bad_request\"}",
    );
    let r = raw_exchange(&w.m, CONNECT_PROXY, b"\x16\x03\x01garbage\r\n\r\n");
    assert!(
        String::from_utf8_lossy(&r).starts_with("HTTP/1.1 400"),
        "{r:?}"
    );
    let r = raw_exchange(&w.m, CONNECT_PROXY, &vec![b'A'; 20_000]);
    assert!(
        String::from_utf8_lossy(&r).starts_with("HTTP/1.1 431"),
        "{r:?}"
    );
    let r = raw_exchange(&w.m, CONNECT_PROXY, b"GET http://x/ HTTP/1.1\r\n\r\n");
    assert!(
        String::from_utf8_lossy(&r).starts_with("HTTP/1.1 405"),
        "{r:?}"
    );
    let bad_after = metric(
        &w.m,
        GW_HEALTH,
        "hcp_olm_tunnel_proxy_connections_total{proto=\"connect\",result=\"bad_request\"}",
    );
    assert_eq!(bad_after - bad_before, 3);
    let r = raw_exchange(&w.m, SOCKS_PROXY, &[4, 1, 0, 80, 1, 2, 3, 4, 0]);
    assert_eq!(r, vec![5, 0xff]);
    let r = raw_exchange(&w.m, SOCKS_PROXY, &[5, 1, 2]);
    assert_eq!(r, vec![5, 0xff], "no acceptable method");
    let r = raw_exchange(&w.m, SOCKS_PROXY, &[5, 1, 0, 5, 2, 0, 1, 1, 2, 3, 4, 0, 80]);
    assert_eq!(
        r.get(..4),
        Some(&[5, 0, 5, 7][..]),
        "BIND is not supported: {r:?}"
    );
    assert!(
        metric(
            &w.m,
            GW_HEALTH,
            "hcp_olm_tunnel_proxy_connections_total{proto=\"socks\",result=\"bad_request\"}"
        ) >= 3
    );
    // Still working after all that.
    packages(&w.m, &guest_name, Some(CONNECT_PROXY))
        .unwrap_or_else(|e| panic!("after bad input: {e}\n{}", w.logs()));

    // Metrics: last handshake, bytes, DNS queries.
    let (_, m) = http_get(&w.m, &format!("http://{GW_HEALTH}/metrics"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let handshake = metric(
        &w.m,
        GW_HEALTH,
        "hcp_olm_tunnel_last_handshake_timestamp_seconds",
    );
    assert!(
        handshake <= now && now - handshake < 600,
        "last handshake {handshake}, now {now}: {m}"
    );
    assert!(m.contains("hcp_olm_build_info{version="), "{m}");
    assert!(
        metric(&w.m, GW_HEALTH, "hcp_olm_tunnel_payload_bytes_total") > 0,
        "{m}"
    );
    assert!(
        m.contains("owner=\"guest\""),
        "guest DNS queries counted: {m}"
    );
    assert!(metric(&w.g, AGENT_HEALTH, "hcp_olm_agent_dns_queries_total") > 0);

    // No key material in the logs.
    let gw_key = std::fs::read_to_string(w.dir.path().join("gw.key")).unwrap();
    let agent_key = std::fs::read_to_string(w.dir.path().join("agent.key")).unwrap();
    let logs = std::fs::read_to_string(w.gateway.as_ref().unwrap().log_path()).unwrap()
        + &std::fs::read_to_string(w.agent.as_ref().unwrap().log_path()).unwrap();
    assert!(!logs.contains(gw_key.trim()) && !logs.contains(agent_key.trim()));
}

fn sigterm(p: &NsProcess) {
    let st = std::process::Command::new("kill")
        .args(["-TERM", &p.pid().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

fn wait_exit(p: &NsProcess, limit: Duration) -> std::process::ExitStatus {
    let mut st = None;
    wait_for(&format!("{} to exit", p.name()), limit, || {
        st = p.exited();
        st.is_some()
    });
    st.unwrap()
}

/// kill -9 the agent, then the gateway: catalog calls through the proxy work again within
/// the stated bounds (agent restart: 15 s; gateway restart: 25 s, dominated by the agent's
/// dead-peer timeout of 3 × keepalive + 5 s = 11 s, plus up to one REKEY_TIMEOUT of 5 s and
/// the CLI's 5 s call timeout). Then
/// SIGTERM drains both cleanly.
#[test]
fn kill_restart_recovery_and_sigterm() {
    let mut w = setup();
    wait_for("agent ready", Duration::from_secs(20), || {
        ready(&w.g, AGENT_HEALTH)
    });
    let guest = format!("cat.{GUEST_NS}.svc.cluster.local:50051");
    packages(&w.m, &guest, Some(CONNECT_PROXY)).unwrap_or_else(|e| panic!("{e}\n{}", w.logs()));

    w.agent.take().unwrap().kill();
    w.start_agent();
    let t = wait_for("calls after agent kill -9", Duration::from_secs(15), || {
        packages(&w.m, &guest, Some(CONNECT_PROXY)).is_ok()
    });
    eprintln!("recovered {t:?} after agent kill -9 + restart");

    w.gateway.take().unwrap().kill();
    w.start_gateway();
    let t = wait_for(
        "calls after gateway kill -9",
        Duration::from_secs(25),
        || packages(&w.m, &guest, Some(CONNECT_PROXY)).is_ok(),
    );
    eprintln!("recovered {t:?} after gateway kill -9 + restart");
    // Reverse direction too.
    packages(&w.g, &format!("127.0.0.1:{EXPOSED_PORT}"), None)
        .unwrap_or_else(|e| panic!("reverse after restarts: {e}\n{}", w.logs()));

    for p in [w.agent.take().unwrap(), w.gateway.take().unwrap()] {
        sigterm(&p);
        let st = wait_exit(&p, Duration::from_secs(8));
        assert!(st.success(), "{} exit {st:?}\n{}", p.name(), p.log_tail(20));
        assert!(p.log_tail(5).contains("drained"), "{}", p.log_tail(20));
    }
}

/// Loads an nft ruleset in `ns`.
fn nft(ns: &Netns, rules: String) {
    let mut cmd = ns.command("nft");
    cmd.args(["-f", "-"]).stdin(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), rules.as_bytes()).unwrap();
    assert!(child.wait().unwrap().success(), "nft: {rules}");
}

/// Relocation (issue 19): the agent dials the gateway by name; the gateway's published
/// address changes (the old one stops answering, the name now resolves to a new one) and the
/// agent follows within a bound, without a restart. It resolved the name once at start-up
/// before, and kept sending to the old address.
#[test]
fn gateway_address_change_is_followed() {
    const NEW_ADDR: &str = "198.18.53.1";
    const NAME: &str = "gateway.relocate.test";
    let mut w = setup();
    w.g.set_hosts(&format!("127.0.0.1 localhost\n{M_ADDR} {NAME}\n"))
        .unwrap();
    let mut agent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&w.agent_conf).unwrap()).unwrap();
    agent["gateway_endpoint"] = serde_json::json!(format!("{NAME}:51820"));
    std::fs::write(&w.agent_conf, serde_json::to_vec_pretty(&agent).unwrap()).unwrap();
    w.agent.take().unwrap().kill();
    w.start_agent();
    wait_for("agent ready by name", Duration::from_secs(20), || {
        ready(&w.g, AGENT_HEALTH)
    });
    let guest = format!("cat.{GUEST_NS}.svc.cluster.local:50051");
    packages(&w.m, &guest, Some(CONNECT_PROXY)).unwrap_or_else(|e| panic!("{e}\n{}", w.logs()));
    // The gateway moves: its published address is now NEW_ADDR (a NAT in M in front of it,
    // as a new LoadBalancer IP would be, so replies come from NEW_ADDR), the old address
    // carries nothing in either direction, and the name says so.
    nft(
        &w.m,
        format!(
            "table ip relocate {{\n chain pre {{\n  type nat hook prerouting priority -100;\n  ip daddr {NEW_ADDR} udp dport 51820 dnat to {M_ADDR}\n }}\n}}\n"
        ),
    );
    w.g.ip(&["route", "add", &format!("{NEW_ADDR}/32"), "via", M_ADDR])
        .unwrap();
    nft(
        &w.g,
        format!(
            "table inet relocate {{\n chain out {{\n  type filter hook output priority 0;\n  ip daddr {M_ADDR} udp dport 51820 drop\n }}\n chain in {{\n  type filter hook input priority 0;\n  ip saddr {M_ADDR} udp sport 51820 drop\n }}\n}}\n"
        ),
    );
    w.g.set_hosts(&format!("127.0.0.1 localhost\n{NEW_ADDR} {NAME}\n"))
        .unwrap();
    let t = wait_for(
        "calls after the gateway's address changed",
        Duration::from_secs(45),
        || packages(&w.m, &guest, Some(CONNECT_PROXY)).is_ok(),
    );
    eprintln!("agent followed the gateway's new address in {t:?}");
    assert!(
        t < Duration::from_secs(30),
        "followed only after {t:?} (bound 30 s)\n{}",
        w.logs()
    );
}

/// 5% loss and 50 ms delay in each direction on the tunnel's UDP path (a relay of the test's
/// own): catalog calls in both directions still succeed.
#[test]
fn lossy_delayed_underlay() {
    let w = setup_with(true);
    wait_for(
        "agent ready through the relay",
        Duration::from_secs(30),
        || ready(&w.g, AGENT_HEALTH),
    );
    let guest = format!("cat.{GUEST_NS}.svc.cluster.local:50051");
    let mut times = Vec::new();
    for i in 0..5 {
        let start = Instant::now();
        let out = packages_within(&w.m, &guest, Some(CONNECT_PROXY), "30s")
            .unwrap_or_else(|e| panic!("call {i} over the lossy path: {e}\n{}", w.logs()));
        assert!(out.contains("nvidia-network-operator"), "{out}");
        times.push(start.elapsed());
    }
    let out = packages_within(&w.g, &format!("127.0.0.1:{EXPOSED_PORT}"), None, "30s")
        .unwrap_or_else(|e| panic!("reverse over the lossy path: {e}\n{}", w.logs()));
    assert!(out.contains("tigera-operator"), "{out}");
    eprintln!("catalog calls over 5% loss / 50 ms delay: {times:?}");
}

/// A DNS client (Python's standard library only) run inside a namespace: one A query over
/// UDP or TCP; prints `RCODE addr...`, or `garbage-ok` after sending junk and then a
/// good query.
const DNS_CLIENT: &str = r#"
import socket, struct, sys, random
host, port, proto, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def query(name):
    q = struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0)
    for l in name.rstrip(".").split("."):
        q += bytes([len(l)]) + l.encode()
    return q + b"\0" + struct.pack(">HH", 1, 1)
def ask(q, proto):
    if proto == "tcp":
        s = socket.create_connection((host, port), timeout=5)
        s.sendall(struct.pack(">H", len(q)) + q)
        n = struct.unpack(">H", s.recv(2))[0]
        r = b""
        while len(r) < n:
            r += s.recv(n - len(r))
        return r
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(5)
    s.sendto(q, (host, port))
    return s.recv(4096)
if proto == "garbage":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for junk in [b"", b"\x00", b"\xff" * 11, b"\x12\x34\x01\x00\x00\x01" + b"\xc0" * 40]:
        s.sendto(junk, (host, port))
    proto = "udp"
r = ask(query(name), proto)
rcode = r[3] & 0xF
an = struct.unpack(">H", r[6:8])[0]
i = 12
while r[i] != 0:
    i += r[i] + 1
i += 5
addrs = []
for _ in range(an):
    if r[i] & 0xC0 == 0xC0:
        i += 2
    else:
        while r[i] != 0:
            i += r[i] + 1
        i += 1
    t, _, _, rdlen = struct.unpack(">HHIH", r[i:i + 10])
    i += 10
    if t == 1:
        addrs.append(socket.inet_ntoa(r[i:i + rdlen]))
    i += rdlen
print(["NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED"][rcode] if rcode < 6 else rcode, *addrs)
"#;

fn dns_ask(ns: &Netns, proto: &str, name: &str) -> String {
    let (host, port) = GW_DNS.rsplit_once(':').unwrap();
    let out = ns
        .output("python3", &["-c", DNS_CLIENT, host, port, proto, name])
        .unwrap();
    assert!(
        out.status.success(),
        "dns client: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The gateway's split DNS served on `dns.listen` (UDP and TCP), as pods pointed at it by
/// `dnsConfig` see it: guest `svc` names are answered by the guest's DNS across the
/// tunnel (management DNS holds a decoy for the same name), HCP-namespace names locally,
/// and the guest's NXDOMAIN is final even for a name management DNS knows. Garbage on the
/// port is dropped and the next query is answered.
#[test]
fn gateway_serves_split_dns_to_pods() {
    let w = setup();
    wait_for("agent ready", Duration::from_secs(20), || {
        ready(&w.g, AGENT_HEALTH)
    });
    let guest_name = format!("cat.{GUEST_NS}.svc.cluster.local");
    let mut last = String::new();
    wait_for(
        "guest name over the tunnel",
        Duration::from_secs(20),
        || {
            last = dns_ask(&w.m, "udp", &guest_name);
            last == format!("NOERROR {GUEST_CAT}")
        },
    );
    assert_eq!(
        dns_ask(&w.m, "tcp", &guest_name),
        format!("NOERROR {GUEST_CAT}")
    );
    assert_eq!(
        dns_ask(&w.m, "udp", &format!("cat.{HCP_NS}.svc.cluster.local")),
        format!("NOERROR {MGMT_CAT}")
    );
    assert_eq!(
        dns_ask(&w.m, "udp", &format!("ghost.{GUEST_NS}.svc.cluster.local")),
        "NXDOMAIN",
        "the guest owns its svc names: its NXDOMAIN must not fall through\n{}",
        w.logs()
    );
    assert_eq!(
        dns_ask(&w.m, "garbage", &guest_name),
        format!("NOERROR {GUEST_CAT}")
    );
    assert!(
        metric(&w.m, GW_HEALTH, "hcp_olm_dns_malformed_total") >= 1,
        "{}",
        w.logs()
    );
    assert!(metric(&w.m, GW_HEALTH, "hcp_olm_dns_queries_total") >= 5);
}

/// Rewrites a JSON config the way a Secret volume changes: a new file renamed over the old.
fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

fn write_key(dir: &Path, name: &str, k: &PrivateKey) -> String {
    let f = dir.join(name);
    std::fs::write(&f, k.to_base64()).unwrap();
    f.display().to_string()
}

/// Key rotation as the controller does it, first of the agent's key, then of the gateway's:
/// (1) the gateway accepts the old and the new key, (2) the agent moves to the new one, (3)
/// the old one is dropped. Meanwhile one catalog connection through the CONNECT proxy calls
/// the guest catalog every 50 ms: no call fails, the connection is never re-opened, and
/// the slowest call is reported. A key file that does not parse is reported and changes
/// nothing.
#[test]
fn key_rotation_keeps_established_catalog_streams() {
    let w = setup();
    wait_for("agent ready", Duration::from_secs(20), || {
        ready(&w.g, AGENT_HEALTH)
    });
    let guest = format!("cat.{GUEST_NS}.svc.cluster.local:50051");
    packages(&w.m, &guest, Some(CONNECT_PROXY)).unwrap_or_else(|e| panic!("{e}\n{}", w.logs()));
    let dir = w.dir.path();
    let gw_cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&w.gw_conf).unwrap()).unwrap();
    let old_gw_key_file = gw_cfg["private_key_file"].as_str().unwrap().to_string();
    let old_agent_pub = gw_cfg["agent_public_key"].as_str().unwrap().to_string();
    let (agent2, gw2) = (PrivateKey::generate(), PrivateKey::generate());
    let agent2_file = write_key(dir, "agent2.key", &agent2);
    let gw2_file = write_key(dir, "gw2.key", &gw2);

    let mut probe =
        w.m.command(cli())
            .args([
                "catalog",
                "--addr",
                &guest,
                "--proxy",
                CONNECT_PROXY,
                "--timeout",
                "5s",
                "-o",
                "json",
                "probe",
                "--count",
                "300",
                "--interval",
                "50ms",
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
    let connects = |w: &World| {
        metric(
            &w.m,
            GW_HEALTH,
            "hcp_olm_tunnel_proxy_connections_total{proto=\"connect\",result=\"ok\"}",
        )
    };
    let reloads = |ns: &Netns, h: &str| {
        metric(
            ns,
            h,
            "hcp_olm_tunnel_key_reloads_total{result=\"applied\"}",
        )
    };
    let switches = |w: &World| metric(&w.m, GW_HEALTH, "hcp_olm_tunnel_key_switches_total");
    let rekeys = |w: &World| metric(&w.g, AGENT_HEALTH, "hcp_olm_tunnel_rekeys_total");
    std::thread::sleep(Duration::from_secs(2));
    let connects_before = connects(&w);
    let limit = Duration::from_secs(10);

    // The agent's key.
    edit_json(&w.gw_conf, |v| {
        v["agent_public_key"] = agent2.public_key().to_string().into();
        v["previous_agent_public_keys"] = serde_json::json!([old_agent_pub]);
    });
    wait_for("gateway accepts the new agent key", limit, || {
        reloads(&w.m, GW_HEALTH) >= 1
    });
    edit_json(&w.agent_conf, |v| {
        v["private_key_file"] = agent2_file.clone().into()
    });
    wait_for("agent rekeyed", limit, || rekeys(&w) >= 1);
    wait_for("gateway switched to the new pair", limit, || {
        switches(&w) >= 1
    });
    edit_json(&w.gw_conf, |v| {
        v.as_object_mut()
            .unwrap()
            .remove("previous_agent_public_keys");
    });
    wait_for("old agent key dropped", limit, || {
        reloads(&w.m, GW_HEALTH) >= 2
    });

    // The gateway's key.
    edit_json(&w.gw_conf, |v| {
        v["private_key_file"] = gw2_file.clone().into();
        v["previous_private_key_files"] = serde_json::json!([old_gw_key_file]);
    });
    wait_for("gateway has its new key", limit, || {
        reloads(&w.m, GW_HEALTH) >= 3
    });
    edit_json(&w.agent_conf, |v| {
        v["gateway_public_key"] = gw2.public_key().to_string().into();
    });
    wait_for("agent rekeyed to the new gateway key", limit, || {
        rekeys(&w) >= 2
    });
    wait_for("gateway switched again", limit, || switches(&w) >= 2);
    edit_json(&w.gw_conf, |v| {
        v.as_object_mut()
            .unwrap()
            .remove("previous_private_key_files");
    });
    wait_for("old gateway key dropped", limit, || {
        reloads(&w.m, GW_HEALTH) >= 4
    });
    assert!(
        probe.try_wait().unwrap().is_none(),
        "the probe ended before the rotation did; lengthen it"
    );

    // Bad input: a key file that does not parse is reported; the keys in use stay.
    std::fs::write(dir.join("broken.key"), "not a key").unwrap();
    edit_json(&w.gw_conf, |v| {
        v["previous_private_key_files"] = serde_json::json!([dir.join("broken.key")]);
    });
    wait_for("broken key file reported", limit, || {
        metric(
            &w.m,
            GW_HEALTH,
            "hcp_olm_tunnel_key_reloads_total{result=\"error\"}",
        ) >= 1
    });
    assert!(
        w.gateway
            .as_ref()
            .unwrap()
            .log_tail(50)
            .contains("previous_private_key_files[0]"),
        "{}",
        w.logs()
    );

    let out = wait_output(&mut probe, Duration::from_secs(60));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "probe failed: {stdout}{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.logs()
    );
    let rows: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let max_ms = rows[0]["max_ms"].as_f64().unwrap();
    eprintln!(
        "key rotation under load: 300 calls, 0 failed, p50 {} ms, p99 {} ms, slowest {max_ms} ms",
        rows[0]["p50_ms"], rows[0]["p99_ms"]
    );
    assert_eq!(rows[0]["failures"], 0, "{stdout}");
    assert_eq!(
        connects(&w),
        connects_before,
        "the catalog connection was re-opened during the rotation\n{}",
        w.logs()
    );
    // A handshake on this link takes milliseconds; allow generous scheduling slack.
    assert!(max_ms < 1000.0, "slowest call {max_ms} ms\n{}", w.logs());
    // Still working after all of it, in both directions.
    packages(&w.m, &guest, Some(CONNECT_PROXY)).unwrap_or_else(|e| panic!("{e}\n{}", w.logs()));
    packages(&w.g, &format!("127.0.0.1:{EXPOSED_PORT}"), None)
        .unwrap_or_else(|e| panic!("reverse after rotation: {e}\n{}", w.logs()));
}

/// Waits for a child with a bound; kills it when the bound passes.
fn wait_output(child: &mut std::process::Child, limit: Duration) -> std::process::Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > limit {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = std::process::Output {
        status: child.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    use std::io::Read;
    if let Some(mut s) = child.stdout.take() {
        let _ = s.read_to_end(&mut out.stdout);
    }
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_end(&mut out.stderr);
    }
    out
}

/// Config errors exit 64 and name the field.
#[test]
fn config_errors_exit_64_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let key = PrivateKey::generate();
    let base_gw = serde_json::json!({
        "listen_port": 0,
        "private_key": key.to_base64(),
        "agent_public_key": key.public_key().to_string(),
        "tunnel_address": "100.127.255.1/30",
        "agent_tunnel_address": "100.127.255.2/30",
        "guest_cidrs": ["not-a-cidr"],
        "connect_listen": "127.0.0.1:0",
        "health_listen": "127.0.0.1:0",
        "dns": {"local_upstreams": ["127.0.0.1"]},
        "allowed_services": [],
        "exposed_services": []
    });
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (GATEWAY, base_gw.clone(), "guest_cidrs[0]"),
        (
            GATEWAY,
            {
                let mut v = base_gw.clone();
                v["guest_cidrs"] = serde_json::json!([]);
                v["agent_public_key"] = serde_json::json!("short");
                v
            },
            "agent_public_key",
        ),
        (
            GATEWAY,
            {
                let mut v = base_gw.clone();
                v["guest_cidrs"] = serde_json::json!([]);
                v["previous_private_key_files"] = serde_json::json!(["/nonexistent/old-key"]);
                v
            },
            "previous_private_key_files[0]",
        ),
        (
            GATEWAY,
            {
                let mut v = base_gw.clone();
                v["guest_cidrs"] = serde_json::json!([]);
                v["previous_agent_public_keys"] = serde_json::json!([key.to_base64(), "x"]);
                v
            },
            "previous_agent_public_keys[1]",
        ),
        (
            AGENT,
            serde_json::json!({
                "gateway_endpoint": null,
                "gateway_public_key": key.public_key().to_string(),
                "private_key": key.to_base64(),
                "tunnel_address": "100.127.255.2/30",
                "gateway_tunnel_address": "100.127.255.1/30",
                "persistent_keepalive_seconds": 25,
                "allowed_services": [],
                "exposed_services": []
            }),
            "gateway_endpoint",
        ),
        (
            AGENT,
            serde_json::json!({"gateway_public_key": 1}),
            "gateway_public_key",
        ),
        (
            GATEWAY,
            {
                let mut v = base_gw.clone();
                v["guest_cidrs"] = serde_json::json!([]);
                v["allowed_local_services"] =
                    serde_json::json!([{"namespace": "*", "name": "cat", "port": 50051}]);
                v
            },
            "allowed_local_services[0].namespace",
        ),
        (
            GATEWAY,
            {
                let mut v = base_gw.clone();
                v["guest_cidrs"] = serde_json::json!([]);
                v["max_connections"] = serde_json::json!(0);
                v
            },
            "max_connections",
        ),
        (
            AGENT,
            serde_json::json!({
                "gateway_endpoint": "127.0.0.1:51820",
                "gateway_public_key": key.public_key().to_string(),
                "private_key": key.to_base64(),
                "tunnel_address": "100.127.255.2/30",
                "gateway_tunnel_address": "100.127.255.1/30",
                "persistent_keepalive_seconds": 25,
                "allowed_services": [],
                "exposed_services": [],
                "idle_timeout_seconds": 0
            }),
            "idle_timeout_seconds",
        ),
    ];
    // Issue 19, bad input: a link-local or unspecified gateway endpoint, a /0 guest range.
    let base_agent = serde_json::json!({
        "gateway_endpoint": "127.0.0.1:51820",
        "gateway_public_key": key.public_key().to_string(),
        "private_key": key.to_base64(),
        "tunnel_address": "100.127.255.2/30",
        "gateway_tunnel_address": "100.127.255.1/30",
        "persistent_keepalive_seconds": 25,
        "allowed_services": [],
        "exposed_services": []
    });
    let mut cases = cases;
    for endpoint in ["169.254.1.1:51820", "[fe80::1]:51820", "0.0.0.0:51820"] {
        let mut v = base_agent.clone();
        v["gateway_endpoint"] = serde_json::json!(endpoint);
        cases.push((AGENT, v, "gateway_endpoint"));
    }
    let mut v = base_agent.clone();
    v["allowed_cidrs"] = serde_json::json!(["0.0.0.0/0"]);
    cases.push((AGENT, v, "allowed_cidrs[0]"));
    let mut v = base_gw.clone();
    v["guest_cidrs"] = serde_json::json!(["0.0.0.0/0"]);
    cases.push((GATEWAY, v, "guest_cidrs[0]"));
    // Issue 19: IPv6 ranges and the IPv6 tunnel pair.
    let gw6 = |v: &mut serde_json::Value| {
        v["tunnel_address6"] = serde_json::json!(hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6);
        v["agent_tunnel_address6"] = serde_json::json!(hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS6);
    };
    let agent6 = |v: &mut serde_json::Value| {
        v["tunnel_address6"] = serde_json::json!(hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS6);
        v["gateway_tunnel_address6"] =
            serde_json::json!(hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6);
    };
    // an IPv6 range without the pair
    let mut v = base_gw.clone();
    v["guest_cidrs"] = serde_json::json!(["198.18.52.0/24", "fd00:52::/64"]);
    cases.push((GATEWAY, v, "guest_cidrs[1]"));
    let mut v = base_agent.clone();
    v["allowed_cidrs"] = serde_json::json!(["fd00:52::/64"]);
    cases.push((AGENT, v, "allowed_cidrs[0]"));
    // an IPv6 /0
    let mut v = base_gw.clone();
    gw6(&mut v);
    v["guest_cidrs"] = serde_json::json!(["::/0"]);
    cases.push((GATEWAY, v, "guest_cidrs[0]"));
    let mut v = base_agent.clone();
    agent6(&mut v);
    v["allowed_cidrs"] = serde_json::json!(["fd00:52::/64", "::/0"]);
    cases.push((AGENT, v, "allowed_cidrs[1]"));
    // overlapping the tunnel's IPv6 range
    let mut v = base_gw.clone();
    gw6(&mut v);
    v["guest_cidrs"] = serde_json::json!(["fd9c:4f1e:7a2b:ffff::/64"]);
    cases.push((GATEWAY, v, "guest_cidrs[0]"));
    let mut v = base_agent.clone();
    agent6(&mut v);
    v["allowed_cidrs"] = serde_json::json!(["fd9c:4f1e:7a2b::/48"]);
    cases.push((AGENT, v, "allowed_cidrs[0]"));
    // only one of the pair
    let mut v = base_gw.clone();
    v["guest_cidrs"] = serde_json::json!([]);
    v["tunnel_address6"] = serde_json::json!(hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6);
    cases.push((GATEWAY, v, "agent_tunnel_address6"));
    let mut v = base_agent.clone();
    v["gateway_tunnel_address6"] = serde_json::json!(hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6);
    cases.push((AGENT, v, "tunnel_address6"));
    // a v6 tunnel address that is not IPv6
    let mut v = base_gw.clone();
    gw6(&mut v);
    v["guest_cidrs"] = serde_json::json!([]);
    v["agent_tunnel_address6"] = serde_json::json!("100.127.254.2/30");
    cases.push((GATEWAY, v, "agent_tunnel_address6"));
    let mut v = base_agent.clone();
    agent6(&mut v);
    v["tunnel_address6"] = serde_json::json!("100.127.254.2/30");
    cases.push((AGENT, v, "tunnel_address6"));
    for (i, (bin, doc, field)) in cases.into_iter().enumerate() {
        let f = dir.path().join(format!("c{i}.json"));
        std::fs::write(&f, doc.to_string()).unwrap();
        let out = std::process::Command::new(bin)
            .arg("--config")
            .arg(&f)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "case {i}: {err}");
        assert!(err.contains(field), "case {i}: want {field} in {err}");
        assert!(!err.contains(&key.to_base64()), "key leaked: {err}");
    }
}

/// Sends `argv[2]` bytes to every connection accepted on `argv[1]` (host:port), then closes.
const BULK_SERVER: &str = r#"
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
total = int(sys.argv[2])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, int(port))); s.listen(4)
chunk = bytes(range(256)) * 256
while True:
    c, _ = s.accept()
    left = total
    try:
        while left > 0:
            n = c.send(chunk[:min(left, len(chunk))]); left -= n
    except OSError:
        pass
    c.close()
"#;

/// Through the HTTP CONNECT proxy at argv[1] to argv[2]; prints the bytes read until EOF.
const BULK_CLIENT: &str = r#"
import socket, sys
host, port = sys.argv[1].rsplit(":", 1)
c = socket.create_connection((host, int(port)), timeout=30)
c.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (sys.argv[2], sys.argv[2])).encode())
head = b""
while b"\r\n\r\n" not in head:
    b = c.recv(1)
    if not b: sys.exit("proxy closed during the reply header: %r" % head)
    head += b
if not head.startswith(b"HTTP/1.1 200"): sys.exit("proxy refused: %r" % head)
n = 0
while True:
    b = c.recv(1 << 16)
    if not b: break
    n += len(b)
print(n)
"#;

/// `Udp: ... RcvbufErrors` of the namespace (datagrams the kernel dropped because a
/// socket's receive buffer was full).
fn udp_rcvbuf_errors(ns: &Netns) -> u64 {
    let out = ns.output("cat", &["/proc/net/snmp"]).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut udp = text.lines().filter(|l| l.starts_with("Udp: "));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let i = names
        .split_whitespace()
        .position(|n| n == "RcvbufErrors")
        .unwrap();
    values.split_whitespace().nth(i).unwrap().parse().unwrap()
}

/// A guest service answers with 16 MiB at once (as a fast catalog server answers
/// ListBundles): the userspace TCP sends whole windows back to back, and the tunnel's UDP
/// sockets must absorb them. Every byte arrives and no datagram is dropped at a socket
/// buffer (with default-sized buffers the gateway's socket overflowed, and each loss cost the
/// userspace TCP a retransmission timeout of a second or more: 2.2 MB took 2–5 s).
#[test]
fn bulk_push_through_the_tunnel_loses_no_datagrams() {
    let w = setup();
    let t0 = Instant::now();
    wait_for("tunnel up", Duration::from_secs(30), || {
        packages(
            &w.m,
            &format!("cat.{GUEST_NS}.svc.cluster.local:50051"),
            Some(CONNECT_PROXY),
        )
        .is_ok()
    });
    eprintln!("bulk: tunnel up after {:?}", t0.elapsed());
    const TOTAL: u64 = 16 << 20;
    let mut cmd = w.g.command("python3");
    cmd.args([
        "-c",
        BULK_SERVER,
        &format!("{GUEST_CAT}:{BULK_PORT}"),
        &TOTAL.to_string(),
    ]);
    let _server = w.g.spawn("bulk-server", cmd).unwrap();
    // Listening (checked inside G, so a start-up race is not mistaken for a refusal).
    let probe = format!("exec 3<>/dev/tcp/{GUEST_CAT}/{BULK_PORT}");
    wait_for("bulk server", Duration::from_secs(10), || {
        w.g.output("bash", &["-c", &probe])
            .unwrap()
            .status
            .success()
    });
    let target = format!("bulk.{GUEST_NS}.svc.cluster.local:{BULK_PORT}");
    let (m0, g0) = (udp_rcvbuf_errors(&w.m), udp_rcvbuf_errors(&w.g));
    for round in 0..3 {
        let t = Instant::now();
        let out =
            w.m.output("python3", &["-c", BULK_CLIENT, CONNECT_PROXY, &target])
                .unwrap();
        eprintln!("bulk round {round}: {:?}", t.elapsed());
        let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(
            out.status.success(),
            "round {round}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            got,
            TOTAL.to_string(),
            "round {round}: bytes through the tunnel\n{}",
            w.logs()
        );
    }
    let (m1, g1) = (udp_rcvbuf_errors(&w.m), udp_rcvbuf_errors(&w.g));
    assert_eq!(
        (m1 - m0, g1 - g0),
        (0, 0),
        "UDP datagrams dropped at a full socket buffer (management, guest)\n{}",
        w.logs()
    );
}

/// A pod network's MTU is often below the tunnel's datagrams (OVN-Kubernetes gives pods 1400;
/// the tunnel's 1420-byte inner packets travel in 1480-byte datagrams over IPv4). The sending
/// host must fragment them, as it does for any UDP socket (and as kernel WireGuard does), not
/// refuse them: a 4 MiB answer through an underlay of MTU 1400 arrives whole, in both
/// directions' worth of full-sized segments (the answer's data one way, ACKs the other).
#[test]
fn the_tunnel_works_over_an_underlay_with_a_smaller_mtu() {
    let w = setup();
    for ns in [&w.m, &w.g] {
        assert_eq!(ns.set_veth_mtu(1400).unwrap(), 1, "{}", ns.name());
    }
    wait_for("tunnel up", Duration::from_secs(30), || {
        packages(
            &w.m,
            &format!("cat.{GUEST_NS}.svc.cluster.local:50051"),
            Some(CONNECT_PROXY),
        )
        .is_ok()
    });
    const TOTAL: u64 = 4 << 20;
    let mut cmd = w.g.command("python3");
    cmd.args([
        "-c",
        BULK_SERVER,
        &format!("{GUEST_CAT}:{BULK_PORT}"),
        &TOTAL.to_string(),
    ]);
    let _server = w.g.spawn("bulk-server", cmd).unwrap();
    let probe = format!("exec 3<>/dev/tcp/{GUEST_CAT}/{BULK_PORT}");
    wait_for("bulk server", Duration::from_secs(10), || {
        w.g.output("bash", &["-c", &probe])
            .unwrap()
            .status
            .success()
    });
    let target = format!("bulk.{GUEST_NS}.svc.cluster.local:{BULK_PORT}");
    let t = Instant::now();
    let out =
        w.m.output("python3", &["-c", BULK_CLIENT, CONNECT_PROXY, &target])
            .unwrap();
    eprintln!("4 MiB over MTU 1400: {:?}", t.elapsed());
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        w.logs()
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        TOTAL.to_string(),
        "bytes through the tunnel over MTU 1400\n{}",
        w.logs()
    );
}

/// Highly available gateway (issue 13 item 6): two replicas sharing the keys, each in its own
/// namespace ("pods" A and B), behind a node namespace N where the agent's WireGuard Service
/// lives. N's nftables DNAT with `numgen random` over both replicas, and `conntrack -D` when
/// an endpoint goes, stand in for kube-proxy (named); `/etc/hosts` listing both replicas
/// stands in for the headless peers Service's DNS. Proxy clients connect to a replica
/// directly (what the SOCKS/CONNECT Service would pick).
///
/// - A request landing on the replica without the agent's session is forwarded to the one
///   with it (counted `result="forwarded"` there, `proto="peer"` on the holder).
/// - kill -9 of the holder in the middle of a relayed stream: the stream ends at once, and
///   calls through the survivor work again within 8 s: the agent's next keepalive (every 2 s
///   here, 10 s as shipped) reaches the survivor, which answers data for a session it does
///   not hold with a handshake offer; one round trip later it holds the session. (Without
///   the offer the agent's dead-peer timeout decides: 3 × keepalive + 5 s, measured 11.0 s
///   and 11.2 s here, 35 s as shipped.)
/// - The killed replica restarts (as its Deployment would) and forwards to the survivor.
#[test]
fn replicas_forward_to_the_session_holder_and_survive_its_kill() {
    const SVC: &str = "198.18.50.1";
    const A_ADDR: &str = "198.18.54.2";
    const B_ADDR: &str = "198.18.54.6";
    const PEERS: &str = "gw-peers.test";
    let n = Netns::create("han").unwrap();
    let g = Netns::create("hag").unwrap();
    let a = Netns::create("haa").unwrap();
    let b = Netns::create("hab").unwrap();
    connect(&n, &format!("{SVC}/30"), &g, &format!("{G_ADDR}/30")).unwrap();
    connect(&n, "198.18.54.1/30", &a, &format!("{A_ADDR}/30")).unwrap();
    connect(&n, "198.18.54.5/30", &b, &format!("{B_ADDR}/30")).unwrap();
    assert!(
        n.output("sysctl", &["-qw", "net.ipv4.ip_forward=1"])
            .unwrap()
            .status
            .success()
    );
    a.ip(&["route", "add", "default", "via", "198.18.54.1"])
        .unwrap();
    b.ip(&["route", "add", "default", "via", "198.18.54.5"])
        .unwrap();
    for a in [GUEST_CAT, GUEST_DNS] {
        g.ip(&["addr", "add", &format!("{a}/32"), "dev", "lo"])
            .unwrap();
    }
    let hosts = format!("127.0.0.1 localhost\n{A_ADDR} {PEERS}\n{B_ADDR} {PEERS}\n");
    for r in [&a, &b] {
        r.set_hosts(&hosts).unwrap();
    }
    let nft = |rules: String| {
        let mut cmd = n.command("nft");
        cmd.args(["-f", "-"]).stdin(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), rules.as_bytes()).unwrap();
        assert!(child.wait().unwrap().success(), "nft: {rules}");
    };
    // kube-proxy stand-in: the WireGuard Service's endpoints.
    let service = |endpoints: &[&str]| {
        let map: Vec<String> = endpoints
            .iter()
            .enumerate()
            .map(|(i, ip)| format!("{i} : {ip} . 51820"))
            .collect();
        nft(format!(
            "table ip hasvc\ndelete table ip hasvc\ntable ip hasvc {{\n chain pre {{\n  type nat hook prerouting priority -100;\n  ip daddr {SVC} udp dport 51820 dnat ip to numgen random mod {} map {{ {} }}\n }}\n}}\n",
            endpoints.len(),
            map.join(", ")
        ));
    };
    service(&[A_ADDR, B_ADDR]);

    let dir = tempfile::tempdir().unwrap();
    let gw_key = PrivateKey::generate();
    let agent_key = PrivateKey::generate();
    let gw_key_file = dir.path().join("gw.key");
    let agent_key_file = dir.path().join("agent.key");
    std::fs::write(&gw_key_file, gw_key.to_base64()).unwrap();
    std::fs::write(&agent_key_file, agent_key.to_base64()).unwrap();
    let gw = serde_json::json!({
        "listen_port": 51820,
        "private_key_file": gw_key_file,
        "agent_public_key": agent_key.public_key().to_string(),
        "tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "agent_tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "guest_cidrs": ["198.18.52.0/24"],
        "hcp_namespace": HCP_NS,
        "connect_listen": "0.0.0.0:3128",
        "peer_listen": "0.0.0.0:1081",
        "peers": format!("{PEERS}:1081"),
        "health_listen": GW_HEALTH,
        "persistent_keepalive_seconds": 2,
        "dns": {"local_upstreams": ["127.0.0.1:5354"]},
        "allowed_services": [{"namespace": GUEST_NS, "name": "*", "port": 50051}],
        "exposed_services": [],
        "drain_timeout_seconds": 3
    });
    let agent = serde_json::json!({
        "gateway_endpoint": format!("{SVC}:51820"),
        "gateway_public_key": gw_key.public_key().to_string(),
        "private_key_file": agent_key_file,
        "tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "gateway_tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "persistent_keepalive_seconds": 2,
        "allowed_services": [{"namespace": "*", "name": "*", "port": 50051}],
        "allowed_cidrs": ["198.18.52.0/24"],
        "guest_dns": [GUEST_DNS],
        "exposed_services": [],
        "health_listen": AGENT_HEALTH,
        "drain_timeout_seconds": 3
    });
    let gw_conf = dir.path().join("gateway.json");
    let agent_conf = dir.path().join("agent.json");
    std::fs::write(&gw_conf, serde_json::to_vec_pretty(&gw).unwrap()).unwrap();
    std::fs::write(&agent_conf, serde_json::to_vec_pretty(&agent).unwrap()).unwrap();
    let guest_cat = dir.path().join("guest-catalog");
    catalog_subset(
        &guest_cat,
        &["eda-openshift-operator", "nvidia-network-operator"],
    );
    let _opm = opm(&g, "opm-guest", &guest_cat, "0.0.0.0:50051");
    let cat = format!("cat.{GUEST_NS}.svc.cluster.local");
    let _dns = dnsmasq(&g, "dnsmasq-guest", GUEST_DNS, 53, &[(&cat, GUEST_CAT)]);
    let start_gateway = |ns: &Netns, name: &str| {
        let mut cmd = ns.command(GATEWAY);
        cmd.arg("--config").arg(&gw_conf);
        ns.spawn(name, cmd).unwrap()
    };
    let mut replicas = vec![
        (&a, A_ADDR, Some(start_gateway(&a, "gateway-a"))),
        (&b, B_ADDR, Some(start_gateway(&b, "gateway-b"))),
    ];
    let mut cmd = g.command(AGENT);
    cmd.arg("--config").arg(&agent_conf);
    let agent_p = g.spawn("agent", cmd).unwrap();
    let logs = |replicas: &[(&Netns, &str, Option<NsProcess>)]| {
        let mut s = format!("--- agent\n{}", agent_p.log_tail(30));
        for (_, addr, p) in replicas {
            if let Some(p) = p {
                s.push_str(&format!("\n--- gateway {addr}\n{}", p.log_tail(30)));
            }
        }
        s
    };
    wait_for("guest opm", Duration::from_secs(60), || {
        packages(&g, &format!("{GUEST_CAT}:50051"), None).is_ok()
    });
    wait_for("agent ready (handshake)", Duration::from_secs(20), || {
        ready(&g, AGENT_HEALTH)
    });
    let handshakes = |ns: &Netns| metric(ns, GW_HEALTH, "hcp_olm_tunnel_last_handshake_timestamp");
    // (the metric is refreshed on a timer)
    let mut holder = None;
    wait_for(
        "a replica's handshake metric",
        Duration::from_secs(10),
        || {
            holder = replicas.iter().position(|(ns, _, _)| handshakes(ns) > 0);
            holder.is_some()
        },
    );
    let holder =
        holder.unwrap_or_else(|| panic!("no replica holds the session\n{}", logs(&replicas)));
    let other = 1 - holder;
    eprintln!("the agent's flow went to {}", replicas[holder].1);
    assert_eq!(handshakes(replicas[other].0), 0, "both replicas handshook");

    // Through either replica.
    let guest = format!("{cat}:50051");
    for (_, addr, _) in &replicas {
        packages(&n, &guest, Some(&format!("{addr}:3128")))
            .unwrap_or_else(|e| panic!("via {addr}: {e}\n{}", logs(&replicas)));
    }
    let forwarded = |ns: &Netns| {
        metric(
            ns,
            GW_HEALTH,
            "hcp_olm_tunnel_proxy_connections_total{proto=\"connect\",result=\"forwarded\"}",
        )
    };
    assert_eq!(forwarded(replicas[other].0), 1, "{}", logs(&replicas));
    assert_eq!(forwarded(replicas[holder].0), 0);
    assert_eq!(
        metric(
            replicas[holder].0,
            GW_HEALTH,
            "hcp_olm_tunnel_proxy_connections_total{proto=\"peer\",result=\"ok\"}"
        ),
        1
    );

    // A relayed stream through the holder, then kill -9 of the holder in its middle.
    let mut stream = {
        use std::io::{Read, Write};
        let mut cmd = n.command("bash");
        cmd.args([
            "-c",
            &format!(
                "exec 3<>/dev/tcp/{}/3128; printf 'CONNECT {guest} HTTP/1.1\\r\\nHost: {guest}\\r\\n\\r\\n' >&3; timeout 20 cat <&3",
                replicas[holder].1
            ),
        ])
        .stdout(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut head = [0u8; 39];
        out.read_exact(&mut head).unwrap();
        assert!(
            String::from_utf8_lossy(&head).starts_with("HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        let _ = std::io::stdout().flush();
        (child, out)
    };
    let (_, addr, p) = &mut replicas[holder];
    p.take().unwrap().kill();
    eprintln!("killed the holder {addr}");
    let t0 = Instant::now();
    // The endpoints controller and kube-proxy: the killed pod leaves the Service, and its
    // UDP conntrack entries go.
    let survivor = replicas[other].1;
    service(&[survivor]);
    let _ = n.output(
        "conntrack",
        &["-D", "-p", "udp", "--orig-port-dst", "51820"],
    );
    {
        use std::io::Read;
        let mut rest = Vec::new();
        let _ = stream.1.read_to_end(&mut rest);
        let _ = stream.0.wait();
        let ended = t0.elapsed();
        eprintln!("the stream through the killed replica ended after {ended:?}");
        assert!(
            ended < Duration::from_secs(5),
            "the stream outlived its replica by {ended:?}"
        );
    }
    let t = wait_for(
        "calls through the survivor after the holder's kill -9",
        Duration::from_secs(40),
        || packages(&n, &guest, Some(&format!("{survivor}:3128"))).is_ok(),
    );
    eprintln!("calls through the survivor work again {t:?} after the kill");
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "recovered only after {:?} (bound 8 s)\n{}",
        t0.elapsed(),
        logs(&replicas)
    );
    // (the metric is refreshed on a timer)
    wait_for(
        "the survivor's handshake metric",
        Duration::from_secs(10),
        || handshakes(replicas[other].0) > 0,
    );
    // It took the session over by offering a handshake, not by waiting for the agent's
    // dead-peer timeout.
    assert!(
        metric(
            replicas[other].0,
            GW_HEALTH,
            "hcp_olm_tunnel_handshake_offers_total"
        ) >= 1,
        "{}",
        logs(&replicas)
    );

    // The killed replica comes back (its Deployment) and joins the Service again; the agent's
    // flow stays with the survivor, and the new replica forwards to it.
    let (ns, addr, p) = &mut replicas[holder];
    *p = Some(start_gateway(ns, "gateway-restarted"));
    let back = *addr;
    service(&[A_ADDR, B_ADDR]);
    wait_for("restarted replica ready", Duration::from_secs(10), || {
        ready(replicas[holder].0, GW_HEALTH)
    });
    packages(&n, &guest, Some(&format!("{back}:3128")))
        .unwrap_or_else(|e| panic!("via the restarted {back}: {e}\n{}", logs(&replicas)));
    assert_eq!(forwarded(replicas[holder].0), 1, "{}", logs(&replicas));
    drop(agent_p);
}

// ---- Issue 19: IPv6 inside the tunnel (IPv6-only and dual-stack guests) ----
//
// Addresses: underlay fd00:50::/64 (M ::1, G ::2); guest "Services" fd00:52::/64 on G's lo
// (echo server ::10, DNS ::53); a management "Service" fd00:51::10 on M's lo. The tunnel pair
// is the shipped fd9c:4f1e:7a2b:ffff::1,2/126 (inside the userspace stacks only). Echo servers
// stand in for catalogs, so these tests need neither opm nor the CLI and take seconds.

const V6_M: &str = "fd00:50::1";
const V6_G: &str = "fd00:50::2";
const V6_GUEST_ECHO: &str = "fd00:52::10";
const V6_GUEST_DNS: &str = "fd00:52::53";
const V6_MGMT_ECHO: &str = "fd00:51::10";
const V6_GUEST_RANGE: &str = "fd00:52::/64";
const ECHO_PORT: u16 = 50051;

/// `serve TAG HOST:PORT` answers each connection with `TAG <peer address> <first message>`;
/// `direct HOST:PORT MSG`, `connect PROXY TARGET MSG` (HTTP CONNECT) and
/// `socks PROXY NAME PORT MSG` print the answer, or `refused <why>`.
const ECHO: &str = r#"
import socket, struct, sys, threading
def addr(hp):
    h, p = hp.rsplit(":", 1)
    return h.strip("[]"), int(p)
mode = sys.argv[1]
if mode == "serve":
    tag, (h, p) = sys.argv[2], addr(sys.argv[3])
    s = socket.socket(socket.AF_INET6 if ":" in h else socket.AF_INET)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((h, p)); s.listen(16)
    def one(c, peer):
        c.settimeout(10)
        try:
            d = c.recv(4096)
            c.sendall(("%s %s %s" % (tag, peer[0], d.decode())).encode())
        finally:
            c.close()
    while True:
        c, peer = s.accept()
        threading.Thread(target=one, args=(c, peer), daemon=True).start()
def recv_exact(c, n):
    b = b""
    while len(b) < n:
        d = c.recv(n - len(b))
        if not d: print("refused eof"); sys.exit(0)
        b += d
    return b
if mode == "direct":
    c = socket.create_connection(addr(sys.argv[2]), timeout=10); msg = sys.argv[3]
elif mode == "connect":
    c = socket.create_connection(addr(sys.argv[2]), timeout=10); t = sys.argv[3]; msg = sys.argv[4]
    c.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (t, t)).encode())
    head = b""
    while b"\r\n\r\n" not in head:
        d = c.recv(1)
        if not d: break
        head += d
    if not head.startswith(b"HTTP/1.1 200"):
        print("refused", head.split(b"\r\n")[0].decode()); sys.exit(0)
elif mode == "socks":
    c = socket.create_connection(addr(sys.argv[2]), timeout=10)
    name, port, msg = sys.argv[3].encode(), int(sys.argv[4]), sys.argv[5]
    c.sendall(b"\x05\x01\x00")
    recv_exact(c, 2)
    c.sendall(b"\x05\x01\x00\x03" + bytes([len(name)]) + name + struct.pack(">H", port))
    r = recv_exact(c, 4)
    if r[1] != 0:
        print("refused socks", r[1]); sys.exit(0)
    recv_exact(c, {1: 6, 4: 18}.get(r[3], 0) or recv_exact(c, 1)[0] + 2)
c.sendall(msg.encode())
out = b""
while True:
    d = c.recv(4096)
    if not d: break
    out += d
print(out.decode())
"#;

/// `HOST PORT TYPE NAME` (TYPE: A, AAAA or PTR) over UDP: prints the rcode and the answers.
const DNS6_CLIENT: &str = r#"
import socket, struct, sys
host, port, qtype, name = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
qt = {"A": 1, "AAAA": 28, "PTR": 12}[qtype]
q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
q += b"".join(bytes([len(l)]) + l.encode() for l in name.rstrip(".").split(".")) + b"\0"
q += struct.pack(">HH", qt, 1)
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(5); s.sendto(q, (host, port)); r = s.recv(4096)
def name_at(i):
    labels, nxt = [], None
    while True:
        l = r[i]
        if l & 0xC0 == 0xC0:
            if nxt is None: nxt = i + 2
            i = ((l & 0x3F) << 8) | r[i + 1]; continue
        if l == 0: i += 1; break
        labels.append(r[i + 1:i + 1 + l].decode()); i += 1 + l
    return ".".join(labels), (nxt if nxt is not None else i)
rcode, an = r[3] & 0xF, struct.unpack(">H", r[6:8])[0]
i = name_at(12)[1] + 4
out = []
for _ in range(an):
    i = name_at(i)[1]
    t, _, _, rdlen = struct.unpack(">HHIH", r[i:i + 10]); i += 10
    if t == 28: out.append(socket.inet_ntop(socket.AF_INET6, r[i:i + 16]))
    elif t == 1: out.append(socket.inet_ntoa(r[i:i + 4]))
    elif t == 12: out.append(name_at(i)[0])
    i += rdlen
print(["NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED"][rcode] if rcode < 6 else rcode, *out)
"#;

struct V6World {
    m: Netns,
    g: Netns,
    dir: tempfile::TempDir,
    gateway: NsProcess,
    agent: NsProcess,
}

impl V6World {
    fn py(&self, ns: &Netns, script: &str, args: &[&str]) -> String {
        let f = self
            .dir
            .path()
            .join(if script == ECHO { "echo.py" } else { "dns6.py" });
        if !f.exists() {
            std::fs::write(&f, script).unwrap();
        }
        let mut cmd = ns.command("timeout");
        cmd.arg("20").arg("python3").arg(&f).args(args);
        let out = cmd.output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout).trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        )
    }

    fn serve(&self, ns: &Netns, tag: &str, at: &str) {
        let f = self.dir.path().join("echo.py");
        std::fs::write(&f, ECHO).unwrap();
        let mut cmd = ns.command("python3");
        cmd.arg(&f).args(["serve", tag, at]);
        ns.spawn(&format!("echo-{tag}"), cmd).unwrap();
        let (h, p) = at.rsplit_once(':').unwrap();
        let h = h.trim_matches(|c| c == '[' || c == ']').to_string();
        wait_for(
            &format!("echo {tag} listening"),
            Duration::from_secs(10),
            || {
                let probe = format!(
                    "import socket; socket.create_connection(('{h}', {p}), timeout=1).close()"
                );
                ns.output("python3", &["-c", &probe])
                    .is_ok_and(|o| o.status.success())
            },
        );
    }

    fn logs(&self) -> String {
        format!(
            "--- gateway\n{}\n--- agent\n{}",
            self.gateway.log_tail(40),
            self.agent.log_tail(40)
        )
    }
}

/// No duplicate address detection in `ns` (new interfaces' IPv6 addresses usable at once).
fn no_dad(ns: &Netns) {
    for k in ["all", "default"] {
        let out = ns
            .output(
                "sysctl",
                &["-qw", &format!("net.ipv6.conf.{k}.accept_dad=0")],
            )
            .unwrap();
        assert!(out.status.success(), "sysctl: {out:?}");
    }
}

/// `dual`: IPv4 underlay and both families of guest ranges (one IPv4 and one IPv6 echo
/// target); otherwise everything on the guest side is IPv6 (underlay, targets, DNS, listeners).
fn setup_v6(dual: bool) -> V6World {
    let m = Netns::create("v6m").unwrap();
    let g = Netns::create("v6g").unwrap();
    no_dad(&m);
    no_dad(&g);
    if dual {
        connect(&m, &format!("{M_ADDR}/30"), &g, &format!("{G_ADDR}/30")).unwrap();
        g.ip(&["addr", "add", &format!("{GUEST_CAT}/32"), "dev", "lo"])
            .unwrap();
    } else {
        connect(&m, &format!("{V6_M}/64"), &g, &format!("{V6_G}/64")).unwrap();
    }
    for a in [V6_GUEST_ECHO, V6_GUEST_DNS] {
        g.ip(&["addr", "add", &format!("{a}/128"), "dev", "lo"])
            .unwrap();
    }
    m.ip(&["addr", "add", &format!("{V6_MGMT_ECHO}/128"), "dev", "lo"])
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let gw_key = PrivateKey::generate();
    let agent_key = PrivateKey::generate();
    let mut guest_ranges = vec![V6_GUEST_RANGE];
    if dual {
        guest_ranges.insert(0, "198.18.52.0/24");
    }
    let gw = serde_json::json!({
        "listen_port": 51820,
        // no listen_address: the default socket takes both families (the agent dials an
        // IPv6 address here; IPv4 underlays elsewhere use the same default)
        "private_key": gw_key.to_base64(),
        "agent_public_key": agent_key.public_key().to_string(),
        "tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "agent_tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "tunnel_address6": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6,
        "agent_tunnel_address6": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS6,
        "guest_cidrs": guest_ranges,
        "hcp_namespace": HCP_NS,
        "connect_listen": "[::]:3128",
        "socks_listen": "[::]:1080",
        "health_listen": "[::]:9101",
        "persistent_keepalive_seconds": 2,
        "dns": {"local_upstreams": ["127.0.0.1:5354"], "listen": GW_DNS},
        "allowed_services": [{"namespace": GUEST_NS, "name": "*", "port": ECHO_PORT}],
        "exposed_services": [
            {"name": "mgmt-echo", "listen_port": EXPOSED_PORT, "target": format!("[{V6_MGMT_ECHO}]:{ECHO_PORT}")}
        ],
        "drain_timeout_seconds": 1
    });
    let agent = serde_json::json!({
        "gateway_endpoint": if dual { format!("{M_ADDR}:51820") } else { format!("[{V6_M}]:51820") },
        "gateway_public_key": gw_key.public_key().to_string(),
        "private_key": agent_key.to_base64(),
        "tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "gateway_tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "tunnel_address6": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS6,
        "gateway_tunnel_address6": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS6,
        "persistent_keepalive_seconds": 2,
        "allowed_services": [{"namespace": "*", "name": "*", "port": ECHO_PORT}],
        "allowed_cidrs": guest_ranges,
        "guest_dns": [format!("[{V6_GUEST_DNS}]:53")],
        "exposed_services": [
            {"name": "mgmt-echo", "listen_port": EXPOSED_PORT, "target": "ignored-by-agent:1"}
        ],
        "exposed_listen_address": "::",
        "health_listen": "[::]:9102",
        "drain_timeout_seconds": 1
    });
    let gw_conf = dir.path().join("gateway.json");
    let agent_conf = dir.path().join("agent.json");
    std::fs::write(&gw_conf, serde_json::to_vec_pretty(&gw).unwrap()).unwrap();
    std::fs::write(&agent_conf, serde_json::to_vec_pretty(&agent).unwrap()).unwrap();
    let name = |n: &str| format!("{n}.{GUEST_NS}.svc.cluster.local");
    let mut records = vec![
        (name("cat6"), V6_GUEST_ECHO.to_string()),
        // a guest name pointing outside the guest ranges (at a management address)
        (name("evil"), V6_MGMT_ECHO.to_string()),
    ];
    if dual {
        records.push((name("cat4"), GUEST_CAT.to_string()));
        records.push((name("both"), format!("{GUEST_CAT},{V6_GUEST_ECHO}")));
    }
    let records: Vec<(&str, &str)> = records
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    dnsmasq(&g, "dnsmasq-guest", V6_GUEST_DNS, 53, &records);
    dnsmasq(&m, "dnsmasq-mgmt", "127.0.0.1", 5354, &[]);
    let gateway = {
        let mut cmd = m.command(GATEWAY);
        cmd.arg("--config").arg(&gw_conf);
        m.spawn("gateway", cmd).unwrap()
    };
    let agent = {
        let mut cmd = g.command(AGENT);
        cmd.arg("--config").arg(&agent_conf);
        g.spawn("agent", cmd).unwrap()
    };
    let w = V6World {
        m,
        g,
        dir,
        gateway,
        agent,
    };
    w.serve(&w.g, "guest6", &format!("[{V6_GUEST_ECHO}]:{ECHO_PORT}"));
    if dual {
        w.serve(&w.g, "guest4", &format!("{GUEST_CAT}:{ECHO_PORT}"));
    }
    w.serve(&w.m, "mgmt6", &format!("[{V6_MGMT_ECHO}]:{ECHO_PORT}"));
    let t = wait_for("agent ready (handshake)", Duration::from_secs(20), || {
        ready(&w.g, AGENT_HEALTH)
    });
    eprintln!("agent ready after {t:?}");
    w
}

/// Issue 19, relocation over an IPv6 underlay: as [`gateway_address_change_is_followed`],
/// with the gateway named by a host name that resolves to an IPv6 address only. Its published
/// address moves (a NAT66 in M in front of it, as a new LoadBalancer IP would be), the old
/// address carries nothing either way, the name says so, and the agent follows within the
/// same bound, without a restart.
#[test]
fn gateway_ipv6_address_change_is_followed() {
    const NEW_V6_M: &str = "fd00:53::1";
    const NAME: &str = "gateway.relocate6.test";
    let w = setup_v6(false);
    w.g.set_hosts(&format!("::1 localhost\n{V6_M} {NAME}\n"))
        .unwrap();
    let conf = w.dir.path().join("agent.json");
    let mut agent: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&conf).unwrap()).unwrap();
    agent["gateway_endpoint"] = serde_json::json!(format!("{NAME}:51820"));
    std::fs::write(&conf, serde_json::to_vec_pretty(&agent).unwrap()).unwrap();
    w.agent.kill();
    let agent = {
        let mut cmd = w.g.command(AGENT);
        cmd.arg("--config").arg(&conf);
        w.g.spawn("agent-by-name", cmd).unwrap()
    };
    wait_for("agent ready by name", Duration::from_secs(20), || {
        ready(&w.g, AGENT_HEALTH)
    });
    let cat6 = format!("cat6.{GUEST_NS}.svc.cluster.local:{ECHO_PORT}");
    let call = || w.py(&w.m, ECHO, &["connect", CONNECT_PROXY, &cat6, "hi"]);
    let r = call();
    assert!(
        r.ends_with(" hi"),
        "before the move: {r}\n{}",
        agent.log_tail(30)
    );
    nft(
        &w.m,
        format!(
            "table ip6 relocate {{\n chain pre {{\n  type nat hook prerouting priority -100;\n  ip6 daddr {NEW_V6_M} udp dport 51820 dnat to {V6_M}\n }}\n}}\n"
        ),
    );
    w.g.ip(&[
        "-6",
        "route",
        "add",
        &format!("{NEW_V6_M}/128"),
        "via",
        V6_M,
    ])
    .unwrap();
    nft(
        &w.g,
        format!(
            "table inet relocate {{\n chain out {{\n  type filter hook output priority 0;\n  ip6 daddr {V6_M} udp dport 51820 drop\n }}\n chain in {{\n  type filter hook input priority 0;\n  ip6 saddr {V6_M} udp sport 51820 drop\n }}\n}}\n"
        ),
    );
    w.g.set_hosts(&format!("::1 localhost\n{NEW_V6_M} {NAME}\n"))
        .unwrap();
    let t = wait_for(
        "calls after the gateway's IPv6 address changed",
        Duration::from_secs(45),
        || call().ends_with(" hi"),
    );
    eprintln!("agent followed the gateway's new IPv6 address in {t:?}");
    assert!(
        t < Duration::from_secs(30),
        "followed only after {t:?} (bound 30 s)\n{}",
        agent.log_tail(40)
    );
}

/// An IPv6-only guest: IPv6 underlay, the agent dials the gateway's IPv6 endpoint; a guest
/// Service name with only an AAAA record is reached through CONNECT and SOCKS5 (the agent
/// dials it from the guest's IPv6 network); the exposed service listens on `::` in the guest
/// and reaches an IPv6 management target; AAAA and PTR (ip6.arpa) names are answered by the
/// guest DNS across the tunnel on the gateway's DNS listener. Isolation holds: an AAAA
/// outside the guest ranges and an IPv6 literal are refused like a name that does not exist.
#[test]
fn ipv6_only_guest_forward_reverse_and_dns() {
    let start = Instant::now();
    let w = setup_v6(false);
    let g_addrs = w.g.ip(&["-4", "addr", "show", "scope", "global"]).unwrap();
    assert!(
        !g_addrs.contains("inet "),
        "the guest has no global IPv4 address: {g_addrs}"
    );
    let cat6 = format!("cat6.{GUEST_NS}.svc.cluster.local");
    // Forward, CONNECT by name (AAAA only): the echo sees the agent's IPv6 source.
    let r = w.py(
        &w.m,
        ECHO,
        &[
            "connect",
            CONNECT_PROXY,
            &format!("{cat6}:{ECHO_PORT}"),
            "hello",
        ],
    );
    assert!(
        r.starts_with("guest6 fd00:") && r.ends_with(" hello"),
        "CONNECT {cat6}: {r}\n{}",
        w.logs()
    );
    // SOCKS5 by name.
    let r = w.py(
        &w.m,
        ECHO,
        &[
            "socks",
            SOCKS_PROXY,
            &cat6,
            &ECHO_PORT.to_string(),
            "via-socks",
        ],
    );
    assert!(
        r.starts_with("guest6 ") && r.ends_with(" via-socks"),
        "SOCKS {cat6}: {r}"
    );
    // Reverse: a guest client on the guest's IPv6 loopback, the agent listening on `::`.
    let r = w.py(
        &w.g,
        ECHO,
        &["direct", &format!("[::1]:{EXPOSED_PORT}"), "back"],
    );
    assert!(
        r.starts_with("mgmt6 ") && r.ends_with(" back"),
        "reverse: {r}\n{}",
        w.logs()
    );
    // Isolation: AAAA outside the guest ranges, an IPv6 literal (IP literals are never
    // dialed: they cannot be checked against allowed_services), a port not allowed.
    for target in [
        format!("evil.{GUEST_NS}.svc.cluster.local:{ECHO_PORT}"),
        format!("[{V6_GUEST_ECHO}]:{ECHO_PORT}"),
        format!("{cat6}:22"),
    ] {
        let r = w.py(&w.m, ECHO, &["connect", CONNECT_PROXY, &target, "x"]);
        assert_eq!(r, "refused HTTP/1.1 502 Bad Gateway", "{target}");
    }
    // DNS through the gateway's listener: AAAA and PTR from the guest.
    let (host, port) = GW_DNS.rsplit_once(':').unwrap();
    let ask = |t: &str, n: &str| w.py(&w.m, DNS6_CLIENT, &[host, port, t, n]);
    assert_eq!(ask("AAAA", &cat6), format!("NOERROR {V6_GUEST_ECHO}"));
    let ptr = "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.2.5.0.0.0.0.d.f.ip6.arpa";
    assert_eq!(ask("PTR", ptr), format!("NOERROR {cat6}"), "{}", w.logs());
    // A PTR name outside the guest ranges stays with the management side (which does not
    // know it), never the guest.
    let other = "0.1.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.0.1.5.0.0.0.0.d.f.ip6.arpa";
    let r = ask("PTR", other);
    assert!(!r.contains("evil"), "{other}: {r}");
    eprintln!("ipv6-only guest checks in {:?}", start.elapsed());
}

/// A dual-stack guest over an IPv4 underlay: one IPv4 and one IPv6 guest target through the
/// one tunnel, at once; a name with both records is dialed over IPv4 (A first).
#[test]
fn dual_stack_guest_reaches_both_families() {
    let start = Instant::now();
    let w = setup_v6(true);
    let name = |n: &str| format!("{n}.{GUEST_NS}.svc.cluster.local:{ECHO_PORT}");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            w.py(
                &w.m,
                ECHO,
                &["connect", CONNECT_PROXY, &name("cat4"), "four"],
            )
        });
        let b = s.spawn(|| {
            w.py(
                &w.m,
                ECHO,
                &["connect", CONNECT_PROXY, &name("cat6"), "six"],
            )
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    assert!(
        a.starts_with("guest4 198.18.") && a.ends_with(" four"),
        "{a}\n{}",
        w.logs()
    );
    assert!(
        b.starts_with("guest6 fd00:") && b.ends_with(" six"),
        "{b}\n{}",
        w.logs()
    );
    let r = w.py(&w.m, ECHO, &["connect", CONNECT_PROXY, &name("both"), "x"]);
    assert!(r.starts_with("guest4 "), "{r}");
    let r = w.py(
        &w.m,
        ECHO,
        &[
            "socks",
            SOCKS_PROXY,
            &format!("cat6.{GUEST_NS}.svc.cluster.local"),
            &ECHO_PORT.to_string(),
            "s",
        ],
    );
    assert!(r.starts_with("guest6 "), "{r}");
    let r = w.py(
        &w.g,
        ECHO,
        &["direct", &format!("127.0.0.1:{EXPOSED_PORT}"), "b4"],
    );
    assert!(
        r.starts_with("mgmt6 "),
        "reverse over IPv4 in the guest: {r}"
    );
    let r = w.py(
        &w.g,
        ECHO,
        &["direct", &format!("[::1]:{EXPOSED_PORT}"), "b6"],
    );
    assert!(
        r.starts_with("mgmt6 "),
        "reverse over IPv6 in the guest: {r}"
    );
    let (host, port) = GW_DNS.rsplit_once(':').unwrap();
    let r = w.py(
        &w.m,
        DNS6_CLIENT,
        &[host, port, "PTR", "10.52.18.198.in-addr.arpa"],
    );
    assert!(
        r.starts_with("NOERROR ") && r.contains(".team-a.svc.cluster.local"),
        "{r}"
    );
    eprintln!("dual-stack checks in {:?}", start.elapsed());
}
