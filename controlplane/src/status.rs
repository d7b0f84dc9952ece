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
            // the guest writes these: short and printable only
            let short = |s: &str, n: usize| s.chars().filter(|c| !c.is_control()).take(n).collect();
            let connection_state = state
                .and_then(|s| s["lastObservedState"].as_str())
                .map(|s| short(s, 32));
            let last_connect = state
                .and_then(|s| s["lastConnect"].as_str())
                .map(|s| short(s, 64));
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
                not_ready_since: None,
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

/// How long a rendered catalog may be seen not READY before the HostedOLM stops being
/// Available: the catalog-operator's first connection to a new catalog pod, through the
/// tunnel for guest catalogs, takes up to about a minute; a restarted catalog pod
/// (extract, start, cache) up to a few.
pub const CATALOG_READY_GRACE: std::time::Duration = std::time::Duration::from_secs(300);

/// At most this many characters of a CatalogSource's own `status.reason`/`message` are
/// carried into ours (the guest writes them: untrusted, control characters dropped).
pub const MAX_SOURCE_MESSAGE: usize = 256;

pub fn guest_text(v: &serde_json::Value) -> Option<String> {
    let t: String = v
        .as_str()?
        .chars()
        .filter(|c| !c.is_control())
        .take(MAX_SOURCE_MESSAGE)
        .collect();
    (!t.trim().is_empty()).then_some(t)
}

/// For every catalog whose guest CatalogSource exists but is not READY: when it was first
/// seen so (kept from `previous`, else `now`) and a message naming its state, since when,
/// and the catalog-operator's own reason and message, if any (after the message the render
/// gave it, which stays). READY, disabled, unrendered or
/// not yet observed catalogs keep what [`catalog_statuses`] said.
pub fn track_not_ready(
    catalogs: &mut [crate::hostedolm::CatalogStatus],
    guest_sources: &std::collections::BTreeMap<String, serde_json::Value>,
    previous: &[crate::hostedolm::CatalogStatus],
    now: &Time,
) {
    for c in catalogs.iter_mut() {
        let Some(live) = guest_sources.get(&c.name) else {
            continue;
        };
        if !c.enabled || c.source.is_none() || c.connection_state.as_deref() == Some("READY") {
            continue;
        }
        let since = previous
            .iter()
            .find(|p| p.name == c.name)
            .and_then(|p| p.not_ready_since.clone())
            .filter(|s| parse_time(s).is_some())
            .unwrap_or_else(|| now.0.to_string());
        let state = c
            .connection_state
            .clone()
            .unwrap_or_else(|| "no connection state".to_string());
        let mut message = format!("{state} since {since}");
        let reason = guest_text(&live["status"]["reason"]);
        let said = guest_text(&live["status"]["message"]);
        match (reason, said) {
            (Some(r), Some(m)) => message.push_str(&format!("; catalog-operator: {r}: {m}")),
            (Some(t), None) | (None, Some(t)) => {
                message.push_str(&format!("; catalog-operator: {t}"))
            }
            (None, None) => {}
        }
        c.not_ready_since = Some(since);
        // after what the render said of it (a registry outage naming the registry, ...)
        c.message = if c.message.is_empty() {
            message
        } else {
            format!("{}; {message}", c.message)
        };
    }
}

fn parse_time(s: &str) -> Option<k8s_openapi::jiff::Timestamp> {
    s.parse().ok()
}

/// The catalogs not READY for at least `grace` (name and message, for `Available`), and when
/// the next one would cross it (to look again then).
pub fn catalogs_not_ready(
    catalogs: &[crate::hostedolm::CatalogStatus],
    now: &Time,
    grace: std::time::Duration,
) -> (Vec<String>, Option<std::time::Duration>) {
    let mut late = Vec::new();
    let mut next: Option<std::time::Duration> = None;
    for c in catalogs {
        let Some(since) = c.not_ready_since.as_deref().and_then(parse_time) else {
            continue;
        };
        let for_ = std::time::Duration::try_from(now.0.duration_since(since))
            .unwrap_or(std::time::Duration::ZERO);
        if for_ >= grace {
            late.push(format!("{} ({})", c.name, c.message));
        } else {
            // a second more: times in status have whole seconds
            let left = grace - for_ + std::time::Duration::from_secs(1);
            next = Some(next.map_or(left, |n| n.min(left)));
        }
    }
    (late, next)
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

    fn at(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn catalog(name: &str, state: Option<&str>) -> crate::hostedolm::CatalogStatus {
        crate::hostedolm::CatalogStatus {
            name: name.into(),
            enabled: true,
            source: Some(format!("hcp-olm-{name}:50051")),
            connection_state: state.map(str::to_string),
            ..Default::default()
        }
    }

    /// Issue 39 item 5: a CatalogSource that is not READY is tracked from the first pass that
    /// sees it so, its state and the catalog-operator's words carried (bounded, printable),
    /// and it counts against Available only past the grace period.
    #[test]
    fn catalogs_not_ready_past_the_grace_period_are_named() {
        use std::collections::BTreeMap;
        use std::time::Duration;
        let t0 = 1_800_000_000;
        let mut live = BTreeMap::new();
        live.insert(
            "redhat-operators".to_string(),
            serde_json::json!({"status": {"reason": "Unhealthy\u{1b}[2J",
                "message": format!("couldn't connect: {}", "x".repeat(10_000)),
                "connectionState": {"lastObservedState": "TRANSIENT_FAILURE"}}}),
        );
        live.insert(
            "certified-operators".to_string(),
            serde_json::json!({"status": {"connectionState": {"lastObservedState": "READY"}}}),
        );
        live.insert("community-operators".to_string(), serde_json::json!({}));
        let fresh = || {
            vec![
                catalog("redhat-operators", Some("TRANSIENT_FAILURE")),
                catalog("certified-operators", Some("READY")),
                catalog("community-operators", None),
            ]
        };
        let mut first = fresh();
        track_not_ready(&mut first, &live, &[], &at(t0));
        let since = at(t0).0.to_string();
        assert_eq!(first[0].not_ready_since.as_deref(), Some(since.as_str()));
        assert!(
            first[0]
                .message
                .starts_with(&format!("TRANSIENT_FAILURE since {since}; catalog-operator: Unhealthy[2J: couldn't connect: xxx")),
            "{}",
            first[0].message
        );
        assert!(
            first[0].message.len() < 600,
            "bounded: {}",
            first[0].message.len()
        );
        assert!(!first[0].message.chars().any(char::is_control));
        assert_eq!(first[1].not_ready_since, None, "READY");
        assert!(first[1].message.is_empty());
        assert_eq!(
            first[2].message,
            format!("no connection state since {since}")
        );
        let grace = Duration::from_secs(300);
        let (late, next) = catalogs_not_ready(&first, &at(t0 + 60), grace);
        assert!(late.is_empty(), "{late:?}");
        assert_eq!(next, Some(Duration::from_secs(241)));

        // Later passes keep the first time; past the grace both are named.
        let mut later = fresh();
        track_not_ready(&mut later, &live, &first, &at(t0 + 400));
        assert_eq!(later[0].not_ready_since, first[0].not_ready_since);
        let (late, next) = catalogs_not_ready(&later, &at(t0 + 400), grace);
        assert_eq!(late.len(), 2, "{late:?}");
        assert!(late[0].starts_with("redhat-operators (TRANSIENT_FAILURE since"));
        assert_eq!(next, None);

        // READY again: no longer tracked. A garbled time in a previous status restarts it.
        let mut ready = vec![catalog("redhat-operators", Some("READY"))];
        track_not_ready(&mut ready, &live, &later, &at(t0 + 500));
        assert_eq!(ready[0].not_ready_since, None);
        let mut garbled_prev = fresh();
        garbled_prev[0].not_ready_since = Some("yesterday".into());
        let mut again = fresh();
        track_not_ready(&mut again, &live, &garbled_prev, &at(t0 + 500));
        assert_eq!(
            again[0].not_ready_since.as_deref(),
            Some(at(t0 + 500).0.to_string().as_str())
        );

        // What the render said of it stays first (a registry outage naming the registry).
        let mut held = fresh();
        held[0].message = "the registry lookup failed; serving the last good image".into();
        track_not_ready(&mut held, &live, &[], &at(t0));
        assert!(
            held[0].message.starts_with(
                "the registry lookup failed; serving the last good image; TRANSIENT_FAILURE since"
            ),
            "{}",
            held[0].message
        );

        // Disabled, not rendered, or not observed: untouched.
        let mut other = vec![
            crate::hostedolm::CatalogStatus {
                enabled: false,
                ..catalog("redhat-operators", None)
            },
            crate::hostedolm::CatalogStatus {
                source: None,
                ..catalog("certified-operators", None)
            },
            catalog("absent", None),
        ];
        track_not_ready(&mut other, &live, &[], &at(t0));
        assert!(other.iter().all(|c| c.not_ready_since.is_none()));
    }
}
