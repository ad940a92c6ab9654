use super::*;

fn config(name: &str, types: &[&str]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "namespace": "shop", "name": name, "uid": "u1", "generation": 1,
        "url": "https://hooks.example.com/", "eventTypes": types, "secret": "s",
        "delivery": {}, "shard": 0
    }))
    .unwrap()
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
