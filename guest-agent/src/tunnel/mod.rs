//! The WireGuard tunnel between guest and management cluster.
//!
//! - [`peer`]: one peer as an I/O-free state machine around `boringtun::noise::Tunn`
//!   (roaming, dead-peer detection, allowed sources, counters).
//! - [`driver`]: the tokio UDP driver with a 250 ms timer tick.
//! - [`key`]: x25519 keys in `wg`'s base64 form.
//! - [`packet`]: a minimal IPv4/UDP/ICMP builder and parser.

pub mod config;
pub mod driver;
pub mod key;
pub mod packet;
pub mod peer;
pub mod tun;

pub use key::{KeyError, PresharedKey, PrivateKey, PublicKey};
pub use peer::{Cidr, Counters, DropReason, KeyChange, Keys, Output, Peer, PeerConfig, PeerStatus};
