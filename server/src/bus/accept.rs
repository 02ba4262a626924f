//! The bus port: accepts the connections of lower-indexed peers, checks each one's handshake,
//! answers with this node's own (or a `HandshakeRefused` naming the mismatch) and hands the
//! connection to that peer's link.
//!
//! Anyone can reach the port, so nothing is trusted before the handshake holds: connections
//! still handshaking are bounded, each gets `link::HANDSHAKE_TIME_MAX`, and unreadable bytes, a
//! mismatch or silence close the connection and are counted. None of it touches the shard's
//! node.

use std::cell::Cell;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;

use monoio::net::{TcpListener, TcpStream};

use super::BusSpec;
use super::counters::{BusCounters, add};
use super::identity::Peer;
use super::link::{FrameError, Link, read_handshake, write_frame};

/// Connections still handshaking at most; one more is closed at once.
const HANDSHAKING_MAX: usize = 16;

/// Accepts until the node stops; `dialed_by[n]` is the link of node `n` (lower nodes only).
pub(super) async fn run(
    spec: Rc<BusSpec>,
    listener: TcpListener,
    counters: Rc<BusCounters>,
    dialed_by: Vec<Option<Rc<Link>>>,
) {
    let dialed_by = Rc::new(dialed_by);
    let handshaking = Rc::new(Cell::new(0usize));
    while let Ok((stream, _)) = listener.accept().await {
        if spec.stop.load(Ordering::SeqCst) {
            break;
        }
        if handshaking.get() >= HANDSHAKING_MAX {
            add(&counters.connections_refused, 1);
            continue;
        }
        let _ = stream.set_nodelay(true);
        handshaking.set(handshaking.get() + 1);
        let (spec, counters, dialed_by, handshaking) = (
            Rc::clone(&spec),
            Rc::clone(&counters),
            Rc::clone(&dialed_by),
            Rc::clone(&handshaking),
        );
        monoio::spawn(async move {
            let accepted = handshake(&spec, stream).await;
            handshaking.set(handshaking.get() - 1);
            match accepted {
                Ok((peer, stream)) => {
                    let link =
                        dialed_by[peer.node as usize].as_ref().expect("check bounds the node");
                    link.serve(stream, peer).await;
                }
                Err(why) => {
                    add(&counters.connections_refused, 1);
                    tracing::warn!(shard = spec.identity.shard, %why, "bus connection refused");
                }
            }
        });
    }
}

/// Checks the dialer's handshake and answers it: this node's handshake when it holds, a
/// refusal naming the mismatch when it does not.
async fn handshake(spec: &BusSpec, mut stream: TcpStream) -> Result<(Peer, TcpStream), String> {
    let header = match read_handshake(&mut stream).await {
        Ok(header) => header,
        Err(FrameError::Closed) => return Err("closed before its handshake".into()),
        Err(FrameError::Invalid(why)) => {
            // A handshake that timed out leaves its read in flight, which holds the socket
            // open until the silent dialer acts.
            crate::connection::shut_down(stream.as_raw_fd());
            return Err(why);
        }
    };
    match spec.identity.check(&header, None) {
        Ok(peer) => {
            let formed = spec.formed.load(Ordering::SeqCst);
            if !write_frame(&mut stream, &spec.identity.handshake(formed), &[]).await {
                return Err(format!("node {} closed during the handshake", peer.node));
            }
            Ok((peer, stream))
        }
        Err(why) => {
            let (refusal, reason) = spec.identity.refusal(&why);
            let _ = write_frame(&mut stream, &refusal, &reason).await;
            Err(format!("node {}: {why}", header.replica))
        }
    }
}
