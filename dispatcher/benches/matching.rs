//! How long `Index::matching` takes for one event, before and after the matching index
//! (issue 12, deliverable 3), in one run:
//!
//! ```text
//! cargo bench -p herald-dispatcher --bench matching
//! ```
//!
//! "before" is the previous algorithm, kept here verbatim over the same endpoints: exact
//! types by hash lookup, every wildcard endpoint of the tenant scanned with
//! `Endpoint::matches`, and each match deduplicated by a search of the answer so far
//! (O(n²) for n matches), all under the index's read lock. "after" is `Index::matching`.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use herald_core::dataplane::EndpointKey;
use herald_dispatcher::index::{Endpoint, Index};

const ENDPOINTS: usize = 10_000;

fn config(name: &str, types: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "namespace": "bench", "name": name, "uid": name, "generation": 1,
        "url": "https://hooks.example.com/", "eventTypes": types, "secret": "s",
        "delivery": {}, "shard": 0
    }))
    .expect("config serializes")
}

/// The previous matching code, over the endpoints of one tenant.
#[derive(Default)]
struct Before {
    endpoints: HashMap<EndpointKey, Arc<Endpoint>>,
    exact: HashMap<String, Vec<EndpointKey>>,
    wildcard: Vec<EndpointKey>,
}

impl Before {
    fn add(&mut self, endpoint: Arc<Endpoint>) {
        let types = &endpoint.config.event_types;
        for ty in types.iter().filter(|t| !t.contains('*')) {
            self.exact
                .entry(ty.clone())
                .or_default()
                .push(endpoint.key.clone());
        }
        if types.iter().any(|t| t.contains('*')) {
            self.wildcard.push(endpoint.key.clone());
        }
        self.endpoints.insert(endpoint.key.clone(), endpoint);
    }

    fn matching(&self, event_type: &str) -> Vec<Arc<Endpoint>> {
        let mut out: Vec<Arc<Endpoint>> = Vec::new();
        let exact = self.exact.get(event_type).into_iter().flatten();
        for key in exact.chain(self.wildcard.iter()) {
            if let Some(endpoint) = self.endpoints.get(key)
                && endpoint.matches(event_type)
                && !out.iter().any(|e| e.key == *key)
            {
                out.push(endpoint.clone());
            }
        }
        out
    }
}

struct Case {
    name: &'static str,
    /// The patterns of endpoint `i`.
    patterns: fn(usize) -> Vec<String>,
    event_type: &'static str,
    matches: usize,
}

const CASES: &[Case] = &[
    Case {
        name: "10,000 `*` endpoints",
        patterns: |_| vec!["*".into()],
        event_type: "order.created",
        matches: ENDPOINTS,
    },
    Case {
        name: "10,000 distinct exact types",
        patterns: |i| vec![format!("type{i}.created")],
        event_type: "type5000.created",
        matches: 1,
    },
    Case {
        name: "10,000 distinct prefixes `p<i>.*`",
        patterns: |i| vec![format!("p{i}.*")],
        event_type: "p5000.item.added",
        matches: 1,
    },
    Case {
        name: "10,000 × `order.created`, `order.*` (overlapping)",
        patterns: |_| vec!["order.created".into(), "order.*".into()],
        event_type: "order.created",
        matches: ENDPOINTS,
    },
    Case {
        name: "10,000 `*.shipped`, type not matching",
        patterns: |_| vec!["*.shipped".into()],
        event_type: "order.created",
        matches: 0,
    },
];

/// Median time of one call, over repetitions for at least `budget` (3 at least).
fn time(budget: Duration, mut call: impl FnMut() -> usize) -> Duration {
    let mut samples = Vec::new();
    let start = Instant::now();
    while samples.len() < 3 || (start.elapsed() < budget && samples.len() < 100_000) {
        let t = Instant::now();
        black_box(call());
        samples.push(t.elapsed());
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn show(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns >= 1_000_000 {
        format!("{:.1} ms", ns as f64 / 1e6)
    } else if ns >= 1_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{ns} ns")
    }
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument selects cases by name.
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with("--"));
    let budget = Duration::from_millis(500);
    println!("| tenant | event type | matches | before | after | speed-up |");
    println!("|---|---|---|---|---|---|");
    for case in CASES {
        if filter
            .as_ref()
            .is_some_and(|f| !case.name.contains(f.as_str()))
        {
            continue;
        }
        let index = Index::default();
        let mut before = Before::default();
        for i in 0..ENDPOINTS {
            let name = format!("e{i}");
            index.apply(
                &format!("ep.bench.{name}"),
                Some(&config(&name, &(case.patterns)(i))),
            );
            before.add(
                index
                    .endpoint(&EndpointKey::new("bench", &name))
                    .expect("endpoint indexed"),
            );
        }
        let before = RwLock::new(before);
        let ty = case.event_type;
        let found = index.matching("bench", ty).expect("tenant known").len();
        let found_before = before.read().expect("lock").matching(ty).len();
        assert_eq!(
            (found, found_before),
            (case.matches, case.matches),
            "{}",
            case.name
        );
        let old = time(budget, || before.read().expect("lock").matching(ty).len());
        let new = time(budget, || {
            index.matching("bench", ty).map_or(0, |m| m.len())
        });
        println!(
            "| {} | `{ty}` | {} | {} | {} | {:.0}× |",
            case.name,
            case.matches,
            show(old),
            show(new),
            old.as_secs_f64() / new.as_secs_f64()
        );
    }
}
