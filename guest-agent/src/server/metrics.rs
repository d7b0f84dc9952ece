//! Prometheus counters for the DNS server.

use hickory_proto::op::ResponseCode;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::dns::{Outcome, Owner, Source};

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum OwnerLabel {
    local,
    guest,
    refuse,
    none,
}

impl From<Option<Owner>> for OwnerLabel {
    fn from(o: Option<Owner>) -> Self {
        match o {
            Some(Owner::Local) => OwnerLabel::local,
            Some(Owner::Guest) => OwnerLabel::guest,
            Some(Owner::Refuse) => OwnerLabel::refuse,
            None => OwnerLabel::none,
        }
    }
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ResultLabel {
    noerror,
    nxdomain,
    servfail,
    refused,
    formerr,
    notimp,
    other,
}

impl From<ResponseCode> for ResultLabel {
    fn from(r: ResponseCode) -> Self {
        match r {
            ResponseCode::NoError => ResultLabel::noerror,
            ResponseCode::NXDomain => ResultLabel::nxdomain,
            ResponseCode::ServFail => ResultLabel::servfail,
            ResponseCode::Refused => ResultLabel::refused,
            ResponseCode::FormErr => ResultLabel::formerr,
            ResponseCode::NotImp => ResultLabel::notimp,
            _ => ResultLabel::other,
        }
    }
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum SourceLabel {
    cache,
    stale,
    upstream,
    table,
    error,
}

impl From<Source> for SourceLabel {
    fn from(s: Source) -> Self {
        match s {
            Source::Cache => SourceLabel::cache,
            Source::Stale => SourceLabel::stale,
            Source::Upstream => SourceLabel::upstream,
            Source::Table => SourceLabel::table,
            Source::Error => SourceLabel::error,
        }
    }
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum UpstreamResultLabel {
    /// A usable answer (NOERROR/NXDOMAIN).
    answer,
    /// The upstream answered with a server failure (SERVFAIL, REFUSED…).
    server_failure,
    /// No answer in time.
    timeout,
    /// Socket error (e.g. connection refused).
    error,
    /// A reply that did not match our query (txid/question) was ignored.
    mismatch,
    /// UDP reply truncated; retried over TCP.
    truncated,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    pub owner: OwnerLabel,
    pub result: ResultLabel,
    pub source: SourceLabel,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UpstreamLabels {
    pub owner: OwnerLabel,
    pub result: UpstreamResultLabel,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MalformedLabels {
    pub action: MalformedAction,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum MalformedAction {
    dropped,
    formerr,
}

/// All DNS counters. Cheap to clone (counters are `Arc`s inside).
#[derive(Debug, Clone, Default)]
pub struct DnsMetrics {
    pub queries: Family<QueryLabels, Counter>,
    pub cache_hits: Counter,
    pub stale_answers: Counter,
    pub truncated: Counter,
    pub malformed: Family<MalformedLabels, Counter>,
    pub upstream: Family<UpstreamLabels, Counter>,
    pub overloaded: Counter,
    /// Queries from sources outside `clients.allowed` (answered REFUSED).
    pub clients_refused: Counter,
    /// Queries dropped by the per-client rate limit.
    pub rate_limited: Counter,
}

impl DnsMetrics {
    /// The registry of `hcp-olm-dns`: build info and these counters.
    pub fn standalone() -> (Registry, Self) {
        let mut registry = crate::daemon::registry("hcp-olm-dns");
        let m = Self::register(&mut registry);
        (registry, m)
    }

    /// Create and register under `registry` (names get `dns_` after the registry's prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let r = registry.sub_registry_with_prefix("dns");
        r.register(
            "queries",
            "Client queries answered, by owner, result and source",
            m.queries.clone(),
        );
        r.register(
            "cache_hits",
            "Answers served from fresh cache",
            m.cache_hits.clone(),
        );
        r.register(
            "stale_answers",
            "Expired answers served because the owner failed (RFC 8767)",
            m.stale_answers.clone(),
        );
        r.register(
            "truncated",
            "UDP answers sent with TC=1 because they exceeded the client limit",
            m.truncated.clone(),
        );
        r.register(
            "malformed",
            "Malformed client messages, dropped or answered FORMERR",
            m.malformed.clone(),
        );
        r.register(
            "upstream_attempts",
            "Upstream exchanges by owner and result",
            m.upstream.clone(),
        );
        r.register(
            "overloaded",
            "Queries refused because the forwarding limit was reached",
            m.overloaded.clone(),
        );
        r.register(
            "clients_refused",
            "Queries answered REFUSED because their source is not in clients.allowed",
            m.clients_refused.clone(),
        );
        r.register(
            "rate_limited",
            "Queries dropped by the per-client rate limit",
            m.rate_limited.clone(),
        );
        m
    }

    /// Count one reply sent to a client.
    pub fn observe(&self, o: &Outcome) {
        self.queries
            .get_or_create(&QueryLabels {
                owner: o.owner.into(),
                result: o.rcode.into(),
                source: o.source.into(),
            })
            .inc();
        match o.source {
            Source::Cache => {
                self.cache_hits.inc();
            }
            Source::Stale => {
                self.stale_answers.inc();
            }
            _ => {}
        }
        if o.truncated {
            self.truncated.inc();
        }
        if o.owner.is_none() && o.rcode == ResponseCode::FormErr {
            self.malformed
                .get_or_create(&MalformedLabels {
                    action: MalformedAction::formerr,
                })
                .inc();
        }
    }

    pub fn dropped(&self) {
        self.malformed
            .get_or_create(&MalformedLabels {
                action: MalformedAction::dropped,
            })
            .inc();
    }

    pub fn upstream(&self, owner: Owner, result: UpstreamResultLabel) {
        self.upstream
            .get_or_create(&UpstreamLabels {
                owner: Some(owner).into(),
                result,
            })
            .inc();
    }
}
