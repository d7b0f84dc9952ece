//! WireGuard keys (x25519) in the base64 text form that `wg genkey`/`wg pubkey` use.
//!
//! A [`PrivateKey`] never prints its bytes: `Debug` shows only the derived public key.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use boringtun::x25519;

/// Errors from parsing a key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// Not valid base64.
    #[error("key is not valid base64")]
    Base64,
    /// Decoded to the wrong number of bytes.
    #[error("key decodes to {0} bytes, want 32")]
    Length(usize),
}

fn decode32(text: &str) -> Result<[u8; 32], KeyError> {
    let bytes = STANDARD.decode(text.trim()).map_err(|_| KeyError::Base64)?;
    <[u8; 32]>::try_from(bytes.as_slice()).map_err(|_| KeyError::Length(bytes.len()))
}

/// A static x25519 private key.
#[derive(Clone)]
pub struct PrivateKey(x25519::StaticSecret);

impl PrivateKey {
    /// A fresh random key (the OS-seeded thread CSPRNG).
    pub fn generate() -> Self {
        Self(x25519::StaticSecret::from(rand::random::<[u8; 32]>()))
    }

    /// Parses the base64 form (`wg genkey` output).
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode32(text).map(|b| Self(x25519::StaticSecret::from(b)))
    }

    /// The base64 form, for writing a key file for another tool. Handle with care.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0.to_bytes())
    }

    /// The matching public key.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(x25519::PublicKey::from(&self.0))
    }

    pub(crate) fn secret(&self) -> x25519::StaticSecret {
        self.0.clone()
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey(public={})", self.public_key())
    }
}

/// An x25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PublicKey(x25519::PublicKey);

impl PublicKey {
    /// Parses the base64 form (`wg pubkey` output).
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode32(text).map(|b| Self(x25519::PublicKey::from(b)))
    }

    pub(crate) fn inner(&self) -> x25519::PublicKey {
        self.0
    }

    pub(crate) fn from_bytes(b: [u8; 32]) -> Self {
        Self(x25519::PublicKey::from(b))
    }
}

impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&STANDARD.encode(self.0.as_bytes()))
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// A preshared key (optional extra symmetric secret). `Debug` redacts it.
#[derive(Clone, PartialEq, Eq)]
pub struct PresharedKey(pub(crate) [u8; 32]);

impl PresharedKey {
    /// Parses the base64 form (`wg genpsk` output).
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        decode32(text).map(Self)
    }
}

impl fmt::Debug for PresharedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PresharedKey(redacted)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_public_derivation() {
        let k = PrivateKey::generate();
        let text = k.to_base64();
        assert_eq!(text.len(), 44);
        let back = PrivateKey::from_base64(&format!("{text}\n")).unwrap();
        assert_eq!(back.public_key(), k.public_key());
        let p = PublicKey::from_base64(&k.public_key().to_string()).unwrap();
        assert_eq!(p, k.public_key());
    }

    #[test]
    fn debug_never_shows_private_bytes() {
        let k = PrivateKey::generate();
        let dbg = format!("{k:?}");
        assert!(!dbg.contains(&k.to_base64()), "{dbg}");
        assert!(dbg.contains(&k.public_key().to_string()));
        let psk = PresharedKey::from_base64(&k.to_base64()).unwrap();
        assert!(!format!("{psk:?}").contains(&k.to_base64()));
    }

    #[test]
    fn rejects_bad_keys() {
        assert_eq!(PublicKey::from_base64("not base64!"), Err(KeyError::Base64));
        assert_eq!(PublicKey::from_base64("AAAA"), Err(KeyError::Length(3)));
    }
}
