//! Image references: `[registry[:port]/]repository[:tag][@sha256:digest]`.

/// A parsed image reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// Registry host (and port), e.g. `quay.io` or `127.0.0.1:5000`.
    pub registry: String,
    /// Repository path, e.g. `openshift-release-dev/ocp-release`.
    pub repository: String,
    /// Tag, if any.
    pub tag: Option<String>,
    /// Digest (`sha256:...`), if any.
    pub digest: Option<String>,
}

/// A reference that cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid image reference {reference:?}: {problem}")]
pub struct ReferenceError {
    /// The input.
    pub reference: String,
    /// What is wrong with it.
    pub problem: &'static str,
}

impl Reference {
    /// Parses an image reference. Docker Hub short names get `docker.io` (and `library/`).
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        let err = |problem| ReferenceError {
            reference: s.to_string(),
            problem,
        };
        if s.is_empty() || s.chars().any(char::is_whitespace) {
            return Err(err("empty or contains white space"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => {
                let hex = d
                    .strip_prefix("sha256:")
                    .ok_or_else(|| err("digest must be sha256:<hex>"))?;
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(err("digest must be sha256 followed by 64 hex digits"));
                }
                (r, Some(d.to_string()))
            }
            None => (s, None),
        };
        // A tag is after the last ':' that follows the last '/'.
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let at = last_slash + i;
                (&rest[..at], Some(rest[at + 1..].to_string()))
            }
            None => (rest, None),
        };
        if tag.as_deref() == Some("") {
            return Err(err("empty tag"));
        }
        let (registry, repository) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                (first.to_string(), path.to_string())
            }
            _ if name.contains('/') => ("docker.io".to_string(), name.to_string()),
            _ => ("docker.io".to_string(), format!("library/{name}")),
        };
        if repository.is_empty()
            || repository.split('/').any(|c| {
                c.is_empty()
                    || !c.chars().all(|ch| {
                        ch.is_ascii_lowercase() || ch.is_ascii_digit() || "._-".contains(ch)
                    })
            })
        {
            return Err(err("repository must be lowercase path components"));
        }
        if tag.is_none() && digest.is_none() {
            return Err(err("needs a tag or a digest"));
        }
        Ok(Self {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// What to ask the registry for: the digest if present, else the tag.
    pub fn manifest_ref(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }

    /// `registry/repository`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// `registry/repository@digest`.
    pub fn pinned(&self, digest: &str) -> String {
        format!("{}@{digest}", self.name())
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Reference;

    #[test]
    fn parses_common_forms() {
        let r = Reference::parse("registry.redhat.io/redhat/redhat-operator-index:v4.18").unwrap();
        assert_eq!(
            (r.registry.as_str(), r.repository.as_str()),
            ("registry.redhat.io", "redhat/redhat-operator-index")
        );
        assert_eq!(r.tag.as_deref(), Some("v4.18"));
        let r = Reference::parse("127.0.0.1:5000/ocp/release:4.18.3").unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.tag.as_deref(), Some("4.18.3"));
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("quay.io/x/y@{d}")).unwrap();
        assert_eq!((r.tag, r.digest.as_deref()), (None, Some(d.as_str())));
        let r = Reference::parse("busybox:1").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/busybox:1");
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        for bad in [
            "",
            "quay.io/x/y",
            "quay.io/x/y:",
            "quay.io/X/y:1",
            "quay.io/x/y@sha256:12",
            "a b:1",
            "quay.io//y:1",
        ] {
            let e = Reference::parse(bad).unwrap_err();
            assert!(!e.problem.is_empty(), "{bad}");
        }
    }
}
