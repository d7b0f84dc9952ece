//! Registry credentials from a pull secret (`.dockerconfigjson`) and the token dance.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A user name and password for one registry. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// The `Authorization: Basic ...` value.
    pub fn basic(&self) -> String {
        format!(
            "Basic {}",
            STANDARD.encode(format!("{}:{}", self.username, self.password))
        )
    }
}

/// Credentials per registry host, from a pull secret.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullSecret {
    auths: BTreeMap<String, Credentials>,
}

/// A pull secret that cannot be used. The message never contains secret material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid pull secret: {0}")]
pub struct PullSecretError(pub String);

impl PullSecret {
    /// Parses `.dockerconfigjson` content: `{"auths": {"<host>": {"auth": base64(user:pass)}}}`
    /// (or `username`/`password` fields).
    pub fn parse(json: &[u8]) -> Result<Self, PullSecretError> {
        let v: serde_json::Value = serde_json::from_slice(json).map_err(|e| {
            PullSecretError(format!(
                "not JSON (line {}, column {})",
                e.line(),
                e.column()
            ))
        })?;
        let auths = v
            .get("auths")
            .and_then(|a| a.as_object())
            .ok_or_else(|| PullSecretError("no \"auths\" object".into()))?;
        let mut out = BTreeMap::new();
        for (host, entry) in auths {
            let s = |k: &str| entry.get(k).and_then(|x| x.as_str()).unwrap_or("");
            let creds = if !s("auth").is_empty() {
                let raw = STANDARD
                    .decode(s("auth"))
                    .map_err(|_| PullSecretError(format!("auths.{host}.auth is not base64")))?;
                let text = String::from_utf8(raw)
                    .map_err(|_| PullSecretError(format!("auths.{host}.auth is not UTF-8")))?;
                let (u, p) = text.split_once(':').ok_or_else(|| {
                    PullSecretError(format!("auths.{host}.auth is not user:password"))
                })?;
                Credentials {
                    username: u.to_string(),
                    password: p.to_string(),
                }
            } else if !s("username").is_empty() {
                Credentials {
                    username: s("username").to_string(),
                    password: s("password").to_string(),
                }
            } else {
                continue;
            };
            let host = host
                .trim_start_matches("https://")
                .trim_start_matches("http://")
                .trim_end_matches('/')
                .split('/')
                .next()
                .unwrap_or_default()
                .to_string();
            out.insert(host, creds);
        }
        Ok(Self { auths: out })
    }

    /// A hash of every credential (hosts, users, passwords): tells pull secrets apart in
    /// cache keys without holding or showing the secret.
    pub fn fingerprint(&self) -> String {
        use sha2::{Digest as _, Sha256};
        let mut h = Sha256::new();
        for (host, c) in &self.auths {
            for part in [host, &c.username, &c.password] {
                h.update((part.len() as u64).to_be_bytes());
                h.update(part.as_bytes());
            }
        }
        format!("{:x}", h.finalize())
    }

    /// Credentials for a registry host (Docker Hub is also known as `index.docker.io`).
    pub fn for_registry(&self, registry: &str) -> Option<&Credentials> {
        self.auths.get(registry).or_else(|| {
            (registry == "docker.io")
                .then(|| self.auths.get("index.docker.io"))
                .flatten()
        })
    }
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Challenge {
    /// `Basic realm=...`
    Basic,
    /// `Bearer realm=...,service=...,scope=...`
    Bearer {
        realm: String,
        service: Option<String>,
        scope: Option<String>,
    },
}

/// Parses a `WWW-Authenticate` header value.
pub fn parse_challenge(value: &str) -> Option<Challenge> {
    let (scheme, params) = value.trim().split_once(' ').unwrap_or((value.trim(), ""));
    if scheme.eq_ignore_ascii_case("basic") {
        return Some(Challenge::Basic);
    }
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let mut map = BTreeMap::new();
    let mut rest = params;
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=')?;
        let after = after.trim_start();
        let (val, next) = if let Some(q) = after.strip_prefix('"') {
            let end = q.find('"')?;
            (&q[..end], q[end + 1..].trim_start_matches([',', ' ']))
        } else {
            let end = after.find(',').unwrap_or(after.len());
            (&after[..end], after[end..].trim_start_matches([',', ' ']))
        };
        map.insert(key.trim().to_ascii_lowercase(), val.to_string());
        rest = next;
    }
    Some(Challenge::Bearer {
        realm: map.remove("realm")?,
        service: map.remove("service"),
        scope: map.remove("scope"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_secret_forms_and_errors() {
        let json = format!(
            r#"{{"auths":{{"quay.io":{{"auth":"{}"}},"https://registry.example:5000/v1/":{{"username":"u","password":"p"}},"empty":{{}}}}}}"#,
            STANDARD.encode("bot:s3cret")
        );
        let ps = PullSecret::parse(json.as_bytes()).unwrap();
        assert_eq!(ps.for_registry("quay.io").unwrap().username, "bot");
        assert_eq!(
            ps.for_registry("registry.example:5000").unwrap().password,
            "p"
        );
        assert!(ps.for_registry("empty").is_none());
        assert!(!format!("{ps:?}").contains("s3cret"));
        for (bad, word) in [
            ("nope", "JSON"),
            ("{}", "auths"),
            (r#"{"auths":{"x":{"auth":"!!"}}}"#, "base64"),
        ] {
            let e = PullSecret::parse(bad.as_bytes()).unwrap_err();
            assert!(e.to_string().contains(word), "{e}");
        }
    }

    #[test]
    fn challenges() {
        assert_eq!(
            parse_challenge(
                r#"Bearer realm="https://auth.example/token",service="registry",scope="repository:a/b:pull""#
            ),
            Some(Challenge::Bearer {
                realm: "https://auth.example/token".into(),
                service: Some("registry".into()),
                scope: Some("repository:a/b:pull".into()),
            })
        );
        assert_eq!(
            parse_challenge(r#"Basic realm="r""#),
            Some(Challenge::Basic)
        );
        assert_eq!(parse_challenge("Negotiate"), None);
        assert_eq!(parse_challenge(r#"Bearer service="x""#), None);
    }
}
