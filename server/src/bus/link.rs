//! One peer's link: the frames of its current connection, read and written by two tasks, and the
//! handshake exchange both ends run first.
//!
//! A frame is read by its header's `size` only after the header's checksum holds, and only when
//! the size is within the bound: a peer can never make this side allocate more than
//! `frame_size_bytes_max`. A newer connection from the same peer takes over from the older one
//! (whose tasks end), so a restarted peer is never shut out by a half-open socket. Nothing here
//! decodes a replica message; the node layer does.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncReadRentExt, AsyncWriteRentExt, Splitable};
use monoio::net::TcpStream;
use shoal_proto::wire::{HANDSHAKE_REASON_BYTES_MAX, HEADER_SIZE, Header};

use super::BusSpec;
use super::counters::{BusCounters, add};
use super::identity::Peer;

/// How long a connection may take to send its handshake.
pub(super) const HANDSHAKE_TIME_MAX: Duration = Duration::from_secs(5);

/// Bytes a link gathers from its queue into one write at most.
const WRITE_GATHER_BYTES_MAX: usize = 1 << 20;

/// One peer's link and the queue of packets waiting for it.
pub(super) struct Link {
    pub(super) spec: Rc<BusSpec>,
    pub(super) peer: u8,
    queue: flume::Receiver<Bytes>,
    pub(super) counters: Rc<BusCounters>,
    /// The current connection's cancel handle: dropping it ends that connection's tasks.
    current: RefCell<Option<flume::Sender<()>>>,
    /// Counts connections served, so a connection that ends knows whether it was the current one.
    generation: Cell<u64>,
}

/// Why a frame could not be read.
pub(super) enum FrameError {
    /// The connection ended or failed.
    Closed,
    /// The bytes are not a trustworthy frame: the connection must be closed.
    Invalid(String),
}

impl Link {
    pub(super) fn new(
        spec: Rc<BusSpec>,
        peer: u8,
        queue: flume::Receiver<Bytes>,
        counters: Rc<BusCounters>,
    ) -> Rc<Link> {
        Rc::new(Link {
            spec,
            peer,
            queue,
            counters,
            current: RefCell::new(None),
            generation: Cell::new(0),
        })
    }

    /// Serves an established connection, handshaken with `peer`, until it fails, the node stops,
    /// or a newer connection to the same peer takes over.
    pub(super) async fn serve(self: &Rc<Self>, stream: TcpStream, peer_said: Peer) {
        let (cancel, cancelled) = flume::bounded::<()>(1);
        // Replacing the older connection's handle ends its tasks.
        self.current.replace(Some(cancel));
        let generation = self.generation.get() + 1;
        self.generation.set(generation);
        let peer = &self.counters.peers[self.peer as usize];
        peer.formed.set(Some(peer_said.formed));
        if peer.ever_connected.replace(true) {
            add(&peer.reconnects, 1);
        }
        peer.connected.set(true);
        peer.known.set(true);
        let (mut reader, writer) = stream.into_split();
        let (reader_alive, reader_gone) = flume::bounded::<()>(1);
        let (writer_alive, writer_gone) = flume::bounded::<()>(1);
        monoio::spawn(Rc::clone(self).write(writer, cancelled.clone(), reader_gone, writer_alive));
        let mut header = vec![0u8; HEADER_SIZE];
        loop {
            let frame = monoio::select! {
                frame = read_frame(&mut reader, header, self.spec.frame_size_bytes_max) => frame,
                _ = cancelled.recv_async() => break,
                _ = writer_gone.recv_async() => break,
            };
            let (result, buffer) = frame;
            header = buffer;
            match result {
                Ok((_, packet)) => {
                    add(&peer.received_bytes, packet.len() as u64);
                    add(&peer.received_packets, 1);
                    if !super::deliver(&self.spec.inbox, self.peer, packet) {
                        add(&peer.dropped_packets, 1);
                    }
                }
                Err(FrameError::Closed) => break,
                Err(FrameError::Invalid(why)) => {
                    add(&self.counters.frames_rejected, 1);
                    tracing::warn!(peer = self.peer, shard = self.spec.identity.shard, %why,
                        "bus frame rejected: closing the link");
                    break;
                }
            }
        }
        drop(reader_alive);
        // Still this link's connection (no newer one took over): it is down now.
        if self.generation.get() == generation {
            self.current.replace(None);
            peer.connected.set(false);
            // What waits for the peer now is stale by the time it is back (see `transport`).
            let stale = self.queue.drain().count();
            add(&peer.dropped_packets, stale as u64);
            peer.queued_bytes.set(0);
        }
    }

    /// Writes the queue out, gathering what is waiting into one write, until the connection
    /// fails or its reader ends.
    async fn write(
        self: Rc<Self>,
        mut writer: monoio::net::tcp::TcpOwnedWriteHalf,
        cancelled: flume::Receiver<()>,
        reader_gone: flume::Receiver<()>,
        _alive: flume::Sender<()>,
    ) {
        let peer = &self.counters.peers[self.peer as usize];
        let mut out = Vec::with_capacity(64 << 10);
        loop {
            let first = monoio::select! {
                packet = self.queue.recv_async() => packet,
                _ = cancelled.recv_async() => return,
                _ = reader_gone.recv_async() => return,
            };
            let Ok(first) = first else { return };
            out.clear();
            out.extend_from_slice(&first);
            let mut packets = 1;
            while out.len() < WRITE_GATHER_BYTES_MAX {
                match self.queue.try_recv() {
                    Ok(packet) => {
                        out.extend_from_slice(&packet);
                        packets += 1;
                    }
                    Err(_) => break,
                }
            }
            peer.queued_bytes.set(peer.queued_bytes.get().saturating_sub(out.len() as u64));
            let (result, buffer) = writer.write_all(out).await;
            out = buffer;
            if result.is_err() {
                return;
            }
            add(&peer.sent_bytes, out.len() as u64);
            add(&peer.sent_packets, packets);
        }
    }
}

/// Reads one frame: the header, checked, then the body its size announces (within
/// `frame_size_bytes_max`); returns the decoded header with the whole frame. Gives the header
/// buffer back for the next frame.
pub(super) async fn read_frame<R: AsyncReadRent>(
    reader: &mut R,
    header_buffer: Vec<u8>,
    frame_size_bytes_max: usize,
) -> (Result<(Header, Bytes), FrameError>, Vec<u8>) {
    let (result, header_buffer) = reader.read_exact(header_buffer).await;
    if result.is_err() {
        return (Err(FrameError::Closed), header_buffer);
    }
    let bytes: &[u8; HEADER_SIZE] = header_buffer[..].try_into().expect("a header's size");
    let header = match Header::decode(bytes) {
        Ok(header) => header,
        Err(error) => {
            return (Err(FrameError::Invalid(format!("bad header: {error}"))), header_buffer);
        }
    };
    let size = header.size as usize;
    if !(HEADER_SIZE..=frame_size_bytes_max).contains(&size) {
        let why =
            format!("a frame of {size} bytes is outside {HEADER_SIZE}..={frame_size_bytes_max}");
        return (Err(FrameError::Invalid(why)), header_buffer);
    }
    let mut packet = Vec::with_capacity(size);
    packet.extend_from_slice(&header_buffer);
    packet.resize(size, 0);
    if size > HEADER_SIZE {
        let (result, slice) = reader.read_exact(packet.slice_mut(HEADER_SIZE..size)).await;
        packet = slice.into_inner();
        if result.is_err() {
            return (Err(FrameError::Closed), header_buffer);
        }
        if let Err(error) = header.verify_body(&packet[HEADER_SIZE..]) {
            return (Err(FrameError::Invalid(format!("bad body: {error}"))), header_buffer);
        }
    }
    (Ok((header, Bytes::from(packet))), header_buffer)
}

/// Reads the peer's handshake (or its refusal) within [`HANDSHAKE_TIME_MAX`].
pub(super) async fn read_handshake<R: AsyncReadRent>(reader: &mut R) -> Result<Header, FrameError> {
    let limit = HEADER_SIZE + HANDSHAKE_REASON_BYTES_MAX;
    let Ok((result, _)) = monoio::time::timeout(
        HANDSHAKE_TIME_MAX,
        read_frame(reader, vec![0u8; HEADER_SIZE], limit),
    )
    .await
    else {
        return Err(FrameError::Invalid(format!("no handshake within {HANDSHAKE_TIME_MAX:?}")));
    };
    let (header, packet) = result?;
    if header.as_handshake_refused().is_some() {
        let reason = String::from_utf8_lossy(&packet[HEADER_SIZE..]).into_owned();
        return Err(FrameError::Invalid(format!("refused by node {}: {reason}", header.replica)));
    }
    Ok(header)
}

/// Writes `header` and `body` as one frame.
pub(super) async fn write_frame(stream: &mut TcpStream, header: &Header, body: &[u8]) -> bool {
    let mut frame = Vec::with_capacity(HEADER_SIZE + body.len());
    frame.extend_from_slice(&header.encode());
    frame.extend_from_slice(body);
    stream.write_all(frame).await.0.is_ok()
}
