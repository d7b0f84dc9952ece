//! `hcp-olm-controller`: wiring only. Subcommands:
//! - `render`: print every object for both clusters from a HostedCluster YAML, offline;
//! - `crd`: print the HostedOLM CRD;
//! - `run`: the controller (see docs/controller.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use hcp_olm_controlplane::catalogs::{self, AssumeTagsExist};
use hcp_olm_controlplane::certs;
use hcp_olm_controlplane::hostedcluster::HostedCluster;
use hcp_olm_controlplane::hostedolm::{self, HostedOLM, HostedOLMSpec};
use hcp_olm_controlplane::render::{self, PkiInput, RenderInput, TunnelKeys};
use hcp_olm_controlplane::validate::{self, ControllerDefaults, ReleaseFacts};

/// Exit code for bad input (flags and input files).
const EXIT_INPUT: u8 = hcp_olm_binkit::EX_USAGE;

#[derive(Parser)]
#[command(
    name = "hcp-olm-controller",
    version,
    about = "OLM for HyperShift hosted control planes"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: hcp_olm_binkit::LogArgs,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Yaml,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Print every object for the HCP namespace and the guest, without any cluster.
    Render {
        /// File with a HostedCluster (other documents in the stream are ignored).
        #[arg(long)]
        hosted_cluster: PathBuf,
        /// File with a HostedOLM object or a bare HostedOLM spec.
        #[arg(long)]
        overrides: Option<PathBuf>,
        /// Release version (normally the release image's io.openshift.release label).
        #[arg(long)]
        release_version: Option<String>,
        /// OLM image (normally the release payload's operator-lifecycle-manager).
        #[arg(long)]
        olm_image: Option<String>,
        /// operator-registry image (normally from the release payload).
        #[arg(long)]
        operator_registry_image: Option<String>,
        /// Output format: one YAML stream, or one JSON document.
        #[arg(short = 'o', long, value_enum, default_value = "yaml")]
        output: Format,
    },
    /// Print the HostedOLM CustomResourceDefinition.
    Crd,
    /// Run the controller against the cluster of the ambient kubeconfig / in-cluster config.
    Run(Box<RunArgs>),
    /// Remove everything hcp-olm created, in every guest and HCP namespace, and release
    /// every HostedCluster from the hcp-olm.io/cleanup finalizer. Stop the controller
    /// first (scale it to 0); delete manifests/ afterwards. Uses the ambient kubeconfig.
    Uninstall(UninstallCmd),
}

#[derive(clap::Args, Clone, Debug)]
struct UninstallCmd {
    #[command(flatten)]
    servers: hcp_olm_controlplane::runtime::guest::GuestServerArgs,
    #[command(flatten)]
    args: hcp_olm_controlplane::runtime::uninstall::UninstallArgs,
}

#[derive(clap::Args)]
struct RunArgs {
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, default_value = "0.0.0.0:8080")]
    admin_addr: std::net::SocketAddr,
    /// HostedClusters reconciled at once.
    #[arg(long, default_value_t = 4)]
    concurrency: u16,
    /// /healthz fails when reconciles have been running this long with none finishing
    /// (a stuck loop; the kubelet's liveness probe then restarts the controller).
    #[arg(long, default_value = "10m", value_parser = hcp_olm_binkit::parse_duration)]
    stall_timeout: std::time::Duration,
    /// OLM image for every hosted cluster; unset (the default) takes each release
    /// payload's operator-lifecycle-manager image (needs --registry-lookups). A
    /// HostedOLM spec.images.olm wins over both.
    #[arg(long, env = "HCP_OLM_OLM_IMAGE")]
    olm_image: Option<String>,
    /// operator-registry image (default: the release payload's operator-registry,
    /// else the OLM image).
    #[arg(long, env = "HCP_OLM_OPERATOR_REGISTRY_IMAGE")]
    operator_registry_image: Option<String>,
    /// Look up release labels and catalog tags in registries; `false` assumes catalog
    /// tags exist and takes the version from HostedCluster status.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    registry_lookups: bool,
    /// dockerconfigjson file with registry credentials for lookups.
    #[arg(long)]
    pull_secret_file: Option<PathBuf>,
    /// Registries (host:port) spoken to over plain HTTP.
    #[arg(long)]
    plain_http: Vec<String>,
    /// The administrator's mirror for registry lookups, `SOURCE=MIRROR` (repository
    /// prefixes, e.g. `registry.redhat.io/redhat=mirror.example:5000/redhat`; repeat the
    /// flag for more). Tried before the source; rendered images keep their source names,
    /// so the nodes need the same mirror. A HostedCluster's imageContentSources are its
    /// own and never change this.
    #[arg(long, value_parser = parse_mirror)]
    registry_mirror: Vec<(String, String)>,
    #[command(flatten)]
    guest_servers: hcp_olm_controlplane::runtime::guest::GuestServerArgs,
    /// Count an answer of a `--registry-mirror` that asked for no credentials as proof
    /// that a hosted cluster may read a shared catalog's image. Off by default: such an
    /// answer is then confirmed at the default registry with the cluster's own pull
    /// secret, and a cluster it refuses (or cannot be asked) gets its own copy
    /// (`EntitlementNotProven`). Turn on only for a mirror every hosted cluster may read.
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    registry_mirror_entitles: bool,
    /// hcp-olm-catalog-server image, the gRPC server of the catalog pods in the HCP
    /// namespace (default: quay.io/hcp-olm/hcp-olm-catalog-server:v<this version>). A
    /// HostedOLM spec.images.catalogServer wins.
    #[arg(long)]
    catalog_server_image: Option<String>,
    /// Tunnel gateway image, run in the HCP namespace (default:
    /// quay.io/hcp-olm/hcp-olm-tunnel-gateway:v<this version>). A HostedOLM
    /// spec.images.tunnelGateway wins.
    #[arg(long)]
    tunnel_gateway_image: Option<String>,
    /// Guest agent image, run in the guest (default:
    /// quay.io/hcp-olm/hcp-olm-guest-agent:v<this version>). A HostedOLM
    /// spec.images.guestAgent wins.
    #[arg(long)]
    guest_agent_image: Option<String>,
    /// Catalog sharing where a HostedOLM sets no spec.catalogSharing: `Shared` (one catalog
    /// Deployment per catalog and catalog minor in hcp-olm-catalogs, for every hosted
    /// cluster where that is safe; status.catalogs[] says which and why) or `Own`.
    #[arg(long, default_value = "Shared", value_parser = parse_catalog_sharing)]
    catalog_sharing: hcp_olm_controlplane::hostedolm::CatalogSharing,
    /// Image with OLM's /bin/copy-content for the shared catalogs' init container
    /// (default: quay.io/operator-framework/olm:v0.46.0). Never a hosted cluster's.
    #[arg(long)]
    shared_catalog_utilities_image: Option<String>,
    /// Pull secret in the hcp-olm-catalogs namespace for the shared catalog pods, put there
    /// by the administrator (default: none, the nodes' credentials).
    #[arg(long)]
    shared_catalog_pull_secret: Option<String>,
    /// Manage only the HostedClusters whose labels match this selector (Kubernetes
    /// syntax, e.g. `hcp-olm.io/managed=true`; default: all). Others are untouched; one
    /// whose labels stop matching is cleaned up and released.
    #[arg(long, default_value = "", value_parser = parse_scope)]
    hosted_cluster_selector: hcp_olm_controlplane::scope::Scope,
    /// Beside HyperShift's own OLM, where a HostedOLM sets no spec.hyperShiftOLM:
    /// `StandDown` (apply nothing while it runs) or `TakeOver` (keep HyperShift's OLM
    /// operators at 0 through debug-deployments and run ours).
    #[arg(long, default_value = "StandDown", value_parser = parse_hypershift_olm)]
    hypershift_olm: hcp_olm_controlplane::hostedolm::HyperShiftOLMMode,
    /// Reconcile only while holding a coordination.k8s.io/v1 Lease (run 2+ replicas).
    #[arg(long, default_value_t = false, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Name of the leader-election Lease.
    #[arg(long, default_value = "hcp-olm-controller")]
    leader_elect_lease_name: String,
    /// Namespace of the Lease (default: the pod's namespace, POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "hcp-olm-system")]
    leader_elect_lease_namespace: String,
    /// This replica's holder identity (default: pod name plus random bits).
    #[arg(long)]
    leader_elect_identity: Option<String>,
    /// How long a Lease is honoured after its last change (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = hcp_olm_binkit::parse_duration)]
    leader_elect_lease_duration: std::time::Duration,
    /// A leader that cannot renew for this long stops reconciling.
    #[arg(long, default_value = "10s", value_parser = hcp_olm_binkit::parse_duration)]
    leader_elect_renew_deadline: std::time::Duration,
    /// Interval of acquire/renew attempts.
    #[arg(long, default_value = "2s", value_parser = hcp_olm_binkit::parse_duration)]
    leader_elect_retry_period: std::time::Duration,
    /// Requeue of converged HostedClusters (drift correction).
    #[arg(long, default_value = "5m", value_parser = hcp_olm_binkit::parse_duration)]
    resync_interval: std::time::Duration,
    /// Requeue while waiting (guest kubeconfig, guest OLM CRDs, HCP namespace).
    #[arg(long, default_value = "30s", value_parser = hcp_olm_binkit::parse_duration)]
    waiting_interval: std::time::Duration,
    /// How long registry answers (catalog tag digests, release labels) are reused (each
    /// up to 20 % less, so answers fetched together do not expire together); a tag that
    /// moved rolls its catalog Deployment after at most this long.
    #[arg(long, default_value = "15m", value_parser = hcp_olm_binkit::parse_duration)]
    catalog_refresh_interval: std::time::Duration,
    /// How long each phase of a tunnel key rotation (HostedOLM spec.tunnel.keyRotation)
    /// is held: longer than a changed Secret takes to reach a mounted volume.
    #[arg(long, default_value = "3m", value_parser = hcp_olm_binkit::parse_duration)]
    tunnel_key_propagation: std::time::Duration,
    /// Serve /metrics here over TLS to authenticated readers allowed to get the
    /// non-resource URL /metrics (TokenReview and SubjectAccessReview; the ServiceAccount
    /// needs system:auth-delegator), e.g. 0.0.0.0:8443. The --admin-addr port then serves
    /// only /healthz and /readyz. Unset: /metrics on --admin-addr, plain HTTP.
    #[arg(long)]
    secure_metrics_addr: Option<std::net::SocketAddr>,
    /// Directory with tls.crt and tls.key for --secure-metrics-addr (re-read when they
    /// change); without them a self-signed certificate is served.
    #[arg(long, default_value = "/etc/hcp-olm/metrics-tls")]
    metrics_cert_dir: PathBuf,
    /// Check the flags (values and combinations) and exit: 0 when they are valid, 64
    /// naming the flag when not. Reads no file and connects to nothing (the Helm chart's
    /// test runs the rendered arguments through it).
    #[arg(long)]
    check_config: bool,
}

fn parse_mirror(s: &str) -> Result<(String, String), String> {
    let (source, mirror) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?} is not SOURCE=MIRROR"))?;
    for (what, v) in [("source", source), ("mirror", mirror)] {
        if v.is_empty()
            || v.contains("://")
            || v.chars().any(|c| c.is_whitespace() || c == '@' || c == '=')
            || v.starts_with('/')
            || v.ends_with('/')
            || v.split_once('/')
                .is_some_and(|(_, path)| path.contains(':'))
        {
            return Err(format!(
                "{what} {v:?} is not a registry/repository prefix (no scheme, tag, digest or surrounding '/')"
            ));
        }
    }
    Ok((source.to_string(), mirror.to_string()))
}

/// `--registry-mirror` flags grouped by source, in the order given.
fn mirrors(flags: Vec<(String, String)>) -> Vec<hcp_olm_oci::Mirror> {
    let mut out: Vec<hcp_olm_oci::Mirror> = Vec::new();
    for (source, mirror) in flags {
        match out.iter_mut().find(|m| m.source == source) {
            Some(m) => m.mirrors.push(mirror),
            None => out.push(hcp_olm_oci::Mirror {
                source,
                mirrors: vec![mirror],
            }),
        }
    }
    out
}

fn parse_catalog_sharing(
    s: &str,
) -> Result<hcp_olm_controlplane::hostedolm::CatalogSharing, String> {
    hcp_olm_controlplane::hostedolm::CatalogSharing::parse(s)
        .ok_or_else(|| format!("{s:?} is neither Shared nor Own"))
}

fn parse_scope(s: &str) -> Result<hcp_olm_controlplane::scope::Scope, String> {
    hcp_olm_controlplane::scope::Scope::parse(s)
}

fn parse_hypershift_olm(
    s: &str,
) -> Result<hcp_olm_controlplane::hostedolm::HyperShiftOLMMode, String> {
    use hcp_olm_controlplane::hostedolm::HyperShiftOLMMode;
    match s {
        "StandDown" => Ok(HyperShiftOLMMode::StandDown),
        "TakeOver" => Ok(HyperShiftOLMMode::TakeOver),
        _ => Err(format!("{s:?} is neither StandDown nor TakeOver")),
    }
}

/// An input problem: printed and mapped to exit code 64.
struct InputError(Vec<String>);

fn main() -> ExitCode {
    // Flag errors are input errors (exit 64, naming the flag); help/version exit 0.
    let cli: Cli = match hcp_olm_binkit::parse_args() {
        Ok(c) => c,
        Err(code) => return code,
    };
    // info unless RUST_LOG says otherwise; --log-format=json for log collectors
    cli.log.init();
    match run(cli) {
        Ok(Ok(())) => ExitCode::SUCCESS,
        Ok(Err(InputError(msgs))) => {
            for m in msgs {
                eprintln!("error: {m}");
            }
            ExitCode::from(EXIT_INPUT)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<Result<(), InputError>> {
    match cli.command {
        Command::Run(args) => {
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            rt.block_on(run_controller(*args))
        }
        Command::Crd => {
            print!("{}", hostedolm::crd_yaml().context("serializing the CRD")?);
            Ok(Ok(()))
        }
        Command::Uninstall(cmd) => {
            let rt = tokio::runtime::Runtime::new().context("starting the async runtime")?;
            rt.block_on(uninstall(cmd))
        }
        Command::Render {
            hosted_cluster,
            overrides,
            release_version,
            olm_image,
            operator_registry_image,
            output,
        } => {
            let text = match std::fs::read_to_string(&hosted_cluster) {
                Ok(t) => t,
                Err(e) => {
                    return Ok(Err(InputError(vec![format!(
                        "--hosted-cluster {}: {e}",
                        hosted_cluster.display()
                    )])));
                }
            };
            let hcs = match HostedCluster::from_yaml_stream(&text) {
                Ok(h) => h,
                Err(e) => {
                    return Ok(Err(InputError(vec![format!(
                        "--hosted-cluster {}: {e}",
                        hosted_cluster.display()
                    )])));
                }
            };
            let hc = match hcs.as_slice() {
                [one] => one,
                other => {
                    return Ok(Err(InputError(vec![format!(
                        "--hosted-cluster {}: expected exactly one HostedCluster, found {}",
                        hosted_cluster.display(),
                        other.len()
                    )])));
                }
            };
            let spec = match overrides.as_deref().map(read_overrides).transpose() {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            let facts = ReleaseFacts {
                version: release_version,
                olm_image,
                operator_registry_image,
                payload_problem: None,
            };
            let valid =
                match validate::validate(hc, spec.as_ref(), &facts, &ControllerDefaults::default())
                {
                    Ok(v) => v,
                    Err(reasons) => {
                        return Ok(Err(InputError(
                            reasons.iter().map(|r| r.to_string()).collect(),
                        )));
                    }
                };
            let input = offline_input(valid)?;
            let desired = render::desired(&input).context("rendering")?;
            for p in &desired.pending {
                eprintln!("pending: {} {}: {}", p.component, p.reason, p.message);
            }
            match output {
                Format::Yaml => print!("{}", render::to_yaml(&desired)?),
                Format::Json => println!("{}", render::to_json(&desired)?),
            }
            Ok(Ok(()))
        }
    }
}

async fn uninstall(cmd: UninstallCmd) -> anyhow::Result<Result<(), InputError>> {
    use hcp_olm_controlplane::runtime;
    let guest_servers = cmd.servers.policy();
    let client = kube::Client::try_default()
        .await
        .context("connecting to the management cluster")?;
    let ctx = runtime::Context::new(
        client,
        runtime::Config {
            guest_servers,
            ..runtime::Config::default()
        },
    )
    .with_events(None);
    let report = runtime::uninstall::uninstall(&ctx, &cmd.args, &mut |line| eprintln!("{line}"))
        .await
        .context("uninstall")?;
    let complete = runtime::uninstall::print(
        &report,
        &cmd.args,
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    );
    if complete {
        Ok(Ok(()))
    } else {
        anyhow::bail!("uninstall incomplete (see above)")
    }
}

async fn run_controller(args: RunArgs) -> anyhow::Result<Result<(), InputError>> {
    use hcp_olm_controlplane::runtime::{self, controller, leader, metrics};
    let election = match leader_config(&args) {
        Ok(e) => e,
        Err(e) => return Ok(Err(e)),
    };
    if args.check_config {
        drop(election);
        println!("hcp-olm-controller run: configuration valid");
        return Ok(Ok(()));
    }
    let schedule = runtime::Schedule {
        resync: args.resync_interval,
        waiting: args.waiting_interval,
        catalog_refresh: args.catalog_refresh_interval,
        key_propagation: args.tunnel_key_propagation,
    };
    let client = kube::Client::try_default()
        .await
        .context("connecting to the management cluster")?;
    let oci = registry_client(&args)?;
    let mut defaults = ControllerDefaults::default();
    if let Some(i) = args.catalog_server_image {
        defaults.catalog_server_image = i;
    }
    if let Some(i) = args.tunnel_gateway_image {
        defaults.tunnel_gateway_image = i;
    }
    if let Some(i) = args.guest_agent_image {
        defaults.guest_agent_image = i;
    }
    defaults.catalog_sharing = args.catalog_sharing;
    let controller_registry_credentials = args.pull_secret_file.is_some();
    let guest_servers = args.guest_servers.policy();
    if !guest_servers.allowed.is_empty() {
        tracing::warn!(allowed = ?guest_servers.allowed, "--guest-server-allowed-cidrs is set: guest API servers there are dialled (test and lab set-ups only)");
    }
    let ctx = std::sync::Arc::new(
        runtime::Context::new(
            client,
            runtime::Config {
                defaults,
                olm_image: args.olm_image,
                operator_registry_image: args.operator_registry_image,
                oci,
                shared_utilities_image: args.shared_catalog_utilities_image,
                shared_pull_secret: args.shared_catalog_pull_secret,
                controller_registry_credentials,
                guest_servers,
                mirror_answers_entitle: args.registry_mirror_entitles,
                scope: args.hosted_cluster_selector,
                hypershift_olm: args.hypershift_olm,
            },
        )
        .with_schedule(schedule)
        .with_metrics(metrics::Metrics::with_stall_limit(args.stall_timeout)),
    );
    let stop = shutdown_signal();
    let admin = match args.secure_metrics_addr {
        None => tokio::spawn(metrics::serve(
            args.admin_addr,
            ctx.metrics.clone(),
            stop.clone(),
        )),
        Some(secure) => {
            use hcp_olm_controlplane::runtime::secure_metrics;
            let cfg = secure_metrics::SecureMetricsConfig {
                addr: secure,
                cert_dir: Some(args.metrics_cert_dir.clone()),
                self_signed_names: self_signed_names(&args.leader_elect_lease_namespace),
            };
            // Bind both and read the certificate first: a port clash or an unreadable
            // certificate fails the start instead of leaving /metrics silently dead.
            let tls = secure_metrics::bind(&cfg).await?;
            let tls_config = secure_metrics::tls_config(&cfg)?;
            let probes = tokio::net::TcpListener::bind(args.admin_addr)
                .await
                .with_context(|| format!("binding --admin-addr {}", args.admin_addr))?;
            let (m, c, s) = (ctx.metrics.clone(), ctx.client.clone(), stop.clone());
            tokio::spawn(async move {
                secure_metrics::serve(tls, tls_config, m, c, s).await;
            });
            tokio::spawn(metrics::serve_probes(
                probes,
                ctx.metrics.clone(),
                secure,
                stop.clone(),
            ))
        }
    };
    let opts = controller::RunOptions {
        concurrency: args.concurrency,
    };
    match election {
        Some(cfg) => {
            tracing::info!(identity = %cfg.identity, lease = %format!("{}/{}", cfg.namespace, cfg.name), "leader election on");
            leader::run_with_leader_election(ctx, opts, cfg, stop).await
        }
        None => controller::run(ctx, opts, stop).await,
    }
    match admin.await {
        Ok(r) => r.context("admin endpoints")?,
        Err(e) => anyhow::bail!("admin endpoints task: {e}"),
    }
    Ok(Ok(()))
}

/// The names of the self-signed metrics certificate: the metrics Service's.
fn self_signed_names(namespace: &str) -> Vec<String> {
    let svc = "hcp-olm-controller-metrics";
    vec![
        format!("{svc}.{namespace}.svc"),
        format!("{svc}.{namespace}.svc.cluster.local"),
        "localhost".to_string(),
    ]
}

/// `--leader-elect*`: the lease to hold, or none.
fn leader_config(
    args: &RunArgs,
) -> Result<Option<hcp_olm_controlplane::runtime::leader::LeaderConfig>, InputError> {
    use hcp_olm_controlplane::runtime::leader;
    if !args.leader_elect {
        return Ok(None);
    }
    let cfg = leader::LeaderConfig {
        namespace: args.leader_elect_lease_namespace.clone(),
        name: args.leader_elect_lease_name.clone(),
        identity: args
            .leader_elect_identity
            .clone()
            .unwrap_or_else(leader::default_identity),
        lease_duration: args.leader_elect_lease_duration,
        renew_deadline: args.leader_elect_renew_deadline,
        retry_period: args.leader_elect_retry_period,
    };
    cfg.check()
        .map_err(|e| InputError(vec![format!("--leader-elect-*: {e}")]))?;
    Ok(Some(cfg))
}

/// The registry client for catalog lookups (`--registry-lookups`), with the controller's
/// own pull secret when `--pull-secret-file` is given.
fn registry_client(args: &RunArgs) -> anyhow::Result<Option<std::sync::Arc<hcp_olm_oci::Client>>> {
    if !args.registry_lookups {
        return Ok(None);
    }
    let pull_secret = match &args.pull_secret_file {
        Some(p) => {
            let bytes = std::fs::read(p).with_context(|| format!("reading {}", p.display()))?;
            hcp_olm_oci::PullSecret::parse(&bytes)
                .map_err(|e| anyhow::anyhow!("{}: {}", p.display(), e.0))?
        }
        None => hcp_olm_oci::PullSecret::default(),
    };
    let client = hcp_olm_oci::Client::new(hcp_olm_oci::ClientOptions {
        pull_secret,
        mirrors: mirrors(args.registry_mirror.clone()),
        plain_http: args.plain_http.clone(),
        timeout: Some(std::time::Duration::from_secs(20)),
    })
    .context("registry client")?;
    Ok(Some(std::sync::Arc::new(client)))
}

/// One shutdown signal (SIGTERM or an interrupt) shared by the admin server and the
/// controller.
fn shutdown_signal() -> futures::future::Shared<futures::future::BoxFuture<'static, ()>> {
    let (tx, rx) = futures::channel::oneshot::channel::<()>();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    let _ = tokio::signal::ctrl_c().await;
                    let _ = tx.send(());
                    return;
                }
            };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("interrupt: shutting down"),
        }
        let _ = tx.send(());
    });
    futures::FutureExt::shared(futures::FutureExt::boxed(futures::FutureExt::map(
        rx,
        |_| (),
    )))
}

fn read_overrides(path: &Path) -> Result<HostedOLMSpec, InputError> {
    let err = |m: String| InputError(vec![format!("--overrides {}: {m}", path.display())]);
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&text).map_err(|e| err(e.to_string()))?;
    if value.get("kind").is_some() {
        let obj: HostedOLM = serde_yaml_ng::from_value(value).map_err(|e| err(e.to_string()))?;
        Ok(obj.spec)
    } else {
        serde_yaml_ng::from_value(value).map_err(|e| err(e.to_string()))
    }
}

/// Offline facts: catalog tags assumed to exist (no digests), fresh certificates,
/// placeholder tunnel keys, no packageserver ClusterIP yet.
fn offline_input(valid: validate::ValidInput) -> anyhow::Result<RenderInput> {
    let now = time::OffsetDateTime::now_utc();
    let cluster = valid.cluster.key();
    let ca = certs::issue_ca(
        &cluster,
        &certs::generate_key_pem()?,
        now,
        certs::CA_VALIDITY,
    )?;
    let sans =
        certs::packageserver_sans(&valid.cluster.hcp_namespace, render::names::PACKAGESERVER);
    let ps = certs::issue_serving_cert(
        &cluster,
        &ca,
        "packageserver",
        &sans,
        &certs::generate_key_pem()?,
        now,
        certs::SERVING_VALIDITY,
    )?;
    let mut catalog_images = BTreeMap::new();
    for c in &valid.enabled_catalogs {
        catalog_images.insert(
            *c,
            catalogs::select_image(
                *c,
                valid.catalog_minor(),
                None,
                valid.catalog_candidates,
                &valid.registry_overrides,
                &AssumeTagsExist,
            ),
        );
    }
    let placeholder = "offline-render-placeholder".to_string();
    Ok(RenderInput {
        catalog_images,
        held_catalogs: Vec::new(),
        pki: PkiInput {
            ca,
            packageserver: ps,
            packageserver_sans_fingerprint: certs::sans_fingerprint(&sans),
            previous_ca_pem: None,
            metrics: None,
        },
        tunnel: TunnelKeys {
            gateway_private_key: placeholder.clone(),
            gateway_public_key: placeholder.clone(),
            agent_private_key: placeholder.clone(),
            agent_public_key: placeholder,
            ..TunnelKeys::default()
        },
        packageserver_cluster_ip: None,
        service_monitors_served: false,
        management_has_scc: false,
        egress_isolation: Vec::new(),
        guest_olm_crds_ready: true,
        external_secret_hashes: BTreeMap::new(),
        owner: None,
        valid,
    })
}

hcp_olm_binkit::every_flag_has_help_test!(Cli);
