//! `hcp-olm-udp-impair`: a test tool that relays UDP between one client and one server with
//! random loss and a fixed delay in both directions (the kernel here has no netem qdisc).
//! Bounded by `--duration-secs`. Not part of any deployment. Exit codes: 0 when the
//! duration is over, 64 on a flag error (naming the flag), 1 otherwise.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use clap::Parser;
use tokio::net::UdpSocket;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Test tool: relay UDP between one client and one server with loss and delay"
)]
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

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hcp-olm-udp-impair: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hcp-olm-udp-impair: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(a: Args) -> anyhow::Result<()> {
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

hcp_olm_binkit::every_flag_has_help_test!(Args);
