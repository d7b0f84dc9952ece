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

/// Whether the registry's log says its port was taken.
fn text_says_in_use(log: &std::path::Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|t| t.contains("address already in use"))
}

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
        let auth = match htpasswd {
            Some(lines) => {
                let path = dir.path().join("htpasswd");
                std::fs::write(&path, lines)?;
                format!(
                    "auth:\n  htpasswd:\n    realm: hcp-olm-test\n    path: {}\n",
                    path.display()
                )
            }
            None => String::new(),
        };
        // A free port can be taken by another test's listener before the registry binds it;
        // then the registry exits ("address already in use") while a connect to the port
        // succeeds, and requests would reach the other server. Ready means: this process
        // logged that it listens on this address. Else try another port.
        const ATTEMPTS: u32 = 5;
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            let port = ports::free_port()?;
            let addr = std::net::SocketAddr::new(ip, port).to_string();
            let config = format!(
                "version: 0.1\nlog:\n  level: info\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: {addr}\n{auth}",
                dir.path().join("data").display()
            );
            let config_path = dir.path().join("config.yml");
            std::fs::write(&config_path, config)?;
            let mut cmd = process::command(&bin);
            cmd.arg("serve")
                .arg(&config_path)
                .env("OTEL_TRACES_EXPORTER", "none")
                .env("OTEL_SDK_DISABLED", "true");
            let log = dir.path().join(format!("registry-{attempt}.log"));
            let process = ManagedProcess::spawn("registry", cmd, &log)?;
            let bound = Duration::from_secs(20);
            let start = Instant::now();
            let listening = format!("listening on {addr}");
            loop {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if text.contains(&listening) && std::net::TcpStream::connect(&addr).is_ok() {
                    return Ok(Self {
                        process,
                        addr,
                        _dir: dir,
                    });
                }
                if process.exited().is_some() || start.elapsed() > bound {
                    last = Some(RegistryError::NotReady {
                        addr: addr.clone(),
                        bound,
                        log: process.log_tail(20),
                    });
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            process.kill();
            if !text_says_in_use(&log) {
                break;
            }
        }
        Err(last
            .unwrap_or_else(|| RegistryError::Io(std::io::Error::other("registry did not start"))))
    }

    /// Requests the registry has answered so far (its log's `response completed` lines,
    /// one per request at the info level it runs with).
    pub fn requests_served(&self) -> u64 {
        std::fs::read_to_string(self.process.log_path())
            .map(|t| t.matches("response completed").count() as u64)
            .unwrap_or(0)
    }

    /// `<ip>:<port>` (`127.0.0.1:<port>` unless started on another address), usable as the registry part of image references.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Replaces the users of a registry started with [`Registry::start_with_htpasswd`]
    /// (the registry reads its htpasswd file again when its modification time changes):
    /// credentials revoked at the registry, for tests.
    pub fn set_htpasswd_users(&self, users: &[(&str, &str)]) -> Result<(), RegistryError> {
        let path = self._dir.path().join("htpasswd");
        if !path.exists() {
            return Err(RegistryError::Io(std::io::Error::other(
                "this registry was started without htpasswd auth",
            )));
        }
        let lines: String = users.iter().map(|(u, h)| format!("{u}:{h}\n")).collect();
        std::fs::write(&path, lines)?;
        Ok(())
    }

    /// The registry's process id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }
}
