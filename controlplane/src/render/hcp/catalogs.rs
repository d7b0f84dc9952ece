//! A hosted cluster's own copies of the default catalogs in its HCP namespace
//! (management placement, catalogs not shared): NetworkPolicies, Services and
//! Deployments (`catalog_deployment` in `hcp.rs`). Shared catalogs are rendered by
//! `render/shared.rs`.

use serde_json::{Value, json};

use super::super::{Desired, RenderError, RenderInput, ResolvedCatalog, names, ports};
use super::{catalog_deployment, ingress_policy, push, service};
use crate::hostedolm::CatalogPlacement;

/// The catalogs this cluster serves itself (none in guest placement).
fn own<'a>(
    input: &RenderInput,
    catalogs: &'a [ResolvedCatalog],
) -> impl Iterator<Item = &'a ResolvedCatalog> {
    let management = input.valid.placement == CatalogPlacement::Management;
    catalogs.iter().filter(move |c| management && c.own())
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
