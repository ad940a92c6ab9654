//! A reflector store that any number of tasks can wait on until its first list is in.
//!
//! kube-runtime's `Store::wait_until_ready` keeps one waker: its `DelayedInit` holds a
//! single `oneshot::Receiver`, and each poll replaces the waker registered before. Two
//! tasks waiting on one store race, and the one that polled first is never woken.
//! Herald's `SigningSecret` store is awaited by the `SigningSecret` controller (kube's
//! applier holds its runner until the store is ready) and was awaited by endpoint
//! reconciles, in another task: when the store's first list came late (the Secrets watch
//! of the same controller backing off on a 403), an endpoint reconcile could wait
//! forever and its endpoint never became Ready (CI's `chart.rs`
//! `operator_with_the_charts_rbac_reconciles`).
//!
//! Contract: [`listed`] passes a reflected watch stream through unchanged and sets the
//! signal when the first `InitDone` goes by — after the reflector applied it, so the store
//! holds the whole first list by then; [`Listed::ready`] resolves for every waiter once
//! the signal is set (a `tokio::sync::watch`), and stays resolved through relists. Only
//! the `SigningSecret` controller's own applier waits on kube's readiness.

use futures::{Stream, StreamExt};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use tokio::sync::watch;

/// The store's readers' view: the store, and whether its first list is in.
pub struct Listed<K: kube::Resource<DynamicType = ()> + Clone + 'static> {
    pub store: Store<K>,
    ready: watch::Receiver<bool>,
}

impl<K: kube::Resource<DynamicType = ()> + Clone + 'static> Clone for Listed<K> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            ready: self.ready.clone(),
        }
    }
}

/// The signal was dropped before the first list: the watch stream is gone.
#[derive(Debug, thiserror::Error)]
#[error("the watch stream ended before its first list")]
pub struct StreamGone;

impl<K: kube::Resource<DynamicType = ()> + Clone + 'static> Listed<K> {
    /// Waits until the store's first list is in. Any number of tasks may wait at once.
    pub async fn ready(&self) -> Result<(), StreamGone> {
        let mut ready = self.ready.clone();
        ready
            .wait_for(|listed| *listed)
            .await
            .map_err(|_| StreamGone)?;
        Ok(())
    }
}

/// `events` (already reflected into `store`) unchanged, and the store's readers' view that
/// becomes ready when the first list has gone through.
pub fn listed<K, S>(
    store: Store<K>,
    events: S,
) -> (Listed<K>, impl Stream<Item = S::Item> + Send + 'static)
where
    K: kube::Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    let (tx, ready) = watch::channel(false);
    let events = events.inspect(move |event| {
        if matches!(event, Ok(watcher::Event::InitDone)) && !*tx.borrow() {
            tx.send_replace(true);
        }
    });
    (Listed { store, ready }, events)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::reflector;

    fn config_map(name: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some("shop".into());
        cm
    }

    /// The race kube's readiness loses: several tasks wait before the first list, each
    /// polled at least once, and every one of them goes on once the list is in.
    #[tokio::test]
    async fn every_waiter_goes_on_after_the_first_list() {
        let (reader, writer) = reflector::store::<ConfigMap>();
        let (feed, events) = futures::channel::mpsc::unbounded();
        let events = events.reflect(writer);
        let (listed, events) = listed(reader, events);
        let waiters: Vec<_> = (0..4)
            .map(|_| {
                let listed = listed.clone();
                tokio::spawn(async move {
                    listed.ready().await.expect("ready");
                    listed.store.state().len()
                })
            })
            .collect();
        tokio::task::yield_now().await;
        let mut events = std::pin::pin!(events);
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(config_map("a")),
            watcher::Event::InitApply(config_map("b")),
        ] {
            feed.unbounded_send(Ok(event)).unwrap();
            events.next().await.unwrap().unwrap();
        }
        tokio::task::yield_now().await;
        assert!(
            waiters.iter().all(|w| !w.is_finished()),
            "ready before InitDone"
        );
        feed.unbounded_send(Ok(watcher::Event::InitDone)).unwrap();
        events.next().await.unwrap().unwrap();
        for waiter in waiters {
            let seen = tokio::time::timeout(Duration::from_secs(5), waiter)
                .await
                .expect("a waiter was never woken")
                .unwrap();
            assert_eq!(seen, 2, "the store holds the whole first list");
        }
        // A relist later does not make it unready.
        feed.unbounded_send(Ok(watcher::Event::Init)).unwrap();
        events.next().await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(1), listed.ready())
            .await
            .expect("still ready during a relist")
            .unwrap();
    }

    #[tokio::test]
    async fn a_stream_gone_before_its_list_is_an_error() {
        let (reader, _writer) = reflector::store::<ConfigMap>();
        let (listed, events) = listed(
            reader,
            futures::stream::empty::<Result<watcher::Event<ConfigMap>, watcher::Error>>(),
        );
        drop(events);
        assert!(listed.ready().await.is_err());
    }
}
