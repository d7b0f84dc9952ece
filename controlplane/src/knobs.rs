//! HyperShift's per-cluster control-plane knobs (issue 37 item 4), read from the
//! HostedCluster's annotations as HyperShift's operator copies them onto the
//! HostedControlPlane, and applied to our HCP Deployments as HyperShift's
//! control-plane-operator applies them to its own:
//!
//! - `hypershift.openshift.io/control-plane-priority-class` and
//!   `hypershift.openshift.io/api-critical-priority-class` replace the default priority
//!   classes (`hypershift-control-plane`, `hypershift-api-critical`);
//! - `hypershift.openshift.io/restart-date` is copied onto every pod template (a new value
//!   rolls the pods);
//! - `resource-request-override.hypershift.openshift.io/<deployment>.<container>:
//!   cpu=…,memory=…` sets container resource requests, named by HyperShift's Deployment and
//!   container names (`catalog-operator`, `olm-operator`, `packageserver`,
//!   `<catalog>-catalog`), mapped to ours.
//!
//! Bad values are skipped with a warning (an Event), as HyperShift skips them; everything is
//! bounded (count and length), since the HostedCluster's owner writes these annotations.

use std::collections::BTreeMap;

/// HyperShift's annotation names.
pub const CONTROL_PLANE_PRIORITY_CLASS: &str =
    "hypershift.openshift.io/control-plane-priority-class";
pub const API_CRITICAL_PRIORITY_CLASS: &str = "hypershift.openshift.io/api-critical-priority-class";
pub const RESTART_DATE: &str = "hypershift.openshift.io/restart-date";
pub const REQUEST_OVERRIDE_PREFIX: &str = "resource-request-override.hypershift.openshift.io/";
/// The pod annotation HyperShift sets on control-plane pods with emptyDir or hostPath
/// volumes, naming them, so the cluster autoscaler may evict them.
pub const SAFE_TO_EVICT_LOCAL_VOLUMES: &str =
    "cluster-autoscaler.kubernetes.io/safe-to-evict-local-volumes";

/// At most this many request overrides are read (HyperShift has about 40 control-plane
/// Deployments; more is not a configuration).
pub const MAX_REQUEST_OVERRIDES: usize = 64;
/// Longest annotation value read.
const MAX_VALUE: usize = 253;

/// The knobs in force for one HostedCluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Knobs {
    pub control_plane_priority_class: Option<String>,
    pub api_critical_priority_class: Option<String>,
    pub restart_date: Option<String>,
    /// (HyperShift Deployment name, container name) → resource → quantity.
    pub requests: BTreeMap<(String, String), BTreeMap<String, String>>,
}

/// Reads the knobs from `annotations`; skipped values are described in the returned
/// warnings (at most five, then a count).
pub fn read(annotations: &BTreeMap<String, String>) -> (Knobs, Vec<String>) {
    let mut k = Knobs::default();
    let mut warnings = Vec::new();
    let field = |key: &str| format!("HostedCluster.metadata.annotations[{key}]");
    for (key, slot) in [
        (
            CONTROL_PLANE_PRIORITY_CLASS,
            &mut k.control_plane_priority_class,
        ),
        (
            API_CRITICAL_PRIORITY_CLASS,
            &mut k.api_critical_priority_class,
        ),
    ] {
        match annotations.get(key).map(String::as_str) {
            None | Some("") => {}
            Some(v) if is_dns_subdomain(v) => *slot = Some(v.to_string()),
            Some(v) => warnings.push(format!(
                "{}: {:?} is not a PriorityClass name; the default is used",
                field(key),
                shown(v)
            )),
        }
    }
    if let Some(v) = annotations.get(RESTART_DATE) {
        if v.len() <= MAX_VALUE {
            k.restart_date = Some(v.clone());
        } else {
            warnings.push(format!(
                "{}: longer than {MAX_VALUE} bytes; ignored",
                field(RESTART_DATE)
            ));
        }
    }
    let mut skipped = 0usize;
    let mut skip = |w: String, warnings: &mut Vec<String>| {
        skipped += 1;
        if warnings.len() < 5 {
            warnings.push(w);
        }
    };
    for (key, value) in annotations.range(REQUEST_OVERRIDE_PREFIX.to_string()..) {
        let Some(target) = key.strip_prefix(REQUEST_OVERRIDE_PREFIX) else {
            break;
        };
        if k.requests.len() >= MAX_REQUEST_OVERRIDES {
            skip(
                format!(
                    "{}: more than {MAX_REQUEST_OVERRIDES} request overrides; the rest are ignored",
                    field(key)
                ),
                &mut warnings,
            );
            break;
        }
        let Some((deployment, container)) = target.split_once('.') else {
            skip(
                format!(
                    "{}: the key must end in <deployment>.<container>",
                    field(key)
                ),
                &mut warnings,
            );
            continue;
        };
        let mut requests = BTreeMap::new();
        for part in value.split(',').take(8) {
            match part.split_once('=') {
                Some((r @ ("cpu" | "memory" | "ephemeral-storage"), q))
                    if is_quantity(q.trim()) =>
                {
                    requests.insert(r.to_string(), q.trim().to_string());
                }
                _ => skip(
                    format!(
                        "{}: {:?} is not <cpu|memory|ephemeral-storage>=<quantity>; skipped",
                        field(key),
                        shown(part)
                    ),
                    &mut warnings,
                ),
            }
        }
        if !requests.is_empty() {
            k.requests
                .insert((deployment.to_string(), container.to_string()), requests);
        }
    }
    if skipped > 5 {
        warnings.push(format!("{} more request overrides skipped", skipped - 5));
    }
    (k, warnings)
}

/// HyperShift's name for one of our HCP Deployments (the name its request overrides use).
pub fn hypershift_deployment_name(ours: &str) -> Option<String> {
    use crate::render::names;
    match ours {
        names::CATALOG_OPERATOR => Some("catalog-operator".into()),
        names::OLM_OPERATOR => Some("olm-operator".into()),
        names::PACKAGESERVER => Some("packageserver".into()),
        _ => crate::catalogs::DefaultCatalog::ALL
            .into_iter()
            .find(|c| names::catalog(*c) == ours)
            .map(|c| format!("{}-catalog", c.name())),
    }
}

/// HyperShift's name for one of our containers (its catalog pods' container is `registry`).
pub fn hypershift_container_name(ours: &str) -> &str {
    match ours {
        "catalog-server" => "registry",
        other => other,
    }
}

fn shown(v: &str) -> String {
    v.chars().take(64).collect()
}

/// A Kubernetes object name of the DNS subdomain form (PriorityClass names).
fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// A Kubernetes resource quantity: a decimal number with an optional binary (Ki…Ei),
/// decimal (n, u, m, k, M…E) or exponent suffix. Our own: no maintained crate parses
/// quantities without pulling a Kubernetes client in, and only the form is checked here.
fn is_quantity(s: &str) -> bool {
    if s.is_empty() || s.len() > 32 {
        return false;
    }
    let body = s.strip_prefix(['+', '-']).unwrap_or(s);
    let digits_end = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(body.len());
    let (number, suffix) = body.split_at(digits_end);
    let dots = number.matches('.').count();
    if number.is_empty() || number == "." || dots > 1 {
        return false;
    }
    match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        e => {
            let Some(exp) = e.strip_prefix(['e', 'E']) else {
                return false;
            };
            let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
            !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ann(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn quantities_as_kubernetes_spells_them() {
        for ok in [
            "1", "100m", "1.5", "2Gi", "512Mi", "1e3", "1E-2", "+1k", ".5",
        ] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "1GB", "Gi", "1..2", "one", "1e", "1 Gi", "-", "."] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }

    #[test]
    fn knobs_are_read_and_bad_ones_skipped_with_a_warning() {
        let (k, w) = read(&ann(&[
            (CONTROL_PLANE_PRIORITY_CLASS, "tenant-cp"),
            (API_CRITICAL_PRIORITY_CLASS, "Not_A_Name"),
            (RESTART_DATE, "2026-11-29T06:00:00Z"),
            (
                "resource-request-override.hypershift.openshift.io/packageserver.packageserver",
                "memory=1Gi,cpu=200m",
            ),
            (
                "resource-request-override.hypershift.openshift.io/olm-operator.olm-operator",
                "memory=lots,cpu=1",
            ),
            (
                "resource-request-override.hypershift.openshift.io/nodot",
                "cpu=1",
            ),
        ]));
        assert_eq!(k.control_plane_priority_class.as_deref(), Some("tenant-cp"));
        assert_eq!(k.api_critical_priority_class, None);
        assert_eq!(k.restart_date.as_deref(), Some("2026-11-29T06:00:00Z"));
        assert_eq!(
            k.requests[&("packageserver".into(), "packageserver".into())],
            BTreeMap::from([
                ("cpu".to_string(), "200m".to_string()),
                ("memory".to_string(), "1Gi".to_string())
            ])
        );
        assert_eq!(
            k.requests[&("olm-operator".into(), "olm-operator".into())],
            BTreeMap::from([("cpu".to_string(), "1".to_string())])
        );
        assert_eq!(w.len(), 3, "{w:?}");
    }

    #[test]
    fn request_overrides_are_bounded() {
        let many: Vec<(String, String)> = (0..500)
            .map(|i| {
                (
                    format!("{REQUEST_OVERRIDE_PREFIX}d{i:03}.c"),
                    "cpu=1".to_string(),
                )
            })
            .collect();
        let (k, w) = read(&many.into_iter().collect());
        assert_eq!(k.requests.len(), MAX_REQUEST_OVERRIDES);
        assert!(!w.is_empty());
    }

    #[test]
    fn our_deployments_map_to_hypershifts_names() {
        use crate::render::names;
        assert_eq!(
            hypershift_deployment_name(names::PACKAGESERVER).as_deref(),
            Some("packageserver")
        );
        assert_eq!(
            hypershift_deployment_name("hcp-olm-redhat-operators").as_deref(),
            Some("redhat-operators-catalog")
        );
        assert_eq!(hypershift_deployment_name(names::TUNNEL_GATEWAY), None);
    }
}
