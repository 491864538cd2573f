//! The whole boundary between Tessera's logic and the world: four traits. The simulator
//! implements them over madsim and simulated disks; production over tokio, tonic, files
//! and rocksdb; `crate::testkit` in memory for this crate's own tests.
//!
//! Methods return `impl Future + Send` rather than being `async fn`, so that drivers
//! generic over them can be spawned on multi-threaded executors.

use std::future::Future;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use futures::channel::{mpsc, oneshot};

use crate::auth::{Caller, ServerRole};
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
    /// Runs `f`, long work that never awaits (a checkpoint's build and encoding), where
    /// it holds up no other task; its result comes back when it is done. A panic in `f`
    /// goes on in the task that awaits it. Here it runs in place: the simulator's time
    /// does not pass while a step computes, and a test's tasks wait their turn.
    fn run_blocking<F, T>(&self, f: F) -> impl Future<Output = T> + Send
    where
        F: FnOnce() -> T + Send + 'static,
        T: Send + 'static,
    {
        async move { f() }
    }
}

/// One inbound call: its prost-encoded body, when it arrived, and where the encoded
/// reply goes.
#[derive(Debug)]
pub struct Incoming {
    /// The request as it arrived, perhaps in pieces: read it with [`PartsReader`].
    pub body: Parts,
    /// The receiving node's clock when the request had arrived whole, before it waited
    /// in any queue: a lease a request grants counts from then, so a request that
    /// waited must not pass for a fresh one.
    pub arrived: Time,
    /// Where the request came from, as the transport saw it (an address; empty when it
    /// cannot tell). For traces and logs only: it identifies nothing the protocol trusts.
    pub peer: String,
    /// Who sent it, as the transport authenticated it (`crate::auth`): the state
    /// machines decide from this what the request may do.
    pub from: Caller,
    pub reply: oneshot::Sender<Parts>,
}

/// An encoded message as pieces that go out one after another. Bulk data (a read's
/// bytes) travels as a piece of its own, so it is not copied into its envelope first:
/// the gRPC transport hands each piece to HTTP/2 as it is, and the receiver gets the
/// data as one piece again when it came in one frame.
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

/// Reads a [`Parts`] front to back as one buffer, so prost decodes a message that
/// arrived in pieces. A `bytes` field that lies within one piece comes out as a slice of
/// it, uncopied; one that spans pieces is joined.
#[derive(Debug, Default)]
pub struct PartsReader {
    pieces: std::collections::VecDeque<Bytes>,
    remaining: usize,
}

impl From<Parts> for PartsReader {
    fn from(p: Parts) -> PartsReader {
        let remaining = p.len();
        PartsReader {
            pieces: p.0.into_iter().filter(|b| !b.is_empty()).collect(),
            remaining,
        }
    }
}

impl Buf for PartsReader {
    fn remaining(&self) -> usize {
        self.remaining
    }

    fn chunk(&self) -> &[u8] {
        self.pieces.front().map_or(&[], |b| &b[..])
    }

    fn advance(&mut self, mut cnt: usize) {
        assert!(cnt <= self.remaining, "advance past the end of the parts");
        self.remaining -= cnt;
        while cnt > 0 {
            let front = self.pieces.front_mut().expect("bytes remain");
            if cnt < front.len() {
                front.advance(cnt);
                return;
            }
            cnt -= front.len();
            self.pieces.pop_front();
        }
    }

    fn copy_to_bytes(&mut self, len: usize) -> Bytes {
        assert!(len <= self.remaining, "copy past the end of the parts");
        if let Some(front) = self.pieces.front_mut()
            && len <= front.len()
        {
            let out = front.split_to(len);
            if front.is_empty() {
                self.pieces.pop_front();
            }
            self.remaining -= len;
            return out;
        }
        let mut out = bytes::BytesMut::with_capacity(len);
        out.put((&mut *self).take(len));
        out.freeze()
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
    /// Calls `to` with `body` (one message, in pieces that are sent one after
    /// another), and gives the reply as the pieces it arrived in, so bulk data in it
    /// need not be joined (read it with [`PartsReader`]). Fails with
    /// `RpcError::Deadline` once the caller's clock passes `deadline`; a failed call may
    /// or may not have been carried out. `server` is the kind of server the caller
    /// means `to` to be: a call that reaches another kind fails, unreachable, with
    /// nothing sent (`crate::auth::ServerRole`).
    fn call_parts(
        &self,
        to: &str,
        server: ServerRole,
        body: Parts,
        deadline: Time,
    ) -> impl Future<Output = Result<Parts, RpcError>> + Send;
    /// [`Transport::call_parts`], with the reply joined into one buffer.
    fn call(
        &self,
        to: &str,
        server: ServerRole,
        body: Parts,
        deadline: Time,
    ) -> impl Future<Output = Result<Bytes, RpcError>> + Send {
        let call = self.call_parts(to, server, body, deadline);
        async move { call.await.map(Parts::concat) }
    }
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
///    the old or the new record, never a mix, whatever became of the data: a new record
///    may survive over data that did not, so callers make data durable (`sync_data`)
///    before they write the metadata that describes it. A torn or lost write leaves data
///    that fails its checksum or a length that the metadata does not claim — never
///    silently wrong bytes under a valid checksum.
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
    /// Makes the chunk's written data durable; its metadata need not be.
    fn sync_data(&mut self, h: ChunkHandle) -> impl Future<Output = Result<(), StoreError>> + Send {
        self.sync(h)
    }
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
    /// `write` then `sync`: the batch, and every write before it, durable. A store may do
    /// both in one step.
    fn write_synced(
        &mut self,
        batch: Vec<(Vec<u8>, Option<Bytes>)>,
    ) -> impl Future<Output = Result<(), StoreError>> + Send {
        async move {
            self.write(batch).await?;
            self.sync().await
        }
    }
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

#[cfg(test)]
mod tests {
    use bytes::{Buf, Bytes};
    use proptest::prelude::*;
    use prost::Message;

    use super::{Parts, PartsReader};
    use crate::pb;

    proptest! {
        /// However a message is cut into pieces, it decodes to itself.
        #[test]
        fn a_message_in_any_pieces_decodes_as_it_was_sent(
            data in proptest::collection::vec(any::<u8>(), 0..3000),
            chunk_length in any::<u64>(),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
        ) {
            let msg = pb::ChunkResponse {
                error: None,
                resp: Some(pb::chunk_response::Resp::Read(pb::ReadChunkResponse {
                    data: data.into(),
                    chunk_length,
                })),
                ..Default::default()
            };
            let whole = Bytes::from(msg.encode_to_vec());
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(whole.len() + 1)).collect();
            at.sort_unstable();
            let mut pieces = Vec::new();
            let mut from = 0;
            for a in at.into_iter().chain([whole.len()]) {
                pieces.push(whole.slice(from..a)); // empty pieces too
                from = a;
            }
            let reader = PartsReader::from(Parts(pieces));
            prop_assert_eq!(reader.remaining(), whole.len());
            prop_assert_eq!(pb::ChunkResponse::decode(reader).expect("decodes"), msg);
        }
    }

    #[test]
    fn reading_parts_walks_every_piece_in_order() {
        let mut r = PartsReader::from(Parts(vec![
            Bytes::from_static(b"ab"),
            Bytes::new(),
            Bytes::from_static(b"cde"),
            Bytes::from_static(b"f"),
        ]));
        assert_eq!(r.chunk(), b"ab");
        r.advance(1);
        assert_eq!(r.copy_to_bytes(3), Bytes::from_static(b"bcd"));
        assert_eq!(r.remaining(), 2);
        assert_eq!(r.copy_to_bytes(1), Bytes::from_static(b"e"));
        assert_eq!(r.chunk(), b"f");
        r.advance(1);
        assert_eq!(r.remaining(), 0);
        assert_eq!(r.chunk(), b"");
    }
}
