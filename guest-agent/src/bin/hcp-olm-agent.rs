//! `hcp-olm-agent`: the guest tunnel agent (dials the gateway, relays to guest services).
//! Wiring only. Exit codes: 0 after a clean drain, 64 on config errors (naming the field),
//! 1 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hcp_olm_guest_agent::agent;
use hcp_olm_guest_agent::daemon::{self, EX_CONFIG};
use hcp_olm_tunnel_api::AgentPeerConfig;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "hcp-olm guest tunnel agent (dials the gateway, relays to guest services)"
)]
struct Args {
    /// JSON config file (hcp_olm_tunnel_api::AgentPeerConfig).
    #[arg(long, env = "HCP_OLM_AGENT_CONFIG")]
    config: PathBuf,
}

fn main() -> ExitCode {
    daemon::init_logging();
    let args = Args::parse();
    let settings = match daemon::load_json::<AgentPeerConfig>(&args.config)
        .and_then(|c| agent::AgentSettings::from_config(&c))
    {
        Ok(s) => s,
        Err(e) => {
            eprintln!("hcp-olm-agent: invalid configuration: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("hcp-olm-agent: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(agent::run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "exiting");
            ExitCode::FAILURE
        }
    }
}
