//! `hcp-olm doctor NAME` (issue 39 item 6): walks the path a catalog read takes, hop by hop,
//! and prints the first hop that fails with what to do about it; exit 1 when one fails.
//!
//! The hops, in the order a Subscription depends on them:
//! 1. `hostedolm`: the HostedOLM exists and the controller has seen its spec;
//! 2. `controller`: the controller is not Degraded for a reason outside the pods;
//! 3. `hcp-pods`: catalog-operator, olm-operator, packageserver, the tunnel gateway and the
//!    catalog servers are available in the HCP namespace;
//! 4. `tunnel-endpoint`: the gateway has an address the guest can dial;
//! 5. `guest-agent`: the agent in the guest is available (from the guest when
//!    `--guest-kubeconfig` is given, else as the controller last saw it);
//! 6. `apiservice`: the guest's `v1.packages.operators.coreos.com` APIService is Available
//!    (guest only);
//! 7. `catalogs`: every enabled default catalog's guest CatalogSource is READY (what OLM's
//!    catalog-operator saw dialling it through the tunnel).
//!
//! The diagnosis is a pure function of what was read ([`Observed`] → [`Report`]), so every
//! fault is tested without a cluster; `cli/tests/doctor.rs` runs it against real API servers.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};
use serde::Serialize;
use serde_json::Value;

/// Arguments of `doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The HostedOLM (named like its HostedCluster).
    pub name: String,
    /// Its namespace (the HCP namespace); default: the kubeconfig context's namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Path of the management cluster's kubeconfig (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// The guest cluster's kubeconfig: check the agent, the APIService and the CatalogSources
    /// in the guest itself (without it, as the controller last reported them).
    #[arg(long, value_name = "PATH")]
    pub guest_kubeconfig: Option<PathBuf>,
    /// Print the hops as JSON.
    #[arg(long, short = 'o', value_enum, default_value_t = DoctorOutput::Text)]
    pub output: DoctorOutput,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DoctorOutput {
    Text,
    Json,
}

/// What the doctor read. `None`: not read (not found, or no access).
#[derive(Debug, Default, Clone)]
pub struct Observed {
    /// The HostedOLM object (JSON), if it exists.
    pub hosted_olm: Option<Value>,
    /// From the guest: the agent Deployment (`None` when not read, `Some(None)` when absent).
    pub guest_agent: Option<Option<Value>>,
    /// From the guest: the packageserver APIService.
    pub apiservice: Option<Option<Value>>,
    /// From the guest: CatalogSources in openshift-marketplace by name.
    pub catalog_sources: Option<Vec<Value>>,
    /// Why the guest was not read, when `--guest-kubeconfig` was given and it failed.
    pub guest_error: Option<String>,
}

/// One hop's verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hop {
    pub hop: &'static str,
    pub ok: bool,
    /// What was found.
    pub detail: String,
    /// What to do, when it failed.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub fix: String,
}

/// Every hop checked, in order; `first_failure` is the one to act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub hops: Vec<Hop>,
}

impl Report {
    pub fn first_failure(&self) -> Option<&Hop> {
        self.hops.iter().find(|h| !h.ok)
    }
}

fn condition<'a>(o: &'a Value, t: &str) -> Option<&'a Value> {
    o["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == t)
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_default()
}

/// Bounded and printable: every string that reaches the terminal came from a cluster.
fn clean(text: &str) -> String {
    let t: String = crate::catalog::sanitize(text).chars().take(300).collect();
    t
}

/// The guest agent's component name (components are named by their Deployment).
const GUEST_AGENT: &str = "hcp-olm-guest-agent";

/// The diagnosis (pure).
pub fn diagnose(ns: &str, name: &str, o: &Observed) -> Report {
    let mut hops = Vec::new();
    let ok = |hop: &'static str, detail: String| Hop {
        hop,
        ok: true,
        detail,
        fix: String::new(),
    };
    let fail = |hop: &'static str, detail: String, fix: String| Hop {
        hop,
        ok: false,
        detail: clean(&detail),
        fix,
    };
    let Some(h) = &o.hosted_olm else {
        hops.push(fail(
            "hostedolm",
            format!("no HostedOLM {ns}/{name}"),
            format!(
                "check the name and namespace (the HCP namespace, e.g. clusters-{name}); is the HostedCluster in hcp-olm's scope (--hosted-cluster-selector) and the controller running? kubectl -n hcp-olm-system logs deploy/hcp-olm-controller"
            ),
        ));
        return Report { hops };
    };
    let generation = h["metadata"]["generation"].as_i64();
    let observed = h["status"]["observedGeneration"].as_i64();
    if h["status"].is_null() || observed.is_none() {
        hops.push(fail(
            "hostedolm",
            "the controller has not reported on it yet".into(),
            "wait a minute; if it stays so, read the controller's log: kubectl -n hcp-olm-system logs deploy/hcp-olm-controller".into(),
        ));
        return Report { hops };
    }
    if generation.is_some() && observed < generation {
        hops.push(fail(
            "hostedolm",
            format!(
                "the controller has seen generation {} of {}",
                observed.unwrap_or_default(),
                generation.unwrap_or_default()
            ),
            "the controller is behind: is it running and leading? kubectl -n hcp-olm-system get lease hcp-olm-controller".into(),
        ));
    } else {
        hops.push(ok(
            "hostedolm",
            format!("observed generation {}", observed.unwrap_or_default()),
        ));
    }

    // The controller's own view: Degraded for a reason that is not a pod's.
    let components = h["status"]["components"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let degraded = condition(h, "Degraded").filter(|c| c["status"] == "True");
    // A reason a later hop names (a component's, the tunnel's, the catalogs') is left to it.
    let later = |reason: &str| {
        reason == "CatalogsNotReady"
            || s(&h["status"]["tunnel"]["reason"]) == reason
            || components.iter().any(|c| s(&c["reason"]) == reason)
    };
    match degraded {
        Some(c) if !later(s(&c["reason"])) => hops.push(fail(
            "controller",
            format!("Degraded {}: {}", s(&c["reason"]), s(&c["message"])),
            format!(
                "the reason names the input to fix (HostedCluster, HostedOLM spec, kubeconfig, pull secret); kubectl -n {ns} get hostedolm {name} -o yaml"
            ),
        )),
        _ => hops.push(ok("controller", "not Degraded for a reason of its own".into())),
    }

    // The HCP namespace's pods.
    let hcp_down: Vec<&Value> = components
        .iter()
        .filter(|c| c["name"] != GUEST_AGENT && c["available"] != true)
        .collect();
    match hcp_down.first() {
        Some(c) => hops.push(fail(
            "hcp-pods",
            format!(
                "{} not available ({}/{} ready){}{}",
                s(&c["name"]),
                c["readyReplicas"].as_i64().unwrap_or(0),
                c["desiredReplicas"].as_i64().unwrap_or(0),
                if s(&c["reason"]).is_empty() { "" } else { ": " },
                [s(&c["reason"]), s(&c["message"])].join(" ").trim()
            ),
            format!(
                "kubectl -n {ns} describe deployment {0}; kubectl -n {ns} logs deployment/{0}",
                s(&c["name"])
            ),
        )),
        None if components.is_empty() => hops.push(fail(
            "hcp-pods",
            "no component reported".into(),
            "the controller has not rendered the HCP side yet; read its status conditions".into(),
        )),
        None => hops.push(ok(
            "hcp-pods",
            format!(
                "{} components available",
                components
                    .iter()
                    .filter(|c| c["name"] != GUEST_AGENT)
                    .count()
            ),
        )),
    }

    // The gateway's address.
    let tunnel = &h["status"]["tunnel"];
    match tunnel["endpoint"].as_str() {
        Some(e) if !e.is_empty() => hops.push(ok("tunnel-endpoint", format!("{e} ({})", s(&tunnel["serviceType"])))),
        _ => hops.push(fail(
            "tunnel-endpoint",
            format!("no endpoint: {} {}", s(&tunnel["reason"]), s(&tunnel["message"])),
            format!(
                "the guest's nodes must reach the gateway: check kubectl -n {ns} get service hcp-olm-tunnel-gateway-wg, the HostedCluster's service publishing, or set HostedOLM spec.tunnel.address"
            ),
        )),
    }

    // The agent in the guest.
    match &o.guest_agent {
        Some(Some(d)) => {
            let want = d["spec"]["replicas"].as_i64().unwrap_or(1);
            let ready = d["status"]["readyReplicas"].as_i64().unwrap_or(0);
            if ready >= want.max(1) {
                hops.push(ok("guest-agent", format!("{ready}/{want} ready in the guest")));
            } else {
                hops.push(fail(
                    "guest-agent",
                    format!("{ready}/{want} ready in the guest"),
                    "in the guest: kubectl -n hcp-olm describe deployment hcp-olm-guest-agent; kubectl -n hcp-olm logs deployment/hcp-olm-guest-agent (a handshake that never completes: the guest's nodes cannot reach the tunnel endpoint over UDP)".into(),
                ));
            }
        }
        Some(None) => hops.push(fail(
            "guest-agent",
            "no hcp-olm-guest-agent Deployment in the guest".into(),
            "the controller writes it once the guest answers: read the HostedOLM's conditions".into(),
        )),
        None => match components.iter().find(|c| c["name"] == GUEST_AGENT) {
            Some(c) if c["available"] == true => hops.push(ok(
                "guest-agent",
                "available (as the controller last saw it; --guest-kubeconfig checks the guest)".into(),
            )),
            Some(c) => hops.push(fail(
                "guest-agent",
                format!("not available (as the controller last saw it): {} {}", s(&c["reason"]), s(&c["message"])),
                "in the guest: kubectl -n hcp-olm logs deployment/hcp-olm-guest-agent; rerun with --guest-kubeconfig".into(),
            )),
            None => hops.push(ok(
                "guest-agent",
                "not reported (catalogs placed in the management cluster without a tunnel, or not checked)".into(),
            )),
        },
    }

    // The packageserver APIService (guest only).
    match &o.apiservice {
        Some(Some(a)) => {
            let c = condition(a, "Available");
            if c.is_some_and(|c| c["status"] == "True") {
                hops.push(ok("apiservice", "v1.packages.operators.coreos.com Available".into()));
            } else {
                hops.push(fail(
                    "apiservice",
                    format!(
                        "v1.packages.operators.coreos.com not Available: {} {}",
                        c.map(|c| s(&c["reason"])).unwrap_or("no condition"),
                        c.map(|c| s(&c["message"])).unwrap_or_default()
                    ),
                    format!(
                        "the guest API server reaches packageserver through the Service default/packageserver: kubectl -n {ns} get pods -l app.kubernetes.io/name=hcp-olm-packageserver; in the guest: kubectl get endpoints -n default packageserver"
                    ),
                ));
            }
        }
        Some(None) => hops.push(fail(
            "apiservice",
            "no APIService v1.packages.operators.coreos.com in the guest".into(),
            "the controller writes it once packageserver has an address: read the HostedOLM's conditions".into(),
        )),
        None => {}
    }

    // The catalogs, as OLM's catalog-operator dials them.
    let enabled: Vec<Value> = h["status"]["catalogs"]
        .as_array()
        .map(|a| a.iter().filter(|c| c["enabled"] == true).cloned().collect())
        .unwrap_or_default();
    let mut states: Vec<(String, String, String)> = enabled
        .iter()
        .map(|c| {
            (
                s(&c["name"]).to_string(),
                s(&c["connectionState"]).to_string(),
                s(&c["message"]).to_string(),
            )
        })
        .collect();
    if let Some(sources) = &o.catalog_sources {
        for st in &mut states {
            match sources
                .iter()
                .find(|cs| cs["metadata"]["name"] == st.0.as_str())
            {
                Some(cs) => {
                    st.1 = s(&cs["status"]["connectionState"]["lastObservedState"]).to_string();
                    st.2 = s(&cs["status"]["message"]).to_string();
                }
                None => {
                    st.1 = "absent".into();
                }
            }
        }
    }
    match states.iter().find(|(_, state, _)| state != "READY") {
        Some((cat, state, msg)) => hops.push(fail(
            "catalogs",
            format!(
                "CatalogSource openshift-marketplace/{cat} is {}{}{msg}",
                if state.is_empty() { "not reported" } else { state },
                if msg.is_empty() { "" } else { ": " }
            ),
            format!(
                "catalog-operator dials it through the tunnel: kubectl -n {ns} logs deployment/hcp-olm-catalog-operator; its server: kubectl -n {ns} get pods -l app.kubernetes.io/component=catalog (or -n hcp-olm-catalogs for shared catalogs); browse it: hcp-olm catalog --help"
            ),
        )),
        None => hops.push(ok("catalogs", format!("{} catalogs READY", states.len()))),
    }
    if let Some(e) = &o.guest_error {
        hops.push(fail(
            "guest",
            format!("the guest was not read: {e}"),
            "check --guest-kubeconfig (the HostedCluster's admin kubeconfig Secret)".into(),
        ));
    }
    Report { hops }
}

/// Prints the report; `Ok(true)` when every hop passed.
pub fn print(
    report: &Report,
    output: DoctorOutput,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<bool> {
    match output {
        DoctorOutput::Json => {
            serde_json::to_writer_pretty(&mut *out, report)?;
            writeln!(out)?;
        }
        DoctorOutput::Text => {
            for h in &report.hops {
                writeln!(
                    out,
                    "{} {:<16} {}",
                    if h.ok { "ok  " } else { "FAIL" },
                    h.hop,
                    h.detail
                )?;
            }
            match report.first_failure() {
                Some(h) => writeln!(out, "\nfirst failing hop: {}\nwhat to do: {}", h.hop, h.fix)?,
                None => writeln!(out, "\nevery hop passed")?,
            }
        }
    }
    Ok(report.first_failure().is_none())
}

/// Reads what [`diagnose`] needs and runs it.
pub async fn run(args: &DoctorArgs, out: &mut dyn std::io::Write) -> anyhow::Result<bool> {
    let (client, default_ns) =
        crate::status::client_for(args.kubeconfig.as_ref(), args.context.as_ref()).await?;
    let ns = args.namespace.clone().unwrap_or(default_ns);
    let ar = crate::status::hosted_olm_resource();
    let api: Api<DynamicObject> = Api::namespaced_with(client, &ns, &ar);
    let hosted_olm = api
        .get_opt(&args.name)
        .await
        .map_err(|e| match e {
            kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
                "this cluster does not serve HostedOLM (olm.hcp-olm.io): is hcp-olm installed?"
            ),
            e => anyhow::Error::new(e).context("reading the HostedOLM"),
        })?
        .map(|o| serde_json::to_value(o).unwrap_or_default());
    let mut observed = Observed {
        hosted_olm,
        ..Default::default()
    };
    if let Some(path) = &args.guest_kubeconfig {
        match read_guest(path).await {
            Ok((agent, apiservice, sources)) => {
                observed.guest_agent = Some(agent);
                observed.apiservice = Some(apiservice);
                observed.catalog_sources = Some(sources);
            }
            Err(e) => observed.guest_error = Some(format!("{e:#}")),
        }
    }
    let report = diagnose(&ns, &args.name, &observed);
    print(&report, args.output, out)
}

type GuestView = (Option<Value>, Option<Value>, Vec<Value>);

async fn read_guest(path: &PathBuf) -> anyhow::Result<GuestView> {
    let (guest, _) = crate::status::client_for(Some(path), None).await?;
    let get = |group: &str, version: &str, kind: &str, plural: &str| {
        ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk(group, version, kind),
            plural,
        )
    };
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        guest.clone(),
        "hcp-olm",
        &get("apps", "v1", "Deployment", "deployments"),
    );
    let agent = deployments
        .get_opt("hcp-olm-guest-agent")
        .await
        .context("reading the guest agent Deployment")?
        .map(|o| serde_json::to_value(o).unwrap_or_default());
    let apiservices: Api<DynamicObject> = Api::all_with(
        guest.clone(),
        &get("apiregistration.k8s.io", "v1", "APIService", "apiservices"),
    );
    let apiservice = apiservices
        .get_opt("v1.packages.operators.coreos.com")
        .await
        .context("reading the packageserver APIService")?
        .map(|o| serde_json::to_value(o).unwrap_or_default());
    let sources: Api<DynamicObject> = Api::namespaced_with(
        guest,
        "openshift-marketplace",
        &get(
            "operators.coreos.com",
            "v1alpha1",
            "CatalogSource",
            "catalogsources",
        ),
    );
    // At most 500 CatalogSources: the defaults are what is checked.
    let list = sources
        .list(&kube::api::ListParams::default().limit(500))
        .await
        .map(|l| l.items)
        .or_else(|e| match e {
            kube::Error::Api(s) if s.code == 404 => Ok(Vec::new()),
            e => Err(e),
        })
        .context("listing the guest's CatalogSources")?;
    Ok((
        agent,
        apiservice,
        list.into_iter()
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn healthy() -> Value {
        json!({
            "metadata": {"name": "a", "namespace": "clusters-a", "generation": 2},
            "status": {
                "observedGeneration": 2,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "AsExpected"},
                    {"type": "Degraded", "status": "False", "reason": "AsExpected"},
                ],
                "components": [
                    {"name": "hcp-olm-catalog-operator", "available": true},
                    {"name": "hcp-olm-olm-operator", "available": true},
                    {"name": "hcp-olm-packageserver", "available": true},
                    {"name": "hcp-olm-tunnel-gateway", "available": true},
                    {"name": "hcp-olm-guest-agent", "available": true},
                ],
                "tunnel": {"serviceType": "NodePort", "endpoint": "198.18.0.1:31234", "reason": "AsExpected"},
                "catalogs": [
                    {"name": "redhat-operators", "enabled": true, "connectionState": "READY"},
                    {"name": "community-operators", "enabled": false},
                ],
            },
        })
    }

    fn first(o: &Observed) -> Option<(&'static str, String)> {
        diagnose("clusters-a", "a", o)
            .first_failure()
            .map(|h| (h.hop, h.detail.clone()))
    }

    #[test]
    fn each_fault_is_named_by_its_hop() {
        let mut o = Observed {
            hosted_olm: Some(healthy()),
            ..Default::default()
        };
        assert_eq!(first(&o), None);
        assert_eq!(first(&Observed::default()).unwrap().0, "hostedolm");

        let mut h = healthy();
        h["status"]["components"][3] = json!({"name": "hcp-olm-tunnel-gateway", "available": false, "readyReplicas": 0, "desiredReplicas": 2, "reason": "CrashLoopBackOff", "message": "exit 64"});
        o.hosted_olm = Some(h);
        let (hop, detail) = first(&o).unwrap();
        assert_eq!(hop, "hcp-pods");
        assert!(
            detail.contains("hcp-olm-tunnel-gateway")
                && detail.contains("0/2")
                && detail.contains("CrashLoopBackOff"),
            "{detail}"
        );

        let mut h = healthy();
        h["status"]["tunnel"] = json!({"serviceType": "NodePort", "reason": "TunnelAddressUnknown", "message": "no address"});
        o.hosted_olm = Some(h);
        assert_eq!(first(&o).unwrap().0, "tunnel-endpoint");

        let mut h = healthy();
        h["status"]["catalogs"][0]["connectionState"] = json!("TRANSIENT_FAILURE");
        o.hosted_olm = Some(h);
        let (hop, detail) = first(&o).unwrap();
        assert_eq!(hop, "catalogs");
        assert!(
            detail.contains("redhat-operators is TRANSIENT_FAILURE"),
            "{detail}"
        );

        let mut h = healthy();
        h["status"]["conditions"][1] = json!({"type": "Degraded", "status": "True", "reason": "GuestKubeconfigUnsafe", "message": "exec is not allowed"});
        o.hosted_olm = Some(h);
        assert_eq!(first(&o).unwrap().0, "controller");
        // Degraded for the tunnel's reason: the tunnel hop names it, not the controller's.
        let mut h = healthy();
        h["status"]["conditions"][1] = json!({"type": "Degraded", "status": "True", "reason": "TunnelAddressUnknown", "message": "no address"});
        h["status"]["tunnel"] = json!({"serviceType": "NodePort", "reason": "TunnelAddressUnknown", "message": "no address"});
        o.hosted_olm = Some(h);
        assert_eq!(first(&o).unwrap().0, "tunnel-endpoint");

        // Guest reads win over the controller's view.
        o.hosted_olm = Some(healthy());
        o.guest_agent = Some(Some(
            json!({"spec": {"replicas": 1}, "status": {"readyReplicas": 0}}),
        ));
        o.apiservice = Some(Some(
            json!({"status": {"conditions": [{"type": "Available", "status": "True"}]}}),
        ));
        o.catalog_sources = Some(vec![
            json!({"metadata": {"name": "redhat-operators"}, "status": {"connectionState": {"lastObservedState": "READY"}}}),
        ]);
        assert_eq!(first(&o).unwrap().0, "guest-agent");
        o.guest_agent = Some(Some(
            json!({"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}),
        ));
        assert_eq!(first(&o), None);
        o.apiservice = Some(Some(
            json!({"status": {"conditions": [{"type": "Available", "status": "False", "reason": "FailedDiscoveryCheck"}]}}),
        ));
        assert_eq!(first(&o).unwrap().0, "apiservice");
        o.apiservice = Some(Some(
            json!({"status": {"conditions": [{"type": "Available", "status": "True"}]}}),
        ));
        o.catalog_sources = Some(vec![
            json!({"metadata": {"name": "redhat-operators"}, "status": {"connectionState": {"lastObservedState": "CONNECTING"}, "message": "\u{1b}[31mred"}}),
        ]);
        let (hop, detail) = first(&o).unwrap();
        assert_eq!(hop, "catalogs");
        assert!(
            detail.contains("CONNECTING") && !detail.contains('\u{1b}'),
            "{detail}"
        );
    }
}
