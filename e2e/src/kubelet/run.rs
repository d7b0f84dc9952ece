//! Starting a planned pod: volumes written to disk, each container's image materialised as
//! its root filesystem, the process started under `bwrap` (private mount, PID and UTS
//! namespaces; the pod's network namespace when given), init containers run to completion
//! in order, then the containers started and their probes run.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::image::ImageStore;
use super::plan::{ContainerPlan, PodPlan, VolumePlan};
use super::probe::{self, Dialer, ProbeResult};
use crate::netns::Netns;
use crate::process::{self, ManagedProcess};

/// Why a pod could not be run (or stopped being healthy).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("pod {pod}: {what}: {source}")]
    Io {
        pod: String,
        what: String,
        source: std::io::Error,
    },
    #[error("pod {pod}: image {image} vanished from the store")]
    Image { pod: String, image: String },
    #[error("pod {pod}: cannot start container {container}: {reason}")]
    Start {
        pod: String,
        container: String,
        reason: String,
    },
    #[error("pod {pod}: init container {container} failed ({status}); log tail:\n{log}")]
    InitFailed {
        pod: String,
        container: String,
        status: String,
        log: String,
    },
    #[error(
        "pod {pod}: init container {container} did not finish within {seconds}s; log tail:\n{log}"
    )]
    InitTimeout {
        pod: String,
        container: String,
        seconds: u64,
        log: String,
    },
    #[error("pod {pod}: container {container} exited ({status}); log tail:\n{log}")]
    Exited {
        pod: String,
        container: String,
        status: String,
        log: String,
    },
    #[error(
        "pod {pod}: container {container} {probe} probe never passed within {seconds}s (last: {last}); log tail:\n{log}"
    )]
    NeverReady {
        pod: String,
        container: String,
        probe: &'static str,
        seconds: u64,
        last: String,
        log: String,
    },
}

/// Where and how a pod runs.
#[derive(Clone, Debug)]
pub struct PodSite<'a> {
    /// The pod's name (hostname inside).
    pub name: &'a str,
    /// The pod's network namespace; `None` runs it in the caller's network namespace.
    pub netns: Option<&'a Netns>,
    /// The pod's IP (for `/etc/hosts` and probes). Loopback when `netns` is None.
    pub ip: std::net::IpAddr,
    /// A directory the runner may use for the pod's files (created if missing).
    pub dir: &'a Path,
    /// How long init containers may take, each.
    pub init_timeout: Duration,
}

/// A running pod. Dropping it kills its containers by PID and waits for them.
#[derive(Debug)]
pub struct RunningPod {
    name: String,
    containers: Vec<(ContainerPlan, ManagedProcess)>,
    dialer: Dialer,
}

impl RunningPod {
    /// The pod's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The containers' processes, by container name.
    pub fn processes(&self) -> impl Iterator<Item = (&str, &ManagedProcess)> {
        self.containers.iter().map(|(c, p)| (c.name.as_str(), p))
    }

    /// Runs every container's readiness probe once (a container without one is ready when
    /// running). Exited containers are errors.
    pub async fn ready(&self) -> Result<bool, RunError> {
        for (c, p) in &self.containers {
            self.check_alive(c, p)?;
            if let Some(probe) = &c.readiness
                && probe::run(&self.dialer, probe).await != ProbeResult::Success
            {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Waits until every container's startup and readiness probes pass, within `timeout`.
    /// A container that exits, or a probe that never passes, is an error with the log tail.
    pub async fn wait_ready(&self, timeout: Duration) -> Result<(), RunError> {
        let deadline = Instant::now() + timeout;
        for (c, p) in &self.containers {
            for (kind, probe) in [("startup", &c.startup), ("readiness", &c.readiness)] {
                let Some(probe) = probe else { continue };
                tokio::time::sleep(
                    Duration::from_secs(probe.initial_delay_s.into())
                        .min(deadline.saturating_duration_since(Instant::now())),
                )
                .await;
                loop {
                    self.check_alive(c, p)?;
                    let last = probe::run(&self.dialer, probe).await;
                    if last == ProbeResult::Success {
                        break;
                    }
                    if Instant::now() >= deadline {
                        return Err(RunError::NeverReady {
                            pod: self.name.clone(),
                            container: c.name.clone(),
                            probe: kind,
                            seconds: timeout.as_secs(),
                            last: last.to_string(),
                            log: p.log_tail(20),
                        });
                    }
                    // the kubelet waits a full period; tests poll faster, bounded by it
                    let pause = Duration::from_secs(probe.period_s.into())
                        .min(Duration::from_millis(500))
                        .min(deadline.saturating_duration_since(Instant::now()));
                    tokio::time::sleep(pause).await;
                }
            }
        }
        Ok(())
    }

    fn check_alive(&self, c: &ContainerPlan, p: &ManagedProcess) -> Result<(), RunError> {
        match p.exited() {
            Some(status) => Err(RunError::Exited {
                pod: self.name.clone(),
                container: c.name.clone(),
                status: status.to_string(),
                log: p.log_tail(20),
            }),
            None => Ok(()),
        }
    }

    /// Kills every container (SIGKILL by PID) and waits for them.
    pub fn stop(&self) {
        for (_, p) in &self.containers {
            p.kill();
        }
    }
}

impl Drop for RunningPod {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `plan` at `site`: writes volumes, runs init containers to completion, starts the
/// containers. Does not wait for readiness (see [`RunningPod::wait_ready`]).
pub async fn start(
    plan: &PodPlan,
    images: &ImageStore,
    site: &PodSite<'_>,
) -> Result<RunningPod, RunError> {
    let pod = site.name.to_string();
    let io = |what: String| {
        let pod = pod.clone();
        move |source| RunError::Io { pod, what, source }
    };
    let dir = site.dir;
    std::fs::create_dir_all(dir).map_err(io(format!("creating {}", dir.display())))?;
    let vol_root = dir.join("volumes");
    for (name, v) in &plan.volumes {
        let vdir = vol_root.join(volume_dir_name(name));
        std::fs::create_dir_all(&vdir).map_err(io(format!("creating volume {name}")))?;
        if let VolumePlan::Files(files) = v {
            for f in files {
                let path = vdir.join(&f.path);
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent).map_err(io(format!("volume {name}")))?;
                }
                std::fs::write(&path, &f.data)
                    .map_err(io(format!("writing {}", path.display())))?;
                set_mode(&path, f.mode).map_err(io(format!("chmod {}", path.display())))?;
            }
        }
    }
    let hosts = dir.join("hosts");
    std::fs::write(
        &hosts,
        format!(
            "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n{}\t{}\n",
            site.ip, site.name
        ),
    )
    .map_err(io("writing /etc/hosts".into()))?;

    for c in &plan.init_containers {
        let p = spawn(c, images, site, &vol_root, &hosts)?;
        let deadline = Instant::now() + site.init_timeout;
        let status = loop {
            if let Some(s) = p.exited() {
                break s;
            }
            if Instant::now() >= deadline {
                let log = p.log_tail(20);
                p.kill();
                return Err(RunError::InitTimeout {
                    pod,
                    container: c.name.clone(),
                    seconds: site.init_timeout.as_secs(),
                    log,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if !status.success() {
            return Err(RunError::InitFailed {
                pod,
                container: c.name.clone(),
                status: status.to_string(),
                log: p.log_tail(20),
            });
        }
    }
    let mut containers = Vec::new();
    for c in &plan.containers {
        let p = spawn(c, images, site, &vol_root, &hosts)?;
        containers.push((c.clone(), p));
    }
    Ok(RunningPod {
        name: pod,
        containers,
        dialer: match site.netns {
            Some(ns) => Dialer::Netns {
                netns: ns.name().to_string(),
                ip: site.ip,
            },
            None => Dialer::Direct { ip: site.ip },
        },
    })
}

fn volume_dir_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// The `bwrap` arguments for a container (everything before the program's argv).
pub fn bwrap_args(
    c: &ContainerPlan,
    rootfs: &Path,
    vol_root: &Path,
    hosts: &Path,
    hostname: &str,
    host_libraries: bool,
) -> Vec<String> {
    let s = |p: &Path| p.display().to_string();
    let mut a: Vec<String> = vec![
        "--bind".into(),
        s(rootfs),
        "/".into(),
        "--proc".into(),
        "/proc".into(),
        "--dev".into(),
        "/dev".into(),
        "--unshare-pid".into(),
        "--unshare-uts".into(),
        "--unshare-ipc".into(),
        "--hostname".into(),
        hostname.into(),
        "--die-with-parent".into(),
        "--ro-bind".into(),
        s(hosts),
        "/etc/hosts".into(),
    ];
    if Path::new("/etc/resolv.conf").exists() {
        // inside `ip netns exec`, this is the namespace's own resolv.conf
        a.extend(["--ro-bind", "/etc/resolv.conf", "/etc/resolv.conf"].map(String::from));
    }
    if host_libraries {
        a.extend(
            [
                "--ro-bind",
                "/usr",
                "/usr",
                "--symlink",
                "usr/lib",
                "/lib",
                "--symlink",
                "usr/lib64",
                "/lib64",
            ]
            .map(String::from),
        );
    }
    for m in &c.mounts {
        let mut src = vol_root.join(volume_dir_name(&m.volume));
        if let Some(sub) = &m.sub_path {
            src = src.join(sub);
        }
        a.push(if m.read_only { "--ro-bind" } else { "--bind" }.into());
        a.push(s(&src));
        a.push(m.dest.clone());
    }
    if c.read_only_root {
        a.extend(["--remount-ro", "/"].map(String::from));
    }
    a.push("--chdir".into());
    a.push(c.working_dir.clone().unwrap_or_else(|| "/".into()));
    a.push("--clearenv".into());
    for (k, v) in &c.env {
        a.extend(["--setenv".to_string(), k.clone(), v.clone()]);
    }
    a.push("--".into());
    a
}

fn spawn(
    c: &ContainerPlan,
    images: &ImageStore,
    site: &PodSite<'_>,
    vol_root: &Path,
    hosts: &Path,
) -> Result<ManagedProcess, RunError> {
    let pod = site.name.to_string();
    let image = images.get(&c.image).ok_or_else(|| RunError::Image {
        pod: pod.clone(),
        image: c.image.clone(),
    })?;
    let rootfs: PathBuf = site.dir.join(format!("rootfs-{}", c.name));
    let _ = std::fs::remove_dir_all(&rootfs);
    std::fs::create_dir_all(&rootfs)
        .and_then(|_| image.materialize(&rootfs))
        .map_err(|source| RunError::Io {
            pod: pod.clone(),
            what: format!("materialising image {} for {}", c.image, c.name),
            source,
        })?;
    let args = bwrap_args(c, &rootfs, vol_root, hosts, site.name, image.host_libraries);
    let mut cmd = match site.netns {
        Some(ns) => ns.command("bwrap"),
        None => process::command("bwrap"),
    };
    cmd.args(&args).args(&c.argv);
    let log = site.dir.join(format!("{}.log", c.name));
    let name = format!("{}.{}", site.name, c.name);
    let started = match site.netns {
        Some(ns) => ns.spawn(&name, cmd).map_err(|e| e.to_string()),
        None => ManagedProcess::spawn(&name, cmd, &log).map_err(|e| e.to_string()),
    };
    started.map_err(|reason| RunError::Start {
        pod,
        container: c.name.clone(),
        reason,
    })
}
