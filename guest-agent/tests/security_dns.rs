//! Hole 7: the split DNS exposed on a network (`hcp-olm-dns`, the gateway's `dns.listen`)
//! must never be an open resolver, and one client must not monopolise it. Real binaries and
//! a real dnsmasq upstream in network namespaces: server namespace S (198.18.60.1) and a
//! client namespace C (198.18.60.2) outside the allowed source ranges. A `python3` DNS client
//! plays the querying pods (stand-in; the tests need rcodes and answer counts).

use std::time::{Duration, Instant};

use hcp_olm_e2e::netns::{Netns, connect};
use hcp_olm_guest_agent::tunnel::PrivateKey;

const DNS_BIN: &str = env!("CARGO_BIN_EXE_hcp-olm-dns");
const GATEWAY: &str = env!("CARGO_BIN_EXE_hcp-olm-gateway");
const DNSMASQ: &str = "/usr/sbin/dnsmasq";
const S_ADDR: &str = "198.18.60.1";
const C_ADDR: &str = "198.18.60.2";
const ANSWER: &str = "198.18.61.7";

/// Sends `count` A queries for `name` to host:port over UDP, at most one per `gap_ms`, and
/// prints `<answered> <rcode of the first answer>` (waits 300 ms for stragglers).
const DNS_CLIENT: &str = r#"
import socket, struct, sys, time, random
host, port, name, count, gap = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), float(sys.argv[5]) / 1000
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setblocking(False)
q = b"".join(bytes([len(l)]) + l.encode() for l in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)
answered, first = 0, None
def drain():
    global answered, first
    while True:
        try:
            r = s.recv(4096)
        except BlockingIOError:
            return
        answered += 1
        if first is None:
            first = r[3] & 0x0f
for i in range(count):
    s.sendto(struct.pack(">HHHHHH", random.randrange(65536), 0x0100, 1, 0, 0, 0) + q, (host, port))
    drain()
    if gap:
        time.sleep(gap)
end = time.time() + 0.3
while time.time() < end:
    drain()
    time.sleep(0.01)
names = {0: "NOERROR", 2: "SERVFAIL", 3: "NXDOMAIN", 5: "REFUSED"}
print(answered, names.get(first, first))
"#;

fn ask(ns: &Netns, server: &str, name: &str, count: u32, gap_ms: u32) -> (u32, String) {
    let (host, port) = server.rsplit_once(':').unwrap();
    let out = ns
        .output(
            "python3",
            &[
                "-c",
                DNS_CLIENT,
                host,
                port,
                name,
                &count.to_string(),
                &gap_ms.to_string(),
            ],
        )
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (n, rcode) = s.split_once(' ').unwrap_or(("0", ""));
    (n.parse().unwrap_or(0), rcode.to_string())
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn world() -> (Netns, Netns, tempfile::TempDir) {
    let s = Netns::create("dnss").unwrap();
    let c = Netns::create("dnsc").unwrap();
    connect(&s, &format!("{S_ADDR}/30"), &c, &format!("{C_ADDR}/30")).unwrap();
    let mut cmd = s.command(DNSMASQ);
    cmd.args([
        "--no-daemon",
        "--conf-file=/dev/null",
        "--port=5354",
        "--listen-address=127.0.0.1",
        "--bind-interfaces",
        "--no-resolv",
        "--no-hosts",
        "--pid-file=",
        "--user=",
        "--local=/example.com/",
        &format!("--host-record=open.example.com,{ANSWER}"),
    ]);
    s.spawn("dnsmasq", cmd).unwrap();
    (s, c, tempfile::tempdir().unwrap())
}

/// `hcp-olm-dns` listening on every address with the default client ranges (loopback and
/// private): a client at a non-private address gets REFUSED (no answer data) for any name,
/// a local client is answered; one client over its rate (default 200/s, burst 400) gets
/// at most burst + rate × time answers.
#[test]
fn security_dns_server_is_not_an_open_resolver_and_limits_each_client() {
    let (s, c, dir) = world();
    let listen = format!("{S_ADDR}:5300");
    let local = "127.0.0.1:5300";
    let conf = dir.path().join("dns.yaml");
    std::fs::write(
        &conf,
        "listen: 0.0.0.0:5300\ndns:\n  upstreams: { local: [\"127.0.0.1:5354\"] }\n  rules:\n    - { suffix: \".\", owner: local }\n  cache: { min_ttl: 60 }\n",
    )
    .unwrap();
    let mut cmd = s.command(DNS_BIN);
    cmd.arg("--config").arg(&conf);
    let p = s.spawn("hcp-olm-dns", cmd).unwrap();
    // An allowed client (loopback) is answered.
    wait_for("server answers", Duration::from_secs(20), || {
        ask(&s, local, "open.example.com", 1, 0) == (1, "NOERROR".into())
    });
    // A client outside the allowed ranges: REFUSED for any name, in zone or not.
    for name in ["open.example.com", "www.example.org"] {
        assert_eq!(
            ask(&c, &listen, name, 3, 10),
            (3, "REFUSED".into()),
            "{name} from {C_ADDR}\n{}",
            p.log_tail(20)
        );
    }
    // Rate: 2,000 queries as fast as possible from one allowed client: at most the burst
    // (400) plus 200/s for the time taken (the client's 0.3 s wait included).
    std::thread::sleep(Duration::from_secs(3)); // bucket full again
    let start = Instant::now();
    let (answered, _) = ask(&s, local, "open.example.com", 2000, 0);
    let secs = start.elapsed().as_secs_f64();
    let bound = 400 + (200.0 * secs).ceil() as u32;
    eprintln!("rate limit: {answered} of 2000 answered in {secs:.2} s (bound {bound})");
    assert!(answered >= 1, "nothing answered during the flood");
    assert!(
        answered <= bound,
        "{answered} answers > burst + rate × {secs:.2} s = {bound}"
    );
    // The same client within its rate is answered in full once its bucket refilled (UDP
    // on a loaded machine may drop some of a back-to-back burst, so the lower bound is
    // checked here, paced).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        ask(&s, local, "open.example.com", 20, 20),
        (20, "NOERROR".into()),
        "a client within its rate"
    );
}

/// The gateway's `dns.listen` with its default client ranges: a client at a non-private
/// address gets REFUSED.
#[test]
fn security_dns_gateway_listen_refuses_clients_outside_the_allowed_ranges() {
    let (s, c, dir) = world();
    let listen = format!("{S_ADDR}:5355");
    let key = PrivateKey::generate();
    let gw = serde_json::json!({
        "listen_port": 51820,
        "private_key": key.to_base64(),
        "agent_public_key": PrivateKey::generate().public_key().to_string(),
        "tunnel_address": hcp_olm_tunnel_api::GATEWAY_TUNNEL_ADDRESS,
        "agent_tunnel_address": hcp_olm_tunnel_api::AGENT_TUNNEL_ADDRESS,
        "connect_listen": "127.0.0.1:3128",
        "health_listen": "127.0.0.1:9101",
        "dns": {
            "local_upstreams": ["127.0.0.1:5354"],
            "rules": [{"suffix": ".", "owner": "local"}],
            "listen": "0.0.0.0:5355",
        },
        "allowed_services": [],
        "exposed_services": [],
    });
    let conf = dir.path().join("gateway.json");
    std::fs::write(&conf, serde_json::to_vec(&gw).unwrap()).unwrap();
    let mut cmd = s.command(GATEWAY);
    cmd.arg("--config").arg(&conf);
    let p = s.spawn("gateway", cmd).unwrap();
    // Answered for a pod in a private range (here: loopback) ...
    wait_for("gateway dns answers", Duration::from_secs(20), || {
        ask(&s, "127.0.0.1:5355", "open.example.com", 1, 0).1 == "NOERROR"
    });
    // ... REFUSED from elsewhere, for any name.
    for name in ["open.example.com", "www.example.org"] {
        assert_eq!(
            ask(&c, &listen, name, 2, 10),
            (2, "REFUSED".into()),
            "{name} from {C_ADDR}\n{}",
            p.log_tail(20)
        );
    }
}
