//! The test environment's container images, built without a container engine by the same code
//! as `make images` (`hcp_olm_images::build_image`): the pinned upstream binaries (OLM, opm,
//! the registry, CoreDNS), our pause, catalog images shaped like Red Hat's index images (FBC
//! under `/configs`, opm and its cache; the index label) and an operator bundle image
//! (`registry+v1`: `manifests/`, `metadata/annotations.yaml`, the bundle labels) with the
//! image its operator runs. `make test-images` writes them all as an OCI layout
//! (`hcp-olm-test-images`); the real-node tests push the ones they run.
//!
//! Users are those of the images they stand for: 1001 (group 0) for Red Hat's OLM and index
//! images, 65532:65532 for ours and CoreDNS.

use std::path::Path;

use anyhow::{Context as _, Result};
use hcp_olm_images::{File, ImageConfig};

use crate::scenario::catalogs;
use crate::tools;

/// One test image: where it is pushed (repository path and tag, without a registry), its
/// configuration and files.
pub struct TestImage {
    pub repository: String,
    pub tag: String,
    pub config: ImageConfig,
    pub files: Vec<File>,
}

impl TestImage {
    /// `<registry>/<repository>:<tag>`.
    pub fn reference(&self, registry: &str) -> String {
        format!("{registry}/{}:{}", self.repository, self.tag)
    }

    /// The image, reproducibly (fixed time stamps, `test` version and revision).
    pub fn build(&self) -> Result<hcp_olm_images::Built> {
        let meta = hcp_olm_images::Meta {
            version: "test".into(),
            revision: "test".into(),
            created: 0,
        };
        hcp_olm_images::build_image(&self.config, &self.files, &meta)
            .with_context(|| format!("building {}", self.repository))
    }
}

/// The bundle labels (as `metadata/annotations.yaml` says them) of package `pkg`.
fn bundle_annotations(pkg: &str) -> Vec<(String, String)> {
    [
        (
            "operators.operatorframework.io.bundle.mediatype.v1",
            "registry+v1",
        ),
        (
            "operators.operatorframework.io.bundle.manifests.v1",
            "manifests/",
        ),
        (
            "operators.operatorframework.io.bundle.metadata.v1",
            "metadata/",
        ),
        ("operators.operatorframework.io.bundle.package.v1", pkg),
        (
            "operators.operatorframework.io.bundle.channels.v1",
            "stable",
        ),
        (
            "operators.operatorframework.io.bundle.channel.default.v1",
            "stable",
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

fn config(
    title: &str,
    entrypoint: &[&str],
    user: &str,
    labels: &[(String, String)],
) -> ImageConfig {
    ImageConfig {
        title: title.into(),
        description: format!("{title} (hcp-olm test image)"),
        entrypoint: entrypoint.iter().map(|s| s.to_string()).collect(),
        cmd: Vec::new(),
        env: Vec::new(),
        user: user.into(),
        labels: labels.iter().cloned().collect(),
        owned_by_user: Vec::new(),
        architecture: hcp_olm_images::Arch::Amd64,
    }
}

fn ca_bundle() -> Result<Vec<u8>> {
    std::fs::read(hcp_olm_images::CA_BUNDLE).with_context(|| {
        format!(
            "reading {} (Debian package ca-certificates)",
            hcp_olm_images::CA_BUNDLE
        )
    })
}

/// An image of one pinned upstream binary at `/usr/bin/<name>`, with the shared libraries
/// it loads when it is not static.
fn binary(repository: &str, name: &str, user: &str) -> Result<TestImage> {
    let bin = tools::bin(name)?;
    let mut files = hcp_olm_images::base_files(ca_bundle()?);
    let data = std::fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?;
    for lib in hcp_olm_images::shared_libraries(&bin)? {
        files.push(File {
            path: lib.to_string_lossy().into_owned(),
            mode: 0o755,
            data: std::fs::read(&lib).with_context(|| format!("reading {}", lib.display()))?,
        });
    }
    files.push(File {
        path: format!("/usr/bin/{name}"),
        mode: 0o755,
        data,
    });
    let path = format!("/usr/bin/{name}");
    Ok(TestImage {
        repository: repository.into(),
        tag: "test".into(),
        config: config(name, &[&path], user, &[]),
        files,
    })
}

/// The OLM image: catalog-operator (`/bin/catalog`), olm-operator (`/bin/olm`),
/// `/bin/package-server`, `/bin/copy-content`, `/bin/cpb` and `cp`, user 1001 as Red Hat's.
pub fn olm() -> Result<TestImage> {
    let (config, files) =
        catalogs::olm_image()?.to_oci("operator-lifecycle-manager", "1001", &[], &[])?;
    Ok(TestImage {
        repository: "hcp-olm-test/operator-lifecycle-manager".into(),
        tag: "test".into(),
        config,
        files,
    })
}

/// opm (operator-registry) on its own.
pub fn opm() -> Result<TestImage> {
    binary("hcp-olm-test/opm", "opm", "1001")
}

/// The distribution registry.
pub fn registry() -> Result<TestImage> {
    binary("hcp-olm-test/registry", "registry", "65532:65532")
}

/// CoreDNS.
pub fn coredns() -> Result<TestImage> {
    binary("hcp-olm-test/coredns", "coredns", "65532:65532")
}

/// Our pause (`e2e/tools/pause`): the pod sandbox of the real nodes.
pub fn pause() -> Result<TestImage> {
    let def = hcp_olm_images::ImageDef {
        name: "hcp-olm-e2e-pause",
        binaries: &["pause"],
        description: "pod sandbox of the hcp-olm real-node tests",
    };
    let mut files = hcp_olm_images::base_files(ca_bundle()?);
    let bin = tools::bin("pause")?;
    files.push(File {
        path: format!("{}/pause", hcp_olm_images::BIN_DIR),
        mode: 0o755,
        data: std::fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?,
    });
    Ok(TestImage {
        repository: "hcp-olm/pause".into(),
        tag: "test".into(),
        config: hcp_olm_images::our_config(&def)?,
        files,
    })
}

/// The image the test operator's Deployment runs (`registry.test/widget-operator:v0.1.0` in
/// its CSV): our pause, which waits for SIGTERM like an idle operator.
pub fn widget_operator() -> Result<TestImage> {
    let mut img = pause()?;
    // the CSV names `registry.test/widget-operator:v0.1.0`
    img.repository = "widget-operator".into();
    img.tag = "v0.1.0".into();
    img.config.title = "widget-operator".into();
    img.config.description = "widget-operator (hcp-olm test operator: waits)".into();
    Ok(img)
}

/// A catalog image shaped like Red Hat's index images, serving package `pkg` (work files
/// under `work`): FBC under `/configs`, `/bin/opm` as entrypoint, opm's cache under
/// `/tmp/cache` owned by its user 1001, the index label.
pub fn index(work: &Path, repository: &str, tag: &str, pkg: &str) -> Result<TestImage> {
    index_with(work, repository, tag, pkg, None)
}

/// [`index`] whose bundle is the image `bundle_image` (by reference, its objects not copied
/// into the catalog), so OLM unpacks it with a Job.
pub fn index_with(
    work: &Path,
    repository: &str,
    tag: &str,
    pkg: &str,
    bundle_image: Option<&str>,
) -> Result<TestImage> {
    let name = repository.rsplit('/').next().unwrap_or(repository);
    let (config, files) = catalogs::index_image_with(work, name, pkg, bundle_image)?.to_oci(
        name,
        "1001",
        &[(
            "operators.operatorframework.io.index.configs.v1",
            "/configs",
        )],
        // opm takes a lock in its cache: built in the image as its user, as Red Hat's are
        &["/tmp/cache"],
    )?;
    Ok(TestImage {
        repository: repository.into(),
        tag: tag.into(),
        config,
        files,
    })
}

/// The operator bundle image of package `pkg` (`registry+v1`): its CSV and CRD under
/// `/manifests`, `/metadata/annotations.yaml`, the same annotations as labels. No binary:
/// OLM's unpack Job runs its own copier in it.
pub fn bundle(pkg: &str) -> Result<TestImage> {
    bundle_with(pkg, catalogs::WIDGET_OPERATOR_IMAGE)
}

/// [`bundle`] whose CSV runs `operator_image`.
pub fn bundle_with(pkg: &str, operator_image: &str) -> Result<TestImage> {
    let (csv, crd) = catalogs::bundle_objects_with(pkg, operator_image);
    let annotations = bundle_annotations(pkg);
    let mut yaml = String::from("annotations:\n");
    for (k, v) in &annotations {
        yaml.push_str(&format!("  {k}: {v}\n"));
    }
    let json = |v: &serde_json::Value| -> Result<Vec<u8>> { Ok(serde_json::to_vec_pretty(v)?) };
    let files = vec![
        File {
            path: format!("/manifests/{pkg}.clusterserviceversion.yaml"),
            mode: 0o644,
            data: json(&csv)?,
        },
        File {
            path: format!("/manifests/widgets.{pkg}.example.com.crd.yaml"),
            mode: 0o644,
            data: json(&crd)?,
        },
        File {
            path: "/metadata/annotations.yaml".into(),
            mode: 0o644,
            data: yaml.into_bytes(),
        },
    ];
    Ok(TestImage {
        repository: format!("hcp-olm-test/{pkg}-bundle"),
        tag: "v0.1.0".into(),
        config: config(&format!("{pkg}-bundle"), &[], "65532:65532", &annotations),
        files,
    })
}

/// Every test image (index images under `work`): OLM, opm, registry, CoreDNS, pause, the
/// three default index images (as `redhat/<name>-operator-index:v4.18`), the widget bundle and
/// the image its operator runs.
pub fn all(work: &Path) -> Result<Vec<TestImage>> {
    let mut out = vec![olm()?, opm()?, registry()?, coredns()?, pause()?];
    for name in ["redhat", "certified", "community"] {
        out.push(index(
            work,
            &format!("redhat/{name}-operator-index"),
            "v4.18",
            &format!("{name}-widget"),
        )?);
    }
    out.push(bundle("widget")?);
    out.push(widget_operator()?);
    Ok(out)
}
