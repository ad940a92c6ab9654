use super::*;

fn config(name: &str, types: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "namespace": "shop", "name": name, "uid": "u1", "generation": 1,
        "url": "https://hooks.example.com/", "eventTypes": types, "secret": "s",
        "delivery": {}, "shard": 0
    }))
    .unwrap()
}

/// The names of the endpoints of `namespace` that `event_type` matches, sorted; `None`
/// when the namespace has no endpoints.
fn matched(index: &Index, namespace: &str, event_type: &str) -> Option<Vec<String>> {
    index.matching(namespace, event_type).map(|found| {
        let mut names: Vec<String> = found.iter().map(|e| e.config.name.clone()).collect();
        names.sort();
        names
    })
}

#[test]
fn endpoints_are_indexed_by_namespace_and_removed_on_delete() {
    let index = Index::default();
    let mut changes = index.subscribe();
    index.apply("ep.shop.orders", Some(&config("orders", &["order.*"])));
    index.apply("ep.shop.all", Some(&config("all", &["*"])));
    index.apply("ep.shop.paid", Some(&config("paid", &["invoice.paid"])));
    assert_eq!(index.matching("shop", "order.created").unwrap().len(), 2);
    assert_eq!(index.matching("shop", "invoice.paid").unwrap().len(), 2);
    assert_eq!(index.matching("shop", "invoice.void").unwrap().len(), 1);
    // An updated config with the same types stays matched (regression: the update
    // used to unindex the endpoint).
    index.apply("ep.shop.paid", Some(&config("paid", &["invoice.paid"])));
    assert_eq!(index.matching("shop", "invoice.paid").unwrap().len(), 2);
    index.apply("ep.shop.all", Some(&config("all", &["*"])));
    assert_eq!(index.matching("shop", "invoice.void").unwrap().len(), 1);
    // A changed config replaces the old patterns.
    index.apply("ep.shop.paid", Some(&config("paid", &["invoice.void"])));
    assert_eq!(index.matching("shop", "invoice.paid").unwrap().len(), 1);
    assert_eq!(index.matching("shop", "invoice.void").unwrap().len(), 2);
    index.apply("ep.shop.orders", None);
    // Operational events only by patterns that name them: not by a lone `*`.
    index.apply("ep.shop.ops", Some(&config("ops", &["herald.*"])));
    let names = |ty: &str| matched(&index, "shop", ty).unwrap();
    assert_eq!(names("herald.endpoint.disabled"), ["ops"]);
    assert_eq!(names("invoice.void"), ["all", "paid"]);
    index.apply("ep.shop.ops", None);
    index.apply("ep.shop.all", None);
    index.apply("ep.shop.paid", None);
    assert!(index.matching("shop", "order.created").is_none());
    assert!(matches!(changes.try_recv(), Ok(Change::Endpoint(_))));
}

#[test]
fn identical_delivery_policies_are_shared() {
    let index = Index::default();
    index.apply("ep.shop.a", Some(&config("a", &["x"])));
    index.apply("ep.shop.b", Some(&config("b", &["y"])));
    let a = index.endpoint(&EndpointKey::new("shop", "a")).unwrap();
    let b = index.endpoint(&EndpointKey::new("shop", "b")).unwrap();
    assert!(Arc::ptr_eq(&a.config.delivery, &b.config.delivery));
}

#[test]
fn invalid_entries_are_skipped_not_fatal() {
    let index = Index::default();
    index.apply("ep.shop.bad", Some(b"{not json"));
    index.apply("key.shop.s", Some(br#"{"keys":["whsec_short"]}"#));
    assert!(index.endpoint(&EndpointKey::new("shop", "bad")).is_none());
    assert!(index.keys("shop", "s").is_none());
    index.apply(
        "key.shop.s",
        Some(br#"{"keys":["whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"]}"#),
    );
    assert_eq!(index.keys("shop", "s").unwrap().len(), 1);
}

fn config_in(namespace: &str, name: &str, types: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "namespace": namespace, "name": name, "uid": name, "generation": 1,
        "url": "https://hooks.example.com/", "eventTypes": types, "secret": "s",
        "delivery": {}, "shard": 0
    }))
    .unwrap()
}

#[test]
fn an_endpoint_whose_patterns_overlap_is_matched_once() {
    let index = Index::default();
    let types = ["order.created", "order.*", "*", "*.created", "order.*.*"].map(String::from);
    index.apply("ep.shop.all", Some(&config_in("shop", "all", &types)));
    index.apply("ep.shop.one", Some(&config_in("shop", "one", &types[..1])));
    let keys = |ty: &str| matched(&index, "shop", ty).unwrap();
    assert_eq!(keys("order.created"), ["all", "one"]);
    assert_eq!(keys("order.item.added"), ["all"]);
    assert_eq!(keys("order"), ["all"]);
    assert!(index.matching("other", "order").is_none());
}

fn on_shard(namespace: &str, name: &str, shard: u32) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "namespace": namespace, "name": name, "uid": name, "generation": 1,
        "url": "https://hooks.example.com/", "eventTypes": ["*"], "secret": "s",
        "delivery": {}, "shard": shard
    }))
    .unwrap()
}

#[tokio::test]
async fn a_scoped_index_holds_what_its_claims_need_once_a_pass_read_it() {
    use herald_core::dataplane::partition_of;
    let shards = 4;
    let index = Index::default();
    index.scope_to(shards);
    let (_stop_tx, mut stop) = watch::channel(false);
    // Two namespaces: one in partition 1, one elsewhere.
    let names = |p: bool| {
        (0..)
            .map(|i| format!("t{i}"))
            .find(move |ns| (partition_of(ns, shards) == 1) == p)
            .unwrap()
    };
    let (mine, other) = (names(true), names(false));
    let apply_all = |index: &Index| {
        index.apply(
            &format!("ep.{other}.on1"),
            Some(&on_shard(&other, "on1", 1)),
        );
        index.apply(
            &format!("ep.{other}.on2"),
            Some(&on_shard(&other, "on2", 2)),
        );
        index.apply(&format!("ep.{mine}.on3"), Some(&on_shard(&mine, "on3", 3)));
    };
    // The first pass, nothing claimed: only key sets and policies would be kept.
    apply_all(&index);
    index.mark_read(1);
    assert!(index.is_loaded());
    assert_eq!(index.endpoint_count(), 0);

    // Shard 1 claimed: the claim waits for a pass that reads with it.
    let claiming = tokio::spawn({
        let (index, mut stop) = (index.clone(), stop.clone());
        async move { index.cover(Claim::Shard(1), &mut stop).await }
    });
    tokio::task::yield_now().await;
    assert!(
        !claiming.is_finished(),
        "covered before a pass read the shard"
    );
    let mut changes = index.subscribe();
    apply_all(&index);
    index.mark_read(2);
    let cover = claiming.await.unwrap().expect("covered");
    // Shard 1's endpoint, and partition 1's namespace's on shard 3; not shard 2's.
    let held = |name: &str, ns: &str| index.endpoint(&EndpointKey::new(ns, name)).is_some();
    assert!(held("on1", &other) && held("on3", &mine) && !held("on2", &other));
    assert_eq!(index.matching(&mine, "x").unwrap().len(), 1);
    // Read again by the next pass: no change announced.
    while changes.try_recv().is_ok() {}
    apply_all(&index);
    assert!(changes.try_recv().is_err(), "an unchanged entry announced");

    // A second claim on the same shard needs no pass; giving one up keeps the shard.
    let again = index
        .cover(Claim::Shard(1), &mut stop)
        .await
        .expect("covered");
    drop(again);
    assert_eq!(index.endpoint_count(), 2);
    // The last claim given up: its endpoints and its namespaces' are dropped.
    drop(cover);
    assert_eq!(index.endpoint_count(), 0);
    assert!(index.matching(&mine, "x").is_none());
}

mod against_a_scan {
    use super::*;
    use proptest::prelude::*;

    const NAMESPACES: [&str; 2] = ["shop", "bank"];
    const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];

    fn pattern() -> impl Strategy<Value = String> {
        // `herald`: operational event types, which a first-segment wildcard must not match.
        proptest::collection::vec(
            prop_oneof!["x", "y", "z", "herald", Just("*".to_owned())],
            1..4,
        )
        .prop_map(|segments| segments.join("."))
    }

    /// Every event type over the segments the patterns use, up to four deep.
    fn event_types() -> Vec<String> {
        let mut all: Vec<String> = vec![String::new()];
        let mut out = Vec::new();
        for _ in 0..4 {
            all = all
                .iter()
                .flat_map(|prefix| {
                    ["x", "y", "z", "w", "herald"].map(|s| {
                        if prefix.is_empty() {
                            s.to_owned()
                        } else {
                            format!("{prefix}.{s}")
                        }
                    })
                })
                .collect();
            out.extend(all.iter().cloned());
        }
        out
    }

    /// One change: an endpoint put with these patterns, or deleted (`None`).
    type Step = (usize, usize, Option<Vec<String>>);

    fn step() -> impl Strategy<Value = Step> {
        (
            0..NAMESPACES.len(),
            0..NAMES.len(),
            proptest::option::weighted(0.8, proptest::collection::vec(pattern(), 1..5)),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        // The index answers what a scan of every endpoint with `Endpoint::matches`
        // answers, after any sequence of puts, pattern changes and deletions.
        #[test]
        fn matching_equals_a_scan_over_all_endpoints(
            steps in proptest::collection::vec(step(), 1..40)
        ) {
            let index = Index::default();
            for (ns, name, types) in &steps {
                let (ns, name) = (NAMESPACES[*ns], NAMES[*name]);
                let value = types.as_ref().map(|t| config_in(ns, name, t));
                index.apply(&format!("ep.{ns}.{name}"), value.as_deref());
            }
            for ns in NAMESPACES {
                let endpoints: Vec<Arc<Endpoint>> = NAMES
                    .iter()
                    .filter_map(|name| index.endpoint(&EndpointKey::new(ns, name)))
                    .collect();
                for ty in event_types() {
                    let got = matched(&index, ns, &ty);
                    let expected = (!endpoints.is_empty()).then(|| {
                        endpoints
                            .iter()
                            .filter(|e| e.matches(&ty))
                            .map(|e| e.config.name.clone())
                            .collect::<Vec<_>>()
                    });
                    prop_assert_eq!(got, expected, "{} {}", ns, ty);
                }
            }
        }
    }
}

/// An endpoint with a header from a Secret and a client certificate, as the operator
/// publishes it: the `ep.` entry without the values, the `cred.` entry with them.
fn with_credentials(token: &str, shard: u32) -> (Vec<u8>, Vec<u8>) {
    let mut config: EndpointConfig = serde_json::from_value(serde_json::json!({
        "namespace": "shop", "name": "billing", "uid": "u1", "generation": 1,
        "url": "https://hooks.example.com/", "eventTypes": ["*"], "secret": "s",
        "delivery": {}, "shard": shard,
        "headers": [{"name": "Authorization", "value": token,
                     "valueFrom": {"secretKeyRef": {"name": "auth", "key": "token"}}}]
    }))
    .unwrap();
    config.tls = Some(Arc::new(herald_core::dataplane::TlsMaterial {
        client_cert: Some("CERT".into()),
        client_key: Some("KEY".into()),
        ca: None,
    }));
    let credentials = Credentials::split(&mut config).unwrap();
    (
        serde_json::to_vec(&config).unwrap(),
        serde_json::to_vec(&credentials).unwrap(),
    )
}

#[test]
fn an_endpoint_is_held_until_its_credentials_arrive_and_follows_their_changes() {
    let index = Index::default();
    let key = EndpointKey::new("shop", "billing");
    let (entry, credentials) = with_credentials("Bearer one", 0);
    index.apply("ep.shop.billing", Some(&entry));
    let held = index.endpoint(&key).unwrap();
    assert_eq!(
        held.config.held.as_ref().map(|h| h.reason.as_str()),
        Some(credentials::CREDENTIALS_PENDING)
    );
    assert_eq!(
        held.config.headers[0].value, "",
        "no value without credentials"
    );
    let mut changes = index.subscribe();
    index.apply("cred.shop.billing", Some(&credentials));
    assert!(matches!(changes.try_recv(), Ok(Change::Endpoint(_))));
    let ready = index.endpoint(&key).unwrap();
    assert_eq!(ready.config.held, None);
    assert_eq!(ready.config.headers[0].value, "Bearer one");
    assert_eq!(
        ready.config.tls.as_ref().unwrap().client_key.as_deref(),
        Some("KEY")
    );
    // A rotated token: the new credentials come first, then the entry naming them.
    let (entry, credentials) = with_credentials("Bearer two", 0);
    index.apply("cred.shop.billing", Some(&credentials));
    let between = index.endpoint(&key).unwrap();
    assert_eq!(
        between.config.held.as_ref().map(|h| h.reason.as_str()),
        Some(credentials::CREDENTIALS_PENDING),
        "the old entry does not take the new credentials"
    );
    index.apply("ep.shop.billing", Some(&entry));
    let rotated = index.endpoint(&key).unwrap();
    assert_eq!(rotated.config.held, None);
    assert_eq!(rotated.config.headers[0].value, "Bearer two");
    // Deleted: nothing kept.
    index.apply("ep.shop.billing", None);
    index.apply("cred.shop.billing", None);
    let inner = index.inner.read().unwrap();
    assert!(inner.credentials.is_empty() && inner.needing.is_empty());
}

#[test]
fn a_replica_keeps_only_the_credentials_of_the_shards_it_delivers() {
    let index = Index::default();
    index.scope_to(4);
    let (_, theirs) = with_credentials("Bearer x", 2);
    index.apply("cred.shop.billing", Some(&theirs));
    assert!(index.inner.read().unwrap().credentials.is_empty());
    index
        .inner
        .write()
        .unwrap()
        .scope
        .add(scope::Claim::Shard(2));
    index.apply("cred.shop.billing", Some(&theirs));
    assert_eq!(index.inner.read().unwrap().credentials.len(), 1);
}
