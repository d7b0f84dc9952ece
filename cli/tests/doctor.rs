//! `hcp-olm doctor` against real API servers (a management and a guest kube-apiserver), each
//! fault injected where it lives, the doctor run as the CLI binary:
//! - healthy: exit 0, every hop passed;
//! - the guest agent has no ready replica (its Deployment status written as a kubelet would:
//!   a stand-in, no node runs it here): `guest-agent`;
//! - the packageserver APIService points at a Service that does not exist: the guest API
//!   server's own availability controller marks it not Available (a real fault): `apiservice`;
//! - a default CatalogSource is TRANSIENT_FAILURE (its status written as catalog-operator
//!   would: a stand-in): `catalogs`;
//! - a component of the HCP namespace not available (the HostedOLM status written as the
//!   controller would: a stand-in): `hcp-pods`;
//! - no such HostedOLM: `hostedolm`.
//!
//! Not covered here (left for the scenario world): the same faults made by stopping the real
//! agent, cutting the path and killing a catalog pod on real nodes.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use hcp_olm_e2e::{Cluster, ClusterOptions};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;

fn doctor(mgmt: &Cluster, guest: &Cluster, extra: &[&str]) -> Result<(Option<i32>, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_hcp-olm"))
        .args(["doctor", "a", "-n", "clusters-a", "--guest-kubeconfig"])
        .arg(guest.kubeconfig())
        .args(extra)
        .env("KUBECONFIG", mgmt.kubeconfig())
        .output()?;
    Ok((
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn obj(v: serde_json::Value) -> Result<DynamicObject> {
    Ok(serde_json::from_value(v)?)
}

async fn expect_hop(mgmt: &Cluster, guest: &Cluster, hop: &str) -> Result<String> {
    // The API server's own controllers may take a moment (the APIService's availability).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out) = doctor(mgmt, guest, &[])?;
        if code == Some(1) && out.contains(&format!("first failing hop: {hop}\n")) {
            return Ok(out);
        }
        if Instant::now() > deadline {
            bail!("expected the first failing hop {hop}, got exit {code:?}:\n{out}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_names_each_fault_by_its_hop() -> Result<()> {
    let mgmt = Cluster::start(ClusterOptions::new("doctor-mgmt")).await?;
    let guest = Cluster::start(ClusterOptions::new("doctor-guest")).await?;
    let repo = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    mgmt.install_crds(&[repo.join("manifests/crds/hostedolm.yaml")])
        .await?;
    guest
        .install_crds(&[hcp_olm_e2e::tools::fixtures_dir()
            .join("crds/olm/operators.coreos.com_catalogsources.yaml")])
        .await?;
    mgmt.ensure_namespace("clusters-a").await?;
    for ns in ["hcp-olm", "openshift-marketplace"] {
        guest.ensure_namespace(ns).await?;
    }

    // The HostedOLM and its status, as the controller writes them (stand-in).
    let holm_ar = ar("olm.hcp-olm.io", "v1alpha1", "HostedOLM", "hostedolms");
    let holms: Api<DynamicObject> = Api::namespaced_with(mgmt.client(), "clusters-a", &holm_ar);
    holms
        .create(
            &PostParams::default(),
            &obj(
                json!({"apiVersion": "olm.hcp-olm.io/v1alpha1", "kind": "HostedOLM",
                "metadata": {"name": "a", "namespace": "clusters-a"}, "spec": {}}),
            )?,
        )
        .await?;
    let generation = holms.get("a").await?.metadata.generation.unwrap_or(1);
    let component = |name: &str, ok: bool| {
        json!({"name": name, "available": ok, "readyReplicas": i32::from(ok), "desiredReplicas": 1,
            "reason": if ok { "" } else { "CrashLoopBackOff" }})
    };
    let status = |gateway_ok: bool| {
        json!({"status": {
            "observedGeneration": generation,
            "conditions": [
                {"type": "Available", "status": "True", "reason": "AsExpected", "message": "", "lastTransitionTime": "2026-11-29T00:00:00Z"},
                {"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "", "lastTransitionTime": "2026-11-29T00:00:00Z"},
            ],
            "components": [
                component("hcp-olm-catalog-operator", true),
                component("hcp-olm-olm-operator", true),
                component("hcp-olm-packageserver", true),
                component("hcp-olm-tunnel-gateway", gateway_ok),
                component("hcp-olm-guest-agent", true),
            ],
            "tunnel": {"serviceType": "NodePort", "endpoint": "198.18.0.1:31234", "reason": "AsExpected"},
            "catalogs": [{"name": "redhat-operators", "enabled": true, "connectionState": "READY"}],
        }})
    };
    holms
        .patch_status("a", &PatchParams::default(), &Patch::Merge(status(true)))
        .await?;

    // The guest: the agent Deployment (status as a kubelet would report it: stand-in), a
    // local APIService (Available: Local, from the API server itself), the CatalogSource.
    let deploys: Api<DynamicObject> = Api::namespaced_with(
        guest.client(),
        "hcp-olm",
        &ar("apps", "v1", "Deployment", "deployments"),
    );
    deploys
        .create(
            &PostParams::default(),
            &obj(json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "hcp-olm-guest-agent", "namespace": "hcp-olm"},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "agent"}},
                    "template": {"metadata": {"labels": {"app": "agent"}},
                        "spec": {"containers": [{"name": "agent", "image": "quay.io/hcp-olm/hcp-olm-guest-agent:v0.1.0"}]}}}}))?,
        )
        .await?;
    let agent_ready =
        |n: i64| json!({"status": {"replicas": 1, "readyReplicas": n, "availableReplicas": n}});
    deploys
        .patch_status(
            "hcp-olm-guest-agent",
            &PatchParams::default(),
            &Patch::Merge(agent_ready(1)),
        )
        .await?;
    let apiservices: Api<DynamicObject> = Api::all_with(
        guest.client(),
        &ar("apiregistration.k8s.io", "v1", "APIService", "apiservices"),
    );
    apiservices
        .create(
            &PostParams::default(),
            &obj(
                json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                "metadata": {"name": "v1.packages.operators.coreos.com"},
                "spec": {"group": "packages.operators.coreos.com", "version": "v1",
                    "groupPriorityMinimum": 2000, "versionPriority": 15}}),
            )?,
        )
        .await?;
    let sources: Api<DynamicObject> = Api::namespaced_with(
        guest.client(),
        "openshift-marketplace",
        &ar(
            "operators.coreos.com",
            "v1alpha1",
            "CatalogSource",
            "catalogsources",
        ),
    );
    sources
        .create(
            &PostParams::default(),
            &obj(
                json!({"apiVersion": "operators.coreos.com/v1alpha1", "kind": "CatalogSource",
                "metadata": {"name": "redhat-operators", "namespace": "openshift-marketplace"},
                "spec": {"sourceType": "grpc", "address": "redhat-operators.hcp-olm.svc:50051"}}),
            )?,
        )
        .await?;
    let cs_state =
        |s: &str| json!({"status": {"connectionState": {"lastObservedState": s, "address": "x"}}});
    sources
        .patch_status(
            "redhat-operators",
            &PatchParams::default(),
            &Patch::Merge(cs_state("READY")),
        )
        .await?;

    // Healthy (the local APIService turns Available on its own).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (code, out) = doctor(&mgmt, &guest, &[])?;
        if code == Some(0) && out.contains("every hop passed") {
            break;
        }
        if Instant::now() > deadline {
            bail!("a healthy cluster is not reported healthy: exit {code:?}\n{out}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (code, json_out) = doctor(&mgmt, &guest, &["-o", "json"])?;
    ensure!(code == Some(0), "{json_out}");
    let report: serde_json::Value = serde_json::from_str(&json_out).context("doctor -o json")?;
    let hops: Vec<&str> = report["hops"]
        .as_array()
        .context("hops")?
        .iter()
        .filter_map(|h| h["hop"].as_str())
        .collect();
    ensure!(
        hops == [
            "hostedolm",
            "controller",
            "hcp-pods",
            "tunnel-endpoint",
            "guest-agent",
            "apiservice",
            "catalogs"
        ],
        "{hops:?}"
    );

    // The agent stops being ready.
    deploys
        .patch_status(
            "hcp-olm-guest-agent",
            &PatchParams::default(),
            &Patch::Merge(agent_ready(0)),
        )
        .await?;
    let out = expect_hop(&mgmt, &guest, "guest-agent").await?;
    ensure!(out.contains("kubectl -n hcp-olm logs"), "{out}");
    deploys
        .patch_status(
            "hcp-olm-guest-agent",
            &PatchParams::default(),
            &Patch::Merge(agent_ready(1)),
        )
        .await?;

    // The APIService points at a Service that does not exist: the API server says so.
    apiservices
        .patch(
            "v1.packages.operators.coreos.com",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"service": {"namespace": "default", "name": "packageserver", "port": 443},
                "insecureSkipTLSVerify": true}})),
        )
        .await?;
    let out = expect_hop(&mgmt, &guest, "apiservice").await?;
    ensure!(out.contains("not Available"), "{out}");
    apiservices
        .patch(
            "v1.packages.operators.coreos.com",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"service": null, "insecureSkipTLSVerify": null}})),
        )
        .await?;

    // A catalog not READY.
    sources
        .patch_status(
            "redhat-operators",
            &PatchParams::default(),
            &Patch::Merge(cs_state("TRANSIENT_FAILURE")),
        )
        .await?;
    let out = expect_hop(&mgmt, &guest, "catalogs").await?;
    ensure!(
        out.contains("redhat-operators is TRANSIENT_FAILURE"),
        "{out}"
    );
    sources
        .patch_status(
            "redhat-operators",
            &PatchParams::default(),
            &Patch::Merge(cs_state("READY")),
        )
        .await?;

    // A pod of the HCP namespace down (as the controller reports it).
    holms
        .patch_status("a", &PatchParams::default(), &Patch::Merge(status(false)))
        .await?;
    let out = expect_hop(&mgmt, &guest, "hcp-pods").await?;
    ensure!(
        out.contains("hcp-olm-tunnel-gateway not available"),
        "{out}"
    );

    // No such HostedOLM.
    let out = Command::new(env!("CARGO_BIN_EXE_hcp-olm"))
        .args(["doctor", "nope", "-n", "clusters-a"])
        .env("KUBECONFIG", mgmt.kubeconfig())
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.code() == Some(1) && text.contains("first failing hop: hostedolm"),
        "{text}"
    );
    Ok(())
}
