//! Leader election with a coordination.k8s.io/v1 Lease, so that of several operator
//! replicas only one reconciles.
//!
//! Contract: the same algorithm as client-go's `leaderelection`, reduced to what Herald
//! needs. Writes are compare-and-swap (`replace` with the `resourceVersion` read), so two
//! candidates cannot both win. A lease is considered expired when its record has not
//! changed for `leaseDurationSeconds` *as observed by this process's monotonic clock*,
//! never by comparing `renewTime` with our wall clock, so clock skew between nodes
//! cannot make two leaders.

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
        }
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
            lease_duration_seconds: Some(self.duration.as_secs().max(1) as i32),
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
                    Ok(created) => {
                        self.observe(created.spec.unwrap_or_default());
                        Ok(true)
                    }
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
            return Ok(false);
        }
        let mut next = lease.clone();
        next.spec = Some(self.spec(Some(&record)));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &next)
            .await
        {
            Ok(written) => {
                self.observe(written.spec.unwrap_or_default());
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
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
