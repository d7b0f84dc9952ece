//! Fleet catalog benchmark (issue 18, "one catalog server for many hosted clusters"): N hosted
//! clusters' worth of one default catalog, served
//!
//! - **shared**: one catalog Deployment for the (catalog, digest) pair, 2 replicas of our
//!   `hcp-olm-catalog-server`, every hosted cluster's client on one of them (round robin by
//!   client, as a Service spreads connections), against
//! - **per hosted cluster**: one `opm serve` per hosted cluster as HyperShift runs it (the
//!   index image's pre-built cache copied into the pod, `--cache-dir` on it, integrity checked).
//!
//! Both serve the same real catalog; every server is a real process on 127.0.0.1 (processes
//! stand in for pods; client-side round robin for the Service). Both systems run side by side
//! for the whole run, so their memory is read at the same moments: 3 s after the last server
//! loaded, then 2 s after each round's client load. A round is three phases, in alternating
//! order (shared, per hosted cluster, solo; then solo, per hosted cluster, shared):
//!
//! - a fleet phase per system: N clients (one per hosted cluster, each its own connection, as a
//!   catalog-operator holds one) each run one full ListBundles (the resolver's snapshot) and
//!   then `calls` GetBundle calls, Poisson-timed at one call per `interval` on average;
//! - solo: one client alone on its own server (ours, a third process), the same client
//!   behaviour with five times the calls (1,000 by default), so its p99 is not just its
//!   second-slowest call. The result line's latency ratio is the median round's.
//!
//! After the rounds, one unpaced phase (every client back to back) per system shows the
//! saturated case on stderr. The last line on stdout is
//! `fleet-bench: n=.. catalog_pods_shared=.. catalog_pods_per_hc=.. memory_ratio=..
//! getbundle_p99_ratio=.. servers=processes` (see docs/fleet-bench.md). Any failed call,
//! server exit or time bound exceeded fails the run (exit 1); Ctrl-C or SIGTERM ends it (exit
//! 130) after stopping every server. Run via `scripts/bench-fleet.sh` (`make bench-fleet`).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use hcp_olm_e2e::catalogbench::{
    self, cpu_time, mib, opm_serve, our_serve, percentile, ratio, registry_client, status_kb,
};
use hcp_olm_e2e::ports::free_port;
use hcp_olm_e2e::process::{ManagedProcess, command};
use hcp_olm_proto::api::{GetBundleRequest, ListBundlesRequest};
use tokio::task::JoinSet;

/// Replicas of the shared catalog Deployment: two, so that losing one pod (a drained node, a
/// rollout) leaves every hosted cluster's catalog served; the issue pairs them with a PDB.
const REPLICAS: usize = 2;
/// opm processes loading at once: loading is CPU-bound (two cores here), and all 50 at once
/// would only stretch every start towards its limit.
const OPM_AT_ONCE: usize = 2;
/// Memory an opm process may reach while loading the large catalog (its VmHWM was 186 MiB in
/// `make bench-catalog`), with a margin; the run refuses to start without N times this free.
const OPM_BUDGET_KB: u64 = 220 * 1024;
/// Start-up bounds: opm built its cache of the large catalog in 12 s alone, ours loads in
/// 1.5 s (docs/catalog-server.md); these only catch a hung start.
const OPM_START_LIMIT: Duration = Duration::from_secs(300);
const OURS_START_LIMIT: Duration = Duration::from_secs(120);
/// One call's bound, and the bound on a phase's ListBundles step (N concurrent full lists).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
const LIST_LIMIT: Duration = Duration::from_secs(300);
/// What a phase may take beyond its schedule before the run fails.
const PHASE_SLACK: Duration = Duration::from_secs(120);
/// Pauses before reading memory: after the last load (as bench.rs) and after client load.
const SETTLE_LOAD: Duration = Duration::from_secs(3);
const SETTLE_CALLS: Duration = Duration::from_secs(2);
/// The solo client makes this many times the calls of one fleet client.
const SOLO_FACTOR: usize = 5;
/// Calls per client in the unpaced phase (solo: SOLO_FACTOR times as many).
const UNPACED_CALLS: usize = 40;

struct Config {
    catalog: PathBuf,
    server: PathBuf,
    opm: PathBuf,
    n: usize,
    rounds: usize,
    calls: usize,
    interval: Duration,
}

const USAGE: &str = "usage: fleet CATALOG_DIR SERVER_BIN OPM_BIN N ROUNDS CALLS INTERVAL_MS";

fn number(
    arg: Option<String>,
    what: &str,
    range: std::ops::RangeInclusive<usize>,
) -> anyhow::Result<usize> {
    let text = arg.with_context(|| format!("{what} missing; {USAGE}"))?;
    let v: usize = text
        .parse()
        .with_context(|| format!("{what} {text:?} is not a number"))?;
    ensure!(
        range.contains(&v),
        "{what} {v} outside {}..={}",
        range.start(),
        range.end()
    );
    Ok(v)
}

impl Config {
    fn from_args() -> anyhow::Result<Self> {
        let mut args = std::env::args().skip(1);
        let mut path = |what: &str| -> anyhow::Result<PathBuf> {
            let p = PathBuf::from(
                args.next()
                    .with_context(|| format!("{what} missing; {USAGE}"))?,
            );
            ensure!(p.exists(), "{what} {} does not exist", p.display());
            Ok(p)
        };
        let catalog = path("CATALOG_DIR")?;
        let server = path("SERVER_BIN")?;
        let opm = path("OPM_BIN")?;
        Ok(Config {
            catalog,
            server,
            opm,
            n: number(args.next(), "N", 1..=1000)?,
            rounds: number(args.next(), "ROUNDS", 1..=20)?,
            calls: number(args.next(), "CALLS", 1..=100_000)?,
            interval: Duration::from_millis(number(args.next(), "INTERVAL_MS", 1..=60_000)? as u64),
        })
    }
}

/// A catalog server process and where it listens.
struct Server {
    process: ManagedProcess,
    port: u16,
    startup: Duration,
}

impl Server {
    fn name(&self) -> &str {
        self.process.name()
    }

    /// Fails when the process has exited (a dead server must not go unnoticed between calls).
    fn alive(&self) -> anyhow::Result<()> {
        if let Some(status) = self.process.exited() {
            bail!(
                "{} exited ({status}); its log ends:\n{}",
                self.name(),
                self.process.log_tail(20)
            );
        }
        Ok(())
    }

    fn cpu(&self) -> anyhow::Result<Duration> {
        self.alive()?;
        cpu_time(self.process.pid()).with_context(|| {
            format!(
                "no CPU times in /proc/{}/stat ({})",
                self.process.pid(),
                self.name()
            )
        })
    }

    fn status_kb(&self, key: &str) -> anyhow::Result<u64> {
        self.alive()?;
        status_kb(self.process.pid(), key).with_context(|| {
            format!(
                "no {key} in /proc/{}/status ({})",
                self.process.pid(),
                self.name()
            )
        })
    }
}

fn spawn(name: &str, cmd: std::process::Command, logs: &Path) -> anyhow::Result<ManagedProcess> {
    Ok(ManagedProcess::spawn(
        name,
        cmd,
        &logs.join(format!("{name}.log")),
    )?)
}

async fn start_ours(cfg: &Config, dir: &Path, logs: &Path, name: &str) -> anyhow::Result<Server> {
    let port = free_port().context("free port")?;
    let started = Instant::now();
    let process = spawn(name, our_serve(command(&cfg.server), dir, port), logs)?;
    let startup = catalogbench::wait_serving(&process, port, started, OURS_START_LIMIT).await?;
    Ok(Server {
        process,
        port,
        startup,
    })
}

/// What the index image carries: `opm serve /configs --cache-dir=/tmp/cache --cache-only`
/// at image build. HyperShift's init container copies that cache into the pod and opm serves
/// from it, so the per-hosted-cluster opm below loads a cache, as in production.
async fn build_opm_cache(
    cfg: &Config,
    dir: &Path,
    cache: &Path,
    logs: &Path,
) -> anyhow::Result<Duration> {
    let mut cmd = command(&cfg.opm);
    cmd.arg("serve")
        .arg(dir)
        .arg("--cache-only")
        .arg("--cache-dir")
        .arg(cache)
        .arg("--pprof-addr=")
        .arg("-t")
        .arg("/dev/null");
    let started = Instant::now();
    let process = spawn("opm-cache-build", cmd, logs)?;
    loop {
        if let Some(status) = process.exited() {
            ensure!(
                status.success(),
                "building opm's cache failed ({status}); its log ends:\n{}",
                process.log_tail(20)
            );
            return Ok(started.elapsed());
        }
        ensure!(
            started.elapsed() < OPM_START_LIMIT,
            "building opm's cache took over {OPM_START_LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Copies a directory tree of plain files (opm's cache): each pod's cache is its own copy in
/// its own emptyDir, and opm holds a lock in its cache directory while it serves.
fn copy_tree(from: &Path, to: &Path) -> anyhow::Result<u64> {
    let mut bytes = 0;
    for e in walkdir::WalkDir::new(from) {
        let e = e.with_context(|| format!("reading {}", from.display()))?;
        let dst = to.join(e.path().strip_prefix(from)?);
        if e.file_type().is_dir() {
            std::fs::create_dir_all(&dst).with_context(|| format!("mkdir {}", dst.display()))?;
        } else if e.file_type().is_file() {
            bytes += std::fs::copy(e.path(), &dst)
                .with_context(|| format!("copying {} to {}", e.path().display(), dst.display()))?;
        } else {
            bail!("{}: not a file or directory", e.path().display());
        }
    }
    Ok(bytes)
}

/// Starts the per-hosted-cluster opm processes OPM_AT_ONCE at a time, each on its own copy of
/// the cache, each waited for until SERVING before the next ones start.
async fn start_opms(
    cfg: &Config,
    dir: &Path,
    cache: &Path,
    work: &Path,
) -> anyhow::Result<Vec<Server>> {
    let logs = work.join("logs");
    let mut out = Vec::with_capacity(cfg.n);
    let mut copied = 0;
    for batch in (0..cfg.n).collect::<Vec<_>>().chunks(OPM_AT_ONCE) {
        let mut starting = Vec::new();
        for &i in batch {
            let own = work.join(format!("hc-{i:03}-cache"));
            copied += copy_tree(cache, &own)?;
            let port = free_port().context("free port")?;
            let mut cmd = opm_serve(command(&cfg.opm), dir, port);
            // As HyperShift's registry container: --cache-dir on the copied cache. opm then
            // enforces the cache's integrity by default: a cache that does not match the
            // catalog fails the start (and so the run) instead of being rebuilt unmeasured.
            cmd.arg("--cache-dir").arg(&own);
            let started = Instant::now();
            let process = spawn(&format!("opm-hc-{i:03}"), cmd, &logs)?;
            starting.push((process, port, started));
        }
        for (process, port, started) in starting {
            let startup =
                catalogbench::wait_serving(&process, port, started, OPM_START_LIMIT).await?;
            out.push(Server {
                process,
                port,
                startup,
            });
        }
        if out.len() % 10 == 0 || out.len() == cfg.n {
            eprintln!("fleet-bench:   {}/{} opm serving", out.len(), cfg.n);
        }
    }
    eprintln!(
        "fleet-bench:   opm caches copied: {} x {:.1} MiB",
        cfg.n,
        copied as f64 / cfg.n as f64 / (1 << 20) as f64
    );
    Ok(out)
}

/// (package, channel, csv) of one ListBundles entry: what a GetBundle asks for.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct BundleRef {
    package: String,
    channel: String,
    csv: String,
}

/// A full ListBundles on `client`, refusing more than `limit` entries (a bound while reading).
async fn list_bundles(
    client: &mut hcp_olm_proto::api::registry_client::RegistryClient<tonic::transport::Channel>,
    limit: usize,
) -> anyhow::Result<Vec<BundleRef>> {
    let mut stream = client
        .list_bundles(ListBundlesRequest {})
        .await
        .context("ListBundles")?
        .into_inner();
    let mut out = Vec::new();
    while let Some(b) = stream.message().await.context("ListBundles stream")? {
        ensure!(
            out.len() < limit,
            "ListBundles sent more than {limit} bundles"
        );
        out.push(BundleRef {
            package: b.package_name,
            channel: b.channel_name,
            csv: b.csv_name,
        });
    }
    Ok(out)
}

/// SplitMix64: a fixed, dependency-free pseudo-random stream, so both systems get exactly the
/// same call schedule and bundle choices.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How a client spaces its calls.
#[derive(Clone, Copy)]
enum Pace {
    /// Poisson: exponential gaps with this mean. Many independent hosted clusters' catalog
    /// operators make a Poisson stream together, which clumps as real arrivals do (evenly
    /// staggered clients would flatter a shared server).
    Poisson(Duration),
    /// Back to back: the next call as soon as the answer is in.
    Unpaced,
}

/// The start offsets of one client's calls (from the phase's start) and the bundles asked.
fn schedule(client: usize, calls: usize, pace: Pace, bundles: usize) -> Vec<(Duration, usize)> {
    let mut rng = Rng(0x5eed_0000 + client as u64);
    let mut at = Duration::ZERO;
    (0..calls)
        .map(|_| {
            if let Pace::Poisson(mean) = pace {
                at += mean.mul_f64(-(1.0 - rng.unit()).ln());
            }
            (at, (rng.next_u64() % bundles as u64) as usize)
        })
        .collect()
}

/// What one phase measured.
struct Phase {
    /// GetBundle latencies, sorted.
    lat: Vec<Duration>,
    /// The slowest client's ListBundles.
    list_max: Duration,
    /// The GetBundle step's wall time.
    wall: Duration,
    /// CPU the phase's servers used in the GetBundle step.
    cpu: Duration,
}

impl Phase {
    fn p(&self, q: usize) -> Duration {
        percentile(&self.lat, q)
    }

    fn describe(&self) -> String {
        format!(
            "GetBundle p50 {:.2} ms p99 {:.2} ms max {:.2} ms ({} calls, {:.0}/s, server CPU {:.0} us/call); slowest ListBundles {:.2} s",
            ms(self.p(50)),
            ms(self.p(99)),
            ms(self.lat.last().copied().unwrap_or_default()),
            self.lat.len(),
            self.lat.len() as f64 / self.wall.as_secs_f64().max(1e-9),
            self.cpu.as_secs_f64() * 1e6 / self.lat.len().max(1) as f64,
            self.list_max.as_secs_f64()
        )
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `clients` clients, client `i` on `servers[i % servers.len()]` (round robin, as a Service
/// spreads connections over ready endpoints), each on its own connection: first all run one
/// full ListBundles (must list `refs.len()` bundles), then all run their GetBundle schedule
/// concurrently. Any error or wrong answer fails the phase.
async fn client_load(
    servers: &[Server],
    clients: usize,
    calls: usize,
    pace: Pace,
    refs: &Arc<Vec<BundleRef>>,
) -> anyhow::Result<Phase> {
    let ports: Vec<u16> = servers.iter().map(|s| s.port).collect();
    let server_cpu = || -> anyhow::Result<Duration> { servers.iter().map(Server::cpu).sum() };
    let mut conns = Vec::with_capacity(clients);
    for i in 0..clients {
        let port = ports[i % ports.len()];
        conns.push((i, port, registry_client(port, CALL_TIMEOUT).await?));
    }

    let expected = refs.len();
    let mut set = JoinSet::new();
    for (i, port, mut c) in conns {
        set.spawn(async move {
            let t = Instant::now();
            let got = list_bundles(&mut c, expected + 1)
                .await
                .with_context(|| format!("client {i} on 127.0.0.1:{port}"))?;
            ensure!(
                got.len() == expected,
                "client {i} on 127.0.0.1:{port}: ListBundles listed {} bundles, expected {expected}",
                got.len()
            );
            anyhow::Ok((i, port, c, t.elapsed()))
        });
    }
    let mut listed = Vec::with_capacity(clients);
    let mut list_max = Duration::ZERO;
    let all = async {
        while let Some(r) = set.join_next().await {
            let (i, port, c, took) = r.context("client task")??;
            list_max = list_max.max(took);
            listed.push((i, port, c));
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(LIST_LIMIT, all)
        .await
        .with_context(|| {
            format!("ListBundles of {clients} clients not done within {LIST_LIMIT:?}")
        })??;

    let schedules: Vec<_> = (0..clients)
        .map(|i| schedule(i, calls, pace, expected))
        .collect();
    let planned = schedules
        .iter()
        .filter_map(|s| s.last().map(|l| l.0))
        .max()
        .unwrap_or_default();
    let cpu_before = server_cpu()?;
    let start = tokio::time::Instant::now();
    let mut set = JoinSet::new();
    for ((i, port, mut c), plan) in listed.into_iter().zip(schedules) {
        let refs = Arc::clone(refs);
        set.spawn(async move {
            let mut lat = Vec::with_capacity(plan.len());
            for (at, k) in plan {
                // A call due while the previous one was still out goes at once: the schedule
                // is kept, so a slow server is not offered less load.
                tokio::time::sleep_until(start + at).await;
                let want = &refs[k];
                let t = Instant::now();
                let b = c
                    .get_bundle(GetBundleRequest {
                        pkg_name: want.package.clone(),
                        channel_name: want.channel.clone(),
                        csv_name: want.csv.clone(),
                    })
                    .await
                    .with_context(|| {
                        format!(
                            "client {i} on 127.0.0.1:{port}: GetBundle {}/{}/{}",
                            want.package, want.channel, want.csv
                        )
                    })?
                    .into_inner();
                let took = t.elapsed();
                ensure!(
                    b.csv_name == want.csv,
                    "client {i} on 127.0.0.1:{port}: GetBundle {} answered {:?}",
                    want.csv,
                    b.csv_name
                );
                lat.push(took);
            }
            anyhow::Ok(lat)
        });
    }
    let mut lat = Vec::with_capacity(clients * calls);
    let limit = planned + PHASE_SLACK;
    let all = async {
        while let Some(r) = set.join_next().await {
            lat.extend(r.context("client task")??);
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(limit, all).await.with_context(|| {
        format!("GetBundle load of {clients} clients not done within {limit:?}")
    })??;
    let wall = start.elapsed();
    let cpu = server_cpu()?.saturating_sub(cpu_before);
    lat.sort();
    Ok(Phase {
        lat,
        list_max,
        wall,
        cpu,
    })
}

/// VmRSS of every server of both systems, read at one moment.
struct Reading {
    label: String,
    shared: Vec<u64>,
    per_hc: Vec<u64>,
}

fn read_rss(label: &str, shared: &[Server], per_hc: &[Server]) -> anyhow::Result<Reading> {
    let read = |s: &[Server]| {
        s.iter()
            .map(|p| p.status_kb("VmRSS:"))
            .collect::<anyhow::Result<Vec<_>>>()
    };
    let r = Reading {
        label: label.into(),
        shared: read(shared)?,
        per_hc: read(per_hc)?,
    };
    eprintln!(
        "fleet-bench: rss {label}: shared total {:.1} MiB, per-HC total {:.1} MiB",
        mib(r.shared.iter().sum()),
        mib(r.per_hc.iter().sum())
    );
    Ok(r)
}

/// min/median/max of per-process kB values as MiB.
fn spread(kb: &[u64]) -> String {
    let mut v = kb.to_vec();
    v.sort_unstable();
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!(
            "{:.1}/{:.1}/{:.1} MiB",
            mib(*lo),
            mib(v[v.len() / 2]),
            mib(*hi)
        ),
        _ => "-".into(),
    }
}

fn durations(d: &[Duration]) -> String {
    let mut v = d.to_vec();
    v.sort();
    match (v.first(), v.last()) {
        (Some(lo), Some(hi)) => format!(
            "{:.2}/{:.2}/{:.2} s",
            lo.as_secs_f64(),
            v[v.len() / 2].as_secs_f64(),
            hi.as_secs_f64()
        ),
        _ => "-".into(),
    }
}

fn mem_available_kb() -> anyhow::Result<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
    text.lines()
        .find(|l| l.starts_with("MemAvailable:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("no MemAvailable in /proc/meminfo")
}

#[derive(Clone, Copy, PartialEq)]
enum System {
    Shared,
    PerHc,
    Solo,
}

async fn run(cfg: Config) -> anyhow::Result<()> {
    let need = cfg.n as u64 * OPM_BUDGET_KB;
    let have = mem_available_kb()?;
    ensure!(
        have > need,
        "{} opm processes need about {:.1} GiB, MemAvailable is {:.1} GiB: lower BENCH_N",
        cfg.n,
        mib(need) / 1024.0,
        mib(have) / 1024.0
    );
    // Declared first so it is removed last, after every server below is stopped.
    let work = tempfile::Builder::new()
        .prefix("hcp-olm-fleet-bench-")
        .tempdir()
        .context("work directory")?;
    let logs = work.path().join("logs");
    std::fs::create_dir_all(&logs)?;
    let catalog = work.path().join("catalog");
    std::fs::create_dir_all(&catalog)?;
    let verdicts = catalogbench::opm_servable_subset(&cfg.catalog, &catalog, &cfg.opm)?;
    let left_out = format!(
        "refused by opm validate: {:?}; accepted by opm, refused by ours: {:?}",
        verdicts.opm_refused, verdicts.ours_refused
    );
    eprintln!(
        "fleet-bench: n={} rounds={} calls={}/client (solo {}) mean interval {} ms, catalog {} (left out: {left_out}), work dir {}",
        cfg.n,
        cfg.rounds,
        cfg.calls,
        cfg.calls * SOLO_FACTOR,
        cfg.interval.as_millis(),
        cfg.catalog.display(),
        work.path().display()
    );

    let cache = work.path().join("opm-cache");
    let took = build_opm_cache(&cfg, &catalog, &cache, &logs).await?;
    eprintln!("fleet-bench: opm cache built (as at index image build) in {took:.1?}");

    let mut shared = Vec::with_capacity(REPLICAS);
    for r in 0..REPLICAS {
        shared.push(start_ours(&cfg, &catalog, &logs, &format!("ours-replica-{r}")).await?);
    }
    let solo = start_ours(&cfg, &catalog, &logs, "ours-solo").await?;
    eprintln!(
        "fleet-bench: shared: {REPLICAS} replicas of hcp-olm-catalog-server serving (start-up {})",
        durations(&shared.iter().map(|s| s.startup).collect::<Vec<_>>())
    );
    eprintln!(
        "fleet-bench: per-HC: starting {} opm serve, {OPM_AT_ONCE} at a time",
        cfg.n
    );
    let per_hc = start_opms(&cfg, &catalog, &cache, work.path()).await?;
    eprintln!(
        "fleet-bench: per-HC: start-up min/median/max {} ({OPM_AT_ONCE} loading at once)",
        durations(&per_hc.iter().map(|s| s.startup).collect::<Vec<_>>())
    );

    let refs = {
        let mut c = registry_client(solo.port, CALL_TIMEOUT).await?;
        let mut refs = list_bundles(&mut c, 1_000_000)
            .await
            .context("solo server")?;
        refs.sort();
        ensure!(!refs.is_empty(), "the catalog lists no bundles");
        Arc::new(refs)
    };
    eprintln!(
        "fleet-bench: {} bundles listed (each phase's clients must list as many)",
        refs.len()
    );

    tokio::time::sleep(SETTLE_LOAD).await;
    let mut readings = vec![read_rss("after load", &shared, &per_hc)?];

    let check = |what: &[&[Server]]| -> anyhow::Result<()> {
        for s in what.iter().flat_map(|g| g.iter()) {
            s.alive()?;
        }
        Ok(())
    };
    let phase = async |sys: System, calls: usize, pace: Pace| -> anyhow::Result<Phase> {
        let p = match sys {
            System::Shared => client_load(&shared, cfg.n, calls, pace, &refs).await,
            System::PerHc => client_load(&per_hc, cfg.n, calls, pace, &refs).await,
            System::Solo => {
                let own = std::slice::from_ref(&solo);
                client_load(own, 1, calls * SOLO_FACTOR, pace, &refs).await
            }
        };
        let name = match sys {
            System::Shared => format!("shared ({} clients on {REPLICAS} replicas)", cfg.n),
            System::PerHc => format!("per-HC ({} clients, one per opm)", cfg.n),
            System::Solo => "solo (1 client, own server)".to_string(),
        };
        let p = p.with_context(|| format!("{name} phase"))?;
        eprintln!("fleet-bench:   {name}: {}", p.describe());
        Ok(p)
    };

    let pace = Pace::Poisson(cfg.interval);
    let mut round_ratios = Vec::with_capacity(cfg.rounds);
    let (mut all_shared, mut all_per_hc, mut all_solo) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cpu_shared, mut cpu_per_hc) = (Duration::ZERO, Duration::ZERO);
    for r in 0..cfg.rounds {
        let order = if r % 2 == 0 {
            [System::Shared, System::PerHc, System::Solo]
        } else {
            [System::Solo, System::PerHc, System::Shared]
        };
        eprintln!("fleet-bench: round {}/{}", r + 1, cfg.rounds);
        let (mut sh, mut so) = (None, None);
        for sys in order {
            let p = phase(sys, cfg.calls, pace).await?;
            check(&[&shared, &per_hc, std::slice::from_ref(&solo)])?;
            match sys {
                System::Shared => sh = Some(p),
                System::Solo => so = Some(p),
                System::PerHc => {
                    cpu_per_hc += p.cpu;
                    all_per_hc.extend(p.lat);
                }
            }
        }
        let (Some(sh), Some(so)) = (sh, so) else {
            bail!("round {} ran without a shared or a solo phase", r + 1);
        };
        let q = sh.p(99).as_secs_f64() / so.p(99).as_secs_f64().max(1e-9);
        eprintln!("fleet-bench:   round {}: getbundle_p99_ratio={q:.3}", r + 1);
        round_ratios.push(q);
        cpu_shared += sh.cpu;
        all_shared.extend(sh.lat);
        all_solo.extend(so.lat);
        tokio::time::sleep(SETTLE_CALLS).await;
        readings.push(read_rss(
            &format!("after round {}", r + 1),
            &shared,
            &per_hc,
        )?);
    }

    eprintln!(
        "fleet-bench: unpaced (every client back to back, {UNPACED_CALLS} calls each; saturation, not in the result line)"
    );
    let mut unpaced = Vec::new();
    for sys in [System::Shared, System::PerHc, System::Solo] {
        unpaced.push(phase(sys, UNPACED_CALLS, Pace::Unpaced).await?);
        check(&[&shared, &per_hc, std::slice::from_ref(&solo)])?;
    }
    tokio::time::sleep(SETTLE_CALLS).await;
    readings.push(read_rss("after the unpaced phase", &shared, &per_hc)?);

    // Steady memory: each process's highest reading; the totals are the highest total of
    // any one reading (both systems read at the same moments).
    let per_process = |pick: fn(&Reading) -> &Vec<u64>| -> Vec<u64> {
        let len = pick(&readings[0]).len();
        (0..len)
            .map(|i| readings.iter().map(|r| pick(r)[i]).max().unwrap_or(0))
            .collect()
    };
    let shared_steady = per_process(|r| &r.shared);
    let per_hc_steady = per_process(|r| &r.per_hc);
    let total = |pick: fn(&Reading) -> &Vec<u64>| -> u64 {
        readings
            .iter()
            .map(|r| pick(r).iter().sum::<u64>())
            .max()
            .unwrap_or(0)
    };
    let shared_total = total(|r| &r.shared);
    let per_hc_total = total(|r| &r.per_hc);
    let peaks = |s: &[Server]| {
        s.iter()
            .map(|p| p.status_kb("VmHWM:"))
            .collect::<anyhow::Result<Vec<_>>>()
    };
    let (shared_peak, per_hc_peak) = (peaks(&shared)?, peaks(&per_hc)?);
    eprintln!(
        "fleet-bench: shared: {REPLICAS} x hcp-olm-catalog-server, VmRSS per process min/median/max {}, total {:.1} MiB (peak VmHWM {}); solo server {:.1} MiB (not counted)",
        spread(&shared_steady),
        mib(shared_total),
        spread(&shared_peak),
        mib(solo.status_kb("VmRSS:")?)
    );
    eprintln!(
        "fleet-bench: per-HC: {} x opm serve, VmRSS per process min/median/max {}, total {:.1} MiB (peak VmHWM {})",
        cfg.n,
        spread(&per_hc_steady),
        mib(per_hc_total),
        spread(&per_hc_peak)
    );
    for r in &readings {
        eprintln!(
            "fleet-bench:   {}: shared {:.1} MiB, per-HC {:.1} MiB",
            r.label,
            mib(r.shared.iter().sum()),
            mib(r.per_hc.iter().sum())
        );
    }

    all_shared.sort();
    all_per_hc.sort();
    all_solo.sort();
    let mut sorted = round_ratios.clone();
    sorted.sort_by(f64::total_cmp);
    // The middle round (the mean of the two middle ones for an even count).
    let median = (sorted[(sorted.len() - 1) / 2] + sorted[sorted.len() / 2]) / 2.0;
    eprintln!(
        "fleet-bench: GetBundle p99 ratio per round min/median/max {:.3}/{median:.3}/{:.3} (result: the median round); all rounds pooled: shared p50 {:.2} ms p99 {:.2} ms ({} calls), solo p50 {:.2} ms p99 {:.2} ms ({} calls), ratio {}",
        sorted[0],
        sorted[sorted.len() - 1],
        ms(percentile(&all_shared, 50)),
        ms(percentile(&all_shared, 99)),
        all_shared.len(),
        ms(percentile(&all_solo, 50)),
        ms(percentile(&all_solo, 99)),
        all_solo.len(),
        ratio(
            percentile(&all_shared, 99).as_secs_f64(),
            percentile(&all_solo, 99).as_secs_f64()
        )
    );
    // The same fleet load on the same cores, shared against per hosted cluster: not what the
    // result line compares (there each hosted cluster's opm would have its own node's CPU),
    // but what the two systems cost for it here.
    eprintln!(
        "fleet-bench: same fleet load, same 2 cores, all rounds pooled: shared p99 {:.2} ms vs per-HC p99 {:.2} ms (ratio {}); server CPU per GetBundle {:.0} us (shared) vs {:.0} us (per-HC)",
        ms(percentile(&all_shared, 99)),
        ms(percentile(&all_per_hc, 99)),
        ratio(
            percentile(&all_shared, 99).as_secs_f64(),
            percentile(&all_per_hc, 99).as_secs_f64()
        ),
        cpu_shared.as_secs_f64() * 1e6 / all_shared.len().max(1) as f64,
        cpu_per_hc.as_secs_f64() * 1e6 / all_per_hc.len().max(1) as f64
    );
    eprintln!(
        "fleet-bench: unpaced getbundle_p99_ratio={} (shared vs solo, both back to back)",
        ratio(
            unpaced[0].p(99).as_secs_f64(),
            unpaced[2].p(99).as_secs_f64()
        )
    );

    println!(
        "fleet-bench: n={} catalog_pods_shared={REPLICAS} catalog_pods_per_hc={} memory_ratio={:.4} getbundle_p99_ratio={median:.3} servers=processes",
        cfg.n,
        per_hc.len(),
        shared_total as f64 / per_hc_total.max(1) as f64,
    );
    // Servers stop here (dropped), then the work directory goes.
    drop((shared, solo, per_hc));
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM (the run then unwinds: servers stopped, work dir removed).
async fn interrupted() -> anyhow::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

fn main() -> ExitCode {
    let cfg = match Config::from_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("fleet-bench: {e:#}");
            return ExitCode::from(64);
        }
    };
    // One thread: every server is spawned from it, and the parent-death signal (setpriv
    // --pdeathsig, which also kills them if this process is killed) follows the spawning
    // thread.
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fleet-bench: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let started = Instant::now();
    let outcome = rt.block_on(async {
        tokio::select! {
            r = run(cfg) => r.map_err(|e| (e, ExitCode::FAILURE)),
            s = interrupted() => match s {
                Ok(sig) => Err((anyhow::anyhow!("interrupted ({sig})"), ExitCode::from(130))),
                Err(e) => Err((e, ExitCode::FAILURE)),
            },
        }
    });
    match outcome {
        Ok(()) => {
            eprintln!("fleet-bench: done in {:.0?}", started.elapsed());
            ExitCode::SUCCESS
        }
        Err((e, code)) => {
            eprintln!("fleet-bench: FAILED after {:.0?}: {e:#}", started.elapsed());
            code
        }
    }
}
