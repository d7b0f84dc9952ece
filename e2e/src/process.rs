//! Child processes that stand in for pods: logged to files, killed by PID and waited for.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

/// Errors starting a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The program could not be started.
    #[error("cannot start {name} ({program}): {source}")]
    Spawn {
        name: String,
        program: String,
        source: std::io::Error,
    },
    /// The log file could not be created.
    #[error("cannot create log file {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Builds a [`Command`] that runs `program` with the parent-death signal set to SIGKILL, so the
/// process dies with the test even if the test process is killed before its destructors run.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut cmd = Command::new("setpriv");
    cmd.arg("--pdeathsig").arg("KILL").arg("--").arg(program);
    cmd
}

/// A running child process. Dropping it kills the process (SIGKILL) and waits for it.
/// Clones share the same process.
#[derive(Clone, Debug)]
pub struct ManagedProcess {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    name: String,
    pid: u32,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

impl ManagedProcess {
    /// Spawns `cmd` with stdout and stderr appended to `log`; stdin is closed.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Self, ProcessError> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| ProcessError::Log {
                path: log.to_owned(),
                source,
            })?;
        let err = out.try_clone().map_err(|source| ProcessError::Log {
            path: log.to_owned(),
            source,
        })?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let program = format!("{:?}", cmd.get_program());
        let child = cmd.spawn().map_err(|source| ProcessError::Spawn {
            name: name.to_string(),
            program,
            source,
        })?;
        tracing::debug!(name, pid = child.id(), "started");
        Ok(Self {
            inner: Arc::new(Inner {
                name: name.to_string(),
                pid: child.id(),
                log: log.to_owned(),
                child: Mutex::new(Some(child)),
            }),
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// The name given at spawn.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.inner.log
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&self) -> Option<std::process::ExitStatus> {
        let mut guard = self.inner.child.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_mut() {
            Some(child) => child.try_wait().ok().flatten(),
            None => None,
        }
    }

    /// The last `lines` lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.inner.log, lines)
    }

    /// Kills the process (SIGKILL) and waits for it. Idempotent.
    pub fn kill(&self) {
        self.inner.kill();
    }
}

impl Inner {
    fn kill(&self) {
        let mut guard = self.child.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(mut child) = guard.take() {
            let _ = child.kill();
            let _ = child.wait();
            tracing::debug!(name = %self.name, pid = self.pid, "stopped");
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a file (empty if unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
