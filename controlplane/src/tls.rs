//! The guest's API server TLS profile (`HostedCluster.spec.configuration.apiServer.
//! tlsSecurityProfile`, OpenShift's `config.openshift.io/v1` TLSSecurityProfile) as flags
//! of our aggregated API server, packageserver, as HyperShift renders them: the minimum
//! version and the TLS 1.2 cipher suites in IANA names. Pure.

use serde::{Deserialize, Serialize};

/// `spec.configuration.apiServer` (only what we read).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ApiServerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_security_profile: Option<TlsSecurityProfile>,
}

/// OpenShift's TLSSecurityProfile: a `type` and, for `Custom`, its own settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct TlsSecurityProfile {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom: Option<CustomTlsProfile>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct CustomTlsProfile {
    #[serde(default)]
    pub ciphers: Vec<String>,
    #[serde(
        rename = "minTLSVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub min_tls_version: Option<String>,
}

/// The profiles' TLS 1.2 suites (OpenSSL names) that HyperShift passes on: OpenShift's
/// profiles also list TLS 1.3 suites (not configurable in Go) and, for Old, suites outside
/// HyperShift's OpenSSL→IANA map, which it drops; so do we.
const INTERMEDIATE: &[&str] = &[
    "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
    "ECDHE-RSA-CHACHA20-POLY1305",
];
const OLD_EXTRA: &[&str] = &[
    "ECDHE-ECDSA-AES128-SHA",
    "ECDHE-RSA-AES128-SHA",
    "ECDHE-ECDSA-AES256-SHA",
    "ECDHE-RSA-AES256-SHA",
];

/// OpenSSL → IANA names of the suites HyperShift passes on (others are dropped, as there).
fn iana(openssl: &str) -> Option<&'static str> {
    Some(match openssl {
        "ECDHE-ECDSA-AES128-GCM-SHA256" => "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-RSA-AES128-GCM-SHA256" => "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "ECDHE-ECDSA-AES256-GCM-SHA384" => "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-RSA-AES256-GCM-SHA384" => "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        "ECDHE-ECDSA-CHACHA20-POLY1305" => "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-RSA-CHACHA20-POLY1305" => "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        "ECDHE-ECDSA-AES128-SHA" => "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
        "ECDHE-RSA-AES128-SHA" => "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
        "ECDHE-ECDSA-AES256-SHA" => "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
        "ECDHE-RSA-AES256-SHA" => "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
        _ => return None,
    })
}

const VERSIONS: &[&str] = &[
    "VersionTLS10",
    "VersionTLS11",
    "VersionTLS12",
    "VersionTLS13",
];

/// The packageserver flags for `profile` (unset: Intermediate, OpenShift's default), or
/// why the profile cannot be used (the message names the field).
pub fn server_args(profile: Option<&TlsSecurityProfile>) -> Result<Vec<String>, String> {
    const FIELD: &str = "HostedCluster.spec.configuration.apiServer.tlsSecurityProfile";
    let kind = profile
        .and_then(|p| p.type_.as_deref())
        .filter(|t| !t.is_empty())
        .unwrap_or("Intermediate");
    let (min, ciphers): (&str, Vec<&str>) = match kind {
        "Old" => (
            "VersionTLS10",
            INTERMEDIATE.iter().chain(OLD_EXTRA).copied().collect(),
        ),
        "Intermediate" => ("VersionTLS12", INTERMEDIATE.to_vec()),
        "Modern" => ("VersionTLS13", Vec::new()),
        "Custom" => {
            let Some(c) = profile.and_then(|p| p.custom.as_ref()) else {
                return Err(format!("{FIELD}.custom: type Custom needs its settings"));
            };
            let min = c.min_tls_version.as_deref().unwrap_or("VersionTLS12");
            if !VERSIONS.contains(&min) {
                return Err(format!(
                    "{FIELD}.custom.minTLSVersion: {:?} is not one of {}",
                    truncated(min),
                    VERSIONS.join(", ")
                ));
            }
            // Unlike HyperShift (which then passes no suite flag, i.e. Go's defaults), a
            // Custom list of which nothing can be used is refused: the admin asked for a
            // narrower set, never for the defaults.
            if !c.ciphers.is_empty() && !c.ciphers.iter().any(|s| iana(s).is_some()) {
                return Err(format!(
                    "{FIELD}.custom.ciphers: none of the {} ciphers is a TLS 1.2 suite packageserver can use (OpenSSL names such as ECDHE-RSA-AES128-GCM-SHA256)",
                    c.ciphers.len()
                ));
            }
            (min, c.ciphers.iter().map(String::as_str).collect())
        }
        other => {
            return Err(format!(
                "{FIELD}.type: {:?} is not Old, Intermediate, Modern or Custom",
                truncated(other)
            ));
        }
    };
    let mut args = vec![format!("--tls-min-version={min}")];
    let suites: Vec<&str> = ciphers.into_iter().filter_map(iana).collect();
    if !suites.is_empty() {
        args.push(format!("--tls-cipher-suites={}", suites.join(",")));
    }
    Ok(args)
}

fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(t: &str) -> TlsSecurityProfile {
        TlsSecurityProfile {
            type_: Some(t.into()),
            custom: None,
        }
    }

    #[test]
    fn profiles_become_packageserver_flags() {
        let intermediate = server_args(None).unwrap();
        assert_eq!(intermediate[0], "--tls-min-version=VersionTLS12");
        assert_eq!(
            intermediate[1],
            "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"
        );
        assert_eq!(server_args(Some(&p("Intermediate"))).unwrap(), intermediate);
        assert_eq!(server_args(Some(&p(""))).unwrap(), intermediate);
        // TLS 1.3 only: no configurable suites, so no suite flag
        assert_eq!(
            server_args(Some(&p("Modern"))).unwrap(),
            ["--tls-min-version=VersionTLS13"]
        );
        let old = server_args(Some(&p("Old"))).unwrap();
        assert_eq!(old[0], "--tls-min-version=VersionTLS10");
        assert!(old[1].ends_with("TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA"));
        assert_eq!(old[1].matches(',').count(), 9);
        let custom = TlsSecurityProfile {
            type_: Some("Custom".into()),
            custom: Some(CustomTlsProfile {
                ciphers: vec![
                    "ECDHE-RSA-AES128-GCM-SHA256".into(),
                    "TLS_AES_128_GCM_SHA256".into(),
                    "NOT-A-CIPHER".into(),
                ],
                min_tls_version: Some("VersionTLS12".into()),
            }),
        };
        assert_eq!(
            server_args(Some(&custom)).unwrap(),
            [
                "--tls-min-version=VersionTLS12",
                "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"
            ]
        );
    }

    #[test]
    fn reads_openshifts_field_names() {
        let c: ApiServerConfig = serde_json::from_value(serde_json::json!({
            "tlsSecurityProfile": {"type": "Custom", "custom": {
                "ciphers": ["ECDHE-RSA-AES128-GCM-SHA256"], "minTLSVersion": "VersionTLS13"}}
        }))
        .unwrap();
        assert_eq!(
            server_args(c.tls_security_profile.as_ref()).unwrap()[0],
            "--tls-min-version=VersionTLS13"
        );
    }

    #[test]
    fn bad_profiles_name_the_field() {
        let e = server_args(Some(&p("Paranoid"))).unwrap_err();
        assert!(
            e.contains("tlsSecurityProfile.type") && e.contains("Paranoid"),
            "{e}"
        );
        let e = server_args(Some(&p("Custom"))).unwrap_err();
        assert!(e.contains("tlsSecurityProfile.custom"), "{e}");
        let bad = TlsSecurityProfile {
            type_: Some("Custom".into()),
            custom: Some(CustomTlsProfile {
                ciphers: vec![],
                min_tls_version: Some("SSLv3".into()),
            }),
        };
        let e = server_args(Some(&bad)).unwrap_err();
        assert!(
            e.contains("custom.minTLSVersion") && e.contains("SSLv3"),
            "{e}"
        );
        let unusable = TlsSecurityProfile {
            type_: Some("Custom".into()),
            custom: Some(CustomTlsProfile {
                ciphers: vec!["NOT-A-CIPHER".into()],
                min_tls_version: None,
            }),
        };
        let e = server_args(Some(&unusable)).unwrap_err();
        assert!(e.contains("custom.ciphers"), "{e}");
        let long = "x".repeat(100_000);
        assert!(server_args(Some(&p(&long))).unwrap_err().len() < 300);
    }
}
