//! Which proxy targets may cross the tunnel: the allowed-services table, matched on
//! Kubernetes Service names (`<name>.<ns>.svc[.<domain>]`).

use hcp_olm_tunnel_api::AllowedService;

/// `(service, namespace)` of a Service name `<svc>.<ns>.svc` or `<svc>.<ns>.svc.<domain>`
/// (lower-case, no trailing dot), else `None`.
pub fn service_of<'a>(name: &'a str, domain: &str) -> Option<(&'a str, &'a str)> {
    let rest = name
        .strip_suffix(domain)
        .and_then(|r| r.strip_suffix('.'))
        .unwrap_or(name);
    let rest = rest.strip_suffix(".svc")?;
    let (svc, ns) = rest.split_once('.')?;
    if svc.is_empty() || ns.is_empty() || ns.contains('.') {
        return None;
    }
    Some((svc, ns))
}

/// The fully qualified form of a Service name (`<svc>.<ns>.svc.<domain>`); other names are
/// returned unchanged.
pub fn qualify(name: &str, domain: &str) -> String {
    match service_of(name, domain) {
        Some((s, n)) => format!("{s}.{n}.svc.{domain}"),
        None => name.to_string(),
    }
}

/// Whether `svc.ns:port` is in the table (`*` matches any name or namespace).
pub fn service_allowed(list: &[AllowedService], svc: &str, ns: &str, port: u16) -> bool {
    list.iter().any(|a| {
        a.port == port
            && (a.namespace == "*" || a.namespace == ns)
            && (a.name == "*" || a.name == svc)
    })
}

/// Whether a resolved management-side address may be dialed: never loopback, unspecified,
/// link-local (cloud metadata endpoints live there), multicast or broadcast, whatever name
/// led to it.
pub fn local_address_allowed(ip: std::net::IpAddr) -> bool {
    use std::net::IpAddr;
    let ip = match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    match ip {
        IpAddr::V4(a) => {
            !(a.is_loopback()
                || a.is_unspecified()
                || a.is_link_local()
                || a.is_multicast()
                || a.is_broadcast())
        }
        IpAddr::V6(a) => {
            !(a.is_loopback()
                || a.is_unspecified()
                || a.is_unicast_link_local()
                || a.is_multicast())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(ns: &str, name: &str, port: u16) -> AllowedService {
        AllowedService {
            namespace: ns.into(),
            name: name.into(),
            port,
        }
    }

    #[test]
    fn names_and_table() {
        let d = "cluster.local";
        assert_eq!(
            service_of("cat.ns.svc.cluster.local", d),
            Some(("cat", "ns"))
        );
        assert_eq!(service_of("cat.ns.svc", d), Some(("cat", "ns")));
        assert_eq!(service_of("cat.ns.svc.other.local", d), None);
        assert_eq!(service_of("a.b.ns.svc.cluster.local", d), None);
        assert_eq!(service_of("example.com", d), None);
        assert_eq!(qualify("cat.ns.svc", d), "cat.ns.svc.cluster.local");
        let t = vec![a("*", "*", 50051), a("team", "db", 5432)];
        assert!(service_allowed(&t, "cat", "any", 50051));
        assert!(!service_allowed(&t, "cat", "any", 22));
        assert!(service_allowed(&t, "db", "team", 5432));
        assert!(!service_allowed(&t, "db", "other", 5432));
    }

    #[test]
    fn local_addresses() {
        for bad in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "::ffff:169.254.169.254",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(!local_address_allowed(bad.parse().unwrap()), "{bad}");
        }
        for good in ["10.0.0.5", "172.30.12.1", "fd00::10", "198.18.51.10"] {
            assert!(local_address_allowed(good.parse().unwrap()), "{good}");
        }
    }
}
