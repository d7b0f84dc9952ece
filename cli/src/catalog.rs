//! `hcp-olm catalog ...`: list packages, channels, bundles and upgrade paths
//! of one or many catalogs, search by package name or provided API, and print
//! tables, JSON or YAML.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand, ValueEnum};
use hcp_olm_proto::api::registry_client::RegistryClient;
use hcp_olm_proto::api::{self, Bundle};
use serde::Serialize;
use tonic::transport::Channel;

use crate::connect;

/// Browse operator catalogs over the registry gRPC API.
#[derive(Debug, Args)]
pub struct CatalogArgs {
    /// Catalog address host:port (repeat for several catalogs).
    #[arg(
        long = "addr",
        short = 'a',
        required = true,
        value_name = "HOST:PORT",
        env = "HCP_OLM_CATALOG_ADDR",
        value_delimiter = ','
    )]
    pub addrs: Vec<String>,
    /// Give up on a catalog after this long (connect and each call), e.g. 5s, 500ms.
    #[arg(long, default_value = "10s", value_parser = hcp_olm_binkit::parse_duration)]
    pub timeout: Duration,
    /// Give up on the whole command after this long, however the catalogs answer (a
    /// catalog that trickles its answers); `probe` is bounded by its count instead.
    #[arg(long = "total-timeout", default_value = "5m", value_parser = hcp_olm_binkit::parse_duration)]
    pub total_timeout: Duration,
    /// Read at most this many bytes of answers from all catalogs together (protobuf
    /// encoded size), e.g. 64MiB; a catalog answering more is refused, not buffered.
    #[arg(long = "max-answer-bytes", default_value = "256MiB", value_parser = parse_bytes)]
    pub max_answer_bytes: u64,
    /// HTTP CONNECT proxy to reach the catalogs through: host:port, http://host:port, or
    /// unix:/path for a proxy on a Unix socket (Konnectivity's proxy-server).
    #[arg(long, env = "HCP_OLM_CATALOG_PROXY")]
    pub proxy: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: CatalogCommand,
}

/// Output formats.
#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Aligned columns.
    Table,
    /// A JSON array.
    Json,
    /// A YAML sequence.
    Yaml,
}

/// What to list.
#[derive(Debug, Subcommand)]
pub enum CatalogCommand {
    /// List packages with their default channel and channels.
    Packages,
    /// List the channels of a package with their heads.
    Channels {
        /// Package name.
        package: String,
    },
    /// List bundles (optionally of one package and channel).
    Bundles {
        /// Package name.
        package: Option<String>,
        /// Only this channel.
        #[arg(long)]
        channel: Option<String>,
    },
    /// Show the upgrade path of a channel: from --from (or the oldest entry on the replaces chain) up to the head.
    UpgradePath {
        /// Package name.
        package: String,
        /// Channel name.
        channel: String,
        /// Start from this bundle.
        #[arg(long)]
        from: Option<String>,
    },
    /// Call the catalog repeatedly over one connection, like ping: GetPackage of its first
    /// package every --interval, --count times; prints call latencies and failures and
    /// exits 1 when any call failed.
    Probe {
        /// Number of calls (at most 100000).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        count: u32,
        /// Pause between calls, e.g. 1s, 50ms.
        #[arg(long, default_value = "1s", value_parser = hcp_olm_binkit::parse_duration)]
        interval: Duration,
    },
    /// Search packages by name or bundles by provided API.
    Search {
        /// Substring of the package name.
        #[arg(long)]
        name: Option<String>,
        /// Provided API: Kind, group/Kind or group/version/Kind.
        #[arg(long)]
        gvk: Option<String>,
    },
}

/// Parses a byte count: a number with an optional `KiB`, `MiB` or `GiB` suffix.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suf, m)| t.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((t, 1));
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{s:?} is not a byte count (e.g. 1048576, 512KiB, 64MiB, 1GiB)"))
}

/// Removes what a terminal would act on from a catalog-supplied string: every control
/// character (C0 including newline and tab, DEL, C1 such as the 8-bit CSI) and the
/// bidirectional formatting characters that reorder what is shown. Catalog content
/// (names, versions, deprecation messages, error messages of the server) is untrusted:
/// a guest's catalog is any server its owner runs. Our own, so the rule is stated in
/// one place and has no dependency; the output formats add their own newlines.
pub fn sanitize(s: &str) -> String {
    s.chars()
        .filter(|c| {
            !c.is_control()
                && !matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
        })
        .collect()
}

fn sanitize_all(v: &[String]) -> Vec<String> {
    v.iter().map(|s| sanitize(s)).collect()
}

/// The bytes of answers read so far from all catalogs, against `--max-answer-bytes`.
#[derive(Debug)]
struct Budget {
    used: AtomicU64,
    max: u64,
}

impl Budget {
    fn take(&self, addr: &str, msg: &impl prost::Message) -> anyhow::Result<()> {
        let n = msg.encoded_len() as u64;
        let used = self.used.fetch_add(n, Ordering::Relaxed) + n;
        if used > self.max {
            bail!(
                "catalog {addr}: answers exceed --max-answer-bytes ({} bytes); raise it to read a catalog this large",
                self.max
            );
        }
        Ok(())
    }
}

#[derive(Debug, Serialize)]
struct PackageRow {
    catalog: String,
    name: String,
    #[serde(rename = "defaultChannel")]
    default_channel: String,
    channels: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deprecation: Option<String>,
}

#[derive(Debug, Serialize)]
struct ProbeRow {
    catalog: String,
    calls: u32,
    failures: u32,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    first_error: Option<String>,
}

/// The `p` quantile of sorted values (nearest rank); 0 when empty.
fn quantile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[derive(Debug, Serialize)]
struct ChannelRow {
    catalog: String,
    package: String,
    name: String,
    head: String,
    default: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    deprecation: Option<String>,
}

#[derive(Debug, Serialize, Clone)]
struct BundleRow {
    catalog: String,
    package: String,
    channel: String,
    name: String,
    version: String,
    replaces: String,
    skips: Vec<String>,
    #[serde(rename = "skipRange")]
    skip_range: String,
    provides: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deprecation: Option<String>,
}

fn bundle_row(catalog: &str, b: &Bundle) -> BundleRow {
    BundleRow {
        catalog: catalog.to_string(),
        package: sanitize(&b.package_name),
        channel: sanitize(&b.channel_name),
        name: sanitize(&b.csv_name),
        version: sanitize(&b.version),
        replaces: sanitize(&b.replaces),
        skips: sanitize_all(&b.skips),
        skip_range: sanitize(&b.skip_range),
        provides: b
            .provided_apis
            .iter()
            .map(|g| sanitize(&format!("{}/{}/{}", g.group, g.version, g.kind)))
            .collect(),
        deprecation: b.deprecation.as_ref().map(|d| sanitize(&d.message)),
    }
}

struct Client {
    addr: String,
    rpc: RegistryClient<Channel>,
    timeout: Duration,
    budget: Arc<Budget>,
}

impl Client {
    async fn list_packages(&mut self) -> anyhow::Result<Vec<api::Package>> {
        let addr = self.addr.clone();
        let mut names = Vec::new();
        let mut s = self
            .rpc
            .list_packages(api::ListPackageRequest {})
            .await
            .with_context(|| format!("catalog {addr}: ListPackages"))?
            .into_inner();
        while let Some(p) = s
            .message()
            .await
            .with_context(|| format!("catalog {addr}: ListPackages"))?
        {
            self.budget.take(&addr, &p)?;
            names.push(p.name);
        }
        names.sort();
        let mut out = Vec::new();
        for n in names {
            out.push(self.package(&n).await?);
        }
        Ok(out)
    }

    /// `count` GetPackage calls of the first package, `interval` apart, on this client's
    /// one connection; each bounded by the timeout.
    async fn probe(&mut self, count: u32, interval: Duration) -> anyhow::Result<ProbeRow> {
        let addr = self.addr.clone();
        let first = tokio::time::timeout(self.timeout, async {
            let mut s = self
                .rpc
                .list_packages(api::ListPackageRequest {})
                .await?
                .into_inner();
            s.message().await
        })
        .await
        .map_err(|_| anyhow::anyhow!("catalog {addr}: ListPackages timed out"))?
        .with_context(|| format!("catalog {addr}: ListPackages"))?;
        let Some(pkg) = first.map(|p| p.name) else {
            bail!("catalog {addr} has no packages to probe");
        };
        let (mut lat, mut failures, mut first_error) = (Vec::new(), 0u32, None);
        for i in 0..count {
            if i > 0 {
                tokio::time::sleep(interval).await;
            }
            let start = std::time::Instant::now();
            let call = self
                .rpc
                .get_package(api::GetPackageRequest { name: pkg.clone() });
            let err = match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(r)) => {
                    self.budget.take(&addr, r.get_ref())?;
                    None
                }
                Ok(Err(e)) => Some(format!("GetPackage: {}", sanitize(e.message()))),
                Err(_) => Some(format!("GetPackage timed out after {:?}", self.timeout)),
            };
            let ms = start.elapsed().as_secs_f64() * 1000.0;
            match err {
                None => lat.push(ms),
                Some(e) => {
                    failures += 1;
                    first_error.get_or_insert(e);
                }
            }
        }
        lat.sort_by(f64::total_cmp);
        Ok(ProbeRow {
            catalog: addr,
            calls: count,
            failures,
            p50_ms: quantile(&lat, 0.5),
            p99_ms: quantile(&lat, 0.99),
            max_ms: lat.last().copied().unwrap_or(0.0),
            first_error,
        })
    }

    async fn package(&mut self, name: &str) -> anyhow::Result<api::Package> {
        let addr = &self.addr;
        let mut p = self
            .rpc
            .get_package(api::GetPackageRequest {
                name: name.to_string(),
            })
            .await
            .map_err(|s| anyhow::anyhow!("catalog {addr}: package {name:?}: {}", s.message()))?
            .into_inner();
        self.budget.take(addr, &p)?;
        p.channels.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(p)
    }

    async fn bundles(&mut self) -> anyhow::Result<Vec<Bundle>> {
        let addr = self.addr.clone();
        let fut = async {
            let mut s = self
                .rpc
                .list_bundles(api::ListBundlesRequest {})
                .await
                .with_context(|| format!("catalog {addr}: ListBundles"))?
                .into_inner();
            let mut out = Vec::new();
            while let Some(b) = s
                .message()
                .await
                .with_context(|| format!("catalog {addr}: ListBundles"))?
            {
                self.budget.take(&addr, &b)?;
                out.push(b);
            }
            anyhow::Ok(out)
        };
        // The listing streams the whole catalog: allow a few timeouts' worth.
        let mut out = tokio::time::timeout(self.timeout * 6, fut)
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "catalog {addr}: ListBundles did not finish within {:?}",
                    self.timeout * 6
                )
            })??;
        out.sort_by(|a, b| {
            (&a.package_name, &a.channel_name, &a.csv_name).cmp(&(
                &b.package_name,
                &b.channel_name,
                &b.csv_name,
            ))
        });
        Ok(out)
    }
}

fn gvk_matches(query: &str, g: &api::GroupVersionKind) -> bool {
    let parts: Vec<&str> = query.split('/').collect();
    match parts.as_slice() {
        [k] => g.kind.eq_ignore_ascii_case(k),
        [grp, k] => g.group == *grp && g.kind.eq_ignore_ascii_case(k),
        [grp, v, k] => g.group == *grp && g.version == *v && g.kind.eq_ignore_ascii_case(k),
        _ => false,
    }
}

/// Runs the subcommand, writing to `out`: bounded by `--total-timeout` (except `probe`,
/// bounded by its count) and `--max-answer-bytes`. Every catalog-supplied string is
/// passed through [`sanitize`] before it is printed.
pub async fn run(args: &CatalogArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    if matches!(args.command, CatalogCommand::Probe { .. }) {
        return run_unbounded(args, out).await;
    }
    // Rendered into a buffer first, so a command cut by the deadline prints nothing.
    let mut buf = Vec::new();
    match tokio::time::timeout(args.total_timeout, run_unbounded(args, &mut buf)).await {
        Ok(r) => r?,
        Err(_) => bail!(
            "gave up after --total-timeout {:?}: {} did not finish answering",
            args.total_timeout,
            args.addrs.join(", ")
        ),
    }
    out.write_all(&buf)?;
    Ok(())
}

async fn run_unbounded(args: &CatalogArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let budget = Arc::new(Budget {
        used: AtomicU64::new(0),
        max: args.max_answer_bytes,
    });
    // One message may not exceed the whole budget (nor 256 MiB).
    let max_message = usize::try_from(args.max_answer_bytes.min(256 << 20)).unwrap_or(256 << 20);
    let mut clients = Vec::new();
    for addr in &args.addrs {
        let ch = connect::dial(addr, args.proxy.as_deref(), args.timeout).await?;
        clients.push(Client {
            addr: addr.clone(),
            rpc: RegistryClient::new(ch).max_decoding_message_size(max_message),
            timeout: args.timeout,
            budget: budget.clone(),
        });
    }
    match &args.command {
        CatalogCommand::Packages => {
            let mut rows = Vec::new();
            for c in &mut clients {
                for p in c.list_packages().await? {
                    rows.push(PackageRow {
                        catalog: c.addr.clone(),
                        name: sanitize(&p.name),
                        default_channel: sanitize(&p.default_channel_name),
                        channels: p.channels.iter().map(|c| sanitize(&c.name)).collect(),
                        deprecation: p.deprecation.map(|d| sanitize(&d.message)),
                    });
                }
            }
            render(
                out,
                args.output,
                &rows,
                &["CATALOG", "PACKAGE", "DEFAULT CHANNEL", "CHANNELS"],
                |r| {
                    vec![
                        r.catalog.clone(),
                        r.name.clone(),
                        r.default_channel.clone(),
                        r.channels.join(","),
                    ]
                },
            )
        }
        CatalogCommand::Probe { count, interval } => {
            let mut rows = Vec::new();
            for c in &mut clients {
                rows.push(c.probe(*count, *interval).await?);
            }
            render(
                out,
                args.output,
                &rows,
                &["CATALOG", "CALLS", "FAILED", "P50 MS", "P99 MS", "MAX MS"],
                |r| {
                    vec![
                        r.catalog.clone(),
                        r.calls.to_string(),
                        r.failures.to_string(),
                        format!("{:.2}", r.p50_ms),
                        format!("{:.2}", r.p99_ms),
                        format!("{:.2}", r.max_ms),
                    ]
                },
            )?;
            let failed: u32 = rows.iter().map(|r| r.failures).sum();
            if failed > 0 {
                let first = rows.iter().find_map(|r| {
                    r.first_error
                        .as_ref()
                        .map(|e| format!("{}: {e}", r.catalog))
                });
                bail!(
                    "{failed} of {} calls failed (first: {})",
                    rows.iter().map(|r| r.calls).sum::<u32>(),
                    first.unwrap_or_default()
                );
            }
            Ok(())
        }
        CatalogCommand::Channels { package } => {
            let mut rows = Vec::new();
            let mut found = false;
            for c in &mut clients {
                let Ok(p) = c.package(package).await else {
                    continue;
                };
                found = true;
                for ch in p.channels {
                    rows.push(ChannelRow {
                        catalog: c.addr.clone(),
                        package: sanitize(&p.name),
                        default: ch.name == p.default_channel_name,
                        name: sanitize(&ch.name),
                        head: sanitize(&ch.csv_name),
                        deprecation: ch.deprecation.map(|d| sanitize(&d.message)),
                    });
                }
            }
            if !found {
                bail!("package {package:?} not found in {}", args.addrs.join(", "));
            }
            render(
                out,
                args.output,
                &rows,
                &["CATALOG", "PACKAGE", "CHANNEL", "HEAD", "DEFAULT"],
                |r| {
                    vec![
                        r.catalog.clone(),
                        r.package.clone(),
                        r.name.clone(),
                        r.head.clone(),
                        r.default.to_string(),
                    ]
                },
            )
        }
        CatalogCommand::Bundles { package, channel } => {
            let mut rows = Vec::new();
            for c in &mut clients {
                for b in c.bundles().await? {
                    if package.as_ref().is_some_and(|p| *p != b.package_name)
                        || channel.as_ref().is_some_and(|ch| *ch != b.channel_name)
                    {
                        continue;
                    }
                    rows.push(bundle_row(&c.addr, &b));
                }
            }
            render_bundles(out, args.output, &rows)
        }
        CatalogCommand::UpgradePath {
            package,
            channel,
            from,
        } => {
            let mut rows = Vec::new();
            for c in &mut clients {
                let Ok(p) = c.package(package).await else {
                    continue;
                };
                let Some(ch) = p.channels.iter().find(|x| x.name == *channel) else {
                    continue;
                };
                let bundles: Vec<Bundle> = c
                    .bundles()
                    .await?
                    .into_iter()
                    .filter(|b| b.package_name == *package && b.channel_name == *channel)
                    .collect();
                let by_name: std::collections::HashMap<&str, &Bundle> =
                    bundles.iter().map(|b| (b.csv_name.as_str(), b)).collect();
                let mut chain = Vec::new();
                let mut cur = by_name.get(ch.csv_name.as_str()).copied();
                while let Some(b) = cur {
                    if chain.len() > bundles.len() {
                        break;
                    }
                    chain.push(bundle_row(&c.addr, b));
                    if from.as_deref() == Some(b.csv_name.as_str()) {
                        break;
                    }
                    cur = by_name.get(b.replaces.as_str()).copied();
                }
                if let Some(f) = from
                    && !chain.iter().any(|r| r.name == *f)
                {
                    // Not on the replaces chain: the head may still skip it.
                    let reachable = bundles.iter().any(|b| b.skips.contains(f));
                    if !reachable {
                        bail!(
                            "catalog {}: {f:?} is not on the upgrade graph of {package}/{channel}",
                            c.addr
                        );
                    }
                }
                chain.reverse();
                rows.extend(chain);
            }
            if rows.is_empty() {
                bail!(
                    "channel {package}/{channel} not found in {}",
                    args.addrs.join(", ")
                );
            }
            render_bundles(out, args.output, &rows)
        }
        CatalogCommand::Search { name, gvk } => {
            if name.is_none() && gvk.is_none() {
                bail!("search needs --name or --gvk");
            }
            let mut rows = Vec::new();
            for c in &mut clients {
                let heads: std::collections::HashSet<(String, String)> = if gvk.is_some() {
                    c.list_packages()
                        .await?
                        .into_iter()
                        .flat_map(|p| {
                            p.channels
                                .into_iter()
                                .map(move |ch| (p.name.clone(), ch.csv_name))
                        })
                        .collect()
                } else {
                    Default::default()
                };
                for b in c.bundles().await? {
                    if name
                        .as_ref()
                        .is_some_and(|n| !b.package_name.contains(n.as_str()))
                    {
                        continue;
                    }
                    if let Some(q) = gvk {
                        // Channel heads only: what a subscription would install.
                        if !heads.contains(&(b.package_name.clone(), b.csv_name.clone()))
                            || !b.provided_apis.iter().any(|g| gvk_matches(q, g))
                        {
                            continue;
                        }
                    }
                    rows.push(bundle_row(&c.addr, &b));
                }
            }
            render_bundles(out, args.output, &rows)
        }
    }
}

fn render_bundles(
    out: &mut dyn std::io::Write,
    fmt: Output,
    rows: &[BundleRow],
) -> anyhow::Result<()> {
    render(
        out,
        fmt,
        rows,
        &[
            "CATALOG",
            "PACKAGE",
            "CHANNEL",
            "BUNDLE",
            "VERSION",
            "REPLACES",
            "SKIPS",
            "SKIP RANGE",
        ],
        |r| {
            vec![
                r.catalog.clone(),
                r.package.clone(),
                r.channel.clone(),
                r.name.clone(),
                r.version.clone(),
                r.replaces.clone(),
                r.skips.join(","),
                r.skip_range.clone(),
            ]
        },
    )
}

pub(crate) fn render<T: Serialize>(
    out: &mut dyn std::io::Write,
    fmt: Output,
    rows: &[T],
    header: &[&str],
    cells: impl Fn(&T) -> Vec<String>,
) -> anyhow::Result<()> {
    match fmt {
        Output::Json => {
            serde_json::to_writer_pretty(&mut *out, rows)?;
            writeln!(out)?;
        }
        Output::Yaml => write!(out, "{}", serde_yaml_ng::to_string(rows)?)?,
        Output::Table => {
            let body: Vec<Vec<String>> = rows.iter().map(cells).collect();
            let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
            for r in &body {
                for (w, c) in widths.iter_mut().zip(r) {
                    *w = (*w).max(c.chars().count());
                }
            }
            let line = |cols: Vec<String>| {
                let mut s = String::new();
                for (i, (c, w)) in cols.iter().zip(&widths).enumerate() {
                    if i + 1 == cols.len() {
                        s.push_str(c);
                    } else {
                        s.push_str(&format!("{c:<w$}   "));
                    }
                }
                s.trim_end().to_string()
            };
            writeln!(
                out,
                "{}",
                line(header.iter().map(|h| (*h).to_string()).collect())
            )?;
            for r in body {
                writeln!(out, "{}", line(r))?;
            }
        }
    }
    Ok(())
}
