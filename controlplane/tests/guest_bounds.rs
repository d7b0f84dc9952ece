//! Issue 35, item 1: a guest API server's answers are untrusted and bounded. A HostedCluster's
//! owner can point the admin kubeconfig at a server of their own; kube's client buffers a
//! whole response body, so one endless answer used to grow the controller until it was
//! OOM-killed (and the standby after it), costing every tenant its OLM.
//!
//! The hostile server here is a STAND-IN (`hostile_guest::Hostile`, see there): no real API
//! server sends an endless body or trickles one a byte at a time.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use hcp_olm_controlplane::runtime::guest;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::Api;

mod hostile_guest;
use hostile_guest::{Hostile, Mode, rss};

/// A guest client as the controller builds one; `lab`: with loopback allowed, as the tests
/// run the controller (`--guest-server-allowed-cidrs 127.0.0.0/8`), else with its defaults.
async fn client_for(
    kubeconfig: &str,
    response_timeout: Duration,
    lab: bool,
) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    let policy = if lab {
        guest::ServerPolicy::allowing(&["127.0.0.0/8"]).map_err(anyhow::Error::msg)?
    } else {
        guest::ServerPolicy::default()
    };
    guest::client(
        &config,
        Duration::from_secs(10),
        response_timeout,
        &policy,
        None,
    )
    .map_err(anyhow::Error::msg)
}

const MIB: u64 = 1 << 20;

/// The controller's GET of the guest OLM CRD (its first request to a guest whose watches are
/// not synced) against a server whose answer never ends: the read stops at its byte bound,
/// and this process's RSS grows by far less than the bound on growth while it streams.
/// On the old code the body was buffered whole: RSS crossed the bound within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_an_endless_guest_answer_is_cut_at_its_byte_bound() -> Result<()> {
    const GROWTH_BOUND: u64 = 64 * MIB;
    let hostile = Hostile::start(Mode::Endless).await?;
    let client = client_for(&hostile.kubeconfig(), Duration::from_secs(60), true).await?;
    let before = rss()?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let get = tokio::spawn(async move { api.get_opt("catalogsources.operators.coreos.com").await });
    let started = Instant::now();
    let mut peak = before;
    // Bounded in time (20 s) and count (one look every 20 ms).
    while !get.is_finished() {
        peak = peak.max(rss()?);
        if peak.saturating_sub(before) > GROWTH_BOUND {
            get.abort();
            bail!(
                "RSS grew by {} MiB (bound {} MiB) while the hostile guest streamed {} MiB: the answer is read without a bound",
                peak.saturating_sub(before) / MIB,
                GROWTH_BOUND / MIB,
                hostile.streamed() / MIB
            );
        }
        if started.elapsed() > Duration::from_secs(20) {
            get.abort();
            bail!(
                "the GET did not end within 20 s ({} MiB streamed)",
                hostile.streamed() / MIB
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let e = get
        .await?
        .err()
        .context("an endless body was read as an answer")?;
    eprintln!(
        "endless answer: {e}; RSS growth {:.1} MiB (peak {:.1} MiB), {:.1} MiB streamed, {:?}",
        peak.saturating_sub(before) as f64 / MIB as f64,
        peak as f64 / MIB as f64,
        hostile.streamed() as f64 / MIB as f64,
        started.elapsed()
    );
    let bound = hcp_olm_apply::bounded::find(&e).context("not a bound error")?;
    ensure!(
        matches!(bound, hcp_olm_apply::bounded::BoundError::TooLarge { .. }),
        "{bound:?}"
    );
    ensure!(
        e.to_string()
            .contains("catalogsources.operators.coreos.com"),
        "the error names the request: {e}"
    );
    Ok(())
}

/// A guest that answers at once and then trickles its body (a byte every now and then,
/// never idle long enough for a read timeout): the whole answer has a deadline, not only
/// its head. On the old code the GET ran until this test's own 20 s guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_a_trickled_guest_answer_ends_at_its_deadline() -> Result<()> {
    let hostile = Hostile::start(Mode::Trickle).await?;
    let deadline = Duration::from_secs(3);
    let client = client_for(&hostile.kubeconfig(), deadline, true).await?;
    let api: Api<CustomResourceDefinition> = Api::all(client);
    let started = Instant::now();
    let r = tokio::time::timeout(
        Duration::from_secs(20),
        api.get_opt("catalogsources.operators.coreos.com"),
    )
    .await;
    let took = started.elapsed();
    let Ok(r) = r else {
        bail!(
            "the GET did not end within 20 s ({} bytes trickled): the body has no deadline",
            hostile.streamed()
        );
    };
    let e = r.err().context("a trickled body was read as an answer")?;
    eprintln!("trickled answer: {e}; ended after {took:?}");
    let bound = hcp_olm_apply::bounded::find(&e).context("not a bound error")?;
    ensure!(
        matches!(bound, hcp_olm_apply::bounded::BoundError::Timeout { .. }),
        "{bound:?}"
    );
    ensure!(
        took >= deadline && took < deadline + Duration::from_secs(2),
        "ended after {took:?}, deadline {deadline:?}"
    );
    ensure!(hostile.reads() >= 1);
    Ok(())
}

/// The guest kubeconfig's `server:` is chosen by the HostedCluster's owner. With the
/// controller's defaults, a server at 127.0.0.1 and one whose name (`localhost`) resolves
/// to a loopback address are refused with an error naming the address, and nothing is
/// dialled (the stand-in counts connections). On the old code both were dialled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_guest_servers_at_loopback_are_not_dialled() -> Result<()> {
    let hostile = Hostile::start(Mode::Trickle).await?;
    for server in [
        format!("https://127.0.0.1:{}", hostile.port()),
        format!("https://localhost:{}", hostile.port()),
    ] {
        let before = hostile.connections();
        let refused = match client_for(
            &hostile.kubeconfig_for(&server),
            Duration::from_secs(5),
            false,
        )
        .await
        {
            // The IP literal: refused before a client exists.
            Err(e) => e.to_string(),
            Ok(client) => {
                let api: Api<CustomResourceDefinition> = Api::all(client);
                let r = tokio::time::timeout(
                    Duration::from_secs(10),
                    api.get_opt("catalogsources.operators.coreos.com"),
                )
                .await;
                match r {
                    Ok(Err(e)) => {
                        let chain: Vec<String> = std::iter::successors(
                            Some(&e as &(dyn std::error::Error + 'static)),
                            |e| e.source(),
                        )
                        .map(ToString::to_string)
                        .collect();
                        chain.join(": ")
                    }
                    other => format!("not refused: {other:?}"),
                }
            }
        };
        let dialled = hostile.connections() - before;
        eprintln!("{server}: {refused} ({dialled} connections)");
        ensure!(
            dialled == 0,
            "{server}: dialled ({dialled} connections): {refused}"
        );
        ensure!(
            refused.contains("refused")
                && (refused.contains("127.0.0.1") || refused.contains("::1")),
            "{server}: {refused}"
        );
    }
    Ok(())
}
