//! State transfer, the pieces of it that are plain data: a backup assembling a peer's
//! replicated state chunk by chunk ([`Incoming`]), and a replica serving its own state, frozen
//! at one op, to a peer ([`Outgoing`]).
//!
//! A backup needs a transfer when every peer answered its repair with `RangeEvicted`:
//! retention removed the ops it lacks everywhere. It then asks one peer for its state as of
//! that peer's commit point *S* (the producer table and the state its driver's machine keeps,
//! joined by [`encode_transfer_state`]; the offset after *S*; the checksum of *S*'s prepare
//! and of the whole state), in pieces of at most `state_chunk_bytes_max`, and then for the
//! prepare of *S* itself; the replica hands both to its driver as one `Write::Install`, and
//! ordinary repair brings the ops after *S*.
//!
//! This module checks every piece against what the first one announced (op, sizes, offsets,
//! the whole state's CRC-32C) before anything of it is believed, and bounds what it allocates
//! by [`STATE_SIZE_BYTES_MAX`]. It never talks to the network, never decides which peer to ask
//! and never touches the log: the replica does all three.

use bytes::Bytes;
use shoal_engine::state::STATE_SIZE_BYTES_MAX;

/// A transferred state's bytes: the partition group's producer table, then the state the
/// driver's own machine keeps for the group (empty when it keeps none). Layout: the table's
/// length (u32, little-endian), the table's encoding, the driver's state to the end.
pub fn encode_transfer_state(producers: &[u8], driver: &[u8]) -> Vec<u8> {
    let length =
        u32::try_from(producers.len()).expect("a producer table is bounded far below 4 GiB");
    let mut bytes = Vec::with_capacity(4 + producers.len() + driver.len());
    bytes.extend_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(producers);
    bytes.extend_from_slice(driver);
    bytes
}

/// The two parts of [`encode_transfer_state`]'s bytes: (producer table, driver's state);
/// `None` when the table's length runs past the end.
pub fn decode_transfer_state(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    let (length, rest) = bytes.split_first_chunk::<4>()?;
    let length = usize::try_from(u32::from_le_bytes(*length)).ok()?;
    (length <= rest.len()).then(|| rest.split_at(length))
}

/// A state frozen at one op, as a replica serves it to peers (and as a backup announces what
/// it is assembling).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outgoing {
    /// The last op the state includes.
    pub op: u64,
    /// The offset after that op's records.
    pub end_offset: u64,
    /// `checksum_header` of that op's prepare.
    pub prepare_checksum: u32,
    /// The state's bytes.
    pub state: Bytes,
    /// CRC-32C of `state`.
    pub state_checksum: u32,
}

impl Outgoing {
    /// Freezes `state` as of `op`.
    pub fn new(op: u64, end_offset: u64, prepare_checksum: u32, state: Bytes) -> Outgoing {
        let state_checksum = shoal_proto::checksum::crc32c(&state);
        Outgoing { op, end_offset, prepare_checksum, state, state_checksum }
    }

    /// The piece starting at `offset_bytes`, at most `chunk_bytes_max` long; `None` past the
    /// end (a confused or hostile asker).
    pub fn chunk(&self, offset_bytes: u64, chunk_bytes_max: usize) -> Option<Bytes> {
        let start = usize::try_from(offset_bytes).ok().filter(|&s| s <= self.state.len())?;
        let end = start.saturating_add(chunk_bytes_max).min(self.state.len());
        Some(self.state.slice(start..end))
    }
}

/// One piece of a peer's state, as it arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The last op the state includes.
    pub op: u64,
    /// The offset after that op's records.
    pub end_offset: u64,
    /// The whole state's size.
    pub size_bytes: u64,
    /// Where this piece starts.
    pub offset_bytes: u64,
    /// `checksum_header` of the prepare of `op`.
    pub prepare_checksum: u32,
    /// CRC-32C of the whole state.
    pub state_checksum: u32,
    /// The piece.
    pub bytes: Bytes,
}

/// What a piece did to the transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accepted {
    /// Taken; more pieces follow.
    More,
    /// Taken; the state is whole and its checksum holds.
    Complete,
    /// Not the piece expected (a stale duplicate, another op): ignored.
    Ignored,
    /// Contradicts what the first piece announced, or is out of bounds, or the whole state
    /// fails its checksum: the transfer must start again elsewhere.
    Rejected,
}

/// A peer's state as a backup assembles it.
#[derive(Clone, Debug)]
pub struct Incoming {
    /// The peer asked.
    pub from: u8,
    /// What the first piece announced (`state` grows as pieces arrive), once it arrived.
    announced: Option<Outgoing>,
    size_bytes: u64,
    bytes: Vec<u8>,
    /// Every piece arrived and the whole passed its checksum.
    complete: bool,
}

impl Incoming {
    /// A transfer about to ask `from` for its newest state.
    pub fn new(from: u8) -> Incoming {
        Incoming { from, announced: None, size_bytes: 0, bytes: Vec::new(), complete: false }
    }

    /// The op of the state being assembled (0 before the first piece).
    pub fn op(&self) -> u64 {
        self.announced.as_ref().map_or(0, |a| a.op)
    }

    /// The next byte to ask for.
    pub fn offset_bytes(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Whether every piece arrived and the whole checks out.
    pub fn is_complete(&self) -> bool {
        self.complete
    }

    /// The assembled state, once complete: op, end offset, prepare checksum and bytes.
    pub fn state(&self) -> Option<Outgoing> {
        let announced = self.announced.as_ref().filter(|_| self.is_complete())?;
        Some(Outgoing { state: Bytes::from(self.bytes.clone()), ..announced.clone() })
    }

    /// Takes a piece from `self.from`. `op_floor`: a state at or below this op is of no use
    /// (the backup already holds it).
    pub fn accept(&mut self, chunk: Chunk, op_floor: u64) -> Accepted {
        if self.complete || self.bytes.len() as u64 > self.size_bytes {
            return Accepted::Ignored;
        }
        match &self.announced {
            None => {
                if chunk.offset_bytes != 0 {
                    return Accepted::Ignored;
                }
                if chunk.op <= op_floor || chunk.size_bytes > STATE_SIZE_BYTES_MAX as u64 {
                    return Accepted::Rejected;
                }
                self.announced = Some(Outgoing {
                    op: chunk.op,
                    end_offset: chunk.end_offset,
                    prepare_checksum: chunk.prepare_checksum,
                    state: Bytes::new(),
                    state_checksum: chunk.state_checksum,
                });
                self.size_bytes = chunk.size_bytes;
            }
            Some(announced) => {
                if chunk.op != announced.op || chunk.offset_bytes != self.bytes.len() as u64 {
                    return Accepted::Ignored;
                }
                if chunk.end_offset != announced.end_offset
                    || chunk.prepare_checksum != announced.prepare_checksum
                    || chunk.state_checksum != announced.state_checksum
                    || chunk.size_bytes != self.size_bytes
                {
                    return Accepted::Rejected;
                }
            }
        }
        let end = self.bytes.len() as u64 + chunk.bytes.len() as u64;
        if end > self.size_bytes || (chunk.bytes.is_empty() && end < self.size_bytes) {
            return Accepted::Rejected;
        }
        self.bytes.extend_from_slice(&chunk.bytes);
        if end < self.size_bytes {
            return Accepted::More;
        }
        let checksum = self.announced.as_ref().expect("set above").state_checksum;
        if shoal_proto::checksum::crc32c(&self.bytes) != checksum {
            return Accepted::Rejected;
        }
        self.complete = true;
        Accepted::Complete
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> Outgoing {
        Outgoing::new(40, 900, 77, Bytes::from((0..250u8).collect::<Vec<_>>()))
    }

    fn piece(source: &Outgoing, offset_bytes: u64, chunk_bytes_max: usize) -> Chunk {
        Chunk {
            op: source.op,
            end_offset: source.end_offset,
            size_bytes: source.state.len() as u64,
            offset_bytes,
            prepare_checksum: source.prepare_checksum,
            state_checksum: source.state_checksum,
            bytes: source.chunk(offset_bytes, chunk_bytes_max).unwrap(),
        }
    }

    #[test]
    fn a_state_served_in_pieces_assembles_to_the_same_bytes() {
        let source = source();
        let mut incoming = Incoming::new(2);
        let mut pieces = 0;
        loop {
            let chunk = piece(&source, incoming.offset_bytes(), 64);
            pieces += 1;
            match incoming.accept(chunk, 10) {
                Accepted::More => {}
                Accepted::Complete => break,
                other => panic!("piece {pieces}: {other:?}"),
            }
            assert!(pieces < 10, "bounded");
        }
        assert_eq!(pieces, 4);
        assert_eq!(incoming.state(), Some(source));
    }

    #[test]
    fn an_empty_state_is_one_empty_piece() {
        let source = Outgoing::new(5, 50, 1, Bytes::new());
        let mut incoming = Incoming::new(0);
        assert_eq!(incoming.accept(piece(&source, 0, 64), 0), Accepted::Complete);
        assert_eq!(incoming.state(), Some(source));
    }

    #[test]
    fn stale_contradicting_or_damaged_pieces_never_complete_a_state() {
        let source = source();
        // Not the first piece: ignored until the first arrives.
        assert_eq!(Incoming::new(2).accept(piece(&source, 64, 64), 0), Accepted::Ignored);
        // A state this backup already holds, or one over the bound.
        assert_eq!(Incoming::new(2).accept(piece(&source, 0, 64), 40), Accepted::Rejected);
        let mut huge = piece(&source, 0, 64);
        huge.size_bytes = STATE_SIZE_BYTES_MAX as u64 + 1;
        assert_eq!(Incoming::new(2).accept(huge, 0), Accepted::Rejected);

        let mut incoming = Incoming::new(2);
        assert_eq!(incoming.accept(piece(&source, 0, 64), 0), Accepted::More);
        // A duplicate of the first piece, and one from another op: ignored.
        assert_eq!(incoming.accept(piece(&source, 0, 64), 0), Accepted::Ignored);
        let mut other_op = piece(&source, 64, 64);
        other_op.op = 41;
        assert_eq!(incoming.accept(other_op, 0), Accepted::Ignored);
        // The same op announcing something else: rejected.
        let mut changed = piece(&source, 64, 64);
        changed.state_checksum ^= 1;
        assert_eq!(incoming.clone().accept(changed, 0), Accepted::Rejected);
        // Running past the announced size.
        let mut long = piece(&source, 64, 64);
        long.bytes = Bytes::from(vec![0; 300]);
        assert_eq!(incoming.clone().accept(long, 0), Accepted::Rejected);
        // An empty piece before the end would never finish.
        let mut empty = piece(&source, 64, 64);
        empty.bytes = Bytes::new();
        assert_eq!(incoming.clone().accept(empty, 0), Accepted::Rejected);
        // A flipped byte: the whole state fails its checksum at the last piece.
        let mut flipped = incoming.clone();
        let mut offset = 64;
        let verdict = loop {
            let mut chunk = piece(&source, offset, 64);
            if offset == 128 {
                let mut bytes = chunk.bytes.to_vec();
                bytes[3] ^= 0x10;
                chunk.bytes = Bytes::from(bytes);
            }
            offset += chunk.bytes.len() as u64;
            match flipped.accept(chunk, 0) {
                Accepted::More => {}
                verdict => break verdict,
            }
        };
        assert_eq!(verdict, Accepted::Rejected);
        assert_eq!(flipped.state(), None);
    }

    #[test]
    fn a_state_splits_into_the_table_and_the_drivers_part() {
        let bytes = encode_transfer_state(b"table", b"driver");
        assert_eq!(decode_transfer_state(&bytes), Some((&b"table"[..], &b"driver"[..])));
        assert_eq!(
            decode_transfer_state(&encode_transfer_state(b"", b"")),
            Some((&b""[..], &b""[..]))
        );
        // A length past the end, and too few bytes for a length.
        assert_eq!(decode_transfer_state(&bytes[..8]), None);
        assert_eq!(decode_transfer_state(&[5, 0, 0]), None);
        assert_eq!(decode_transfer_state(&u32::MAX.to_le_bytes()), None);
    }

    #[test]
    fn a_chunk_past_the_end_is_refused_by_the_source() {
        let source = source();
        assert_eq!(source.chunk(250, 64), Some(Bytes::new()));
        assert_eq!(source.chunk(251, 64), None);
        assert_eq!(source.chunk(u64::MAX, 64), None);
    }
}
