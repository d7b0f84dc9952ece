//! STAND-IN for a hostile guest API server (issue 35, item 1), shared by `guest_bounds.rs`
//! and `runtime.rs`: no real API server sends an endless body or trickles one a byte at a
//! time, which is the case under test. It speaks TLS and HTTP/1.1 on loopback; every watch
//! fails (500), every other request is answered `200` with a JSON list that never ends (or,
//! in trickle mode, that never ends slowly).
#![allow(dead_code)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Most a stand-in streams into one response (an "endless" body that still ends, so a test
/// on code that reads it all cannot run the machine out of memory before its own bound
/// stops it).
const STREAM_CAP: u64 = 8 << 30;

/// How the stand-in answers a request that is not a watch.
#[derive(Clone, Copy, Debug)]
pub enum Mode {
    /// As fast as the connection takes it.
    Endless,
    /// One small item a second.
    Trickle,
}

/// STAND-IN for a hostile guest API server (see the module docs).
pub struct Hostile {
    addr: std::net::SocketAddr,
    ca_pem: String,
    /// Body bytes sent over all responses.
    streamed: Arc<AtomicU64>,
    /// Requests that were not watches.
    reads: Arc<AtomicU64>,
    /// TCP connections accepted.
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Hostile {
    pub async fn start(mode: Mode) -> Result<Self> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let ca = hcp_olm_e2e::pki::Ca::new("hostile guest stand-in CA")?;
        let server = ca.issue(
            "hostile",
            &[],
            &["127.0.0.1", "localhost"],
            hcp_olm_e2e::pki::Usage::Server,
        )?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_slice(server.cert_pem.as_bytes())?],
                PrivateKeyDer::from_pem_slice(server.key_pem.as_bytes())?,
            )?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let streamed = Arc::new(AtomicU64::new(0));
        let reads = Arc::new(AtomicU64::new(0));
        let connections = Arc::new(AtomicU64::new(0));
        let (s, r, c) = (streamed.clone(), reads.clone(), connections.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                c.fetch_add(1, Ordering::Relaxed);
                let (acceptor, s, r) = (acceptor.clone(), s.clone(), r.clone());
                tokio::spawn(async move {
                    if let Ok(tls) = acceptor.accept(tcp).await {
                        let _ = serve(tls, mode, &s, &r).await;
                    }
                });
            }
        });
        Ok(Self {
            addr,
            ca_pem: ca.cert_pem().to_string(),
            streamed,
            reads,
            connections,
            task,
        })
    }

    pub fn kubeconfig(&self) -> String {
        self.kubeconfig_for(&format!("https://{}", self.addr))
    }

    /// A kubeconfig naming `server`, trusting the stand-in's CA (inline material only).
    pub fn kubeconfig_for(&self, server: &str) -> String {
        use base64::Engine as _;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: g\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n    token: hostile\ncontexts:\n- name: g\n  context: {{cluster: g, user: u}}\ncurrent-context: g\n"
        )
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn streamed(&self) -> u64 {
        self.streamed.load(Ordering::Relaxed)
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }
}

/// One connection: each request's head is read (at most 64 KiB), watches get a 500, any
/// other request a `200` whose body does not end (the connection is then closed).
async fn serve<S>(mut io: S, mode: Mode, streamed: &AtomicU64, reads: &AtomicU64) -> Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    loop {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            ensure!(head.len() < 64 << 10, "request head too long");
            if io.read(&mut byte).await? == 0 {
                return Ok(());
            }
            head.push(byte[0]);
        }
        let line = String::from_utf8_lossy(&head);
        let target = line.split_whitespace().nth(1).unwrap_or_default();
        if target.contains("watch=true") || target.contains("watch=1") {
            let body = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"no watches here","code":500}"#;
            io.write_all(
                format!(
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await?;
            continue;
        }
        reads.fetch_add(1, Ordering::Relaxed);
        // No length and no chunking: the body runs until the connection closes.
        io.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"apiVersion\":\"v1\",\"kind\":\"List\",\"metadata\":{},\"items\":[",
        )
        .await?;
        let item = format!(r#"{{"metadata":{{"name":"{}"}}}},"#, "x".repeat(200));
        let chunk = item.repeat((64 << 10) / item.len());
        let mut sent = 0u64;
        while sent < STREAM_CAP {
            let piece = match mode {
                Mode::Endless => chunk.as_bytes(),
                Mode::Trickle => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    item.as_bytes()
                }
            };
            io.write_all(piece).await?;
            io.flush().await?;
            sent += piece.len() as u64;
            streamed.fetch_add(piece.len() as u64, Ordering::Relaxed);
        }
        return Ok(());
    }
}

/// This process's resident set size in bytes (Linux).
pub fn rss() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .context("no VmRSS")?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    Ok(kib * 1024)
}
