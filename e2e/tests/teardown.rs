//! No leftovers: processes of a test environment die with the test process, even when the
//! test process is SIGKILLed and no destructor runs (parent-death signal).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use hcp_olm_e2e::{Cluster, ClusterOptions};

const CHILD_ENV: &str = "HCP_OLM_E2E_TEARDOWN_CHILD";

/// Child mode only: starts a cluster, writes its pids to the marker file and waits to be killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_a_cluster_until_killed() -> Result<()> {
    let Some(marker) = std::env::var_os(CHILD_ENV) else {
        return Ok(()); // run as a normal test: nothing to do
    };
    let cluster = Cluster::start(ClusterOptions::new("orphan")).await?;
    let [a, b] = cluster.pids();
    std::fs::write(&marker, format!("{a} {b}"))?;
    tokio::time::sleep(Duration::from_secs(120)).await;
    Ok(())
}

fn alive(pid: u32) -> bool {
    // A zombie still has /proc/<pid>; it counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.split(' ').nth(2).is_none_or(|s| s != "Z"),
        Err(_) => false,
    }
}

#[test]
fn processes_die_when_the_test_process_is_killed() -> Result<()> {
    if std::env::var_os(CHILD_ENV).is_some() {
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let marker = dir.path().join("pids");
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args([
            "--exact",
            "child_holds_a_cluster_until_killed",
            "--nocapture",
        ])
        .env(CHILD_ENV, &marker)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let start = Instant::now();
    let pids: Vec<u32> = loop {
        if let Ok(text) = std::fs::read_to_string(&marker)
            && !text.is_empty()
        {
            break text.split(' ').map(str::parse).collect::<Result<_, _>>()?;
        }
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("child exited early: {status}");
        }
        ensure!(
            start.elapsed() < Duration::from_secs(120),
            "child never started its cluster"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    ensure!(
        pids.iter().all(|&p| alive(p)),
        "cluster processes not running: {pids:?}"
    );
    child.kill().context("SIGKILL the child")?;
    child.wait()?;
    let start = Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        ensure!(
            start.elapsed() < Duration::from_secs(10),
            "processes {pids:?} outlived the killed test process"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
