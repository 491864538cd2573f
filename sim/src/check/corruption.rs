//! A copy fails its checksums only where the run corrupted it on purpose (a flipped bit).
//!
//! Crashes tear and lose unsynced writes, and may leave an unsynced metadata record over
//! data it does not describe; none of that may ever make a chunkserver find acknowledged
//! bytes that fail their checksums. A torn overwrite has its range marked before the
//! data is written (its checksums are recomputed on restart), a torn append lies past the
//! length the checksums cover, and the data is durable before the metadata that
//! describes it is written. A copy reported corrupt that nobody corrupted means the
//! storage protocol itself lost acknowledged bytes (on one copy here, and on every copy
//! if all its servers lose power at once).

use std::collections::HashSet;

/// Checks a corruption report from `server` about chunk `handle`.
pub fn check(corrupted: &HashSet<(String, u64)>, server: &str, handle: u64) -> Option<String> {
    if corrupted.contains(&(server.to_string(), handle)) {
        return None;
    }
    Some(format!(
        "the copy of chunk {handle} on {server} failed its checksums, but no corruption was \
         injected there: a crash left bytes its checksums do not match"
    ))
}
