//! Kafka RecordBatch v2 (magic 2): the one batch format Shoal carries on the wire, in
//! replication, on disk and in memory.
//!
//! This module owns the byte layout of a batch: decoding its fixed header, validating a whole
//! batch on the append path (framing, limits, CRC-32C, record count and, for uncompressed batches,
//! every record), stamping the base offset and leader epoch in place, iterating records without
//! copying, and building batches for clients and tests. It never decompresses (a compressed batch
//! is checked at header level only), never allocates or slices on a length it has not bounded,
//! never panics on input, and never copies record bytes: every decoded key, value and header
//! borrows from the caller's buffer. All integers are big-endian, as Kafka defines them.

use std::fmt;
use std::iter::FusedIterator;

use bytes::Bytes;

use crate::checksum;

// ---------------------------------------------------------------------------------------------
// Layout
// ---------------------------------------------------------------------------------------------

/// Byte position of `baseOffset` (i64): the offset of the first record, stamped by the server.
pub const BASE_OFFSET_POS: usize = 0;
/// Byte position of `batchLength` (i32): the number of bytes that follow this field.
pub const BATCH_LENGTH_POS: usize = BASE_OFFSET_POS + size_of::<i64>();
/// Byte position of `partitionLeaderEpoch` (i32), stamped by the server.
pub const PARTITION_LEADER_EPOCH_POS: usize = BATCH_LENGTH_POS + size_of::<i32>();
/// Byte position of `magic` (i8), always [`MAGIC`] for this layout.
pub const MAGIC_POS: usize = PARTITION_LEADER_EPOCH_POS + size_of::<i32>();
/// Byte position of `crc` (u32): CRC-32C over [`ATTRIBUTES_POS`] to the end of the batch.
pub const CRC_POS: usize = MAGIC_POS + size_of::<i8>();
/// Byte position of `attributes` (i16): the first byte the CRC covers.
pub const ATTRIBUTES_POS: usize = CRC_POS + size_of::<u32>();
/// Byte position of `lastOffsetDelta` (i32).
pub const LAST_OFFSET_DELTA_POS: usize = ATTRIBUTES_POS + size_of::<i16>();
/// Byte position of `baseTimestamp` (i64, milliseconds).
pub const BASE_TIMESTAMP_POS: usize = LAST_OFFSET_DELTA_POS + size_of::<i32>();
/// Byte position of `maxTimestamp` (i64, milliseconds).
pub const MAX_TIMESTAMP_POS: usize = BASE_TIMESTAMP_POS + size_of::<i64>();
/// Byte position of `producerId` (i64, -1 when the producer is not idempotent).
pub const PRODUCER_ID_POS: usize = MAX_TIMESTAMP_POS + size_of::<i64>();
/// Byte position of `producerEpoch` (i16).
pub const PRODUCER_EPOCH_POS: usize = PRODUCER_ID_POS + size_of::<i64>();
/// Byte position of `baseSequence` (i32).
pub const BASE_SEQUENCE_POS: usize = PRODUCER_EPOCH_POS + size_of::<i16>();
/// Byte position of `recordsCount` (i32).
pub const RECORDS_COUNT_POS: usize = BASE_SEQUENCE_POS + size_of::<i32>();
/// Byte position of the first record.
pub const RECORDS_POS: usize = RECORDS_COUNT_POS + size_of::<i32>();

/// Size of the fixed batch header in bytes; records start right after it.
pub const BATCH_HEADER_SIZE: usize = 61;
/// Bytes in front of and including `batchLength`, which `batchLength` does not count, so that the
/// total size of a batch is `BATCH_LENGTH_PREFIX_SIZE + batchLength`.
pub const BATCH_LENGTH_PREFIX_SIZE: usize = BATCH_LENGTH_POS + size_of::<i32>();
/// The only `magic` value this layout describes; v0/v1 message sets are refused.
pub const MAGIC: i8 = 2;

const _: () = assert!(RECORDS_POS == BATCH_HEADER_SIZE);
const _: () = assert!(BATCH_LENGTH_PREFIX_SIZE == 12);
const _: () = assert!(PARTITION_LEADER_EPOCH_POS == 12);
const _: () = assert!(MAGIC_POS == 16);
const _: () = assert!(CRC_POS == 17);
const _: () = assert!(ATTRIBUTES_POS == 21);
const _: () = assert!(LAST_OFFSET_DELTA_POS == 23);
const _: () = assert!(BASE_TIMESTAMP_POS == 27);
const _: () = assert!(MAX_TIMESTAMP_POS == 35);
const _: () = assert!(PRODUCER_ID_POS == 43);
const _: () = assert!(PRODUCER_EPOCH_POS == 51);
const _: () = assert!(BASE_SEQUENCE_POS == 53);
const _: () = assert!(RECORDS_COUNT_POS == 57);

/// Smallest legal `batchLength`: a header with nothing after it.
const BATCH_LENGTH_MIN: usize = BATCH_HEADER_SIZE - BATCH_LENGTH_PREFIX_SIZE;

/// Attribute bits 0-2: the compression codec.
pub const ATTR_COMPRESSION_MASK: i16 = 0b111;
/// Attribute bit 3: timestamps are `LogAppendTime` (set by the broker) rather than `CreateTime`.
pub const ATTR_TIMESTAMP_TYPE: i16 = 1 << 3;
/// Attribute bit 4: the batch belongs to a transaction.
pub const ATTR_TRANSACTIONAL: i16 = 1 << 4;
/// Attribute bit 5: the batch holds control records (transaction markers).
pub const ATTR_CONTROL: i16 = 1 << 5;
/// Attribute bit 6: `baseTimestamp` holds a compaction delete horizon.
pub const ATTR_DELETE_HORIZON: i16 = 1 << 6;

// Kafka caps varints at the widths that can carry 32 and 64 bits of payload, 7 bits a byte.
const VARINT_BYTES_MAX: usize = 5;
const VARLONG_BYTES_MAX: usize = 10;

// ---------------------------------------------------------------------------------------------
// Public types
// ---------------------------------------------------------------------------------------------

/// The compression codec named by attribute bits 0-2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Compression {
    /// Records are stored as-is and can be walked.
    None,
    /// Codec 1.
    Gzip,
    /// Codec 2.
    Snappy,
    /// Codec 3.
    Lz4,
    /// Codec 4.
    Zstd,
}

impl Compression {
    /// Decodes a codec id (attribute bits 0-2); ids 5-7 are reserved by Kafka and refused.
    pub fn from_codec_id(codec_id: u8) -> Result<Compression, BatchError> {
        match codec_id {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Gzip),
            2 => Ok(Compression::Snappy),
            3 => Ok(Compression::Lz4),
            4 => Ok(Compression::Zstd),
            other => Err(BatchError::UnsupportedCompression(other)),
        }
    }

    /// The codec id as stored in attribute bits 0-2.
    #[must_use]
    pub fn codec_id(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Gzip => 1,
            Compression::Snappy => 2,
            Compression::Lz4 => 3,
            Compression::Zstd => 4,
        }
    }
}

/// Caller-configured bounds a batch must respect on the append path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Largest accepted batch, counting all of it (`12 + batchLength`).
    pub batch_size_bytes_max: u32,
    /// Largest accepted `recordsCount`.
    pub record_count_max: u32,
}

impl Default for BatchLimits {
    /// 16 MiB and one million records: generous enough for any sane producer, small enough that a
    /// single hostile batch cannot monopolise a shard. Topics are expected to configure their own.
    fn default() -> Self {
        BatchLimits { batch_size_bytes_max: 16 * 1024 * 1024, record_count_max: 1_000_000 }
    }
}

/// Why a batch was refused. Each variant names one check, so a client can be told exactly what
/// is wrong with what it sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Fewer bytes than the fixed header needs.
    TooShort {
        /// Bytes available.
        len: usize,
    },
    /// `batchLength` is too small to cover the rest of the fixed header.
    BatchLengthTooSmall {
        /// The `batchLength` field as stored.
        batch_length: i32,
    },
    /// The size the header declares (`12 + batchLength`) differs from the bytes given.
    LengthMismatch {
        /// Total size declared by the header.
        declared: usize,
        /// Bytes given.
        actual: usize,
    },
    /// The batch is larger than [`BatchLimits::batch_size_bytes_max`].
    TooLarge {
        /// Total size declared by the header.
        size: usize,
        /// The configured maximum.
        max: u32,
    },
    /// `magic` is not [`MAGIC`]; older message formats are not accepted.
    BadMagic(i8),
    /// The stored CRC-32C does not match the bytes.
    BadCrc {
        /// CRC stored in the header.
        stored: u32,
        /// CRC computed over attributes..end.
        computed: u32,
    },
    /// `recordsCount` is zero: a batch must carry at least one record.
    EmptyBatch,
    /// `recordsCount != lastOffsetDelta + 1`. Kafka tolerates a larger `lastOffsetDelta` after
    /// compaction, but appended batches are dense.
    RecordCountMismatch {
        /// The `recordsCount` field.
        records_count: i32,
        /// The `lastOffsetDelta` field.
        last_offset_delta: i32,
    },
    /// `recordsCount` exceeds [`BatchLimits::record_count_max`].
    TooManyRecords {
        /// The `recordsCount` field.
        count: u32,
        /// The configured maximum.
        max: u32,
    },
    /// A header field that must not be negative is.
    NegativeField(&'static str),
    /// Attribute bits 0-2 hold a reserved codec id (5-7).
    UnsupportedCompression(u8),
    /// The batch is a control batch; only the broker writes those, so an append refuses it.
    ControlBatch,
    /// Records of a compressed batch were asked for; this module never decompresses.
    Compressed(Compression),
    /// All declared records were read but bytes remain before the end of the batch.
    TrailingRecordBytes {
        /// Bytes left over after the last record.
        unread_bytes: usize,
    },
    /// Record number `index` (0-based) is malformed.
    Record {
        /// Position of the record in the batch.
        index: u32,
        /// What is wrong with it.
        reason: RecordError,
    },
}

/// What is wrong with a single record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordError {
    /// A varint runs past 5 bytes (32-bit) or 10 bytes (64-bit), or carries bits beyond its width.
    VarintOverflow,
    /// The record (or the batch, for the record's length) ends inside a field, or a length points
    /// past the end of the bytes that contain it.
    Truncated,
    /// A length is negative where it may not be (only key, value and header value may be -1).
    LengthOutOfRange,
    /// Record `i` must carry `offsetDelta == i`.
    OffsetDeltaMismatch {
        /// The offset delta the record's position requires.
        expected: i32,
        /// The offset delta it carries.
        found: i32,
    },
    /// The record's fields end before the length it declares.
    TrailingBytes,
}

/// The fixed 61-byte header of a batch, decoded. Obtained only from [`BatchHeader::parse`],
/// [`validate`] or [`validate_header_only`], so its counts and codec are known to be in range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    base_offset: i64,
    batch_length: i32,
    partition_leader_epoch: i32,
    magic: i8,
    crc: u32,
    attributes: i16,
    last_offset_delta: i32,
    base_timestamp_ms: i64,
    max_timestamp_ms: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    records_count: i32,
}

/// One record of an uncompressed batch, borrowing from the batch's bytes.
#[derive(Debug, Clone)]
pub struct Record<'a> {
    /// Record attributes; unused by Kafka today.
    pub attributes: i8,
    /// Milliseconds from the batch's `baseTimestamp`.
    pub timestamp_delta: i64,
    /// Position of the record in its batch (validated to equal its index).
    pub offset_delta: i32,
    /// The key, `None` when null.
    pub key: Option<&'a [u8]>,
    /// The value, `None` when null.
    pub value: Option<&'a [u8]>,
    /// The record's headers, already checked to be well formed.
    pub headers: HeaderIter<'a>,
}

/// The headers of one [`Record`] as `(key, value)` pairs; a `None` value is null.
#[derive(Debug, Clone)]
pub struct HeaderIter<'a> {
    bytes: &'a [u8],
    remaining: u32,
}

/// Iterator over the records of an uncompressed batch, from [`records`]. It yields each record
/// or the first error and then stops for good.
#[derive(Debug, Clone)]
pub struct RecordIter<'a> {
    rest: &'a [u8],
    index: u32,
    count: u32,
    done: bool,
}

/// Builds an uncompressed batch with base offset 0 and leader epoch 0, for clients and tests.
#[derive(Debug, Clone)]
pub struct BatchBuilder {
    base_timestamp_ms: i64,
    max_timestamp_ms: i64,
    producer_id: i64,
    producer_epoch: i16,
    base_sequence: i32,
    record_count: i32,
    records_bytes: Vec<u8>,
    attributes: i16,
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

/// The full append-path check: exact framing, limits, magic, CRC, attributes, record count and,
/// for an uncompressed batch, every record. A compressed batch is checked at header level only.
///
/// `bytes` must be exactly one batch. Control batches are refused ([`BatchError::ControlBatch`]);
/// transactional ones are accepted and reported by [`BatchHeader::is_transactional`].
pub fn validate(bytes: &[u8], limits: &BatchLimits) -> Result<BatchHeader, BatchError> {
    validate_records(bytes, validate_header(bytes, limits, None)?)
}

/// [`validate`] given `crc_whole`, the CRC-32C of all of `bytes`, which the caller derived from
/// a checksum it verified (a request body's): the Kafka CRC is derived from it rather than read
/// again (see [`crate::checksum`]).
pub fn validate_checksummed(
    bytes: &[u8],
    limits: &BatchLimits,
    crc_whole: u32,
) -> Result<BatchHeader, BatchError> {
    validate_records(bytes, validate_header(bytes, limits, Some(crc_whole))?)
}

fn validate_records(bytes: &[u8], header: BatchHeader) -> Result<BatchHeader, BatchError> {
    if header.compression() == Compression::None {
        // The header checks above already bound the walk: the count is within limits and the
        // iterator never reads past `bytes`.
        for record in RecordIter::new(&bytes[RECORDS_POS..], header.record_count()) {
            record?;
        }
    }
    Ok(header)
}

/// [`validate`] without the record walk: the fast path for compressed batches, whose records
/// cannot be read without decompressing.
pub fn validate_header_only(bytes: &[u8], limits: &BatchLimits) -> Result<BatchHeader, BatchError> {
    validate_header(bytes, limits, None)
}

fn validate_header(
    bytes: &[u8],
    limits: &BatchLimits,
    crc_whole: Option<u32>,
) -> Result<BatchHeader, BatchError> {
    let header = read_header(bytes)?;
    header.check_framing()?;
    let declared = header.total_size();
    if declared > limits.batch_size_bytes_max as usize {
        return Err(BatchError::TooLarge { size: declared, max: limits.batch_size_bytes_max });
    }
    if declared != bytes.len() {
        return Err(BatchError::LengthMismatch { declared, actual: bytes.len() });
    }
    // CRC before the remaining fields: if the bytes are damaged, the fields mean nothing and the
    // CRC is the error worth reporting.
    let covered = bytes.len() - ATTRIBUTES_POS;
    let computed = match crc_whole {
        Some(crc) => checksum::suffix(crc, &bytes[..ATTRIBUTES_POS], covered),
        None => checksum::crc32c(&bytes[ATTRIBUTES_POS..]),
    };
    if computed != header.crc {
        return Err(BatchError::BadCrc { stored: header.crc, computed });
    }
    header.check_fields()?;
    if header.is_control() {
        return Err(BatchError::ControlBatch);
    }
    if header.last_offset_delta.checked_add(1) != Some(header.records_count) {
        return Err(BatchError::RecordCountMismatch {
            records_count: header.records_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    if header.record_count() > limits.record_count_max {
        return Err(BatchError::TooManyRecords {
            count: header.record_count(),
            max: limits.record_count_max,
        });
    }
    Ok(header)
}

/// Writes the server-assigned base offset and partition leader epoch into a batch. Neither field
/// is covered by the CRC, so the CRC stays valid and is not recomputed.
///
/// # Panics
///
/// If `bytes` is shorter than [`BATCH_HEADER_SIZE`]: stamping is only done on validated batches.
pub fn stamp(bytes: &mut [u8], base_offset: u64, partition_leader_epoch: u32) {
    assert!(
        bytes.len() >= BATCH_HEADER_SIZE,
        "stamp on {} bytes, shorter than a batch header",
        bytes.len()
    );
    bytes[BASE_OFFSET_POS..BASE_OFFSET_POS + size_of::<u64>()]
        .copy_from_slice(&base_offset.to_be_bytes());
    bytes[PARTITION_LEADER_EPOCH_POS..PARTITION_LEADER_EPOCH_POS + size_of::<u32>()]
        .copy_from_slice(&partition_leader_epoch.to_be_bytes());
}

/// [`stamp`] for a batch whose CRC-32C (of all its bytes) is `crc_whole`; returns the CRC-32C
/// of the stamped batch, derived without reading the batch again.
///
/// # Panics
///
/// As [`stamp`].
pub fn stamp_checksummed(
    bytes: &mut [u8],
    base_offset: u64,
    partition_leader_epoch: u32,
    crc_whole: u32,
) -> u32 {
    const STAMPED_END: usize = PARTITION_LEADER_EPOCH_POS + size_of::<u32>();
    let rest_len = bytes.len().saturating_sub(STAMPED_END);
    let rest = checksum::suffix(crc_whole, &bytes[..STAMPED_END.min(bytes.len())], rest_len);
    stamp(bytes, base_offset, partition_leader_epoch);
    checksum::concat(checksum::crc32c(&bytes[..STAMPED_END]), rest, rest_len)
}

/// Iterates the records of an uncompressed batch. Checks the fixed header as [`BatchHeader::parse`]
/// does and that `bytes` holds the whole batch (trailing bytes past it are ignored); it does not
/// verify the CRC, which [`validate`] has done before the batch was stored.
pub fn records(bytes: &[u8]) -> Result<RecordIter<'_>, BatchError> {
    let header = BatchHeader::parse(bytes)?;
    let compression = header.compression();
    if compression != Compression::None {
        return Err(BatchError::Compressed(compression));
    }
    let declared = header.total_size();
    let batch = bytes
        .get(..declared)
        .ok_or(BatchError::LengthMismatch { declared, actual: bytes.len() })?;
    Ok(RecordIter::new(batch.get(RECORDS_POS..).unwrap_or_default(), header.record_count()))
}

// ---------------------------------------------------------------------------------------------
// BatchHeader
// ---------------------------------------------------------------------------------------------

impl BatchHeader {
    /// Decodes and checks the fixed header: magic, `batchLength` covering the header, non-negative
    /// counts, a non-empty batch and a known codec. It does not check the CRC, nor that `bytes`
    /// holds the whole batch, so a reader can learn [`total_size`](Self::total_size) from the
    /// first [`BATCH_HEADER_SIZE`] bytes alone.
    pub fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
        let header = read_header(bytes)?;
        header.check_framing()?;
        header.check_fields()?;
        Ok(header)
    }

    /// The batch's `baseOffset` (0 until stamped).
    #[must_use]
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    /// The `batchLength` field: bytes after it.
    #[must_use]
    pub fn batch_length(&self) -> i32 {
        self.batch_length
    }

    /// The `partitionLeaderEpoch` field.
    #[must_use]
    pub fn partition_leader_epoch(&self) -> i32 {
        self.partition_leader_epoch
    }

    /// The stored CRC-32C.
    #[must_use]
    pub fn crc(&self) -> u32 {
        self.crc
    }

    /// The raw attributes field.
    #[must_use]
    pub fn attributes(&self) -> i16 {
        self.attributes
    }

    /// The compression codec.
    #[must_use]
    pub fn compression(&self) -> Compression {
        // `check_fields` has refused codecs 5-7 before any header reaches a caller.
        Compression::from_codec_id(self.codec_id()).unwrap_or(Compression::None)
    }

    /// Whether the batch holds control records.
    #[must_use]
    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    /// Whether the batch is part of a transaction; the caller decides whether to accept it.
    #[must_use]
    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }

    /// Whether `baseTimestamp` holds a compaction delete horizon.
    #[must_use]
    pub fn has_delete_horizon(&self) -> bool {
        self.attributes & ATTR_DELETE_HORIZON != 0
    }

    /// Whether timestamps are `LogAppendTime` (`false`: `CreateTime`).
    #[must_use]
    pub fn timestamp_type_log_append(&self) -> bool {
        self.attributes & ATTR_TIMESTAMP_TYPE != 0
    }

    /// Number of records; at least 1.
    #[must_use]
    pub fn record_count(&self) -> u32 {
        u32::try_from(self.records_count).unwrap_or(0)
    }

    /// Offset delta of the last record.
    #[must_use]
    pub fn last_offset_delta(&self) -> i32 {
        self.last_offset_delta
    }

    /// Timestamp the record deltas are relative to, in milliseconds.
    #[must_use]
    pub fn base_timestamp(&self) -> i64 {
        self.base_timestamp_ms
    }

    /// Largest record timestamp, in milliseconds.
    #[must_use]
    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp_ms
    }

    /// Idempotent producer id, -1 when none.
    #[must_use]
    pub fn producer_id(&self) -> i64 {
        self.producer_id
    }

    /// Idempotent producer epoch, -1 when none.
    #[must_use]
    pub fn producer_epoch(&self) -> i16 {
        self.producer_epoch
    }

    /// Sequence number of the first record, -1 when none.
    #[must_use]
    pub fn base_sequence(&self) -> i32 {
        self.base_sequence
    }

    /// Size of the whole batch in bytes: `12 + batchLength`.
    #[must_use]
    pub fn total_size(&self) -> usize {
        // `check_framing` has bounded batch_length to a non-negative i32, so this cannot wrap.
        BATCH_LENGTH_PREFIX_SIZE + usize::try_from(self.batch_length).unwrap_or(0)
    }

    fn codec_id(&self) -> u8 {
        // The mask keeps three bits, so the cast cannot truncate.
        (self.attributes & ATTR_COMPRESSION_MASK) as u8
    }

    /// The checks that decide where the batch ends: without them no length can be trusted.
    fn check_framing(&self) -> Result<(), BatchError> {
        if self.magic != MAGIC {
            return Err(BatchError::BadMagic(self.magic));
        }
        if self.batch_length < 0 {
            return Err(BatchError::NegativeField("batch_length"));
        }
        if (self.batch_length as usize) < BATCH_LENGTH_MIN {
            return Err(BatchError::BatchLengthTooSmall { batch_length: self.batch_length });
        }
        Ok(())
    }

    fn check_fields(&self) -> Result<(), BatchError> {
        Compression::from_codec_id(self.codec_id())?;
        if self.records_count < 0 {
            return Err(BatchError::NegativeField("records_count"));
        }
        if self.records_count == 0 {
            return Err(BatchError::EmptyBatch);
        }
        if self.last_offset_delta < 0 {
            return Err(BatchError::NegativeField("last_offset_delta"));
        }
        Ok(())
    }
}

/// Decodes the fixed fields without judging them.
fn read_header(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
    let header: &[u8; BATCH_HEADER_SIZE] =
        bytes.first_chunk().ok_or(BatchError::TooShort { len: bytes.len() })?;
    Ok(BatchHeader {
        base_offset: i64::from_be_bytes(field(header, BASE_OFFSET_POS)),
        batch_length: i32::from_be_bytes(field(header, BATCH_LENGTH_POS)),
        partition_leader_epoch: i32::from_be_bytes(field(header, PARTITION_LEADER_EPOCH_POS)),
        magic: i8::from_be_bytes(field(header, MAGIC_POS)),
        crc: u32::from_be_bytes(field(header, CRC_POS)),
        attributes: i16::from_be_bytes(field(header, ATTRIBUTES_POS)),
        last_offset_delta: i32::from_be_bytes(field(header, LAST_OFFSET_DELTA_POS)),
        base_timestamp_ms: i64::from_be_bytes(field(header, BASE_TIMESTAMP_POS)),
        max_timestamp_ms: i64::from_be_bytes(field(header, MAX_TIMESTAMP_POS)),
        producer_id: i64::from_be_bytes(field(header, PRODUCER_ID_POS)),
        producer_epoch: i16::from_be_bytes(field(header, PRODUCER_EPOCH_POS)),
        base_sequence: i32::from_be_bytes(field(header, BASE_SEQUENCE_POS)),
        records_count: i32::from_be_bytes(field(header, RECORDS_COUNT_POS)),
    })
}

/// Copies the `N` bytes at `pos` out of the fixed header; positions are the layout constants,
/// checked at compile time to lie inside it.
fn field<const N: usize>(header: &[u8; BATCH_HEADER_SIZE], pos: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&header[pos..pos + N]);
    out
}

// ---------------------------------------------------------------------------------------------
// Records
// ---------------------------------------------------------------------------------------------

impl<'a> RecordIter<'a> {
    fn new(records_bytes: &'a [u8], count: u32) -> Self {
        RecordIter { rest: records_bytes, index: 0, count, done: false }
    }
}

impl<'a> Iterator for RecordIter<'a> {
    type Item = Result<Record<'a>, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if self.index == self.count {
            self.done = true;
            return if self.rest.is_empty() {
                None
            } else {
                Some(Err(BatchError::TrailingRecordBytes { unread_bytes: self.rest.len() }))
            };
        }
        let index = self.index;
        let result = parse_record(&mut self.rest).and_then(|record| {
            // `index < count <= i32::MAX` because counts come from a non-negative i32.
            let expected = i32::try_from(index).unwrap_or(i32::MAX);
            if record.offset_delta == expected {
                Ok(record)
            } else {
                Err(RecordError::OffsetDeltaMismatch { expected, found: record.offset_delta })
            }
        });
        match result {
            Ok(record) => {
                self.index += 1;
                Some(Ok(record))
            }
            Err(reason) => {
                self.done = true;
                Some(Err(BatchError::Record { index, reason }))
            }
        }
    }
}

impl FusedIterator for RecordIter<'_> {}

impl<'a> Iterator for HeaderIter<'a> {
    type Item = (&'a [u8], Option<&'a [u8]>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.remaining == 0 {
            return None;
        }
        // The record parser walked these bytes already, so this cannot fail; if it somehow did,
        // ending the iteration is the safe answer.
        match parse_header(&mut self.bytes) {
            Ok(header) => {
                self.remaining -= 1;
                Some(header)
            }
            Err(_) => {
                self.remaining = 0;
                None
            }
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let remaining = self.remaining as usize;
        (remaining, Some(remaining))
    }
}

impl ExactSizeIterator for HeaderIter<'_> {}

impl FusedIterator for HeaderIter<'_> {}

/// Reads one record from the front of `rest`, advancing it past the record.
fn parse_record<'a>(rest: &mut &'a [u8]) -> Result<Record<'a>, RecordError> {
    let length = usize::try_from(read_varint(rest)?).map_err(|_| RecordError::LengthOutOfRange)?;
    let (mut body, after) = rest.split_at_checked(length).ok_or(RecordError::Truncated)?;
    *rest = after;

    let attributes = i8::from_be_bytes([read_byte(&mut body)?]);
    let timestamp_delta = read_varlong(&mut body)?;
    let offset_delta = read_varint(&mut body)?;
    let key = read_nullable(&mut body)?;
    let value = read_nullable(&mut body)?;
    let headers_count =
        u32::try_from(read_varint(&mut body)?).map_err(|_| RecordError::LengthOutOfRange)?;

    // Walk the headers now so that a record is either wholly valid or refused; each header takes
    // at least two bytes, so a hostile count ends in `Truncated` after at most `length / 2` turns.
    let headers_bytes = body;
    for _ in 0..headers_count {
        parse_header(&mut body)?;
    }
    if !body.is_empty() {
        return Err(RecordError::TrailingBytes);
    }
    Ok(Record {
        attributes,
        timestamp_delta,
        offset_delta,
        key,
        value,
        headers: HeaderIter { bytes: headers_bytes, remaining: headers_count },
    })
}

fn parse_header<'a>(rest: &mut &'a [u8]) -> Result<(&'a [u8], Option<&'a [u8]>), RecordError> {
    // Kafka forbids null header keys.
    let key = read_nullable(rest)?.ok_or(RecordError::LengthOutOfRange)?;
    let value = read_nullable(rest)?;
    Ok((key, value))
}

/// Reads a varint length and that many bytes; -1 means null.
fn read_nullable<'a>(rest: &mut &'a [u8]) -> Result<Option<&'a [u8]>, RecordError> {
    let length = read_varint(rest)?;
    if length == -1 {
        return Ok(None);
    }
    let length = usize::try_from(length).map_err(|_| RecordError::LengthOutOfRange)?;
    let (bytes, after) = rest.split_at_checked(length).ok_or(RecordError::Truncated)?;
    *rest = after;
    Ok(Some(bytes))
}

fn read_byte(rest: &mut &[u8]) -> Result<u8, RecordError> {
    let (&byte, after) = rest.split_first().ok_or(RecordError::Truncated)?;
    *rest = after;
    Ok(byte)
}

// ---------------------------------------------------------------------------------------------
// Varints
// ---------------------------------------------------------------------------------------------

/// Reads an unsigned LEB128 value of at most `bytes_max` bytes holding `width_bits` of payload.
/// Refuses encodings that need a further byte or set bits beyond the width, rather than silently
/// dropping them as Kafka's reader does: a canonical encoder never produces either.
fn read_unsigned(rest: &mut &[u8], bytes_max: usize, width_bits: u32) -> Result<u64, RecordError> {
    let mut value = 0u64;
    for i in 0..bytes_max {
        let byte = read_byte(rest)?;
        let shift = 7 * i as u32;
        let payload = u64::from(byte & 0x7f);
        if i + 1 == bytes_max && payload >> (width_bits - shift) != 0 {
            return Err(RecordError::VarintOverflow);
        }
        value |= payload << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(RecordError::VarintOverflow)
}

fn read_varint(rest: &mut &[u8]) -> Result<i32, RecordError> {
    let raw = read_unsigned(rest, VARINT_BYTES_MAX, 32)?;
    // `read_unsigned` bounded the value to 32 bits.
    let raw = raw as u32;
    Ok((raw >> 1) as i32 ^ -((raw & 1) as i32))
}

fn read_varlong(rest: &mut &[u8]) -> Result<i64, RecordError> {
    let raw = read_unsigned(rest, VARLONG_BYTES_MAX, 64)?;
    Ok((raw >> 1) as i64 ^ -((raw & 1) as i64))
}

fn zigzag32(value: i32) -> u64 {
    u64::from(((value << 1) ^ (value >> 31)) as u32)
}

fn zigzag64(value: i64) -> u64 {
    ((value << 1) ^ (value >> 63)) as u64
}

fn write_unsigned(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn unsigned_size_bytes(value: u64) -> usize {
    let significant_bits = 64 - value.leading_zeros() as usize;
    significant_bits.div_ceil(7).max(1)
}

fn write_varint(out: &mut Vec<u8>, value: i32) {
    write_unsigned(out, zigzag32(value));
}

fn write_varlong(out: &mut Vec<u8>, value: i64) {
    write_unsigned(out, zigzag64(value));
}

// ---------------------------------------------------------------------------------------------
// Builder
// ---------------------------------------------------------------------------------------------

impl BatchBuilder {
    /// An empty builder whose record timestamps are stored relative to `base_timestamp_ms`.
    /// Producer fields default to -1 (not idempotent).
    #[must_use]
    pub fn new(base_timestamp_ms: i64) -> Self {
        BatchBuilder {
            base_timestamp_ms,
            max_timestamp_ms: base_timestamp_ms,
            producer_id: -1,
            producer_epoch: -1,
            base_sequence: -1,
            record_count: 0,
            records_bytes: Vec::new(),
            attributes: 0,
        }
    }

    /// Marks the batch as a control batch: records the server itself writes into a partition's
    /// log (Kafka's transaction markers; Shoal's consumer offset commits), which consumers skip.
    #[must_use]
    pub fn control(mut self) -> Self {
        self.attributes |= ATTR_CONTROL;
        self
    }

    /// Marks the batch as coming from an idempotent producer.
    #[must_use]
    pub fn producer(mut self, producer_id: i64, epoch: i16, base_sequence: i32) -> Self {
        self.producer_id = producer_id;
        self.producer_epoch = epoch;
        self.base_sequence = base_sequence;
        self
    }

    /// Appends a record. Timestamp deltas wrap, so any `timestamp_ms` round-trips.
    ///
    /// # Panics
    ///
    /// If a key, value or header is longer than `i32::MAX` bytes, or the batch would hold more
    /// than `i32::MAX` records: the format cannot express either.
    pub fn push(
        &mut self,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: &[(&[u8], Option<&[u8]>)],
    ) {
        let offset_delta = self.record_count;
        self.record_count =
            offset_delta.checked_add(1).expect("a batch holds at most i32::MAX records");
        if self.record_count == 1 || timestamp_ms > self.max_timestamp_ms {
            self.max_timestamp_ms = timestamp_ms;
        }
        let timestamp_delta = timestamp_ms.wrapping_sub(self.base_timestamp_ms);
        let headers_count = i32::try_from(headers.len()).expect("too many headers");

        let mut body_bytes = 1
            + unsigned_size_bytes(zigzag64(timestamp_delta))
            + unsigned_size_bytes(zigzag32(offset_delta))
            + nullable_size_bytes(key)
            + nullable_size_bytes(value)
            + unsigned_size_bytes(zigzag32(headers_count));
        for (header_key, header_value) in headers {
            body_bytes +=
                nullable_size_bytes(Some(header_key)) + nullable_size_bytes(*header_value);
        }
        let body_length = i32::try_from(body_bytes).expect("record longer than i32::MAX bytes");

        let out = &mut self.records_bytes;
        write_varint(out, body_length);
        out.push(0); // record attributes: unused
        write_varlong(out, timestamp_delta);
        write_varint(out, offset_delta);
        write_nullable(out, key);
        write_nullable(out, value);
        write_varint(out, headers_count);
        for (header_key, header_value) in headers {
            write_nullable(out, Some(header_key));
            write_nullable(out, *header_value);
        }
    }

    /// Number of records pushed.
    #[must_use]
    pub fn len(&self) -> usize {
        self.record_count as usize
    }

    /// Whether no record has been pushed (such a batch is refused by [`validate`]).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.record_count == 0
    }

    /// Size in bytes of the batch [`build`](Self::build) would produce.
    #[must_use]
    pub fn encoded_size(&self) -> usize {
        BATCH_HEADER_SIZE + self.records_bytes.len()
    }

    /// Encodes the batch.
    #[must_use]
    pub fn build(self) -> Bytes {
        let mut out = Vec::with_capacity(self.encoded_size());
        self.build_into(&mut out);
        Bytes::from(out)
    }

    /// Appends the encoded batch to `out`, so a caller can reuse one buffer (clearing it first)
    /// or concatenate several batches.
    ///
    /// # Panics
    ///
    /// If the batch is larger than the format can describe (`i32::MAX` bytes).
    pub fn build_into(&self, out: &mut Vec<u8>) {
        let start = out.len();
        let batch_length = i32::try_from(self.encoded_size() - BATCH_LENGTH_PREFIX_SIZE)
            .expect("batch longer than i32::MAX bytes");
        out.reserve(self.encoded_size());
        out.extend_from_slice(&0i64.to_be_bytes()); // base offset: stamped by the server
        out.extend_from_slice(&batch_length.to_be_bytes());
        out.extend_from_slice(&0i32.to_be_bytes()); // leader epoch: stamped by the server
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes()); // CRC, filled in below
        out.extend_from_slice(&self.attributes.to_be_bytes()); // uncompressed, CreateTime
        out.extend_from_slice(&(self.record_count - 1).to_be_bytes());
        out.extend_from_slice(&self.base_timestamp_ms.to_be_bytes());
        out.extend_from_slice(&self.max_timestamp_ms.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.producer_epoch.to_be_bytes());
        out.extend_from_slice(&self.base_sequence.to_be_bytes());
        out.extend_from_slice(&self.record_count.to_be_bytes());
        debug_assert_eq!(out.len() - start, BATCH_HEADER_SIZE);
        out.extend_from_slice(&self.records_bytes);

        let crc = checksum::crc32c(&out[start + ATTRIBUTES_POS..]);
        out[start + CRC_POS..start + CRC_POS + size_of::<u32>()]
            .copy_from_slice(&crc.to_be_bytes());
    }
}

fn nullable_size_bytes(bytes: Option<&[u8]>) -> usize {
    match bytes {
        None => unsigned_size_bytes(zigzag32(-1)),
        Some(bytes) => {
            let length = i32::try_from(bytes.len()).expect("field longer than i32::MAX bytes");
            unsigned_size_bytes(zigzag32(length)) + bytes.len()
        }
    }
}

fn write_nullable(out: &mut Vec<u8>, bytes: Option<&[u8]>) {
    match bytes {
        None => write_varint(out, -1),
        Some(bytes) => {
            let length = i32::try_from(bytes.len()).expect("field longer than i32::MAX bytes");
            write_varint(out, length);
            out.extend_from_slice(bytes);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

impl fmt::Display for BatchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BatchError::TooShort { len } => write!(
                f,
                "batch of {len} bytes is shorter than its {BATCH_HEADER_SIZE}-byte header"
            ),
            BatchError::BatchLengthTooSmall { batch_length } => write!(
                f,
                "batchLength {batch_length} does not cover the header (at least {BATCH_LENGTH_MIN})"
            ),
            BatchError::LengthMismatch { declared, actual } => {
                write!(f, "batch header declares {declared} bytes but {actual} were given")
            }
            BatchError::TooLarge { size, max } => {
                write!(f, "batch of {size} bytes exceeds the limit of {max} bytes")
            }
            BatchError::BadMagic(magic) => {
                write!(f, "batch magic {magic} is not supported (expected {MAGIC})")
            }
            BatchError::BadCrc { stored, computed } => write!(
                f,
                "batch CRC-32C mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ),
            BatchError::EmptyBatch => write!(f, "batch has no records"),
            BatchError::RecordCountMismatch { records_count, last_offset_delta } => write!(
                f,
                "recordsCount {records_count} does not equal lastOffsetDelta {last_offset_delta} + 1"
            ),
            BatchError::TooManyRecords { count, max } => {
                write!(f, "batch holds {count} records, more than the limit of {max}")
            }
            BatchError::NegativeField(name) => write!(f, "batch field {name} is negative"),
            BatchError::UnsupportedCompression(codec_id) => {
                write!(f, "compression codec {codec_id} is not supported")
            }
            BatchError::ControlBatch => write!(f, "control batches may not be appended"),
            BatchError::Compressed(compression) => write!(
                f,
                "records of a {compression:?}-compressed batch cannot be read without decompressing"
            ),
            BatchError::TrailingRecordBytes { unread_bytes } => {
                write!(f, "{unread_bytes} bytes remain after the last record of the batch")
            }
            BatchError::Record { index, reason } => write!(f, "record {index}: {reason}"),
        }
    }
}

impl std::error::Error for BatchError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            BatchError::Record { reason, .. } => Some(reason),
            _ => None,
        }
    }
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RecordError::VarintOverflow => write!(f, "varint is too long or overflows its width"),
            RecordError::Truncated => write!(f, "record ends inside a field"),
            RecordError::LengthOutOfRange => write!(f, "a length field is out of range"),
            RecordError::OffsetDeltaMismatch { expected, found } => {
                write!(f, "offsetDelta {found}, expected {expected}")
            }
            RecordError::TrailingBytes => {
                write!(f, "record fields end before the record's declared length")
            }
        }
    }
}

impl std::error::Error for RecordError {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn three_records() -> Vec<u8> {
        let mut builder = BatchBuilder::new(1_000);
        for i in 0..3 {
            builder.push(1_000 + i, Some(b"key"), Some(&[i as u8; 200]), &[]);
        }
        builder.build().to_vec()
    }

    /// The checksummed paths give what the reading paths give: a derived Kafka CRC accepts and
    /// refuses exactly as a computed one, and a stamp's derived checksum is the stamped bytes'.
    #[test]
    fn checksummed_validation_and_stamping_agree_with_reading_the_bytes() {
        let limits = BatchLimits::default();
        let mut bytes = three_records();
        let crc = crc32c::crc32c(&bytes);
        assert_eq!(validate_checksummed(&bytes, &limits, crc), validate(&bytes, &limits));
        assert!(validate_checksummed(&bytes, &limits, crc).is_ok());
        let mut damaged = bytes.clone();
        damaged[RECORDS_POS + 5] ^= 0x40;
        let damaged_crc = crc32c::crc32c(&damaged);
        assert!(matches!(
            validate_checksummed(&damaged, &limits, damaged_crc),
            Err(BatchError::BadCrc { .. })
        ));
        assert_eq!(
            validate_checksummed(&damaged, &limits, damaged_crc),
            validate(&damaged, &limits)
        );
        let stamped_crc = stamp_checksummed(&mut bytes, 1 << 40, 7, crc);
        assert_eq!(stamped_crc, crc32c::crc32c(&bytes));
        assert_eq!(BatchHeader::parse(&bytes).unwrap().base_offset, 1 << 40);
    }

    type OwnedHeader = (Vec<u8>, Option<Vec<u8>>);

    /// A record as a test describes it: owned, with an absolute timestamp.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct TestRecord {
        timestamp_ms: i64,
        key: Option<Vec<u8>>,
        value: Option<Vec<u8>>,
        headers: Vec<OwnedHeader>,
    }

    fn build(base_timestamp_ms: i64, records: &[TestRecord]) -> Vec<u8> {
        let mut builder = BatchBuilder::new(base_timestamp_ms);
        for record in records {
            let headers: Vec<(&[u8], Option<&[u8]>)> = record
                .headers
                .iter()
                .map(|(key, value)| (key.as_slice(), value.as_deref()))
                .collect();
            builder.push(
                record.timestamp_ms,
                record.key.as_deref(),
                record.value.as_deref(),
                &headers,
            );
        }
        assert_eq!(builder.len(), records.len());
        let expected_size = builder.encoded_size();
        let bytes = builder.build().to_vec();
        assert_eq!(bytes.len(), expected_size);
        bytes
    }

    fn simple_batch(record_count: usize) -> Vec<u8> {
        let records: Vec<TestRecord> = (0..record_count)
            .map(|i| TestRecord {
                timestamp_ms: 1_000 + i as i64,
                key: Some(format!("key-{i}").into_bytes()),
                value: Some(vec![i as u8; 10]),
                headers: vec![(b"h".to_vec(), None)],
            })
            .collect();
        build(1_000, &records)
    }

    /// Decodes every record of a batch back into test form.
    fn decode(bytes: &[u8]) -> Result<Vec<TestRecord>, BatchError> {
        let header = BatchHeader::parse(bytes)?;
        records(bytes)?
            .map(|record| {
                let record = record?;
                Ok(TestRecord {
                    timestamp_ms: header.base_timestamp().wrapping_add(record.timestamp_delta),
                    key: record.key.map(<[u8]>::to_vec),
                    value: record.value.map(<[u8]>::to_vec),
                    headers: record
                        .headers
                        .map(|(key, value)| (key.to_vec(), value.map(<[u8]>::to_vec)))
                        .collect(),
                })
            })
            .collect()
    }

    /// The one way tests judge a batch: full validation against `limits` must give `expected`.
    fn check(bytes: &[u8], limits: &BatchLimits, expected: Result<(), BatchError>) {
        let got = validate(bytes, limits).map(|_| ());
        assert_eq!(got, expected, "validate of {} bytes", bytes.len());
    }

    fn fix_crc(bytes: &mut [u8]) {
        let crc = crc32c::crc32c(&bytes[ATTRIBUTES_POS..]);
        bytes[CRC_POS..CRC_POS + 4].copy_from_slice(&crc.to_be_bytes());
    }

    fn put_i32(bytes: &mut [u8], pos: usize, value: i32) {
        bytes[pos..pos + 4].copy_from_slice(&value.to_be_bytes());
    }

    fn put_i16(bytes: &mut [u8], pos: usize, value: i16) {
        bytes[pos..pos + 2].copy_from_slice(&value.to_be_bytes());
    }

    /// A batch whose records area is `records_body` verbatim, with a consistent header and CRC,
    /// so tests can hand-craft malformed records.
    fn raw_batch(records_body: &[u8], record_count: i32) -> Vec<u8> {
        let mut bytes = simple_batch(1)[..BATCH_HEADER_SIZE].to_vec();
        bytes.extend_from_slice(records_body);
        let batch_length = i32::try_from(bytes.len() - BATCH_LENGTH_PREFIX_SIZE).unwrap();
        put_i32(&mut bytes, BATCH_LENGTH_POS, batch_length);
        put_i32(&mut bytes, RECORDS_COUNT_POS, record_count);
        put_i32(&mut bytes, LAST_OFFSET_DELTA_POS, record_count - 1);
        fix_crc(&mut bytes);
        bytes
    }

    /// A record encoded by hand: `length` prefix computed over `body`.
    fn raw_record(body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_varint(&mut out, i32::try_from(body.len()).unwrap());
        out.extend_from_slice(body);
        out
    }

    fn record_error(index: u32, reason: RecordError) -> Result<(), BatchError> {
        Err(BatchError::Record { index, reason })
    }

    /// Runs every decoder over `bytes`, draining the iterators; only a panic fails.
    fn exercise(bytes: &[u8]) {
        let _ = BatchHeader::parse(bytes);
        let _ = validate(bytes, &BatchLimits::default());
        let _ = validate_header_only(bytes, &BatchLimits::default());
        if let Ok(iter) = records(bytes) {
            for record in iter.take(100_000).flatten() {
                record.headers.for_each(drop);
            }
        }
    }

    fn test_record() -> impl Strategy<Value = TestRecord> {
        let bytes = || prop::collection::vec(any::<u8>(), 0..40);
        (
            any::<i64>(),
            prop::option::of(bytes()),
            prop::option::of(bytes()),
            prop::collection::vec((bytes(), prop::option::of(bytes())), 0..4),
        )
            .prop_map(|(timestamp_ms, key, value, headers)| TestRecord {
                timestamp_ms,
                key,
                value,
                headers,
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn round_trip(
            base_timestamp_ms in any::<i64>(),
            records_in in prop::collection::vec(test_record(), 1..20),
            base_offset in any::<u64>(),
            epoch in any::<u32>(),
        ) {
            let mut bytes = build(base_timestamp_ms, &records_in);
            let header = validate(&bytes, &BatchLimits::default()).unwrap();
            prop_assert_eq!(header.record_count() as usize, records_in.len());
            prop_assert_eq!(header.last_offset_delta() as usize, records_in.len() - 1);
            prop_assert_eq!(header.base_timestamp(), base_timestamp_ms);
            let max_timestamp_ms = records_in.iter().map(|r| r.timestamp_ms).max().unwrap();
            prop_assert_eq!(header.max_timestamp(), max_timestamp_ms);
            prop_assert_eq!(header.total_size(), bytes.len());
            prop_assert_eq!(header.compression(), Compression::None);
            prop_assert_eq!(decode(&bytes).unwrap(), records_in.clone());

            let crc_before = header.crc();
            stamp(&mut bytes, base_offset, epoch);
            let stamped = validate(&bytes, &BatchLimits::default()).unwrap();
            prop_assert_eq!(stamped.crc(), crc_before);
            prop_assert_eq!(stamped.base_offset() as u64, base_offset);
            prop_assert_eq!(stamped.partition_leader_epoch() as u32, epoch);
            prop_assert_eq!(decode(&bytes).unwrap(), records_in);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
            exercise(&bytes);
        }

        #[test]
        fn arbitrary_header_over_valid_records_never_panics(
            header in prop::collection::vec(any::<u8>(), BATCH_HEADER_SIZE),
            magic_two in any::<bool>(),
        ) {
            // Random headers rarely carry magic 2 or a matching length; force both half the time
            // so the decoders get past framing.
            let mut bytes = simple_batch(3);
            bytes[..BATCH_HEADER_SIZE].copy_from_slice(&header);
            if magic_two {
                bytes[MAGIC_POS] = MAGIC as u8;
                let batch_length = i32::try_from(bytes.len() - BATCH_LENGTH_PREFIX_SIZE).unwrap();
                put_i32(&mut bytes, BATCH_LENGTH_POS, batch_length);
                fix_crc(&mut bytes);
            }
            exercise(&bytes);
        }

        #[test]
        fn mutated_batch_never_panics(
            mutations in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
            keep_crc_valid in any::<bool>(),
        ) {
            let mut bytes = simple_batch(5);
            for (index, byte) in mutations {
                let pos = index.index(bytes.len());
                bytes[pos] = byte;
            }
            // Recomputing the CRC lets the mutation reach the record walk instead of stopping at
            // the checksum.
            if keep_crc_valid {
                fix_crc(&mut bytes);
            }
            exercise(&bytes);
        }

        #[test]
        fn random_records_area_never_panics(
            body in prop::collection::vec(any::<u8>(), 0..200),
            record_count in 1..10i32,
        ) {
            let bytes = raw_batch(&body, record_count);
            exercise(&bytes);
        }
    }

    #[test]
    fn layout_matches_kafka() {
        let mut builder = BatchBuilder::new(7).producer(42, 3, 100);
        builder.push(9, Some(b"k"), None, &[]);
        let bytes = builder.build();
        assert_eq!(bytes[MAGIC_POS], 2);
        let header = BatchHeader::parse(&bytes).unwrap();
        assert_eq!(header.producer_id(), 42);
        assert_eq!(header.producer_epoch(), 3);
        assert_eq!(header.base_sequence(), 100);
        assert_eq!(header.base_offset(), 0);
        assert_eq!(header.partition_leader_epoch(), 0);
        assert_eq!(header.max_timestamp(), 9);
        assert!(!header.is_transactional());
        assert!(!header.is_control());
        assert!(!header.timestamp_type_log_append());
        assert!(!header.has_delete_horizon());
        // Zigzag varints: body of 7 bytes → 0x0e, attributes, timestamp delta 2 → 0x04, offset
        // delta 0, key length 1 → 0x02, 'k', null value -1 → 0x01, no headers.
        assert_eq!(&bytes[RECORDS_POS..], &[0x0e, 0x00, 0x04, 0x00, 0x02, b'k', 0x01, 0x00]);
        assert_eq!(header.total_size(), BATCH_HEADER_SIZE + 8);
    }

    #[test]
    fn build_into_appends_and_reuses() {
        let mut builder = BatchBuilder::new(0);
        builder.push(0, None, Some(b"v"), &[]);
        let mut out = Vec::new();
        builder.build_into(&mut out);
        builder.build_into(&mut out);
        let size = builder.encoded_size();
        assert_eq!(out.len(), 2 * size);
        check(&out[..size], &BatchLimits::default(), Ok(()));
        check(&out[size..], &BatchLimits::default(), Ok(()));
        assert_eq!(&out[..size], &builder.build()[..]);
    }

    #[test]
    fn empty_builder_is_refused() {
        let builder = BatchBuilder::new(0);
        assert!(builder.is_empty());
        let bytes = builder.build();
        check(&bytes, &BatchLimits::default(), Err(BatchError::EmptyBatch));
    }

    #[test]
    fn size_limit_is_inclusive() {
        let bytes = simple_batch(4);
        let size = bytes.len();
        let at = |max: usize| BatchLimits {
            batch_size_bytes_max: u32::try_from(max).unwrap(),
            ..BatchLimits::default()
        };
        check(&bytes, &at(size), Ok(()));
        check(
            &bytes,
            &at(size - 1),
            Err(BatchError::TooLarge { size, max: u32::try_from(size - 1).unwrap() }),
        );
    }

    #[test]
    fn record_count_limit_is_inclusive() {
        let bytes = simple_batch(4);
        let at = |max| BatchLimits { record_count_max: max, ..BatchLimits::default() };
        check(&bytes, &at(4), Ok(()));
        check(&bytes, &at(3), Err(BatchError::TooManyRecords { count: 4, max: 3 }));
    }

    #[test]
    fn header_field_corruption() {
        type Mutation = fn(&mut Vec<u8>);
        // Each mutation keeps the CRC valid (it is fixed afterwards) so the named check is the
        // one that fires.
        let cases: &[(&str, Mutation, BatchError)] = &[
            (
                "records count above last offset delta",
                |b| put_i32(b, RECORDS_COUNT_POS, 4),
                BatchError::RecordCountMismatch { records_count: 4, last_offset_delta: 2 },
            ),
            (
                "last offset delta above records count",
                |b| put_i32(b, LAST_OFFSET_DELTA_POS, 5),
                BatchError::RecordCountMismatch { records_count: 3, last_offset_delta: 5 },
            ),
            ("records count zero", |b| put_i32(b, RECORDS_COUNT_POS, 0), BatchError::EmptyBatch),
            (
                "records count negative",
                |b| put_i32(b, RECORDS_COUNT_POS, -1),
                BatchError::NegativeField("records_count"),
            ),
            (
                "last offset delta negative",
                |b| put_i32(b, LAST_OFFSET_DELTA_POS, -1),
                BatchError::NegativeField("last_offset_delta"),
            ),
            (
                "last offset delta at i32::MAX",
                |b| put_i32(b, LAST_OFFSET_DELTA_POS, i32::MAX),
                BatchError::RecordCountMismatch { records_count: 3, last_offset_delta: i32::MAX },
            ),
            ("codec 5", |b| put_i16(b, ATTRIBUTES_POS, 5), BatchError::UnsupportedCompression(5)),
            ("codec 7", |b| put_i16(b, ATTRIBUTES_POS, 7), BatchError::UnsupportedCompression(7)),
            (
                "control batch",
                |b| put_i16(b, ATTRIBUTES_POS, ATTR_CONTROL),
                BatchError::ControlBatch,
            ),
            ("magic 1", |b| b[MAGIC_POS] = 1, BatchError::BadMagic(1)),
            (
                "batch length negative",
                |b| put_i32(b, BATCH_LENGTH_POS, -5),
                BatchError::NegativeField("batch_length"),
            ),
            (
                "batch length below header",
                |b| put_i32(b, BATCH_LENGTH_POS, 48),
                BatchError::BatchLengthTooSmall { batch_length: 48 },
            ),
        ];
        for (name, mutate, expected) in cases {
            let mut bytes = simple_batch(3);
            mutate(&mut bytes);
            fix_crc(&mut bytes);
            let got = validate(&bytes, &BatchLimits::default());
            assert_eq!(got, Err(expected.clone()), "{name}");
            assert_eq!(
                validate_header_only(&bytes, &BatchLimits::default()),
                Err(expected.clone()),
                "{name} (header only)"
            );
        }
    }

    #[test]
    fn transactional_batch_is_reported_not_refused() {
        let mut bytes = simple_batch(2);
        put_i16(&mut bytes, ATTRIBUTES_POS, ATTR_TRANSACTIONAL | ATTR_TIMESTAMP_TYPE);
        fix_crc(&mut bytes);
        let header = validate(&bytes, &BatchLimits::default()).unwrap();
        assert!(header.is_transactional());
        assert!(header.timestamp_type_log_append());
        assert!(!header.is_control());
    }

    #[test]
    fn control_batch_flag_is_reported_by_parse() {
        let mut bytes = simple_batch(1);
        put_i16(&mut bytes, ATTRIBUTES_POS, ATTR_CONTROL | ATTR_TRANSACTIONAL);
        fix_crc(&mut bytes);
        let header = BatchHeader::parse(&bytes).unwrap();
        assert!(header.is_control());
        assert!(header.is_transactional());
        check(&bytes, &BatchLimits::default(), Err(BatchError::ControlBatch));
    }

    #[test]
    fn a_built_control_batch_is_flagged_and_its_checksum_holds() {
        let mut builder = BatchBuilder::new(7).control();
        builder.push(7, Some(&[0, 0, 0x53, 0x48]), Some(b"commit"), &[]);
        let bytes = builder.build();
        let header = BatchHeader::parse(&bytes).unwrap();
        assert!(header.is_control());
        assert!(!header.is_transactional());
        assert_eq!(header.crc(), crc32c::crc32c(&bytes[ATTRIBUTES_POS..]));
        check(&bytes, &BatchLimits::default(), Err(BatchError::ControlBatch));
        let record = records(&bytes).unwrap().next().unwrap().unwrap();
        assert_eq!(record.value, Some(&b"commit"[..]));
    }

    #[test]
    fn bad_crc_in_records_area() {
        let good = simple_batch(3);
        let stored = BatchHeader::parse(&good).unwrap().crc();
        for pos in [ATTRIBUTES_POS, RECORDS_POS, good.len() - 1] {
            let mut bytes = good.clone();
            bytes[pos] ^= 0x01;
            let computed = crc32c::crc32c(&bytes[ATTRIBUTES_POS..]);
            check(&bytes, &BatchLimits::default(), Err(BatchError::BadCrc { stored, computed }));
        }
    }

    #[test]
    fn stamped_fields_are_outside_the_crc() {
        let mut bytes = simple_batch(2);
        stamp(&mut bytes, u64::MAX, u32::MAX);
        check(&bytes, &BatchLimits::default(), Ok(()));
        // Only a header prefix is needed to stamp.
        let mut header_only = bytes[..BATCH_HEADER_SIZE].to_vec();
        stamp(&mut header_only, 77, 5);
        let header = BatchHeader::parse(&header_only).unwrap();
        assert_eq!((header.base_offset(), header.partition_leader_epoch()), (77, 5));
    }

    #[test]
    #[should_panic(expected = "shorter than a batch header")]
    fn stamp_asserts_header_length() {
        stamp(&mut [0u8; BATCH_HEADER_SIZE - 1], 0, 0);
    }

    #[test]
    fn too_short_input() {
        for len in [0, 1, BATCH_LENGTH_PREFIX_SIZE, BATCH_HEADER_SIZE - 1] {
            let bytes = &simple_batch(1)[..len];
            check(bytes, &BatchLimits::default(), Err(BatchError::TooShort { len }));
            assert_eq!(BatchHeader::parse(bytes), Err(BatchError::TooShort { len }));
            assert_eq!(records(bytes).err(), Some(BatchError::TooShort { len }));
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = simple_batch(3);
        for len in 0..bytes.len() {
            let prefix = &bytes[..len];
            assert!(validate(prefix, &BatchLimits::default()).is_err(), "prefix {len}");
            assert!(validate_header_only(prefix, &BatchLimits::default()).is_err());
            assert!(records(prefix).is_err(), "prefix {len}");
            // A header prefix is enough for parse, by design.
            assert_eq!(BatchHeader::parse(prefix).is_ok(), len >= BATCH_HEADER_SIZE);
        }
    }

    #[test]
    fn batch_length_lying() {
        let bytes = simple_batch(2);
        let actual = bytes.len();
        let batch_length = i32::try_from(actual - BATCH_LENGTH_PREFIX_SIZE).unwrap();
        for delta in [1, -1, 1000, -10] {
            let mut lying = bytes.clone();
            put_i32(&mut lying, BATCH_LENGTH_POS, batch_length + delta);
            let declared = usize::try_from(i32::try_from(actual).unwrap() + delta).unwrap();
            check(
                &lying,
                &BatchLimits::default(),
                Err(BatchError::LengthMismatch { declared, actual }),
            );
        }
        // A huge declared length is judged against the limit before anything is read.
        let mut lying = bytes.clone();
        put_i32(&mut lying, BATCH_LENGTH_POS, i32::MAX);
        check(
            &lying,
            &BatchLimits::default(),
            Err(BatchError::TooLarge {
                size: BATCH_LENGTH_PREFIX_SIZE + i32::MAX as usize,
                max: BatchLimits::default().batch_size_bytes_max,
            }),
        );
        // One byte too many given.
        let mut extra = bytes.clone();
        extra.push(0);
        check(
            &extra,
            &BatchLimits::default(),
            Err(BatchError::LengthMismatch { declared: actual, actual: actual + 1 }),
        );
        // `records` only needs the batch to be present; it ignores what follows.
        assert_eq!(records(&extra).unwrap().count(), 2);
    }

    #[test]
    fn malformed_records() {
        let valid_body = [0u8, 0, 0, 1, 1, 0]; // attrs, ts 0, offset 0, null key, null value, 0 headers
        // (name, records area, recordsCount, expected outcome)
        type Case = (&'static str, Vec<u8>, i32, Result<(), BatchError>);
        let cases: Vec<Case> = vec![
            ("minimal record", raw_record(&valid_body), 1, Ok(())),
            (
                "record length negative",
                vec![0x01],
                1,
                record_error(0, RecordError::LengthOutOfRange),
            ),
            (
                "record length past the batch",
                vec![0x7e, 0, 0, 0],
                1,
                record_error(0, RecordError::Truncated),
            ),
            (
                "key length -2",
                raw_record(&[0, 0, 0, 0x03, 1, 0]),
                1,
                record_error(0, RecordError::LengthOutOfRange),
            ),
            (
                "value length -3",
                raw_record(&[0, 0, 0, 1, 0x05, 0]),
                1,
                record_error(0, RecordError::LengthOutOfRange),
            ),
            (
                "headers count negative",
                raw_record(&[0, 0, 0, 1, 1, 0x01]),
                1,
                record_error(0, RecordError::LengthOutOfRange),
            ),
            (
                "null header key",
                raw_record(&[0, 0, 0, 1, 1, 0x02, 0x01, 0x01]),
                1,
                record_error(0, RecordError::LengthOutOfRange),
            ),
            (
                "header count exceeds record",
                raw_record(&[0, 0, 0, 1, 1, 0xfe, 0xff, 0xff, 0xff, 0x0f]),
                1,
                record_error(0, RecordError::Truncated),
            ),
            (
                "key longer than record",
                raw_record(&[0, 0, 0, 0x08, b'a', 1, 0]),
                1,
                record_error(0, RecordError::Truncated),
            ),
            (
                "record longer than its fields",
                raw_record(&[0, 0, 0, 1, 1, 0, 0]),
                1,
                record_error(0, RecordError::TrailingBytes),
            ),
            (
                "offset delta not the index",
                raw_record(&[0, 0, 0x02, 1, 1, 0]),
                1,
                record_error(0, RecordError::OffsetDeltaMismatch { expected: 0, found: 1 }),
            ),
            (
                "fewer records than counted",
                raw_record(&valid_body),
                2,
                record_error(1, RecordError::Truncated),
            ),
            (
                "bytes after the last record",
                [raw_record(&valid_body), vec![0xAA]].concat(),
                1,
                Err(BatchError::TrailingRecordBytes { unread_bytes: 1 }),
            ),
            (
                "varint of 6 bytes",
                raw_record(&[0, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 1, 1, 0]),
                1,
                record_error(0, RecordError::VarintOverflow),
            ),
            (
                "varint with bits past 32",
                raw_record(&[0, 0, 0x80, 0x80, 0x80, 0x80, 0x10, 1, 1, 0]),
                1,
                record_error(0, RecordError::VarintOverflow),
            ),
            (
                "varlong of 11 bytes",
                raw_record(&[
                    0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00, 0, 1, 1, 0,
                ]),
                1,
                record_error(0, RecordError::VarintOverflow),
            ),
            (
                "varlong with bits past 64",
                raw_record(&[
                    0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x02, 0, 1, 1, 0,
                ]),
                1,
                record_error(0, RecordError::VarintOverflow),
            ),
            (
                "varlong of 10 bytes at the limit",
                raw_record(&[
                    0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0, 1, 1, 0,
                ]),
                1,
                Ok(()),
            ),
            (
                "varint ends with the record",
                vec![0x04, 0, 0, 0x80, 0x80],
                1,
                record_error(0, RecordError::Truncated),
            ),
        ];
        for (name, body, record_count, expected) in cases {
            let bytes = raw_batch(&body, record_count);
            let got = validate(&bytes, &BatchLimits::default()).map(|_| ());
            assert_eq!(got, expected, "{name}");
            // The iterator reports the same error, then stops.
            let mut iter = records(&bytes).unwrap();
            let first_error = iter.by_ref().find_map(Result::err);
            assert_eq!(first_error, expected.clone().err(), "{name} (iterator)");
            assert!(iter.next().is_none(), "{name}: iterator must be fused");
        }
    }

    #[test]
    fn varlong_limits_round_trip() {
        for value in [0, 1, -1, 63, -64, 64, i64::MAX, i64::MIN] {
            let mut out = Vec::new();
            write_varlong(&mut out, value);
            assert_eq!(out.len(), unsigned_size_bytes(zigzag64(value)));
            assert!(out.len() <= VARLONG_BYTES_MAX);
            assert_eq!(read_varlong(&mut out.as_slice()), Ok(value));
        }
        for value in [0, 1, -1, i32::MAX, i32::MIN] {
            let mut out = Vec::new();
            write_varint(&mut out, value);
            assert_eq!(out.len(), unsigned_size_bytes(zigzag32(value)));
            assert!(out.len() <= VARINT_BYTES_MAX);
            assert_eq!(read_varint(&mut out.as_slice()), Ok(value));
        }
    }

    #[test]
    fn compressed_batch_passes_header_checks_without_record_walk() {
        // Garbage records, as a compressed payload looks to a reader that does not decompress.
        let mut bytes = raw_batch(&[0xff; 32], 3);
        put_i16(&mut bytes, ATTRIBUTES_POS, i16::from(Compression::Gzip.codec_id()));
        fix_crc(&mut bytes);
        let header = validate(&bytes, &BatchLimits::default()).unwrap();
        assert_eq!(header.compression(), Compression::Gzip);
        assert_eq!(header.record_count(), 3);
        assert_eq!(validate_header_only(&bytes, &BatchLimits::default()), Ok(header));
        assert_eq!(records(&bytes).err(), Some(BatchError::Compressed(Compression::Gzip)));
        // The same bytes declared uncompressed are walked and refused.
        put_i16(&mut bytes, ATTRIBUTES_POS, 0);
        fix_crc(&mut bytes);
        assert!(matches!(
            validate(&bytes, &BatchLimits::default()),
            Err(BatchError::Record { index: 0, .. })
        ));
        assert!(validate_header_only(&bytes, &BatchLimits::default()).is_ok());
    }

    #[test]
    fn every_codec_round_trips() {
        for codec_id in 0..=7u8 {
            match Compression::from_codec_id(codec_id) {
                Ok(compression) => assert_eq!(compression.codec_id(), codec_id),
                Err(error) => {
                    assert!(codec_id >= 5);
                    assert_eq!(error, BatchError::UnsupportedCompression(codec_id));
                }
            }
        }
    }

    #[test]
    fn errors_display_their_values() {
        let error = BatchError::Record {
            index: 3,
            reason: RecordError::OffsetDeltaMismatch { expected: 3, found: 9 },
        };
        assert_eq!(error.to_string(), "record 3: offsetDelta 9, expected 3");
        assert!(std::error::Error::source(&error).is_some());
        assert!(BatchError::TooLarge { size: 10, max: 9 }.to_string().contains("10 bytes"));
    }
}
