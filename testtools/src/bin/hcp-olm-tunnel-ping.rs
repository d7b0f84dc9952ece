//! hcp-olm-tunnel-ping: bring up the tunnel to one WireGuard peer from userspace and send ICMP
//! echo requests (or UDP datagrams) through it. A diagnostic for the tunnel engine and the
//! harness of its interoperability tests. Prints one line per event on stdout:
//! `reply seq=N t_ms=T`, `rebound local=ADDR`, then `summary sent=N received=M ...`.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use hcp_olm_guest_agent::tunnel::packet::{self, IcmpEcho, Ipv4, Udp};
use hcp_olm_guest_agent::tunnel::{Cidr, Peer, PeerConfig, PrivateKey, PublicKey, driver};
use tokio::net::UdpSocket;
use tokio_util::sync::CancellationToken;

#[derive(Debug, Parser)]
#[command(version, about = "Send pings through a userspace WireGuard tunnel")]
struct Args {
    /// Local UDP address to bind.
    #[arg(long)]
    listen: SocketAddr,
    /// File with our private key (base64, as `wg genkey` writes it).
    #[arg(long)]
    private_key_file: PathBuf,
    /// The peer's public key (base64).
    #[arg(long)]
    peer_public_key: String,
    /// The peer's UDP endpoint.
    #[arg(long)]
    endpoint: SocketAddr,
    /// Our tunnel address (source of the probes).
    #[arg(long)]
    source: Ipv4Addr,
    /// Address to probe through the tunnel.
    #[arg(long)]
    target: Ipv4Addr,
    /// Send UDP to this port (expecting an echo) instead of ICMP echo.
    #[arg(long)]
    udp_port: Option<u16>,
    /// Milliseconds between probes.
    #[arg(long, default_value_t = 200)]
    interval_ms: u64,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 10)]
    duration_secs: u64,
    /// Persistent keepalive (seconds).
    #[arg(long, default_value_t = 5)]
    keepalive: u16,
    /// Restart the handshake after this many seconds without hearing from the peer.
    #[arg(long, default_value_t = 12)]
    dead_peer_timeout: u64,
    /// After this many seconds, rebind to `--rebind-listen` (keeping the session).
    #[arg(long, requires = "rebind_listen")]
    rebind_after_secs: Option<u64>,
    /// The address to rebind to.
    #[arg(long)]
    rebind_listen: Option<SocketAddr>,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    args.log.init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let key_text = std::fs::read_to_string(&args.private_key_file)
        .with_context(|| format!("reading {}", args.private_key_file.display()))?;
    let private_key = PrivateKey::from_base64(&key_text).context("private_key_file")?;
    let peer_public_key =
        PublicKey::from_base64(&args.peer_public_key).context("peer_public_key")?;
    let peer = Peer::new(PeerConfig {
        private_key,
        peer_public_key,
        preshared_key: None,
        endpoint: Some(args.endpoint),
        persistent_keepalive: Some(args.keepalive),
        dead_peer_timeout: Some(Duration::from_secs(args.dead_peer_timeout)),
        allowed_ips: vec![Cidr::new(args.target.into(), 32)],
        index: rand::random(),
        previous_private_keys: Vec::new(),
        previous_peer_public_keys: Vec::new(),
        solicit_after: None,
    });
    let socket = UdpSocket::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let mut cancel = CancellationToken::new();
    let (mut h, mut task) = driver::spawn(socket, peer, cancel.clone());
    let start = Instant::now();
    let end = start + Duration::from_secs(args.duration_secs);
    let mut rebind_at = args
        .rebind_after_secs
        .map(|s| start + Duration::from_secs(s));
    let mut interval = tokio::time::interval(Duration::from_millis(args.interval_ms.max(1)));
    let (mut sent, mut received) = (0u16, 0u32);
    let id: u16 = rand::random();
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end.into()) => break,
            _ = interval.tick() => {
                if rebind_at.is_some_and(|t| Instant::now() >= t) {
                    rebind_at = None;
                    if let Some(addr) = args.rebind_listen {
                        cancel.cancel();
                        let peer = task.await.context("driver task")?;
                        let socket = UdpSocket::bind(addr).await.with_context(|| format!("binding {addr}"))?;
                        cancel = CancellationToken::new();
                        (h, task) = driver::spawn(socket, peer, cancel.clone());
                        println!("rebound local={addr}");
                    }
                }
                sent = sent.wrapping_add(1);
                let p = match args.udp_port {
                    Some(port) => packet::udp_packet(args.source, 40_000, args.target, port, &sent.to_be_bytes()),
                    None => packet::icmp_echo_request(args.source, args.target, id, sent, b"hcp-olm"),
                };
                h.to_peer.send(p).await.context("driver stopped")?;
            }
            p = h.from_peer.recv() => {
                let Some(p) = p else { anyhow::bail!("driver stopped") };
                if let Some(seq) = reply_seq(&p, &args, id) {
                    received += 1;
                    println!("reply seq={seq} t_ms={}", start.elapsed().as_millis());
                }
            }
        }
    }
    cancel.cancel();
    let peer = task.await.context("driver task")?;
    let s = peer.status();
    println!(
        "summary sent={sent} received={received} handshake_age_ms={} roams={} dead_peer_restarts={} dropped={}",
        s.handshake_age.map_or(-1, |d| d.as_millis() as i64),
        s.counters.roams,
        s.counters.dead_peer_restarts,
        s.counters.dropped.iter().sum::<u64>(),
    );
    Ok(())
}

fn reply_seq(p: &[u8], args: &Args, id: u16) -> Option<u16> {
    let ip = Ipv4::parse(p).ok()?;
    if ip.src != args.target || ip.dst != args.source {
        return None;
    }
    match args.udp_port {
        Some(port) => {
            let u = Udp::parse(&ip).ok()?;
            let seq = <[u8; 2]>::try_from(u.data).ok()?;
            (u.src_port == port).then(|| u16::from_be_bytes(seq))
        }
        None => {
            let e = IcmpEcho::parse(ip.payload).ok()?;
            (e.reply && e.id == id).then_some(e.seq)
        }
    }
}

hcp_olm_binkit::every_flag_has_help_test!(Args);
