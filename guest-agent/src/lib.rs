//! hcp-olm-guest-agent: the guest-side connectivity agent.
//!
//! - [`dns`]: the split-DNS protocol engine (no I/O).
//! - [`server`]: the tokio driver (UDP/TCP listeners, upstream forwarding, metrics).
//! - [`tunnel`]: the WireGuard tunnel engine (no I/O) and its tokio UDP driver.

pub mod agent;
pub mod daemon;
pub mod dns;
pub mod gateway;
pub mod proxy;
pub mod server;
pub mod stack;
pub mod tunnel;
