//! The wire format's tests: round trips of every command, the documented offsets, and hostile
//! bytes (every single-bit flip, truncation and reserved byte) refused without a panic.

use super::body::*;
use super::fields::*;
use super::layout::*;
use super::*;
use proptest::prelude::*;

fn arb_prepare() -> impl Strategy<Value = Prepare> {
    (
        (any::<u64>(), any::<u64>(), any::<u64>(), any::<u32>()),
        (any::<u64>(), any::<u32>()),
        (any::<i64>(), any::<i64>(), any::<i64>()),
        (any::<u64>(), any::<u64>(), any::<u64>()),
        (any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()),
    )
        .prop_map(
            |(
                (group, op, commit, parent),
                (base_offset, record_count),
                (first_timestamp_ms, max_timestamp_ms, append_time_ms),
                (client, session, request),
                (voters, learners, next_voters, next_learners),
            )| Prepare {
                group,
                op,
                commit,
                parent,
                base_offset,
                record_count,
                first_timestamp_ms,
                max_timestamp_ms,
                append_time_ms,
                client,
                session,
                request,
                membership: Membership { voters, learners },
                reconfigure: Membership { voters: next_voters, learners: next_learners },
            },
        )
}

fn arb_header_and_body() -> impl Strategy<Value = (Header, Vec<u8>)> {
    (
        any::<u64>(),
        any::<u32>(),
        any::<u8>(),
        arb_prepare(),
        proptest::collection::vec(any::<u8>(), 0..512),
    )
        .prop_map(|(cluster, view, replica, prepare, body)| {
            (Header::prepare(cluster, view, replica, prepare, &body), body)
        })
}

/// Re-seals raw bytes so that the check under test, not the checksum, is what fires.
fn reseal(bytes: &mut [u8; HEADER_SIZE]) {
    let checksum = checksum_header(bytes);
    bytes[OFF_CHECKSUM_HEADER..OFF_CHECKSUM_BODY].copy_from_slice(&checksum.to_le_bytes());
}

fn sample_prepare() -> Prepare {
    Prepare {
        group: 0x1112_1314_1516_1718,
        op: 0x2122_2324_2526_2728,
        commit: 0x3132_3334_3536_3738,
        parent: 0x4142_4344,
        base_offset: 0x5152_5354_5556_5758,
        record_count: 0x6162_6364,
        first_timestamp_ms: 0x7172_7374_7576_7778,
        max_timestamp_ms: -2,
        append_time_ms: 1_700_000_000_000,
        client: 0x8182_8384_8586_8788,
        session: 0x9192_9394_9596_9798,
        request: 0xa1a2_a3a4_a5a6_a7a8,
        membership: Membership { voters: 0xb1b2_b3b4, learners: 0xc1c2_c3c4 },
        reconfigure: Membership { voters: 0xd1d2_d3d4, learners: 0xe1e2_e3e4 },
    }
}

fn sample_header() -> Header {
    Header::prepare(0x0102_0304_0506_0708, 0x0a0b_0c0d, 3, sample_prepare(), b"shoal")
}

fn from_hex(hex: &str) -> Vec<u8> {
    let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

proptest! {
    #[test]
    fn wire_round_trip((header, body) in arb_header_and_body()) {
        let bytes = header.encode();
        let decoded = Header::decode(&bytes).unwrap();
        prop_assert_eq!(decoded, header);
        prop_assert_eq!(decoded.version, VERSION);
        prop_assert_eq!(decoded.body_size(), body.len());
        prop_assert_eq!(decoded.verify_body(&body), Ok(()));
        prop_assert_eq!(decoded.encode(), bytes);

        let mut message = bytes.to_vec();
        message.extend_from_slice(&body);
        prop_assert_eq!(Header::decode_prefix(&message), Ok(header));
    }

    #[test]
    fn wire_bit_flip_rejected(
        (header, _body) in arb_header_and_body(),
        bit in 0..HEADER_SIZE * 8,
    ) {
        let mut bytes = header.encode();
        bytes[bit / 8] ^= 1 << (bit % 8);
        let result = Header::decode(&bytes);
        let rejected = matches!(result, Err(HeaderError::BadChecksum { .. }));
        prop_assert!(rejected, "bit {} flip not caught", bit);
    }

    #[test]
    fn wire_decode_arbitrary_never_panics(
        raw in proptest::collection::vec(any::<u8>(), HEADER_SIZE),
    ) {
        let bytes: [u8; HEADER_SIZE] = raw.try_into().unwrap();
        let _ = Header::decode(&bytes);
    }

    /// Arbitrary bytes almost never pass the checksum, so re-seal them to reach every later
    /// check; anything that then decodes must re-encode to the very same bytes.
    #[test]
    fn wire_decode_arbitrary_sealed_is_canonical(
        raw in proptest::collection::vec(any::<u8>(), HEADER_SIZE),
        command in prop_oneof![1u8..=16, any::<u8>()],
        version in prop_oneof![Just(VERSION), any::<u8>()],
        zero_reserved in any::<bool>(),
        small_counts in any::<bool>(),
    ) {
        let mut bytes: [u8; HEADER_SIZE] = raw.try_into().unwrap();
        bytes[OFF_COMMAND] = command;
        bytes[OFF_VERSION] = version;
        if zero_reserved && let Some(command) = Command::from_u8(command) {
            for &(offset, len) in RESERVED_COMMON.iter().chain(reserved_ranges(command)) {
                bytes[offset..offset + len].fill(0);
            }
        }
        if small_counts {
            // Counts below 256 (whichever command's count sits there), so that the size
            // fix-up below fits in `u32`.
            for offset in [
                OFF_COMMIT_ENTRY_COUNT,
                OFF_DO_VIEW_CHANGE_HEADER_COUNT,
                OFF_START_VIEW_HEADER_COUNT,
            ] {
                bytes[offset + 1..offset + 4].fill(0);
            }
        }
        reseal(&mut bytes);
        let mut result = Header::decode(&bytes);
        // Take the size the fields ask for, to reach what lies past the size check.
        if let Err(HeaderError::SizeInconsistent { expected, .. }) = result
            && let Ok(size) = u32::try_from(expected)
        {
            bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
            reseal(&mut bytes);
            result = Header::decode(&bytes);
            let inconsistent = matches!(result, Err(HeaderError::SizeInconsistent { .. }));
            prop_assert!(!inconsistent);
        }
        if let Ok(header) = result {
            prop_assert_eq!(header.encode(), bytes);
            let _ = header.verify_body(&[]);
        }
    }

    #[test]
    fn wire_decode_prefix_any_length_never_panics(
        raw in proptest::collection::vec(any::<u8>(), 0..600),
    ) {
        let result = Header::decode_prefix(&raw);
        if raw.len() < HEADER_SIZE {
            prop_assert_eq!(result, Err(HeaderError::TooShort { len: raw.len() }));
        }
    }
}

#[test]
fn wire_every_single_bit_flip_rejected() {
    let bytes = sample_header().encode();
    for bit in 0..HEADER_SIZE * 8 {
        let mut flipped = bytes;
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert!(
            matches!(Header::decode(&flipped), Err(HeaderError::BadChecksum { .. })),
            "bit {bit}"
        );
    }
}

#[test]
fn wire_checksum_checked_before_anything_else() {
    let mut bytes = sample_header().encode();
    bytes[OFF_VERSION] = 0xee;
    bytes[OFF_COMMAND] = 0xee;
    let computed = checksum_header(&bytes);
    assert_eq!(
        Header::decode(&bytes),
        Err(HeaderError::BadChecksum { stored: sample_header().checksum_header, computed })
    );
}

#[test]
fn wire_wrong_version_rejected() {
    for version in [0, VERSION_MIN_READ.wrapping_sub(1), VERSION + 1, u8::MAX] {
        if (VERSION_MIN_READ..=VERSION).contains(&version) {
            continue;
        }
        let mut bytes = sample_header().encode();
        bytes[OFF_VERSION] = version;
        reseal(&mut bytes);
        assert_eq!(Header::decode(&bytes), Err(HeaderError::UnsupportedVersion(version)));
    }
}

#[test]
fn wire_readable_versions_accepted() {
    for version in VERSION_MIN_READ..=VERSION {
        let mut bytes = sample_header().encode();
        bytes[OFF_VERSION] = version;
        reseal(&mut bytes);
        assert_eq!(Header::decode(&bytes).unwrap().version, version);
    }
}

#[test]
fn wire_unknown_command_rejected() {
    for command in [Command::Reserved as u8, 17, 0x7f, u8::MAX] {
        let mut bytes = sample_header().encode();
        bytes[OFF_COMMAND] = command;
        reseal(&mut bytes);
        assert_eq!(Header::decode(&bytes), Err(HeaderError::UnknownCommand(command)));
    }
}

#[test]
fn wire_every_reserved_byte_checked() {
    let mut reserved_offsets = Vec::new();
    for &(offset, len) in RESERVED_COMMON.iter().chain(&RESERVED_PREPARE) {
        reserved_offsets.extend(offset..offset + len);
    }
    assert_eq!(reserved_offsets.len(), 5 + 4 + 4 + 112);
    for offset in reserved_offsets {
        let mut bytes = sample_header().encode();
        bytes[offset] = 0x80;
        reseal(&mut bytes);
        assert_eq!(Header::decode(&bytes), Err(HeaderError::ReservedNonZero { offset }));
    }
}

#[test]
fn wire_size_too_small_rejected() {
    for size in [0, 1, HEADER_SIZE as u32 - 1] {
        let mut bytes = sample_header().encode();
        bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
        reseal(&mut bytes);
        assert_eq!(Header::decode(&bytes), Err(HeaderError::SizeTooSmall(size)));
    }
    let mut bytes = sample_header().encode();
    bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&(HEADER_SIZE as u32).to_le_bytes());
    reseal(&mut bytes);
    assert_eq!(Header::decode(&bytes).unwrap().body_size(), 0);
}

#[test]
fn wire_body_mismatch_rejected() {
    let header = sample_header();
    assert_eq!(header.verify_body(b"shoal"), Ok(()));
    assert_eq!(
        header.verify_body(b"shoa"),
        Err(HeaderError::BodySizeMismatch { expected: 5, actual: 4 })
    );
    assert_eq!(
        header.verify_body(b"shoal!"),
        Err(HeaderError::BodySizeMismatch { expected: 5, actual: 6 })
    );
    assert_eq!(
        header.verify_body(b"shoaL"),
        Err(HeaderError::BadBodyChecksum {
            stored: crc32c::crc32c(b"shoal"),
            computed: crc32c::crc32c(b"shoaL"),
        })
    );
}

#[test]
fn wire_empty_body() {
    let header = Header::prepare(1, 2, 0, Prepare::default(), &[]);
    assert_eq!(header.checksum_body, 0);
    assert_eq!(header.size as usize, HEADER_SIZE);
    assert_eq!(header.body_size(), 0);
    assert_eq!(header.verify_body(&[]), Ok(()));
}

#[test]
fn wire_seal_after_change() {
    let mut header = sample_header();
    header.view += 1;
    assert!(matches!(Header::decode(&header.encode()), Err(HeaderError::BadChecksum { .. })));
    header.seal();
    assert_eq!(Header::decode(&header.encode()), Ok(header));
}

#[test]
fn wire_zeroed_header_is_end_of_data_not_a_header() {
    let zero = [0u8; HEADER_SIZE];
    assert!(is_zeroed(&zero));
    assert!(is_zeroed(&[]));
    assert!(!is_zeroed(&sample_header().encode()));
    let mut one = zero;
    one[HEADER_SIZE - 1] = 1;
    assert!(!is_zeroed(&one));
    assert!(matches!(Header::decode(&zero), Err(HeaderError::BadChecksum { stored: 0, .. })));
}

#[test]
fn wire_decode_prefix_lengths() {
    let mut message = sample_header().encode().to_vec();
    assert_eq!(
        Header::decode_prefix(&message[..HEADER_SIZE - 1]),
        Err(HeaderError::TooShort { len: HEADER_SIZE - 1 })
    );
    assert_eq!(Header::decode_prefix(&[]), Err(HeaderError::TooShort { len: 0 }));
    message.extend_from_slice(b"shoal");
    let header = Header::decode_prefix(&message).unwrap();
    assert_eq!(header.verify_body(&message[HEADER_SIZE..]), Ok(()));
}

#[test]
fn wire_little_endian_at_known_offsets() {
    let bytes = sample_header().encode();
    assert_eq!(bytes[8..16], [0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01]);
    assert_eq!(bytes[16..20], (HEADER_SIZE as u32 + 5).to_le_bytes());
    assert_eq!(bytes[20..24], [0x0d, 0x0c, 0x0b, 0x0a]);
    assert_eq!(bytes[24], Command::Prepare as u8);
    assert_eq!(bytes[25], VERSION);
    assert_eq!(bytes[26], 3);
    assert_eq!(bytes[56..60], [0x44, 0x43, 0x42, 0x41]);
    assert_eq!(bytes[88..96], [0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
}

/// Pins the exact bytes of one header. If this fails, the layout changed: that is a format
/// change, which needs a VERSION bump and a docs/storage-format.md entry, not a new literal.
#[test]
fn wire_golden_bytes() {
    const GOLDEN: &str = "
            8bb30371 c39066f1 08070605 04030201 05010000 0d0c0b0a 01010300 00000000
            18171615 14131211 28272625 24232221 38373635 34333231 44434241 00000000
            58575655 54535251 64636261 00000000 78777675 74737271 feffffff ffffffff
            0068e5cf 8b010000 88878685 84838281 98979695 94939291 a8a7a6a5 a4a3a2a1
            b4b3b2b1 c4c3c2c1 d4d3d2d1 e4e3e2e1 00000000 00000000 00000000 00000000
            00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
            00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
            00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
        ";
    let golden = from_hex(GOLDEN);
    assert_eq!(golden.len(), HEADER_SIZE);
    let header = sample_header();
    assert_eq!(header.encode().to_vec(), golden);
    let golden: [u8; HEADER_SIZE] = golden.try_into().unwrap();
    assert_eq!(Header::decode(&golden), Ok(header));
}

#[test]
fn wire_as_prepare_and_command() {
    let header = sample_header();
    assert_eq!(header.command, Command::Prepare);
    assert_eq!(header.fields.command(), Command::Prepare);
    assert_eq!(header.as_prepare(), Some(&sample_prepare()));
    assert_eq!(Command::from_u8(0), None);
    assert_eq!(Command::from_u8(1), Some(Command::Prepare));
}

#[test]
fn wire_errors_display_and_are_errors() {
    let errors = [
        HeaderError::TooShort { len: 3 },
        HeaderError::BadChecksum { stored: 1, computed: 2 },
        HeaderError::UnsupportedVersion(9),
        HeaderError::UnknownCommand(9),
        HeaderError::ReservedNonZero { offset: 130 },
        HeaderError::SizeTooSmall(7),
        HeaderError::UnknownFlags { offset: 52, flags: 6 },
        HeaderError::SizeInconsistent { size: 300, expected: 256 },
        HeaderError::SizeOverLimit { size: 2000, max: 1280 },
        HeaderError::BodySizeMismatch { expected: 1, actual: 2 },
        HeaderError::BadBodyChecksum { stored: 1, computed: 2 },
    ];
    for error in errors {
        let boxed: Box<dyn std::error::Error> = Box::new(error.clone());
        assert!(!boxed.to_string().is_empty());
        assert_ne!(boxed.to_string(), format!("{error:?}"));
    }
    let errors = [
        BodyError::WrongCommand { expected: Command::Commit, actual: Command::Prepare },
        BodyError::CountOverLimit { count: 9, max: 8 },
        BodyError::LengthMismatch { expected: 24, actual: 23 },
        BodyError::Header { index: 1, error: HeaderError::UnknownCommand(77) },
        BodyError::NotPrepare { index: 0, command: Command::Commit },
        BodyError::OpsNotAscending { index: 1, op: 3, previous: 3 },
        BodyError::BadFlags { index: 2, flags: 0x80 },
    ];
    for error in errors {
        let boxed: Box<dyn std::error::Error> = Box::new(error.clone());
        assert!(!boxed.to_string().is_empty());
        assert_ne!(boxed.to_string(), format!("{error:?}"));
        assert_eq!(boxed.source().is_some(), matches!(error, BodyError::Header { .. }));
    }
}

#[test]
fn wire_journal_entry_round_trips_and_frames_a_prepare() {
    let prepare = sample_header();
    let body = prepare.encode();
    let fields = JournalEntry { seq: 7, durable_seq: 5, tail_seq: 2 };
    let header = Header::journal_entry(0xC1, fields, &body);
    let decoded = Header::decode(&header.encode()).unwrap();
    assert_eq!(decoded, header);
    assert_eq!(decoded.as_journal_entry(), Some(&fields));
    assert_eq!(decoded.as_prepare(), None);
    decoded.verify_body(&body).unwrap();
    let mut bytes = header.encode();
    bytes[OFF_JOURNAL_RESERVED_TAIL] = 1;
    reseal(&mut bytes);
    assert_eq!(
        Header::decode(&bytes),
        Err(HeaderError::ReservedNonZero { offset: OFF_JOURNAL_RESERVED_TAIL })
    );
}

// Replica messages (commands 3..=9).

const CLUSTER: u64 = 0x0102_0304_0506_0708;
const VIEW: u32 = 0x0a0b_0c0d;

fn sample_prepare_ok() -> Header {
    let fields = PrepareOk {
        group: 0x1112_1314_1516_1718,
        op: 0x2122_2324_2526_2728,
        commit: 0x3132_3334_3536_3738,
        prepare_checksum: 0x4142_4344,
    };
    Header::prepare_ok(CLUSTER, VIEW, 2, fields)
}

fn sample_commit_entries() -> Vec<CommitEntry> {
    vec![
        CommitEntry {
            group: 0x1112_1314_1516_1718,
            commit: 0x2122_2324_2526_2728,
            commit_checksum: 0x3132_3334,
            view: 0x4142_4344,
        },
        CommitEntry { group: 7, commit: 0, commit_checksum: 0, view: 1 },
    ]
}

fn commit_message(entries: &[CommitEntry]) -> (Header, Vec<u8>) {
    let body = encode_commit_entries(entries);
    let fields = Commit { entry_count: entries.len() as u32 };
    (Header::commit(CLUSTER, 1, fields, &body), body)
}

fn sample_commit() -> (Header, Vec<u8>) {
    commit_message(&sample_commit_entries())
}

fn sample_start_view_change() -> Header {
    let membership = Membership { voters: 0b1110, learners: 0b1 };
    Header::start_view_change(
        CLUSTER,
        VIEW,
        0,
        StartViewChange { group: 0x1112_1314_1516_1718, membership },
    )
}

/// A chain of `count` prepares of group 5 from op 10, each with a small body.
fn sample_view_prepares(count: u64) -> Vec<Header> {
    let mut parent = 0x5152_5354;
    (0..count)
        .map(|i| {
            let fields = Prepare { group: 5, op: 10 + i, commit: 9, parent, ..Prepare::default() };
            let header = Header::prepare(CLUSTER, 3, 1, fields, format!("op {i}").as_bytes());
            parent = header.checksum_header;
            header
        })
        .collect()
}

fn do_view_change_message(headers: &[Header], flags: &[u8]) -> (Header, Vec<u8>) {
    let body = encode_view_headers(headers, Some(flags));
    let fields = DoViewChange {
        group: 5,
        op: 0x2122_2324_2526_2728,
        commit: 9,
        faulty_from: 0x3132_3334_3536_3738,
        log_view: 3,
        header_count: headers.len() as u32,
        flags: 0,
        log_view_head_op: 0,
    };
    (Header::do_view_change(CLUSTER, 4, 2, fields, &body), body)
}

fn sample_do_view_change() -> (Header, Vec<u8>) {
    do_view_change_message(
        &sample_view_prepares(2),
        &[VIEW_HEADER_FLAG_PRESENT, VIEW_HEADER_FLAG_NACK],
    )
}

fn sample_start_view() -> (Header, Vec<u8>) {
    let headers = sample_view_prepares(2);
    let body = encode_view_headers(&headers, None);
    let fields = StartView {
        group: 5,
        op: 11,
        commit: 9,
        nonce: 0x4142_4344_4546_4748,
        header_count: headers.len() as u32,
        membership: Membership { voters: 0b111, learners: 0b1000 },
    };
    (Header::start_view(CLUSTER, 4, 1, fields, &body), body)
}

fn sample_request_start_view() -> Header {
    let fields = RequestStartView { group: 0x1112_1314_1516_1718, nonce: 0x2122_2324_2526_2728 };
    Header::request_start_view(CLUSTER, VIEW, 2, fields)
}

fn sample_request_prepare() -> Header {
    let fields =
        RequestPrepare::by_checksum(0x1112_1314_1516_1718, 0x2122_2324_2526_2728, 0x3132_3334);
    Header::request_prepare(CLUSTER, VIEW, 1, fields)
}

/// One sample message of every command, with its body.
fn sample_messages() -> Vec<(Header, Vec<u8>)> {
    let prepare_body = b"shoal".to_vec();
    let journal_body = sample_header().encode().to_vec();
    let journal = Header::journal_entry(CLUSTER, JournalEntry::default(), &journal_body);
    vec![
        (sample_header(), prepare_body),
        (journal, journal_body),
        (sample_prepare_ok(), Vec::new()),
        sample_commit(),
        (sample_start_view_change(), Vec::new()),
        sample_do_view_change(),
        sample_start_view(),
        (sample_request_start_view(), Vec::new()),
        (sample_request_prepare(), Vec::new()),
        sample_client_request(),
        sample_client_reply(),
        (sample_range_evicted(), Vec::new()),
        (sample_request_state(), Vec::new()),
        sample_state_chunk(),
        (sample_handshake(), Vec::new()),
        sample_handshake_refused(),
    ]
}

fn sample_request_state() -> Header {
    let fields = RequestState {
        group: 0x1112_1314_1516_1718,
        op: 0x2122_2324_2526_2728,
        offset_bytes: 0x3132_3334_3536_3738,
    };
    Header::request_state(CLUSTER, VIEW, 1, fields)
}

fn sample_state_chunk() -> (Header, Vec<u8>) {
    let chunk = b"producer table piece".to_vec();
    let fields = StateChunk {
        group: 0x1112_1314_1516_1718,
        op: 0x2122_2324_2526_2728,
        end_offset: 0x3132_3334_3536_3738,
        size_bytes: 0x4142_4344_4546_4748,
        offset_bytes: 0x5152_5354_5556_5758,
        prepare_checksum: 0x6162_6364,
        state_checksum: 0x7172_7374,
        chunk_size_bytes: 0,
    };
    (Header::state_chunk(CLUSTER, VIEW, 2, fields, &chunk), chunk)
}

fn sample_range_evicted() -> Header {
    let fields = RangeEvicted {
        group: 0x1112_1314_1516_1718,
        op: 0x2122_2324_2526_2728,
        op_min: 0x3132_3334_3536_3738,
    };
    Header::range_evicted(CLUSTER, VIEW, 2, fields)
}

fn sample_handshake() -> Header {
    let fields = Handshake {
        shard: 0x1112_1314,
        shard_count: 0x2122_2324,
        node_count: 0x31,
        flags: 0,
        incarnation: 0x4142_4344_4546_4748,
    };
    Header::handshake(CLUSTER, 1, fields)
}

fn sample_handshake_refused() -> (Header, Vec<u8>) {
    let fields =
        HandshakeRefused { shard: 0x1112_1314, shard_count: 0x2122_2324, node_count: 0x31 };
    let reason = b"cluster id 7 is not this node's 1".to_vec();
    (Header::handshake_refused(CLUSTER, 2, fields, &reason), reason)
}

fn sample_client_request() -> (Header, Vec<u8>) {
    let fields = ClientRequest {
        client: 0x1112_1314_1516_1718,
        session: 0x2122_2324_2526_2728,
        request: 0x3132_3334_3536_3738,
        operation: 0x4142_4344,
    };
    let body = b"request body".to_vec();
    (Header::request(CLUSTER, fields, &body), body)
}

fn sample_client_reply() -> (Header, Vec<u8>) {
    let fields = ClientReply {
        client: 0x1112_1314_1516_1718,
        request: 0x3132_3334_3536_3738,
        operation: 0x4142_4344,
        error: 0x5152_5354,
    };
    let body = b"reply body".to_vec();
    (Header::reply(CLUSTER, fields, &body), body)
}

/// The one round-trip check for every command: header bytes, body, and (for commands with a
/// record body) the body decoders, which must give back exactly what was encoded.
fn check_message(header: &Header, body: &[u8]) -> Result<(), TestCaseError> {
    let bytes = header.encode();
    let decoded = Header::decode(&bytes);
    prop_assert_eq!(&decoded, &Ok(*header));
    prop_assert_eq!(header.version, VERSION);
    prop_assert_eq!(header.command, header.fields.command());
    prop_assert_eq!(header.body_size(), body.len());
    prop_assert_eq!(header.verify_body(body), Ok(()));
    let mut message = bytes.to_vec();
    message.extend_from_slice(body);
    prop_assert_eq!(Header::decode_prefix(&message), Ok(*header));

    match header.fields {
        Fields::Commit(commit) => {
            let entries = decode_commit_entries(header, body, commit.entry_count as usize);
            prop_assert_eq!(encode_commit_entries(&entries.unwrap()), body);
        }
        Fields::DoViewChange(dvc) => {
            let decoded = decode_view_headers(body, dvc.header_count, true, 128);
            let (headers, flags) = decoded.unwrap();
            prop_assert_eq!(headers.len(), dvc.header_count as usize);
            prop_assert_eq!(encode_view_headers(&headers, Some(&flags)), body);
        }
        Fields::StartView(start_view) => {
            let decoded = decode_view_headers(body, start_view.header_count, false, 128);
            let (headers, flags) = decoded.unwrap();
            prop_assert!(flags.is_empty());
            prop_assert_eq!(encode_view_headers(&headers, None), body);
        }
        _ => prop_assert_eq!(decode_commit_entries(header, body, 8).is_err(), true),
    }
    Ok(())
}

/// Checks that `header` encodes to `golden_hex` followed by zeros, and that those bytes decode
/// back to `header`. Each golden was cross-checked against an independent encoder written
/// from docs/storage-format.md; if one fails, the layout changed (see `wire_golden_bytes`).
fn check_golden(header: &Header, golden_hex: &str) {
    let golden = from_hex(golden_hex);
    let bytes = header.encode();
    assert_eq!(bytes[..golden.len()], golden[..], "{:?}", header.command);
    assert!(is_zeroed(&bytes[golden.len()..]), "{:?}", header.command);
    assert_eq!(Header::decode(&bytes), Ok(*header));
}

fn arb_commit_entry() -> impl Strategy<Value = CommitEntry> {
    (any::<u64>(), any::<u64>(), any::<u32>(), any::<u32>()).prop_map(
        |(group, commit, commit_checksum, view)| CommitEntry {
            group,
            commit,
            commit_checksum,
            view,
        },
    )
}

/// Up to four prepare headers with strictly ascending ops.
fn arb_view_headers() -> impl Strategy<Value = Vec<Header>> {
    let item = (arb_prepare(), 1..1_000u64, proptest::collection::vec(any::<u8>(), 0..16));
    (0..u64::MAX / 2, any::<u32>(), proptest::collection::vec(item, 0..5)).prop_map(
        |(mut op, view, items)| {
            items
                .into_iter()
                .map(|(fields, step, body)| {
                    op += step;
                    Header::prepare(CLUSTER, view, 0, Prepare { op, ..fields }, &body)
                })
                .collect()
        },
    )
}

fn arb_view_flag() -> impl Strategy<Value = u8> {
    prop_oneof![Just(0), Just(VIEW_HEADER_FLAG_PRESENT), Just(VIEW_HEADER_FLAG_NACK)]
}

fn arb_replica_message() -> impl Strategy<Value = (Header, Vec<u8>)> {
    let prefix = (any::<u64>(), any::<u32>(), any::<u8>());
    prop_oneof![
        (prefix, any::<(u64, u64, u64, u32)>()).prop_map(
            |((cluster, view, replica), (group, op, commit, prepare_checksum))| {
                let fields = PrepareOk { group, op, commit, prepare_checksum };
                (Header::prepare_ok(cluster, view, replica, fields), Vec::new())
            }
        ),
        (any::<u64>(), any::<u8>(), proptest::collection::vec(arb_commit_entry(), 0..6)).prop_map(
            |(cluster, replica, entries)| {
                let body = encode_commit_entries(&entries);
                let fields = Commit { entry_count: entries.len() as u32 };
                (Header::commit(cluster, replica, fields, &body), body)
            }
        ),
        (prefix, any::<(u64, u32, u32)>()).prop_map(|((cluster, view, replica), (group, v, l))| {
            let fields =
                StartViewChange { group, membership: Membership { voters: v, learners: l } };
            (Header::start_view_change(cluster, view, replica, fields), Vec::new())
        }),
        (
            prefix,
            any::<(u64, u64, u64, u64, u32)>(),
            arb_view_headers(),
            proptest::collection::vec(arb_view_flag(), 4),
        )
            .prop_map(
                |(
                    (cluster, view, replica),
                    (group, op, commit, faulty_from, log_view),
                    headers,
                    flags,
                )| {
                    let flags = &flags[..headers.len()];
                    let body = encode_view_headers(&headers, Some(flags));
                    let header_count = headers.len() as u32;
                    let fields = DoViewChange {
                        group,
                        op,
                        commit,
                        faulty_from,
                        log_view,
                        header_count,
                        flags: (op & 1) as u32 | ((commit & 1) << 1) as u32,
                        log_view_head_op: if commit & 1 == 1 { op ^ commit } else { 0 },
                    };
                    (Header::do_view_change(cluster, view, replica, fields, &body), body)
                }
            ),
        (prefix, any::<(u64, u64, u64, u64)>(), arb_view_headers(), any::<(u32, u32)>()).prop_map(
            |(
                (cluster, view, replica),
                (group, op, commit, nonce),
                headers,
                (voters, learners),
            )| {
                let body = encode_view_headers(&headers, None);
                let header_count = headers.len() as u32;
                let membership = Membership { voters, learners };
                let fields = StartView { group, op, commit, nonce, header_count, membership };
                (Header::start_view(cluster, view, replica, fields, &body), body)
            }
        ),
        (prefix, any::<(u64, u64)>()).prop_map(|((cluster, view, replica), (group, nonce))| {
            let fields = RequestStartView { group, nonce };
            (Header::request_start_view(cluster, view, replica, fields), Vec::new())
        }),
        (prefix, any::<(u64, u64, Option<u32>)>()).prop_map(
            |((cluster, view, replica), (group, op, checksum))| {
                let fields = match checksum {
                    Some(checksum) => RequestPrepare::by_checksum(group, op, checksum),
                    None => RequestPrepare::committed(group, op),
                };
                (Header::request_prepare(cluster, view, replica, fields), Vec::new())
            }
        ),
        (prefix, any::<(u64, u64, u64)>()).prop_map(
            |((cluster, view, replica), (group, op, op_min))| {
                let fields = RangeEvicted { group, op, op_min };
                (Header::range_evicted(cluster, view, replica, fields), Vec::new())
            }
        ),
        (prefix, any::<(u64, u64, u64)>()).prop_map(
            |((cluster, view, replica), (group, op, offset_bytes))| {
                let fields = RequestState { group, op, offset_bytes };
                (Header::request_state(cluster, view, replica, fields), Vec::new())
            }
        ),
        (
            prefix,
            any::<(u64, u64, u64, u64, u64, u32, u32)>(),
            proptest::collection::vec(any::<u8>(), 0..64)
        )
            .prop_map(|((cluster, view, replica), fields, chunk)| {
                let (
                    group,
                    op,
                    end_offset,
                    size_bytes,
                    offset_bytes,
                    prepare_checksum,
                    state_checksum,
                ) = fields;
                let fields = StateChunk {
                    group,
                    op,
                    end_offset,
                    size_bytes,
                    offset_bytes,
                    prepare_checksum,
                    state_checksum,
                    chunk_size_bytes: 0,
                };
                (Header::state_chunk(cluster, view, replica, fields, &chunk), chunk)
            }),
    ]
}

proptest! {
    #[test]
    fn wire_replica_messages_round_trip((header, body) in arb_replica_message()) {
        check_message(&header, &body)?;
    }

    #[test]
    fn wire_replica_message_bit_flip_rejected(
        (header, _body) in arb_replica_message(),
        bit in 0..HEADER_SIZE * 8,
    ) {
        let mut bytes = header.encode();
        bytes[bit / 8] ^= 1 << (bit % 8);
        let rejected = matches!(Header::decode(&bytes), Err(HeaderError::BadChecksum { .. }));
        prop_assert!(rejected, "bit {} flip not caught", bit);
    }

    #[test]
    fn wire_decode_view_headers_arbitrary_never_panics(
        body in proptest::collection::vec(any::<u8>(), 0..1_100),
        header_count in prop_oneof![0..6u32, any::<u32>()],
        with_flags in any::<bool>(),
        headers_max in prop_oneof![0..6usize, Just(usize::MAX)],
    ) {
        if let Ok((headers, flags)) =
            decode_view_headers(&body, header_count, with_flags, headers_max)
        {
            prop_assert_eq!(headers.len(), header_count as usize);
            prop_assert_eq!(flags.len(), if with_flags { headers.len() } else { 0 });
        }
    }

    /// Arbitrary bytes never get past the first header's checksum, so start from a valid
    /// body and damage one byte of it (re-sealing the header it falls in, half of the time).
    #[test]
    fn wire_decode_view_headers_damaged_never_panics(
        (header, body) in arb_replica_message(),
        position in any::<prop::sample::Index>(),
        value in any::<u8>(),
        reseal_header in any::<bool>(),
    ) {
        let (count, with_flags) = match header.fields {
            Fields::DoViewChange(dvc) => (dvc.header_count, true),
            Fields::StartView(start_view) => (start_view.header_count, false),
            _ => return Ok(()),
        };
        let mut body = body;
        if body.is_empty() {
            return Ok(());
        }
        let position = position.index(body.len());
        body[position] = value;
        let index = position / HEADER_SIZE;
        if reseal_header && index < count as usize {
            let start = index * HEADER_SIZE;
            let chunk: &mut [u8; HEADER_SIZE] =
                (&mut body[start..start + HEADER_SIZE]).try_into().unwrap();
            reseal(chunk);
        }
        let _ = decode_view_headers(&body, count, with_flags, usize::MAX);
    }

    #[test]
    fn wire_decode_commit_entries_arbitrary_never_panics(
        entry_count in prop_oneof![0..6u32, any::<u32>()],
        body in proptest::collection::vec(any::<u8>(), 0..200),
        entries_max in prop_oneof![0..6usize, Just(usize::MAX)],
    ) {
        // A hand-built header: the decoder must not trust `size` to match the body.
        let header = Header {
            checksum_header: 0,
            checksum_body: 0,
            cluster: 0,
            size: HEADER_SIZE as u32,
            view: 0,
            command: Command::Commit,
            version: VERSION,
            replica: 0,
            fields: Fields::Commit(Commit { entry_count }),
        };
        if let Ok(entries) = decode_commit_entries(&header, &body, entries_max) {
            prop_assert_eq!(entries.len() * COMMIT_ENTRY_SIZE, body.len());
        }
    }
}

#[test]
fn wire_every_command_round_trips() {
    let messages = sample_messages();
    assert_eq!(messages.len(), 16);
    for (i, (header, body)) in messages.iter().enumerate() {
        assert_eq!(header.command as u8, i as u8 + 1);
        check_message(header, body).unwrap();
    }
}

#[test]
fn wire_every_command_single_bit_flip_rejected() {
    for (header, _body) in sample_messages() {
        let bytes = header.encode();
        for bit in 0..HEADER_SIZE * 8 {
            let mut flipped = bytes;
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                matches!(Header::decode(&flipped), Err(HeaderError::BadChecksum { .. })),
                "{:?} bit {bit}",
                header.command
            );
        }
    }
}

#[test]
fn wire_every_command_reserved_byte_checked() {
    let reserved_field_bytes = [
        (Command::Prepare, 4 + 4 + 112),
        (Command::JournalEntry, 200),
        (Command::PrepareOk, 196),
        (Command::Commit, 220),
        (Command::StartViewChange, 208),
        (Command::DoViewChange, 4 + 168),
        (Command::StartView, 180),
        (Command::RequestStartView, 208),
        (Command::RequestPrepare, 200),
        (Command::Request, 196),
        (Command::Reply, 200),
        (Command::RangeEvicted, 200),
        (Command::RequestState, 200),
        (Command::StateChunk, 172),
        (Command::Handshake, 6 + 200),
        (Command::HandshakeRefused, 215),
    ];
    for ((header, _body), (command, field_bytes)) in
        sample_messages().into_iter().zip(reserved_field_bytes)
    {
        assert_eq!(header.command, command);
        let mut reserved_offsets = Vec::new();
        for &(offset, len) in RESERVED_COMMON.iter().chain(reserved_ranges(command)) {
            reserved_offsets.extend(offset..offset + len);
        }
        assert_eq!(reserved_offsets.len(), 5 + field_bytes, "{command:?}");
        for offset in reserved_offsets {
            let mut bytes = header.encode();
            bytes[offset] = 0x80;
            reseal(&mut bytes);
            assert_eq!(
                Header::decode(&bytes),
                Err(HeaderError::ReservedNonZero { offset }),
                "{command:?}"
            );
        }
    }
}

#[test]
fn wire_replica_message_size_must_match_counts() {
    let cases = [
        (sample_prepare_ok(), HEADER_SIZE as u64),
        (sample_commit().0, (HEADER_SIZE + 2 * COMMIT_ENTRY_SIZE) as u64),
        (sample_start_view_change(), HEADER_SIZE as u64),
        (sample_do_view_change().0, (HEADER_SIZE + 2 * (HEADER_SIZE + 1)) as u64),
        (sample_start_view().0, (HEADER_SIZE + 2 * HEADER_SIZE) as u64),
        (sample_request_start_view(), HEADER_SIZE as u64),
        (sample_request_prepare(), HEADER_SIZE as u64),
        (sample_handshake(), HEADER_SIZE as u64),
    ];
    for (header, expected) in cases {
        assert_eq!(u64::from(header.size), expected, "{:?}", header.command);
        // One byte short of a header is `SizeTooSmall`, checked before the counts.
        let short = expected - 1;
        for size in [short, expected + 1, u64::from(u32::MAX)] {
            if short < HEADER_SIZE as u64 && size == short {
                continue;
            }
            let size = u32::try_from(size).unwrap();
            let mut bytes = header.encode();
            bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
            reseal(&mut bytes);
            assert_eq!(
                Header::decode(&bytes),
                Err(HeaderError::SizeInconsistent { size, expected }),
                "{:?}",
                header.command
            );
        }
    }
    // A count whose body cannot fit in the size field at all.
    let mut bytes = sample_commit().0.encode();
    bytes[OFF_COMMIT_ENTRY_COUNT..OFF_COMMIT_ENTRY_COUNT + 4]
        .copy_from_slice(&u32::MAX.to_le_bytes());
    reseal(&mut bytes);
    let expected = HEADER_SIZE as u64 + u64::from(u32::MAX) * COMMIT_ENTRY_SIZE as u64;
    assert!(expected > u64::from(u32::MAX));
    let size = (HEADER_SIZE + 2 * COMMIT_ENTRY_SIZE) as u32;
    assert_eq!(Header::decode(&bytes), Err(HeaderError::SizeInconsistent { size, expected }));
}

#[test]
fn wire_as_accessors_match_only_their_command() {
    for (header, _body) in sample_messages() {
        let command = header.command;
        assert_eq!(header.as_prepare().is_some(), command == Command::Prepare);
        assert_eq!(header.as_journal_entry().is_some(), command == Command::JournalEntry);
        assert_eq!(header.as_prepare_ok().is_some(), command == Command::PrepareOk);
        assert_eq!(header.as_commit().is_some(), command == Command::Commit);
        assert_eq!(header.as_start_view_change().is_some(), command == Command::StartViewChange);
        assert_eq!(header.as_do_view_change().is_some(), command == Command::DoViewChange);
        assert_eq!(header.as_start_view().is_some(), command == Command::StartView);
        assert_eq!(header.as_request_start_view().is_some(), command == Command::RequestStartView);
        assert_eq!(header.as_request_prepare().is_some(), command == Command::RequestPrepare);
        assert_eq!(header.as_request().is_some(), command == Command::Request);
        assert_eq!(header.as_reply().is_some(), command == Command::Reply);
        assert_eq!(header.as_range_evicted().is_some(), command == Command::RangeEvicted);
        assert_eq!(header.as_request_state().is_some(), command == Command::RequestState);
        assert_eq!(header.as_state_chunk().is_some(), command == Command::StateChunk);
        assert_eq!(header.as_handshake().is_some(), command == Command::Handshake);
        assert_eq!(header.as_handshake_refused().is_some(), command == Command::HandshakeRefused);
        assert_eq!(Command::from_u8(command as u8), Some(command));
    }
    assert_eq!(Command::from_u8(17), None);
    assert_eq!(sample_prepare_ok().as_prepare_ok().unwrap().prepare_checksum, 0x4142_4344);
    assert_eq!(sample_commit().0.as_commit(), Some(&Commit { entry_count: 2 }));
    assert_eq!(sample_start_view().0.as_start_view().unwrap().nonce, 0x4142_4344_4546_4748);
    assert_eq!(sample_do_view_change().0.as_do_view_change().unwrap().log_view, 3);
    assert_eq!(
        sample_request_start_view().as_request_start_view().unwrap().nonce,
        0x2122_2324_2526_2728
    );
}

#[test]
fn do_view_change_log_view_head_is_held_to_its_flag() {
    let (header, body) = sample_do_view_change();
    let mut fields = *header.as_do_view_change().unwrap();
    fields.flags = DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN;
    fields.log_view_head_op = 0x0102_0304_0506_0708;
    let known = Header::do_view_change(CLUSTER, 4, 2, fields, &body);
    let bytes = known.encode();
    assert_eq!(bytes[80..88], 0x0102_0304_0506_0708u64.to_le_bytes());
    assert_eq!(Header::decode(&bytes).unwrap().as_do_view_change(), Some(&fields));
    // Without its flag the field is unused and must be zero, like reserved bytes.
    let mut unflagged = bytes;
    unflagged[OFF_DO_VIEW_CHANGE_FLAGS..OFF_DO_VIEW_CHANGE_FLAGS + 4].fill(0);
    reseal(&mut unflagged);
    assert_eq!(
        Header::decode(&unflagged),
        Err(HeaderError::ReservedNonZero { offset: OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP })
    );
    // The pad before it is reserved, and so is a flag bit beyond the two known.
    let mut padded = bytes;
    padded[OFF_DO_VIEW_CHANGE_RESERVED_PAD + 3] = 1;
    reseal(&mut padded);
    assert_eq!(
        Header::decode(&padded),
        Err(HeaderError::ReservedNonZero { offset: OFF_DO_VIEW_CHANGE_RESERVED_PAD + 3 })
    );
    let mut flagged = bytes;
    flagged[OFF_DO_VIEW_CHANGE_FLAGS] = 0b111;
    reseal(&mut flagged);
    assert_eq!(
        Header::decode(&flagged),
        Err(HeaderError::UnknownFlags { offset: OFF_DO_VIEW_CHANGE_FLAGS, flags: 0b111 })
    );
}

#[test]
fn wire_replica_golden_bytes() {
    check_golden(
        &sample_prepare_ok(),
        "cd1cec94 00000000 08070605 04030201 00010000 0d0c0b0a 03010200 00000000
             18171615 14131211 28272625 24232221 38373635 34333231 44434241 00000000",
    );
    check_golden(
        &sample_commit().0,
        "354dde87 483c95be 08070605 04030201 30010000 00000000 04010100 00000000
             02000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000",
    );
    check_golden(
        &sample_start_view_change(),
        "439d9347 00000000 08070605 04030201 00010000 0d0c0b0a 05010000 00000000
             18171615 14131211 0e000000 01000000 00000000 00000000 00000000 00000000",
    );
    check_golden(
        &sample_do_view_change().0,
        "4f6b78b1 db501f10 08070605 04030201 02030000 04000000 06010200 00000000
             05000000 00000000 28272625 24232221 09000000 00000000 38373635 34333231
             03000000 02000000 00000000 00000000 00000000 00000000 00000000 00000000",
    );
    check_golden(
        &sample_start_view().0,
        "7ff4b46f 8567523b 08070605 04030201 00030000 04000000 07010100 00000000
             05000000 00000000 0b000000 00000000 09000000 00000000 48474645 44434241
             02000000 07000000 08000000 00000000 00000000 00000000 00000000 00000000",
    );
    check_golden(
        &sample_request_start_view(),
        "e5ae2892 00000000 08070605 04030201 00010000 0d0c0b0a 08010200 00000000
             18171615 14131211 28272625 24232221 00000000 00000000 00000000 00000000",
    );
    check_golden(
        &sample_request_prepare(),
        "8c6bbd14 00000000 08070605 04030201 00010000 0d0c0b0a 09010100 00000000
             18171615 14131211 28272625 24232221 34333231 01000000 00000000 00000000",
    );
}

/// Pins the body layouts: a commit entry and the flag bytes after the view headers.
#[test]
fn wire_replica_body_golden_bytes() {
    let body = encode_commit_entries(&sample_commit_entries());
    assert_eq!(
        body,
        from_hex(
            "18171615 14131211 28272625 24232221 34333231 44434241
             07000000 00000000 00000000 00000000 00000000 01000000"
        )
    );
    let (_, body) = sample_do_view_change();
    let headers = sample_view_prepares(2);
    assert_eq!(body.len(), 2 * HEADER_SIZE + 2);
    assert_eq!(body[..HEADER_SIZE], headers[0].encode());
    assert_eq!(body[HEADER_SIZE..2 * HEADER_SIZE], headers[1].encode());
    assert_eq!(body[2 * HEADER_SIZE..], [0x01, 0x02]);
    let (_, body) = sample_start_view();
    assert_eq!(body.len(), 2 * HEADER_SIZE);
    assert_eq!(body[HEADER_SIZE..], headers[1].encode());
}

#[test]
fn wire_commit_entries_count_over_limit_rejected() {
    let (header, body) = sample_commit();
    assert_eq!(decode_commit_entries(&header, &body, 2), Ok(sample_commit_entries()));
    assert_eq!(
        decode_commit_entries(&header, &body, 1),
        Err(BodyError::CountOverLimit { count: 2, max: 1 })
    );
    let (empty, body) = commit_message(&[]);
    assert_eq!(decode_commit_entries(&empty, &body, 0), Ok(Vec::new()));
}

#[test]
fn wire_commit_entries_wrong_body_length_rejected() {
    let (header, body) = sample_commit();
    let expected = 2 * COMMIT_ENTRY_SIZE as u64;
    for actual in [0, body.len() - 1, body.len() + 1, body.len() + COMMIT_ENTRY_SIZE] {
        let mut wrong = body.clone();
        wrong.resize(actual, 0);
        assert_eq!(
            decode_commit_entries(&header, &wrong, usize::MAX),
            Err(BodyError::LengthMismatch { expected, actual })
        );
    }
}

#[test]
fn wire_commit_entries_wrong_command_rejected() {
    assert_eq!(
        decode_commit_entries(&sample_prepare_ok(), &[], 8),
        Err(BodyError::WrongCommand { expected: Command::Commit, actual: Command::PrepareOk })
    );
}

#[test]
fn wire_view_headers_count_over_limit_rejected() {
    let (_, body) = sample_do_view_change();
    assert!(decode_view_headers(&body, 2, true, 2).is_ok());
    assert_eq!(
        decode_view_headers(&body, 2, true, 1),
        Err(BodyError::CountOverLimit { count: 2, max: 1 })
    );
    // A huge count with a generous limit fails on the length check, before any allocation.
    assert_eq!(
        decode_view_headers(&body, u32::MAX, true, usize::MAX),
        Err(BodyError::LengthMismatch {
            expected: u64::from(u32::MAX) * (HEADER_SIZE as u64 + 1),
            actual: body.len(),
        })
    );
    assert_eq!(decode_view_headers(&[], 0, true, 0), Ok((Vec::new(), Vec::new())));
}

#[test]
fn wire_view_headers_wrong_body_length_rejected() {
    let (_, dvc_body) = sample_do_view_change();
    let (_, start_view_body) = sample_start_view();
    let dvc_expected = 2 * (HEADER_SIZE as u64 + 1);
    let start_view_expected = 2 * HEADER_SIZE as u64;
    let cases = [
        (&dvc_body[..dvc_body.len() - 1], true, dvc_expected),
        (&start_view_body[..], true, dvc_expected),
        (&dvc_body[..], false, start_view_expected),
        (&start_view_body[..HEADER_SIZE], false, start_view_expected),
    ];
    for (body, with_flags, expected) in cases {
        assert_eq!(
            decode_view_headers(body, 2, with_flags, 128),
            Err(BodyError::LengthMismatch { expected, actual: body.len() })
        );
    }
    let mut longer = start_view_body.clone();
    longer.push(0);
    assert_eq!(
        decode_view_headers(&longer, 2, false, 128),
        Err(BodyError::LengthMismatch { expected: start_view_expected, actual: longer.len() })
    );
}

#[test]
fn wire_view_headers_bad_flag_bits_rejected() {
    let headers = sample_view_prepares(2);
    for flag in [0, VIEW_HEADER_FLAG_PRESENT, VIEW_HEADER_FLAG_NACK] {
        let (_, body) = do_view_change_message(&headers, &[0, flag]);
        assert_eq!(decode_view_headers(&body, 2, true, 128).unwrap().1, [0, flag]);
    }
    let (_, body) = sample_do_view_change();
    for flag in [0x04, 0x80, 0xff, VIEW_HEADER_FLAG_PRESENT | VIEW_HEADER_FLAG_NACK] {
        let mut bad = body.clone();
        *bad.last_mut().unwrap() = flag;
        assert_eq!(
            decode_view_headers(&bad, 2, true, 128),
            Err(BodyError::BadFlags { index: 1, flags: flag })
        );
    }
}

#[test]
fn wire_view_headers_non_prepare_rejected() {
    let journal = Header::journal_entry(CLUSTER, JournalEntry::default(), &[]);
    for stranger in [sample_prepare_ok(), sample_start_view_change(), journal] {
        let mut body = encode_view_headers(&sample_view_prepares(1), None);
        body.extend_from_slice(&stranger.encode());
        assert_eq!(
            decode_view_headers(&body, 2, false, 128),
            Err(BodyError::NotPrepare { index: 1, command: stranger.command })
        );
    }
}

#[test]
fn wire_view_headers_corrupt_header_rejected() {
    let (_, mut body) = sample_start_view();
    body[HEADER_SIZE + 40] ^= 1;
    assert!(matches!(
        decode_view_headers(&body, 2, false, 128),
        Err(BodyError::Header { index: 1, error: HeaderError::BadChecksum { .. } })
    ));
}

#[test]
fn wire_view_headers_ops_not_ascending_rejected() {
    let headers = sample_view_prepares(2);
    for pair in [[headers[0], headers[0]], [headers[1], headers[0]]] {
        let mut body = pair[0].encode().to_vec();
        body.extend_from_slice(&pair[1].encode());
        assert_eq!(
            decode_view_headers(&body, 2, false, 128),
            Err(BodyError::OpsNotAscending {
                index: 1,
                op: pair[1].as_prepare().unwrap().op,
                previous: pair[0].as_prepare().unwrap().op,
            })
        );
    }
}

#[test]
#[should_panic(expected = "view headers must be prepares")]
fn wire_encode_view_headers_refuses_non_prepare() {
    encode_view_headers(&[sample_prepare_ok()], None);
}

#[test]
#[should_panic(expected = "ops must ascend")]
fn wire_encode_view_headers_refuses_descending_ops() {
    let headers = sample_view_prepares(2);
    encode_view_headers(&[headers[1], headers[0]], None);
}

#[test]
#[should_panic(expected = "one flag byte per header")]
fn wire_encode_view_headers_refuses_missing_flags() {
    encode_view_headers(&sample_view_prepares(2), Some(&[0]));
}

#[test]
#[should_panic(expected = "invalid view header flags")]
fn wire_encode_view_headers_refuses_present_and_nack() {
    encode_view_headers(&sample_view_prepares(1), Some(&[3]));
}

#[test]
#[should_panic(expected = "body length disagrees with its count field")]
fn wire_commit_constructor_refuses_wrong_count() {
    let body = encode_commit_entries(&sample_commit_entries());
    Header::commit(CLUSTER, 0, Commit { entry_count: 1 }, &body);
}

#[test]
fn wire_request_prepare_flags() {
    let by_checksum = RequestPrepare::by_checksum(5, 10, 0xabcd);
    assert_eq!(by_checksum.checksum_given(), Some(0xabcd));
    let committed = RequestPrepare::committed(5, 10);
    assert_eq!(committed.checksum_given(), None);
    assert_eq!(committed.checksum, 0);
    let header = Header::request_prepare(CLUSTER, 1, 0, committed);
    check_message(&header, &[]).unwrap();

    // Unknown flag bits.
    for flags in [0b10, 0b11, 1 << 31] {
        let mut bytes = sample_request_prepare().encode();
        bytes[OFF_REQUEST_PREPARE_FLAGS..OFF_REQUEST_PREPARE_FLAGS + 4]
            .copy_from_slice(&u32::to_le_bytes(flags));
        reseal(&mut bytes);
        assert_eq!(
            Header::decode(&bytes),
            Err(HeaderError::UnknownFlags { offset: OFF_REQUEST_PREPARE_FLAGS, flags })
        );
    }
    // A checksum without the flag that says it is given.
    for (checksum, first_nonzero) in [(1u32, 0), (0x0100, 1), (0xff00_0000, 3)] {
        let mut bytes = header.encode();
        bytes[OFF_REQUEST_PREPARE_CHECKSUM..OFF_REQUEST_PREPARE_CHECKSUM + 4]
            .copy_from_slice(&checksum.to_le_bytes());
        reseal(&mut bytes);
        assert_eq!(
            Header::decode(&bytes),
            Err(HeaderError::ReservedNonZero {
                offset: OFF_REQUEST_PREPARE_CHECKSUM + first_nonzero
            })
        );
    }
}

#[test]
#[should_panic(expected = "checksum without REQUEST_PREPARE_FLAG_CHECKSUM")]
fn wire_request_prepare_constructor_refuses_stray_checksum() {
    let fields = RequestPrepare { group: 1, op: 2, checksum: 3, flags: 0 };
    Header::request_prepare(CLUSTER, 0, 0, fields);
}

// The replica bus handshake (commands 15 and 16).

fn arb_handshake_message() -> impl Strategy<Value = (Header, Vec<u8>)> {
    let prefix = (any::<u64>(), any::<u8>());
    let identity = (any::<u32>(), any::<u32>(), any::<u8>());
    prop_oneof![
        (prefix, identity, any::<u64>(), any::<bool>()).prop_map(
            |((cluster, node), (shard, shard_count, node_count), incarnation, formed)| {
                let flags = if formed { HANDSHAKE_FLAG_FORMED } else { 0 };
                let fields = Handshake { shard, shard_count, node_count, flags, incarnation };
                (Header::handshake(cluster, node, fields), Vec::new())
            }
        ),
        (prefix, identity, proptest::collection::vec(any::<u8>(), 0..=HANDSHAKE_REASON_BYTES_MAX))
            .prop_map(|((cluster, node), (shard, shard_count, node_count), reason)| {
                let fields = HandshakeRefused { shard, shard_count, node_count };
                (Header::handshake_refused(cluster, node, fields, &reason), reason)
            }),
    ]
}

proptest! {
    #[test]
    fn wire_handshake_messages_round_trip((header, body) in arb_handshake_message()) {
        check_message(&header, &body)?;
        prop_assert_eq!(header.view, 0);
    }
}

/// A handshake flag this build does not know is refused, as the DoViewChange's are.
#[test]
fn wire_handshake_unknown_flags_rejected() {
    let mut bytes = sample_handshake().encode();
    bytes[41] = 0b11;
    reseal(&mut bytes);
    assert_eq!(Header::decode(&bytes), Err(HeaderError::UnknownFlags { offset: 41, flags: 0b11 }));
}

/// Every field at its lowest and highest value, and a refusal's reason empty and at its limit.
#[test]
fn wire_handshake_fields_at_their_bounds() {
    for (value_u8, value_u32, value_u64) in [(0, 0, 0), (u8::MAX, u32::MAX, u64::MAX)] {
        let fields = Handshake {
            shard: value_u32,
            shard_count: value_u32,
            node_count: value_u8,
            flags: HANDSHAKE_FLAG_FORMED.min(value_u8),
            incarnation: value_u64,
        };
        let header = Header::handshake(value_u64, value_u8, fields);
        check_message(&header, &[]).unwrap();
        let decoded = Header::decode(&header.encode()).unwrap();
        assert_eq!(decoded.as_handshake(), Some(&fields));
        assert_eq!((decoded.cluster, decoded.replica, decoded.view), (value_u64, value_u8, 0));

        let fields =
            HandshakeRefused { shard: value_u32, shard_count: value_u32, node_count: value_u8 };
        for reason_bytes in [0, HANDSHAKE_REASON_BYTES_MAX] {
            let reason = vec![b'x'; reason_bytes];
            let header = Header::handshake_refused(value_u64, value_u8, fields, &reason);
            check_message(&header, &reason).unwrap();
            let decoded = Header::decode(&header.encode()).unwrap();
            assert_eq!(decoded.as_handshake_refused(), Some(&fields));
            assert_eq!(decoded.body_size(), reason_bytes);
            assert_eq!((decoded.cluster, decoded.replica, decoded.view), (value_u64, value_u8, 0));
        }
    }
}

#[test]
fn wire_handshake_refused_reason_over_limit_rejected() {
    let fields = HandshakeRefused { shard: 1, shard_count: 2, node_count: 3 };
    let reason = vec![b'x'; HANDSHAKE_REASON_BYTES_MAX];
    let header = Header::handshake_refused(CLUSTER, 0, fields, &reason);
    let max = (HEADER_SIZE + HANDSHAKE_REASON_BYTES_MAX) as u64;
    assert_eq!(u64::from(header.size), max);
    for size in [max as u32 + 1, u32::MAX] {
        let mut bytes = header.encode();
        bytes[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
        reseal(&mut bytes);
        assert_eq!(Header::decode(&bytes), Err(HeaderError::SizeOverLimit { size, max }));
    }
}

#[test]
#[should_panic(expected = "exceeds its limit")]
fn wire_handshake_refused_constructor_refuses_long_reason() {
    let reason = vec![b'x'; HANDSHAKE_REASON_BYTES_MAX + 1];
    Header::handshake_refused(CLUSTER, 0, HandshakeRefused::default(), &reason);
}

/// Pins both layouts, and that a refusal's identity sits where a handshake's does. The goldens
/// were computed by an independent encoder written from docs/protocol.md.
#[test]
fn wire_handshake_golden_bytes() {
    check_golden(
        &sample_handshake(),
        "da119e0f 00000000 08070605 04030201 00010000 00000000 0f010100 00000000
             14131211 24232221 31000000 00000000 48474645 44434241 00000000 00000000",
    );
    let (header, reason) = sample_handshake_refused();
    check_golden(
        &header,
        "ee7db738 86dc9aec 08070605 04030201 21010000 00000000 10010200 00000000
             14131211 24232221 31",
    );
    assert_eq!(header.verify_body(&reason), Ok(()));
}

#[test]
fn a_reply_built_from_parts_is_the_reply_built_from_their_concatenation() {
    let (whole, body) = sample_client_reply();
    let fields = *whole.as_reply().expect("a reply");
    let parts: [&[u8]; 3] = [&body[..3], &[], &body[3..]];
    assert_eq!(Header::reply_parts(CLUSTER, fields, &parts).encode(), whole.encode());
    let none: [&[u8]; 0] = [];
    assert_eq!(
        Header::reply_parts(CLUSTER, fields, &none).encode(),
        Header::reply(CLUSTER, fields, &[]).encode()
    );
}
