//! Conditions for `HostedOLM.status` computed from validation and render results.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::catalogs::MinorVersion;
use crate::render::Pending;
use crate::validate::{ConditionReason, Severity};

pub const AVAILABLE: &str = "Available";
pub const PROGRESSING: &str = "Progressing";
pub const DEGRADED: &str = "Degraded";
pub const UPGRADEABLE: &str = "Upgradeable";

fn cond(
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: if ok { "True" } else { "False" }.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// Sets `Degraded=True` with `reason` (replacing any Degraded condition), other conditions
/// as they were.
pub fn set_degraded(
    conditions: &mut Vec<Condition>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    conditions.retain(|c| c.type_ != DEGRADED);
    conditions.push(cond(
        DEGRADED,
        true,
        reason,
        message.to_string(),
        generation,
        now,
    ));
}

/// Nothing can be applied for a lasting reason outside our control: not Available,
/// Degraded with `reason` and `message`, not Progressing. Other conditions as they were.
pub fn set_blocked(
    conditions: &mut Vec<Condition>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    conditions.retain(|c| ![AVAILABLE, DEGRADED, PROGRESSING].contains(&c.type_.as_str()));
    conditions.push(cond(
        AVAILABLE,
        false,
        reason,
        message.to_string(),
        generation,
        now,
    ));
    conditions.push(cond(
        PROGRESSING,
        false,
        "AsExpected",
        String::new(),
        generation,
        now,
    ));
    conditions.push(cond(
        DEGRADED,
        true,
        reason,
        message.to_string(),
        generation,
        now,
    ));
}

/// Waiting on something outside our control that is expected to come: not Available,
/// Progressing with `reason` and `message`, not Degraded. Other conditions as they were.
pub fn set_waiting(
    conditions: &mut Vec<Condition>,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) {
    conditions.retain(|c| ![AVAILABLE, DEGRADED, PROGRESSING].contains(&c.type_.as_str()));
    for (type_, ok, reason, message) in [
        (AVAILABLE, false, reason, message),
        (PROGRESSING, true, reason, message),
        (DEGRADED, false, "AsExpected", ""),
    ] {
        conditions.push(cond(
            type_,
            ok,
            reason,
            message.to_string(),
            generation,
            now,
        ));
    }
}

/// Degraded/Progressing from validation problems (render did not run).
pub fn conditions_from_validation(
    errs: &[ConditionReason],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let degraded: Vec<&ConditionReason> = errs
        .iter()
        .filter(|e| e.code.severity() == Severity::Degraded)
        .collect();
    let progressing: Vec<&ConditionReason> = errs
        .iter()
        .filter(|e| e.code.severity() == Severity::Progressing)
        .collect();
    let join = |v: &[&ConditionReason]| {
        v.iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ")
    };
    vec![
        cond(
            AVAILABLE,
            false,
            "InvalidInput",
            "the hosted cluster's OLM cannot be rendered".into(),
            generation,
            now,
        ),
        match progressing.first() {
            Some(first) => cond(
                PROGRESSING,
                true,
                first.code.as_str(),
                join(&progressing),
                generation,
                now,
            ),
            None => cond(
                PROGRESSING,
                false,
                "AsExpected",
                String::new(),
                generation,
                now,
            ),
        },
        match degraded.first() {
            Some(first) => cond(
                DEGRADED,
                true,
                first.code.as_str(),
                join(&degraded),
                generation,
                now,
            ),
            None => cond(
                DEGRADED,
                false,
                "AsExpected",
                String::new(),
                generation,
                now,
            ),
        },
    ]
}

/// Progressing/Degraded from render notes (Available comes from live objects).
pub fn conditions_from_pending(
    pending: &[Pending],
    generation: Option<i64>,
    now: &Time,
) -> Vec<Condition> {
    let pick = |sev: Severity| {
        let items: Vec<&Pending> = pending.iter().filter(|p| p.severity == sev).collect();
        let msg = items
            .iter()
            .map(|p| format!("{}: {}", p.component, p.message))
            .collect::<Vec<_>>()
            .join("; ");
        (items.first().map(|p| p.reason), msg)
    };
    let (p_reason, p_msg) = pick(Severity::Progressing);
    let (d_reason, d_msg) = pick(Severity::Degraded);
    vec![
        cond(
            PROGRESSING,
            p_reason.is_some(),
            p_reason.unwrap_or("AsExpected"),
            p_msg,
            generation,
            now,
        ),
        cond(
            DEGRADED,
            d_reason.is_some(),
            d_reason.unwrap_or("AsExpected"),
            d_msg,
            generation,
            now,
        ),
    ]
}

/// An installed CSV and its `olm.maxOpenShiftVersion` property, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstalledOperator {
    pub namespace: String,
    pub csv: String,
    pub max_openshift_version: Option<String>,
}

/// `Upgradeable`: False, naming the operators, when an installed CSV's
/// `olm.maxOpenShiftVersion` is below the next minor of `current`, or unparsable.
/// Operators named in the `Upgradeable` message; the rest are counted.
const SHOWN: usize = 5;

pub fn upgradeable(
    current: &semver::Version,
    installed: &[InstalledOperator],
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let next = MinorVersion::new(current.major, current.minor + 1);
    let mut blocking = Vec::new();
    let mut invalid = Vec::new();
    for op in installed {
        let Some(max) = op.max_openshift_version.as_deref() else {
            continue;
        };
        match MinorVersion::parse(max) {
            Some(m) if m < next => {
                blocking.push(format!("{}/{} (max {})", op.namespace, op.csv, max))
            }
            Some(_) => {}
            None => invalid.push(format!("{}/{} (invalid {:?})", op.namespace, op.csv, max)),
        }
    }
    if blocking.is_empty() && invalid.is_empty() {
        return cond(
            UPGRADEABLE,
            true,
            "AsExpected",
            String::new(),
            generation,
            now,
        );
    }
    // Bounded: a count and the first few names, however many CSVs the guest holds.
    let some = |v: &[String]| {
        let shown = v.iter().take(SHOWN).cloned().collect::<Vec<_>>().join(", ");
        match v.len().saturating_sub(SHOWN) {
            0 => shown,
            more => format!("{shown} and {more} more"),
        }
    };
    let mut parts = Vec::new();
    if !blocking.is_empty() {
        parts.push(format!(
            "{} operators not compatible with {next}: {}",
            blocking.len(),
            some(&blocking)
        ));
    }
    if !invalid.is_empty() {
        parts.push(format!(
            "{} operators with an invalid olm.maxOpenShiftVersion: {}",
            invalid.len(),
            some(&invalid)
        ));
    }
    let reason = if blocking.is_empty() {
        "InvalidMaxOpenShiftVersion"
    } else {
        "IncompatibleOperatorsInstalled"
    };
    cond(
        UPGRADEABLE,
        false,
        reason,
        parts.join("; "),
        generation,
        now,
    )
}

/// Per-catalog status: every default catalog (enabled or not), with the image and
/// version chosen and the connection state read back from the guest CatalogSource
/// (`guest_sources` maps a CatalogSource name to the object as JSON).
pub fn catalog_statuses(
    input: &crate::render::RenderInput,
    desired: &crate::render::Desired,
    guest_sources: &std::collections::BTreeMap<String, serde_json::Value>,
) -> Vec<crate::hostedolm::CatalogStatus> {
    use crate::catalogs::DefaultCatalog;
    use crate::hostedolm::CatalogStatus;
    DefaultCatalog::ALL
        .into_iter()
        .map(|c| {
            let enabled = input.valid.enabled_catalogs.contains(&c);
            let rendered = desired
                .guest
                .iter()
                .find(|o| o.kind == "CatalogSource" && o.name == c.name());
            let source = rendered.and_then(|o| {
                o.body["spec"]["address"]
                    .as_str()
                    .or_else(|| o.body["spec"]["image"].as_str())
                    .map(str::to_string)
            });
            let image = desired
                .hcp
                .iter()
                .find(|o| o.kind == "Deployment" && o.name == crate::render::names::catalog(c))
                .and_then(|o| o.body["spec"]["template"]["spec"]["containers"][0]["image"].as_str())
                .map(str::to_string)
                .or_else(|| {
                    rendered.and_then(|o| o.body["spec"]["image"].as_str().map(str::to_string))
                });
            let live = guest_sources.get(c.name());
            let state = live.map(|l| &l["status"]["connectionState"]);
            let connection_state = state
                .and_then(|s| s["lastObservedState"].as_str())
                .map(str::to_string);
            let last_connect = state
                .and_then(|s| s["lastConnect"].as_str())
                .map(str::to_string);
            let message = if !enabled {
                "disabled".to_string()
            } else if rendered.is_none() {
                desired
                    .pending
                    .iter()
                    .find(|p| p.component == crate::render::names::catalog(c))
                    .map(|p| p.message.clone())
                    .unwrap_or_else(|| "not rendered".to_string())
            } else if let Some(p) = desired.pending.iter().find(|p| {
                p.component == crate::render::names::catalog(c)
                    && p.reason == crate::last_good::HELD_REASON
            }) {
                p.message.clone()
            } else if live.is_none() {
                "CatalogSource not observed in the guest yet".to_string()
            } else {
                String::new()
            };
            let sharing = catalog_sharing(input, c, enabled && rendered.is_some());
            let image = image.or_else(|| {
                // a shared catalog: the digest this cluster resolved (the shared
                // Deployment serves it, or another digest of the same tag during a refresh)
                sharing
                    .as_ref()
                    .filter(|(d, _)| d.key().is_some())
                    .and_then(|_| {
                        input
                            .catalog_images
                            .get(&c)
                            .and_then(|r| r.as_ref().ok())
                            .map(|i| i.image().to_string())
                    })
            });
            let version = match input.catalog_images.get(&c) {
                Some(Ok(img)) if enabled && rendered.is_some() && !img.version.is_empty() => {
                    Some(img.version.clone())
                }
                _ => None,
            };
            CatalogStatus {
                name: c.name().to_string(),
                enabled,
                image,
                version,
                source,
                sharing: sharing.as_ref().map(|(d, _)| d.sharing_str().to_string()),
                reason: sharing
                    .as_ref()
                    .map(|(d, _)| d.reason.as_str().to_string())
                    .unwrap_or_default(),
                serving_deployment: sharing.map(|(_, s)| s),
                connection_state,
                last_connect,
                message,
            }
        })
        .collect()
}

/// For a rendered catalog in management placement: shared or own (the decision the render
/// made, [`crate::sharing::decide`]) and the `namespace/name` of the serving Deployment.
fn catalog_sharing(
    input: &crate::render::RenderInput,
    c: crate::catalogs::DefaultCatalog,
    rendered: bool,
) -> Option<(crate::sharing::Decision, String)> {
    let v = &input.valid;
    if !rendered || v.placement != crate::hostedolm::CatalogPlacement::Management {
        return None;
    }
    let image = input.catalog_images.get(&c).and_then(|r| r.as_ref().ok());
    let d = crate::sharing::decide(v, c, image);
    let serving = match d.key() {
        Some(k) => k.deployment_ref(),
        None => format!(
            "{}/{}",
            v.cluster.hcp_namespace,
            crate::render::names::catalog(c)
        ),
    };
    Some((d, serving))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap())
    }

    fn op(csv: &str, max: Option<&str>) -> InstalledOperator {
        InstalledOperator {
            namespace: "ns".into(),
            csv: csv.into(),
            max_openshift_version: max.map(str::to_string),
        }
    }

    #[test]
    fn upgradeable_names_blocking_operators() {
        let v = semver::Version::new(4, 18, 3);
        let c = upgradeable(
            &v,
            &[
                op("a.v1", Some("4.18")),
                op("b.v1", Some("4.19")),
                op("c.v1", None),
            ],
            Some(2),
            &now(),
        );
        assert_eq!(c.status, "False");
        assert_eq!(c.reason, "IncompatibleOperatorsInstalled");
        assert!(c.message.contains("ns/a.v1"));
        assert!(!c.message.contains("b.v1"));
        assert_eq!(c.observed_generation, Some(2));
        let ok = upgradeable(&v, &[op("b.v1", Some("4.19.0"))], None, &now());
        assert_eq!(ok.status, "True");
        let bad = upgradeable(&v, &[op("x", Some("soon"))], None, &now());
        assert_eq!(bad.status, "False");
        assert_eq!(bad.reason, "InvalidMaxOpenShiftVersion");
    }

    #[test]
    fn upgradeable_message_is_bounded() {
        let v = semver::Version::new(4, 18, 3);
        let many: Vec<InstalledOperator> = (0..20_000)
            .map(|i| op(&format!("op-{i:05}.v1.0.0"), Some("4.18")))
            .collect();
        let c = upgradeable(&v, &many, None, &now());
        assert!(c.message.len() < 400, "{} bytes", c.message.len());
        assert!(
            c.message
                .starts_with("20000 operators not compatible with 4.19: ns/op-00000.v1.0.0")
        );
        assert!(c.message.ends_with("and 19995 more"), "{}", c.message);
    }
}
