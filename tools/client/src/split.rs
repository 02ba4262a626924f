//! One connection split into its two directions, for callers that must write a request while
//! waiting for an earlier reply — an open-loop load generator sends on schedule whatever the
//! replies are doing. Both halves share the connection's protocol state (request FIFO, framing);
//! each performs I/O on its own half of the socket, so a `submit` and a `receive` may be in
//! flight at once in one task (joined) or in two tasks of one thread. A half whose I/O failed
//! must be dropped with its twin: the stream is then in an unknown state.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use monoio::io::{OwnedReadHalf, OwnedWriteHalf};
use monoio::net::TcpStream;
use shoal_proto::protocol::Operation;

use crate::connection::{Connection, Reply};
use crate::error::{ClientError, Result};
use crate::transport::{READ_CHUNK_BYTES, read_chunk, write_keeping};

/// The writing half: queues and writes requests.
pub struct RequestSender {
    writer: OwnedWriteHalf<TcpStream>,
    connection: Rc<RefCell<Connection>>,
    spare: Vec<u8>,
    timeout: Duration,
}

/// The reading half: reads replies, in request order.
pub struct ReplyReceiver {
    reader: OwnedReadHalf<TcpStream>,
    connection: Rc<RefCell<Connection>>,
    read_buf: Vec<u8>,
    timeout: Duration,
}

/// Splits a connected stream and its connection state (the client's `into_split`).
pub(crate) fn split(
    stream: TcpStream,
    connection: Connection,
    timeout: Duration,
) -> (RequestSender, ReplyReceiver) {
    use monoio::io::Splitable;
    let (reader, writer) = stream.into_split();
    let connection = Rc::new(RefCell::new(connection));
    let sender =
        RequestSender { writer, connection: Rc::clone(&connection), spare: Vec::new(), timeout };
    let receiver = ReplyReceiver {
        reader,
        connection,
        read_buf: Vec::with_capacity(READ_CHUNK_BYTES),
        timeout,
    };
    (sender, receiver)
}

impl RequestSender {
    /// Queues and writes one request, within the request timeout; returns its request number.
    /// Keep at most `in_flight_max` outstanding ([`RequestSender::has_room`]).
    pub async fn submit(&mut self, operation: Operation, body_parts: &[&[u8]]) -> Result<u64> {
        let (request, outgoing) = {
            let mut connection = self.connection.borrow_mut();
            let request = connection.request(operation, body_parts)?;
            (request, connection.take_outgoing(std::mem::take(&mut self.spare)))
        };
        let write = write_keeping(&mut self.writer, outgoing, &mut self.spare);
        match monoio::time::timeout(self.timeout, write).await {
            Ok(result) => result.map(|()| request),
            Err(_) => Err(ClientError::Timeout),
        }
    }

    /// Whether another request may be outstanding now.
    pub fn has_room(&self) -> bool {
        self.connection.borrow().has_room()
    }

    /// Requests outstanding.
    pub fn in_flight(&self) -> usize {
        self.connection.borrow().in_flight()
    }
}

impl ReplyReceiver {
    /// The next reply, within the request timeout. Call it only with a request outstanding.
    pub async fn receive(&mut self) -> Result<Reply> {
        match monoio::time::timeout(self.timeout, self.receive_unbounded()).await {
            Ok(result) => result,
            Err(_) => Err(ClientError::Timeout),
        }
    }

    async fn receive_unbounded(&mut self) -> Result<Reply> {
        loop {
            if let Some(reply) = self.connection.borrow_mut().poll_reply()? {
                return Ok(reply);
            }
            let read = read_chunk(&mut self.reader, &mut self.read_buf).await?;
            if read == 0 {
                return Err(self.connection.borrow_mut().on_closed());
            }
            self.connection.borrow_mut().on_bytes(&self.read_buf[..read]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use shoal_proto::protocol::{Partitioning, Produce, ProduceReply, Writer};

    use crate::testing::{Faults, MemoryServer, batch_of, spawn_tcp};
    use crate::{Client, ClientConfig, runtime};

    /// Requests go out while a receive is already waiting, and the replies come back in order.
    #[test]
    fn the_halves_send_while_a_reply_is_awaited() {
        let server = Arc::new(Mutex::new(MemoryServer::new(1)));
        let address = spawn_tcp(server, Faults::default());
        runtime().unwrap().block_on(async move {
            let config = ClientConfig {
                request_timeout_ms: 2_000,
                in_flight_max: 2,
                ..ClientConfig::with_seeds([address.to_string()])
            };
            let mut client = Client::connect(config).await.unwrap();
            client.create_stream("s").await.unwrap();
            let (mut requests, mut replies) = client.into_split().await.unwrap();
            let mut prefix = Writer::new();
            Produce {
                stream: "s".into(),
                topic: "t".into(),
                partitioning: Partitioning::Explicit(0),
            }
            .encode_prefix(&mut prefix);
            let batch = batch_of(0, 1_000, &["a", "b"]);
            let parts: [&[u8]; 2] = [&prefix.bytes, &batch];
            let first = requests.submit(shoal_proto::protocol::Operation::Produce, &parts).await;
            let first = first.unwrap();
            // The receive starts first and is pending while the second request is written.
            let (reply, second) = monoio::join!(replies.receive(), async {
                let second = requests.submit(shoal_proto::protocol::Operation::Produce, &parts);
                second.await.unwrap()
            });
            let reply = reply.unwrap();
            assert_eq!(reply.request, first);
            assert_eq!(ProduceReply::decode(&reply.result.unwrap()).unwrap().base_offset, 0);
            assert_eq!(requests.in_flight(), 1, "the second is still outstanding");
            assert!(requests.has_room());
            let reply = replies.receive().await.unwrap();
            assert_eq!(reply.request, second);
            assert_eq!(ProduceReply::decode(&reply.result.unwrap()).unwrap().base_offset, 2);
            assert_eq!(requests.in_flight(), 0);
        });
    }
}
