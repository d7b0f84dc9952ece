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

/// Bearer tokens are cached per registry, repository and credentials until they expire: five
/// lookups of one repository make one token request (each lookup used to fetch its own: a
/// 401, a token request and a retry every time), and a lookup of another repository asks for
/// a token of its own scope. STAND-IN registry with a token realm (the CNCF registry's token
/// auth needs a separate token server).
#[tokio::test]
async fn bearer_tokens_are_cached_per_scope() -> anyhow::Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tokens = Arc::new(AtomicUsize::new(0));
    let t = tokens.clone();
    let addr = Arc::new(std::sync::OnceLock::<String>::new());
    let a = addr.clone();
    let manifest = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000000","size":2},"layers":[]}"#.to_vec();
    let digest = format!(
        "sha256:{:x}",
        <sha2::Sha256 as sha2::Digest>::digest(&manifest)
    );
    let d = digest.clone();
    let hostile = HostileRegistry::start_with_auth(move |_method, path, auth| {
        if let Some(q) = path.strip_prefix("/token?") {
            let n = t.fetch_add(1, Ordering::SeqCst);
            let scope = q
                .split('&')
                .find_map(|kv| kv.strip_prefix("scope="))
                .unwrap_or("none")
                .to_string();
            return Reply::ok(
                format!(r#"{{"token":"t{n}-{scope}","expires_in":300}}"#).into_bytes(),
                &[("Content-Type", "application/json")],
            );
        }
        let repo = path
            .strip_prefix("/v2/")
            .and_then(|p| p.split("/manifests/").next())
            .unwrap_or("");
        let scope = format!("repository%3A{}%3Apull", repo.replace('/', "%2F"));
        if auth.is_some_and(|h| h.starts_with("Bearer t") && h.ends_with(&scope)) {
            return Reply::ok(
                manifest.clone(),
                &[
                    ("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                    ("Docker-Content-Digest", d.as_str()),
                ],
            );
        }
        let challenge = format!(
            r#"Bearer realm="http://{}/token",service="stand-in",scope="repository:{repo}:pull""#,
            a.get().map(String::as_str).unwrap_or("")
        );
        Reply::Full {
            status: 401,
            headers: vec![("WWW-Authenticate".into(), challenge)],
            body: vec![],
        }
    })
    .await?;
    addr.set(hostile.addr().to_string()).ok();
    let client = Client::new(ClientOptions {
        plain_http: vec![hostile.addr().to_string()],
        pull_secret: hcp_olm_oci::PullSecret::parse(
            format!(
                r#"{{"auths":{{"{}":{{"username":"u","password":"p"}}}}}}"#,
                hostile.addr()
            )
            .as_bytes(),
        )?,
        ..Default::default()
    })?;
    for _ in 0..5 {
        match client
            .resolve(&format!("{}/org/cat:v1", hostile.addr()))
            .await?
        {
            hcp_olm_oci::Lookup::Found { digest: got, .. } => anyhow::ensure!(got == digest),
            other => anyhow::bail!("{other:?}"),
        }
    }
    anyhow::ensure!(
        tokens.load(Ordering::SeqCst) == 1,
        "five lookups of one repository asked for {} tokens",
        tokens.load(Ordering::SeqCst)
    );
    let before = hostile.requests();
    client
        .resolve(&format!("{}/org/cat:v1", hostile.addr()))
        .await?;
    anyhow::ensure!(
        hostile.requests() - before == 1,
        "a lookup with a cached token took {} requests",
        hostile.requests() - before
    );
    client
        .resolve(&format!("{}/org/other:v1", hostile.addr()))
        .await?;
    anyhow::ensure!(
        tokens.load(Ordering::SeqCst) == 2,
        "another repository, another scope"
    );
    // Other credentials never use these tokens.
    let other = client.with_pull_secret(hcp_olm_oci::PullSecret::default());
    other
        .resolve(&format!("{}/org/cat:v1", hostile.addr()))
        .await?;
    anyhow::ensure!(
        tokens.load(Ordering::SeqCst) == 3,
        "a token was shared across credentials"
    );
    Ok(())
}

/// Issue 35 item 5: a tenant's mirror (STAND-IN) lists one valid layer (a tar without
/// `image-references`) 4,000 times in its release manifest and serves every blob slowly but
/// within the request deadline (in pieces, 0.9 s each). Reading the payload must end within
/// bounded work: at most `MAX_LAYERS_SEARCHED` layers and a clear reason naming the bound.
/// The old client read layer after layer (4,000 × 0.9 s, an hour).
#[tokio::test]
async fn a_payload_of_thousands_of_slow_layers_is_read_in_bounded_time() -> Result<()> {
    const LAYERS: usize = 4000;
    let layer = tar_gz(&[("usr/bin/true", b"\x7fELF")]);
    let layer_digest = sha(&layer);
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Labels": {"io.openshift.release": "4.18.3"}},
        "rootfs": {"type": "layers", "diff_ids": []},
    }))?;
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": sha(&config), "size": config.len()},
        "layers": (0..LAYERS).map(|_| serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": layer_digest, "size": layer.len(),
        })).collect::<Vec<_>>(),
    }))?;
    let digest = sha(&manifest);
    let hostile = HostileRegistry::start(move |_method, path| {
        if path.contains("/manifests/") {
            return Reply::ok(
                manifest.clone(),
                &[
                    ("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                    ("Docker-Content-Digest", &digest),
                ],
            );
        }
        Reply::Paced {
            body: layer.clone(),
            headers: vec![],
            chunk: layer.len().div_ceil(3),
            every: Duration::from_millis(300),
        }
    })
    .await?;
    let h = hostile.addr().to_string();
    let c = Client::new(ClientOptions {
        plain_http: vec![h.clone()],
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    })?;
    let t0 = std::time::Instant::now();
    // The test's own bound: the old client was still reading layers when it passed.
    let got = tokio::time::timeout(
        Duration::from_secs(30),
        c.release_image_references(&format!("{h}/ocp/release:4.18.3")),
    )
    .await;
    let took = t0.elapsed();
    eprintln!(
        "payload lookup ended after {took:?} and {} requests: {got:?}",
        hostile.requests()
    );
    let got = got.map_err(|_| {
        anyhow::anyhow!(
            "still reading the payload after 30 s ({} requests to the mirror)",
            hostile.requests()
        )
    })?;
    let msg = match got {
        Ok(m) => anyhow::bail!("a payload without image-references answered {m:?}"),
        Err(e) => e.to_string(),
    };
    ensure!(
        msg.contains("of 4000 layers") && msg.contains("layers and"),
        "not the layer bound: {msg}"
    );
    // HEAD + GET of the manifest, then one GET per layer searched (at most 8:
    // `payload::MAX_LAYERS_SEARCHED`).
    ensure!(
        hostile.requests() <= 2 + 8,
        "{} requests",
        hostile.requests()
    );
    Ok(())
}
