//! Registry lookups against a real OCI registry (CNCF distribution) on loopback.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use hcp_olm_e2e::registry::Registry;
use hcp_olm_oci::{Client, ClientOptions, Lookup, Mirror, OciError};

fn client(reg: &Registry, mirrors: Vec<Mirror>) -> Result<Client> {
    Ok(Client::new(ClientOptions {
        plain_http: vec![reg.addr().to_string()],
        mirrors,
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    })?)
}

#[tokio::test]
async fn release_version_label_and_its_absence() -> Result<()> {
    let reg = Registry::start()?;
    let c = client(&reg, vec![])?;
    let a = reg.addr();
    let labels = BTreeMap::from([("io.openshift.release".to_string(), "4.18.3".to_string())]);
    c.push_image(&format!("{a}/ocp/release:4.18.3-x86_64"), &labels)
        .await?;
    assert_eq!(
        c.release_version(&format!("{a}/ocp/release:4.18.3-x86_64"))
            .await?,
        "4.18.3"
    );

    c.push_image(&format!("{a}/ocp/release:unlabelled"), &BTreeMap::new())
        .await?;
    match c
        .release_version(&format!("{a}/ocp/release:unlabelled"))
        .await
    {
        Err(e @ OciError::NoVersionLabel { .. }) => {
            assert!(e.to_string().contains("io.openshift.release"), "{e}")
        }
        other => panic!("expected NoVersionLabel, got {other:?}"),
    }
    match c.release_version(&format!("{a}/ocp/release:absent")).await {
        Err(OciError::NotFound { reason, .. }) => {
            assert!(reason.contains("manifest unknown"), "{reason}")
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn tags_resolve_to_the_pushed_digest_and_missing_minors_are_missing() -> Result<()> {
    let reg = Registry::start()?;
    let c = client(&reg, vec![])?;
    let a = reg.addr();
    let repo = format!("{a}/redhat/redhat-operator-index");
    let pushed = c
        .push_image(&format!("{repo}:v4.16"), &BTreeMap::new())
        .await?;
    // The catalog-image fallback walks minors down until a tag exists.
    let mut found = None;
    let mut missing = Vec::new();
    for minor in [18, 17, 16, 15] {
        match c.resolve(&format!("{repo}:v4.{minor}")).await? {
            Lookup::Found { digest, via, .. } => {
                found = Some((minor, digest, via));
                break;
            }
            Lookup::Missing { reason } => missing.push((minor, reason)),
            other => panic!("v4.{minor}: an open registry answered {other:?}"),
        }
    }
    let (minor, digest, via) = found.expect("v4.16 exists");
    assert_eq!(minor, 16);
    assert_eq!(digest, pushed);
    assert_eq!(via, format!("{repo}:v4.16"));
    assert_eq!(missing.len(), 2);
    assert!(missing[0].1.contains("manifest unknown"), "{missing:?}");
    // A digest reference resolves to itself.
    match c.resolve(&format!("{repo}@{pushed}")).await? {
        Lookup::Found { digest, .. } => assert_eq!(digest, pushed),
        other => panic!("{other:?}"),
    }
    Ok(())
}

#[tokio::test]
async fn mirrors_are_tried_before_the_source() -> Result<()> {
    let reg = Registry::start()?;
    let a = reg.addr();
    let source = "registry.redhat.io/redhat/certified-operator-index";
    let mirror = format!("{a}/mirror/certified-operator-index");
    let plain = client(&reg, vec![])?;
    let pushed = plain
        .push_image(&format!("{mirror}:v4.18"), &BTreeMap::new())
        .await?;

    let mirrored = client(
        &reg,
        vec![Mirror {
            source: "registry.redhat.io/redhat".into(),
            mirrors: vec![format!("{a}/nothing-here"), format!("{a}/mirror")],
        }],
    )?;
    match mirrored.resolve(&format!("{source}:v4.18")).await? {
        Lookup::Found { digest, via, .. } => {
            assert_eq!(digest, pushed);
            assert_eq!(via, format!("{mirror}:v4.18"));
        }
        other => panic!("expected the mirror to answer, got {other:?}"),
    }
    // A prefix that only matches part of a path component is not a mirror match.
    let c = mirrored.candidates(&hcp_olm_oci::Reference::parse(
        "registry.redhat.io/redhatx/y:1",
    )?);
    assert_eq!(c.len(), 1);
    Ok(())
}

#[tokio::test]
async fn unreachable_registry_fails_within_the_timeout_naming_the_url() -> Result<()> {
    let port = hcp_olm_e2e::ports::free_port()?;
    let addr = format!("127.0.0.1:{port}");
    let c = Client::new(ClientOptions {
        plain_http: vec![addr.clone()],
        timeout: Some(Duration::from_secs(2)),
        ..Default::default()
    })?;
    let start = Instant::now();
    match c.resolve(&format!("{addr}/x/y:1")).await {
        Err(e @ OciError::Transport { .. }) => assert!(e.to_string().contains(&addr), "{e}"),
        other => panic!("expected a transport error, got {other:?}"),
    }
    assert!(start.elapsed() < Duration::from_secs(5));
    match c.resolve("not a reference").await {
        Err(OciError::Reference(e)) => assert!(e.to_string().contains("white space")),
        other => panic!("{other:?}"),
    }
    Ok(())
}

/// A release image whose top layer carries `release-manifests/image-references`.
#[tokio::test]
async fn release_image_references_from_the_payload_layers() -> Result<()> {
    use hcp_olm_oci::payload::{IMAGE_REFERENCES_PATH, OLM_COMPONENT, tar_gz};
    let reg = Registry::start()?;
    let c = client(&reg, vec![])?;
    let a = reg.addr();
    let refs = serde_json::json!({
        "kind": "ImageStream", "apiVersion": "image.openshift.io/v1",
        "metadata": {"name": "4.18.3"},
        "spec": {"tags": [
            {"name": "operator-lifecycle-manager",
             "from": {"kind": "DockerImage", "name": format!("{a}/art/olm@sha256:{}", "1".repeat(64))}},
            {"name": "operator-registry",
             "from": {"kind": "DockerImage", "name": format!("{a}/art/opm@sha256:{}", "2".repeat(64))}},
        ]},
    });
    let refs = serde_json::to_vec(&refs)?;
    let labels = BTreeMap::from([("io.openshift.release".to_string(), "4.18.3".to_string())]);
    let base_layer = tar_gz(&[("usr/bin/cluster-version-operator", b"\x7fELF")]);
    let manifests_layer = tar_gz(&[
        (
            "release-manifests/0000_50_olm_00-namespace.yaml",
            b"kind: Namespace\n",
        ),
        (IMAGE_REFERENCES_PATH, &refs),
    ]);
    let good = format!("{a}/ocp/release:4.18.3-x86_64");
    c.push_image_with_layers(&good, &labels, &[base_layer.clone(), manifests_layer])
        .await?;
    let m = c.release_image_references(&good).await?;
    assert_eq!(
        m.get(OLM_COMPONENT).map(String::as_str),
        Some(format!("{a}/art/olm@sha256:{}", "1".repeat(64)).as_str())
    );
    assert_eq!(m.len(), 2, "{m:?}");
    // The version label still reads from the same image.
    assert_eq!(c.release_version(&good).await?, "4.18.3");

    // A payload without the OLM component: the map says so (the caller decides).
    let no_olm = serde_json::to_vec(&serde_json::json!({
        "kind": "ImageStream", "spec": {"tags": [
            {"name": "cli", "from": {"kind": "DockerImage", "name": format!("{a}/art/cli:1")}}]}
    }))?;
    let partial = format!("{a}/ocp/release:no-olm");
    c.push_image_with_layers(
        &partial,
        &labels,
        &[tar_gz(&[(IMAGE_REFERENCES_PATH, &no_olm)])],
    )
    .await?;
    let m = c.release_image_references(&partial).await?;
    ensure!(!m.contains_key(OLM_COMPONENT), "{m:?}");
    ensure!(m.contains_key("cli"), "{m:?}");

    // No file in any layer.
    let bare = format!("{a}/ocp/release:no-manifests");
    c.push_image_with_layers(&bare, &labels, std::slice::from_ref(&base_layer))
        .await?;
    match c.release_image_references(&bare).await {
        Err(e @ OciError::NoImageReferences { .. }) => {
            ensure!(
                e.to_string().contains("release-manifests/image-references"),
                "{e}"
            )
        }
        other => anyhow::bail!("expected NoImageReferences, got {other:?}"),
    }
    // No layers at all.
    let empty = format!("{a}/ocp/release:empty");
    c.push_image(&empty, &labels).await?;
    ensure!(matches!(
        c.release_image_references(&empty).await,
        Err(OciError::NoImageReferences { .. })
    ));

    // Garbage JSON in the file.
    let garbage = format!("{a}/ocp/release:garbage");
    c.push_image_with_layers(
        &garbage,
        &labels,
        &[tar_gz(&[(
            IMAGE_REFERENCES_PATH,
            b"{\"kind\": \"ImageStream\", spec: ",
        )])],
    )
    .await?;
    match c.release_image_references(&garbage).await {
        Err(e @ OciError::InvalidImageReferences { .. }) => {
            ensure!(e.to_string().contains("not JSON"), "{e}")
        }
        other => anyhow::bail!("expected InvalidImageReferences, got {other:?}"),
    }

    // A layer that is not a tar archive at all: an error naming the layer.
    let corrupt = format!("{a}/ocp/release:corrupt");
    c.push_image_with_layers(&corrupt, &labels, &[vec![0x1f, 0x8b, 8, 0, 1, 2, 3, 4]])
        .await?;
    match c.release_image_references(&corrupt).await {
        Err(e @ OciError::Layer { .. }) => ensure!(e.to_string().contains("sha256:"), "{e}"),
        other => anyhow::bail!("expected a layer error, got {other:?}"),
    }

    // Absent image.
    ensure!(matches!(
        c.release_image_references(&format!("{a}/ocp/release:absent"))
            .await,
        Err(OciError::NotFound { .. })
    ));
    Ok(())
}

/// Issue 35, item 6: whether an answer proves what a pull secret may read. The real
/// registry without auth answers anonymously (`authenticated: false`, even with
/// credentials at hand); the real registry with htpasswd auth answers `authenticated: true`
/// once it accepted the credentials (also from the cached challenge answer), and
/// `Unauthorized` for a wrong password. `resolve_at_source` skips the mirrors: the source
/// itself (here a registry with auth standing in for registry.redhat.io through
/// `with_endpoint`) decides.
#[tokio::test]
async fn answers_say_whether_credentials_were_asked_for_and_accepted() -> Result<()> {
    use hcp_olm_e2e::registry::{TEST_USER_HASH, TEST_USER_PASSWORD};
    use hcp_olm_oci::PullSecret;
    let open = Registry::start()?;
    let locked = Registry::start_with_htpasswd(&[("reader", TEST_USER_HASH)])?;
    let (o, l) = (open.addr().to_string(), locked.addr().to_string());
    let creds = |password: &str| -> Result<PullSecret> {
        Ok(PullSecret::parse(&serde_json::to_vec(
            &serde_json::json!({"auths": {
                &l: {"username": "reader", "password": password},
                &o: {"username": "reader", "password": password},
                "registry.redhat.io": {"username": "reader", "password": password},
            }}),
        )?)?)
    };
    let good = Client::new(ClientOptions {
        plain_http: vec![o.clone(), l.clone()],
        pull_secret: creds(TEST_USER_PASSWORD)?,
        timeout: Some(Duration::from_secs(5)),
        ..Default::default()
    })?;
    for a in [&o, &l] {
        good.push_image(&format!("{a}/redhat/idx:v4.18"), &BTreeMap::new())
            .await?;
    }
    for round in ["challenge", "cached answer"] {
        match good.resolve(&format!("{o}/redhat/idx:v4.18")).await? {
            Lookup::Found { authenticated, .. } => {
                ensure!(!authenticated, "open registry ({round}): authenticated")
            }
            other => anyhow::bail!("open registry: {other:?}"),
        }
        match good.resolve(&format!("{l}/redhat/idx:v4.18")).await? {
            Lookup::Found { authenticated, .. } => {
                ensure!(
                    authenticated,
                    "locked registry ({round}): not authenticated"
                )
            }
            other => anyhow::bail!("locked registry: {other:?}"),
        }
    }
    // The default registry behind an anonymous mirror.
    let behind = |ps: PullSecret| -> Result<Client> {
        Ok(Client::new(ClientOptions {
            plain_http: vec![o.clone(), l.clone()],
            pull_secret: ps,
            mirrors: vec![Mirror {
                source: "registry.redhat.io/redhat".into(),
                mirrors: vec![format!("{o}/redhat")],
            }],
            timeout: Some(Duration::from_secs(5)),
        })?
        .with_endpoint("registry.redhat.io", &format!("http://{l}")))
    };
    let image = "registry.redhat.io/redhat/idx:v4.18";
    for (password, entitled) in [(TEST_USER_PASSWORD, true), ("wrong", false)] {
        let c = behind(creds(password)?)?;
        match c.resolve(image).await? {
            Lookup::Found {
                via, authenticated, ..
            } => ensure!(
                via == format!("{o}/redhat/idx:v4.18") && !authenticated,
                "the mirror answers anonymously: {via} {authenticated}"
            ),
            other => anyhow::bail!("through the mirror: {other:?}"),
        }
        match (c.resolve_at_source(image).await?, entitled) {
            (
                Lookup::Found {
                    via, authenticated, ..
                },
                true,
            ) => ensure!(via == image && authenticated, "{via} {authenticated}"),
            (Lookup::Unauthorized { .. }, false) => {}
            (other, _) => anyhow::bail!("at the source with {password:?}: {other:?}"),
        }
    }
    Ok(())
}
