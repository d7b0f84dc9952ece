//! `make demo`: the main job on a local embedded environment.
//!
//! Today: starts the management and guest control planes from the pinned upstream binaries,
//! installs the OLM and OperatorHub CRDs into the guest (as HyperShift's CVO would), prints how
//! to reach both clusters, and keeps them up until Ctrl-C. Without a terminal on stdin it tears
//! down after the summary; the last line is `demo: ok` or `demo: failed at <step>`.

use std::io::IsTerminal as _;
use std::time::Instant;

use anyhow::{Context as _, Result};
use hcp_olm_e2e::Environment;
use hcp_olm_e2e::tools::fixtures_dir;

async fn step<T>(
    name: &'static str,
    failed: &mut Option<&'static str>,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Option<T> {
    println!("demo: {name} ...");
    let start = Instant::now();
    match fut.await {
        Ok(v) => {
            println!(
                "demo: {name}: done in {:.1}s",
                start.elapsed().as_secs_f64()
            );
            Some(v)
        }
        Err(e) => {
            eprintln!("demo: {name}: {e:#}");
            *failed = Some(name);
            None
        }
    }
}

async fn run(failed: &mut Option<&'static str>) -> Option<Environment> {
    let env = step(
        "start management and guest control planes (etcd + kube-apiserver)",
        failed,
        async { Environment::start().await.context("starting the clusters") },
    )
    .await?;
    let crd_dir = fixtures_dir().join("crds");
    let crds = step(
        "install OLM and OperatorHub CRDs into the guest",
        failed,
        async {
            let mut files = Vec::new();
            for sub in ["olm", "openshift"] {
                let dir = crd_dir.join(sub);
                for entry in
                    std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
                {
                    let path = entry?.path();
                    if path.extension().is_some_and(|e| e == "yaml") {
                        files.push(path);
                    }
                }
            }
            files.sort();
            Ok(env.guest.install_crds(&files).await?)
        },
    )
    .await?;

    println!();
    println!("== environment");
    for c in [&env.management, &env.guest] {
        println!(
            "  {:<10} {}  pids {:?}\n             kubectl --kubeconfig {} get namespaces",
            c.name(),
            c.url(),
            c.pids(),
            c.kubeconfig().display()
        );
    }
    println!("== guest CRDs ({}):", crds.len());
    for name in &crds {
        println!("  {name}");
    }
    Some(env)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut failed = None;
    let env = run(&mut failed).await;
    if let Some(env) = &env
        && std::io::stdin().is_terminal()
    {
        println!("\nThe environment stays up until Ctrl-C.");
        let _ = tokio::signal::ctrl_c().await;
        println!(
            "demo: tearing down {} and {}",
            env.management.name(),
            env.guest.name()
        );
    }
    drop(env);
    match failed {
        None => println!("demo: ok"),
        Some(step) => {
            println!("demo: failed at {step}");
            std::process::exit(1);
        }
    }
}
