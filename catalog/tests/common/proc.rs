//! Child processes for tests: logged to a file, killed by PID and waited for
//! on drop (and by the kernel if the test process dies), plus locating the
//! pinned upstream binaries the way `hcp-olm-e2e` does (same directories and
//! environment variables; see e2e/src/tools.rs).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// Path of an upstream tool in `$HCP_OLM_TOOLS_DIR`, `$HCP_OLM_CACHE/bin` or
/// `~/.cache/hcp-olm/bin`; an error telling to run `make tools` otherwise.
pub fn tool(name: &str) -> Result<PathBuf, String> {
    let dir = if let Some(d) = std::env::var_os("HCP_OLM_TOOLS_DIR") {
        PathBuf::from(d)
    } else {
        let cache = std::env::var_os("HCP_OLM_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
                Path::new(&home).join(".cache/hcp-olm")
            });
        cache.join("bin")
    };
    let path = dir.join(name);
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "upstream tool `{name}` not found at {}: run `make tools` first",
            path.display()
        ))
    }
}

/// A [`Command`] whose process gets SIGKILL when the test process dies.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.arg("--pdeathsig").arg("KILL").arg("--").arg(program);
    cmd
}

/// A loopback port free now and reserved for this test process (across processes too).
pub fn free_port() -> std::io::Result<u16> {
    hcp_olm_e2e::ports::free_port()
}

/// A running child; dropping it kills (SIGKILL) and waits.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

impl ManagedProcess {
    /// Spawns with stdout/stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> std::io::Result<Self> {
        let out = File::options().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let child = cmd.stdin(Stdio::null()).stdout(out).stderr(err).spawn()?;
        Ok(ManagedProcess {
            name: name.into(),
            log: log.into(),
            child: Mutex::new(Some(child)),
        })
    }

    /// Name given at spawn.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// PID.
    pub fn pid(&self) -> Option<u32> {
        self.child
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Child::id)
    }

    /// Exit status once exited.
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut g = self.child.lock().unwrap_or_else(|p| p.into_inner());
        g.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// Last lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Kill (SIGKILL) and wait; idempotent.
    pub fn kill(&self) {
        if let Some(mut c) = self.child.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
