//! Split DNS: ownership table, cache and the sans-I/O protocol engine.

pub mod cache;
pub mod config;
pub mod engine;
pub mod reverse;
pub mod table;

pub use cache::{Cache, CacheKey, STALE_TTL};
pub use config::{ConfigError, DnsConfigSpec, EngineConfig};
pub use engine::{
    Action, ClientEdns, Engine, Forward, Outcome, PendingQuery, Reply, Source, Transport,
    UpstreamVerdict,
};
pub use reverse::reverse_zones;
pub use table::{Decision, Owner, OwnershipTable, Rule};

#[cfg(test)]
mod engine_tests;
