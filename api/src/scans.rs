//! How many reads of the delivery log run at once. One read is bounded
//! (`--max-scan-records`, `--max-scan-seconds`); these bound how many: at most
//! `--max-concurrent-scans` in the process, so the memory of all reads together is that
//! many times one read's, and at most [`PER_NAMESPACE`] of one namespace's, running or
//! waiting, so one tenant's burst of lists cannot take every slot from the others.
//!
//! A namespace over its share is answered 429 at once; a read that finds every slot
//! taken waits for one up to its time bound, then 503 — both with `Retry-After`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// Reads of one namespace's that may run or wait at once.
pub const PER_NAMESPACE: usize = 2;

/// The process's read slots and who holds them.
pub struct Scans {
    slots: Arc<Semaphore>,
    /// Reads running or waiting, by namespace; an entry exists only while it is above 0.
    by_namespace: Mutex<HashMap<String, usize>>,
}

/// A read's slot, given back when dropped.
pub struct ScanPermit {
    scans: Arc<Scans>,
    namespace: String,
    _slot: OwnedSemaphorePermit,
}

impl std::fmt::Debug for ScanPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScanPermit")
            .field("namespace", &self.namespace)
            .finish()
    }
}

impl Drop for ScanPermit {
    fn drop(&mut self) {
        self.scans.release(&self.namespace);
    }
}

impl Scans {
    pub fn new(slots: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(slots.max(1))),
            by_namespace: Mutex::new(HashMap::new()),
        })
    }

    fn release(&self, namespace: &str) {
        let mut held = self.by_namespace.lock().expect("scans lock");
        if let Some(n) = held.get_mut(namespace) {
            *n -= 1;
            if *n == 0 {
                held.remove(namespace);
            }
        }
    }

    /// A slot for a read of `namespace`'s log, waiting up to `wait` for one.
    pub async fn acquire(
        self: &Arc<Self>,
        namespace: &str,
        wait: Duration,
    ) -> Result<ScanPermit, ApiError> {
        {
            let mut held = self.by_namespace.lock().expect("scans lock");
            let n = held.entry(namespace.to_owned()).or_default();
            if *n >= PER_NAMESPACE {
                return Err(busy(
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyReads",
                    format!(
                        "namespace {namespace} already has {PER_NAMESPACE} reads of the delivery log under way; wait for them"
                    ),
                ));
            }
            *n += 1;
        }
        let slot = tokio::time::timeout(wait, self.slots.clone().acquire_owned()).await;
        match slot {
            Ok(Ok(slot)) => Ok(ScanPermit {
                scans: self.clone(),
                namespace: namespace.to_owned(),
                _slot: slot,
            }),
            _ => {
                self.release(namespace);
                Err(busy(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "Busy",
                    "every read of the delivery log this API runs at once is taken; try again",
                ))
            }
        }
    }

    /// Namespaces with reads running or waiting.
    pub fn namespaces(&self) -> usize {
        self.by_namespace.lock().expect("scans lock").len()
    }
}

fn busy(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(status, code, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_namespace_gets_its_share_and_the_process_its_slots() {
        let scans = Scans::new(3);
        let wait = Duration::from_millis(20);
        let a1 = scans.acquire("a", wait).await.unwrap();
        let a2 = scans.acquire("a", wait).await.unwrap();
        // A third of a's is refused at once, and leaves a's count alone.
        let refused = scans.acquire("a", wait).await.unwrap_err();
        assert_eq!(
            (refused.status.as_u16(), refused.code),
            (429, "TooManyReads")
        );
        assert_eq!(refused.retry_after, Some(1));
        // b gets the last slot; c finds none within its wait.
        let b1 = scans.acquire("b", wait).await.unwrap();
        let full = scans.acquire("c", wait).await.unwrap_err();
        assert_eq!((full.status.as_u16(), full.code), (503, "Busy"));
        assert_eq!(scans.namespaces(), 2, "c's wait left nothing behind");
        drop(a1);
        let c1 = scans.acquire("c", wait).await.unwrap();
        assert!(scans.acquire("a", wait).await.is_err(), "no slot is free");
        drop((a2, b1, c1));
        assert_eq!(scans.namespaces(), 0);
        let again = scans.acquire("a", wait).await;
        assert!(again.is_ok());
    }
}
