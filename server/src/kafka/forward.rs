//! Work this node cannot do, asked of the node that can, as a native client would, on a
//! connection of its own bounded in time and in the size of what it reads:
//! - InitProducerId may reach any node (librdkafka sends it to any broker it is connected to),
//!   but only the metadata group's primary registers sessions: `Hello`, then `Register` there.
//! - A Kafka group's offsets are committed and read on its coordinator (the metadata primary),
//!   but stored in each partition's log, which only that partition's primary writes and
//!   serves: `StoreOffset` and `GetOffset` there, pipelined a window at a time.
//!
//! It never follows a second redirect: a primary that moved meanwhile is NOT_COORDINATOR or
//! NOT_LEADER_OR_FOLLOWER to the Kafka client, which asks again.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
use monoio::net::TcpStream;
use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_proto::protocol::{Hello, Operation, PROTOCOL_VERSION, decode_session};
use shoal_proto::wire::{ClientReply, ClientRequest, HEADER_SIZE, Header};

use super::Connection;
use super::errors::kafka_error;
use crate::shard::{Body, Outcome};

/// The whole exchange (connect, Hello, the requests) takes at most this long.
const FORWARD_TIME_MAX: Duration = Duration::from_secs(5);
/// The largest reply body read: a Hello reply names every node; the others' are a few bytes
/// or an error's text.
const REPLY_BODY_BYTES_MAX: usize = 64 << 10;
/// Requests sent before their replies are read: far below any server's
/// `requests_in_flight_max`, and few enough that their replies fit the socket buffers, so
/// neither side waits on the other.
const PIPELINE_REQUESTS_MAX: usize = 16;

/// One forwarded request's answer: its reply body, or its error code and error body.
pub(crate) type NativeAnswer = Result<Vec<u8>, (u32, Vec<u8>)>;

/// Registers a session on the node at `address` (the metadata primary's client address) under
/// `client`: the session id, or why not.
pub(super) async fn register_on(
    address: SocketAddr,
    cluster: u64,
    client: u64,
) -> Result<u64, String> {
    match monoio::time::timeout(FORWARD_TIME_MAX, exchange(address, cluster, client)).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer from {address} within {FORWARD_TIME_MAX:?}")),
    }
}

async fn exchange(address: SocketAddr, cluster: u64, client: u64) -> Result<u64, String> {
    let mut stream = hello(address, cluster, client, 1).await?;
    let body = call(&mut stream, cluster, client, 2, Operation::Register, &[]).await?;
    decode_session(&body).map_err(|error| format!("a Register reply: {error}"))
}

/// Sends `requests` (operation, body) to the node at `address` under `client`, numbered from
/// `first_request` on (the first one is the `Hello`), and returns each one's answer in order;
/// `Err` when the exchange failed (each request may or may not have been carried out).
pub(crate) async fn call_each(
    address: SocketAddr,
    cluster: u64,
    client: u64,
    first_request: u64,
    requests: &[(Operation, Vec<u8>)],
) -> Result<Vec<NativeAnswer>, String> {
    let exchange = async {
        let mut stream = hello(address, cluster, client, first_request).await?;
        let mut answers = Vec::with_capacity(requests.len());
        let numbered = (first_request + 1..).zip(requests);
        let numbered: Vec<_> = numbered.collect();
        for window in numbered.chunks(PIPELINE_REQUESTS_MAX) {
            let mut frames = Vec::new();
            for &(request, (operation, body)) in window {
                let fields =
                    ClientRequest { client, session: 0, request, operation: *operation as u32 };
                frames.extend_from_slice(&Header::request(cluster, fields, body).encode());
                frames.extend_from_slice(body);
            }
            let (written, _) = stream.write_all(frames).await;
            written.map_err(|error| format!("sending to {address}: {error}"))?;
            for &(request, _) in window {
                answers.push(receive(&mut stream, request).await?);
            }
        }
        Ok(answers)
    };
    match monoio::time::timeout(FORWARD_TIME_MAX, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer from {address} within {FORWARD_TIME_MAX:?}")),
    }
}

/// A connection to `address` that has said `Hello` as request `request`.
async fn hello(
    address: SocketAddr,
    cluster: u64,
    client: u64,
    request: u64,
) -> Result<TcpStream, String> {
    let mut stream =
        TcpStream::connect(address).await.map_err(|error| format!("{address}: {error}"))?;
    let hello = Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        client_name: "shoal kafka listener".into(),
    };
    call(&mut stream, cluster, client, request, Operation::Hello, &hello.encode()).await?;
    Ok(stream)
}

/// One request and its reply's body; an error reply is its text.
async fn call(
    stream: &mut TcpStream,
    cluster: u64,
    client: u64,
    request: u64,
    operation: Operation,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    let fields = ClientRequest { client, session: 0, request, operation: operation as u32 };
    let mut frame = Header::request(cluster, fields, body).encode().to_vec();
    frame.extend_from_slice(body);
    let (written, _) = stream.write_all(frame).await;
    written.map_err(|error| format!("sending {operation:?}: {error}"))?;
    receive(stream, request)
        .await?
        .map_err(|(_, text)| format!("{operation:?} refused: {}", String::from_utf8_lossy(&text)))
}

/// The reply to `request`, the next one on `stream`.
async fn receive(stream: &mut TcpStream, request: u64) -> Result<NativeAnswer, String> {
    let (read, head) = stream.read_exact(vec![0u8; HEADER_SIZE]).await;
    read.map_err(|error| format!("reading a reply: {error}"))?;
    let head: [u8; HEADER_SIZE] = head.try_into().expect("read exactly a header");
    let header = Header::decode(&head).map_err(|error| format!("a reply header: {error}"))?;
    let Some(&ClientReply { request: answered, error, .. }) = header.as_reply() else {
        return Err("the answer is not a reply".into());
    };
    let size = header.body_size();
    if size > REPLY_BODY_BYTES_MAX {
        return Err(format!("a reply body of {size} bytes"));
    }
    let (read, reply) = stream.read_exact(vec![0u8; size]).await;
    read.map_err(|error| format!("reading a reply: {error}"))?;
    header.verify_body(&reply).map_err(|error| format!("a reply body: {error}"))?;
    if answered != request {
        return Err(format!("reply to request {answered}, not {request}"));
    }
    Ok(if error == 0 { Ok(reply) } else { Err((error, reply)) })
}

/// A request this node's replica did not take because `node`'s leads the partition.
struct Redirected {
    node: u8,
    operation: Operation,
    body: Vec<u8>,
}

impl Connection {
    /// Each partition's answer, in order: its own shard's, or — where that shard's replica is
    /// not the partition's primary — the primary node's to the native request `redirect(slot)`
    /// builds, its reply body as a success. A request that never reached a shard keeps its
    /// error.
    pub(super) async fn local_or_forwarded(
        &mut self,
        waiting: Vec<Result<flume::Receiver<Outcome>, ResponseError>>,
        redirect: impl Fn(usize) -> (Operation, Vec<u8>),
    ) -> Vec<Result<Outcome, ResponseError>> {
        let mut answers = Vec::with_capacity(waiting.len());
        let mut redirected = Vec::new();
        for (slot, answer) in waiting.into_iter().enumerate() {
            let answer = match answer {
                Err(error) => Err(error),
                Ok(answer) => {
                    answer.recv_async().await.map_err(|_| ResponseError::NotLeaderOrFollower)
                }
            };
            if let Ok(Outcome { body: Body::NotPrimary { primary, .. }, .. }) = answer {
                let (operation, body) = redirect(slot);
                redirected.push((slot, Redirected { node: primary, operation, body }));
            }
            answers.push(answer);
        }
        let (slots, redirected): (Vec<usize>, Vec<Redirected>) = redirected.into_iter().unzip();
        for (slot, answer) in slots.into_iter().zip(self.forward(redirected).await) {
            answers[slot] = answer.map(Outcome::ok);
        }
        answers
    }

    /// Each redirected request's answer from the node it names, in order; the requests for one
    /// node share one connection. A node without a client address, this node itself (its
    /// replica's view moved on meanwhile) or a failed exchange is an error the Kafka client
    /// retries after refreshing its metadata.
    async fn forward(
        &mut self,
        redirected: Vec<Redirected>,
    ) -> Vec<Result<Vec<u8>, ResponseError>> {
        let mut answers: Vec<Result<Vec<u8>, ResponseError>> =
            vec![Err(ResponseError::NotLeaderOrFollower); redirected.len()];
        let mut by_node: BTreeMap<u8, Vec<usize>> = BTreeMap::new();
        for (slot, request) in redirected.iter().enumerate() {
            by_node.entry(request.node).or_default().push(slot);
        }
        let cluster = &self.context.config.cluster;
        let (cluster_id, this_node) = (cluster.id, cluster.node);
        for (node, slots) in by_node {
            let address = self.catalog.nodes.client_address(cluster, node);
            let Some(address) = address.filter(|_| node != this_node) else {
                continue;
            };
            let requests: Vec<(Operation, Vec<u8>)> = slots
                .iter()
                .map(|&slot| (redirected[slot].operation, redirected[slot].body.clone()))
                .collect();
            let first_request = self.requests + 1;
            self.requests += 1 + requests.len() as u64;
            match call_each(address, cluster_id, self.client, first_request, &requests).await {
                Ok(replies) => {
                    for (slot, reply) in slots.into_iter().zip(replies) {
                        answers[slot] = reply.map_err(|(code, _)| {
                            kafka_error(code).unwrap_or(ResponseError::UnknownServerError)
                        });
                    }
                }
                Err(why) => {
                    tracing::debug!(node, %address, why, "Kafka offsets not forwarded");
                    for slot in slots {
                        answers[slot] = Err(ResponseError::RequestTimedOut);
                    }
                }
            }
        }
        answers
    }
}
