//! The client's one error type, shared by every layer of the library.
//!
//! It owns the classification a caller acts on: what the server refused (with its code and
//! text), what broke on the way (I/O, a peer that does not speak the protocol, a timeout, a closed
//! connection), and what the client itself refused to send. It never hides a server error code
//! behind text, and never decides to retry: [`ClientError::is_retryable`] only says whether a
//! retry may succeed.

use std::fmt;
use std::sync::Arc;

use shoal_proto::protocol::{ErrorCode, NODE_UNKNOWN, NotPrimary};

/// Why a client call failed.
///
/// `Clone`, because one broken connection fails every request outstanding on it, and each of
/// them reports the same cause.
#[derive(Clone, Debug)]
pub enum ClientError {
    /// The server answered with an error code; `message` is its text.
    Server {
        /// What the server refused, and so what is safe to do next.
        code: ErrorCode,
        /// The server's explanation.
        message: String,
    },
    /// The server (protocol version 3 or later) does not lead the group the request is for and
    /// names the node that does: its view, index and client address. Nothing was done; the same
    /// request may go there. (Before version 3 this is a `Server` error with code
    /// `NotPrimary`.)
    NotPrimary(NotPrimary),
    /// The connection failed (connect, read or write).
    Io(Arc<std::io::Error>),
    /// The peer sent bytes that are not a valid reply, or replied out of order: the connection
    /// is dropped.
    Protocol(String),
    /// No reply within the configured request timeout: the connection is dropped, and whether
    /// the request took effect is unknown.
    Timeout,
    /// The connection was closed (by the server, or before the request could be answered).
    Closed,
    /// The client refused to send the request (an argument out of range, a frame over the
    /// limit); nothing reached the server.
    Invalid(String),
}

impl ClientError {
    /// Whether the same request may succeed if sent again (on this or a new connection).
    ///
    /// `Io`, `Timeout` and `Closed` are retryable but leave the outcome unknown: a produce that
    /// was retried after one of them may be stored twice (at-least-once delivery).
    pub fn is_retryable(&self) -> bool {
        match self {
            ClientError::Server { code, .. } => code.is_retryable(),
            ClientError::NotPrimary(_)
            | ClientError::Io(_)
            | ClientError::Timeout
            | ClientError::Closed => true,
            ClientError::Protocol(_) | ClientError::Invalid(_) => false,
        }
    }

    /// The server's error code, when the server refused the request.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Server { code, .. } => Some(*code),
            ClientError::NotPrimary(_) => Some(ErrorCode::NotPrimary),
            _ => None,
        }
    }

    /// Whether the connection that produced this error cannot be used any further.
    pub(crate) fn breaks_connection(&self) -> bool {
        match self {
            // The server closes the connection after these two (docs/protocol.md).
            ClientError::Server { code, .. } => {
                matches!(code, ErrorCode::InvalidFrame | ErrorCode::UnsupportedVersion)
            }
            ClientError::Invalid(_) | ClientError::NotPrimary(_) => false,
            ClientError::Io(_)
            | ClientError::Protocol(_)
            | ClientError::Timeout
            | ClientError::Closed => true,
        }
    }

    pub(crate) fn io(error: std::io::Error) -> ClientError {
        ClientError::Io(Arc::new(error))
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // `CODE: text`, the form `shoalctl` prints, so a script can match the code.
            ClientError::Server { code, message } if message.is_empty() => write!(f, "{code}"),
            ClientError::Server { code, message } => write!(f, "{code}: {message}"),
            ClientError::NotPrimary(redirect) => {
                write!(f, "{}: {}", ErrorCode::NotPrimary, redirect.text)?;
                if redirect.primary != NODE_UNKNOWN {
                    write!(f, " (node {} at {})", redirect.primary, redirect.address)?;
                }
                Ok(())
            }
            ClientError::Io(error) => write!(f, "I/O error: {error}"),
            ClientError::Protocol(reason) => write!(f, "protocol error: {reason}"),
            ClientError::Timeout => write!(f, "no reply within the request timeout"),
            ClientError::Closed => write!(f, "the connection was closed"),
            ClientError::Invalid(reason) => write!(f, "invalid request: {reason}"),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Io(error) => Some(error.as_ref()),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClientError {
    fn from(error: std::io::Error) -> Self {
        ClientError::io(error)
    }
}

/// The client's result type.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;
