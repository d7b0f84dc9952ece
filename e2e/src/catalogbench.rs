//! What the catalog benchmarks share (`hcp-olm-bench-catalog`, `hcp-olm-bench-fleet`): how
//! each server is started, the servable part of a real catalog, health polling, /proc
//! readings and the figures.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::ManagedProcess;
use anyhow::{Context as _, bail};
use hcp_olm_proto::api::registry_client::RegistryClient;
use hcp_olm_proto::health::HealthCheckRequest;
use hcp_olm_proto::health::health_client::HealthClient;
use tonic::transport::{Channel, Endpoint};

/// Largest gRPC answer a benchmark client accepts: far above any bundle of the fixture
/// catalogs, but a bound all the same.
pub const MAX_MESSAGE: usize = 64 << 20;

/// `opm serve DIR` on 127.0.0.1:`port` as the benchmarks run it: pprof off (its default,
/// localhost:6060, would collide between processes sharing one network namespace; in a pod it
/// listens idle) and the termination log to /dev/null (a pod's /dev/termination-log does not
/// exist here). `cmd` is the program to run (`Command::new(opm)` or a pdeathsig wrapper).
pub fn opm_serve(mut cmd: Command, dir: &Path, port: u16) -> Command {
    cmd.arg("serve")
        .arg(dir)
        .arg("-p")
        .arg(port.to_string())
        .arg("--pprof-addr=")
        .arg("-t")
        .arg("/dev/null")
        // opm would otherwise route its own gRPC through a proxy set in the environment
        .env("GRPC_PROXY", "")
        .env("grpc_proxy", "");
    cmd
}

/// `hcp-olm-catalog-server` serving `dir` on 127.0.0.1:`port`, flags as the controller renders
/// them (docs/catalog-server.md) but for the loopback address.
pub fn our_serve(mut cmd: Command, dir: &Path, port: u16) -> Command {
    cmd.arg("--catalog")
        .arg(dir)
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"));
    cmd
}

/// The gRPC endpoint of a server on 127.0.0.1:`port`.
pub fn loopback(port: u16) -> anyhow::Result<Endpoint> {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .with_context(|| format!("endpoint for port {port}"))
}

/// One gRPC connection (as one catalog-operator holds one per catalog), every call bounded by
/// `call_timeout`.
pub async fn registry_client(
    port: u16,
    call_timeout: Duration,
) -> anyhow::Result<RegistryClient<Channel>> {
    let ch = loopback(port)?
        .connect_timeout(Duration::from_secs(5))
        .timeout(call_timeout)
        .connect()
        .await
        .with_context(|| format!("connecting to 127.0.0.1:{port}"))?;
    Ok(RegistryClient::new(ch).max_decoding_message_size(MAX_MESSAGE))
}

/// Whether the server on `port` answers the gRPC health check with SERVING (both servers
/// answer only once the catalog is loaded).
pub async fn serving(port: u16) -> bool {
    let Ok(ep) = loopback(port) else {
        return false;
    };
    let Ok(ch) = ep
        .connect_timeout(Duration::from_millis(200))
        .timeout(Duration::from_secs(1))
        .connect()
        .await
    else {
        return false;
    };
    HealthClient::new(ch)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .is_ok_and(|r| r.into_inner().status == 1)
}

/// Polls the health check every 50 ms until SERVING, for at most `limit`; fails at once when
/// the process exits (with its log's tail). Returns the time from `started`.
pub async fn wait_serving(
    process: &ManagedProcess,
    port: u16,
    started: Instant,
    limit: Duration,
) -> anyhow::Result<Duration> {
    loop {
        if let Some(status) = process.exited() {
            bail!(
                "{} exited before serving ({status}); its log ends:\n{}",
                process.name(),
                process.log_tail(20)
            );
        }
        if serving(port).await {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            bail!(
                "{} not SERVING on 127.0.0.1:{port} within {limit:?}; its log ends:\n{}",
                process.name(),
                process.log_tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A `kB` field of /proc/PID/status (`VmRSS:`, `VmHWM:`); `None` once the process is gone.
pub fn status_kb(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

/// CPU time (user + system) the process `pid` has used so far; `None` once it is gone.
pub fn cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: count fields after it. The
    // state (field 3 of proc(5)) comes first, so utime and stime (14 and 15) are at 11 and 12.
    let fields: Vec<&str> = text[text.rfind(')')? + 1..].split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // /proc counts in USER_HZ, which the kernel ABI fixes at 100 per second.
    Some(Duration::from_millis(ticks * 10))
}

/// The packages of a catalog each server refuses, by their own verdicts.
#[derive(Debug, Default)]
pub struct Verdicts {
    /// `opm validate PACKAGE_DIR` failed (opm's own rules: what `opm serve` refuses to load).
    pub opm_refused: Vec<String>,
    /// opm accepts them, our loader does not (left out too, so both serve the same set).
    pub ours_refused: Vec<String>,
}

/// A directory of symlinks to the packages of `catalog` that `opm` accepts (`opm validate`
/// on each package directory: opm's own verdict, not ours) and our loader loads; what either
/// refused is returned, separately.
pub fn opm_servable_subset(catalog: &Path, out: &Path, opm: &Path) -> anyhow::Result<Verdicts> {
    let catalog = &catalog
        .canonicalize()
        .with_context(|| format!("catalog {}", catalog.display()))?;
    let mut v = Verdicts::default();
    let mut entries = std::fs::read_dir(catalog)
        .with_context(|| format!("reading catalog {}", catalog.display()))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("reading catalog {}", catalog.display()))?;
    entries.sort_by_key(std::fs::DirEntry::file_name);
    for e in entries {
        if !e.path().is_dir() {
            continue;
        }
        let name = e.file_name().to_string_lossy().into_owned();
        let status = Command::new(opm)
            .arg("validate")
            .arg(e.path())
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running {} validate", opm.display()))?;
        if !status.success() {
            v.opm_refused.push(name);
            continue;
        }
        if hcp_olm_catalog::Catalog::load_dir(&e.path()).is_err() {
            v.ours_refused.push(name);
            continue;
        }
        let to = out.join(e.file_name());
        std::fs::create_dir_all(&to).with_context(|| format!("mkdir {}", to.display()))?;
        for f in std::fs::read_dir(e.path())
            .with_context(|| format!("reading {}", e.path().display()))?
        {
            let f = f.with_context(|| format!("reading {}", e.path().display()))?;
            std::os::unix::fs::symlink(f.path(), to.join(f.file_name()))
                .with_context(|| format!("symlink in {}", to.display()))?;
        }
    }
    if out
        .read_dir()
        .map(|mut d| d.next().is_none())
        .unwrap_or(true)
    {
        bail!("no package of {} is servable by both", catalog.display());
    }
    Ok(v)
}

/// Median, min and max of `v` as `median (min..max)`, three decimals; `-` when empty.
pub fn spread(v: &[f64]) -> String {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return "-".into();
    }
    v.sort_by(f64::total_cmp);
    let median = if v.len() % 2 == 1 {
        v[v.len() / 2]
    } else {
        (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
    };
    format!("{median:.3} ({:.3}..{:.3})", v[0], v[v.len() - 1])
}

/// kB as MiB.
pub fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// `a / b` with three decimals; `inf` when `b` is zero.
pub fn ratio(a: f64, b: f64) -> String {
    if b == 0.0 {
        "inf".into()
    } else {
        format!("{:.3}", a / b)
    }
}

/// The `p`th percentile of sorted samples (nearest rank below, as `bench.rs` always took
/// it); zero for no samples.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}
