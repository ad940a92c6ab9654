//! Do the dispatchers hold every shard? The installation's shard count is recorded in
//! `herald-config` (`layout.shards`, by the first dispatcher or operator that started);
//! each shard is owned through a lease, key `shard.<n>` in `herald-shards` holding the
//! owner's id, renewed every 2 s and gone 10 s after its last renewal (the bucket's
//! TTL); a live dispatcher also keeps `member.<id>` there. A shard without a lease has
//! no dispatcher: its endpoints get no deliveries, and the fan-out of its ingest
//! partition stops. Pure: what the buckets hold is passed in.

use std::collections::{BTreeMap, BTreeSet};

use super::report::Verdict;

/// What the buckets hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShardFacts {
    /// `layout.shards` (`None`: not recorded).
    pub count: Option<u32>,
    /// Live `shard.<n>` leases and their holders.
    pub holders: BTreeMap<u32, String>,
    /// Live `member.<id>` heartbeats.
    pub members: BTreeSet<String>,
}

const CHECK: &str = "shards";

/// The verdict on the shards; `namespace` is Herald's (for the commands it suggests).
pub fn verdict(facts: &Result<ShardFacts, String>, namespace: &str) -> Verdict {
    let facts = match facts {
        Err(error) => {
            return Verdict::fail(CHECK, format!("cannot read the shard leases: {error}"));
        }
        Ok(facts) => facts,
    };
    let Some(count) = facts.count else {
        return Verdict::fail(
            CHECK,
            "no shard count recorded (herald-config layout.shards): no dispatcher or operator has started against this NATS; start them (the chart's herald-dispatcher StatefulSet and herald-operator Deployment)",
        );
    };
    let unheld: Vec<u32> = (0..count)
        .filter(|s| !facts.holders.contains_key(s))
        .collect();
    let holders: BTreeSet<&str> = facts
        .holders
        .iter()
        .filter(|(s, _)| **s < count)
        .map(|(_, h)| h.as_str())
        .collect();
    if unheld.is_empty() {
        return Verdict::ok(
            CHECK,
            format!(
                "all {count} shards held, by {} dispatcher{} ({})",
                holders.len(),
                plural(holders.len()),
                list(holders.iter().copied())
            ),
        );
    }
    let what = format!(
        "{} of {count} shard{} without a live holder ({}): their endpoints get no deliveries and their events are not fanned out",
        unheld.len(),
        plural(count as usize),
        ranges(&unheld)
    );
    let why = if facts.members.is_empty() {
        format!(
            "no dispatcher is alive (none heartbeats in herald-shards): start the dispatchers, or check why they cannot reach NATS (kubectl -n {namespace} get pods -l app.kubernetes.io/component=dispatcher, and their logs)"
        )
    } else {
        let one = facts.members.len() == 1;
        format!(
            "dispatcher{} {} {} alive but {} not take them (a free shard is taken within seconds): their /readyz (part shards) and logs say why",
            plural(facts.members.len()),
            list(facts.members.iter().map(String::as_str)),
            if one { "is" } else { "are" },
            if one { "does" } else { "do" },
        )
    };
    Verdict::fail(CHECK, format!("{what}; {why}"))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// At most five names, then how many more.
fn list<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    let shown = names.iter().take(5).copied().collect::<Vec<_>>().join(", ");
    match names.len() {
        n if n > 5 => format!("{shown} and {} more", n - 5),
        _ => shown,
    }
}

/// Sorted shard numbers as ranges: `0-3, 7, 9-10`.
pub fn ranges(shards: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < shards.len() {
        let start = shards[i];
        let mut end = start;
        while i + 1 < shards.len() && shards[i + 1] == end + 1 {
            i += 1;
            end = shards[i];
        }
        out.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    out.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::report::Status;

    fn facts(count: Option<u32>, held: &[(u32, &str)], members: &[&str]) -> ShardFacts {
        ShardFacts {
            count,
            holders: held.iter().map(|(s, h)| (*s, (*h).to_owned())).collect(),
            members: members.iter().map(|m| (*m).to_owned()).collect(),
        }
    }

    #[test]
    fn every_shard_held_is_ok() {
        let v = verdict(
            &Ok(facts(
                Some(4),
                &[(0, "d0"), (1, "d1"), (2, "d0"), (3, "d1")],
                &["d0", "d1"],
            )),
            "herald-system",
        );
        assert_eq!(v.status, Status::Ok);
        assert_eq!(v.message, "all 4 shards held, by 2 dispatchers (d0, d1)");
    }

    #[test]
    fn unheld_shards_are_named_with_the_likely_cause() {
        let none = verdict(&Ok(facts(Some(16), &[], &[])), "herald-system");
        assert_eq!(none.status, Status::Fail);
        assert!(
            none.message
                .starts_with("16 of 16 shards without a live holder (0-15)"),
            "{none:?}"
        );
        assert!(none.message.contains("no dispatcher is alive"));

        let some = verdict(
            &Ok(facts(Some(4), &[(0, "d0"), (2, "d0")], &["d0"])),
            "herald-system",
        );
        assert!(
            some.message
                .starts_with("2 of 4 shards without a live holder (1, 3)"),
            "{some:?}"
        );
        assert!(
            some.message
                .contains("dispatcher d0 is alive but does not take them"),
            "{some:?}"
        );
    }

    #[test]
    fn no_recorded_count_or_an_unreadable_bucket_fails() {
        let v = verdict(&Ok(facts(None, &[], &[])), "herald-system");
        assert!(v.message.starts_with("no shard count recorded"));
        let v = verdict(&Err("timed out".into()), "herald-system");
        assert_eq!(v.message, "cannot read the shard leases: timed out");
    }

    #[test]
    fn shard_ranges_read_short() {
        assert_eq!(ranges(&[0, 1, 2, 3, 7, 9, 10]), "0-3, 7, 9-10");
        assert_eq!(ranges(&[5]), "5");
        assert_eq!(ranges(&[]), "");
    }
}
