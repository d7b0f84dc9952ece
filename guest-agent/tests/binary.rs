//! End-to-end tests of the `hcp-olm-dns` binary: config errors, admin endpoints, SIGTERM.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use hickory_proto::op::ResponseCode;
use hickory_proto::rr::RecordType;

const BIN: &str = env!("CARGO_BIN_EXE_hcp-olm-dns");

struct Proc(Option<Child>);

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(3))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, out))
}

fn wait_status(child: &mut Child, bound: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + bound;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn config_errors_exit_64_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\ndns:\n  upstreams: { local: ['127.0.0.1:53'] }\n  rules: [{ suffix: '.', owner: guest }]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("--config")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("dns.rules[0].owner"), "{err}");

    let out = Command::new(BIN)
        .arg("--config")
        .arg(dir.path().join("missing.toml"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
}

#[tokio::test]
async fn serves_dns_admin_endpoints_and_drains_on_sigterm() {
    let guest = Dnsmasq::start(&[
        "--local-ttl=30".to_string(),
        host("cat.openshift-marketplace.svc.cluster.local", "198.18.1.1"),
    ])
    .await;
    let local = Dnsmasq::start(&[host("cat.clusters-hc1.svc.cluster.local", "198.18.2.2")]).await;
    let dns_port = free_port();
    let admin_port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dns.toml");
    std::fs::write(
        &path,
        format!(
            r#"
listen = "127.0.0.1:1"
admin = "127.0.0.1:{admin_port}"
drain_timeout_ms = 3000
[dns]
cluster_domain = "cluster.local"
[dns.upstreams]
local = ["{}"]
guest = ["{}"]
[[dns.rules]]
suffix = "svc.cluster.local"
owner = "guest"
[[dns.rules]]
suffix = "svc.cluster.local"
namespace = "clusters-hc1"
owner = "local"
[[dns.rules]]
suffix = "."
owner = "local"
"#,
            local.addr, guest.addr
        ),
    )
    .unwrap();
    let dns: SocketAddr = format!("127.0.0.1:{dns_port}").parse().unwrap();
    let admin: SocketAddr = format!("127.0.0.1:{admin_port}").parse().unwrap();
    let mut p = Proc(Some(
        Command::new(BIN)
            .arg("--config")
            .arg(&path)
            .arg("--listen")
            .arg(dns.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));

    // Ready within 5 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some((200, _)) = http_get(admin, "/readyz") {
            break;
        }
        assert!(Instant::now() < deadline, "not ready within 5 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(http_get(admin, "/healthz").map(|x| x.0), Some(200));

    let m = udp(
        dns,
        "cat.openshift-marketplace.svc.cluster.local.",
        RecordType::A,
        None,
    )
    .await;
    assert_eq!(a_records(&m)[0].0, "198.18.1.1");
    let m = tcp(dns, "cat.clusters-hc1.svc.cluster.local.", RecordType::A).await;
    assert_eq!(a_records(&m)[0].0, "198.18.2.2");
    // Cached second time.
    let m = udp(
        dns,
        "cat.openshift-marketplace.svc.cluster.local.",
        RecordType::A,
        None,
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(a_records(&m)[0].1 <= 30);

    let (code, body) = http_get(admin, "/metrics").unwrap();
    assert_eq!(code, 200);
    assert!(
        body.contains(
            r#"hcp_olm_dns_queries_total{owner="guest",result="noerror",source="upstream"} 1"#
        ),
        "{body}"
    );
    assert!(body.contains("hcp_olm_dns_cache_hits_total 1"), "{body}");
    assert!(
        body.contains(&format!(
            "hcp_olm_build_info{{version=\"{}\",binary=\"hcp-olm-dns\"}} 1",
            env!("CARGO_PKG_VERSION")
        )),
        "{body}"
    );

    let child = p.0.as_mut().unwrap();
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = wait_status(child, Duration::from_secs(5)).expect("exited within 5 s of SIGTERM");
    assert_eq!(status.code(), Some(0));
}

/// Every daemon: an unknown or malformed flag exits 64 naming the flag (clap's own exit 2
/// before), `--help` exits 0, and `--log-format=json` logs one JSON object per line.
#[test]
fn every_daemon_flag_error_exits_64_and_logs_json_on_request() {
    let bins = [
        env!("CARGO_BIN_EXE_hcp-olm-dns"),
        env!("CARGO_BIN_EXE_hcp-olm-agent"),
        env!("CARGO_BIN_EXE_hcp-olm-gateway"),
        env!("CARGO_BIN_EXE_hcp-olm-tunnel"),
    ];
    for bin in bins {
        let out = Command::new(bin)
            .args(["--config", "/nonexistent", "--no-such-flag"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bin}: {err}");
        assert!(err.contains("--no-such-flag"), "{bin}: {err}");
        let out = Command::new(bin)
            .args(["--config", "/nonexistent", "--log-format", "xml"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{bin}: {err}");
        assert!(err.contains("--log-format"), "{bin}: {err}");
        let out = Command::new(bin).arg("--help").output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{bin}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("--log-format"),
            "{bin}"
        );
    }
    // JSON logs: the DNS daemon logs its config error path as JSON when asked.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\ndns:\n  upstreams: { local: ['127.0.0.1:9'] }\n  rules: [{ suffix: '.', owner: local }]\n",
    )
    .unwrap();
    let mut child = Proc(Some(
        Command::new(BIN)
            .args(["--log-format", "json", "--config"])
            .arg(&path)
            .env_remove("RUST_LOG")
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let c = child.0.as_mut().unwrap();
    let mut stderr = c.stderr.take().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    sigterm(c.id());
    let st = wait_status(c, Duration::from_secs(10)).expect("exits after SIGTERM");
    let mut text = String::new();
    stderr.read_to_string(&mut text).unwrap();
    assert!(st.success(), "{text}");
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "no logs at the default level (info)");
    for l in lines {
        let v: serde_json::Value =
            serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{l}");
    }
}

fn sigterm(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
}

/// With `listen: <ip>:0` the DNS daemon must serve UDP and TCP on one port. It used to bind UDP
/// on a kernel-chosen port and exit ("bind tcp …: Address already in use") when that port was
/// taken for TCP — a CI run of this very file failed that way. Here, in a namespace whose
/// ephemeral range is 40000–40099 with TCP 40000–40098 taken, only 40099 fits both: the old
/// code exits 99 times in 100 (the kernel's random pick), the daemon must find 40099.
#[tokio::test]
async fn dns_listen_port_zero_finds_one_port_free_for_udp_and_tcp() {
    use hcp_olm_e2e::netns::{Netns, in_netns};
    let ns = Netns::create("hdz").expect("create netns");
    let held = in_netns(ns.name(), || {
        std::fs::write("/proc/sys/net/ipv4/ip_local_port_range", "40000 40099")?;
        (40000..40099u16)
            .map(|p| std::net::TcpListener::bind(("127.0.0.1", p)))
            .collect::<std::io::Result<Vec<_>>>()
    })
    .await
    .expect("narrow the port range and take TCP 40000-40098");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dns.yaml");
    std::fs::write(
        &path,
        "listen: 127.0.0.1:0\ndns:\n  upstreams: { local: ['127.0.0.1:9'] }\n  rules: [{ suffix: '.', owner: local }]\n",
    )
    .unwrap();
    let mut p = Proc(Some(
        ns.command(BIN)
            .arg("--config")
            .arg(&path)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let child = p.0.as_mut().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut listening = String::new();
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("hcp-olm-dns exited ({st}) instead of serving: {err}");
        }
        let out = ns.output("ss", &["-Hlntu"]).unwrap();
        listening = String::from_utf8_lossy(&out.stdout).into_owned();
        let on_40099 = listening
            .lines()
            .filter(|l| l.contains("127.0.0.1:40099"))
            .count();
        if on_40099 == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let udp = listening
        .lines()
        .any(|l| l.starts_with("udp") && l.contains("127.0.0.1:40099"));
    let tcp = listening
        .lines()
        .any(|l| l.starts_with("tcp") && l.contains("127.0.0.1:40099"));
    assert!(
        udp && tcp,
        "not serving UDP and TCP on 40099 within 10 s:\n{listening}"
    );
    sigterm(child.id());
    let st = wait_status(child, Duration::from_secs(5)).expect("exits after SIGTERM");
    assert!(st.success());
    drop(held);
}
