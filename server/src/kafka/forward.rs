//! A producer id registered on the metadata primary when this node is not it: InitProducerId
//! may reach any node (librdkafka sends it to any broker it is connected to), but only the
//! metadata group's primary registers sessions. This node then asks the primary as a native
//! client would — `Hello`, then `Register` — on a connection of its own, bounded in time and in
//! the size of what it reads.
//!
//! It never follows a second redirect: a primary that moved meanwhile is NOT_COORDINATOR to the
//! Kafka client, which asks again.

use std::net::SocketAddr;
use std::time::Duration;

use monoio::io::{AsyncReadRentExt, AsyncWriteRentExt};
use monoio::net::TcpStream;
use shoal_proto::protocol::{Hello, Operation, PROTOCOL_VERSION, decode_session};
use shoal_proto::wire::{ClientReply, ClientRequest, HEADER_SIZE, Header};

/// The whole exchange (connect, Hello, Register) takes at most this long.
const FORWARD_TIME_MAX: Duration = Duration::from_secs(5);
/// The largest reply body read: a Hello reply names every node; a Register reply is 8 bytes.
const REPLY_BODY_BYTES_MAX: usize = 64 << 10;

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
    let mut stream =
        TcpStream::connect(address).await.map_err(|error| format!("{address}: {error}"))?;
    let hello = Hello {
        version_min: PROTOCOL_VERSION,
        version_max: PROTOCOL_VERSION,
        client_name: "shoal kafka listener".into(),
    };
    call(&mut stream, cluster, client, 1, Operation::Hello, &hello.encode()).await?;
    let body = call(&mut stream, cluster, client, 2, Operation::Register, &[]).await?;
    decode_session(&body).map_err(|error| format!("a Register reply: {error}"))
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
    let (read, head) = stream.read_exact(vec![0u8; HEADER_SIZE]).await;
    read.map_err(|error| format!("reading the {operation:?} reply: {error}"))?;
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
    read.map_err(|error| format!("reading the {operation:?} reply: {error}"))?;
    header.verify_body(&reply).map_err(|error| format!("a reply body: {error}"))?;
    if answered != request {
        return Err(format!("reply to request {answered}, not {request}"));
    }
    if error != 0 {
        return Err(format!("{operation:?} refused: {}", String::from_utf8_lossy(&reply)));
    }
    Ok(reply)
}
