//! Runs the master over a `Runtime`, a `Transport` and a `MetaStore`.
//!
//! The op log lives in the store as `log/<seq, 8 bytes big-endian>` → record, and the
//! latest checkpoint under `checkpoint`, in parts (`driver::checkpoint`). Writing a
//! checkpoint deletes the records it covers in the same batch.
//!
//! Each value is sealed ([`seal`]): a format byte, the CRC32C of the encoded message,
//! then the message. A bit flipped or a value cut short on the disk under the store is
//! found at recovery, and the master refuses to start rather than serve a namespace
//! built from a damaged record (a record that still decodes would be believed). The
//! operator restores the log; nothing is dropped silently.

use std::collections::HashMap;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::stream::FusedStream;
use futures::{SinkExt, StreamExt};
use prost::Message;

use super::checkpoint::Sealed;
use super::commit::{Commit, Held, LogBatch};
use super::{DriverError, MasterStart, Observer};
use crate::error::{RpcError, StoreError};
use crate::master::checkpointer::{Checkpointer, Feed};
use crate::master::{Effects, Input, Master, MasterConfig, RequestId};
use crate::pb;
use crate::runtime::{MetaStore, Parts, PartsReader, Runtime, Transport};
use crate::types::LogSeq;

pub(crate) const LOG_PREFIX: &[u8] = b"log/";
pub const CHECKPOINT_KEY: &[u8] = b"checkpoint";

/// No log reaches this record: one numbered past it was damaged (a value from before
/// sealing is not checked) and would overflow the numbers after it.
const MAX_SEQ: LogSeq = 1 << 62;

pub fn log_key(seq: LogSeq) -> Vec<u8> {
    let mut k = LOG_PREFIX.to_vec();
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// The first byte of a sealed value. Values written before values were sealed start
/// with a field tag of their message; no tag the two messages use lies one bit away
/// from it, so a flip of this byte is never taken for an old value.
const SEALED: u8 = 0xC5;

/// First bytes of values written before sealing: a `LogRecord` or `Checkpoint` encoding
/// starts with the tag of its lowest set field (1-11, varint or length-delimited).
const UNSEALED_FIRST: &[u8] = &[
    0x08, 0x10, 0x12, 0x1a, 0x22, 0x2a, 0x32, 0x38, 0x3a, 0x42, 0x4a, 0x52, 0x5a,
];

/// `msg` as stored: [`SEALED`], CRC32C of the encoding (little-endian), the encoding.
pub fn seal(msg: &impl Message) -> Bytes {
    seal_as(SEALED, msg)
}

/// The message that `pieces` make up, merged in order, sealed as [`seal`] seals it,
/// though never whole: each piece is encoded straight into the sealed value, whose
/// bytes decode to the same message (a protobuf message merges what it decodes).
pub fn seal_pieces<M: Message>(pieces: impl IntoIterator<Item = M>) -> Bytes {
    let mut v = sealed_with(SEALED, 0, |v| {
        for p in pieces {
            p.encode(v).expect("a Vec grows");
        }
    });
    // Held as long as the snapshot is: not with the room the Vec grew into.
    v.shrink_to_fit();
    Bytes::from(v)
}

/// `format`, the CRC32C of what `body` writes after it (little-endian), and that: a
/// sealed value. `capacity` is what `body` is expected to write.
fn sealed_with(format: u8, capacity: usize, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + capacity);
    v.push(format);
    v.extend_from_slice(&[0; 4]);
    body(&mut v);
    let sum = crc32c::crc32c(&v[5..]);
    v[1..5].copy_from_slice(&sum.to_le_bytes());
    v
}

/// `msg` sealed under another first byte (a stored checkpoint's head: `checkpoint.rs`).
pub(crate) fn seal_as(format: u8, msg: &impl Message) -> Bytes {
    Bytes::from(sealed_with(format, msg.encoded_len(), |v| {
        msg.encode(v).expect("a Vec grows")
    }))
}

/// The body of a sealed value (any first byte), checked against its checksum.
pub(crate) fn checked(v: &[u8]) -> Result<&[u8], String> {
    let (sum, body) = v
        .get(1..5)
        .zip(v.get(5..))
        .ok_or_else(|| format!("cut short: {} bytes", v.len()))?;
    let want = u32::from_le_bytes(sum.try_into().expect("four bytes"));
    let got = crc32c::crc32c(body);
    if got != want {
        return Err(format!(
            "checksum mismatch ({} bytes: stored {want:#010x}, computed {got:#010x})",
            v.len()
        ));
    }
    Ok(body)
}

/// The message a stored value holds, checked against its checksum. A value from before
/// sealing (see [`UNSEALED_FIRST`]) is taken as it is: it cannot be checked.
pub fn unseal<T: Message + Default>(v: &[u8]) -> Result<T, String> {
    open(v).map(|(m, _)| m)
}

/// As [`unseal`], and whether the value was sealed.
pub(crate) fn open<T: Message + Default>(v: &[u8]) -> Result<(T, bool), String> {
    let sealed = v.first() == Some(&SEALED);
    let body = match v.first() {
        Some(&SEALED) => checked(v)?,
        Some(b) if UNSEALED_FIRST.contains(b) => v,
        Some(b) => return Err(format!("unknown format (first byte {b:#04x})")),
        None => return Err("empty".into()),
    };
    T::decode(body)
        .map(|m| (m, sealed))
        .map_err(|e| format!("does not decode: {e}"))
}

#[derive(Clone, Debug)]
pub struct MasterOptions {
    pub config: MasterConfig,
    pub listen: String,
    /// How often the master checks liveness, re-replication and garbage.
    pub tick: Duration,
    /// Deadline for calls to chunkservers.
    pub call_timeout: Duration,
    /// How long the checkpointer waits before it builds each checkpoint: zero on real
    /// time. The simulator sets it, so that checkpoints come back after more records
    /// were logged and a crash can fall between a checkpoint's ask and its write.
    pub checkpoint_delay: Duration,
    /// The size of a stored checkpoint's parts (0: 4 MiB): one holds as many of the
    /// checkpoint's pieces as fit, and a piece larger than that alone; see
    /// `driver::checkpoint`.
    pub checkpoint_part_bytes: usize,
}

enum Event {
    Request(Incoming),
    CallResult(u64, Result<pb::ChunkResponse, RpcError>),
    Tick,
    Checkpointed(Sealed),
}

type Incoming = crate::runtime::Incoming;

/// The master's durable state: its latest checkpoint and the log records after it.
#[derive(Clone, Debug)]
pub struct Durable {
    pub checkpoint: Option<pb::Checkpoint>,
    /// How many parts the checkpoint lies in (`driver::checkpoint`).
    pub checkpoint_parts: u32,
    pub tail: Vec<(LogSeq, pb::LogRecord)>,
}

impl Durable {
    /// Records the checkpoint covers that are still stored. None are left now; a fresh
    /// log's first record was left behind by every checkpoint before the checkpointer
    /// was built beside the master (its lowest record was taken to be the second).
    /// Recovery skips them; the driver deletes them at start-up.
    pub fn stale(&self) -> impl Iterator<Item = LogSeq> + '_ {
        let through = self.checkpoint.as_ref().map_or(0, |c| c.through_seq);
        self.tail
            .iter()
            .map(|(s, _)| *s)
            .take_while(move |&s| s <= through)
    }
}

/// Loads the checkpoint and the log tail from `store` and rebuilds the master.
/// Also returns what the next batch must know of the store.
pub async fn recover<M: MetaStore>(
    store: &mut M,
    cfg: MasterConfig,
    now: crate::Time,
) -> Result<(Master, Held), DriverError> {
    rebuild(cfg, now, &load(store).await?)
}

/// Reads the checkpoint and the log tail from `store`, each value checked.
pub async fn load<M: MetaStore>(store: &mut M) -> Result<Durable, DriverError> {
    let bad = |what: String| DriverError::Recovery(what);
    let damaged = |what: String, e: String| {
        DriverError::Recovery(format!(
            "the master's log is damaged: {what}: {e}; refusing to start on it \
             (restore the data directory from a copy)"
        ))
    };
    if !store.scan(crate::group::store::PREFIX).await?.is_empty() {
        return Err(bad(
            "this data directory holds a master group replica's log, not a single \
             master's: a single master does not start on it (start it with --peers, as \
             the replica it is)"
                .into(),
        ));
    }
    let loaded = super::checkpoint::load(store.scan(CHECKPOINT_KEY).await?)
        .map_err(|e| damaged("checkpoint".into(), e))?;
    // Values are written in order, checkpoint before the records after it; once one was
    // sealed every later one is. An unsealed value after a sealed one is damage that
    // happened to look like an old value (its first byte changed by several bits).
    let mut sealed_seen = loaded.as_ref().is_some_and(|l| l.sealed);
    let checkpoint_parts = loaded.as_ref().map_or(0, |l| l.parts);
    let checkpoint = loaded.map(|l| l.checkpoint);
    if let Some(cp) = &checkpoint
        && cp.through_seq > MAX_SEQ
    {
        return Err(damaged(
            "checkpoint".into(),
            format!("through record {}, past any log", cp.through_seq),
        ));
    }
    let mut tail = Vec::new();
    for (k, v) in store.scan(LOG_PREFIX).await? {
        let seq: [u8; 8] = k[LOG_PREFIX.len()..]
            .try_into()
            .map_err(|_| bad(format!("log key {k:?}")))?;
        let seq = u64::from_be_bytes(seq);
        if seq > MAX_SEQ {
            return Err(damaged(format!("log key {k:?}"), "past any log".into()));
        }
        let (rec, sealed) =
            open::<pb::LogRecord>(&v).map_err(|e| damaged(format!("log record {seq}"), e))?;
        if sealed_seen && !sealed {
            return Err(damaged(
                format!("log record {seq}"),
                "not sealed, after a value that was".into(),
            ));
        }
        sealed_seen |= sealed;
        tail.push((seq, rec));
    }
    Ok(Durable {
        checkpoint,
        checkpoint_parts,
        tail,
    })
}

/// The log on its way to the store: the batch the next sync writes, and the
/// checkpointer beside the loop that builds the checkpoints the master says are due.
struct Logging {
    batch: LogBatch,
    /// The checkpointer's feeds; closed once its task ended.
    feeds: mpsc::UnboundedSender<Feed>,
    /// The last record fed to the checkpointer.
    fed: LogSeq,
    /// A checkpoint is being built.
    building: bool,
}

impl Logging {
    /// Takes a step's records into the batch and feeds them to the checkpointer, then
    /// asks for a checkpoint if one is due. One that falls due while another is being
    /// built is let go: the master says the next is due `checkpoint_every` records on.
    /// The log then holds about twice that many records at most, unless a build takes
    /// longer than the master takes to log `checkpoint_every` records.
    fn add(&mut self, effects: &mut Effects) {
        self.batch.add(effects);
        if let Some((last, _)) = effects.log.last() {
            self.fed = *last;
            // Moved, not copied: the batch holds them sealed. Closed only if the
            // checkpointer's task ended: the loop stops at its next turn.
            let records = std::mem::take(&mut effects.log);
            let _ = self.feeds.unbounded_send(Feed::Apply(records));
        }
        if let Some(through) = effects.checkpoint_due.take()
            && !self.building
        {
            assert_eq!(
                through, self.fed,
                "a checkpoint due through the last record"
            );
            self.building = true;
            let _ = self.feeds.unbounded_send(Feed::Take { through });
        }
    }

    /// A checkpoint came back: it goes into the next batch.
    fn built(&mut self, cp: Sealed) {
        self.building = false;
        self.batch.checkpoint(cp);
    }
}

/// Starts the checkpointer on a task of its own, on the state recovery read.
fn start_checkpointer<R: Runtime>(
    rt: &R,
    opts: &MasterOptions,
    durable: std::sync::Arc<Durable>,
    tx: &mpsc::UnboundedSender<Event>,
) -> mpsc::UnboundedSender<Feed> {
    let (chunk_size, delay) = (opts.config.chunk_size, opts.checkpoint_delay);
    let part_bytes = opts.checkpoint_part_bytes;
    let (feeds, mut fed) = mpsc::unbounded::<Feed>();
    let (tx, rt2) = (tx.clone(), rt.clone());
    rt.spawn(async move {
        // The master recovered from the same values, so they recover here too.
        let mut checkpointer =
            Checkpointer::recover(chunk_size, durable.checkpoint.as_ref(), &durable.tail)
                .expect("the master recovered from the same durable state");
        drop(durable);
        while let Some(f) = fed.next().await {
            let through = match f {
                Feed::Apply(records) => {
                    checkpointer.apply(records);
                    continue;
                }
                Feed::Take { through } => through,
            };
            if !delay.is_zero() {
                rt2.sleep(delay).await;
            }
            let began = rt2.now();
            // A walk of the whole namespace and its encoding: off the threads that run
            // tasks. Records fed meanwhile wait in the channel.
            let (back, sealed) = rt2
                .run_blocking(move || {
                    // Encoded into parts as the walk goes: the loop only writes them.
                    let sealed = Sealed::build(through, checkpointer.take(through), part_bytes);
                    (checkpointer, sealed)
                })
                .await;
            checkpointer = back;
            let (parts, bytes) = sealed.size();
            tracing::info!(
                through = sealed.through_seq,
                entries = sealed.entries,
                chunks = sealed.chunks,
                parts,
                bytes,
                took_ms = rt2.now().saturating_sub(began).as_millis() as u64,
                "checkpoint built beside the master"
            );
            if tx.unbounded_send(Event::Checkpointed(sealed)).is_err() {
                return;
            }
        }
    });
    feeds
}

/// The master `durable` describes, and what the next batch must know of the store.
pub fn rebuild(
    cfg: MasterConfig,
    now: crate::Time,
    durable: &Durable,
) -> Result<(Master, Held), DriverError> {
    let Durable {
        checkpoint,
        checkpoint_parts,
        tail,
    } = durable;
    let records = tail.len();
    // The lowest record the next checkpoint deletes: one past this checkpoint (those it
    // covers are `Durable::stale`), else the first stored, else the next one logged (a
    // fresh log's cluster id record is logged at recovery, and is record 1).
    let low = match checkpoint {
        Some(cp) => cp.through_seq + 1,
        None => tail.first().map_or(1, |(s, _)| *s),
    };
    let m = Master::recover_from(cfg, now, checkpoint.as_ref(), tail)
        .map_err(|e| DriverError::Recovery(e.to_string()))?;
    tracing::info!(
        records,
        through = m.last_seq(),
        files = m.meta().ns.file_count(),
        chunks = m.meta().chunks.len(),
        "master recovered"
    );
    let held = Held {
        low_seq: low,
        checkpoint_parts: *checkpoint_parts,
    };
    Ok((m, held))
}

/// Runs the master until its store fails. Start-up is recovery.
pub async fn run<R: Runtime, T: Transport, M: MetaStore, O: Observer>(
    rt: R,
    transport: T,
    mut store: M,
    opts: MasterOptions,
    mut observer: O,
) -> Result<(), DriverError> {
    let mut opts = opts;
    // The quiet period after a restart must cover the longest a grant this driver sends
    // can be in flight: its own deadline (see `MasterConfig::call_timeout`).
    opts.config.call_timeout = opts.config.call_timeout.max(opts.call_timeout);
    // Shared with the checkpointer's task, which rebuilds its copy from it too.
    let durable = std::sync::Arc::new(load(&mut store).await?);
    let now = rt.now();
    // The seed of the master's choices: with the durable state and the inputs, all a
    // run needs to be replayed (`tessera replay node`).
    tracing::info!(rng_seed = opts.config.rng_seed, "master starting");
    observer.master_started(
        now,
        MasterStart {
            config: &opts.config,
            checkpoint: durable.checkpoint.as_ref(),
            tail: &durable.tail,
            epoch: 0,
        },
    );
    // The last record the store holds: durable (a fresh log's cluster id, made at
    // recovery, is not yet).
    let recovered = durable
        .tail
        .last()
        .map_or(0, |(s, _)| *s)
        .max(durable.checkpoint.as_ref().map_or(0, |c| c.through_seq));
    let (mut master, mut held) = rebuild(opts.config.clone(), now, &durable)?;
    // Call results, ticks and checkpoints, which the master itself started, come
    // through `events`.
    let (tx, mut events) = mpsc::unbounded::<Event>();
    // Records (and a checkpoint) not yet written: the steps since the last sync, or the
    // step that learned of a sync (they go into the next batch at once, without waiting
    // for an event).
    let mut log = Logging {
        batch: LogBatch::default(),
        feeds: start_checkpointer(&rt, &opts, durable.clone(), &tx),
        // What the checkpointer starts from: the durable state (a fresh log's cluster id
        // record, made at recovery, comes in the first step's records).
        fed: recovered,
        building: false,
    };
    {
        let (rt2, mut tx) = (rt.clone(), tx.clone());
        let tick = opts.tick;
        rt.spawn(async move {
            loop {
                rt2.sleep(tick).await;
                if tx.send(Event::Tick).await.is_err() {
                    return;
                }
            }
        });
    }
    let mut replies: HashMap<RequestId, oneshot::Sender<Parts>> = HashMap::new();
    let mut next_request: RequestId = 1;
    // This run's epoch (`Master::start_alone`) is durable before the master serves or
    // sends anything: a chunkserver that stored it must never see a later run take it
    // again. The first step only collects the records.
    master.start_alone();
    let mut effects = step(
        &rt,
        &mut master,
        &mut observer,
        Input::LogSynced { through: recovered },
    );
    log.add(&mut effects);
    dispatch(&rt, &transport, &tx, &opts, &mut replies, effects);
    log.batch.delete(durable.stale());
    drop(durable);
    let commit = std::mem::take(&mut log.batch).commit(&mut held);
    assert!(
        commit.checkpoint.is_none(),
        "no checkpoint comes back before the loop reads its events"
    );
    store.write_synced(commit.writes).await?;
    if let Some(through) = commit.through {
        let mut effects = step(
            &rt,
            &mut master,
            &mut observer,
            Input::LogSynced { through },
        );
        log.add(&mut effects);
        dispatch(&rt, &transport, &tx, &opts, &mut replies, effects);
    }
    // Requests are taken from the transport's bounded queue as the loop gets to them,
    // not forwarded into an unbounded one: when the master falls behind, callers wait in
    // the transport, which bounds how many and how many bytes, and the wait reaches the
    // sockets as back-pressure. The same holds while a sync is slow: the loop stops
    // taking requests once the next batch holds `MAX_WAITING` writes.
    let mut inbound = transport.listen(&opts.listen).await?;
    tracing::info!(addr = %opts.listen, epoch = master.epoch(), "master serving");
    // The sync under way, which holds the store until it is done. The master goes on
    // meanwhile: it takes requests and results, and their records gather in the next
    // batch, which goes to the store once this sync is done (group commit, pipelined:
    // the disk is never idle while records wait, and the master is never idle while
    // the disk syncs). Batches are written strictly one after another, so the store
    // always holds a prefix of the log.
    let mut store = Some(store);
    let mut syncing: Option<Syncing<M>> = None;
    loop {
        if log.feeds.is_closed() {
            // Its task ended: it panicked (a bug; the master's own state is sound).
            // Without it no checkpoint comes back and the log grows for ever: the master
            // stops, as at a crash, and starts again on its store.
            return Err(DriverError::Stopped(
                "the master's checkpointer stopped; the master stops too".into(),
            ));
        }
        if syncing.is_none() && !log.batch.is_empty() {
            let commit = std::mem::take(&mut log.batch).commit(&mut held);
            let mut s = store
                .take()
                .expect("the store is back once its sync is done");
            let Commit {
                writes,
                through,
                checkpoint,
            } = commit;
            let logged = master.last_seq();
            syncing = Some(Box::pin(async move {
                let done = s.write_synced(writes).await;
                (
                    s,
                    done.map(|()| Synced {
                        through,
                        checkpoint,
                        logged,
                    }),
                )
            }));
        }
        // While a sync is under way and the next batch is already large (a slow disk),
        // new requests wait in the transport, whose bounded queue pushes back on callers;
        // results and ticks are still taken.
        let requests = |log: &Logging, syncing: &Option<Syncing<M>>| {
            syncing.is_none() || log.batch.len() < MAX_WAITING
        };
        let take = requests(&log, &syncing);
        let mut ev = match next_event(&mut events, &mut inbound, &mut syncing, take).await {
            Some(Next::Synced(s, done)) => {
                syncing = None;
                store = Some(s);
                let synced = done?;
                if let Some(cp) = &synced.checkpoint {
                    observer.master_checkpointed(rt.now(), cp, synced.logged);
                }
                if let Some(through) = synced.through {
                    let mut effects = step(
                        &rt,
                        &mut master,
                        &mut observer,
                        Input::LogSynced { through },
                    );
                    // A sync can release work that logs (a grant reserving its version).
                    log.add(&mut effects);
                    dispatch(&rt, &transport, &tx, &opts, &mut replies, effects);
                }
                // Start the next sync before taking more events.
                continue;
            }
            Some(Next::Event(e)) => Some(e),
            None => break,
        };
        // Every event ready now, up to a bound (so a flood cannot hold back the next
        // sync), so one sync covers the records of all of them.
        let mut taken = 0;
        while let Some(e) = ev.take() {
            let input = match e {
                Event::Request(inc) => {
                    let id = next_request;
                    next_request += 1;
                    replies.insert(id, inc.reply);
                    observer.request(id, &inc.peer, inc.arrived);
                    match pb::MasterRequest::decode(PartsReader::from(inc.body)) {
                        Ok(req) => Input::Request {
                            id,
                            req,
                            from: inc.from,
                        },
                        Err(e) => Input::Malformed {
                            id,
                            error: e.to_string(),
                        },
                    }
                }
                Event::CallResult(id, result) => Input::CallResult { id, result },
                Event::Tick => Input::Tick,
                Event::Checkpointed(cp) => {
                    log.built(cp);
                    ev = try_event(&mut events, &mut inbound, requests(&log, &syncing));
                    continue;
                }
            };
            let mut effects = step(&rt, &mut master, &mut observer, input);
            log.add(&mut effects);
            dispatch(&rt, &transport, &tx, &opts, &mut replies, effects);
            taken += 1;
            if taken < BATCH_LIMIT {
                ev = try_event(&mut events, &mut inbound, requests(&log, &syncing));
            }
        }
    }
    Ok(())
}

/// The most events taken before the loop looks at the sync under way again.
const BATCH_LIMIT: usize = 1024;

/// The most writes the next batch gathers while a sync is under way before the loop
/// stops taking requests (it still takes results and ticks): hundreds of times what a
/// batch holds at full speed (a sync's worth of creates, 8-16 on a real disk with 16
/// clients), so only a disk slow to sync meets it.
pub const MAX_WAITING: usize = 4 * 1024;

/// What a finished sync made durable: the last record of its batch, the checkpoint it
/// wrote, and the last record the master had logged when the batch was made.
struct Synced {
    through: Option<LogSeq>,
    checkpoint: Option<Sealed>,
    logged: LogSeq,
}

/// A sync under way: it gives the store back, and what it made durable.
type Syncing<M> = Pin<Box<dyn Future<Output = (M, Result<Synced, StoreError>)> + Send>>;

/// The next thing the loop does.
enum Next<M> {
    /// The sync under way ended.
    Synced(M, Result<Synced, StoreError>),
    Event(Event),
}

/// The next thing to do: the end of the sync under way first (it releases replies and
/// lets the next batch go), then a result or tick (they finish work already begun), else
/// a request. Ends when `events` does; a transport that stopped serving just sends no
/// more requests.
async fn next_event<M>(
    events: &mut mpsc::UnboundedReceiver<Event>,
    inbound: &mut mpsc::Receiver<Incoming>,
    syncing: &mut Option<Syncing<M>>,
    requests: bool,
) -> Option<Next<M>> {
    futures::future::poll_fn(|cx| {
        if let Some(s) = syncing.as_mut()
            && let Poll::Ready((store, done)) = s.as_mut().poll(cx)
        {
            return Poll::Ready(Some(Next::Synced(store, done)));
        }
        if let Poll::Ready(e) = events.poll_next_unpin(cx) {
            return Poll::Ready(e.map(Next::Event));
        }
        if requests
            && !inbound.is_terminated()
            && let Poll::Ready(Some(req)) = inbound.poll_next_unpin(cx)
        {
            return Poll::Ready(Some(Next::Event(Event::Request(req))));
        }
        Poll::Pending
    })
    .await
}

/// An event that is ready now, if any, in the order [`next_event`] takes them
/// (requests only if `requests`).
fn try_event(
    events: &mut mpsc::UnboundedReceiver<Event>,
    inbound: &mut mpsc::Receiver<Incoming>,
    requests: bool,
) -> Option<Event> {
    events.try_recv().ok().or_else(|| {
        requests
            .then(|| inbound.try_recv().ok())
            .flatten()
            .map(Event::Request)
    })
}

fn step<R: Runtime, O: Observer>(
    rt: &R,
    master: &mut Master,
    observer: &mut O,
    input: Input,
) -> Effects {
    let now = rt.now();
    let effects = master.handle(now, input.clone());
    observer.master_step(now, &input, &effects, master);
    effects
}

fn dispatch<R: Runtime, T: Transport>(
    rt: &R,
    transport: &T,
    tx: &mpsc::UnboundedSender<Event>,
    opts: &MasterOptions,
    replies: &mut HashMap<RequestId, oneshot::Sender<Parts>>,
    effects: Effects,
) {
    for (id, resp) in effects.replies {
        if let Some(reply) = replies.remove(&id) {
            // A caller that gave up is no error of ours.
            let _ = reply.send(resp.encode_to_vec().into());
        }
    }
    for call in effects.calls {
        spawn_call(
            rt,
            transport,
            tx,
            opts.call_timeout,
            call,
            Event::CallResult,
        );
    }
}

/// Makes a master's call to a chunkserver on a task of its own; its result comes back
/// through `tx` as `result(id, outcome)`. Shared by the single master's and a group
/// replica's drivers.
pub(crate) fn spawn_call<R: Runtime, T: Transport, E: Send + 'static>(
    rt: &R,
    transport: &T,
    tx: &mpsc::UnboundedSender<E>,
    default_timeout: Duration,
    call: crate::master::Call,
    result: fn(u64, Result<pb::ChunkResponse, RpcError>) -> E,
) {
    let (transport, tx) = (transport.clone(), tx.clone());
    let deadline = rt.now() + call.timeout.unwrap_or(default_timeout);
    rt.spawn(async move {
        let outcome = transport
            .call(
                &call.to,
                crate::auth::ServerRole::Chunkserver,
                call.req.encode_to_vec().into(),
                deadline,
            )
            .await
            .and_then(|b| {
                pb::ChunkResponse::decode(b).map_err(|e| RpcError::Decode(e.to_string()))
            });
        let _ = tx.unbounded_send(result(call.id, outcome));
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb::log_record::Op;
    use crate::runtime::MetaStore;
    use crate::testkit::MemMetaStore;

    fn rec(time_ms: u64, op: Op) -> pb::LogRecord {
        pb::LogRecord {
            time_ms,
            token: 0,
            op: Some(op),
        }
    }

    fn mkdir(p: &str) -> Op {
        Op::Mkdir(pb::MkdirOp {
            perms: None,
            path: p.into(),
        })
    }

    /// CRC32C finds every flipped bit of a value (the format byte and the checksum
    /// included) and every cut; a value from before sealing is still read.
    #[test]
    fn a_sealed_value_shows_every_flipped_bit_and_every_cut() {
        let r = rec(1234, mkdir("/some/dir"));
        let v = seal(&r);
        assert_eq!(unseal::<pb::LogRecord>(&v), Ok(r.clone()));
        for bit in 0..v.len() * 8 {
            let mut bad = v.to_vec();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(unseal::<pb::LogRecord>(&bad).is_err(), "bit {bit}");
        }
        for len in 0..v.len() {
            assert!(unseal::<pb::LogRecord>(&v[..len]).is_err(), "cut to {len}");
        }
        assert_eq!(unseal::<pb::LogRecord>(&r.encode_to_vec()), Ok(r.clone()));
        let cp = pb::Checkpoint {
            through_seq: 3,
            ..Default::default()
        };
        assert_eq!(
            unseal::<pb::Checkpoint>(&cp.encode_to_vec()),
            Ok(cp.clone())
        );
        assert_eq!(unseal::<pb::Checkpoint>(&seal(&cp)), Ok(cp));
    }

    /// A record that still decodes after a bit flips in it (a directory's name changes)
    /// is refused at recovery, as is a damaged checkpoint; the store is left as it was.
    #[test]
    fn a_master_refuses_to_start_on_a_damaged_log() {
        let mut store = MemMetaStore::default();
        let records = [
            rec(
                1,
                Op::ClusterId(pb::ClusterIdOp {
                    root: None,
                    cluster_id: 7,
                }),
            ),
            rec(2, mkdir("/a")),
        ];
        let batch = records
            .iter()
            .zip(1..)
            .map(|(r, seq)| (log_key(seq), Some(seal(r))))
            .collect();
        let start = |store: &mut MemMetaStore| {
            futures::executor::block_on(recover(store, MasterConfig::default(), crate::Time(0)))
        };
        futures::executor::block_on(async {
            store.write(batch).await.unwrap();
            store.sync().await.unwrap();
        });
        let (m, _) = start(&mut store).expect("a sound log");
        assert!(m.meta().ns.dir_id("/a").is_ok());

        // '/a' becomes '/c': still a valid record.
        let mut v = seal(&records[1]).to_vec();
        let at = v.len() - 1;
        v[at] ^= 0b10;
        assert_eq!(
            pb::LogRecord::decode(&v[5..]).map(|r| r.op),
            Ok(Some(mkdir("/c")))
        );
        futures::executor::block_on(store.write(vec![(log_key(2), Some(v.into()))])).unwrap();
        let err = start(&mut store).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("log is damaged: log record 2: checksum mismatch"),
            "{err}"
        );

        let mut cp = seal(&pb::Checkpoint {
            through_seq: 2,
            next_handle: 1,
            cluster_id: 7,
            ..Default::default()
        })
        .to_vec();
        cp[6] ^= 1;
        futures::executor::block_on(store.write(vec![
            (log_key(2), Some(seal(&records[1]))),
            (CHECKPOINT_KEY.to_vec(), Some(cp.into())),
        ]))
        .unwrap();
        let err = start(&mut store).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("log is damaged: checkpoint: "), "{err}");

        // An old (unsealed) record after a sealed one: damage that looks like an old
        // value. Old records before sealed ones are read.
        futures::executor::block_on(store.write(vec![
            (CHECKPOINT_KEY.to_vec(), None),
            (log_key(1), Some(records[0].encode_to_vec().into())),
            (log_key(2), Some(seal(&records[1]))),
        ]))
        .unwrap();
        assert!(start(&mut store).is_ok(), "old records before sealed ones");
        futures::executor::block_on(store.write(vec![
            (log_key(1), Some(seal(&records[0]))),
            (log_key(2), Some(records[1].encode_to_vec().into())),
        ]))
        .unwrap();
        let err = start(&mut store).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("log record 2: not sealed"), "{err}");

        // An unsealed checkpoint (unchecked) through a record no log reaches: refused,
        // not a number that overflows the next.
        let mut store = MemMetaStore::default();
        let cp = pb::Checkpoint {
            through_seq: u64::MAX,
            ..Default::default()
        };
        futures::executor::block_on(store.write(vec![(
            CHECKPOINT_KEY.to_vec(),
            Some(cp.encode_to_vec().into()),
        )]))
        .unwrap();
        let err = start(&mut store).map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("checkpoint: through record 18446744073709551615, past any log"),
            "{err}"
        );
        futures::executor::block_on(store.write(vec![
            (CHECKPOINT_KEY.to_vec(), None),
            (log_key(u64::MAX), Some(records[0].encode_to_vec().into())),
        ]))
        .unwrap();
        let err = start(&mut store).map(|_| ()).unwrap_err().to_string();
        assert!(err.contains("past any log"), "{err}");
    }
}
