//! Container probes, run the way the kubelet runs them: from outside the pod, to the pod's IP
//! (inside the pod's network namespace when it has one). HTTP(S) GET with a 200–399 status,
//! TCP connect, and the gRPC health protocol over plaintext HTTP/2.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::plan::{ProbeAction, ProbePlan};

/// How the runner reaches a pod.
#[derive(Clone, Debug)]
pub enum Dialer {
    /// The pod shares the caller's network namespace (or is routable from it).
    Direct { ip: IpAddr },
    /// The pod has its own network namespace; sockets are created inside it.
    Netns { netns: String, ip: IpAddr },
}

impl Dialer {
    /// Connects to `port` on the pod within `timeout`.
    pub async fn connect(&self, port: u16, timeout: Duration) -> std::io::Result<TcpStream> {
        match self {
            Dialer::Direct { ip } => {
                tokio::time::timeout(timeout, TcpStream::connect(SocketAddr::new(*ip, port)))
                    .await
                    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))?
            }
            Dialer::Netns { netns, ip } => {
                let std = crate::netns::connect_tcp_in(netns, SocketAddr::new(*ip, port), timeout)
                    .await?;
                std.set_nonblocking(true)?;
                TcpStream::from_std(std)
            }
        }
    }
}

/// One probe's outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeResult {
    Success,
    Failure(String),
}

impl std::fmt::Display for ProbeResult {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeResult::Success => f.write_str("success"),
            ProbeResult::Failure(why) => f.write_str(why),
        }
    }
}

/// Runs `probe` once, bounded by its timeout.
pub async fn run(dialer: &Dialer, probe: &ProbePlan) -> ProbeResult {
    let timeout = Duration::from_secs(probe.timeout_s.into());
    let fut = async {
        match &probe.action {
            ProbeAction::Tcp { port } => dialer.connect(*port, timeout).await.map(|_| ()),
            ProbeAction::Http { https, port, path } => {
                http_get(dialer, *port, path, *https, timeout).await
            }
            ProbeAction::Grpc { port, service } => {
                grpc_health(dialer, *port, service.as_deref(), timeout).await
            }
            ProbeAction::Exec { argv } => Err(std::io::Error::other(format!(
                "exec probes ({argv:?}) are not supported by the runner"
            ))),
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(())) => ProbeResult::Success,
        Ok(Err(e)) => ProbeResult::Failure(format!("{:?}: {e}", probe.action)),
        Err(_) => ProbeResult::Failure(format!(
            "{:?}: timed out after {}s",
            probe.action, probe.timeout_s
        )),
    }
}

async fn http_get(
    dialer: &Dialer,
    port: u16,
    path: &str,
    https: bool,
    timeout: Duration,
) -> std::io::Result<()> {
    let tcp = dialer.connect(port, timeout).await?;
    let host = match dialer {
        Dialer::Direct { ip } | Dialer::Netns { ip, .. } => *ip,
    };
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: kube-probe/1.36\r\nAccept: */*\r\nConnection: close\r\n\r\n",
        SocketAddr::new(host, port)
    );
    let mut response = Vec::new();
    if https {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(NoVerify))
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::IpAddress(host.into());
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await?;
        tls.write_all(request.as_bytes()).await?;
        let _ = tls.read_to_end(&mut response).await;
    } else {
        let mut tcp = tcp;
        tcp.write_all(request.as_bytes()).await?;
        let _ = tcp.read_to_end(&mut response).await;
    }
    let head = String::from_utf8_lossy(&response[..response.len().min(64)]).into_owned();
    let code: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("no HTTP status in {head:?}")))?;
    if (200..400).contains(&code) {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("HTTP status {code}")))
    }
}

async fn grpc_health(
    dialer: &Dialer,
    port: u16,
    service: Option<&str>,
    timeout: Duration,
) -> std::io::Result<()> {
    let tcp = dialer.connect(port, timeout).await?;
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .map_err(std::io::Error::other)?;
    tokio::spawn(conn);
    // grpc.health.v1.HealthCheckRequest { string service = 1; }
    let mut msg = Vec::new();
    if let Some(s) = service {
        msg.push(0x0a);
        msg.push(u8::try_from(s.len()).map_err(std::io::Error::other)?);
        msg.extend_from_slice(s.as_bytes());
    }
    let mut frame = vec![0u8];
    frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    frame.extend_from_slice(&msg);
    let req = http::Request::post(format!(
        "http://{}/grpc.health.v1.Health/Check",
        match dialer {
            Dialer::Direct { ip } | Dialer::Netns { ip, .. } => SocketAddr::new(*ip, port),
        }
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(Full::new(Bytes::from(frame)))
    .map_err(std::io::Error::other)?;
    let resp = sender
        .send_request(req)
        .await
        .map_err(std::io::Error::other)?;
    let headers_status = resp
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let collected = resp
        .into_body()
        .collect()
        .await
        .map_err(std::io::Error::other)?;
    let trailer_status = collected
        .trailers()
        .and_then(|t| t.get("grpc-status"))
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let status = trailer_status.or(headers_status).unwrap_or_default();
    if status != "0" {
        return Err(std::io::Error::other(format!("grpc-status {status:?}")));
    }
    let body = collected.to_bytes();
    // HealthCheckResponse { ServingStatus status = 1; } SERVING = 1
    let serving = body.len() >= 7 && body[5] == 0x08 && body[6] == 1;
    if serving {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "health response is not SERVING: {body:?}"
        )))
    }
}

/// The kubelet does not verify probe certificates; neither do we.
#[derive(Debug)]
struct NoVerify;

impl rustls::client::danger::ServerCertVerifier for NoVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &rustls::pki_types::CertificateDer<'_>,
        _dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}
