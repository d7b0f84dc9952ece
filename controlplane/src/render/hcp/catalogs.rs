//! A hosted cluster's own copies of the default catalogs in its HCP namespace
//! (management placement, catalogs not shared): NetworkPolicies, Services and
//! Deployments, and the ServiceAccount their pods run as. Shared catalogs are rendered
//! by `render/shared.rs` (with the same server container, `catalog_server_container`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::super::{Desired, RenderError, RenderInput, ResolvedCatalog, names, ports};
use super::{
    CONTROL_PLANE_PRIORITY, PodSpec, catalog_server_container, config_hash, container_security,
    deployment, grpc_probe, ingress_policy, push, resources, service,
};
use crate::hostedolm::{CatalogPlacement, CatalogServerKind};

/// The catalogs this cluster serves itself (none in guest placement).
fn own<'a>(
    input: &RenderInput,
    catalogs: &'a [ResolvedCatalog],
) -> impl Iterator<Item = &'a ResolvedCatalog> {
    let management = input.valid.placement == CatalogPlacement::Management;
    catalogs.iter().filter(move |c| management && c.own())
}

/// The ServiceAccount of the own catalogs' pods, when there are any.
pub(super) fn service_account(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    out: &mut Desired,
) {
    if own(input, catalogs).next().is_some() {
        push(
            out,
            super::service_account(
                input,
                names::CATALOG_SA,
                "catalog",
                Some(&input.valid.pull_secret),
            ),
            "serviceaccounts",
        );
    }
}

/// Each own catalog accepts gRPC from `olm_clients` only.
pub(super) fn network_policies(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    olm_clients: &Value,
    out: &mut Desired,
) {
    for c in own(input, catalogs) {
        let name = names::catalog(c.catalog);
        push(
            out,
            ingress_policy(
                input,
                &name,
                "catalog",
                &name,
                olm_clients.clone(),
                json!([{"protocol": "TCP", "port": ports::CATALOG_GRPC}]),
            ),
            "networkpolicies",
        );
    }
}

/// Egress from the shared-catalog readers to the shared catalogs' gRPC port, for the readers
/// whose egress another NetworkPolicy of the HCP namespace isolates (HyperShift's
/// `management-kas`: same namespace, DNS and addresses off the management pod network only).
/// Nothing where no reader is isolated: a policy of ours alone would isolate them. Inserted
/// after the last NetworkPolicy, so it is applied before the Deployments.
pub(super) fn shared_catalog_egress(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    out: &mut Desired,
) {
    use crate::render::shared::CATALOG_READERS;
    let management = input.valid.placement == CatalogPlacement::Management;
    if !management || !catalogs.iter().any(|c| c.shared.is_some()) {
        return;
    }
    let isolated: Vec<&str> = CATALOG_READERS
        .into_iter()
        .filter(|reader| {
            let Some(labels) = out
                .hcp
                .iter()
                .find(|o| o.kind == "Deployment" && o.name == *reader)
                .and_then(|o| o.body.pointer("/spec/template/metadata/labels"))
                .and_then(Value::as_object)
            else {
                return false;
            };
            input
                .egress_isolation
                .iter()
                .any(|p| crate::netpol::selects(&p.pod_selector, labels))
        })
        .collect();
    if isolated.is_empty() {
        return;
    }
    let name = names::SHARED_CATALOG_EGRESS;
    let policy = json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": super::metadata(&input.valid, name, Some(super::ns(input)), "catalog", super::owner(input)),
        "spec": crate::render::shared::reader_egress_spec(&isolated),
    });
    let at = out
        .hcp
        .iter()
        .rposition(|o| o.kind == "NetworkPolicy")
        .map_or(0, |i| i + 1);
    out.hcp.insert(
        at,
        super::super::Object::new(policy, "networkpolicies", super::super::ApplyPolicy::Apply),
    );
}

/// Each own catalog's gRPC Service.
pub(super) fn services(input: &RenderInput, catalogs: &[ResolvedCatalog], out: &mut Desired) {
    for c in own(input, catalogs) {
        let name = names::catalog(c.catalog);
        push(
            out,
            service(
                input,
                &name,
                "catalog",
                &name,
                json!([{"name": "grpc", "protocol": "TCP", "port": ports::CATALOG_GRPC, "targetPort": ports::CATALOG_GRPC}]),
                "ClusterIP",
            ),
            "services",
        );
    }
}

/// Each own catalog's Deployment.
pub(super) fn deployments(
    input: &RenderInput,
    catalogs: &[ResolvedCatalog],
    out: &mut Desired,
) -> Result<(), RenderError> {
    for c in own(input, catalogs) {
        push(out, catalog_deployment(input, c)?, "deployments");
    }
    Ok(())
}

/// One own catalog's Deployment: the catalog image's content copied out by init
/// containers, served by opm or our server.
fn catalog_deployment(input: &RenderInput, c: &ResolvedCatalog) -> Result<Value, RenderError> {
    let v = &input.valid;
    let name = names::catalog(c.catalog);
    let image = c.image.image().to_string();
    let utilities = json!({
        "name": "extract-utilities",
        "image": v.images.olm,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp"],
        "args": ["/bin/copy-content", "/utilities/copy-content"],
        "resources": resources("10m", "50Mi"),
        "securityContext": container_security(),
        "volumeMounts": [{"name": "utilities", "mountPath": "/utilities"}],
    });
    let extract = |with_cache: bool| {
        let mut args = vec![
            "--catalog.from=/configs".to_string(),
            "--catalog.to=/extracted-catalog/catalog".to_string(),
        ];
        if with_cache {
            args.push("--cache.from=/tmp/cache".to_string());
            args.push("--cache.to=/extracted-catalog/cache".to_string());
        }
        json!({
            "name": "extract-content",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": ["/utilities/copy-content"],
            "args": args,
            "resources": resources("10m", "50Mi"),
            "securityContext": container_security(),
            "volumeMounts": [
                {"name": "utilities", "mountPath": "/utilities"},
                {"name": "catalog-content", "mountPath": "/extracted-catalog"},
            ],
        })
    };
    let (init, server, grace, server_image) = match v.catalog_server {
        CatalogServerKind::Opm => (
            vec![utilities, extract(true)],
            json!({
                "name": "registry",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["/bin/opm"],
                "args": [
                    "serve", "/extracted-catalog/catalog",
                    "--cache-dir=/extracted-catalog/cache",
                    "--port", ports::CATALOG_GRPC.to_string(),
                ],
                "ports": [{"name": "grpc", "containerPort": ports::CATALOG_GRPC, "protocol": "TCP"}],
                "readinessProbe": grpc_probe(5, 5, 10, 3),
                "livenessProbe": grpc_probe(10, 1, 10, 3),
                "startupProbe": grpc_probe(0, 1, 10, 15),
                "resources": resources("10m", c.catalog.memory_request()),
                "securityContext": container_security(),
                "volumeMounts": [
                    {"name": "catalog-content", "mountPath": "/extracted-catalog"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }),
            None,
            image.clone(),
        ),
        // Flags and probes as documented in docs/catalog-server.md.
        CatalogServerKind::HcpOlm => (
            vec![utilities, extract(false)],
            catalog_server_container(&v.images.catalog_server, c.catalog.memory_request()),
            Some(15),
            v.images.catalog_server.clone(),
        ),
    };
    let mut hash_parts = BTreeMap::from([
        ("image".to_string(), image.clone()),
        ("server".to_string(), server_image),
    ]);
    // A rotated pull secret rolls the catalog pods (only known with a cluster).
    if let Some(h) = input.external_secret_hashes.get(&v.pull_secret) {
        hash_parts.insert(format!("secret/{}", v.pull_secret), h.clone());
    }
    let hash = config_hash(&hash_parts);
    let mut d = deployment(
        input,
        PodSpec {
            name: &name,
            component: "catalog",
            replicas: 1,
            service_account: names::CATALOG_SA,
            automount_token: false,
            priority_class: CONTROL_PLANE_PRIORITY,
            init_containers: init,
            containers: vec![server],
            // As HyperShift renders catalog pods: a writable /tmp for the server (its root
            // is read-only; the init containers keep the image's own /tmp, where the opm
            // cache is copied from) and Linux nodes only.
            volumes: vec![
                json!({"name": "utilities", "emptyDir": {}}),
                json!({"name": "catalog-content", "emptyDir": {}}),
                json!({"name": "tmp", "emptyDir": {}}),
            ],
            config_hash: hash,
            image_pull_secrets: vec![v.pull_secret.clone()],
            strategy: None,
            termination_grace_seconds: grace,
        },
    );
    let selector = &mut d["spec"]["template"]["spec"]["nodeSelector"];
    if selector.get(LINUX_NODE_KEY).is_none() {
        selector[LINUX_NODE_KEY] = json!("linux");
    }
    Ok(d)
}

/// The well-known node label of the operating system.
const LINUX_NODE_KEY: &str = "kubernetes.io/os";
