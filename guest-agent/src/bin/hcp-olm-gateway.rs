//! `hcp-olm-gateway`: the control-plane tunnel gateway (unprivileged WireGuard responder, CONNECT/SOCKS5 proxy).
//! Wiring only. Exit codes: 0 after a clean drain, 64 on config errors (naming the field),
//! 1 otherwise.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use hcp_olm_guest_agent::daemon;
use hcp_olm_guest_agent::gateway;
use hcp_olm_tunnel_api::GatewayConfig;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "hcp-olm control-plane tunnel gateway (unprivileged WireGuard responder, CONNECT/SOCKS5 proxy)"
)]
struct Args {
    /// JSON config file (hcp_olm_tunnel_api::GatewayConfig).
    #[arg(long, env = "HCP_OLM_GATEWAY_CONFIG")]
    config: PathBuf,
    /// This pod's address (downward API `status.podIP`): skipped among the `peers`
    /// addresses. Without it, an address counts as ours when a socket can bind to it.
    #[arg(long, env = "POD_IP")]
    pod_ip: Option<std::net::IpAddr>,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

fn main() -> ExitCode {
    let args: Args = match hcp_olm_binkit::parse_args() {
        Ok(a) => a,
        Err(code) => return code,
    };
    args.log.init();
    let settings = daemon::load_json::<GatewayConfig>(&args.config)
        .map(|mut c| {
            // no resolvers given: the pod's own (its cluster DNS), as any process would
            if c.dns.local_upstreams.is_empty() {
                c.dns.local_upstreams = std::fs::read_to_string("/etc/resolv.conf")
                    .map(|t| gateway::resolv_conf_nameservers(&t))
                    .unwrap_or_default();
            }
            c
        })
        .and_then(|c| gateway::GatewaySettings::from_config(&c))
        .map(|mut s| {
            s.config_path = Some(args.config.clone());
            s.own_address = args.pod_ip;
            s
        });
    daemon::run_daemon("hcp-olm-gateway", settings, gateway::run)
}

hcp_olm_binkit::every_flag_has_help_test!(Args);
