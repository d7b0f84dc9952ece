//! Answer cache keyed by (name, type, class).
//!
//! - Positive TTL: the smallest record TTL, clamped to `[min_ttl, max_ttl]`.
//! - Negative TTL (RFC 2308 §5): `min(SOA TTL, SOA MINIMUM)` clamped to `max_negative_ttl`;
//!   negative answers without an SOA are not cached.
//! - Stale (RFC 8767): expired entries are kept for `max_stale` and can be served with TTL 30
//!   when the owner cannot be reached.
//! - Failures (RFC 9520): a name whose owner failed is remembered for `failure_ttl`.
//!
//! Time is passed in; the cache never reads a clock.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};

use super::config::CacheSpec;

/// TTL put on records served stale (RFC 8767 §4).
pub const STALE_TTL: u32 = 30;

const SHARDS: usize = 16;

/// Cache key: lower-case name, type, class.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub name: Name,
    pub rtype: RecordType,
    pub class: DNSClass,
}

impl CacheKey {
    pub fn new(name: &Name, rtype: RecordType, class: DNSClass) -> Self {
        Self {
            name: name.to_lowercase(),
            rtype,
            class,
        }
    }
}

/// A cached response (records carry clamped TTLs as received).
#[derive(Debug)]
pub struct CachedAnswer {
    pub rcode: ResponseCode,
    pub answers: Vec<Record>,
    pub authorities: Vec<Record>,
    pub additionals: Vec<Record>,
    pub stored: Instant,
    /// Lifetime in seconds from `stored`.
    pub ttl: u32,
    /// Set when the cache replaces or evicts this entry, so a holder of the `Arc` (the
    /// engine's reply memo) can tell it is no longer the cached answer without a lookup.
    retired: AtomicBool,
}

impl CachedAnswer {
    fn expires(&self) -> Instant {
        self.stored + Duration::from_secs(u64::from(self.ttl))
    }

    fn retire(&self) {
        self.retired.store(true, Ordering::Release);
    }

    /// Whole seconds since it was stored, while it is still the cache's fresh entry for its
    /// key (not expired, replaced or evicted); what [`Cache::get_fresh`] would return for it.
    pub fn fresh_elapsed(&self, now: Instant) -> Option<u32> {
        if self.retired.load(Ordering::Acquire) || now >= self.expires() {
            return None;
        }
        let elapsed = now.saturating_duration_since(self.stored).as_secs();
        Some(u32::try_from(elapsed).unwrap_or(u32::MAX))
    }
}

/// Result of a fresh lookup: the entry and whole seconds elapsed since it was stored.
#[derive(Debug, Clone)]
pub struct Hit {
    pub entry: Arc<CachedAnswer>,
    pub elapsed: u32,
}

#[derive(Default)]
struct Shard {
    answers: HashMap<CacheKey, Arc<CachedAnswer>>,
    failures: HashMap<CacheKey, Instant>,
}

/// Sharded answer cache.
pub struct Cache {
    shards: Vec<Mutex<Shard>>,
    hasher: RandomState,
    spec: CacheSpec,
    per_shard: usize,
    max_stale: Duration,
    failure_ttl: Duration,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache").field("spec", &self.spec).finish()
    }
}

fn lock(m: &Mutex<Shard>) -> MutexGuard<'_, Shard> {
    // A panic while holding the lock cannot leave a shard logically broken (every update is a
    // single map operation), so recover from poisoning instead of propagating it.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How a response will be cached, if at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cacheability {
    Positive(u32),
    Negative(u32),
    No,
}

impl Cache {
    pub fn new(spec: CacheSpec) -> Self {
        let per_shard = spec.max_entries.div_ceil(SHARDS).max(1);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            hasher: RandomState::new(),
            max_stale: Duration::from_secs(spec.max_stale),
            failure_ttl: Duration::from_secs(spec.failure_ttl),
            spec,
            per_shard,
        }
    }

    fn shard(&self, key: &CacheKey) -> &Mutex<Shard> {
        let h = self.hasher.hash_one(key) as usize;
        &self.shards[h % SHARDS]
    }

    /// Decide the cache lifetime of a response (pure).
    pub fn cacheability(
        &self,
        rcode: ResponseCode,
        answers: &[Record],
        authorities: &[Record],
    ) -> Cacheability {
        let negative = match rcode {
            ResponseCode::NXDomain => true,
            ResponseCode::NoError => answers.is_empty(),
            _ => return Cacheability::No,
        };
        if negative {
            // RFC 2308 §5: TTL of the SOA in the authority section, bounded by its MINIMUM.
            let soa_ttl = authorities.iter().find_map(|r| match &r.data {
                RData::SOA(soa) => Some(r.ttl.min(soa.minimum)),
                _ => None,
            });
            match soa_ttl {
                Some(t) => Cacheability::Negative(t.min(self.spec.max_negative_ttl)),
                None => Cacheability::No,
            }
        } else {
            let min = answers.iter().map(|r| r.ttl).min().unwrap_or(0);
            Cacheability::Positive(min.clamp(self.spec.min_ttl, self.spec.max_ttl))
        }
    }

    /// Store a response. Returns the cacheability that was applied.
    pub fn insert(
        &self,
        key: CacheKey,
        rcode: ResponseCode,
        mut answers: Vec<Record>,
        mut authorities: Vec<Record>,
        additionals: Vec<Record>,
        now: Instant,
    ) -> Cacheability {
        let c = self.cacheability(rcode, &answers, &authorities);
        let ttl = match c {
            Cacheability::Positive(t) => {
                for r in &mut answers {
                    r.ttl = r.ttl.clamp(self.spec.min_ttl, self.spec.max_ttl);
                }
                t
            }
            Cacheability::Negative(t) => {
                for r in &mut authorities {
                    r.ttl = r.ttl.min(t);
                }
                t
            }
            Cacheability::No => return c,
        };
        let mut additionals = additionals;
        for r in &mut additionals {
            r.ttl = r.ttl.clamp(self.spec.min_ttl, self.spec.max_ttl);
        }
        let entry = Arc::new(CachedAnswer {
            rcode,
            answers,
            authorities,
            additionals,
            stored: now,
            ttl,
            retired: AtomicBool::new(false),
        });
        let mut shard = lock(self.shard(&key));
        shard.failures.remove(&key);
        if shard.answers.len() >= self.per_shard && !shard.answers.contains_key(&key) {
            self.evict(&mut shard, now);
        }
        if let Some(old) = shard.answers.insert(key, entry) {
            old.retire();
        }
        c
    }

    fn evict(&self, shard: &mut Shard, now: Instant) {
        let max_stale = self.max_stale;
        shard.answers.retain(|_, e| {
            let keep = e.expires() + max_stale > now;
            if !keep {
                e.retire();
            }
            keep
        });
        shard.failures.retain(|_, until| *until > now);
        if shard.answers.len() >= self.per_shard {
            // Still full of live entries: drop an arbitrary eighth (HashMap order is random).
            let drop_n = (self.per_shard / 8).max(1);
            let victims: Vec<CacheKey> = shard.answers.keys().take(drop_n).cloned().collect();
            for k in victims {
                if let Some(e) = shard.answers.remove(&k) {
                    e.retire();
                }
            }
        }
    }

    /// A fresh (unexpired) entry.
    pub fn get_fresh(&self, key: &CacheKey, now: Instant) -> Option<Hit> {
        let shard = lock(self.shard(key));
        let entry = shard.answers.get(key)?;
        let elapsed = entry.fresh_elapsed(now)?;
        Some(Hit {
            entry: Arc::clone(entry),
            elapsed,
        })
    }

    /// An expired entry that is still within `max_stale` (or a fresh one).
    pub fn get_stale(&self, key: &CacheKey, now: Instant) -> Option<Arc<CachedAnswer>> {
        let shard = lock(self.shard(key));
        let entry = shard.answers.get(key)?;
        if now >= entry.expires() + self.max_stale {
            return None;
        }
        Some(Arc::clone(entry))
    }

    /// Remember that resolving `key` failed.
    pub fn insert_failure(&self, key: CacheKey, now: Instant) {
        if self.failure_ttl.is_zero() {
            return;
        }
        let mut shard = lock(self.shard(&key));
        if shard.failures.len() >= self.per_shard {
            shard.failures.retain(|_, until| *until > now);
            if shard.failures.len() >= self.per_shard {
                return;
            }
        }
        shard.failures.insert(key, now + self.failure_ttl);
    }

    /// Whether a recent failure for `key` is still remembered.
    pub fn is_failed(&self, key: &CacheKey, now: Instant) -> bool {
        let shard = lock(self.shard(key));
        shard.failures.get(key).is_some_and(|until| *until > now)
    }

    /// Number of answer entries (for tests and metrics).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).answers.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, SOA};
    use std::net::Ipv4Addr;

    fn spec() -> CacheSpec {
        CacheSpec {
            max_entries: 64,
            min_ttl: 2,
            max_ttl: 100,
            max_negative_ttl: 50,
            max_stale: 1000,
            failure_ttl: 5,
        }
    }

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn a(name: &str, ttl: u32) -> Record {
        Record::from_rdata(n(name), ttl, RData::A(A(Ipv4Addr::new(198, 18, 0, 1))))
    }

    fn soa(ttl: u32, minimum: u32) -> Record {
        Record::from_rdata(
            n("cluster.local."),
            ttl,
            RData::SOA(SOA::new(
                n("ns.dns.cluster.local."),
                n("hostmaster.cluster.local."),
                1,
                7200,
                1800,
                86400,
                minimum,
            )),
        )
    }

    fn key(s: &str) -> CacheKey {
        CacheKey::new(&n(s), RecordType::A, DNSClass::IN)
    }

    #[test]
    fn positive_ttl_is_min_record_ttl_clamped() {
        let c = Cache::new(spec());
        assert_eq!(
            c.cacheability(ResponseCode::NoError, &[a("x.", 30), a("x.", 20)], &[]),
            Cacheability::Positive(20)
        );
        assert_eq!(
            c.cacheability(ResponseCode::NoError, &[a("x.", 1000)], &[]),
            Cacheability::Positive(100)
        );
        assert_eq!(
            c.cacheability(ResponseCode::NoError, &[a("x.", 0)], &[]),
            Cacheability::Positive(2)
        );
    }

    #[test]
    fn negative_ttl_from_soa_rfc2308() {
        let c = Cache::new(spec());
        // min(SOA TTL, MINIMUM)
        assert_eq!(
            c.cacheability(ResponseCode::NXDomain, &[], &[soa(30, 10)]),
            Cacheability::Negative(10)
        );
        assert_eq!(
            c.cacheability(ResponseCode::NXDomain, &[], &[soa(7, 10)]),
            Cacheability::Negative(7)
        );
        // NODATA is negative too, clamped to max_negative_ttl.
        assert_eq!(
            c.cacheability(ResponseCode::NoError, &[], &[soa(900, 900)]),
            Cacheability::Negative(50)
        );
        // Without SOA: not cached.
        assert_eq!(
            c.cacheability(ResponseCode::NXDomain, &[], &[]),
            Cacheability::No
        );
        assert_eq!(
            c.cacheability(ResponseCode::ServFail, &[], &[soa(5, 5)]),
            Cacheability::No
        );
    }

    #[test]
    fn fresh_then_stale_then_gone() {
        let c = Cache::new(spec());
        let t0 = Instant::now();
        c.insert(
            key("x."),
            ResponseCode::NoError,
            vec![a("x.", 10)],
            vec![],
            vec![],
            t0,
        );
        let hit = c
            .get_fresh(&key("X."), t0 + Duration::from_secs(4))
            .unwrap();
        assert_eq!(hit.elapsed, 4);
        assert!(
            c.get_fresh(&key("x."), t0 + Duration::from_secs(10))
                .is_none()
        );
        assert!(
            c.get_stale(&key("x."), t0 + Duration::from_secs(10))
                .is_some()
        );
        assert!(
            c.get_stale(&key("x."), t0 + Duration::from_secs(1009))
                .is_some()
        );
        assert!(
            c.get_stale(&key("x."), t0 + Duration::from_secs(1010))
                .is_none()
        );
    }

    #[test]
    fn failures_expire() {
        let c = Cache::new(spec());
        let t0 = Instant::now();
        c.insert_failure(key("x."), t0);
        assert!(c.is_failed(&key("x."), t0 + Duration::from_secs(4)));
        assert!(!c.is_failed(&key("x."), t0 + Duration::from_secs(5)));
    }

    #[test]
    fn bounded_size() {
        let c = Cache::new(spec());
        let t0 = Instant::now();
        for i in 0..1000 {
            c.insert(
                key(&format!("h{i}.")),
                ResponseCode::NoError,
                vec![a("h.", 60)],
                vec![],
                vec![],
                t0,
            );
        }
        assert!(c.len() <= 64, "len {}", c.len());
        assert!(!c.is_empty());
    }

    /// The engine's reply memo trusts `fresh_elapsed` instead of a lookup: it must say "no
    /// longer fresh" exactly when the cache would no longer return that entry (replaced,
    /// evicted or expired).
    #[test]
    fn fresh_elapsed_agrees_with_the_cache_after_replacement_and_eviction() {
        // 16 entries in all: one per shard, so every insert into a used shard evicts.
        let c = Cache::new(CacheSpec {
            max_entries: 16,
            max_stale: 0,
            ..spec()
        });
        let t0 = Instant::now();
        let store = |k: &CacheKey| {
            c.insert(
                k.clone(),
                ResponseCode::NoError,
                vec![a("x.example.", 30)],
                vec![],
                vec![],
                t0,
            );
        };
        let mut held = Vec::new();
        for i in 0..64 {
            let k = key(&format!("n{i}.example."));
            store(&k);
            let hit = c.get_fresh(&k, t0).expect("just stored");
            held.push((k, hit.entry));
        }
        // a replacement of one that is still cached
        let (k, _) = held
            .iter()
            .rev()
            .find(|(k, _)| c.get_fresh(k, t0).is_some())
            .unwrap()
            .clone();
        store(&k);
        held.push((k.clone(), c.get_fresh(&k, t0).unwrap().entry));
        let mut evicted_or_replaced = 0;
        for at in [
            t0,
            t0 + Duration::from_secs(5),
            t0 + Duration::from_secs(31),
        ] {
            for (k, e) in &held {
                let cached = c
                    .get_fresh(k, at)
                    .filter(|h| Arc::ptr_eq(&h.entry, e))
                    .map(|h| h.elapsed);
                assert_eq!(e.fresh_elapsed(at), cached, "{k:?}");
                if at == t0 && cached.is_none() {
                    evicted_or_replaced += 1;
                }
            }
        }
        assert!(evicted_or_replaced >= 48, "{evicted_or_replaced}");
    }
}
