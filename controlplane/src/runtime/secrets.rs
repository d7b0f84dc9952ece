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
use crate::render::{PREVIOUS_CA_KEY, PkiInput, TunnelKeys, labels, names};
use crate::validate::ValidInput;

/// Secret with the tunnel's WireGuard private keys (created once; updated only by a key
/// rotation, see [`rotation_step`]).
pub const TUNNEL_KEYS_SECRET: &str = "hcp-olm-tunnel-keys";
const GATEWAY_KEY: &str = "gateway-private-key";
const AGENT_KEY: &str = "agent-private-key";
const NEXT_GATEWAY_KEY: &str = "next-gateway-private-key";
const NEXT_AGENT_KEY: &str = "next-agent-private-key";
const PREVIOUS_GATEWAY_KEY: &str = "previous-gateway-private-key";
const PREVIOUS_AGENT_KEY: &str = "previous-agent-private-key";
/// The `HostedOLM.spec.tunnel.keyRotation` value the last rotation was started for.
pub const ROTATION_TOKEN_ANNOTATION: &str = "olm.hcp-olm.io/key-rotation-token";
/// When the current rotation phase began (RFC 3339).
pub const ROTATION_SINCE_ANNOTATION: &str = "olm.hcp-olm.io/key-rotation-phase-since";

/// A gateway and agent private key pair (raw bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyPairs {
    pub gateway: [u8; 32],
    pub agent: [u8; 32],
}

/// The tunnel keys as stored, with the state of a rotation.
///
/// A rotation has two phases, each held for the propagation time (how long a changed
/// Secret takes to reach a mounted volume, on both sides):
/// 1. `next` set: the gateway accepts the next keys besides the current ones; the agent
///    still uses the current ones.
/// 2. `previous` set: the next keys became current and the agent uses them; the gateway
///    still accepts the previous ones, in case the agent's volume is late.
///
/// Then `previous` is dropped. The tunnel ends re-read their keys without restarting, so
/// established catalog streams see one handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredKeys {
    pub current: KeyPairs,
    pub next: Option<KeyPairs>,
    pub previous: Option<KeyPairs>,
    pub token: Option<String>,
    pub phase_since: Option<OffsetDateTime>,
}

/// What a reconcile does to the stored keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RotationStep {
    /// Nothing now; look again after the duration if one is given.
    Hold(Option<std::time::Duration>),
    /// Start a rotation for this token with these new keys (phase 1).
    Start(String),
    /// Phase 1 → 2.
    Advance,
    /// Phase 2 → done.
    Finish,
}

/// The next step of a key rotation (pure). A new token while a rotation is under way
/// waits for it to finish.
pub fn rotation_step(
    stored: &StoredKeys,
    requested: Option<&str>,
    now: OffsetDateTime,
    propagation: std::time::Duration,
) -> RotationStep {
    let in_phase = stored.next.is_some() || stored.previous.is_some();
    if in_phase {
        let since = stored.phase_since.unwrap_or(now);
        let elapsed = std::time::Duration::try_from(now - since).unwrap_or_default();
        if elapsed < propagation {
            return RotationStep::Hold(Some(propagation - elapsed));
        }
        return if stored.next.is_some() {
            RotationStep::Advance
        } else {
            RotationStep::Finish
        };
    }
    match requested {
        Some(t) if !t.is_empty() && stored.token.as_deref() != Some(t) => {
            RotationStep::Start(t.to_string())
        }
        _ => RotationStep::Hold(None),
    }
}

/// Applies a step to the stored keys (pure but for the fresh keys passed in).
pub fn apply_step(
    stored: &StoredKeys,
    step: &RotationStep,
    fresh: KeyPairs,
    now: OffsetDateTime,
) -> StoredKeys {
    let mut s = stored.clone();
    match step {
        RotationStep::Hold(_) => {}
        RotationStep::Start(token) => {
            s.next = Some(fresh);
            s.token = Some(token.clone());
            s.phase_since = Some(now);
        }
        RotationStep::Advance => {
            if let Some(next) = s.next.take() {
                s.previous = Some(s.current);
                s.current = next;
            }
            s.phase_since = Some(now);
        }
        RotationStep::Finish => {
            s.previous = None;
            s.phase_since = None;
        }
    }
    s
}

fn stored_keys(s: &Secret) -> Option<StoredKeys> {
    let pair = |g: &str, a: &str| {
        Some(KeyPairs {
            gateway: decode_key(s, g)?,
            agent: decode_key(s, a)?,
        })
    };
    let ann = s.metadata.annotations.as_ref();
    Some(StoredKeys {
        current: pair(GATEWAY_KEY, AGENT_KEY)?,
        next: pair(NEXT_GATEWAY_KEY, NEXT_AGENT_KEY),
        previous: pair(PREVIOUS_GATEWAY_KEY, PREVIOUS_AGENT_KEY),
        token: ann.and_then(|a| a.get(ROTATION_TOKEN_ANNOTATION)).cloned(),
        phase_since: ann
            .and_then(|a| a.get(ROTATION_SINCE_ANNOTATION))
            .and_then(|t| {
                OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok()
            }),
    })
}

/// Writes `keys` into the fetched Secret `s` (data and annotations; labels kept).
fn store_keys(mut s: Secret, keys: &StoredKeys) -> Secret {
    let enc = |k: &[u8; 32]| k8s_openapi::ByteString(B64.encode(k).into_bytes());
    let mut data = BTreeMap::new();
    data.insert(GATEWAY_KEY.to_string(), enc(&keys.current.gateway));
    data.insert(AGENT_KEY.to_string(), enc(&keys.current.agent));
    if let Some(n) = &keys.next {
        data.insert(NEXT_GATEWAY_KEY.to_string(), enc(&n.gateway));
        data.insert(NEXT_AGENT_KEY.to_string(), enc(&n.agent));
    }
    if let Some(p) = &keys.previous {
        data.insert(PREVIOUS_GATEWAY_KEY.to_string(), enc(&p.gateway));
        data.insert(PREVIOUS_AGENT_KEY.to_string(), enc(&p.agent));
    }
    s.data = Some(data);
    s.string_data = None;
    let ann = s.metadata.annotations.get_or_insert_with(BTreeMap::new);
    match &keys.token {
        Some(t) => ann.insert(ROTATION_TOKEN_ANNOTATION.into(), t.clone()),
        None => ann.remove(ROTATION_TOKEN_ANNOTATION),
    };
    match keys.phase_since.and_then(|t| {
        t.format(&time::format_description::well_known::Rfc3339)
            .ok()
    }) {
        Some(t) => ann.insert(ROTATION_SINCE_ANNOTATION.into(), t),
        None => ann.remove(ROTATION_SINCE_ANNOTATION),
    };
    s
}

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
    ctx: &super::Context,
    valid: &ValidInput,
    now: OffsetDateTime,
) -> Result<(PkiInput, bool), Error> {
    let ns = &valid.cluster.hcp_namespace;
    let cluster = valid.cluster.key();
    let (ca, previous_ca_pem, ca_issued) = cluster_ca(ctx, ns, &cluster, now).await?;
    let sans = certs::packageserver_sans(ns, names::PACKAGESERVER);
    let (packageserver, ps_issued) =
        packageserver_cert(ctx, ns, &cluster, &ca, ca_issued, &sans, now).await?;
    // The OLM operators' metrics endpoints (serving) and their scraper (client).
    let leaf = Leaves {
        ctx,
        ns,
        cluster: &cluster,
        ca: &ca,
        ca_issued,
        now,
    };
    let catalog_operator = leaf
        .get(
            names::CATALOG_OPERATOR_METRICS_CERT,
            "catalog-operator-metrics",
            certs::metrics_sans(ns, &names::metrics_service(names::CATALOG_OPERATOR)),
            false,
        )
        .await?;
    let olm_operator = leaf
        .get(
            names::OLM_OPERATOR_METRICS_CERT,
            "olm-operator-metrics",
            certs::metrics_sans(ns, &names::metrics_service(names::OLM_OPERATOR)),
            false,
        )
        .await?;
    let client = leaf
        .get(
            names::METRICS_CLIENT,
            "hcp-olm-metrics-client",
            Vec::new(),
            true,
        )
        .await?;
    Ok((
        PkiInput {
            ca,
            packageserver,
            packageserver_sans_fingerprint: certs::sans_fingerprint(&sans),
            previous_ca_pem,
            metrics: Some(crate::render::MetricsPki {
                catalog_operator,
                olm_operator,
                client,
            }),
        },
        ca_issued || ps_issued,
    ))
}

/// The cluster CA: the stored one until it is due for rotation, else a new one. Returns it,
/// the replaced CA (still trusted by the guest until packageserver has rolled; the
/// reconcile retires it) and whether it was issued now.
async fn cluster_ca(
    ctx: &super::Context,
    ns: &str,
    cluster: &str,
    now: OffsetDateTime,
) -> Result<(CertMaterial, Option<String>, bool), Error> {
    let ca_secret = ctx
        .read_secret(ns, names::CA)
        .await
        .map_err(kube_err(format!("reading Secret {ns}/{}", names::CA)))?;
    let mut previous_ca_pem = ca_secret
        .as_ref()
        .and_then(|s| data_str(s, PREVIOUS_CA_KEY))
        .filter(|p| p.starts_with("-----BEGIN CERTIFICATE-----"));
    match ca_secret.as_ref().and_then(stored_cert) {
        Some((ca, info)) if !certs::needs_rotation(info.not_before, info.not_after, now) => {
            Ok((ca, previous_ca_pem, false))
        }
        stored => {
            tracing::info!(%cluster, "issuing the cluster CA");
            // the replaced CA stays in the guest's caBundle until packageserver has rolled
            if let Some((old, _)) = stored {
                previous_ca_pem = Some(old.cert_pem);
            }
            let ca = certs::issue_ca(
                cluster,
                &certs::generate_key_pem()?,
                now,
                certs::CA_VALIDITY,
            )?;
            Ok((ca, previous_ca_pem, true))
        }
    }
}

/// packageserver's serving certificate: the stored one unless the CA is new or it needs
/// re-issuing (expiry, SANs, another CA). Returns it and whether it was issued now.
async fn packageserver_cert(
    ctx: &super::Context,
    ns: &str,
    cluster: &str,
    ca: &CertMaterial,
    ca_issued: bool,
    sans: &[String],
    now: OffsetDateTime,
) -> Result<(CertMaterial, bool), Error> {
    let stored = ctx
        .read_secret(ns, names::PACKAGESERVER_CERT)
        .await
        .map_err(kube_err(format!(
            "reading Secret {ns}/{}",
            names::PACKAGESERVER_CERT
        )))?
        .as_ref()
        .and_then(stored_cert);
    match stored {
        Some((cert, info))
            if !ca_issued && !certs::serving_cert_needs_reissue(Some(&info), sans, ca, now) =>
        {
            Ok((cert, false))
        }
        _ => {
            tracing::info!(%cluster, "issuing the packageserver serving certificate");
            let cert = certs::issue_serving_cert(
                cluster,
                ca,
                "packageserver",
                sans,
                &certs::generate_key_pem()?,
                now,
                certs::SERVING_VALIDITY,
            )?;
            Ok((cert, true))
        }
    }
}

/// The metrics certificates: a new CA re-issues every leaf; a new packageserver
/// certificate alone does not. A re-issued leaf does not count as "issued" for the caller
/// (it only rolls the operators through their Secret hashes).
struct Leaves<'a> {
    ctx: &'a super::Context,
    ns: &'a str,
    cluster: &'a str,
    ca: &'a CertMaterial,
    ca_issued: bool,
    now: OffsetDateTime,
}

impl Leaves<'_> {
    async fn get(
        &self,
        secret: &str,
        cn: &str,
        sans: Vec<String>,
        client: bool,
    ) -> Result<CertMaterial, Error> {
        let (ns, ca, now, cluster) = (self.ns, self.ca, self.now, self.cluster);
        let stored = self
            .ctx
            .read_secret(ns, secret)
            .await
            .map_err(kube_err(format!("reading Secret {ns}/{secret}")))?
            .as_ref()
            .and_then(stored_cert);
        match stored {
            Some((cert, info))
                if !self.ca_issued
                    && !certs::serving_cert_needs_reissue(Some(&info), &sans, ca, now) =>
            {
                Ok(cert)
            }
            _ => {
                tracing::info!(%cluster, %secret, "issuing a metrics certificate");
                let key = certs::generate_key_pem()?;
                Ok(if client {
                    certs::issue_client_cert(cluster, ca, cn, &key, now, certs::SERVING_VALIDITY)?
                } else {
                    certs::issue_serving_cert(
                        cluster,
                        ca,
                        cn,
                        &sans,
                        &key,
                        now,
                        certs::SERVING_VALIDITY,
                    )?
                })
            }
        }
    }
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
/// cleanup removes it). A key rotation (`HostedOLM.spec.tunnel.keyRotation` changed, or
/// one under way whose phase has lasted `propagation`) updates the Secret here, with the
/// read resourceVersion (a concurrent writer makes this reconcile fail and retry).
pub async fn tunnel_keys(
    ctx: &super::Context,
    valid: &ValidInput,
    now: OffsetDateTime,
    propagation: std::time::Duration,
) -> Result<(TunnelKeys, Option<serde_json::Value>), Error> {
    let ns = &valid.cluster.hcp_namespace;
    let stored = ctx
        .read_secret(ns, TUNNEL_KEYS_SECRET)
        .await
        .map_err(kube_err(format!(
            "reading Secret {ns}/{TUNNEL_KEYS_SECRET}"
        )))?;
    let existing = stored.as_ref().and_then(stored_keys);
    let (keys, body) = match (existing, stored) {
        (Some(keys), Some(secret)) => {
            let step = rotation_step(
                &keys,
                valid.tunnel_key_rotation.as_deref(),
                now,
                propagation,
            );
            if let RotationStep::Hold(_) = step {
                (keys, None)
            } else {
                let fresh = KeyPairs {
                    gateway: new_private_key()?,
                    agent: new_private_key()?,
                };
                let next = apply_step(&keys, &step, fresh, now);
                tracing::info!(
                    namespace = %ns,
                    step = ?std::mem::discriminant(&step),
                    phase = rotation_phase(&next),
                    "tunnel key rotation"
                );
                let updated = store_keys(secret, &next);
                // With the read resourceVersion: a concurrent writer (or a cached read
                // that was not current after all) makes this fail and the pass retry.
                let api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
                api.replace(TUNNEL_KEYS_SECRET, &Default::default(), &updated)
                    .await
                    .map_err(kube_err(format!(
                        "updating Secret {ns}/{TUNNEL_KEYS_SECRET} (key rotation)"
                    )))?;
                (next, None)
            }
        }
        (None, Some(_)) => {
            // Never replace keys we cannot read: fresh keys on every pass would break the
            // tunnel each time. The caller reports it and keeps the last good render.
            return Err(Error::Keys(format!(
                "Secret {ns}/{TUNNEL_KEYS_SECRET} exists but does not hold two 32-byte base64 keys ({GATEWAY_KEY}, {AGENT_KEY}); the tunnel keeps its last good keys. Restore the Secret, or delete it to generate new keys (the agent reconnects)"
            )));
        }
        (_, None) => {
            let current = KeyPairs {
                gateway: new_private_key()?,
                agent: new_private_key()?,
            };
            let data = BTreeMap::from([
                (GATEWAY_KEY, B64.encode(B64.encode(current.gateway))),
                (AGENT_KEY, B64.encode(B64.encode(current.agent))),
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
            let keys = StoredKeys {
                current,
                next: None,
                previous: None,
                token: None,
                phase_since: None,
            };
            (keys, Some(body))
        }
    };
    Ok((render_keys(&keys, now, propagation), body))
}

/// `Idle`, `NewKeysAccepted` (phase 1) or `OldKeysAccepted` (phase 2).
pub fn rotation_phase(k: &StoredKeys) -> &'static str {
    if k.next.is_some() {
        "NewKeysAccepted"
    } else if k.previous.is_some() {
        "OldKeysAccepted"
    } else {
        "Idle"
    }
}

/// What render needs: the keys each end uses, the further ones the gateway accepts, and
/// when to look again.
pub fn render_keys(
    k: &StoredKeys,
    now: OffsetDateTime,
    propagation: std::time::Duration,
) -> TunnelKeys {
    let extra = k.next.or(k.previous);
    let recheck = match rotation_step(k, None, now, propagation) {
        RotationStep::Hold(d) => d,
        _ => Some(std::time::Duration::ZERO),
    };
    TunnelKeys {
        gateway_private_key: B64.encode(k.current.gateway),
        gateway_public_key: public_of(&k.current.gateway),
        agent_private_key: B64.encode(k.current.agent),
        agent_public_key: public_of(&k.current.agent),
        gateway_extra_private_key: extra.map(|e| B64.encode(e.gateway)),
        agent_extra_public_key: extra.map(|e| public_of(&e.agent)),
        rotation_phase: rotation_phase(k),
        rotation_token: k.token.clone(),
        rotation_recheck: recheck,
        gateway_endpoint: None,
        gateway_endpoint_wait: None,
    }
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

    fn pairs(n: u8) -> KeyPairs {
        KeyPairs {
            gateway: [n; 32],
            agent: [n + 100; 32],
        }
    }

    #[test]
    fn rotation_walks_two_held_phases() {
        let t0 = OffsetDateTime::from_unix_timestamp(1_900_000_000).unwrap();
        let hold = std::time::Duration::from_secs(180);
        let idle = StoredKeys {
            current: pairs(1),
            next: None,
            previous: None,
            token: None,
            phase_since: None,
        };
        assert_eq!(
            rotation_step(&idle, None, t0, hold),
            RotationStep::Hold(None)
        );
        assert_eq!(
            rotation_step(&idle, Some(""), t0, hold),
            RotationStep::Hold(None)
        );
        let start = rotation_step(&idle, Some("2026-11"), t0, hold);
        assert_eq!(start, RotationStep::Start("2026-11".into()));
        let p1 = apply_step(&idle, &start, pairs(2), t0);
        assert_eq!(
            (p1.current, p1.next, p1.previous),
            (pairs(1), Some(pairs(2)), None)
        );
        assert_eq!(rotation_phase(&p1), "NewKeysAccepted");
        // Phase 1: the agent keeps its key, the gateway also accepts the next ones.
        let r = render_keys(&p1, t0, hold);
        assert_eq!(r.agent_private_key, B64.encode(pairs(1).agent));
        assert_eq!(
            r.gateway_extra_private_key,
            Some(B64.encode(pairs(2).gateway))
        );
        assert_eq!(r.agent_extra_public_key, Some(public_of(&pairs(2).agent)));
        assert_eq!(r.rotation_recheck, Some(hold));
        // Held, even when another token arrives meanwhile.
        let t1 = t0 + time::Duration::seconds(60);
        assert_eq!(
            rotation_step(&p1, Some("again"), t1, hold),
            RotationStep::Hold(Some(std::time::Duration::from_secs(120)))
        );
        let t2 = t0 + time::Duration::seconds(180);
        let adv = rotation_step(&p1, Some("2026-11"), t2, hold);
        assert_eq!(adv, RotationStep::Advance);
        let p2 = apply_step(&p1, &adv, pairs(9), t2);
        assert_eq!(
            (p2.current, p2.next, p2.previous),
            (pairs(2), None, Some(pairs(1)))
        );
        assert_eq!(rotation_phase(&p2), "OldKeysAccepted");
        let r = render_keys(&p2, t2, hold);
        assert_eq!(r.agent_private_key, B64.encode(pairs(2).agent));
        assert_eq!(
            r.gateway_extra_private_key,
            Some(B64.encode(pairs(1).gateway))
        );
        let t3 = t2 + time::Duration::seconds(181);
        let fin = rotation_step(&p2, Some("2026-11"), t3, hold);
        assert_eq!(fin, RotationStep::Finish);
        let done = apply_step(&p2, &fin, pairs(9), t3);
        assert_eq!(
            (done.current, done.next, done.previous),
            (pairs(2), None, None)
        );
        assert_eq!(
            rotation_step(&done, Some("2026-11"), t3, hold),
            RotationStep::Hold(None)
        );
        // A new token starts the next rotation.
        assert_eq!(
            rotation_step(&done, Some("again"), t3, hold),
            RotationStep::Start("again".into())
        );
        let r = render_keys(&done, t3, hold);
        assert_eq!(
            (r.gateway_extra_private_key, r.rotation_recheck),
            (None, None)
        );
    }

    #[test]
    fn stored_keys_round_trip_through_the_secret() {
        let t0 = OffsetDateTime::from_unix_timestamp(1_900_000_000).unwrap();
        let k = StoredKeys {
            current: pairs(3),
            next: None,
            previous: Some(pairs(4)),
            token: Some("t".into()),
            phase_since: Some(t0),
        };
        let s = store_keys(Secret::default(), &k);
        assert_eq!(stored_keys(&s), Some(k.clone()));
        let done = StoredKeys {
            previous: None,
            phase_since: None,
            ..k
        };
        let s = store_keys(s, &done);
        assert_eq!(stored_keys(&s), Some(done));
        assert!(!s.data.unwrap().contains_key(PREVIOUS_GATEWAY_KEY));
        assert!(
            !s.metadata
                .annotations
                .unwrap()
                .contains_key(ROTATION_SINCE_ANNOTATION)
        );
    }
}
