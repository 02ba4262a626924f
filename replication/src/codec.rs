//! Replica messages on the wire: each [`Message`] as one `engine::wire` header plus body, and
//! the coalesced Commit heartbeat that carries many groups' commit points between two nodes.
//!
//! This module owns the mapping only. Decoding treats every byte as hostile: the header checksum
//! first, then the size against the caller's bound before the body is touched, the body
//! checksum, then counts against their bounds before anything is allocated. It never panics on
//! input and never decides what a message means.

use std::fmt;

use bytes::{Bytes, BytesMut};
use shoal_proto::wire::{
    self, BodyError, Command, CommitEntry, HEADER_SIZE, Header, HeaderError, VIEW_HEADER_FLAG_NACK,
    VIEW_HEADER_FLAG_PRESENT,
};

use crate::message::{FLAG_NACK, FLAG_PRESENT, Message};

const _: () =
    assert!(FLAG_PRESENT == VIEW_HEADER_FLAG_PRESENT && FLAG_NACK == VIEW_HEADER_FLAG_NACK);

/// Bounds a decoder enforces before allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodecLimits {
    /// Largest message (header and body) accepted.
    pub message_size_bytes_max: usize,
    /// Most headers in a DoViewChange or StartView.
    pub view_headers_max: usize,
    /// Most groups in one Commit heartbeat.
    pub commit_entries_max: usize,
}

/// Why bytes were not accepted as a replica message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// The header failed its checks.
    Header(HeaderError),
    /// The message is larger than the bound.
    TooLarge {
        /// Its declared size.
        size_bytes: u64,
    },
    /// The packet is not exactly one message long.
    Framing {
        /// Bytes the header declares.
        declared: u64,
        /// Bytes received.
        actual: usize,
    },
    /// The body failed its checks.
    Body(BodyError),
    /// A command that is not a replica message (a journal entry, say).
    NotReplicaMessage(Command),
    /// A field holds a value the protocol never sends.
    Invalid(&'static str),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Header(error) => write!(f, "bad header: {error}"),
            DecodeError::TooLarge { size_bytes } => {
                write!(f, "message of {size_bytes} bytes exceeds the configured maximum")
            }
            DecodeError::Framing { declared, actual } => {
                write!(f, "packet of {actual} bytes holds a message of {declared}")
            }
            DecodeError::Body(error) => write!(f, "bad body: {error:?}"),
            DecodeError::NotReplicaMessage(command) => {
                write!(f, "{command:?} is not a replica message")
            }
            DecodeError::Invalid(what) => write!(f, "invalid field: {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Encodes one message of `group` from replica `from`.
pub fn encode(cluster: u64, from: u8, group: u64, message: &Message) -> Bytes {
    let (header, body): (Header, Bytes) = match message {
        Message::Prepare { header, body } => (*header, body.clone()),
        Message::PrepareOk { view, op, commit, prepare_checksum } => {
            let fields = wire::PrepareOk {
                group,
                op: *op,
                commit: *commit,
                prepare_checksum: *prepare_checksum,
            };
            (Header::prepare_ok(cluster, *view, from, fields), Bytes::new())
        }
        Message::Commit { view, commit, commit_checksum } => {
            let entry = CommitEntry {
                group,
                commit: *commit,
                commit_checksum: *commit_checksum,
                view: *view,
            };
            return encode_commits(cluster, from, &[entry]);
        }
        Message::StartViewChange { view, membership } => {
            let fields = wire::StartViewChange { group, membership: *membership };
            (Header::start_view_change(cluster, *view, from, fields), Bytes::new())
        }
        Message::DoViewChange {
            view,
            log_view,
            op,
            commit,
            faulty_from,
            log_complete,
            log_view_head_op,
            headers,
            flags,
        } => {
            let body = wire::encode_view_headers(headers, Some(flags));
            let mut dvc_flags = 0;
            if *log_complete {
                dvc_flags |= wire::DO_VIEW_CHANGE_FLAG_LOG_COMPLETE;
            }
            if log_view_head_op.is_some() {
                dvc_flags |= wire::DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN;
            }
            let fields = wire::DoViewChange {
                group,
                op: *op,
                commit: *commit,
                faulty_from: faulty_from.unwrap_or(0),
                log_view: *log_view,
                header_count: headers.len() as u32,
                flags: dvc_flags,
                log_view_head_op: log_view_head_op.unwrap_or(0),
            };
            (Header::do_view_change(cluster, *view, from, fields, &body), Bytes::from(body))
        }
        Message::StartView { view, op, commit, nonce, headers, membership } => {
            let body = wire::encode_view_headers(headers, None);
            let fields = wire::StartView {
                group,
                op: *op,
                commit: *commit,
                nonce: *nonce,
                header_count: headers.len() as u32,
                membership: *membership,
            };
            (Header::start_view(cluster, *view, from, fields, &body), Bytes::from(body))
        }
        Message::RequestStartView { view, nonce } => {
            let fields = wire::RequestStartView { group, nonce: *nonce };
            (Header::request_start_view(cluster, *view, from, fields), Bytes::new())
        }
        Message::RequestPrepare { view, op, checksum } => {
            let fields = match checksum {
                Some(checksum) => wire::RequestPrepare::by_checksum(group, *op, *checksum),
                None => wire::RequestPrepare::committed(group, *op),
            };
            (Header::request_prepare(cluster, *view, from, fields), Bytes::new())
        }
        Message::RangeEvicted { view, op, op_min } => {
            let fields = wire::RangeEvicted { group, op: *op, op_min: *op_min };
            (Header::range_evicted(cluster, *view, from, fields), Bytes::new())
        }
        Message::RequestState { view, op, offset_bytes } => {
            let fields = wire::RequestState { group, op: *op, offset_bytes: *offset_bytes };
            (Header::request_state(cluster, *view, from, fields), Bytes::new())
        }
        Message::StateChunk {
            view,
            op,
            end_offset,
            size_bytes,
            offset_bytes,
            prepare_checksum,
            state_checksum,
            chunk,
        } => {
            let fields = wire::StateChunk {
                group,
                op: *op,
                end_offset: *end_offset,
                size_bytes: *size_bytes,
                offset_bytes: *offset_bytes,
                prepare_checksum: *prepare_checksum,
                state_checksum: *state_checksum,
                chunk_size_bytes: 0,
            };
            (Header::state_chunk(cluster, *view, from, fields, chunk), chunk.clone())
        }
    };
    frame(&header, &body)
}

/// One Commit heartbeat carrying the commit points of many groups.
pub fn encode_commits(cluster: u64, from: u8, entries: &[CommitEntry]) -> Bytes {
    let body = wire::encode_commit_entries(entries);
    let fields = wire::Commit { entry_count: entries.len() as u32 };
    frame(&Header::commit(cluster, from, fields, &body), &body)
}

fn frame(header: &Header, body: &[u8]) -> Bytes {
    let mut bytes = BytesMut::with_capacity(HEADER_SIZE + body.len());
    bytes.extend_from_slice(&header.encode());
    bytes.extend_from_slice(body);
    bytes.freeze()
}

/// Decodes one packet of cluster `cluster` into its sender and (group, message) pairs (one,
/// or one per group of a Commit heartbeat).
pub fn decode(
    cluster: u64,
    packet: &Bytes,
    limits: &CodecLimits,
) -> Result<(u8, Vec<(u64, Message)>), DecodeError> {
    let header = Header::decode_prefix(packet).map_err(DecodeError::Header)?;
    if header.size as usize > limits.message_size_bytes_max {
        return Err(DecodeError::TooLarge { size_bytes: u64::from(header.size) });
    }
    if packet.len() != header.size as usize {
        return Err(DecodeError::Framing {
            declared: u64::from(header.size),
            actual: packet.len(),
        });
    }
    if header.cluster != cluster {
        return Err(DecodeError::Invalid("cluster"));
    }
    let body = packet.slice(HEADER_SIZE..);
    header.verify_body(&body).map_err(DecodeError::Header)?;
    let view = header.view;
    let message = match header.command {
        Command::Prepare => {
            let group = header.as_prepare().expect("command checked").group;
            (group, Message::Prepare { header, body })
        }
        Command::PrepareOk => {
            let f = header.as_prepare_ok().expect("command checked");
            let message = Message::PrepareOk {
                view,
                op: f.op,
                commit: f.commit,
                prepare_checksum: f.prepare_checksum,
            };
            (f.group, message)
        }
        Command::Commit => {
            let entries = wire::decode_commit_entries(&header, &body, limits.commit_entries_max)
                .map_err(DecodeError::Body)?;
            let messages = entries
                .into_iter()
                .map(|e| {
                    let message = Message::Commit {
                        view: e.view,
                        commit: e.commit,
                        commit_checksum: e.commit_checksum,
                    };
                    (e.group, message)
                })
                .collect();
            return Ok((header.replica, messages));
        }
        Command::StartViewChange => {
            let f = header.as_start_view_change().expect("command checked");
            (f.group, Message::StartViewChange { view, membership: f.membership })
        }
        Command::DoViewChange => {
            let f = *header.as_do_view_change().expect("command checked");
            let (headers, flags) =
                wire::decode_view_headers(&body, f.header_count, true, limits.view_headers_max)
                    .map_err(DecodeError::Body)?;
            let message = Message::DoViewChange {
                view,
                log_view: f.log_view,
                op: f.op,
                commit: f.commit,
                faulty_from: (f.faulty_from != 0).then_some(f.faulty_from),
                log_complete: f.flags & wire::DO_VIEW_CHANGE_FLAG_LOG_COMPLETE != 0,
                log_view_head_op: (f.flags & wire::DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN != 0)
                    .then_some(f.log_view_head_op),
                headers,
                flags,
            };
            (f.group, message)
        }
        Command::StartView => {
            let f = *header.as_start_view().expect("command checked");
            let (headers, _) =
                wire::decode_view_headers(&body, f.header_count, false, limits.view_headers_max)
                    .map_err(DecodeError::Body)?;
            let message = Message::StartView {
                view,
                op: f.op,
                commit: f.commit,
                nonce: f.nonce,
                headers,
                membership: f.membership,
            };
            (f.group, message)
        }
        Command::RequestStartView => {
            let f = header.as_request_start_view().expect("command checked");
            (f.group, Message::RequestStartView { view, nonce: f.nonce })
        }
        Command::RequestPrepare => {
            let f = header.as_request_prepare().expect("command checked");
            (f.group, Message::RequestPrepare { view, op: f.op, checksum: f.checksum_given() })
        }
        Command::RangeEvicted => {
            let f = header.as_range_evicted().expect("command checked");
            (f.group, Message::RangeEvicted { view, op: f.op, op_min: f.op_min })
        }
        Command::RequestState => {
            let f = header.as_request_state().expect("command checked");
            (f.group, Message::RequestState { view, op: f.op, offset_bytes: f.offset_bytes })
        }
        Command::StateChunk => {
            let f = *header.as_state_chunk().expect("command checked");
            let message = Message::StateChunk {
                view,
                op: f.op,
                end_offset: f.end_offset,
                size_bytes: f.size_bytes,
                offset_bytes: f.offset_bytes,
                prepare_checksum: f.prepare_checksum,
                state_checksum: f.state_checksum,
                chunk: body,
            };
            (f.group, message)
        }
        command @ (Command::Reserved
        | Command::JournalEntry
        | Command::Request
        | Command::Reply
        | Command::Handshake
        | Command::HandshakeRefused) => {
            return Err(DecodeError::NotReplicaMessage(command));
        }
    };
    Ok((header.replica, vec![message]))
}

#[cfg(test)]
mod tests {
    use shoal_proto::wire::{Membership, Prepare};

    use super::*;

    const LIMITS: CodecLimits =
        CodecLimits { message_size_bytes_max: 1 << 20, view_headers_max: 8, commit_entries_max: 4 };

    fn prepare(op: u64, parent: u32) -> Header {
        let fields = Prepare {
            group: 3,
            op,
            parent,
            record_count: 1,
            base_offset: op - 1,
            ..Default::default()
        };
        Header::prepare(9, 1, 0, fields, b"x")
    }

    #[test]
    fn every_message_round_trips() {
        let h1 = prepare(1, 0);
        let h2 = prepare(2, h1.checksum_header);
        let messages = [
            Message::Prepare { header: h1, body: Bytes::from_static(b"x") },
            Message::PrepareOk { view: 2, op: 5, commit: 4, prepare_checksum: 77 },
            Message::Commit { view: 2, commit: 9, commit_checksum: 5 },
            Message::StartViewChange { view: 3, membership: Membership::first(3, 3) },
            Message::DoViewChange {
                view: 3,
                log_view: 2,
                op: 2,
                commit: 1,
                faulty_from: Some(2),
                log_complete: true,
                log_view_head_op: Some(1),
                headers: vec![h1, h2],
                flags: vec![FLAG_PRESENT, 0],
            },
            Message::DoViewChange {
                view: 3,
                log_view: 2,
                op: 0,
                commit: 0,
                faulty_from: None,
                log_complete: false,
                log_view_head_op: None,
                headers: vec![],
                flags: vec![],
            },
            Message::DoViewChange {
                view: 3,
                log_view: 2,
                op: 0,
                commit: 0,
                faulty_from: None,
                log_complete: false,
                log_view_head_op: Some(0),
                headers: vec![],
                flags: vec![],
            },
            Message::StartView {
                view: 3,
                op: 2,
                commit: 1,
                nonce: 11,
                headers: vec![h1, h2],
                membership: Membership { voters: 0b011, learners: 0b100 },
            },
            Message::RequestStartView { view: 3, nonce: 12 },
            Message::RequestPrepare { view: 3, op: 2, checksum: Some(h2.checksum_header) },
            Message::RequestPrepare { view: 3, op: 2, checksum: None },
            Message::RangeEvicted { view: 3, op: 2, op_min: 40 },
            Message::RequestState { view: 3, op: 0, offset_bytes: 0 },
            Message::RequestState { view: 3, op: 41, offset_bytes: 4096 },
            Message::StateChunk {
                view: 3,
                op: 41,
                end_offset: 900,
                size_bytes: 5000,
                offset_bytes: 4096,
                prepare_checksum: 7,
                state_checksum: 8,
                chunk: Bytes::from_static(b"piece"),
            },
        ];
        for message in messages {
            let packet = encode(9, 1, 3, &message);
            let (from, decoded) = decode(9, &packet, &LIMITS).unwrap();
            // A prepare names its preparer (replica 0 here), whoever relays it.
            let sender = if matches!(message, Message::Prepare { .. }) { 0 } else { 1 };
            assert_eq!((from, decoded), (sender, vec![(3, message)]));
        }
    }

    #[test]
    fn one_heartbeat_carries_many_groups_up_to_the_bound() {
        let entries: Vec<CommitEntry> = (0..4)
            .map(|g| CommitEntry { group: g, commit: g * 10, commit_checksum: 1, view: 2 })
            .collect();
        let (_, decoded) = decode(9, &encode_commits(9, 2, &entries), &LIMITS).unwrap();
        assert_eq!(decoded.len(), 4);
        let mut more = entries.clone();
        more.push(CommitEntry::default());
        let error = decode(9, &encode_commits(9, 2, &more), &LIMITS).unwrap_err();
        assert!(matches!(error, DecodeError::Body(BodyError::CountOverLimit { .. })));
    }

    #[test]
    fn hostile_packets_are_refused_with_a_reason() {
        let vote = Message::StartViewChange { view: 3, membership: Membership::first(3, 3) };
        let packet = encode(9, 1, 3, &vote);
        assert!(matches!(decode(8, &packet, &LIMITS), Err(DecodeError::Invalid("cluster"))));
        let short = packet.slice(..100);
        assert!(matches!(decode(9, &short, &LIMITS), Err(DecodeError::Header(_))));
        let mut flipped = packet.to_vec();
        flipped[40] ^= 1;
        assert!(matches!(decode(9, &Bytes::from(flipped), &LIMITS), Err(DecodeError::Header(_))));
        let mut longer = packet.to_vec();
        longer.push(0);
        assert!(matches!(
            decode(9, &Bytes::from(longer), &LIMITS),
            Err(DecodeError::Framing { .. })
        ));
        let big = Message::Prepare {
            header: Header::prepare(9, 1, 0, Prepare::default(), &[0; 64]),
            body: Bytes::from(vec![0; 64]),
        };
        let tiny = CodecLimits { message_size_bytes_max: 300, ..LIMITS };
        assert!(matches!(
            decode(9, &encode(9, 1, 0, &big), &tiny),
            Err(DecodeError::TooLarge { .. })
        ));
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut rng = shoal_engine::rng::Rng::new(5);
        let valid = encode(
            9,
            1,
            3,
            &Message::StartView {
                view: 3,
                op: 1,
                commit: 0,
                nonce: 1,
                headers: vec![prepare(1, 0)],
                membership: Membership::first(3, 3),
            },
        );
        for _ in 0..2_000 {
            let mut bytes = valid.to_vec();
            for _ in 0..=rng.below(4) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] = rng.next_u64() as u8;
            }
            bytes.truncate(rng.below(bytes.len() as u64 + 1) as usize);
            let _ = decode(9, &Bytes::from(bytes), &LIMITS);
        }
    }
}
