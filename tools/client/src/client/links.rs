//! The client's connections and where each request goes: the open links (one per address,
//! each with the node its `Hello` named), connecting and reconnecting, one request on one link
//! within the request timeout, and the routed call that follows `NotPrimary` answers.
//!
//! A routed call goes to the node believed to lead what it is about (`Routes`), else over the
//! current connection. A `NotPrimary` answer moves it at once to the node the answer names (at
//! most [`FOLLOW_ATTEMPTS_MAX`] tries in all); `TransientNotAccepted`, a node that cannot be
//! reached, or (for a request that is harmless to repeat) a connection that broke send it again
//! after a backoff that doubles from [`FOLLOW_BACKOFF_MIN`] to [`FOLLOW_BACKOFF_MAX`] — all
//! within the request timeout (plus the wait the request itself asks for). Nothing here repeats
//! a write whose outcome is unknown.

use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_proto::protocol::{ErrorCode, NODE_UNKNOWN, Operation};

use super::{Client, Link};
use crate::connection::{HelloState, Reply};
use crate::error::{ClientError, Result};
use crate::routes::Route;
use crate::split::{ReplyReceiver, RequestSender};
use crate::transport::Transport;

/// Tries one routed call makes at most (redirects and retries together).
pub(crate) const FOLLOW_ATTEMPTS_MAX: u32 = 16;
/// The first backoff before a routed call is sent again.
pub(crate) const FOLLOW_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// The longest backoff between two tries of a routed call.
pub(crate) const FOLLOW_BACKOFF_MAX: Duration = Duration::from_secs(1);

/// How long a partition's request may be answered "no such stream, topic or partition" by a
/// node of a cluster before the client believes it: the metadata primary acknowledges a new
/// topic once a quorum holds it, and the other nodes apply it when they hear of the commit (the
/// primary's commit heartbeat goes out every 100 ms), so a client that created a topic and at
/// once sends to a partition's primary elsewhere may find it not there yet.
pub(crate) const CATALOG_LAG_MAX: Duration = Duration::from_secs(1);

/// Whether `error` may be a node's catalog lagging the metadata primary's.
pub(crate) fn is_catalog_lag(error: &ClientError) -> bool {
    matches!(
        error.code(),
        Some(ErrorCode::StreamNotFound | ErrorCode::TopicNotFound | ErrorCode::PartitionNotFound)
    )
}

/// What to do after a try of a routed call failed.
enum Next {
    /// Go at once to this node (a `NotPrimary` answer named it).
    Follow(u8),
    /// Try again after a backoff.
    Retry,
    /// Give up with the error.
    Fail,
}

impl Client {
    /// Sends one request where `route` says it belongs and waits for its reply body, following
    /// `NotPrimary` answers and retrying what is safe to retry (see the module documentation).
    /// `held` is how long the server may hold the request (a long-poll or a join).
    pub(crate) async fn call_routed(
        &mut self,
        route: &Route<'_>,
        held: Duration,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<Bytes> {
        let started = Instant::now();
        let deadline = started + self.request_timeout() + held;
        let mut backoff = FOLLOW_BACKOFF_MIN;
        let mut hint = None;
        let mut attempts = 0;
        loop {
            attempts += 1;
            let target = hint.take().or_else(|| self.routes.primary(route));
            let (answered_by, error) = match self.link_to(target, deadline).await {
                Ok(link) => {
                    let node = self.link_node(link);
                    match self.call_on(link, held, operation, body_parts).await {
                        Ok(body) => return Ok(body),
                        Err(error) => (Some(node), error),
                    }
                }
                // Nothing was sent: a cluster has other nodes to try once this one's beliefs
                // are forgotten; a single node has nowhere else to go.
                Err(error) if self.routes.is_cluster() => (None, error),
                Err(error) => return Err(error),
            };
            let next = match (&error, answered_by) {
                (_, None) => Next::Retry,
                (ClientError::NotPrimary(redirect), Some(node)) => {
                    self.routes.learn(route, redirect.primary);
                    // A node naming itself, or one the client has no address for, is no
                    // redirect: ask again after the backoff.
                    let elsewhere = redirect.primary != NODE_UNKNOWN
                        && Some(redirect.primary) != node
                        && self.routes.address(redirect.primary).is_some();
                    if elsewhere { Next::Follow(redirect.primary) } else { Next::Retry }
                }
                (error, _) if error.code() == Some(ErrorCode::TransientNotAccepted) => Next::Retry,
                (error, _) if error.breaks_connection() && is_repeatable(operation) => Next::Retry,
                (error, _)
                    if is_catalog_lag(error)
                        && matches!(route, Route::Partition { .. })
                        && self.routes.is_cluster()
                        && started.elapsed() < CATALOG_LAG_MAX =>
                {
                    Next::Retry
                }
                _ => Next::Fail,
            };
            if attempts >= FOLLOW_ATTEMPTS_MAX {
                return Err(error);
            }
            match next {
                Next::Fail => return Err(error),
                Next::Follow(node) if Instant::now() < deadline => hint = Some(node),
                Next::Retry if Instant::now() + backoff < deadline => {
                    monoio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(FOLLOW_BACKOFF_MAX);
                }
                _ => return Err(error),
            }
        }
    }

    /// One request on link `link` and its reply body, within the request timeout plus `held`.
    pub(super) async fn call_on(
        &mut self,
        link: u64,
        held: Duration,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<Bytes> {
        let timeout = self.request_timeout() + held;
        let call = self.call_on_unbounded(link, operation, body_parts);
        match monoio::time::timeout(timeout, call).await {
            Ok(result) => result,
            Err(_) => {
                // The reply may still come; the connection's state is unknown from here on.
                self.drop_link(link);
                Err(ClientError::Timeout)
            }
        }
    }

    async fn call_on_unbounded(
        &mut self,
        link: u64,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<Bytes> {
        // Requests left outstanding by a caller that gave up are answered first, in order;
        // their replies are drained here.
        while self.link(link).is_some_and(|l| !l.transport.connection.has_room()) {
            self.receive_unbounded(link).await?;
        }
        let request = self.submit_on(link, operation, body_parts).await?;
        loop {
            let reply = self.receive_unbounded(link).await?;
            if reply.request == request {
                return reply.result;
            }
        }
    }

    /// Queues and writes one request on `link`; returns its number. A failed write drops the
    /// link.
    async fn submit_on(
        &mut self,
        link: u64,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<u64> {
        let next_request = self.next_request;
        let Some(open) = self.links.iter_mut().find(|l| l.id == link) else {
            return Err(ClientError::Closed);
        };
        let connection = &mut open.transport.connection;
        connection.continue_numbering(next_request);
        let request = connection.request(operation, body_parts)?;
        self.next_request = connection.next_request();
        if let Err(error) = open.transport.write_pending().await {
            self.drop_link(link);
            return Err(error);
        }
        Ok(request)
    }

    /// The next reply on `link`. A failure drops the link: every request still outstanding on
    /// it is lost.
    async fn receive_unbounded(&mut self, link: u64) -> Result<Reply> {
        let Some(open) = self.links.iter_mut().find(|l| l.id == link) else {
            return Err(ClientError::Closed);
        };
        match open.transport.read_reply().await {
            Ok(reply) => {
                if open.transport.connection.is_failed() {
                    // The server closes the connection after this reply (InvalidFrame,
                    // UnsupportedVersion): reconnect next time rather than write into it.
                    self.drop_link(link);
                }
                Ok(reply)
            }
            Err(error) => {
                self.drop_link(link);
                Err(error)
            }
        }
    }

    // -- Pipelining on routed links (the producer) ----------------------------------------------

    /// Queues and writes one request where `route` says it belongs, without waiting for its
    /// reply; returns the link it went out on and its request number. Collect the reply with
    /// [`Client::receive_on`] on that link (replies come in request order per link).
    pub(crate) async fn submit_routed(
        &mut self,
        route: &Route<'_>,
        operation: Operation,
        body_parts: &[&[u8]],
    ) -> Result<(u64, u64)> {
        let target = self.routes.primary(route);
        let timeout = self.request_timeout();
        let link = self.link_to(target, Instant::now() + timeout).await?;
        match monoio::time::timeout(timeout, self.submit_on(link, operation, body_parts)).await {
            Ok(result) => result.map(|request| (link, request)),
            Err(_) => {
                self.drop_link(link);
                Err(ClientError::Timeout)
            }
        }
    }

    /// The next reply on `link`, within the request timeout. A failure drops the link.
    pub(crate) async fn receive_on(&mut self, link: u64) -> Result<Reply> {
        match monoio::time::timeout(self.request_timeout(), self.receive_unbounded(link)).await {
            Ok(result) => result,
            Err(_) => {
                self.drop_link(link);
                Err(ClientError::Timeout)
            }
        }
    }

    /// A server said `primary` leads what `route` is about.
    pub(crate) fn learn(&mut self, route: &Route<'_>, primary: u8) {
        self.routes.learn(route, primary);
    }

    /// Whether link `link` is open and usable.
    pub(crate) fn link_alive(&self, link: u64) -> bool {
        self.link(link).is_some_and(|l| !l.transport.connection.is_failed())
    }

    // -- The current connection ------------------------------------------------------------------

    /// Queues and writes one request on the current connection without waiting for its reply;
    /// returns its request number. Reconnects first if there is no live connection. The caller
    /// must collect the reply with [`Client::receive`] (replies come in request order) and keep
    /// at most `in_flight_max` requests outstanding ([`Client::has_room`]); pipelining tools
    /// (the load tool) use this pair. It goes wherever the connection is: nothing is routed.
    pub async fn submit(&mut self, operation: Operation, body_parts: &[&[u8]]) -> Result<u64> {
        let timeout = self.request_timeout();
        let link = self.link_to(None, Instant::now() + timeout).await?;
        match monoio::time::timeout(timeout, self.submit_on(link, operation, body_parts)).await {
            Ok(result) => result,
            Err(_) => {
                self.drop_link(link);
                Err(ClientError::Timeout)
            }
        }
    }

    /// The next reply on the current connection, within the request timeout. A failure drops
    /// the connection: every request still outstanding on it is lost.
    pub async fn receive(&mut self) -> Result<Reply> {
        let Some(link) = self.current else { return Err(ClientError::Closed) };
        self.receive_on(link).await
    }

    /// Splits the current connection into its writing and reading halves (see
    /// [`RequestSender`]), connecting first if there is none. The halves keep this client's
    /// request timeout but never reconnect or follow a primary: after a failure, connect a new
    /// client.
    pub async fn into_split(mut self) -> Result<(RequestSender, ReplyReceiver)> {
        let timeout = self.request_timeout();
        let link = self.link_to(None, Instant::now() + timeout).await?;
        let index = self.links.iter().position(|l| l.id == link).ok_or(ClientError::Closed)?;
        let (stream, connection) = self.links.swap_remove(index).transport.into_parts();
        Ok(crate::split::split(stream, connection, timeout))
    }

    /// Requests outstanding on the current connection.
    pub fn in_flight(&self) -> usize {
        self.current.and_then(|id| self.link(id)).map_or(0, |l| l.transport.connection.in_flight())
    }

    /// Whether the current connection may take another request now (`true` without one: the
    /// next submit reconnects).
    pub fn has_room(&self) -> bool {
        self.current.and_then(|id| self.link(id)).is_none_or(|l| l.transport.connection.has_room())
    }

    // -- Links -----------------------------------------------------------------------------------

    fn link(&self, id: u64) -> Option<&Link> {
        self.links.iter().find(|l| l.id == id)
    }

    /// The node link `id`'s `Hello` named.
    pub(crate) fn link_node(&self, id: u64) -> Option<u8> {
        self.link(id).and_then(|l| l.node)
    }

    fn drop_link(&mut self, id: u64) {
        self.links.retain(|l| l.id != id);
        if self.current == Some(id) {
            self.current = None;
        }
    }

    /// A live link to node `node` (the current connection if it is one, else any, else a new
    /// one to the node's address), or with no node the current connection (reconnecting if
    /// there is none). A node that cannot be reached is forgotten as anyone's primary.
    /// Connecting counts towards the call's `deadline`: past it, no further address is tried.
    pub(super) async fn link_to(&mut self, node: Option<u8>, deadline: Instant) -> Result<u64> {
        if let Some(node) = node {
            let serves = |l: &Link| l.node == Some(node) && !l.transport.connection.is_failed();
            if let Some(id) = self.current.filter(|&id| self.link(id).is_some_and(serves)) {
                return Ok(id);
            }
            if let Some(link) = self.links.iter().find(|l| serves(l)) {
                return Ok(link.id);
            }
            if let Some(address) = self.routes.address(node).map(str::to_string) {
                return match self.open_link_by(&address, Some(deadline)).await {
                    Ok(id) => Ok(id),
                    // A call that ran out of time says nothing of the node.
                    Err(error) if Instant::now() >= deadline => Err(error),
                    Err(error) => {
                        self.routes.forget_node(node);
                        Err(error)
                    }
                };
            }
        }
        if let Some(id) = self.current.filter(|&id| self.link_alive(id)) {
            return Ok(id);
        }
        self.reconnect(Some(deadline)).await?;
        self.current.ok_or(ClientError::Closed)
    }

    /// [`Self::open_link`] within `deadline` when there is one ([`ClientError::Timeout`]
    /// past it).
    async fn open_link_by(&mut self, address: &str, deadline: Option<Instant>) -> Result<u64> {
        let Some(deadline) = deadline else { return self.open_link(address).await };
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(ClientError::Timeout);
        }
        let opened = monoio::time::timeout(left, self.open_link(address)).await;
        opened.unwrap_or(Err(ClientError::Timeout))
    }

    /// Opens a link to `address` (replacing a dead one there), learning the cluster's nodes
    /// from its `Hello`; the current connection if there was none.
    async fn open_link(&mut self, address: &str) -> Result<u64> {
        self.links.retain(|l| l.address != address);
        let transport = self.open(address).await?;
        let hello = match transport.connection.hello_state() {
            HelloState::Done(hello) => Some(hello.clone()),
            _ => None,
        };
        if let Some(hello) = &hello {
            self.routes.learn_nodes(hello, address);
        }
        let id = self.next_link;
        self.next_link += 1;
        let node = hello.as_ref().filter(|h| h.version >= 3).map(|h| h.node);
        self.links.push(Link { id, address: address.to_string(), node, transport });
        if self.current.is_none_or(|current| !self.link_alive(current)) {
            self.make_current(id);
        }
        Ok(id)
    }

    fn make_current(&mut self, id: u64) {
        let Some(link) = self.links.iter().find(|l| l.id == id) else { return };
        self.current = Some(id);
        self.address = Some(link.address.clone());
        if let HelloState::Done(hello) = link.transport.connection.hello_state() {
            self.server = Some(hello.clone());
        }
    }

    /// Drops the current connection and connects anew: to the chosen shard address, else to
    /// the first that completes the handshake of the seeds (starting with the one that worked
    /// last) and every node a `Hello` named — within `deadline` when one is given (the initial
    /// connect has none: it tries only the seeds, each within the connect timeout).
    pub(super) async fn reconnect(&mut self, deadline: Option<Instant>) -> Result<()> {
        if let Some(id) = self.current.take() {
            self.drop_link(id);
        }
        if let Some(address) = self.preferred.clone() {
            match self.open_link_by(&address, deadline).await {
                Ok(id) => {
                    self.make_current(id);
                    return Ok(());
                }
                // A call that ran out of time says nothing of the address.
                Err(error) if deadline.is_some_and(|deadline| Instant::now() >= deadline) => {
                    return Err(error);
                }
                // Stale or unreachable (a restarted server may listen elsewhere): the seeds
                // are the way back, and the next connect_to_shard learns the address anew.
                Err(_) => self.preferred = None,
            }
        }
        let seeds = self.config.seeds.len();
        if seeds == 0 {
            return Err(ClientError::Invalid("no server address to connect to".into()));
        }
        let mut candidates: Vec<(Option<usize>, String)> = (0..seeds)
            .map(|attempt| (self.seed_first + attempt) % seeds)
            .map(|index| (Some(index), self.config.seeds[index].clone()))
            .collect();
        for address in self.routes.addresses() {
            if !candidates.iter().any(|(_, known)| known == address) {
                candidates.push((None, address.to_string()));
            }
        }
        let mut last_error = None;
        for (seed, address) in candidates {
            let live = self.links.iter().find(|l| l.address == address).map(|l| l.id);
            let opened = match live.filter(|&id| self.link_alive(id)) {
                Some(id) => Ok(id),
                None => self.open_link_by(&address, deadline).await,
            };
            match opened {
                Ok(id) => {
                    self.make_current(id);
                    if let Some(index) = seed {
                        self.seed_first = index;
                    }
                    return Ok(());
                }
                Err(error) => last_error = Some(error),
            }
        }
        Err(last_error.unwrap_or(ClientError::Closed))
    }

    /// One address: TCP connect and `Hello`, carrying the client's session and request
    /// numbering.
    async fn open(&mut self, address: &str) -> Result<Transport> {
        let connect_timeout = Duration::from_millis(self.config.connect_timeout_ms.max(1));
        let config = self.config.connection(self.client_id);
        let mut transport =
            match monoio::time::timeout(connect_timeout, Transport::connect(address, config)).await
            {
                Ok(result) => result?,
                Err(_) => {
                    return Err(ClientError::io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("connect to {address}: no answer within {connect_timeout:?}"),
                    )));
                }
            };
        transport.connection.set_session(self.session);
        transport.connection.continue_numbering(self.next_request);
        transport.connection.hello(&self.config.client_name)?;
        let handshake =
            match monoio::time::timeout(self.request_timeout(), transport.round_trip()).await {
                Ok(reply) => reply.and_then(|reply| reply.result.map(drop)),
                Err(_) => Err(ClientError::Timeout),
            };
        self.next_request = self.next_request.max(transport.connection.next_request());
        handshake?;
        Ok(transport)
    }
}

/// Whether sending `operation` twice does no harm (it reads, or refreshes a liveness lease),
/// so a routed call may send it again after its connection broke.
fn is_repeatable(operation: Operation) -> bool {
    matches!(
        operation,
        Operation::ListStreams
            | Operation::ListTopics
            | Operation::DescribeTopic
            | Operation::Status
            | Operation::Fetch
            | Operation::GetOffset
            | Operation::Heartbeat
    )
}
