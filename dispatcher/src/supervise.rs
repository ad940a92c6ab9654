//! Supervision and readiness. Every long-running task of the dispatcher (fan-out, the
//! configuration watch, the lease loop) runs under [`supervise`]: when it ends without
//! being asked to stop, the error is logged, its part is reported not ready on
//! `/readyz`, and it is started again after a back-off. A task reports itself ready
//! through [`Readiness::set`] once it really works (the configuration snapshot loaded,
//! the consumer created).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Which parts of the dispatcher work.
#[derive(Debug, Default)]
pub struct Readiness {
    parts: Mutex<BTreeMap<&'static str, bool>>,
}

impl Readiness {
    /// Readiness of `parts`, none of them ready yet.
    pub fn new(parts: &[&'static str]) -> Arc<Self> {
        Arc::new(Self {
            parts: Mutex::new(parts.iter().map(|p| (*p, false)).collect()),
        })
    }

    pub fn set(&self, part: &'static str, ready: bool) {
        self.lock().insert(part, ready);
    }

    /// Ready when every part is.
    pub fn is_ready(&self) -> bool {
        self.lock().values().all(|ready| *ready)
    }

    /// The parts that are not ready, for `/readyz`.
    pub fn not_ready(&self) -> Vec<&'static str> {
        self.lock()
            .iter()
            .filter(|(_, ready)| !**ready)
            .map(|(part, _)| *part)
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, bool>> {
        // Every operation is one insert or read: a poisoned map is still consistent.
        self.parts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Exponential back-off with jitter between restarts.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            next: min,
            min,
            max,
        }
    }

    /// The next delay: the current one with ±20 % jitter; doubles for the time after.
    pub fn next_delay(&mut self, jitter: f64) -> Duration {
        let delay = self.next.mul_f64(0.8 + 0.4 * jitter.clamp(0.0, 1.0));
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Runs `attempt()` up to `tries` times with back-off (0.5 s doubling) until it
/// succeeds: for writes that must survive a short NATS outage (attempt records, saved
/// endpoint state). Logs each failure; returns the last error.
pub async fn with_retries<F, Fut, T, E>(what: &str, tries: u32, mut attempt: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    E: std::fmt::Display,
{
    let mut backoff = Backoff::new(Duration::from_millis(500), Duration::from_secs(10));
    let mut tried = 0;
    loop {
        tried += 1;
        match attempt().await {
            Ok(value) => return Ok(value),
            Err(error) if tried >= tries => {
                tracing::warn!(%error, what, tried, "giving up");
                return Err(error);
            }
            Err(error) => {
                tracing::debug!(%error, what, tried, "failed; retrying");
                tokio::time::sleep(backoff.next_delay(fastrand::f64())).await;
            }
        }
    }
}

/// Runs `start()` until `stop` becomes true, restarting it whenever it ends on its own.
/// The task must watch `stop` itself and return when it is set (so it can stop
/// gracefully); `supervise` returns then.
pub async fn supervise<F, Fut, E>(
    part: &'static str,
    readiness: Arc<Readiness>,
    mut stop: watch::Receiver<bool>,
    mut start: F,
) where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
    loop {
        let started = Instant::now();
        let outcome = start().await;
        // Asked to stop, or the owner gone (the sender dropped): not restarted.
        if *stop.borrow() || stop.has_changed().is_err() {
            return;
        }
        readiness.set(part, false);
        match outcome {
            Ok(()) => tracing::error!(part, "task ended unexpectedly; restarting"),
            Err(error) => tracing::error!(part, %error, "task failed; restarting"),
        }
        if started.elapsed() > Duration::from_secs(60) {
            backoff.reset();
        }
        let delay = backoff.next_delay(fastrand::f64());
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// A task that is aborted when this handle is dropped, however its owner ends: returned,
/// failed, or itself aborted (a plain `JoinHandle` dropped leaves its task running).
pub struct Owned<T>(Option<tokio::task::JoinHandle<T>>);

impl<T> Owned<T> {
    pub fn new(task: tokio::task::JoinHandle<T>) -> Self {
        Self(Some(task))
    }

    /// The handle, no longer aborted on drop.
    pub fn release(mut self) -> tokio::task::JoinHandle<T> {
        self.0.take().expect("an owned task")
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Dropping the owner's handle stops the task (a dropped `JoinHandle` would not):
    /// what keeps a replay's worker from outliving its shard.
    #[tokio::test]
    async fn an_owned_task_stops_when_its_handle_is_dropped() {
        let alive = Arc::new(());
        let held = alive.clone();
        let owned = Owned::new(tokio::spawn(async move {
            let _held = held;
            std::future::pending::<()>().await;
        }));
        tokio::task::yield_now().await;
        assert_eq!(Arc::strong_count(&alive), 2, "the task runs");
        drop(owned);
        for _ in 0..100 {
            if Arc::strong_count(&alive) == 1 {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(Arc::strong_count(&alive), 1, "the task was aborted");

        let released = Owned::new(tokio::spawn(async { 7 })).release();
        assert_eq!(
            released.await.unwrap(),
            7,
            "a released task is the caller's"
        );
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(4));
        let delays: Vec<u64> = (0..4).map(|_| b.next_delay(0.5).as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 4]);
        b.reset();
        assert_eq!(b.next_delay(0.5), Duration::from_secs(1));
        assert!(b.next_delay(1.0) <= Duration::from_millis(2400));
    }

    #[test]
    fn ready_only_when_every_part_is() {
        let r = Readiness::new(&["config", "fanout"]);
        assert!(!r.is_ready());
        r.set("config", true);
        assert_eq!(r.not_ready(), ["fanout"]);
        r.set("fanout", true);
        assert!(r.is_ready());
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ends_is_restarted_and_reported_until_it_works() {
        let readiness = Readiness::new(&["task"]);
        let (stop_tx, stop) = watch::channel(false);
        let runs = Arc::new(AtomicU32::new(0));
        let supervised = {
            let (readiness, runs, stop) = (readiness.clone(), runs.clone(), stop.clone());
            let r = readiness.clone();
            let task_stop = stop.clone();
            tokio::spawn(supervise("task", readiness, stop, move || {
                let (runs, r, mut stop) = (runs.clone(), r.clone(), task_stop.clone());
                async move {
                    // Fails twice, then works until asked to stop.
                    if runs.fetch_add(1, Ordering::SeqCst) < 2 {
                        return Err("broken");
                    }
                    r.set("task", true);
                    let _ = stop.wait_for(|s| *s).await;
                    Ok(())
                }
            }))
        };
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "restarted after each failure"
        );
        assert!(readiness.is_ready());
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(1), supervised)
            .await
            .expect("stops when asked")
            .unwrap();
        let _ = stop;
    }
}
