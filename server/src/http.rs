//! The metrics endpoint's HTTP/1.1 server: just enough HTTP to answer `GET /metrics` (and `HEAD`)
//! on shard 0's runtime, one request per connection (`Connection: close`).
//!
//! It owns the socket side: accepting within [`CONNECTIONS_MAX`], reading a request head of at
//! most [`HEAD_BYTES_MAX`] within [`HEAD_READ_TIME_MAX`], parsing it strictly, and writing the
//! status line, headers and body within [`WRITE_TIME_MAX`]. Malformed input gets 400, an
//! oversized head 431, a head not sent in time 408, another path 404, another method 405.
//! Whatever the client sends, it costs at most one bounded buffer and one task for a bounded
//! time, and never panics. It never knows what the page says: the [`Page`] it is given renders
//! the body (`metrics::Exporter`), and it never touches a shard's state itself.

use std::cell::Cell;
use std::future::Future;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use monoio::buf::IoBufMut;
use monoio::io::{AsyncReadRent, AsyncWriteRent, AsyncWriteRentExt};
use monoio::net::{TcpListener, TcpStream};

/// Largest request head (request line and headers) read before parsing; one byte more is 431.
pub const HEAD_BYTES_MAX: usize = 8 << 10;

/// Time a client has to send its whole request head, counted from the accept, so a client that
/// trickles bytes cannot hold a connection place longer than a silent one.
pub const HEAD_READ_TIME_MAX: Duration = Duration::from_secs(5);

/// Time the response may take to write; a client that stops reading loses its connection.
pub const WRITE_TIME_MAX: Duration = Duration::from_secs(10);

/// Metrics connections served at once; one more is closed at once, unanswered (answering would
/// cost the very task and buffer the bound is there to cap). A scraper needs one.
pub const CONNECTIONS_MAX: usize = 8;

/// What a client still sends after its response is read and discarded for at most this many
/// bytes and this long, so that closing does not reset the connection before the client has read
/// the response (a close with unread input sends a reset, which discards unread data).
const DRAIN_BYTES_MAX: usize = 64 << 10;
const DRAIN_TIME_MAX: Duration = Duration::from_secs(1);

/// The pause after a failed accept.
const ACCEPT_RETRY_DELAY: Duration = Duration::from_millis(50);

/// The path served.
pub const METRICS_PATH: &str = "/metrics";

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The statuses the endpoint answers with, in the order [`HttpStats::responses`] counts them.
pub const STATUSES: [Status; 6] = [
    Status::Ok,
    Status::BadRequest,
    Status::NotFound,
    Status::MethodNotAllowed,
    Status::RequestTimeout,
    Status::HeadTooLarge,
];

/// A response status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    BadRequest,
    NotFound,
    MethodNotAllowed,
    RequestTimeout,
    HeadTooLarge,
}

impl Status {
    /// The status code.
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 200,
            Status::BadRequest => 400,
            Status::NotFound => 404,
            Status::MethodNotAllowed => 405,
            Status::RequestTimeout => 408,
            Status::HeadTooLarge => 431,
        }
    }

    fn reason(self) -> &'static str {
        match self {
            Status::Ok => "OK",
            Status::BadRequest => "Bad Request",
            Status::NotFound => "Not Found",
            Status::MethodNotAllowed => "Method Not Allowed",
            Status::RequestTimeout => "Request Timeout",
            Status::HeadTooLarge => "Request Header Fields Too Large",
        }
    }

    fn index(self) -> usize {
        STATUSES.iter().position(|&status| status == self).unwrap_or(0)
    }
}

/// What the endpoint has answered so far (shown on the page itself).
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpStats {
    /// Responses sent, per status, in [`STATUSES`] order.
    pub responses: [u64; STATUSES.len()],
    /// Connections closed unanswered because [`CONNECTIONS_MAX`] were being served.
    pub connections_refused: u64,
}

/// The resource behind `GET /metrics`.
pub trait Page {
    /// The body, given what the endpoint has answered before this request.
    fn render(&self, http: HttpStats) -> impl Future<Output = String>;
}

/// The endpoint's own counters, on the serving thread only.
#[derive(Default)]
struct Counters {
    responses: [Cell<u64>; STATUSES.len()],
    connections_refused: Cell<u64>,
    connections_open: Cell<usize>,
}

impl Counters {
    fn stats(&self) -> HttpStats {
        HttpStats {
            responses: std::array::from_fn(|index| self.responses[index].get()),
            connections_refused: self.connections_refused.get(),
        }
    }
}

/// Holds one of the [`CONNECTIONS_MAX`] connection places until dropped.
struct ConnectionPermit(Rc<Counters>);

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        self.0.connections_open.set(self.0.connections_open.get() - 1);
    }
}

/// Serves `page` on `listener` (a bound `std` listener, adopted by the calling monoio runtime)
/// until the listener fails or `stop` is set.
pub async fn serve<P: Page + 'static>(
    listener: std::net::TcpListener,
    page: P,
    stop: Arc<AtomicBool>,
) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(error) => {
            tracing::error!(%error, "metrics endpoint: cannot adopt the listener");
            return;
        }
    };
    let page = Rc::new(page);
    let counters = Rc::new(Counters::default());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            // A failed accept (a client that reset before it was taken, a full descriptor
            // table) concerns that client only; the pause keeps a lasting failure from spinning
            // shard 0's thread.
            Err(error) => {
                tracing::debug!(%error, "metrics endpoint: accept failed");
                monoio::time::sleep(ACCEPT_RETRY_DELAY).await;
                continue;
            }
        };
        if stop.load(Ordering::SeqCst) {
            break;
        }
        if counters.connections_open.get() >= CONNECTIONS_MAX {
            counters.connections_refused.set(counters.connections_refused.get() + 1);
            drop(stream);
            continue;
        }
        counters.connections_open.set(counters.connections_open.get() + 1);
        let permit = ConnectionPermit(Rc::clone(&counters));
        monoio::spawn(answer(stream, Rc::clone(&page), permit));
    }
}

/// Reads one request from `stream` and answers it.
async fn answer<P: Page>(mut stream: TcpStream, page: Rc<P>, permit: ConnectionPermit) {
    // A read or write given up on (the timeouts below) stays in flight: the socket is shut
    // down on every way out, so that it closes and the client sees the end.
    let _shut = crate::connection::ShutDownOnDrop(stream.as_raw_fd());
    let counters = Rc::clone(&permit.0);
    let (status, method) = match read_head(&mut stream).await {
        Head::Closed => return,
        Head::TimedOut => (Status::RequestTimeout, Method::Get),
        Head::TooLarge => (Status::HeadTooLarge, Method::Get),
        Head::Complete(bytes) => match parse_head(&bytes) {
            Err(Malformed) => (Status::BadRequest, Method::Get),
            Ok(request) => (route(&request), request.method),
        },
    };
    let body = match status {
        Status::Ok => page.render(counters.stats()).await,
        Status::NotFound => format!("not found: the metrics are at {METRICS_PATH}\n"),
        Status::MethodNotAllowed => format!("{METRICS_PATH} answers GET and HEAD only\n"),
        Status::BadRequest => "malformed HTTP/1.1 request\n".to_string(),
        Status::RequestTimeout => "the request head did not arrive in time\n".to_string(),
        Status::HeadTooLarge => format!("the request head exceeds {HEAD_BYTES_MAX} bytes\n"),
    };
    let index = status.index();
    counters.responses[index].set(counters.responses[index].get() + 1);
    let response = response(status, method, body);
    let Ok((result, _)) = monoio::time::timeout(WRITE_TIME_MAX, stream.write_all(response)).await
    else {
        return;
    };
    if result.is_ok() {
        // FIN after the response, then wait (bounded) for the client to close first.
        let _ = stream.shutdown().await;
        drain(&mut stream).await;
    }
    drop(permit);
}

/// What reading a request head found.
enum Head {
    /// The head, through its blank line.
    Complete(Vec<u8>),
    /// [`HEAD_BYTES_MAX`] bytes without a blank line.
    TooLarge,
    /// Not complete within [`HEAD_READ_TIME_MAX`].
    TimedOut,
    /// The client closed (or the connection failed) first: nobody to answer.
    Closed,
}

async fn read_head(stream: &mut TcpStream) -> Head {
    let deadline = Instant::now() + HEAD_READ_TIME_MAX;
    let mut head: Vec<u8> = Vec::with_capacity(HEAD_BYTES_MAX);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let start = head.len();
        let read = stream.read(head.slice_mut(start..HEAD_BYTES_MAX));
        let Ok((result, slice)) = monoio::time::timeout(left, read).await else {
            return Head::TimedOut;
        };
        head = slice.into_inner();
        match result {
            Ok(0) | Err(_) => return Head::Closed,
            Ok(_) => {}
        }
        // The blank line may straddle two reads: look back three bytes.
        if let Some(end) = head_end(&head, start.saturating_sub(3)) {
            head.truncate(end);
            return Head::Complete(head);
        }
        if head.len() >= HEAD_BYTES_MAX {
            return Head::TooLarge;
        }
    }
}

/// The end of the head (just past its blank line) if `bytes` holds one, searching from `from`.
/// A bare LF ends a line as well as CRLF (RFC 9112 §2.2 lets a recipient accept it).
fn head_end(bytes: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while at < bytes.len() {
        if bytes[at] == b'\n' {
            if bytes.get(at + 1) == Some(&b'\n') {
                return Some(at + 2);
            }
            if bytes.get(at + 1) == Some(&b'\r') && bytes.get(at + 2) == Some(&b'\n') {
                return Some(at + 3);
            }
        }
        at += 1;
    }
    None
}

/// Reads and discards what the client still sends, bounded in bytes and time.
async fn drain(stream: &mut TcpStream) {
    let deadline = Instant::now() + DRAIN_TIME_MAX;
    let mut buffer = vec![0u8; 4096];
    let mut drained = 0;
    while drained < DRAIN_BYTES_MAX {
        let left = deadline.saturating_duration_since(Instant::now());
        let Ok((result, back)) = monoio::time::timeout(left, stream.read(buffer)).await else {
            return;
        };
        buffer = back;
        match result {
            Ok(0) | Err(_) => return,
            Ok(n) => drained += n,
        }
    }
}

/// A request method the endpoint tells apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    /// Any other well-formed method (answered 405).
    Other,
}

/// A parsed request head: what the endpoint needs of it.
#[derive(Debug, PartialEq, Eq)]
pub struct Request<'a> {
    pub method: Method,
    /// The path, without the query.
    pub path: &'a str,
}

/// A request head that breaks the grammar (answered 400; which rule it broke is not reported).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed;

/// Longest method token accepted (the longest standard one, `OPTIONS`, has 7 letters).
const METHOD_BYTES_MAX: usize = 16;

/// Parses a request head (request line, header lines, blank line) strictly: printable ASCII
/// only, `METHOD SP /path SP HTTP/1.x`, every header line `name: value` with a token name, no
/// obsolete line folding. Header values are not interpreted (a request body, if any, is never
/// read: the connection closes after the response).
pub fn parse_head(bytes: &[u8]) -> Result<Request<'_>, Malformed> {
    let text = std::str::from_utf8(bytes).map_err(|_| Malformed)?;
    // Without its last newline, the head's last line is the blank one.
    let text = text.strip_suffix('\n').ok_or(Malformed)?;
    let mut lines = text.split('\n').map(|line| line.strip_suffix('\r').unwrap_or(line));
    let request_line = lines.next().ok_or(Malformed)?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Malformed);
    };
    if method.is_empty() || method.len() > METHOD_BYTES_MAX || !method.bytes().all(is_tchar) {
        return Err(Malformed);
    }
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        return Err(Malformed);
    }
    if !target.starts_with('/') || !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Malformed);
    }
    let mut ended = false;
    for line in lines {
        if ended {
            return Err(Malformed);
        }
        if line.is_empty() {
            ended = true;
            continue;
        }
        let (name, value) = line.split_once(':').ok_or(Malformed)?;
        if name.is_empty() || !name.bytes().all(is_tchar) {
            return Err(Malformed);
        }
        if !value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b)) {
            return Err(Malformed);
        }
    }
    if !ended {
        return Err(Malformed);
    }
    let method = match method {
        "GET" => Method::Get,
        "HEAD" => Method::Head,
        _ => Method::Other,
    };
    let path = target.split_once('?').map_or(target, |(path, _)| path);
    Ok(Request { method, path })
}

/// A token character (RFC 9110 §5.6.2).
fn is_tchar(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&byte)
}

/// The status a well-formed request gets.
fn route(request: &Request<'_>) -> Status {
    if request.path != METRICS_PATH {
        Status::NotFound
    } else if request.method == Method::Other {
        Status::MethodNotAllowed
    } else {
        Status::Ok
    }
}

/// The whole response: status line, headers and (but for `HEAD`) the body.
fn response(status: Status, method: Method, body: String) -> Vec<u8> {
    let content_type =
        if status == Status::Ok { CONTENT_TYPE } else { "text/plain; charset=utf-8" };
    let allow = if status == Status::MethodNotAllowed { "Allow: GET, HEAD\r\n" } else { "" };
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}\
         Connection: close\r\n\r\n",
        status.code(),
        status.reason(),
        body.len()
    );
    let mut bytes = head.into_bytes();
    if method != Method::Head {
        bytes.extend_from_slice(body.as_bytes());
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_head_parses_to_its_method_and_path() {
        let head = b"GET /metrics?x=1 HTTP/1.1\r\nHost: a:1\r\nAccept: */*\r\n\r\n";
        assert_eq!(parse_head(head), Ok(Request { method: Method::Get, path: "/metrics" }));
        let bare_lf = b"HEAD /metrics HTTP/1.0\nUser-Agent: x\n\n";
        assert_eq!(parse_head(bare_lf), Ok(Request { method: Method::Head, path: "/metrics" }));
        let post = b"POST /other HTTP/1.1\r\n\r\n";
        assert_eq!(parse_head(post), Ok(Request { method: Method::Other, path: "/other" }));
    }

    #[test]
    fn malformed_heads_are_refused() {
        let bad: &[&[u8]] = &[
            b"\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET /metrics HTTP/1.1 extra\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/2.0\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"G@T /metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nno colon\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nBad Name: x\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nA: b\r\n folded\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nA: \x01\r\n\r\n",
            b"GET /m\xc3\xa9trics HTTP/1.1\r\n\r\n",
            b"\xff\xfe\x00garbage\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\n",
        ];
        for head in bad {
            assert_eq!(parse_head(head), Err(Malformed), "{:?}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn the_head_ends_at_the_first_blank_line_even_across_reads() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nbody", 0), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\nbody", 0), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nA: b\r\n", 0), None);
        // The search restarts three bytes back, so a blank line split by reads is found.
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\n", 15), Some(18));
    }

    #[test]
    fn routing_distinguishes_path_then_method() {
        let request = |method, path| Request { method, path };
        assert_eq!(route(&request(Method::Get, "/metrics")), Status::Ok);
        assert_eq!(route(&request(Method::Head, "/metrics")), Status::Ok);
        assert_eq!(route(&request(Method::Other, "/metrics")), Status::MethodNotAllowed);
        assert_eq!(route(&request(Method::Other, "/")), Status::NotFound);
        assert_eq!(route(&request(Method::Get, "/metrics/")), Status::NotFound);
    }

    #[test]
    fn a_head_response_carries_the_length_but_no_body() {
        let get = response(Status::Ok, Method::Get, "a 1\n".into());
        let get = String::from_utf8(get).unwrap();
        assert!(get.starts_with("HTTP/1.1 200 OK\r\n"), "{get}");
        assert!(get.contains("Content-Length: 4\r\n") && get.ends_with("\r\n\r\na 1\n"), "{get}");
        let head = String::from_utf8(response(Status::Ok, Method::Head, "a 1\n".into())).unwrap();
        assert!(head.contains("Content-Length: 4\r\n") && head.ends_with("\r\n\r\n"), "{head}");
        let refused = response(Status::MethodNotAllowed, Method::Other, String::new());
        assert!(String::from_utf8(refused).unwrap().contains("Allow: GET, HEAD\r\n"));
    }
}
