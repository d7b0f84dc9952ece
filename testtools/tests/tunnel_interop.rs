//! The tunnel engine against a standard WireGuard peer (wireguard-go configured with `wg`),
//! in network namespaces: A runs `hcp-olm-tunnel-ping` (our userspace engine), B runs
//! wireguard-go whose kernel answers ICMP and a UDP echo server on the tunnel address.
//! Underlay 198.18.40.0/29, tunnel 198.18.41.0/24; both exist only inside the namespaces.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use hcp_olm_e2e::netns::{Netns, NsProcess, connect, unique_name};
use hcp_olm_guest_agent::tunnel::PrivateKey;

const PING: &str = env!("CARGO_BIN_EXE_hcp-olm-tunnel-ping");
const A_ADDR: &str = "198.18.40.1";
const A_ADDR2: &str = "198.18.40.3";
const B_ADDR: &str = "198.18.40.2";
const WG_PORT: u16 = 51820;
const TUN_B: &str = "198.18.41.1";
const TUN_A: &str = "198.18.41.2";

/// wireguard-go in namespace B. Dropped before its namespace: kills the process by PID, waits,
/// and removes its global UAPI socket.
struct WgGo<'a> {
    ns: &'a Netns,
    ifname: String,
    key_file: PathBuf,
    our_public: String,
    proc: Option<NsProcess>,
}

impl<'a> WgGo<'a> {
    fn start(ns: &'a Netns, dir: &Path, our_public: String) -> (Self, String) {
        let key = PrivateKey::generate();
        let key_file = dir.join("wg-b.key");
        std::fs::write(&key_file, key.to_base64()).unwrap();
        let mut w = Self {
            ns,
            ifname: unique_name("wg"),
            key_file,
            our_public,
            proc: None,
        };
        w.launch();
        (w, key.public_key().to_string())
    }

    fn socket(&self) -> PathBuf {
        PathBuf::from(format!("/var/run/wireguard/{}.sock", self.ifname))
    }

    fn launch(&mut self) {
        let _ = std::fs::remove_file(self.socket()); // stale after a kill -9
        let mut cmd = self.ns.command(wireguard_go());
        cmd.env("WG_PROCESS_FOREGROUND", "1")
            .args(["-f", &self.ifname]);
        let p = self.ns.spawn("wireguard-go", cmd).unwrap();
        wait_for("wireguard-go UAPI socket", Duration::from_secs(10), || {
            self.socket().exists()
        })
        .unwrap_or_else(|e| panic!("{e}\n{}", p.log_tail(20)));
        self.proc = Some(p);
        let port = WG_PORT.to_string();
        let out = self
            .ns
            .output(
                "wg",
                &[
                    "set",
                    &self.ifname,
                    "private-key",
                    self.key_file.to_str().unwrap(),
                    "listen-port",
                    &port,
                    "peer",
                    &self.our_public,
                    "allowed-ips",
                    &format!("{TUN_A}/32"),
                    "persistent-keepalive",
                    "3",
                ],
            )
            .unwrap();
        assert!(out.status.success(), "wg set: {out:?}");
        self.ns
            .ip(&["addr", "add", &format!("{TUN_B}/24"), "dev", &self.ifname])
            .unwrap();
        self.ns
            .ip(&["link", "set", &self.ifname, "mtu", "1420", "up"])
            .unwrap();
    }

    fn kill(&mut self) {
        if let Some(p) = self.proc.take() {
            p.kill();
        }
    }

    fn show(&self, what: &str) -> String {
        let out = self.ns.output("wg", &["show", &self.ifname, what]).unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for WgGo<'_> {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(self.socket());
    }
}

fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Result<Duration, String> {
    let start = Instant::now();
    for _ in 0..10_000 {
        if f() {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(format!("timed out after {limit:?} waiting for {what}"))
}

struct Setup {
    a: Netns,
    b: Netns,
    a_if: String,
    dir: tempfile::TempDir,
    our_key_file: PathBuf,
    our_public: String,
}

fn setup() -> Setup {
    let a = Netns::create("tna").unwrap();
    let b = Netns::create("tnb").unwrap();
    let (a_if, _) = connect(&a, &format!("{A_ADDR}/29"), &b, &format!("{B_ADDR}/29")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = PrivateKey::generate();
    let our_key_file = dir.path().join("a.key");
    std::fs::write(&our_key_file, key.to_base64()).unwrap();
    Setup {
        a,
        b,
        a_if,
        dir,
        our_key_file,
        our_public: key.public_key().to_string(),
    }
}

fn ping_args(s: &Setup, peer_public: &str, listen: &str, duration: u64) -> Vec<String> {
    [
        "--listen",
        listen,
        "--private-key-file",
        s.our_key_file.to_str().unwrap(),
        "--peer-public-key",
        peer_public,
        "--endpoint",
        &format!("{B_ADDR}:{WG_PORT}"),
        "--source",
        TUN_A,
        "--target",
        TUN_B,
        "--keepalive",
        "3",
        "--dead-peer-timeout",
        "8",
        "--duration-secs",
        &duration.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run_ping(s: &Setup, args: &[String]) -> String {
    let out =
        s.a.command(PING)
            .args(args)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "ping failed: {out:?}");
    stdout
}

/// (seq, t_ms) of every reply line.
fn replies(log: &str) -> Vec<(u32, u64)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("reply seq=")?;
            let (seq, t) = rest.split_once(" t_ms=")?;
            Some((seq.parse().ok()?, t.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn key_format_matches_wg_pubkey() {
    let key = PrivateKey::generate();
    let mut child = std::process::Command::new("wg")
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(key.to_base64().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        key.public_key().to_string()
    );
}

#[test]
fn icmp_and_udp_echo_through_wireguard_go() {
    let s = setup();
    let (wg, wg_public) = WgGo::start(&s.b, s.dir.path(), s.our_public.clone());
    let listen = format!("{A_ADDR}:40100");

    let log = run_ping(&s, &ping_args(&s, &wg_public, &listen, 4));
    let r = replies(&log);
    assert!(r.len() >= 10, "too few ICMP echo replies:\n{log}");
    assert!(r[0].1 < 3_000, "first reply after {} ms:\n{log}", r[0].1);
    assert!(log.contains("summary"), "{log}");
    assert!(
        wg.show("endpoints").contains(&listen),
        "wireguard-go learned our endpoint: {}",
        wg.show("endpoints")
    );

    // UDP: a python echo server bound to the tunnel address in B.
    let mut echo = s.b.command("python3");
    echo.args([
        "-c",
        "import socket\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n\
         s.bind(('198.18.41.1',7007))\nwhile True:\n d,a=s.recvfrom(2048)\n s.sendto(d,a)\n",
    ]);
    let _echo = s.b.spawn("udp-echo", echo).unwrap();
    let mut args = ping_args(&s, &wg_public, &listen, 3);
    args.extend(["--udp-port".to_string(), "7007".to_string()]);
    // The echo server may need a moment; the ping retries every 200 ms for 3 s.
    let log = run_ping(&s, &args);
    assert!(replies(&log).len() >= 5, "too few UDP echoes:\n{log}");
    drop(wg);
}

#[test]
fn recovers_after_wireguard_go_is_killed_and_restarted() {
    let s = setup();
    let (mut wg, wg_public) = WgGo::start(&s.b, s.dir.path(), s.our_public.clone());
    let mut cmd = s.a.command(PING);
    cmd.args(ping_args(&s, &wg_public, &format!("{A_ADDR}:40200"), 45));
    let ping = s.a.spawn("ping", cmd).unwrap();
    let log = || std::fs::read_to_string(ping.log_path()).unwrap_or_default();
    wait_for("first replies", Duration::from_secs(10), || {
        replies(&log()).len() >= 3
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));

    wg.kill();
    std::thread::sleep(Duration::from_secs(2));
    let before = replies(&log()).len();
    wg.launch();
    let restarted = Instant::now();
    let took = wait_for("replies after restart", Duration::from_secs(20), || {
        replies(&log()).len() > before
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    eprintln!("recovered {took:?} after wireguard-go restart");
    assert!(took <= Duration::from_secs(15), "recovery took {took:?}");
    // Stays up.
    let n = replies(&log()).len();
    wait_for("steady replies", Duration::from_secs(5), || {
        replies(&log()).len() >= n + 5
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    assert!(restarted.elapsed() < Duration::from_secs(40));
    ping.kill();
    drop(wg);
}

#[test]
fn agent_kill_9_then_new_agent_rehandshakes() {
    let s = setup();
    let (wg, wg_public) = WgGo::start(&s.b, s.dir.path(), s.our_public.clone());
    let listen = format!("{A_ADDR}:40300");
    let mut cmd = s.a.command(PING);
    cmd.args(ping_args(&s, &wg_public, &listen, 30));
    let ping = s.a.spawn("ping", cmd).unwrap();
    let log = || std::fs::read_to_string(ping.log_path()).unwrap_or_default();
    wait_for("first replies", Duration::from_secs(10), || {
        replies(&log()).len() >= 3
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", log()));
    ping.kill(); // SIGKILL, waited for

    // A new agent with the same key (fresh handshake state, same port) is accepted at once.
    let log = run_ping(&s, &ping_args(&s, &wg_public, &listen, 3));
    let r = replies(&log);
    assert!(!r.is_empty(), "no replies after agent restart:\n{log}");
    assert!(r[0].1 < 2_000, "first reply after {} ms:\n{log}", r[0].1);
    drop(wg);
}

#[test]
fn wireguard_go_follows_our_source_address_change() {
    let s = setup();
    s.a.ip(&["addr", "add", &format!("{A_ADDR2}/29"), "dev", &s.a_if])
        .unwrap();
    let (wg, wg_public) = WgGo::start(&s.b, s.dir.path(), s.our_public.clone());
    let new_listen = format!("{A_ADDR2}:40401");
    let mut args = ping_args(&s, &wg_public, &format!("{A_ADDR}:40400"), 6);
    args.extend([
        "--rebind-after-secs".to_string(),
        "2".to_string(),
        "--rebind-listen".to_string(),
        new_listen.clone(),
    ]);
    let log = run_ping(&s, &args);
    let (_, after) = log
        .split_once("rebound local=")
        .unwrap_or_else(|| panic!("no rebind:\n{log}"));
    assert!(
        replies(after).len() >= 5,
        "too few replies after roaming:\n{log}"
    );
    assert!(
        replies(&log).len() > replies(after).len(),
        "replies before roaming:\n{log}"
    );
    let endpoints = wg.show("endpoints");
    assert!(
        endpoints.contains(&new_listen),
        "endpoint not updated: {endpoints}"
    );
    drop(wg);
}

/// The pinned wireguard-go (`make tools`, e2e/tools/versions.env), not a distribution's.
fn wireguard_go() -> PathBuf {
    hcp_olm_e2e::tools::bin("wireguard-go").unwrap_or_else(|e| panic!("{e}"))
}
