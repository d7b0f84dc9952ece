//! The split-DNS protocol engine. It does no I/O and reads no clock: callers pass bytes and
//! the current `Instant`, and get back what to send where.
//!
//! Flow for a client query:
//! 1. [`Engine::handle_query`] parses it and returns [`Action::Reply`] (cache hit, REFUSED,
//!    FORMERR, synthesized NXDOMAIN, fail-fast SERVFAIL/stale), [`Action::Drop`] (not a query
//!    at all) or [`Action::Forward`] with the owner's usable upstreams.
//! 2. The driver sends [`Engine::upstream_query`] to each upstream in turn, feeds replies to
//!    [`Engine::check_upstream_reply`], reports health with [`Engine::record_upstream`].
//! 3. It finishes with [`Engine::complete`] (an owner answer, final even if NXDOMAIN) or
//!    [`Engine::fail`] (stale or SERVFAIL). While waiting it may call
//!    [`Engine::stale_reply`] when the RFC 8767 client response timer fires.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::SOA;
use hickory_proto::rr::{DNSClass, Name, RData, Record};

use super::cache::{Cache, CacheKey, CachedAnswer, STALE_TTL};
use super::config::EngineConfig;
use super::table::Owner;

/// Transport the client used; decides the size limit of the reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
}

/// Where an answer came from (metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// Fresh cache entry.
    Cache,
    /// Expired entry served because the owner failed (RFC 8767).
    Stale,
    /// Forwarded to the owner.
    Upstream,
    /// Synthesized from the table (search-path NXDOMAIN, REFUSED).
    Table,
    /// Error generated here (FORMERR, NOTIMP, SERVFAIL).
    Error,
}

impl Source {
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Cache => "cache",
            Source::Stale => "stale",
            Source::Upstream => "upstream",
            Source::Table => "table",
            Source::Error => "error",
        }
    }
}

/// Summary of one reply, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    /// `None` when the query was unparseable and no owner could be decided.
    pub owner: Option<Owner>,
    pub rcode: ResponseCode,
    pub source: Source,
    pub truncated: bool,
}

/// A reply to send to the client.
#[derive(Debug, Clone)]
pub struct Reply {
    pub bytes: Vec<u8>,
    pub outcome: Outcome,
}

/// EDNS details of the client's query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientEdns {
    pub payload: u16,
}

/// A parsed, owned client query that needs forwarding.
#[derive(Debug, Clone)]
pub struct PendingQuery {
    pub id: u16,
    /// The question as the client sent it (case preserved for the reply).
    pub query: Query,
    pub key: CacheKey,
    pub recursion_desired: bool,
    pub checking_disabled: bool,
    pub edns: Option<ClientEdns>,
    pub transport: Transport,
    pub owner: Owner,
}

/// Forwarding plan: the query and the owner's upstreams to try, in order.
#[derive(Debug, Clone)]
pub struct Forward {
    pub query: PendingQuery,
    pub upstreams: Vec<SocketAddr>,
}

/// What the driver must do with a client datagram/frame.
#[derive(Debug, Clone)]
pub enum Action {
    Reply(Reply),
    /// Not worth an answer (too short for a header, or a response). Counted as malformed.
    Drop,
    Forward(Forward),
}

/// Verdict on one upstream datagram.
#[derive(Debug)]
pub enum UpstreamVerdict {
    /// A usable answer from the owner: pass to [`Engine::complete`]. Final, even if NXDOMAIN.
    Answer(Box<Message>),
    /// Truncated over UDP: retry this upstream over TCP.
    Truncated,
    /// The upstream rejected our EDNS (FORMERR): retry without EDNS (RFC 6891 §7).
    RetryWithoutEdns,
    /// This upstream failed (SERVFAIL, REFUSED, NOTIMP…): try the owner's next upstream.
    ServerFailure(ResponseCode),
    /// Not a reply to our question (wrong id/question, garbage): ignore and keep waiting.
    Mismatch,
}

#[derive(Debug, Default, Clone, Copy)]
struct Health {
    consecutive_failures: u32,
    down: bool,
    last_probe: Option<Instant>,
}

/// The engine. Shareable across tasks (`&self` everywhere).
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    cache: Cache,
    health: Mutex<HashMap<SocketAddr, Health>>,
    synth_soa: Option<Record>,
    memo: ReplyMemo,
}

/// Fast path for repeated cache hits: the exact reply bytes last built for identical query
/// bytes (everything but the id), valid while the cache entry and its elapsed second are
/// unchanged. Identical bytes take the identical path through the (immutable) table, so only
/// the cache state needs re-checking.
#[derive(Debug, Default)]
struct ReplyMemo {
    shards: Vec<Mutex<MemoShard>>,
    per_shard: usize,
    hasher: std::hash::RandomState,
}

#[derive(Debug, Default)]
struct MemoShard {
    udp: HashMap<Vec<u8>, Memo>,
    tcp: HashMap<Vec<u8>, Memo>,
}

#[derive(Debug)]
struct Memo {
    entry: std::sync::Arc<CachedAnswer>,
    elapsed: u32,
    reply: Vec<u8>,
    outcome: Outcome,
}

const MEMO_SHARDS: usize = 16;

impl ReplyMemo {
    fn new(max_entries: usize) -> Self {
        Self {
            shards: (0..MEMO_SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: max_entries.div_ceil(MEMO_SHARDS).max(1),
            hasher: std::hash::RandomState::new(),
        }
    }

    fn shard(&self, body: &[u8]) -> std::sync::MutexGuard<'_, MemoShard> {
        use std::hash::BuildHasher;
        let i = (self.hasher.hash_one(body) as usize) % MEMO_SHARDS;
        self.shards[i].lock().unwrap_or_else(|p| p.into_inner())
    }
}

const MAX_TCP_REPLY: usize = u16::MAX as usize;

impl Engine {
    pub fn new(config: EngineConfig) -> Self {
        let cache = Cache::new(config.cache.clone());
        let config_max_entries = config.cache.max_entries;
        let synth_soa = config.cluster_domain.as_ref().map(|d| {
            let mname = Name::from_ascii("ns.dns")
                .ok()
                .and_then(|p| p.append_domain(d).ok())
                .unwrap_or_else(|| d.clone());
            let rname = Name::from_ascii("hostmaster")
                .ok()
                .and_then(|p| p.append_domain(d).ok())
                .unwrap_or_else(|| d.clone());
            Record::from_rdata(
                d.clone(),
                5,
                RData::SOA(SOA::new(mname, rname, 1, 7200, 1800, 86400, 5)),
            )
        });
        Self {
            config,
            cache,
            health: Mutex::new(HashMap::new()),
            synth_soa,
            memo: ReplyMemo::new(config_max_entries),
        }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// Handle one client message.
    pub fn handle_query(&self, bytes: &[u8], transport: Transport, now: Instant) -> Action {
        // Header: 12 bytes. Anything shorter cannot even be answered with its id.
        let Some(header) = bytes.get(..12) else {
            return Action::Drop;
        };
        if let Some(r) = self.memo_hit(bytes, transport, now) {
            return Action::Reply(r);
        }
        let id = u16::from_be_bytes([header[0], header[1]]);
        if header[2] & 0x80 != 0 {
            // QR=1: a response sent to us; never answer (reflection loops).
            return Action::Drop;
        }
        let opcode_bits = (header[2] >> 3) & 0x0f;
        let msg = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(_) => {
                return Action::Reply(self.error_reply(id, opcode_bits, ResponseCode::FormErr));
            }
        };
        if msg.metadata.op_code != OpCode::Query {
            return Action::Reply(self.error_reply(id, opcode_bits, ResponseCode::NotImp));
        }
        let edns = msg.edns.as_ref().map(|e| ClientEdns {
            payload: e.max_payload().max(512),
        });
        if msg.queries.len() != 1 || !msg.answers.is_empty() || !msg.authorities.is_empty() {
            return Action::Reply(self.error_reply(id, opcode_bits, ResponseCode::FormErr));
        }
        let query = msg.queries[0].clone();
        let name = query.name().clone();
        if !name.is_fqdn() {
            return Action::Reply(self.error_reply(id, opcode_bits, ResponseCode::FormErr));
        }
        let key = CacheKey::new(&name, query.query_type(), query.query_class());
        let decision = self.config.table.lookup(&key.name);
        let pending = PendingQuery {
            id,
            query,
            key,
            recursion_desired: msg.metadata.recursion_desired,
            checking_disabled: msg.metadata.checking_disabled,
            edns,
            transport,
            owner: decision.owner,
        };
        if let Some(e) = &msg.edns
            && e.version() != 0
        {
            return Action::Reply(self.build_reply(
                &pending,
                ResponseCode::BADVERS,
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Source::Error,
            ));
        }
        if pending.key.class != DNSClass::IN {
            return Action::Reply(self.build_reply(
                &pending,
                ResponseCode::Refused,
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Source::Table,
            ));
        }
        if decision.owner == Owner::Refuse {
            return Action::Reply(self.build_reply(
                &pending,
                ResponseCode::Refused,
                Vec::new(),
                Vec::new(),
                Vec::new(),
                Source::Table,
            ));
        }
        if let Some(hit) = self.cache.get_fresh(&pending.key, now) {
            let reply = self.reply_from_cache(&pending, &hit.entry, Some(hit.elapsed));
            self.memo_store(bytes, transport, hit, &reply);
            return Action::Reply(reply);
        }
        if self.is_impossible_search_expansion(&pending.key.name) {
            let auth = self.synth_soa.iter().cloned().collect();
            return Action::Reply(self.build_reply(
                &pending,
                ResponseCode::NXDomain,
                Vec::new(),
                auth,
                Vec::new(),
                Source::Table,
            ));
        }
        if self.cache.is_failed(&pending.key, now) {
            return Action::Reply(self.stale_or_servfail(&pending, now));
        }
        let upstreams = self.select_upstreams(decision.owner, now);
        if upstreams.is_empty() {
            // The owner is known to be down and no probe is due: fail fast (stale if we can).
            // Not recorded as a failure of this name: it was not tried.
            return Action::Reply(self.stale_or_servfail(&pending, now));
        }
        Action::Forward(Forward {
            query: pending,
            upstreams,
        })
    }

    fn memo_hit(&self, bytes: &[u8], transport: Transport, now: Instant) -> Option<Reply> {
        let body = bytes.get(2..)?;
        let shard = self.memo.shard(body);
        let map = match transport {
            Transport::Udp => &shard.udp,
            Transport::Tcp => &shard.tcp,
        };
        let m = map.get(body)?;
        // Still the cache's fresh entry, in the same second: the memoized reply is what the
        // slow path would build (no cache lookup needed, see `CachedAnswer::fresh_elapsed`).
        if m.entry.fresh_elapsed(now)? != m.elapsed {
            return None;
        }
        let mut reply = m.reply.clone();
        if let Some(id) = reply.get_mut(..2) {
            id.copy_from_slice(&bytes[..2]);
        }
        Some(Reply {
            bytes: reply,
            outcome: m.outcome,
        })
    }

    fn memo_store(
        &self,
        bytes: &[u8],
        transport: Transport,
        hit: super::cache::Hit,
        reply: &Reply,
    ) {
        let Some(body) = bytes.get(2..) else {
            return;
        };
        let mut shard = self.memo.shard(body);
        let map = match transport {
            Transport::Udp => &mut shard.udp,
            Transport::Tcp => &mut shard.tcp,
        };
        if map.len() >= self.memo.per_shard && !map.contains_key(body) {
            map.clear();
        }
        map.insert(
            body.to_vec(),
            Memo {
                entry: hit.entry,
                elapsed: hit.elapsed,
                reply: reply.bytes.clone(),
                outcome: reply.outcome,
            },
        );
    }

    /// Kubernetes DNS schema check (only under the configured cluster domain): names that the
    /// schema proves cannot exist, typically produced by `ndots:5` search lists, e.g.
    /// `foo.bar.svc.cluster.local.<ns>.svc.cluster.local` or `example.com.cluster.local`.
    ///
    /// Under `<domain>` a name can only be:
    /// - `<x>.<domain>` (single label, e.g. `dns-version`): forwarded, not judged;
    /// - `[...].<ns>.svc.<domain>` where `[...]` is `<svc>`, `<host>.<svc>`, or
    ///   `_<port>._<proto>.<svc>`;
    /// - `[...].<ns>.pod.<domain>` where `[...]` is one label;
    /// - `<ns>.svc.<domain>`, `svc.<domain>`, `pod.<domain>`: forwarded.
    pub fn is_impossible_search_expansion(&self, name: &Name) -> bool {
        if !self.config.synthesize_search_nxdomain {
            return false;
        }
        let Some(domain) = &self.config.cluster_domain else {
            return false;
        };
        if domain.is_root() || !domain.zone_of(name) {
            return false;
        }
        let rel_len = usize::from(name.num_labels() - domain.num_labels());
        if rel_len <= 1 {
            return false;
        }
        let labels: Vec<&[u8]> = name.iter().take(rel_len).collect();
        // labels[rel_len-1] is the label directly left of the domain.
        let zone = labels[rel_len - 1];
        let before_ns = rel_len.saturating_sub(2); // labels left of `<ns>`
        if zone.eq_ignore_ascii_case(b"svc") {
            match before_ns {
                0..=2 => false,
                3 => !(labels[0].starts_with(b"_") && labels[1].starts_with(b"_")),
                _ => true,
            }
        } else if zone.eq_ignore_ascii_case(b"pod") {
            before_ns > 1
        } else {
            true
        }
    }

    fn select_upstreams(&self, owner: Owner, now: Instant) -> Vec<SocketAddr> {
        let list = match owner {
            Owner::Local => &self.config.local_upstreams,
            Owner::Guest => &self.config.guest_upstreams,
            Owner::Refuse => return Vec::new(),
        };
        let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::with_capacity(list.len());
        for addr in list {
            let h = health.entry(*addr).or_default();
            if !h.down {
                out.push(*addr);
            } else if h
                .last_probe
                .is_none_or(|t| now.saturating_duration_since(t) >= self.config.upstream_recheck)
            {
                // One probe per recheck interval goes through; everyone else fails fast.
                h.last_probe = Some(now);
                out.push(*addr);
            }
        }
        out
    }

    /// Report the outcome of one upstream attempt (success = any well-formed matching reply
    /// that is not a server failure).
    pub fn record_upstream(&self, addr: SocketAddr, ok: bool, now: Instant) {
        let mut health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        let h = health.entry(addr).or_default();
        if ok {
            *h = Health::default();
        } else {
            h.consecutive_failures = h.consecutive_failures.saturating_add(1);
            if h.consecutive_failures >= self.config.upstream_fail_threshold && !h.down {
                h.down = true;
                h.last_probe = Some(now);
            }
        }
    }

    /// Whether an upstream is currently considered down.
    pub fn upstream_down(&self, addr: SocketAddr) -> bool {
        let health = self.health.lock().unwrap_or_else(|p| p.into_inner());
        health.get(&addr).is_some_and(|h| h.down)
    }

    /// Wire bytes of the query to send upstream with transaction id `txid`. We never forward
    /// the client's OPT; we add our own (payload size from config) unless `edns` is false.
    pub fn upstream_query(&self, q: &PendingQuery, txid: u16, edns: bool) -> Vec<u8> {
        let mut m = Message::new(txid, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.metadata.checking_disabled = q.checking_disabled;
        m.add_query(Query::query(q.key.name.clone(), q.key.rtype));
        if edns {
            let mut e = Edns::new();
            e.set_max_payload(self.config.edns_udp_size);
            e.set_version(0);
            m.set_edns(e);
        }
        // A query built from an already-parsed name cannot fail to encode; fall back to empty
        // (the driver then sees a timeout-free mismatch and moves on) rather than panic.
        m.to_vec().unwrap_or_default()
    }

    /// Judge one upstream datagram/frame for `q` sent with `txid`. Pure.
    pub fn check_upstream_reply(
        &self,
        q: &PendingQuery,
        txid: u16,
        bytes: &[u8],
        via: Transport,
        sent_edns: bool,
    ) -> UpstreamVerdict {
        let Ok(msg) = Message::from_vec(bytes) else {
            return UpstreamVerdict::Mismatch;
        };
        if msg.metadata.id != txid || msg.metadata.message_type != MessageType::Response {
            return UpstreamVerdict::Mismatch;
        }
        let question_ok = msg.queries.len() == 1 && {
            let rq = &msg.queries[0];
            rq.query_type() == q.key.rtype
                && rq.query_class() == q.key.class
                && *rq.name() == q.key.name
        };
        if !question_ok {
            // A FORMERR may legitimately come back without the question.
            if msg.metadata.response_code == ResponseCode::FormErr && msg.queries.is_empty() {
                return if sent_edns {
                    UpstreamVerdict::RetryWithoutEdns
                } else {
                    UpstreamVerdict::ServerFailure(ResponseCode::FormErr)
                };
            }
            return UpstreamVerdict::Mismatch;
        }
        if msg.metadata.truncation {
            return match via {
                Transport::Udp => UpstreamVerdict::Truncated,
                // A truncated TCP answer is unusable.
                Transport::Tcp => UpstreamVerdict::ServerFailure(ResponseCode::ServFail),
            };
        }
        match msg.metadata.response_code {
            ResponseCode::NoError | ResponseCode::NXDomain => {
                UpstreamVerdict::Answer(Box::new(msg))
            }
            ResponseCode::FormErr if sent_edns => UpstreamVerdict::RetryWithoutEdns,
            other => UpstreamVerdict::ServerFailure(other),
        }
    }

    /// The owner answered: cache it and build the client reply. The owner's NXDOMAIN is final.
    pub fn complete(&self, q: &PendingQuery, msg: Message, now: Instant) -> Reply {
        let rcode = msg.metadata.response_code;
        let mut answers = msg.answers;
        let mut authorities = msg.authorities;
        let additionals: Vec<Record> = msg
            .additionals
            .into_iter()
            .filter(|r| r.record_type() != hickory_proto::rr::RecordType::OPT)
            .collect();
        self.cache.insert(
            q.key.clone(),
            rcode,
            answers.clone(),
            authorities.clone(),
            additionals.clone(),
            now,
        );
        let max = self.config.cache.max_ttl;
        for r in answers.iter_mut().chain(authorities.iter_mut()) {
            r.ttl = r.ttl.min(max);
        }
        self.build_reply(
            q,
            rcode,
            answers,
            authorities,
            additionals,
            Source::Upstream,
        )
    }

    /// The owner could not be reached or failed: serve stale (RFC 8767) or SERVFAIL, and
    /// remember the failure for `failure_ttl` (RFC 9520).
    pub fn fail(&self, q: &PendingQuery, now: Instant) -> Reply {
        if !self.cache.is_failed(&q.key, now) {
            self.cache.insert_failure(q.key.clone(), now);
        }
        self.stale_or_servfail(q, now)
    }

    fn stale_or_servfail(&self, q: &PendingQuery, now: Instant) -> Reply {
        if let Some(r) = self.stale_reply(q, now) {
            return r;
        }
        self.build_reply(
            q,
            ResponseCode::ServFail,
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Source::Error,
        )
    }

    /// An empty reply with `rcode` (e.g. REFUSED when the driver is overloaded).
    pub fn rcode_reply(&self, q: &PendingQuery, rcode: ResponseCode) -> Reply {
        self.build_reply(q, rcode, Vec::new(), Vec::new(), Vec::new(), Source::Error)
    }

    /// A stale answer if one is available (for the client response timer).
    pub fn stale_reply(&self, q: &PendingQuery, now: Instant) -> Option<Reply> {
        let entry = self.cache.get_stale(&q.key, now)?;
        Some(self.reply_from_cache(q, &entry, None))
    }

    fn reply_from_cache(&self, q: &PendingQuery, e: &CachedAnswer, elapsed: Option<u32>) -> Reply {
        let adjust = |rs: &[Record]| -> Vec<Record> {
            rs.iter()
                .map(|r| {
                    let mut r = r.clone();
                    r.ttl = match elapsed {
                        Some(el) => r.ttl.saturating_sub(el),
                        None => STALE_TTL,
                    };
                    r
                })
                .collect()
        };
        let source = if elapsed.is_some() {
            Source::Cache
        } else {
            Source::Stale
        };
        self.build_reply(
            q,
            e.rcode,
            adjust(&e.answers),
            adjust(&e.authorities),
            adjust(&e.additionals),
            source,
        )
    }

    fn reply_limit(&self, q: &PendingQuery) -> usize {
        match q.transport {
            Transport::Tcp => MAX_TCP_REPLY,
            Transport::Udp => match q.edns {
                None => 512,
                Some(e) => usize::from(e.payload.min(self.config.edns_udp_size).max(512)),
            },
        }
    }

    fn build_reply(
        &self,
        q: &PendingQuery,
        rcode: ResponseCode,
        answers: Vec<Record>,
        authorities: Vec<Record>,
        additionals: Vec<Record>,
        source: Source,
    ) -> Reply {
        let mut m = Message::response(q.id, OpCode::Query);
        m.metadata.recursion_desired = q.recursion_desired;
        m.metadata.recursion_available = true;
        m.metadata.checking_disabled = q.checking_disabled;
        m.metadata.response_code = rcode;
        m.add_query(q.query.clone());
        if q.edns.is_some() {
            let mut e = Edns::new();
            e.set_max_payload(self.config.edns_udp_size);
            e.set_version(0);
            m.set_edns(e);
        }
        let header_only = m.clone();
        m.answers = answers;
        m.authorities = authorities;
        m.additionals = additionals;
        let limit = self.reply_limit(q);
        let outcome = Outcome {
            owner: Some(q.owner),
            rcode,
            source,
            truncated: false,
        };
        match m.to_vec() {
            Ok(bytes) if bytes.len() <= limit => Reply { bytes, outcome },
            Ok(_) => {
                // RFC 1035 §4.2.1 / RFC 6891: too big for the client's UDP limit. Send the
                // question (and OPT) with TC=1 so the client retries over TCP.
                let mut t = header_only;
                t.metadata.truncation = true;
                Reply {
                    bytes: t.to_vec().unwrap_or_default(),
                    outcome: Outcome {
                        truncated: true,
                        ..outcome
                    },
                }
            }
            Err(_) => {
                let mut t = header_only;
                t.metadata.response_code = ResponseCode::ServFail;
                Reply {
                    bytes: t.to_vec().unwrap_or_default(),
                    outcome: Outcome {
                        rcode: ResponseCode::ServFail,
                        source: Source::Error,
                        ..outcome
                    },
                }
            }
        }
    }

    /// Minimal error reply built from the raw header only (no question: it may be garbage).
    /// REFUSED for a client that may not query us (no parsing beyond the header; `None`
    /// for anything that is not a query we could answer).
    pub fn refused_reply(&self, bytes: &[u8]) -> Option<Reply> {
        let header = bytes.get(..12)?;
        if header[2] & 0x80 != 0 {
            return None;
        }
        let id = u16::from_be_bytes([header[0], header[1]]);
        Some(self.error_reply(id, (header[2] >> 3) & 0x0f, ResponseCode::Refused))
    }

    fn error_reply(&self, id: u16, opcode_bits: u8, rcode: ResponseCode) -> Reply {
        let mut b = vec![0u8; 12];
        b[0..2].copy_from_slice(&id.to_be_bytes());
        // QR=1, opcode echoed, RD=0; RA=1, rcode low bits.
        b[2] = 0x80 | (opcode_bits << 3);
        b[3] = 0x80 | (rcode.low() & 0x0f);
        Reply {
            bytes: b,
            outcome: Outcome {
                owner: None,
                rcode,
                source: Source::Error,
                truncated: false,
            },
        }
    }
}
