//! Tenants of one ingest partition take turns at fan-out. A worker reads ahead of what it
//! fans out (up to a bound in events and bytes) into one queue per namespace and fans
//! out one event of each namespace in turn, so a tenant's burst waits behind itself and
//! a neighbour's event is fanned out within a turn of arriving. Each namespace's queue
//! keeps publish order, and every endpoint belongs to one namespace, so no endpoint's
//! events change order.

use std::collections::{HashMap, VecDeque};

/// Events read ahead, per namespace, with the order in which namespaces take turns.
pub(super) struct Turns<T> {
    queues: HashMap<String, VecDeque<(T, usize)>>,
    /// Namespaces with an event waiting, next turn first.
    order: VecDeque<String>,
    events: usize,
    bytes: usize,
    max_events: usize,
    max_bytes: usize,
}

impl<T> Turns<T> {
    /// Read-ahead of at most `max_events` events and `max_bytes` bytes (one event is
    /// always taken, however large).
    pub(super) fn new(max_events: usize, max_bytes: usize) -> Self {
        Self {
            queues: HashMap::new(),
            order: VecDeque::new(),
            events: 0,
            bytes: 0,
            max_events: max_events.max(1),
            max_bytes,
        }
    }

    /// Whether the read-ahead is at its bound: take nothing more until one is fanned out.
    pub(super) fn is_full(&self) -> bool {
        self.events >= self.max_events || (self.events > 0 && self.bytes >= self.max_bytes)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Every event waiting, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.queues.values().flatten().map(|(item, _)| item)
    }

    /// Queues `item` (of `bytes`) behind `namespace`'s earlier events.
    pub(super) fn push(&mut self, namespace: &str, item: T, bytes: usize) {
        self.events += 1;
        self.bytes += bytes;
        match self.queues.get_mut(namespace) {
            Some(queue) => queue.push_back((item, bytes)),
            None => {
                self.queues
                    .insert(namespace.to_owned(), VecDeque::from([(item, bytes)]));
                self.order.push_back(namespace.to_owned());
            }
        }
    }

    /// The oldest event of the namespace whose turn it is; that namespace goes to the
    /// back of the line if it has more.
    pub(super) fn pop(&mut self) -> Option<T> {
        let namespace = self.order.pop_front()?;
        let queue = self.queues.get_mut(&namespace)?;
        let (item, bytes) = queue.pop_front()?;
        if queue.is_empty() {
            self.queues.remove(&namespace);
        } else {
            self.order.push_back(namespace);
        }
        self.events -= 1;
        self.bytes -= bytes;
        Some(item)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn drain(turns: &mut Turns<(char, u32)>) -> Vec<(char, u32)> {
        std::iter::from_fn(|| turns.pop()).collect()
    }

    #[test]
    fn a_burst_waits_behind_itself() {
        let mut turns = Turns::new(100, usize::MAX);
        for n in 0..5 {
            turns.push("a", ('a', n), 1);
        }
        turns.push("b", ('b', 0), 1);
        let served = drain(&mut turns);
        assert_eq!(
            served,
            vec![('a', 0), ('b', 0), ('a', 1), ('a', 2), ('a', 3), ('a', 4)]
        );
        assert!(turns.is_empty());
    }

    #[test]
    fn bounded_in_events_and_bytes_but_always_takes_one() {
        let mut turns = Turns::new(2, 100);
        assert!(!turns.is_full());
        turns.push("a", ('a', 0), 1_000);
        assert!(turns.is_full(), "one event over the byte bound fills it");
        turns.pop();
        assert!(!turns.is_full());
        turns.push("a", ('a', 1), 1);
        turns.push("b", ('b', 0), 1);
        assert!(turns.is_full(), "two events");
        assert_eq!(turns.iter().count(), 2);
    }

    proptest! {
        /// Whatever the arrivals: each namespace's events come out in the order they
        /// went in, none is lost, and while n namespaces have events waiting, each is
        /// served once in any n consecutive turns.
        #[test]
        fn order_kept_per_namespace_and_turns_fair(arrivals in prop::collection::vec(0u8..4, 0..200)) {
            let mut turns = Turns::new(usize::MAX, usize::MAX);
            let mut next = [0u32; 4];
            for ns in &arrivals {
                let c = (b'a' + ns) as char;
                turns.push(&c.to_string(), (c, next[*ns as usize]), 1);
                next[*ns as usize] += 1;
            }
            let served = drain(&mut turns);
            prop_assert_eq!(served.len(), arrivals.len());
            let mut seen = [0u32; 4];
            for (c, n) in &served {
                let i = (*c as u8 - b'a') as usize;
                prop_assert_eq!(*n, seen[i]);
                seen[i] += 1;
            }
            // Fair: between two turns of one namespace, no other takes two.
            for (i, (c, _)) in served.iter().enumerate() {
                let Some(again) = served[i + 1..].iter().position(|(d, _)| d == c) else {
                    continue;
                };
                let between = &served[i + 1..i + 1 + again];
                for (d, _) in between {
                    prop_assert_eq!(between.iter().filter(|(e, _)| e == d).count(), 1);
                }
            }
        }
    }
}
