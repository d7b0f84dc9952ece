//! Shared helpers for integration tests: real dnsmasq upstreams on loopback, an in-process
//! DNS server, and a tiny DNS client (UDP and TCP).
#![allow(dead_code)]

use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use hcp_olm_guest_agent::dns::{DnsConfigSpec, Engine};
use hcp_olm_guest_agent::server::{DnsMetrics, DnsServer};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

pub const DNSMASQ: &str = "/usr/sbin/dnsmasq";

/// A free loopback port (UDP and TCP both free at the time of the check), reserved for
/// this test process against other test processes too.
pub fn free_port() -> u16 {
    hcp_olm_e2e::ports::free_udp_tcp_port().expect("a free loopback port for UDP and TCP")
}

/// A dnsmasq child process; killed by PID and reaped on drop.
pub struct Dnsmasq {
    child: Option<Child>,
    pub addr: SocketAddr,
}

impl Dnsmasq {
    /// Start dnsmasq on 127.0.0.1:<free port> with extra args; waits until it answers.
    /// Panics (fails the test) when dnsmasq is missing: CI must install `dnsmasq-base`.
    ///
    /// The free port can be taken by another test between the probe and dnsmasq's bind
    /// (dnsmasq then exits 2, "address in use"): a few fresh ports are tried.
    pub async fn start(extra: &[String]) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            match Self::try_start_on(free_port(), extra).await {
                Ok(d) => return d,
                Err(e) => last = e,
            }
        }
        panic!("{last}")
    }

    pub async fn start_on(port: u16, extra: &[String]) -> Self {
        Self::try_start_on(port, extra)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    async fn try_start_on(port: u16, extra: &[String]) -> Result<Self, String> {
        assert!(
            std::path::Path::new(DNSMASQ).exists(),
            "{DNSMASQ} not found: install the Debian package dnsmasq-base"
        );
        let child = Command::new(DNSMASQ)
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                &format!("--port={port}"),
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                "--pid-file=",
                "--user=",
                "--local=/cluster.local/",
            ])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn dnsmasq");
        let mut d = Self {
            child: Some(child),
            addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        };
        // Ready when it answers anything (REFUSED for the root is fine).
        for _ in 0..100 {
            if let Ok(Some(_)) = udp_query_raw(
                d.addr,
                &query(1, "ready.check.", RecordType::A, None),
                Duration::from_millis(100),
            )
            .await
            {
                return Ok(d);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            if let Some(c) = d.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                d.child = None;
                return Err(format!("dnsmasq on port {port} exited early: {status}"));
            }
        }
        d.kill();
        Err(format!("dnsmasq on {} did not become ready", d.addr))
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn host(name: &str, ip: &str) -> String {
    format!("--host-record={name},{ip}")
}

/// A running in-process server.
pub struct TestServer {
    pub server: DnsServer,
    pub addr: SocketAddr,
}

impl TestServer {
    pub fn engine(&self) -> &Arc<Engine> {
        self.server.engine()
    }
}

/// Standard split config: guest owns svc.cluster.local, the HCP namespace `clusters-hc1` and
/// everything else is local. `extra` is appended YAML (cache/limits).
pub fn split_config(local: SocketAddr, guest: SocketAddr, extra: &str) -> String {
    format!(
        r#"
cluster_domain: cluster.local
upstreams:
  local: ["{local}"]
  guest: ["{guest}"]
rules:
  - {{ suffix: svc.cluster.local, owner: guest }}
  - {{ suffix: svc.cluster.local, namespace: clusters-hc1, owner: local }}
  - {{ suffix: ".", owner: local }}
{extra}
"#
    )
}

pub async fn start_server(yaml: &str) -> TestServer {
    let spec: DnsConfigSpec = serde_yaml_ng::from_str(yaml).expect("yaml");
    let engine = Arc::new(Engine::new(spec.validate().expect("valid config")));
    let server = DnsServer::new(engine, DnsMetrics::default());
    // UDP and TCP must share a port number; the TCP side of a fresh UDP port can be taken by
    // another socket, so try a bounded number of fresh ports.
    let mut bound = None;
    for _ in 0..50 {
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = udp.local_addr().unwrap();
        match tokio::net::TcpListener::bind(addr).await {
            Ok(tcp) => {
                bound = Some((udp, tcp, addr));
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => continue,
            Err(e) => panic!("binding TCP {addr}: {e}"),
        }
    }
    let (udp, tcp, addr) = bound.expect("a port free for both UDP and TCP within 50 tries");
    server.spawn_udp(udp);
    server.spawn_tcp(tcp);
    TestServer { server, addr }
}

pub fn query(id: u16, name: &str, rtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    if let Some(p) = edns {
        let mut e = Edns::new();
        e.set_max_payload(p);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

pub async fn udp_query_raw(
    server: SocketAddr,
    q: &[u8],
    wait: Duration,
) -> std::io::Result<Option<Vec<u8>>> {
    let s = UdpSocket::bind("127.0.0.1:0").await?;
    s.connect(server).await?;
    s.send(q).await?;
    let mut buf = vec![0u8; 65_535];
    match tokio::time::timeout(wait, s.recv(&mut buf)).await {
        Ok(Ok(n)) => Ok(Some(buf[..n].to_vec())),
        Ok(Err(e)) => Err(e),
        Err(_) => Ok(None),
    }
}

pub async fn udp(server: SocketAddr, name: &str, rtype: RecordType, edns: Option<u16>) -> Message {
    let id = rand_id();
    let raw = udp_query_raw(
        server,
        &query(id, name, rtype, edns),
        Duration::from_secs(5),
    )
    .await
    .expect("udp io")
    .expect("no udp answer within 5 s");
    let m = Message::from_vec(&raw).expect("parse answer");
    assert_eq!(m.metadata.id, id);
    m
}

pub async fn tcp_send(stream: &mut TcpStream, q: &[u8]) {
    let mut f = (q.len() as u16).to_be_bytes().to_vec();
    f.extend_from_slice(q);
    stream.write_all(&f).await.unwrap();
}

pub async fn tcp_recv(stream: &mut TcpStream) -> Message {
    let mut lb = [0u8; 2];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut lb))
        .await
        .expect("tcp answer within 5 s")
        .unwrap();
    let mut buf = vec![0u8; usize::from(u16::from_be_bytes(lb))];
    stream.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).expect("parse tcp answer")
}

pub async fn tcp(server: SocketAddr, name: &str, rtype: RecordType) -> Message {
    let mut s = TcpStream::connect(server).await.unwrap();
    let id = rand_id();
    tcp_send(&mut s, &query(id, name, rtype, None)).await;
    let m = tcp_recv(&mut s).await;
    assert_eq!(m.metadata.id, id);
    m
}

fn rand_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static N: AtomicU16 = AtomicU16::new(1);
    N.fetch_add(1, Ordering::Relaxed)
}

pub fn a_records(m: &Message) -> Vec<(String, u32)> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some((a.0.to_string(), r.ttl)),
            _ => None,
        })
        .collect()
}
