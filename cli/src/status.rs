//! `hcp-olm status` (also `kubectl hcp-olm status`): the HostedOLM objects of a management
//! cluster, one line each: whether OLM is available, why not, the default catalogs' guest
//! connection state and the tunnel endpoint. Reads through the usual kubeconfig
//! (`--kubeconfig`, else `KUBECONFIG`, else `~/.kube/config`; `--context`).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde::Serialize;
use serde_json::Value;

use crate::catalog::{Output, render};

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One HostedOLM to show in detail (its conditions, components, catalogs and tunnel,
    /// with their messages); all of the namespace when unset.
    pub name: Option<String>,
    /// Namespace (HCP namespace) to list; default: the kubeconfig context's namespace.
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// List HostedOLMs of every namespace.
    #[arg(long, short = 'A')]
    pub all_namespaces: bool,
    /// Path of the kubeconfig (default: KUBECONFIG, then ~/.kube/config).
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: its current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// One HostedOLM, as printed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct StatusRow {
    pub namespace: String,
    pub name: String,
    pub available: String,
    pub degraded: String,
    /// Reason of the first unhealthy condition, else empty.
    pub reason: String,
    /// Catalogs whose guest connection is READY, of the enabled ones.
    pub catalogs_ready: usize,
    pub catalogs: usize,
    pub tunnel: String,
}

fn condition<'a>(status: &'a Value, type_: &str) -> Option<&'a Value> {
    status["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// The row of one HostedOLM object (pure; anything missing shows as `Unknown` or empty).
pub fn row(o: &Value) -> StatusRow {
    let st = &o["status"];
    let status_of = |t: &str| {
        condition(st, t)
            .and_then(|c| c["status"].as_str())
            .unwrap_or("Unknown")
            .to_string()
    };
    let available = status_of("Available");
    let degraded = status_of("Degraded");
    let reason = [("Available", "False"), ("Degraded", "True")]
        .iter()
        .find_map(|(t, bad)| {
            condition(st, t)
                .filter(|c| c["status"] == *bad)
                .and_then(|c| c["reason"].as_str())
        })
        .unwrap_or_default()
        .to_string();
    let enabled: Vec<&Value> = st["catalogs"]
        .as_array()
        .map(|a| a.iter().filter(|c| c["enabled"] == true).collect())
        .unwrap_or_default();
    let ready = enabled
        .iter()
        .filter(|c| c["connectionState"] == "READY")
        .count();
    let tunnel = match (
        st["tunnel"]["endpoint"].as_str(),
        st["tunnel"]["reason"].as_str(),
    ) {
        (Some(e), _) => e.to_string(),
        (None, Some(r)) => r.to_string(),
        _ => String::new(),
    };
    StatusRow {
        namespace: o["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .into(),
        name: o["metadata"]["name"].as_str().unwrap_or_default().into(),
        available,
        degraded,
        reason,
        catalogs_ready: ready,
        catalogs: enabled.len(),
        tunnel,
    }
}

/// One HostedOLM in detail: conditions, components, catalogs and tunnel with their messages
/// (pure; every string from the cluster sanitized).
pub fn detail(o: &Value) -> String {
    use std::fmt::Write as _;
    let c = |v: &Value| crate::catalog::sanitize(v.as_str().unwrap_or_default());
    let st = &o["status"];
    let mut t = String::new();
    let _ = writeln!(
        t,
        "HostedOLM {}/{} (generation {}, observed {}; placement {}, release {})",
        c(&o["metadata"]["namespace"]),
        c(&o["metadata"]["name"]),
        o["metadata"]["generation"].as_i64().unwrap_or(0),
        st["observedGeneration"].as_i64().unwrap_or(0),
        c(&st["placement"]),
        c(&st["releaseVersion"]),
    );
    let _ = writeln!(t, "Conditions:");
    for k in st["conditions"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "  {:<12} {:<6} {:<28} {}",
            c(&k["type"]),
            c(&k["status"]),
            c(&k["reason"]),
            c(&k["message"])
        );
    }
    let _ = writeln!(t, "Components:");
    for k in st["components"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "  {:<36} {:<5} {}/{} {} {}",
            c(&k["name"]),
            if k["available"] == true { "ok" } else { "DOWN" },
            k["readyReplicas"].as_i64().unwrap_or(0),
            k["desiredReplicas"].as_i64().unwrap_or(0),
            c(&k["reason"]),
            c(&k["message"])
        );
    }
    let _ = writeln!(t, "Catalogs:");
    for k in st["catalogs"].as_array().into_iter().flatten() {
        let _ = writeln!(
            t,
            "  {:<24} {:<8} {:<18} {:<7} {} {}",
            c(&k["name"]),
            if k["enabled"] == true {
                "enabled"
            } else {
                "disabled"
            },
            c(&k["connectionState"]),
            c(&k["sharing"]),
            c(&k["servingDeployment"]),
            c(&k["message"])
        );
    }
    let tn = &st["tunnel"];
    let _ = writeln!(
        t,
        "Tunnel: {} {} {} {}",
        c(&tn["serviceType"]),
        c(&tn["endpoint"]),
        c(&tn["reason"]),
        c(&tn["message"])
    );
    t
}

async fn client(args: &StatusArgs) -> anyhow::Result<(kube::Client, String)> {
    client_for(args.kubeconfig.as_ref(), args.context.as_ref()).await
}

/// A client of the kubeconfig at `kubeconfig` (else the usual places) and `context` (else its
/// current one), with the context's namespace.
pub(crate) async fn client_for(
    kubeconfig: Option<&PathBuf>,
    context: Option<&String>,
) -> anyhow::Result<(kube::Client, String)> {
    let kubeconfig = match kubeconfig {
        // KUBECONFIG may list several files (joined with ':'), as kubectl allows.
        Some(p) if p.to_string_lossy().contains(':') => {
            Kubeconfig::read().context("reading the kubeconfig files named by KUBECONFIG")?
        }
        Some(p) => Kubeconfig::read_from(p)
            .with_context(|| format!("reading the kubeconfig {}", p.display()))?,
        None => Kubeconfig::read().context(
            "no kubeconfig: pass --kubeconfig, set KUBECONFIG, or create ~/.kube/config",
        )?,
    };
    let opts = KubeConfigOptions {
        context: context.cloned(),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &opts)
        .await
        .with_context(|| match context {
            Some(c) => format!("kubeconfig context {c:?}"),
            None => "the kubeconfig's current context".to_string(),
        })?;
    let ns = config.default_namespace.clone();
    Ok((kube::Client::try_from(config)?, ns))
}

/// The HostedOLM kind, for dynamic clients (the CLI does not link the controller's types).
pub(crate) fn hosted_olm_resource() -> ApiResource {
    ApiResource {
        group: "olm.hcp-olm.io".into(),
        version: "v1alpha1".into(),
        api_version: "olm.hcp-olm.io/v1alpha1".into(),
        kind: "HostedOLM".into(),
        plural: "hostedolms".into(),
    }
}

/// Run `status`, printing to `out`.
pub async fn run(args: &StatusArgs, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let (client, default_ns) = client(args).await?;
    let ar = hosted_olm_resource();
    let api: Api<DynamicObject> = if args.all_namespaces {
        Api::all_with(client, &ar)
    } else {
        let ns = args.namespace.clone().unwrap_or(default_ns);
        Api::namespaced_with(client, &ns, &ar)
    };
    let not_served = |e: kube::Error, what: &str| match e {
        kube::Error::Api(s) if s.code == 404 => anyhow::anyhow!(
            "this cluster does not serve HostedOLM (olm.hcp-olm.io): is hcp-olm installed?"
        ),
        e => anyhow::Error::new(e).context(what.to_string()),
    };
    let items: Vec<Value> = match &args.name {
        Some(name) if !args.all_namespaces => {
            let o = api
                .get_opt(name)
                .await
                .map_err(|e| not_served(e, "reading the HostedOLM"))?
                .with_context(|| {
                    format!("no HostedOLM {name} here (-n names the HCP namespace)")
                })?;
            vec![serde_json::to_value(o).unwrap_or_default()]
        }
        Some(_) => anyhow::bail!("a NAME and --all-namespaces do not go together"),
        None => api
            .list(&ListParams::default())
            .await
            .map_err(|e| not_served(e, "listing HostedOLMs"))?
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .collect(),
    };
    // -o json / yaml: the objects as a Kubernetes List, as kubectl prints them.
    if args.output != Output::Table {
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        match args.output {
            Output::Json => {
                serde_json::to_writer_pretty(&mut *out, &list)?;
                writeln!(out)?;
            }
            _ => write!(out, "{}", serde_yaml_ng::to_string(&list)?)?,
        }
        return Ok(());
    }
    if args.name.is_some() {
        for o in &items {
            write!(out, "{}", detail(o))?;
        }
        return Ok(());
    }
    let list = items;
    let rows: Vec<StatusRow> = list.iter().map(row).collect();
    render(
        out,
        args.output,
        &rows,
        &[
            "NAMESPACE",
            "NAME",
            "AVAILABLE",
            "DEGRADED",
            "REASON",
            "CATALOGS",
            "TUNNEL",
        ],
        |r| {
            vec![
                r.namespace.clone(),
                r.name.clone(),
                r.available.clone(),
                r.degraded.clone(),
                r.reason.clone(),
                format!("{}/{}", r.catalogs_ready, r.catalogs),
                r.tunnel.clone(),
            ]
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_say_what_works_and_why_not() {
        let o = json!({
            "metadata": {"namespace": "clusters-a", "name": "a"},
            "status": {
                "conditions": [
                    {"type": "Available", "status": "False", "reason": "GuestUnreachable"},
                    {"type": "Degraded", "status": "False", "reason": "AsExpected"},
                ],
                "catalogs": [
                    {"name": "redhat-operators", "enabled": true, "connectionState": "READY"},
                    {"name": "certified-operators", "enabled": true, "connectionState": "TRANSIENT_FAILURE"},
                    {"name": "community-operators", "enabled": false},
                ],
                "tunnel": {"endpoint": "198.18.0.1:31820"},
            }
        });
        let r = row(&o);
        assert_eq!(
            (r.available.as_str(), r.degraded.as_str(), r.reason.as_str()),
            ("False", "False", "GuestUnreachable")
        );
        assert_eq!((r.catalogs_ready, r.catalogs), (1, 2));
        assert_eq!(r.tunnel, "198.18.0.1:31820");
        let empty = row(&json!({"metadata": {"name": "b"}}));
        assert_eq!(empty.available, "Unknown");
        assert_eq!((empty.catalogs_ready, empty.catalogs), (0, 0));
    }
}
