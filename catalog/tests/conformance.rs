//! Wire conformance against real `opm serve` (v1.73.0): the same catalogs are
//! served by both, every rpc is called for every package, channel, bundle and
//! provided GVK, and the answers must be equal after normalising only what
//! the API leaves unordered (stream order, channel order in a package, JSON
//! object key order inside csvJson/object, and the pick among several bundles
//! that replace the same one).
//! Fails, never skips, when opm is missing: run `make tools` first.

#![allow(deprecated)] // GetBundleForChannel is deprecated upstream but still served.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use common::{Server, start_opm, start_ours};
use hcp_olm_proto::api::registry_client::RegistryClient;
use hcp_olm_proto::api::{self, Bundle, ChannelEntry};
use tonic::transport::Channel;

type Reply<T> = Result<T, (tonic::Code, String)>;

fn reply<T>(r: Result<tonic::Response<T>, tonic::Status>) -> Reply<T> {
    r.map(tonic::Response::into_inner)
        .map_err(|s| (s.code(), s.message().to_string()))
}

async fn collect<T>(
    r: Result<tonic::Response<tonic::Streaming<T>>, tonic::Status>,
) -> Reply<Vec<T>> {
    let mut s = reply(r)?;
    let mut out = Vec::new();
    loop {
        match s.message().await {
            Ok(Some(x)) => out.push(x),
            Ok(None) => return Ok(out),
            Err(e) => return Err((e.code(), e.message().to_string())),
        }
    }
}

/// A bundle with JSON payloads parsed (key order is not part of the API).
#[derive(Debug, PartialEq)]
struct NormBundle {
    bundle: Bundle,
    csv: Option<serde_json::Value>,
    objects: Vec<serde_json::Value>,
}

fn parse_json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|_| serde_json::Value::String(s.to_string()))
}

fn norm_bundle(mut b: Bundle) -> NormBundle {
    let csv = (!b.csv_json.is_empty()).then(|| parse_json(&b.csv_json));
    let objects = b.object.iter().map(|o| parse_json(o)).collect();
    b.csv_json.clear();
    b.object.clear();
    NormBundle {
        bundle: b,
        csv,
        objects,
    }
}

fn norm_entries(mut v: Vec<ChannelEntry>) -> Vec<ChannelEntry> {
    v.sort_by(|a, b| {
        (
            &a.package_name,
            &a.channel_name,
            &a.bundle_name,
            &a.replaces,
        )
            .cmp(&(
                &b.package_name,
                &b.channel_name,
                &b.bundle_name,
                &b.replaces,
            ))
    });
    v
}

struct Stats {
    calls: usize,
    byte_equal_csv: usize,
    csv_compared: usize,
}

struct Pair {
    opm: RegistryClient<Channel>,
    ours: RegistryClient<Channel>,
    stats: Stats,
    failures: Vec<String>,
}

macro_rules! both {
    ($pair:expr, $method:ident, $req:expr) => {{
        $pair.stats.calls += 1;
        let req = $req;
        let (a, b) = tokio::join!(
            $pair.opm.$method(req.clone()),
            $pair.ours.$method(req.clone())
        );
        (req, a, b)
    }};
}

impl Pair {
    fn check<T: PartialEq + std::fmt::Debug>(
        &mut self,
        what: String,
        opm: &Reply<T>,
        ours: &Reply<T>,
    ) {
        if opm != ours {
            let (a, b) = (format!("{opm:#?}"), format!("{ours:#?}"));
            let (la, lb): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
            let i = la
                .iter()
                .zip(&lb)
                .position(|(x, y)| x != y)
                .unwrap_or(la.len().min(lb.len()));
            let cut = |l: &[&str]| {
                l[i.saturating_sub(2)..(i + 3).min(l.len())]
                    .iter()
                    .map(|s| s.chars().take(300).collect::<String>())
                    .collect::<Vec<_>>()
                    .join("\n      ")
            };
            self.failures.push(format!(
                "{what}: first difference at line {i}:\n  opm:  {}\n  ours: {}",
                cut(&la),
                cut(&lb)
            ));
        }
    }

    fn count_csv(&mut self, opm: &Reply<Bundle>, ours: &Reply<Bundle>) {
        if let (Ok(a), Ok(b)) = (opm, ours)
            && !a.csv_json.is_empty()
        {
            self.stats.csv_compared += 1;
            if a.csv_json == b.csv_json {
                self.stats.byte_equal_csv += 1;
            }
        }
    }
}

async fn compare(name: &str, dir: &Path) -> Stats {
    let logs = tempfile::tempdir().expect("tempdir");
    let (opm, ours): (Server, Server) =
        tokio::join!(start_opm(dir, logs.path()), start_ours(dir, logs.path()));
    let mut p = Pair {
        opm: opm.registry().await,
        ours: ours.registry().await,
        stats: Stats {
            calls: 0,
            byte_equal_csv: 0,
            csv_compared: 0,
        },
        failures: Vec::new(),
    };

    // Packages.
    let (_, a, b) = both!(p, list_packages, api::ListPackageRequest {});
    let (mut a, mut b) = (collect(a).await, collect(b).await);
    for v in [&mut a, &mut b].into_iter().flatten() {
        v.sort_by(|x, y| x.name.cmp(&y.name));
    }
    p.check("ListPackages".into(), &a, &b);
    let packages: Vec<String> = a
        .expect("opm ListPackages")
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert!(!packages.is_empty(), "{name}: opm lists no packages");

    for pkg in packages
        .iter()
        .map(String::as_str)
        .chain(["no-such-package", ""])
    {
        let (_, a, b) = both!(p, get_package, api::GetPackageRequest { name: pkg.into() });
        let norm = |r: Reply<api::Package>| {
            r.map(|mut x| {
                x.channels.sort_by(|c, d| c.name.cmp(&d.name));
                x
            })
        };
        let (a, b) = (norm(reply(a)), norm(reply(b)));
        p.check(format!("GetPackage({pkg})"), &a, &b);
    }

    // Full bundle listing.
    let (_, a, b) = both!(p, list_bundles, api::ListBundlesRequest {});
    let key = |b: &Bundle| {
        (
            b.package_name.clone(),
            b.channel_name.clone(),
            b.csv_name.clone(),
        )
    };
    let sorted = |r: Reply<Vec<Bundle>>| {
        r.map(|mut v| {
            v.sort_by_key(key);
            v
        })
    };
    let (a, b) = (sorted(collect(a).await), sorted(collect(b).await));
    let listed = a.clone().expect("opm ListBundles");
    let (na, nb) = (
        a.map(|v| v.into_iter().map(norm_bundle).collect::<Vec<_>>()),
        b.map(|v| v.into_iter().map(norm_bundle).collect::<Vec<_>>()),
    );
    match (&na, &nb) {
        (Ok(x), Ok(y)) if x.len() == y.len() => {
            for (i, (u, v)) in x.iter().zip(y).enumerate() {
                if u != v {
                    p.check(
                        format!("ListBundles[{i}]"),
                        &Ok::<_, (tonic::Code, String)>(u),
                        &Ok(v),
                    );
                }
            }
        }
        _ => p.check(
            "ListBundles".into(),
            &na.map(|v| v.len()),
            &nb.map(|v| v.len()),
        ),
    }

    // Graph as opm lists it, for the "any of several replacements" rule.
    let mut replacers: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    let mut channels: BTreeSet<(String, String)> = BTreeSet::new();
    let mut gvks: BTreeSet<(String, String, String)> = BTreeSet::new();
    for b in &listed {
        channels.insert((b.package_name.clone(), b.channel_name.clone()));
        for r in std::iter::once(&b.replaces).chain(&b.skips) {
            replacers
                .entry((b.package_name.clone(), b.channel_name.clone(), r.clone()))
                .or_default()
                .insert(b.csv_name.clone());
        }
        for g in b.provided_apis.iter().chain(&b.required_apis) {
            gvks.insert((g.group.clone(), g.version.clone(), g.kind.clone()));
        }
    }

    for b in &listed {
        let (pk, ch, cs) = (&b.package_name, &b.channel_name, &b.csv_name);
        let (_, a, o) = both!(
            p,
            get_bundle,
            api::GetBundleRequest {
                pkg_name: pk.clone(),
                channel_name: ch.clone(),
                csv_name: cs.clone()
            }
        );
        let (a, o) = (reply(a), reply(o));
        p.count_csv(&a, &o);
        p.check(
            format!("GetBundle({pk},{ch},{cs})"),
            &a.map(norm_bundle),
            &o.map(norm_bundle),
        );

        let (_, a, o) = both!(
            p,
            get_bundle_that_replaces,
            api::GetReplacementRequest {
                csv_name: cs.clone(),
                pkg_name: pk.clone(),
                channel_name: ch.clone()
            }
        );
        let (a, o) = (reply(a), reply(o));
        let both_valid = match (&a, &o) {
            (Ok(x), Ok(y)) if x.csv_name != y.csv_name => replacers
                .get(&(pk.clone(), ch.clone(), cs.clone()))
                .is_some_and(|set| set.contains(&x.csv_name) && set.contains(&y.csv_name)),
            _ => false,
        };
        if !both_valid {
            p.check(
                format!("GetBundleThatReplaces({cs},{pk},{ch})"),
                &a.map(norm_bundle),
                &o.map(norm_bundle),
            );
        }

        let (_, a, o) = both!(
            p,
            get_channel_entries_that_replace,
            api::GetAllReplacementsRequest {
                csv_name: cs.clone()
            }
        );
        let (a, o) = (
            collect(a).await.map(norm_entries),
            collect(o).await.map(norm_entries),
        );
        p.check(format!("GetChannelEntriesThatReplace({cs})"), &a, &o);
    }
    for name in ["", "no-such-bundle.v0.0.0"] {
        let (_, a, o) = both!(
            p,
            get_channel_entries_that_replace,
            api::GetAllReplacementsRequest {
                csv_name: name.into()
            }
        );
        let (a, o) = (
            collect(a).await.map(norm_entries),
            collect(o).await.map(norm_entries),
        );
        p.check(format!("GetChannelEntriesThatReplace({name:?})"), &a, &o);
    }

    let first_pkg = packages[0].clone();
    let mut channel_queries: Vec<(String, String)> = channels.iter().cloned().collect();
    channel_queries.push((first_pkg.clone(), "no-such-channel".into()));
    channel_queries.push(("no-such-package".into(), "stable".into()));
    for (pk, ch) in &channel_queries {
        let (_, a, o) = both!(
            p,
            get_bundle_for_channel,
            api::GetBundleInChannelRequest {
                pkg_name: pk.clone(),
                channel_name: ch.clone()
            }
        );
        p.check(
            format!("GetBundleForChannel({pk},{ch})"),
            &reply(a).map(norm_bundle),
            &reply(o).map(norm_bundle),
        );
    }

    // Unknown lookups.
    let first_ch = channels
        .iter()
        .find(|(p, _)| *p == first_pkg)
        .map(|(_, c)| c.clone())
        .unwrap_or_default();
    for (pk, ch, cs) in [
        ("no-such-package", "stable", "x.v1.0.0"),
        (first_pkg.as_str(), "no-such-channel", "x.v1.0.0"),
        (
            first_pkg.as_str(),
            first_ch.as_str(),
            "no-such-bundle.v1.0.0",
        ),
    ] {
        let req = api::GetBundleRequest {
            pkg_name: pk.into(),
            channel_name: ch.into(),
            csv_name: cs.into(),
        };
        let (_, a, o) = both!(p, get_bundle, req);
        p.check(
            format!("GetBundle({pk},{ch},{cs})"),
            &reply(a).map(norm_bundle),
            &reply(o).map(norm_bundle),
        );
        let req = api::GetReplacementRequest {
            csv_name: cs.into(),
            pkg_name: pk.into(),
            channel_name: ch.into(),
        };
        let (_, a, o) = both!(p, get_bundle_that_replaces, req);
        p.check(
            format!("GetBundleThatReplaces({cs},{pk},{ch})"),
            &reply(a).map(norm_bundle),
            &reply(o).map(norm_bundle),
        );
    }

    // Providers.
    gvks.insert(("no.such.group".into(), "v1".into(), "Nothing".into()));
    for (g, v, k) in &gvks {
        let (_, a, o) = both!(
            p,
            get_channel_entries_that_provide,
            api::GetAllProvidersRequest {
                group: g.clone(),
                version: v.clone(),
                kind: k.clone(),
                plural: "ignored".into()
            }
        );
        let (a, o) = (
            collect(a).await.map(norm_entries),
            collect(o).await.map(norm_entries),
        );
        p.check(format!("GetChannelEntriesThatProvide({g}/{v}/{k})"), &a, &o);
        let (_, a, o) = both!(
            p,
            get_latest_channel_entries_that_provide,
            api::GetLatestProvidersRequest {
                group: g.clone(),
                version: v.clone(),
                kind: k.clone(),
                plural: String::new()
            }
        );
        let (a, o) = (
            collect(a).await.map(norm_entries),
            collect(o).await.map(norm_entries),
        );
        p.check(
            format!("GetLatestChannelEntriesThatProvide({g}/{v}/{k})"),
            &a,
            &o,
        );
        let (_, a, o) = both!(
            p,
            get_default_bundle_that_provides,
            api::GetDefaultProviderRequest {
                group: g.clone(),
                version: v.clone(),
                kind: k.clone(),
                plural: String::new()
            }
        );
        p.check(
            format!("GetDefaultBundleThatProvides({g}/{v}/{k})"),
            &reply(a).map(norm_bundle),
            &reply(o).map(norm_bundle),
        );
    }

    eprintln!(
        "conformance[{name}]: {} calls compared on each server, {} csvJson byte-identical of {}; startup opm {:?}, ours {:?}",
        p.stats.calls, p.stats.byte_equal_csv, p.stats.csv_compared, opm.startup, ours.startup
    );
    let n = p.failures.len();
    if n > 0 {
        let shown: Vec<&String> = p.failures.iter().take(15).collect();
        panic!(
            "{name}: {n} of {} calls differ from opm; first ones:\n{}",
            p.stats.calls,
            shown
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    p.stats
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_small_catalog() {
    let s = compare("small", &common::fixture("small")).await;
    assert!(s.calls > 50, "too few calls: {}", s.calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_large_catalog() {
    let (dir, opm_refused, ours_refused) = common::opm_subset(&common::fixture("large"));
    eprintln!(
        "large: {} packages left out, refused by opm validate: {opm_refused:?}",
        opm_refused.len()
    );
    assert!(
        opm_refused.len() < 20,
        "too many packages refused by opm: {opm_refused:?}"
    );
    // Whatever opm serves, we serve.
    assert!(
        ours_refused.is_empty(),
        "accepted by opm, refused by our loader: {ours_refused:?}"
    );
    let s = compare("large", dir.path()).await;
    assert!(s.calls > 4000, "too few calls: {}", s.calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_bundle_object_catalog() {
    let s = compare(
        "large-bundle-object",
        &common::fixture("large-bundle-object"),
    )
    .await;
    assert!(s.calls > 500, "too few calls: {}", s.calls);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_generated_edge_cases() {
    let dir = tempfile::tempdir().expect("tempdir");
    common::edge::write(dir.path());
    let s = compare("edge-cases", dir.path()).await;
    assert!(s.calls > 40, "too few calls: {}", s.calls);
}
