//! `DecodeError`: why a Kafka request could not be read, naming the field and its position.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The frame ends inside `what`, or `what` announces more than the frame holds.
    Truncated { what: &'static str, at: usize },
    /// `what` holds a value no client may send.
    Invalid { what: &'static str, at: usize, reason: &'static str },
    /// The array `what` holds more elements than Shoal takes in one request.
    TooMany { what: &'static str, at: usize, count: usize, max: usize },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Truncated { what, at } => {
                write!(f, "the request ends inside {what} (at byte {at})")
            }
            DecodeError::Invalid { what, at, reason } => {
                write!(f, "{what} at byte {at} is invalid: {reason}")
            }
            DecodeError::TooMany { what, at, count, max } => {
                write!(f, "{what} at byte {at} has {count} elements, more than the {max} allowed")
            }
        }
    }
}

impl std::error::Error for DecodeError {}
