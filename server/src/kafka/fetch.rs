//! The Fetch answer: each partition read by the owning shard as a native fetch is — committed
//! data only, whole batches from the one holding the fetch offset, from the ring, the batch
//! cache or the disk — and returned as stored (compressed batches as their producer sent them).
//!
//! Waiting: a first round reads every partition at once without waiting. If it found nothing
//! and the client allows a wait, a second round parks every partition's read (each answers when
//! its partition gets data or its wait ends) and the response goes out as soon as the first of
//! them answers; the others are taken as they stand. `min_bytes` above 1 is treated as 1.
//! Fetch sessions (KIP-227) are not kept: the response's session id is 0, which tells clients
//! to send full requests. An offset before the first held or past the committed end is
//! `OFFSET_OUT_OF_RANGE`, so the client resets by its `auto.offset.reset`. The batches go out
//! as the buffers the shards read them into (ring, batch cache or disk read), never copied
//! (`shoal_kafka::FetchAnswer`: one vectored write per response).

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use bytes::Bytes;
use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::request::FetchRequest;
use shoal_kafka::{FetchAnswer, FetchPartitionAnswer, FetchTopicAnswer, Uuid};
use shoal_proto::protocol::{FetchFrom, FetchReply};

use super::Connection;
use super::errors::kafka_error;
use crate::metadata::PartitionPlace;
use crate::shard::{Body, FetchArgs, Outcome, Work};

/// One asked partition: where it lives (or why it cannot be read) and what was found.
struct Asked {
    index: i32,
    fetch_offset: i64,
    /// Its `partition_max_bytes`, within the response's bound.
    partition_max: u32,
    /// What its next read may return (0: its offsets only); `None` until a wave plans it.
    bytes_max: Option<u32>,
    place: Result<PartitionPlace, ResponseError>,
    found: Option<Outcome>,
}

pub(super) async fn answer(connection: &Connection, request: FetchRequest) -> FetchAnswer {
    let config = &connection.context.config;
    // Whatever the request asks, a response carries at most `[kafka] fetch_bytes_max` of
    // batches, plus the first partition's past it.
    let max_bytes = request.max_bytes.clamp(1, config.kafka.fetch_bytes_max as i32);
    let mut seen = HashSet::new();
    let mut topics = Vec::with_capacity(request.topics.len());
    for wanted in &request.topics {
        let found = connection.find_topic(wanted.name.as_deref(), &wanted.topic_id);
        let name = found
            .as_ref()
            .map_or_else(|_| wanted.name.clone().unwrap_or_default(), |(n, _)| n.clone());
        let mut asked = Vec::with_capacity(wanted.partitions.len());
        for p in &wanted.partitions {
            // A partition named twice is read and answered once (Kafka keeps the request's
            // partitions in a map): repeats would multiply the reads and the response.
            if !seen.insert((name.clone(), wanted.topic_id, p.index)) {
                continue;
            }
            asked.push(Asked {
                index: p.index,
                fetch_offset: p.fetch_offset,
                partition_max: p.partition_max_bytes.clamp(1, max_bytes) as u32,
                bytes_max: None,
                place: found.as_ref().map_err(|error| *error).and_then(|(_, topic)| {
                    let index = usize::try_from(p.index).ok();
                    let place = index.and_then(|index| topic.partitions.get(index)).copied();
                    place.ok_or(ResponseError::UnknownTopicOrPartition)
                }),
                found: None,
            });
        }
        topics.push((name, wanted.topic_id, asked));
    }

    let order: Vec<(usize, usize)> = topics
        .iter()
        .enumerate()
        .flat_map(|(t, (_, _, asked))| (0..asked.len()).map(move |a| (t, a)))
        .collect();
    read_in_waves(connection, &mut topics, &order, max_bytes as usize).await;
    let found_bytes: usize = topics.iter().flat_map(|t| &t.2).map(batch_bytes).sum();
    if found_bytes == 0 && request.max_wait_ms > 0 {
        // Nothing found, so every partition was read within its share: each waits with it.
        let wait_ms = (request.max_wait_ms as u32).min(config.network.fetch_wait_ms_max);
        connection.read_all(&mut topics, &order, wait_ms).await;
    }

    let mut budget = Budget { left: usize::try_from(max_bytes).unwrap_or(1), first: true };
    let topics = topics
        .into_iter()
        .map(|(name, id, asked)| FetchTopicAnswer {
            name,
            topic_id: Uuid::from_bytes(id),
            partitions: asked.into_iter().map(|a| partition_data(a, &mut budget)).collect(),
        })
        .collect();
    FetchAnswer { error_code: 0, topics }
}

/// Reads the partitions in request `order` as Kafka's broker does, so that what they return
/// stays within the response's budget however many are asked: in waves read at once, each
/// taking partitions while their bounds fit what is left of the budget (at least one), what a
/// wave found coming off the budget before the next is planned. The last of at most
/// [`WAVES_MAX`] waves shares what is left among the rest (partitions that hold little would
/// otherwise make a wave each). Once the budget is spent the rest are read for their offsets
/// only.
async fn read_in_waves(
    connection: &Connection,
    topics: &mut [(String, [u8; 16], Vec<Asked>)],
    order: &[(usize, usize)],
    budget_bytes: usize,
) {
    let mut budget = budget_bytes;
    let mut next = 0;
    let mut waves = 0;
    while next < order.len() && budget > 0 {
        waves += 1;
        let wave_start = next;
        if waves == WAVES_MAX {
            let share = (budget / (order.len() - next)).max(1);
            for &(t, a) in &order[next..] {
                let asked = &mut topics[t].2[a];
                asked.bytes_max = Some((asked.partition_max as usize).min(share) as u32);
            }
            connection.read_all(topics, &order[next..], 0).await;
            return;
        }
        let mut planned = 0usize;
        while let Some(&(t, a)) = order.get(next) {
            let asked = &mut topics[t].2[a];
            let bound = (asked.partition_max as usize).min(budget);
            if next > wave_start && planned + bound > budget {
                break;
            }
            planned += bound;
            asked.bytes_max = Some(bound as u32);
            next += 1;
        }
        connection.read_all(topics, &order[wave_start..next], 0).await;
        let found: usize =
            order[wave_start..next].iter().map(|&(t, a)| batch_bytes(&topics[t].2[a])).sum();
        budget = budget.saturating_sub(found);
    }
    if next < order.len() {
        for &(t, a) in &order[next..] {
            topics[t].2[a].bytes_max = Some(0);
        }
        connection.read_all(topics, &order[next..], 0).await;
    }
}

/// The most waves of reads one Fetch makes (each a round trip to the shards).
const WAVES_MAX: usize = 16;

/// Bytes of batches a partition's answer holds (0 without one).
fn batch_bytes(asked: &Asked) -> usize {
    match &asked.found {
        Some(Outcome { error: 0, body: Body::Parts(parts) }) => {
            parts.iter().skip(1).map(Bytes::len).sum()
        }
        _ => 0,
    }
}

/// One partition's part of the response; its batches count against the response's byte bound,
/// which only the first partition with data may pass (by its first batch).
fn partition_data(asked: Asked, budget: &mut Budget) -> FetchPartitionAnswer {
    let data = FetchPartitionAnswer {
        index: asked.index,
        error_code: 0,
        high_watermark: -1,
        last_stable_offset: -1,
        log_start_offset: -1,
        batches: Vec::new(),
    };
    let refused =
        |error: ResponseError| FetchPartitionAnswer { error_code: error.code(), ..data.clone() };
    if let Err(error) = asked.place {
        return refused(error);
    }
    let parts = match asked.found {
        Some(Outcome { error: 0, body: Body::Parts(parts) }) => parts,
        Some(Outcome { error, .. }) => {
            return refused(kafka_error(error).unwrap_or(ResponseError::UnknownServerError));
        }
        None => return refused(ResponseError::NotLeaderOrFollower),
    };
    let Some((reply, _)) = parts.first().and_then(|prefix| FetchReply::decode(prefix).ok()) else {
        return refused(ResponseError::UnknownServerError);
    };
    let data = FetchPartitionAnswer {
        high_watermark: reply.next_offset as i64,
        last_stable_offset: reply.next_offset as i64,
        log_start_offset: reply.first_offset as i64,
        ..data
    };
    let offset = u64::try_from(asked.fetch_offset).unwrap_or(u64::MAX);
    if offset < reply.first_offset || offset > reply.next_offset {
        return FetchPartitionAnswer { error_code: ResponseError::OffsetOutOfRange.code(), ..data };
    }
    let mut batches = parts;
    batches.remove(0);
    if !budget.first {
        // Past the first partition with data, only whole batches within what is left (Kafka
        // forces one batch past the bound for the first only).
        let mut kept = 0;
        let fit = batches.iter().take_while(|b| {
            kept += b.len();
            kept <= budget.left
        });
        let fit = fit.count();
        batches.truncate(fit);
    }
    let size: usize = batches.iter().map(Bytes::len).sum();
    if size == 0 {
        return data;
    }
    budget.left = budget.left.saturating_sub(size);
    budget.first = false;
    FetchPartitionAnswer { batches, ..data }
}

/// What is left of a response's byte bound as its partitions are answered in order.
struct Budget {
    left: usize,
    /// No partition has returned batches yet: the next may pass the bound by its first batch.
    first: bool,
}

impl Connection {
    /// Reads at once, each from its owning shard, the readable partitions of `positions`
    /// (topic, partition) a wave planned: without a wait, those not read yet, every answer
    /// awaited; with one (a long-poll round), those without batches, the first answer ending the
    /// round and the others taken as they stand.
    async fn read_all(
        &self,
        topics: &mut [(String, [u8; 16], Vec<Asked>)],
        positions: &[(usize, usize)],
        wait_ms_max: u32,
    ) {
        let mut pending = Vec::new();
        for &(topic, at) in positions {
            let a = &topics[topic].2[at];
            let (Ok(place), Some(bytes_max)) = (a.place, a.bytes_max) else { continue };
            let read = if wait_ms_max == 0 {
                a.found.is_none()
            } else {
                batch_bytes(a) == 0 && !matches!(&a.found, Some(o) if o.error != 0)
            };
            if !read {
                continue;
            }
            let args = FetchArgs {
                partition: a.index as u32,
                from: FetchFrom::Offset(u64::try_from(a.fetch_offset).unwrap_or(u64::MAX)),
                bytes_max,
                count_max: u32::MAX,
                wait_ms_max,
            };
            let (reply, answer) = flume::bounded(1);
            let work = Work::Fetch { group: place.group, args, reply };
            if self.send(place.shard, work).await.is_ok() {
                pending.push((topic, at, answer));
            }
        }
        let mut found: Vec<Option<Outcome>> = pending.iter().map(|_| None).collect();
        if wait_ms_max > 0 && !pending.is_empty() {
            // The first answer (data, or the end of its wait) ends the round; what a receiver
            // yields is kept, since it is gone from its channel once yielded.
            let mut receiving: Vec<_> =
                pending.iter().map(|(_, _, answer)| Some(answer.recv_async())).collect();
            std::future::poll_fn(|context| {
                let mut answered = false;
                for (slot, receiver) in found.iter_mut().zip(receiving.iter_mut()) {
                    if let Some(future) = receiver
                        && let Poll::Ready(outcome) = Pin::new(future).poll(context)
                    {
                        *slot = outcome.ok();
                        *receiver = None;
                        answered = true;
                    }
                }
                if answered { Poll::Ready(()) } else { Poll::Pending }
            })
            .await;
        }
        for ((topic, at, answer), slot) in pending.into_iter().zip(found) {
            let outcome = match slot {
                Some(outcome) => Some(outcome),
                None if wait_ms_max > 0 => answer.try_recv().ok(),
                None => answer.recv_async().await.ok(),
            };
            if outcome.is_some() {
                topics[topic].2[at].found = outcome;
            }
        }
    }
}
