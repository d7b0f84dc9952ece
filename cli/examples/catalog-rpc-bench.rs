//! Benchmark client (not a test; used by `scripts/bench-tunnel.sh`): a full `ListBundles`
//! stream, repeated, and sequential small `GetPackage` calls, against one catalog address,
//! optionally through an HTTP CONNECT proxy. One channel (one HTTP/2 connection), as OLM
//! keeps one per CatalogSource.
//!
//! Usage: catalog-rpc-bench ADDR [PROXY|-] [LISTBUNDLES_REPEATS] [SMALL_CALLS]
//! Last line: `rpc-bench: listbundles_s=<median> bundles=<n> mbytes=<payload> mbit_per_s=<..> small_p50_ms=<..> small_p99_ms=<..> stream_bytes=<payload of one ListBundles, exact>`

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use hcp_olm_proto::api::registry_client::RegistryClient;
use hcp_olm_proto::api::{self};

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let Some(addr) = args.get(1) else {
        bail!("usage: catalog-rpc-bench ADDR [PROXY|-] [LISTBUNDLES_REPEATS] [SMALL_CALLS]");
    };
    let proxy = args
        .get(2)
        .filter(|p| p.as_str() != "-")
        .map(String::as_str);
    let repeats: usize = args.get(3).map_or(Ok(3), |s| s.parse())?;
    let calls: usize = args.get(4).map_or(Ok(500), |s| s.parse())?;
    let ch = hcp_olm_cli::connect::dial(addr, proxy, Duration::from_secs(60)).await?;
    let mut rpc = RegistryClient::new(ch).max_decoding_message_size(256 << 20);

    let packages = rpc
        .list_packages(api::ListPackageRequest {})
        .await
        .context("ListPackages")?
        .into_inner();
    let mut names = Vec::new();
    let mut s = packages;
    while let Some(p) = s.message().await.context("ListPackages")? {
        names.push(p.name);
    }
    let Some(pkg) = names.first().cloned() else {
        bail!("catalog {addr} has no packages");
    };

    // ListBundles: one warm-up, then `repeats` timed full streams.
    let mut times = Vec::new();
    let (mut bundles, mut bytes) = (0usize, 0usize);
    for i in 0..=repeats {
        let start = Instant::now();
        let mut s = rpc
            .list_bundles(api::ListBundlesRequest {})
            .await
            .context("ListBundles")?
            .into_inner();
        let (mut n, mut b) = (0usize, 0usize);
        while let Some(m) = s.message().await.context("ListBundles")? {
            n += 1;
            b += prost::Message::encoded_len(&m);
        }
        if i > 0 {
            times.push(start.elapsed().as_secs_f64());
        }
        (bundles, bytes) = (n, b);
    }
    times.sort_by(f64::total_cmp);
    let lb = percentile(&times, 0.5);

    // Small RPCs, sequential, after a few warm-up calls.
    let mut lat = Vec::with_capacity(calls);
    for i in 0..calls + 10 {
        let start = Instant::now();
        rpc.get_package(api::GetPackageRequest { name: pkg.clone() })
            .await
            .context("GetPackage")?;
        if i >= 10 {
            lat.push(start.elapsed().as_secs_f64() * 1000.0);
        }
    }
    lat.sort_by(f64::total_cmp);
    let mbytes = bytes as f64 / 1e6;
    println!(
        "rpc-bench: listbundles_s={lb:.3} bundles={bundles} mbytes={mbytes:.1} mbit_per_s={:.1} small_p50_ms={:.3} small_p99_ms={:.3} stream_bytes={bytes}",
        mbytes * 8.0 / lb,
        percentile(&lat, 0.5),
        percentile(&lat, 0.99)
    );
    Ok(())
}
