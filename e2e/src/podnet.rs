//! A cluster's pod network, built from network namespaces: one router namespace (the "node")
//! and one namespace per pod, routed like a layer-3 CNI (a /32 per pod over its own veth).
//! The router also plays kube-proxy (nftables DNAT from Service IP:port to pod IP:port) and
//! cluster DNS (dnsmasq answering `<svc>.<ns>.svc.cluster.local`).
//!
//! Nothing changes in the caller's own network namespace: the test process reaches pods by
//! creating sockets inside their namespaces, and pods reach the test's loopback API servers
//! through forwarders the test runs ([`PodNetwork::forward_to_host`]).
//!
//! Two networks can be linked as two sites ([`link`]): one side may dial the other's node
//! address (for NodePort Services), masqueraded as a NAT would, and nothing else routes.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use crate::netns::{self, Netns, NetnsError, unique_name};
use crate::process::ManagedProcess;

/// Errors building or changing a pod network.
#[derive(Debug, thiserror::Error)]
pub enum PodNetError {
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    #[error("pod network {network} is full")]
    Full { network: String },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PodNetError {
    let what = what.into();
    move |source| PodNetError::Io { what, source }
}

/// A Service as the router should serve it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntry {
    pub namespace: String,
    pub name: String,
    /// The ClusterIP (None for a name-only entry such as an ExternalName target).
    pub cluster_ip: Option<Ipv4Addr>,
    pub ports: Vec<ServicePort>,
}

/// One Service port and where it goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePort {
    pub protocol: Protocol,
    pub port: u16,
    /// NodePort on the router's node address, if any.
    pub node_port: Option<u16>,
    /// Ready endpoints: pod IP and target port.
    pub endpoints: Vec<(Ipv4Addr, u16)>,
}

/// L4 protocol of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Tcp,
    Udp,
}

impl Protocol {
    fn nft(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        }
    }
}

/// A pod network: a router namespace plus pod namespaces.
#[derive(Debug)]
pub struct PodNetwork {
    name: String,
    router: Netns,
    /// `a.b.c.0/24` of the pods; the router is `.1`.
    prefix: [u8; 3],
    domain: String,
    next_host: Mutex<u8>,
    dir: tempfile::TempDir,
    dns: Mutex<Option<ManagedProcess>>,
    forwarders: Mutex<Vec<tokio::task::JoinHandle<()>>>,
    node_address: Mutex<Option<Ipv4Addr>>,
}

/// A pod's place in the network.
#[derive(Debug)]
pub struct PodNet {
    pub netns: Netns,
    pub ip: Ipv4Addr,
}

fn sh(ns: &Netns, program: &str, args: &[&str]) -> Result<String, PodNetError> {
    let out = ns.output(program, args).map_err(PodNetError::Netns)?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(PodNetError::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

impl PodNetwork {
    /// Creates a network whose pods get addresses from `prefix.0/24` (from 198.18.0.0/15),
    /// with DNS for `domain` (normally `cluster.local`).
    pub async fn create(name: &str, prefix: [u8; 3], domain: &str) -> Result<Self, PodNetError> {
        let router = Netns::create(&format!("rt{}", &name[..name.len().min(3)]))?;
        sh(&router, "sysctl", &["-qw", "net.ipv4.ip_forward=1"])?;
        let gw = format!("{}.{}.{}.1", prefix[0], prefix[1], prefix[2]);
        router.ip(&["addr", "add", &format!("{gw}/32"), "dev", "lo"])?;
        // the router's own connections to Service IPs need a route for the lookup that comes
        // before DNAT; after DNAT they are re-routed to the pod
        router.ip(&["route", "add", "default", "dev", "lo"])?;
        let dir = tempfile::Builder::new()
            .prefix(&format!("hcp-olm-podnet-{name}-"))
            .tempdir()
            .map_err(io("creating the network's directory"))?;
        let net = Self {
            name: name.to_string(),
            router,
            prefix,
            domain: domain.to_string(),
            next_host: Mutex::new(2),
            dir,
            dns: Mutex::new(None),
            forwarders: Mutex::new(Vec::new()),
            node_address: Mutex::new(None),
        };
        net.write_hosts(&[])?;
        net.start_dns()?;
        net.apply_nft(&[])?;
        Ok(net)
    }

    /// The network's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The router namespace (where DNS, Service rules and forwarders live).
    pub fn router(&self) -> &Netns {
        &self.router
    }

    /// The router's address on the pod network: pods' gateway and DNS server.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::new(self.prefix[0], self.prefix[1], self.prefix[2], 1)
    }

    /// The node's address for NodePorts (set by [`link`]); the gateway otherwise.
    pub fn node_address(&self) -> Ipv4Addr {
        self.node_address
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .unwrap_or_else(|| self.gateway())
    }

    fn hosts_file(&self) -> PathBuf {
        self.dir.path().join("services.hosts")
    }

    fn write_hosts(&self, services: &[ServiceEntry]) -> Result<(), PodNetError> {
        let mut text = String::new();
        for s in services {
            // A headless Service (no ClusterIP) names its endpoints' addresses.
            let mut ips: Vec<Ipv4Addr> = match s.cluster_ip {
                Some(ip) => vec![ip],
                None => s
                    .ports
                    .iter()
                    .flat_map(|p| p.endpoints.iter().map(|(ip, _)| *ip))
                    .collect(),
            };
            ips.sort_unstable();
            ips.dedup();
            for ip in ips {
                text.push_str(&format!(
                    "{ip}\t{n}.{ns}.svc.{d}\n",
                    n = s.name,
                    ns = s.namespace,
                    d = self.domain
                ));
            }
        }
        std::fs::write(self.hosts_file(), text).map_err(io("writing the Service hosts file"))
    }

    fn start_dns(&self) -> Result<(), PodNetError> {
        let gw = self.gateway().to_string();
        let mut cmd = self.router.command("dnsmasq");
        cmd.args([
            "--no-daemon",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--pid-file=",
        ])
        .arg(format!("--listen-address={gw}"))
        .arg(format!("--local=/{}/", self.domain))
        .arg(format!("--addn-hosts={}", self.hosts_file().display()));
        let p = self.router.spawn("dns", cmd)?;
        *self.dns.lock().unwrap_or_else(|p| p.into_inner()) = Some(p);
        Ok(())
    }

    /// Adds a pod namespace with the next free address, a default route via the router and a
    /// `resolv.conf` with the Kubernetes search path of `namespace`.
    pub fn add_pod(&self, prefix: &str, namespace: &str) -> Result<PodNet, PodNetError> {
        let host = {
            let mut next = self.next_host.lock().unwrap_or_else(|p| p.into_inner());
            if *next == 255 {
                return Err(PodNetError::Full {
                    network: self.name.clone(),
                });
            }
            let h = *next;
            *next += 1;
            h
        };
        let ip = Ipv4Addr::new(self.prefix[0], self.prefix[1], self.prefix[2], host);
        let ns = Netns::create(prefix)?;
        let r_if = unique_name("pr");
        let p_if = unique_name("pp");
        netns::run_ip(&[
            "link",
            "add",
            &r_if,
            "netns",
            self.router.name(),
            "type",
            "veth",
            "peer",
            "name",
            &p_if,
            "netns",
            ns.name(),
        ])?;
        let gw = self.gateway().to_string();
        self.router
            .ip(&["addr", "add", &format!("{gw}/32"), "dev", &r_if])?;
        self.router.ip(&["link", "set", &r_if, "up"])?;
        self.router
            .ip(&["route", "add", &format!("{ip}/32"), "dev", &r_if])?;
        ns.ip(&["addr", "add", &format!("{ip}/32"), "dev", &p_if])?;
        ns.ip(&["link", "set", &p_if, "up"])?;
        ns.ip(&["route", "add", &gw, "dev", &p_if])?;
        ns.ip(&["route", "add", "default", "via", &gw])?;
        ns.set_resolv_conf(&format!(
            "nameserver {gw}\nsearch {namespace}.svc.{d} svc.{d} {d}\noptions ndots:5\n",
            d = self.domain
        ))?;
        Ok(PodNet { netns: ns, ip })
    }

    /// Replaces the Service table: DNS records and DNAT rules (ClusterIP and NodePort).
    pub fn set_services(&self, services: &[ServiceEntry]) -> Result<(), PodNetError> {
        self.write_hosts(services)?;
        if let Some(p) = self.dns.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            // dnsmasq re-reads --addn-hosts on SIGHUP
            let _ = std::process::Command::new("kill")
                .args(["-HUP", &p.pid().to_string()])
                .status();
        }
        self.apply_nft(services)?;
        self.flush_udp_conntrack(services);
        Ok(())
    }

    /// What kube-proxy does when UDP endpoints change: delete the conntrack entries of the
    /// Services' UDP ports, so a client that kept sending (a WireGuard peer retrying its
    /// handshake) is NAT-ed by the new rules instead of riding a stale entry — one created
    /// before the Service had endpoints stays forever while packets keep coming.
    fn flush_udp_conntrack(&self, services: &[ServiceEntry]) {
        let mut ports: Vec<u16> = services
            .iter()
            .flat_map(|s| &s.ports)
            .filter(|p| p.protocol == Protocol::Udp)
            .flat_map(|p| std::iter::once(p.port).chain(p.node_port))
            .collect();
        ports.sort_unstable();
        ports.dedup();
        for port in ports {
            // exit status 1 means "no entry matched"
            let _ = self.router.output(
                "conntrack",
                &["-D", "-p", "udp", "--orig-port-dst", &port.to_string()],
            );
        }
    }

    fn apply_nft(&self, services: &[ServiceEntry]) -> Result<(), PodNetError> {
        let rules = nft_ruleset(services, self.node_address());
        let path = self.dir.path().join("services.nft");
        std::fs::write(&path, rules).map_err(io("writing the nftables ruleset"))?;
        sh(
            &self.router,
            "nft",
            &["-f", path.to_str().unwrap_or_default()],
        )
        .map(|_| ())
    }

    /// Listens on `gateway():port` inside the network and forwards each connection to
    /// `target` in the caller's network namespace (how pods reach the test's API servers).
    pub async fn forward_to_host(&self, port: u16, target: SocketAddr) -> Result<(), PodNetError> {
        let listener = netns::bind_tcp_in(
            self.router.name(),
            SocketAddr::new(IpAddr::V4(self.gateway()), port),
        )
        .await
        .map_err(io(format!(
            "binding {}:{port} in {}",
            self.gateway(),
            self.name
        )))?;
        listener
            .set_nonblocking(true)
            .map_err(io("setting the forwarder non-blocking"))?;
        let listener =
            tokio::net::TcpListener::from_std(listener).map_err(io("registering the forwarder"))?;
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        self.forwarders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
        Ok(())
    }

    /// Listens on a free loopback port of the caller's namespace and forwards each connection
    /// into the network, to `target` (how the test's API servers reach pods). Returns the
    /// loopback address.
    pub async fn forward_from_host(&self, target: SocketAddr) -> Result<SocketAddr, PodNetError> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(io("binding a loopback forwarder"))?;
        let local = listener.local_addr().map_err(io("forwarder address"))?;
        let router = self.router.name().to_string();
        let task = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let router = router.clone();
                tokio::spawn(async move {
                    let Ok(s) =
                        netns::connect_tcp_in(&router, target, Duration::from_secs(5)).await
                    else {
                        return;
                    };
                    if s.set_nonblocking(true).is_err() {
                        return;
                    }
                    if let Ok(mut outbound) = tokio::net::TcpStream::from_std(s) {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        self.forwarders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(task);
        Ok(local)
    }
}

impl Drop for PodNetwork {
    fn drop(&mut self) {
        for t in self
            .forwarders
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            t.abort();
        }
        // the router namespace kills dnsmasq and deletes itself when dropped
    }
}

/// Links two networks as two sites: `client` may dial `server`'s node address (NodePorts), its
/// traffic masqueraded to `client`'s node address as a NAT would; `server` has no route into
/// `client`'s pods. Addresses: a /30 from `link_prefix` (`x.y.z.0`).
pub fn link(
    client: &PodNetwork,
    server: &PodNetwork,
    link_prefix: [u8; 3],
) -> Result<(), PodNetError> {
    let [a, b, c] = link_prefix;
    let client_addr = Ipv4Addr::new(a, b, c, 2);
    let server_addr = Ipv4Addr::new(a, b, c, 1);
    let (c_if, _s_if) = netns::connect(
        &client.router,
        &format!("{client_addr}/30"),
        &server.router,
        &format!("{server_addr}/30"),
    )?;
    *server
        .node_address
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(server_addr);
    *client
        .node_address
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(client_addr);
    let path = client.dir.path().join("nat.nft");
    std::fs::write(
        &path,
        format!(
            "table ip hcpolm_nat {{\n  chain post {{\n    type nat hook postrouting priority srcnat; policy accept;\n    oifname \"{c_if}\" masquerade\n  }}\n}}\n"
        ),
    )
    .map_err(io("writing the NAT ruleset"))?;
    sh(
        &client.router,
        "nft",
        &["-f", path.to_str().unwrap_or_default()],
    )?;
    Ok(())
}

/// The router's nftables ruleset for `services` (pure, for tests): DNAT from ClusterIP:port
/// (and node address:NodePort) to the endpoints, spread by `numgen`, and masquerade of
/// DNAT-ed traffic so hairpin connections (a pod to its own Service) return through the router.
pub fn nft_ruleset(services: &[ServiceEntry], node: Ipv4Addr) -> String {
    let mut rules = Vec::new();
    for s in services {
        for p in &s.ports {
            if p.endpoints.is_empty() {
                continue;
            }
            let target = if p.endpoints.len() == 1 {
                let (ip, port) = p.endpoints[0];
                format!("dnat to {ip}:{port}")
            } else {
                let map: Vec<String> = p
                    .endpoints
                    .iter()
                    .enumerate()
                    .map(|(i, (ip, port))| format!("{i} : {ip} . {port}"))
                    .collect();
                format!(
                    "dnat ip to numgen random mod {} map {{ {} }}",
                    p.endpoints.len(),
                    map.join(", ")
                )
            };
            let proto = p.protocol.nft();
            if let Some(ip) = s.cluster_ip {
                rules.push(format!(
                    "    ip daddr {ip} {proto} dport {} {target}",
                    p.port
                ));
            }
            if let Some(np) = p.node_port {
                rules.push(format!("    ip daddr {node} {proto} dport {np} {target}"));
            }
        }
    }
    let rules = rules.join("\n");
    let mut by_chain = BTreeMap::new();
    by_chain.insert("pre", ("prerouting", "-100"));
    by_chain.insert("out", ("output", "-100"));
    let mut text =
        String::from("table ip hcpolm_svc\ndelete table ip hcpolm_svc\ntable ip hcpolm_svc {\n");
    for (chain, (hook, prio)) in by_chain {
        text.push_str(&format!(
            "  chain {chain} {{\n    type nat hook {hook} priority {prio}; policy accept;\n{rules}\n  }}\n"
        ));
    }
    text.push_str(
        "  chain post {\n    type nat hook postrouting priority 100; policy accept;\n    ct status dnat masquerade\n  }\n}\n",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ruleset_maps_cluster_ips_and_node_ports() {
        let svc = ServiceEntry {
            namespace: "hcp".into(),
            name: "packageserver".into(),
            cluster_ip: Some(Ipv4Addr::new(198, 19, 16, 10)),
            ports: vec![
                ServicePort {
                    protocol: Protocol::Tcp,
                    port: 443,
                    node_port: None,
                    endpoints: vec![(Ipv4Addr::new(198, 18, 16, 5), 5443)],
                },
                ServicePort {
                    protocol: Protocol::Udp,
                    port: 51820,
                    node_port: Some(30820),
                    endpoints: vec![
                        (Ipv4Addr::new(198, 18, 16, 6), 51820),
                        (Ipv4Addr::new(198, 18, 16, 7), 51820),
                    ],
                },
                ServicePort {
                    protocol: Protocol::Tcp,
                    port: 80,
                    node_port: None,
                    endpoints: vec![],
                },
            ],
        };
        let text = nft_ruleset(&[svc], Ipv4Addr::new(198, 18, 250, 1));
        assert!(text.contains("ip daddr 198.19.16.10 tcp dport 443 dnat to 198.18.16.5:5443"));
        assert!(text.contains(
            "ip daddr 198.18.250.1 udp dport 30820 dnat ip to numgen random mod 2 map { 0 : 198.18.16.6 . 51820, 1 : 198.18.16.7 . 51820 }"
        ));
        assert!(!text.contains("dport 80"), "no endpoints, no rule");
        assert_eq!(
            text.matches("dnat to 198.18.16.5:5443").count(),
            2,
            "prerouting and output"
        );
    }
}

/// Service routing for processes of the caller's own network namespace that belong to the
/// management network (the hosted kube-apiserver, whose aggregator dials the packageserver
/// Service): connections to `ip:port` are DNAT-ed to a loopback forwarder into `net`, which
/// dials the target there (a ClusterIP the router maps to its pods). The rules live in their
/// own nftables table and /32 routes on `lo`, removed on drop.
#[derive(Debug)]
pub struct HostNat {
    table: String,
    routes: Vec<Ipv4Addr>,
}

impl HostNat {
    /// Installs the rules: each `(ip, port, target)` sends `ip:port` to `target` inside `net`.
    pub async fn create(
        net: &PodNetwork,
        rules: &[(Ipv4Addr, u16, SocketAddr)],
    ) -> Result<Self, PodNetError> {
        let table = unique_name("hcpolm_host");
        let mut lines = Vec::new();
        let mut routes = Vec::new();
        for (ip, port, target) in rules {
            let local = net.forward_from_host(*target).await?;
            lines.push(format!(
                "    ip daddr {ip} tcp dport {port} dnat to {}:{}",
                local.ip(),
                local.port()
            ));
            if !routes.contains(ip) {
                routes.push(*ip);
            }
        }
        let text = format!(
            "table ip {table} {{\n  chain out {{\n    type nat hook output priority -100; policy accept;\n{}\n  }}\n}}\n",
            lines.join("\n")
        );
        let path = net.dir.path().join(format!("{table}.nft"));
        std::fs::write(&path, text).map_err(io("writing the host NAT ruleset"))?;
        let nat = Self {
            table,
            routes: Vec::new(),
        };
        run_host("nft", &["-f", path.to_str().unwrap_or_default()])?;
        let mut nat = nat;
        for ip in routes {
            run_host(
                "ip",
                &["route", "replace", &format!("{ip}/32"), "dev", "lo"],
            )?;
            nat.routes.push(ip);
        }
        Ok(nat)
    }
}

impl Drop for HostNat {
    fn drop(&mut self) {
        for ip in &self.routes {
            let _ = run_host("ip", &["route", "del", &format!("{ip}/32"), "dev", "lo"]);
        }
        let _ = run_host("nft", &["delete", "table", "ip", &self.table]);
    }
}

fn run_host(program: &str, args: &[&str]) -> Result<(), PodNetError> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(io(format!("running {program}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(PodNetError::Command {
            command: format!("{program} {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}
