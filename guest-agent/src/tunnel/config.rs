//! The `hcp-olm-tunnel` config file (TOML, or YAML by extension). Pure parsing and
//! validation: every error names the field it is about.
//!
//! ```toml
//! mode = "tun"                          # the only mode of this binary so far
//! listen = "0.0.0.0:51820"              # WireGuard UDP socket
//! admin = "127.0.0.1:9301"              # /healthz /readyz /metrics
//! private_key_file = "/etc/hcp-olm/wg/private-key"   # `wg genkey` form
//! drain_timeout_ms = 5000
//! key_reload_seconds = 5                # re-read the key files (rotation); 0 disables
//!
//! [tun]
//! name = "hcpolm0"
//! address = "198.18.41.2/24"            # our tunnel address
//! address6 = "fd00:41::2/64"            # optional: our IPv6 tunnel address (IPv6 inside)
//! mtu = 1420
//! routes = ["198.18.50.0/24"]           # guest service / pod CIDRs routed into the device
//!                                       # (IPv6 prefixes need `address6`)
//! offload = true                        # virtio-net offload (GSO/GRO); default true
//!
//! [peer]
//! public_key = "…"                      # `wg pubkey` form
//! endpoint = "198.18.40.2:51820"        # set on the dialing side only
//! allowed_ips = ["198.18.41.1/32", "198.18.50.0/24"]
//! persistent_keepalive = 25
//! dead_peer_timeout_s = 60
//! preshared_key_file = "/etc/hcp-olm/wg/psk"          # optional
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::key::{PresharedKey, PrivateKey, PublicKey};
use super::peer::{Cidr, PeerConfig};

/// A configuration error naming its field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{field}: {message}")]
pub struct TunnelConfigError {
    /// The dotted field path, e.g. `peer.public_key`.
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

fn err(field: &str, message: impl Into<String>) -> TunnelConfigError {
    TunnelConfigError {
        field: field.to_string(),
        message: message.into(),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    mode: Option<String>,
    listen: Option<String>,
    admin: Option<String>,
    private_key_file: Option<PathBuf>,
    drain_timeout_ms: Option<u64>,
    key_reload_seconds: Option<u64>,
    tun: Option<FileTun>,
    peer: Option<FilePeer>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTun {
    name: Option<String>,
    address: Option<String>,
    address6: Option<String>,
    mtu: Option<u16>,
    #[serde(default)]
    routes: Vec<String>,
    offload: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FilePeer {
    public_key: Option<String>,
    endpoint: Option<String>,
    #[serde(default)]
    allowed_ips: Vec<String>,
    persistent_keepalive: Option<u16>,
    dead_peer_timeout_s: Option<u64>,
    preshared_key_file: Option<PathBuf>,
}

/// How the tunnel meets the local network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A TUN device with routes (needs NET_ADMIN).
    Tun,
}

/// The TUN device settings.
#[derive(Debug, Clone)]
pub struct TunSettings {
    /// Interface name (at most 15 bytes).
    pub name: String,
    /// Our tunnel address with its prefix.
    pub address: String,
    /// Our IPv6 tunnel address with its prefix (IPv6 inside the tunnel), if any.
    pub address6: Option<String>,
    /// Device MTU.
    pub mtu: u16,
    /// Prefixes routed into the device.
    pub routes: Vec<String>,
    /// Whether to open the device with virtio-net offload.
    pub offload: bool,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct TunnelConfig {
    /// The mode.
    pub mode: Mode,
    /// WireGuard UDP listen address.
    pub listen: SocketAddr,
    /// Admin listen address.
    pub admin: Option<SocketAddr>,
    /// How long SIGTERM waits for the driver to stop.
    pub drain_timeout: Duration,
    /// How often the key files are re-read (a Secret volume changes them in place); `None`:
    /// never. Default 5 s.
    pub key_reload: Option<Duration>,
    /// TUN settings.
    pub tun: TunSettings,
    /// The peer.
    pub peer: PeerConfig,
}

fn parse_addr(field: &str, s: &str) -> Result<SocketAddr, TunnelConfigError> {
    s.parse()
        .map_err(|_| err(field, format!("`{s}` is not an IP:port")))
}

fn read_key_file(field: &str, path: &Path) -> Result<String, TunnelConfigError> {
    std::fs::read_to_string(path)
        .map_err(|e| err(field, format!("cannot read {}: {e}", path.display())))
}

/// Parses and validates config text; `path` chooses the format (`.yaml`/`.yml` or TOML) and
/// anchors relative key-file paths.
pub fn parse(path: &Path, text: &str) -> Result<TunnelConfig, TunnelConfigError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let f: FileConfig = if ext == "yaml" || ext == "yml" {
        serde_yaml_ng::from_str(text).map_err(|e| {
            let msg = e.to_string();
            err(&field_from_serde(&msg), msg)
        })?
    } else {
        toml::from_str(text).map_err(|e| {
            let msg = e.message().to_string();
            err(&field_from_serde(&msg), msg)
        })?
    };
    let base = path.parent().unwrap_or(Path::new("."));
    let resolve = |p: &Path| {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            base.join(p)
        }
    };

    let mode = match f.mode.as_deref().unwrap_or("tun") {
        "tun" => Mode::Tun,
        other => {
            return Err(err(
                "mode",
                format!("`{other}` is not supported by this binary (want `tun`)"),
            ));
        }
    };
    let listen = parse_addr("listen", f.listen.as_deref().unwrap_or("0.0.0.0:51820"))?;
    let admin = f
        .admin
        .as_deref()
        .map(|a| parse_addr("admin", a))
        .transpose()?;
    let key_path = f
        .private_key_file
        .as_deref()
        .ok_or_else(|| err("private_key_file", "required"))?;
    let private_key =
        PrivateKey::from_base64(&read_key_file("private_key_file", &resolve(key_path))?)
            .map_err(|e| err("private_key_file", e.to_string()))?;

    let t = f.tun.ok_or_else(|| err("tun", "required in tun mode"))?;
    let name = t.name.unwrap_or_else(|| "hcpolm0".to_string());
    if name.is_empty()
        || name.len() > 15
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    {
        return Err(err(
            "tun.name",
            format!("`{name}` is not a valid interface name (1-15 of [A-Za-z0-9._-])"),
        ));
    }
    let address = t
        .address
        .ok_or_else(|| err("tun.address", "required (ADDRESS/PREFIX)"))?;
    let own = address
        .parse::<Cidr>()
        .map_err(|e| err("tun.address", e.to_string()))?;
    let mut own_ranges = vec![own];
    if let Some(a6) = &t.address6 {
        let c = a6
            .parse::<Cidr>()
            .map_err(|e| err("tun.address6", e.to_string()))?;
        if !c.addr().is_ipv6() || !own.addr().is_ipv4() {
            return Err(err(
                "tun.address6",
                format!("`{a6}` is not an IPv6 address (with an IPv4 `tun.address`)"),
            ));
        }
        own_ranges.push(c);
    }
    let mtu = t.mtu.unwrap_or(1420);
    if !(576..=9000).contains(&mtu) {
        return Err(err("tun.mtu", format!("{mtu} is outside 576..=9000")));
    }
    if own_ranges.iter().any(|c| c.addr().is_ipv6()) && mtu < 1280 {
        return Err(err(
            "tun.mtu",
            format!("{mtu} is below IPv6's minimum link MTU (1280)"),
        ));
    }
    for (i, r) in t.routes.iter().enumerate() {
        let f = format!("tun.routes[{i}]");
        let c = r.parse::<Cidr>().map_err(|e| err(&f, e.to_string()))?;
        if !own_ranges
            .iter()
            .any(|o| o.addr().is_ipv4() == c.addr().is_ipv4())
        {
            return Err(err(
                &f,
                format!("`{r}`: an IPv6 route needs an IPv6 tunnel address (`tun.address6`)"),
            ));
        }
        // (IPv4 routes are taken as they always were.)
        if let Some(o) = own_ranges[1..].iter().find(|o| o.overlaps(&c)) {
            return Err(err(
                &f,
                format!(
                    "`{r}` overlaps the tunnel's own range {}/{}",
                    o.network(),
                    o.prefix()
                ),
            ));
        }
    }

    let p = f.peer.ok_or_else(|| err("peer", "required"))?;
    let public_key = p
        .public_key
        .as_deref()
        .ok_or_else(|| err("peer.public_key", "required"))?;
    let peer_public_key =
        PublicKey::from_base64(public_key).map_err(|e| err("peer.public_key", e.to_string()))?;
    let endpoint = p
        .endpoint
        .as_deref()
        .map(|e| parse_addr("peer.endpoint", e))
        .transpose()?;
    if p.allowed_ips.is_empty() {
        return Err(err("peer.allowed_ips", "at least one prefix is required"));
    }
    let mut allowed_ips = Vec::new();
    for (i, a) in p.allowed_ips.iter().enumerate() {
        allowed_ips.push(
            a.parse::<Cidr>()
                .map_err(|e| err(&format!("peer.allowed_ips[{i}]"), e.to_string()))?,
        );
    }
    let preshared_key = p
        .preshared_key_file
        .as_deref()
        .map(|path| {
            let text = read_key_file("peer.preshared_key_file", &resolve(path))?;
            PresharedKey::from_base64(&text)
                .map_err(|e| err("peer.preshared_key_file", e.to_string()))
        })
        .transpose()?;
    let dead_peer_timeout = match p.dead_peer_timeout_s {
        Some(0) => return Err(err("peer.dead_peer_timeout_s", "must be positive")),
        Some(s) => Some(Duration::from_secs(s)),
        None => endpoint.map(|_| Duration::from_secs(60)),
    };
    Ok(TunnelConfig {
        mode,
        listen,
        admin,
        drain_timeout: Duration::from_millis(f.drain_timeout_ms.unwrap_or(5000)),
        key_reload: match f.key_reload_seconds.unwrap_or(5) {
            0 => None,
            n => Some(Duration::from_secs(n)),
        },
        tun: TunSettings {
            name,
            address,
            address6: t.address6,
            mtu,
            routes: t.routes,
            offload: t.offload.unwrap_or(true),
        },
        peer: PeerConfig {
            private_key,
            peer_public_key,
            preshared_key,
            endpoint,
            persistent_keepalive: p.persistent_keepalive,
            dead_peer_timeout,
            allowed_ips,
            index: rand::random::<u32>(),
            previous_private_keys: Vec::new(),
            previous_peer_public_keys: Vec::new(),
            solicit_after: None,
        },
    })
}

/// Best effort: the field a serde message mentions (`unknown field `x``, `missing field `y``).
fn field_from_serde(msg: &str) -> String {
    msg.split('`')
        .nth(1)
        .filter(|f| !f.is_empty() && f.len() < 64)
        .unwrap_or("config")
        .to_string()
}

/// Reads and parses a config file.
pub fn load(path: &Path) -> Result<TunnelConfig, TunnelConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| err("config", format!("cannot read {}: {e}", path.display())))?;
    parse(path, &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_key(dir: &Path) -> PathBuf {
        let p = dir.join("key");
        std::fs::write(&p, PrivateKey::generate().to_base64()).unwrap();
        p
    }

    fn good(key: &Path) -> String {
        format!(
            r#"
listen = "127.0.0.1:0"
private_key_file = "{}"
[tun]
address = "198.18.41.2/24"
routes = ["198.18.50.0/24"]
[peer]
public_key = "{}"
endpoint = "198.18.40.2:51820"
allowed_ips = ["198.18.41.1/32"]
"#,
            key.display(),
            PrivateKey::generate().public_key()
        )
    }

    #[test]
    fn valid_config_parses_with_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let key = write_key(dir.path());
        let c = parse(&dir.path().join("c.toml"), &good(&key)).unwrap();
        assert_eq!(c.mode, Mode::Tun);
        assert_eq!(c.tun.mtu, 1420);
        assert!(c.tun.offload);
        assert_eq!(c.tun.name, "hcpolm0");
        assert_eq!(c.peer.dead_peer_timeout, Some(Duration::from_secs(60)));
        assert_eq!(c.tun.address6, None);
        let text = good(&key)
            .replace("[tun]", "[tun]\naddress6 = \"fd00:41::2/64\"")
            .replace(
                "[\"198.18.50.0/24\"]",
                "[\"198.18.50.0/24\", \"fd00:50::/64\"]",
            )
            .replace(
                "[\"198.18.41.1/32\"]",
                "[\"198.18.41.1/32\", \"fd00:41::1/128\"]",
            );
        let c = parse(&dir.path().join("c.toml"), &text).unwrap();
        assert_eq!(c.tun.address6.as_deref(), Some("fd00:41::2/64"));
        assert_eq!(c.tun.routes.len(), 2);
        assert_eq!(c.peer.allowed_ips.len(), 2);
    }

    #[test]
    fn errors_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let key = write_key(dir.path());
        let path = dir.path().join("c.toml");
        let base = good(&key);
        let cases = [
            (base.replace("198.18.41.2/24", "198.18.41.2"), "tun.address"),
            (
                base.replace("[\"198.18.50.0/24\"]", "[\"x\"]"),
                "tun.routes[0]",
            ),
            (
                base.replace("public_key = \"", "public_key = \"!!"),
                "peer.public_key",
            ),
            (
                base.replace("198.18.40.2:51820", "nowhere"),
                "peer.endpoint",
            ),
            (
                base.replace("allowed_ips = [\"198.18.41.1/32\"]", "allowed_ips = []"),
                "peer.allowed_ips",
            ),
            (format!("mode = \"userspace\"\n{base}"), "mode"),
            (format!("bogus = 1\n{base}"), "bogus"),
            (
                base.replace(&key.display().to_string(), "/nonexistent/key"),
                "private_key_file",
            ),
            (base.replace("[tun]", "[tun]\nmtu = 100"), "tun.mtu"),
            (
                base.replace("[tun]", "[tun]\nname = \"much-too-long-name0\""),
                "tun.name",
            ),
            // Issue 19: IPv6 inside.
            (
                base.replace("[\"198.18.50.0/24\"]", "[\"fd00:50::/64\"]"),
                "tun.routes[0]",
            ),
            (
                base.replace("[tun]", "[tun]\naddress6 = \"198.18.45.2/24\""),
                "tun.address6",
            ),
            (
                base.replace("[tun]", "[tun]\naddress6 = \"fd00:41::2\""),
                "tun.address6",
            ),
            (
                base.replace("[tun]", "[tun]\naddress6 = \"fd00:41::2/64\"")
                    .replace("[\"198.18.50.0/24\"]", "[\"fd00:41::/48\"]"),
                "tun.routes[0]",
            ),
        ];
        for (text, field) in cases {
            let e = parse(&path, &text).unwrap_err();
            assert_eq!(e.field, field, "{e}");
        }
    }
}
