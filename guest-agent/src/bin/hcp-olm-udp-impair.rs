//! `hcp-olm-udp-impair`: a test tool that relays UDP between one client and one server with
//! random loss and a fixed delay in both directions (the kernel here has no netem qdisc).
//! Bounded by `--duration-secs`. Not part of any deployment.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use tokio::net::UdpSocket;

#[derive(Debug, Parser)]
struct Args {
    /// Address clients send to.
    #[arg(long)]
    listen: SocketAddr,
    /// Server to relay to.
    #[arg(long)]
    server: SocketAddr,
    /// Loss probability per datagram and direction, in percent.
    #[arg(long, default_value_t = 5.0)]
    loss_percent: f64,
    /// One-way delay in milliseconds.
    #[arg(long, default_value_t = 50)]
    delay_ms: u64,
    /// Exit after this long.
    #[arg(long, default_value_t = 600)]
    duration_secs: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let front = Arc::new(UdpSocket::bind(a.listen).await?);
    let back_bind: SocketAddr = if a.server.is_ipv4() {
        "0.0.0.0:0".parse()?
    } else {
        "[::]:0".parse()?
    };
    let back = Arc::new(UdpSocket::bind(back_bind).await?);
    back.connect(a.server).await?;
    let client: Arc<Mutex<Option<SocketAddr>>> = Arc::new(Mutex::new(None));
    let delay = Duration::from_millis(a.delay_ms);
    let loss = a.loss_percent / 100.0;
    let (f, b, c) = (Arc::clone(&front), Arc::clone(&back), Arc::clone(&client));
    let up = tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok((n, from)) = f.recv_from(&mut buf).await else {
                continue;
            };
            *c.lock().unwrap_or_else(|p| p.into_inner()) = Some(from);
            if rand::random::<f64>() < loss {
                continue;
            }
            let d = buf[..n].to_vec();
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = b.send(&d).await;
            });
        }
    });
    let (f, b, c) = (front, back, client);
    let down = tokio::spawn(async move {
        let mut buf = vec![0u8; 65_536];
        loop {
            let Ok(n) = b.recv(&mut buf).await else {
                continue;
            };
            let to = *c.lock().unwrap_or_else(|p| p.into_inner());
            let Some(to) = to else { continue };
            if rand::random::<f64>() < loss {
                continue;
            }
            let d = buf[..n].to_vec();
            let f = Arc::clone(&f);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let _ = f.send_to(&d, to).await;
            });
        }
    });
    tokio::time::sleep(Duration::from_secs(a.duration_secs)).await;
    up.abort();
    down.abort();
    Ok(())
}
