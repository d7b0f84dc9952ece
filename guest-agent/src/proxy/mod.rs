//! Proxy protocols of the gateway (no I/O): the HTTP CONNECT request parser, the SOCKS5
//! greeting/request parsers, and target policy (which names may cross the tunnel).

pub mod http;
pub mod policy;
pub mod socks;

use std::net::IpAddr;

/// Where a client wants to go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    Name(String),
    Ip(IpAddr),
}

/// A proxy target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub host: Host,
    pub port: u16,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.host {
            Host::Name(n) => write!(f, "{n}:{}", self.port),
            Host::Ip(IpAddr::V6(a)) => write!(f, "[{a}]:{}", self.port),
            Host::Ip(a) => write!(f, "{a}:{}", self.port),
        }
    }
}

/// Parses `host:port`, `[v6]:port` or `v4:port` (a CONNECT authority).
pub fn parse_authority(s: &str) -> Option<Target> {
    if let Some(rest) = s.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        let ip: std::net::Ipv6Addr = h.parse().ok()?;
        let port = parse_port(p)?;
        return Some(Target {
            host: Host::Ip(IpAddr::V6(ip)),
            port,
        });
    }
    let (h, p) = s.rsplit_once(':')?;
    let port = parse_port(p)?;
    if let Ok(ip) = h.parse::<std::net::Ipv4Addr>() {
        return Some(Target {
            host: Host::Ip(IpAddr::V4(ip)),
            port,
        });
    }
    let name = valid_name(h)?;
    Some(Target {
        host: Host::Name(name),
        port,
    })
}

fn parse_port(p: &str) -> Option<u16> {
    if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    p.parse().ok().filter(|&p| p != 0)
}

/// A DNS host name (LDH labels, ≤ 253 characters), lower-cased, without a trailing dot.
pub fn valid_name(h: &str) -> Option<String> {
    let h = h.strip_suffix('.').unwrap_or(h);
    if h.is_empty() || h.len() > 253 {
        return None;
    }
    for l in h.split('.') {
        if l.is_empty()
            || l.len() > 63
            || l.starts_with('-')
            || l.ends_with('-')
            || !l
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return None;
        }
    }
    Some(h.to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        assert_eq!(
            parse_authority("Cat.NS.svc.cluster.local:50051")
                .unwrap()
                .to_string(),
            "cat.ns.svc.cluster.local:50051"
        );
        assert_eq!(
            parse_authority("[fd00::1]:443").unwrap().host,
            Host::Ip("fd00::1".parse().unwrap())
        );
        assert_eq!(
            parse_authority("198.18.0.1:80").unwrap().host,
            Host::Ip("198.18.0.1".parse().unwrap())
        );
        for bad in [
            "x", "x:", "x:0", "x:65536", ":80", "a..b:1", "-a:1", "a b:1", "[::1:80", "x:+1",
        ] {
            assert_eq!(parse_authority(bad), None, "{bad}");
        }
    }
}
