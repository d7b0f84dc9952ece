//! Who may use a shared catalog (issue 35, item 6), against real registries with htpasswd
//! auth, on real API servers (management + guest), the controller as its ServiceAccount
//! with exactly the RBAC and admission policies of manifests/controller:
//! (a) an administrator's mirror answering anonymously admits nobody the default registry
//! refuses; (b) credentials revoked at the registry stop admitting within the entitlement
//! lifetime; (c) a tenant whose passes stop early (a dead guest API server) is re-checked.

#[path = "common/tenancy.rs"]
mod tenancy;

use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use hcp_olm_controlplane::hostedolm::HostedOLM;
use hcp_olm_controlplane::runtime::reconcile::State;
use hcp_olm_controlplane::runtime::{Context, shared};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use tenancy::*;

/// One environment at a time under `cargo test` (see runtime.rs).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long a recorded shared-catalog use counts in the item 6 tests (the controller's is
/// [`shared::USE_LIFETIME`], 15 minutes).
const TEST_LIFETIME: Duration = Duration::from_secs(30);

struct Locked {
    w: World,
    ctx: Context,
}

/// A [`World`] with HostedClusters `clusters/<name>` whose pull secrets read the catalogs
/// as `user`, and the controller with the entitlement lifetime shortened to
/// [`TEST_LIFETIME`] (its catalog refresh stays the default 15 minutes).
async fn locked_world(clusters: &[(&str, &str)]) -> Result<Locked> {
    let w = World::start().await?;
    for (name, user) in clusters {
        w.cluster("clusters", name, Some(user), true).await?;
    }
    let mut ctx = w.controller().await?.with_events(None);
    ctx.shared_digests = shared::SharedDigests::with_lifetime(TEST_LIFETIME);
    Ok(Locked { w, ctx })
}

/// Reconciles `names` (twice each) and runs a shared pass; returns who the shared
/// redhat-operators catalog admits.
async fn converge(w: &Locked, names: &[&str], what: &str) -> Result<Option<Vec<String>>> {
    for name in names {
        reconcile(&w.ctx, w.w.m(), "clusters", name).await?;
        reconcile(&w.ctx, w.w.m(), "clusters", name).await?;
    }
    pass(&w.ctx, what).await?;
    let a = admitted(w.w.m(), RH).await?;
    eprintln!("{what}: {RH} admits {a:?}");
    Ok(a)
}

fn ns_list(names: &[&str]) -> Option<Vec<String>> {
    Some(names.iter().map(|n| format!("clusters-{n}")).collect())
}

/// Issue 35, item 6 (c): a tenant whose admin kubeconfig points at a dead server (here a
/// closed loopback port) stops its passes at `GuestUnreachable`, before the catalog
/// lookups. Its shared-catalog use must still be re-checked: it lapses within the
/// entitlement lifetime (the test's 30 s; the controller's 15 minutes) while the other user
/// stays admitted, and comes back once the tenant's passes complete again.
#[tokio::test]
async fn security_a_dead_guest_does_not_keep_its_shared_catalog_use() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let w = locked_world(&[("da", "reader"), ("db", "reader")]).await?;
    let m = w.w.m();
    pass(&w.ctx, "before anything").await?;
    let a = converge(&w, &["da", "db"], "both healthy").await?;
    ensure!(a == ns_list(&["da", "db"]), "{a:?}");

    // da's owner points its kubeconfig at a dead server.
    let mut kc: serde_json::Value =
        serde_yaml_ng::from_str(&std::fs::read_to_string(w.w.env.guest.kubeconfig())?)?;
    for c in kc["clusters"].as_array_mut().into_iter().flatten() {
        c["cluster"]["server"] = "https://127.0.0.1:1".into();
    }
    let healthy = std::fs::read(w.w.env.guest.kubeconfig())?;
    put_secret(
        m,
        "clusters",
        "kc-da",
        "kubeconfig",
        serde_yaml_ng::to_string(&kc)?.into_bytes(),
    )
    .await?;
    Api::<DynamicObject>::namespaced_with(m.client(), "clusters", &hc_resource())
        .patch_status(
            "da",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"kubeconfig": {"name": "kc-da"}}})),
        )
        .await?;
    let o = reconcile(&w.ctx, m, "clusters", "da").await?;
    ensure!(
        o.state == State::Waiting("GuestUnreachable".into()),
        "da with a dead guest: {o:?}"
    );
    // Past the lifetime, with da's passes still stopping early and db converging.
    wait(TEST_LIFETIME + Duration::from_secs(1)).await;
    let o = reconcile(&w.ctx, m, "clusters", "da").await?;
    ensure!(
        o.state == State::Waiting("GuestUnreachable".into()),
        "{o:?}"
    );
    let a = converge(&w, &["db"], "da's guest dead past the lifetime").await?;
    ensure!(
        a == ns_list(&["db"]),
        "a tenant whose passes stop at GuestUnreachable kept its shared catalog use past the entitlement lifetime: {RH} admits {a:?}"
    );

    // Mended: back after its next complete pass.
    put_secret(m, "clusters", "kc-da", "kubeconfig", healthy).await?;
    let a = converge(&w, &["da", "db"], "da mended").await?;
    ensure!(a == ns_list(&["da", "db"]), "after da was mended: {a:?}");
    Ok(())
}

/// Issue 35, item 6 (b): credentials revoked at the registry (user `reader2` removed from
/// its htpasswd; the tenant's pull secret unchanged, so the lookup cache key is the same)
/// must stop admitting the tenant within the entitlement lifetime (30 s here, 15 minutes in
/// the controller), though the catalog refresh is the default 15 minutes: a cached "exists"
/// made with the revoked credentials may not outlive it.
#[tokio::test]
async fn security_revoked_registry_credentials_end_shared_catalog_use() -> Result<()> {
    let _serial = SERIAL.lock().await;
    let w = locked_world(&[("ra", "reader2"), ("rb", "reader")]).await?;
    pass(&w.ctx, "before anything").await?;
    let a = converge(&w, &["ra", "rb"], "both entitled").await?;
    ensure!(a == ns_list(&["ra", "rb"]), "{a:?}");

    // Revoked at the registry.
    w.w.locked
        .set_htpasswd_users(&[("reader", hcp_olm_e2e::registry::TEST_USER_HASH)])?;
    wait(TEST_LIFETIME + Duration::from_secs(1)).await;
    let a = converge(&w, &["ra", "rb"], "ra's credentials revoked").await?;
    ensure!(
        a == ns_list(&["rb"]),
        "a cached answer outlived credentials revoked at the registry by more than the entitlement lifetime: {RH} admits {a:?}"
    );
    let h = Api::<HostedOLM>::namespaced(w.w.m().client(), "clusters-ra")
        .get("ra")
        .await?;
    let c = h
        .status
        .context("status")?
        .catalogs
        .into_iter()
        .find(|c| c.name == "redhat-operators")
        .context("redhat-operators status")?;
    ensure!(
        c.sharing.as_deref() != Some("shared"),
        "ra still shares after revocation: {c:?}"
    );
    Ok(())
}

/// Issue 35, item 6 (a): the administrator's `--registry-mirror` of registry.redhat.io
/// answers anonymously (the real registry without auth), while the default registry itself
/// (a real registry with htpasswd auth standing in for registry.redhat.io, reached on
/// loopback through `Client::with_endpoint`) grants `ma`'s pull secret and refuses `mb`'s
/// (wrong password). `mb` must not be admitted to the shared catalog: it gets its own copy
/// (`own`, `EntitlementNotProven`); `ma` shares.
#[tokio::test]
async fn security_an_anonymous_mirror_admits_nobody_the_default_registry_refuses() -> Result<()> {
    let _serial = SERIAL.lock().await;
    use hcp_olm_controlplane::hostedcluster::HCP_PULL_SECRET;
    let w = World::start().await?;
    let m = w.m();
    let (o, l) = (w.open.addr().to_string(), w.locked.addr().to_string());
    // The administrator's mirror: the same catalogs, readable by anyone.
    let pusher = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
        plain_http: vec![o.clone()],
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    })?;
    for idx in [
        "redhat-operator-index",
        "certified-operator-index",
        "community-operator-index",
    ] {
        pusher
            .push_image(
                &format!("{o}/redhat/{idx}:v4.18"),
                &std::collections::BTreeMap::new(),
            )
            .await?;
    }
    let oci = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
        plain_http: vec![o.clone(), l.clone()],
        mirrors: vec![hcp_olm_oci::Mirror {
            source: "registry.redhat.io/redhat".into(),
            mirrors: vec![format!("{o}/redhat")],
        }],
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    })?
    .with_endpoint("registry.redhat.io", &format!("http://{l}"));
    for (name, password) in [("ma", None), ("mb", Some("not-the-password"))] {
        w.cluster("clusters", name, None, true).await?;
        put_secret(
            m,
            &format!("clusters-{name}"),
            HCP_PULL_SECRET,
            ".dockerconfigjson",
            docker_config("registry.redhat.io", "reader", password)?,
        )
        .await?;
    }
    let ctx =
        controller_ctx(controller_client(m).await?, std::sync::Arc::new(oci)).with_events(None);
    pass(&ctx, "before anything").await?;
    for name in ["ma", "mb"] {
        reconcile(&ctx, m, "clusters", name).await?;
        reconcile(&ctx, m, "clusters", name).await?;
    }
    pass(&ctx, "both reconciled").await?;
    let a = admitted(m, RH).await?;
    ensure!(
        a == ns_list(&["ma"]),
        "an anonymous mirror answer admitted a cluster whose pull secret the default registry refuses: {RH} admits {a:?}"
    );
    let status = |ns: &'static str, name: &'static str| async move {
        let h = Api::<HostedOLM>::namespaced(m.client(), ns)
            .get(name)
            .await?;
        h.status
            .context("status")?
            .catalogs
            .into_iter()
            .find(|c| c.name == "redhat-operators")
            .context("redhat-operators status")
    };
    let b = status("clusters-mb", "mb").await?;
    ensure!(
        b.sharing.as_deref() == Some("own") && b.reason == "EntitlementNotProven",
        "mb: {b:?}"
    );
    let a = status("clusters-ma", "ma").await?;
    ensure!(
        a.sharing.as_deref() == Some("shared") && a.reason == "SharedCatalog",
        "ma: {a:?}"
    );
    Ok(())
}
