//! The run's trace: the hash of every delivery and commit in order, which shows a seed
//! reproduces bit for bit (`Outcome::trace_hash`), and the debugging print of one group's
//! replica messages (`SimOptions::trace_group`).
//!
//! It only observes: it never changes a delivery, and the hash's inputs and their order must not
//! change, or every recorded seed's hash does.

use bytes::Bytes;

use super::cluster::{Cluster, Packet};

impl Cluster {
    /// Mixes one delivery into the trace: the tick, the endpoints, and what identifies the
    /// packet (a replica message's first four bytes, a request's or reply's client and request).
    pub(super) fn trace_packet(&mut self, from: usize, to: usize, packet: &Packet) {
        let value = match packet {
            Packet::Replica(bytes) => {
                u64::from(u32::from_le_bytes(bytes[..4].try_into().unwrap_or([0; 4])))
            }
            Packet::Request { client, request, .. } => client << 32 ^ request,
            Packet::Reply { reply, .. } => reply.client << 32 ^ reply.request ^ 1 << 63,
        };
        mix(&mut self.trace, self.tick);
        mix(&mut self.trace, (from as u64) << 16 | to as u64);
        mix(&mut self.trace, value);
    }

    /// Mixes one commit a node reported into the trace.
    pub(super) fn trace_commit(&mut self, group: u64, op: u64, checksum: u32) {
        mix(&mut self.trace, group ^ (op << 8) ^ u64::from(checksum));
    }
}

/// Prints one delivered replica message of `group` (the debugging trace of `trace_group`).
pub(super) fn trace_message(tick: u64, from: usize, to: usize, group: u64, bytes: &Bytes) {
    let limits = crate::codec::CodecLimits {
        message_size_bytes_max: usize::MAX,
        view_headers_max: usize::MAX,
        commit_entries_max: usize::MAX,
    };
    let Ok((_, messages)) = crate::codec::decode(0x5ea1, bytes, &limits) else { return };
    for (g, message) in messages {
        if g != group {
            continue;
        }
        let detail = match &message {
            crate::message::Message::Prepare { header, .. } => {
                let p = header.as_prepare().expect("prepare");
                format!(
                    "op {} view {} commit {} sum {:#x}",
                    p.op, header.view, p.commit, header.checksum_header
                )
            }
            crate::message::Message::DoViewChange { headers, flags, .. } => {
                let ops: Vec<String> = headers
                    .iter()
                    .zip(flags)
                    .rev()
                    .take(4)
                    .map(|(h, f)| format!("{}@{}/{f}", h.as_prepare().expect("prepare").op, h.view))
                    .collect();
                format!("{message:?}").split(", headers").next().unwrap_or("").to_string()
                    + &format!(" top {ops:?}")
            }
            crate::message::Message::StartView { headers, .. } => {
                let ops: Vec<String> = headers
                    .iter()
                    .rev()
                    .take(4)
                    .map(|h| format!("{}@{}", h.as_prepare().expect("prepare").op, h.view))
                    .collect();
                format!("{message:?}").split(", headers").next().unwrap_or("").to_string()
                    + &format!(" top {ops:?}")
            }
            other => format!("{other:?}"),
        };
        eprintln!("{tick:>6} {from}->{to} {} {detail}", message.name());
    }
}

/// FNV-1a over the eight bytes of `value`.
fn mix(hash: &mut u64, value: u64) {
    for byte in value.to_le_bytes() {
        *hash ^= u64::from(byte);
        *hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
}
