//! Key material persisted in the HCP namespace: the per-cluster CA and packageserver
//! serving certificate (in the Secrets render writes, so they are read back here and
//! re-issued only when due), and the WireGuard keys of the tunnel.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;
use time::OffsetDateTime;

use super::{Error, kube_err};
use crate::certs::{self, CertMaterial, StoredCertInfo};
use crate::render::{PkiInput, TunnelKeys, labels, names};
use crate::validate::ValidInput;

/// Secret with the tunnel's WireGuard private keys (created once, never updated).
pub const TUNNEL_KEYS_SECRET: &str = "hcp-olm-tunnel-keys";
const GATEWAY_KEY: &str = "gateway-private-key";
const AGENT_KEY: &str = "agent-private-key";

fn data_str(s: &Secret, key: &str) -> Option<String> {
    let bytes = s.data.as_ref()?.get(key)?;
    String::from_utf8(bytes.0.clone()).ok()
}

fn stored_cert(s: &Secret) -> Option<(CertMaterial, StoredCertInfo)> {
    let info = StoredCertInfo::from_annotations(s.metadata.annotations.as_ref()?)?;
    let cert = CertMaterial {
        cert_pem: data_str(s, "tls.crt")?,
        key_pem: data_str(s, "tls.key")?,
        not_before: info.not_before,
        not_after: info.not_after,
    };
    Some((cert, info))
}

/// The CA and packageserver certificate: the stored ones when still good, else newly
/// issued (render writes them back to the same Secrets).
pub async fn pki(
    client: &kube::Client,
    valid: &ValidInput,
    now: OffsetDateTime,
) -> Result<(PkiInput, bool), Error> {
    let ns = &valid.cluster.hcp_namespace;
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let cluster = valid.cluster.key();
    let stored_ca = api
        .get_opt(names::CA)
        .await
        .map_err(kube_err(format!("reading Secret {ns}/{}", names::CA)))?
        .as_ref()
        .and_then(stored_cert);
    let mut issued = false;
    let ca = match stored_ca {
        Some((ca, info)) if !certs::needs_rotation(info.not_before, info.not_after, now) => ca,
        _ => {
            issued = true;
            tracing::info!(%cluster, "issuing the cluster CA");
            certs::issue_ca(
                &cluster,
                &certs::generate_key_pem()?,
                now,
                certs::CA_VALIDITY,
            )?
        }
    };
    let sans = certs::packageserver_sans(ns, names::PACKAGESERVER);
    let stored_ps = api
        .get_opt(names::PACKAGESERVER_CERT)
        .await
        .map_err(kube_err(format!(
            "reading Secret {ns}/{}",
            names::PACKAGESERVER_CERT
        )))?
        .as_ref()
        .and_then(stored_cert);
    let packageserver = match stored_ps {
        Some((cert, info))
            if !issued && !certs::serving_cert_needs_reissue(Some(&info), &sans, &ca, now) =>
        {
            cert
        }
        _ => {
            issued = true;
            tracing::info!(%cluster, "issuing the packageserver serving certificate");
            certs::issue_serving_cert(
                &cluster,
                &ca,
                "packageserver",
                &sans,
                &certs::generate_key_pem()?,
                now,
                certs::SERVING_VALIDITY,
            )?
        }
    };
    Ok((
        PkiInput {
            ca,
            packageserver,
            packageserver_sans_fingerprint: certs::sans_fingerprint(&sans),
        },
        issued,
    ))
}

/// A WireGuard private key (base64 of 32 random bytes, clamped by x25519).
fn new_private_key() -> Result<[u8; 32], Error> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| Error::Keys(format!("no randomness: {e}")))?;
    Ok(b)
}

fn public_of(private: &[u8; 32]) -> String {
    let secret = x25519_dalek::StaticSecret::from(*private);
    B64.encode(x25519_dalek::PublicKey::from(&secret).as_bytes())
}

fn decode_key(s: &Secret, key: &str) -> Option<[u8; 32]> {
    let text = data_str(s, key)?;
    B64.decode(text.trim()).ok()?.try_into().ok()
}

/// Tunnel keys: read from [`TUNNEL_KEYS_SECRET`], or generated. When generated, the
/// returned body is the Secret to create (create-only; it carries the prune labels so
/// cleanup removes it).
pub async fn tunnel_keys(
    client: &kube::Client,
    valid: &ValidInput,
) -> Result<(TunnelKeys, Option<serde_json::Value>), Error> {
    let ns = &valid.cluster.hcp_namespace;
    let api: Api<Secret> = Api::namespaced(client.clone(), ns);
    let stored = api
        .get_opt(TUNNEL_KEYS_SECRET)
        .await
        .map_err(kube_err(format!(
            "reading Secret {ns}/{TUNNEL_KEYS_SECRET}"
        )))?;
    let existing = stored
        .as_ref()
        .and_then(|s| Some((decode_key(s, GATEWAY_KEY)?, decode_key(s, AGENT_KEY)?)));
    let (gw, agent, body) = match existing {
        Some((gw, agent)) => (gw, agent, None),
        None => {
            if stored.is_some() {
                tracing::warn!(
                    namespace = %ns,
                    "tunnel keys Secret is unreadable; generating new keys"
                );
            }
            let gw = new_private_key()?;
            let agent = new_private_key()?;
            let data = BTreeMap::from([
                (GATEWAY_KEY, B64.encode(B64.encode(gw))),
                (AGENT_KEY, B64.encode(B64.encode(agent))),
            ]);
            let body = json!({
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": labels::metadata(
                    valid,
                    TUNNEL_KEYS_SECRET,
                    Some(ns.as_str()),
                    "tunnel-keys",
                    None,
                ),
                "type": "Opaque",
                "data": data,
            });
            (gw, agent, Some(body))
        }
    };
    Ok((
        TunnelKeys {
            gateway_private_key: B64.encode(gw),
            gateway_public_key: public_of(&gw),
            agent_private_key: B64.encode(agent),
            agent_public_key: public_of(&agent),
            gateway_endpoint: None,
            gateway_endpoint_wait: None,
        },
        body,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn public_key_matches_rfc7748_vector() {
        // RFC 7748 section 6.1, Alice's key pair.
        let hexd = |s: &str| -> [u8; 32] {
            (0..32)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect::<Vec<_>>()
                .try_into()
                .unwrap()
        };
        let private = hexd("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
        let public = hexd("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
        assert_eq!(public_of(&private), B64.encode(public));
        assert_ne!(new_private_key().unwrap(), new_private_key().unwrap());
    }
}
