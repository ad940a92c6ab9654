//! One tenant's endpoints, indexed so that matching an event costs its matches, not the
//! tenant's endpoints.
//!
//! - exact types: a hash map from the type to its endpoints, one lookup;
//! - wildcard patterns: a trie over the pattern's segments. A literal segment is a
//!   child by name, an inner `*` (exactly one segment) the node's `any` child, and a
//!   pattern that ends in `*` (one or more segments: `order.*`, a lone `*`) sits in the
//!   `tail` list of the node its prefix leads to. Matching walks the event type's
//!   segments once; at each step every node reached so far contributes its `tail` list
//!   and moves to its child by name and to its `any` child. For the usual patterns
//!   (`a.b.*`, `*`) that is one node per segment, so the walk costs the type's depth.
//!
//! Every list holds an endpoint at most once (its patterns are deduplicated, and two
//! different patterns end in different lists), so the answer needs deduplication only
//! when several lists contribute, and only for endpoints with more than one pattern:
//! those go through a set of pointers, the rest are copied. The whole answer is
//! O(depth + matches); an endpoint that does not match is never looked at.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use super::Endpoint;

type Members = Vec<Arc<Endpoint>>;

fn add_member(list: &mut Members, endpoint: &Arc<Endpoint>) {
    list.push(endpoint.clone());
}

/// Removes `endpoint` (by pointer: the index holds the very `Arc` it added). O(list).
fn remove_member(list: &mut Members, endpoint: &Arc<Endpoint>) {
    if let Some(at) = list.iter().position(|e| Arc::ptr_eq(e, endpoint)) {
        list.swap_remove(at);
        if list.is_empty() {
            *list = Vec::new();
        }
    }
}

#[derive(Default)]
struct Node {
    children: HashMap<Box<str>, Node>,
    /// An inner `*`: any one segment.
    any: Option<Box<Node>>,
    /// Patterns that end here with a trailing `*`: one or more further segments.
    tail: Members,
    /// Patterns that end here exactly (only those with an inner `*`; plain types are
    /// in [`Namespace::exact`]).
    end: Members,
}

impl Node {
    fn is_empty(&self) -> bool {
        self.children.is_empty()
            && self.any.is_none()
            && self.tail.is_empty()
            && self.end.is_empty()
    }

    /// The list a wildcard pattern's endpoints belong in, creating the path.
    fn list_mut<'a>(&'a mut self, segments: &[&str]) -> &'a mut Members {
        match segments {
            [] => &mut self.end,
            ["*"] => &mut self.tail,
            ["*", rest @ ..] => self.any.get_or_insert_with(Box::default).list_mut(rest),
            [literal, rest @ ..] => self
                .children
                .entry((*literal).into())
                .or_default()
                .list_mut(rest),
        }
    }

    /// Removes `endpoint` from the pattern's list and prunes nodes left empty.
    fn remove(&mut self, segments: &[&str], endpoint: &Arc<Endpoint>) {
        match segments {
            [] => remove_member(&mut self.end, endpoint),
            ["*"] => remove_member(&mut self.tail, endpoint),
            ["*", rest @ ..] => {
                if let Some(any) = &mut self.any {
                    any.remove(rest, endpoint);
                    if any.is_empty() {
                        self.any = None;
                    }
                }
            }
            [literal, rest @ ..] => {
                if let Some(child) = self.children.get_mut(*literal) {
                    child.remove(rest, endpoint);
                    if child.is_empty() {
                        self.children.remove(*literal);
                    }
                }
            }
        }
    }
}

/// A tenant's endpoints, indexed for matching.
#[derive(Default)]
pub(super) struct Namespace {
    exact: HashMap<Box<str>, Members>,
    wildcards: Node,
    pub(super) count: usize,
}

/// An endpoint's distinct patterns (validated when the endpoint was compiled).
fn patterns(endpoint: &Endpoint) -> BTreeSet<&str> {
    endpoint
        .config
        .event_types
        .iter()
        .map(String::as_str)
        .collect()
}

impl Namespace {
    pub(super) fn add(&mut self, endpoint: &Arc<Endpoint>) {
        self.count += 1;
        for pattern in patterns(endpoint) {
            let list = if pattern.contains('*') {
                let segments: Vec<&str> = pattern.split('.').collect();
                self.wildcards.list_mut(&segments)
            } else {
                self.exact.entry(pattern.into()).or_default()
            };
            add_member(list, endpoint);
        }
    }

    /// Removes `endpoint`, the same `Arc` that was added.
    pub(super) fn remove(&mut self, endpoint: &Arc<Endpoint>) {
        self.count = self.count.saturating_sub(1);
        for pattern in patterns(endpoint) {
            if pattern.contains('*') {
                let segments: Vec<&str> = pattern.split('.').collect();
                self.wildcards.remove(&segments, endpoint);
            } else if let Some(list) = self.exact.get_mut(pattern) {
                remove_member(list, endpoint);
                if list.is_empty() {
                    self.exact.remove(pattern);
                }
            }
        }
    }

    /// The endpoints that receive `event_type`, each once.
    pub(super) fn matching(&self, event_type: &str) -> Vec<Arc<Endpoint>> {
        let mut lists: Vec<&Members> = Vec::new();
        if let Some(list) = self.exact.get(event_type) {
            lists.push(list);
        }
        let mut reached: Vec<&Node> = vec![&self.wildcards];
        let mut next: Vec<&Node> = Vec::new();
        // Herald's operational events are matched only by patterns that name them
        // (`herald.…`), never by a wildcard in the first segment (a lone `*`).
        let operational = herald_core::operational::is_operational(event_type);
        for (depth, segment) in event_type.split('.').enumerate() {
            let first = depth == 0;
            for node in reached.drain(..) {
                // At least this segment is left: trailing wildcards match.
                if !(first && operational) {
                    lists.push(&node.tail);
                    next.extend(node.any.as_deref());
                }
                next.extend(node.children.get(segment));
            }
            std::mem::swap(&mut reached, &mut next);
            if reached.is_empty() {
                break;
            }
        }
        lists.extend(reached.iter().map(|node| &node.end));
        lists.retain(|list| !list.is_empty());
        collect(&lists)
    }
}

/// The union of `lists`, each endpoint once, in O(total length).
fn collect(lists: &[&Members]) -> Vec<Arc<Endpoint>> {
    if let [only] = lists {
        return (*only).clone();
    }
    let mut out = Vec::with_capacity(lists.iter().map(|l| l.len()).sum());
    // Only an endpoint with several patterns can be in several lists.
    let mut seen: HashSet<*const Endpoint> = HashSet::new();
    for endpoint in lists.iter().flat_map(|l| l.iter()) {
        if endpoint.config.event_types.len() > 1 && !seen.insert(Arc::as_ptr(endpoint)) {
            continue;
        }
        out.push(endpoint.clone());
    }
    out
}
