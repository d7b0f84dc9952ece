//! `make demo` interrupted during its steps (Ctrl-C, or SIGTERM from a CI runner) tears down
//! what it started: no node namespace, cgroup or pod process of its sites is left. Failed on
//! the old code: SIGINT ended the process at once, and the containerd shims (double-forked,
//! so not killed with it) kept every pod running in namespaces and cgroups nobody removed.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};

/// `n` in base 36, as `netns::unique_name` writes the creating process's id.
fn base36(mut n: u32) -> String {
    let mut s = String::new();
    while n > 0 {
        s.insert(0, std::char::from_digit(n % 36, 36).unwrap_or('0'));
        n /= 36;
    }
    s
}

/// The demo's node namespaces (`hon<pid>x<n>`), their cgroups and the processes in them.
fn leftovers(prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(o) = Command::new("ip").args(["netns", "list"]).output() {
        for l in String::from_utf8_lossy(&o.stdout).lines() {
            if l.starts_with(prefix) {
                out.push(format!("netns {l}"));
            }
        }
    }
    for h in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        for d in std::fs::read_dir(h.path()).into_iter().flatten().flatten() {
            let name = d.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("hcp-olm-{prefix}")) {
                out.push(format!("cgroup {}", d.path().display()));
                for e in walkdir::WalkDir::new(d.path()).into_iter().flatten() {
                    if e.file_name() == "cgroup.procs"
                        && let Ok(p) = std::fs::read_to_string(e.path())
                    {
                        out.extend(p.lines().map(|p| format!("process {p}")));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn an_interrupted_demo_leaves_nothing_behind() -> Result<()> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hcp-olm-demo"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        // OLM panics under CI=true (the scenario unsets it for OLM's pods anyway)
        .env_remove("CI")
        .spawn()
        .context("starting hcp-olm-demo")?;
    let pid = child.id();
    let prefix = format!("hon{}x", base36(pid));
    let stdout = child.stdout.take().context("stdout")?;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout)
            .lines()
            .map_while(std::result::Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(240);
    // The nodes are up once the second step begins.
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => {
                let next = l.starts_with("== step: HostedCluster");
                let failed = l.starts_with("demo: failed");
                lines.push(l);
                if next {
                    break;
                }
                if failed {
                    let _ = child.kill();
                    let _ = child.wait();
                    bail!(
                        "the demo failed before its nodes were up:\n{}",
                        lines.join("\n")
                    );
                }
            }
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "the demo's nodes were not up within 240s:\n{}",
                    lines.join("\n")
                );
            }
        }
    }
    let before = leftovers(&prefix);
    ensure!(
        before.iter().any(|l| l.starts_with("netns"))
            && before.iter().any(|l| l.starts_with("process")),
        "the check does not see the demo's nodes ({prefix}): {before:?}"
    );
    let st = Command::new("kill")
        .args(["-INT", &pid.to_string()])
        .status()?;
    ensure!(st.success(), "kill -INT {pid}");
    let stop = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if Instant::now() > stop {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the demo did not exit within 120 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    lines.extend(rx.try_iter());
    ensure!(
        status.code() == Some(130),
        "exit status {status:?}; output:\n{}",
        lines.join("\n")
    );
    ensure!(
        lines.iter().any(|l| l == "demo: interrupted"),
        "no `demo: interrupted` line:\n{}",
        lines.join("\n")
    );
    // Namespaces are deleted once their last process is gone: allow a moment.
    let settle = Instant::now() + Duration::from_secs(20);
    loop {
        let left = leftovers(&prefix);
        if left.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < settle,
            "left behind after SIGINT: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    eprintln!(
        "[demo] interrupted after its nodes were up ({} node resources seen): exit 130, nothing left",
        before.len()
    );
    Ok(())
}
