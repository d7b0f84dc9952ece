//! `make bench-controller` (a benchmark, not a test): N HostedClusters against the real
//! management kube-apiserver, the controller running as a real process (`hcp-olm-controller
//! run`, release build) under its ServiceAccount with the RBAC from `manifests/`.
//!
//! Guest side: every HostedCluster writes cluster-scoped objects into its guest (APIService,
//! OperatorHub `cluster`, CatalogSources), so each needs its own guest API server. The run
//! first starts one real guest kube-apiserver (sharing one etcd under its own
//! `--etcd-prefix`), measures its memory and idle CPU, and then either starts a real guest
//! for every HostedCluster (when N of them fit the machine) or serves all guests from
//! [`hcp_olm_e2e::guest_standin`], a minimal in-process stand-in, saying so and why.
//!
//! Environment: `BENCH_N` (100), `IDLE_SECONDS` (300), `BENCH_GUESTS` (`auto`|`real`|`standin`),
//! `BENCH_CONCURRENCY` (controller `--concurrency`, 4), `BENCH_CONVERGE_TIMEOUT` (seconds),
//! `BENCH_GUEST_MEM_FRACTION` (0.5 of MemAvailable), `BENCH_GUEST_CPU_BUDGET` (cores, 0.5),
//! `BENCH_GUEST_APISERVER_ARGS` (extra flags for guest kube-apiservers),
//! `BENCH_CONTROLLER_ARGS` (extra controller flags, named in the result line),
//! `BENCH_PULL_SECRETS` (`1`: every hosted cluster gets a pull secret of its own),
//! `HCP_OLM_CONTROLLER_BIN` (default `$CARGO_TARGET_DIR/release/hcp-olm-controller`).
//!
//! Last line on stdout:
//! `controller-bench: n=<N> guests=<real|standin> rollout=standin converge_s=<s> writes_per_hc=<w> idle_writes=<i>
//! resync_requests_per_s=<q> idle_requests_per_s=<r> idle_reconciles=<c> rss_mib=<m>
//! registry_requests_converge=<k> registry_requests_per_min_idle=<p> own_pull_secrets=<bool> controller_args="<extra flags>"`
//! (registry requests counted from the real registry's log, one `response completed` line each).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use futures::StreamExt as _;
use hcp_olm_e2e::fleet::{
    Guests, HC_NS, RESOURCES, RolloutStandIn, controller_identity, cpu_seconds,
    create_hosted_cluster, guest_crd_files, holm_resource, hosted_cluster_template, metrics_text,
    start_real_guest, yaml_docs,
};
use hcp_olm_e2e::guest_standin::GuestStandIn;
use hcp_olm_e2e::tools::fixtures_dir;
use hcp_olm_e2e::{Cluster, ClusterOptions, SharedEtcd};
use kube::api::{Api, DynamicObject};
use kube::runtime::WatchStreamExt as _;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .map_err(|_| anyhow::anyhow!("{name}={v:?} is not a valid value")),
        Err(_) => Ok(default),
    }
}

fn repo_file(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(p)
}

fn progress(msg: impl std::fmt::Display) {
    eprintln!("controller-bench: {msg}");
}

/// utime + stime of a process, seconds.
/// A `/proc/<pid>/status` field in KiB (VmRSS, VmHWM).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix(field)?
                .strip_prefix(':')?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemAvailable:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Sum of all samples of a metric family line prefix (e.g. `apiserver_request_total{`).
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Requests served and their summed server-side duration, per the API server. Long-running
/// requests (WATCH, CONNECT) are left out: a watch counts its whole lifetime.
async fn served(c: &Cluster) -> Result<(f64, f64)> {
    let t = metrics_text(c).await?;
    let short: String = t
        .lines()
        .filter(|l| !l.contains("verb=\"WATCH\"") && !l.contains("verb=\"CONNECT\""))
        .map(|l| format!("{l}\n"))
        .collect();
    Ok((
        metric_sum(&short, "apiserver_request_total{"),
        metric_sum(&short, "apiserver_request_duration_seconds_sum{"),
    ))
}

/// `apiserver_request_total` by (verb, resource/subresource), long-running verbs left out.
fn request_breakdown(text: &str) -> BTreeMap<(String, String), f64> {
    let label = hcp_olm_e2e::fleet::metric_label;
    let mut out = BTreeMap::new();
    for l in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let verb = label(l, "verb");
        if verb == "WATCH" || verb == "CONNECT" {
            continue;
        }
        let mut resource = label(l, "resource");
        let sub = label(l, "subresource");
        if !sub.is_empty() {
            resource = format!("{resource}/{sub}");
        }
        let n: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        *out.entry((verb, resource)).or_insert(0.0) += n;
    }
    out
}

/// The requests of `after` not in `before`, per hosted cluster, as a table (largest first).
fn breakdown_table(
    before: &BTreeMap<(String, String), f64>,
    after: &BTreeMap<(String, String), f64>,
    n: usize,
) -> String {
    let mut rows: Vec<_> = after
        .iter()
        .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d > 0.0)
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows.iter()
        .map(|((verb, res), d)| format!("  {verb:<7} {res:<40} {d:>9.0} {:>7.2}/hc", d / n as f64))
        .collect::<Vec<_>>()
        .join("\n")
}

fn controller_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("HCP_OLM_CONTROLLER_BIN") {
        return PathBuf::from(p);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_file("target"));
    target.join("release/hcp-olm-controller")
}

struct Controller {
    child: std::process::Child,
    port: u16,
    log: PathBuf,
}

impl Controller {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn reconciles(&self) -> f64 {
        use std::io::{Read, Write};
        let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", self.port)) else {
            return f64::NAN;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        metric_sum(&out, "hcp_olm_reconciles_total{")
    }

    /// SIGTERM, then wait up to 20s (SIGKILL after).
    fn stop(mut self) -> Result<std::process::ExitStatus> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                self.child.kill()?;
                return Ok(self.child.wait()?);
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

struct Probe {
    rss_kib: u64,
    start_s: f64,
    idle_cpu_cores: f64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let n: usize = env_or("BENCH_N", 100)?;
    let idle_seconds: u64 = env_or("IDLE_SECONDS", 300)?;
    let mode: String = env_or("BENCH_GUESTS", "auto".to_string())?;
    let concurrency: u16 = env_or("BENCH_CONCURRENCY", 4)?;
    let converge_timeout: u64 = env_or("BENCH_CONVERGE_TIMEOUT", 600 + 3 * n as u64)?;
    let mem_fraction: f64 = env_or("BENCH_GUEST_MEM_FRACTION", 0.5)?;
    let cpu_budget: f64 = env_or("BENCH_GUEST_CPU_BUDGET", 0.5)?;
    let guest_args: Vec<String> = env_or(
        "BENCH_GUEST_APISERVER_ARGS",
        "--watch-cache=false".to_string(),
    )?
    .split_whitespace()
    .map(str::to_string)
    .collect();
    ensure!(n > 0, "BENCH_N must be > 0");
    ensure!(
        ["auto", "real", "standin"].contains(&mode.as_str()),
        "BENCH_GUESTS must be auto, real or standin"
    );
    let bin = controller_bin();
    ensure!(
        bin.is_file(),
        "controller binary {} not found: build it with `cargo build --release -p hcp-olm-controlplane --bin hcp-olm-controller` or set HCP_OLM_CONTROLLER_BIN",
        bin.display()
    );
    progress(format!(
        "n={n} idle_seconds={idle_seconds} guests={mode} controller={}",
        bin.display()
    ));

    // Management cluster: the real kube-apiserver, always.
    let t = Instant::now();
    // Every hosted cluster gets ~8 Services; the default /24 would run out of ClusterIPs.
    let mut mgmt_opts = ClusterOptions::new("management");
    mgmt_opts.service_cidr = "198.18.0.0/16".into();
    // Every hosted cluster's tunnel gateway has a NodePort Service: the default range
    // (30000-32767, 2,768 ports) would stop N=3000 at 2,768 (seen: `range is full`, the
    // rest Degraded ApplyFailed). A management cluster that hosts that many needs a wider
    // range too; nothing listens on these ports here (no kube-proxy).
    mgmt_opts
        .extra_apiserver_args
        .push("--service-node-port-range=30000-39999".into());
    let mgmt = Cluster::start(mgmt_opts).await?;
    let fx = fixtures_dir();
    mgmt.install_crds(&[
        fx.join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml"),
        repo_file("manifests/crds/hostedolm.yaml"),
    ])
    .await?;
    mgmt.ensure_namespace(HC_NS).await?;
    let controller_kubeconfig = controller_identity(&mgmt).await?;
    progress(format!(
        "management cluster ready in {:.1}s",
        t.elapsed().as_secs_f64()
    ));

    // Guest side: measure one real guest, then decide.
    let etcd = SharedEtcd::start("guests-etcd")?;
    let t = Instant::now();
    let probe_guest = start_real_guest(0, &etcd, &guest_args).await?;
    let start_s = t.elapsed().as_secs_f64();
    let pid = probe_guest.pids()[0];
    let c0 = cpu_seconds(pid);
    tokio::time::sleep(Duration::from_secs(10)).await;
    let probe = Probe {
        rss_kib: status_kib(pid, "VmRSS"),
        start_s,
        idle_cpu_cores: (cpu_seconds(pid) - c0) / 10.0,
    };
    let avail = mem_available_kib();
    let need_mem = probe.rss_kib * n as u64;
    let need_cpu = probe.idle_cpu_cores * n as f64;
    let fits_mem = (need_mem as f64) < mem_fraction * avail as f64;
    let fits_cpu = need_cpu < cpu_budget;
    progress(format!(
        "one real guest kube-apiserver (flags {guest_args:?}, shared etcd, 3 OLM CRDs): rss={:.0}MiB start={:.1}s idle_cpu={:.3} cores; \
         x{n}: {:.0}MiB of {:.0}MiB available (budget {:.0}%), {:.2} idle cores (budget {cpu_budget})",
        mib(probe.rss_kib),
        probe.start_s,
        probe.idle_cpu_cores,
        mib(need_mem),
        mib(avail),
        mem_fraction * 100.0,
        need_cpu
    ));
    let real = match mode.as_str() {
        "real" => true,
        "standin" => false,
        _ => fits_mem && fits_cpu,
    };
    let guest_kind;
    let guests = if real {
        guest_kind = "real kube-apiservers";
        progress(format!(
            "guest side: {n} real guest kube-apiservers on one shared etcd"
        ));
        let t = Instant::now();
        let mut all = vec![probe_guest];
        let mut started = futures::stream::iter(1..n)
            .map(|i| {
                let etcd = &etcd;
                let args = &guest_args;
                async move { (i, start_real_guest(i, etcd, args).await) }
            })
            .buffer_unordered(4);
        let mut rest = BTreeMap::new();
        while let Some((i, c)) = started.next().await {
            rest.insert(i, c?);
            if rest.len() % 10 == 0 {
                progress(format!(
                    "started {}/{n} guests ({:.0}s, {:.0}MiB available)",
                    rest.len() + 1,
                    t.elapsed().as_secs_f64(),
                    mib(mem_available_kib())
                ));
            }
        }
        drop(started);
        all.extend(rest.into_values());
        Guests::Real(all)
    } else {
        guest_kind = "STAND-IN (not a kube-apiserver)";
        let why = if mode == "standin" {
            "BENCH_GUESTS=standin".to_string()
        } else {
            let mut w = Vec::new();
            if !fits_mem {
                w.push(format!(
                    "{n} guests need ~{:.0}MiB, over {:.0}% of the {:.0}MiB available",
                    mib(need_mem),
                    mem_fraction * 100.0,
                    mib(avail)
                ));
            }
            if !fits_cpu {
                w.push(format!(
                    "{n} idle guests need ~{need_cpu:.2} cores, over the budget of {cpu_budget} on this shared machine"
                ));
            }
            w.join("; ")
        };
        progress(format!(
            "guest side: STAND-IN, not real guest API servers ({why}). The management side stays the real \
             kube-apiserver; guest writes are counted by the stand-in (hcp_olm_e2e::guest_standin)"
        ));
        drop(probe_guest);
        let mut crds = Vec::new();
        for f in guest_crd_files() {
            crds.extend(yaml_docs(&f)?);
        }
        Guests::StandIn(GuestStandIn::start(n, crds).await?)
    };

    // N HostedClusters, each with a pull secret of its own when BENCH_PULL_SECRETS=1 (its
    // registry lookups are then keyed apart from every other cluster's).
    let own_pull_secrets = std::env::var("BENCH_PULL_SECRETS").is_ok_and(|v| v == "1");
    let t = Instant::now();
    let template = hosted_cluster_template()?;
    let mut created = futures::stream::iter(0..n)
        .map(|i| {
            let (mgmt, template, guests) = (&mgmt, &template, &guests);
            async move {
                let kc = guests.kubeconfig(i)?;
                create_hosted_cluster(mgmt, template, i, kc)
                    .await
                    .with_context(|| format!("creating HostedCluster hc{i}"))?;
                if own_pull_secrets {
                    own_pull_secret(mgmt, i)
                        .await
                        .with_context(|| format!("pull secret of hc{i}"))?;
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(16);
    let mut done = 0;
    while let Some(r) = created.next().await {
        r?;
        done += 1;
        if done % (n / 10).max(1) == 0 {
            progress(format!(
                "created {done}/{n} HostedClusters ({:.0}s)",
                t.elapsed().as_secs_f64()
            ));
        }
    }
    drop(created);

    // Stand-ins for the deployment controller and kubelets (no pods run here): our
    // Deployments report themselves rolled out, so HostedOLMs can become Available.
    let mut rollouts = vec![RolloutStandIn::start(mgmt.client())];
    if let Guests::Real(cs) = &guests {
        rollouts.extend(cs.iter().map(|c| RolloutStandIn::start(c.client())));
    }
    progress(
        "deployment rollout: STAND-IN (no kubelets here): the harness patches the status of our \
         Deployments to rolled out (its own writes are subtracted from the counts)",
    );

    // Baselines, then the controller.
    let before = guests.breakdown().await?;
    if !before.is_empty() {
        progress(format!("guest 0 writes before the controller: {before}"));
    }
    let (m0, g0) = (mgmt.api_writes(RESOURCES).await?, guests.writes().await?);
    let (req0, dur0) = served(&mgmt).await?;
    let by_request0 = request_breakdown(&metrics_text(&mgmt).await?);
    let [mgmt_api_pid, mgmt_etcd_pid] = mgmt.pids();
    let cpu0 = (
        cpu_seconds(std::process::id()),
        cpu_seconds(mgmt_api_pid),
        cpu_seconds(mgmt_etcd_pid),
        guests.cpu_seconds(),
        cpu_seconds(etcd.pid()),
    );
    // Registry lookups on, as shipped: the release and the default catalogs in the real
    // registry, reached by the administrator's mirror flags (the OLM image comes from the
    // release payload, catalogs are resolved to digests and shared by default).
    let local = hcp_olm_e2e::fleet::LocalRegistry::start().await?;
    progress(format!(
        "registry lookups: the real registry at {} (release payload and catalog indexes, via --registry-mirror)",
        local.registry.addr()
    ));
    // Extra controller flags (e.g. a shorter --catalog-refresh-interval), named in the result.
    let extra_args = std::env::var("BENCH_CONTROLLER_ARGS").unwrap_or_default();
    let port = hcp_olm_e2e::ports::free_port()?;
    let log = std::env::temp_dir().join(format!("hcp-olm-bench-controller-{port}.log"));
    let mut cmd = hcp_olm_e2e::process::command(&bin);
    // The guest stand-in and API servers listen on 127.0.0.1 (test/lab-only flag).
    cmd.env("HCP_OLM_GUEST_SERVER_ALLOWED_CIDRS", "127.0.0.0/8");
    cmd.args([
        "run",
        // As the shipped Deployment runs it (manifests/controller/deployment.yaml).
        "--leader-elect=true",
        "--admin-addr",
        &format!("127.0.0.1:{port}"),
        "--concurrency",
        &concurrency.to_string(),
    ])
    .args(&local.controller_flags)
    .args(extra_args.split_whitespace())
    .env("KUBECONFIG", &controller_kubeconfig)
    .env(
        "RUST_LOG",
        std::env::var("BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::fs::File::create(&log)?);
    let started = Instant::now();
    let controller = Controller {
        child: cmd.spawn().context("starting the controller")?,
        port,
        log,
    };
    progress(format!(
        "controller started (pid {}, log {})",
        controller.pid(),
        controller.log.display()
    ));
    let result = measure(
        n,
        idle_seconds,
        converge_timeout,
        &mgmt,
        &guests,
        &controller,
        started,
        (m0, g0, req0, dur0),
        cpu0,
        &etcd,
        concurrency,
        &by_request0,
        &rollouts,
        &local.registry,
    )
    .await;
    let rss_kib = status_kib(controller.pid(), "VmHWM");
    let log = controller.log.clone();
    let status = controller.stop()?;
    let Measured {
        converge_s,
        writes_per_hc,
        idle_writes,
        idle_requests_per_s,
        resync_requests_per_s,
        idle_reconciles,
        registry_converge,
        registry_idle_per_min,
    } = match result {
        Ok(r) => r,
        Err(e) => {
            let tail = hcp_olm_e2e::process::log_tail(&log, 30);
            bail!("{e:#}\ncontroller log tail ({}):\n{tail}", log.display());
        }
    };
    progress(format!(
        "controller exited with {status} after SIGTERM; guests: {guest_kind}"
    ));
    println!(
        "controller-bench: n={n} guests={} rollout=standin registry=local converge_s={converge_s:.1} writes_per_hc={writes_per_hc:.1} idle_writes={idle_writes} resync_requests_per_s={resync_requests_per_s:.2} idle_requests_per_s={idle_requests_per_s:.2} idle_reconciles={idle_reconciles:.0} rss_mib={:.1} registry_requests_converge={registry_converge} registry_requests_per_min_idle={registry_idle_per_min:.1} own_pull_secrets={own_pull_secrets} controller_args={extra_args:?}",
        if guest_kind.starts_with("STAND-IN") {
            "standin"
        } else {
            "real"
        },
        mib(rss_kib)
    );
    Ok(())
}

/// A pull secret of hosted cluster `i`'s own in its HCP namespace, as HyperShift keeps it
/// (`pull-secret`, `.dockerconfigjson`), with credentials no other cluster has.
async fn own_pull_secret(mgmt: &Cluster, i: usize) -> Result<()> {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("bench-hc{i}:secret-{i}"));
    let config = serde_json::json!({"auths": {
        "registry.redhat.io": {"auth": auth},
        "quay.io": {"auth": auth},
    }});
    let ns = format!("{HC_NS}-hc{i}");
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("pull-secret".into()),
            namespace: Some(ns.clone()),
            ..Default::default()
        },
        type_: Some("kubernetes.io/dockerconfigjson".into()),
        data: Some(BTreeMap::from([(
            ".dockerconfigjson".to_string(),
            k8s_openapi::ByteString(serde_json::to_vec(&config)?),
        )])),
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(mgmt.client(), &ns)
        .create(&kube::api::PostParams::default(), &secret)
        .await?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    n: usize,
    idle_seconds: u64,
    converge_timeout: u64,
    mgmt: &Cluster,
    guests: &Guests,
    controller: &Controller,
    started: Instant,
    (m0, g0, req0, dur0): (u64, u64, f64, f64),
    (harness_cpu0, api_cpu0, etcd_cpu0, guests_cpu0, guest_etcd_cpu0): (f64, f64, f64, f64, f64),
    guest_etcd: &SharedEtcd,
    concurrency: u16,
    by_request0: &BTreeMap<(String, String), f64>,
    rollouts: &[RolloutStandIn],
    registry: &hcp_olm_e2e::registry::Registry,
) -> Result<Measured> {
    let reg0 = registry.requests_served();
    let stand_in_writes = || -> (u64, u64) {
        let g = rollouts.iter().skip(1).map(RolloutStandIn::writes).sum();
        (rollouts[0].writes(), g)
    };
    let (sm0, sg0) = stand_in_writes();
    // Converge: every HostedOLM is Available (every component available) at its
    // generation, every guest has its packageserver Endpoints (second pass), and
    // management writes have stopped for 10s. HostedOLMs are
    // followed by one watch (a LIST of N HostedOLMs every 2 s loaded the API server whose
    // work is being measured).
    let holms: Api<DynamicObject> = Api::all_with(mgmt.client(), &holm_resource());
    let holm_writer =
        kube::runtime::reflector::store::Writer::<DynamicObject>::new(holm_resource());
    let holm_store = holm_writer.as_reader();
    let holm_watch = tokio::spawn(
        kube::runtime::watcher(holms, kube::runtime::watcher::Config::default())
            .default_backoff()
            .reflect(holm_writer)
            .for_each(|_| futures::future::ready(())),
    );
    let _stop_watch = AbortOnDrop(holm_watch);
    let mut guest_done = vec![false; n];
    let mut last_writes = m0;
    let mut last_change = started;
    let mut last_report = Instant::now();
    let deadline = started + Duration::from_secs(converge_timeout);
    let quiet = Duration::from_secs(10);
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let w = mgmt.api_writes(RESOURCES).await? - (stand_in_writes().0 - sm0);
        if w != last_writes {
            last_writes = w;
            last_change = Instant::now();
        }
        let with_status = holm_store.state().iter().filter(|h| available(h)).count();
        let todo: Vec<usize> = (0..n).filter(|i| !guest_done[*i]).collect();
        let checks = futures::stream::iter(todo)
            .map(|i| async move { (i, guests.done(i).await) })
            .buffer_unordered(8)
            .collect::<Vec<_>>()
            .await;
        for (i, d) in checks {
            guest_done[i] = d;
        }
        let guests_ok = guest_done.iter().filter(|d| **d).count();
        if last_report.elapsed() >= Duration::from_secs(10) {
            last_report = Instant::now();
            progress(format!(
                "converging {:.0}s: {with_status}/{n} HostedOLMs Available, {guests_ok}/{n} guests done, {} management writes, controller rss {:.0}MiB",
                started.elapsed().as_secs_f64(),
                w - m0,
                mib(status_kib(controller.pid(), "VmRSS"))
            ));
        }
        if controller_exited(controller) {
            bail!("controller exited early");
        }
        if with_status == n && guests_ok == n && last_change.elapsed() >= quiet {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "not converged after {converge_timeout}s: {with_status}/{n} Available, {guests_ok}/{n} guests done"
            );
        }
    }
    let converge_s = (last_change - started).as_secs_f64();
    // The controller's writes: the API servers' counters less the rollout stand-ins' own.
    let (sm1, sg1) = stand_in_writes();
    let (m1, g1) = (
        mgmt.api_writes(RESOURCES).await? - (sm1 - sm0),
        guests.writes().await? - (sg1 - sg0),
    );
    let (req1, dur1) = served(mgmt).await?;
    let ctl_cpu = cpu_seconds(controller.pid());
    // The harness's own CPU: the stand-in guests (when used) and the convergence polling.
    let harness_cpu = cpu_seconds(std::process::id()) - harness_cpu0;
    let api_cpu = cpu_seconds(mgmt.pids()[0]) - api_cpu0;
    let etcd_cpu = cpu_seconds(mgmt.pids()[1]) - etcd_cpu0;
    let guests_cpu =
        guests.cpu_seconds() - guests_cpu0 + cpu_seconds(guest_etcd.pid()) - guest_etcd_cpu0;
    let writes = (m1 - m0) + (g1 - g0);
    let writes_per_hc = writes as f64 / n as f64;
    let window = started.elapsed().as_secs_f64();
    progress(format!(
        "management requests during convergence, by verb and resource (harness's included: \
         one HostedOLM watch, /metrics reads):\n{}",
        breakdown_table(
            by_request0,
            &request_breakdown(&metrics_text(mgmt).await?),
            n
        )
    ));
    let after = guests.breakdown().await?;
    if !after.is_empty() {
        progress(format!("guest 0 writes after convergence: {after}"));
    }
    let server_cpu = api_cpu + etcd_cpu + guests_cpu;
    progress(format!(
        "converged in {converge_s:.1}s: {} management + {} guest writes ({writes_per_hc:.1} per HostedCluster), {:.0} reconciles",
        m1 - m0,
        g1 - g0,
        controller.reconciles()
    ));
    progress(format!(
        "who bounds convergence ({window:.0}s window, 2 cores shared with other work): CPU controller {ctl_cpu:.1}s, \
         management kube-apiserver {api_cpu:.1}s + etcd {etcd_cpu:.1}s, real guest API servers+etcd {guests_cpu:.1}s, \
         harness incl. stand-in guests {harness_cpu:.1}s (controller {:.0}% of all this CPU); management API server served \
         {:.0} requests ({:.0}/s) with {:.1}s summed server-side latency = {:.2} requests in flight at the server on \
         average, against the controller's {concurrency} concurrent reconciles",
        100.0 * ctl_cpu / (ctl_cpu + server_cpu + harness_cpu).max(1e-9),
        req1 - req0,
        (req1 - req0) / converge_s.max(1e-9),
        dur1 - dur0,
        (dur1 - dur0) / converge_s.max(1e-9),
    ));

    // Idle window.
    let reg1 = registry.requests_served();
    let r0 = controller.reconciles();
    let (ireq0, _) = served(mgmt).await?;
    let idle_by_request0 = request_breakdown(&metrics_text(mgmt).await?);
    let guest_requests0 = guests.requests().await?;
    let t = Instant::now();
    let idle = Duration::from_secs(idle_seconds);
    progress(format!("idle window: {idle_seconds}s"));
    while t.elapsed() < idle {
        tokio::time::sleep((idle - t.elapsed()).min(Duration::from_secs(30))).await;
        if controller_exited(controller) {
            bail!("controller exited during the idle window");
        }
        progress(format!(
            "idle {:.0}/{idle_seconds}s: {} management writes, {:.0} reconciles, controller rss {:.0}MiB",
            t.elapsed().as_secs_f64(),
            mgmt.api_writes(RESOURCES).await? - (stand_in_writes().0 - sm0) - m1,
            controller.reconciles() - r0,
            mib(status_kib(controller.pid(), "VmRSS"))
        ));
    }
    let (sm2, sg2) = stand_in_writes();
    let (m2, g2) = (
        mgmt.api_writes(RESOURCES).await? - (sm2 - sm0),
        guests.writes().await? - (sg2 - sg0),
    );
    let idle_reconciles = controller.reconciles() - r0;
    let reg2 = registry.requests_served();
    progress(format!(
        "registry: {} requests while converging, {} in the idle window ({:.1}/min)",
        reg1 - reg0,
        reg2 - reg1,
        (reg2 - reg1) as f64 * 60.0 / idle_seconds.max(1) as f64
    ));
    let (ireq1, _) = served(mgmt).await?;
    let idle_by_request1 = request_breakdown(&metrics_text(mgmt).await?);
    let guest_requests = guests.requests().await? - guest_requests0;
    progress(format!(
        "management requests in the idle window, by verb and resource:\n{}",
        breakdown_table(&idle_by_request0, &idle_by_request1, n)
    ));
    // What resyncs cost: every request of the idle window on both sides except Lease
    // renewals and non-resource paths (/openapi, /metrics: the API server's and harness's).
    let mgmt_resync: f64 = idle_by_request1
        .iter()
        .filter(|((_, res), _)| !res.starts_with('/') && res != "leases")
        .map(|(k, v)| v - idle_by_request0.get(k).copied().unwrap_or(0.0))
        .sum();
    let resync_requests_per_s = (mgmt_resync + guest_requests as f64) / idle_seconds.max(1) as f64;
    progress(format!(
        "resync requests in the idle window ({idle_reconciles:.0} reconciles): {mgmt_resync:.0} management \
         (Lease renewals left out) + {guest_requests} guest = {resync_requests_per_s:.2}/s"
    ));
    progress(format!(
        "idle window done: {} management + {} guest writes during {:.0} reconciles (resyncs); the management \
         API server served {:.0} non-watch requests meanwhile ({:.1}/s, {:.0} per reconcile, incl. the harness's polls)",
        m2 - m1,
        g2 - g1,
        idle_reconciles,
        ireq1 - ireq0,
        (ireq1 - ireq0) / idle_seconds.max(1) as f64,
        (ireq1 - ireq0) / idle_reconciles.max(1.0),
    ));
    Ok(Measured {
        converge_s,
        writes_per_hc,
        idle_writes: (m2 - m1) + (g2 - g1),
        idle_requests_per_s: (ireq1 - ireq0) / idle_seconds.max(1) as f64,
        resync_requests_per_s,
        idle_reconciles,
        registry_converge: reg1 - reg0,
        registry_idle_per_min: (reg2 - reg1) as f64 * 60.0 / idle_seconds.max(1) as f64,
    })
}

/// Whether a HostedOLM says Available=True for its current generation.
fn available(h: &DynamicObject) -> bool {
    let st = &h.data["status"];
    st["observedGeneration"].as_i64().is_some()
        && st["observedGeneration"].as_i64() == h.metadata.generation
        && st["conditions"].as_array().is_some_and(|cs| {
            cs.iter()
                .any(|c| c["type"] == "Available" && c["status"] == "True")
        })
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What [`measure`] found.
struct Measured {
    converge_s: f64,
    writes_per_hc: f64,
    idle_writes: u64,
    /// Management API requests per second in the idle window (not WATCH; Lease renewals and
    /// the harness's own metric polls included).
    idle_requests_per_s: f64,
    /// Requests per second of the idle window on both sides, Lease renewals left out.
    resync_requests_per_s: f64,
    idle_reconciles: f64,
    /// Requests the local registry answered from the controller's start to convergence.
    registry_converge: u64,
    /// Registry requests per minute in the idle window (catalog and release refreshes).
    registry_idle_per_min: f64,
}

/// Whether the controller process has exited (a zombie or gone). `try_wait` needs
/// `&mut`; the state is read from /proc instead.
fn controller_exited(c: &Controller) -> bool {
    match std::fs::read_to_string(format!("/proc/{}/stat", c.pid())) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, r)| r.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
        Err(_) => true,
    }
}
