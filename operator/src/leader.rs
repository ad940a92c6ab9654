//! Leader election with a coordination.k8s.io/v1 Lease, so that of several operator
//! replicas only one reconciles.
//!
//! Contract: the same algorithm as client-go's `leaderelection`, reduced to what Herald
//! needs. Writes are compare-and-swap (`replace` with the `resourceVersion` read), so two
//! candidates cannot both win. A lease is considered expired when its record has not
//! changed for `leaseDurationSeconds` *as observed by this process's monotonic clock*,
//! never by comparing `renewTime` with our wall clock, so clock skew between nodes
//! cannot make two leaders.
//!
//! The leader keeps leading through failed renewals for as long as nobody else can have
//! taken the Lease: until [`Elector::valid_until`], the start of its last successful
//! write plus the duration it wrote (a standby measures from when it *saw* that write,
//! which is later). [`lead`] retries renewals with back-off until then and steps down a
//! margin before; [`stand_by`] acquires. The caller alternates the two inside one
//! process: losing the Lease is a return to standby, not an exit.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading or writing Lease {name}: {source}")]
    Kube {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// One candidate for the leadership.
pub struct Elector {
    api: Api<Lease>,
    name: String,
    identity: String,
    duration: Duration,
    /// The lease record last seen and when it was first seen: the base of expiry.
    observed: Option<(LeaseSpec, Instant)>,
    /// While we hold the Lease: until when no one else can acquire it.
    valid_until: Option<Instant>,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        duration: Duration,
    ) -> Self {
        Self {
            api: Api::namespaced(client, namespace),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration,
            observed: None,
            valid_until: None,
        }
    }

    /// How long the Lease lasts without renewal.
    pub fn duration(&self) -> Duration {
        self.written_duration()
    }

    /// Until when the Lease is ours for certain (`None`: it is not ours).
    pub fn valid_until(&self) -> Option<Instant> {
        self.valid_until
    }

    /// The duration written into the Lease, whole seconds as the API has it.
    fn written_duration(&self) -> Duration {
        Duration::from_secs(self.duration.as_secs().max(1))
    }

    /// Records a successful write begun at `started`.
    fn won(&mut self, started: Instant, record: LeaseSpec) -> bool {
        self.observe(record);
        self.valid_until = Some(started + self.written_duration());
        true
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    fn spec(&self, previous: Option<&LeaseSpec>) -> LeaseSpec {
        let now = MicroTime(Timestamp::now());
        let ours = previous.is_some_and(|p| p.holder_identity.as_deref() == Some(&self.identity));
        let transitions = previous.and_then(|p| p.lease_transitions).unwrap_or(0);
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.written_duration().as_secs() as i32),
            acquire_time: if ours {
                previous.and_then(|p| p.acquire_time.clone())
            } else {
                Some(now.clone())
            },
            renew_time: Some(now),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..Default::default()
        }
    }

    /// Acquires the lease when it is free or expired, renews it when we hold it. Returns
    /// whether we hold it now. A lost compare-and-swap is `Ok(false)`, not an error.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, Error> {
        // Before any request: our write happens later, so others see it later.
        let started = Instant::now();
        let err = |source| Error::Kube {
            name: self.name.clone(),
            source,
        };
        let lease = match self.api.get_opt(&self.name).await.map_err(err)? {
            Some(lease) => lease,
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(self.spec(None)),
                };
                return match self.api.create(&PostParams::default(), &lease).await {
                    Ok(created) => Ok(self.won(started, created.spec.unwrap_or_default())),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                    Err(e) => Err(Error::Kube {
                        name: self.name.clone(),
                        source: e,
                    }),
                };
            }
        };
        let record = lease.spec.clone().unwrap_or_default();
        self.observe(record.clone());
        let holder = record.holder_identity.as_deref().filter(|h| !h.is_empty());
        let ours = holder == Some(self.identity.as_str());
        if !ours && holder.is_some() && !self.expired(&record) {
            self.valid_until = None;
            return Ok(false);
        }
        let mut next = lease.clone();
        next.spec = Some(self.spec(Some(&record)));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(written) => Ok(self.won(started, written.spec.unwrap_or_default())),
            Err(kube::Error::Api(e)) if e.code == 409 => {
                self.valid_until = None;
                Ok(false)
            }
            Err(e) => Err(Error::Kube {
                name: self.name.clone(),
                source: e,
            }),
        }
    }

    /// Gives the lease up (on graceful shutdown) so a standby takes over at once instead
    /// of after the lease duration.
    pub async fn release(&mut self) -> Result<(), Error> {
        let err = |source| Error::Kube {
            name: self.name.clone(),
            source,
        };
        let Some(mut lease) = self.api.get_opt(&self.name).await.map_err(err)? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(&self.identity) {
            return Ok(());
        }
        self.valid_until = None;
        spec.holder_identity = None;
        spec.acquire_time = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        spec.lease_duration_seconds = Some(1);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(e) => Err(Error::Kube {
                name: self.name.clone(),
                source: e,
            }),
        }
    }

    fn observe(&mut self, record: LeaseSpec) {
        let changed = self
            .observed
            .as_ref()
            .is_none_or(|(seen, _)| *seen != record);
        if changed {
            self.observed = Some((record, Instant::now()));
        }
    }

    fn expired(&self, record: &LeaseSpec) -> bool {
        let duration = record
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(0) as u64))
            .unwrap_or(self.duration);
        self.observed
            .as_ref()
            .is_some_and(|(_, since)| since.elapsed() >= duration)
    }
}

/// How a leadership term ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// `shutdown` resolved.
    Shutdown,
    /// Another replica holds the Lease, or it could not be renewed before it expired.
    Lost,
}

/// Delay before retry number `failures` of a failed Lease request: 250 ms doubling, at
/// most `period`.
pub fn retry_delay(failures: u32, period: Duration) -> Duration {
    Duration::from_millis(250)
        .saturating_mul(1u32 << failures.saturating_sub(1).min(10))
        .min(period)
}

/// Safety margin before the Lease's expiry at which the leader stops its controllers:
/// a tenth of the duration, between 0.5 s and 2 s.
pub fn margin(duration: Duration) -> Duration {
    (duration / 10).clamp(Duration::from_millis(500), Duration::from_secs(2))
}

/// Stands by until the Lease is ours (`true`) or `shutdown` resolves (`false`): retries
/// every `period` while another replica leads, sooner while the API fails.
pub async fn stand_by(
    elector: &mut Elector,
    period: Duration,
    shutdown: impl Future<Output = ()>,
) -> bool {
    tokio::pin!(shutdown);
    let mut failures = 0;
    loop {
        let wait = match elector.try_acquire_or_renew().await {
            Ok(true) => return true,
            Ok(false) => {
                failures = 0;
                period
            }
            Err(error) => {
                failures += 1;
                tracing::warn!(%error, failures, "leader election");
                retry_delay(failures, period)
            }
        };
        tokio::select! {
            _ = &mut shutdown => return false,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Leads: renews every `period` (retrying failures with back-off) until `shutdown`
/// resolves or the Lease is lost. Returns a [`margin`] before the Lease could expire in
/// the eyes of a standby, so the caller can stop its controllers in time.
pub async fn lead(
    elector: &mut Elector,
    period: Duration,
    shutdown: impl Future<Output = ()>,
) -> Ended {
    tokio::pin!(shutdown);
    let margin = margin(elector.duration());
    let mut failures = 0;
    loop {
        let Some(deadline) = elector.valid_until().map(|t| t - margin) else {
            return Ended::Lost;
        };
        let wait = if failures == 0 {
            period
        } else {
            retry_delay(failures, period)
        };
        tokio::select! {
            _ = &mut shutdown => return Ended::Shutdown,
            _ = tokio::time::sleep_until(deadline) => {
                tracing::warn!("the leader Lease could not be renewed before it expires");
                return Ended::Lost;
            }
            _ = tokio::time::sleep(wait) => {}
        }
        let budget = deadline
            .saturating_duration_since(Instant::now())
            .min(period);
        match tokio::time::timeout(budget, elector.try_acquire_or_renew()).await {
            Ok(Ok(true)) => failures = 0,
            Ok(Ok(false)) => {
                tracing::warn!("another replica holds the leader Lease");
                return Ended::Lost;
            }
            Ok(Err(error)) => {
                failures += 1;
                tracing::warn!(%error, failures, "renewing the leader Lease; still leading");
            }
            Err(_) => {
                failures += 1;
                tracing::warn!(
                    failures,
                    "renewing the leader Lease timed out; still leading"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewals_back_off_within_the_period() {
        let period = Duration::from_secs(5);
        assert_eq!(retry_delay(1, period), Duration::from_millis(250));
        assert_eq!(retry_delay(3, period), Duration::from_secs(1));
        assert_eq!(retry_delay(30, period), period);
        assert_eq!(margin(Duration::from_secs(15)), Duration::from_millis(1500));
        assert_eq!(margin(Duration::from_secs(60)), Duration::from_secs(2));
        assert_eq!(margin(Duration::from_secs(2)), Duration::from_millis(500));
    }
}
