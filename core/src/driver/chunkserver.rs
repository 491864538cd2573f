//! Runs a chunkserver over a `Runtime`, a `Transport` and a `ChunkStore`.

use std::collections::HashMap;
use std::task::Poll;
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::stream::{FusedStream, FuturesUnordered};
use futures::{SinkExt, StreamExt};
use prost::Message;

use super::queues::ChunkQueues;
use super::{ChunkserverStart, DriverError, Observer};
use crate::chunkserver::{
    Chunkserver, ChunkserverConfig, Dest, Effects, IDENTITY_HANDLE, Input, OpId, Outgoing, Reply,
    RequestId, StoreOp, StoreOutput,
};
use crate::error::{RpcError, StoreError};
use crate::runtime::{ChunkStore, Incoming, Parts, PartsReader, Runtime, Transport};
use crate::types::ChunkHandle;
use crate::{pb, wire};

#[derive(Clone, Debug)]
pub struct ChunkserverOptions {
    pub config: ChunkserverConfig,
    /// The master's address, or every master replica's, comma-separated: heartbeats go
    /// to the leader, found and followed (`crate::masters`).
    pub master: String,
    pub heartbeat_interval: Duration,
    pub call_timeout: Duration,
}

enum Event {
    Request(Incoming),
    // Boxed: a master's reply is far larger than the other events.
    CallResult(u64, Box<Result<Reply, RpcError>>),
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
            // The data is durable before the metadata that describes it is written: an
            // unsynced metadata record may become durable at any moment (on real disks
            // every chunk's metadata shares one log, which another chunk's sync flushes),
            // and one describing data still in flight would, after a power cut, give
            // checksums the bytes on disk fail, costing the whole copy, acknowledged bytes
            // included, on every replica the cut reached.
            store.sync_data(handle).await?;
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

/// Gives a store without a server id one, durably, before the server first speaks: the
/// id is what tells the master this disk from another at the same address, so it must
/// never change once a heartbeat carried it. `fresh` is the id to give (drawn from the
/// runtime's random source, seeded in the simulator). Leaves the identity record in
/// `metas`.
pub async fn ensure_server_id<S: ChunkStore>(
    fresh: u64,
    store: &mut S,
    metas: &mut Vec<pb::ChunkMeta>,
) -> Result<u64, StoreError> {
    let at = metas.iter().position(|m| m.handle == IDENTITY_HANDLE);
    if let Some(m) = at.map(|i| &metas[i])
        && m.server_id != 0
    {
        return Ok(m.server_id);
    }
    let mut meta = at.map_or_else(Default::default, |i| metas.remove(i));
    meta.handle = IDENTITY_HANDLE;
    meta.server_id = fresh.max(1);
    store.write_meta(meta.clone()).await?;
    store.sync(IDENTITY_HANDLE).await?;
    tracing::info!(server_id = meta.server_id, "server id made");
    let id = meta.server_id;
    metas.push(meta);
    Ok(id)
}

/// What the event loop does next.
enum Step<E> {
    Event(E),
    Stored(OpId, ChunkHandle, Result<StoreOutput, StoreError>),
    /// The tick that a disk-space reading went in ahead of.
    TickNext,
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
    let mut metas = store.load().await?;
    ensure_server_id(rt.random_u64(), &mut store, &mut metas).await?;
    tracing::info!(addr = %opts.config.address, chunks = metas.len() - 1, "chunkserver recovered");
    let now = rt.now();
    observer.chunkserver_started(
        now,
        ChunkserverStart {
            config: &opts.config,
            metas: &metas,
        },
    );
    let mut cs = Chunkserver::recover(opts.config.clone(), now, metas);
    // The disk's free space as the state machine last heard it.
    let mut disk_free = None;
    // A tick waits behind the disk-space reading taken for it.
    let mut tick_next = false;
    let mut inbound = transport.listen(&opts.config.address).await?;
    let (tx, mut events) = mpsc::unbounded::<Event>();
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
    let masters = crate::masters::Masters::parse(&opts.master);
    let mut replies: HashMap<RequestId, oneshot::Sender<Parts>> = HashMap::new();
    let mut next_request: RequestId = 1;
    let mut running = FuturesUnordered::new();
    let mut queues = ChunkQueues::default();
    loop {
        // Finished storage operations first: they free chunks for queued work. Then
        // results and ticks (work already begun), then new requests, taken from the
        // transport's bounded queue only as fast as this loop handles them, so a flood
        // waits there (and its senders with it) rather than in memory here. Each request
        // carries the time it arrived, before it waited.
        let step = futures::future::poll_fn(|cx| {
            if std::mem::take(&mut tick_next) {
                return Poll::Ready(Some(Step::TickNext));
            }
            if let Poll::Ready(Some((id, h, result))) = running.poll_next_unpin(cx) {
                return Poll::Ready(Some(Step::Stored(id, h, result)));
            }
            if let Poll::Ready(e) = events.poll_next_unpin(cx) {
                return Poll::Ready(e.map(Step::Event));
            }
            if !inbound.is_terminated()
                && let Poll::Ready(Some(req)) = inbound.poll_next_unpin(cx)
            {
                return Poll::Ready(Some(Step::Event(Event::Request(req))));
            }
            Poll::Pending
        })
        .await;
        let input = match step {
            None => break,
            Some(Step::Stored(id, h, result)) => {
                if let Some((next, op)) = queues.finished(h) {
                    running.push(execute_owned(store.clone(), next, op));
                }
                Input::StoreDone { id, result }
            }
            Some(Step::Event(Event::Request(inc))) => {
                let arrived = inc.arrived;
                let id = next_request;
                next_request += 1;
                replies.insert(id, inc.reply);
                observer.request(id, &inc.peer, arrived);
                match pb::ChunkRequest::decode(PartsReader::from(inc.body)) {
                    Ok(req) => Input::Request {
                        id,
                        req,
                        arrived,
                        from: inc.from,
                    },
                    Err(e) => Input::Malformed {
                        id,
                        error: e.to_string(),
                    },
                }
            }
            Some(Step::Event(Event::CallResult(id, result))) => Input::CallResult {
                id,
                result: *result,
            },
            Some(Step::Event(Event::Tick)) => {
                let free = store.available_bytes();
                if free != disk_free {
                    // The reading goes in as an input of its own, the tick after it.
                    disk_free = free;
                    tick_next = true;
                    Input::DiskSpace { free }
                } else {
                    Input::Tick
                }
            }
            Some(Step::TickNext) => Input::Tick,
        };
        let now = rt.now();
        let effects: Effects = cs.handle(now, input.clone());
        observer.chunkserver_step(now, &input, &effects, &cs);
        for (id, resp) in effects.replies {
            if let Some(r) = replies.remove(&id) {
                let _ = r.send(wire::reply_parts(resp));
            }
        }
        for call in effects.calls {
            spawn_call(&rt, &transport, &tx, &opts, &masters, call);
        }
        for (id, op) in effects.store {
            if let Some((id, op)) = queues.issue(id, op) {
                running.push(execute_owned(store.clone(), id, op));
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
    masters: &crate::masters::Masters,
    call: crate::chunkserver::Call,
) {
    let to = match call.to {
        Dest::Master => masters.current(),
        Dest::Peer(a) => a,
    };
    let deadline = rt.now() + opts.call_timeout;
    if let Outgoing::Master(pb::MasterRequest {
        req: Some(pb::master_request::Req::Heartbeat(hb)),
        ..
    }) = &call.req
    {
        // Every other master replica gets a copy, so a shadow knows where chunks are
        // (`group::locations`); its answer is not waited for, nor acted on.
        for other in masters.all().into_iter().filter(|a| *a != to) {
            let copy = pb::MasterRequest {
                req: Some(pb::master_request::Req::Heartbeat(pb::HeartbeatRequest {
                    copy: true,
                    lease_extensions: Vec::new(),
                    ..hb.clone()
                })),
                ..Default::default()
            };
            let transport = transport.clone();
            rt.spawn(async move {
                let _ = transport
                    .call(
                        &other,
                        crate::auth::ServerRole::Master,
                        copy.encode_to_vec().into(),
                        deadline,
                    )
                    .await;
            });
        }
    }
    let (transport, tx, masters) = (transport.clone(), tx.clone(), masters.clone());
    rt.spawn(async move {
        let result = match call.req {
            Outgoing::Master(req) => {
                let result = transport
                    .call(
                        &to,
                        crate::auth::ServerRole::Master,
                        req.encode_to_vec().into(),
                        deadline,
                    )
                    .await
                    .and_then(|b| {
                        pb::MasterResponse::decode(b).map_err(|e| RpcError::Decode(e.to_string()))
                    });
                // Where the next call to the master goes: the leader a replica named, or
                // the next replica after one that did not answer.
                match &result {
                    Err(_) => masters.unreachable(&to),
                    Ok(pb::MasterResponse { error: Some(e), .. }) => {
                        masters.after(&to, &crate::error::FsError::from_pb(e));
                    }
                    Ok(_) => {}
                }
                result.map(Reply::Master)
            }
            // A clone's data arrives as a piece of its own: decoded as a slice of it.
            Outgoing::Chunk(req) => transport
                .call_parts(
                    &to,
                    crate::auth::ServerRole::Chunkserver,
                    wire::request_parts(req),
                    deadline,
                )
                .await
                .and_then(|b| {
                    pb::ChunkResponse::decode(PartsReader::from(b))
                        .map(Reply::Chunk)
                        .map_err(|e| RpcError::Decode(e.to_string()))
                }),
        };
        let _ = tx.unbounded_send(Event::CallResult(call.id, Box::new(result)));
    });
}
