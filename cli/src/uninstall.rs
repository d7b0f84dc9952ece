//! `hcp-olm uninstall` (also `kubectl hcp-olm uninstall`): removes everything hcp-olm created
//! and releases every HostedCluster from its finalizer, with the controller stopped (see
//! `hcp_olm_controlplane::runtime::uninstall`). Reads through the usual kubeconfig
//! (`--kubeconfig`, else `KUBECONFIG`, else `~/.kube/config`; `--context`); a line per
//! HostedCluster on stderr as it goes; exits non-zero naming what was not done or left.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use hcp_olm_controlplane::runtime::{self, guest::GuestServerArgs, uninstall::UninstallArgs};

/// Arguments of `uninstall`.
#[derive(Debug, Args)]
pub struct UninstallCliArgs {
    /// Path of the kubeconfig of the management cluster (default: KUBECONFIG, then
    /// ~/.kube/config).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    #[command(flatten)]
    pub args: UninstallArgs,
    #[command(flatten)]
    pub servers: GuestServerArgs,
}

/// Run `uninstall`; Ok(false) when it is incomplete (reported on `err`).
pub async fn run(
    a: &UninstallCliArgs,
    out: &mut dyn std::io::Write,
    err: &mut dyn std::io::Write,
) -> anyhow::Result<bool> {
    let (client, _) = crate::status::client_for(a.kubeconfig.as_ref(), a.context.as_ref()).await?;
    let ctx = runtime::Context::new(
        client,
        runtime::Config {
            guest_servers: a.servers.policy(),
            ..runtime::Config::default()
        },
    )
    .with_events(None);
    let report = runtime::uninstall::uninstall(&ctx, &a.args, &mut |line| {
        let _ = writeln!(err, "{line}");
    })
    .await
    .context("uninstall")?;
    Ok(runtime::uninstall::print(&report, &a.args, out, err))
}
