//! Image references: `[registry[:port]/]repository[:tag][@sha256:digest]`, parsed by
//! `oci-spec`.

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
    /// Parses an image reference with `oci-spec`'s parser (the distribution grammar; Docker
    /// Hub short names get `docker.io` and `library/`). On top of it: a tag or a digest is
    /// required (no implicit `latest`: a lookup of an image nobody named is a mistake), and a
    /// digest must be `sha256:` with 64 hex digits.
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        use oci_spec::distribution::ParseError as P;
        let err = |problem| ReferenceError {
            reference: s.to_string(),
            problem,
        };
        if s.is_empty() || s.chars().any(char::is_whitespace) {
            return Err(err("empty or contains white space"));
        }
        let r: oci_spec::distribution::Reference = s.parse().map_err(|e| {
            err(match e {
                P::DigestInvalidFormat | P::DigestInvalidLength | P::DigestUnsupported => {
                    "digest must be sha256 followed by 64 hex digits"
                }
                P::NameContainsUppercase => "repository name must be lower case",
                P::NameEmpty => "empty repository name",
                P::NameTooLong => "repository name longer than 255 characters",
                P::TagInvalidFormat => "invalid tag",
                _ => "not registry/repository:tag or @sha256:digest",
            })
        })?;
        let name_part = s.rsplit('/').next().unwrap_or(s);
        if !name_part.contains(':') && !s.contains('@') {
            return Err(err("no tag or digest"));
        }
        let digest = r.digest().map(str::to_string);
        if let Some(d) = &digest {
            let hex = d
                .strip_prefix("sha256:")
                .ok_or_else(|| err("digest must be sha256:<hex>"))?;
            if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err("digest must be sha256 followed by 64 hex digits"));
            }
        }
        Ok(Self {
            registry: r.registry().to_string(),
            repository: r.repository().to_string(),
            tag: r.tag().map(str::to_string),
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
