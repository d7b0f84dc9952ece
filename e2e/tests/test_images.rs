//! The test images (`hcp_olm_e2e::testimages`, `make test-images`): built twice they are the
//! same, except opm's cache inside the index images (its pogreb database is not byte-stable
//! from one build to the next); the bundle image is a `registry+v1` bundle whose labels are
//! its `metadata/annotations.yaml`; each image runs as the user of the image it stands for.

use std::collections::BTreeMap;

use anyhow::{Context as _, Result, ensure};
use hcp_olm_e2e::testimages;

/// opm's cache database files, the one part of an index image that differs between builds.
fn opm_cache_db(path: &str) -> bool {
    path.starts_with("/tmp/cache/pogreb.v1/")
}

#[test]
fn test_images_are_reproducible_and_shaped_like_what_they_stand_for() -> Result<()> {
    let (w1, w2) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let first = testimages::all(w1.path())?;
    let second = testimages::all(w2.path())?;
    ensure!(first.len() == second.len());
    let mut summary = Vec::new();
    for (a, b) in first.iter().zip(&second) {
        let name = a.reference("registry.test");
        ensure!(name == b.reference("registry.test"));
        let (ba, bb) = (a.build()?, b.build()?);
        let index = a
            .config
            .labels
            .contains_key("operators.operatorframework.io.index.configs.v1");
        if index {
            // The same files with the same contents, but for opm's cache database.
            let files = |i: &testimages::TestImage| -> BTreeMap<String, Vec<u8>> {
                i.files
                    .iter()
                    .map(|f| {
                        let data = if opm_cache_db(&f.path) {
                            Vec::new()
                        } else {
                            f.data.clone()
                        };
                        (f.path.clone(), data)
                    })
                    .collect()
            };
            ensure!(files(a) == files(b), "{name}: differs beyond opm's cache");
            ensure!(
                a.files.iter().any(|f| f.path == "/bin/opm")
                    && a.files.iter().any(|f| f.path.starts_with("/configs/"))
                    && a.files.iter().any(|f| opm_cache_db(&f.path)),
                "{name}: not shaped like an index image"
            );
        } else {
            ensure!(
                ba.digest() == bb.digest(),
                "{name}: two builds gave {} and {}",
                ba.digest(),
                bb.digest()
            );
        }
        let user = a.config.user.as_str();
        let want = if name.contains("operator-index")
            || name.contains("lifecycle-manager")
            || name.contains("/opm:")
        {
            "1001"
        } else {
            "65532:65532"
        };
        ensure!(user == want, "{name}: user {user}, want {want}");
        summary.push(format!(
            "{name} {:.1} MiB{}",
            ba.size() as f64 / 1048576.0,
            if index { " (opm cache varies)" } else { "" }
        ));
    }
    eprintln!("test-images: {}", summary.join(", "));

    // The bundle: registry+v1, its annotations file says what its labels say.
    let bundle = first
        .iter()
        .find(|i| i.repository.ends_with("widget-bundle"))
        .context("no bundle image")?;
    let file = |p: &str| {
        bundle
            .files
            .iter()
            .find(|f| f.path == p)
            .with_context(|| format!("bundle has no {p}"))
    };
    let annotations: BTreeMap<String, BTreeMap<String, String>> =
        serde_yaml_ng::from_slice(&file("/metadata/annotations.yaml")?.data)?;
    let annotations = annotations.get("annotations").context("no annotations")?;
    ensure!(
        annotations["operators.operatorframework.io.bundle.mediatype.v1"] == "registry+v1"
            && annotations["operators.operatorframework.io.bundle.package.v1"] == "widget"
    );
    for (k, v) in annotations {
        ensure!(bundle.config.labels.get(k) == Some(v), "label {k}");
    }
    let csv: serde_json::Value =
        serde_json::from_slice(&file("/manifests/widget.clusterserviceversion.yaml")?.data)?;
    ensure!(csv["kind"] == "ClusterServiceVersion" && csv["metadata"]["name"] == "widget.v0.1.0");
    // The operator the CSV installs runs an image that is built too.
    let operator_image = &csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]["spec"]
        ["containers"][0]["image"];
    ensure!(
        *operator_image == testimages::widget_operator()?.reference("registry.test"),
        "the CSV runs {operator_image}, which no test image is"
    );
    Ok(())
}
