//! The links this node opens: to every peer with a higher index, on the same shard's bus port.
//! A peer whose address is not known yet (a slot no node was added to) is looked up again every
//! [`BACKOFF_MAX`]. Each dials, handshakes, serves the connection until it ends, and dials again after a backoff
//! that doubles up to a ceiling (and starts over once a connection was made), until the node
//! stops.

use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use monoio::net::TcpStream;

use super::identity::Peer;
use super::link::{FrameError, Link, read_handshake, write_frame};

/// The first wait before dialing again, doubled per failure up to [`BACKOFF_MAX`].
const BACKOFF_MIN: Duration = Duration::from_millis(20);
const BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How long one connection attempt may take.
const CONNECT_TIME_MAX: Duration = Duration::from_secs(2);

/// Keeps the link to `link.peer` up until the node stops.
pub(super) async fn run(link: Rc<Link>) {
    let mut backoff = BACKOFF_MIN;
    let mut warned = None;
    while !link.spec.stop.load(Ordering::SeqCst) {
        match connect(&link).await {
            Ok((stream, peer)) => {
                backoff = BACKOFF_MIN;
                warned = None;
                link.serve(stream, peer).await;
                continue;
            }
            // Said once per distinct reason, not once per attempt.
            Err(Some(why)) if warned.as_ref() != Some(&why) => {
                tracing::warn!(peer = link.peer, shard = link.spec.identity.shard, %why,
                    "bus handshake failed");
                warned = Some(why);
            }
            Err(_) => {}
        }
        let known = link.spec.addresses.get(link.peer).is_some();
        link.counters.peers[usize::from(link.peer)].known.set(known);
        monoio::time::sleep(if known { backoff } else { BACKOFF_MAX }).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// One attempt: connect and handshake. `Err(None)`: the peer is not there (down or starting);
/// `Err(Some(why))`: it answered and the two do not match.
async fn connect(link: &Link) -> Result<(TcpStream, Peer), Option<String>> {
    let Some(address) = link.spec.addresses.get(link.peer) else { return Err(None) };
    let mut stream =
        match monoio::time::timeout(CONNECT_TIME_MAX, TcpStream::connect(address)).await {
            Ok(Ok(stream)) => stream,
            _ => return Err(None),
        };
    let _ = stream.set_nodelay(true);
    let formed = link.spec.formed.load(Ordering::SeqCst);
    if !write_frame(&mut stream, &link.spec.identity.handshake(formed), &[]).await {
        return Err(None);
    }
    let header = match read_handshake(&mut stream).await {
        Ok(header) => header,
        Err(FrameError::Closed) => return Err(None),
        Err(FrameError::Invalid(why)) => {
            // A timed-out read stays in flight and holds the socket open: shut it down.
            crate::connection::shut_down(stream.as_raw_fd());
            return Err(Some(why));
        }
    };
    let peer = link
        .spec
        .identity
        .check(&header, Some(link.peer))
        .map_err(|why| Some(format!("{address}: {why}")))?;
    Ok((stream, peer))
}
