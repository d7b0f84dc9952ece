//! Which HostedClusters the controller manages (issue 37 item 1): a label selector
//! (`--hosted-cluster-selector`, Kubernetes syntax). A HostedCluster outside it is
//! untouched: no finalizer, no HostedOLM, no write; one that leaves it is cleaned up like a
//! deleted one (our objects pruned, HyperShift's OLM handed back, our finalizer released).
//!
//! The parser is our own: kube's `Selector` matches labels but parses no selector text, and
//! no maintained crate parses the Kubernetes syntax without a whole client.

use std::collections::BTreeMap;

use kube::core::{Expression, Selector, SelectorExt};

/// Longest selector text accepted.
const MAX_SELECTOR: usize = 1024;

/// The HostedClusters in scope; the default selects every one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    selector: Selector,
    text: String,
}

impl Scope {
    /// Parses a label selector: comma-separated `key`, `!key`, `key=value`, `key==value`,
    /// `key!=value`, `key in (a,b)`, `key notin (a,b)`. Empty selects everything.
    pub fn parse(text: &str) -> Result<Scope, String> {
        if text.len() > MAX_SELECTOR {
            return Err(format!("longer than {MAX_SELECTOR} bytes"));
        }
        let mut selector = Selector::default();
        for term in split_terms(text)? {
            selector.extend([expression(term)?]);
        }
        Ok(Scope {
            selector,
            text: text.trim().to_string(),
        })
    }

    /// Whether a HostedCluster with these labels is managed.
    pub fn contains(&self, labels: Option<&BTreeMap<String, String>>) -> bool {
        let empty = BTreeMap::new();
        self.selector.matches(labels.unwrap_or(&empty))
    }

    /// Whether every HostedCluster is in scope.
    pub fn is_everything(&self) -> bool {
        self.selector.selects_all()
    }

    /// The selector as given.
    pub fn text(&self) -> &str {
        &self.text
    }
}

/// Splits at the commas outside parentheses.
fn split_terms(text: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err(format!("unbalanced parentheses in {text:?}"));
        }
    }
    if depth != 0 {
        return Err(format!("unbalanced parentheses in {text:?}"));
    }
    out.push(&text[start..]);
    Ok(out
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect())
}

fn expression(term: &str) -> Result<Expression, String> {
    let set = |rest: &str| -> Result<std::collections::BTreeSet<String>, String> {
        let inner = rest
            .trim()
            .strip_prefix('(')
            .and_then(|r| r.strip_suffix(')'))
            .ok_or_else(|| format!("{term:?}: expected a list in parentheses"))?;
        let values: Result<_, String> = inner.split(',').map(|v| value(v.trim(), term)).collect();
        values
    };
    if let Some(key) = term.strip_prefix('!') {
        return Ok(Expression::DoesNotExist(label_key(key.trim(), term)?));
    }
    if let Some((k, v)) = term.split_once("!=") {
        return Ok(Expression::NotEqual(
            label_key(k.trim(), term)?,
            value(v.trim(), term)?,
        ));
    }
    if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
        return Ok(Expression::Equal(
            label_key(k.trim(), term)?,
            value(v.trim(), term)?,
        ));
    }
    let mut words = term.splitn(2, char::is_whitespace);
    let key = label_key(words.next().unwrap_or_default(), term)?;
    match words.next().map(str::trim_start) {
        None => Ok(Expression::Exists(key)),
        Some(rest) => {
            if let Some(list) = rest.strip_prefix("notin") {
                Ok(Expression::NotIn(key, set(list)?))
            } else if let Some(list) = rest.strip_prefix("in") {
                Ok(Expression::In(key, set(list)?))
            } else {
                Err(format!("{term:?}: expected =, ==, !=, in or notin"))
            }
        }
    }
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name of at most 63
/// characters (alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric).
fn label_key(k: &str, term: &str) -> Result<String, String> {
    let (prefix, name) = match k.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    });
    if prefix_ok && name_ok(name, false) {
        Ok(k.to_string())
    } else {
        Err(format!("{term:?}: {k:?} is not a label key"))
    }
}

fn value(v: &str, term: &str) -> Result<String, String> {
    if name_ok(v, true) {
        Ok(v.to_string())
    } else {
        Err(format!("{term:?}: {v:?} is not a label value"))
    }
}

fn name_ok(s: &str, empty_ok: bool) -> bool {
    if s.is_empty() {
        return empty_ok;
    }
    let b = s.as_bytes();
    s.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn selectors_match_as_kubernetes_matches_them() {
        let s = Scope::parse("hcp-olm.io/managed=true, env in (a, b),!legacy,tier!=x").unwrap();
        assert!(s.contains(Some(&labels(&[
            ("hcp-olm.io/managed", "true"),
            ("env", "a")
        ]))));
        assert!(!s.contains(Some(&labels(&[
            ("hcp-olm.io/managed", "true"),
            ("env", "c")
        ]))));
        assert!(!s.contains(Some(&labels(&[
            ("hcp-olm.io/managed", "true"),
            ("env", "b"),
            ("legacy", "")
        ]))));
        assert!(!s.contains(Some(&labels(&[
            ("hcp-olm.io/managed", "true"),
            ("env", "b"),
            ("tier", "x")
        ]))));
        assert!(!s.contains(None));
        let all = Scope::parse("").unwrap();
        assert!(all.is_everything() && all.contains(None));
        let s = Scope::parse("pilot, region notin (eu)").unwrap();
        assert!(s.contains(Some(&labels(&[("pilot", "")]))));
        assert!(!s.contains(Some(&labels(&[("pilot", ""), ("region", "eu")]))));
        assert!(
            Scope::parse("a==b")
                .unwrap()
                .contains(Some(&labels(&[("a", "b")])))
        );
    }

    #[test]
    fn bad_selectors_are_refused_with_the_term() {
        for bad in [
            "a in (b",
            "a in b)",
            "Bad Key=x",
            "a=b c",
            "a=-x",
            "a between (b)",
            "/a=b",
            &"x".repeat(2000),
        ] {
            let e = Scope::parse(bad).expect_err(bad);
            assert!(!e.is_empty());
        }
    }
}
