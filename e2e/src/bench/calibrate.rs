//! What a JetStream operation costs on the machine the benchmark runs on, measured first:
//! 200,000 publishes of 500 bytes to a file-stored stream of their own, acknowledged, at
//! most 2,048 unacknowledged — the same shape as the throughput runs' publisher, without
//! Herald. The brief's cost budget (and its 20,000 deliveries/s target) assumes about
//! 6 µs of CPU per publish with its ack, server and client together; the benchmark's
//! machines differ by more than twice that, so the report puts each run's figures next to
//! this one.

use std::time::{Duration, Instant};

use async_nats::jetstream::{self, stream};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use serde::Serialize;

use crate::TestEnv;
use crate::faults::cpu_time;

const STREAM: &str = "HERALD_BENCH_CALIBRATION";
/// The brief's reference: CPU of one publish with its ack, server and client, in µs.
pub const REFERENCE_US: f64 = 6.0;

/// One calibration run.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Calibration {
    pub publishes: usize,
    /// Publishes acknowledged per second.
    pub rate: f64,
    /// CPU per publish of the publishing process (the benchmark, idle otherwise), µs.
    pub client_us: f64,
    /// CPU per publish of the environment's process (nats-server, with an idle etcd and
    /// kube-apiserver beside it), µs.
    pub server_us: f64,
}

impl Calibration {
    pub fn total_us(&self) -> f64 {
        self.client_us + self.server_us
    }

    /// How many times the brief's reference machine's cost a JetStream operation costs
    /// here.
    pub fn factor(&self) -> f64 {
        self.total_us() / REFERENCE_US
    }
}

/// Measures `publishes` publishes against `env`.
pub async fn run(env: &TestEnv, publishes: usize) -> Calibration {
    let js = jetstream::new(env.nats().await);
    let _ = js.delete_stream(STREAM).await;
    js.create_stream(stream::Config {
        name: STREAM.into(),
        subjects: vec!["herald-bench.calibration.>".into()],
        storage: stream::StorageType::File,
        ..Default::default()
    })
    .await
    .expect("creating the calibration stream");
    let cpu = |pid: Option<u32>| pid.and_then(cpu_time).unwrap_or(Duration::ZERO);
    let (me, server) = (Some(std::process::id()), env.pid());
    let (client0, server0) = (cpu(me), cpu(server));
    let start = Instant::now();
    // A fresh body each time, as the throughput runs' publisher formats each event.
    let body = vec![b'x'; 500];
    let mut pending = FuturesUnordered::new();
    for i in 0..publishes {
        let ack = js
            .publish(
                format!("herald-bench.calibration.{}", i % 10),
                body.clone().into(),
            )
            .await
            .expect("publish");
        pending.push(ack.into_future());
        while pending.len() >= 2048 {
            pending.next().await.expect("pending").expect("publish ack");
        }
    }
    while let Some(ack) = pending.next().await {
        ack.expect("publish ack");
    }
    let seconds = start.elapsed().as_secs_f64();
    let per = |d: Duration| d.as_secs_f64() * 1e6 / publishes.max(1) as f64;
    let calibration = Calibration {
        publishes,
        rate: publishes as f64 / seconds,
        client_us: per(cpu(me) - client0),
        server_us: per(cpu(server) - server0),
    };
    let _ = js.delete_stream(STREAM).await;
    calibration
}
