//! A real OCI registry (CNCF distribution) on loopback, for registry-lookup tests.

use std::time::{Duration, Instant};

use crate::process::{self, ManagedProcess, ProcessError};
use crate::{ports, tools};

/// Errors starting the registry.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error(transparent)]
    Tool(#[from] tools::ToolError),
    #[error(transparent)]
    Process(#[from] ProcessError),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("registry did not listen on {addr} within {bound:?}; last log lines:\n{log}")]
    NotReady {
        addr: String,
        bound: Duration,
        log: String,
    },
}

/// The password whose bcrypt hash (cost 4, for speed) is [`TEST_USER_HASH`].
pub const TEST_USER_PASSWORD: &str = "reader-password";
/// bcrypt of [`TEST_USER_PASSWORD`], for [`Registry::start_with_htpasswd`].
pub const TEST_USER_HASH: &str = "$2b$04$YTBWyrvuWWpeR9htC8snxOC6bGa7OysKMY95pmO8RYFr/K7.5IojW";

const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// A running registry; dropping it kills the process and removes its storage.
pub struct Registry {
    process: ManagedProcess,
    addr: String,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("addr", &self.addr)
            .finish()
    }
}

impl Registry {
    /// Starts a registry with filesystem storage on a free loopback port (plain HTTP).
    pub fn start() -> Result<Self, RegistryError> {
        Self::start_with(None, LOOPBACK)
    }

    /// [`Registry::start`] requiring HTTP basic auth (the registry's htpasswd backend):
    /// every request, reads included, needs one of `users` (name, bcrypt hash as in an
    /// htpasswd file, e.g. [`TEST_USER_HASH`]).
    pub fn start_with_htpasswd(users: &[(&str, &str)]) -> Result<Self, RegistryError> {
        let lines: String = users.iter().map(|(u, h)| format!("{u}:{h}\n")).collect();
        Self::start_with(Some(lines), LOOPBACK)
    }

    /// [`Registry::start_with_htpasswd`] on `ip` instead of loopback (the host end of a real
    /// node's link, [`crate::realnode::Site::host_ip`], so its containerd can pull).
    pub fn start_with_htpasswd_on(
        ip: std::net::IpAddr,
        users: &[(&str, &str)],
    ) -> Result<Self, RegistryError> {
        let lines: String = users.iter().map(|(u, h)| format!("{u}:{h}\n")).collect();
        Self::start_with(Some(lines), ip)
    }

    fn start_with(htpasswd: Option<String>, ip: std::net::IpAddr) -> Result<Self, RegistryError> {
        let bin = tools::bin("registry")?;
        let dir = tempfile::Builder::new()
            .prefix("hcp-olm-registry-")
            .tempdir()?;
        let port = ports::free_port()?;
        let addr = std::net::SocketAddr::new(ip, port).to_string();
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n",
            dir.path().join("data").display()
        );
        if let Some(lines) = htpasswd {
            let path = dir.path().join("htpasswd");
            std::fs::write(&path, lines)?;
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: hcp-olm-test\n    path: {}\n",
                path.display()
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config)?;
        let mut cmd = process::command(bin);
        cmd.arg("serve")
            .arg(&config_path)
            .env("OTEL_TRACES_EXPORTER", "none")
            .env("OTEL_SDK_DISABLED", "true");
        let process = ManagedProcess::spawn("registry", cmd, &dir.path().join("registry.log"))?;
        let bound = Duration::from_secs(20);
        let start = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            if start.elapsed() > bound || process.exited().is_some() {
                return Err(RegistryError::NotReady {
                    addr,
                    bound,
                    log: process.log_tail(20),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self {
            process,
            addr,
            _dir: dir,
        })
    }

    /// `<ip>:<port>` (`127.0.0.1:<port>` unless started on another address), usable as the registry part of image references.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The registry's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}
