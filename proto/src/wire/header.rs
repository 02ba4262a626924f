//! The [`Header`] itself: its constructors (one per command, each sealing the checksums), the
//! encode, and [`Header::decode`], the only door from untrusted bytes to a header. Also the
//! raw-bytes helpers recovery uses (`checksum_header`, `is_zeroed`).

use crate::checksum;

use super::fields::*;
use super::layout::*;
use super::{Command, Fields, HeaderError};

/// A decoded (or about-to-be-encoded) wire header.
///
/// Invariant: `command == fields.command()`. The constructors and [`Header::decode`] uphold it;
/// code building a `Header` by hand must too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// CRC-32C over header bytes 4..256. Because that range includes `checksum_body`, this one
    /// value commits to the whole message, which is why the hash chain can use it alone.
    pub checksum_header: u32,
    /// CRC-32C of the body following the header (`0` for an empty body).
    pub checksum_body: u32,
    /// Cluster id, so messages and files from another cluster are never mistaken for ours.
    pub cluster: u64,
    /// Header plus body, in bytes; at least [`HEADER_SIZE`].
    pub size: u32,
    /// VSR view number: for a replica message, the sender's view of the message's group (`0` in
    /// a [`Command::Commit`], whose entries carry one view per group).
    pub view: u32,
    /// What the message is; selects the layout of `fields`.
    pub command: Command,
    /// Format version the header was written with.
    pub version: u8,
    /// Index of the replica that sent the message.
    pub replica: u8,
    /// The per-command fields.
    pub fields: Fields,
}

impl Header {
    /// Builds a sealed prepare header for `body`: `size` and `checksum_body` come from the body,
    /// `version` is [`VERSION`], and `checksum_header` is computed last.
    ///
    /// # Panics
    ///
    /// If `body` is longer than `u32::MAX - HEADER_SIZE` bytes; callers enforce their own, far
    /// smaller, message limit before getting here.
    pub fn prepare(cluster: u64, view: u32, replica: u8, fields: Prepare, body: &[u8]) -> Header {
        Header::sealed(cluster, view, replica, Fields::Prepare(fields), body)
    }

    /// [`Header::prepare`] for a body whose CRC-32C the caller already holds, so the body is
    /// not read again.
    pub fn prepare_checksummed(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: Prepare,
        body: &[u8],
        checksum_body: u32,
    ) -> Header {
        Header::sealed_checksummed(
            cluster,
            view,
            replica,
            Fields::Prepare(fields),
            body,
            checksum_body,
        )
    }

    /// Builds a sealed journal entry header framing `body` (one encoded prepare).
    ///
    /// # Panics
    ///
    /// As [`Header::prepare`], on a body longer than the size field can hold.
    pub fn journal_entry(cluster: u64, fields: JournalEntry, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, 0, Fields::JournalEntry(fields), body)
    }

    /// [`Header::journal_entry`] for a body whose CRC-32C the caller already holds.
    pub fn journal_entry_checksummed(
        cluster: u64,
        fields: JournalEntry,
        body: &[u8],
        checksum_body: u32,
    ) -> Header {
        Header::sealed_checksummed(cluster, 0, 0, Fields::JournalEntry(fields), body, checksum_body)
    }

    /// Builds a sealed prepare-ok header (empty body).
    pub fn prepare_ok(cluster: u64, view: u32, replica: u8, fields: PrepareOk) -> Header {
        Header::sealed(cluster, view, replica, Fields::PrepareOk(fields), &[])
    }

    /// Builds a sealed commit header for `body`, the output of [`encode_commit_entries`]. The
    /// header's `view` is `0`: each entry carries its group's view. `replica` identifies the
    /// sending node (see `docs/protocol.md`).
    ///
    /// # Panics
    ///
    /// If `body` is not exactly `fields.entry_count` entries long: the sender must never build
    /// a message that [`decode_commit_entries`] rejects.
    pub fn commit(cluster: u64, replica: u8, fields: Commit, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, replica, Fields::Commit(fields), body)
    }

    /// Builds a sealed start-view-change header (empty body): `replica` votes to move `group` to
    /// `view`.
    pub fn start_view_change(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: StartViewChange,
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::StartViewChange(fields), &[])
    }

    /// Builds a sealed do-view-change header for `body`, the output of [`encode_view_headers`]
    /// with flags.
    ///
    /// # Panics
    ///
    /// If `body` is not exactly `fields.header_count` headers and flag bytes long.
    pub fn do_view_change(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: DoViewChange,
        body: &[u8],
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::DoViewChange(fields), body)
    }

    /// Builds a sealed start-view header for `body`, the output of [`encode_view_headers`]
    /// without flags.
    ///
    /// # Panics
    ///
    /// If `body` is not exactly `fields.header_count` headers long.
    pub fn start_view(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: StartView,
        body: &[u8],
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::StartView(fields), body)
    }

    /// Builds a sealed request-start-view header (empty body).
    pub fn request_start_view(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: RequestStartView,
    ) -> Header {
        Header::sealed(cluster, view, replica, Fields::RequestStartView(fields), &[])
    }

    /// Builds a sealed request-prepare header (empty body). [`RequestPrepare::by_checksum`] and
    /// [`RequestPrepare::committed`] build valid fields.
    ///
    /// # Panics
    ///
    /// If `fields.flags` has a bit other than [`REQUEST_PREPARE_FLAG_CHECKSUM`], or `checksum` is
    /// not zero while that flag is clear.
    pub fn request_prepare(cluster: u64, view: u32, replica: u8, fields: RequestPrepare) -> Header {
        Header::sealed(cluster, view, replica, Fields::RequestPrepare(fields), &[])
    }

    /// Builds a sealed range-evicted header (empty body).
    pub fn range_evicted(cluster: u64, view: u32, replica: u8, fields: RangeEvicted) -> Header {
        Header::sealed(cluster, view, replica, Fields::RangeEvicted(fields), &[])
    }

    /// Builds a sealed state request header (empty body).
    pub fn request_state(cluster: u64, view: u32, replica: u8, fields: RequestState) -> Header {
        Header::sealed(cluster, view, replica, Fields::RequestState(fields), &[])
    }

    /// Builds a sealed state chunk header for `chunk` (`fields.chunk_size_bytes` is set from it).
    ///
    /// # Panics
    ///
    /// If `chunk` is longer than `u32::MAX` bytes.
    pub fn state_chunk(
        cluster: u64,
        view: u32,
        replica: u8,
        mut fields: StateChunk,
        chunk: &[u8],
    ) -> Header {
        fields.chunk_size_bytes = u32::try_from(chunk.len()).expect("a chunk fits in u32");
        Header::sealed(cluster, view, replica, Fields::StateChunk(fields), chunk)
    }

    /// Builds a sealed replica bus handshake header (empty body) from node `node` of cluster
    /// `cluster`; `view` is 0.
    pub fn handshake(cluster: u64, node: u8, fields: Handshake) -> Header {
        Header::sealed(cluster, 0, node, Fields::Handshake(fields), &[])
    }

    /// Builds a sealed handshake refusal header from node `node` of cluster `cluster` (the
    /// refuser's own identity) carrying `reason`, UTF-8 text naming the mismatched values; `view`
    /// is 0.
    ///
    /// # Panics
    ///
    /// If `reason` is longer than [`HANDSHAKE_REASON_BYTES_MAX`] bytes.
    pub fn handshake_refused(
        cluster: u64,
        node: u8,
        fields: HandshakeRefused,
        reason: &[u8],
    ) -> Header {
        Header::sealed(cluster, 0, node, Fields::HandshakeRefused(fields), reason)
    }

    /// Builds a sealed client request header for `body`.
    ///
    /// # Panics
    ///
    /// As [`Header::prepare`], on a body longer than the size field can hold.
    pub fn request(cluster: u64, fields: ClientRequest, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, 0, Fields::Request(fields), body)
    }

    /// Builds a sealed reply header for `body`.
    ///
    /// # Panics
    ///
    /// As [`Header::prepare`], on a body longer than the size field can hold.
    pub fn reply(cluster: u64, fields: ClientReply, body: &[u8]) -> Header {
        Header::sealed(cluster, 0, 0, Fields::Reply(fields), body)
    }

    /// Builds a sealed reply header for a body sent as `parts`, one after the other, without
    /// gathering them into one buffer: the checksum runs over each part in turn (a fetch reply
    /// goes out as its prefix and the stored batches, written straight from where they lie).
    ///
    /// # Panics
    ///
    /// As [`Header::reply`].
    pub fn reply_parts<P: AsRef<[u8]>>(cluster: u64, fields: ClientReply, parts: &[P]) -> Header {
        let (len, checksum) = parts.iter().fold((0usize, 0u32), |(len, crc), part| {
            (len + part.as_ref().len(), checksum::crc32c_append(crc, part.as_ref()))
        });
        Header::sealed_sized(cluster, 0, 0, Fields::Reply(fields), len, checksum)
    }

    /// Recomputes `checksum_header` from every other field. Call it after changing any field;
    /// [`Header::encode`] deliberately does not, so that re-encoding a decoded header reproduces
    /// its bytes exactly (replicas and the hash chain depend on that).
    pub fn seal(&mut self) {
        self.checksum_header = checksum_header(&self.encode());
    }

    /// Serializes the header as it is, `checksum_header` and `version` included. A header that was
    /// not sealed after its last change encodes to bytes that [`Header::decode`] rejects.
    pub fn encode(&self) -> [u8; HEADER_SIZE] {
        let mut bytes = [0u8; HEADER_SIZE];
        put_u32(&mut bytes, OFF_CHECKSUM_HEADER, self.checksum_header);
        put_u32(&mut bytes, OFF_CHECKSUM_BODY, self.checksum_body);
        put_u64(&mut bytes, OFF_CLUSTER, self.cluster);
        put_u32(&mut bytes, OFF_SIZE, self.size);
        put_u32(&mut bytes, OFF_VIEW, self.view);
        // The fields decide the layout of bytes 32..256, so they decide the command byte too;
        // writing `self.command` could label a prepare layout as something else.
        debug_assert_eq!(self.command, self.fields.command());
        bytes[OFF_COMMAND] = self.fields.command() as u8;
        bytes[OFF_VERSION] = self.version;
        bytes[OFF_REPLICA] = self.replica;
        encode_fields(&mut bytes, &self.fields);
        bytes
    }

    /// Parses and validates a header. Checks run in this order, and the first failure is returned:
    /// `checksum_header` (nothing else is trusted before it passes), version, command, reserved
    /// bytes zero, `size >= HEADER_SIZE`, the command's own field rules (a request-prepare's
    /// flags), `size` matching the body the fields require (empty, or their count of
    /// fixed-size records; see [`Fields::body_size_required`]), and `size` within the body the
    /// command allows (see [`Fields::body_size_max`]). The body itself is not checked; see
    /// [`Header::verify_body`].
    pub fn decode(bytes: &[u8; HEADER_SIZE]) -> Result<Header, HeaderError> {
        let stored = get_u32(bytes, OFF_CHECKSUM_HEADER);
        let computed = checksum_header(bytes);
        if stored != computed {
            return Err(HeaderError::BadChecksum { stored, computed });
        }

        let version = bytes[OFF_VERSION];
        if !(VERSION_MIN_READ..=VERSION).contains(&version) {
            return Err(HeaderError::UnsupportedVersion(version));
        }

        let command_byte = bytes[OFF_COMMAND];
        let command =
            Command::from_u8(command_byte).ok_or(HeaderError::UnknownCommand(command_byte))?;

        if command == Command::Reserved {
            // `from_u8` never yields `Reserved`; treat it as unknown rather than trusting that.
            return Err(HeaderError::UnknownCommand(command_byte));
        }
        let reserved_command = reserved_ranges(command);
        for &(offset, len) in RESERVED_COMMON.iter().chain(reserved_command) {
            if let Some(nonzero) = bytes[offset..offset + len].iter().position(|&b| b != 0) {
                return Err(HeaderError::ReservedNonZero { offset: offset + nonzero });
            }
        }

        let size = get_u32(bytes, OFF_SIZE);
        if (size as usize) < HEADER_SIZE {
            return Err(HeaderError::SizeTooSmall(size));
        }

        let fields = match decode_fields(bytes, command) {
            Some(fields) => fields,
            None => return Err(HeaderError::UnknownCommand(command_byte)),
        };
        if let Fields::Handshake(handshake) = &fields
            && handshake.flags & !HANDSHAKE_FLAGS_KNOWN != 0
        {
            return Err(HeaderError::UnknownFlags {
                offset: OFF_HANDSHAKE_FLAGS,
                flags: u32::from(handshake.flags),
            });
        }
        if let Fields::DoViewChange(dvc) = &fields
            && dvc.flags & !DO_VIEW_CHANGE_FLAGS_KNOWN != 0
        {
            return Err(HeaderError::UnknownFlags {
                offset: OFF_DO_VIEW_CHANGE_FLAGS,
                flags: dvc.flags,
            });
        }
        if let Fields::DoViewChange(dvc) = &fields
            && dvc.flags & DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN == 0
            && dvc.log_view_head_op != 0
        {
            // Without its flag the field is unused, so it is held to zero like reserved bytes.
            return Err(HeaderError::ReservedNonZero {
                offset: OFF_DO_VIEW_CHANGE_LOG_VIEW_HEAD_OP,
            });
        }
        if let Fields::RequestPrepare(request) = &fields {
            let unknown = request.flags & !REQUEST_PREPARE_FLAGS_KNOWN;
            if unknown != 0 {
                return Err(HeaderError::UnknownFlags {
                    offset: OFF_REQUEST_PREPARE_FLAGS,
                    flags: request.flags,
                });
            }
            if request.checksum_given().is_none() && request.checksum != 0 {
                // Without the flag the checksum field is unused, and unused bytes must be zero.
                let nonzero = request.checksum.to_le_bytes().iter().position(|&b| b != 0);
                let offset = OFF_REQUEST_PREPARE_CHECKSUM + nonzero.unwrap_or(0);
                return Err(HeaderError::ReservedNonZero { offset });
            }
        }
        if let Some(body_size) = fields.body_size_required() {
            let expected = HEADER_SIZE as u64 + body_size;
            if u64::from(size) != expected {
                return Err(HeaderError::SizeInconsistent { size, expected });
            }
        }
        if let Some(body_size_max) = fields.body_size_max() {
            let max = HEADER_SIZE as u64 + body_size_max;
            if u64::from(size) > max {
                return Err(HeaderError::SizeOverLimit { size, max });
            }
        }

        Ok(Header {
            checksum_header: stored,
            checksum_body: get_u32(bytes, OFF_CHECKSUM_BODY),
            cluster: get_u64(bytes, OFF_CLUSTER),
            size,
            view: get_u32(bytes, OFF_VIEW),
            command,
            version,
            replica: bytes[OFF_REPLICA],
            fields,
        })
    }

    /// Like [`Header::decode`], for the first [`HEADER_SIZE`] bytes of a longer buffer (a socket
    /// read or a file region). Bytes after the header are ignored.
    pub fn decode_prefix(bytes: &[u8]) -> Result<Header, HeaderError> {
        match bytes.first_chunk::<HEADER_SIZE>() {
            Some(header) => Header::decode(header),
            None => Err(HeaderError::TooShort { len: bytes.len() }),
        }
    }

    /// Length of the body that follows this header, in bytes. It is not capped here: compare it
    /// with your own message limit before allocating or reading that many bytes.
    pub fn body_size(&self) -> usize {
        // Saturating so a hand-built header with a bogus size cannot panic; decoded headers
        // always have `size >= HEADER_SIZE`.
        (self.size as usize).saturating_sub(HEADER_SIZE)
    }

    /// Checks that `body` is exactly [`Header::body_size`] bytes and matches `checksum_body`.
    pub fn verify_body(&self, body: &[u8]) -> Result<(), HeaderError> {
        let expected = self.body_size();
        if body.len() != expected {
            return Err(HeaderError::BodySizeMismatch { expected, actual: body.len() });
        }
        let computed = checksum::crc32c(body);
        if computed != self.checksum_body {
            return Err(HeaderError::BadBodyChecksum { stored: self.checksum_body, computed });
        }
        Ok(())
    }

    /// The prepare fields, if this is a [`Command::Prepare`] header.
    pub fn as_prepare(&self) -> Option<&Prepare> {
        match &self.fields {
            Fields::Prepare(prepare) => Some(prepare),
            _ => None,
        }
    }

    /// The journal entry fields, if this is a journal entry header.
    pub fn as_journal_entry(&self) -> Option<&JournalEntry> {
        match &self.fields {
            Fields::JournalEntry(entry) => Some(entry),
            _ => None,
        }
    }

    /// The prepare-ok fields, if this is a [`Command::PrepareOk`] header.
    pub fn as_prepare_ok(&self) -> Option<&PrepareOk> {
        match &self.fields {
            Fields::PrepareOk(prepare_ok) => Some(prepare_ok),
            _ => None,
        }
    }

    /// The commit fields, if this is a [`Command::Commit`] header.
    pub fn as_commit(&self) -> Option<&Commit> {
        match &self.fields {
            Fields::Commit(commit) => Some(commit),
            _ => None,
        }
    }

    /// The start-view-change fields, if this is a [`Command::StartViewChange`] header.
    pub fn as_start_view_change(&self) -> Option<&StartViewChange> {
        match &self.fields {
            Fields::StartViewChange(start_view_change) => Some(start_view_change),
            _ => None,
        }
    }

    /// The do-view-change fields, if this is a [`Command::DoViewChange`] header.
    pub fn as_do_view_change(&self) -> Option<&DoViewChange> {
        match &self.fields {
            Fields::DoViewChange(do_view_change) => Some(do_view_change),
            _ => None,
        }
    }

    /// The start-view fields, if this is a [`Command::StartView`] header.
    pub fn as_start_view(&self) -> Option<&StartView> {
        match &self.fields {
            Fields::StartView(start_view) => Some(start_view),
            _ => None,
        }
    }

    /// The request-start-view fields, if this is a [`Command::RequestStartView`] header.
    pub fn as_request_start_view(&self) -> Option<&RequestStartView> {
        match &self.fields {
            Fields::RequestStartView(request) => Some(request),
            _ => None,
        }
    }

    /// The request-prepare fields, if this is a [`Command::RequestPrepare`] header.
    pub fn as_request_prepare(&self) -> Option<&RequestPrepare> {
        match &self.fields {
            Fields::RequestPrepare(request) => Some(request),
            _ => None,
        }
    }

    /// The range-evicted fields, if this is a [`Command::RangeEvicted`] header.
    pub fn as_range_evicted(&self) -> Option<&RangeEvicted> {
        match &self.fields {
            Fields::RangeEvicted(evicted) => Some(evicted),
            _ => None,
        }
    }

    /// The state request fields, if this is a [`Command::RequestState`] header.
    pub fn as_request_state(&self) -> Option<&RequestState> {
        match &self.fields {
            Fields::RequestState(request) => Some(request),
            _ => None,
        }
    }

    /// The state chunk fields, if this is a [`Command::StateChunk`] header.
    pub fn as_state_chunk(&self) -> Option<&StateChunk> {
        match &self.fields {
            Fields::StateChunk(chunk) => Some(chunk),
            _ => None,
        }
    }

    /// The handshake fields, if this is a [`Command::Handshake`] header.
    pub fn as_handshake(&self) -> Option<&Handshake> {
        match &self.fields {
            Fields::Handshake(handshake) => Some(handshake),
            _ => None,
        }
    }

    /// The handshake refusal fields, if this is a [`Command::HandshakeRefused`] header.
    pub fn as_handshake_refused(&self) -> Option<&HandshakeRefused> {
        match &self.fields {
            Fields::HandshakeRefused(refused) => Some(refused),
            _ => None,
        }
    }

    /// The client request fields, if this is a request.
    pub fn as_request(&self) -> Option<&ClientRequest> {
        match &self.fields {
            Fields::Request(request) => Some(request),
            _ => None,
        }
    }

    /// The reply fields, if this is a reply.
    pub fn as_reply(&self) -> Option<&ClientReply> {
        match &self.fields {
            Fields::Reply(reply) => Some(reply),
            _ => None,
        }
    }

    /// Builds a sealed header of any command for `body`, checking first (in every build) that the
    /// fields are ones [`Header::decode`] accepts with this body length: a sender must never
    /// put on the wire what its peer will reject.
    fn sealed(cluster: u64, view: u32, replica: u8, fields: Fields, body: &[u8]) -> Header {
        Header::sealed_checksummed(cluster, view, replica, fields, body, checksum::crc32c(body))
    }

    /// [`Header::sealed`] with the body's CRC-32C already known (derived from checksums verified
    /// on receipt, see [`crate::checksum`]); debug builds recompute it.
    fn sealed_checksummed(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: Fields,
        body: &[u8],
        checksum_body: u32,
    ) -> Header {
        debug_assert_eq!(checksum::crc32c(body), checksum_body, "a derived body checksum is wrong");
        Header::sealed_sized(cluster, view, replica, fields, body.len(), checksum_body)
    }

    /// [`Header::sealed_checksummed`] for a body known by its length and checksum only.
    fn sealed_sized(
        cluster: u64,
        view: u32,
        replica: u8,
        fields: Fields,
        body_len: usize,
        checksum_body: u32,
    ) -> Header {
        let size = body_len
            .checked_add(HEADER_SIZE)
            .and_then(|size| u32::try_from(size).ok())
            .expect("message body exceeds the u32 size field");
        if let Some(required) = fields.body_size_required() {
            assert_eq!(
                body_len as u64,
                required,
                "{:?} body length disagrees with its count field",
                fields.command()
            );
        }
        if let Some(max) = fields.body_size_max() {
            assert!(
                body_len as u64 <= max,
                "{:?} body of {} bytes exceeds its limit of {max}",
                fields.command(),
                body_len
            );
        }
        if let Fields::DoViewChange(dvc) = &fields {
            assert_eq!(dvc.flags & !DO_VIEW_CHANGE_FLAGS_KNOWN, 0, "unknown flags");
            assert!(
                dvc.flags & DO_VIEW_CHANGE_FLAG_LOG_VIEW_HEAD_KNOWN != 0
                    || dvc.log_view_head_op == 0,
                "a log view head without its flag"
            );
        }
        if let Fields::RequestPrepare(request) = &fields {
            assert_eq!(request.flags & !REQUEST_PREPARE_FLAGS_KNOWN, 0, "unknown flags");
            assert!(
                request.checksum_given().is_some() || request.checksum == 0,
                "checksum without REQUEST_PREPARE_FLAG_CHECKSUM"
            );
        }
        let mut header = Header {
            checksum_header: 0,
            checksum_body,
            cluster,
            size,
            view,
            command: fields.command(),
            version: VERSION,
            replica,
            fields,
        };
        header.seal();
        header
    }
}

/// The `checksum_header` that encoded header `bytes` should carry: CRC-32C over bytes 4..256.
/// Useful when only raw bytes are at hand, e.g. to check a parent link without a full decode.
pub fn checksum_header(bytes: &[u8; HEADER_SIZE]) -> u32 {
    checksum::crc32c(&bytes[OFF_CHECKSUM_BODY..])
}

/// True if every byte is zero (and for an empty slice).
///
/// Recovery treats an all-zero header region as the end of written data (space preallocated but
/// never written), which is a normal stop, whereas a header failing [`Header::decode`] means a torn
/// or corrupt write, which is not. An all-zero header never decodes, since its checksum field
/// (0) differs from the CRC of 252 zero bytes.
pub fn is_zeroed(bytes: &[u8]) -> bool {
    bytes.iter().all(|&b| b == 0)
}
