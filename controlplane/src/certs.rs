//! Per-hosted-cluster CA and the packageserver serving certificate.
//!
//! Pure functions: the caller supplies `now` and the private keys (PEM, PKCS#8), so
//! tests are deterministic apart from ECDSA signature bytes. The CA's subject is
//! derived from the hosted cluster, so a stored CA key plus its validity is enough to
//! sign again; no certificate parsing is needed.

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SerialNumber,
};
use sha2::{Digest, Sha256};
use time::{Duration, OffsetDateTime};

/// Default CA lifetime.
pub const CA_VALIDITY: Duration = Duration::days(3650);
/// Default serving-certificate lifetime.
pub const SERVING_VALIDITY: Duration = Duration::days(365);
/// Backdating of `notBefore` to tolerate clock skew.
pub const BACKDATE: Duration = Duration::minutes(5);

#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("invalid private key: {0}")]
    Key(rcgen::Error),
    #[error("cannot build certificate: {0}")]
    Build(rcgen::Error),
    #[error("validity must be positive")]
    Validity,
    #[error("no randomness for a certificate serial: {0}")]
    Random(String),
}

/// A certificate with its key and validity window.
#[derive(Clone, PartialEq, Eq)]
pub struct CertMaterial {
    pub cert_pem: String,
    pub key_pem: String,
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
}

/// The private key never appears in Debug output (logs, panics, error chains).
impl std::fmt::Debug for CertMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertMaterial")
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"<redacted>")
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish()
    }
}

/// Generate a new ECDSA P-256 key (PKCS#8 PEM). The only non-pure function here.
pub fn generate_key_pem() -> Result<String, CertError> {
    KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map(|k| k.serialize_pem())
        .map_err(CertError::Key)
}

fn ca_dn(cluster: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "hcp-olm");
    dn.push(DnType::CommonName, format!("hcp-olm-ca {cluster}"));
    dn
}

/// A random positive 128-bit serial (RFC 5280 §4.1.2.2: unique per CA; random so that two
/// certificates issued with the same inputs in the same second never share one).
fn random_serial() -> Result<SerialNumber, CertError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| CertError::Random(e.to_string()))?;
    bytes[0] &= 0x7f; // positive
    bytes[0] |= 0x40; // and a full 16 octets (no leading zero octet to strip)
    Ok(SerialNumber::from_slice(&bytes))
}

fn ca_params(
    cluster: &str,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> CertificateParams {
    // No serial here: these parameters also describe the issuer when a serving certificate
    // is signed, and an issuer is named by its DN and key, not its serial.
    let mut p = CertificateParams::default();
    p.distinguished_name = ca_dn(cluster);
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = not_before;
    p.not_after = not_after;
    p
}

/// Issue the CA of one hosted cluster (`cluster` is `<namespace>/<name>`).
pub fn issue_ca(
    cluster: &str,
    key_pem: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<CertMaterial, CertError> {
    if validity <= Duration::ZERO {
        return Err(CertError::Validity);
    }
    let key = KeyPair::from_pem(key_pem).map_err(CertError::Key)?;
    let not_before = now - BACKDATE;
    let not_after = now + validity;
    let mut params = ca_params(cluster, not_before, not_after);
    params.serial_number = Some(random_serial()?);
    let cert = params.self_signed(&key).map_err(CertError::Build)?;
    Ok(CertMaterial {
        cert_pem: cert.pem(),
        key_pem: key_pem.to_string(),
        not_before,
        not_after,
    })
}

/// The SANs of the packageserver serving certificate: the HCP Service names (what
/// in-namespace clients dial) and the guest `default/packageserver` names (what the
/// guest kube-apiserver's aggregator verifies).
pub fn packageserver_sans(hcp_namespace: &str, hcp_service: &str) -> Vec<String> {
    vec![
        hcp_service.to_string(),
        format!("{hcp_service}.{hcp_namespace}.svc"),
        format!("{hcp_service}.{hcp_namespace}.svc.cluster.local"),
        "packageserver.default.svc".to_string(),
        "packageserver.default.svc.cluster.local".to_string(),
    ]
}

/// The SANs of an HCP metrics Service's serving certificate.
pub fn metrics_sans(hcp_namespace: &str, service: &str) -> Vec<String> {
    vec![
        service.to_string(),
        format!("{service}.{hcp_namespace}.svc"),
        format!("{service}.{hcp_namespace}.svc.cluster.local"),
    ]
}

/// Issue a serving certificate signed by `ca` (which must come from [`issue_ca`] for
/// the same `cluster`). Its lifetime never exceeds the CA's.
pub fn issue_serving_cert(
    cluster: &str,
    ca: &CertMaterial,
    common_name: &str,
    sans: &[String],
    key_pem: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<CertMaterial, CertError> {
    issue_leaf(
        cluster,
        ca,
        common_name,
        sans,
        key_pem,
        now,
        validity,
        ExtendedKeyUsagePurpose::ServerAuth,
    )
}

/// Issue a client certificate (ClientAuth only, no SANs) signed by `ca`, e.g. for a
/// metrics scraper that OLM's `--client-ca` accepts. Its lifetime never exceeds the CA's.
pub fn issue_client_cert(
    cluster: &str,
    ca: &CertMaterial,
    common_name: &str,
    key_pem: &str,
    now: OffsetDateTime,
    validity: Duration,
) -> Result<CertMaterial, CertError> {
    issue_leaf(
        cluster,
        ca,
        common_name,
        &[],
        key_pem,
        now,
        validity,
        ExtendedKeyUsagePurpose::ClientAuth,
    )
}

#[allow(clippy::too_many_arguments)]
fn issue_leaf(
    cluster: &str,
    ca: &CertMaterial,
    common_name: &str,
    sans: &[String],
    key_pem: &str,
    now: OffsetDateTime,
    validity: Duration,
    usage: ExtendedKeyUsagePurpose,
) -> Result<CertMaterial, CertError> {
    if validity <= Duration::ZERO {
        return Err(CertError::Validity);
    }
    let ca_key = KeyPair::from_pem(&ca.key_pem).map_err(CertError::Key)?;
    let key = KeyPair::from_pem(key_pem).map_err(CertError::Key)?;
    let issuer = Issuer::new(ca_params(cluster, ca.not_before, ca.not_after), ca_key);
    let mut p = CertificateParams::new(sans.to_vec()).map_err(CertError::Build)?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "hcp-olm");
    dn.push(DnType::CommonName, common_name);
    p.distinguished_name = dn;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    // One usage only: a serving certificate that could also authenticate as a client
    // would let whoever holds its key log in wherever our CA is trusted for clients.
    p.extended_key_usages = vec![usage];
    let not_before = now - BACKDATE;
    let not_after = (now + validity).min(ca.not_after);
    p.not_before = not_before;
    p.not_after = not_after;
    p.serial_number = Some(random_serial()?);
    let cert = p.signed_by(&key, &issuer).map_err(CertError::Build)?;
    Ok(CertMaterial {
        cert_pem: cert.pem(),
        key_pem: key_pem.to_string(),
        not_before,
        not_after,
    })
}

/// Rotation decision: re-issue when less than a third of the validity remains, when
/// the window is empty or inverted, or when `now` is before `notBefore` (clock jump).
pub fn needs_rotation(
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
    now: OffsetDateTime,
) -> bool {
    let total = not_after - not_before;
    if total <= Duration::ZERO || now < not_before {
        return true;
    }
    let remaining = not_after - now;
    remaining * 3 < total
}

/// Fingerprint of a SAN list, stored next to a certificate so a changed list
/// (for example a renamed Service) triggers re-issue.
pub fn sans_fingerprint(sans: &[String]) -> String {
    let mut h = Sha256::new();
    for s in sans {
        h.update(s.as_bytes());
        h.update([b'\n']);
    }
    hex(&h.finalize()[..8])
}

/// Secret annotation: when the stored certificate becomes valid (RFC 3339).
pub const NOT_BEFORE_ANNOTATION: &str = "hcp-olm.io/not-before";
/// Secret annotation: when the stored certificate expires (RFC 3339).
pub const NOT_AFTER_ANNOTATION: &str = "hcp-olm.io/not-after";
/// Secret annotation: [`sans_fingerprint`] of the SANs the certificate was issued for.
pub const SANS_ANNOTATION: &str = "hcp-olm.io/sans-fingerprint";

/// What the runtime knows about an existing certificate Secret, from the
/// annotations render writes (`hcp-olm.io/not-before`, `hcp-olm.io/not-after`,
/// `hcp-olm.io/sans-fingerprint`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredCertInfo {
    pub not_before: OffsetDateTime,
    pub not_after: OffsetDateTime,
    pub sans_fingerprint: Option<String>,
}

impl StoredCertInfo {
    /// Read the annotations of an existing Secret; None when any is missing or invalid
    /// (which means: issue a new certificate).
    pub fn from_annotations(a: &std::collections::BTreeMap<String, String>) -> Option<Self> {
        use time::format_description::well_known::Rfc3339;
        let t = |k: &str| OffsetDateTime::parse(a.get(k)?, &Rfc3339).ok();
        Some(Self {
            not_before: t(NOT_BEFORE_ANNOTATION)?,
            not_after: t(NOT_AFTER_ANNOTATION)?,
            sans_fingerprint: a.get(SANS_ANNOTATION).cloned(),
        })
    }
}

/// Whether a stored serving certificate must be re-issued: missing, due for rotation,
/// issued for other SANs, or older than the CA that should have signed it.
pub fn serving_cert_needs_reissue(
    stored: Option<&StoredCertInfo>,
    expected_sans: &[String],
    ca: &CertMaterial,
    now: OffsetDateTime,
) -> bool {
    let Some(s) = stored else { return true };
    needs_rotation(s.not_before, s.not_after, now)
        || s.sans_fingerprint.as_deref() != Some(sans_fingerprint(expected_sans).as_str())
        || s.not_before < ca.not_before
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> OffsetDateTime {
        OffsetDateTime::from_unix_timestamp(secs).unwrap()
    }

    #[test]
    fn rotation_threshold_is_one_third() {
        let nb = t(0);
        let na = t(300);
        assert!(!needs_rotation(nb, na, t(0)));
        assert!(!needs_rotation(nb, na, t(199)));
        assert!(!needs_rotation(nb, na, t(200))); // exactly 1/3 left
        assert!(needs_rotation(nb, na, t(201)));
        assert!(needs_rotation(nb, na, t(400))); // expired
        assert!(needs_rotation(nb, na, t(-10))); // before notBefore
        assert!(needs_rotation(na, nb, t(100))); // inverted
    }

    #[test]
    fn issues_ca_and_serving_cert() {
        let now = t(1_800_000_000);
        let ca_key = generate_key_pem().unwrap();
        let ca = issue_ca("clusters/example", &ca_key, now, CA_VALIDITY).unwrap();
        assert!(ca.cert_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(ca.not_after, now + CA_VALIDITY);
        assert!(!needs_rotation(ca.not_before, ca.not_after, now));

        let sans = packageserver_sans("clusters-example", "hcp-olm-packageserver");
        assert!(sans.contains(&"packageserver.default.svc".to_string()));
        assert!(sans.contains(&"hcp-olm-packageserver.clusters-example.svc".to_string()));
        let key = generate_key_pem().unwrap();
        let srv = issue_serving_cert(
            "clusters/example",
            &ca,
            "packageserver",
            &sans,
            &key,
            now,
            SERVING_VALIDITY,
        )
        .unwrap();
        assert_eq!(srv.not_after, now + SERVING_VALIDITY);
        assert_ne!(srv.cert_pem, ca.cert_pem);

        // Never outlives the CA.
        let late = ca.not_after - Duration::days(10);
        let srv2 = issue_serving_cert(
            "clusters/example",
            &ca,
            "packageserver",
            &sans,
            &key,
            late,
            SERVING_VALIDITY,
        )
        .unwrap();
        assert_eq!(srv2.not_after, ca.not_after);
        assert!(needs_rotation(
            srv2.not_before,
            srv2.not_after,
            late + Duration::days(9)
        ));
    }

    /// Serials are random (RFC 5280 §4.1.2.2 asks for unique ones; CA/B Forum wants 64 bits
    /// of randomness): the same inputs at the same second must not give the same serial, or
    /// one certificate could be mistaken for another (revocation, pinning, audits).
    #[test]
    fn certificate_serials_are_random_and_positive() {
        use x509_parser::prelude::*;
        fn serial_of(pem: &str) -> Vec<u8> {
            let (_, p) = parse_x509_pem(pem.as_bytes()).unwrap();
            let (_, c) = X509Certificate::from_der(&p.contents).unwrap();
            c.tbs_certificate.raw_serial().to_vec()
        }
        let now = t(1_800_000_000);
        let key = generate_key_pem().unwrap();
        let a = issue_ca("clusters/example", &key, now, CA_VALIDITY).unwrap();
        let b = issue_ca("clusters/example", &key, now, CA_VALIDITY).unwrap();
        assert_ne!(serial_of(&a.cert_pem), serial_of(&b.cert_pem), "CA serials");
        let sans = packageserver_sans("clusters-example", "hcp-olm-packageserver");
        let issue = || {
            issue_serving_cert(
                "clusters/example",
                &a,
                "packageserver",
                &sans,
                &key,
                now,
                SERVING_VALIDITY,
            )
            .unwrap()
        };
        let (s1, s2) = (issue(), issue());
        assert_ne!(
            serial_of(&s1.cert_pem),
            serial_of(&s2.cert_pem),
            "serving serials"
        );
        for pem in [&a.cert_pem, &b.cert_pem, &s1.cert_pem, &s2.cert_pem] {
            let raw = serial_of(pem);
            // positive, at most 20 octets, and at least 64 bits of it random
            assert!(
                raw[0] & 0x80 == 0 && raw.len() <= 20 && raw.len() >= 8,
                "{raw:?}"
            );
        }
    }

    #[test]
    fn serving_cert_chain_verifies_with_sans() {
        use x509_parser::prelude::*;
        let now = t(1_800_000_000);
        let ca = issue_ca(
            "clusters/example",
            &generate_key_pem().unwrap(),
            now,
            CA_VALIDITY,
        )
        .unwrap();
        let sans = packageserver_sans("clusters-example", "hcp-olm-packageserver");
        let srv = issue_serving_cert(
            "clusters/example",
            &ca,
            "packageserver",
            &sans,
            &generate_key_pem().unwrap(),
            now,
            SERVING_VALIDITY,
        )
        .unwrap();
        let (_, ca_pem) = x509_parser::pem::parse_x509_pem(ca.cert_pem.as_bytes()).unwrap();
        let (_, srv_pem) = x509_parser::pem::parse_x509_pem(srv.cert_pem.as_bytes()).unwrap();
        let ca_x = ca_pem.parse_x509().unwrap();
        let srv_x = srv_pem.parse_x509().unwrap();
        assert!(ca_x.is_ca());
        assert!(!srv_x.is_ca());
        assert_eq!(srv_x.issuer(), ca_x.subject());
        srv_x
            .verify_signature(Some(ca_x.public_key()))
            .expect("signed by the CA");
        ca_x.verify_signature(None).expect("CA self-signed");
        let san = srv_x.subject_alternative_name().unwrap().unwrap();
        let names: Vec<String> = san
            .value
            .general_names
            .iter()
            .filter_map(|g| match g {
                GeneralName::DNSName(d) => Some(d.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(names, sans);
        // serving only: no client authentication with this certificate
        let eku = srv_x.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.server_auth && !eku.client_auth, "{eku:?}");
        // the key never shows in Debug output
        assert!(!format!("{srv:?}").contains(srv.key_pem.trim()));
        assert!(!format!("{srv:?}").contains("PRIVATE KEY"));
        assert_eq!(
            srv_x.validity().not_after.timestamp(),
            (now + SERVING_VALIDITY).unix_timestamp()
        );
        // A CA re-created from the same key and validity signs compatibly (same subject).
        let ca2 = issue_ca("clusters/example", &ca.key_pem, now, CA_VALIDITY).unwrap();
        let (_, ca2_pem) = x509_parser::pem::parse_x509_pem(ca2.cert_pem.as_bytes()).unwrap();
        let ca2_x = ca2_pem.parse_x509().unwrap();
        srv_x
            .verify_signature(Some(ca2_x.public_key()))
            .expect("same key");
    }

    #[test]
    fn reissue_decision() {
        let now = t(1_800_000_000);
        let ca = CertMaterial {
            cert_pem: String::new(),
            key_pem: String::new(),
            not_before: t(1_700_000_000),
            not_after: t(2_000_000_000),
        };
        let sans = vec!["a".to_string()];
        let good = StoredCertInfo {
            not_before: t(1_790_000_000),
            not_after: t(1_830_000_000),
            sans_fingerprint: Some(sans_fingerprint(&sans)),
        };
        assert!(!serving_cert_needs_reissue(Some(&good), &sans, &ca, now));
        assert!(serving_cert_needs_reissue(None, &sans, &ca, now));
        assert!(serving_cert_needs_reissue(
            Some(&good),
            &["b".to_string()],
            &ca,
            now
        ));
        let newer_ca = CertMaterial {
            not_before: t(1_795_000_000),
            ..ca.clone()
        };
        assert!(serving_cert_needs_reissue(
            Some(&good),
            &sans,
            &newer_ca,
            now
        ));
        assert!(serving_cert_needs_reissue(
            Some(&good),
            &sans,
            &ca,
            t(1_820_000_000)
        ));

        let mut a = std::collections::BTreeMap::new();
        a.insert(
            "hcp-olm.io/not-before".to_string(),
            "2027-01-15T08:00:00Z".to_string(),
        );
        a.insert(
            "hcp-olm.io/not-after".to_string(),
            "2028-01-15T08:00:00Z".to_string(),
        );
        let info = StoredCertInfo::from_annotations(&a).unwrap();
        assert_eq!(info.sans_fingerprint, None);
        assert!(info.not_after > info.not_before);
        a.insert("hcp-olm.io/not-after".to_string(), "garbage".to_string());
        assert!(StoredCertInfo::from_annotations(&a).is_none());
    }

    #[test]
    fn rejects_bad_input() {
        assert!(matches!(
            issue_ca("c/x", "not a key", t(0), CA_VALIDITY),
            Err(CertError::Key(_))
        ));
        let k = generate_key_pem().unwrap();
        assert!(matches!(
            issue_ca("c/x", &k, t(0), Duration::ZERO),
            Err(CertError::Validity)
        ));
    }

    #[test]
    fn sans_fingerprint_changes_with_sans() {
        let a = sans_fingerprint(&["a".into(), "b".into()]);
        assert_eq!(a, sans_fingerprint(&["a".into(), "b".into()]));
        assert_ne!(a, sans_fingerprint(&["a".into(), "c".into()]));
        assert_ne!(a, sans_fingerprint(&["ab".into()]));
    }
}
