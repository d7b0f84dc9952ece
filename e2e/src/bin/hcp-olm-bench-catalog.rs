//! Catalog benchmark: our server against `opm serve` on the same catalog, same
//! run, same machine. Measures resident memory (VmRSS) 3 s after load, again
//! after three full ListBundles passes and after the GetBundle samples (each
//! after a 2 s pause), and the peak (VmHWM) over the whole run; start-up time
//! to the first SERVING health answer, full ListBundles time and GetBundle
//! p50/p99, then prints the ratio line. `rss_ratio` compares the highest of
//! the three steady readings of each server. Run via
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

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let catalog = PathBuf::from(
        args.next()
            .expect("usage: bench CATALOG_DIR SERVER_BIN OPM_BIN [SAMPLES]"),
    );
    let server = PathBuf::from(args.next().expect("server binary"));
    let opm = PathBuf::from(args.next().expect("opm binary"));
    let samples: usize = args
        .next()
        .map(|s| s.parse().expect("samples"))
        .unwrap_or(2000)
        .min(100_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let left_out = catalogbench::servable_subset(&catalog, dir.path()).expect("servable subset");
    eprintln!(
        "catalog-bench: {} (left out, refused by opm's rules: {left_out:?})",
        catalog.display()
    );

    let port = free_port();
    let cmd = opm_serve(Command::new(&opm), dir.path(), port);
    let o = measure("opm", cmd, port, samples).await;

    let port = free_port();
    let cmd = our_serve(Command::new(&server), dir.path(), port);
    let s = measure("ours", cmd, port, samples).await;
    assert_eq!(
        o.bundles, s.bundles,
        "both servers must list the same bundles"
    );

    eprintln!(
        "catalog-bench: rss_peak_ratio={}",
        ratio(s.rss_peak_kb as f64, o.rss_peak_kb as f64)
    );
    println!(
        "catalog-bench: rss_ratio={} startup_ratio={} listbundles_ratio={} getbundle_p99_ratio={}",
        ratio(s.rss_steady_kb() as f64, o.rss_steady_kb() as f64),
        ratio(s.startup.as_secs_f64(), o.startup.as_secs_f64()),
        ratio(s.list_bundles.as_secs_f64(), o.list_bundles.as_secs_f64()),
        ratio(s.get_p99.as_secs_f64(), o.get_p99.as_secs_f64()),
    );
}
