//! OperatorHub (config.openshift.io/v1) spec and the decision which default
//! catalogs exist.

use serde::{Deserialize, Serialize};

use crate::catalogs::DefaultCatalog;

/// `OperatorHub.spec`, as carried by `HostedCluster.spec.configuration.operatorhub`
/// and by the guest's `OperatorHub/cluster`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperatorHubSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_all_default_sources: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sources: Vec<HubSource>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HubSource {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub disabled: bool,
}

impl OperatorHubSpec {
    /// Whether one default source is enabled. A per-source entry wins over
    /// `disableAllDefaultSources` in both directions, as in standalone OpenShift's
    /// marketplace operator: `disableAllDefaultSources: true` plus
    /// `{name: redhat-operators, disabled: false}` keeps only redhat-operators.
    pub fn is_enabled(&self, catalog: DefaultCatalog) -> bool {
        // The last entry for a name wins (the API does not forbid duplicates).
        if let Some(src) = self.sources.iter().rev().find(|s| s.name == catalog.name()) {
            return !src.disabled;
        }
        !self.disable_all_default_sources.unwrap_or(false)
    }

    /// The enabled default catalogs, in canonical order.
    pub fn enabled_catalogs(&self) -> Vec<DefaultCatalog> {
        DefaultCatalog::ALL
            .into_iter()
            .filter(|c| self.is_enabled(*c))
            .collect()
    }

    /// Source names that are not default catalogs (reported, otherwise ignored).
    pub fn unknown_sources(&self) -> Vec<String> {
        self.sources
            .iter()
            .filter(|s| DefaultCatalog::from_name(&s.name).is_none())
            .map(|s| s.name.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DefaultCatalog::*;

    fn hub(all: Option<bool>, sources: &[(&str, bool)]) -> OperatorHubSpec {
        OperatorHubSpec {
            disable_all_default_sources: all,
            sources: sources
                .iter()
                .map(|(n, d)| HubSource {
                    name: n.to_string(),
                    disabled: *d,
                })
                .collect(),
        }
    }

    #[test]
    fn empty_enables_all() {
        assert_eq!(
            hub(None, &[]).enabled_catalogs(),
            vec![RedhatOperators, CertifiedOperators, CommunityOperators]
        );
    }

    #[test]
    fn disable_all() {
        assert!(hub(Some(true), &[]).enabled_catalogs().is_empty());
        assert_eq!(hub(Some(false), &[]).enabled_catalogs().len(), 3);
    }

    #[test]
    fn one_source_disabled() {
        assert_eq!(
            hub(None, &[("community-operators", true)]).enabled_catalogs(),
            vec![RedhatOperators, CertifiedOperators]
        );
    }

    #[test]
    fn per_source_enable_overrides_disable_all() {
        assert_eq!(
            hub(Some(true), &[("certified-operators", false)]).enabled_catalogs(),
            vec![CertifiedOperators]
        );
    }

    #[test]
    fn last_entry_wins_and_unknown_reported() {
        let h = hub(
            None,
            &[
                ("redhat-operators", true),
                ("redhat-operators", false),
                ("redhat-marketplace", true),
            ],
        );
        assert!(h.is_enabled(RedhatOperators));
        assert_eq!(h.unknown_sources(), vec!["redhat-marketplace".to_string()]);
    }

    #[test]
    fn parses_openshift_shape() {
        let h: OperatorHubSpec = serde_json::from_str(
            r#"{"disableAllDefaultSources":true,"sources":[{"name":"redhat-operators","disabled":false}],"future":1}"#,
        )
        .unwrap();
        assert_eq!(h.enabled_catalogs(), vec![RedhatOperators]);
    }
}
