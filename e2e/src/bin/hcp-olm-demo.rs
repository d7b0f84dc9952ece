//! `make demo`: the end-to-end scenario on a local embedded environment (see
//! `hcp_olm_e2e::scenario`): two real control planes with a real node each (containerd,
//! kubelet, kube-proxy, CoreDNS, controller-manager, scheduler), our controller, and what it
//! rendered run from images: the real OLM binaries, the default catalogs and the tunnel
//! gateway in the HCP namespace, the guest agent and a user's catalog in the guest.
//!
//! Each step prints progress and a summary. With a terminal on stdin the environment stays up
//! (before the HostedCluster is deleted) until Ctrl-C or SIGTERM, with the two kubeconfig paths
//! printed; then the deletion step runs and everything is torn down. Ctrl-C or SIGTERM during
//! the steps tears everything down at once (exit status 130). Without a terminal every step runs
//! and it tears down at once. The last line is `demo: ok` or `demo: failed at <step>`; the
//! exit status is 0 only if every step succeeded.
//!
//! Our binaries are taken from the directory of this executable (`make demo` builds them).
//!
//! `--guest ipv6` (`make demo DEMO_GUEST=ipv6`) runs the variant with an IPv6-only guest
//! (issue 19; `hcp_olm_e2e::scenario::GuestStack::Ipv6`); `--guest ipv4` is the default.

use std::io::IsTerminal as _;
use std::sync::Arc;

use hcp_olm_e2e::scenario::{self, Binaries, Finish, GuestStack};

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let stack = match guest_stack(std::env::args().skip(1)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hcp-olm-demo: {e}\nusage: hcp-olm-demo [--guest ipv4|ipv6]");
            std::process::exit(64);
        }
    };
    let interactive = std::io::stdin().is_terminal();
    let bins = match Binaries::next_to_current_exe() {
        Ok(b) => b,
        Err(e) => {
            println!("demo: cannot find our binaries: {e:#}");
            println!("demo: failed at setup");
            std::process::exit(1);
        }
    };
    let log: scenario::Log = Arc::new(|line: &str| println!("{line}"));
    let finish = if interactive {
        Finish::BeforeDelete
    } else {
        Finish::All
    };
    // Ctrl-C or SIGTERM during the steps: the run is dropped, and with it everything it
    // started (nodes and their pods by PID, sites, registry, control planes).
    let outcome = tokio::select! {
        o = scenario::run_with(&bins, log.clone(), finish, stack) => Some(o),
        sig = interrupted() => {
            println!("demo: {sig} during the steps: tearing down");
            None
        }
    };
    let Some(outcome) = outcome else {
        println!("demo: interrupted");
        std::process::exit(130);
    };
    let mut failed = outcome.failed.as_ref().map(|(step, e)| {
        println!("demo: step \"{step}\" failed: {e:#}");
        step.clone()
    });
    let mut steps = outcome.steps.clone();
    if let Some(world) = outcome.world {
        println!("\n== summary\n{}", scenario::summary(&world).await);
        if failed.is_some() {
            println!("{}", world.node_diagnosis().await);
            println!(
                "--- controller log (last 30 lines):\n{}",
                world.controller_log_tail(30)
            );
        }
        if interactive {
            println!("The environment stays up until Ctrl-C. Explore it with:");
            println!(
                "  kubectl --kubeconfig {} get hostedclusters,hostedolms -A",
                world.env.management.kubeconfig().display()
            );
            println!(
                "  kubectl --kubeconfig {} get catalogsources,packagemanifests -n openshift-marketplace",
                world.env.guest.kubeconfig().display()
            );
            let sig = interrupted().await;
            println!("demo: {sig}");
            if failed.is_none() {
                match scenario::delete_step(&world, &log).await {
                    Ok(s) => steps.push(scenario::StepRecord {
                        name: "delete the HostedCluster".into(),
                        seconds: s,
                        ok: true,
                    }),
                    Err(e) => {
                        println!("demo: delete failed: {e:#}");
                        failed = Some("delete the HostedCluster".into());
                    }
                }
            }
        }
        println!("demo: tearing down");
        world.teardown().await;
    }
    println!("\n== steps");
    for s in &steps {
        println!(
            "  {:>6.1}s  {}  {}",
            s.seconds,
            if s.ok { "ok    " } else { "FAILED" },
            s.name
        );
    }
    match failed {
        None => println!("demo: ok"),
        Some(step) => {
            println!("demo: failed at {step}");
            std::process::exit(1);
        }
    }
}

/// The guest's address families from the arguments: `--guest ipv4|ipv6` (or
/// `--guest=…`); default IPv4.
fn guest_stack(mut args: impl Iterator<Item = String>) -> Result<GuestStack, String> {
    let mut stack = GuestStack::Ipv4;
    while let Some(a) = args.next() {
        let value = match a.strip_prefix("--guest=") {
            Some(v) => v.to_string(),
            None if a == "--guest" => args.next().ok_or("--guest needs a value")?,
            None => return Err(format!("unknown argument {a:?}")),
        };
        stack = value.parse()?;
    }
    Ok(stack)
}

/// Waits for Ctrl-C (SIGINT) or SIGTERM; returns which. Without a way to listen for them it
/// waits forever (the caller's other work decides).
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) {
        (Ok(mut int), Ok(mut term)) => tokio::select! {
            _ = int.recv() => "SIGINT",
            _ = term.recv() => "SIGTERM",
        },
        _ => std::future::pending().await,
    }
}
