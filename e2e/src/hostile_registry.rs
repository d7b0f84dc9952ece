//! A STAND-IN for a hostile OCI registry (or mirror) on loopback: a tiny HTTP/1.1 server
//! whose answers the test chooses per request, including ones no real registry gives
//! (content that does not match the digest asked for, a manifest that never ends).
//! It counts the requests it answered, so tests can check that lookups are shared.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;

/// What the stand-in answers to one request.
#[derive(Clone, Debug)]
pub enum Reply {
    /// A status, extra headers and a body (`Content-Length` is added).
    Full {
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
    },
    /// 200 with `Content-Length: len` and `len` bytes of `b' '` written in 64 KiB chunks
    /// (stops when the client goes away).
    Endless { len: u64 },
    /// 200 with `body` and `headers`, the head at once, then `body` in pieces of `chunk`
    /// bytes with `every` before each (a slow registry that does finish).
    Paced {
        body: Vec<u8>,
        headers: Vec<(String, String)>,
        chunk: usize,
        every: std::time::Duration,
    },
}

impl Reply {
    /// 200 with `body` and `headers`.
    pub fn ok(body: Vec<u8>, headers: &[(&str, &str)]) -> Self {
        Self::Full {
            status: 200,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body,
        }
    }

    /// A status with an empty body.
    pub fn status(status: u16) -> Self {
        Self::Full {
            status,
            headers: vec![],
            body: vec![],
        }
    }
}

type Handler = dyn Fn(&str, &str, Option<&str>) -> Reply + Send + Sync;

/// The running stand-in; dropping it stops accepting connections.
pub struct HostileRegistry {
    addr: String,
    requests: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for HostileRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl HostileRegistry {
    /// Starts listening on a free loopback port; `handler(method, path)` picks each answer.
    /// Must be called inside a tokio runtime.
    pub async fn start(
        handler: impl Fn(&str, &str) -> Reply + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        Self::start_with_auth(move |method, path, _| handler(method, path)).await
    }

    /// [`HostileRegistry::start`] whose `handler(method, path, authorization)` also sees the
    /// request's `Authorization` header.
    pub async fn start_with_auth(
        handler: impl Fn(&str, &str, Option<&str>) -> Reply + Send + Sync + 'static,
    ) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let requests = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        let counter = requests.clone();
        let task = tokio::spawn(async move {
            // Bounded by the test: the task is aborted when the stand-in is dropped.
            while let Ok((mut sock, _)) = listener.accept().await {
                let handler = handler.clone();
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                        if head.len() > 64 << 10 {
                            return;
                        }
                    }
                    let text = String::from_utf8_lossy(&head);
                    let mut first = text.lines().next().unwrap_or("").split(' ');
                    let method = first.next().unwrap_or("").to_string();
                    let path = first.next().unwrap_or("").to_string();
                    let authorization = text.lines().find_map(|l| {
                        let (k, v) = l.split_once(':')?;
                        k.eq_ignore_ascii_case("authorization")
                            .then(|| v.trim().to_string())
                    });
                    counter.fetch_add(1, Ordering::SeqCst);
                    let reply = handler(&method, &path, authorization.as_deref());
                    let head_only = method == "HEAD";
                    let _ = write_reply(&mut sock, reply, head_only).await;
                });
            }
        });
        Ok(Self {
            addr,
            requests,
            task,
        })
    }

    /// `127.0.0.1:<port>`, usable as the registry part of image references.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn write_reply(
    sock: &mut tokio::net::TcpStream,
    reply: Reply,
    head_only: bool,
) -> std::io::Result<()> {
    match reply {
        Reply::Full {
            status,
            headers,
            body,
        } => {
            let mut out = format!(
                "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            sock.write_all(out.as_bytes()).await?;
            if !head_only {
                sock.write_all(&body).await?;
            }
        }
        Reply::Endless { len } => {
            let out = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/vnd.oci.image.manifest.v1+json\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
            );
            sock.write_all(out.as_bytes()).await?;
            if !head_only {
                let chunk = vec![b' '; 64 << 10];
                let mut left = len;
                while left > 0 {
                    let n = left.min(chunk.len() as u64) as usize;
                    sock.write_all(&chunk[..n]).await?;
                    left -= n as u64;
                }
            }
        }
        Reply::Paced {
            body,
            headers,
            chunk,
            every,
        } => {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n",
                body.len()
            );
            for (k, v) in headers {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
            out.push_str("\r\n");
            sock.write_all(out.as_bytes()).await?;
            if !head_only {
                for piece in body.chunks(chunk.max(1)) {
                    tokio::time::sleep(every).await;
                    sock.write_all(piece).await?;
                }
            }
        }
    }
    sock.shutdown().await
}
