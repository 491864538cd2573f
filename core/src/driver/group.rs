//! Runs one master replica of a group (`crate::group`) over a `Runtime`, a `Transport`
//! and a `MetaStore`.
//!
//! The replica's store holds its copy of the replicated log (`group::store`). An empty
//! store is formatted with the group's members only when asked to (`bootstrap`, a new
//! group's first start); every other start is recovery from what the store holds. Writes the replica asks for (`Persist`) from every
//! event ready at once go to the store as one batch with one sync (group commit), and
//! only then does the replica hear `Persisted`. Messages to other replicas are calls
//! whose answers are not waited for: raft-rs retries what is lost.
//!
//! A replica whose transport stops serving it stops: it can no longer take part.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use futures::channel::{mpsc, oneshot};
use futures::stream::FusedStream;
use futures::{SinkExt, StreamExt};
use prost::Message;

use super::{DriverError, MasterStart, Observer};
use crate::error::{RpcError, StoreError};
use crate::group::{self, GroupConfig, Input, LogStore, Replica};
use crate::master::{MasterConfig, RequestId};
use crate::pb;
use crate::runtime::{Incoming, MetaStore, Parts, PartsReader, Runtime, Transport};
use crate::types::Time;

#[derive(Clone, Debug)]
pub struct GroupOptions {
    pub group: GroupConfig,
    pub master: MasterConfig,
    /// How often the leader's master checks liveness, re-replication and garbage.
    pub tick: Duration,
    /// Deadline for calls to chunkservers and messages to other replicas.
    pub call_timeout: Duration,
    /// Form a new group: this replica's store must be empty, and is formatted with the
    /// group's members. Without it a replica starts only on the state its store holds:
    /// a replica whose data was lost must not come back under its old id with an empty
    /// log (it may have voted, or acknowledged entries, that it no longer remembers).
    pub bootstrap: bool,
    /// Join a running group: this replica's store must be empty, and is formatted with
    /// no members. The replica takes the group's log from its leader once an admin has
    /// added it (`tessera admin masters add`), and votes only once the leader has made
    /// it a voter.
    pub join: bool,
    /// How long the checkpointer waits before it builds each checkpoint: zero on real
    /// machines, where building takes what it takes. The simulator, where it takes no
    /// time, sets it so that checkpoints come back after more entries were applied.
    pub checkpoint_delay: Duration,
}

enum Event {
    CallResult(u64, Result<pb::ChunkResponse, RpcError>),
    Tick,
    RaftTick,
    Checkpointed(group::checkpointer::Taken),
    MasterCopy(group::checkpointer::Handover),
    /// Another replica's answer to a call of this one's, with messages in it, and when
    /// it arrived.
    Answer(pb::RaftBatch, Time),
}

/// Reads the replica's store: its log, or, with `bootstrap` and an empty store, a new
/// group's, or, with `join`, a joining replica's.
pub async fn load<M: MetaStore>(
    store: &mut M,
    group: &GroupConfig,
    bootstrap: bool,
    join: bool,
) -> Result<LogStore, DriverError> {
    if bootstrap && join {
        return Err(DriverError::Recovery(
            "--bootstrap forms a new group and --join joins a running one: give one".into(),
        ));
    }
    let single = !store.scan(super::master::LOG_PREFIX).await?.is_empty()
        || !store.scan(super::master::CHECKPOINT_KEY).await?.is_empty();
    if single {
        return Err(DriverError::Recovery(
            "this data directory holds a single master's log, not a master group \
             replica's: a replica does not start on it (start it as a single master, \
             without --peers)"
                .into(),
        ));
    }
    let values = store.scan(group::store::PREFIX).await?;
    if values.is_empty() {
        if join {
            let joining = LogStore::joining();
            store.write(joining.format()).await?;
            store.sync().await?;
            tracing::info!(
                id = group.id,
                "master replica formatted its store to join a group"
            );
            return Ok(joining);
        }
        if !bootstrap {
            return Err(DriverError::Recovery(format!(
                "replica {}'s data directory holds no group state: give --bootstrap on \
                 every replica's first start to form a new group, or --join to join a \
                 running group under a new id. A replica whose data was lost must not \
                 rejoin under its old id, nor on an older copy of its data (it may have \
                 voted for, or acknowledged, entries that it would no longer hold): remove \
                 it from the group (`tessera admin masters remove ID`) and add a new \
                 replica under a new id (`--join`, then `tessera admin masters add`)",
                group.id
            )));
        }
        let fresh = LogStore::fresh(group.members.clone());
        store.write(fresh.format()).await?;
        store.sync().await?;
        tracing::info!(id = group.id, members = ?group.members, "master replica formatted its store");
        return Ok(fresh);
    }
    if bootstrap || join {
        return Err(DriverError::Recovery(format!(
            "replica {} already holds group state: --bootstrap and --join are only for a \
             replica's first start; start it without them",
            group.id
        )));
    }
    let log = LogStore::load(values).map_err(DriverError::Recovery)?;
    let named: Vec<u64> = group.members.keys().copied().collect();
    if !log.members().addresses.is_empty() {
        // The log says who the members are now; --peers may be the list the group was
        // formed with, or one from before a change.
        if log.members().addresses.keys().copied().collect::<Vec<_>>() != named {
            tracing::info!(
                id = group.id,
                members = ?log.members().addresses,
                "the group's members, as its log holds them, differ from --peers; the log's are used"
            );
        }
        return Ok(log);
    }
    if log.voters().is_empty() {
        // Joined, and not yet reached by the group.
        return Ok(log);
    }
    if log.voters() != named {
        return Err(DriverError::Recovery(format!(
            "replica {}'s store holds a group of replicas {:?}, but --peers names {:?}: \
             give every replica the list the group was formed with",
            group.id,
            log.voters(),
            named
        )));
    }
    Ok(log)
}

/// Runs the replica until its store fails or its transport stops serving it.
pub async fn run<R: Runtime, T: Transport, M: MetaStore, O: Observer>(
    rt: R,
    transport: T,
    mut store: M,
    opts: GroupOptions,
    mut observer: O,
) -> Result<(), DriverError> {
    let mut opts = opts;
    opts.master.call_timeout = opts.master.call_timeout.max(opts.call_timeout);
    let log = load(&mut store, &opts.group, opts.bootstrap, opts.join).await?;
    let listen = opts.group.members[&opts.group.id].clone();
    let mut replica = Replica::start(opts.group.clone(), opts.master.clone(), rt.now(), log)
        .map_err(DriverError::Recovery)?;
    if observer.watches_masters() {
        replica.observe();
    }
    replica.hold_proposals();
    let mut inbound = transport.listen(&listen).await?;
    tracing::info!(id = opts.group.id, addr = %listen, "master replica serving");
    let (tx, mut events) = mpsc::unbounded::<Event>();
    for (every, what) in [(opts.tick, 0), (opts.group.tick, 1)] {
        let (rt2, mut tx) = (rt.clone(), tx.clone());
        rt.spawn(async move {
            loop {
                rt2.sleep(every).await;
                let e = if what == 0 {
                    Event::Tick
                } else {
                    Event::RaftTick
                };
                if tx.send(e).await.is_err() {
                    return;
                }
            }
        });
    }
    // The checkpointer runs on a task of its own, so building a checkpoint never holds
    // up the replica's event loop (`group::checkpointer`).
    let (feeds, mut fed) = mpsc::unbounded::<group::checkpointer::Feed>();
    if let Some(mut checkpointer) = replica.take_checkpointer() {
        let (tx, rt2, delay) = (tx.clone(), rt.clone(), opts.checkpoint_delay);
        rt.spawn(async move {
            while let Some(f) = fed.next().await {
                let slow = matches!(
                    f,
                    group::checkpointer::Feed::Take(_) | group::checkpointer::Feed::Copy { .. }
                );
                if slow && !delay.is_zero() {
                    rt2.sleep(delay).await;
                }
                // A walk of the whole state, or a state rebuilt from a snapshot: off the
                // threads that run tasks. Entries fed meanwhile wait in the channel.
                let blocking = slow || matches!(f, group::checkpointer::Feed::Reset(_));
                let built = if blocking {
                    let (back, built) = rt2
                        .run_blocking(move || {
                            let built = checkpointer.feed(f);
                            (checkpointer, built)
                        })
                        .await;
                    checkpointer = back;
                    built
                } else {
                    checkpointer.feed(f)
                };
                let event = match built {
                    Some(group::checkpointer::Built::Checkpoint(t)) => Event::Checkpointed(t),
                    Some(group::checkpointer::Built::Copy(h)) => Event::MasterCopy(h),
                    None => continue,
                };
                if tx.unbounded_send(event).is_err() {
                    return;
                }
            }
        });
    }
    let mut out = Out {
        replies: HashMap::new(),
        writes: Vec::new(),
        persisted: None,
        outbox: Vec::new(),
        feeds,
    };
    let mut next_request: RequestId = 1;
    let mut origins = Origins::new();
    let watched = observer.watches_masters();
    // The sync under way, which holds the store until it is done. The replica goes on
    // meanwhile: a leader proposes what arrives and counts its followers' answers while
    // its own write is on its way to disk, and the writes made meanwhile go to disk
    // together in the next sync (group commit).
    let mut store = Some(store);
    let mut syncing: Option<Syncing<M>> = None;
    loop {
        if out.feeds.is_closed() {
            // Its task ended: it panicked (a bug; the replica's own copy of the state is
            // sound). Without it no checkpoint comes back and the log grows for ever: the
            // replica stops, as at a crash, and starts again on its store.
            return Err(DriverError::Stopped(
                "the replica's checkpointer stopped; the replica stops too".into(),
            ));
        }
        if syncing.is_none()
            && let Some(number) = out.persisted.take()
        {
            let mut s = store
                .take()
                .expect("the store is back once its sync is done");
            let batch = std::mem::take(&mut out.writes);
            syncing = Some(Box::pin(async move {
                let done = s.write_synced(batch).await;
                (s, done.map(|()| number))
            }));
        }
        let mut ev = match next_event(&mut events, &mut inbound, &mut syncing).await {
            Some(Next::Synced(s, done)) => {
                syncing = None;
                store = Some(s);
                let number = done?;
                let effects = step(
                    &rt,
                    &mut replica,
                    &mut observer,
                    &mut origins,
                    Input::Persisted { number },
                );
                dispatch(&rt, &transport, &tx, &opts, &mut out, &replica, effects);
                None
            }
            Some(Next::Step(e)) => Some(e),
            None => break,
        };
        // Every event ready now (up to a bound, so a flood cannot hold back the sync
        // and the messages of those taken), so one sync covers the writes of all of them.
        let mut taken = 0;
        while let Some(e) = ev.take() {
            let input = match e {
                Step::Request(inc) => {
                    let id = next_request;
                    next_request += 1;
                    out.replies.insert(id, inc.reply);
                    if watched {
                        origins.insert(id, (inc.peer.clone(), inc.arrived));
                    }
                    match pb::MasterRequest::decode(PartsReader::from(inc.body)) {
                        Ok(req) => Input::Request {
                            id,
                            req,
                            arrived: inc.arrived,
                            from: inc.from,
                        },
                        Err(e) => Input::Malformed {
                            id,
                            error: e.to_string(),
                        },
                    }
                }
                Step::Event(Event::CallResult(id, result)) => Input::CallResult { id, result },
                Step::Event(Event::Tick) => Input::Tick,
                Step::Event(Event::RaftTick) => Input::RaftTick,
                Step::Event(Event::Checkpointed(t)) => Input::Checkpointed(t),
                Step::Event(Event::MasterCopy(h)) => Input::MasterCopy(h),
                Step::Event(Event::Answer(batch, arrived)) => Input::Answer { batch, arrived },
            };
            let effects = step(&rt, &mut replica, &mut observer, &mut origins, input);
            dispatch(&rt, &transport, &tx, &opts, &mut out, &replica, effects);
            taken += 1;
            if taken < BATCH_LIMIT {
                ev = try_event(&mut events, &mut inbound);
            }
        }
        // The master's records from every step of the batch, as one entry.
        let effects = step(&rt, &mut replica, &mut observer, &mut origins, Input::Flush);
        dispatch(&rt, &transport, &tx, &opts, &mut out, &replica, effects);
        send(&rt, &transport, &tx, &opts, &mut out.outbox);
        if inbound.is_terminated() {
            tracing::warn!(addr = %listen, "master replica no longer served; stopping");
            break;
        }
    }
    Ok(())
}

/// The most events taken into one batch before its messages go out and its sync starts.
const BATCH_LIMIT: usize = 1024;

/// A sync under way: it gives the store back, and the number of the last `Persist` it
/// made durable.
type Syncing<M> = Pin<Box<dyn Future<Output = (M, Result<u64, StoreError>)> + Send>>;

/// Sends what `outbox` holds, one call per replica. The parts of a snapshot go one
/// after another, each with a deadline of its own from when it is sent: sent at once,
/// they would share one deadline however large the snapshot (and fill the receiver's
/// request memory), and a large one would never arrive whole.
fn send<R: Runtime, T: Transport>(
    rt: &R,
    transport: &T,
    tx: &mpsc::UnboundedSender<Event>,
    opts: &GroupOptions,
    outbox: &mut Vec<(String, pb::RaftMessage)>,
) {
    let calls = group::wire::batches(std::mem::take(outbox), opts.group.snapshot_part_bytes);
    // The parts for each address, in order.
    let mut parts: Vec<(String, Vec<pb::MasterRequest>)> = Vec::new();
    for (to, msg) in calls {
        if let Some(pb::master_request::Req::RaftBatch(b)) = &msg.req
            && !b.snapshot_parts.is_empty()
        {
            match parts.iter_mut().find(|(a, _)| *a == to) {
                Some((_, v)) => v.push(msg),
                None => parts.push((to, vec![msg])),
            }
            continue;
        }
        let (transport, rt2, tx) = (transport.clone(), rt.clone(), tx.clone());
        let deadline = rt.now() + opts.call_timeout;
        rt.spawn(async move {
            // Lost or refused: raft-rs sends again.
            if let Ok(answer) = transport
                .call_parts(
                    &to,
                    crate::auth::ServerRole::Master,
                    msg.encode_to_vec().into(),
                    deadline,
                )
                .await
            {
                take_answer(&rt2, &tx, answer);
            }
        });
    }
    for (to, msgs) in parts {
        let (transport, rt2, timeout) = (transport.clone(), rt.clone(), opts.call_timeout);
        let tx = tx.clone();
        rt.spawn(async move {
            for msg in msgs {
                let deadline = rt2.now() + timeout;
                match transport
                    .call_parts(
                        &to,
                        crate::auth::ServerRole::Master,
                        msg.encode_to_vec().into(),
                        deadline,
                    )
                    .await
                {
                    Ok(answer) => take_answer(&rt2, &tx, answer),
                    // The snapshot cannot arrive whole: the leader sends it again.
                    Err(_) => return,
                }
            }
        });
    }
}

/// The messages another replica's answer carries (`group::answers`), for the replica.
/// An answer that does not decode is dropped, as a lost one would be.
fn take_answer<R: Runtime>(rt: &R, tx: &mpsc::UnboundedSender<Event>, answer: Parts) {
    let Ok(resp) = pb::MasterResponse::decode(PartsReader::from(answer)) else {
        tracing::warn!("a replica's answer did not decode; dropped");
        return;
    };
    if let Some(pb::master_response::Resp::RaftBatch(batch)) = resp.resp
        && !batch.messages.is_empty()
    {
        // Closed only once the replica stopped.
        let _ = tx.unbounded_send(Event::Answer(batch, rt.now()));
    }
}

/// Where the requests given to the replica came from, until its master takes them (or
/// the replica answers them itself), for the observer's `request`.
pub type Origins = HashMap<RequestId, (String, Time)>;

/// One step of the replica, shown to the observer: its master's starts and steps first.
pub fn step<R: Runtime, O: Observer>(
    rt: &R,
    replica: &mut Replica,
    observer: &mut O,
    origins: &mut Origins,
    input: Input,
) -> group::Effects {
    step_at(rt.now(), replica, observer, origins, input)
}

/// [`step`] at the clock reading `now`. The master's starts and steps are shown at the
/// readings the master took them at (`group::MasterStep::now`), which are later than
/// `now` when the clock went back.
pub fn step_at<O: Observer>(
    now: Time,
    replica: &mut Replica,
    observer: &mut O,
    origins: &mut Origins,
    input: Input,
) -> group::Effects {
    let mut effects = replica.handle(now, input.clone());
    let mut starts = std::mem::take(&mut effects.master_starts);
    for s in std::mem::take(&mut effects.master_steps) {
        // Also the steps of a master that stopped within this one (its last grants,
        // say): they are judged like the others.
        let Some(m) = replica.master_of(s.generation) else {
            continue;
        };
        if let Some(at) = starts.iter().position(|st| st.generation == s.generation) {
            let st = starts.remove(at);
            observer.master_started(
                st.now,
                MasterStart {
                    config: m.config(),
                    checkpoint: Some(&st.checkpoint),
                    tail: &[],
                    epoch: st.epoch,
                },
            );
        }
        if let crate::master::Input::Request { id, .. } | crate::master::Input::Malformed { id, .. } =
            &s.input
            && let Some((peer, arrived)) = origins.remove(id)
        {
            observer.request(*id, &peer, arrived);
        }
        observer.authority(s.authority);
        observer.master_step(s.now, &s.input, &s.effects, m);
    }
    for (id, _) in &effects.replies {
        origins.remove(id);
    }
    observer.replica_step(now, &input, &effects, replica);
    effects
}

enum Step {
    Request(Incoming),
    Event(Event),
}

enum Next<M> {
    Step(Step),
    Synced(M, Result<u64, StoreError>),
}

/// The next thing to do: the end of the sync under way first, then the replica's own
/// events, then requests.
async fn next_event<M>(
    events: &mut mpsc::UnboundedReceiver<Event>,
    inbound: &mut mpsc::Receiver<Incoming>,
    syncing: &mut Option<Syncing<M>>,
) -> Option<Next<M>> {
    futures::future::poll_fn(|cx| {
        if let Some(s) = syncing.as_mut()
            && let Poll::Ready((store, done)) = s.as_mut().poll(cx)
        {
            return Poll::Ready(Some(Next::Synced(store, done)));
        }
        if let Poll::Ready(e) = events.poll_next_unpin(cx) {
            return Poll::Ready(e.map(|e| Next::Step(Step::Event(e))));
        }
        if inbound.is_terminated() {
            return Poll::Ready(None);
        }
        match inbound.poll_next_unpin(cx) {
            Poll::Ready(Some(req)) => Poll::Ready(Some(Next::Step(Step::Request(req)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

fn try_event(
    events: &mut mpsc::UnboundedReceiver<Event>,
    inbound: &mut mpsc::Receiver<Incoming>,
) -> Option<Step> {
    events
        .try_recv()
        .ok()
        .map(Step::Event)
        .or_else(|| inbound.try_recv().ok().map(Step::Request))
}

/// What the replica's steps leave for the loop to carry out.
struct Out {
    /// Callers waiting for replies, by request.
    replies: HashMap<RequestId, oneshot::Sender<Parts>>,
    /// Writes for the next sync, and the last Persist among them the replica waits for.
    writes: Vec<group::Write>,
    persisted: Option<u64>,
    /// Messages for other replicas from every step of this batch of events: sent as one
    /// call per replica at the batch's end, so followers write while this one does.
    outbox: Vec<(String, pb::RaftMessage)>,
    /// The checkpointer's feeds.
    feeds: mpsc::UnboundedSender<group::checkpointer::Feed>,
}

fn dispatch<R: Runtime, T: Transport>(
    rt: &R,
    transport: &T,
    tx: &mpsc::UnboundedSender<Event>,
    opts: &GroupOptions,
    out: &mut Out,
    replica: &Replica,
    effects: group::Effects,
) {
    for f in effects.checkpointer {
        // Closed only if the checkpointer's task ended: the loop stops at its next turn.
        let _ = out.feeds.unbounded_send(f);
    }
    for p in effects.persist {
        out.writes.extend(p.writes);
        if p.wait {
            out.persisted = Some(p.number);
        }
    }
    for (id, mut resp) in effects.replies {
        let Some(reply) = out.replies.remove(&id) else {
            continue;
        };
        if let Some(pb::master_response::Resp::RaftBatch(b)) = &mut resp.resp
            && let Some(to) = b.messages.first().map(|m| m.to)
        {
            // Messages an answer would carry to a replica that messages of earlier steps
            // of this batch are still to go to (the answer would overtake them), or to a
            // caller that gave up: they go as a call, in order.
            let queued = out.outbox.iter().find(|(_, m)| m.to == to);
            let addr = queued
                .map(|(a, _)| a.clone())
                .or_else(|| replica.config().members.get(&to).cloned());
            if (queued.is_some() || reply.is_canceled())
                && let Some(addr) = addr
            {
                let msgs = std::mem::take(&mut b.messages);
                out.outbox
                    .extend(msgs.into_iter().map(|m| (addr.clone(), m)));
            }
        }
        let _ = reply.send(resp.encode_to_vec().into());
    }
    out.outbox.extend(effects.send);
    for call in effects.calls {
        super::master::spawn_call(
            rt,
            transport,
            tx,
            opts.call_timeout,
            call,
            Event::CallResult,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{MemMetaStore, TestRuntime};
    use crate::types::Time;

    /// A replica formats its store only when told to form a group, never over state it
    /// holds, and neither a replica nor a single master starts on the other's store: a
    /// replica back under its old id with an empty log could vote twice in a term, or deny
    /// entries a majority counted it for.
    #[test]
    fn a_replica_forms_a_group_only_when_told_and_never_on_anothers_store() {
        let rt = TestRuntime::new(5);
        rt.block_on(async move {
            let g = GroupConfig::new(1, (1..=3).map(|i| (i, format!("m{i}"))).collect());
            let mut store = MemMetaStore::default();
            let e = load(&mut store, &g, false, false).await.unwrap_err();
            assert!(e.to_string().contains("--bootstrap"), "{e}");
            let e = load(&mut store, &g, true, true).await.unwrap_err();
            assert!(e.to_string().contains("give one"), "{e}");
            load(&mut store, &g, true, false).await.unwrap();
            for (bootstrap, join) in [(true, false), (false, true)] {
                let e = load(&mut store, &g, bootstrap, join).await.unwrap_err();
                assert!(e.to_string().contains("already holds group state"), "{e}");
            }
            let log = load(&mut store, &g, false, false).await.unwrap();
            assert_eq!(log.members().addresses, g.members);
            // The store's members win over --peers (they change with the log).
            let five = GroupConfig::new(1, (1..=5).map(|i| (i, format!("m{i}"))).collect());
            let log = load(&mut store, &five, false, false).await.unwrap();
            assert_eq!(log.voters(), vec![1, 2, 3]);
            // A store from before the members' addresses were kept must match --peers.
            let mut old = MemMetaStore::default();
            let mut conf = crate::group::wire::conf_to_pb(&raft::eraftpb::ConfState::from((
                vec![1, 2, 3],
                vec![],
            )));
            conf.addresses.clear();
            old.write(vec![(
                crate::group::store::CONF_KEY.to_vec(),
                Some(crate::driver::master::seal(&conf)),
            )])
            .await
            .unwrap();
            let e = load(&mut old, &five, false, false).await.unwrap_err();
            assert!(
                e.to_string().contains("--peers names [1, 2, 3, 4, 5]"),
                "{e}"
            );
            load(&mut old, &g, false, false).await.unwrap();
            // A joining replica formats a store with no members, once.
            let mut joining = MemMetaStore::default();
            let log = load(&mut joining, &g, false, true).await.unwrap();
            assert!(log.voters().is_empty());
            let log = load(&mut joining, &g, false, false).await.unwrap();
            assert!(log.voters().is_empty() && log.members().addresses.is_empty());
            let e = crate::driver::master::load(&mut store)
                .await
                .expect_err("a single master refuses a replica's store");
            assert!(e.to_string().contains("replica's log"), "{e}");

            let mut single = MemMetaStore::default();
            let mut master = crate::master::Master::new(MasterConfig::default(), Time::ZERO);
            let fx = master.handle(Time(1), crate::master::Input::Tick);
            let batch: Vec<_> = fx
                .log
                .iter()
                .map(|(seq, r)| {
                    (
                        crate::driver::master::log_key(*seq),
                        Some(crate::driver::master::seal(r)),
                    )
                })
                .collect();
            assert!(!batch.is_empty(), "a new master logs its cluster id");
            single.write(batch).await.unwrap();
            for bootstrap in [false, true] {
                let e = load(&mut single, &g, bootstrap, !bootstrap)
                    .await
                    .unwrap_err();
                assert!(e.to_string().contains("single master's log"), "{e}");
            }
        });
    }
}
