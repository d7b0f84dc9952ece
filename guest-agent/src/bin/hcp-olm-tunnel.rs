//! `hcp-olm-tunnel`: the WireGuard tunnel endpoint in TUN mode (for places that allow
//! NET_ADMIN): a TUN device carrying our tunnel address, routes for the configured prefixes
//! (the guest service and pod CIDRs) into it, and one WireGuard peer over UDP.
//!
//! Wiring only: config, device, socket, admin endpoints, signals. Exit codes: 0 after a clean
//! drain, 64 on config errors (the message names the field), 1 otherwise.
//! Addresses and routes are set with iproute2 (`ip`), which the image must carry.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use hcp_olm_binkit::admin::Admin;
use hcp_olm_guest_agent::daemon;
use hcp_olm_guest_agent::tunnel::config::{self, TunnelConfig};
use hcp_olm_guest_agent::tunnel::tun::{TunOptions, TunTunnel};
use hcp_olm_guest_agent::tunnel::{Peer, PeerStatus};
use tokio::net::{TcpListener, UdpSocket};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

const EX_CONFIG: u8 = hcp_olm_binkit::EX_USAGE;
/// A session older than this is gone (WireGuard's REJECT_AFTER_TIME).
const SESSION_LIFETIME: Duration = Duration::from_secs(180);

#[derive(Debug, Parser)]
#[command(version, about = "hcp-olm WireGuard tunnel endpoint (TUN mode)")]
struct Args {
    /// Config file (.toml, or .yaml/.yml).
    #[arg(long, env = "HCP_OLM_TUNNEL_CONFIG")]
    config: PathBuf,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    args.log.init();
    let cfg = match config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hcp-olm-tunnel: invalid configuration: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hcp-olm-tunnel: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cfg, args.config.clone())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .with_context(|| format!("run ip {}", args.join(" ")))?;
    if !out.status.success() {
        anyhow::bail!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

async fn run(cfg: TunnelConfig, config_path: PathBuf) -> anyhow::Result<()> {
    // Bind and configure everything first; only then report ready.
    let socket = UdpSocket::bind(cfg.listen)
        .await
        .with_context(|| format!("bind udp {}", cfg.listen))?;
    let listen = socket.local_addr()?;
    let admin = match cfg.admin {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("bind admin {a}"))?,
        ),
        None => None,
    };
    let t = &cfg.tun;
    let device = tun_rs::DeviceBuilder::new()
        .name(&t.name)
        .mtu(t.mtu)
        .offload(t.offload)
        .build_async()
        .with_context(|| format!("create TUN device {} (needs NET_ADMIN)", t.name))?;
    ip(&["addr", "replace", &t.address, "dev", &t.name])?;
    if let Some(a6) = &t.address6 {
        // No duplicate address detection on a point-to-point device: the address is usable
        // at once instead of staying tentative for a second or more.
        ip(&["-6", "addr", "replace", a6, "dev", &t.name, "nodad"])?;
    }
    ip(&[
        "link",
        "set",
        "dev",
        &t.name,
        "mtu",
        &t.mtu.to_string(),
        "up",
    ])?;
    for r in &t.routes {
        ip(&["route", "replace", r, "dev", &t.name])?;
    }

    let dialer = cfg.peer.endpoint.is_some();
    let cancel = CancellationToken::new();
    let tunnel = TunTunnel::spawn(
        device,
        socket,
        Peer::new(cfg.peer.clone()),
        TunOptions {
            mtu: t.mtu,
            offload: t.offload,
        },
        cancel.clone(),
    )
    .context("start TUN driver")?;

    let (registry, key_reloads) = daemon::tun_registry(tunnel.status_source(), &t.name);
    // Key rotation as in the userspace daemons: the key files are re-read and changed keys
    // go to the peer; a file that does not parse keeps the keys in use (field named).
    if let Some(every) = cfg.key_reload {
        let path = config_path.clone();
        daemon::spawn_key_reload_reporting(
            every,
            cfg.peer.keys(),
            move || {
                config::load(&path)
                    .map(|c| c.peer.keys())
                    .map_err(|e| daemon::config_error(&e.field, e.message))
            },
            tunnel.keys.clone(),
            move |r| {
                key_reloads
                    .get_or_create(&daemon::ReloadLabels { result: r })
                    .inc();
            },
            cancel.clone(),
        );
    }
    let ready = Arc::new(AtomicBool::new(true));
    let admin_addr = match admin {
        Some(listener) => {
            let addr = listener.local_addr()?;
            let (ready, status) = (Arc::clone(&ready), tunnel.status_source());
            let admin_cancel = cancel.clone();
            Admin::new(registry)
                .readyz(move || readiness(&ready, dialer, &status))
                .spawn(listener, async move { admin_cancel.cancelled().await });
            Some::<SocketAddr>(addr)
        }
        None => None,
    };
    tracing::info!(
        %listen, admin = ?admin_addr, tun = %t.name, address = %t.address, address6 = ?t.address6,
        routes = ?t.routes, offload = t.offload, peer = %cfg.peer.peer_public_key,
        endpoint = ?cfg.peer.endpoint, "tunnel up"
    );

    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
    // Unready first so that nothing new is steered here, then let in-flight packets finish.
    ready.store(false, Ordering::SeqCst);
    tokio::time::sleep(cfg.drain_timeout.min(Duration::from_millis(200))).await;
    match tokio::time::timeout(cfg.drain_timeout, tunnel.shutdown()).await {
        Ok(s) => {
            tracing::info!(
                tx_bytes = s.tx_bytes,
                rx_bytes = s.rx_bytes,
                "drained; TUN device removed on exit"
            );
            Ok(())
        }
        Err(_) => anyhow::bail!("drain did not finish within {:?}", cfg.drain_timeout),
    }
}

/// Ready when draining has not started and, on the dialing side, a session is live. The
/// answering side is ready as soon as it listens (the peer must be able to reach it).
fn readiness(
    ready: &AtomicBool,
    dialer: bool,
    status: &dyn Fn() -> PeerStatus,
) -> Result<String, String> {
    if !ready.load(Ordering::SeqCst) {
        return Err("draining".to_string());
    }
    let live = status().handshake_age.is_some_and(|a| a < SESSION_LIFETIME);
    if dialer && !live {
        return Err("no session with the peer".to_string());
    }
    Ok("ready".to_string())
}

hcp_olm_binkit::every_flag_has_help_test!(Args);
