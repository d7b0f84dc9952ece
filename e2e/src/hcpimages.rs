//! Real images for what the controller renders into an HCP namespace, pushed to a test
//! registry at the paths the rendered references name, and the HostedOLM `spec.images`
//! overrides naming them by digest (as an admin names a mirror's copies): the OLM image of
//! the pinned upstream binaries (user 1001, as Red Hat's), index images shaped like Red Hat's
//! (FBC, opm and its cache), our tunnel gateway and guest agent as `make images` packs them,
//! and opm on its own (catalog-operator's `--opmImage`, the bundle-unpack Job's extract step).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};

use crate::realnode::push_image;
use crate::testimages;

/// What [`push_hcp_images`] pushed.
#[derive(Debug)]
pub struct PushedImages {
    /// HostedOLM `spec.images` naming the pushed images by digest.
    pub overrides: serde_json::Value,
    /// Images pushed.
    pub count: usize,
    /// Their size (layers and config), bytes.
    pub bytes: usize,
}

/// Every image the Deployments of namespace `ns` name (containers and init containers).
pub async fn image_refs(client: kube::Client, ns: &str) -> Result<BTreeSet<String>> {
    let mut refs = BTreeSet::new();
    for d in Api::<Deployment>::namespaced(client, ns)
        .list(&ListParams::default())
        .await?
    {
        let spec = d.spec.and_then(|s| s.template.spec).unwrap_or_default();
        for c in spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
        {
            refs.extend(c.image.clone());
        }
    }
    Ok(refs)
}

/// Pushes to `registry` (`host:port`) a real image for each reference in `refs` (what the
/// controller renders: the release's OLM image by digest, Red Hat's index images, our gateway)
/// at the same path, plus opm and our guest agent. Our binaries come from `bin_dir` (the cargo
/// target directory). An index image serving package `<name>-widget` names its bundle by
/// image when `bundles` has that package (OLM then unpacks it with a Job), else carries its
/// objects. A reference of no known kind is an error naming it.
pub async fn push_hcp_images(
    refs: &BTreeSet<String>,
    bin_dir: &Path,
    oci: &hcp_olm_oci::Client,
    registry: &str,
    bundles: &BTreeMap<String, String>,
) -> Result<PushedImages> {
    let path_of = |r: &str| -> Result<String> {
        let (_, path) = r
            .split_once('/')
            .context("image reference without a host")?;
        Ok(path.to_string())
    };
    let work = tempfile::tempdir()?;
    let (mut count, mut bytes) = (0, 0);
    enum Key {
        Olm,
        Gateway,
        Catalog(String),
    }
    let mut overrides = serde_json::json!({"catalogs": {}});
    for r in refs {
        let (config, files, target, key) = if r.contains('@') {
            // The release payload's OLM image: pushed by tag, named by its real digest.
            let (repo, _) = r.split_once('@').context("digest")?;
            let img = testimages::olm()?;
            (
                img.config,
                img.files,
                format!("{}:olm", path_of(repo)?),
                Key::Olm,
            )
        } else if r.contains("-operator-index:") {
            // "registry.redhat.io/redhat/redhat-operator-index:v4.18" → "redhat"
            let name = r
                .rsplit('/')
                .next()
                .and_then(|n| n.split('-').next())
                .unwrap_or("index")
                .to_string();
            let path = path_of(r)?;
            let (repo, tag) = path.rsplit_once(':').context("index tag")?;
            let pkg = format!("{name}-widget");
            let img = testimages::index_with(
                work.path(),
                repo,
                tag,
                &pkg,
                bundles.get(&pkg).map(String::as_str),
            )?;
            (
                img.config,
                img.files,
                path,
                Key::Catalog(format!("{name}-operators")),
            )
        } else if r.contains("/hcp-olm-tunnel-gateway:") {
            let (config, files) = our_image("hcp-olm-tunnel-gateway", bin_dir)?;
            (config, files, path_of(r)?, Key::Gateway)
        } else {
            anyhow::bail!("no test image for {r}");
        };
        let target = format!("{registry}/{target}");
        let built = push_image(oci, &target, &config, &files).await?;
        count += 1;
        bytes += built.size();
        let repo = target.rsplit_once(':').map(|(r, _)| r).unwrap_or(&target);
        let by_digest = format!("{repo}@{}", built.digest());
        match key {
            Key::Olm => overrides["olm"] = by_digest.into(),
            Key::Gateway => overrides["tunnelGateway"] = by_digest.into(),
            Key::Catalog(c) => overrides["catalogs"][c] = by_digest.into(),
        }
    }
    let opm = testimages::opm()?;
    let built = push_image(
        oci,
        &format!("{registry}/{}:{}", opm.repository, opm.tag),
        &opm.config,
        &opm.files,
    )
    .await?;
    count += 1;
    bytes += built.size();
    overrides["operatorRegistry"] =
        format!("{registry}/{}@{}", opm.repository, built.digest()).into();
    // The guest agent (a guest Deployment): `make images`' image, named by digest.
    let (agent, size) = push_ours("hcp-olm-guest-agent", bin_dir, oci, registry).await?;
    count += 1;
    bytes += size;
    overrides["guestAgent"] = agent.into();
    ensure!(
        overrides.get("olm").is_some(),
        "no OLM image among the references: {refs:?}"
    );
    Ok(PushedImages {
        overrides,
        count,
        bytes,
    })
}

/// Pushes our image `name` (`make images`' definition, binaries from `bin_dir`) to
/// `registry` as `hcp-olm/<name>:test`; returns its reference by digest and its size.
pub async fn push_ours(
    name: &str,
    bin_dir: &Path,
    oci: &hcp_olm_oci::Client,
    registry: &str,
) -> Result<(String, usize)> {
    let (config, files) = our_image(name, bin_dir)?;
    let target = format!("{registry}/hcp-olm/{name}:test");
    let built = push_image(oci, &target, &config, &files).await?;
    Ok((
        format!("{registry}/hcp-olm/{name}@{}", built.digest()),
        built.size(),
    ))
}

/// The config and files of our image `name` as `make images` packs it.
fn our_image(
    name: &str,
    bin_dir: &Path,
) -> Result<(hcp_olm_images::ImageConfig, Vec<hcp_olm_images::File>)> {
    let ca = std::fs::read(hcp_olm_images::CA_BUNDLE)
        .with_context(|| format!("reading {}", hcp_olm_images::CA_BUNDLE))?;
    let def = hcp_olm_images::IMAGES
        .iter()
        .find(|d| d.name == name)
        .with_context(|| format!("no image {name}"))?;
    Ok((
        hcp_olm_images::our_config(def)?,
        hcp_olm_images::files_for(def, bin_dir, &ca)?,
    ))
}
