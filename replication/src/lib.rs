//! Viewstamped Replication for Shoal: the sans-IO replica state machine, the client table, the
//! shard's node layer and the deterministic cluster simulator.
//!
//! Not built yet: the VSR core issue fills this crate. It will never open a socket or a file,
//! read a clock or spawn a thread; time arrives as ticks and randomness from a seeded PRNG.
#![forbid(unsafe_code)]
