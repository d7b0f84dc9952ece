//! Real Kubernetes nodes for the test environment: containerd 2 with runc, the CNI bridge, the
//! kubelet and kube-proxy (nftables mode) of the pinned Kubernetes release, joined to a test
//! API server ([`Cluster`]).
//!
//! Each node is a site of its own, as kind runs each node in a container:
//! - its own **network namespace**, joined to the host by a veth pair ([`Site`]; addresses from
//!   198.19.200.0/22, pod CIDRs from 198.19.208.0/20). The host routes the node's pod CIDR to
//!   it, so pods reach host-side servers (API server, registry) without masquerading;
//! - its own **mount namespace**, in which the fixed host paths the kubelet, containerd and
//!   the CNI plugins use (`/run`, `/var/lib/{kubelet,containerd,cni}`, `/var/log/{pods,containers}`,
//!   `/etc/cni/net.d`, `/opt/cni/bin`) are the node's own directories, so several nodes and
//!   tests never share them and the host's are never touched;
//! - its own **cgroup subtree**, `/hcp-olm-<node's namespace>` in every cgroup hierarchy (v1, and the
//!   unified one of a hybrid host): the daemons run
//!   in `<root>/system`, the kubelet puts pods under `<root>/kubepods` (`cgroupRoot`). Teardown
//!   kills every process in the subtree by PID, waits for them, then removes the subtree.
//!
//! What this machine kind needs (cgroup v1, no CAP_SYS_RESOURCE) is set here and nowhere else:
//! the kubelet's `failCgroupV1: false`, the cgroupfs driver, `oomScoreAdj: 0`, no iptables
//! chains and no kernel-default changes; containerd's `restrict_oom_score_adj`.
//!
//! The pod sandbox image (our `pause`, `e2e/tools/pause`) is pulled by containerd from the
//! test's registry before the kubelet starts, as kind's node image carries it preloaded.
//!
//! NetworkPolicy is enforced only on a node started with [`NodeOptions::network_policies`]:
//! kube-router with only its firewall on (no routing, no service proxy), in the node's network
//! namespace, as its DaemonSet runs on a real node; its iptables rules and ipsets are the
//! node's alone. (sigs.k8s.io/kube-network-policies needs the nftables `queue` expression,
//! `CONFIG_NFT_QUEUE`, which the CI machines' kernels lack.)

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};

use crate::cluster::{Cluster, ClusterError};
use crate::netns::{self, Netns, NetnsError};
use crate::process::{self, ManagedProcess, ProcessError};
use crate::tools::{self, ToolError};

/// Errors setting up or running a real node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error(transparent)]
    Netns(#[from] NetnsError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Kube { what: String, source: kube::Error },
    #[error("node {node}: {problem}")]
    Setup { node: String, problem: String },
    #[error("node {node}: {component} {problem}; last log lines:\n{log}")]
    NotReady {
        node: String,
        component: String,
        problem: String,
        log: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> NodeError {
    let what = what.into();
    move |source| NodeError::Io { what, source }
}

/// The fixed host paths a node gets its own copy of (mount namespace), and the node-directory
/// name each is bound from.
const PRIVATE_PATHS: &[(&str, &str)] = &[
    ("/run", "run"),
    ("/var/lib/kubelet", "kubelet"),
    ("/var/lib/containerd", "containerd"),
    ("/var/lib/cni", "cni-state"),
    ("/var/log/pods", "log-pods"),
    ("/var/log/containers", "log-containers"),
    ("/etc/cni/net.d", "cni-conf"),
];

/// Where Debian's containernetworking-plugins package installs the CNI plugins.
const CNI_PLUGINS: &str = "/usr/lib/cni";

/// Every node's pod CIDR is in this range (kube-proxy's `--cluster-cidr`).
pub const POD_CIDRS: &str = "198.19.208.0/20";
/// Every node's IPv6 pod CIDR (`fd00:198:208:<slot>::/64`) is in this range.
const POD_CIDRS6: &str = "fd00:198:208::/48";

/// The address families of a [`Site`] (issue 19).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SiteStack {
    /// IPv4 only, as every site was before issue 19.
    Ipv4,
    /// IPv4 and IPv6: both on the veth to the host, a pod CIDR of each family, the node
    /// address of each family (IPv4 first).
    DualStack,
    /// An IPv6 node: its node address and pod CIDR are IPv6 only, so its pods have no IPv4.
    /// The veth to the host keeps its IPv4 pair for the node's own pulls from the test
    /// registry (whose image references are `IPv4:port`); nothing of Kubernetes uses it.
    Ipv6,
}

impl SiteStack {
    fn has_v4_pods(self) -> bool {
        self != SiteStack::Ipv6
    }

    fn has_v6(self) -> bool {
        self != SiteStack::Ipv4
    }
}

/// Binds ClusterRole `role` to `user` (idempotent).
async fn bind(cluster: &Cluster, name: &str, role: &str, user: &str) -> Result<(), NodeError> {
    let crb: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))
    .map_err(|e| NodeError::Setup {
        node: "-".into(),
        problem: format!("ClusterRoleBinding {name}: {e}"),
    })?;
    match Api::<ClusterRoleBinding>::all(cluster.client())
        .create(&PostParams::default(), &crb)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(source) => Err(NodeError::Kube {
            what: format!("binding {user} to {role}"),
            source,
        }),
    }
}

/// How many sites may exist at once on this machine, across all test processes.
const MAX_SITES: u32 = 16;
/// How many site links may exist at once on this machine.
const MAX_LINKS: u32 = 256;
/// Where the slots' lock files live (on the host, shared by every test process).
const SLOT_DIR: &str = "/run/hcp-olm/slots";

/// A numbered slot held across processes: an exclusive `flock` on
/// `/run/hcp-olm/slots/<kind>-<index>.lock`, released when the slot is dropped or its process
/// ends (however it ends). Sites and links take their addresses from their slot, so two test
/// processes (`make test` and `make demo`, or two test binaries) never pick the same ones; a
/// per-process counter gave both index 0.
#[derive(Debug)]
pub struct Slot {
    index: u32,
    _lock: std::fs::File,
}

impl Slot {
    /// Takes the lowest free slot of `kind` below `max`.
    pub fn take(kind: &str, max: u32) -> Result<Self, NodeError> {
        std::fs::create_dir_all(SLOT_DIR).map_err(io(format!("creating {SLOT_DIR}")))?;
        for index in 0..max {
            let path = Path::new(SLOT_DIR).join(format!("{kind}-{index}.lock"));
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
                .map_err(io(format!("opening {}", path.display())))?;
            match file.try_lock() {
                Ok(()) => {
                    return Ok(Self { index, _lock: file });
                }
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(e)) => {
                    return Err(io(format!("locking {}", path.display()))(e));
                }
            }
        }
        Err(NodeError::Setup {
            node: "-".into(),
            problem: format!(
                "all {max} {kind} slots are held by test processes on this machine ({SLOT_DIR})"
            ),
        })
    }

    /// The slot's number.
    pub fn index(&self) -> u32 {
        self.index
    }
}

/// A node's network: a namespace and a veth pair to the host. Create it before the API server
/// and registry the node talks to, so they can bind to [`Site::host_ip`].
#[derive(Debug)]
pub struct Site {
    netns: Netns,
    host_if: String,
    host_ip: Ipv4Addr,
    node_ip: Ipv4Addr,
    pod_cidr: String,
    stack: SiteStack,
    host_ip6: Option<Ipv6Addr>,
    node_ip6: Option<Ipv6Addr>,
    pod_cidr6: Option<String>,
    // last: released after the namespace and its addresses are gone
    slot: Slot,
}

impl Site {
    /// Creates the namespace, the veth pair (host `198.19.200.4k+1/30`, node `…+2`) and the
    /// host's route to the node's pod CIDR (`198.19.(208+k).0/24`).
    pub fn create() -> Result<Self, NodeError> {
        Self::create_with(SiteStack::Ipv4)
    }

    /// [`Site::create`] with the address families of `stack`. IPv6 (issue 19): host
    /// `fd00:198:200:<slot>::1/64`, node `…::2/64` (no duplicate address detection), the
    /// node's default IPv6 route via the host, IPv6 forwarding on in the node's namespace,
    /// and the host's route to the node's IPv6 pod CIDR `fd00:198:208:<slot>::/64`.
    pub fn create_with(stack: SiteStack) -> Result<Self, NodeError> {
        let slot = Slot::take("site", MAX_SITES)?;
        let k = slot.index();
        let base = 4 * k;
        let host_ip = Ipv4Addr::new(198, 19, 200 + (base / 256) as u8, (base % 256) as u8 + 1);
        let node_ip = Ipv4Addr::new(198, 19, 200 + (base / 256) as u8, (base % 256) as u8 + 2);
        let pod_cidr = format!("198.19.{}.0/24", 208 + k);
        let netns = Netns::create("hon")?;
        let host_if = netns::unique_name("honh");
        let node_if = netns::unique_name("honn");
        netns::run_ip(&[
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            &node_if,
            "netns",
            netns.name(),
        ])?;
        let (host_ip6, node_ip6, pod_cidr6) = if stack.has_v6() {
            let h = Ipv6Addr::new(0xfd00, 0x198, 0x200, k as u16, 0, 0, 0, 1);
            let n = Ipv6Addr::new(0xfd00, 0x198, 0x200, k as u16, 0, 0, 0, 2);
            (Some(h), Some(n), Some(format!("fd00:198:208:{k:x}::/64")))
        } else {
            (None, None, None)
        };
        let site = Self {
            netns,
            host_if,
            host_ip,
            node_ip,
            pod_cidr,
            stack,
            host_ip6,
            node_ip6,
            pod_cidr6,
            slot,
        };
        netns::run_ip(&[
            "addr",
            "add",
            &format!("{host_ip}/30"),
            "dev",
            &site.host_if,
        ])?;
        netns::run_ip(&["link", "set", &site.host_if, "up"])?;
        site.netns
            .ip(&["addr", "add", &format!("{node_ip}/30"), "dev", &node_if])?;
        site.netns.ip(&["link", "set", &node_if, "up"])?;
        site.netns
            .ip(&["route", "add", "default", "via", &host_ip.to_string()])?;
        if stack.has_v4_pods() {
            netns::run_ip(&[
                "route",
                "add",
                &site.pod_cidr,
                "via",
                &node_ip.to_string(),
                "dev",
                &site.host_if,
            ])?;
        }
        if let (Some(h), Some(n), Some(pods6)) = (host_ip6, node_ip6, &site.pod_cidr6) {
            netns::run_ip(&[
                "-6",
                "addr",
                "add",
                &format!("{h}/64"),
                "dev",
                &site.host_if,
                "nodad",
            ])?;
            site.netns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{n}/64"),
                "dev",
                &node_if,
                "nodad",
            ])?;
            site.netns
                .ip(&["-6", "route", "add", "default", "via", &h.to_string()])?;
            // the node routes its pods' IPv6 (the bridge plugin would turn it on at the
            // first pod; on from the start, so the node's own routing never depends on it)
            run(
                "enabling IPv6 forwarding in the node's namespace",
                Command::new("ip").args([
                    "netns",
                    "exec",
                    site.netns.name(),
                    "sysctl",
                    "-q",
                    "-w",
                    "net.ipv6.conf.all.forwarding=1",
                ]),
            )?;
            netns::run_ip(&[
                "-6",
                "route",
                "add",
                pods6,
                "via",
                &n.to_string(),
                "dev",
                &site.host_if,
            ])?;
        }
        Ok(site)
    }

    /// The site's slot number (0 to 15), unique on this machine while the site exists: what
    /// its addresses are derived from, and what a test can derive its own ranges from.
    pub fn slot(&self) -> u32 {
        self.slot.index()
    }

    /// The host's end of the veth: where servers the node must reach bind.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// The node's address (the kubelet's `--node-ip`).
    pub fn node_ip(&self) -> Ipv4Addr {
        self.node_ip
    }

    /// The node's pod CIDR (its CNI bridge's host-local range): the IPv4 one, or on an
    /// IPv6 site ([`SiteStack::Ipv6`]) the IPv6 one.
    pub fn pod_cidr(&self) -> &str {
        match (&self.stack, &self.pod_cidr6) {
            (SiteStack::Ipv6, Some(p)) => p,
            _ => &self.pod_cidr,
        }
    }

    /// Lets the node send (or forward) IPv4 only to `allowed` (TCP), on loopback and to the
    /// local multicast block 224.0.0.0/24 (the kernel's own IGMP reports when an interface
    /// comes up, never routed): every other IPv4 packet leaving by its interfaces is counted
    /// and dropped (nftables table
    /// `ip hcp_olm_ipv4_fence` in the node's namespace). For an IPv6 site whose one IPv4 use
    /// is pulling from the test registry ([`SiteStack::Ipv6`]); [`Site::ipv4_fenced`] reads
    /// the count.
    pub fn fence_ipv4(&self, allowed: std::net::SocketAddrV4) -> Result<(), NodeError> {
        let rules = format!(
            "table ip hcp_olm_ipv4_fence {{
  counter fenced {{ }}
  set seen {{ type ipv4_addr . inet_proto; flags dynamic; size 64; }}
  chain node_out {{
    type filter hook output priority filter; policy accept;
    oifname \"lo\" accept
    ip daddr 224.0.0.0/24 accept
    ip daddr {ip} tcp dport {port} accept
    update @seen {{ ip daddr . meta l4proto }} counter name fenced drop
  }}
  chain node_forward {{
    type filter hook forward priority filter; policy accept;
    update @seen {{ ip daddr . meta l4proto }} counter name fenced drop
  }}
}}
",
            ip = allowed.ip(),
            port = allowed.port()
        );
        nft_in(self.netns.name(), &rules, "fencing the node's IPv4")
    }

    /// The IPv4 packets [`Site::fence_ipv4`] has dropped, and where they went
    /// (`address . protocol` as nftables lists them).
    pub fn ipv4_fenced(&self) -> Result<(u64, String), NodeError> {
        let nft = |args: &[&str]| {
            run(
                "nft list",
                Command::new("ip")
                    .args(["netns", "exec", self.netns.name(), "nft", "list"])
                    .args(args),
            )
        };
        let out = nft(&["counter", "ip", "hcp_olm_ipv4_fence", "fenced"])?;
        let packets = out
            .split_whitespace()
            .skip_while(|w| *w != "packets")
            .nth(1)
            .and_then(|n| n.parse().ok())
            .ok_or_else(|| NodeError::Setup {
                node: "-".into(),
                problem: format!("no packet count in {out:?}"),
            })?;
        let seen = nft(&["set", "ip", "hcp_olm_ipv4_fence", "seen"])?;
        let elements = seen
            .split_once("elements = {")
            .and_then(|(_, rest)| rest.split_once('}'))
            .map(|(e, _)| e.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        Ok((packets, elements))
    }

    /// The site's address families.
    pub fn stack(&self) -> SiteStack {
        self.stack
    }

    /// The host's IPv6 end of the veth (sites with IPv6).
    pub fn host_ip6(&self) -> Option<Ipv6Addr> {
        self.host_ip6
    }

    /// The node's IPv6 address (sites with IPv6).
    pub fn node_ip6(&self) -> Option<Ipv6Addr> {
        self.node_ip6
    }

    /// The node's pod CIDRs, IPv4 first (one per family of the site).
    pub fn pod_cidrs(&self) -> Vec<&str> {
        let mut out = Vec::new();
        if self.stack.has_v4_pods() {
            out.push(self.pod_cidr.as_str());
        }
        out.extend(self.pod_cidr6.as_deref());
        out
    }

    /// The node's addresses as the kubelet's `--node-ip` lists them (IPv4 first).
    pub fn node_ips(&self) -> Vec<IpAddr> {
        let mut out = Vec::new();
        if self.stack.has_v4_pods() {
            out.push(IpAddr::V4(self.node_ip));
        }
        out.extend(self.node_ip6.map(IpAddr::V6));
        out
    }

    /// kube-proxy's `--cluster-cidr`: every node's pod range of each family of the site.
    fn cluster_cidrs(&self) -> String {
        match self.stack {
            SiteStack::Ipv4 => POD_CIDRS.to_string(),
            SiteStack::DualStack => format!("{POD_CIDRS},{POD_CIDRS6}"),
            SiteStack::Ipv6 => POD_CIDRS6.to_string(),
        }
    }

    /// The network namespace.
    pub fn netns(&self) -> &Netns {
        &self.netns
    }
}

impl Drop for Site {
    fn drop(&mut self) {
        // The route goes with the link; the link goes with the namespace (Netns's drop), but
        // delete it first so its name is free at once.
        let _ = netns::run_ip(&["link", "del", &self.host_if]);
    }
}

/// A wide-area path from one site's node to another site's node address, as a guest's nodes
/// reach the management cluster's published NodePort address: a veth pair between the two
/// node namespaces (`198.19.204.4k+1/30` on the near side, `…+2` on the far side), a route in
/// the near node for the far node's address only, and masquerading of what leaves the near
/// node by it. The far node learns no route back into the near site (its pods stay private),
/// and the host, whose `ip_forward` stays off, forwards nothing between sites.
///
/// From an IPv6 site ([`SiteStack::Ipv6`]) to a site with IPv6 the path is IPv6 only (issue
/// 19): `fd00:198:204:<k>::1/64` and `…::2/64`, the route for the far node's IPv6 address,
/// masquerading in an `ip6` table.
#[derive(Debug)]
pub struct SiteLink {
    near: String,
    near_if: String,
    table: String,
    family: &'static str,
    _slot: Slot,
}

impl Site {
    /// Lets this site's node (and its pods, masqueraded) reach `far`'s node address:
    /// see [`SiteLink`].
    pub fn reach_node_of(&self, far: &Site) -> Result<SiteLink, NodeError> {
        let slot = Slot::take("link", MAX_LINKS)?;
        let k = slot.index();
        let base = 4 * k;
        let v6 = match (self.stack, far.node_ip6) {
            (SiteStack::Ipv6, Some(far_node)) => Some(far_node),
            (SiteStack::Ipv6, None) => {
                return Err(NodeError::Setup {
                    node: "-".into(),
                    problem: "an IPv6 site can reach only a site with IPv6".into(),
                });
            }
            _ => None,
        };
        let (near_addr, far_addr, far_node, far_via, family) = match v6 {
            Some(far_node) => {
                let near_ip = Ipv6Addr::new(0xfd00, 0x198, 0x204, k as u16, 0, 0, 0, 1);
                let far_ip = Ipv6Addr::new(0xfd00, 0x198, 0x204, k as u16, 0, 0, 0, 2);
                (
                    format!("{near_ip}/64"),
                    format!("{far_ip}/64"),
                    format!("{far_node}/128"),
                    far_ip.to_string(),
                    "ip6",
                )
            }
            None => {
                let near_ip =
                    Ipv4Addr::new(198, 19, 204 + (base / 256) as u8, (base % 256) as u8 + 1);
                let far_ip =
                    Ipv4Addr::new(198, 19, 204 + (base / 256) as u8, (base % 256) as u8 + 2);
                (
                    format!("{near_ip}/30"),
                    format!("{far_ip}/30"),
                    format!("{}/32", far.node_ip),
                    far_ip.to_string(),
                    "ip",
                )
            }
        };
        let (near_if, _) = netns::connect(&self.netns, &near_addr, &far.netns, &far_addr)?;
        let link = SiteLink {
            near: self.netns.name().to_string(),
            near_if: near_if.clone(),
            table: format!("hcp_olm_link{k}"),
            family,
            _slot: slot,
        };
        // (IPv6: the pair's addresses pass duplicate address detection within a second or
        // two; nothing uses the link before the near node is up, tens of seconds later)
        self.netns
            .ip(&["route", "add", &far_node, "via", &far_via, "dev", &near_if])?;
        let rules = format!(
            "table {family} {t} {{
  chain post {{
    type nat hook postrouting priority srcnat; policy accept;
    oifname \"{near_if}\" masquerade
  }}
}}
",
            t = link.table
        );
        nft_in(&link.near, &rules, "masquerading on the site link")?;
        Ok(link)
    }
}

impl SiteLink {
    /// Cuts the path (`true`: the near node drops everything in and out by the link, as a
    /// wide-area outage does) or restores it (`false`). The link and its route stay, so
    /// restoring needs nothing else.
    pub fn set_cut(&self, cut: bool) -> Result<(), NodeError> {
        let table = format!("{}_cut", self.table);
        let rules = if cut {
            format!(
                "table inet {table} {{
  chain cut_forward {{ type filter hook forward priority filter; policy accept; iifname \"{i}\" drop; oifname \"{i}\" drop; }}
  chain cut_input {{ type filter hook input priority filter; policy accept; iifname \"{i}\" drop; }}
  chain cut_output {{ type filter hook output priority filter; policy accept; oifname \"{i}\" drop; }}
}}
",
                i = self.near_if
            )
        } else {
            format!("delete table inet {table}\n")
        };
        nft_in(
            &self.near,
            &rules,
            if cut {
                "cutting the site link"
            } else {
                "restoring the site link"
            },
        )
    }
}

/// Loads nftables `rules` (`nft -f -`) in network namespace `netns`; `what` names the change
/// in the error.
fn nft_in(netns: &str, rules: &str, what: &str) -> Result<(), NodeError> {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write as _;
            c.stdin.take().map(|mut i| i.write_all(rules.as_bytes()));
            c.wait_with_output()
        })
        .map_err(io("running nft"))?;
    if !out.status.success() {
        return Err(NodeError::Setup {
            node: "-".into(),
            problem: format!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim()),
        });
    }
    Ok(())
}

impl Drop for SiteLink {
    fn drop(&mut self) {
        let _ = netns::run_ip(&["-n", &self.near, "link", "del", &self.near_if]);
        let _ = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.near,
                "nft",
                "delete",
                "table",
                self.family,
                &self.table,
            ])
            .output();
    }
}

/// A registry the node pulls from over plain HTTP (a test registry on the host).
#[derive(Clone, Debug)]
pub struct PlainHttpRegistry {
    /// `host:port`.
    pub host: String,
}

/// What a node needs besides its [`Site`].
#[derive(Clone, Debug)]
pub struct NodeOptions {
    /// The Node name (also the kubelet's `--hostname-override`).
    pub name: String,
    /// The pod sandbox image, pulled before the kubelet starts.
    pub sandbox_image: String,
    /// `user:password` for pulling [`NodeOptions::sandbox_image`] (containerd's own pull;
    /// pods pull with their `imagePullSecrets`).
    pub sandbox_credentials: Option<String>,
    /// Registries reached over plain HTTP.
    pub plain_http: Vec<PlainHttpRegistry>,
    /// The cluster DNS address the kubelet gives pods (`clusterDNS`, domain `cluster.local`;
    /// [`crate::clusterdns`]); without it pods get the node's resolver, which resolves nothing.
    pub cluster_dns: Option<IpAddr>,
    /// A Docker config (`{"auths": …}`) the kubelet pulls every pod's images with, written
    /// to `/var/lib/kubelet/config.json` as OpenShift nodes carry the cluster's global pull
    /// secret; pods then need no `imagePullSecrets`.
    pub pull_secret: Option<Vec<u8>>,
    /// How long to wait for the Node to be Ready.
    pub ready_timeout: Duration,
    /// Enforce NetworkPolicy on this node (kube-router's firewall, see the module doc); off:
    /// every policy is ignored, as on a cluster whose network plugin has none.
    pub network_policies: bool,
}

impl NodeOptions {
    /// Defaults for `name`: 90 s to become Ready.
    pub fn new(name: &str, sandbox_image: &str) -> Self {
        Self {
            name: name.into(),
            sandbox_image: sandbox_image.into(),
            sandbox_credentials: None,
            plain_http: Vec::new(),
            cluster_dns: None,
            pull_secret: None,
            ready_timeout: Duration::from_secs(90),
            network_policies: false,
        }
    }
}

/// A running node. Dropping it kills the kubelet, containerd and every pod process by PID,
/// waits for them, and removes its cgroups, mounts, directories and network.
pub struct RealNode {
    name: String,
    // Set as each daemon starts.
    kubelet: Option<ManagedProcess>,
    kube_proxy: Option<ManagedProcess>,
    network_policies: Option<ManagedProcess>,
    containerd: Option<ManagedProcess>,
    mount_ns: PathBuf,
    cgroup: String,
    // Dropped after the processes (declaration order): the directory, then the network.
    dir: tempfile::TempDir,
    site: Site,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.name)
            .field("node_ip", &self.site.node_ip)
            .finish()
    }
}

/// The cgroup hierarchies: every v1 one, and the unified (v2) one of a hybrid host, where the
/// kubelet makes the pods' cgroups too.
fn hierarchies() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/sys/fs/cgroup") {
        for e in rd.flatten() {
            let p = e.path();
            if p.join("cgroup.procs").exists() {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

/// Creates `/<root>/system` in every hierarchy; cpuset cgroups get their parent's CPUs and
/// memory nodes (a new cpuset cgroup has none, and no process can join it).
fn create_cgroups(root: &str) -> Result<(), NodeError> {
    for h in hierarchies() {
        for rel in [root.to_string(), format!("{root}/system")] {
            let dir = h.join(&rel);
            std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
            if h.ends_with("cpuset") {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let parent = dir.parent().map(|p| p.join(f)).unwrap_or_default();
                    let v = std::fs::read_to_string(&parent)
                        .map_err(io(format!("reading {}", parent.display())))?;
                    std::fs::write(dir.join(f), v.trim())
                        .map_err(io(format!("writing {}/{f}", dir.display())))?;
                }
            }
        }
    }
    Ok(())
}

/// Every process id in the cgroup subtree `root` of any hierarchy.
fn cgroup_pids(root: &str) -> Vec<u32> {
    let mut pids = std::collections::BTreeSet::new();
    for h in hierarchies() {
        for e in walkdir::WalkDir::new(h.join(root)).into_iter().flatten() {
            if e.file_name() == "cgroup.procs"
                && let Ok(s) = std::fs::read_to_string(e.path())
            {
                pids.extend(s.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
    }
    pids.into_iter().collect()
}

/// Kills every process in the subtree (SIGKILL, by PID) until none is left (bounded), then
/// removes the subtree's directories, deepest first.
fn remove_cgroups(root: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids = cgroup_pids(root);
        if pids.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            tracing::warn!(cgroup = root, ?pids, "processes left in the node's cgroups");
            break;
        }
        for pid in pids {
            if let Ok(pid) = i32::try_from(pid) {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for h in hierarchies() {
        let top = h.join(root);
        let mut dirs: Vec<PathBuf> = walkdir::WalkDir::new(&top)
            .into_iter()
            .flatten()
            .filter(|e| e.file_type().is_dir())
            .map(|e| e.into_path())
            .collect();
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            if let Err(e) = std::fs::remove_dir(&d)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(cgroup = %d.display(), error = %e, "removing a cgroup failed");
            }
        }
    }
}

fn run(what: &str, cmd: &mut Command) -> Result<String, NodeError> {
    let out = cmd.output().map_err(io(format!("running {what}")))?;
    if !out.status.success() {
        return Err(NodeError::Setup {
            node: "-".into(),
            problem: format!(
                "{what} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

impl RealNode {
    /// Starts containerd and the kubelet on `site`, registers the node with `cluster` (client
    /// certificate for `system:node:<name>` in `system:nodes`, bound to the `system:node` role)
    /// and waits until the Node is Ready.
    pub async fn start(
        site: Site,
        cluster: &Cluster,
        opts: NodeOptions,
    ) -> Result<Self, NodeError> {
        let name = opts.name.clone();
        let setup = |problem: String| NodeError::Setup {
            node: name.clone(),
            problem,
        };
        let kubelet_bin = tools::bin("kubelet")?;
        let containerd_bin = tools::bin("containerd")?;
        let ctr = tools::bin("ctr")?;
        let shim = tools::bin("containerd-shim-runc-v2")?;
        for p in ["bridge", "host-local", "loopback", "portmap"] {
            if !Path::new(CNI_PLUGINS).join(p).is_file() {
                return Err(setup(format!(
                    "CNI plugin {CNI_PLUGINS}/{p} missing: install the Debian package containernetworking-plugins (scripts/prereqs.sh test does)"
                )));
            }
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("hcp-olm-node-{name}-"))
            .tempdir()
            .map_err(io("creating the node directory"))?;
        let d = dir.path().to_path_buf();
        let cgroup = format!("hcp-olm-{}", site.netns.name());
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            return Err(setup(
                "this host mounts only the unified cgroup v2 hierarchy; real test nodes are \
                 built for cgroup v1 (hybrid) hosts like the CI machines"
                    .into(),
            ));
        }

        // 1. Mount namespace, pinned to a file so every daemon can enter it. The node value
        // exists from here on, so an early error still unmounts and removes what was made.
        let ns_dir = d.join("ns");
        let mount_ns = ns_dir.join("mnt");
        std::fs::create_dir_all(&ns_dir).map_err(io("creating the namespace directory"))?;
        let mut node = Self {
            name: name.clone(),
            kubelet: None,
            kube_proxy: None,
            network_policies: None,
            containerd: None,
            mount_ns: mount_ns.clone(),
            cgroup: cgroup.clone(),
            dir,
            site,
        };
        let ns_s = ns_dir.display().to_string();
        run(
            "mount --bind",
            Command::new("mount").args(["--bind", &ns_s, &ns_s]),
        )?;
        run(
            "mount --make-private",
            Command::new("mount").args(["--make-private", &ns_s]),
        )?;
        std::fs::write(&mount_ns, b"").map_err(io("creating the mount namespace file"))?;
        // The copies of the host's network namespace mounts would keep those namespaces
        // (other tests') alive as long as this node: drop them first.
        let mut script = String::from("set -e\numount -R -l /run/netns 2>/dev/null || true\n");
        // No name server: the node resolves nothing outside the test (an image on a public
        // registry fails to pull at once instead of reaching out), and pods inherit it.
        // Bound before /run (resolv.conf may be a link into /run).
        let resolv = d.join("resolv.conf");
        std::fs::write(
            &resolv,
            "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
        )
        .map_err(io("writing the node's resolv.conf"))?;
        script.push_str(&format!(
            "mount --bind {} /etc/resolv.conf\n",
            resolv.display()
        ));
        script.push_str(&format!(
            "mkdir -p /opt/cni/bin\nmount --bind {CNI_PLUGINS} /opt/cni/bin\n"
        ));
        // /run last: every source is resolved before the node's own /run hides the host's.
        for (target, src) in PRIVATE_PATHS.iter().rev() {
            let src = d.join(src);
            std::fs::create_dir_all(&src).map_err(io(format!("creating {}", src.display())))?;
            script.push_str(&format!(
                "mkdir -p {target}\nmount --bind {} {target}\n",
                src.display()
            ));
        }
        run(
            "unshare --mount",
            Command::new("unshare")
                .arg(format!("--mount={}", mount_ns.display()))
                .args(["--propagation", "private", "sh", "-c", &script]),
        )?;
        create_cgroups(&cgroup)?;

        // 2. Configuration.
        let certs_d = d.join("certs.d");
        for r in &opts.plain_http {
            let hd = certs_d.join(&r.host);
            std::fs::create_dir_all(&hd).map_err(io("creating certs.d"))?;
            std::fs::write(
                hd.join("hosts.toml"),
                format!(
                    "server = \"http://{h}\"\n[host.\"http://{h}\"]\n  capabilities = [\"pull\", \"resolve\"]\n",
                    h = r.host
                ),
            )
            .map_err(io("writing hosts.toml"))?;
        }
        let containerd_toml = d.join("containerd.toml");
        std::fs::write(
            &containerd_toml,
            containerd_config(&opts.sandbox_image, &certs_d),
        )
        .map_err(io("writing containerd.toml"))?;
        std::fs::write(
            d.join("cni-conf/10-hcp-olm.conflist"),
            cni_config(&node.site.pod_cidrs()),
        )
        .map_err(io("writing the CNI configuration"))?;
        if let Some(secret) = &opts.pull_secret {
            let path = d.join("kubelet/config.json");
            std::fs::write(&path, secret).map_err(io("writing the node's pull secret"))?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(io("restricting the node's pull secret"))?;
        }
        let node_ips = node.site.node_ips();
        let node_ip_flag = node_ips
            .iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let kubelet_yaml = d.join("kubelet.yaml");
        std::fs::write(
            &kubelet_yaml,
            kubelet_config(
                &cgroup,
                node_ips[0],
                &d.join("volume-plugins"),
                opts.cluster_dns,
            ),
        )
        .map_err(io("writing the kubelet configuration"))?;

        // 3. containerd, in the node's namespaces and cgroups.
        let path_env = format!(
            "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            shim.parent()
                .map(|p| p.display().to_string())
                .unwrap_or_default()
        );
        let containerd_cmd = node.enter(
            &path_env,
            &[
                containerd_bin.display().to_string(),
                "--config".into(),
                containerd_toml.display().to_string(),
            ],
        );
        let containerd =
            ManagedProcess::spawn("containerd", containerd_cmd, &d.join("containerd.log"))?;
        node.containerd = Some(containerd.clone());
        let start = Instant::now();
        loop {
            let ok = node
                .ctr(&ctr, &["version"])
                .output()
                .map(|o| o.status.success())
                .unwrap_or(false);
            if ok {
                break;
            }
            if start.elapsed() > Duration::from_secs(30) || containerd.exited().is_some() {
                return Err(NodeError::NotReady {
                    node: name.clone(),
                    component: "containerd".into(),
                    problem: "did not answer on its socket within 30s".into(),
                    log: containerd.log_tail(20),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }

        // 4. The sandbox image, pulled by containerd from the test registry.
        let mut pull: Vec<&str> = vec!["images", "pull"];
        if opts
            .plain_http
            .iter()
            .any(|r| opts.sandbox_image.starts_with(&format!("{}/", r.host)))
        {
            pull.push("--plain-http");
        }
        if let Some(c) = &opts.sandbox_credentials {
            pull.extend(["--user", c.as_str()]);
        }
        pull.push(&opts.sandbox_image);
        let out = node
            .ctr(&ctr, &pull)
            .output()
            .map_err(io("running ctr images pull"))?;
        if !out.status.success() {
            return Err(setup(format!(
                "pulling the sandbox image {}: {}",
                opts.sandbox_image,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }

        // 5. The kubelet and kube-proxy, each with its own identity and bootstrap role.
        let user = format!("system:node:{name}");
        let identity = cluster.user(&user, &["system:nodes"]).await?;
        bind(
            cluster,
            &format!("hcp-olm-e2e-node-{name}"),
            "system:node",
            &user,
        )
        .await?;
        let proxy_user = format!("hcp-olm-e2e:kube-proxy:{name}");
        let proxy_identity = cluster.user(&proxy_user, &[]).await?;
        bind(
            cluster,
            &format!("hcp-olm-e2e-kube-proxy-{name}"),
            "system:node-proxier",
            &proxy_user,
        )
        .await?;
        let kubelet_cmd = node.enter(
            &path_env,
            &[
                kubelet_bin.display().to_string(),
                format!("--config={}", kubelet_yaml.display()),
                format!("--kubeconfig={}", identity.kubeconfig.display()),
                format!("--hostname-override={name}"),
                format!("--node-ip={node_ip_flag}"),
                "--root-dir=/var/lib/kubelet".into(),
                "--v=2".into(),
            ],
        );
        let kubelet = ManagedProcess::spawn("kubelet", kubelet_cmd, &d.join("kubelet.log"))?;
        node.kubelet = Some(kubelet.clone());
        // kube-proxy in nftables mode, in the node's network namespace (its rules are the
        // node's alone, as are its default health and metrics ports). No conntrack sysctl
        // changes (a namespace may not make them).
        let proxy_cmd = node.enter(
            &path_env,
            &[
                tools::bin("kube-proxy")?.display().to_string(),
                format!("--kubeconfig={}", proxy_identity.kubeconfig.display()),
                "--proxy-mode=nftables".into(),
                format!("--hostname-override={name}"),
                format!("--cluster-cidr={}", node.site.cluster_cidrs()),
                "--conntrack-max-per-core=0".into(),
                "--conntrack-tcp-timeout-established=0".into(),
                "--conntrack-tcp-timeout-close-wait=0".into(),
                "--v=1".into(),
            ],
        );
        let kube_proxy = ManagedProcess::spawn("kube-proxy", proxy_cmd, &d.join("kube-proxy.log"))?;
        node.kube_proxy = Some(kube_proxy.clone());

        // 6. Ready.
        let nodes: Api<Node> = Api::all(cluster.client());
        let start = Instant::now();
        loop {
            let ready = nodes.get_opt(&name).await.ok().flatten().is_some_and(|n| {
                n.status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
            if let Some(status) = kube_proxy.exited() {
                return Err(NodeError::NotReady {
                    node: name.clone(),
                    component: "kube-proxy".into(),
                    problem: format!("exited ({status})"),
                    log: kube_proxy.log_tail(8),
                });
            }
            if ready {
                tracing::info!(node = %name, secs = start.elapsed().as_secs_f64(), "node ready");
                if opts.network_policies {
                    // after Ready: kube-router reads its Node's addresses at start
                    node.start_network_policies(cluster, &path_env).await?;
                }
                return Ok(node);
            }
            let exited = kubelet.exited();
            if start.elapsed() > opts.ready_timeout || exited.is_some() {
                return Err(NodeError::NotReady {
                    node: name.clone(),
                    component: "kubelet".into(),
                    problem: match exited {
                        Some(status) => format!("exited ({status})"),
                        None => format!("the Node was not Ready within {:?}", opts.ready_timeout),
                    },
                    log: kubelet.log_tail(30),
                });
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Starts kube-router's network policy controller in the node's namespaces and cgroups
    /// (its own identity: read access to what it watches) and waits until its top-level
    /// chains exist in the node's filter table (its caches have synced and its controller
    /// runs).
    async fn start_network_policies(
        &mut self,
        cluster: &Cluster,
        path_env: &str,
    ) -> Result<(), NodeError> {
        let name = self.name.clone();
        let role = "hcp-olm-e2e:network-policies";
        let cr: ClusterRole = serde_json::from_value(serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role},
            "rules": [
                {"apiGroups": [""], "resources": ["pods", "namespaces", "nodes", "services", "endpoints"],
                 "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch", "update"]},
            ],
        }))
        .map_err(|e| NodeError::Setup {
            node: name.clone(),
            problem: format!("ClusterRole {role}: {e}"),
        })?;
        match Api::<ClusterRole>::all(cluster.client())
            .create(&PostParams::default(), &cr)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(source) => {
                return Err(NodeError::Kube {
                    what: format!("creating ClusterRole {role}"),
                    source,
                });
            }
        }
        let user = format!("hcp-olm-e2e:network-policies:{name}");
        let identity = cluster.user(&user, &[]).await?;
        bind(
            cluster,
            &format!("hcp-olm-e2e-network-policies-{name}"),
            role,
            &user,
        )
        .await?;
        let cmd = self.enter(
            path_env,
            &[
                tools::bin("kube-router")?.display().to_string(),
                format!("--kubeconfig={}", identity.kubeconfig.display()),
                format!("--hostname-override={name}"),
                "--run-firewall=true".into(),
                "--run-router=false".into(),
                "--run-service-proxy=false".into(),
                "--enable-cni=false".into(),
                format!("--service-cluster-ip-range={}", cluster.service_cidr()),
                // nothing scrapes it; the node's namespace has no other user of the port
                "--health-port=0".into(),
                "--metrics-port=0".into(),
                "--v=1".into(),
            ],
        );
        let log = self.dir.path().join("kube-router.log");
        let p = ManagedProcess::spawn("kube-router", cmd, &log)?;
        self.network_policies = Some(p.clone());
        let start = Instant::now();
        loop {
            let synced = Command::new("ip")
                .args(["netns", "exec", self.site.netns.name()])
                .args([
                    "iptables",
                    "-w",
                    "5",
                    "-t",
                    "filter",
                    "-S",
                    "KUBE-ROUTER-FORWARD",
                ])
                .output()
                .is_ok_and(|o| o.status.success());
            if synced {
                tracing::info!(node = %name, secs = start.elapsed().as_secs_f64(), "network policies enforced");
                return Ok(());
            }
            let exited = p.exited();
            if start.elapsed() > Duration::from_secs(60) || exited.is_some() {
                return Err(NodeError::NotReady {
                    node: name,
                    component: "kube-router (network policies)".into(),
                    problem: match exited {
                        Some(status) => format!("exited ({status})"),
                        None => "set up no chains within 60s".into(),
                    },
                    log: p.log_tail(20),
                });
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    /// A command that runs `argv` in the node's mount and network namespaces and cgroups.
    fn enter(&self, path_env: &str, argv: &[String]) -> Command {
        // The shell joins the node's cgroups (as itself, before exec, so nothing the daemon
        // forks escapes them), then becomes the daemon.
        let mut join = String::from("set -e\n");
        for h in hierarchies() {
            join.push_str(&format!(
                "echo $$ > {}/{}/system/cgroup.procs\n",
                h.display(),
                self.cgroup
            ));
        }
        join.push_str("exec \"$@\"\n");
        let mut cmd = process::command("nsenter");
        cmd.arg(format!("--mount={}", self.mount_ns.display()))
            .arg(format!("--net=/run/netns/{}", self.site.netns.name()))
            .args(["--", "sh", "-c", &join, "sh"])
            .args(argv)
            .env("PATH", path_env)
            .env_remove("CI");
        cmd
    }

    fn ctr(&self, ctr: &Path, args: &[&str]) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--mount={}", self.mount_ns.display()))
            .arg("--")
            .arg(ctr)
            .args([
                "--address",
                "/run/containerd/containerd.sock",
                "--namespace",
                "k8s.io",
            ])
            .args(args);
        cmd
    }

    /// The Node name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's network site.
    pub fn site(&self) -> &Site {
        &self.site
    }

    /// The process ids in the node's cgroups (daemons, shims and every container process).
    pub fn pids(&self) -> Vec<u32> {
        cgroup_pids(&self.cgroup)
    }

    /// The process ids on the node whose command name (`/proc/<pid>/comm`, at most 15
    /// bytes) is `comm`: a container's main process, found as `ps` would.
    pub fn pids_named(&self, comm: &str) -> Vec<u32> {
        self.pids()
            .into_iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim_end() == comm)
            })
            .collect()
    }

    /// The node's cgroup subtree (`/<this>` in every hierarchy).
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }

    /// The kubelet's log, for error messages.
    pub fn kubelet_log(&self, lines: usize) -> String {
        self.kubelet
            .as_ref()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }

    /// The last `lines` lines of every container log of pod `namespace/pod` (the kubelet's
    /// files under the node's `/var/log/pods`), for error messages.
    pub fn pod_logs(&self, namespace: &str, pod: &str, lines: usize) -> String {
        let prefix = format!("{namespace}_{pod}_");
        let mut out = String::new();
        let root = self.dir.path().join("log-pods");
        for e in walkdir::WalkDir::new(&root)
            .sort_by_file_name()
            .into_iter()
            .flatten()
        {
            let in_pod = e
                .path()
                .strip_prefix(&root)
                .ok()
                .and_then(|r| r.components().next())
                .is_some_and(|c| c.as_os_str().to_string_lossy().starts_with(&prefix));
            if in_pod && e.file_type().is_file() {
                out.push_str(&format!(
                    "== {}\n{}\n",
                    e.path().display(),
                    process::log_tail(e.path(), lines)
                ));
            }
        }
        out
    }

    /// kube-proxy's log, for error messages.
    pub fn kube_proxy_log(&self, lines: usize) -> String {
        self.kube_proxy
            .as_ref()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }

    /// The NetworkPolicy implementation's log ([`NodeOptions::network_policies`]; empty
    /// without it), for error messages.
    pub fn network_policies_log(&self, lines: usize) -> String {
        self.network_policies
            .as_ref()
            .map(|p| p.log_tail(lines))
            .unwrap_or_default()
    }

    /// The node's directory (logs, configuration).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        for p in [
            &self.kubelet,
            &self.kube_proxy,
            &self.network_policies,
            &self.containerd,
        ]
        .into_iter()
        .flatten()
        {
            p.kill();
        }
        remove_cgroups(&self.cgroup);
        // The mount namespace ends with its last process and its pinning file.
        let ns = self.mount_ns.display().to_string();
        let _ = Command::new("umount").arg(&ns).output();
        if let Some(p) = self.mount_ns.parent() {
            let _ = Command::new("umount").arg(p).output();
        }
    }
}

/// containerd 2's configuration: CRI with runc (cgroupfs), our CNI, the registries' hosts
/// files, and what this machine kind needs.
pub fn containerd_config(sandbox_image: &str, certs_d: &Path) -> String {
    format!(
        r#"version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{sandbox_image}"
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "{certs_d}"
[plugins."io.containerd.cri.v1.runtime"]
  # no CAP_SYS_RESOURCE here: every sandbox fails without it
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  SystemdCgroup = false
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/opt/cni/bin"]
  conf_dir = "/etc/cni/net.d"
"#,
        certs_d = certs_d.display()
    )
}

/// The CNI configuration: a bridge with host-local addresses from the node's pod CIDRs (one
/// range set per family, IPv4 first, a default route of each), no masquerading (the host
/// routes the pod CIDRs to the node).
pub fn cni_config(pod_cidrs: &[&str]) -> String {
    let ranges: Vec<serde_json::Value> = pod_cidrs
        .iter()
        .map(|c| serde_json::json!([{"subnet": c}]))
        .collect();
    let routes: Vec<serde_json::Value> = pod_cidrs
        .iter()
        .map(|c| {
            if c.contains(':') {
                serde_json::json!({"dst": "::/0"})
            } else {
                serde_json::json!({"dst": "0.0.0.0/0"})
            }
        })
        .collect();
    serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "hcp-olm",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": ranges,
                    "routes": routes,
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    })
    .to_string()
}

/// The kubelet's configuration for this machine kind (cgroup v1, no CAP_SYS_RESOURCE, a
/// shared host whose sysctls and firewall are not ours).
pub fn kubelet_config(
    cgroup_root: &str,
    node_ip: IpAddr,
    volume_plugins: &Path,
    cluster_dns: Option<IpAddr>,
) -> String {
    let dns = cluster_dns
        .map(|ip| format!("clusterDNS: [\"{ip}\"]\nclusterDomain: cluster.local\n"))
        .unwrap_or_default();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
oomScoreAdj: 0
makeIPTablesUtilChains: false
protectKernelDefaults: false
failSwapOn: false
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
volumePluginDir: {volume_plugins}
address: "{node_ip}"
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
enforceNodeAllocatable: []
localStorageCapacityIsolation: false
evictionHard: {{}}
serializeImagePulls: false
{dns}"#,
        volume_plugins = volume_plugins.display()
    )
}

/// kube-controller-manager and kube-scheduler of the pinned release for a test cluster (with
/// real nodes, Deployments become pods on them). Dropping it kills both by PID.
pub struct ClusterControllers {
    controller_manager: ManagedProcess,
    scheduler: ManagedProcess,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for ClusterControllers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterControllers")
            .field("controller_manager", &self.controller_manager.pid())
            .field("scheduler", &self.scheduler.pid())
            .finish()
    }
}

impl ClusterControllers {
    /// Starts both with the cluster's admin kubeconfig, no leader election and no serving
    /// port (nothing scrapes them); the controller-manager publishes the cluster CA
    /// (`kube-root-ca.crt`) and runs every default controller.
    pub fn start(cluster: &Cluster) -> Result<Self, NodeError> {
        Self::start_with(cluster, "*")
    }

    /// [`ClusterControllers::start`] with the controller-manager running only `controllers`
    /// (its `--controllers` flag, e.g. `endpointslicemirroring`).
    pub fn start_with(cluster: &Cluster, controllers: &str) -> Result<Self, NodeError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("hcp-olm-controllers-{}-", cluster.name()))
            .tempdir()
            .map_err(io("creating the controllers' directory"))?;
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, cluster.ca_pem()).map_err(io("writing the cluster CA"))?;
        let kubeconfig = cluster.kubeconfig().display().to_string();
        let mut kcm = process::command(tools::bin("kube-controller-manager")?);
        kcm.args([
            format!("--kubeconfig={kubeconfig}"),
            format!("--root-ca-file={}", ca.display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            format!("--controllers={controllers}"),
            format!("--cluster-name={}", cluster.name()),
            "--v=1".into(),
        ]);
        let controller_manager = ManagedProcess::spawn(
            "kube-controller-manager",
            kcm,
            &dir.path().join("kube-controller-manager.log"),
        )?;
        let mut sched = process::command(tools::bin("kube-scheduler")?);
        sched.args([
            format!("--kubeconfig={kubeconfig}"),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--v=1".into(),
        ]);
        let scheduler = ManagedProcess::spawn(
            "kube-scheduler",
            sched,
            &dir.path().join("kube-scheduler.log"),
        )?;
        std::thread::sleep(Duration::from_millis(500));
        for p in [&controller_manager, &scheduler] {
            if p.exited().is_some() {
                return Err(NodeError::NotReady {
                    node: "-".into(),
                    component: p.name().into(),
                    problem: "exited at start".into(),
                    log: p.log_tail(20),
                });
            }
        }
        Ok(Self {
            controller_manager,
            scheduler,
            _dir: dir,
        })
    }

    /// The last log lines of both, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        format!(
            "kube-controller-manager:\n{}\nkube-scheduler:\n{}",
            self.controller_manager.log_tail(lines),
            self.scheduler.log_tail(lines)
        )
    }
}

/// Builds an image of `files` run as `config` says (as `make images` builds ours; time
/// stamps 0, version and revision `test`) and pushes it as `reference` with `client`.
pub async fn push_image(
    client: &hcp_olm_oci::Client,
    reference: &str,
    config: &hcp_olm_images::ImageConfig,
    files: &[hcp_olm_images::File],
) -> Result<hcp_olm_images::Built, NodeError> {
    let setup = |problem: String| NodeError::Setup {
        node: "-".into(),
        problem,
    };
    let meta = hcp_olm_images::Meta {
        version: "test".into(),
        revision: "test".into(),
        created: 0,
    };
    let img = hcp_olm_images::build_image(config, files, &meta)
        .map_err(|e| setup(format!("building {reference}: {e}")))?;
    client
        .push_built(
            reference,
            &img.layers,
            img.config.clone(),
            img.manifest.clone(),
        )
        .await
        .map_err(|e| setup(format!("pushing {reference}: {e}")))?;
    Ok(img)
}

/// Builds the pod sandbox image (our `pause`, `e2e/tools/pause`) as `make images` builds ours
/// and pushes it to `registry` (`host:port`) with `client`; returns its reference.
pub async fn push_sandbox_image(
    client: &hcp_olm_oci::Client,
    registry: &str,
) -> Result<String, NodeError> {
    push_test_image(
        client,
        registry,
        "the pause image",
        crate::testimages::pause(),
    )
    .await
}

/// Pushes a test image ([`crate::testimages`]) to `registry`; returns its reference. `what`
/// names it in the error when it could not be made.
pub async fn push_test_image(
    client: &hcp_olm_oci::Client,
    registry: &str,
    what: &str,
    image: anyhow::Result<crate::testimages::TestImage>,
) -> Result<String, NodeError> {
    let img = image.map_err(|e| NodeError::Setup {
        node: "-".into(),
        problem: format!("{what}: {e:#}"),
    })?;
    let reference = img.reference(registry);
    push_image(client, &reference, &img.config, &img.files).await?;
    Ok(reference)
}

/// A route in the host's namespace, deleted when dropped: plays the part of a pod network the
/// test's host-side processes (the API servers) stand in for, e.g. the guest API server's
/// path to Service addresses of the management cluster, which HyperShift runs it next to.
#[derive(Debug)]
pub struct HostRoute(String);

impl HostRoute {
    /// `ip route add <dst> via <via>`.
    pub fn add(dst: &str, via: &str) -> Result<Self, NodeError> {
        let out = Command::new("ip")
            .args(["route", "add", dst, "via", via])
            .output()
            .map_err(io("running ip route"))?;
        if !out.status.success() {
            return Err(NodeError::Setup {
                node: "-".into(),
                problem: format!(
                    "ip route add {dst} via {via}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            });
        }
        Ok(Self(dst.to_string()))
    }
}

impl Drop for HostRoute {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["route", "del", &self.0]).output();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two processes never hold one slot (the defect: each test process counted sites from
    /// 0, so `make demo` beside a real-node test failed with `ip route add 198.19.208.0/24
    /// … File exists` and both had 198.19.200.1 on the host).
    #[test]
    fn slots_are_exclusive_within_and_across_processes() {
        let a = Slot::take("unit-test", 3).expect("first slot");
        let b = Slot::take("unit-test", 3).expect("second slot");
        assert_ne!(a.index(), b.index());
        let path = format!("{SLOT_DIR}/unit-test-{}.lock", a.index());
        let other = |p: &str| {
            Command::new("flock")
                .args(["-n", p, "true"])
                .status()
                .expect("flock runs")
                .success()
        };
        assert!(!other(&path), "another process took a held slot");
        let c = Slot::take("unit-test", 3).expect("third slot");
        let full = Slot::take("unit-test", 3).expect_err("only 3 slots");
        assert!(full.to_string().contains("all 3 unit-test slots"), "{full}");
        drop(a);
        assert!(other(&path), "a dropped slot stays held");
        drop((b, c));
    }
}
