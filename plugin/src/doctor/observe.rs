//! The IO of `doctor`: what the Kubernetes API, NATS and herald-api say, gathered into
//! [`Facts`] for the pure verdicts. Every question has a deadline; a question that fails
//! becomes a fact too (its error text), so one unreachable part never hides the others.
//! Nothing is written anywhere.

use std::future::Future;
use std::time::Duration;

use async_nats::jetstream::{self, kv, stream};
use futures::StreamExt as _;
use herald_core::dataplane::layout::{self, LayoutError};
use herald_core::dataplane::{BucketKey, CONFIG_BUCKET, LeaseKey, SHARDS_BUCKET};
use herald_core::flags::{NatsArgs, redact_urls};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use super::leader::LeaseFacts;
use super::nats::{JetStream, ServerFacts, StreamFacts};
use super::readyz::Answer;
use super::shards::ShardFacts;
use super::{Facts, Settings};

/// Asks everything, the Kubernetes API, NATS and herald-api side by side.
pub async fn observe(settings: &Settings, nats: &NatsArgs, kube: Result<Client, String>) -> Facts {
    let timeout = settings.timeout;
    let kube_side = async {
        let client = match kube {
            Ok(client) => client,
            Err(error) => {
                let crds = super::crds::expected()
                    .iter()
                    .map(|_| Err(error.clone()))
                    .collect();
                return (crds, Err(error));
            }
        };
        let crds = futures::future::join_all(super::crds::expected().iter().map(|crd| {
            let name = crd.metadata.name.clone().unwrap_or_default();
            within(timeout, installed_crd(&client, name))
        }))
        .await;
        let lease = within(
            timeout,
            leader_lease(&client, &settings.namespace, &settings.lease_names),
        )
        .await;
        (crds, lease)
    };
    let nats_side = async {
        let js = match within(timeout, connect(nats, timeout)).await {
            Ok(js) => js,
            Err(error) => return (Err(error), None, None),
        };
        let server = server_facts(&js, timeout).await;
        if server
            .as_ref()
            .map(|s| s.jetstream.is_err())
            .unwrap_or(true)
        {
            return (server, None, None);
        }
        let shards = within(timeout, shard_facts(&js)).await;
        let streams = futures::future::join_all(
            super::stream_specs()
                .iter()
                .map(|spec| within(timeout, stream_facts(&js, spec.name))),
        )
        .await;
        (server, Some(shards), Some(streams))
    };
    let api_side = async {
        match &settings.api_url {
            Some(url) => Some(readyz(url, timeout).await),
            None => None,
        }
    };
    let ((crds, lease), (server, shards, streams), api) =
        tokio::join!(kube_side, nats_side, api_side);
    Facts {
        crds,
        lease,
        server,
        shards,
        streams,
        api,
        now: jiff::Timestamp::now(),
    }
}

/// `what`, or a timeout error after `timeout`.
async fn within<T>(
    timeout: Duration,
    what: impl Future<Output = Result<T, String>>,
) -> Result<T, String> {
    tokio::time::timeout(timeout, what)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer within {} s (--timeout)",
                timeout.as_secs_f64()
            ))
        })
}

async fn installed_crd(
    client: &Client,
    name: String,
) -> Result<Option<CustomResourceDefinition>, String> {
    Api::<CustomResourceDefinition>::all(client.clone())
        .get_opt(&name)
        .await
        .map_err(|e| crate::kube_message(&e))
}

/// The first of `names` that exists in `namespace`.
async fn leader_lease(
    client: &Client,
    namespace: &str,
    names: &[String],
) -> Result<Option<LeaseFacts>, String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    for name in names {
        let Some(lease) = api
            .get_opt(name)
            .await
            .map_err(|e| crate::kube_message(&e))?
        else {
            continue;
        };
        let spec = lease.spec.unwrap_or_default();
        return Ok(Some(LeaseFacts {
            name: name.clone(),
            holder: spec.holder_identity,
            renewed: spec.renew_time.map(|t| t.0),
            duration_secs: spec.lease_duration_seconds,
        }));
    }
    Ok(None)
}

/// One connection attempt (no retries: the doctor reports, it does not wait for NATS).
async fn connect(nats: &NatsArgs, timeout: Duration) -> Result<jetstream::Context, String> {
    let addrs = nats.server_addrs().map_err(|e| e.to_string())?;
    let options = nats
        .options("kubectl-herald doctor")
        .await
        .map_err(|e| e.to_string())?
        .connection_timeout(timeout)
        .request_timeout(Some(timeout));
    let client = options.connect(addrs).await.map_err(|e| {
        format!(
            "cannot connect to NATS at {}: {e}",
            redact_urls(&nats.nats_url)
        )
    })?;
    Ok(jetstream::new(client))
}

async fn server_facts(js: &jetstream::Context, timeout: Duration) -> Result<ServerFacts, String> {
    let jetstream = match within(timeout, async { Ok(layout::check_jetstream(js).await) }).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(LayoutError::NoJetStream)) => Err(JetStream::Disabled),
        Ok(Err(other)) => Err(JetStream::Unanswered(other.to_string())),
        Err(timeout) => Err(JetStream::Unanswered(timeout)),
    };
    let info = js.client().server_info();
    Ok(ServerFacts {
        version: info.version,
        max_payload: info.max_payload,
        jetstream,
    })
}

/// The bucket, `None` when it does not exist.
async fn bucket(js: &jetstream::Context, name: &str) -> Result<Option<kv::Store>, String> {
    match js.get_stream(format!("KV_{name}")).await {
        Err(e) if layout::stream_missing(&e) => return Ok(None),
        Err(e) => return Err(format!("key-value bucket {name}: {e}")),
        Ok(_) => {}
    }
    js.get_key_value(name)
        .await
        .map(Some)
        .map_err(|e| format!("key-value bucket {name}: {e}"))
}

async fn shard_facts(js: &jetstream::Context) -> Result<ShardFacts, String> {
    let mut facts = ShardFacts::default();
    if let Some(config) = bucket(js, CONFIG_BUCKET).await? {
        let key = BucketKey::ShardCount.to_string();
        let value = config
            .get(&key)
            .await
            .map_err(|e| format!("{CONFIG_BUCKET} {key}: {e}"))?;
        facts.count = match value {
            None => None,
            Some(value) => Some(
                std::str::from_utf8(&value)
                    .ok()
                    .and_then(|v| v.trim().parse().ok())
                    .ok_or_else(|| format!("{CONFIG_BUCKET} {key} holds no number"))?,
            ),
        };
    }
    let Some(leases) = bucket(js, SHARDS_BUCKET).await? else {
        return Ok(facts);
    };
    let mut keys = leases
        .keys()
        .await
        .map_err(|e| format!("listing {SHARDS_BUCKET}: {e}"))?;
    let mut shards = Vec::new();
    while let Some(key) = keys.next().await {
        let key = key.map_err(|e| format!("listing {SHARDS_BUCKET}: {e}"))?;
        match LeaseKey::parse(&key) {
            Some(LeaseKey::Shard(shard)) => shards.push(shard),
            Some(LeaseKey::Member(id)) => {
                facts.members.insert(id);
            }
            None => {}
        }
    }
    let holders = futures::future::join_all(shards.into_iter().map(|shard| {
        let leases = &leases;
        async move {
            let holder = leases.get(LeaseKey::Shard(shard).to_string()).await;
            (shard, holder)
        }
    }))
    .await;
    for (shard, holder) in holders {
        // A lease that expired between the listing and the read is simply not held.
        let holder = holder.map_err(|e| format!("reading {SHARDS_BUCKET} shard.{shard}: {e}"))?;
        if let Some(holder) = holder {
            facts
                .holders
                .insert(shard, String::from_utf8_lossy(&holder).into_owned());
        }
    }
    Ok(facts)
}

async fn stream_facts(js: &jetstream::Context, name: &str) -> Result<Option<StreamFacts>, String> {
    let stream = match js.get_stream(name).await {
        Ok(stream) => stream,
        Err(e) if layout::stream_missing(&e) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let info = stream.cached_info();
    let config = &info.config;
    let cluster = info.cluster.as_ref();
    Ok(Some(StreamFacts {
        replicas: config.num_replicas.max(1),
        file: config.storage == stream::StorageType::File,
        max_message_size: i64::from(config.max_message_size),
        schedules: config.allow_message_schedules,
        leader: cluster
            .and_then(|c| c.leader.clone())
            .filter(|l| !l.is_empty()),
        clustered: cluster.is_some(),
        offline: cluster
            .map(|c| {
                c.replicas
                    .iter()
                    .filter(|r| r.offline)
                    .map(|r| r.name.clone())
                    .collect()
            })
            .unwrap_or_default(),
        messages: info.state.messages,
    }))
}

/// `GET <url>/readyz` (a path prefix of `url` kept, as for every API call).
async fn readyz(url: &str, timeout: Duration) -> Answer {
    let mut target = url::Url::parse(url.trim())
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && !u.cannot_be_a_base())
        .ok_or_else(|| format!("--api-url {url:?} is not an http(s) URL"))?;
    target
        .path_segments_mut()
        .map_err(|_| format!("--api-url {url:?} is not an http(s) URL"))?
        .pop_if_empty()
        .push("readyz");
    let http = reqwest::Client::builder()
        .timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| e.to_string())?;
    let answer = http.get(target).send().await.map_err(|e| {
        // reqwest's own message is "error sending request for url (...)"; the innermost
        // cause says why (connection refused, a name that does not resolve, a timeout).
        let mut cause: &dyn std::error::Error = &e;
        while let Some(inner) = cause.source() {
            cause = inner;
        }
        cause.to_string()
    })?;
    let status = answer.status().as_u16();
    let body = answer.text().await.unwrap_or_default();
    Ok((status, body))
}
