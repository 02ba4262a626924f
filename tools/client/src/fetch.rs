//! A fetch result and the records in it, sans-IO.
//!
//! [`Fetched`] owns one `Fetch` reply: its fixed part (`FetchReply`) and the concatenated Kafka
//! RecordBatch v2 batches that follow it, held as one `Bytes` view of the reply frame (no copy).
//! Building a `Fetched` checks the batches' framing up front — exactly `batch_count` whole
//! batches, each with a valid header and CRC, nothing after them — so iterating later meets only
//! record-level damage. [`Fetched::records`] walks the records as `(offset, timestamp, key,
//! value)` and skips those before the requested position (a fetch returns the whole batch that
//! contains the requested offset).
//!
//! It never copies record bytes (keys and values borrow from the reply), never decompresses (a
//! compressed batch is reported as unsupported), and never panics on server bytes.

use bytes::Bytes;
use shoal_proto::batch::{self, BatchError, BatchHeader, BatchLimits, HeaderIter, RecordIter};
use shoal_proto::protocol::{FetchFrom, FetchReply};

use crate::error::{ClientError, Result};

/// One fetch's result: the partition's offsets and the batches returned.
#[derive(Clone, Debug)]
pub struct Fetched {
    /// The fixed part: partition, first and next (log end) offsets, batch count.
    pub reply: FetchReply,
    /// The batches, concatenated, as the server stores them (base offsets stamped).
    pub batches: Bytes,
    /// Where the caller asked to start; records before it are skipped by `records`.
    pub from: FetchFrom,
}

/// One record of a fetched batch, borrowing from the reply.
#[derive(Clone, Debug)]
pub struct FetchedRecord<'a> {
    /// The record's offset in its partition.
    pub offset: u64,
    /// The record's timestamp, milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The key, `None` when null.
    pub key: Option<&'a [u8]>,
    /// The value, `None` when null.
    pub value: Option<&'a [u8]>,
    /// The record's headers as `(key, value)` pairs.
    pub headers: HeaderIter<'a>,
}

/// No bound of its own here: the reply frame limit already bounds every batch.
const FETCH_BATCH_LIMITS: BatchLimits =
    BatchLimits { batch_size_bytes_max: u32::MAX, record_count_max: u32::MAX };

impl Fetched {
    /// Checks the framing of `batches` against `reply.batch_count` and keeps them.
    pub fn new(reply: FetchReply, batches: Bytes, from: FetchFrom) -> Result<Fetched> {
        let mut rest: &[u8] = &batches;
        for index in 0..reply.batch_count {
            let batch = split_batch(&mut rest)
                .map_err(|reason| protocol(format!("fetched batch {index}: {reason}")))?;
            match batch::validate_header_only(batch, &FETCH_BATCH_LIMITS) {
                // A control batch (from a transactional Kafka producer) passed its CRC check
                // before it was recognised; it carries no records for a reader.
                Ok(_) | Err(BatchError::ControlBatch) => {}
                Err(error) => return Err(protocol(format!("fetched batch {index}: {error}"))),
            }
        }
        if !rest.is_empty() {
            return Err(protocol(format!(
                "{} bytes after the {} batches the fetch reply announced",
                rest.len(),
                reply.batch_count
            )));
        }
        Ok(Fetched { reply, batches, from })
    }

    /// The records from the requested position on, in offset order. After an error the iterator
    /// ends.
    pub fn records(&self) -> Records<'_> {
        let start = match self.from {
            FetchFrom::Offset(offset) => Start::Offset(offset),
            FetchFrom::First => Start::Offset(self.reply.first_offset),
            FetchFrom::Last => Start::Offset(self.reply.next_offset.saturating_sub(1)),
            FetchFrom::Timestamp(time_ms) => Start::Timestamp(time_ms),
        };
        Records {
            rest: &self.batches,
            batches_left: self.reply.batch_count,
            current: None,
            start,
            done: false,
        }
    }

    /// The offset after the last record of the last batch returned (where the next fetch should
    /// start), or `None` when no batch was returned.
    pub fn end_offset(&self) -> Option<u64> {
        let mut rest: &[u8] = &self.batches;
        let mut end = None;
        for _ in 0..self.reply.batch_count {
            let Ok(batch) = split_batch(&mut rest) else { break };
            let Ok(header) = BatchHeader::parse(batch) else { break };
            let last = u64::try_from(header.base_offset())
                .ok()
                .and_then(|base| base.checked_add(u64::try_from(header.last_offset_delta()).ok()?));
            end = last.and_then(|last| last.checked_add(1)).or(end);
        }
        end
    }

    /// Whether no batch was returned.
    pub fn is_empty(&self) -> bool {
        self.reply.batch_count == 0
    }
}

/// Takes one whole batch off the front of `rest`, bounded by what is there.
fn split_batch<'a>(rest: &mut &'a [u8]) -> std::result::Result<&'a [u8], String> {
    let header = BatchHeader::parse(rest).map_err(|e| e.to_string())?;
    if header.base_offset() < 0 {
        return Err(format!("negative base offset {}", header.base_offset()));
    }
    let size = header.total_size();
    let (batch, after) = rest
        .split_at_checked(size)
        .ok_or_else(|| format!("declares {size} bytes, only {} remain", rest.len()))?;
    *rest = after;
    Ok(batch)
}

fn protocol(reason: String) -> ClientError {
    ClientError::Protocol(reason)
}

#[derive(Clone, Copy, Debug)]
enum Start {
    /// Skip records below this offset.
    Offset(u64),
    /// Skip leading records stamped before this time; once one is at or after it, yield all.
    Timestamp(i64),
}

/// Iterator over a [`Fetched`]'s records, from [`Fetched::records`].
#[derive(Debug)]
pub struct Records<'a> {
    rest: &'a [u8],
    batches_left: u32,
    current: Option<CurrentBatch<'a>>,
    start: Start,
    done: bool,
}

#[derive(Debug)]
struct CurrentBatch<'a> {
    records: RecordIter<'a>,
    base_offset: u64,
    base_timestamp_ms: i64,
}

impl<'a> Records<'a> {
    /// Opens the next batch with records, skipping control batches.
    fn open_next_batch(&mut self) -> Result<bool> {
        while self.batches_left > 0 {
            self.batches_left -= 1;
            // `Fetched::new` checked the framing; these only fail on bytes it already refused.
            let batch = split_batch(&mut self.rest).map_err(protocol)?;
            let header = BatchHeader::parse(batch).map_err(|e| protocol(e.to_string()))?;
            if header.is_control() {
                continue;
            }
            let records = batch::records(batch).map_err(|error| match error {
                BatchError::Compressed(codec) => protocol(format!(
                    "a {codec:?}-compressed batch at offset {}: this client does not decompress",
                    header.base_offset()
                )),
                other => protocol(other.to_string()),
            })?;
            self.current = Some(CurrentBatch {
                records,
                base_offset: u64::try_from(header.base_offset()).unwrap_or(0),
                base_timestamp_ms: header.base_timestamp(),
            });
            return Ok(true);
        }
        Ok(false)
    }

    fn next_record(&mut self) -> Result<Option<FetchedRecord<'a>>> {
        loop {
            if self.current.is_none() && !self.open_next_batch()? {
                return Ok(None);
            }
            let Some(current) = self.current.as_mut() else { return Ok(None) };
            let Some(record) = current.records.next() else {
                self.current = None;
                continue;
            };
            let record = record.map_err(|e| protocol(format!("fetched record: {e}")))?;
            // Offset deltas are checked non-negative (equal to the record's index) by the
            // iterator.
            let offset_delta = u64::try_from(record.offset_delta).unwrap_or(0);
            let record = FetchedRecord {
                offset: current.base_offset.saturating_add(offset_delta),
                timestamp_ms: current.base_timestamp_ms.wrapping_add(record.timestamp_delta),
                key: record.key,
                value: record.value,
                headers: record.headers,
            };
            match self.start {
                Start::Offset(offset) if record.offset < offset => continue,
                Start::Timestamp(time_ms) if record.timestamp_ms < time_ms => continue,
                Start::Timestamp(_) => self.start = Start::Offset(0),
                Start::Offset(_) => {}
            }
            return Ok(Some(record));
        }
    }
}

impl<'a> Iterator for Records<'a> {
    type Item = Result<FetchedRecord<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_record() {
            Ok(Some(record)) => Some(Ok(record)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(error) => {
                self.done = true;
                Some(Err(error))
            }
        }
    }
}

impl std::iter::FusedIterator for Records<'_> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::batch_of;

    /// Two batches: offsets 10..13 (values "a".."c") and 13..15 ("d", "e"), timestamps 100 + i.
    fn two_batches() -> (FetchReply, Bytes) {
        let mut bytes = Vec::new();
        bytes.extend(batch_of(10, 100, &["a", "b", "c"]));
        bytes.extend(batch_of(13, 103, &["d", "e"]));
        let reply = FetchReply { partition: 0, first_offset: 10, next_offset: 15, batch_count: 2 };
        (reply, Bytes::from(bytes))
    }

    fn values(fetched: &Fetched) -> Vec<(u64, i64, String)> {
        fetched
            .records()
            .map(|r| {
                let r = r.unwrap();
                (r.offset, r.timestamp_ms, String::from_utf8(r.value.unwrap().to_vec()).unwrap())
            })
            .collect()
    }

    #[test]
    fn fetch_records_carry_offsets_and_timestamps_and_skip_before_the_start() {
        let (reply, bytes) = two_batches();
        let all = Fetched::new(reply, bytes.clone(), FetchFrom::First).unwrap();
        assert_eq!(
            values(&all),
            [
                (10, 100, "a".into()),
                (11, 101, "b".into()),
                (12, 102, "c".into()),
                (13, 103, "d".into()),
                (14, 104, "e".into())
            ]
        );
        assert_eq!(all.end_offset(), Some(15));
        let from_11 = Fetched::new(reply, bytes.clone(), FetchFrom::Offset(11)).unwrap();
        assert_eq!(values(&from_11).first().map(|v| v.0), Some(11));
        assert_eq!(values(&from_11).len(), 4);
        let last = Fetched::new(reply, bytes.clone(), FetchFrom::Last).unwrap();
        assert_eq!(values(&last), [(14, 104, "e".into())]);
        let by_time = Fetched::new(reply, bytes, FetchFrom::Timestamp(102)).unwrap();
        assert_eq!(values(&by_time).first().map(|v| v.0), Some(12));
    }

    #[test]
    fn fetch_framing_is_checked_before_any_record_is_read() {
        let (reply, bytes) = two_batches();
        // Fewer batches than announced, more bytes than announced, a torn batch, a bad CRC.
        let more = FetchReply { batch_count: 3, ..reply };
        assert!(matches!(
            Fetched::new(more, bytes.clone(), FetchFrom::First),
            Err(ClientError::Protocol(_))
        ));
        let fewer = FetchReply { batch_count: 1, ..reply };
        assert!(Fetched::new(fewer, bytes.clone(), FetchFrom::First).is_err());
        for len in 0..bytes.len() {
            assert!(Fetched::new(reply, bytes.slice(..len), FetchFrom::First).is_err(), "{len}");
        }
        let mut corrupt = bytes.to_vec();
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert!(Fetched::new(reply, Bytes::from(corrupt), FetchFrom::First).is_err());
        // Every single-byte corruption either is refused or iterates without panicking.
        for position in 0..bytes.len() {
            let mut damaged = bytes.to_vec();
            damaged[position] ^= 0x5a;
            if let Ok(fetched) = Fetched::new(reply, Bytes::from(damaged), FetchFrom::First) {
                let _ = fetched.records().count();
                let _ = fetched.end_offset();
            }
        }
        let empty = FetchReply { batch_count: 0, ..reply };
        let fetched = Fetched::new(empty, Bytes::new(), FetchFrom::First).unwrap();
        assert!(fetched.is_empty());
        assert_eq!(fetched.records().count(), 0);
        assert_eq!(fetched.end_offset(), None);
    }
}
