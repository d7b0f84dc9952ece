//! From a pod spec to what the runner starts: the kubelet's translation, as a pure function.
//!
//! Strict by design: an unknown image, a command the image does not contain, a volume mount
//! without a volume, a missing Secret/ConfigMap or key (unless `optional`), a volume or env
//! source kind we do not implement, a probe on an undeclared named port — each is an error
//! that names the container and the field. Nothing the controller rendered is rewritten.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, PodSpec, Probe};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::image::{Image, ImageStore};

/// Where service-account credentials are mounted, as the kubelet does.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Why a pod cannot be run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("container {container}: no image")]
    NoImage { container: String },
    #[error("container {container}: image {image} is not known to the runner (known: {known})")]
    UnknownImage {
        container: String,
        image: String,
        known: String,
    },
    #[error("container {container}: neither the pod nor image {image} sets a command")]
    NoCommand { container: String, image: String },
    #[error("container {container}: command {program} is not in image {image}")]
    ProgramMissing {
        container: String,
        program: String,
        image: String,
    },
    #[error(
        "container {container}: volumeMount {mount} names volume {volume}, which the pod does not define"
    )]
    UndefinedVolume {
        container: String,
        mount: String,
        volume: String,
    },
    #[error("volume {volume}: kind {kind} is not supported by the runner")]
    UnsupportedVolume { volume: String, kind: String },
    #[error("{what}: {kind} {namespace}/{name} does not exist")]
    MissingObject {
        what: String,
        kind: &'static str,
        namespace: String,
        name: String,
    },
    #[error("{what}: {kind} {namespace}/{name} has no key {key}")]
    MissingKey {
        what: String,
        kind: &'static str,
        namespace: String,
        name: String,
        key: String,
    },
    #[error("container {container}: env {var}: {reason}")]
    UnsupportedEnv {
        container: String,
        var: String,
        reason: String,
    },
    #[error("container {container}: {probe} probe: {reason}")]
    BadProbe {
        container: String,
        probe: &'static str,
        reason: String,
    },
    #[error("pod mounts service-account credentials but the runner was given none")]
    NoServiceAccountCredentials,
}

/// Secrets and ConfigMaps by (namespace, name), with decoded data.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub secrets: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
    pub config_maps: BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
}

/// What the kubelet knows that is not in the pod spec.
#[derive(Clone, Debug, Default)]
pub struct NodeFacts {
    /// `KUBERNETES_SERVICE_HOST` / `_PORT` for in-cluster clients.
    pub api_host: String,
    pub api_port: u16,
    /// The pod's IP (`status.podIP`).
    pub pod_ip: String,
    /// The node's name (`spec.nodeName`).
    pub node_name: String,
    /// Token, CA and namespace for the pod's ServiceAccount, if the runner can issue them.
    pub service_account: Option<ServiceAccountFiles>,
}

/// The projected service-account volume's content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceAccountFiles {
    pub token: String,
    pub ca_crt: Vec<u8>,
}

/// The pod being planned.
#[derive(Clone, Debug)]
pub struct PodInput<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub spec: &'a PodSpec,
}

/// A file to write into a volume directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeFile {
    /// Relative to the volume root.
    pub path: String,
    pub data: Vec<u8>,
    pub mode: u32,
}

/// The content of one pod volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumePlan {
    /// An empty, writable directory shared by the pod's containers.
    EmptyDir,
    /// Files written once (Secret, ConfigMap, service-account token), mounted read-only.
    Files(Vec<VolumeFile>),
}

/// One mount of a container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountPlan {
    pub volume: String,
    pub sub_path: Option<String>,
    pub dest: String,
    pub read_only: bool,
}

/// What a probe does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProbeAction {
    Http {
        https: bool,
        port: u16,
        path: String,
    },
    Tcp {
        port: u16,
    },
    Grpc {
        port: u16,
        service: Option<String>,
    },
    Exec {
        argv: Vec<String>,
    },
}

/// A probe with the kubelet's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePlan {
    pub action: ProbeAction,
    pub initial_delay_s: u32,
    pub period_s: u32,
    pub timeout_s: u32,
    pub failure_threshold: u32,
    pub success_threshold: u32,
}

/// One container, ready to start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerPlan {
    pub name: String,
    pub image: String,
    /// argv as the process sees it; `argv[0]` is an absolute path inside the image or a
    /// mounted volume.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub mounts: Vec<MountPlan>,
    pub working_dir: Option<String>,
    pub read_only_root: bool,
    pub startup: Option<ProbePlan>,
    pub readiness: Option<ProbePlan>,
    pub liveness: Option<ProbePlan>,
}

/// The whole pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPlan {
    pub volumes: BTreeMap<String, VolumePlan>,
    pub init_containers: Vec<ContainerPlan>,
    pub containers: Vec<ContainerPlan>,
}

/// Every Secret and ConfigMap (namespace, name) the pod refers to, so the runner can fetch
/// exactly those.
pub fn referenced_objects(namespace: &str, spec: &PodSpec) -> (Vec<String>, Vec<String>) {
    let mut secrets = Vec::new();
    let mut cms = Vec::new();
    for v in spec.volumes.iter().flatten() {
        if let Some(s) = v.secret.as_ref().and_then(|s| s.secret_name.clone()) {
            secrets.push(s);
        }
        if let Some(c) = &v.config_map {
            cms.push(c.name.clone());
        }
    }
    for c in all_containers(spec) {
        for e in c.env.iter().flatten() {
            if let Some(src) = &e.value_from {
                if let Some(s) = &src.secret_key_ref {
                    secrets.push(s.name.clone());
                }
                if let Some(c) = &src.config_map_key_ref {
                    cms.push(c.name.clone());
                }
            }
        }
        for e in c.env_from.iter().flatten() {
            if let Some(s) = &e.secret_ref {
                secrets.push(s.name.clone());
            }
            if let Some(c) = &e.config_map_ref {
                cms.push(c.name.clone());
            }
        }
    }
    let _ = namespace;
    secrets.sort();
    secrets.dedup();
    cms.sort();
    cms.dedup();
    (secrets, cms)
}

fn all_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
}

/// Whether the kubelet would mount service-account credentials.
pub fn automounts_token(spec: &PodSpec) -> bool {
    spec.automount_service_account_token.unwrap_or(true)
}

/// Plans a pod.
pub fn plan(
    pod: &PodInput<'_>,
    objects: &Objects,
    images: &ImageStore,
    node: &NodeFacts,
) -> Result<PodPlan, PlanError> {
    let ns = pod.namespace;
    let mut volumes = BTreeMap::new();
    for v in pod.spec.volumes.iter().flatten() {
        volumes.insert(v.name.clone(), volume_plan(ns, v, objects)?);
    }
    let sa_volume = "kube-api-access (automount)";
    let automount = automounts_token(pod.spec);
    if automount {
        let sa = node
            .service_account
            .as_ref()
            .ok_or(PlanError::NoServiceAccountCredentials)?;
        volumes.insert(
            sa_volume.to_string(),
            VolumePlan::Files(vec![
                VolumeFile {
                    path: "token".into(),
                    data: sa.token.clone().into_bytes(),
                    mode: 0o644,
                },
                VolumeFile {
                    path: "ca.crt".into(),
                    data: sa.ca_crt.clone(),
                    mode: 0o644,
                },
                VolumeFile {
                    path: "namespace".into(),
                    data: ns.as_bytes().to_vec(),
                    mode: 0o644,
                },
            ]),
        );
    }
    let mut plan_one = |c: &Container| -> Result<ContainerPlan, PlanError> {
        let mut cp = container_plan(pod, c, objects, images, node, &volumes)?;
        if automount {
            cp.mounts.push(MountPlan {
                volume: sa_volume.to_string(),
                sub_path: None,
                dest: SERVICE_ACCOUNT_DIR.into(),
                read_only: true,
            });
        }
        Ok(cp)
    };
    let init_containers = pod
        .spec
        .init_containers
        .iter()
        .flatten()
        .map(&mut plan_one)
        .collect::<Result<Vec<_>, _>>()?;
    let containers = pod
        .spec
        .containers
        .iter()
        .map(&mut plan_one)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(PodPlan {
        volumes,
        init_containers,
        containers,
    })
}

fn volume_plan(
    ns: &str,
    v: &k8s_openapi::api::core::v1::Volume,
    objects: &Objects,
) -> Result<VolumePlan, PlanError> {
    let what = format!("volume {}", v.name);
    if v.empty_dir.is_some() {
        return Ok(VolumePlan::EmptyDir);
    }
    if let Some(s) = &v.secret {
        let name = s.secret_name.clone().unwrap_or_default();
        let data = objects.secrets.get(&(ns.to_string(), name.clone()));
        return files_from(
            &what,
            "Secret",
            ns,
            &name,
            data,
            s.items.as_deref(),
            s.default_mode,
            s.optional.unwrap_or(false),
        );
    }
    if let Some(c) = &v.config_map {
        let data = objects.config_maps.get(&(ns.to_string(), c.name.clone()));
        return files_from(
            &what,
            "ConfigMap",
            ns,
            &c.name,
            data,
            c.items.as_deref(),
            c.default_mode,
            c.optional.unwrap_or(false),
        );
    }
    let kind = serde_json::to_value(v)
        .ok()
        .and_then(|j| {
            j.as_object().and_then(|o| {
                o.keys()
                    .find(|k| k.as_str() != "name")
                    .map(|k| k.to_string())
            })
        })
        .unwrap_or_else(|| "none".into());
    Err(PlanError::UnsupportedVolume {
        volume: v.name.clone(),
        kind,
    })
}

#[allow(clippy::too_many_arguments)]
fn files_from(
    what: &str,
    kind: &'static str,
    ns: &str,
    name: &str,
    data: Option<&BTreeMap<String, Vec<u8>>>,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: Option<i32>,
    optional: bool,
) -> Result<VolumePlan, PlanError> {
    let mode = default_mode.map(|m| m as u32 & 0o777).unwrap_or(0o644);
    let Some(data) = data else {
        if optional {
            return Ok(VolumePlan::Files(Vec::new()));
        }
        return Err(PlanError::MissingObject {
            what: what.to_string(),
            kind,
            namespace: ns.to_string(),
            name: name.to_string(),
        });
    };
    let files = match items {
        None => data
            .iter()
            .map(|(k, d)| VolumeFile {
                path: k.clone(),
                data: d.clone(),
                mode,
            })
            .collect(),
        Some(items) => items
            .iter()
            .map(|it| match data.get(&it.key) {
                Some(d) => Ok(VolumeFile {
                    path: it.path.clone(),
                    data: d.clone(),
                    mode: it.mode.map(|m| m as u32 & 0o777).unwrap_or(mode),
                }),
                None => Err(PlanError::MissingKey {
                    what: what.to_string(),
                    kind,
                    namespace: ns.to_string(),
                    name: name.to_string(),
                    key: it.key.clone(),
                }),
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(VolumePlan::Files(files))
}

fn lookup_key(
    objects: &BTreeMap<(String, String), BTreeMap<String, Vec<u8>>>,
    kind: &'static str,
    what: &str,
    ns: &str,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, PlanError> {
    let Some(data) = objects.get(&(ns.to_string(), name.to_string())) else {
        return if optional {
            Ok(None)
        } else {
            Err(PlanError::MissingObject {
                what: what.to_string(),
                kind,
                namespace: ns.to_string(),
                name: name.to_string(),
            })
        };
    };
    match data.get(key) {
        Some(v) => Ok(Some(String::from_utf8_lossy(v).into_owned())),
        None if optional => Ok(None),
        None => Err(PlanError::MissingKey {
            what: what.to_string(),
            kind,
            namespace: ns.to_string(),
            name: name.to_string(),
            key: key.to_string(),
        }),
    }
}

fn container_plan(
    pod: &PodInput<'_>,
    c: &Container,
    objects: &Objects,
    images: &ImageStore,
    node: &NodeFacts,
    volumes: &BTreeMap<String, VolumePlan>,
) -> Result<ContainerPlan, PlanError> {
    let cname = c.name.clone();
    let image_ref = c.image.clone().ok_or_else(|| PlanError::NoImage {
        container: cname.clone(),
    })?;
    let image = images
        .get(&image_ref)
        .ok_or_else(|| PlanError::UnknownImage {
            container: cname.clone(),
            image: image_ref.clone(),
            known: images.references().join(", "),
        })?;

    // env: image ENV, the kubelet's service variables, then the container's own, in order,
    // each able to refer to the ones before it with $(VAR).
    let mut env: Vec<(String, String)> = image.env.clone();
    set(&mut env, "HOSTNAME", pod.name);
    // container runtimes always set HOME (from /etc/passwd, else "/"); Go's os/user and
    // controller-runtime's config loading fail without it
    if !env.iter().any(|(k, _)| k == "HOME") {
        set(&mut env, "HOME", "/");
    }
    if !node.api_host.is_empty() {
        set(&mut env, "KUBERNETES_SERVICE_HOST", &node.api_host);
        set(
            &mut env,
            "KUBERNETES_SERVICE_PORT",
            &node.api_port.to_string(),
        );
        set(
            &mut env,
            "KUBERNETES_SERVICE_PORT_HTTPS",
            &node.api_port.to_string(),
        );
    }
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let (kind, name, optional, store) = if let Some(s) = &from.secret_ref {
            (
                "Secret",
                s.name.clone(),
                s.optional.unwrap_or(false),
                &objects.secrets,
            )
        } else if let Some(cm) = &from.config_map_ref {
            (
                "ConfigMap",
                cm.name.clone(),
                cm.optional.unwrap_or(false),
                &objects.config_maps,
            )
        } else {
            continue;
        };
        match store.get(&(pod.namespace.to_string(), name.clone())) {
            Some(data) => {
                for (k, v) in data {
                    set(
                        &mut env,
                        &format!("{prefix}{k}"),
                        &String::from_utf8_lossy(v),
                    );
                }
            }
            None if optional => {}
            None => {
                return Err(PlanError::MissingObject {
                    what: format!("container {cname} envFrom"),
                    kind,
                    namespace: pod.namespace.to_string(),
                    name,
                });
            }
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (_, Some(src)) => {
                let what = format!("container {cname} env {}", e.name);
                if let Some(f) = &src.field_ref {
                    Some(field_value(pod, node, &f.field_path).ok_or_else(|| {
                        PlanError::UnsupportedEnv {
                            container: cname.clone(),
                            var: e.name.clone(),
                            reason: format!("fieldRef {} is not supported", f.field_path),
                        }
                    })?)
                } else if let Some(s) = &src.secret_key_ref {
                    lookup_key(
                        &objects.secrets,
                        "Secret",
                        &what,
                        pod.namespace,
                        &s.name,
                        &s.key,
                        s.optional.unwrap_or(false),
                    )?
                } else if let Some(s) = &src.config_map_key_ref {
                    lookup_key(
                        &objects.config_maps,
                        "ConfigMap",
                        &what,
                        pod.namespace,
                        &s.name,
                        &s.key,
                        s.optional.unwrap_or(false),
                    )?
                } else {
                    return Err(PlanError::UnsupportedEnv {
                        container: cname.clone(),
                        var: e.name.clone(),
                        reason: "only fieldRef, secretKeyRef and configMapKeyRef are supported"
                            .into(),
                    });
                }
            }
            (Some(v), None) => Some(expand(v, &env)),
            (None, None) => Some(String::new()),
        };
        if let Some(v) = value {
            set(&mut env, &e.name, &v);
        }
    }

    // argv, by the Kubernetes rules for command/args vs ENTRYPOINT/CMD
    let mut argv: Vec<String> = match (&c.command, &c.args) {
        (Some(cmd), args) if !cmd.is_empty() => cmd
            .iter()
            .chain(args.iter().flatten())
            .map(|s| expand(s, &env))
            .collect(),
        (_, Some(args)) => image
            .entrypoint
            .iter()
            .cloned()
            .chain(args.iter().map(|s| expand(s, &env)))
            .collect(),
        _ => image
            .entrypoint
            .iter()
            .chain(image.cmd.iter())
            .cloned()
            .collect(),
    };
    if argv.is_empty() {
        return Err(PlanError::NoCommand {
            container: cname,
            image: image_ref,
        });
    }

    let mut mounts = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let read_only_volume = matches!(volumes.get(&m.name), Some(VolumePlan::Files(_)));
        if !volumes.contains_key(&m.name) {
            return Err(PlanError::UndefinedVolume {
                container: cname,
                mount: m.mount_path.clone(),
                volume: m.name.clone(),
            });
        }
        mounts.push(MountPlan {
            volume: m.name.clone(),
            sub_path: m.sub_path.clone().filter(|s| !s.is_empty()),
            dest: m.mount_path.clone(),
            read_only: m.read_only.unwrap_or(false) || read_only_volume,
        });
    }

    // the program must exist: in the image (through PATH), or under a mounted volume
    // (written there by an init container)
    argv[0] =
        resolve_program(&argv[0], image, &mounts).ok_or_else(|| PlanError::ProgramMissing {
            container: cname.clone(),
            program: argv[0].clone(),
            image: image_ref.clone(),
        })?;

    let ports: BTreeMap<String, u16> = c
        .ports
        .iter()
        .flatten()
        .filter_map(|p| Some((p.name.clone()?, p.container_port as u16)))
        .collect();
    let probe = |p: &Option<Probe>, kind: &'static str| -> Result<Option<ProbePlan>, PlanError> {
        p.as_ref()
            .map(|p| {
                probe_plan(p, &ports).map_err(|reason| PlanError::BadProbe {
                    container: cname.clone(),
                    probe: kind,
                    reason,
                })
            })
            .transpose()
    };
    Ok(ContainerPlan {
        name: c.name.clone(),
        image: image_ref,
        argv,
        mounts,
        working_dir: c.working_dir.clone(),
        read_only_root: c
            .security_context
            .as_ref()
            .and_then(|s| s.read_only_root_filesystem)
            .unwrap_or(false),
        startup: probe(&c.startup_probe, "startup")?,
        readiness: probe(&c.readiness_probe, "readiness")?,
        liveness: probe(&c.liveness_probe, "liveness")?,
        env,
    })
}

fn resolve_program(program: &str, image: &Image, mounts: &[MountPlan]) -> Option<String> {
    if let Some(p) = image.resolve(program) {
        return Some(p);
    }
    if program.starts_with('/')
        && mounts.iter().any(|m| {
            program
                .strip_prefix(m.dest.trim_end_matches('/'))
                .is_some_and(|rest| rest.starts_with('/'))
        })
    {
        return Some(program.to_string());
    }
    None
}

fn set(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    if let Some(slot) = env.iter_mut().find(|(k, _)| k == key) {
        slot.1 = value.to_string();
    } else {
        env.push((key.to_string(), value.to_string()));
    }
}

fn field_value(pod: &PodInput<'_>, node: &NodeFacts, path: &str) -> Option<String> {
    match path {
        "metadata.name" => Some(pod.name.to_string()),
        "metadata.namespace" => Some(pod.namespace.to_string()),
        "status.podIP" => Some(node.pod_ip.clone()),
        "spec.nodeName" => Some(node.node_name.clone()),
        "spec.serviceAccountName" => Some(
            pod.spec
                .service_account_name
                .clone()
                .unwrap_or_else(|| "default".into()),
        ),
        _ => {
            let key = path.strip_prefix("metadata.labels['")?.strip_suffix("']")?;
            Some(pod.labels.get(key).cloned().unwrap_or_default())
        }
    }
}

/// `$(VAR)` expansion as the kubelet does it: a defined variable is replaced, `$$` is a literal
/// `$`, anything else is left as written.
pub fn expand(input: &str, env: &[(String, String)]) -> String {
    let mut out = String::with_capacity(input.len());
    let bytes = input.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'$' && i + 1 < bytes.len() {
            if bytes[i + 1] == b'$' {
                out.push('$');
                i += 2;
                continue;
            }
            if bytes[i + 1] == b'('
                && let Some(close) = input[i + 2..].find(')')
                && let Some((_, v)) = env.iter().find(|(k, _)| *k == input[i + 2..i + 2 + close])
            {
                out.push_str(v);
                i += close + 3;
                continue;
            }
        }
        let ch = input[i..].chars().next().unwrap_or('\u{fffd}');
        out.push(ch);
        i += ch.len_utf8();
    }
    out
}

fn port_of(port: &IntOrString, ports: &BTreeMap<String, u16>) -> Result<u16, String> {
    match port {
        IntOrString::Int(p) => u16::try_from(*p).map_err(|_| format!("port {p} out of range")),
        IntOrString::String(name) => ports
            .get(name)
            .copied()
            .ok_or_else(|| format!("named port {name} is not declared by the container")),
    }
}

fn probe_plan(p: &Probe, ports: &BTreeMap<String, u16>) -> Result<ProbePlan, String> {
    let action = if let Some(h) = &p.http_get {
        if h.host.is_some() {
            return Err("httpGet.host is not supported".into());
        }
        ProbeAction::Http {
            https: h
                .scheme
                .as_deref()
                .is_some_and(|s| s.eq_ignore_ascii_case("HTTPS")),
            port: port_of(&h.port, ports)?,
            path: h.path.clone().unwrap_or_else(|| "/".into()),
        }
    } else if let Some(t) = &p.tcp_socket {
        ProbeAction::Tcp {
            port: port_of(&t.port, ports)?,
        }
    } else if let Some(g) = &p.grpc {
        ProbeAction::Grpc {
            port: u16::try_from(g.port).map_err(|_| format!("port {} out of range", g.port))?,
            service: g.service.clone().filter(|s| !s.is_empty()),
        }
    } else if let Some(e) = &p.exec {
        ProbeAction::Exec {
            argv: e.command.clone().unwrap_or_default(),
        }
    } else {
        return Err("no action (httpGet, tcpSocket, grpc or exec)".into());
    };
    let n = |v: Option<i32>, d: u32| v.map(|v| v.max(0) as u32).unwrap_or(d);
    Ok(ProbePlan {
        action,
        initial_delay_s: n(p.initial_delay_seconds, 0),
        period_s: n(p.period_seconds, 10).max(1),
        timeout_s: n(p.timeout_seconds, 1).max(1),
        failure_threshold: n(p.failure_threshold, 3).max(1),
        success_threshold: n(p.success_threshold, 1).max(1),
    })
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
