//! Runs a chunkserver over a `Runtime`, a `Transport` and a `ChunkStore`.

use std::collections::{HashMap, VecDeque};
use std::task::Poll;
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::stream::FuturesUnordered;
use futures::{SinkExt, StreamExt};
use prost::Message;

use super::{DriverError, Observer};
use crate::chunkserver::{
    Chunkserver, ChunkserverConfig, Dest, Effects, Input, OpId, Outgoing, Reply, RequestId,
    StoreOp, StoreOutput,
};
use crate::error::{FsError, RpcError, StoreError};
use crate::pb;
use crate::runtime::{ChunkStore, Incoming, Parts, Runtime, Transport};
use crate::types::ChunkHandle;

#[derive(Clone, Debug)]
pub struct ChunkserverOptions {
    pub config: ChunkserverConfig,
    pub master: String,
    pub heartbeat_interval: Duration,
    pub call_timeout: Duration,
}

enum Event {
    Request(Incoming, crate::Time),
    CallResult(u64, Result<Reply, RpcError>),
    Tick,
}

/// Carries out one storage operation; each step of the durability recipe in order.
pub async fn execute<S: ChunkStore>(store: &mut S, op: StoreOp) -> Result<StoreOutput, StoreError> {
    match op {
        StoreOp::Read { handle, ranges } => {
            let mut out = Vec::with_capacity(ranges.len());
            for (off, len) in ranges {
                out.push(store.read(handle, off, len).await?);
            }
            Ok(StoreOutput::Data(out))
        }
        StoreOp::Write {
            handle,
            offset,
            data,
            meta,
            intent,
        } => {
            if let Some(intent) = intent {
                store.write_meta(intent).await?;
                store.sync(handle).await?;
            }
            store.write(handle, offset, data).await?;
            store.write_meta(meta).await?;
            store.sync(handle).await?;
            Ok(StoreOutput::Done)
        }
        StoreOp::Replace { handle, data, meta } => {
            store.replace(meta, data).await?;
            store.sync(handle).await?;
            Ok(StoreOutput::Done)
        }
        StoreOp::WriteMeta { handle, meta } => {
            store.write_meta(meta).await?;
            store.sync(handle).await?;
            Ok(StoreOutput::Done)
        }
        StoreOp::Delete { handle } => {
            store.delete(handle).await?;
            Ok(StoreOutput::Done)
        }
    }
}

/// One storage operation on a handle of the store, owned, so that several can be under
/// way at once.
async fn execute_owned<S: ChunkStore>(
    mut store: S,
    id: OpId,
    op: StoreOp,
) -> (OpId, ChunkHandle, Result<StoreOutput, StoreError>) {
    let h = op.handle();
    (id, h, execute(&mut store, op).await)
}

/// What the event loop does next.
enum Step<E> {
    Event(E),
    Stored(OpId, ChunkHandle, Result<StoreOutput, StoreError>),
}

/// Runs the chunkserver until it is stopped. Start-up is recovery from the store.
///
/// Storage operations run concurrently with the network side and with each other, but
/// those on one chunk run one at a time, in the order the state machine issued them
/// (it keeps one job per chunk running, and a job's operations depend on each other).
/// They run inside this future, not as spawned tasks, so stopping the server (dropping
/// the future) stops them too, as a crash does.
pub async fn run<R: Runtime, T: Transport, S: ChunkStore + Clone, O: Observer>(
    rt: R,
    transport: T,
    mut store: S,
    opts: ChunkserverOptions,
    mut observer: O,
) -> Result<(), DriverError> {
    let metas = store.load().await?;
    tracing::info!(addr = %opts.config.address, chunks = metas.len(), "chunkserver recovered");
    let mut cs = Chunkserver::recover(opts.config.clone(), rt.now(), metas);
    let mut inbound = transport.listen(&opts.config.address).await?;
    let (tx, mut events) = mpsc::unbounded::<Event>();
    {
        let (tx, rt2) = (tx.clone(), rt.clone());
        rt.spawn(async move {
            while let Some(req) = inbound.next().await {
                if tx.unbounded_send(Event::Request(req, rt2.now())).is_err() {
                    return;
                }
            }
        });
    }
    {
        let (rt2, mut tx) = (rt.clone(), tx.clone());
        let every = opts.heartbeat_interval;
        rt.spawn(async move {
            // The first heartbeat goes at once, so the master learns our chunks promptly.
            loop {
                if tx.send(Event::Tick).await.is_err() {
                    return;
                }
                rt2.sleep(every).await;
            }
        });
    }
    let mut replies: HashMap<RequestId, oneshot::Sender<Parts>> = HashMap::new();
    let mut next_request: RequestId = 1;
    let mut running = FuturesUnordered::new();
    // Operations waiting for an earlier one on the same chunk; a key is present while an
    // operation on that chunk is running.
    let mut waiting: HashMap<ChunkHandle, VecDeque<(OpId, StoreOp)>> = HashMap::new();
    loop {
        // Finished storage operations first: they free chunks for queued work.
        let step = futures::future::poll_fn(|cx| {
            if let Poll::Ready(Some((id, h, result))) = running.poll_next_unpin(cx) {
                return Poll::Ready(Some(Step::Stored(id, h, result)));
            }
            events.poll_next_unpin(cx).map(|e| e.map(Step::Event))
        })
        .await;
        let input = match step {
            None => break,
            Some(Step::Stored(id, h, result)) => {
                if let Some(q) = waiting.get_mut(&h) {
                    match q.pop_front() {
                        Some((next, op)) => running.push(execute_owned(store.clone(), next, op)),
                        None => {
                            waiting.remove(&h);
                        }
                    }
                }
                Input::StoreDone { id, result }
            }
            Some(Step::Event(Event::Request(inc, arrived))) => {
                match pb::ChunkRequest::decode(inc.body) {
                    Ok(req) => {
                        let id = next_request;
                        next_request += 1;
                        replies.insert(id, inc.reply);
                        Input::Request { id, req, arrived }
                    }
                    Err(e) => {
                        let resp = pb::ChunkResponse {
                            error: Some(
                                FsError::InvalidArgument(format!("malformed request: {e}")).to_pb(),
                            ),
                            resp: None,
                        };
                        let _ = inc.reply.send(resp.encode_to_vec().into());
                        continue;
                    }
                }
            }
            Some(Step::Event(Event::CallResult(id, result))) => Input::CallResult { id, result },
            Some(Step::Event(Event::Tick)) => {
                cs.set_disk_available(store.available_bytes());
                Input::Tick
            }
        };
        let now = rt.now();
        let effects: Effects = cs.handle(now, input.clone());
        observer.chunkserver_step(now, &input, &effects, &cs);
        for (id, resp) in effects.replies {
            if let Some(r) = replies.remove(&id) {
                let _ = r.send(reply_parts(resp));
            }
        }
        for call in effects.calls {
            spawn_call(&rt, &transport, &tx, &opts, call);
        }
        for (id, op) in effects.store {
            let h = op.handle();
            match waiting.get_mut(&h) {
                Some(q) => q.push_back((id, op)),
                None => {
                    waiting.insert(h, VecDeque::new());
                    running.push(execute_owned(store.clone(), id, op));
                }
            }
        }
    }
    Ok(())
}

fn spawn_call<R: Runtime, T: Transport>(
    rt: &R,
    transport: &T,
    tx: &mpsc::UnboundedSender<Event>,
    opts: &ChunkserverOptions,
    call: crate::chunkserver::Call,
) {
    let to = match call.to {
        Dest::Master => opts.master.clone(),
        Dest::Peer(a) => a,
    };
    let deadline = rt.now() + opts.call_timeout;
    let (transport, tx) = (transport.clone(), tx.clone());
    rt.spawn(async move {
        let result = match call.req {
            Outgoing::Master(req) => transport
                .call(&to, req.encode_to_vec().into(), deadline)
                .await
                .and_then(|b| {
                    pb::MasterResponse::decode(b)
                        .map(Reply::Master)
                        .map_err(|e| RpcError::Decode(e.to_string()))
                }),
            Outgoing::Chunk(req) => transport
                .call(&to, req.encode_to_vec().into(), deadline)
                .await
                .and_then(|b| {
                    pb::ChunkResponse::decode(b)
                        .map(Reply::Chunk)
                        .map_err(|e| RpcError::Decode(e.to_string()))
                }),
        };
        let _ = tx.unbounded_send(Event::CallResult(call.id, result));
    });
}

/// Replies whose data is smaller than this are encoded whole; larger ones keep the data
/// as a piece of its own.
const SPLIT_REPLY_AT: usize = 64 << 10;

/// A reply, encoded as the pieces the transport writes one after another: a read's data
/// is not copied into the envelope around it. That envelope is encoded here field by
/// field, as prost would encode the whole message (a test holds the two to the same
/// bytes).
pub fn reply_parts(resp: pb::ChunkResponse) -> Parts {
    use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
    match resp {
        pb::ChunkResponse {
            error: None,
            resp: Some(pb::chunk_response::Resp::Read(r)),
        } if r.data.len() >= SPLIT_REPLY_AT => {
            // ChunkResponse.read = 3 { data = 1, chunk_length = 2 (omitted when 0) }.
            let n = r.data.len();
            let mut tail = Vec::new();
            if r.chunk_length != 0 {
                encode_key(2, WireType::Varint, &mut tail);
                encode_varint(r.chunk_length, &mut tail);
            }
            let inner = key_len(1) + encoded_len_varint(n as u64) + n + tail.len();
            let mut head = Vec::with_capacity(24);
            encode_key(3, WireType::LengthDelimited, &mut head);
            encode_varint(inner as u64, &mut head);
            encode_key(1, WireType::LengthDelimited, &mut head);
            encode_varint(n as u64, &mut head);
            Parts(vec![head.into(), r.data, tail.into()])
        }
        other => other.encode_to_vec().into(),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    #[test]
    fn a_read_reply_in_pieces_is_the_message_prost_encodes() {
        for n in [
            0,
            1,
            100,
            SPLIT_REPLY_AT - 1,
            SPLIT_REPLY_AT,
            200_000,
            4 << 20,
        ] {
            for chunk_length in [0, 1, 300, 64 << 20, u64::MAX] {
                let resp = pb::ChunkResponse {
                    error: None,
                    resp: Some(pb::chunk_response::Resp::Read(pb::ReadChunkResponse {
                        data: Bytes::from(vec![7u8; n]),
                        chunk_length,
                    })),
                };
                let parts = reply_parts(resp.clone());
                assert_eq!(parts.0.len(), if n >= SPLIT_REPLY_AT { 3 } else { 1 });
                assert_eq!(
                    parts.concat(),
                    resp.encode_to_vec(),
                    "{n} bytes, length {chunk_length}"
                );
            }
        }
        let other = pb::ChunkResponse::default();
        assert_eq!(reply_parts(other.clone()).concat(), other.encode_to_vec());
    }

    #[test]
    fn a_read_reply_received_in_its_pieces_decodes_to_its_data_uncopied() {
        let data = Bytes::from(vec![9u8; 1 << 20]);
        let resp = pb::ChunkResponse {
            error: None,
            resp: Some(pb::chunk_response::Resp::Read(pb::ReadChunkResponse {
                data: data.clone(),
                chunk_length: 64 << 20,
            })),
        };
        let got =
            pb::ChunkResponse::decode(crate::runtime::PartsReader::from(reply_parts(resp.clone())))
                .expect("decodes");
        assert_eq!(got, resp);
        let Some(pb::chunk_response::Resp::Read(r)) = got.resp else {
            unreachable!()
        };
        assert_eq!(r.data.as_ptr(), data.as_ptr(), "the data was copied");
    }
}
