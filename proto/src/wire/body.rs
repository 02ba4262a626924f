//! The fixed-record bodies of replica messages: the entries of a `Commit` and the prepare headers
//! (with present/nack flags) of a `DoViewChange` or `StartView`. The decoders bound every count
//! by a caller-given limit before allocating and never interpret any other body.

use super::layout::*;
use super::{BodyError, Command, CommitEntry, Header};

/// The body of a [`Command::Commit`] carrying `entries`, in order; pass it to [`Header::commit`]
/// with `entry_count = entries.len()`.
pub fn encode_commit_entries(entries: &[CommitEntry]) -> Vec<u8> {
    let mut body = Vec::with_capacity(entries.len() * COMMIT_ENTRY_SIZE);
    for entry in entries {
        let mut bytes = [0u8; COMMIT_ENTRY_SIZE];
        put_u64(&mut bytes, OFF_ENTRY_GROUP, entry.group);
        put_u64(&mut bytes, OFF_ENTRY_COMMIT, entry.commit);
        put_u32(&mut bytes, OFF_ENTRY_COMMIT_CHECKSUM, entry.commit_checksum);
        put_u32(&mut bytes, OFF_ENTRY_VIEW, entry.view);
        body.extend_from_slice(&bytes);
    }
    body
}

/// Decodes the entries of a [`Command::Commit`] message whose `body` the caller has already
/// checked with [`Header::verify_body`]. Before allocating, it checks that `header` is a commit,
/// that `entry_count <= entries_max`, and that `body` is exactly `entry_count` entries long.
pub fn decode_commit_entries(
    header: &Header,
    body: &[u8],
    entries_max: usize,
) -> Result<Vec<CommitEntry>, BodyError> {
    let Some(commit) = header.as_commit() else {
        return Err(BodyError::WrongCommand { expected: Command::Commit, actual: header.command });
    };
    let count = commit.entry_count;
    if count as usize > entries_max {
        return Err(BodyError::CountOverLimit { count, max: entries_max });
    }
    let expected = u64::from(count) * COMMIT_ENTRY_SIZE as u64;
    if body.len() as u64 != expected {
        return Err(BodyError::LengthMismatch { expected, actual: body.len() });
    }
    let (chunks, rest) = body.as_chunks::<COMMIT_ENTRY_SIZE>();
    debug_assert!(rest.is_empty());
    let entries = chunks
        .iter()
        .map(|bytes| CommitEntry {
            group: get_u64(bytes, OFF_ENTRY_GROUP),
            commit: get_u64(bytes, OFF_ENTRY_COMMIT),
            commit_checksum: get_u32(bytes, OFF_ENTRY_COMMIT_CHECKSUM),
            view: get_u32(bytes, OFF_ENTRY_VIEW),
        })
        .collect();
    Ok(entries)
}

/// The body of a [`Command::DoViewChange`] (`flags` given, one byte per header, see
/// [`VIEW_HEADER_FLAG_PRESENT`] and [`VIEW_HEADER_FLAG_NACK`]) or a [`Command::StartView`]
/// (`flags` `None`): every header as encoded (so relayed headers keep their exact bytes and
/// checksums), then the flag bytes. Pass it to the matching constructor with
/// `header_count = headers.len()`.
///
/// # Panics
///
/// If the input is something [`decode_view_headers`] would reject: a header that is not a
/// prepare, ops not strictly ascending, a flag slice of another length than `headers`, or a flag
/// byte with unknown bits or with both present and nack set.
pub fn encode_view_headers(headers: &[Header], flags: Option<&[u8]>) -> Vec<u8> {
    let mut previous: Option<u64> = None;
    for header in headers {
        let prepare = header.as_prepare().expect("view headers must be prepares");
        assert!(previous.is_none_or(|previous| prepare.op > previous), "ops must ascend");
        previous = Some(prepare.op);
    }
    if let Some(flags) = flags {
        assert_eq!(flags.len(), headers.len(), "one flag byte per header");
        for &flag in flags {
            assert!(view_header_flag_valid(flag), "invalid view header flags {flag:#04x}");
        }
    }
    let per_header = HEADER_SIZE + usize::from(flags.is_some());
    let mut body = Vec::with_capacity(headers.len() * per_header);
    for header in headers {
        body.extend_from_slice(&header.encode());
    }
    if let Some(flags) = flags {
        body.extend_from_slice(flags);
    }
    body
}

/// Decodes the body of a [`Command::DoViewChange`] (`with_flags`) or a [`Command::StartView`]:
/// `header_count` prepare headers, then (`with_flags`) as many flag bytes. Returns the headers
/// and the flags (empty without flags). The caller has already checked the body with
/// [`Header::verify_body`] and passes the count from the message's fields.
///
/// Before allocating it checks `header_count <= headers_max` and that `body` is exactly as long
/// as the count requires; then every header must pass [`Header::decode`], be a
/// [`Command::Prepare`], and have a higher op than the one before it, and every flag byte must
/// have only known bits, never present and nack together. Whether the headers belong to the
/// message's group and lie in its op range is the receiver's to check.
pub fn decode_view_headers(
    body: &[u8],
    header_count: u32,
    with_flags: bool,
    headers_max: usize,
) -> Result<(Vec<Header>, Vec<u8>), BodyError> {
    if header_count as usize > headers_max {
        return Err(BodyError::CountOverLimit { count: header_count, max: headers_max });
    }
    let expected = view_headers_body_size(header_count, with_flags);
    if body.len() as u64 != expected {
        return Err(BodyError::LengthMismatch { expected, actual: body.len() });
    }
    let headers_len = header_count as usize * HEADER_SIZE;
    let (header_bytes, flag_bytes) = body.split_at(headers_len);
    let (chunks, rest) = header_bytes.as_chunks::<HEADER_SIZE>();
    debug_assert!(rest.is_empty());

    let mut headers = Vec::with_capacity(chunks.len());
    let mut previous: Option<u64> = None;
    for (index, bytes) in chunks.iter().enumerate() {
        let header = Header::decode(bytes).map_err(|error| BodyError::Header { index, error })?;
        let Some(prepare) = header.as_prepare() else {
            return Err(BodyError::NotPrepare { index, command: header.command });
        };
        if let Some(previous) = previous
            && prepare.op <= previous
        {
            return Err(BodyError::OpsNotAscending { index, op: prepare.op, previous });
        }
        previous = Some(prepare.op);
        headers.push(header);
    }
    if let Some(index) = flag_bytes.iter().position(|&flag| !view_header_flag_valid(flag)) {
        return Err(BodyError::BadFlags { index, flags: flag_bytes[index] });
    }
    Ok((headers, flag_bytes.to_vec()))
}

pub(super) fn view_header_flag_valid(flag: u8) -> bool {
    flag & !VIEW_HEADER_FLAGS_KNOWN == 0 && flag != VIEW_HEADER_FLAG_PRESENT | VIEW_HEADER_FLAG_NACK
}
