//! Registry answers shared across HostedClusters (issue 12 hole 2, issue 14 item 14):
//! one tenant's `imageContentSources` mirror must not decide another tenant's OLM image,
//! concurrent misses make one lookup, and a hostile registry's answers become clear
//! reasons. The honest registry is the real CNCF registry; hostile registries are
//! STAND-INS (`hcp_olm_e2e::hostile_registry`): a real registry cannot serve content that
//! does not match its digest, nor stream a manifest without end.
//! These tests drive the controller's lookup layer (`runtime::facts`) and validation
//! directly; the API server plays no part in what is checked here.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use hcp_olm_controlplane::hostedcluster::HostedCluster;
use hcp_olm_controlplane::runtime::Config;
use hcp_olm_controlplane::runtime::facts::{self, LookupCache};
use hcp_olm_controlplane::validate::{self, ReleaseFacts};
use hcp_olm_e2e::hostile_registry::{HostileRegistry, Reply};
use hcp_olm_e2e::registry::Registry;
use hcp_olm_oci::payload::{IMAGE_REFERENCES_PATH, tar_gz};
use sha2::{Digest as _, Sha256};

const TTL: Duration = Duration::from_secs(600);

fn sha(b: &[u8]) -> String {
    format!("sha256:{:x}", Sha256::digest(b))
}

fn image_references(olm: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
        "spec": {"tags": [
            {"name": "operator-lifecycle-manager", "from": {"kind": "DockerImage", "name": olm}},
        ]},
    }))
    .unwrap()
}

/// A complete, self-consistent payload image naming `olm`: (manifest, blobs by digest).
fn payload(olm: &str) -> (Vec<u8>, BTreeMap<String, Vec<u8>>) {
    let layer = tar_gz(&[(IMAGE_REFERENCES_PATH, &image_references(olm))]);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": {"io.openshift.release": "4.18.3"}},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))
    .unwrap();
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(&layer), "size": layer.len()}],
    }))
    .unwrap();
    (
        manifest,
        BTreeMap::from([(sha(&layer), layer), (sha(&config), config)]),
    )
}

/// A stand-in serving `manifest` for every manifest request, claiming `claimed` as its
/// digest (or its own digest), and `blobs` by digest.
async fn serve_payload(
    manifest: Vec<u8>,
    blobs: BTreeMap<String, Vec<u8>>,
    claimed: Option<String>,
) -> Result<HostileRegistry> {
    let claimed = claimed.unwrap_or_else(|| sha(&manifest));
    Ok(HostileRegistry::start(move |_method, path| {
        if path.contains("/manifests/") {
            return Reply::ok(
                manifest.clone(),
                &[
                    ("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                    ("Docker-Content-Digest", &claimed),
                ],
            );
        }
        match path.rsplit('/').next().and_then(|d| blobs.get(d)) {
            Some(b) => Reply::ok(b.clone(), &[]),
            None => Reply::status(404),
        }
    })
    .await?)
}

fn hosted_cluster(name: &str, release: &str, mirror: Option<(&str, &str)>) -> HostedCluster {
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.metadata.name = Some(name.to_string());
    hc.spec.release.image = release.to_string();
    hc.spec.control_plane_release = None;
    hc.spec.image_content_sources = mirror.map(|(source, mirror)| {
        serde_json::from_value(serde_json::json!([{"source": source, "mirrors": [mirror]}]))
            .unwrap()
    });
    hc
}

fn config(plain_http: Vec<String>) -> Result<Config> {
    let oci = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
        plain_http,
        timeout: Some(Duration::from_secs(20)),
        ..Default::default()
    })?;
    Ok(Config {
        olm_image: None,
        oci: Some(Arc::new(oci)),
        ..Default::default()
    })
}

async fn facts_of(hc: &HostedCluster, config: &Config, cache: &LookupCache) -> ReleaseFacts {
    facts::release_facts_cached(hc, config, None, false, cache, TTL).await
}

/// The reasons validation gives for these facts (empty when valid): (code, message).
fn reasons(hc: &HostedCluster, f: &ReleaseFacts) -> Vec<(String, String)> {
    match validate::validate(hc, None, f, &common::defaults()) {
        Ok(_) => vec![],
        Err(r) => r
            .iter()
            .map(|r| (r.code.as_str().to_string(), r.to_string()))
            .collect(),
    }
}

/// The message of the reason `code`, if validation gives it.
fn reason(hc: &HostedCluster, f: &ReleaseFacts, code: &str) -> Option<String> {
    reasons(hc, f)
        .into_iter()
        .find(|(c, _)| c == code)
        .map(|(_, m)| m)
}

/// Tenant A points an `imageContentSources` mirror at a registry serving a fake payload
/// (for a digest reference it claims the real digest; for a tag it simply answers).
/// Tenant B, on the same release, must get the real OLM image whichever tenant is looked
/// up first; A is refused with `ReleasePayloadDigestMismatch` for the digest reference.
#[tokio::test]
async fn a_hostile_mirror_of_one_hosted_cluster_never_reaches_another() -> Result<()> {
    let reg = Registry::start()?;
    let a = reg.addr().to_string();
    let real_olm = format!("{a}/art/olm@sha256:{}", "1".repeat(64));
    let (real_manifest, real_blobs) = payload(&real_olm);
    // Push the real payload to the real registry (blobs then manifest, by tag).
    let honest = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
        plain_http: vec![a.clone()],
        ..Default::default()
    })?;
    let layer = real_blobs
        .values()
        .find(|b| b.starts_with(&[0x1f, 0x8b]))
        .cloned()
        .unwrap();
    let digest = honest
        .push_image_with_layers(
            &format!("{a}/ocp/release:4.18.3"),
            &BTreeMap::from([("io.openshift.release".to_string(), "4.18.3".to_string())]),
            &[layer],
        )
        .await?;
    drop(real_manifest);

    let fake_olm = format!("evil.example.com/olm@sha256:{}", "6".repeat(64));
    let (fake_manifest, fake_blobs) = payload(&fake_olm);
    // For a digest reference the mirror claims the real digest; for a tag it answers
    // with its own (consistent) fake.
    let lying = serve_payload(
        fake_manifest.clone(),
        fake_blobs.clone(),
        Some(digest.clone()),
    )
    .await?;
    let consistent = serve_payload(fake_manifest, fake_blobs, None).await?;
    let config = config(vec![
        a.clone(),
        lying.addr().to_string(),
        consistent.addr().to_string(),
    ])?;
    let source = format!("{a}/ocp");

    for (release, attacker_first) in [
        (format!("{a}/ocp/release:4.18.3"), true),
        (format!("{a}/ocp/release@{digest}"), true),
        (format!("{a}/ocp/release@{digest}"), false),
    ] {
        let hostile = if release.contains('@') {
            &lying
        } else {
            &consistent
        };
        let mirror = format!("{}/ocp", hostile.addr());
        let cache = LookupCache::default();
        let asked = hostile.requests();
        let tenant_a = hosted_cluster("a", &release, Some((&source, &mirror)));
        let tenant_b = hosted_cluster("b", &release, None);
        let (fa, fb) = if attacker_first {
            let fa = facts_of(&tenant_a, &config, &cache).await;
            (fa, facts_of(&tenant_b, &config, &cache).await)
        } else {
            let fb = facts_of(&tenant_b, &config, &cache).await;
            (facts_of(&tenant_a, &config, &cache).await, fb)
        };
        assert_eq!(
            fb.olm_image.as_deref(),
            Some(real_olm.as_str()),
            "{release} (attacker first: {attacker_first}): tenant B runs {:?}",
            fb.olm_image
        );
        ensure!(
            reasons(&tenant_b, &fb).is_empty(),
            "{:?}",
            reasons(&tenant_b, &fb)
        );
        ensure!(
            hostile.requests() > asked,
            "{release}: the hostile mirror was not asked"
        );
        if release.contains('@') {
            ensure!(
                fa.olm_image.is_none(),
                "{release}: tenant A got an OLM image from its hostile mirror: {:?}",
                fa.olm_image
            );
            let message = reason(&tenant_a, &fa, "ReleasePayloadDigestMismatch");
            let message = message.ok_or_else(|| {
                anyhow::anyhow!(
                    "no ReleasePayloadDigestMismatch: {:?}",
                    reasons(&tenant_a, &fa)
                )
            })?;
            ensure!(message.contains(&digest), "{message}");
        }
    }
    Ok(())
}

/// Concurrent reconciles of HostedClusters on one release, all missing the cache, make
/// one set of registry requests (single flight), not one set each.
#[tokio::test]
async fn concurrent_misses_for_one_release_make_one_lookup() -> Result<()> {
    let olm = format!("example.com/olm@sha256:{}", "1".repeat(64));
    let (manifest, blobs) = payload(&olm);
    let digest = sha(&manifest);
    let stand_in = serve_payload(manifest, blobs, None).await?;
    let h = stand_in.addr().to_string();
    let config = config(vec![h.clone()])?;
    let release = format!("{h}/ocp/release@{digest}");
    let hc = hosted_cluster("one", &release, None);

    // One lookup on its own: how many requests it takes.
    let f = facts_of(&hc, &config, &LookupCache::default()).await;
    assert_eq!(f.olm_image.as_deref(), Some(olm.as_str()), "{f:?}");
    let per_lookup = stand_in.requests();
    ensure!(per_lookup > 0);

    let cache = LookupCache::default();
    let n = 16;
    let hcs: Vec<HostedCluster> = (0..n)
        .map(|i| hosted_cluster(&format!("hc{i}"), &release, None))
        .collect();
    let all = tokio::time::timeout(
        Duration::from_secs(60),
        futures::future::join_all(hcs.iter().map(|hc| facts_of(hc, &config, &cache))),
    )
    .await?;
    for f in &all {
        assert_eq!(f.olm_image.as_deref(), Some(olm.as_str()), "{f:?}");
    }
    let made = stand_in.requests() - per_lookup;
    assert_eq!(
        made, per_lookup,
        "{n} concurrent misses made {made} requests; one lookup takes {per_lookup}"
    );
    Ok(())
}

/// A release registry (STAND-IN) streaming 1 GiB as the manifest: the HostedCluster is
/// Degraded with `RegistryResponseTooLarge`.
#[tokio::test]
async fn an_endless_release_manifest_is_a_clear_reason() -> Result<()> {
    let stand_in = HostileRegistry::start(|method, path| {
        if method == "HEAD" && path.contains("/manifests/") {
            return Reply::ok(vec![], &[]);
        }
        if path.contains("/manifests/") {
            return Reply::Endless { len: 1 << 30 };
        }
        Reply::status(404)
    })
    .await?;
    let h = stand_in.addr().to_string();
    let config = config(vec![h.clone()])?;
    let hc = hosted_cluster("big", &format!("{h}/ocp/release:4.18.3"), None);
    let f = facts_of(&hc, &config, &LookupCache::default()).await;
    let message = reason(&hc, &f, "RegistryResponseTooLarge")
        .ok_or_else(|| anyhow::anyhow!("no RegistryResponseTooLarge: {:?}", reasons(&hc, &f)))?;
    ensure!(message.contains("larger than"), "{message}");
    Ok(())
}

/// A HostedCluster whose default catalogs come from `registry` (HyperShift's
/// registry-overrides annotation), with catalog placement `placement`.
fn catalog_cluster(registry: &str, placement: &str) -> HostedCluster {
    let mut hc = common::load_hc("none-minimal.yaml");
    hc.metadata.annotations.get_or_insert_default().insert(
        "hypershift.openshift.io/olm-catalogs-is-registry-overrides".into(),
        format!("registry.redhat.io/redhat={registry}/redhat"),
    );
    hc.spec.olm_catalog_placement = Some(placement.to_string());
    hc
}

fn pull_secret(registry: &str, user: &str, password: &str) -> Result<hcp_olm_oci::PullSecret> {
    Ok(hcp_olm_oci::PullSecret::parse(
        serde_json::json!({"auths": {registry: {"username": user, "password": password}}})
            .to_string()
            .as_bytes(),
    )?)
}

/// Issue 13 item 1: a registry that requires credentials (the real registry with its
/// htpasswd backend). The controller has no pull secret of its own; each HostedCluster's
/// pull secret is used: one that can read the catalogs gets them pinned by digest, one
/// that cannot gets `CatalogImageUnauthorized` naming the registry (not "not found"),
/// and the rest of OLM is rendered for both. The answers share one cache.
#[tokio::test]
async fn catalogs_are_looked_up_with_each_clusters_pull_secret() -> Result<()> {
    use hcp_olm_controlplane::catalogs::{CatalogImageError, DefaultCatalog};
    use hcp_olm_e2e::registry::{TEST_USER_HASH, TEST_USER_PASSWORD};
    let reg = Registry::start_with_htpasswd(&[("reader", TEST_USER_HASH)])?;
    let a = reg.addr().to_string();
    let good = pull_secret(&a, "reader", TEST_USER_PASSWORD)?;
    let bad = pull_secret(&a, "reader", "not-the-password")?;
    let pusher = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
        plain_http: vec![a.clone()],
        pull_secret: good.clone(),
        ..Default::default()
    })?;
    let mut pushed = BTreeMap::new();
    for c in [
        DefaultCatalog::RedhatOperators,
        DefaultCatalog::CertifiedOperators,
        DefaultCatalog::CommunityOperators,
    ] {
        let repo = c.repository().replace("registry.redhat.io", &a);
        let d = pusher
            .push_image(&format!("{repo}:v4.18"), &BTreeMap::new())
            .await?;
        pushed.insert(c, format!("{repo}@{d}"));
    }
    let config = config(vec![a.clone()])?;
    let cache = LookupCache::default();
    let hc = catalog_cluster(&a, "management");
    let valid = validate::validate(&hc, None, &common::facts(), &common::defaults())
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    ensure!(!valid.enabled_catalogs.is_empty());

    for (who, ps) in [
        ("reader", &good),
        ("stranger", &bad),
        ("reader again", &good),
    ] {
        let images =
            facts::catalog_images_cached(&hc, &valid, &config, Some(ps), &cache, TTL).await;
        ensure!(
            images.len() == valid.enabled_catalogs.len(),
            "{who}: {images:?}"
        );
        for (c, img) in &images {
            if std::ptr::eq(ps, &good) {
                let img = img
                    .as_ref()
                    .map_err(|e| anyhow::anyhow!("{who}: {c}: {e}"))?;
                assert_eq!(img.pinned_ref.as_ref(), pushed.get(c), "{who}: {c}");
            } else {
                match img {
                    Err(e @ CatalogImageError::Unauthorized { registry, .. }) => {
                        assert_eq!(registry, &a, "{e}")
                    }
                    other => anyhow::bail!("{who}: {c}: expected Unauthorized, got {other:?}"),
                }
            }
        }
        // The rest of OLM is rendered either way; a refused catalog is a clear reason.
        let mut input = common::input(valid.clone(), true);
        input.catalog_images = images;
        let desired = hcp_olm_controlplane::render::desired(&input)?;
        for d in [
            "hcp-olm-olm-operator",
            "hcp-olm-catalog-operator",
            "hcp-olm-packageserver",
        ] {
            ensure!(
                desired
                    .hcp
                    .iter()
                    .any(|o| o.kind == "Deployment" && o.name == d),
                "{who}: {d} not rendered"
            );
        }
        let refused: Vec<_> = desired
            .pending
            .iter()
            .filter(|p| p.reason == "CatalogImageUnauthorized")
            .collect();
        if std::ptr::eq(ps, &bad) {
            ensure!(
                refused.len() == valid.enabled_catalogs.len(),
                "{:?}",
                desired.pending
            );
            ensure!(
                refused.iter().all(|p| p.message.contains(&a)),
                "{refused:?}"
            );
        } else {
            ensure!(refused.is_empty(), "{who}: {refused:?}");
        }
    }
    Ok(())
}

/// Issue 13 item 2: with catalogs in the guest, HyperShift looks nothing up (tags with
/// registryPoll). A registry (STAND-IN, counting requests) must not be asked, and each
/// catalog runs its tag.
#[tokio::test]
async fn guest_placement_makes_no_registry_lookups() -> Result<()> {
    let stand_in = HostileRegistry::start(|_, _| Reply::status(500)).await?;
    let h = stand_in.addr().to_string();
    let config = config(vec![h.clone()])?;
    let hc = catalog_cluster(&h, "guest");
    let valid = validate::validate(&hc, None, &common::facts(), &common::defaults())
        .map_err(|e| anyhow::anyhow!("{e:?}"))?;
    ensure!(!valid.enabled_catalogs.is_empty());
    let images =
        facts::catalog_images_cached(&hc, &valid, &config, None, &LookupCache::default(), TTL)
            .await;
    assert_eq!(stand_in.requests(), 0, "the registry was asked");
    for (c, img) in images {
        let img = img.map_err(|e| anyhow::anyhow!("{c}: {e}"))?;
        assert_eq!(img.pinned_ref, None, "{c}");
        ensure!(
            img.tag_ref.starts_with(&h) && img.tag_ref.ends_with(":v4.18"),
            "{c}: {}",
            img.tag_ref
        );
    }
    Ok(())
}
