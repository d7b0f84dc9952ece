//! Shared test helpers: start catalog servers (ours and opm) as child
//! processes on loopback ports and wait until their health check answers.

#![allow(dead_code)]

pub mod edge;
pub mod proc;

pub use proc::{ManagedProcess, command, free_port};

use std::path::Path;
use std::time::{Duration, Instant};

use hcp_olm_proto::api::registry_client::RegistryClient;
use hcp_olm_proto::health::HealthCheckRequest;
use hcp_olm_proto::health::health_client::HealthClient;
use tonic::transport::Channel;

/// A running catalog server.
pub struct Server {
    pub process: ManagedProcess,
    pub port: u16,
    pub startup: Duration,
}

impl Server {
    pub async fn registry(&self) -> RegistryClient<Channel> {
        let ch = connect(self.port).await;
        RegistryClient::new(ch).max_decoding_message_size(usize::MAX)
    }
}

async fn connect(port: u16) -> Channel {
    tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .expect("connect")
}

/// Starts our server on `dir`.
pub async fn start_ours(dir: &Path, logs: &Path) -> Server {
    let port = free_port().expect("free port");
    // Another build of the server for A/B benchmarks (they name it in their result).
    let bin = std::env::var("HCP_OLM_CATALOG_SERVER_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_hcp-olm-catalog-server").to_string());
    let mut cmd = command(bin);
    cmd.arg("--catalog")
        .arg(dir)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"));
    // Extra server flags for experiments (benchmarks name them in their result).
    if let Ok(extra) = std::env::var("HCP_OLM_CATALOG_SERVER_ARGS") {
        cmd.args(extra.split_whitespace());
    }
    let log = logs.join(format!("ours-{port}.log"));
    let started = Instant::now();
    let process = ManagedProcess::spawn("hcp-olm-catalog-server", cmd, &log).expect("spawn ours");
    wait_serving(&process, port, Duration::from_secs(120)).await;
    Server {
        process,
        port,
        startup: started.elapsed(),
    }
}

/// Starts real `opm serve` on `dir`. Fails (never skips) when opm is missing.
pub async fn start_opm(dir: &Path, logs: &Path) -> Server {
    let opm = proc::tool("opm").unwrap_or_else(|e| panic!("{e}"));
    let port = free_port().expect("free port");
    let mut cmd = command(opm);
    cmd.arg("serve")
        .arg(dir)
        .arg("-p")
        .arg(port.to_string())
        .arg("--pprof-addr=")
        .arg("-t")
        .arg("/dev/null")
        // without it opm builds its cache in a fresh /tmp/opm-serve-cache-* and, killed,
        // leaves ~100 MiB behind per run
        .arg("--cache-dir")
        .arg(logs.join(format!("opm-cache-{port}")))
        // build the cache on start (with --cache-dir, opm otherwise demands one exists)
        .arg("--cache-enforce-integrity=false")
        .env("GRPC_PROXY", "")
        .env("grpc_proxy", "");
    let log = logs.join(format!("opm-{port}.log"));
    let started = Instant::now();
    let process = ManagedProcess::spawn("opm", cmd, &log).expect("spawn opm");
    wait_serving(&process, port, Duration::from_secs(300)).await;
    Server {
        process,
        port,
        startup: started.elapsed(),
    }
}

/// Polls grpc.health.v1 Check until SERVING, bounded by `limit`.
pub async fn wait_serving(process: &ManagedProcess, port: u16, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = process.exited() {
            panic!(
                "{} exited early ({status}):\n{}",
                process.name(),
                process.log_tail(30)
            );
        }
        if serving(port).await {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} not SERVING on port {port} within {limit:?}:\n{}",
            process.name(),
            process.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Path of a fixture catalog of this repository (`fixtures/catalogs`; the large ones are
/// unpacked once from their archives).
pub fn fixture(name: &str) -> std::path::PathBuf {
    hcp_olm_e2e::tools::fixture_catalog(name).unwrap_or_else(|e| panic!("{e}"))
}

/// A directory of symlinks to the packages of `catalog` that our loader
/// accepts (a few real packages have stranded bundles, which opm refuses too;
/// see [`opm_subset`] for opm's own verdict). Returns the dir and the names of
/// the packages left out.
pub fn servable_subset(catalog: &Path) -> (tempfile::TempDir, Vec<String>) {
    let out = tempfile::tempdir().expect("tempdir");
    let mut left_out = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(catalog)
        .expect("read catalog")
        .flatten()
        .collect();
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        if !e.path().is_dir() {
            continue;
        }
        let name = e.file_name();
        match hcp_olm_catalog::Catalog::load_dir(&e.path()) {
            Ok(_) => link_files(&e.path(), &out.path().join(&name)),
            Err(_) => left_out.push(name.to_string_lossy().into_owned()),
        }
    }
    (out, left_out)
}

/// The packages of `catalog` by opm's own verdict (`opm validate` on each
/// package directory: what `opm serve` refuses to load), as a directory of
/// symlinks to those it accepts; with the names opm refused and the names of
/// the accepted ones our loader refuses (a conformance gap: not served here).
pub fn opm_subset(catalog: &Path) -> (tempfile::TempDir, Vec<String>, Vec<String>) {
    let opm = proc::tool("opm").unwrap_or_else(|e| panic!("{e}"));
    let out = tempfile::tempdir().expect("tempdir");
    let v = hcp_olm_e2e::catalogbench::opm_servable_subset(catalog, out.path(), &opm)
        .unwrap_or_else(|e| panic!("{e:#}"));
    (out, v.opm_refused, v.ours_refused)
}

/// One health Check against 127.0.0.1:port; true when it answers SERVING.
pub async fn serving(port: u16) -> bool {
    let Ok(ch) = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .connect_timeout(Duration::from_millis(500))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
    else {
        return false;
    };
    let req = HealthCheckRequest {
        service: String::new(),
    };
    HealthClient::new(ch)
        .check(req)
        .await
        .is_ok_and(|r| r.into_inner().status == 1)
}

/// Recreates `from` under `to` as real directories holding symlinks to the
/// files (opm does not follow symlinked directories).
fn link_files(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read dir").flatten() {
        let p = e.path();
        if p.is_dir() {
            link_files(&p, &to.join(e.file_name()));
        } else {
            std::os::unix::fs::symlink(&p, to.join(e.file_name())).expect("symlink");
        }
    }
}
