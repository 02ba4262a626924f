//! The Fetch response, encoded by Shoal rather than the codec crate, so that each partition's
//! record batches go out as the buffers they are held in: the frame is a list of parts — the
//! size prefix, the fields between batches, the batches themselves — for one vectored write,
//! and no batch byte is copied. It writes exactly what the codec crate writes for the same
//! response (tested version by version), with what Shoal answers: no throttling, no fetch
//! session (id 0), no aborted transactions, no preferred read replica, no tagged fields.

use bytes::{BufMut, Bytes, BytesMut};
use uuid::Uuid;

use crate::header::RequestHeader;
use crate::response::EncodeError;

/// A Fetch response (versions 4–16).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FetchAnswer {
    pub error_code: i16,
    pub topics: Vec<FetchTopicAnswer>,
}

/// One topic's answer: by name up to v12, by id from v13.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchTopicAnswer {
    pub name: String,
    pub topic_id: Uuid,
    pub partitions: Vec<FetchPartitionAnswer>,
}

/// One partition's answer; `batches` are its records, whole batches as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPartitionAnswer {
    pub index: i32,
    pub error_code: i16,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    pub batches: Vec<Bytes>,
}

impl FetchAnswer {
    /// Every error code it carries (the response's, then each partition's).
    pub fn error_codes(&self) -> impl Iterator<Item = i16> + '_ {
        std::iter::once(self.error_code)
            .chain(self.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code))
    }

    /// The frame answering `header` at `version` (4–16), as parts in order; an error when it
    /// would pass Kafka's 2 GiB frame (the server bounds a response's batches far below it).
    ///
    /// # Panics
    /// If a string is longer than Kafka's bound (`i16::MAX` bytes): Shoal's topic names are
    /// far shorter.
    pub fn encode_frame(
        &self,
        header: &RequestHeader,
        version: i16,
    ) -> Result<Vec<Bytes>, EncodeError> {
        assert!((4..=16).contains(&version), "Fetch v{version} is not served");
        let flexible = version >= 12;
        let mut parts = Vec::new();
        let mut out = BytesMut::with_capacity(128);
        header.encode_response_header(&mut out);
        out.put_i32(0); // throttle_time_ms
        if version >= 7 {
            out.put_i16(self.error_code);
            out.put_i32(0); // session_id
        }
        put_len(&mut out, self.topics.len(), flexible);
        for topic in &self.topics {
            if version <= 12 {
                put_string(&mut out, &topic.name, flexible);
            } else {
                out.put_slice(topic.topic_id.as_bytes());
            }
            put_len(&mut out, topic.partitions.len(), flexible);
            for partition in &topic.partitions {
                out.put_i32(partition.index);
                out.put_i16(partition.error_code);
                out.put_i64(partition.high_watermark);
                out.put_i64(partition.last_stable_offset);
                if version >= 5 {
                    out.put_i64(partition.log_start_offset);
                }
                put_len(&mut out, 0, flexible); // aborted_transactions: none
                if version >= 11 {
                    out.put_i32(-1); // preferred_read_replica
                }
                let size: usize = partition.batches.iter().map(Bytes::len).sum();
                put_len(&mut out, size, flexible);
                if size > 0 {
                    parts.push(out.split().freeze());
                    parts.extend(partition.batches.iter().filter(|b| !b.is_empty()).cloned());
                }
                if flexible {
                    out.put_u8(0); // tagged fields
                }
            }
            if flexible {
                out.put_u8(0);
            }
        }
        if flexible {
            out.put_u8(0);
        }
        parts.push(out.freeze());
        let size: usize = parts.iter().map(Bytes::len).sum();
        let size = i32::try_from(size).map_err(|_| EncodeError {
            api_key: header.api_key,
            api_version: header.api_version,
            reason: format!("a Fetch response of {size} bytes is over 2 GiB"),
        })?;
        parts.insert(0, Bytes::copy_from_slice(&size.to_be_bytes()));
        Ok(parts)
    }
}

/// An array's or byte string's length: `i32` (classic) or unsigned varint of length + 1
/// (compact).
fn put_len(out: &mut BytesMut, len: usize, compact: bool) {
    if compact {
        put_uvarint(out, u32::try_from(len + 1).expect("a length under 4 GiB"));
    } else {
        out.put_i32(i32::try_from(len).expect("a length under 2 GiB"));
    }
}

fn put_string(out: &mut BytesMut, text: &str, compact: bool) {
    if compact {
        put_len(out, text.len(), true);
    } else {
        out.put_i16(i16::try_from(text.len()).expect("a string under 32 KiB"));
    }
    out.put_slice(text.as_bytes());
}

fn put_uvarint(out: &mut BytesMut, mut value: u32) {
    while value >= 0x80 {
        out.put_u8((value as u8) | 0x80);
        value >>= 7;
    }
    out.put_u8(value as u8);
}

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::{FetchResponse, TopicName};
    use kafka_protocol::protocol::StrBytes;

    use super::*;
    use crate::encode_frame;

    fn answer() -> FetchAnswer {
        let partition = |index, batches: Vec<Bytes>| FetchPartitionAnswer {
            index,
            error_code: 0,
            high_watermark: 900 + i64::from(index),
            last_stable_offset: 900 + i64::from(index),
            log_start_offset: 3,
            batches,
        };
        FetchAnswer {
            error_code: 0,
            topics: vec![
                FetchTopicAnswer {
                    name: "orders".into(),
                    topic_id: Uuid::from_bytes([7; 16]),
                    partitions: vec![
                        partition(0, vec![Bytes::from(vec![1u8; 300]), Bytes::from(vec![2u8; 5])]),
                        partition(1, Vec::new()),
                        FetchPartitionAnswer {
                            error_code: 1,
                            high_watermark: -1,
                            last_stable_offset: -1,
                            log_start_offset: -1,
                            ..partition(2, Vec::new())
                        },
                    ],
                },
                FetchTopicAnswer {
                    name: "x".repeat(200),
                    topic_id: Uuid::from_bytes([9; 16]),
                    partitions: vec![partition(5, vec![Bytes::from(vec![3u8; 20_000])])],
                },
            ],
        }
    }

    /// The same response as the codec crate builds it.
    fn as_codec(answer: &FetchAnswer) -> FetchResponse {
        let topics = answer
            .topics
            .iter()
            .map(|topic| {
                let partitions = topic
                    .partitions
                    .iter()
                    .map(|p| {
                        PartitionData::default()
                            .with_partition_index(p.index)
                            .with_error_code(p.error_code)
                            .with_high_watermark(p.high_watermark)
                            .with_last_stable_offset(p.last_stable_offset)
                            .with_log_start_offset(p.log_start_offset)
                            .with_records(Some(Bytes::from(p.batches.concat())))
                    })
                    .collect();
                FetchableTopicResponse::default()
                    .with_topic(TopicName(StrBytes::from_string(topic.name.clone())))
                    .with_topic_id(topic.topic_id)
                    .with_partitions(partitions)
            })
            .collect();
        FetchResponse::default()
            .with_error_code(answer.error_code)
            .with_session_id(0)
            .with_responses(topics)
    }

    #[test]
    fn every_version_is_byte_for_byte_the_codec_crates_encoding() {
        let answer = answer();
        for version in 4..=16 {
            let header = RequestHeader {
                api_key: 1,
                api_version: version,
                correlation_id: 77,
                client_id: None,
            };
            let ours: Vec<u8> = answer.encode_frame(&header, version).unwrap().concat();
            let codec = encode_frame(&header, &as_codec(&answer), version).unwrap();
            assert_eq!(ours, codec.to_vec(), "v{version}");
        }
        // Nothing at all, at the oldest and newest versions.
        let header =
            RequestHeader { api_key: 1, api_version: 4, correlation_id: 1, client_id: None };
        for version in [4, 16] {
            let empty = FetchAnswer::default();
            let codec = encode_frame(&header, &as_codec(&empty), version).unwrap();
            assert_eq!(empty.encode_frame(&header, version).unwrap().concat(), codec.to_vec());
        }
    }

    #[test]
    fn batches_are_parts_of_their_own_not_copies() {
        let answer = answer();
        let header =
            RequestHeader { api_key: 1, api_version: 12, correlation_id: 1, client_id: None };
        let parts = answer.encode_frame(&header, 12).unwrap();
        let batch = &answer.topics[1].partitions[0].batches[0];
        assert!(
            parts.iter().any(|part| part.as_ptr() == batch.as_ptr() && part.len() == batch.len()),
            "the 20,000-byte batch is sent from its own buffer"
        );
        assert_eq!(parts[0].len(), 4, "the size prefix");
        assert!(answer.error_codes().any(|code| code == 1));
    }
}
