//! The durability mode of a topic's groups (DESIGN.md §3): its names in text (config, flags,
//! status, JSON) and its byte in the superblock slot and the native protocol. It owns only the
//! mapping between the mode, its name and its byte; what each mode promises is the engine's.

use std::fmt;
use std::str::FromStr;

/// The durability mode of a group, chosen at creation (DESIGN.md §3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize), serde(rename_all = "lowercase"))]
pub enum Durability {
    /// Acknowledged once written (single node) or once a quorum has it: the partition log is the
    /// write-ahead log.
    #[default]
    Replicated,
    /// Acknowledged once durable: prepares also go to the shard journal, synced every cycle.
    Persisted,
}

impl Durability {
    /// Every mode, in the order of their bytes.
    pub const ALL: [Durability; 2] = [Durability::Replicated, Durability::Persisted];

    /// The name used in config files, flags, status and JSON.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Durability::Replicated => "replicated",
            Durability::Persisted => "persisted",
        }
    }

    /// The byte that stands for this mode on disk and on the wire (0 is kept for "unset").
    #[must_use]
    pub const fn to_byte(self) -> u8 {
        match self {
            Durability::Replicated => 1,
            Durability::Persisted => 2,
        }
    }

    /// The mode a byte stands for; `None` for 0 and for every unknown byte.
    #[must_use]
    pub const fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            1 => Some(Durability::Replicated),
            2 => Some(Durability::Persisted),
            _ => None,
        }
    }
}

impl fmt::Display for Durability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is neither `replicated` nor `persisted`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownDurability(pub String);

impl fmt::Display for UnknownDurability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown durability {:?}: use replicated or persisted", self.0)
    }
}

impl std::error::Error for UnknownDurability {}

impl FromStr for Durability {
    type Err = UnknownDurability;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Durability::ALL
            .into_iter()
            .find(|mode| mode.as_str() == name)
            .ok_or_else(|| UnknownDurability(name.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_bytes_round_trip() {
        for mode in Durability::ALL {
            assert_eq!(mode.as_str().parse::<Durability>(), Ok(mode));
            assert_eq!(Durability::from_byte(mode.to_byte()), Some(mode));
            assert_eq!(mode.to_string(), mode.as_str());
        }
        assert_eq!(Durability::from_byte(0), None);
        assert_eq!(Durability::from_byte(3), None);
        let error = "Persisted".parse::<Durability>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "unknown durability \"Persisted\": use replicated or persisted"
        );
    }
}
