//! The native protocol's consumer bodies: stored offsets, consumer groups and polling from a
//! stored offset, plus the control record an offset commit becomes in its partition's log.
//!
//! Like the rest of `protocol`, it only encodes and decodes: every length is bounded before use
//! and nothing here decides whether a request is allowed.

use bytes::Bytes;

use super::{NAME_LEN_MAX, Reader, Result, Writer, invalid};
use crate::batch::{self, BatchBuilder};

/// Who owns a stored offset: a standalone consumer, or a consumer group (whose members commit
/// for it under the group's current generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ConsumerKind {
    /// A consumer identified by its own name.
    Consumer = 0,
    /// A consumer group.
    Group = 1,
}

/// A stored offset's owner.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerId {
    /// Standalone or group.
    pub kind: ConsumerKind,
    /// The consumer's or the group's name (the stream/topic name rule).
    pub name: String,
}

impl ConsumerId {
    /// A standalone consumer.
    pub fn consumer(name: impl Into<String>) -> ConsumerId {
        ConsumerId { kind: ConsumerKind::Consumer, name: name.into() }
    }

    /// A consumer group.
    pub fn group(name: impl Into<String>) -> ConsumerId {
        ConsumerId { kind: ConsumerKind::Group, name: name.into() }
    }

    /// Writes the kind byte and the name.
    pub fn write(&self, w: &mut Writer) {
        w.u8(self.kind as u8).str(&self.name);
    }

    /// Reads what [`ConsumerId::write`] wrote.
    pub fn read(r: &mut Reader<'_>) -> Result<ConsumerId> {
        let kind = match r.u8("consumer_kind")? {
            0 => ConsumerKind::Consumer,
            1 => ConsumerKind::Group,
            other => return Err(invalid("consumer_kind", format!("{other}: use 0 or 1"))),
        };
        Ok(ConsumerId { kind, name: r.name("consumer")? })
    }
}

/// The partition a request is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PartitionRef {
    /// The stream.
    pub stream: String,
    /// The topic.
    pub topic: String,
    /// The partition.
    pub partition: u32,
}

impl PartitionRef {
    fn write(&self, w: &mut Writer) {
        w.str(&self.stream).str(&self.topic).u32(self.partition);
    }

    fn read(r: &mut Reader<'_>) -> Result<PartitionRef> {
        Ok(PartitionRef {
            stream: r.name("stream")?,
            topic: r.name("topic")?,
            partition: r.u32("partition")?,
        })
    }
}

/// A group member's credentials for a group's offsets: the member id `JoinGroup` gave it and the
/// generation of the assignment it acts under. Standalone consumers send an empty member and 0.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Membership {
    /// The member id.
    pub member: String,
    /// The assignment's generation.
    pub generation: u64,
}

impl Membership {
    fn write(&self, w: &mut Writer) {
        w.str(&self.member).u64(self.generation);
    }

    fn read(r: &mut Reader<'_>) -> Result<Membership> {
        Ok(Membership { member: r.str("member", NAME_LEN_MAX)?, generation: r.u64("generation")? })
    }
}

/// `StoreOffset`: the offset of the next message `consumer` will process in a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreOffset {
    /// The partition.
    pub partition: PartitionRef,
    /// Whose offset.
    pub consumer: ConsumerId,
    /// Group members: who commits, under which generation.
    pub membership: Membership,
    /// The offset (of the next message to process, as in Kafka).
    pub offset: u64,
}

impl StoreOffset {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.partition.write(&mut w);
        self.consumer.write(&mut w);
        self.membership.write(&mut w);
        w.u64(self.offset).finish()
    }

    /// Decodes the body.
    pub fn decode(body: &[u8]) -> Result<StoreOffset> {
        let mut r = Reader::new(body);
        let store = StoreOffset {
            partition: PartitionRef::read(&mut r)?,
            consumer: ConsumerId::read(&mut r)?,
            membership: Membership::read(&mut r)?,
            offset: r.u64("offset")?,
        };
        r.end()?;
        Ok(store)
    }
}

/// `GetOffset` and `DeleteOffset`: a consumer's stored offset in a partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetKey {
    /// The partition.
    pub partition: PartitionRef,
    /// Whose offset.
    pub consumer: ConsumerId,
}

impl OffsetKey {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.partition.write(&mut w);
        self.consumer.write(&mut w);
        w.finish()
    }

    /// Decodes the body.
    pub fn decode(body: &[u8]) -> Result<OffsetKey> {
        let mut r = Reader::new(body);
        let key = OffsetKey {
            partition: PartitionRef::read(&mut r)?,
            consumer: ConsumerId::read(&mut r)?,
        };
        r.end()?;
        Ok(key)
    }
}

/// `GetOffset` result: the stored offset, if any.
pub fn encode_stored_offset(offset: Option<u64>) -> Vec<u8> {
    Writer::new().opt_u64(offset).finish()
}

/// Decodes a `GetOffset` result.
pub fn decode_stored_offset(body: &[u8]) -> Result<Option<u64>> {
    let mut r = Reader::new(body);
    let offset = r.opt_u64("offset")?;
    r.end()?;
    Ok(offset)
}

/// A consumer group of a topic.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupRef {
    /// The stream.
    pub stream: String,
    /// The topic the group consumes.
    pub topic: String,
    /// The group's name.
    pub group: String,
}

impl GroupRef {
    fn write(&self, w: &mut Writer) {
        w.str(&self.stream).str(&self.topic).str(&self.group);
    }

    fn read(r: &mut Reader<'_>) -> Result<GroupRef> {
        Ok(GroupRef { stream: r.name("stream")?, topic: r.name("topic")?, group: r.name("group")? })
    }
}

/// `JoinGroup`: join (or rejoin) a topic's consumer group; answered once an assignment that
/// includes the member is in force.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JoinGroup {
    /// The group.
    pub group: GroupRef,
    /// Empty to join as a new member; a member id to rejoin as that member.
    pub member: String,
    /// The member is declared dead after this long without a heartbeat.
    pub session_timeout_ms: u32,
}

impl JoinGroup {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.group.write(&mut w);
        w.str(&self.member).u32(self.session_timeout_ms).finish()
    }

    /// Decodes the body.
    pub fn decode(body: &[u8]) -> Result<JoinGroup> {
        let mut r = Reader::new(body);
        let join = JoinGroup {
            group: GroupRef::read(&mut r)?,
            member: r.str("member", NAME_LEN_MAX)?,
            session_timeout_ms: r.u32("session_timeout_ms")?,
        };
        r.end()?;
        Ok(join)
    }
}

/// `Heartbeat` and `LeaveGroup`: a member of a group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMember {
    /// The group.
    pub group: GroupRef,
    /// The member id.
    pub member: String,
}

impl GroupMember {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.group.write(&mut w);
        w.str(&self.member).finish()
    }

    /// Decodes the body.
    pub fn decode(body: &[u8]) -> Result<GroupMember> {
        let mut r = Reader::new(body);
        let member =
            GroupMember { group: GroupRef::read(&mut r)?, member: r.str("member", NAME_LEN_MAX)? };
        r.end()?;
        Ok(member)
    }
}

/// `JoinGroup` and `Heartbeat` result: the member's part of the assignment in force.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Assignment {
    /// The member id.
    pub member: String,
    /// The assignment's generation: offset commits must name it.
    pub generation: u64,
    /// The partitions this member consumes, ascending.
    pub partitions: Vec<u32>,
}

impl Assignment {
    /// Encodes the result.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.str(&self.member).u64(self.generation).u32(self.partitions.len() as u32);
        for partition in &self.partitions {
            w.u32(*partition);
        }
        w.finish()
    }

    /// Decodes the result.
    pub fn decode(body: &[u8]) -> Result<Assignment> {
        let mut r = Reader::new(body);
        let member = r.str("member", NAME_LEN_MAX)?;
        let generation = r.u64("generation")?;
        let count = r.count("partitions", 4)?;
        let partitions = (0..count).map(|_| r.u32("partitions")).collect::<Result<Vec<u32>>>()?;
        r.end()?;
        if let Some(past) = partitions.iter().find(|&&p| p >= super::TOPIC_PARTITIONS_MAX) {
            return Err(invalid("partitions", format!("partition {past} is past any topic's")));
        }
        Ok(Assignment { member, generation, partitions })
    }
}

/// `Poll`: a fetch from the consumer's stored offset (from the first message when it has
/// none), optionally committing past what it returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Poll {
    /// The partition.
    pub partition: PartitionRef,
    /// Whose stored offset.
    pub consumer: ConsumerId,
    /// Group members: who polls, under which generation.
    pub membership: Membership,
    /// As in `Fetch`.
    pub bytes_max: u32,
    /// As in `Fetch`.
    pub count_max: u32,
    /// As in `Fetch`.
    pub wait_ms_max: u32,
    /// Store the offset after the returned messages before answering.
    pub auto_commit: bool,
}

impl Poll {
    /// Encodes the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.partition.write(&mut w);
        self.consumer.write(&mut w);
        self.membership.write(&mut w);
        w.u32(self.bytes_max)
            .u32(self.count_max)
            .u32(self.wait_ms_max)
            .u8(u8::from(self.auto_commit))
            .finish()
    }

    /// Decodes the body.
    pub fn decode(body: &[u8]) -> Result<Poll> {
        let mut r = Reader::new(body);
        let poll = Poll {
            partition: PartitionRef::read(&mut r)?,
            consumer: ConsumerId::read(&mut r)?,
            membership: Membership::read(&mut r)?,
            bytes_max: r.u32("bytes_max")?,
            count_max: r.u32("count_max")?,
            wait_ms_max: r.u32("wait_ms_max")?,
            auto_commit: match r.u8("auto_commit")? {
                0 => false,
                1 => true,
                other => return Err(invalid("auto_commit", format!("{other}: use 0 or 1"))),
            },
        };
        r.end()?;
        Ok(poll)
    }
}

/// The key of every offset-commit control record: Kafka's control key layout (`version i16`,
/// `type i16`, big-endian) with a type of Shoal's own. Kafka clients skip control batches of
/// any type.
pub const OFFSET_COMMIT_CONTROL_KEY: [u8; 4] = [0, 0, 0x53, 0x43];

/// An offset commit as it is stored: one control record in the partition's own log, so the
/// offsets are replicated, ordered and recovered with the partition's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetCommitRecord {
    /// Whose offset.
    pub consumer: ConsumerId,
    /// The new offset; `None` deletes it.
    pub offset: Option<u64>,
}

impl OffsetCommitRecord {
    /// The control batch holding this commit.
    pub fn to_batch(&self, now_ms: i64) -> Bytes {
        let mut w = Writer::new();
        self.consumer.write(&mut w);
        w.opt_u64(self.offset);
        let value = w.finish();
        let mut builder = BatchBuilder::new(now_ms).control();
        builder.push(now_ms, Some(&OFFSET_COMMIT_CONTROL_KEY), Some(&value), &[]);
        builder.build()
    }

    /// The commit a stored batch holds: `None` for any batch that is not an offset commit (data,
    /// or a control batch of another kind); `Some(Err)` for one that claims to be and does not
    /// decode.
    pub fn from_batch(body: &[u8]) -> Option<Result<OffsetCommitRecord>> {
        let mut r = Reader::new(control_value(body, &OFFSET_COMMIT_CONTROL_KEY)?);
        let decoded = (|| {
            let commit = OffsetCommitRecord {
                consumer: ConsumerId::read(&mut r)?,
                offset: r.opt_u64("offset")?,
            };
            r.end()?;
            Ok(commit)
        })();
        Some(decoded)
    }
}

/// The key of every log-start control record (`DeleteRecords`): Kafka's control key layout with
/// another type of Shoal's own.
pub const LOG_START_CONTROL_KEY: [u8; 4] = [0, 0, 0x4c, 0x53];

/// A partition's new log start as it is stored: one control record in the partition's own log,
/// so every replica moves it at the same point of the log. Records below it are gone to
/// consumers; their space goes with the topic's retention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogStartRecord {
    /// The first offset consumers may read.
    pub offset: u64,
}

impl LogStartRecord {
    /// The control batch holding this log start.
    pub fn to_batch(&self, now_ms: i64) -> Bytes {
        let value = Writer::new().u64(self.offset).finish();
        let mut builder = BatchBuilder::new(now_ms).control();
        builder.push(now_ms, Some(&LOG_START_CONTROL_KEY), Some(&value), &[]);
        builder.build()
    }

    /// The log start a stored batch holds: `None` for any batch that is not one; `Some(Err)`
    /// for one that claims to be and does not decode.
    pub fn from_batch(body: &[u8]) -> Option<Result<LogStartRecord>> {
        let value = control_value(body, &LOG_START_CONTROL_KEY)?;
        let mut r = Reader::new(value);
        let decoded = (|| {
            let record = LogStartRecord { offset: r.u64("offset")? };
            r.end()?;
            Ok(record)
        })();
        Some(decoded)
    }
}

/// The value of the one record of a control batch whose key is `key`; `None` for any other
/// batch.
fn control_value<'a>(body: &'a [u8], key: &[u8; 4]) -> Option<&'a [u8]> {
    let header = batch::BatchHeader::parse(body).ok()?;
    if !header.is_control() {
        return None;
    }
    let record = batch::records(body).ok()?.next()?.ok()?;
    if record.key != Some(&key[..]) {
        return None;
    }
    Some(record.value.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn partition() -> PartitionRef {
        PartitionRef { stream: "s".into(), topic: "t".into(), partition: 3 }
    }

    #[test]
    fn consumer_bodies_round_trip_and_refuse_trailing_bytes() {
        let store = StoreOffset {
            partition: partition(),
            consumer: ConsumerId::group("g"),
            membership: Membership { member: "m-1".into(), generation: 4 },
            offset: 99,
        };
        assert_eq!(StoreOffset::decode(&store.encode()), Ok(store.clone()));
        let mut long = store.encode();
        long.push(0);
        assert!(StoreOffset::decode(&long).is_err());

        let key = OffsetKey { partition: partition(), consumer: ConsumerId::consumer("c") };
        assert_eq!(OffsetKey::decode(&key.encode()), Ok(key));
        assert_eq!(decode_stored_offset(&encode_stored_offset(Some(5))), Ok(Some(5)));
        assert_eq!(decode_stored_offset(&encode_stored_offset(None)), Ok(None));

        let group = GroupRef { stream: "s".into(), topic: "t".into(), group: "g".into() };
        let join = JoinGroup { group: group.clone(), member: String::new(), session_timeout_ms: 7 };
        assert_eq!(JoinGroup::decode(&join.encode()), Ok(join));
        let member = GroupMember { group, member: "m".into() };
        assert_eq!(GroupMember::decode(&member.encode()), Ok(member));
        let assignment = Assignment { member: "m".into(), generation: 2, partitions: vec![0, 2] };
        assert_eq!(Assignment::decode(&assignment.encode()), Ok(assignment));

        let poll = Poll {
            partition: partition(),
            consumer: ConsumerId::consumer("c"),
            membership: Membership::default(),
            bytes_max: 1,
            count_max: 2,
            wait_ms_max: 3,
            auto_commit: true,
        };
        assert_eq!(Poll::decode(&poll.encode()), Ok(poll));
    }

    #[test]
    fn a_hostile_partition_count_is_refused_before_allocating() {
        let mut w = Writer::new();
        w.str("m").u64(1).u32(u32::MAX);
        assert!(Assignment::decode(&w.finish()).is_err());
        // A partition past any topic's: clients index their tables by partition.
        let past = Assignment { member: "m".into(), generation: 1, partitions: vec![0, u32::MAX] };
        assert!(Assignment::decode(&past.encode()).is_err());
        let mut w = Writer::new();
        w.str("s").str("t").u32(0).u8(7).str("c");
        assert!(OffsetKey::decode(&w.finish()).is_err(), "unknown consumer kind");
    }

    #[test]
    fn an_offset_commit_survives_its_control_batch_and_data_is_not_mistaken_for_one() {
        let commit = OffsetCommitRecord { consumer: ConsumerId::group("g"), offset: Some(12) };
        let batch = commit.to_batch(1_700_000_000_000);
        assert_eq!(OffsetCommitRecord::from_batch(&batch), Some(Ok(commit)));
        let delete = OffsetCommitRecord { consumer: ConsumerId::consumer("c"), offset: None };
        assert_eq!(OffsetCommitRecord::from_batch(&delete.to_batch(0)), Some(Ok(delete)));

        let mut data = BatchBuilder::new(0);
        data.push(0, Some(&OFFSET_COMMIT_CONTROL_KEY), Some(b"x"), &[]);
        assert_eq!(OffsetCommitRecord::from_batch(&data.build()), None, "not a control batch");
        let mut other = BatchBuilder::new(0).control();
        other.push(0, Some(&[0, 0, 0, 1]), None, &[]);
        assert_eq!(OffsetCommitRecord::from_batch(&other.build()), None, "a Kafka commit marker");
        let mut garbled = BatchBuilder::new(0).control();
        garbled.push(0, Some(&OFFSET_COMMIT_CONTROL_KEY), Some(&[9]), &[]);
        assert!(matches!(OffsetCommitRecord::from_batch(&garbled.build()), Some(Err(_))));

        let start = LogStartRecord { offset: 77 };
        assert_eq!(LogStartRecord::from_batch(&start.to_batch(5)), Some(Ok(start)));
        assert_eq!(OffsetCommitRecord::from_batch(&start.to_batch(5)), None, "another kind");
        assert_eq!(LogStartRecord::from_batch(&batch), None, "an offset commit");
        let mut short = BatchBuilder::new(0).control();
        short.push(0, Some(&LOG_START_CONTROL_KEY), Some(&[1, 2, 3]), &[]);
        assert!(matches!(LogStartRecord::from_batch(&short.build()), Some(Err(_))));
    }
}
