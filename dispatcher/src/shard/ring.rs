//! The shard's fair scheduler: a ring of tenants (namespaces), each with a ring of its
//! endpoints that may have work and capacity, and timers for endpoints that must wait
//! (Retry-After, circuit probes, rate limits, in-place retries).
//!
//! Fair across tenants first: each turn of the outer ring gives the tenant in front
//! `weight` consecutive attempts (one per endpoint, round robin over its endpoints), then
//! moves it to the back — so a tenant with 1,000 endpoints and a tenant with one get the
//! same share of a busy shard at equal weights. A tenant holding its in-flight cap of
//! the shard's attempts is parked (out of the ring, its endpoints kept in order) until
//! one of its attempts finishes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use herald_core::dataplane::EndpointKey;

/// How one tenant shares a shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TenantShare {
    /// Consecutive attempts per turn of the tenant ring (≥ 1).
    pub weight: u32,
    /// Most attempts of the tenant in flight in the shard at once (≥ 1).
    pub max_in_flight: usize,
}

#[derive(Default)]
struct Tenant {
    ready: VecDeque<EndpointKey>,
    in_flight: usize,
    /// Attempts left in its current turn.
    turns: u32,
    /// In `order`.
    in_order: bool,
}

pub struct Ring {
    /// Tenants with ready endpoints and room for an attempt, in turn order.
    order: VecDeque<Arc<str>>,
    tenants: HashMap<Arc<str>, Tenant>,
    /// Endpoints waiting in some tenant's ring.
    ready: usize,
    timers: BinaryHeap<Reverse<(Instant, EndpointKey)>>,
    default_share: TenantShare,
    shares: HashMap<Arc<str>, TenantShare>,
}

impl Ring {
    pub fn new(default_share: TenantShare) -> Self {
        Self {
            order: VecDeque::new(),
            tenants: HashMap::new(),
            ready: 0,
            timers: BinaryHeap::new(),
            default_share,
            shares: HashMap::new(),
        }
    }

    /// Sets how `tenant` shares the shard (`None`: the defaults).
    pub fn set_share(&mut self, tenant: &str, share: Option<TenantShare>) {
        match share {
            Some(share) => self.shares.insert(tenant.into(), share),
            None => self.shares.remove(tenant),
        };
        // A raised cap may unpark it.
        self.requeue(tenant);
    }

    /// Sets how every tenant shares the shard: those in `shares` as given, the others by
    /// the defaults.
    pub fn replace_shares(&mut self, shares: HashMap<String, TenantShare>) {
        let old = std::mem::take(&mut self.shares);
        self.shares = shares.into_iter().map(|(ns, s)| (ns.into(), s)).collect();
        for tenant in old.keys().chain(self.shares.clone().keys()) {
            self.requeue(tenant);
        }
    }

    fn share(&self, tenant: &str) -> TenantShare {
        let share = self
            .shares
            .get(tenant)
            .copied()
            .unwrap_or(self.default_share);
        TenantShare {
            weight: share.weight.max(1),
            max_in_flight: share.max_in_flight.max(1),
        }
    }

    /// Puts `key` at the back of its tenant's ring unless `queued` says it is already in
    /// it.
    pub fn push(&mut self, key: &EndpointKey, queued: &mut bool) {
        if *queued {
            return;
        }
        *queued = true;
        let tenant = key.namespace();
        self.tenant_mut(tenant).ready.push_back(key.clone());
        self.ready += 1;
        self.requeue(tenant);
    }

    /// Puts `tenant` at the back of the tenant ring if it has ready endpoints and room.
    fn requeue(&mut self, tenant: &str) {
        let cap = self.share(tenant).max_in_flight;
        let Some((name, t)) = self.tenants.get_key_value(tenant) else {
            return;
        };
        if !t.in_order && !t.ready.is_empty() && t.in_flight < cap {
            let name = name.clone();
            self.order.push_back(name);
            if let Some(t) = self.tenants.get_mut(tenant) {
                t.in_order = true;
            }
        }
    }

    /// The tenant's entry, created on first use (without allocating when it exists).
    fn tenant_mut(&mut self, tenant: &str) -> &mut Tenant {
        if !self.tenants.contains_key(tenant) {
            self.tenants.insert(tenant.into(), Tenant::default());
        }
        self.tenants.get_mut(tenant).expect("inserted")
    }

    /// The next endpoint to give an attempt; the caller clears its `queued` flag and
    /// reports the attempt with [`Self::started`] if it starts one.
    pub fn pop(&mut self) -> Option<EndpointKey> {
        while let Some(name) = self.order.front().cloned() {
            let share = self.share(&name);
            let t = self
                .tenants
                .get_mut(&name)
                .expect("a tenant in order exists");
            if t.in_flight >= share.max_in_flight || t.ready.is_empty() {
                // Parked until an attempt finishes, or empty until an endpoint is pushed.
                t.in_order = false;
                t.turns = 0;
                self.order.pop_front();
                continue;
            }
            let key = t.ready.pop_front().expect("not empty");
            self.ready -= 1;
            if t.turns == 0 {
                t.turns = share.weight;
            }
            t.turns -= 1;
            // With turns left it stays in front, even with no endpoint ready this moment:
            // the endpoint just popped is usually pushed back before the next pop.
            if t.turns == 0 {
                if t.ready.is_empty() {
                    t.in_order = false;
                    self.order.pop_front();
                } else {
                    self.order.rotate_left(1);
                }
            }
            return Some(key);
        }
        None
    }

    /// An attempt of `tenant` started.
    pub fn started(&mut self, tenant: &str) {
        self.tenant_mut(tenant).in_flight += 1;
    }

    /// An attempt of `tenant` finished: it may take its turn again.
    pub fn finished(&mut self, tenant: &str) {
        let Some(t) = self.tenants.get_mut(tenant) else {
            return;
        };
        t.in_flight = t.in_flight.saturating_sub(1);
        if t.in_flight == 0 && t.ready.is_empty() && !t.in_order {
            self.tenants.remove(tenant);
            return;
        }
        self.requeue(tenant);
    }

    /// Attempts of `tenant` in flight.
    #[cfg(test)]
    pub fn in_flight(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |t| t.in_flight)
    }

    /// Endpoints waiting for a turn (parked tenants' included).
    pub fn len(&self) -> usize {
        self.ready
    }

    /// Looks at `key` again at `at`.
    pub fn wake_at(&mut self, at: Instant, key: EndpointKey) {
        self.timers.push(Reverse((at, key)));
    }

    pub fn next_timer(&self) -> Option<Instant> {
        self.timers.peek().map(|Reverse((at, _))| *at)
    }

    /// Endpoints whose timers are due at `now`.
    pub fn due(&mut self, now: Instant) -> Vec<EndpointKey> {
        let mut due = Vec::new();
        while let Some(Reverse((at, _))) = self.timers.peek() {
            if *at > now {
                break;
            }
            if let Some(Reverse((_, key))) = self.timers.pop() {
                due.push(key);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const EVEN: TenantShare = TenantShare {
        weight: 1,
        max_in_flight: 1000,
    };

    fn key(ns: &str, name: &str) -> EndpointKey {
        EndpointKey::new(ns, name)
    }

    /// Runs `turns` turns the way the shard does: each popped endpoint starts an attempt
    /// and goes to the back of its tenant's ring; returns the tenants served in order.
    fn serve(ring: &mut Ring, queued: &mut HashMap<EndpointKey, bool>, turns: usize) -> String {
        let mut served = String::new();
        for _ in 0..turns {
            let Some(k) = ring.pop() else { break };
            queued.insert(k.clone(), false);
            ring.started(k.namespace());
            served.push_str(k.namespace());
            ring.push(&k, queued.get_mut(&k).unwrap());
        }
        served
    }

    fn fill(ring: &mut Ring, queued: &mut HashMap<EndpointKey, bool>, ns: &str, n: usize) {
        for i in 0..n {
            let k = key(ns, &format!("e{i}"));
            ring.push(&k, queued.entry(k.clone()).or_default());
        }
    }

    #[test]
    fn an_endpoint_is_in_the_ring_once_and_timers_fire_in_order() {
        let mut ring = Ring::new(EVEN);
        let a = key("ns", "a");
        let mut queued = false;
        ring.push(&a, &mut queued);
        ring.push(&a, &mut queued);
        assert_eq!(ring.len(), 1);
        let now = Instant::now();
        ring.wake_at(now + Duration::from_secs(2), key("ns", "late"));
        ring.wake_at(now + Duration::from_secs(1), key("ns", "early"));
        assert_eq!(ring.next_timer(), Some(now + Duration::from_secs(1)));
        assert_eq!(
            ring.due(now + Duration::from_secs(1)),
            vec![key("ns", "early")]
        );
        assert_eq!(ring.due(now + Duration::from_secs(5)).len(), 1);
    }

    #[test]
    fn a_tenant_with_a_thousand_endpoints_and_a_tenant_with_one_alternate() {
        let mut ring = Ring::new(EVEN);
        let mut queued = HashMap::new();
        fill(&mut ring, &mut queued, "a", 1000);
        fill(&mut ring, &mut queued, "b", 1);
        let served = serve(&mut ring, &mut queued, 2000);
        assert_eq!(served.matches('a').count(), 1000);
        assert_eq!(served.matches('b').count(), 1000);
        assert!(served.starts_with("abab"), "{}", &served[..10]);
    }

    #[test]
    fn weights_give_consecutive_turns() {
        let mut ring = Ring::new(EVEN);
        ring.set_share("a", Some(TenantShare { weight: 3, ..EVEN }));
        let mut queued = HashMap::new();
        fill(&mut ring, &mut queued, "a", 10);
        fill(&mut ring, &mut queued, "b", 10);
        assert_eq!(serve(&mut ring, &mut queued, 12), "aaabaaabaaab");
    }

    #[test]
    fn weights_hold_for_a_tenant_with_a_single_endpoint() {
        let mut ring = Ring::new(EVEN);
        ring.set_share("a", Some(TenantShare { weight: 3, ..EVEN }));
        let mut queued = HashMap::new();
        fill(&mut ring, &mut queued, "a", 1);
        fill(&mut ring, &mut queued, "b", 1);
        assert_eq!(serve(&mut ring, &mut queued, 12), "aaabaaabaaab");
    }

    #[test]
    fn a_tenant_at_its_cap_is_parked_until_an_attempt_finishes() {
        let mut ring = Ring::new(TenantShare {
            weight: 1,
            max_in_flight: 2,
        });
        let mut queued = HashMap::new();
        fill(&mut ring, &mut queued, "a", 5);
        fill(&mut ring, &mut queued, "b", 5);
        // Two each, then both are parked although their endpoints wait.
        assert_eq!(serve(&mut ring, &mut queued, 10), "abab");
        assert_eq!(ring.pop(), None);
        assert_eq!(ring.len(), 10);
        ring.finished("b");
        assert_eq!(serve(&mut ring, &mut queued, 10), "b");
        ring.finished("a");
        ring.finished("a");
        assert_eq!(serve(&mut ring, &mut queued, 10), "aa");
        assert_eq!(ring.in_flight("a"), 2);
        // Raising the cap unparks at once.
        ring.set_share(
            "a",
            Some(TenantShare {
                weight: 1,
                max_in_flight: 3,
            }),
        );
        assert_eq!(serve(&mut ring, &mut queued, 10), "a");
    }

    #[test]
    fn an_idle_tenant_is_forgotten() {
        let mut ring = Ring::new(EVEN);
        let k = key("gone", "e");
        let mut queued = false;
        ring.push(&k, &mut queued);
        assert_eq!(ring.pop(), Some(k));
        ring.started("gone");
        ring.finished("gone");
        assert!(ring.tenants.is_empty());
        assert_eq!(ring.len(), 0);
    }
}
