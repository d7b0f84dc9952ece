//! Catalog benchmark: our server against `opm serve` on the same catalog, same
//! run, same machine. Measures resident memory (VmRSS) 3 s after load, again
//! after three full ListBundles passes and after the GetBundle samples (each
//! after a 2 s pause), and the peak (VmHWM) over the whole run; start-up time
//! to the first SERVING health answer, full ListBundles time and GetBundle
//! p50/p99. `rss_ratio` compares the highest of the three steady readings of
//! each server. opm runs as in production: `--cache-dir` with the cache a
//! catalog image ships (built once here by `opm serve --cache-only`, outside
//! the figures). The catalog is the packages `opm validate` accepts (opm's own
//! verdict; those our loader refuses besides are listed and left out too).
//! Several rounds in alternating order; the last line gives each ratio as the
//! median (min..max). A failed call or start fails the benchmark. Run via
//! `scripts/bench-catalog.sh` (`make bench-catalog`). Loopback only; every
//! loop is bounded in count and time.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hcp_olm_e2e::catalogbench::{
    self, mib, opm_serve, our_serve, percentile, ratio, serving, status_kb,
};
use hcp_olm_proto::api::registry_client::RegistryClient;
use hcp_olm_proto::api::{self, GetBundleRequest};

struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[derive(Debug, Default)]
struct Figures {
    startup: Duration,
    rss_load_kb: u64,
    rss_listed_kb: u64,
    rss_served_kb: u64,
    rss_peak_kb: u64,
    list_bundles: Duration,
    get_p50: Duration,
    get_p99: Duration,
    bundles: usize,
}

fn rss_kb(pid: u32, key: &str) -> u64 {
    status_kb(pid, key).unwrap_or(0)
}

fn free_port() -> u16 {
    hcp_olm_e2e::ports::free_port().expect("free port")
}

async fn measure(name: &str, mut cmd: Command, port: u16, samples: usize) -> Figures {
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let guard = Guard(child);
    let pid = guard.0.id();
    let limit = Duration::from_secs(600);
    while !serving(port).await {
        assert!(
            started.elapsed() < limit,
            "{name} not serving within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut f = Figures {
        startup: started.elapsed(),
        ..Default::default()
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    f.rss_load_kb = rss_kb(pid, "VmRSS:");

    let ch = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut c = RegistryClient::new(ch).max_decoding_message_size(usize::MAX);
    let mut refs = Vec::new();
    let mut times = Vec::new();
    for round in 0..3 {
        let t = Instant::now();
        let mut s = c
            .list_bundles(api::ListBundlesRequest {})
            .await
            .expect("ListBundles")
            .into_inner();
        let mut n = Vec::new();
        while let Some(b) = s.message().await.expect("stream") {
            n.push((b.package_name, b.channel_name, b.csv_name));
        }
        times.push(t.elapsed());
        if round == 0 {
            refs = n;
        }
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    f.rss_listed_kb = rss_kb(pid, "VmRSS:");
    times.sort();
    f.list_bundles = times[1];
    f.bundles = refs.len();
    refs.sort();
    let mut lat = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    for i in 0..samples {
        if Instant::now() > deadline {
            break;
        }
        // Spread over all bundles.
        let (p, ch, b) = &refs[(i * 7919) % refs.len()];
        let t = Instant::now();
        c.get_bundle(GetBundleRequest {
            pkg_name: p.clone(),
            channel_name: ch.clone(),
            csv_name: b.clone(),
        })
        .await
        .expect("GetBundle");
        lat.push(t.elapsed());
    }
    lat.sort();
    f.get_p50 = percentile(&lat, 50);
    f.get_p99 = percentile(&lat, 99);
    tokio::time::sleep(Duration::from_secs(2)).await;
    f.rss_served_kb = rss_kb(pid, "VmRSS:");
    f.rss_peak_kb = rss_kb(pid, "VmHWM:");
    drop(guard);
    eprintln!(
        "{name}: startup {:?}, rss after load {:.1} MiB, after ListBundles {:.1} MiB, after GetBundles {:.1} MiB, peak {:.1} MiB, ListBundles {:?} ({} bundles), GetBundle p50 {:?} p99 {:?} ({} calls)",
        f.startup,
        mib(f.rss_load_kb),
        mib(f.rss_listed_kb),
        mib(f.rss_served_kb),
        mib(f.rss_peak_kb),
        f.list_bundles,
        f.bundles,
        f.get_p50,
        f.get_p99,
        lat.len()
    );
    f
}

impl Figures {
    /// The highest of the steady readings.
    fn rss_steady_kb(&self) -> u64 {
        self.rss_load_kb
            .max(self.rss_listed_kb)
            .max(self.rss_served_kb)
    }
}

/// opm's version as it reports it (`GitCommit:"v1.73.0"`), for the result line.
fn opm_version(opm: &std::path::Path) -> String {
    let out = Command::new(opm)
        .arg("version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    out.split("GitCommit:\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("unknown")
        .to_string()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let catalog = PathBuf::from(
        args.next()
            .expect("usage: bench CATALOG_DIR SERVER_BIN OPM_BIN [SAMPLES] [ROUNDS]"),
    );
    let server = PathBuf::from(args.next().expect("server binary"));
    let opm = PathBuf::from(args.next().expect("opm binary"));
    let samples: usize = args
        .next()
        .map(|s| s.parse().expect("samples"))
        .unwrap_or(2000)
        .min(100_000);
    let rounds: usize = args
        .next()
        .map(|s| s.parse().expect("rounds"))
        .unwrap_or(4)
        .clamp(1, 20);
    let dir = tempfile::tempdir().expect("tempdir");
    let subset = dir.path().join("catalog");
    std::fs::create_dir_all(&subset).expect("subset dir");
    let verdicts = catalogbench::opm_servable_subset(&catalog, &subset, &opm)
        .expect("the packages both servers accept");
    let packages = std::fs::read_dir(&subset).map(|d| d.count()).unwrap_or(0);
    eprintln!(
        "catalog-bench: {} ({packages} packages served; refused by opm validate: {:?}; accepted by opm, refused by ours: {:?})",
        catalog.display(),
        verdicts.opm_refused,
        verdicts.ours_refused
    );

    // opm as production runs it: the catalog image ships a cache built at image build time
    // (`opm serve --cache-only`), and the pod serves with `--cache-dir` (integrity enforced,
    // opm's default then). Built once here, outside the figures.
    let cache = dir.path().join("opm-cache");
    let t = Instant::now();
    let built = Command::new(&opm)
        .arg("serve")
        .arg(&subset)
        .arg("--cache-dir")
        .arg(&cache)
        .arg("--cache-only")
        .arg("--pprof-addr=")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("opm serve --cache-only");
    assert!(built.success(), "opm could not build its cache: {built}");
    eprintln!(
        "catalog-bench: opm cache built in {:?} (not counted: a catalog image ships it)",
        t.elapsed()
    );
    let opm_cmd = |port: u16| {
        let mut c = opm_serve(Command::new(&opm), &subset, port);
        c.arg("--cache-dir").arg(&cache);
        c
    };

    let mut ratios: [Vec<f64>; 4] = Default::default();
    let r = |a: f64, b: f64| if b == 0.0 { f64::INFINITY } else { a / b };
    for round in 0..rounds {
        // alternating order: neither server always runs on the colder machine
        let opm_first = round % 2 == 0;
        let run_opm = || async {
            let port = free_port();
            measure("opm", opm_cmd(port), port, samples).await
        };
        let run_ours = || async {
            let port = free_port();
            let cmd = our_serve(Command::new(&server), &subset, port);
            measure("ours", cmd, port, samples).await
        };
        let (o, s) = if opm_first {
            let o = run_opm().await;
            (o, run_ours().await)
        } else {
            let s = run_ours().await;
            (run_opm().await, s)
        };
        assert_eq!(
            o.bundles, s.bundles,
            "both servers must list the same bundles"
        );
        let this = [
            r(s.rss_steady_kb() as f64, o.rss_steady_kb() as f64),
            r(s.startup.as_secs_f64(), o.startup.as_secs_f64()),
            r(s.list_bundles.as_secs_f64(), o.list_bundles.as_secs_f64()),
            r(s.get_p99.as_secs_f64(), o.get_p99.as_secs_f64()),
        ];
        eprintln!(
            "catalog-bench: round {}/{rounds} ({} first): rss_ratio={:.3} startup_ratio={:.3} listbundles_ratio={:.3} getbundle_p99_ratio={:.3} rss_peak_ratio={}",
            round + 1,
            if opm_first { "opm" } else { "ours" },
            this[0],
            this[1],
            this[2],
            this[3],
            ratio(s.rss_peak_kb as f64, o.rss_peak_kb as f64)
        );
        for (all, x) in ratios.iter_mut().zip(this) {
            all.push(x);
        }
    }
    println!(
        "catalog-bench: rss_ratio={} startup_ratio={} listbundles_ratio={} getbundle_p99_ratio={} (median (min..max) of {rounds} rounds, order alternating; peer: opm {} serve --cache-dir with its prebuilt cache; {packages} packages by opm validate's verdict)",
        catalogbench::spread(&ratios[0]),
        catalogbench::spread(&ratios[1]),
        catalogbench::spread(&ratios[2]),
        catalogbench::spread(&ratios[3]),
        opm_version(&opm),
    );
}
