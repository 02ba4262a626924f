//! A pipelined, batching producer.
//!
//! [`Producer::send`] hands a record to an open batch for its target partition (a fixed
//! partition, the key's partition by Kafka's murmur2 partitioner, or "balanced", which lets the
//! server spread batches) and returns a *ticket*: the record's position in send order. A batch is
//! sealed when it reaches `batch_bytes_max` or `batch_records_max`, or once its first record has
//! waited `linger_us`; sealed batches go out as produce requests, at most `in_flight_max` at once
//! on the connection. Acknowledgements are released strictly in ticket order
//! ([`Producer::poll_acks`]): an [`Ack`] for ticket *n* means every earlier ticket was
//! acknowledged too, which is what a caller printing "what is durable" needs.
//!
//! Retryable failures (a retryable error code, a broken connection, a timeout) resend the same
//! request body after a growing backoff, at most `retries_max` times; then, or on any other
//! error, the producer fails and stays failed (acknowledgements received before stay available).
//! By default delivery is at-least-once: a batch resent after its outcome became unknown may be
//! stored twice, and with `in_flight_max > 1` a resent batch may land after a later one of the
//! same partition (as in Kafka without idempotence).
//!
//! With `idempotent` (DESIGN.md §4, Kafka's idempotent producer) every batch carries the
//! client's session as its producer id, epoch 0 and a per-partition sequence (from 0, counting
//! records, wrapping at `i32::MAX`); a resend is the same bytes, so the partition stores it once
//! and answers a duplicate with the original offsets — also after a failover, since every
//! replica keeps the producer table. Keyless records then go to a partition the producer picks
//! (sticky, moving on with each batch), since a sequence belongs to one partition. A batch
//! refused with `OutOfOrderSequence` (or `UnknownProducer`, when the batch before it was the
//! partition's first) while an earlier batch of its partition is not stored yet (waiting to be
//! resent, or in flight again) is resent after it; otherwise those errors fail the producer. Resends of one partition's batches always go out in their sequence order.
//!
//! In a cluster (a version 3 server naming several nodes) each batch goes to its partition's
//! primary, on the client's connection to that node; keyless records go to partitions the
//! producer picks (as when idempotent). A `NotPrimary` answer teaches the client the new primary
//! and the batch goes there at once ([`REDIRECTS_MAX`] times at most, then it counts as a failed
//! attempt); a broken connection loses only the batches in flight on it. Replies are awaited
//! oldest batch first, on the connection it went out on. A partition's primary that does not
//! know the topic yet (its catalog lags the metadata primary's just after the topic was
//! created) is retried like a transient refusal, within `retries_max`.
//!
//! A producer for one partition (`partition: Some(p)`) of a single node moves its client to the
//! shard that owns the partition when the server has per-shard listeners (`connect_to_owner`, on
//! by default), so its requests are served without a hop between shards; a producer spread over
//! partitions keeps the connection it was given (its partitions may live on every shard).
//!
//! The batching, ordering and retry logic (`ProducerCore`) is sans-IO and takes the time as an
//! argument; `Producer` drives it with a [`Client`]. Buffers (request bodies, ticket lists, the
//! acknowledgement queues) are reused; at steady state a record costs no allocation of its own.
//! The producer never reorders acknowledgements and never drops a record silently.

use std::collections::VecDeque;
use std::collections::vec_deque::Drain;
use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_proto::batch::BatchBuilder;
use shoal_proto::protocol::{
    ErrorCode, Operation, Partitioning, Produce, ProduceReply, Writer, partition_for_key,
};
use shoal_proto::wire::HEADER_SIZE;

use crate::client::{Client, is_catalog_lag};
use crate::error::{ClientError, Result};
use crate::routes::Route;

/// Producer limits.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// Send every record to this partition (otherwise: by key, or balanced without a key).
    pub partition: Option<u32>,
    /// Largest batch, in bytes (also capped by the topic's `message_size_bytes_max` and the
    /// client's frame limit).
    pub batch_bytes_max: usize,
    /// Most records in one batch.
    pub batch_records_max: usize,
    /// Longest a record waits in an open batch for company, in microseconds (checked on each
    /// `send`; call `flush` when done sending).
    pub linger_us: u64,
    /// Produce requests outstanding at once (also capped by the client's `in_flight_max`).
    pub in_flight_max: usize,
    /// Times one batch is resent after a retryable failure.
    pub retries_max: u32,
    /// Backoff before the first resend, in milliseconds; doubled per attempt, capped at
    /// `retry_backoff_ms_max`.
    pub retry_backoff_ms: u64,
    /// Longest backoff, in milliseconds.
    pub retry_backoff_ms_max: u64,
    /// With `partition` set, connect to the shard that owns it when the server names per-shard
    /// listeners ([`Client::connect_to_shard`]); otherwise stay on the client's connection.
    pub connect_to_owner: bool,
    /// Stamp producer id (the client's registered session), epoch and sequence on every batch,
    /// so resends are stored once (see the module documentation). Needs a registered session.
    pub idempotent: bool,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        ProducerConfig {
            partition: None,
            batch_bytes_max: 256 << 10,
            batch_records_max: 16_384,
            linger_us: 1_000,
            in_flight_max: 8,
            // With the backoff doubling from 50 ms to 2 s: about 11 s of resends, enough to ride
            // out a primary's failover (detection plus a view change) in a cluster.
            retries_max: 10,
            retry_backoff_ms: 50,
            retry_backoff_ms_max: 2_000,
            connect_to_owner: true,
            idempotent: false,
        }
    }
}

/// One acknowledged record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The ticket `send` returned for it.
    pub ticket: u64,
    /// The partition it went to.
    pub partition: u32,
    /// Its offset there.
    pub offset: u64,
}

/// Where a batch goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Balanced,
    Partition(u32),
}

/// A batch still accepting records.
#[derive(Debug)]
struct OpenBatch {
    builder: BatchBuilder,
    tickets: Vec<u64>,
    opened: Instant,
}

/// A sealed batch: its produce request body, kept byte for byte for resends.
#[derive(Debug)]
struct SealedBatch {
    target: Target,
    body: Vec<u8>,
    tickets: Vec<u64>,
    /// Resends after a failure (bounded by `retries_max`).
    attempts: u32,
    /// Resends at once to the primary a `NotPrimary` answer named (bounded by
    /// [`REDIRECTS_MAX`]; beyond, a redirect counts as a failure).
    redirects: u32,
}

impl SealedBatch {
    /// The ticket of its first record: batches of one partition are sealed, and must be stored,
    /// in this order.
    fn first_ticket(&self) -> u64 {
        self.tickets.first().copied().unwrap_or(u64::MAX)
    }
}

/// Times one batch follows a `NotPrimary` answer at once before a redirect counts as a failed
/// attempt (with its backoff): a view change can move a primary, not make it bounce forever.
pub(crate) const REDIRECTS_MAX: u32 = 4;

/// What to do after a reply or a lost connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Nothing to resend.
    No,
    /// Resend now (a `NotPrimary` answer named where).
    Now,
    /// Resend after this backoff.
    After(Duration),
}

/// A sent batch.
#[derive(Debug)]
struct InFlight {
    /// The client's connection it went out on.
    link: u64,
    request: u64,
    batch: SealedBatch,
}

/// The sans-IO heart of the producer: batching, the send queue, in-flight tracking, retries and
/// in-order acknowledgement.
#[derive(Debug)]
pub(crate) struct ProducerCore {
    config: ProducerConfig,
    /// Produce arguments; `partitioning` is set per batch when sealing.
    produce: Produce,
    partitions: u32,
    /// Slot 0: balanced; slot `p + 1`: partition `p`.
    open: Vec<Option<OpenBatch>>,
    open_records: usize,
    /// Batches that failed retryably, oldest first; sent before `ready`.
    retry: VecDeque<SealedBatch>,
    /// Sealed batches not yet sent.
    ready: VecDeque<SealedBatch>,
    /// Sent batches with the link each went out on and its request number, in request order.
    in_flight: VecDeque<InFlight>,
    /// Results per ticket from `acked_base` on; `None` until its batch is acknowledged.
    pending: VecDeque<Option<(u32, u64)>>,
    acked_base: u64,
    acks: VecDeque<Ack>,
    next_ticket: u64,
    /// Request bodies of acknowledged batches, for reuse.
    body_pool: Vec<Vec<u8>>,
    /// Ticket lists of acknowledged batches, for reuse.
    ticket_pool: Vec<Vec<u64>>,
    failed: Option<ClientError>,
    /// The producer id when idempotent.
    producer_id: Option<i64>,
    /// Per partition, the sequence of the next batch's first record (idempotent only).
    sequences: Vec<i32>,
    /// Whether keyless records go to a partition the producer picks (`sticky`) rather than one
    /// the server balances to: when idempotent (a sequence belongs to one partition) and in a
    /// cluster (a batch goes to its partition's primary).
    sticky_keyless: bool,
    /// In a cluster: a partition's primary may not know the topic yet when it was just created
    /// (its catalog lags the metadata primary's), so "not found" is retried like a transient
    /// refusal, within the retry bound.
    catalog_may_lag: bool,
    /// The partition keyless records go to when `sticky_keyless`.
    sticky: u32,
}

impl ProducerCore {
    pub(crate) fn new(
        config: ProducerConfig,
        stream: &str,
        topic: &str,
        partitions: u32,
    ) -> Result<ProducerCore> {
        if partitions == 0 {
            return Err(ClientError::Invalid(format!("topic {stream}/{topic} has no partitions")));
        }
        if let Some(partition) = config.partition
            && partition >= partitions
        {
            return Err(ClientError::Invalid(format!(
                "partition {partition} does not exist: {stream}/{topic} has {partitions}"
            )));
        }
        let config = ProducerConfig {
            batch_records_max: config.batch_records_max.clamp(1, i32::MAX as usize),
            in_flight_max: config.in_flight_max.max(1),
            ..config
        };
        Ok(ProducerCore {
            produce: Produce {
                stream: stream.to_string(),
                topic: topic.to_string(),
                partitioning: Partitioning::Balanced,
            },
            partitions,
            open: (0..=partitions).map(|_| None).collect(),
            open_records: 0,
            retry: VecDeque::new(),
            ready: VecDeque::new(),
            in_flight: VecDeque::with_capacity(config.in_flight_max),
            pending: VecDeque::new(),
            acked_base: 0,
            acks: VecDeque::new(),
            next_ticket: 0,
            body_pool: Vec::new(),
            ticket_pool: Vec::new(),
            failed: None,
            producer_id: None,
            sequences: Vec::new(),
            sticky_keyless: false,
            catalog_may_lag: false,
            sticky: 0,
            config,
        })
    }

    /// Makes every batch sealed from now on idempotent under `producer_id` (epoch 0).
    pub(crate) fn set_idempotent(&mut self, producer_id: i64) {
        self.producer_id = Some(producer_id);
        self.sequences = vec![0; self.partitions as usize];
        self.sticky_keyless = true;
    }

    /// The producer runs against a cluster: keyless records go to a partition it picks, moving
    /// on with each batch, and "not found" may be a lagging catalog.
    pub(crate) fn set_cluster(&mut self) {
        self.sticky_keyless = true;
        self.catalog_may_lag = true;
    }

    fn check(&self) -> Result<()> {
        match &self.failed {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    fn route(&self, key: Option<&[u8]>) -> Target {
        match (self.config.partition, key) {
            (Some(partition), _) => Target::Partition(partition),
            (None, Some(key)) => Target::Partition(partition_for_key(key, self.partitions)),
            (None, None) if self.sticky_keyless => Target::Partition(self.sticky),
            (None, None) => Target::Balanced,
        }
    }

    fn slot(target: Target) -> usize {
        match target {
            Target::Balanced => 0,
            Target::Partition(partition) => partition as usize + 1,
        }
    }

    /// Adds a record to its target's open batch (sealing that batch first if the record would
    /// overflow it, and after if it is full); returns the record's ticket.
    pub(crate) fn push(
        &mut self,
        now: Instant,
        timestamp_ms: i64,
        key: Option<&[u8]>,
        value: &[u8],
    ) -> Result<u64> {
        self.check()?;
        let target = self.route(key);
        let slot = Self::slot(target);
        // Record overhead: length, attributes, deltas and lengths as varints (at most ~25 bytes).
        let record_bytes = value.len() + key.map_or(0, <[u8]>::len) + 25;
        if let Some(open) = &self.open[slot]
            && open.builder.encoded_size() + record_bytes > self.config.batch_bytes_max
        {
            self.seal(slot);
        }
        let ticket = self.next_ticket;
        let ticket_pool = &mut self.ticket_pool;
        let open = self.open[slot].get_or_insert_with(|| OpenBatch {
            builder: BatchBuilder::new(timestamp_ms),
            tickets: ticket_pool.pop().unwrap_or_default(),
            opened: now,
        });
        open.builder.push(timestamp_ms, key, Some(value), &[]);
        open.tickets.push(ticket);
        let full = open.tickets.len() >= self.config.batch_records_max;
        self.next_ticket += 1;
        self.open_records += 1;
        self.pending.push_back(None);
        if full {
            self.seal(slot);
        }
        Ok(ticket)
    }

    /// Seals the open batch in `slot` into the send queue.
    fn seal(&mut self, slot: usize) {
        let Some(open) = self.open[slot].take() else { return };
        let target = if slot == 0 { Target::Balanced } else { Target::Partition(slot as u32 - 1) };
        let mut body = self.body_pool.pop().unwrap_or_default();
        body.clear();
        self.produce.partitioning = match target {
            Target::Balanced => Partitioning::Balanced,
            Target::Partition(partition) => Partitioning::Explicit(partition),
        };
        let mut writer = Writer { bytes: body };
        self.produce.encode_prefix(&mut writer);
        let mut builder = open.builder;
        if let (Some(producer_id), Target::Partition(partition)) = (self.producer_id, target) {
            let sequence = &mut self.sequences[partition as usize];
            builder = builder.producer(producer_id, 0, *sequence);
            let records = open.tickets.len() as i64;
            *sequence = ((i64::from(*sequence) + records) % (i64::from(i32::MAX) + 1)) as i32;
        }
        if self.sticky_keyless
            && self.config.partition.is_none()
            && target == Target::Partition(self.sticky)
        {
            self.sticky = (self.sticky + 1) % self.partitions;
        }
        builder.build_into(&mut writer.bytes);
        self.open_records -= open.tickets.len();
        self.ready.push_back(SealedBatch {
            target,
            body: writer.bytes,
            tickets: open.tickets,
            attempts: 0,
            redirects: 0,
        });
    }

    /// Seals every open batch whose first record has waited `linger_us` by `now`.
    pub(crate) fn seal_lingering(&mut self, now: Instant) {
        let linger = Duration::from_micros(self.config.linger_us);
        for slot in 0..self.open.len() {
            if self.open[slot].as_ref().is_some_and(|o| now.duration_since(o.opened) >= linger) {
                self.seal(slot);
            }
        }
    }

    /// Seals every open batch.
    pub(crate) fn seal_all(&mut self) {
        for slot in 0..self.open.len() {
            self.seal(slot);
        }
    }

    /// The partition (`None`: balanced) and body of the next batch to send, if one is waiting
    /// and the in-flight bound allows.
    pub(crate) fn next_to_send(&self) -> Option<(Option<u32>, &[u8])> {
        if self.failed.is_some() || self.in_flight.len() >= self.config.in_flight_max {
            return None;
        }
        let batch = self.retry.front().or(self.ready.front())?;
        let partition = match batch.target {
            Target::Balanced => None,
            Target::Partition(partition) => Some(partition),
        };
        Some((partition, &batch.body[..]))
    }

    /// The batch `next_to_send` returned went out on `link` as `request`.
    pub(crate) fn sent(&mut self, link: u64, request: u64) {
        let batch = match self.retry.pop_front() {
            Some(batch) => batch,
            None => match self.ready.pop_front() {
                Some(batch) => batch,
                None => return,
            },
        };
        self.in_flight.push_back(InFlight { link, request, batch });
    }

    /// The link the oldest in-flight request went out on: its reply is the next to wait for
    /// (each link answers in request order, so waiting there always makes progress).
    pub(crate) fn oldest_link(&self) -> Option<u64> {
        self.in_flight.front().map(|sent| sent.link)
    }

    /// The partition of the oldest in-flight batch (`None`: balanced, or nothing in flight).
    pub(crate) fn oldest_partition(&self) -> Option<u32> {
        match self.in_flight.front()?.batch.target {
            Target::Balanced => None,
            Target::Partition(partition) => Some(partition),
        }
    }

    /// The reply to the oldest in-flight request. Returns whether (and when) the batch is to be
    /// resent.
    pub(crate) fn on_reply(&mut self, request: u64, result: Result<Bytes>) -> Result<Resend> {
        self.check()?;
        let Some(oldest) = self.in_flight.front() else {
            return Err(self.fail(ClientError::Protocol(format!(
                "a produce reply to request {request} with none in flight"
            ))));
        };
        if oldest.request != request {
            let error = ClientError::Protocol(format!(
                "a reply to request {request} while produce request {} is the oldest",
                oldest.request
            ));
            return Err(self.fail(error));
        }
        let Some(InFlight { batch, .. }) = self.in_flight.pop_front() else {
            return Ok(Resend::No);
        };
        match result {
            Ok(body) => {
                self.acknowledge(batch, &body)?;
                Ok(Resend::No)
            }
            Err(error) => self.retry_or_fail(batch, error),
        }
    }
    fn acknowledge(&mut self, batch: SealedBatch, body: &[u8]) -> Result<()> {
        let reply = ProduceReply::decode(body)
            .map_err(|e| ClientError::Protocol(format!("Produce reply: {e}")));
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => return Err(self.fail(error)),
        };
        let count = batch.tickets.len() as u64;
        let bad = if u64::from(reply.record_count) != count {
            Some(format!("{} records acknowledged for a batch of {count}", reply.record_count))
        } else if reply.partition >= self.partitions {
            Some(format!("partition {} of a topic with {}", reply.partition, self.partitions))
        } else if matches!(batch.target, Target::Partition(p) if p != reply.partition) {
            Some(format!("sent to partition {:?}, stored in {}", batch.target, reply.partition))
        } else if reply.base_offset.checked_add(count).is_none() {
            Some(format!("base offset {} overflows", reply.base_offset))
        } else {
            None
        };
        if let Some(reason) = bad {
            return Err(self.fail(ClientError::Protocol(format!("Produce reply: {reason}"))));
        }
        for (index, ticket) in batch.tickets.iter().enumerate() {
            // Tickets of in-flight batches are never below `acked_base`: the front only moves
            // past acknowledged ones.
            if let Some(slot) =
                ticket.checked_sub(self.acked_base).and_then(|i| self.pending.get_mut(i as usize))
            {
                *slot = Some((reply.partition, reply.base_offset + index as u64));
            }
        }
        while let Some(Some((partition, offset))) = self.pending.front().copied() {
            self.pending.pop_front();
            self.acks.push_back(Ack { ticket: self.acked_base, partition, offset });
            self.acked_base += 1;
        }
        let SealedBatch { body, mut tickets, .. } = batch;
        tickets.clear();
        self.ticket_pool.push(tickets);
        self.body_pool.push(body);
        Ok(())
    }

    fn retry_or_fail(&mut self, mut batch: SealedBatch, error: ClientError) -> Result<Resend> {
        // Not appended: the answer named the primary (the client learned it), go there now.
        if matches!(error, ClientError::NotPrimary(_)) && batch.redirects < REDIRECTS_MAX {
            batch.redirects += 1;
            self.requeue(batch);
            return Ok(Resend::Now);
        }
        // An idempotent batch sent behind one of its partition that is not stored yet (failed
        // and waiting to be resent, or in flight again, perhaps to a new primary) arrives to a
        // gap — or, when that one was the partition's first, to a partition that does not know
        // the producer yet: it goes again after that one.
        let first = batch.first_ticket();
        let gap = matches!(
            error.code(),
            Some(ErrorCode::OutOfOrderSequence | ErrorCode::UnknownProducer)
        );
        let mut unstored = self.retry.iter().chain(self.in_flight.iter().map(|sent| &sent.batch));
        let behind_a_resend = self.producer_id.is_some()
            && gap
            && unstored
                .any(|earlier| earlier.target == batch.target && earlier.first_ticket() < first);
        let lagging = self.catalog_may_lag && is_catalog_lag(&error);
        let retryable = error.is_retryable() || behind_a_resend || lagging;
        if !retryable || batch.attempts >= self.config.retries_max {
            return Err(self.fail(error));
        }
        batch.attempts += 1;
        let backoff = self.backoff(batch.attempts);
        self.requeue(batch);
        Ok(Resend::After(backoff))
    }

    /// Puts a batch back to be resent, in ticket order among those waiting, so that batches of
    /// one partition go out again in their sequence order whatever order their failures came in.
    fn requeue(&mut self, batch: SealedBatch) {
        let first = batch.first_ticket();
        let at = self.retry.iter().position(|waiting| waiting.first_ticket() > first);
        self.retry.insert(at.unwrap_or(self.retry.len()), batch);
    }

    /// A connection broke (or a send failed): every batch in flight on a link that is no
    /// longer `alive` is resent, after the returned backoff, unless it has used up its retries.
    pub(crate) fn on_connection_lost(
        &mut self,
        alive: impl Fn(u64) -> bool,
        error: ClientError,
    ) -> Result<Duration> {
        self.check()?;
        if !error.is_retryable() {
            return Err(self.fail(error));
        }
        let mut attempts = 0;
        let (lost, kept): (VecDeque<InFlight>, VecDeque<InFlight>) =
            self.in_flight.drain(..).partition(|sent| !alive(sent.link));
        self.in_flight = kept;
        for InFlight { mut batch, .. } in lost {
            batch.attempts += 1;
            attempts = attempts.max(batch.attempts);
            self.requeue(batch);
        }
        // A send that failed before anything was in flight charges the batch it was sending.
        if attempts == 0 {
            let front = match self.retry.front_mut() {
                Some(batch) => Some(batch),
                None => self.ready.front_mut(),
            };
            if let Some(batch) = front {
                batch.attempts += 1;
                attempts = batch.attempts;
            }
        }
        if attempts > self.config.retries_max {
            return Err(self.fail(error));
        }
        Ok(self.backoff(attempts.max(1)))
    }

    fn backoff(&self, attempts: u32) -> Duration {
        let factor = 1u64 << attempts.saturating_sub(1).min(16);
        let backoff_ms = self.config.retry_backoff_ms.saturating_mul(factor);
        Duration::from_millis(backoff_ms.min(self.config.retry_backoff_ms_max))
    }

    fn fail(&mut self, error: ClientError) -> ClientError {
        if self.failed.is_none() {
            self.failed = Some(error.clone());
        }
        error
    }

    pub(crate) fn poll_acks(&mut self) -> Drain<'_, Ack> {
        self.acks.drain(..)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Sealed batches waiting to be sent (including resends).
    pub(crate) fn backlog(&self) -> usize {
        self.retry.len() + self.ready.len()
    }

    pub(crate) fn open_records(&self) -> usize {
        self.open_records
    }

    /// Records sent and not yet acknowledged (or reported).
    pub(crate) fn unacked(&self) -> usize {
        self.pending.len()
    }
}

/// A batching, pipelined producer for one topic. See the module documentation.
#[derive(Debug)]
pub struct Producer {
    client: Client,
    core: ProducerCore,
    stream: String,
    topic: String,
}

impl Producer {
    /// A producer for `stream`/`topic` on `client`. Looks the topic up first (its partition
    /// count routes keys; its `message_size_bytes_max` caps the batch size; with `partition` and
    /// `connect_to_owner`, the owning shard is where the client connects).
    pub async fn new(
        mut client: Client,
        stream: &str,
        topic: &str,
        config: ProducerConfig,
    ) -> Result<Producer> {
        let (info, partitions) = client.describe_topic(stream, topic).await?;
        // In a cluster each batch goes to its partition's primary node instead.
        if config.connect_to_owner
            && client.nodes().len() <= 1
            && let Some(partition) = config.partition
            && let Some(owner) = partitions.iter().find(|p| p.partition == partition)
        {
            client.connect_to_shard(owner.shard).await?;
        }
        // The request frame carries the header and the produce arguments besides the batch.
        let prefix_bytes_max = 2 + stream.len() + 2 + topic.len() + 1 + 4;
        let frame_room =
            client.config().frame_size_bytes_max.saturating_sub(HEADER_SIZE + prefix_bytes_max);
        let topic_max = usize::try_from(info.message_size_bytes_max).unwrap_or(usize::MAX);
        let config = ProducerConfig {
            batch_bytes_max: config.batch_bytes_max.min(topic_max).min(frame_room).max(1),
            in_flight_max: config.in_flight_max.min(client.config().in_flight_max).max(1),
            ..config
        };
        let idempotent = config.idempotent;
        let mut core = ProducerCore::new(config, stream, topic, info.partitions)?;
        if client.nodes().len() > 1 {
            core.set_cluster();
        }
        if idempotent {
            let producer_id =
                i64::try_from(client.session()).ok().filter(|&id| id > 0).ok_or_else(|| {
                    ClientError::Invalid(
                        "an idempotent producer needs a registered session (its producer id)"
                            .into(),
                    )
                })?;
            core.set_idempotent(producer_id);
        }
        Ok(Producer { client, core, stream: stream.to_string(), topic: topic.to_string() })
    }

    /// Adds a record; returns its ticket. Sends batches that are due, waiting for
    /// acknowledgements only when more than `in_flight_max` sealed batches are waiting.
    pub async fn send(&mut self, key: Option<&[u8]>, value: &[u8]) -> Result<u64> {
        let now = Instant::now();
        self.core.seal_lingering(now);
        let ticket = self.core.push(now, now_ms(), key, value)?;
        self.pump().await?;
        Ok(ticket)
    }

    /// Acknowledgements received so far, in ticket order.
    pub fn poll_acks(&mut self) -> Drain<'_, Ack> {
        self.core.poll_acks()
    }

    /// Seals every open batch and sends what the in-flight bound allows, without waiting for
    /// acknowledgements unless the send queue is over its bound.
    pub async fn send_buffered(&mut self) -> Result<()> {
        self.core.seal_all();
        self.pump().await
    }

    /// Waits for one reply if a request is in flight (sending what is due first). Returns
    /// whether anything was waited for.
    pub async fn await_ack(&mut self) -> Result<bool> {
        self.send_due().await?;
        if self.core.in_flight() == 0 {
            return Ok(false);
        }
        self.receive_one().await?;
        Ok(true)
    }

    /// Sends everything buffered and waits until every record is acknowledged.
    pub async fn flush(&mut self) -> Result<()> {
        self.core.seal_all();
        loop {
            self.core.check()?;
            self.send_due().await?;
            if self.core.in_flight() > 0 {
                self.receive_one().await?;
            } else if self.core.backlog() == 0 {
                return Ok(());
            } else {
                // Nothing in flight and nothing sendable: only requests the producer does not
                // own could be holding the connection's in-flight bound.
                return Err(ClientError::Invalid(
                    "the client has requests outstanding that are not the producer's".into(),
                ));
            }
        }
    }

    /// Produce requests outstanding.
    pub fn in_flight(&self) -> usize {
        self.core.in_flight()
    }

    /// Records in batches not yet sealed.
    pub fn buffered_records(&self) -> usize {
        self.core.open_records()
    }

    /// Records sent with `send` and not yet acknowledged.
    pub fn unacked(&self) -> usize {
        self.core.unacked()
    }

    /// The client back (after `flush`, so no request is left outstanding on it).
    pub fn into_client(self) -> Client {
        self.client
    }

    /// Sends due batches, then waits for replies while the send queue is over its bound.
    async fn pump(&mut self) -> Result<()> {
        loop {
            self.send_due().await?;
            if self.core.backlog() <= self.core.config.in_flight_max {
                return Ok(());
            }
            self.receive_one().await?;
        }
    }

    /// Sends waiting batches while the in-flight bound allows, each to its partition's primary.
    async fn send_due(&mut self) -> Result<()> {
        while let Some((partition, body)) = self.core.next_to_send() {
            let route = match partition {
                Some(partition) => {
                    Route::Partition { stream: &self.stream, topic: &self.topic, partition }
                }
                None => Route::Any,
            };
            match self.client.submit_routed(&route, Operation::Produce, &[body]).await {
                Ok((link, request)) => self.core.sent(link, request),
                Err(error) => {
                    let client = &self.client;
                    let backoff = self.core.on_connection_lost(|l| client.link_alive(l), error)?;
                    monoio::time::sleep(backoff).await;
                }
            }
        }
        Ok(())
    }

    /// Waits for the reply to the oldest batch in flight (on the link it went out on) and acts
    /// on it: a `NotPrimary` answer teaches the client the partition's primary first.
    async fn receive_one(&mut self) -> Result<()> {
        let Some(link) = self.core.oldest_link() else { return Ok(()) };
        let resend = match self.client.receive_on(link).await {
            Ok(reply) => {
                if let (Err(ClientError::NotPrimary(redirect)), Some(partition)) =
                    (&reply.result, self.core.oldest_partition())
                {
                    let route =
                        Route::Partition { stream: &self.stream, topic: &self.topic, partition };
                    self.client.learn(&route, redirect.primary);
                }
                self.core.on_reply(reply.request, reply.result)?
            }
            Err(error) => {
                let client = &self.client;
                Resend::After(self.core.on_connection_lost(|l| client.link_alive(l), error)?)
            }
        };
        if let Resend::After(backoff) = resend {
            monoio::time::sleep(backoff).await;
        }
        Ok(())
    }
}

/// Milliseconds since the Unix epoch: a record's timestamp (`CreateTime`).
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::connection::{Connection, ConnectionConfig};
    use crate::testing::{
        Faults, MemoryServer, Responder, hello_reply_body, reply_frame, spawn_cluster, spawn_tcp,
        spawn_tcp_as_shard,
    };
    use crate::{ClientConfig, runtime};
    use shoal_proto::batch::records;
    use shoal_proto::protocol::ErrorCode;

    /// The link id the sans-IO harness's one connection stands for.
    const LINK: u64 = 1;

    /// Drives a `ProducerCore` over a sans-IO `Connection` against an in-memory server.
    struct Harness {
        core: ProducerCore,
        connection: Connection,
        responder: Responder,
        server: MemoryServer,
        now: Instant,
    }

    impl Harness {
        fn new(config: ProducerConfig, partitions: u32) -> Harness {
            let (connection, responder) = connected();
            Harness {
                core: ProducerCore::new(config, "s", "t", partitions).unwrap(),
                connection,
                responder,
                server: MemoryServer::new(partitions),
                now: Instant::now(),
            }
        }

        fn send(&mut self, key: Option<&str>, value: &str) -> u64 {
            let ticket =
                self.core.push(self.now, 1_000, key.map(str::as_bytes), value.as_bytes()).unwrap();
            self.send_due();
            ticket
        }

        fn send_due(&mut self) {
            while let Some((_, body)) = self.core.next_to_send() {
                let request = self.connection.request(Operation::Produce, &[body]).unwrap();
                self.core.sent(LINK, request);
            }
        }

        /// The server answers everything written so far; the core sees every reply.
        fn deliver(&mut self) -> Result<()> {
            let bytes = self.connection.take_outgoing(Vec::new());
            let replies = self.server.respond(&mut self.responder, &bytes);
            self.connection.on_bytes(&replies);
            while let Some(reply) = self.connection.poll_reply()? {
                self.core.on_reply(reply.request, reply.result)?;
            }
            self.send_due();
            Ok(())
        }

        fn acks(&mut self) -> Vec<(u64, u32, u64)> {
            self.core.poll_acks().map(|a| (a.ticket, a.partition, a.offset)).collect()
        }
    }

    /// A connection whose Hello was answered, and the responder that saw it.
    fn connected() -> (Connection, Responder) {
        let mut connection = Connection::new(ConnectionConfig {
            cluster: 1,
            client: 9,
            in_flight_max: 64,
            frame_size_bytes_max: 1 << 20,
            reply_size_bytes_max: 1 << 20,
        });
        connection.hello("test").unwrap();
        let mut responder = Responder::new(1);
        responder.requests(&connection.take_outgoing(Vec::new()));
        connection.on_bytes(&reply_frame(1, 9, 1, Operation::Hello, 0, &hello_reply_body(1)));
        connection.poll_reply().unwrap().unwrap();
        (connection, responder)
    }

    fn config() -> ProducerConfig {
        ProducerConfig { linger_us: 1_000, ..ProducerConfig::default() }
    }

    #[test]
    fn producer_batches_by_record_count_and_acknowledges_with_dense_offsets() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 4, ..config() },
            1,
        );
        for i in 0..10 {
            assert_eq!(h.send(None, &format!("v{i}")), i);
        }
        // Two full batches went out; two records wait for company.
        assert_eq!(h.core.in_flight(), 2);
        assert_eq!(h.core.open_records(), 2);
        h.deliver().unwrap();
        assert_eq!(h.acks(), (0..8).map(|i| (i, 0, i)).collect::<Vec<_>>());
        // Linger seals the rest once its first record has waited long enough.
        h.core.seal_lingering(h.now + Duration::from_micros(999));
        assert_eq!(h.core.open_records(), 2);
        h.core.seal_lingering(h.now + Duration::from_millis(1));
        h.send_due();
        h.deliver().unwrap();
        assert_eq!(h.acks(), [(8, 0, 8), (9, 0, 9)]);
        assert_eq!(
            h.server.produce_log,
            [
                (Partitioning::Explicit(0), 4),
                (Partitioning::Explicit(0), 4),
                (Partitioning::Explicit(0), 2)
            ]
        );
        // The stored records are the values sent, in order.
        let stored: Vec<Vec<u8>> = h.server.logs[0]
            .iter()
            .flat_map(|(_, batch)| {
                records(batch)
                    .unwrap()
                    .map(|r| r.unwrap().value.unwrap().to_vec())
                    .collect::<Vec<_>>()
            })
            .collect();
        assert_eq!(stored, (0..10).map(|i| format!("v{i}").into_bytes()).collect::<Vec<_>>());
    }

    #[test]
    fn an_idempotent_producer_stamps_per_partition_sequences_and_keeps_them_across_resends() {
        let mut h = Harness::new(ProducerConfig { batch_records_max: 2, ..config() }, 2);
        h.core.set_idempotent(77);
        // Keyless records stick to a partition per batch and move on: 0, 1, 0.
        for i in 0..6 {
            h.send(None, &format!("v{i}"));
        }
        h.server.produce_script.push_back(Some(ErrorCode::TransientNotCommitted));
        h.deliver().unwrap();
        // The first batch was refused (outcome unknown) and goes again, byte for byte; the
        // two behind it were stored.
        h.send_due();
        h.deliver().unwrap();
        let stamps: Vec<(u32, i64, i16, i32)> = h
            .server
            .logs
            .iter()
            .enumerate()
            .flat_map(|(p, log)| {
                log.iter().map(move |(_, batch)| {
                    let header = shoal_proto::batch::BatchHeader::parse(batch).unwrap();
                    (
                        p as u32,
                        header.producer_id(),
                        header.producer_epoch(),
                        header.base_sequence(),
                    )
                })
            })
            .collect();
        assert_eq!(stamps, [(0, 77, 0, 2), (0, 77, 0, 0), (1, 77, 0, 0)]);
        assert_eq!(h.acks().len(), 6);
    }

    #[test]
    fn producer_batches_by_bytes() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_bytes_max: 200, ..config() },
            1,
        );
        let value = "x".repeat(50);
        for _ in 0..8 {
            h.send(None, &value);
        }
        h.core.seal_all();
        h.send_due();
        h.deliver().unwrap();
        assert_eq!(h.acks().len(), 8);
        assert!(h.server.produce_log.len() >= 3, "{:?}", h.server.produce_log);
        for (_, batch) in &h.server.logs[0] {
            assert!(batch.len() <= 200, "{}", batch.len());
        }
    }

    #[test]
    fn producer_acks_come_in_send_order_across_partitions() {
        // Keys spread records over 3 partitions; batches complete in seal order, which is not
        // send order, yet acknowledgements are released in ticket order.
        let mut h = Harness::new(ProducerConfig { batch_records_max: 3, ..config() }, 3);
        let keys = ["a", "b", "c", "d", "e", "f", "g", "h"];
        let mut expected_partition = Vec::new();
        for (i, key) in keys.iter().cycle().take(24).enumerate() {
            h.send(Some(key), &format!("{i}"));
            expected_partition.push(partition_for_key(key.as_bytes(), 3));
        }
        h.core.seal_all();
        h.send_due();
        h.deliver().unwrap();
        let acks = h.acks();
        assert_eq!(acks.iter().map(|a| a.0).collect::<Vec<_>>(), (0..24).collect::<Vec<_>>());
        assert_eq!(acks.iter().map(|a| a.1).collect::<Vec<_>>(), expected_partition);
        // Offsets are dense per partition, in send order.
        for partition in 0..3 {
            let offsets: Vec<u64> = acks.iter().filter(|a| a.1 == partition).map(|a| a.2).collect();
            assert_eq!(offsets, (0..offsets.len() as u64).collect::<Vec<_>>());
        }
    }

    #[test]
    fn producer_withholds_later_acks_until_earlier_tickets_are_acknowledged() {
        let mut h = Harness::new(ProducerConfig { batch_records_max: 2, ..config() }, 2);
        // Ticket 0 to partition 0 (stays open), tickets 1 and 2 fill partition 1's batch.
        let key_for = |partition: u32| {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|k| partition_for_key(k.as_bytes(), 2) == partition)
                .unwrap()
        };
        let (k0, k1) = (key_for(0), key_for(1));
        h.send(Some(&k0), "first");
        h.send(Some(&k1), "second");
        h.send(Some(&k1), "third");
        h.deliver().unwrap();
        assert_eq!(h.acks(), [], "ticket 0 is not acknowledged yet");
        assert_eq!(h.core.unacked(), 3);
        h.core.seal_all();
        h.send_due();
        h.deliver().unwrap();
        assert_eq!(h.acks(), [(0, 0, 0), (1, 1, 0), (2, 1, 1)]);
        assert_eq!(h.core.unacked(), 0);
    }

    #[test]
    fn producer_retries_retryable_errors_with_the_same_bytes_then_gives_up() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 2, retries_max: 2, ..config() },
            1,
        );
        h.server.produce_script.extend([Some(ErrorCode::Busy), Some(ErrorCode::StorageFull)]);
        h.send(None, "a");
        h.send(None, "b");
        h.deliver().unwrap(); // Busy: queued for a resend
        assert_eq!(h.core.backlog() + h.core.in_flight(), 1);
        h.deliver().unwrap(); // StorageFull: resent again
        h.deliver().unwrap(); // stored
        assert_eq!(h.acks(), [(0, 0, 0), (1, 0, 1)]);
        assert_eq!(h.server.produce_requests, 3);

        // A non-retryable error fails the producer for good.
        h.server.produce_script.push_back(Some(ErrorCode::InvalidBatch));
        h.send(None, "c");
        h.send(None, "d");
        let error = h.deliver().unwrap_err();
        assert_eq!(error.code(), Some(ErrorCode::InvalidBatch));
        assert!(h.core.push(h.now, 0, None, b"e").is_err());

        // Retries run out.
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 1, retries_max: 1, ..config() },
            1,
        );
        h.server.produce_script.extend([Some(ErrorCode::Busy), Some(ErrorCode::Busy)]);
        h.send(None, "a");
        h.deliver().unwrap();
        assert_eq!(h.deliver().unwrap_err().code(), Some(ErrorCode::Busy));
    }

    #[test]
    fn producer_resends_in_flight_batches_in_order_after_a_lost_connection() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 1, ..config() },
            1,
        );
        for value in ["a", "b", "c"] {
            h.send(None, value);
        }
        assert_eq!(h.core.in_flight(), 3);
        let backoff = h.core.on_connection_lost(|_| false, ClientError::Closed).unwrap();
        assert_eq!(backoff, Duration::from_millis(50));
        assert_eq!((h.core.in_flight(), h.core.backlog()), (0, 3));
        // A new connection: request numbers restart, the batches go out again in order.
        (h.connection, h.responder) = connected();
        h.send_due();
        h.deliver().unwrap();
        assert_eq!(h.acks(), [(0, 0, 0), (1, 0, 1), (2, 0, 2)]);
        // A protocol error is not retried.
        let mut h = Harness::new(ProducerConfig { partition: Some(0), ..config() }, 1);
        h.send(None, "a");
        assert!(h.core.on_connection_lost(|_| false, ClientError::Protocol("bad".into())).is_err());
    }

    fn redirect() -> ClientError {
        ClientError::NotPrimary(shoal_proto::protocol::NotPrimary {
            view: 1,
            primary: 2,
            address: "127.0.0.1:1".into(),
            text: "replica 2 leads view 1".into(),
        })
    }

    #[test]
    fn producer_follows_not_primary_at_once_a_bounded_number_of_times() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 1, retries_max: 1, ..config() },
            1,
        );
        h.send(None, "a");
        for _ in 0..REDIRECTS_MAX {
            let request = h.core.in_flight.front().unwrap().request;
            assert_eq!(h.core.on_reply(request, Err(redirect())).unwrap(), Resend::Now);
            h.send_due();
        }
        // Then a redirect is a failed attempt, with its backoff, and the retries run out.
        let request = h.core.in_flight.front().unwrap().request;
        let backoff = Duration::from_millis(50);
        assert_eq!(h.core.on_reply(request, Err(redirect())).unwrap(), Resend::After(backoff));
        h.send_due();
        let request = h.core.in_flight.front().unwrap().request;
        assert!(h.core.on_reply(request, Err(redirect())).is_err());
    }

    #[test]
    fn producer_resends_a_partitions_batches_in_sequence_order() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 2, ..config() },
            1,
        );
        h.core.set_idempotent(77);
        for value in ["a", "b", "c", "d", "e", "f"] {
            h.send(None, value);
        }
        // Three batches in flight on two links; the link of the last two breaks first, then the
        // first batch is refused: the resends go out first batch first.
        let links: Vec<u64> = vec![1, 2, 2];
        for (sent, link) in h.core.in_flight.iter_mut().zip(links) {
            sent.link = link;
        }
        h.core.on_connection_lost(|link| link == 1, ClientError::Closed).unwrap();
        let request = h.core.in_flight.front().unwrap().request;
        h.core.on_reply(request, Err(redirect())).unwrap();
        let sequences: Vec<i32> = h
            .core
            .retry
            .iter()
            .map(|batch| {
                let at = Produce::decode(&batch.body).unwrap().1;
                shoal_proto::batch::BatchHeader::parse(&batch.body[at..]).unwrap().base_sequence()
            })
            .collect();
        assert_eq!(sequences, [0, 2, 4]);
        // An out-of-order refusal behind a batch of its partition still unstored is resent
        // after it, even when that batch is in flight again.
        h.send_due();
        let (first, second) = (h.core.in_flight[0].request, h.core.in_flight[1].request);
        let gap =
            || ClientError::Server { code: ErrorCode::OutOfOrderSequence, message: "gap".into() };
        h.core.in_flight.swap(0, 1);
        assert!(matches!(h.core.on_reply(second, Err(gap())), Ok(Resend::After(_))));
        let refused = h.core.on_reply(first, Err(gap())).unwrap_err();
        assert_eq!(refused.code(), Some(ErrorCode::OutOfOrderSequence), "nothing before the first");
    }

    #[test]
    fn producer_refuses_a_reply_that_does_not_match_its_batch() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 2, ..config() },
            1,
        );
        h.send(None, "a");
        h.send(None, "b");
        let request = h.core.in_flight.front().unwrap().request;
        let wrong_count = ProduceReply { partition: 0, base_offset: 0, record_count: 3 }.encode();
        assert!(matches!(
            h.core.on_reply(request, Ok(Bytes::from(wrong_count))),
            Err(ClientError::Protocol(_))
        ));
    }

    #[test]
    fn producer_reuses_buffers_at_steady_state() {
        let mut h = Harness::new(
            ProducerConfig { partition: Some(0), batch_records_max: 8, ..config() },
            1,
        );
        for i in 0..64 {
            h.send(None, &format!("{i}"));
            h.deliver().unwrap();
        }
        // Bodies and ticket lists come back to the pool and are taken again: it stays small.
        assert!(h.core.body_pool.len() <= 2, "{}", h.core.body_pool.len());
        assert!(h.core.ticket_pool.len() <= 2, "{}", h.core.ticket_pool.len());
        assert_eq!(h.acks().len(), 64);
    }

    #[test]
    fn producer_over_tcp_flushes_and_survives_a_dropped_connection() {
        let server = Arc::new(Mutex::new(MemoryServer::new(2)));
        // The first connection answers Hello and DescribeTopic, then drops: the producer
        // reconnects and resends.
        let address =
            spawn_tcp(server.clone(), Faults { close_first_after: Some(2), ..Faults::default() });
        runtime().unwrap().block_on(async move {
            let client = Client::connect(ClientConfig {
                request_timeout_ms: 2_000,
                ..ClientConfig::with_seeds([address.to_string()])
            })
            .await
            .unwrap();
            let config = ProducerConfig { partition: Some(1), batch_records_max: 10, ..config() };
            let mut producer = Producer::new(client, "s", "t", config).await.unwrap();
            let mut tickets = Vec::new();
            for i in 0..25 {
                tickets.push(producer.send(None, format!("{i}").as_bytes()).await.unwrap());
            }
            producer.flush().await.unwrap();
            let acks: Vec<Ack> = producer.poll_acks().collect();
            assert_eq!(acks.iter().map(|a| a.ticket).collect::<Vec<_>>(), tickets);
            assert!(acks.iter().all(|a| a.partition == 1));
            let mut offsets: Vec<u64> = acks.iter().map(|a| a.offset).collect();
            offsets.sort_unstable();
            offsets.dedup();
            assert_eq!(offsets.len(), 25, "each record has its own offset");
            assert_eq!(producer.unacked(), 0);
        });
        let server = server.lock().unwrap();
        assert_eq!(server.next_offsets[1], 25);
        assert_eq!(server.hellos, 2, "the producer reconnected once");
    }

    /// A server naming per-shard listeners: a one-partition producer moves to the owner's,
    /// others (and one told not to) stay on the seed.
    #[test]
    fn producer_for_one_partition_connects_to_the_shard_that_owns_it() {
        let server = Arc::new(Mutex::new(MemoryServer::new(4)));
        let shard0 = spawn_tcp_as_shard(server.clone(), Faults::default(), 0);
        let shard1 = spawn_tcp_as_shard(server.clone(), Faults::default(), 1);
        server.lock().unwrap().shard_addresses = vec![shard0.to_string(), shard1.to_string()];
        let connect = || {
            Client::connect(ClientConfig {
                request_timeout_ms: 2_000,
                ..ClientConfig::with_seeds([shard0.to_string()])
            })
        };
        runtime().unwrap().block_on(async move {
            // (partition, connect_to_owner, where the producer ends up); partition p is on
            // shard p % 2.
            let cases = [
                (Some(3), true, shard1),
                (Some(2), true, shard0),
                (Some(1), false, shard0),
                (None, true, shard0),
            ];
            for (partition, connect_to_owner, expected) in cases {
                let client = connect().await.unwrap();
                let config = ProducerConfig { partition, connect_to_owner, ..config() };
                let mut producer = Producer::new(client, "s", "t", config).await.unwrap();
                producer.send(Some(b"k"), b"v").await.unwrap();
                producer.flush().await.unwrap();
                assert_eq!(producer.poll_acks().count(), 1);
                let client = producer.into_client();
                let case = format!("{partition:?} {connect_to_owner}");
                assert_eq!(client.address(), Some(expected.to_string().as_str()), "{case}");
                let shard = client.server().map(|hello| hello.shard);
                assert_eq!(shard, Some(u32::from(expected == shard1)), "{case}");
            }
            // A client already on the owner stays; an unknown shard is no move.
            let mut client = connect().await.unwrap();
            assert!(client.connect_to_shard(0).await.unwrap());
            assert!(!client.connect_to_shard(7).await.unwrap());
            assert_eq!(client.address(), Some(shard0.to_string().as_str()));
            assert_eq!(client.shard_address(1), Some(shard1.to_string()));
        });
    }

    /// Three nodes each leading one partition; the producer is given node 1 only. Node 1 then
    /// dies and node 2 takes its partition over: the producer follows, and every record is
    /// acknowledged once, offsets dense per partition.
    #[test]
    fn a_producer_sends_each_partition_to_its_primary_and_follows_a_failover() {
        let server = Arc::new(Mutex::new(MemoryServer::new(3)));
        let nodes = spawn_cluster(&server, 3);
        server.lock().unwrap().primaries = vec![0, 1, 2];
        let key_for = |partition: u32| {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|k| partition_for_key(k.as_bytes(), 3) == partition)
                .unwrap()
        };
        let keys: Vec<String> = (0..3).map(key_for).collect();
        let shared = Arc::clone(&server);
        runtime().unwrap().block_on(async move {
            let client = Client::connect(ClientConfig {
                register: true,
                request_timeout_ms: 2_000,
                ..ClientConfig::with_seeds([nodes[1].to_string()])
            })
            .await
            .unwrap();
            let config = ProducerConfig { idempotent: true, batch_records_max: 4, ..config() };
            let mut producer = Producer::new(client, "s", "t", config).await.unwrap();
            for i in 0..30 {
                producer.send(Some(keys[i % 3].as_bytes()), b"before").await.unwrap();
            }
            producer.flush().await.unwrap();
            {
                let mut state = shared.lock().unwrap();
                state.down[1] = true;
                state.primaries[1] = 2;
            }
            for i in 0..30 {
                producer.send(Some(keys[i % 3].as_bytes()), b"after").await.unwrap();
            }
            producer.flush().await.unwrap();
            let acks: Vec<Ack> = producer.poll_acks().collect();
            assert_eq!(acks.len(), 60);
            for partition in 0..3 {
                let offsets: Vec<u64> =
                    acks.iter().filter(|a| a.partition == partition).map(|a| a.offset).collect();
                assert_eq!(offsets, (0..20).collect::<Vec<_>>(), "partition {partition}");
            }
        });
        let server = server.lock().unwrap();
        assert_eq!(server.next_offsets, [20, 20, 20]);
        // Before the failover every batch went to its primary (only the registration, sent to
        // node 1, was redirected); after it, node 1 was unreachable, and the batches of
        // partition 1 sent before the first redirect came back (at most the in-flight bound)
        // found another node not leading it.
        let redirects = &server.redirects_by_node;
        assert_eq!(redirects[1], 1);
        let in_flight_max = ProducerConfig::default().in_flight_max;
        assert!(redirects[0] + redirects[2] <= in_flight_max, "{redirects:?}");
    }

    /// A listener on every interface is named with an unspecified IP: the client substitutes
    /// the host it reached.
    #[test]
    fn an_unspecified_shard_address_means_the_host_the_client_reached() {
        let server = Arc::new(Mutex::new(MemoryServer::new(2)));
        let shard0 = spawn_tcp_as_shard(server.clone(), Faults::default(), 0);
        let shard1 = spawn_tcp_as_shard(server.clone(), Faults::default(), 1);
        let anywhere = format!("0.0.0.0:{}", shard1.port());
        server.lock().unwrap().shard_addresses = vec![shard0.to_string(), anywhere];
        runtime().unwrap().block_on(async move {
            let mut client = Client::connect(ClientConfig {
                request_timeout_ms: 2_000,
                ..ClientConfig::with_seeds([shard0.to_string()])
            })
            .await
            .unwrap();
            assert_eq!(client.shard_address(1), Some(shard1.to_string()));
            assert!(client.connect_to_shard(1).await.unwrap());
            assert_eq!(client.address(), Some(shard1.to_string().as_str()));
        });
    }
}
