//! Taking over from HyperShift's own OLM and handing back (HostedOLM
//! `spec.hyperShiftOLM: TakeOver`), through HyperShift's supported knob: the HostedCluster
//! annotation `hypershift.openshift.io/debug-deployments`, a comma-separated list of
//! control-plane Deployment names its control-plane-operator keeps at 0 replicas (it copies
//! the annotation to the HostedControlPlane and scales every listed component to 0).
//!
//! What we added, and the annotation's value before, are kept in a second annotation on
//! the HostedCluster, so handing back restores the value exactly, even after the HostedOLM
//! is gone. Pure: the runtime reads the annotations and applies the [`Edit`].

use serde::{Deserialize, Serialize};

/// HyperShift's annotation (its `k8sutil.DebugDeploymentsAnnotation`).
pub const DEBUG_DEPLOYMENTS: &str = "hypershift.openshift.io/debug-deployments";
/// Ours: what we added to [`DEBUG_DEPLOYMENTS`] and its value before (JSON [`Record`]).
pub const RECORD: &str = "hcp-olm.io/debug-deployments-added";
/// HyperShift's OLM Deployments we replace. Its catalogs keep running.
pub const TAKEN_OVER: [&str; 3] = ["catalog-operator", "olm-operator", "packageserver"];
/// Longest annotation value we read (Kubernetes bounds all annotations to 256 KiB together;
/// a record or a debug list longer than this is not ours or not sane).
const MAX_VALUE: usize = 16 * 1024;

/// The content of [`RECORD`].
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// [`DEBUG_DEPLOYMENTS`] before we changed it (`None`: it was absent).
    pub before: Option<String>,
    /// The names we added (those that were not listed before).
    pub added: Vec<String>,
}

/// New values of both annotations (`None` removes one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Edit {
    pub debug_deployments: Option<String>,
    pub record: Option<String>,
}

/// Why the annotations cannot be edited safely.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TakeOverError {
    #[error("annotation {0} is longer than {MAX_VALUE} bytes")]
    TooLong(&'static str),
    #[error("annotation {RECORD} is not hcp-olm's record ({0}); remove it to continue")]
    BadRecord(String),
}

fn names(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect()
}

/// The edit that makes the annotations say what `take_over` wants, or `None` when they
/// already do. `current` and `record` are the live annotation values.
pub fn edit(
    current: Option<&str>,
    record: Option<&str>,
    take_over: bool,
) -> Result<Option<Edit>, TakeOverError> {
    if current.is_some_and(|c| c.len() > MAX_VALUE) {
        return Err(TakeOverError::TooLong(DEBUG_DEPLOYMENTS));
    }
    if record.is_some_and(|r| r.len() > MAX_VALUE) {
        return Err(TakeOverError::TooLong(RECORD));
    }
    let record: Option<Record> = record
        .map(|r| serde_json::from_str(r).map_err(|e| TakeOverError::BadRecord(e.to_string())))
        .transpose()?;
    let listed = names(current.unwrap_or(""));
    if take_over {
        let missing: Vec<&str> = TAKEN_OVER
            .iter()
            .copied()
            .filter(|n| !listed.contains(n))
            .collect();
        if missing.is_empty() {
            return Ok(None);
        }
        // Appended as they are, so the value before is a prefix of the new one.
        let mut value = current.unwrap_or("").to_string();
        for n in &missing {
            if !value.trim().is_empty() {
                value.push(',');
            }
            value.push_str(n);
        }
        let rec = match record {
            // Taken over before and someone removed some of ours since: add them again,
            // still owing the original value.
            Some(mut r) => {
                for n in &missing {
                    if !r.added.iter().any(|a| a == n) {
                        r.added.push((*n).to_string());
                    }
                }
                r
            }
            None => Record {
                before: current.map(str::to_string),
                added: missing.iter().map(|n| (*n).to_string()).collect(),
            },
        };
        let record =
            serde_json::to_string(&rec).map_err(|e| TakeOverError::BadRecord(e.to_string()))?;
        return Ok(Some(Edit {
            debug_deployments: Some(value),
            record: Some(record),
        }));
    }
    // Hand back: only what we added goes; the value before comes back exactly when nobody
    // else changed the list meanwhile.
    let Some(rec) = record else {
        return Ok(None);
    };
    let kept: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|n| !rec.added.iter().any(|a| a == n))
        .collect();
    let before_names = names(rec.before.as_deref().unwrap_or(""));
    let debug_deployments = if kept == before_names {
        rec.before.clone()
    } else if kept.is_empty() && current.is_none() {
        None
    } else {
        Some(kept.join(","))
    };
    Ok(Some(Edit {
        debug_deployments,
        record: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(
        current: Option<&str>,
        e: &Option<Edit>,
        record: Option<&str>,
    ) -> (Option<String>, Option<String>) {
        match e {
            Some(e) => (e.debug_deployments.clone(), e.record.clone()),
            None => (current.map(str::to_string), record.map(str::to_string)),
        }
    }

    #[test]
    fn take_over_then_hand_back_restores_the_value_exactly() {
        for before in [
            None,
            Some(""),
            Some("kube-scheduler"),
            Some(" a , b"),
            Some("olm-operator"),
        ] {
            let e = edit(before, None, true).unwrap();
            let (v, r) = apply(before, &e, None);
            let listed = names(v.as_deref().unwrap_or(""));
            for n in TAKEN_OVER {
                assert!(listed.contains(&n), "{before:?} → {v:?}");
            }
            // converged: a second pass changes nothing
            assert_eq!(
                edit(v.as_deref(), r.as_deref(), true).unwrap(),
                None,
                "{before:?}"
            );
            let back = edit(v.as_deref(), r.as_deref(), false).unwrap();
            let (v2, r2) = apply(v.as_deref(), &back, r.as_deref());
            assert_eq!(v2.as_deref(), before, "hand back of {before:?}");
            assert_eq!(r2, None);
            // and again: nothing to do
            assert_eq!(edit(v2.as_deref(), None, false).unwrap(), None);
        }
    }

    #[test]
    fn names_listed_by_the_admin_are_never_taken_away() {
        // olm-operator was listed before: hand back keeps it
        let e = edit(Some("olm-operator"), None, true).unwrap().unwrap();
        let rec: Record = serde_json::from_str(e.record.as_deref().unwrap()).unwrap();
        assert_eq!(rec.added, ["catalog-operator", "packageserver"]);
        // the admin adds a name while we hold the others: it stays on hand back
        let current = format!("{},etcd", e.debug_deployments.unwrap());
        let back = edit(Some(&current), e.record.as_deref(), false)
            .unwrap()
            .unwrap();
        assert_eq!(back.debug_deployments.as_deref(), Some("olm-operator,etcd"));
        // all of them listed by the admin already: nothing written, nothing to hand back
        let all = "catalog-operator,olm-operator,packageserver";
        assert_eq!(edit(Some(all), None, true).unwrap(), None);
        assert_eq!(edit(Some(all), None, false).unwrap(), None);
    }

    #[test]
    fn someone_removing_ours_gets_them_added_again_and_the_record_kept() {
        let e = edit(None, None, true).unwrap().unwrap();
        let e2 = edit(Some("catalog-operator"), e.record.as_deref(), true)
            .unwrap()
            .unwrap();
        let rec: Record = serde_json::from_str(e2.record.as_deref().unwrap()).unwrap();
        assert_eq!(rec.before, None);
        assert_eq!(
            e2.debug_deployments.as_deref(),
            Some("catalog-operator,olm-operator,packageserver")
        );
        let back = edit(e2.debug_deployments.as_deref(), e2.record.as_deref(), false)
            .unwrap()
            .unwrap();
        assert_eq!(back.debug_deployments, None);
    }

    #[test]
    fn bad_input_is_an_error_not_a_guess() {
        assert!(matches!(
            edit(None, Some("{not json"), false),
            Err(TakeOverError::BadRecord(_))
        ));
        let long = "x,".repeat(MAX_VALUE);
        assert_eq!(
            edit(Some(&long), None, true),
            Err(TakeOverError::TooLong(DEBUG_DEPLOYMENTS))
        );
    }
}
