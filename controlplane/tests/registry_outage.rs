//! Issue 38 item 3: a registry outage never removes a catalog.
//!
//! Real API servers (management + guest), a real registry with htpasswd auth holding the
//! default catalogs (the administrator's mirror of registry.redhat.io), the controller as
//! its ServiceAccount with the manifests' RBAC and admission policies. One hosted cluster
//! converges onto the shared catalogs; then the catalogs' registry fails and the controller
//! restarts (a fresh context: no cached answer), with the catalog refresh interval cut to
//! one second so every pass asks again:
//! 1. the registry is gone (connection refused);
//! 2. it accepts connections and never answers (every lookup times out);
//! 3. it answers every request `503 Service Unavailable` (a STAND-IN: a real registry does
//!    not fail on demand; a TCP listener writing one fixed HTTP answer).
//!
//! In each, no catalog Deployment, Service or NetworkPolicy (shared or in the HCP
//! namespace) and no guest CatalogSource changes (resourceVersion and generation equal),
//! `Available` stays as it was, and once a lookup has failed the HostedOLM status says
//! `Degraded` and names the registry. The old code pruned the catalogs and their guest
//! CatalogSources in the first pass after the restart.

#[path = "common/tenancy.rs"]
mod tenancy;

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use hcp_olm_controlplane::hostedolm::HostedOLM;
use hcp_olm_controlplane::runtime::Context;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use tenancy::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NAME: &str = "a";
const HCP_NS: &str = "clusters-a";

/// `kind/namespace/name` → (resourceVersion, generation) of every object whose change
/// would mean a catalog moved: ours in the shared catalogs' namespace and the HCP
/// namespace, and the guest's CatalogSources.
async fn snapshot(w: &World) -> Result<BTreeMap<String, (String, i64)>> {
    let mut out = BTreeMap::new();
    let kinds = [
        ("apps/v1", "Deployment", "deployments"),
        ("v1", "Service", "services"),
        ("networking.k8s.io/v1", "NetworkPolicy", "networkpolicies"),
    ];
    let ours = ListParams::default().labels("app.kubernetes.io/managed-by=hcp-olm");
    let mut record = |c: &str, o: &DynamicObject| {
        out.insert(
            format!(
                "{c}:{}/{}/{}",
                o.types.as_ref().map(|t| t.kind.as_str()).unwrap_or(""),
                o.metadata.namespace.as_deref().unwrap_or(""),
                o.metadata.name.as_deref().unwrap_or("")
            ),
            (
                o.metadata.resource_version.clone().unwrap_or_default(),
                o.metadata.generation.unwrap_or(0),
            ),
        );
    };
    for ns in [hcp_olm_controlplane::sharing::SHARED_NAMESPACE, HCP_NS] {
        for (gv, kind, plural) in kinds {
            let (group, version) = gv.split_once('/').unwrap_or(("", gv));
            let ar = ApiResource {
                group: group.into(),
                version: version.into(),
                api_version: gv.into(),
                kind: kind.into(),
                plural: plural.into(),
            };
            for o in Api::<DynamicObject>::namespaced_with(w.m().client(), ns, &ar)
                .list(&ours)
                .await?
            {
                let mut o = o;
                o.types.get_or_insert_with(Default::default).kind = kind.into();
                record("management", &o);
            }
        }
    }
    let cs = ApiResource {
        group: "operators.coreos.com".into(),
        version: "v1alpha1".into(),
        api_version: "operators.coreos.com/v1alpha1".into(),
        kind: "CatalogSource".into(),
        plural: "catalogsources".into(),
    };
    for o in
        Api::<DynamicObject>::namespaced_with(w.env.guest.client(), "openshift-marketplace", &cs)
            .list(&ListParams::default())
            .await?
    {
        let mut o = o;
        o.types.get_or_insert_with(Default::default).kind = "CatalogSource".into();
        record("guest", &o);
    }
    Ok(out)
}

async fn holm(w: &World) -> Result<HostedOLM> {
    Ok(Api::<HostedOLM>::namespaced(w.m().client(), HCP_NS)
        .get(NAME)
        .await?)
}

/// The redhat-operators entry of the HostedOLM's catalog status.
fn redhat_operators(h: &HostedOLM) -> Result<hcp_olm_controlplane::hostedolm::CatalogStatus> {
    h.status
        .as_ref()
        .and_then(|s| s.catalogs.iter().find(|c| c.name == "redhat-operators"))
        .cloned()
        .context("redhat-operators in status")
}

fn condition(h: &HostedOLM, t: &str) -> Option<(String, String, String)> {
    h.status.as_ref()?.conditions.iter().find_map(|c| {
        (c.type_ == t).then(|| (c.status.clone(), c.reason.clone(), c.message.clone()))
    })
}

/// The controller after a restart: nothing cached, every answer older than a second
/// asked again.
fn restarted(w: &World, client: &kube::Client) -> Result<Context> {
    let mut ctx =
        controller_ctx(client.clone(), std::sync::Arc::new(w.oci.clone())).with_events(None);
    ctx.schedule.catalog_refresh = Duration::from_secs(1);
    Ok(ctx)
}

/// A STAND-IN for a failing registry on `addr`: every connection gets `answer` (None:
/// accepted and never answered) until the task is aborted.
async fn failing_registry(
    addr: &str,
    answer: Option<&'static str>,
) -> Result<tokio::task::JoinHandle<()>> {
    // the registry process was just killed: its port may take a moment to be free
    let mut tries = 0;
    let listener = loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => break l,
            Err(e) if tries < 50 => {
                tries += 1;
                eprintln!("binding {addr}: {e}; again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e).context(format!("binding {addr}")),
        }
    };
    Ok(tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((mut s, _)) = listener.accept().await {
            match answer {
                Some(a) => {
                    tokio::spawn(async move {
                        let mut buf = [0u8; 4096];
                        let _ = s.read(&mut buf).await;
                        let _ = s.write_all(a.as_bytes()).await;
                        let _ = s.shutdown().await;
                    });
                }
                // bounded: the test's passes open a few dozen connections at most
                None if held.len() < 1000 => held.push(s),
                None => {}
            }
        }
    }))
}

/// Runs passes under `ctx` until one has failed lookups behind it (bounded), checking after
/// every pass that nothing moved; returns the Degraded condition then, which must name
/// `registry`.
async fn outage(
    w: &World,
    ctx: &Context,
    what: &str,
    before: &BTreeMap<String, (String, i64)>,
    available: &Option<(String, String, String)>,
    registry: &str,
) -> Result<(String, String, String)> {
    let t0 = std::time::Instant::now();
    loop {
        reconcile(ctx, w.m(), "clusters", NAME).await?;
        pass(ctx, what).await?;
        let now = snapshot(w).await?;
        let moved: Vec<_> = before
            .iter()
            .filter(|(k, v)| now.get(*k) != Some(v))
            .map(|(k, v)| format!("{k}: {v:?} -> {:?}", now.get(k)))
            .chain(
                now.keys()
                    .filter(|k| !before.contains_key(*k))
                    .map(|k| format!("{k}: new")),
            )
            .collect();
        ensure!(
            moved.is_empty(),
            "{what}: catalogs changed while the registry failed: {moved:#?}"
        );
        let h = holm(w).await?;
        ensure!(
            &condition(&h, "Available") == available,
            "{what}: Available moved: {:?} -> {:?}",
            available,
            condition(&h, "Available")
        );
        let degraded = condition(&h, "Degraded");
        let rh = redhat_operators(&h)?;
        if let Some(d) = degraded.filter(|d| d.0 == "True") {
            ensure!(
                d.2.contains(registry) && rh.message.contains(registry),
                "{what}: Degraded does not name the registry {registry}: {d:?}; catalog {rh:?}"
            );
            ensure!(
                rh.sharing.as_deref() == Some("shared"),
                "{what}: the catalog left its shared Deployment: {rh:?}"
            );
            eprintln!(
                "{what}: after {:.1} s nothing moved; Degraded {} : {}",
                t0.elapsed().as_secs_f64(),
                d.1,
                d.2
            );
            return Ok(d);
        }
        ensure!(
            t0.elapsed() < Duration::from_secs(90),
            "{what}: no Degraded naming the registry within 90 s: {:?}",
            condition(&h, "Degraded")
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

#[tokio::test]
async fn a_registry_outage_and_a_restart_never_remove_a_catalog() -> Result<()> {
    let w = World::start().await?;
    w.cluster("clusters", NAME, Some("reader"), true).await?;
    let client = controller_client(w.m()).await?;
    let ctx = controller_ctx(client.clone(), std::sync::Arc::new(w.oci.clone())).with_events(None);
    for _ in 0..3 {
        reconcile(&ctx, w.m(), "clusters", NAME).await?;
        pass(&ctx, "converging").await?;
    }
    let h = holm(&w).await?;
    let rh = redhat_operators(&h)?;
    ensure!(
        rh.sharing.as_deref() == Some("shared")
            && rh.image.as_deref().is_some_and(|i| i.contains("@sha256:")),
        "not converged onto the shared catalog: {rh:?}"
    );
    let before = snapshot(&w).await?;
    let catalogs = before.keys().filter(|k| k.contains("operators")).count();
    ensure!(
        before.contains_key(&format!("management:Deployment/hcp-olm-catalogs/{RH}"))
            && before.keys().any(|k| k.starts_with("guest:CatalogSource/")),
        "no shared catalog Deployment or guest CatalogSource: {before:#?}"
    );
    let available = condition(&h, "Available");
    eprintln!(
        "converged: {} objects watched ({catalogs} of catalogs); Available {available:?}",
        before.len()
    );
    drop(ctx);

    // 1. The registry is gone (its process killed); the controller restarts.
    let addr = w.locked.addr().to_string();
    let pid = w.locked.pid();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()?;
    ensure!(killed.success(), "kill {pid}: {killed}");
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(&addr).is_ok() {
        ensure!(
            t0.elapsed() < Duration::from_secs(10),
            "{addr} still answers"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("registry {addr} (pid {pid}) killed");
    let ctx = restarted(&w, &client)?;
    outage(&w, &ctx, "connection refused", &before, &available, &addr).await?;
    drop(ctx);

    // 2. It accepts connections and never answers.
    let blackhole = failing_registry(&addr, None).await?;
    let ctx = restarted(&w, &client)?;
    outage(&w, &ctx, "no answer", &before, &available, &addr).await?;
    drop(ctx);
    blackhole.abort();
    let _ = blackhole.await;

    // 3. It answers 503.
    let unavailable = failing_registry(
        &addr,
        Some("HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"),
    )
    .await?;
    let ctx = restarted(&w, &client)?;
    outage(&w, &ctx, "503", &before, &available, &addr).await?;
    unavailable.abort();
    Ok(())
}
