//! [`ConfigError`], what every step of the resolution returns: the key as the user wrote it and
//! the reason. It names a key the user can find (in the file, the environment or on the command
//! line), never an internal field.

use std::fmt;

/// An invalid setting: the key as the user wrote it, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// `topic_defaults.segment_size_bytes`, `shard.2.cpu`, `SHOAL_SHARDS`, `--shards`, or the
    /// config file's path when the file itself cannot be read or parsed.
    pub key: String,
    /// What is wrong and, where it helps, what would be right.
    pub reason: String,
}

impl ConfigError {
    /// An error about `key`.
    pub fn new(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
        ConfigError { key: key.into(), reason: reason.into() }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

impl std::error::Error for ConfigError {}
