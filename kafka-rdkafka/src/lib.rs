//! Shoal's Kafka listener under librdkafka, the C client most Kafka users run (through the
//! `rdkafka` crate, librdkafka built from the source it bundles): what the rdkafka test
//! (`tests/rdkafka.rs`) and the load tool `shoal-kafka-bench` share — creating a topic through
//! Kafka's CreateTopics with rdkafka's admin client, and the few lines of executor that admin
//! client's futures need (no async runtime is linked: producers and consumers here are
//! `BaseProducer`s and `BaseConsumer`s, polled by their own threads) — and `wire`, the
//! library-less Kafka producer of `shoal-kafka-bench --client wire`.
//!
//! This crate is built by `cargo test --workspace` (so CI runs its test) and by no canary build:
//! librdkafka's C build takes about a minute on two cores.

pub mod wire;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::types::RDKafkaErrorCode;

/// Wakes the thread that waits in [`block_on`].
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs `future` to completion on this thread, parking between polls. rdkafka's admin futures
/// are completed by the admin client's own thread, which wakes this one.
pub fn block_on<F: Future>(future: F) -> F::Output {
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut context = Context::from_waker(&waker);
    let mut future = pin!(future);
    loop {
        match future.as_mut().poll(&mut context) {
            Poll::Ready(output) => return output,
            Poll::Pending => std::thread::park(),
        }
    }
}

/// Creates Kafka topic `topic` with `partitions` partitions and Shoal durability `durability`
/// (`replicated` or `persisted`, the topic config `shoal.durability`) through CreateTopics,
/// waiting at most `timeout`. `Ok(true)`: created; `Ok(false)`: it already existed.
pub fn create_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    durability: &str,
    timeout: Duration,
) -> Result<bool, String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .map_err(|e| format!("admin client: {e}"))?;
    // Replication factor -1: the broker's default, which on Shoal is every node.
    let new_topic = NewTopic::new(topic, partitions, TopicReplication::Fixed(-1))
        .set("shoal.durability", durability);
    let options = AdminOptions::new().request_timeout(Some(timeout));
    let results = block_on(admin.create_topics([&new_topic], &options))
        .map_err(|e| format!("CreateTopics {topic}: {e}"))?;
    match results.as_slice() {
        [Ok(_)] => Ok(true),
        [Err((_, RDKafkaErrorCode::TopicAlreadyExists))] => Ok(false),
        [Err((name, code))] => Err(format!("CreateTopics {name}: {code}")),
        other => Err(format!("CreateTopics {topic}: {} results", other.len())),
    }
}
