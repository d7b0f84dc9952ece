//! Network namespaces joined by veth pairs, for tests that need more than loopback.
//!
//! Addresses come from 198.18.0.0/15 (or fd00::/8). Each namespace can have its own
//! `resolv.conf` (`/etc/netns/<name>/resolv.conf`, which `ip netns exec` bind-mounts).
//! Teardown order: processes started in a namespace are killed by PID and waited for, then the
//! namespace is deleted, then its `/etc/netns` directory is removed.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::process::{ManagedProcess, ProcessError};

/// Errors from namespace and link management.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// An `ip` command failed.
    #[error("`{command}` failed: {stderr}")]
    Command { command: String, stderr: String },
    /// A file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    /// A process could not be started.
    #[error(transparent)]
    Process(#[from] ProcessError),
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A name unique to this process and call: `<prefix><pid base36><counter>`, at most 15 bytes
/// (the Linux interface-name limit), so it can name interfaces too.
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mut pid = std::process::id();
    let mut id = String::new();
    while pid > 0 {
        id.insert(0, std::char::from_digit(pid % 36, 36).unwrap_or('0'));
        pid /= 36;
    }
    let mut name = format!("{prefix}{id}x{n}");
    name.truncate(15);
    name
}

/// Runs `ip <args>` in the caller's namespace.
pub(crate) fn run_ip(args: &[&str]) -> Result<String, NetnsError> {
    run(args)
}

fn run(args: &[&str]) -> Result<String, NetnsError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|source| NetnsError::Io {
            what: "running `ip` (package iproute2)".into(),
            source,
        })?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(NetnsError::Command {
            command: format!("ip {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// A network namespace. Dropping it kills its processes, then deletes it.
#[derive(Debug)]
pub struct Netns {
    name: String,
    procs: Mutex<Vec<ManagedProcess>>,
    log_dir: tempfile::TempDir,
}

impl Netns {
    /// Creates a namespace with a unique name starting with `prefix` and brings `lo` up.
    pub fn create(prefix: &str) -> Result<Self, NetnsError> {
        let name = unique_name(prefix);
        run(&["netns", "add", &name])?;
        let log_dir = tempfile::Builder::new()
            .prefix(&format!("hcp-olm-netns-{name}-"))
            .tempdir()
            .map_err(|source| NetnsError::Io {
                what: "creating a log directory".into(),
                source,
            });
        let name_for_cleanup = name.clone();
        let ns = Self {
            name,
            procs: Mutex::new(Vec::new()),
            log_dir: match log_dir {
                Ok(d) => d,
                Err(e) => {
                    let _ = run(&["netns", "del", &name_for_cleanup]);
                    return Err(e);
                }
            },
        };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n <ns> <args>`.
    pub fn ip(&self, args: &[&str]) -> Result<String, NetnsError> {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        run(&all)
    }

    /// Sets the MTU of every veth in this namespace; returns how many there were.
    pub fn set_veth_mtu(&self, mtu: u32) -> Result<usize, NetnsError> {
        let text = self.ip(&["-o", "link", "show", "type", "veth"])?;
        let names: Vec<String> = text
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect();
        for n in &names {
            self.ip(&["link", "set", "dev", n, "mtu", &mtu.to_string()])?;
        }
        Ok(names.len())
    }

    fn etc_dir(&self) -> PathBuf {
        PathBuf::from("/etc/netns").join(&self.name)
    }

    /// Writes the `resolv.conf` that processes in this namespace see.
    pub fn set_resolv_conf(&self, contents: &str) -> Result<(), NetnsError> {
        self.set_etc_file("resolv.conf", contents)
    }

    /// Writes the `hosts` file that processes in this namespace see. Rewriting it later
    /// reaches running processes too (same file, written in place).
    pub fn set_hosts(&self, contents: &str) -> Result<(), NetnsError> {
        self.set_etc_file("hosts", contents)
    }

    fn set_etc_file(&self, name: &str, contents: &str) -> Result<(), NetnsError> {
        let dir = self.etc_dir();
        std::fs::create_dir_all(&dir).map_err(|source| NetnsError::Io {
            what: format!("creating {}", dir.display()),
            source,
        })?;
        let file = dir.join(name);
        std::fs::write(&file, contents).map_err(|source| NetnsError::Io {
            what: format!("writing {}", file.display()),
            source,
        })
    }

    /// A command that runs `program` inside this namespace (with parent-death SIGKILL).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &self.name,
            "setpriv",
            "--pdeathsig",
            "KILL",
            "--",
        ])
        .arg(program);
        cmd
    }

    /// Runs a command inside the namespace to completion and returns its output.
    pub fn output(&self, program: &str, args: &[&str]) -> Result<std::process::Output, NetnsError> {
        self.command(program)
            .args(args)
            .output()
            .map_err(|source| NetnsError::Io {
                what: format!("running {program} in {}", self.name),
                source,
            })
    }

    /// Starts a long-running process inside the namespace. The namespace keeps a handle and
    /// kills it before the namespace is deleted; the caller may kill it earlier.
    pub fn spawn(&self, name: &str, cmd: Command) -> Result<ManagedProcess, NetnsError> {
        let log = self.log_dir.path().join(format!("{name}.log"));
        let p = ManagedProcess::spawn(name, cmd, &log)?;
        self.procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(p.clone());
        Ok(p)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // 1. processes, by PID, waited for
        for p in self
            .procs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            p.kill();
        }
        // 2. the namespace (its veth ends go with it)
        if let Err(e) = run(&["netns", "del", &self.name]) {
            tracing::warn!(netns = %self.name, error = %e, "deleting namespace failed");
        }
        // 3. its /etc/netns directory
        let _ = std::fs::remove_dir_all(self.etc_dir());
    }
}

/// Joins two namespaces with a veth pair and assigns addresses (CIDR form, e.g.
/// `198.18.0.1/30`) to each end. Returns the interface names (`a` side, `b` side).
pub fn connect(
    a: &Netns,
    a_addr: &str,
    b: &Netns,
    b_addr: &str,
) -> Result<(String, String), NetnsError> {
    let a_if = unique_name("va");
    let b_if = unique_name("vb");
    run(&[
        "link",
        "add",
        &a_if,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        &b_if,
        "netns",
        b.name(),
    ])?;
    for (ns, ifname, addr) in [(a, &a_if, a_addr), (b, &b_if, b_addr)] {
        ns.ip(&["addr", "add", addr, "dev", ifname])?;
        ns.ip(&["link", "set", ifname, "up"])?;
    }
    Ok((a_if, b_if))
}

/// Adds a route in `ns` for `cidr` via `gateway`.
pub fn route(ns: &Netns, cidr: &str, gateway: &str) -> Result<(), NetnsError> {
    ns.ip(&["route", "add", cidr, "via", gateway]).map(|_| ())
}

/// A process started in a namespace; re-exported for convenience.
pub type NsProcess = ManagedProcess;

/// Runs `f` on a short-lived thread that has joined the network namespace `netns` (by name)
/// and returns its result. Sockets `f` creates stay in `netns`; no other thread of the caller
/// changes namespace.
pub async fn in_netns<T, F>(netns: &str, f: F) -> std::io::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> std::io::Result<T> + Send + 'static,
{
    let path = PathBuf::from("/var/run/netns").join(netns);
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name(format!("netns-{netns}"))
        .spawn(move || {
            let result = (|| {
                let file = std::fs::File::open(&path)?;
                nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
                    .map_err(std::io::Error::from)?;
                f()
            })();
            let _ = tx.send(result);
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("netns thread vanished"))?
}

/// Opens a TCP connection from inside the network namespace `netns`, bounded by `timeout`.
pub async fn connect_tcp_in(
    netns: &str,
    addr: std::net::SocketAddr,
    timeout: std::time::Duration,
) -> std::io::Result<std::net::TcpStream> {
    in_netns(netns, move || {
        std::net::TcpStream::connect_timeout(&addr, timeout)
    })
    .await
}

/// Binds a TCP listener inside the network namespace `netns`.
pub async fn bind_tcp_in(
    netns: &str,
    addr: std::net::SocketAddr,
) -> std::io::Result<std::net::TcpListener> {
    in_netns(netns, move || std::net::TcpListener::bind(addr)).await
}

#[cfg(test)]
mod tests {
    use super::unique_name;

    #[test]
    fn unique_names_fit_interface_limit_and_differ() {
        let a = unique_name("veth-");
        let b = unique_name("veth-");
        assert_ne!(a, b);
        assert!(a.len() <= 15, "{a}");
    }
}
