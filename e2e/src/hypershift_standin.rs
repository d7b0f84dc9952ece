//! A stand-in for HyperShift's hosted-cluster-config-operator (named: no real one runs in
//! these tests): its OLM writes to the guest, as its `reconcileOLM` makes them in management
//! placement. Used by the controller's take-over tests (`runtime.rs`, and the scenario with
//! the real OLM).

use std::collections::BTreeMap;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};

/// An [`ApiResource`] from `group/version` (or `version`), kind and plural.
pub fn resource(api_version: &str, kind: &str, plural: &str) -> ApiResource {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    }
}

/// `operators.coreos.com/v1alpha1` CatalogSources.
pub fn catalog_source_ar() -> ApiResource {
    resource(
        "operators.coreos.com/v1alpha1",
        "CatalogSource",
        "catalogsources",
    )
}

/// Stand-in for HyperShift's hosted-cluster-config-operator's OLM writes to the guest
/// (`reconcileOLM` in its resources controller, management placement): OperatorHub spec
/// `{}`, the three default CatalogSources with `address: <name>:50051`, the packageserver
/// APIService with the root CA's `ca.crt`, Service `default/packageserver` (port 443) and
/// Endpoints to HyperShift's packageserver ClusterIP, and deleting `redhat-marketplace`.
/// Create-or-update as its `CreateOrUpdate`: an object is written only when the fields it
/// sets differ. Returns the objects it wrote (`Kind/name`).
pub async fn hcco_round(
    guest: &kube::Client,
    management: &kube::Client,
    hcp_ns: &str,
) -> Result<Vec<String>> {
    let guest = guest.clone();
    let mut wrote = Vec::new();
    let root_ca = Api::<Secret>::namespaced(management.clone(), hcp_ns)
        .get("root-ca")
        .await?;
    let ca = root_ca
        .data
        .unwrap_or_default()
        .get("ca.crt")
        .map(|b| b.0.clone())
        .context("root-ca has ca.crt")?;
    let ps_ip = Api::<Service>::namespaced(management.clone(), hcp_ns)
        .get("packageserver")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("HyperShift's packageserver Service has a ClusterIP")?;
    use base64::Engine as _;
    let ca_b64 = base64::engine::general_purpose::STANDARD.encode(&ca);
    let mut objects: Vec<(ApiResource, Option<&str>, &str, serde_json::Value)> = vec![
        (
            resource("config.openshift.io/v1", "OperatorHub", "operatorhubs"),
            None,
            "cluster",
            serde_json::json!({"spec": {}}),
        ),
        (
            resource("apiregistration.k8s.io/v1", "APIService", "apiservices"),
            None,
            "v1.packages.operators.coreos.com",
            serde_json::json!({"spec": {
                "caBundle": ca_b64, "group": "packages.operators.coreos.com",
                "groupPriorityMinimum": 2000,
                "service": {"name": "packageserver", "namespace": "default", "port": 443},
                "version": "v1", "versionPriority": 15}}),
        ),
        (
            resource("v1", "Endpoints", "endpoints"),
            Some("default"),
            "packageserver",
            serde_json::json!({"subsets": [{"addresses": [{"ip": ps_ip}],
                "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}]}),
        ),
    ];
    for (name, display, priority) in [
        ("certified-operators", "Certified Operators", -200),
        ("community-operators", "Community Operators", -400),
        ("redhat-operators", "Red Hat Operators", -100),
    ] {
        objects.push((
            catalog_source_ar(),
            Some("openshift-marketplace"),
            name,
            serde_json::json!({
                "metadata": {"annotations": {"target.workload.openshift.io/management":
                    r#"{"effect": "PreferredDuringScheduling"}"#}},
                "spec": {"sourceType": "grpc", "displayName": display,
                    "grpcPodConfig": {"securityContextConfig": "restricted"},
                    "publisher": "Red Hat", "priority": priority,
                    "updateStrategy": {"registryPoll": {"interval": "10m"}},
                    "address": format!("{name}:50051")}}),
        ));
    }
    for (ar, ns, name, want) in objects {
        let api: Api<DynamicObject> = match ns {
            Some(ns) => Api::namespaced_with(guest.clone(), ns, &ar),
            None => Api::all_with(guest.clone(), &ar),
        };
        match api.get_opt(name).await? {
            None => {
                let mut body = want.clone();
                body["apiVersion"] = serde_json::json!(ar.api_version);
                body["kind"] = serde_json::json!(ar.kind);
                body["metadata"]["name"] = serde_json::json!(name);
                if let Some(ns) = ns {
                    body["metadata"]["namespace"] = serde_json::json!(ns);
                }
                api.create(&PostParams::default(), &serde_json::from_value(body)?)
                    .await?;
                wrote.push(format!("{}/{name}", ar.kind));
            }
            Some(mut live) => {
                let mut changed = false;
                for (k, v) in want.as_object().context("object")? {
                    if k == "metadata" {
                        let anns = live.metadata.annotations.get_or_insert_default();
                        for (ak, av) in v["annotations"].as_object().context("annotations")? {
                            let av = av.as_str().unwrap_or_default().to_string();
                            if anns.get(ak) != Some(&av) {
                                anns.insert(ak.clone(), av);
                                changed = true;
                            }
                        }
                    } else if live.data.get(k) != Some(v) {
                        live.data[k] = v.clone();
                        changed = true;
                    }
                }
                if changed {
                    api.replace(name, &PostParams::default(), &live).await?;
                    wrote.push(format!("{}/{name}", ar.kind));
                }
            }
        }
    }
    // Service default/packageserver: it sets name and port of the one port; the server's
    // defaults (protocol, targetPort) are not a difference.
    let svcs = Api::<Service>::namespaced(guest.clone(), "default");
    match svcs.get_opt("packageserver").await? {
        None => {
            svcs.create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "packageserver", "namespace": "default"},
                    "spec": {"ports": [{"name": "https", "port": 443}]}}))?,
            )
            .await?;
            wrote.push("Service/packageserver".into());
        }
        Some(mut live) => {
            let ports = live
                .spec
                .as_ref()
                .and_then(|s| s.ports.clone())
                .unwrap_or_default();
            if ports.len() != 1 || ports[0].name.as_deref() != Some("https") || ports[0].port != 443
            {
                let spec = live.spec.get_or_insert_default();
                spec.ports = Some(vec![k8s_openapi::api::core::v1::ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    ..Default::default()
                }]);
                svcs.replace("packageserver", &PostParams::default(), &live)
                    .await?;
                wrote.push("Service/packageserver".into());
            }
        }
    }
    let cs =
        Api::<DynamicObject>::namespaced_with(guest, "openshift-marketplace", &catalog_source_ar());
    if cs.get_opt("redhat-marketplace").await?.is_some() {
        cs.delete("redhat-marketplace", &Default::default()).await?;
        wrote.push("CatalogSource/redhat-marketplace (deleted)".into());
    }
    Ok(wrote)
}

/// resourceVersions of the guest objects HyperShift's hosted-cluster-config-operator writes.
/// With `olm_runs`, a CatalogSource counts as written only when its generation, labels or
/// annotations change: OLM's catalog-operator writes its status (connection state) all along.
pub async fn hcco_object_versions(
    guest: &kube::Client,
    olm_runs: bool,
) -> Result<BTreeMap<String, String>> {
    let guest = guest.clone();
    let mut out = BTreeMap::new();
    let mut add = |k: String, o: Option<kube::api::ObjectMeta>| {
        out.insert(
            k,
            o.and_then(|m| m.resource_version)
                .unwrap_or_else(|| "absent".into()),
        );
    };
    let hub = Api::<DynamicObject>::all_with(
        guest.clone(),
        &resource("config.openshift.io/v1", "OperatorHub", "operatorhubs"),
    );
    add(
        "OperatorHub/cluster".into(),
        hub.get_opt("cluster").await?.map(|o| o.metadata),
    );
    let aps = Api::<DynamicObject>::all_with(
        guest.clone(),
        &resource("apiregistration.k8s.io/v1", "APIService", "apiservices"),
    );
    add(
        "APIService".into(),
        aps.get_opt("v1.packages.operators.coreos.com")
            .await?
            .map(|o| o.metadata),
    );
    let eps = Api::<DynamicObject>::namespaced_with(
        guest.clone(),
        "default",
        &resource("v1", "Endpoints", "endpoints"),
    );
    add(
        "Endpoints/packageserver".into(),
        eps.get_opt("packageserver").await?.map(|o| o.metadata),
    );
    let svcs = Api::<Service>::namespaced(guest.clone(), "default");
    add(
        "Service/packageserver".into(),
        svcs.get_opt("packageserver").await?.map(|o| o.metadata),
    );
    let cs =
        Api::<DynamicObject>::namespaced_with(guest, "openshift-marketplace", &catalog_source_ar());
    for n in [
        "certified-operators",
        "community-operators",
        "redhat-operators",
    ] {
        let meta = cs.get_opt(n).await?.map(|o| o.metadata);
        let meta = if olm_runs {
            meta.map(|m| kube::api::ObjectMeta {
                resource_version: Some(format!(
                    "generation {:?}, labels {:?}, annotations {:?}",
                    m.generation, m.labels, m.annotations
                )),
                ..Default::default()
            })
        } else {
            meta
        };
        add(format!("CatalogSource/{n}"), meta);
    }
    Ok(out)
}
