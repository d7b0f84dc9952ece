//! hcp-olm-catalog-server: serves a file-based catalog directory over the
//! operator-registry gRPC API. Wiring only; the work is in the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;

/// Exit code for an invalid catalog (EX_DATAERR).
const EXIT_BAD_CATALOG: u8 = 65;

#[derive(Debug, Parser)]
#[command(
    name = "hcp-olm-catalog-server",
    version,
    about = "Serve a file-based OLM catalog over the registry gRPC API"
)]
struct Args {
    /// Catalog directory (file-based catalog: JSON and YAML files, searched recursively).
    #[arg(long = "catalog", env = "HCP_OLM_CATALOG_DIR", value_name = "DIR")]
    catalog: PathBuf,
    /// Address to listen on.
    #[arg(
        long = "listen",
        env = "HCP_OLM_CATALOG_LISTEN",
        default_value = "0.0.0.0:50051"
    )]
    listen: SocketAddr,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
    /// How long to let in-flight calls finish after SIGTERM/SIGINT.
    #[arg(long = "shutdown-timeout", default_value = "10s", value_parser = hcp_olm_binkit::parse_duration)]
    shutdown_timeout: Duration,
    /// Open connections in all; more are closed at accept.
    #[arg(long = "max-connections", default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Open connections per client address (one tenant's pod); more are closed at accept.
    #[arg(long = "max-connections-per-peer", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections_per_peer: u32,
    /// HTTP/2 streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long = "max-streams-per-connection", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    max_streams_per_connection: u32,
    /// Calls being answered at once in all (each holds at most one answer in memory); more wait their turn.
    #[arg(long = "max-calls", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    max_calls: u32,
    /// Calls being answered at once per client address; more wait their turn, round-robin over clients.
    #[arg(long = "max-calls-per-peer", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    max_calls_per_peer: u32,
    /// A call that waits this long for its turn is answered RESOURCE_EXHAUSTED.
    #[arg(long = "admission-timeout", default_value = "30s", value_parser = hcp_olm_binkit::parse_duration)]
    admission_timeout: Duration,
    /// Close a connection with no call in flight after this long.
    #[arg(long = "idle-timeout", default_value = "10m", value_parser = hcp_olm_binkit::parse_duration)]
    idle_timeout: Duration,
}

/// Runtime worker threads; heavy handlers get one fewer CPU slot, so a flood
/// of them never holds every worker.
const WORKERS: usize = 2;

impl Args {
    fn limits(&self) -> hcp_olm_catalog::Limits {
        hcp_olm_catalog::Limits {
            max_connections: self.max_connections as usize,
            max_connections_per_peer: self.max_connections_per_peer as usize,
            max_streams_per_connection: self.max_streams_per_connection,
            max_calls: self.max_calls as usize,
            max_calls_per_peer: self.max_calls_per_peer as usize,
            admission_timeout: self.admission_timeout,
            work_slots: WORKERS - 1,
            idle_timeout: self.idle_timeout,
            ..hcp_olm_catalog::Limits::default()
        }
    }
}

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    args.log.init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKERS)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(RunError::BadCatalog(e)) => {
            tracing::error!(error = %e, "refusing to serve");
            eprintln!("{e}");
            ExitCode::from(EXIT_BAD_CATALOG)
        }
        Err(RunError::Other(e)) => {
            tracing::error!(error = format!("{e:#}"), "catalog server failed");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

enum RunError {
    BadCatalog(hcp_olm_catalog::LoadError),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for RunError {
    fn from(e: anyhow::Error) -> Self {
        RunError::Other(e)
    }
}

async fn run(args: Args) -> Result<(), RunError> {
    let started = Instant::now();
    // Bind first: a taken port fails before any loading work.
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding --listen {}", args.listen))?;
    let dir = args.catalog.clone();
    let catalog = tokio::task::spawn_blocking(move || hcp_olm_catalog::Catalog::load_dir(&dir))
        .await
        .context("catalog loader panicked")?
        .map_err(RunError::BadCatalog)?;
    tracing::info!(
        catalog = %args.catalog.display(),
        packages = catalog.packages.len(),
        bundles = catalog.bundle_count(),
        load_ms = started.elapsed().as_millis() as u64,
        listen = %listener.local_addr().map(|a| a.to_string()).unwrap_or_default(),
        "catalog loaded; serving"
    );
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let timeout = args.shutdown_timeout;
    let server = tokio::spawn(hcp_olm_catalog::serve_with(
        listener,
        Arc::new(catalog),
        args.limits(),
        async {
            let _ = rx.await;
        },
    ));
    shutdown_signal().await;
    tracing::info!(timeout_s = timeout.as_secs_f64(), "shutting down");
    let _ = tx.send(());
    match tokio::time::timeout(timeout, server).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(e))) => Err(anyhow::Error::new(e).context("serving").into()),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context("server task").into()),
        Err(_) => {
            tracing::warn!("shutdown timeout reached; exiting with calls in flight");
            Ok(())
        }
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

hcp_olm_binkit::every_flag_has_help_test!(Args);
