//! Shoal's Rust client library: the native protocol over TCP.
//!
//! Layers, bottom up — each owns one thing and performs no I/O unless it says so:
//!
//! - `codec`: request frames out, verified reply frames in (sans-IO).
//! - `connection`: one connection's state: request FIFO, handshake, session (sans-IO).
//! - `fetch`: a fetch result and the records in it (sans-IO).
//! - `transport`: the monoio TCP socket under one connection (the only I/O).
//! - `routes`: where the client believes each request should go in a cluster: the nodes, the
//!   metadata group's primary, each partition's primary (sans-IO).
//! - `client`: [`Client`], its connections (one per node it talks to), connect/reconnect,
//!   timeouts, following `NotPrimary`, admin calls, produce, fetch, status.
//! - `producer`: [`Producer`], batching and pipelining with in-order acknowledgements.
//! - `split`: a connection's two directions apart ([`Client::into_split`]), for writing a request
//!   while an earlier reply is awaited (the load tool's open-loop producer).
//!
//! The client speaks `shoal_proto::wire` headers and `shoal_proto::protocol` bodies and depends on
//! no other Shoal crate (no storage engine). It never panics on server bytes; every failure
//! is a [`ClientError`].
//!
//! ```no_run
//! use shoal_client::{Client, ClientConfig, Producer, ProducerConfig};
//!
//! shoal_client::runtime().unwrap().block_on(async {
//!     let client = Client::connect(ClientConfig::with_seeds(["127.0.0.1:7070"])).await?;
//!     let mut producer = Producer::new(client, "orders", "created", ProducerConfig::default())
//!         .await?;
//!     producer.send(Some(b"customer-7"), b"{\"total\": 12}").await?;
//!     producer.flush().await?;
//!     for ack in producer.poll_acks() {
//!         println!("{} at {}/{}", ack.ticket, ack.partition, ack.offset);
//!     }
//!     Ok::<_, shoal_client::ClientError>(())
//! })
//! .unwrap();
//! ```

mod client;
pub mod codec;
pub mod connection;
mod error;
mod fetch;
mod producer;
mod routes;
mod split;
#[cfg(test)]
mod testing;
mod transport;

pub use client::{Client, ClientConfig, runtime};
pub use connection::Reply;
pub use error::{ClientError, Result};
pub use fetch::{Fetched, FetchedRecord, Records};
pub use producer::{Ack, Producer, ProducerConfig};
pub use routes::Route;
/// Durability modes of a topic.
pub use shoal_proto::Durability;
/// Batches are built with `shoal-proto`'s builder.
pub use shoal_proto::batch::BatchBuilder;
/// Consumer offsets, groups and polling.
pub use shoal_proto::protocol::consumer::{
    Assignment, ConsumerId, ConsumerKind, GroupMember, GroupRef, JoinGroup, Membership, OffsetKey,
    PartitionRef, Poll, StoreOffset,
};
/// The protocol's argument and result types, re-exported so callers need no `shoal-proto` dependency.
pub use shoal_proto::protocol::{
    AddNode, CreateTopic, ErrorCode, Fetch, FetchFrom, FetchReply, HelloReply, MoveAction,
    MovePartition, NODE_UNKNOWN, NodeAddress, NotPrimary, PartitionInfo, PartitionPrimary,
    Partitioning, ProduceReply, RemoveNode, StreamInfo, TopicDescription, TopicInfo,
};
pub use split::{ReplyReceiver, RequestSender};
