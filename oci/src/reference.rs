//! Image references: `[registry[:port]/]repository[:tag][@sha256:digest]`, by the
//! distribution project's reference grammar.

/// Longest repository path.
const NAME_TOTAL_LENGTH_MAX: usize = 255;

/// `[a-z0-9]+` joined by `.`, `_`, `__` or runs of `-`.
fn valid_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: &u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(&b[0]) || !alnum(&b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(&b[i]) {
            i += 1;
            continue;
        }
        // A separator: ".", "_", "__" or "-"+, then an alphanumeric.
        let start = i;
        match b[i] {
            b'.' => i += 1,
            b'_' => i += if b.get(i + 1) == Some(&b'_') { 2 } else { 1 },
            b'-' => {
                while b.get(i) == Some(&b'-') {
                    i += 1;
                }
            }
            _ => return false,
        }
        if i == start || !b.get(i).is_some_and(alnum) {
            return false;
        }
    }
    true
}

/// A host name label: `[a-zA-Z0-9]` or `[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]`.
fn valid_domain_component(c: &str) -> bool {
    let b = c.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
}

/// `host[:port]`, the host being labels joined by dots.
fn valid_domain(d: &str) -> bool {
    let (host, port) = match d.split_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (d, None),
    };
    host.split('.').all(valid_domain_component)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// `[\w][\w.-]{0,127}` (ASCII word characters).
fn valid_tag(t: &str) -> bool {
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|x| word(*x) || *x == b'.' || *x == b'-')
}

/// A name is path components joined by `/`, optionally after a registry (`host[:port]`).
fn valid_name(name: &str) -> bool {
    let paths = |p: &str| p.split('/').all(valid_path_component);
    paths(name)
        || name
            .split_once('/')
            .is_some_and(|(d, p)| valid_domain(d) && paths(p))
}

/// Registry and repository of a valid name, as Docker splits them: the first component is
/// a registry when it has a `.` or a `:` or is `localhost`; otherwise the registry is
/// `docker.io`, where a one-component name is in `library/`.
fn split_domain(name: &str) -> (String, String) {
    let (registry, repository) = match name.split_once('/') {
        Some((first, rest))
            if first.contains('.') || first.contains(':') || first == "localhost" =>
        {
            (first, rest.to_string())
        }
        _ => ("docker.io", name.to_string()),
    };
    let registry = match registry {
        "index.docker.io" => "docker.io",
        r => r,
    };
    let repository = if registry == "docker.io" && !repository.contains('/') {
        format!("library/{repository}")
    } else {
        repository
    };
    (registry.to_string(), repository)
}

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
    /// Parses an image reference by the distribution grammar (Docker Hub short names get
    /// `docker.io` and `library/`). On top of it: a tag or a digest is required (no implicit
    /// `latest`: a lookup of an image nobody named is a mistake), and a digest must be
    /// `sha256:` with 64 hex digits.
    ///
    /// Our own parser rather than `oci-spec`'s: that one matches one regular expression
    /// whose Unicode `\w` builds a 5 MB automaton plus a multi-megabyte match cache per
    /// thread that uses it (heaptrack: about 19 MB of the controller's heap, whatever the
    /// number of hosted clusters). The grammar is small; a test compares both parsers.
    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        let err = |problem| ReferenceError {
            reference: s.to_string(),
            problem,
        };
        if s.is_empty() || s.chars().any(char::is_whitespace) {
            return Err(err("empty or contains white space"));
        }
        if !s.is_ascii() {
            return Err(err("not registry/repository:tag or @sha256:digest"));
        }
        let (rest, digest) = match s.split_once('@') {
            Some((r, d)) => (r, Some(d)),
            None => (s, None),
        };
        // A tag follows the last ':' after the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
            None => (rest, None),
        };
        if let Some(t) = tag
            && !valid_tag(t)
        {
            return Err(err("invalid tag"));
        }
        if let Some(d) = digest {
            let Some((algorithm, hex)) = d.split_once(':') else {
                return Err(err("digest must be sha256 followed by 64 hex digits"));
            };
            if algorithm != "sha256"
                || hex.len() != 64
                || !hex.bytes().all(|b| b.is_ascii_hexdigit())
            {
                return Err(err("digest must be sha256 followed by 64 hex digits"));
            }
        }
        if tag.is_none() && digest.is_none() {
            return Err(err("no tag or digest"));
        }
        if !valid_name(name) {
            return Err(err(if name.bytes().any(|b| b.is_ascii_uppercase()) {
                "repository name must be lower case"
            } else if name.is_empty() || name.contains("//") {
                "empty repository name"
            } else {
                "not registry/repository:tag or @sha256:digest"
            }));
        }
        let (registry, repository) = split_domain(name);
        if repository.len() > NAME_TOTAL_LENGTH_MAX {
            return Err(err("repository name longer than 255 characters"));
        }
        Ok(Self {
            registry,
            repository,
            tag: tag.map(str::to_string),
            digest: digest.map(str::to_string),
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

    /// Our parser against `oci-spec`'s regular expression on a corpus of valid and broken
    /// registries, repositories, tags and digests: the same accept/reject (ours also wants a
    /// tag or digest, and a sha256 digest) and the same parts.
    #[test]
    fn agrees_with_oci_spec() {
        let hex = |c: &str, n| c.repeat(n);
        let registries = [
            "",
            "quay.io/",
            "localhost/",
            "localhost:5000/",
            "127.0.0.1:5000/",
            "Quay.IO/",
            "a-b.c/",
            "-a.b/",
            "a..b/",
            "host:/",
            "host:12a/",
            "index.docker.io/",
            "docker.io/",
            "a.b_c/",
            "my-registry:443/",
        ];
        let repos = [
            "x", "x/y", "X/y", "a.b/c__d", "a---b", "a_-b", "a.", ".a", "a//b", "a__b", "a___b",
            "", "ab-", "a/b/c/d", "UPPER", "a.b.c", "1/2",
        ];
        let long_tag = format!(":{}", hex("a", 128));
        let too_long_tag = format!(":{}", hex("a", 129));
        let tags = [
            "",
            ":1",
            ":v4.18",
            ":",
            ":-x",
            ":_x",
            ":x.y-z",
            ":A_b",
            ":a/b",
            ":a:b",
            long_tag.as_str(),
            too_long_tag.as_str(),
        ];
        let sha = format!("@sha256:{}", hex("a", 64));
        let tiny = "@sha256:12".to_string();
        let sha512 = format!("@sha512:{}", hex("a", 128));
        let not_hex = format!("@sha256:{}", hex("g", 64));
        let upper_hex = format!("@sha256:{}", hex("A", 64));
        let digests = [
            "", &sha, &tiny, &sha512, &not_hex, &upper_hex, "@", "@sha256",
        ];
        let mut checked = 0;
        for r in registries {
            for p in repos {
                for t in tags {
                    for d in digests {
                        let s = format!("{r}{p}{t}{d}");
                        let ours = Reference::parse(&s);
                        let theirs = s.parse::<oci_spec::distribution::Reference>();
                        let want = theirs.as_ref().ok().filter(|th| {
                            (!t.is_empty() || !d.is_empty())
                                && th.digest().is_none_or(|dg| {
                                    dg.strip_prefix("sha256:").is_some_and(|h| {
                                        h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())
                                    })
                                })
                        });
                        match (&ours, want) {
                            (Ok(o), Some(th)) => {
                                assert_eq!(o.registry, th.registry(), "{s}");
                                assert_eq!(o.repository, th.repository(), "{s}");
                                assert_eq!(o.digest.as_deref(), th.digest(), "{s}");
                                if !t.is_empty() {
                                    assert_eq!(o.tag.as_deref(), th.tag(), "{s}");
                                }
                            }
                            (Err(_), None) => {}
                            _ => panic!("{s:?}: ours {ours:?}, oci-spec {theirs:?}"),
                        }
                        checked += 1;
                    }
                }
            }
        }
        assert_eq!(checked, 15 * 17 * 12 * 8);
    }
}
