//! hcp-olm CLI library: the `catalog` subcommand (browsing catalogs over the registry gRPC
//! API) and `status` (HostedOLM objects through the kubeconfig), kept out of the binaries
//! (`hcp-olm` and the kubectl plugin `kubectl-hcp_olm`) so they can be tested.

pub mod catalog;
pub mod connect;
pub mod doctor;
pub mod status;
pub mod uninstall;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(version, about = "hcp-olm: OLM for HyperShift hosted clusters")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Browse operator catalogs (packages, channels, bundles, upgrade paths).
    Catalog(catalog::CatalogArgs),
    /// Show the HostedOLM of each hosted cluster: available, why not, catalogs, tunnel.
    Status(status::StatusArgs),
    /// Remove everything hcp-olm created (guests, HCP namespaces, shared catalogs) and
    /// release every HostedCluster from its finalizer. Stop the controller first (scale it
    /// to 0); delete the manifests afterwards. `--dry-run` lists it all and changes nothing.
    Uninstall(uninstall::UninstallCliArgs),
    /// Walk every hop a catalog read takes for one hosted cluster (HostedOLM, controller, HCP
    /// pods, tunnel endpoint, guest agent, APIService, CatalogSources) and print the first
    /// that fails with what to do; exit 1 when one fails.
    Doctor(doctor::DoctorArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// Run the CLI under the name `program` (what usage and help show).
pub fn main_as(program: &str) -> ExitCode {
    let args =
        std::iter::once(std::ffi::OsString::from(program)).chain(std::env::args_os().skip(1));
    let cli: Cli = match hcp_olm_binkit::parse_from(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    cli.log.init();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        let mut out = std::io::stdout().lock();
        match &cli.command {
            Command::Catalog(args) => catalog::run(args, &mut out).await,
            Command::Status(args) => status::run(args, &mut out).await,
            Command::Doctor(args) => match doctor::run(args, &mut out).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(anyhow::anyhow!(
                    "unhealthy (the first failing hop is above)"
                )),
                Err(e) => Err(e),
            },
            Command::Completion { shell } => {
                let mut cmd = <Cli as clap::CommandFactory>::command();
                clap_complete::generate(*shell, &mut cmd, program.to_string(), &mut out);
                Ok(())
            }
            Command::Uninstall(args) => {
                match uninstall::run(args, &mut out, &mut std::io::stderr().lock()).await {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(anyhow::anyhow!("uninstall incomplete (see above)")),
                    Err(e) => Err(e),
                }
            }
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Error texts can carry a catalog's or API server's own words: no
            // control characters reach the terminal.
            eprintln!("error: {}", catalog::sanitize(&format!("{e:#}")));
            ExitCode::FAILURE
        }
    }
}

hcp_olm_binkit::every_flag_has_help_test!(Cli);
