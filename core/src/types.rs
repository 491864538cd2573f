//! Plain values shared by the master, the chunkserver and the client.

use std::time::Duration;

/// A chunk's immutable, cluster-unique name, given by the master.
pub type ChunkHandle = u64;
/// A chunk's version: bumped by the master on every lease grant.
pub type Version = u64;
/// A position in the master's operation log. The first record is 1.
pub type LogSeq = u64;

/// Checksums cover blocks of this many bytes (GFS §5.2).
pub const BLOCK_SIZE: u64 = 64 * 1024;
/// Data a chunkserver assembles for a write starts on this memory boundary, so a store
/// using direct I/O (which needs block-aligned buffers) can write it without a copy.
pub const IO_ALIGN: usize = 4096;
/// GFS's chunk size; the master's is configurable so tests can make chunks tiny. It is
/// the size of new files' chunks: each file keeps the size it was created with.
pub const DEFAULT_CHUNK_SIZE: u64 = 64 * 1024 * 1024;
/// The largest chunk size any file may have. A chunkserver bounds everything it takes
/// outside a lease by it (pushed data, a secondary's mutation, a clone's source), since
/// it cannot know the size of the file a chunk belongs to: files made with bigger chunks
/// before the master's default was lowered must keep working. The master keeps a file's
/// size in 32 bits, so this must stay below 4 GiB.
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;

/// A node's clock reading in milliseconds since an arbitrary epoch. State machines never
/// read a clock: the driver passes `Time` in with every input.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Time(pub u64);

impl Time {
    pub const ZERO: Time = Time(0);

    pub fn from_millis(ms: u64) -> Time {
        Time(ms)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    pub fn saturating_sub(self, other: Time) -> Duration {
        Duration::from_millis(self.0.saturating_sub(other.0))
    }
}

impl std::ops::Add<Duration> for Time {
    type Output = Time;
    fn add(self, d: Duration) -> Time {
        Time(self.0.saturating_add(d.as_millis() as u64))
    }
}

/// Duration in whole milliseconds, saturating at `u64::MAX`.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The hash maps and sets of the state machines. Their hasher has fixed keys, so
/// iteration order depends on what was put in and taken out, in what order, not on the
/// process: a node replayed from its trace in another process (`tessera replay node`)
/// goes through the same history and so takes the same steps in the same order (the
/// standard library's hasher may change between Rust releases: the trace's protocol
/// fingerprint covers the compiler's version).
pub type HashMap<K, V> = std::collections::HashMap<K, V, FixedState>;
pub type HashSet<K> = std::collections::HashSet<K, FixedState>;
pub type FixedState = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
