//! Guest kubeconfigs are untrusted input: whoever can write the HostedCluster's admin
//! kubeconfig Secret chooses its content, and kube's loader honours exec plugins (runs a
//! command in the controller's pod), auth providers, token and certificate *files* (would
//! send the controller's own ServiceAccount token or keys to a server of the tenant's
//! choice) and proxies. [`check`] accepts only inline material, by allow-list, before the
//! text reaches kube: cluster `server` (https), `certificate-authority-data`,
//! `tls-server-name`, `disable-compression`, `extensions`; user `token`,
//! `client-certificate-data`, `client-key-data`, `username`/`password`, impersonation,
//! `extensions`. Anything else is refused naming the field.
//!
//! A crate of its own, over plain YAML values, so the fuzz target builds without kube.

use serde_yaml_ng::Value;

/// Largest kubeconfig read (HyperShift's are a few KiB).
pub const MAX_BYTES: usize = 1 << 20;

const CLUSTER_FIELDS: &[&str] = &[
    "server",
    "certificate-authority-data",
    "tls-server-name",
    "disable-compression",
    "insecure-skip-tls-verify",
    "extensions",
];
const USER_FIELDS: &[&str] = &[
    "token",
    "client-certificate-data",
    "client-key-data",
    "username",
    "password",
    "as",
    "as-uid",
    "as-groups",
    "as-user-extra",
    "extensions",
];

/// Why a kubeconfig is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    /// A field that would run a command, read a local file or route traffic elsewhere.
    #[error(
        "{field} is not allowed in a guest kubeconfig ({why}); only inline material is accepted"
    )]
    Unsafe { field: String, why: &'static str },
    /// Not a kubeconfig at all.
    #[error("{0}")]
    Invalid(String),
}

fn why(field: &str) -> &'static str {
    match field {
        "exec" => "runs a command",
        "auth-provider" => "runs provider code and reads local files",
        "tokenFile" | "client-certificate" | "client-key" | "certificate-authority" => {
            "a local file path"
        }
        "proxy-url" => "routes the controller's traffic through a proxy of the kubeconfig's choice",
        "insecure-skip-tls-verify" => "turns off server verification",
        "server" => "must be an https:// URL",
        _ => "not an inline field",
    }
}

/// Checks `text` (a kubeconfig) for anything but inline material. Pure: reads no file,
/// runs nothing.
pub fn check(text: &[u8]) -> Result<(), Refused> {
    if text.len() > MAX_BYTES {
        return Err(Refused::Invalid(format!(
            "kubeconfig is {} bytes, more than the {MAX_BYTES} accepted",
            text.len()
        )));
    }
    let text = std::str::from_utf8(text).map_err(|e| Refused::Invalid(e.to_string()))?;
    let doc: Value =
        serde_yaml_ng::from_str(text).map_err(|e| Refused::Invalid(format!("not YAML: {e}")))?;
    let Value::Mapping(top) = &doc else {
        return Err(Refused::Invalid("not a kubeconfig (no mapping)".into()));
    };
    let unsafe_field = |field: String, name: &str| Refused::Unsafe {
        field,
        why: why(name),
    };
    for (list, inner, allowed) in [
        ("clusters", "cluster", CLUSTER_FIELDS),
        ("users", "user", USER_FIELDS),
    ] {
        let entries = match top.get(list) {
            None | Some(Value::Null) => continue,
            Some(Value::Sequence(s)) => s,
            Some(_) => return Err(Refused::Invalid(format!("{list} is not a list"))),
        };
        for (i, e) in entries.iter().enumerate() {
            let Value::Mapping(e) = e else {
                return Err(Refused::Invalid(format!("{list}[{i}] is not a mapping")));
            };
            let body = match e.get(inner) {
                None | Some(Value::Null) => continue,
                Some(Value::Mapping(m)) => m,
                Some(_) => {
                    return Err(Refused::Invalid(format!(
                        "{list}[{i}].{inner} is not a mapping"
                    )));
                }
            };
            for (k, v) in body {
                let Some(k) = k.as_str() else {
                    return Err(Refused::Invalid(format!(
                        "{list}[{i}].{inner} has a non-string key"
                    )));
                };
                let field = format!("{list}[{i}].{inner}.{k}");
                if !allowed.contains(&k) {
                    return Err(unsafe_field(field, k));
                }
                let bad = match k {
                    "insecure-skip-tls-verify" => v.as_bool() == Some(true),
                    "server" => !v.as_str().is_some_and(|s| s.starts_with("https://")),
                    _ => false,
                };
                if bad {
                    return Err(unsafe_field(field, k));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "apiVersion: v1
kind: Config
clusters:
- name: guest
  cluster:
    server: https://api.guest.example:6443
    certificate-authority-data: Q0E=
users:
- name: admin
  user:
    client-certificate-data: Q0VSVA==
    client-key-data: S0VZ
contexts:
- name: admin
  context: {cluster: guest, user: admin}
current-context: admin
";

    fn with(extra_cluster: &str, extra_user: &str) -> String {
        GOOD.replace(
            "    certificate-authority-data: Q0E=\n",
            &format!("    certificate-authority-data: Q0E=\n{extra_cluster}"),
        )
        .replace(
            "    client-key-data: S0VZ\n",
            &format!("    client-key-data: S0VZ\n{extra_user}"),
        )
    }

    #[test]
    fn inline_material_is_accepted() {
        assert_eq!(check(GOOD.as_bytes()), Ok(()));
        assert_eq!(
            check(with("    tls-server-name: api\n", "    token: abc\n").as_bytes()),
            Ok(())
        );
    }

    #[test]
    fn every_non_inline_form_is_refused_naming_the_field() {
        for (cluster, user, field) in [
            (
                "",
                "    exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh}\n",
                "users[0].user.exec",
            ),
            (
                "",
                "    auth-provider: {name: gcp}\n",
                "users[0].user.auth-provider",
            ),
            (
                "",
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "users[0].user.tokenFile",
            ),
            (
                "",
                "    client-certificate: /etc/pki/c.crt\n",
                "users[0].user.client-certificate",
            ),
            (
                "",
                "    client-key: /etc/pki/c.key\n",
                "users[0].user.client-key",
            ),
            ("", "    made-up: 1\n", "users[0].user.made-up"),
            (
                "    certificate-authority: /etc/ssl/ca.crt\n",
                "",
                "clusters[0].cluster.certificate-authority",
            ),
            (
                "    proxy-url: http://127.0.0.1:1\n",
                "",
                "clusters[0].cluster.proxy-url",
            ),
            (
                "    insecure-skip-tls-verify: true\n",
                "",
                "clusters[0].cluster.insecure-skip-tls-verify",
            ),
        ] {
            let err = check(with(cluster, user).as_bytes()).expect_err(field);
            assert!(
                matches!(&err, Refused::Unsafe { field: f, .. } if f == field),
                "{field}: {err}"
            );
            assert!(err.to_string().contains(field));
        }
        let plain = GOOD.replace("https://api", "http://api");
        assert!(
            matches!(check(plain.as_bytes()), Err(Refused::Unsafe { field, .. }) if field == "clusters[0].cluster.server")
        );
    }

    #[test]
    fn size_and_garbage_are_invalid_not_panics() {
        let big = vec![b'a'; MAX_BYTES + 1];
        assert!(matches!(check(&big), Err(Refused::Invalid(_))));
        assert!(matches!(check(&[0xff, 0xfe]), Err(Refused::Invalid(_))));
        assert!(matches!(check(b"clusters: 7"), Err(Refused::Invalid(_))));
        assert!(matches!(check(b"- a"), Err(Refused::Invalid(_))));
        assert!(matches!(
            check(b"users: [{user: {? [a] : b}}]"),
            Err(Refused::Invalid(_))
        ));
    }
}
