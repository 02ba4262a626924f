//! Framing of the native protocol, sans-IO: request frames out, reply frames in.
//!
//! A frame is one `proto::wire` header (256 bytes, `Command::Request` or `Command::Reply`)
//! followed by its body. [`RequestEncoder`] owns a connection's request numbering and writes
//! sealed request frames into a caller's buffer; [`FrameDecoder`] is fed whatever byte chunks the
//! socket delivers and yields complete, verified reply frames.
//!
//! The decoder treats every byte as hostile (DESIGN.md §6): it verifies the header checksum
//! before believing any field, refuses a frame larger than its configured limit *before*
//! buffering or allocating for the body, and verifies the body checksum before handing a body
//! out. Once a frame fails, the byte stream has lost its framing, so the decoder stays failed.
//! This module never interprets a body (that is `connection` and the callers'), never touches a
//! socket or a clock, and never panics on any input bytes.

use std::fmt;

use bytes::{Bytes, BytesMut};
use shoal_proto::protocol::Operation;
use shoal_proto::wire::{ClientReply, ClientRequest, Command, HEADER_SIZE, Header, HeaderError};

use crate::error::ClientError;

/// Largest frame any side may describe: the header's `size` field is a `u32`.
const FRAME_SIZE_BYTES_LIMIT: usize = u32::MAX as usize;

/// Writes request frames and numbers them: request numbers start at 1 (or where
/// [`RequestEncoder::continue_from`] says) and increase by one per frame. A client continues its
/// numbering on every new connection, so that a request number names one request of the session
/// for good: the server's client table deduplicates admin requests by (session, request).
#[derive(Debug)]
pub struct RequestEncoder {
    cluster: u64,
    client: u64,
    next_request: u64,
    frame_size_bytes_max: usize,
}

impl RequestEncoder {
    /// An encoder for `client` on a connection to `cluster`, refusing frames (header plus body)
    /// over `frame_size_bytes_max` bytes.
    pub fn new(cluster: u64, client: u64, frame_size_bytes_max: usize) -> RequestEncoder {
        RequestEncoder {
            cluster,
            client,
            next_request: 1,
            frame_size_bytes_max: frame_size_bytes_max.clamp(HEADER_SIZE, FRAME_SIZE_BYTES_LIMIT),
        }
    }

    /// Continues the numbering at `next_request` (never backwards), as a new connection of a
    /// client that sent requests before must.
    pub fn continue_from(&mut self, next_request: u64) {
        self.next_request = self.next_request.max(next_request);
    }

    /// The number the next frame will carry.
    pub fn next_request(&self) -> u64 {
        self.next_request
    }

    /// Appends one sealed request frame to `out`: the header, then the concatenation of
    /// `body_parts` (so a produce prefix and its batch need no joining copy). Returns the request
    /// number it used. A frame over the limit is refused and `out` is left as it was.
    pub fn encode(
        &mut self,
        out: &mut Vec<u8>,
        session: u64,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<u64, ClientError> {
        let body_size: usize = body_parts.iter().map(|part| part.len()).sum();
        let frame_size = HEADER_SIZE.saturating_add(body_size);
        if frame_size > self.frame_size_bytes_max {
            return Err(ClientError::Invalid(format!(
                "a {operation:?} frame of {frame_size} bytes is over the frame limit of {} bytes",
                self.frame_size_bytes_max
            )));
        }
        let request = self.next_request;
        let start = out.len();
        out.reserve(frame_size);
        // The header commits to the body's checksum, so the body goes in first and the header
        // is written over the placeholder afterwards.
        out.resize(start + HEADER_SIZE, 0);
        for part in body_parts {
            out.extend_from_slice(part);
        }
        let fields =
            ClientRequest { client: self.client, session, request, operation: operation as u32 };
        let header = Header::request(self.cluster, fields, &out[start + HEADER_SIZE..]);
        out[start..start + HEADER_SIZE].copy_from_slice(&header.encode());
        self.next_request += 1;
        Ok(request)
    }
}

/// One complete, verified reply frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplyFrame {
    /// The reply's header fields: client, request number, operation and error code.
    pub reply: ClientReply,
    /// The body: the operation's result, or the error's text. A view of the decoder's buffer,
    /// not a copy.
    pub body: Bytes,
}

/// Why bytes from the server are not a valid reply frame. After any of these, the connection's
/// framing is lost and it must be closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The header did not decode (checksum, version, command byte, reserved bytes, size).
    Header(HeaderError),
    /// A valid header of a command other than `Reply`.
    NotAReply(Command),
    /// A reply from another cluster.
    WrongCluster {
        /// The cluster this client talks to.
        expected: u64,
        /// The cluster the frame names.
        found: u64,
    },
    /// The frame is larger than the configured limit; nothing was allocated for it.
    TooLarge {
        /// Header plus body, as the header declares.
        size: usize,
        /// The configured limit.
        max: usize,
    },
    /// The body does not match the header's body checksum.
    Body(HeaderError),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::Header(error) => write!(f, "bad reply header: {error}"),
            FrameError::NotAReply(command) => {
                write!(f, "expected a Reply frame, got a {command:?} frame")
            }
            FrameError::WrongCluster { expected, found } => {
                write!(
                    f,
                    "a reply from cluster {found}, but this client talks to cluster {expected}"
                )
            }
            FrameError::TooLarge { size, max } => {
                write!(f, "a reply frame of {size} bytes is over the limit of {max} bytes")
            }
            FrameError::Body(error) => write!(f, "bad reply body: {error}"),
        }
    }
}

impl std::error::Error for FrameError {}

impl From<FrameError> for ClientError {
    fn from(error: FrameError) -> Self {
        ClientError::Protocol(error.to_string())
    }
}

/// Reassembles reply frames from arbitrary byte chunks.
#[derive(Debug)]
pub struct FrameDecoder {
    cluster: u64,
    frame_size_bytes_max: usize,
    buffer: BytesMut,
    /// The header of the frame whose body is still arriving (already verified and bounded).
    pending: Option<Header>,
    failed: Option<FrameError>,
}

impl FrameDecoder {
    /// A decoder for replies from `cluster`, refusing frames (header plus body) over
    /// `frame_size_bytes_max` bytes.
    pub fn new(cluster: u64, frame_size_bytes_max: usize) -> FrameDecoder {
        FrameDecoder {
            cluster,
            frame_size_bytes_max: frame_size_bytes_max.clamp(HEADER_SIZE, FRAME_SIZE_BYTES_LIMIT),
            buffer: BytesMut::new(),
            pending: None,
            failed: None,
        }
    }

    /// Appends bytes received from the socket. Call [`FrameDecoder::next_frame`] until it
    /// returns `Ok(None)` after each feed: that keeps the buffer within one frame plus one chunk.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.failed.is_none() {
            self.buffer.extend_from_slice(bytes);
        }
    }

    /// Bytes buffered and not yet returned as a frame.
    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }

    /// Whether bytes of an incomplete frame are buffered (a clean end of stream has none).
    pub fn is_mid_frame(&self) -> bool {
        !self.buffer.is_empty()
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed, or the error that ended the
    /// stream's framing (returned again on every later call).
    pub fn next_frame(&mut self) -> Result<Option<ReplyFrame>, FrameError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        match self.decode() {
            Ok(frame) => Ok(frame),
            Err(error) => {
                self.failed = Some(error.clone());
                // Nothing after a framing error can be trusted; let the memory go.
                self.buffer = BytesMut::new();
                self.pending = None;
                Err(error)
            }
        }
    }

    fn decode(&mut self) -> Result<Option<ReplyFrame>, FrameError> {
        let header = match self.pending {
            Some(header) => header,
            None => {
                if self.buffer.len() < HEADER_SIZE {
                    return Ok(None);
                }
                let header = Header::decode_prefix(&self.buffer).map_err(FrameError::Header)?;
                if header.command != Command::Reply {
                    return Err(FrameError::NotAReply(header.command));
                }
                if header.cluster != self.cluster {
                    return Err(FrameError::WrongCluster {
                        expected: self.cluster,
                        found: header.cluster,
                    });
                }
                let size = header.size as usize;
                if size > self.frame_size_bytes_max {
                    return Err(FrameError::TooLarge { size, max: self.frame_size_bytes_max });
                }
                self.pending = Some(header);
                header
            }
        };
        let size = header.size as usize;
        if self.buffer.len() < size {
            // Bounded above by the limit check: at most one frame's worth is reserved.
            self.buffer.reserve(size - self.buffer.len());
            return Ok(None);
        }
        self.pending = None;
        let frame = self.buffer.split_to(size).freeze();
        let body = frame.slice(HEADER_SIZE..);
        header.verify_body(&body).map_err(FrameError::Body)?;
        let reply = match header.as_reply() {
            Some(reply) => *reply,
            // `command == Reply` implies reply fields (the header's invariant); a mismatch is
            // still only a protocol error, never a panic.
            None => return Err(FrameError::NotAReply(header.command)),
        };
        Ok(Some(ReplyFrame { reply, body }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{reply_frame, reply_frame_with};
    use shoal_proto::wire::Fields;

    const CLUSTER: u64 = 1;

    fn decode_all(decoder: &mut FrameDecoder) -> Vec<ReplyFrame> {
        let mut frames = Vec::new();
        while let Some(frame) = decoder.next_frame().expect("valid frames") {
            frames.push(frame);
        }
        frames
    }

    #[test]
    fn codec_request_round_trips_through_the_wire_header() {
        let mut encoder = RequestEncoder::new(CLUSTER, 77, 1 << 20);
        let mut out = Vec::new();
        let first = encoder.encode(&mut out, 0, Operation::Hello, &[b"ab", b"", b"cd"]).unwrap();
        let second = encoder.encode(&mut out, 9, Operation::Status, &[]).unwrap();
        assert_eq!((first, second), (1, 2));
        assert_eq!(encoder.next_request(), 3);

        let header = Header::decode_prefix(&out).unwrap();
        assert_eq!(header.command, Command::Request);
        assert_eq!(header.cluster, CLUSTER);
        assert_eq!(header.body_size(), 4);
        let body = &out[HEADER_SIZE..HEADER_SIZE + 4];
        assert_eq!(body, b"abcd");
        header.verify_body(body).unwrap();
        assert_eq!(
            header.fields,
            Fields::Request(ClientRequest {
                client: 77,
                session: 0,
                request: 1,
                operation: Operation::Hello as u32
            })
        );
        let next = Header::decode_prefix(&out[HEADER_SIZE + 4..]).unwrap();
        assert_eq!(next.size as usize, HEADER_SIZE);
        assert_eq!(next.as_request().map(|r| (r.session, r.request)), Some((9, 2)));
    }

    #[test]
    fn codec_request_over_the_frame_limit_is_refused_and_leaves_the_buffer_alone() {
        let mut encoder = RequestEncoder::new(CLUSTER, 1, HEADER_SIZE + 10);
        let mut out = vec![7];
        assert!(encoder.encode(&mut out, 0, Operation::Produce, &[&[0; 10]]).is_ok());
        let before = out.clone();
        let error = encoder.encode(&mut out, 0, Operation::Produce, &[&[0; 6], &[0; 5]]);
        assert!(matches!(error, Err(ClientError::Invalid(_))), "{error:?}");
        assert_eq!(out, before);
        assert_eq!(encoder.next_request(), 2, "a refused frame uses no request number");
    }

    #[test]
    fn codec_reply_split_at_every_byte_boundary_decodes_the_same() {
        let mut stream = reply_frame(CLUSTER, 5, 1, Operation::Status, 0, b"{\"shards\":1}");
        stream.extend(reply_frame(CLUSTER, 5, 2, Operation::ListStreams, 0, &[0; 4]));
        stream.extend(reply_frame(CLUSTER, 5, 3, Operation::CreateStream, 0, b""));
        let mut whole = FrameDecoder::new(CLUSTER, 1 << 20);
        whole.feed(&stream);
        let expected = decode_all(&mut whole);
        assert_eq!(expected.len(), 3);
        assert_eq!(&expected[0].body[..], b"{\"shards\":1}");
        assert_eq!(expected[2].reply.request, 3);

        for split in 0..=stream.len() {
            let mut decoder = FrameDecoder::new(CLUSTER, 1 << 20);
            decoder.feed(&stream[..split]);
            let mut frames = decode_all(&mut decoder);
            decoder.feed(&stream[split..]);
            frames.extend(decode_all(&mut decoder));
            assert_eq!(frames, expected, "split at {split}");
            assert!(!decoder.is_mid_frame());
        }
        // And one byte at a time.
        let mut decoder = FrameDecoder::new(CLUSTER, 1 << 20);
        let mut frames = Vec::new();
        for byte in &stream {
            decoder.feed(std::slice::from_ref(byte));
            frames.extend(decode_all(&mut decoder));
        }
        assert_eq!(frames, expected);
    }

    #[test]
    fn codec_oversized_reply_is_refused_from_its_header_before_the_body_is_buffered() {
        let max = HEADER_SIZE + 100;
        let frame = reply_frame(CLUSTER, 5, 1, Operation::Fetch, 0, &[1; 101]);
        let mut decoder = FrameDecoder::new(CLUSTER, max);
        // Only the header has arrived: the size alone condemns the frame.
        decoder.feed(&frame[..HEADER_SIZE]);
        assert_eq!(
            decoder.next_frame(),
            Err(FrameError::TooLarge { size: HEADER_SIZE + 101, max })
        );
        assert!(decoder.buffer.capacity() <= HEADER_SIZE, "nothing reserved for the body");
        // The decoder stays failed, whatever follows.
        decoder.feed(&frame[HEADER_SIZE..]);
        assert!(decoder.next_frame().is_err());
        assert_eq!(decoder.buffered(), 0);

        // A claimed 4 GiB body is refused the same way, without allocating it.
        let mut header = Header::decode_prefix(&frame).unwrap();
        header.size = u32::MAX;
        header.seal();
        let mut decoder = FrameDecoder::new(CLUSTER, max);
        decoder.feed(&header.encode());
        assert!(matches!(decoder.next_frame(), Err(FrameError::TooLarge { .. })));

        // At the limit exactly it is accepted.
        let frame = reply_frame(CLUSTER, 5, 1, Operation::Fetch, 0, &[1; 100]);
        let mut decoder = FrameDecoder::new(CLUSTER, max);
        decoder.feed(&frame);
        assert_eq!(decode_all(&mut decoder).len(), 1);
    }

    #[test]
    fn codec_bad_checksums_command_and_cluster_are_protocol_errors() {
        let frame = reply_frame(CLUSTER, 5, 1, Operation::Status, 0, b"body");

        let mut corrupt_header = frame.clone();
        corrupt_header[40] ^= 1;
        let mut decoder = FrameDecoder::new(CLUSTER, 1 << 20);
        decoder.feed(&corrupt_header);
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::Header(HeaderError::BadChecksum { .. }))
        ));

        let mut corrupt_body = frame.clone();
        *corrupt_body.last_mut().unwrap() ^= 1;
        let mut decoder = FrameDecoder::new(CLUSTER, 1 << 20);
        decoder.feed(&corrupt_body);
        assert!(matches!(
            decoder.next_frame(),
            Err(FrameError::Body(HeaderError::BadBodyChecksum { .. }))
        ));

        let mut encoder = RequestEncoder::new(CLUSTER, 5, 1 << 20);
        let mut request = Vec::new();
        encoder.encode(&mut request, 0, Operation::Status, &[]).unwrap();
        let mut decoder = FrameDecoder::new(CLUSTER, 1 << 20);
        decoder.feed(&request);
        assert_eq!(decoder.next_frame(), Err(FrameError::NotAReply(Command::Request)));

        let mut decoder = FrameDecoder::new(2, 1 << 20);
        decoder.feed(&frame);
        assert_eq!(decoder.next_frame(), Err(FrameError::WrongCluster { expected: 2, found: 1 }));

        // Garbage of every length never panics.
        for len in 0..600 {
            let garbage: Vec<u8> = (0..len).map(|i| (i * 31 + 7) as u8).collect();
            let mut decoder = FrameDecoder::new(CLUSTER, 1 << 20);
            decoder.feed(&garbage);
            let _ = decoder.next_frame();
        }
        // An error frame's fields come through as they are; interpreting them is the caller's.
        let error = reply_frame_with(CLUSTER, 5, 1, Operation::Status as u32, 6, b"no such stream");
        let mut decoder = FrameDecoder::new(CLUSTER, 1 << 20);
        decoder.feed(&error);
        let frame = decoder.next_frame().unwrap().unwrap();
        assert_eq!(frame.reply.error, 6);
    }
}
