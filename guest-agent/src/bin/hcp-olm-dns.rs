//! `hcp-olm-dns`: the split-DNS server on its own. Wiring only: config, sockets, admin
//! endpoints, signals. Exit codes: 0 after a clean drain, 64 on config errors, 1 otherwise.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context;
use clap::Parser;
use hcp_olm_binkit::admin::{self, Admin};
use hcp_olm_guest_agent::dns::Engine;
use hcp_olm_guest_agent::server::{DnsMetrics, DnsServer, file};
use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};

const EX_CONFIG: u8 = hcp_olm_binkit::EX_USAGE;

#[derive(Debug, Parser)]
#[command(version, about = "hcp-olm split-DNS server")]
struct Args {
    /// Config file (.toml, .yaml or .yml).
    #[arg(long, env = "HCP_OLM_DNS_CONFIG")]
    config: PathBuf,
    /// UDP+TCP listen address; overrides `listen` in the file.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Admin (healthz/readyz/metrics) address; overrides `admin` in the file.
    #[arg(long)]
    admin: Option<SocketAddr>,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    args.log.init();
    let cfg = match file::load(&args.config, args.listen, args.admin) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("hcp-olm-dns: invalid configuration: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hcp-olm-dns: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}

async fn run(cfg: file::ServerConfig) -> anyhow::Result<()> {
    // Bind everything first; only then report ready.
    let (udp, tcp) = hcp_olm_guest_agent::server::bind_udp_and_tcp(cfg.listen)
        .await
        .with_context(|| format!("bind udp and tcp {}", cfg.listen))?;
    let bound = udp.local_addr()?;
    let admin = match cfg.admin {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .with_context(|| format!("bind admin {a}"))?,
        ),
        None => None,
    };

    let (registry, metrics) = DnsMetrics::standalone();
    let engine = Arc::new(Engine::new(cfg.engine));
    let server = DnsServer::new(engine, metrics);
    server.spawn_udp(udp);
    server.spawn_tcp(tcp);

    let ready = Arc::new(AtomicBool::new(true));
    let admin_addr = match admin {
        Some(listener) => {
            let addr = listener.local_addr()?;
            Admin::new(registry)
                .readyz(admin::ready_until_draining(Arc::clone(&ready)))
                .spawn(listener, std::future::pending());
            Some(addr)
        }
        None => None,
    };
    tracing::info!(dns = %bound, admin = ?admin_addr, "serving");

    let mut term = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = int.recv() => tracing::info!("SIGINT: draining"),
    }
    ready.store(false, Ordering::SeqCst);
    let drained = tokio::select! {
        d = server.shutdown(cfg.drain_timeout) => d,
        _ = term.recv() => { tracing::warn!("second signal: aborting drain"); false }
        _ = int.recv() => { tracing::warn!("second signal: aborting drain"); false }
    };
    if drained {
        tracing::info!("drained");
        Ok(())
    } else {
        anyhow::bail!("drain did not finish within {:?}", cfg.drain_timeout)
    }
}

hcp_olm_binkit::every_flag_has_help_test!(Args);
