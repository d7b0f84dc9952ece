//! The ownership table: which side answers a name.
//!
//! Both clusters call themselves `cluster.local`, so ownership is decided by an explicit,
//! ordered list of rules (suffix, optional namespace label). The longest match wins; ties are
//! impossible because duplicate effective suffixes are rejected at load time.

use std::fmt;

use hickory_proto::rr::{Label, Name};

/// Who is authoritative for (and therefore has the final word on) a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// Management-side resolvers.
    Local,
    /// Guest-side resolvers over the tunnel.
    Guest,
    /// Nobody: answer REFUSED.
    Refuse,
}

impl Owner {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Owner::Local => "local",
            Owner::Guest => "guest",
            Owner::Refuse => "refuse",
        }
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One validated rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Lower-case, fully qualified suffix.
    pub suffix: Name,
    /// Optional namespace label directly left of `suffix`.
    pub namespace: Option<String>,
    pub owner: Owner,
}

impl Rule {
    fn effective(&self) -> Result<Name, String> {
        match &self.namespace {
            None => Ok(self.suffix.clone()),
            Some(ns) => {
                let label = Label::from_ascii(ns).map_err(|e| format!("bad namespace: {e}"))?;
                let mut labels: Vec<Label> = vec![label];
                labels.extend(
                    self.suffix
                        .iter()
                        .map(Label::from_raw_bytes)
                        .filter_map(Result::ok),
                );
                let mut n = Name::from_labels(labels).map_err(|e| format!("bad name: {e}"))?;
                n.set_fqdn(true);
                Ok(n.to_lowercase())
            }
        }
    }
}

#[derive(Debug, Clone)]
struct Compiled {
    effective: Name,
    labels: u8,
    index: usize,
}

/// The decision for one name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub owner: Owner,
    /// Index of the matched rule in config order; `None` when no rule matched (REFUSED).
    pub rule: Option<usize>,
}

/// Ordered rules; lookups return the longest matching rule.
#[derive(Debug, Clone)]
pub struct OwnershipTable {
    rules: Vec<Rule>,
    /// Sorted by label count, longest first.
    compiled: Vec<Compiled>,
}

impl OwnershipTable {
    /// Build a table. On error returns the index of the offending rule and a reason.
    pub fn new(rules: Vec<Rule>) -> Result<Self, (usize, String)> {
        let mut compiled: Vec<Compiled> = Vec::with_capacity(rules.len());
        for (index, rule) in rules.iter().enumerate() {
            let effective = rule.effective().map_err(|e| (index, e))?;
            if let Some(prev) = compiled.iter().find(|c| c.effective == effective) {
                return Err((
                    index,
                    format!(
                        "duplicates rules[{}] (both cover `{}`)",
                        prev.index, effective
                    ),
                ));
            }
            compiled.push(Compiled {
                labels: effective.num_labels(),
                effective,
                index,
            });
        }
        // Stable sort keeps config order among equal lengths (they cannot overlap anyway).
        compiled.sort_by_key(|c| std::cmp::Reverse(c.labels));
        Ok(Self { rules, compiled })
    }

    /// The rules in config order.
    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    /// Decide the owner of `name` (case-insensitive). No match means `Refuse`.
    pub fn lookup(&self, name: &Name) -> Decision {
        for c in &self.compiled {
            if c.effective.zone_of(name) {
                return Decision {
                    owner: self.rules[c.index].owner,
                    rule: Some(c.index),
                };
            }
        }
        Decision {
            owner: Owner::Refuse,
            rule: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn table() -> OwnershipTable {
        OwnershipTable::new(vec![
            Rule {
                suffix: n("svc.cluster.local."),
                namespace: None,
                owner: Owner::Guest,
            },
            Rule {
                suffix: n("svc.cluster.local."),
                namespace: Some("clusters-hc1".into()),
                owner: Owner::Local,
            },
            Rule {
                suffix: n("cluster.local."),
                namespace: None,
                owner: Owner::Local,
            },
            Rule {
                suffix: n("blocked.example."),
                namespace: None,
                owner: Owner::Refuse,
            },
            Rule {
                suffix: Name::root(),
                namespace: None,
                owner: Owner::Local,
            },
        ])
        .unwrap()
    }

    #[test]
    fn guest_service_goes_to_guest() {
        let d = table().lookup(&n(
            "redhat-operators.openshift-marketplace.svc.cluster.local.",
        ));
        assert_eq!(d.owner, Owner::Guest);
        assert_eq!(d.rule, Some(0));
    }

    #[test]
    fn hcp_namespace_is_local_despite_same_suffix() {
        let d = table().lookup(&n("catalog-operator.clusters-hc1.svc.cluster.local."));
        assert_eq!(d.owner, Owner::Local);
        assert_eq!(d.rule, Some(1));
        // Case-insensitive.
        let d = table().lookup(&n("Catalog-Operator.CLUSTERS-HC1.svc.Cluster.Local."));
        assert_eq!(d.owner, Owner::Local);
    }

    #[test]
    fn namespace_rule_does_not_match_a_prefix_of_the_label() {
        let d = table().lookup(&n("x.clusters-hc1x.svc.cluster.local."));
        assert_eq!(d.owner, Owner::Guest);
    }

    #[test]
    fn other_names_fall_to_root_and_refuse_rules() {
        let t = table();
        assert_eq!(
            t.lookup(&n("kubernetes.default.pod.cluster.local.")).owner,
            Owner::Local
        );
        assert_eq!(t.lookup(&n("quay.io.")).owner, Owner::Local);
        assert_eq!(t.lookup(&n("a.blocked.example.")).owner, Owner::Refuse);
        assert_eq!(t.lookup(&n("blocked.example.")).rule, Some(3));
    }

    #[test]
    fn no_match_refuses() {
        let t = OwnershipTable::new(vec![Rule {
            suffix: n("svc.cluster.local."),
            namespace: None,
            owner: Owner::Guest,
        }])
        .unwrap();
        let d = t.lookup(&n("example.com."));
        assert_eq!(
            d,
            Decision {
                owner: Owner::Refuse,
                rule: None
            }
        );
    }

    #[test]
    fn duplicates_rejected_with_index() {
        let err = OwnershipTable::new(vec![
            Rule {
                suffix: n("b.svc.cluster.local."),
                namespace: None,
                owner: Owner::Guest,
            },
            Rule {
                suffix: n("svc.cluster.local."),
                namespace: Some("b".into()),
                owner: Owner::Local,
            },
        ])
        .unwrap_err();
        assert_eq!(err.0, 1);
    }
}
