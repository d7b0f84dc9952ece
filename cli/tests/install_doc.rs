//! `docs/install.md`, followed literally (issue 37 item 9): every `sh` block of the page runs,
//! in page order, with `bash -euo pipefail` from the repository root, against a real
//! kube-apiserver holding HyperShift's HostedCluster CRD and the HostedCluster
//! `clusters/example` (`fixtures/hypershift/examples/none-minimal.yaml`), with the real
//! `kubectl` and `helm` (built from their Go modules: `make tools`) and this build's
//! `kubectl-hcp_olm` plugin on `PATH`. Each path of the page (`<!-- run: helm -->`,
//! `<!-- run: kustomize -->`) gets a cluster of its own. After each path, the test checks
//! what the page says happened. A block without a `run:` marker fails the test.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, ensure};
use hcp_olm_e2e::{Cluster, ClusterOptions};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{DynamicObject, GroupVersionKind};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The page's `sh` blocks as (path, script), in order.
fn blocks(page: &str) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    let mut marker: Option<String> = None;
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        if let Some(m) = line
            .trim()
            .strip_prefix("<!-- run: ")
            .and_then(|r| r.strip_suffix(" -->"))
        {
            marker = Some(m.to_string());
            continue;
        }
        if line.trim_start().starts_with("```") {
            let lang = line.trim_start().trim_start_matches('`').trim();
            let mut body = String::new();
            for l in lines.by_ref() {
                if l.trim_start().starts_with("```") {
                    break;
                }
                body.push_str(l);
                body.push('\n');
            }
            if lang == "sh" {
                let path = marker
                    .take()
                    .with_context(|| format!("an sh block without a run: marker:\n{body}"))?;
                out.push((path, body));
            }
            marker = None;
            continue;
        }
        if !line.trim().is_empty() {
            marker = None;
        }
    }
    Ok(out)
}

struct Shell {
    path_var: String,
    kubeconfig: PathBuf,
    home: tempfile::TempDir,
}

impl Shell {
    fn new(cluster: &Cluster) -> Result<Self> {
        let plugin = PathBuf::from(env!("CARGO_BIN_EXE_kubectl-hcp_olm"));
        let plugin_dir = plugin.parent().context("plugin dir")?;
        let kubectl = hcp_olm_e2e::tools::bin("kubectl")?;
        let helm = hcp_olm_e2e::tools::bin("helm")?;
        let tools = [kubectl.parent(), helm.parent()];
        let mut dirs: Vec<String> = tools
            .iter()
            .flatten()
            .map(|p| p.display().to_string())
            .collect();
        dirs.push(plugin_dir.display().to_string());
        dirs.push(std::env::var("PATH").unwrap_or_default());
        Ok(Self {
            path_var: dirs.join(":"),
            kubeconfig: cluster.kubeconfig().to_path_buf(),
            home: tempfile::tempdir()?,
        })
    }

    fn run(&self, script: &str) -> Result<String> {
        let h = self.home.path();
        let out = Command::new("bash")
            .args(["-euo", "pipefail", "-c", script])
            .current_dir(repo())
            .env("PATH", &self.path_var)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", h)
            .env("HELM_CACHE_HOME", h.join("helm-cache"))
            .env("HELM_CONFIG_HOME", h.join("helm-config"))
            .env("HELM_DATA_HOME", h.join("helm-data"))
            .env_remove("CI")
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(
            out.status.success(),
            "docs/install.md block failed ({}):\n{script}\n--- output:\n{text}",
            out.status
        );
        Ok(text)
    }
}

/// The management cluster as the page assumes it: HyperShift's HostedCluster CRD, and the
/// HostedCluster `clusters/example` with its HCP namespace `clusters-example`.
async fn management(name: &str) -> Result<Cluster> {
    let cluster = Cluster::start(ClusterOptions::new(name)).await?;
    let fixtures = hcp_olm_e2e::tools::fixtures_dir();
    cluster
        .install_crds(
            &[fixtures.join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml")],
        )
        .await?;
    cluster.ensure_namespace("clusters").await?;
    cluster.ensure_hcp_namespace("clusters-example").await?;
    // HyperShift's render with its placeholders replaced (the CRD refuses them).
    let mut hc = hcp_olm_e2e::fleet::hosted_cluster_template()?;
    hc["metadata"]["namespace"] = "clusters".into();
    hc["metadata"]["name"] = "example".into();
    let obj: DynamicObject = serde_json::from_value(hc)?;
    let gvk = GroupVersionKind::gvk("hypershift.openshift.io", "v1beta1", "HostedCluster");
    let (ar, _) = kube::discovery::pinned_kind(&cluster.client(), &gvk).await?;
    let api: Api<DynamicObject> = Api::namespaced_with(cluster.client(), "clusters", &ar);
    api.create(&Default::default(), &obj).await?;
    Ok(cluster)
}

async fn run_path(cluster: &Cluster, page: &[(String, String)], path: &str) -> Result<Vec<String>> {
    let shell = Shell::new(cluster)?;
    let mut outputs = Vec::new();
    for (_, script) in page.iter().filter(|(p, _)| p == path) {
        eprintln!("== docs/install.md ({path}):\n{script}");
        let out = shell.run(script)?;
        eprintln!("{out}");
        outputs.push(out);
    }
    ensure!(!outputs.is_empty(), "no blocks for the {path} path");
    Ok(outputs)
}

fn page() -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(repo().join("docs/install.md"))?;
    let b = blocks(&text)?;
    for (p, _) in &b {
        ensure!(p == "helm" || p == "kustomize", "unknown run: path {p}");
    }
    Ok(b)
}

#[test]
fn every_sh_block_of_the_page_is_run() -> Result<()> {
    let b = page()?;
    let text = std::fs::read_to_string(repo().join("docs/install.md"))?;
    let fences = text
        .lines()
        .filter(|l| l.trim_start().starts_with("```sh"))
        .count();
    ensure!(b.len() == fences, "{} sh blocks, {} run", fences, b.len());
    // And a block without its marker is refused.
    ensure!(blocks("text\n```sh\necho hi\n```\n").is_err());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_page_helm_path_runs_as_written() -> Result<()> {
    let page = page()?;
    let cluster = management("install-doc-helm").await?;
    let client = cluster.client();
    let gvk = GroupVersionKind::gvk("olm.hcp-olm.io", "v1alpha1", "HostedOLM");
    // Stop before the uninstall blocks to check the installed state: run the blocks one by
    // one and look after the ones that change what we check.
    let shell = Shell::new(&cluster)?;
    let helm: Vec<&String> = page
        .iter()
        .filter(|(p, _)| p == "helm")
        .map(|(_, s)| s)
        .collect();
    ensure!(helm.len() >= 6, "the helm path has {} blocks", helm.len());
    let (install, rest) = helm.split_at(helm.len() - 1);
    for script in install {
        eprintln!("== docs/install.md (helm):\n{script}");
        eprintln!("{}", shell.run(script)?);
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "hcp-olm-system");
    let d = deployments.get("hcp-olm-controller").await?;
    let pod = d
        .spec
        .as_ref()
        .context("spec")?
        .template
        .spec
        .as_ref()
        .context("pod")?;
    let c = &pod.containers[0];
    ensure!(
        c.image.as_deref()
            == Some(
                "mirror.example:5000/hcp-olm/hcp-olm-controller@sha256:0000000000000000000000000000000000000000000000000000000000000001"
            ),
        "{:?}",
        c.image
    );
    let args = c.args.clone().unwrap_or_default();
    for want in [
        "--hosted-cluster-selector=hcp-olm.io/managed=true",
        "--hypershift-olm=TakeOver",
        "--catalog-server-image=mirror.example:5000/hcp-olm/hcp-olm-catalog-server:v0.1.0",
    ] {
        ensure!(args.iter().any(|a| a == want), "{want} not in {args:?}");
    }
    let ns: Api<Namespace> = Api::all(client.clone());
    let labels = ns
        .get("hcp-olm-system")
        .await?
        .metadata
        .labels
        .unwrap_or_default();
    ensure!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str)
            == Some("restricted"),
        "{labels:?}"
    );
    let (ar, _) = kube::discovery::pinned_kind(&client, &gvk).await?;
    let olms: Api<DynamicObject> = Api::namespaced_with(client.clone(), "clusters-example", &ar);
    let olm = olms.get("example").await?;
    ensure!(
        olm.data["spec"]["hyperShiftOLM"] == "TakeOver",
        "{:?}",
        olm.data
    );
    let hcs: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "clusters",
        &kube::discovery::pinned_kind(
            &client,
            &GroupVersionKind::gvk("hypershift.openshift.io", "v1beta1", "HostedCluster"),
        )
        .await?
        .0,
    );
    let hc = hcs.get("example").await?;
    ensure!(
        hc.metadata
            .labels
            .unwrap_or_default()
            .get("hcp-olm.io/managed")
            .map(String::as_str)
            == Some("true")
    );

    // The uninstall block: everything of hcp-olm's goes, the HostedCluster stays.
    for script in rest {
        eprintln!("== docs/install.md (helm):\n{script}");
        eprintln!("{}", shell.run(script)?);
    }
    ensure!(deployments.get_opt("hcp-olm-controller").await?.is_none());
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    // The CRD goes once its objects are gone (the API server's own finalizer).
    let mut gone = false;
    for _ in 0..100 {
        if crds.get_opt("hostedolms.olm.hcp-olm.io").await?.is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    ensure!(gone, "the HostedOLM CRD is still there");
    ensure!(
        hcs.get_opt("example").await?.is_some(),
        "the HostedCluster went"
    );
    drop(cluster);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_page_kustomize_path_runs_as_written() -> Result<()> {
    let page = page()?;
    let cluster = management("install-doc-kustomize").await?;
    let outputs = run_path(&cluster, &page, "kustomize").await?;
    ensure!(outputs[0].contains("hcp-olm-controller"), "{}", outputs[0]);
    let deployments: Api<Deployment> = Api::namespaced(cluster.client(), "hcp-olm-system");
    ensure!(
        deployments.get_opt("hcp-olm-controller").await?.is_none(),
        "the Deployment is still there after the page's kustomize uninstall"
    );
    Ok(())
}
