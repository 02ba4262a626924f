//! One connection's protocol state, sans-IO.
//!
//! [`Connection`] owns what must hold for the life of one TCP connection: the request numbering
//! and the bytes waiting to be written (through `codec::RequestEncoder`), the reply reassembly
//! (`codec::FrameDecoder`), the FIFO of outstanding requests (bounded by `in_flight_max`), the
//! version handshake (`Hello` must be the first request; the negotiated version is recorded) and
//! the session the server registered. Because the server answers the requests of one connection
//! strictly in order, every reply must match the head of the FIFO — same client id, same request
//! number, same operation — or the connection is broken.
//!
//! It never performs I/O, reads a clock or sleeps (the transport does), never retries (callers
//! decide), and never panics on server bytes: anything unexpected becomes a
//! [`ClientError::Protocol`] that fails the connection for good.

use std::collections::VecDeque;

use bytes::Bytes;
use shoal_proto::protocol::{
    ErrorCode, Hello, HelloReply, NotPrimary, Operation, PROTOCOL_VERSION, PROTOCOL_VERSION_MIN,
    TEXT_LEN_MAX, decode_session,
};

use crate::codec::{FrameDecoder, ReplyFrame, RequestEncoder};
use crate::error::{ClientError, Result};

/// Limits and identity of one connection.
#[derive(Clone, Copy, Debug)]
pub struct ConnectionConfig {
    /// The cluster id requests carry and replies must carry.
    pub cluster: u64,
    /// The client id (random, kept for the client's life).
    pub client: u64,
    /// Requests that may be outstanding at once (at least 1).
    pub in_flight_max: usize,
    /// Largest request frame, header included.
    pub frame_size_bytes_max: usize,
    /// Largest reply frame, header included.
    pub reply_size_bytes_max: usize,
}

/// Where the version handshake stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HelloState {
    /// No request sent yet; the first must be `Hello`.
    NotSent,
    /// `Hello` is outstanding.
    Sent,
    /// The server accepted: the connection speaks `reply.version`.
    Done(HelloReply),
}

/// A reply matched to its request.
#[derive(Clone, Debug)]
pub struct Reply {
    /// The request number answered.
    pub request: u64,
    /// The operation answered.
    pub operation: Operation,
    /// The result body, or the error the server answered with.
    pub result: Result<Bytes>,
}

#[derive(Clone, Copy, Debug)]
struct Outstanding {
    request: u64,
    operation: Operation,
}

/// The state machine of one connection. See the module documentation.
#[derive(Debug)]
pub struct Connection {
    config: ConnectionConfig,
    encoder: RequestEncoder,
    decoder: FrameDecoder,
    outstanding: VecDeque<Outstanding>,
    outgoing: Vec<u8>,
    hello: HelloState,
    session: u64,
    failed: Option<ClientError>,
}

impl Connection {
    /// A fresh connection; nothing is sent until [`Connection::hello`].
    pub fn new(config: ConnectionConfig) -> Connection {
        let config = ConnectionConfig { in_flight_max: config.in_flight_max.max(1), ..config };
        Connection {
            encoder: RequestEncoder::new(
                config.cluster,
                config.client,
                config.frame_size_bytes_max,
            ),
            decoder: FrameDecoder::new(config.cluster, config.reply_size_bytes_max),
            outstanding: VecDeque::with_capacity(config.in_flight_max),
            outgoing: Vec::new(),
            hello: HelloState::NotSent,
            session: 0,
            failed: None,
            config,
        }
    }

    /// Queues the `Hello` request (versions this build speaks); it must be the first request.
    pub fn hello(&mut self, client_name: &str) -> Result<u64> {
        if self.hello != HelloState::NotSent {
            return Err(ClientError::Invalid("Hello was already sent on this connection".into()));
        }
        let mut name = client_name;
        if name.len() > TEXT_LEN_MAX {
            let mut end = TEXT_LEN_MAX;
            while !name.is_char_boundary(end) {
                end -= 1;
            }
            name = &name[..end];
        }
        let body = Hello {
            version_min: PROTOCOL_VERSION_MIN,
            version_max: PROTOCOL_VERSION,
            client_name: name.to_string(),
        }
        .encode();
        let request = self.queue(Operation::Hello, &[&body])?;
        self.hello = HelloState::Sent;
        Ok(request)
    }

    /// Queues a request; its frame is appended to the outgoing bytes. Refused while the
    /// connection has failed, before `Hello` was sent, or with `in_flight_max` requests
    /// outstanding.
    pub fn request(&mut self, operation: Operation, body_parts: &[&[u8]]) -> Result<u64> {
        if operation == Operation::Hello {
            return Err(ClientError::Invalid("Hello is sent with Connection::hello".into()));
        }
        if self.hello == HelloState::NotSent {
            return Err(ClientError::Invalid(format!(
                "{operation:?} before Hello: Hello must be the first request on a connection"
            )));
        }
        self.queue(operation, body_parts)
    }

    fn queue(&mut self, operation: Operation, body_parts: &[&[u8]]) -> Result<u64> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        if !self.has_room() {
            return Err(ClientError::Invalid(format!(
                "{} requests are already outstanding (in_flight_max)",
                self.outstanding.len()
            )));
        }
        let request =
            self.encoder.encode(&mut self.outgoing, self.session, operation, body_parts)?;
        self.outstanding.push_back(Outstanding { request, operation });
        Ok(request)
    }

    /// Whether another request may be queued now.
    pub fn has_room(&self) -> bool {
        self.outstanding.len() < self.config.in_flight_max
    }

    /// Requests sent (or queued) and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.outstanding.len()
    }

    /// The request numbers outstanding, oldest first.
    pub fn outstanding(&self) -> impl Iterator<Item = u64> + '_ {
        self.outstanding.iter().map(|o| o.request)
    }

    /// Whether bytes are waiting to be written.
    pub fn wants_write(&self) -> bool {
        !self.outgoing.is_empty()
    }

    /// Takes the bytes waiting to be written, leaving `spare` (cleared) in their place, so the
    /// transport and the connection swap two buffers instead of allocating.
    pub fn take_outgoing(&mut self, mut spare: Vec<u8>) -> Vec<u8> {
        spare.clear();
        std::mem::replace(&mut self.outgoing, spare)
    }

    /// Feeds bytes read from the socket.
    pub fn on_bytes(&mut self, bytes: &[u8]) {
        self.decoder.feed(bytes);
    }

    /// The end of the byte stream: the connection fails with [`ClientError::Closed`].
    pub fn on_closed(&mut self) -> ClientError {
        self.fail(ClientError::Closed)
    }

    /// The next reply matched to its request, `Ok(None)` when more bytes are needed, or the
    /// error that broke the connection (every outstanding request is lost with it).
    pub fn poll_reply(&mut self) -> Result<Option<Reply>> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        let frame = match self.decoder.next_frame() {
            Ok(Some(frame)) => frame,
            Ok(None) => return Ok(None),
            Err(error) => return Err(self.fail(error.into())),
        };
        match self.accept(frame) {
            Ok(reply) => Ok(Some(reply)),
            Err(error) => Err(self.fail(error)),
        }
    }

    /// Matches a frame to the head of the FIFO and applies what it means to the connection.
    fn accept(&mut self, frame: ReplyFrame) -> Result<Reply> {
        let ReplyFrame { reply, body } = frame;
        let Some(head) = self.outstanding.front().copied() else {
            return Err(ClientError::Protocol(format!(
                "a reply to request {} when no request is outstanding",
                reply.request
            )));
        };
        if reply.client != self.config.client {
            return Err(ClientError::Protocol(format!(
                "a reply for client {:#x}, but this is client {:#x}",
                reply.client, self.config.client
            )));
        }
        if reply.request != head.request {
            return Err(ClientError::Protocol(format!(
                "a reply to request {} while request {} is the oldest outstanding (replies must \
                 come in order)",
                reply.request, head.request
            )));
        }
        if reply.operation != head.operation as u32 {
            return Err(ClientError::Protocol(format!(
                "the reply to request {} is for operation {}, not {:?}",
                reply.request, reply.operation, head.operation
            )));
        }
        self.outstanding.pop_front();

        let result = if reply.error == 0 {
            Ok(body)
        } else if reply.error == ErrorCode::NotPrimary as u32 && self.version() >= Some(3) {
            match NotPrimary::decode(&body) {
                Ok(redirect) => Err(ClientError::NotPrimary(redirect)),
                Err(error) => {
                    return Err(ClientError::Protocol(format!(
                        "the NotPrimary answer to request {}: {error}",
                        reply.request
                    )));
                }
            }
        } else {
            let message = error_text(&body);
            match ErrorCode::from_u32(reply.error) {
                Some(code) => Err(ClientError::Server { code, message }),
                None => {
                    return Err(ClientError::Protocol(format!(
                        "unknown error code {} in the reply to request {}: {message}",
                        reply.error, reply.request
                    )));
                }
            }
        };

        match (head.operation, &result) {
            (Operation::Hello, Ok(body)) => {
                let hello = HelloReply::decode(body)
                    .map_err(|e| ClientError::Protocol(format!("Hello reply: {e}")))?;
                if !(PROTOCOL_VERSION_MIN..=PROTOCOL_VERSION).contains(&hello.version) {
                    return Err(ClientError::Protocol(format!(
                        "the server chose protocol version {}, outside this client's \
                         {PROTOCOL_VERSION_MIN}..={PROTOCOL_VERSION}",
                        hello.version
                    )));
                }
                self.hello = HelloState::Done(hello);
            }
            (Operation::Register, Ok(body)) => {
                self.session = decode_session(body)
                    .map_err(|e| ClientError::Protocol(format!("Register reply: {e}")))?;
            }
            (_, Err(error)) if error.breaks_connection() => {
                // The server closes the connection after this reply; later requests must not be
                // queued behind it.
                self.failed = Some(error.clone());
            }
            _ => {}
        }
        Ok(Reply { request: head.request, operation: head.operation, result })
    }

    fn fail(&mut self, error: ClientError) -> ClientError {
        if self.failed.is_none() {
            self.failed = Some(error.clone());
        }
        error
    }

    /// Whether the connection can no longer be used.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }

    /// The handshake's state.
    pub fn hello_state(&self) -> &HelloState {
        &self.hello
    }

    /// The negotiated protocol version, once `Hello` was answered.
    pub fn version(&self) -> Option<u16> {
        match &self.hello {
            HelloState::Done(reply) => Some(reply.version),
            _ => None,
        }
    }

    /// The number the next request will carry.
    pub fn next_request(&self) -> u64 {
        self.encoder.next_request()
    }

    /// Continues the request numbering of an earlier connection of the same client: request
    /// numbers must keep increasing in a session across connections (the server deduplicates
    /// admin requests by session and request number).
    pub fn continue_numbering(&mut self, next_request: u64) {
        self.encoder.continue_from(next_request);
    }

    /// The session requests carry (`0` before registration).
    pub fn session(&self) -> u64 {
        self.session
    }

    /// Sets the session requests carry from now on (a session registered on an earlier
    /// connection survives reconnects).
    pub fn set_session(&mut self, session: u64) {
        self.session = session;
    }
}

/// An error reply's text: UTF-8 (lossy: server bytes are hostile), at most `TEXT_LEN_MAX` bytes.
fn error_text(body: &[u8]) -> String {
    let body = &body[..body.len().min(TEXT_LEN_MAX)];
    String::from_utf8_lossy(body).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Responder, hello_reply_body, reply_frame};
    use shoal_proto::protocol::encode_session;

    const CLIENT: u64 = 0xc1;

    fn connection(in_flight_max: usize) -> Connection {
        Connection::new(ConnectionConfig {
            cluster: 1,
            client: CLIENT,
            in_flight_max,
            frame_size_bytes_max: 1 << 20,
            reply_size_bytes_max: 1 << 20,
        })
    }

    /// A connection whose Hello has been answered.
    fn ready(in_flight_max: usize) -> Connection {
        let mut conn = connection(in_flight_max);
        let request = conn.hello("test").unwrap();
        conn.take_outgoing(Vec::new());
        conn.on_bytes(&reply_frame(1, CLIENT, request, Operation::Hello, 0, &hello_reply_body(1)));
        let reply = conn.poll_reply().unwrap().unwrap();
        assert!(reply.result.is_ok());
        conn
    }

    #[test]
    fn connection_hello_must_come_first_and_is_recorded() {
        let mut conn = connection(4);
        assert!(matches!(conn.request(Operation::Status, &[]), Err(ClientError::Invalid(_))));
        assert!(!conn.wants_write());
        let request = conn.hello("me").unwrap();
        assert_eq!(request, 1);
        assert_eq!(conn.hello_state(), &HelloState::Sent);
        assert!(conn.hello("again").is_err());
        // Requests may be pipelined behind Hello: the server answers in order.
        assert_eq!(conn.request(Operation::Status, &[]).unwrap(), 2);

        let mut responder = Responder::new(1);
        let requests = responder.requests(&conn.take_outgoing(Vec::new()));
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].operation, Operation::Hello);
        let hello = Hello::decode(&requests[0].body).unwrap();
        assert_eq!((hello.version_min, hello.version_max), (1, PROTOCOL_VERSION));
        assert_eq!(hello.client_name, "me");

        conn.on_bytes(&reply_frame(1, CLIENT, 1, Operation::Hello, 0, &hello_reply_body(1)));
        let reply = conn.poll_reply().unwrap().unwrap();
        assert_eq!((reply.request, reply.operation), (1, Operation::Hello));
        assert_eq!(conn.version(), Some(1));
        assert_eq!(conn.poll_reply().unwrap().map(|r| r.request), None);
    }

    #[test]
    fn connection_unsupported_version_is_an_error_and_ends_the_connection() {
        let mut conn = connection(4);
        conn.hello("me").unwrap();
        let text = b"no protocol version in common";
        conn.on_bytes(&reply_frame(1, CLIENT, 1, Operation::Hello, 2, text));
        let reply = conn.poll_reply().unwrap().unwrap();
        match reply.result {
            Err(ClientError::Server { code: ErrorCode::UnsupportedVersion, message }) => {
                assert_eq!(message, "no protocol version in common");
            }
            other => panic!("{other:?}"),
        }
        assert!(conn.is_failed());
        assert!(conn.request(Operation::Status, &[]).is_err());

        // A version the client does not speak, even in a success reply, is refused.
        let mut conn = connection(4);
        conn.hello("me").unwrap();
        conn.on_bytes(&reply_frame(1, CLIENT, 1, Operation::Hello, 0, &hello_reply_body(9)));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));
    }

    #[test]
    fn connection_reply_out_of_order_or_foreign_is_a_protocol_error() {
        // Wrong request number: the reply to 3 arrives while 2 is the head.
        let mut conn = ready(4);
        conn.request(Operation::Status, &[]).unwrap();
        conn.request(Operation::Status, &[]).unwrap();
        conn.on_bytes(&reply_frame(1, CLIENT, 3, Operation::Status, 0, b"{}"));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));
        assert!(conn.is_failed());
        assert!(conn.poll_reply().is_err(), "stays failed");
        assert!(conn.request(Operation::Status, &[]).is_err());

        // Another client's reply.
        let mut conn = ready(4);
        conn.request(Operation::Status, &[]).unwrap();
        conn.on_bytes(&reply_frame(1, CLIENT + 1, 2, Operation::Status, 0, b"{}"));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));

        // The right number for the wrong operation.
        let mut conn = ready(4);
        conn.request(Operation::Status, &[]).unwrap();
        conn.on_bytes(&reply_frame(1, CLIENT, 2, Operation::ListStreams, 0, &[0; 4]));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));

        // A reply nobody asked for.
        let mut conn = ready(4);
        conn.on_bytes(&reply_frame(1, CLIENT, 2, Operation::Status, 0, b"{}"));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));

        // An error code this build does not know.
        let mut conn = ready(4);
        conn.request(Operation::Status, &[]).unwrap();
        conn.on_bytes(&crate::testing::reply_frame_with(1, CLIENT, 2, 12, 999, b"?"));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));
    }

    #[test]
    fn connection_pipelines_up_to_in_flight_max_and_matches_in_order() {
        let mut conn = ready(3);
        let requests: Vec<u64> =
            (0..3).map(|_| conn.request(Operation::ListStreams, &[]).unwrap()).collect();
        assert_eq!(requests, [2, 3, 4]);
        assert!(!conn.has_room());
        assert!(matches!(conn.request(Operation::ListStreams, &[]), Err(ClientError::Invalid(_))));
        assert_eq!(conn.outstanding().collect::<Vec<_>>(), requests);

        let mut bytes = Vec::new();
        bytes.extend(reply_frame(1, CLIENT, 2, Operation::ListStreams, 0, &[0; 4]));
        bytes.extend(reply_frame(1, CLIENT, 3, Operation::ListStreams, 6, b"StreamNotFound x"));
        bytes.extend(reply_frame(1, CLIENT, 4, Operation::ListStreams, 0, &[0; 4]));
        conn.on_bytes(&bytes);
        let first = conn.poll_reply().unwrap().unwrap();
        assert_eq!(first.request, 2);
        assert!(conn.has_room());
        let second = conn.poll_reply().unwrap().unwrap();
        assert_eq!(second.result.unwrap_err().code(), Some(ErrorCode::StreamNotFound));
        assert!(!conn.is_failed(), "an ordinary error leaves the connection usable");
        assert_eq!(conn.poll_reply().unwrap().unwrap().request, 4);
        assert_eq!(conn.in_flight(), 0);
    }

    #[test]
    fn connection_register_records_the_session_and_requests_carry_it() {
        let mut conn = ready(4);
        conn.take_outgoing(Vec::new());
        conn.request(Operation::Register, &[]).unwrap();
        conn.on_bytes(&reply_frame(1, CLIENT, 2, Operation::Register, 0, &encode_session(42)));
        conn.poll_reply().unwrap().unwrap();
        assert_eq!(conn.session(), 42);
        conn.take_outgoing(Vec::new());
        conn.request(Operation::Status, &[]).unwrap();
        let mut responder = Responder::new(1);
        let sent = responder.requests(&conn.take_outgoing(Vec::new()));
        assert_eq!((sent[0].session, sent[0].request), (42, 3));

        // A session body of the wrong size is a protocol error.
        let mut conn = ready(4);
        conn.request(Operation::Register, &[]).unwrap();
        conn.on_bytes(&reply_frame(1, CLIENT, 2, Operation::Register, 0, &[1, 2, 3]));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));
    }

    #[test]
    fn connection_reads_a_structured_not_primary_from_version_3_on() {
        let redirect = NotPrimary {
            view: 4,
            primary: 2,
            address: "10.0.0.3:7070".into(),
            text: "replica 2 leads view 4".into(),
        };
        let mut conn = connection(4);
        let request = conn.hello("test").unwrap();
        conn.on_bytes(&reply_frame(1, CLIENT, request, Operation::Hello, 0, &hello_reply_body(3)));
        conn.poll_reply().unwrap().unwrap();
        for _ in 0..2 {
            conn.request(Operation::Fetch, &[]).unwrap();
        }
        let code = ErrorCode::NotPrimary as u32;
        conn.on_bytes(&reply_frame(1, CLIENT, 2, Operation::Fetch, code, &redirect.encode()));
        match conn.poll_reply().unwrap().unwrap().result {
            Err(ClientError::NotPrimary(got)) => assert_eq!(got, redirect),
            other => panic!("{other:?}"),
        }
        assert!(!conn.is_failed(), "a redirect leaves the connection usable");
        // A version 3 NotPrimary body that does not decode breaks the connection.
        conn.on_bytes(&reply_frame(1, CLIENT, 3, Operation::Fetch, code, b"plain text"));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Protocol(_))));

        // Before version 3 the body is the text alone.
        let mut conn = ready(4);
        conn.request(Operation::Fetch, &[]).unwrap();
        conn.on_bytes(&reply_frame(
            1,
            CLIENT,
            2,
            Operation::Fetch,
            code,
            b"replica 2 leads view 4",
        ));
        match conn.poll_reply().unwrap().unwrap().result {
            Err(ClientError::Server { code: ErrorCode::NotPrimary, message }) => {
                assert_eq!(message, "replica 2 leads view 4");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn connection_end_of_stream_fails_everything_outstanding() {
        let mut conn = ready(4);
        conn.request(Operation::Status, &[]).unwrap();
        assert!(matches!(conn.on_closed(), ClientError::Closed));
        assert!(matches!(conn.poll_reply(), Err(ClientError::Closed)));
        assert_eq!(conn.in_flight(), 1, "the caller learns which requests were lost");
    }
}
