//! Dialing a catalog: plain TCP or through an HTTP CONNECT proxy (TCP `host:port`, or a
//! Unix socket `unix:/path` as Konnectivity's proxy-server offers), bounded by a timeout,
//! with errors naming the address.

use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tonic::transport::{Channel, Endpoint, Uri};

/// Why a catalog could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The address is not host:port.
    #[error("catalog {addr}: invalid address (want host:port): {reason}")]
    Address { addr: String, reason: String },
    /// Connecting failed.
    #[error("catalog {addr}: unreachable: {reason}")]
    Unreachable { addr: String, reason: String },
    /// Connecting took longer than the timeout.
    #[error("catalog {addr}: no connection within {timeout:?}")]
    Timeout { addr: String, timeout: Duration },
}

/// Opens a gRPC channel to `addr` (host:port), optionally through the HTTP
/// CONNECT proxy `proxy` (host:port or http://host:port).
pub async fn dial(
    addr: &str,
    proxy: Option<&str>,
    timeout: Duration,
) -> Result<Channel, DialError> {
    let bad = |reason: String| DialError::Address {
        addr: addr.to_string(),
        reason,
    };
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| bad("missing port".into()))?;
    if host.is_empty() {
        return Err(bad("missing host".into()));
    }
    port.parse::<u16>().map_err(|e| bad(format!("port: {e}")))?;
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| bad(e.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout);
    let unreachable = |e: tonic::transport::Error| DialError::Unreachable {
        addr: addr.to_string(),
        reason: source_chain(&e),
    };
    let fut = async {
        match proxy {
            None => endpoint.connect().await.map_err(unreachable),
            Some(p) => {
                let proxy = p
                    .trim_start_matches("http://")
                    .trim_end_matches('/')
                    .to_string();
                let target = addr.to_string();
                let connector = tower::service_fn(move |_: Uri| {
                    let (proxy, target) = (proxy.clone(), target.clone());
                    async move {
                        let io: Box<dyn ProxiedIo> = match proxy.strip_prefix("unix:") {
                            Some(path) => {
                                let mut u = UnixStream::connect(path).await?;
                                connect_handshake(&mut u, &target).await?;
                                Box::new(u)
                            }
                            None => Box::new(connect_via_proxy(&proxy, &target).await?),
                        };
                        Ok::<_, std::io::Error>(TokioIo::new(io))
                    }
                });
                endpoint
                    .connect_with_connector(connector)
                    .await
                    .map_err(unreachable)
            }
        }
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(DialError::Timeout {
            addr: addr.to_string(),
            timeout,
        }),
    }
}

fn source_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// A byte stream a proxied connection runs over (TCP or Unix socket).
trait ProxiedIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> ProxiedIo for T {}

/// Opens a tunnel to `target` through the HTTP CONNECT proxy at `proxy`.
pub async fn connect_via_proxy(proxy: &str, target: &str) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect(proxy).await?;
    // gRPC writes a request as several frames; without this Nagle holds the later ones
    // for the proxy's delayed ACK (~40 ms a call). tonic sets it on its own connections.
    s.set_nodelay(true)?;
    connect_handshake(&mut s, target).await?;
    Ok(s)
}

/// Sends `CONNECT target` on `s` and reads the response head (and nothing after it).
async fn connect_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    target: &str,
) -> std::io::Result<()> {
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    // Read the response head byte by byte so no tunnelled bytes are consumed.
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 8192 {
            return Err(std::io::Error::other("proxy response head too long"));
        }
        if s.read(&mut b).await? == 0 {
            return Err(std::io::Error::other(
                "proxy closed the connection during CONNECT",
            ));
        }
        head.push(b[0]);
    }
    let text = String::from_utf8_lossy(&head);
    let status = text.lines().next().unwrap_or_default().to_string();
    let code = status.split_whitespace().nth(1).unwrap_or_default();
    if !code.starts_with('2') {
        return Err(std::io::Error::other(format!(
            "proxy refused CONNECT {target}: {status}"
        )));
    }
    Ok(())
}
