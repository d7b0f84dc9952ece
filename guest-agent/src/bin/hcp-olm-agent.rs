//! `hcp-olm-agent`: the guest tunnel agent (dials the gateway, relays to guest services).
//! Wiring only. Exit codes: 0 after a clean drain, 64 on config errors (naming the field),
//! 1 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hcp_olm_guest_agent::agent;
use hcp_olm_guest_agent::daemon;
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
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    args.log.init();
    let settings = daemon::load_json::<AgentPeerConfig>(&args.config)
        .and_then(|c| agent::AgentSettings::from_config(&c))
        .map(|mut s| {
            s.config_path = Some(args.config.clone());
            s
        });
    daemon::run_daemon("hcp-olm-agent", settings, agent::run)
}

hcp_olm_binkit::every_flag_has_help_test!(Args);
