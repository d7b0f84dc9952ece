//! Split-DNS configuration: the file format (serde) and its validation into typed values.
//!
//! Every validation error names the offending field so that a binary can exit 64 with a
//! message an operator can act on.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::rr::Name;
use serde::Deserialize;

use super::table::{Owner, OwnershipTable, Rule};

/// A configuration error: the field path and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[error("config field `{field}`: {reason}")]
pub struct ConfigError {
    /// Dotted path of the offending field, e.g. `rules[2].suffix`.
    pub field: String,
    /// Human readable reason.
    pub reason: String,
}

impl ConfigError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Owner named in the config file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OwnerSpec {
    /// Management-side DNS (the HCP namespace and the management cluster).
    Local,
    /// The guest cluster's DNS, across the tunnel.
    Guest,
    /// Answer REFUSED.
    Refuse,
}

/// One ownership rule as written in the config file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    /// Name suffix, e.g. `svc.cluster.local` or `.` for everything.
    pub suffix: String,
    /// Optional namespace label: the rule then covers `*.<namespace>.<suffix>`.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Who answers names under this rule.
    pub owner: OwnerSpec,
}

/// Upstream servers per owner.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamsSpec {
    /// Management-side resolvers.
    #[serde(default)]
    pub local: Vec<String>,
    /// Guest-side resolvers (reached over the tunnel).
    #[serde(default)]
    pub guest: Vec<String>,
}

/// Cache settings (seconds).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheSpec {
    pub max_entries: usize,
    pub min_ttl: u32,
    pub max_ttl: u32,
    pub max_negative_ttl: u32,
    /// How long past expiry a record may still be served stale (RFC 8767 suggests 1-3 days).
    pub max_stale: u64,
    /// How long a resolution failure (all owner upstreams failed) is remembered (RFC 9520).
    pub failure_ttl: u64,
}

impl Default for CacheSpec {
    fn default() -> Self {
        Self {
            max_entries: 10_000,
            min_ttl: 0,
            max_ttl: 3600,
            max_negative_ttl: 1800,
            max_stale: 86_400,
            failure_ttl: 5,
        }
    }
}

/// Timing and concurrency settings (milliseconds where named `_ms`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSpec {
    /// Per-attempt upstream timeout.
    pub upstream_timeout_ms: u64,
    /// RFC 8767 client response timer: after this, a stale answer is sent if one exists.
    pub client_timer_ms: u64,
    /// Upstream marked down after this many consecutive failures.
    pub upstream_fail_threshold: u32,
    /// While down, one probe query is let through this often; other queries fail fast.
    pub upstream_recheck_ms: u64,
    /// Maximum queries being forwarded at once.
    pub max_in_flight: usize,
    /// Maximum concurrent TCP client connections.
    pub max_tcp_connections: usize,
    /// TCP client idle timeout.
    pub tcp_idle_timeout_ms: u64,
    /// EDNS UDP payload size advertised and honoured (RFC 6891, DNS flag day 2020).
    pub edns_udp_size: u16,
}

impl Default for LimitsSpec {
    fn default() -> Self {
        Self {
            upstream_timeout_ms: 1500,
            client_timer_ms: 1800,
            upstream_fail_threshold: 2,
            upstream_recheck_ms: 5000,
            max_in_flight: 1024,
            max_tcp_connections: 256,
            tcp_idle_timeout_ms: 10_000,
            edns_udp_size: 1232,
        }
    }
}

/// Who may query the server, and how fast (listeners only; in-process lookups are not
/// subject to it).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientsSpec {
    /// Source CIDRs answered; every query from elsewhere gets REFUSED, whatever the name,
    /// so the server is never an open resolver. Default: loopback and private ranges
    /// (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7).
    pub allowed: Option<Vec<String>>,
    /// Queries per second one client address may send (token bucket); more are dropped.
    pub rate_limit_qps: u32,
    /// Bucket size: queries one client may send at once.
    pub rate_limit_burst: u32,
}

impl Default for ClientsSpec {
    fn default() -> Self {
        Self {
            allowed: None,
            rate_limit_qps: 200,
            rate_limit_burst: 400,
        }
    }
}

/// Client ranges allowed when `clients.allowed` is not set.
pub const DEFAULT_ALLOWED_CLIENTS: [&str; 7] = [
    "127.0.0.0/8",
    "::1/128",
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "fc00::/7",
];

/// Top-level DNS config (the `dns` part of an agent config, or a whole `hcp-olm-dns` file).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DnsConfigSpec {
    /// Cluster domain shared by both sides (`cluster.local`); enables search-path shortcuts.
    #[serde(default)]
    pub cluster_domain: Option<String>,
    /// Answer provably non-existent Kubernetes search-path expansions with NXDOMAIN locally.
    #[serde(default = "default_true")]
    pub synthesize_search_nxdomain: bool,
    pub upstreams: UpstreamsSpec,
    pub rules: Vec<RuleSpec>,
    #[serde(default)]
    pub cache: CacheSpec,
    #[serde(default)]
    pub limits: LimitsSpec,
    #[serde(default)]
    pub clients: ClientsSpec,
}

fn default_true() -> bool {
    true
}

/// Validated engine configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub table: OwnershipTable,
    pub cluster_domain: Option<Name>,
    pub synthesize_search_nxdomain: bool,
    pub local_upstreams: Vec<SocketAddr>,
    pub guest_upstreams: Vec<SocketAddr>,
    pub cache: CacheSpec,
    pub max_stale: Duration,
    pub failure_ttl: Duration,
    pub upstream_timeout: Duration,
    pub client_timer: Duration,
    pub upstream_fail_threshold: u32,
    pub upstream_recheck: Duration,
    pub max_in_flight: usize,
    pub max_tcp_connections: usize,
    pub tcp_idle_timeout: Duration,
    pub edns_udp_size: u16,
    /// Client source ranges answered (others get REFUSED).
    pub allowed_clients: Vec<crate::tunnel::Cidr>,
    pub client_rate_qps: u32,
    pub client_rate_burst: u32,
}

pub(crate) fn parse_name(field: &str, s: &str) -> Result<Name, ConfigError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(ConfigError::new(field, "must not be empty"));
    }
    if s == "." {
        return Ok(Name::root());
    }
    let mut name = Name::from_ascii(s)
        .map_err(|e| ConfigError::new(field, format!("not a valid DNS name: {e}")))?;
    name.set_fqdn(true);
    Ok(name.to_lowercase())
}

fn parse_upstreams(field: &str, list: &[String]) -> Result<Vec<SocketAddr>, ConfigError> {
    list.iter()
        .enumerate()
        .map(|(i, s)| {
            let f = format!("{field}[{i}]");
            if let Ok(a) = s.parse::<SocketAddr>() {
                return Ok(a);
            }
            // Bare IP means port 53.
            s.parse::<std::net::IpAddr>()
                .map(|ip| SocketAddr::new(ip, 53))
                .map_err(|_| ConfigError::new(f, format!("`{s}` is not an IP or IP:port")))
        })
        .collect()
}

impl DnsConfigSpec {
    /// Validate into a typed engine config.
    pub fn validate(&self) -> Result<EngineConfig, ConfigError> {
        let local_upstreams = parse_upstreams("upstreams.local", &self.upstreams.local)?;
        let guest_upstreams = parse_upstreams("upstreams.guest", &self.upstreams.guest)?;
        if self.rules.is_empty() {
            return Err(ConfigError::new("rules", "at least one rule is required"));
        }
        let mut rules = Vec::with_capacity(self.rules.len());
        for (i, r) in self.rules.iter().enumerate() {
            let suffix = parse_name(&format!("rules[{i}].suffix"), &r.suffix)?;
            let namespace = match &r.namespace {
                None => None,
                Some(ns) => {
                    let f = format!("rules[{i}].namespace");
                    let ns = ns.trim();
                    let ok = !ns.is_empty()
                        && ns.len() <= 63
                        && ns
                            .bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !ns.starts_with('-')
                        && !ns.ends_with('-');
                    if !ok {
                        return Err(ConfigError::new(
                            f,
                            format!("`{ns}` is not a valid namespace (RFC 1123 label)"),
                        ));
                    }
                    Some(ns.to_string())
                }
            };
            let owner = match r.owner {
                OwnerSpec::Local => {
                    if local_upstreams.is_empty() {
                        return Err(ConfigError::new(
                            format!("rules[{i}].owner"),
                            "owner `local` needs at least one entry in upstreams.local",
                        ));
                    }
                    Owner::Local
                }
                OwnerSpec::Guest => {
                    if guest_upstreams.is_empty() {
                        return Err(ConfigError::new(
                            format!("rules[{i}].owner"),
                            "owner `guest` needs at least one entry in upstreams.guest",
                        ));
                    }
                    Owner::Guest
                }
                OwnerSpec::Refuse => Owner::Refuse,
            };
            rules.push(Rule {
                suffix,
                namespace,
                owner,
            });
        }
        let table = OwnershipTable::new(rules)
            .map_err(|(i, reason)| ConfigError::new(format!("rules[{i}]"), reason))?;
        let cluster_domain = match &self.cluster_domain {
            None => None,
            Some(d) => Some(parse_name("cluster_domain", d)?),
        };
        let c = &self.cache;
        if c.max_entries == 0 {
            return Err(ConfigError::new("cache.max_entries", "must be > 0"));
        }
        if c.min_ttl > c.max_ttl {
            return Err(ConfigError::new(
                "cache.min_ttl",
                "must be <= cache.max_ttl",
            ));
        }
        let l = &self.limits;
        for (field, v) in [
            ("limits.upstream_timeout_ms", l.upstream_timeout_ms),
            ("limits.client_timer_ms", l.client_timer_ms),
            ("limits.upstream_recheck_ms", l.upstream_recheck_ms),
            ("limits.tcp_idle_timeout_ms", l.tcp_idle_timeout_ms),
        ] {
            if v == 0 || v > 600_000 {
                return Err(ConfigError::new(field, "must be between 1 and 600000"));
            }
        }
        if l.upstream_fail_threshold == 0 {
            return Err(ConfigError::new(
                "limits.upstream_fail_threshold",
                "must be > 0",
            ));
        }
        if l.max_in_flight == 0 {
            return Err(ConfigError::new("limits.max_in_flight", "must be > 0"));
        }
        if l.max_tcp_connections == 0 {
            return Err(ConfigError::new(
                "limits.max_tcp_connections",
                "must be > 0",
            ));
        }
        if !(512..=4096).contains(&l.edns_udp_size) {
            return Err(ConfigError::new(
                "limits.edns_udp_size",
                "must be between 512 and 4096 (1232 recommended)",
            ));
        }
        let cl = &self.clients;
        let allowed_clients = match &cl.allowed {
            None => DEFAULT_ALLOWED_CLIENTS
                .iter()
                .filter_map(|c| c.parse().ok())
                .collect(),
            Some(list) => list
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    c.parse().map_err(|_| {
                        ConfigError::new(
                            format!("clients.allowed[{i}]"),
                            format!("`{c}` is not a CIDR"),
                        )
                    })
                })
                .collect::<Result<Vec<_>, _>>()?,
        };
        if cl.rate_limit_qps == 0 {
            return Err(ConfigError::new("clients.rate_limit_qps", "must be > 0"));
        }
        if cl.rate_limit_burst < cl.rate_limit_qps {
            return Err(ConfigError::new(
                "clients.rate_limit_burst",
                "must be >= clients.rate_limit_qps",
            ));
        }
        Ok(EngineConfig {
            allowed_clients,
            client_rate_qps: cl.rate_limit_qps,
            client_rate_burst: cl.rate_limit_burst,
            table,
            cluster_domain,
            synthesize_search_nxdomain: self.synthesize_search_nxdomain,
            local_upstreams,
            guest_upstreams,
            cache: c.clone(),
            max_stale: Duration::from_secs(c.max_stale),
            failure_ttl: Duration::from_secs(c.failure_ttl),
            upstream_timeout: Duration::from_millis(l.upstream_timeout_ms),
            client_timer: Duration::from_millis(l.client_timer_ms),
            upstream_fail_threshold: l.upstream_fail_threshold,
            upstream_recheck: Duration::from_millis(l.upstream_recheck_ms),
            max_in_flight: l.max_in_flight,
            max_tcp_connections: l.max_tcp_connections,
            tcp_idle_timeout: Duration::from_millis(l.tcp_idle_timeout_ms),
            edns_udp_size: l.edns_udp_size,
        })
    }
}

#[cfg(test)]
mod client_tests {
    use super::*;

    fn spec(clients: &str) -> Result<EngineConfig, ConfigError> {
        let y = format!(
            "upstreams: {{ local: [\"127.0.0.1\"] }}\nrules: [{{ suffix: \".\", owner: local }}]\nclients: {clients}\n"
        );
        serde_yaml_ng::from_str::<DnsConfigSpec>(&y)
            .unwrap()
            .validate()
    }

    #[test]
    fn client_ranges_default_private_and_errors_name_fields() {
        let c = spec("{}").unwrap();
        let ok = |ip: &str| {
            c.allowed_clients
                .iter()
                .any(|r| r.contains(ip.parse().unwrap()))
        };
        assert!(ok("127.0.0.1") && ok("10.1.2.3") && ok("fd00::1") && ok("100.64.0.9"));
        assert!(!ok("198.18.60.2") && !ok("8.8.8.8") && !ok("2001:db8::1"));
        assert_eq!((c.client_rate_qps, c.client_rate_burst), (200, 400));
        let c = spec("{ allowed: [\"198.18.0.0/15\"] }").unwrap();
        assert_eq!(c.allowed_clients.len(), 1);
        for (bad, field) in [
            ("{ allowed: [\"nope\"] }", "clients.allowed[0]"),
            ("{ rate_limit_qps: 0 }", "clients.rate_limit_qps"),
            (
                "{ rate_limit_qps: 10, rate_limit_burst: 5 }",
                "clients.rate_limit_burst",
            ),
        ] {
            assert_eq!(spec(bad).unwrap_err().field, field, "{bad}");
        }
    }
}
