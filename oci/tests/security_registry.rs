//! Attacks on the registry client: a hostile mirror serving a fake release payload under
//! the digest of the real one, and a hostile registry streaming a manifest without end.
//! The hostile parts are STAND-INS ([`HostileRegistry`]): a real registry cannot serve
//! content that does not match its digest. The honest source is the real CNCF registry.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::{Result, ensure};
use hcp_olm_e2e::hostile_registry::{HostileRegistry, Reply};
use hcp_olm_e2e::registry::Registry;
use hcp_olm_oci::payload::{IMAGE_REFERENCES_PATH, tar_gz};
use hcp_olm_oci::{Client, ClientOptions, Mirror};
use sha2::{Digest as _, Sha256};

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

/// Issue 12 hole 2: the owner of one HostedCluster points an `imageContentSources` mirror
/// at a registry that answers every manifest request with a fake payload (and claims the
/// digest asked for). Fetching the release by digest through that mirror must fail with a
/// digest mismatch, never return the fake OLM image.
#[tokio::test]
async fn hostile_mirror_cannot_substitute_a_release_payload_fetched_by_digest() -> Result<()> {
    let reg = Registry::start()?;
    let a = reg.addr().to_string();
    let honest = Client::new(ClientOptions {
        plain_http: vec![a.clone()],
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    })?;
    let labels = BTreeMap::from([("io.openshift.release".to_string(), "4.18.3".to_string())]);
    let real_olm = format!("{a}/art/olm@sha256:{}", "1".repeat(64));
    let digest = honest
        .push_image_with_layers(
            &format!("{a}/ocp/release:4.18.3"),
            &labels,
            &[tar_gz(&[(
                IMAGE_REFERENCES_PATH,
                &image_references(&real_olm),
            )])],
        )
        .await?;
    let release = format!("{a}/ocp/release@{digest}");

    // The fake payload: a complete, self-consistent image naming the attacker's OLM image.
    let fake_olm = "evil.example.com/olm@sha256:".to_string() + &"6".repeat(64);
    let layer = tar_gz(&[(IMAGE_REFERENCES_PATH, &image_references(&fake_olm))]);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {"Labels": labels},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": sha(&config), "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": sha(&layer), "size": layer.len()}],
    }))?;
    let blobs = BTreeMap::from([(sha(&layer), layer), (sha(&config), config)]);
    let claimed = digest.clone();
    let hostile = HostileRegistry::start(move |_method, path| {
        if path.contains("/manifests/") {
            // Claims to be whatever was asked for.
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
    .await?;

    let tenant = Client::new(ClientOptions {
        plain_http: vec![a.clone(), hostile.addr().to_string()],
        mirrors: vec![Mirror {
            source: format!("{a}/ocp"),
            mirrors: vec![format!("{}/ocp", hostile.addr())],
        }],
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    })?;
    let got = tenant.release_image_references(&release).await;
    ensure!(hostile.requests() > 0, "the hostile mirror was not asked");
    match got {
        Ok(refs) => anyhow::bail!("the fake payload was accepted: {refs:?}"),
        Err(e) => {
            let msg = e.to_string();
            ensure!(
                msg.contains("does not match") && msg.contains(&digest),
                "error does not name the digest mismatch: {msg}"
            );
            ensure!(!msg.contains("evil.example.com"), "{msg}");
        }
    }
    // Without the mirror the real payload is read.
    let refs = honest.release_image_references(&release).await?;
    assert_eq!(
        refs.get("operator-lifecycle-manager"),
        Some(&real_olm),
        "{refs:?}"
    );
    Ok(())
}

/// The peak resident set size of this process so far (`VmHWM`).
fn peak_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .ok_or_else(|| anyhow::anyhow!("no VmHWM in /proc/self/status"))?;
    Ok(kb * 1024)
}

/// Issue 12 hole 6(b): a hostile registry (STAND-IN) streams 1 GiB as a manifest. The
/// client stops reading at its manifest bound: the error says the response is too large,
/// and this process's peak resident memory grows by far less than the stream.
#[tokio::test]
async fn a_manifest_streamed_without_end_is_refused_with_bounded_memory() -> Result<()> {
    const STREAM: u64 = 1 << 30;
    let hostile = HostileRegistry::start(|method, path| {
        if method == "HEAD" && path.contains("/manifests/") {
            // No digest header: the client has to GET the manifest.
            return Reply::ok(
                vec![],
                &[("Content-Type", "application/vnd.oci.image.manifest.v1+json")],
            );
        }
        if path.contains("/manifests/") {
            return Reply::Endless { len: STREAM };
        }
        Reply::status(404)
    })
    .await?;
    let h = hostile.addr().to_string();
    let c = Client::new(ClientOptions {
        plain_http: vec![h.clone()],
        // Long enough for the whole stream to arrive on loopback: the bound must come
        // from the size limit, not from the timeout.
        timeout: Some(Duration::from_secs(120)),
        ..Default::default()
    })?;
    let before = peak_rss_bytes()?;
    let t0 = std::time::Instant::now();
    let got = c.labels(&format!("{h}/ocp/release:4.18.3")).await;
    let grew = peak_rss_bytes()?.saturating_sub(before);
    eprintln!(
        "answer after {:?}, peak RSS grew by {} MiB: {got:?}",
        t0.elapsed(),
        grew >> 20
    );
    match got {
        Ok(l) => anyhow::bail!("a 1 GiB manifest was accepted: {l:?}"),
        Err(e) => {
            let msg = e.to_string();
            ensure!(msg.contains("larger than"), "not a size error: {msg}");
        }
    }
    ensure!(
        grew < 64 << 20,
        "peak resident memory grew by {} MiB reading one manifest",
        grew >> 20
    );
    Ok(())
}
