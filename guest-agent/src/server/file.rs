//! The `hcp-olm-dns` config file (TOML or YAML, chosen by extension).
//!
//! ```yaml
//! listen: 127.0.0.1:5353      # UDP and TCP; overridden by --listen
//! admin: 127.0.0.1:9153       # /healthz /readyz /metrics; overridden by --admin
//! drain_timeout_ms: 10000
//! dns:
//!   cluster_domain: cluster.local
//!   upstreams: { local: ["10.96.0.10:53"], guest: ["172.31.0.10:53"] }
//!   rules:
//!     - { suffix: svc.cluster.local, owner: guest }
//!     - { suffix: svc.cluster.local, namespace: clusters-hc1, owner: local }
//!     - { suffix: ".", owner: local }
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::dns::{ConfigError, DnsConfigSpec, EngineConfig};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub listen: Option<String>,
    #[serde(default)]
    pub admin: Option<String>,
    #[serde(default)]
    pub drain_timeout_ms: Option<u64>,
    pub dns: DnsConfigSpec,
}

/// Validated process configuration.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub drain_timeout: Duration,
    pub engine: EngineConfig,
}

fn addr(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse()
        .map_err(|_| ConfigError::new(field, format!("`{s}` is not an IP:port")))
}

impl FileConfig {
    /// Parse TOML (`.toml`) or YAML (`.yaml`/`.yml`) text.
    pub fn parse(path_for_format: &Path, text: &str) -> Result<Self, ConfigError> {
        let ext = path_for_format
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        match ext.as_str() {
            "toml" => toml::from_str(text).map_err(|e| {
                let field = e
                    .span()
                    .map(|s| format!("line-offset {}..{}", s.start, s.end))
                    .unwrap_or_else(|| "<file>".into());
                ConfigError::new(field, e.message().to_string())
            }),
            "yaml" | "yml" => serde_yaml_ng::from_str(text).map_err(|e| {
                let field = e
                    .location()
                    .map(|l| format!("line {} column {}", l.line(), l.column()))
                    .unwrap_or_else(|| "<file>".into());
                ConfigError::new(field, e.to_string())
            }),
            _ => Err(ConfigError::new(
                "--config",
                "file name must end in .toml, .yaml or .yml",
            )),
        }
    }

    /// Validate, applying command-line overrides.
    pub fn validate(
        &self,
        listen_override: Option<SocketAddr>,
        admin_override: Option<SocketAddr>,
    ) -> Result<ServerConfig, ConfigError> {
        let listen = match (listen_override, &self.listen) {
            (Some(a), _) => a,
            (None, Some(s)) => addr("listen", s)?,
            (None, None) => {
                return Err(ConfigError::new(
                    "listen",
                    "required (in the file or as --listen)",
                ));
            }
        };
        let admin = match (admin_override, &self.admin) {
            (Some(a), _) => Some(a),
            (None, Some(s)) => Some(addr("admin", s)?),
            (None, None) => None,
        };
        let drain_ms = self.drain_timeout_ms.unwrap_or(10_000);
        if drain_ms == 0 || drain_ms > 600_000 {
            return Err(ConfigError::new(
                "drain_timeout_ms",
                "must be between 1 and 600000",
            ));
        }
        let engine = self.dns.validate().map_err(|e| ConfigError {
            field: format!("dns.{}", e.field),
            reason: e.reason,
        })?;
        Ok(ServerConfig {
            listen,
            admin,
            drain_timeout: Duration::from_millis(drain_ms),
            engine,
        })
    }
}

/// Read, parse and validate a config file.
pub fn load(
    path: &Path,
    listen_override: Option<SocketAddr>,
    admin_override: Option<SocketAddr>,
) -> Result<ServerConfig, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::new("--config", format!("{}: {e}", path.display())))?;
    FileConfig::parse(path, &text)?.validate(listen_override, admin_override)
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
listen: 127.0.0.1:5353
admin: 127.0.0.1:9153
dns:
  cluster_domain: cluster.local
  upstreams: { local: ["127.0.0.1:1053"], guest: ["127.0.0.1:2053"] }
  rules:
    - { suffix: svc.cluster.local, owner: guest }
    - { suffix: ".", owner: local }
"#;

    const TOML: &str = r#"
listen = "127.0.0.1:5353"
[dns]
cluster_domain = "cluster.local"
[dns.upstreams]
local = ["127.0.0.1:1053"]
guest = ["127.0.0.1:2053"]
[[dns.rules]]
suffix = "svc.cluster.local"
owner = "guest"
[[dns.rules]]
suffix = "svc.cluster.local"
namespace = "clusters-hc1"
owner = "local"
[dns.limits]
client_timer_ms = 1800
"#;

    #[test]
    fn yaml_and_toml_parse() {
        let c = FileConfig::parse(Path::new("a.yaml"), YAML)
            .unwrap()
            .validate(None, None)
            .unwrap();
        assert_eq!(c.listen.port(), 5353);
        assert_eq!(c.admin.unwrap().port(), 9153);
        let c = FileConfig::parse(Path::new("a.toml"), TOML)
            .unwrap()
            .validate(Some("127.0.0.1:7".parse().unwrap()), None)
            .unwrap();
        assert_eq!(c.listen.port(), 7);
        assert_eq!(c.engine.table.rules().len(), 2);
        assert!(c.admin.is_none());
    }

    #[test]
    fn errors_name_fields() {
        let e = FileConfig::parse(Path::new("a.yaml"), &YAML.replace("127.0.0.1:2053", "x"))
            .unwrap()
            .validate(None, None)
            .unwrap_err();
        assert_eq!(e.field, "dns.upstreams.guest[0]");
        let e = FileConfig::parse(
            Path::new("a.yaml"),
            &YAML.replace("listen: 127.0.0.1:5353", "listen: nope"),
        )
        .unwrap()
        .validate(None, None)
        .unwrap_err();
        assert_eq!(e.field, "listen");
        let e = FileConfig::parse(
            Path::new("a.yaml"),
            &YAML.replace("owner: guest", "owner: guset"),
        )
        .unwrap_err();
        assert!(e.reason.contains("guset"), "{e}");
        let e = FileConfig::parse(Path::new("a.yaml"), &format!("{YAML}bogus: 1\n")).unwrap_err();
        assert!(e.reason.contains("bogus"), "{e}");
        let e = FileConfig::parse(Path::new("a.toml"), "listen = 1").unwrap_err();
        assert!(
            e.reason.contains("dns") || e.reason.contains("invalid type"),
            "{e}"
        );
        let e = FileConfig::parse(Path::new("a.json"), "{}").unwrap_err();
        assert_eq!(e.field, "--config");
    }
}
