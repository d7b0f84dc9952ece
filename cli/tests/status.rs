//! `kubectl hcp-olm status` against a real API server: the kubectl-plugin binary reads
//! HostedOLMs through the usual kubeconfig and context, and bad input (unknown context, a
//! cluster without hcp-olm) is a clear error with a non-zero exit.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Result, ensure};
use hcp_olm_e2e::cluster::{Cluster, ClusterOptions};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};

fn plugin(kubeconfig: &std::path::Path, args: &[&str]) -> Result<(bool, String, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-hcp_olm"))
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test]
async fn kubectl_plugin_status_reads_hosted_olms_through_the_kubeconfig() -> Result<()> {
    let cluster = Cluster::start(ClusterOptions::new("cli-status")).await?;
    let kubeconfig = cluster.kubeconfig().to_path_buf();

    // Before hcp-olm is installed: a clear error.
    let (ok, _, err) = plugin(&kubeconfig, &["status", "-A"])?;
    ensure!(!ok && err.contains("does not serve HostedOLM"), "{err}");

    cluster
        .install_crds(&[
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds/hostedolm.yaml")
        ])
        .await?;
    cluster.ensure_namespace("clusters-a").await?;
    let ar = ApiResource {
        group: "olm.hcp-olm.io".into(),
        version: "v1alpha1".into(),
        api_version: "olm.hcp-olm.io/v1alpha1".into(),
        kind: "HostedOLM".into(),
        plural: "hostedolms".into(),
    };
    let api = Api::<DynamicObject>::namespaced_with(cluster.client(), "clusters-a", &ar);
    let o: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "olm.hcp-olm.io/v1alpha1", "kind": "HostedOLM",
        "metadata": {"name": "a", "namespace": "clusters-a"}, "spec": {},
    }))?;
    api.create(&PostParams::default(), &o).await?;
    api.patch_status(
        "a",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {
            "conditions": [
                {"type": "Available", "status": "False", "reason": "GuestUnreachable", "message": "", "lastTransitionTime": "2026-11-24T00:00:00Z"},
                {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "", "lastTransitionTime": "2026-11-24T00:00:00Z"},
            ],
            "catalogs": [{"name": "redhat-operators", "enabled": true, "connectionState": "READY"}],
        }})),
    )
    .await?;

    let (ok, out, err) = plugin(&kubeconfig, &["status", "-n", "clusters-a"])?;
    ensure!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    ensure!(
        lines[0].starts_with("NAMESPACE") && lines.len() == 2,
        "{out}"
    );
    for want in ["clusters-a", "False", "GuestUnreachable", "1/1"] {
        ensure!(lines[1].contains(want), "{want} missing: {out}");
    }
    let (ok, out, err) = plugin(&kubeconfig, &["status", "-A", "-o", "json"])?;
    ensure!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out)?;
    ensure!(
        v["kind"] == "List"
            && v["items"][0]["metadata"]["name"] == "a"
            && v["items"][0]["status"]["conditions"][0]["reason"] == "GuestUnreachable",
        "{v}"
    );
    // One in detail: conditions with their reasons, catalogs with their state.
    let (ok, out, err) = plugin(&kubeconfig, &["status", "a", "-n", "clusters-a"])?;
    ensure!(ok, "{err}");
    for want in [
        "HostedOLM clusters-a/a",
        "Available",
        "GuestUnreachable",
        "redhat-operators",
        "READY",
    ] {
        ensure!(out.contains(want), "{want} missing: {out}");
    }
    let (ok, _, err) = plugin(&kubeconfig, &["status", "nope", "-n", "clusters-a"])?;
    ensure!(!ok && err.contains("no HostedOLM nope"), "{err}");

    // An unknown context: named in the error, non-zero exit.
    let (ok, _, err) = plugin(&kubeconfig, &["status", "--context", "nope"])?;
    ensure!(!ok && err.contains("nope"), "{err}");

    // uninstall (issue 39 item 7; its work is tested in controlplane/tests/runtime.rs
    // `uninstall_removes_our_objects_and_releases_hosted_clusters`): an unknown context and a
    // cluster without HyperShift are clear errors; --dry-run with the named context lists
    // the HostedOLM it would delete and changes nothing.
    let (ok, _, err) = plugin(
        &kubeconfig,
        &["uninstall", "--dry-run", "--context", "nope"],
    )?;
    ensure!(!ok && err.contains("nope"), "{err}");
    let (ok, _, err) = plugin(&kubeconfig, &["uninstall", "--dry-run"])?;
    ensure!(!ok && err.contains("listing HostedClusters"), "{err}");
    cluster
        .install_crds(&[hcp_olm_e2e::tools::fixtures_dir()
            .join("hypershift/crds/hostedclusters-Hypershift-Default.crd.yaml")])
        .await?;
    let context = std::fs::read_to_string(&kubeconfig)?
        .lines()
        .find_map(|l| l.strip_prefix("current-context: ").map(str::to_string))
        .ok_or_else(|| anyhow::anyhow!("no current-context in the kubeconfig"))?;
    let (ok, out, err) = plugin(
        &kubeconfig,
        &[
            "uninstall",
            "--dry-run",
            "--context",
            context.trim_matches('"'),
        ],
    )?;
    ensure!(ok, "{out}{err}");
    ensure!(
        out.contains("would delete HostedOLM clusters-a/a") && out.contains("nothing changed"),
        "{out}"
    );
    ensure!(api.get_opt("a").await?.is_some(), "a dry run deleted it");
    // A flag error exits 64 and names the flag; help names the plugin as kubectl runs it.
    let out = Command::new(env!("CARGO_BIN_EXE_kubectl-hcp_olm"))
        .args(["status", "--no-such-flag"])
        .output()?;
    ensure!(out.status.code() == Some(64), "{:?}", out.status);
    ensure!(String::from_utf8_lossy(&out.stderr).contains("--no-such-flag"));
    let help = Command::new(env!("CARGO_BIN_EXE_kubectl-hcp_olm"))
        .arg("--help")
        .output()?;
    ensure!(String::from_utf8_lossy(&help.stdout).contains("kubectl hcp-olm"));
    Ok(())
}
