//! The whole boundary between Tessera's logic and the world: four traits. The simulator
//! implements them over madsim and simulated disks; production over tokio, tonic, files
//! and rocksdb; `crate::testkit` in memory for this crate's own tests.
//!
//! Methods return `impl Future + Send` rather than being `async fn`, so that drivers
//! generic over them can be spawned on multi-threaded executors.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};

use crate::error::{RpcError, StoreError};
use crate::pb;
use crate::types::{ChunkHandle, Time};

/// Time, timers, tasks and randomness.
pub trait Runtime: Clone + Send + Sync + 'static {
    /// This node's clock. In the simulator it carries the node's skew and drift.
    fn now(&self) -> Time;
    fn sleep(&self, d: Duration) -> impl Future<Output = ()> + Send;
    fn spawn<F>(&self, f: F)
    where
        F: Future<Output = ()> + Send + 'static;
    /// Seeded in the simulator, so a run replays exactly.
    fn random_u64(&self) -> u64;
}

/// One inbound call: its prost-encoded body, and where the encoded reply goes.
#[derive(Debug)]
pub struct Incoming {
    pub body: Bytes,
    pub reply: oneshot::Sender<Parts>,
}

/// An encoded message as pieces that go out one after another. Bulk data (a read's
/// bytes) travels as a piece of its own, so it is not copied into its envelope first;
/// the gRPC codec copies each piece into its frame buffer once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Parts(pub Vec<Bytes>);

impl Parts {
    /// The pieces joined (the one piece as it is, when there is one).
    pub fn concat(mut self) -> Bytes {
        if self.0.len() == 1 {
            return self.0.pop().expect("one piece");
        }
        let mut out = bytes::BytesMut::with_capacity(self.len());
        for p in &self.0 {
            out.extend_from_slice(p);
        }
        out.freeze()
    }

    /// Bytes in all the pieces.
    pub fn len(&self) -> usize {
        self.0.iter().map(Bytes::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl From<Bytes> for Parts {
    fn from(b: Bytes) -> Parts {
        Parts(vec![b])
    }
}

impl From<Vec<u8>> for Parts {
    fn from(b: Vec<u8>) -> Parts {
        Parts(vec![b.into()])
    }
}

/// Request/response calls between nodes, by address. Bodies are prost-encoded in every
/// implementation, so the simulator exercises the same encoding as the wire.
pub trait Transport: Clone + Send + Sync + 'static {
    /// Calls `to`. Fails with `RpcError::Deadline` once the caller's clock passes
    /// `deadline`; a failed call may or may not have been carried out.
    fn call(
        &self,
        to: &str,
        body: Bytes,
        deadline: Time,
    ) -> impl Future<Output = Result<Bytes, RpcError>> + Send;
    /// Serves calls addressed to `addr`.
    fn listen(
        &self,
        addr: &str,
    ) -> impl Future<Output = Result<mpsc::Receiver<Incoming>, RpcError>> + Send;
}

/// One chunkserver's chunk data and per-chunk metadata.
///
/// Durability contract:
/// 1. `write`, `write_meta` and `replace` are visible to reads at once but durable only
///    after `sync` of that chunk returns.
/// 2. A crash loses any unsynced suffix of a chunk's writes and may tear the last one
///    (some of its bytes old, some new); the metadata of an unsynced `write_meta` may be
///    the old or the new record, never a mix. A torn or lost write leaves data that fails
///    its checksum or a length that the metadata does not claim — never silently wrong
///    bytes under a valid checksum.
/// 3. `replace` is all-or-nothing across a crash even before `sync`: the old chunk or the
///    new one.
/// 4. `delete` is durable when it returns: a deleted copy never comes back after a crash.
///    (The master lifts a standing order against a copy once the server shows it gone; a
///    copy that came back would pass for current.)
/// 5. A full disk is `StoreError::NoSpace` and changes nothing.
pub trait ChunkStore: Send + 'static {
    fn read(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        len: u64,
    ) -> impl Future<Output = Result<Bytes, StoreError>> + Send;
    fn write(
        &mut self,
        h: ChunkHandle,
        offset: u64,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn write_meta(
        &mut self,
        meta: pb::ChunkMeta,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn replace(
        &mut self,
        meta: pb::ChunkMeta,
        data: Bytes,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn sync(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn delete(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Every chunk's metadata, at start-up.
    fn load(&mut self) -> impl Future<Output = Result<Vec<pb::ChunkMeta>, StoreError>> + Send;
    /// Free space for more chunk data, if the store can tell (on files: the file
    /// system's). The chunkserver then reports what its chunks use plus this as its
    /// capacity, so the master sees a disk shared with other data fill up.
    fn available_bytes(&self) -> Option<u64> {
        None
    }
}

/// A key-value store for the master's op log and checkpoints.
///
/// Durability contract:
/// 1. `write` applies its batch atomically and is visible to `scan` at once.
/// 2. After `sync` returns, every batch written before it is durable.
/// 3. A crash loses a suffix of the unsynced batches, whole: never part of a batch, never
///    a later batch without an earlier one.
pub trait MetaStore: Send + 'static {
    /// Puts (`Some`) and deletes (`None`), all or nothing.
    fn write(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Bytes>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send;
    fn sync(&mut self) -> impl Future<Output = Result<(), StoreError>> + Send;
    /// Every key with `prefix`, in key order.
    fn scan(
        &mut self,
        prefix: &[u8],
    ) -> impl Future<Output = Result<Vec<(Vec<u8>, Bytes)>, StoreError>> + Send;
}

/// Every entry of `map` whose key starts with `prefix`, in key order: `MetaStore::scan` for
/// stores kept in a `BTreeMap` (the simulator's and the test kit's).
pub fn scan_prefix(
    map: &std::collections::BTreeMap<Vec<u8>, Bytes>,
    prefix: &[u8],
) -> Vec<(Vec<u8>, Bytes)> {
    map.range(prefix.to_vec()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}
