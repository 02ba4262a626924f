//! The client table of a replicated state machine (VR Revisited §4, "the client table"): per
//! registered session, the number of its newest executed request and that request's reply, so a
//! request retried after a lost reply, a timeout or a view change is answered with its original
//! reply instead of being executed twice. The metadata group uses it for admin requests
//! (DESIGN.md §4, "Sessions and exactly-once produce").
//!
//! It owns the table, its rules, its bounds and its snapshot bytes. It never decides what enters
//! the log and never executes anything: the state machine that embeds it checks a request before
//! proposing it (to answer a duplicate at once) and again when the request's op commits (the
//! authoritative check, since the log may hold a retry twice, for instance once in each of two
//! views), and records the reply it produced. It never does I/O and reads no clock: recency is
//! the op of a session's newest registration or executed request, which every replica sees
//! identically, so every replica's table is the same function of the committed log.
//!
//! Rules: a session exists once registered ([`ClientTable::register`], the session id being the
//! registering op, so ids are never reused). A request numbered above the session's newest is
//! new; equal to it, a duplicate answered with the stored reply; below it, stale (the client has
//! moved on, and that request's reply is no longer kept); from a session the table does not hold
//! (never registered, or evicted), refused: the client must register again.
//!
//! Bounds: at most `sessions_max` sessions; registering one more evicts the least recently used
//! (the lowest op of last use; op ties cannot occur). A reply is at most `reply_bytes_max`
//! bytes; the embedding state machine keeps its replies within it.

use std::collections::{BTreeMap, BTreeSet};

use shoal_proto::protocol::Reader;

/// Snapshot format version.
const SNAPSHOT_VERSION: u16 = 1;
/// One session in a snapshot before its reply: session, request, last_op, reply length.
const SNAPSHOT_SESSION_SIZE: usize = 8 + 8 + 8 + 4;

/// The table's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientLimits {
    /// Sessions kept at most; registering one more evicts the least recently used.
    pub sessions_max: usize,
    /// Largest reply kept per session, in bytes.
    pub reply_bytes_max: usize,
}

/// What the table says about a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientCheck<'a> {
    /// Newer than the session's newest request: execute it.
    New,
    /// The session's newest request again: answer with its reply, execute nothing.
    Duplicate(&'a [u8]),
    /// Older than the session's newest request: its reply is gone; execute nothing.
    Stale {
        /// The session's newest request.
        newest: u64,
    },
    /// The session is not in the table (never registered, or evicted): register again.
    UnknownSession,
}

/// Why [`ClientTable::apply`] refused to record a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientTableError {
    /// The session is not in the table.
    UnknownSession(u64),
    /// The request is not newer than the session's newest.
    NotNew {
        /// The session.
        session: u64,
        /// The request offered.
        request: u64,
        /// The session's newest request.
        newest: u64,
    },
    /// The reply is over `reply_bytes_max`.
    ReplyTooLarge {
        /// Its length.
        len: usize,
        /// The bound.
        max: usize,
    },
}

impl std::fmt::Display for ClientTableError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientTableError::UnknownSession(session) => write!(f, "session {session} unknown"),
            ClientTableError::NotNew { session, request, newest } => {
                write!(f, "session {session}: request {request} is not newer than {newest}")
            }
            ClientTableError::ReplyTooLarge { len, max } => {
                write!(f, "a reply of {len} bytes is over the {max}-byte bound")
            }
        }
    }
}

impl std::error::Error for ClientTableError {}

/// Why snapshot bytes were refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientSnapshotError(pub String);

impl std::fmt::Display for ClientSnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "client table snapshot: {}", self.0)
    }
}

impl std::error::Error for ClientSnapshotError {}

/// One session's entry.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    /// The newest executed request (0: none since registration).
    request: u64,
    /// Its reply.
    reply: Vec<u8>,
    /// The op of the session's registration or newest executed request.
    last_op: u64,
}

/// The committed client table of one group. See the module documentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientTable {
    limits: ClientLimits,
    sessions: BTreeMap<u64, Entry>,
    /// `(last_op, session)` of every session: the first is the least recently used.
    recency: BTreeSet<(u64, u64)>,
}

impl ClientTable {
    /// An empty table.
    pub fn new(limits: ClientLimits) -> ClientTable {
        ClientTable { limits, sessions: BTreeMap::new(), recency: BTreeSet::new() }
    }

    /// The bounds.
    pub fn limits(&self) -> ClientLimits {
        self.limits
    }

    /// Sessions held.
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Whether `session` is held.
    pub fn contains(&self, session: u64) -> bool {
        self.sessions.contains_key(&session)
    }

    /// Registers `session` at `op` (its id is normally that op). Returns the session evicted to
    /// make room, if any. Registering a session already held only marks it used.
    pub fn register(&mut self, session: u64, op: u64) -> Option<u64> {
        if let Some(entry) = self.sessions.get_mut(&session) {
            self.recency.remove(&(entry.last_op, session));
            entry.last_op = entry.last_op.max(op);
            self.recency.insert((entry.last_op, session));
            return None;
        }
        let evicted = if self.sessions.len() >= self.limits.sessions_max.max(1) {
            self.evict_least_recent()
        } else {
            None
        };
        self.sessions.insert(session, Entry { request: 0, reply: Vec::new(), last_op: op });
        self.recency.insert((op, session));
        evicted
    }

    /// The rules for request `request` of `session` (see the module documentation).
    pub fn check(&self, session: u64, request: u64) -> ClientCheck<'_> {
        let Some(entry) = self.sessions.get(&session) else {
            return ClientCheck::UnknownSession;
        };
        if request > entry.request {
            ClientCheck::New
        } else if request == entry.request && request > 0 {
            ClientCheck::Duplicate(&entry.reply)
        } else {
            ClientCheck::Stale { newest: entry.request }
        }
    }

    /// Records that request `request` of `session` executed at `op` with `reply`. The request
    /// must be new ([`ClientTable::check`]); on an error nothing changes.
    pub fn apply(
        &mut self,
        session: u64,
        request: u64,
        op: u64,
        reply: &[u8],
    ) -> Result<(), ClientTableError> {
        if reply.len() > self.limits.reply_bytes_max {
            return Err(ClientTableError::ReplyTooLarge {
                len: reply.len(),
                max: self.limits.reply_bytes_max,
            });
        }
        let Some(entry) = self.sessions.get_mut(&session) else {
            return Err(ClientTableError::UnknownSession(session));
        };
        if request <= entry.request {
            return Err(ClientTableError::NotNew { session, request, newest: entry.request });
        }
        self.recency.remove(&(entry.last_op, session));
        entry.request = request;
        entry.reply.clear();
        entry.reply.extend_from_slice(reply);
        entry.last_op = entry.last_op.max(op);
        self.recency.insert((entry.last_op, session));
        Ok(())
    }

    /// The snapshot bytes (little-endian): `version u16`, `count u32`, then per session in
    /// ascending id order `session u64`, `request u64`, `last_op u64`, `reply_len u32`, `reply`.
    pub fn encode(&self) -> Vec<u8> {
        let replies: usize = self.sessions.values().map(|e| e.reply.len()).sum();
        let mut out =
            Vec::with_capacity(2 + 4 + self.sessions.len() * SNAPSHOT_SESSION_SIZE + replies);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.sessions.len() as u32).to_le_bytes());
        for (session, entry) in &self.sessions {
            out.extend_from_slice(&session.to_le_bytes());
            out.extend_from_slice(&entry.request.to_le_bytes());
            out.extend_from_slice(&entry.last_op.to_le_bytes());
            out.extend_from_slice(&(entry.reply.len() as u32).to_le_bytes());
            out.extend_from_slice(&entry.reply);
        }
        out
    }

    /// A table from snapshot bytes. Hostile-input safe: the count is bounded by the bytes
    /// present and every reply by `reply_bytes_max` before anything is allocated; session ids
    /// must ascend and last-use ops be distinct; nothing may trail. A snapshot holding more
    /// sessions than `limits` allows (the bound was lowered) is cut down by the eviction rule.
    pub fn decode(bytes: &[u8], limits: ClientLimits) -> Result<ClientTable, ClientSnapshotError> {
        let error = |e: shoal_proto::protocol::ProtocolError| ClientSnapshotError(e.to_string());
        let mut r = Reader::new(bytes);
        let version = r.u16("version").map_err(error)?;
        if version != SNAPSHOT_VERSION {
            return Err(ClientSnapshotError(format!(
                "version {version}, this build reads {SNAPSHOT_VERSION}"
            )));
        }
        let count = r.count("sessions", SNAPSHOT_SESSION_SIZE).map_err(error)?;
        let mut table = ClientTable::new(limits);
        let mut previous: Option<u64> = None;
        for _ in 0..count {
            let session = r.u64("session").map_err(error)?;
            if previous.is_some_and(|p| p >= session) {
                return Err(ClientSnapshotError("session ids not ascending".into()));
            }
            previous = Some(session);
            let request = r.u64("request").map_err(error)?;
            let last_op = r.u64("last_op").map_err(error)?;
            let reply = r.bytes("reply", limits.reply_bytes_max).map_err(error)?.to_vec();
            if !table.recency.insert((last_op, session)) {
                return Err(ClientSnapshotError("last-use ops not distinct".into()));
            }
            table.sessions.insert(session, Entry { request, reply, last_op });
        }
        r.end().map_err(error)?;
        while table.sessions.len() > limits.sessions_max.max(1) {
            table.evict_least_recent();
        }
        Ok(table)
    }

    fn evict_least_recent(&mut self) -> Option<u64> {
        let (_, session) = self.recency.pop_first()?;
        self.sessions.remove(&session);
        Some(session)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: ClientLimits = ClientLimits { sessions_max: 3, reply_bytes_max: 8 };

    #[test]
    fn client_table_answers_new_duplicate_stale_and_unknown() {
        let mut table = ClientTable::new(LIMITS);
        assert_eq!(table.check(5, 1), ClientCheck::UnknownSession);
        assert_eq!(table.register(5, 5), None);
        // Nothing executed yet: request 0 is no request, anything above is new.
        assert_eq!(table.check(5, 0), ClientCheck::Stale { newest: 0 });
        assert_eq!(table.check(5, 1), ClientCheck::New);
        table.apply(5, 3, 6, b"three").unwrap();
        assert_eq!(table.check(5, 3), ClientCheck::Duplicate(b"three"));
        assert_eq!(table.check(5, 2), ClientCheck::Stale { newest: 3 });
        assert_eq!(table.check(5, 4), ClientCheck::New);
        // Request numbers need not be dense (other requests share the numbering).
        table.apply(5, 10, 7, b"").unwrap();
        assert_eq!(table.check(5, 10), ClientCheck::Duplicate(b""));
        assert_eq!(
            table.apply(5, 10, 8, b"again"),
            Err(ClientTableError::NotNew { session: 5, request: 10, newest: 10 })
        );
        assert_eq!(table.apply(9, 1, 8, b""), Err(ClientTableError::UnknownSession(9)));
        assert_eq!(table.check(5, 10), ClientCheck::Duplicate(b""), "a refusal changes nothing");
    }

    #[test]
    fn client_table_reply_bound_is_exact() {
        let mut table = ClientTable::new(LIMITS);
        table.register(1, 1);
        assert_eq!(
            table.apply(1, 1, 2, &[7; 9]),
            Err(ClientTableError::ReplyTooLarge { len: 9, max: 8 })
        );
        assert_eq!(table.check(1, 1), ClientCheck::New, "a refused reply records nothing");
        table.apply(1, 1, 2, &[7; 8]).unwrap();
        assert_eq!(table.check(1, 1), ClientCheck::Duplicate(&[7; 8]));
    }

    #[test]
    fn client_table_evicts_the_least_recently_used_session_at_the_bound() {
        let mut table = ClientTable::new(LIMITS);
        assert_eq!(table.register(1, 1), None);
        assert_eq!(table.register(2, 2), None);
        assert_eq!(table.register(3, 3), None);
        assert_eq!(table.len(), 3);
        // Session 1 executes a request: session 2 is now the least recently used.
        table.apply(1, 1, 4, b"a").unwrap();
        assert_eq!(table.register(5, 5), Some(2));
        assert_eq!(table.len(), 3, "the bound holds");
        assert_eq!(table.check(2, 1), ClientCheck::UnknownSession);
        assert_eq!(table.check(1, 1), ClientCheck::Duplicate(b"a"));
        // Re-registering a held session only touches it.
        assert_eq!(table.register(3, 6), None);
        assert_eq!(table.register(7, 7), Some(1));
        assert!(table.contains(3) && table.contains(5) && table.contains(7));
    }

    #[test]
    fn client_table_snapshot_round_trips() {
        let mut table = ClientTable::new(LIMITS);
        table.register(1, 1);
        table.register(4, 4);
        table.apply(4, 9, 5, b"reply").unwrap();
        let bytes = table.encode();
        assert_eq!(ClientTable::decode(&bytes, LIMITS), Ok(table.clone()));
        let empty = ClientTable::new(LIMITS);
        assert_eq!(ClientTable::decode(&empty.encode(), LIMITS), Ok(empty));
    }

    #[test]
    fn client_table_snapshot_refuses_damage_without_allocating() {
        let mut table = ClientTable::new(LIMITS);
        table.register(1, 1);
        table.register(2, 2);
        table.apply(2, 3, 3, b"xy").unwrap();
        let bytes = table.encode();
        // Every truncation is refused.
        for len in 0..bytes.len() {
            assert!(ClientTable::decode(&bytes[..len], LIMITS).is_err(), "cut at {len}");
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(ClientTable::decode(&trailing, LIMITS).is_err());
        let mut version = bytes.clone();
        version[0] = 9;
        assert!(ClientTable::decode(&version, LIMITS).is_err());
        // A hostile count is bounded by the bytes present.
        let mut count = bytes.clone();
        count[2..6].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(ClientTable::decode(&count, LIMITS).is_err());
        // A reply length over the bound is refused before it is read.
        let reply_len_at = 6 + SNAPSHOT_SESSION_SIZE + 24;
        let mut long = bytes.clone();
        long[reply_len_at..reply_len_at + 4].copy_from_slice(&9u32.to_le_bytes());
        let error = ClientTable::decode(&long, LIMITS).unwrap_err();
        assert!(error.0.contains("more than 8"), "{error}");
        // Session ids must ascend.
        let mut order = bytes.clone();
        order[6 + SNAPSHOT_SESSION_SIZE..6 + SNAPSHOT_SESSION_SIZE + 8]
            .copy_from_slice(&1u64.to_le_bytes());
        assert!(ClientTable::decode(&order, LIMITS).is_err());
    }

    #[test]
    fn client_table_snapshot_under_a_lower_bound_keeps_the_most_recent() {
        let mut table = ClientTable::new(LIMITS);
        for session in 1..=3 {
            table.register(session, session);
        }
        table.apply(1, 1, 4, b"").unwrap();
        let smaller = ClientLimits { sessions_max: 2, ..LIMITS };
        let decoded = ClientTable::decode(&table.encode(), smaller).unwrap();
        assert_eq!(decoded.len(), 2);
        assert!(decoded.contains(1) && decoded.contains(3), "session 2 was the least recent");
    }

    /// A tiny replicated state machine over the table: a counter that admin-like requests add
    /// to. The log may hold one request twice — a client retried it after a view change while
    /// the original was still uncommitted, and both entered the log (VR Revisited §4: the new
    /// primary cannot know) — or a stale retry behind a newer request.
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct Counter {
        total: u64,
        clients: ClientTable,
    }

    enum Op {
        Register,
        Add { session: u64, request: u64, amount: u64 },
    }

    impl Counter {
        fn new() -> Counter {
            Counter { total: 0, clients: ClientTable::new(LIMITS) }
        }

        /// Applies a committed op and returns its reply as the client would see it.
        fn apply(&mut self, op: u64, entry: &Op) -> Result<Vec<u8>, String> {
            match *entry {
                Op::Register => {
                    self.clients.register(op, op);
                    Ok(op.to_le_bytes().to_vec())
                }
                Op::Add { session, request, amount } => {
                    match self.clients.check(session, request) {
                        ClientCheck::New => {
                            self.total += amount;
                            let reply = self.total.to_le_bytes();
                            self.clients
                                .apply(session, request, op, &reply)
                                .map_err(|e| e.to_string())?;
                            Ok(reply.to_vec())
                        }
                        ClientCheck::Duplicate(reply) => Ok(reply.to_vec()),
                        ClientCheck::Stale { newest } => Err(format!("stale behind {newest}")),
                        ClientCheck::UnknownSession => Err("register again".into()),
                    }
                }
            }
        }
    }

    #[test]
    fn client_table_applies_a_retried_request_once_from_any_replay_point() {
        // Session 1 registers at op 1; request 2 adds 10 and enters the log at op 2 (view 1)
        // and again at op 3 (retried to the primary of view 2); request 3 adds 5 at op 4; a
        // late copy of request 2 lands at op 5, behind request 3.
        let log = [
            Op::Register,
            Op::Add { session: 1, request: 2, amount: 10 },
            Op::Add { session: 1, request: 2, amount: 10 },
            Op::Add { session: 1, request: 3, amount: 5 },
            Op::Add { session: 1, request: 2, amount: 10 },
        ];
        let mut full = Counter::new();
        let replies: Vec<_> =
            log.iter().enumerate().map(|(i, op)| full.apply(i as u64 + 1, op)).collect();
        assert_eq!(full.total, 15, "request 2 added once");
        assert_eq!(replies[1], replies[2], "the retry got the original reply");
        assert_eq!(replies[2], Ok(10u64.to_le_bytes().to_vec()));
        assert_eq!(replies[4], Err("stale behind 3".into()));
        // A replica that restores a snapshot taken after any op and replays the rest ends in
        // the same state and gives the same replies (the table travels in the snapshot).
        for cut in 0..=log.len() {
            let mut head = Counter::new();
            for (i, op) in log[..cut].iter().enumerate() {
                head.apply(i as u64 + 1, op).unwrap_or_default();
            }
            let clients = ClientTable::decode(&head.clients.encode(), LIMITS).unwrap();
            let mut restored = Counter { total: head.total, clients };
            for (i, op) in log.iter().enumerate().skip(cut) {
                assert_eq!(restored.apply(i as u64 + 1, op), replies[i], "cut {cut} op {i}");
            }
            assert_eq!(restored, full, "cut {cut}");
        }
    }
}
