//! The kubelet stand-in runs what the controller rendered, as rendered: real binaries, init
//! containers, mounted volumes, probes; and it fails loudly on what a kubelet would not run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hcp_olm_e2e::kubelet::{self, Image, ImageStore, NodeFacts, Objects, PodInput, PodSite};
use hcp_olm_e2e::netns::Netns;
use hcp_olm_e2e::tools;
use k8s_openapi::api::apps::v1::Deployment;
use serde::Deserialize;

fn golden_deployment(file: &str, name: &str) -> Deployment {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../controlplane/tests/golden")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    let doc = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| serde_yaml_ng::Value::deserialize(d).unwrap())
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{name} not in {}", path.display()));
    serde_yaml_ng::from_value(doc).unwrap()
}

/// A catalog image as a directory: opm, the catalog under /configs and the pre-built cache
/// under /tmp/cache, as `opm`-based index images ship them.
fn index_image(work: &Path) -> Image {
    let opm = tools::bin("opm").unwrap();
    let configs = tools::fixtures_dir().join("catalogs/small");
    let cache = work.join("index-cache");
    let out = std::process::Command::new(&opm)
        .args([
            "serve",
            configs.to_str().unwrap(),
            "--cache-only",
            "--pprof-addr=127.0.0.1:0",
            "--cache-dir",
        ])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "building the index cache: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Image::new()
        .file("/bin/opm", &opm)
        .tree("/configs", configs)
        .tree("/tmp/cache", cache)
        .entrypoint(&["/bin/opm"])
}

/// The OLM image of a release payload: the OLM binaries, plus `cp` for the init container
/// that copies `copy-content` out of it.
fn olm_image() -> Image {
    let mut img = Image::new().with_host_libraries();
    for b in ["catalog", "olm", "package-server", "copy-content"] {
        img = img.file(&format!("/bin/{b}"), tools::bin(b).unwrap());
    }
    img.file("/bin/cp", PathBuf::from("/usr/bin/cp"))
}

fn images_for(dep: &Deployment, work: &Path) -> ImageStore {
    let spec = dep.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let mut store = ImageStore::new();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
    {
        let image = c.image.clone().unwrap();
        if image.contains("operator-index") {
            store.insert(&image, index_image(work));
        } else if image.contains("ocp-v4.0-art-dev") {
            store.insert(&image, olm_image());
        }
    }
    store
}

fn node() -> NodeFacts {
    NodeFacts {
        api_host: String::new(),
        api_port: 0,
        pod_ip: "127.0.0.1".into(),
        node_name: "node-a".into(),
        service_account: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_catalog_pod_runs_init_containers_then_serves_and_passes_grpc_probes() {
    let dep = golden_deployment("aws-default-live.yaml", "hcp-olm-redhat-operators");
    let work = tempfile::tempdir().unwrap();
    let images = images_for(&dep, work.path());
    let tmpl = &dep.spec.as_ref().unwrap().template;
    let spec = tmpl.spec.as_ref().unwrap();
    let labels: BTreeMap<String, String> = tmpl
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    let plan = kubelet::plan::plan(
        &PodInput {
            namespace: "clusters-cesar",
            name: "redhat-operators-0",
            labels: &labels,
            spec,
        },
        &Objects::default(),
        &images,
        &node(),
    )
    .unwrap();
    assert_eq!(
        plan.init_containers.len(),
        2,
        "extract-utilities, extract-content"
    );

    let ns = Netns::create("kub").unwrap();
    let dir = work.path().join("pod");
    let site = PodSite {
        name: "redhat-operators-0",
        netns: Some(&ns),
        ip: "127.0.0.1".parse().unwrap(),
        dir: &dir,
        init_timeout: Duration::from_secs(60),
    };
    let pod = kubelet::start(&plan, &images, &site).await.unwrap();
    pod.wait_ready(Duration::from_secs(90))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(pod.ready().await.unwrap());
    // the init containers really ran: the catalog was copied into the shared emptyDir
    let copied = dir.join("volumes/catalog-content/catalog");
    assert!(
        std::fs::read_dir(&copied).unwrap().count() > 0,
        "{} is empty",
        copied.display()
    );
    // a crash (SIGKILL from outside) makes the next readiness check fail, naming the exit
    let (_, p) = pod.processes().next().unwrap();
    let status = std::process::Command::new("kill")
        .args(["-KILL", &p.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    tokio::time::sleep(Duration::from_millis(200)).await;
    let err = pod.ready().await.unwrap_err().to_string();
    assert!(err.contains("container registry exited"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flag_the_binary_rejects_fails_with_its_own_message() {
    let mut dep = golden_deployment("aws-default-live.yaml", "hcp-olm-redhat-operators");
    let work = tempfile::tempdir().unwrap();
    let images = images_for(&dep, work.path());
    let spec = dep.spec.as_mut().unwrap().template.spec.as_mut().unwrap();
    spec.containers[0]
        .args
        .as_mut()
        .unwrap()
        .push("--no-such-flag".into());
    let labels = BTreeMap::new();
    let plan = kubelet::plan::plan(
        &PodInput {
            namespace: "clusters-cesar",
            name: "bad-flag",
            labels: &labels,
            spec,
        },
        &Objects::default(),
        &images,
        &node(),
    )
    .unwrap();
    let ns = Netns::create("kub").unwrap();
    let dir = work.path().join("pod");
    let site = PodSite {
        name: "bad-flag",
        netns: Some(&ns),
        ip: "127.0.0.1".parse().unwrap(),
        dir: &dir,
        init_timeout: Duration::from_secs(60),
    };
    let pod = kubelet::start(&plan, &images, &site).await.unwrap();
    let err = pod
        .wait_ready(Duration::from_secs(60))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("container registry exited"), "{err}");
    assert!(err.contains("unknown flag: --no-such-flag"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_init_container_stops_the_pod_with_its_log() {
    let dep = golden_deployment("aws-default-live.yaml", "hcp-olm-redhat-operators");
    let work = tempfile::tempdir().unwrap();
    // the index image without its /configs: copy-content has nothing to copy
    let mut images = images_for(&dep, work.path());
    let spec = dep.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    let index_ref = spec.containers[0].image.clone().unwrap();
    let mut broken = images.get(&index_ref).unwrap().clone();
    broken.entries.remove("/configs");
    images.insert(&index_ref, broken);
    let labels = BTreeMap::new();
    let plan = kubelet::plan::plan(
        &PodInput {
            namespace: "clusters-cesar",
            name: "no-content",
            labels: &labels,
            spec,
        },
        &Objects::default(),
        &images,
        &node(),
    )
    .unwrap();
    let dir = work.path().join("pod");
    let site = PodSite {
        name: "no-content",
        netns: None,
        ip: "127.0.0.1".parse().unwrap(),
        dir: &dir,
        init_timeout: Duration::from_secs(60),
    };
    let err = kubelet::start(&plan, &images, &site)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("init container extract-content failed"),
        "{err}"
    );
    assert!(err.contains("/configs"), "{err}");
}
