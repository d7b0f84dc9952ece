//! Issue 35 item 2, attack test: one guest user must not take a shared catalog
//! server down for every tenant.
//!
//! The real server binary serves the large real catalog on loopback. An
//! attacker (source address 127.0.0.2, as one tenant's gateway is one pod
//! address) opens 128 connections with a zero HTTP/2 stream window and keeps
//! opening `ListBundles` streams it never reads; a second one (127.0.0.3)
//! runs tight `GetBundle` loops for the heaviest bundles on 16 connections
//! and retries every refused call at once. A bystander
//! (127.0.0.1, another tenant's catalog-operator) measures `GetPackage`
//! latency, first quietly, then under the attack. Required: the bystander's
//! p99 under attack within 2x its quiet p99, no bystander call refused, and
//! the server's RSS below the memory limit the controller renders for catalog
//! Deployments. All clients are real gRPC clients (tonic), the server is the
//! real process; nothing is a stand-in.
//!
//! The attack clients run in their own process (this test binary again, its
//! ignored `dos_attacker_process` entry) at `SCHED_IDLE`: in a cluster the
//! attacker's clients run on other nodes, so their own CPU is not the
//! server's to spend; on this 2-core machine they would otherwise take the
//! bystander's client and the server's CPU away (measured, same server: p99
//! ratio 15-22x with the clients in-process at normal priority, 2.3x in their
//! own process at nice 19). The attack's call rate is printed
//! (`attack_calls_per_s`, ~2,500/s either way) to show it is not throttled
//! by this. Everything the server does for the attack still competes at full
//! priority.
//!
//! Bounded: 128 + 16 connections, at most 100 open ListBundles streams per
//! attack connection, 16 GetBundle loops per flood connection, the attack
//! runs at most `ATTACK_LIMIT` and stops at once when the server's RSS passes
//! the limit (the old server was stopped there, never left to grow).
//!
//! Prints one line starting `catalog-dos:` with the figures.

mod common;

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hcp_olm_proto::api::registry_client::RegistryClient;
use hcp_olm_proto::api::{self};
use tonic::transport::Endpoint;

/// The smallest memory limit the controller renders for a catalog server
/// container (`catalog_server_container` in controlplane/src/render/hcp.rs,
/// used for own and shared catalogs: limit = request, 160Mi for every
/// default catalog but redhat-operators' 420Mi): keep the two equal.
const RSS_LIMIT_MIB: f64 = 160.0;
const ATTACK_CONNS: usize = 128;
const STREAMS_PER_CONN: usize = 100;
const FLOOD_CONNS: usize = 16;
const LOOPS_PER_FLOOD_CONN: usize = 16;
/// Calls per bystander round; rounds per phase. The figure compared is the
/// median of the rounds' p99s, so one burst of load from the other work on
/// this shared 2-core machine does not decide the result either way.
const ROUND_CALLS: usize = 400;
const ROUNDS: usize = 5;
/// As a benchmark (HCP_OLM_DOS_BENCH=1), more calls per round: a p99 of 1,000
/// calls is the 10th slowest, not the 4th.
const BENCH_ROUND_CALLS: usize = 1000;
/// As a benchmark, more rounds per phase (the median of 11 p99s).
const BENCH_ROUNDS: usize = 11;
/// The attack process's environment: the server port, the heavy bundles.
const ATTACK_PORT_ENV: &str = "HCP_OLM_DOS_ATTACK_PORT";
/// "1": the bystander's thread runs at `SCHED_FIFO` (a client on another node
/// gets its CPU when it has work).
const BYSTANDER_RT_ENV: &str = "HCP_OLM_DOS_BYSTANDER_RT";
const ATTACK_HEAVY_ENV: &str = "HCP_OLM_DOS_ATTACK_HEAVY";
/// Lines of the attack process the test reads (libtest prints its own too).
const ATTACK_LINE: &str = "dos-attack: ";
/// Upper bound of the whole attack phase.
const ATTACK_LIMIT: Duration = Duration::from_secs(60);
/// A bystander call slower than this counts as this slow (and as failed).
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

const ATTACKER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));
const FLOODER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 3));
const BYSTANDER: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1));

fn endpoint(port: u16, from: IpAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .local_address(Some(from))
        .connect_timeout(Duration::from_secs(5))
}

fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

fn rss_kb(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

fn p99(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Whether the experiment switch `name` is "1".
fn env_is(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

/// Moves the calling thread to `SCHED_FIFO` priority 10 (through `chrt`, no
/// `unsafe` here).
fn realtime_thread() {
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .expect("own thread id");
    let ok = std::process::Command::new("chrt")
        .args(["-f", "-p", "10", &tid])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "chrt -f -p 10 {tid}");
}

/// The bystander: its own thread and single-threaded runtime (another
/// tenant's client is another process), one connection, sequential calls.
struct Bystander {
    tx: std::sync::mpsc::Sender<usize>,
    rx: std::sync::mpsc::Receiver<(Vec<Duration>, usize)>,
}

impl Bystander {
    fn start(port: u16, packages: Vec<String>) -> Bystander {
        let (tx, cmd_rx) = std::sync::mpsc::channel::<usize>();
        let (res_tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            if env_is(BYSTANDER_RT_ENV) {
                realtime_thread();
            }
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let ch = endpoint(port, BYSTANDER).connect().await.expect("connect");
                let mut c = RegistryClient::new(ch);
                let mut i = 0usize;
                while let Ok(n) = cmd_rx.recv() {
                    let mut samples = Vec::with_capacity(n);
                    let mut failed = 0usize;
                    for _ in 0..n {
                        let name = packages[i % packages.len()].clone();
                        i += 1;
                        let t = Instant::now();
                        let r = tokio::time::timeout(
                            CALL_TIMEOUT,
                            c.get_package(api::GetPackageRequest { name }),
                        )
                        .await;
                        samples.push(t.elapsed());
                        if !matches!(r, Ok(Ok(_))) {
                            failed += 1;
                        }
                    }
                    if res_tx.send((samples, failed)).is_err() {
                        return;
                    }
                }
            });
        });
        Bystander { tx, rx }
    }

    /// `rounds` rounds of `n` calls: each round's p99, and the failed count.
    fn measure(&self, rounds: usize, n: usize) -> (Vec<Duration>, usize) {
        let mut p99s = Vec::new();
        let mut failed = 0;
        for _ in 0..rounds {
            self.tx.send(n).expect("bystander alive");
            let (mut s, f) = self
                .rx
                .recv_timeout(CALL_TIMEOUT * n as u32 + Duration::from_secs(10))
                .expect("bystander round");
            p99s.push(p99(&mut s));
            failed += f;
        }
        (p99s, failed)
    }
}

#[derive(Default)]
struct AttackCounts {
    streams_open: AtomicU64,
    refused: AtomicU64,
    getbundle_ok: AtomicU64,
    /// Why attack calls did not get through, by kind.
    why: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl AttackCounts {
    fn refused(&self, why: String) {
        self.refused.fetch_add(1, Ordering::Relaxed);
        *self.why.lock().expect("why").entry(why).or_insert(0) += 1;
    }
}

/// The attack process (see the module doc): reads the server port and the
/// heavy bundles from its environment, attacks until its stdin closes,
/// prints its counts. Run only by the test below.
#[test]
#[ignore = "the attack client process of security_catalog_one_client_cannot_starve_or_exhaust_the_server, started by it"]
fn dos_attacker_process() {
    let port: u16 = std::env::var(ATTACK_PORT_ENV)
        .expect("run by security_catalog_one_client_cannot_starve_or_exhaust_the_server")
        .parse()
        .expect("port");
    let heavy: Vec<(String, String, String)> =
        serde_json::from_str(&std::env::var(ATTACK_HEAVY_ENV).expect("heavy bundles"))
            .expect("heavy bundles");
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(AttackCounts::default());
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            // EOF (or an error) on stdin: the test wants the attack over.
            let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
            stop.store(true, Ordering::Relaxed);
        });
    }
    {
        let (stop, counts) = (stop.clone(), counts.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                println!(
                    "{ATTACK_LINE}progress {} {}",
                    counts.streams_open.load(Ordering::Relaxed),
                    counts.getbundle_ok.load(Ordering::Relaxed)
                );
                std::thread::sleep(Duration::from_millis(250));
            }
        });
    }
    run_attack(port, heavy, stop, counts.clone());
    println!(
        "{ATTACK_LINE}done {} {} {} {}",
        counts.streams_open.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
        counts.getbundle_ok.load(Ordering::Relaxed),
        serde_json::to_string(&*counts.why.lock().expect("why")).expect("json"),
    );
}

/// The attack process, seen from the test: its counts so far, and its stdin,
/// closed to end the attack.
struct Attack {
    child: std::process::Child,
    stdin: Arc<std::sync::Mutex<Option<std::process::ChildStdin>>>,
    streams_open: Arc<AtomicU64>,
    getbundle_ok: Arc<AtomicU64>,
    done: std::sync::mpsc::Receiver<String>,
}

impl Attack {
    /// Starts the attack process at `SCHED_IDLE` (see the module doc).
    fn start(port: u16, heavy: &[(String, String, String)]) -> Attack {
        use std::io::BufRead;
        let exe = std::env::current_exe().expect("test binary");
        let mut child = std::process::Command::new("chrt")
            .args(["--idle", "0", "setpriv", "--pdeathsig", "KILL", "--"])
            .arg(exe)
            .args([
                "--exact",
                "dos_attacker_process",
                "--ignored",
                "--nocapture",
            ])
            .env(ATTACK_PORT_ENV, port.to_string())
            .env(
                ATTACK_HEAVY_ENV,
                serde_json::to_string(heavy).expect("json"),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the attack process (chrt, setpriv)");
        let stdin = Arc::new(std::sync::Mutex::new(child.stdin.take()));
        let out = child.stdout.take().expect("stdout");
        let streams_open = Arc::new(AtomicU64::new(0));
        let getbundle_ok = Arc::new(AtomicU64::new(0));
        let (tx, done) = std::sync::mpsc::channel();
        {
            let (streams_open, getbundle_ok) = (streams_open.clone(), getbundle_ok.clone());
            std::thread::spawn(move || {
                for line in std::io::BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    let Some(rest) = line.strip_prefix(ATTACK_LINE) else {
                        continue;
                    };
                    if let Some(p) = rest.strip_prefix("progress ") {
                        let mut f = p.split(' ').filter_map(|v| v.parse::<u64>().ok());
                        if let (Some(s), Some(g)) = (f.next(), f.next()) {
                            streams_open.store(s, Ordering::Relaxed);
                            getbundle_ok.store(g, Ordering::Relaxed);
                        }
                    } else if let Some(d) = rest.strip_prefix("done ") {
                        let _ = tx.send(d.to_string());
                    }
                }
            });
        }
        Attack {
            child,
            stdin,
            streams_open,
            getbundle_ok,
            done,
        }
    }

    /// A handle that ends the attack when called (from any thread).
    fn stopper(&self) -> impl Fn() + Send + 'static {
        let stdin = self.stdin.clone();
        move || drop(stdin.lock().unwrap_or_else(|e| e.into_inner()).take())
    }

    /// Ends the attack; its final counts: streams opened, refused, GetBundle
    /// answers, and why calls were refused.
    fn finish(mut self) -> (u64, u64, u64, String) {
        (self.stopper())();
        let line = self.done.recv_timeout(Duration::from_secs(60));
        if line.is_err() {
            let _ = self.child.kill();
        }
        let status = self.child.wait().expect("attack process");
        let line = line.unwrap_or_else(|_| panic!("the attack process gave no counts ({status})"));
        assert!(status.success(), "the attack process failed: {status}");
        let f: Vec<&str> = line.splitn(4, ' ').collect();
        let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        (n(0), n(1), n(2), f.get(3).unwrap_or(&"").to_string())
    }
}

/// Attacks on a runtime of one worker until `stop` is set.
fn run_attack(
    port: u16,
    heavy: Vec<(String, String, String)>,
    stop: Arc<AtomicBool>,
    counts: Arc<AttackCounts>,
) {
    {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async move {
            let mut tasks = tokio::task::JoinSet::new();
            // Zero-window connections holding ListBundles streams open.
            for _ in 0..ATTACK_CONNS {
                let stop = stop.clone();
                let counts = counts.clone();
                tasks.spawn(async move {
                    let Ok(ch) = endpoint(port, ATTACKER)
                        .initial_stream_window_size(0)
                        .connect()
                        .await
                    else {
                        counts.refused("connect".into());
                        return;
                    };
                    let mut held = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        if held.len() < STREAMS_PER_CONN {
                            let mut c = RegistryClient::new(ch.clone());
                            match tokio::time::timeout(
                                Duration::from_secs(2),
                                c.list_bundles(api::ListBundlesRequest {}),
                            )
                            .await
                            {
                                Ok(Ok(s)) => {
                                    counts.streams_open.fetch_add(1, Ordering::Relaxed);
                                    held.push(s);
                                }
                                Ok(Err(e)) => {
                                    counts.refused(format!("ListBundles {:?}", e.code()));
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                                Err(_) => {
                                    counts.refused("ListBundles waited 2s".into());
                                }
                            }
                        } else {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                    drop(held);
                });
            }
            // Tight GetBundle loops on the heaviest bundles.
            for k in 0..FLOOD_CONNS {
                let Ok(ch) = endpoint(port, FLOODER).connect().await else {
                    counts.refused("connect".into());
                    continue;
                };
                for j in 0..LOOPS_PER_FLOOD_CONN {
                    let stop = stop.clone();
                    let counts = counts.clone();
                    let heavy = heavy.clone();
                    let mut c =
                        RegistryClient::new(ch.clone()).max_decoding_message_size(usize::MAX);
                    tasks.spawn(async move {
                        let mut i = k * LOOPS_PER_FLOOD_CONN + j;
                        while !stop.load(Ordering::Relaxed) {
                            let (p, ch, b) = heavy[i % heavy.len()].clone();
                            i += 1;
                            match c
                                .get_bundle(api::GetBundleRequest {
                                    pkg_name: p,
                                    channel_name: ch,
                                    csv_name: b,
                                })
                                .await
                            {
                                Ok(_) => {
                                    counts.getbundle_ok.fetch_add(1, Ordering::Relaxed);
                                }
                                Err(e) => {
                                    counts.refused(format!("GetBundle {:?}", e.code()));
                                    // A refused call is retried at once: the
                                    // attacker does not back off.
                                    tokio::task::yield_now().await;
                                }
                            }
                        }
                    });
                }
            }
            while tasks.join_next().await.is_some() {}
        });
        // Dropping the runtime closes every attack connection.
    }
}

#[test]
fn security_catalog_one_client_cannot_starve_or_exhaust_the_server() {
    let setup = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let logs = tempfile::tempdir().expect("tempdir");
    let (subset, _left_out) = common::servable_subset(&common::fixture("large"));
    let server = setup.block_on(common::start_ours(subset.path(), logs.path()));
    let port = server.port;
    let pid = server.process.pid().expect("pid");

    // The workload: every package for GetPackage, the 32 heaviest bundles for GetBundle.
    let (packages, heavy) = setup.block_on(async {
        let mut c = server.registry().await;
        let mut s = c
            .list_packages(api::ListPackageRequest {})
            .await
            .expect("ListPackages")
            .into_inner();
        let mut packages = Vec::new();
        while let Some(p) = s.message().await.expect("ListPackages item") {
            packages.push(p.name);
        }
        let mut s = c
            .list_bundles(api::ListBundlesRequest {})
            .await
            .expect("ListBundles")
            .into_inner();
        let mut refs = Vec::new();
        while let Some(b) = s.message().await.expect("ListBundles item") {
            refs.push((b.package_name, b.channel_name, b.csv_name));
        }
        let mut sized = Vec::new();
        for (p, ch, b) in refs {
            let got = c
                .get_bundle(api::GetBundleRequest {
                    pkg_name: p.clone(),
                    channel_name: ch.clone(),
                    csv_name: b.clone(),
                })
                .await
                .expect("GetBundle")
                .into_inner();
            let size = got.csv_json.len() + got.object.iter().map(String::len).sum::<usize>();
            sized.push((size, (p, ch, b)));
        }
        sized.sort_by_key(|s| std::cmp::Reverse(s.0));
        if env_is("HCP_OLM_DOS_LIGHT") {
            sized.reverse();
        }
        let heavy: Vec<_> = sized.into_iter().take(32).map(|(_, r)| r).collect();
        (packages, heavy)
    });
    assert!(
        packages.len() > 50,
        "large catalog: {} packages",
        packages.len()
    );

    let bench = std::env::var_os("HCP_OLM_DOS_BENCH").is_some_and(|v| v == "1");
    let (rounds_n, round_calls) = if bench {
        (BENCH_ROUNDS, BENCH_ROUND_CALLS)
    } else {
        (ROUNDS, ROUND_CALLS)
    };
    let bystander = Bystander::start(port, packages);
    // Warm-up, then the quiet figure.
    bystander.measure(1, round_calls);
    let (mut quiet, quiet_failed) = bystander.measure(rounds_n, round_calls);
    assert_eq!(quiet_failed, 0, "bystander calls failed with no attack");
    let quiet_p99 = median(&mut quiet);
    let rss_quiet = rss_kb(pid).expect("server alive");

    // The attack, with an RSS watch that stops it at the limit.
    let stop = Arc::new(AtomicBool::new(false));
    let attack = Attack::start(port, &heavy);
    let peak = Arc::new(AtomicU64::new(rss_quiet));
    let over = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(std::sync::Mutex::new(Vec::<(Duration, u64)>::new()));
    let watch = {
        let (stop, peak, over, samples) =
            (stop.clone(), peak.clone(), over.clone(), samples.clone());
        let end_attack = attack.stopper();
        std::thread::spawn(move || {
            let started = Instant::now();
            while !stop.load(Ordering::Relaxed) && started.elapsed() < ATTACK_LIMIT {
                let Some(kb) = rss_kb(pid) else {
                    over.store(true, Ordering::Relaxed);
                    break;
                };
                peak.fetch_max(kb, Ordering::Relaxed);
                samples
                    .lock()
                    .expect("samples")
                    .push((started.elapsed(), kb));
                if mib(kb) > RSS_LIMIT_MIB {
                    over.store(true, Ordering::Relaxed);
                    break;
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            end_attack();
            stop.store(true, Ordering::Relaxed);
        })
    };
    let attack_started = Instant::now();
    // Let the attack reach its full size (every stream it can get open).
    let ramp_deadline = attack_started + Duration::from_secs(20);
    let mut last = 0;
    loop {
        std::thread::sleep(Duration::from_millis(1000));
        let now = attack.streams_open.load(Ordering::Relaxed);
        if over.load(Ordering::Relaxed)
            || Instant::now() > ramp_deadline
            || (now > 0 && now == last && attack.getbundle_ok.load(Ordering::Relaxed) > 0)
        {
            break;
        }
        last = now;
    }
    let (mut loaded, loaded_failed) = if over.load(Ordering::Relaxed) {
        (vec![CALL_TIMEOUT], 0)
    } else {
        bystander.measure(rounds_n, round_calls)
    };
    let attack_secs = attack_started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let rss_end = rss_kb(pid);
    watch.join().expect("watch");
    let (streams_open, refused, getbundle_ok, why) = attack.finish();
    let loaded_p99 = median(&mut loaded);
    let peak_mib = mib(peak.load(Ordering::Relaxed));
    let samples = samples.lock().expect("samples").clone();
    // Plateau: the highest reading of the last third of the attack against
    // the highest of the first two thirds.
    let cut = samples.len() * 2 / 3;
    let early = samples[..cut].iter().map(|s| s.1).max().unwrap_or(0);
    let late = samples[cut..].iter().map(|s| s.1).max().unwrap_or(0);
    let ratio = ms(loaded_p99) / ms(quiet_p99);
    let rounds = |v: &[Duration]| {
        v.iter()
            .map(|d| format!("{:.2}", ms(*d)))
            .collect::<Vec<_>>()
            .join("/")
    };
    println!(
        "catalog-dos: quiet_p99_ms={:.3} attack_p99_ms={:.3} ratio={ratio:.2} (median of round p99s, {round_calls} calls a round; quiet rounds {} attack rounds {}) bystander_failed={loaded_failed} rss_quiet_mib={:.1} rss_peak_mib={peak_mib:.1} rss_end_mib={} rss_limit_mib={RSS_LIMIT_MIB} rss_early_max_mib={:.1} rss_late_max_mib={:.1} attack_s={attack_secs:.1} attack_calls_per_s={:.0} streams_open={streams_open} refused={refused} {why} getbundle_ok={getbundle_ok} flood_bundles={} server_args={:?} server_bin={} profile={} bystander={} (attack clients: own process at SCHED_IDLE, standing in for other nodes)",
        ms(quiet_p99),
        ms(loaded_p99),
        rounds(&quiet),
        rounds(&loaded),
        mib(rss_quiet),
        rss_end.map_or("gone".to_string(), |kb| format!("{:.1}", mib(kb))),
        mib(early),
        mib(late),
        (streams_open + refused + getbundle_ok) as f64 / attack_secs,
        if env_is("HCP_OLM_DOS_LIGHT") {
            "lightest-32"
        } else {
            "heaviest-32"
        },
        std::env::var("HCP_OLM_CATALOG_SERVER_ARGS").unwrap_or_default(),
        std::env::var("HCP_OLM_CATALOG_SERVER_BIN").unwrap_or_else(|_| "this-build".into()),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        if env_is(BYSTANDER_RT_ENV) {
            "SCHED_FIFO"
        } else {
            "normal"
        },
    );
    assert!(
        !over.load(Ordering::Relaxed),
        "server RSS passed the {RSS_LIMIT_MIB} MiB limit under attack (peak {peak_mib:.1} MiB; attack stopped there)"
    );
    assert!(
        getbundle_ok > 0,
        "the flood never got an answer: the attack did not run"
    );
    assert_eq!(loaded_failed, 0, "bystander calls failed under attack");
    // The 2x goal is a speed figure: it is printed above and asserted only when this runs as
    // a benchmark (HCP_OLM_DOS_BENCH=1, nothing else on the machine). In `make test` it shares
    // two cores with other tests, where the quiet baseline alone moved from 0.6 to 9.9 ms
    // between runs; there the bystander must still be answered promptly (the old server
    // left it at the 5 s call timeout).
    if bench {
        // The figure means something only while the flood runs (it once "stalled" behind
        // a stranded work slot, and those runs measured a quiet server).
        let flood_per_s = getbundle_ok as f64 / attack_secs;
        assert!(
            flood_per_s >= 500.0,
            "the GetBundle flood got {flood_per_s:.0} answers/s: the attack did not run at full rate"
        );
        assert!(
            ratio <= 2.0,
            "bystander GetPackage p99 {:.3} ms under attack is {ratio:.2}x its quiet p99 {:.3} ms",
            ms(loaded_p99),
            ms(quiet_p99)
        );
    }
    assert!(
        loaded_p99 <= Duration::from_millis(750),
        "bystander GetPackage p99 {:.3} ms under attack (quiet {:.3} ms): starved",
        ms(loaded_p99),
        ms(quiet_p99)
    );
    assert!(
        mib(late) <= mib(early) * 1.1 + 4.0,
        "server RSS still growing at the end of the attack: {:.1} MiB then {:.1} MiB",
        mib(early),
        mib(late)
    );
    // Still serving after the attack.
    setup.block_on(async {
        assert!(
            common::serving(port).await,
            "server not SERVING after the attack"
        );
    });
}

/// Found while explaining why the flood of the test above "stalled" in some
/// runs: a `ListBundles` stream whose reader keeps its window at zero could
/// be granted the work slot while nobody polls it (the transport polls a
/// body only when it has room to send), so the slot stayed held until the
/// stream went, and every heavy call of every tenant waited. Here the slot
/// is kept busy (a GetBundle loop) while zero-window streams are opened, so
/// their next items wait for it; then another tenant's GetBundle calls must
/// still be answered.
#[test]
fn zero_window_streams_cannot_strand_the_work_slot() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let logs = tempfile::tempdir().expect("tempdir");
    let (subset, _left_out) = common::servable_subset(&common::fixture("large"));
    rt.block_on(async {
        let server = common::start_ours(subset.path(), logs.path()).await;
        let port = server.port;
        let mut c = server.registry().await;
        let first = c
            .list_bundles(api::ListBundlesRequest {})
            .await
            .expect("ListBundles")
            .into_inner()
            .message()
            .await
            .expect("ListBundles item")
            .expect("a bundle");
        let req = move || api::GetBundleRequest {
            pkg_name: first.package_name.clone(),
            channel_name: first.channel_name.clone(),
            csv_name: first.csv_name.clone(),
        };
        // Keep the work slot busy.
        let stop = Arc::new(AtomicBool::new(false));
        let flood_ch = endpoint(port, FLOODER).connect().await.expect("connect");
        let mut flood = tokio::task::JoinSet::new();
        for _ in 0..4 {
            let (stop, req) = (stop.clone(), req.clone());
            let mut c = RegistryClient::new(flood_ch.clone()).max_decoding_message_size(usize::MAX);
            flood.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let _ = c.get_bundle(req()).await;
                }
            });
        }
        // Zero-window streams, held open and never read.
        let mut held = Vec::new();
        for _ in 0..2 {
            let ch = endpoint(port, ATTACKER)
                .initial_stream_window_size(0)
                .connect()
                .await
                .expect("connect");
            for _ in 0..8 {
                let mut c = RegistryClient::new(ch.clone());
                if let Ok(Ok(s)) = tokio::time::timeout(
                    Duration::from_secs(5),
                    c.list_bundles(api::ListBundlesRequest {}),
                )
                .await
                {
                    held.push(s);
                }
            }
        }
        assert!(!held.is_empty(), "no ListBundles stream was opened");
        // Let their first answers fill the windows and the next items queue.
        tokio::time::sleep(Duration::from_secs(2)).await;
        stop.store(true, Ordering::Relaxed);
        // (A flood call stuck behind a stranded slot never returns: abort it.)
        flood.abort_all();
        while flood.join_next().await.is_some() {}
        // Another tenant's heavy calls.
        let by = endpoint(port, BYSTANDER).connect().await.expect("connect");
        let mut c = RegistryClient::new(by).max_decoding_message_size(usize::MAX);
        for i in 0..20 {
            let r = tokio::time::timeout(Duration::from_secs(10), c.get_bundle(req())).await;
            assert!(
                matches!(r, Ok(Ok(_))),
                "GetBundle {i} of another tenant beside {} zero-window ListBundles streams: {r:?}",
                held.len()
            );
        }
        drop(held);
    });
}
