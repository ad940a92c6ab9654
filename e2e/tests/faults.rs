//! Fault injection works: a nats-server restart keeps JetStream data, and an API server
//! blackout cuts the Kubernetes API for a while. These tests run in an environment of
//! their own ([`private_env`]) so they never disturb tests sharing the main one.

use std::time::Duration;

use async_nats::jetstream::{self, consumer::pull, stream};
use futures::StreamExt;
use herald_core::v1alpha1::WebhookEndpoint;
use herald_e2e::{TestContext, eventually, fault_lock, private_env, unique_name};

#[tokio::test]
async fn jetstream_stores_delivers_and_survives_a_nats_restart() {
    let _faults = fault_lock().await;
    let ctx = TestContext::new_in(private_env(), "nats").await;
    let js = jetstream::new(ctx.nats.clone());
    let name = unique_name("E2E").replace('-', "_");
    let subject = format!("e2e.{name}.>");
    let stream = js
        .create_stream(stream::Config {
            name: name.clone(),
            subjects: vec![subject],
            storage: stream::StorageType::File,
            ..Default::default()
        })
        .await
        .unwrap();
    for i in 0..3 {
        js.publish(format!("e2e.{name}.msg"), format!("m{i}").into())
            .await
            .unwrap()
            .await
            .unwrap();
    }
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("reader".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut batch = consumer.fetch().max_messages(1).messages().await.unwrap();
    let first = batch.next().await.unwrap().unwrap();
    assert_eq!(&first.payload[..], b"m0");
    first.ack().await.unwrap();

    private_env().restart_nats();

    // The client reconnects by itself; the stream, the unacked messages and the consumer's
    // position are still there.
    let payloads = eventually("messages after restart", Duration::from_secs(30), || {
        let js = js.clone();
        let name = name.clone();
        async move {
            let stream = js.get_stream(&name).await.ok()?;
            let consumer = async {
                let c = stream.get_consumer::<pull::Config>("reader").await.ok()?;
                c.fetch().max_messages(2).messages().await.ok()
            }
            .await?;
            let msgs: Vec<_> = consumer.collect().await;
            let mut out = Vec::new();
            for msg in msgs {
                let msg = msg.ok()?;
                out.push(String::from_utf8_lossy(&msg.payload).into_owned());
                msg.ack().await.ok()?;
            }
            (out.len() == 2).then_some(out)
        }
    })
    .await;
    assert_eq!(payloads, ["m1", "m2"]);
    ctx.cleanup().await;
}

#[tokio::test]
async fn an_apiserver_blackout_makes_the_api_unreachable_then_returns() {
    let _faults = fault_lock().await;
    let ctx = TestContext::new_in(private_env(), "blackout").await;
    let api = ctx.api::<WebhookEndpoint>();
    api.list(&Default::default()).await.unwrap();
    private_env().blackout_apiserver(3.0);
    let during = tokio::time::timeout(Duration::from_secs(2), api.list(&Default::default())).await;
    assert!(
        !matches!(during, Ok(Ok(_))),
        "the API answered during the blackout"
    );
    eventually("the API back", Duration::from_secs(30), || async {
        api.list(&Default::default()).await.ok()
    })
    .await;
    ctx.cleanup().await;
}
