//! What every step of every node is checked for, pure: the simulator's observer
//! (`observer.rs`) and the in-process fuzzing world (`crate::world`) both call these after
//! each step. They extend the trace hash and run the per-step checkers.

use std::collections::HashMap;

use prost::Message;
use tessera_core::chunkserver::{self as cs, Chunkserver};
use tessera_core::master::{self as ms, Master};
use tessera_core::types::Time;

use super::{Checks, NS_DIR, references, replication::ReplicationReport};

/// After a master step at true time `t` (ms) on `node`, whose clock read `now`;
/// `to_true` turns a reading of the node's clock into true time.
/// A master replica's step: at most one leader per term, and a master that stops
/// leaves its unsynced version records behind (as a crash would).
#[allow(clippy::too_many_arguments)]
pub fn replica_step(
    c: &mut Checks,
    node: &str,
    t: i64,
    now: Time,
    input: &tessera_core::group::Input,
    effects: &tessera_core::group::Effects,
    replica: &tessera_core::group::Replica,
    to_true: impl Fn(i64) -> i64,
) {
    let s = replica.status();
    // Read authority, in true time (`authority.rs`).
    {
        let until = replica.authority_until();
        let authority = (until > Time::ZERO).then(|| to_true(until.0 as i64));
        let request = match input {
            tessera_core::group::Input::Request { id, req, .. } => Some((*id, req)),
            _ => None,
        };
        let leading = s.role == "leader";
        for v in c
            .authority
            .step(node, t, s.term, leading, authority, request, effects)
        {
            c.violation(t, v);
        }
        // A leader's locations name each chunk at a version no older than any write
        // acknowledged before the read arrived: the grant's version was committed
        // before that write's lease went out.
        for (arrived, chunks) in std::mem::take(&mut c.authority.located) {
            for (h, v) in chunks {
                c.authority.located_judged += 1;
                if let Some((m, at)) = c.mutations.acked_before(h, arrived)
                    && m > v
                {
                    let what = format!(
                        "{node} answered the locations of chunk {h} at version {v} to a read \
                         that arrived at {arrived} ms (true time), though a write at version \
                         {m} was acknowledged at {at} ms: its copies there miss it"
                    );
                    c.violation(t, what);
                }
            }
        }
    }
    let tr = &mut c.trace;
    tr.add(node.as_bytes());
    tr.add_u64(now.0);
    {
        use tessera_core::group::Input as G;
        match input {
            G::Request { id, req, .. } => {
                tr.add_u64(*id);
                tr.add(&req.encode_to_vec());
            }
            G::CallResult { id, result } => {
                tr.add_u64(*id);
                tr.add_u64(u64::from(result.as_ref().is_ok_and(|r| r.error.is_none())));
            }
            G::Tick => tr.add(b"tick"),
            G::RaftTick => tr.add(b"raft tick"),
            G::Persisted { number } => tr.add_u64(*number),
            G::Malformed { id, .. } => tr.add_u64(*id),
            G::Flush => tr.add(b"flush"),
            G::Answer { batch, .. } => {
                tr.add(b"answer");
                tr.add(&batch.encode_to_vec());
            }
            G::MasterCopy(h) => {
                tr.add(b"master copy");
                tr.add_u64(h.index);
                // A new leader's master copy, made beside it: one that came back too
                // late (the replica no longer leads, or applied more) is dropped.
                let kind = if s.serving {
                    "master_copy_taken"
                } else {
                    "master_copy_dropped"
                };
                *c.faults.entry(kind).or_default() += 1;
            }
            G::Checkpointed(taken) => {
                tr.add(b"checkpointed");
                tr.add_u64(taken.ask.index);
                tr.add_u64(taken.seq);
                c.group_checkpoints += 1;
                // Built while the replica went on applying entries.
                if s.applied > taken.ask.index {
                    *c.faults.entry("slow_checkpoint").or_default() += 1;
                }
            }
        }
    }
    tr.add_u64(s.term);
    tr.add_u64(s.commit);
    let (_, whole) = replica.snapshot_parts_taken();
    let seen = c.parts_seen.entry(node.to_string()).or_default();
    if whole < *seen {
        // Started again.
        *seen = 0;
    }
    c.snapshots_from_parts += whole - *seen;
    *seen = whole;
    // What the group has committed: a leader's commit index, and the records of every
    // entry up to it as the first replica to apply them shows them. A leader may count
    // an entry committed by its followers' copies before its own sync is done, so a
    // follower can apply it before the leader does.
    if s.role == "leader" {
        c.leader_commit = c.leader_commit.max(s.commit);
    }
    // Raft's rule: a replica applies only what is committed, as its own log says and as
    // a leader said (a follower learns of a commit only from a leader that made it, whose
    // step came first). Applied early, an entry a later leader overwrites would stay in
    // its shadow state, its snapshots and the master it may start.
    if s.applied > s.commit || s.applied > c.leader_commit {
        let v = format!(
            "{node} ({}) applied through entry {} before it was committed: its commit index \
             is {}, the highest a leader reached {}",
            s.role, s.applied, s.commit, c.leader_commit
        );
        c.violation(t, v);
    }
    if s.applied <= c.leader_commit && s.seq > c.committed_seq {
        c.committed_seq = s.seq;
        c.committed_at.push((t, s.seq));
    }
    // A shadow's claim to be current is judged at every step, as if it answered a read
    // then: a wrong claim is caught when it is made, not only if a read met it. (A leader
    // whose authority has lapsed answers shadow reads too, but judging its steps caught
    // nothing: with its claims made current-as-of-now past its authority, 100 seeds of
    // master-failover and 60 of master-failover-5, master-replace and lost-remove-group
    // passed. A successor commits only after that authority ends and an election, by
    // when check_quorum has deposed it, so its claims stay within the slack.)
    if !s.serving {
        c.shadow_claim(t, node, s.seq, replica.lag_ms());
    }
    if s.role == "leader" {
        match c.leaders.get(&s.term) {
            Some(other) if other != node => {
                let v = format!("two leaders in term {}: {other} and {node}", s.term);
                c.violation(t, v);
            }
            Some(_) => {}
            None => {
                c.leaders.insert(s.term, node.to_string());
            }
        }
    }
    let was = c
        .serving
        .insert(node.to_string(), s.serving)
        .unwrap_or(false);
    if was && !s.serving {
        c.versions.master_crashed(node);
    }
}

/// A master alone's driver wrote checkpoint `cp`, built beside the master, whose
/// master had logged through record `logged` by then; `stored` is what its store holds
/// under `checkpoint` now. Read back from those values, as a start-up reads them, it
/// must hold exactly the master's state at the step that said it was due: a restart
/// starts from it.
pub fn master_checkpointed(
    c: &mut Checks,
    node: &str,
    t: i64,
    sealed: &tessera_core::driver::checkpoint::Sealed,
    stored: Option<Vec<(Vec<u8>, bytes::Bytes)>>,
    logged: u64,
) {
    let through = sealed.through_seq;
    c.trace.add(b"checkpointed");
    c.trace.add_u64(through);
    c.master_checkpoints += 1;
    let parts = sealed.size().0;
    c.master_checkpoint_parts += u64::from(parts);
    if c.last_checkpoint_parts
        .insert(node.to_string(), parts)
        .is_some_and(|before| before > parts)
    {
        c.master_checkpoints_shrunk += 1;
    }
    let read = match stored {
        Some(values) => tessera_core::driver::checkpoint::load(values).and_then(|l| {
            let l = l.ok_or("none is stored")?;
            if l.parts != parts {
                return Err(format!("{} parts stored, {parts} written", l.parts));
            }
            Ok(l.checkpoint)
        }),
        None => sealed.read(),
    };
    let cp = match read {
        Ok(cp) => cp,
        Err(e) => {
            let v = format!(
                "{node} wrote a checkpoint through record {through} that does not read back: {e}"
            );
            return c.violation(t, v);
        }
    };
    // Built while the master went on logging.
    if logged > through {
        *c.faults.entry("slow_master_checkpoint").or_default() += 1;
    }
    let due = c.checkpoints_due.remove(&(node.to_string(), through));
    // Those that fell due while one was being built were let go.
    c.checkpoints_due
        .retain(|(n, seq), _| n != node || *seq > through);
    let v = match due {
        Some(want) if want.checkpoint == cp => {
            // Restored as a start-up restores it, it must be that state: a field the
            // checkpoint builder leaves out is left out of both checkpoints above.
            let got = tessera_core::master::Meta::restore(&cp, want.chunk_size)
                .map(|m| tessera_core::fuzz::oplog::dump(&m));
            match got {
                Ok(got) if got == want.state => return,
                Ok(got) => {
                    let (g, w) = got
                        .lines()
                        .zip(want.state.lines())
                        .find(|(g, w)| g != w)
                        .unwrap_or(("(fewer lines)", "(more lines)"));
                    format!(
                        "{node} wrote a checkpoint through record {through} that restores \
                         to another state than the master's at that record: {:.200} \
                         where the master had {:.200}",
                        g, w
                    )
                }
                Err(e) => format!(
                    "{node} wrote a checkpoint through record {through} that does not \
                     restore: {e}"
                ),
            }
        }
        Some(_) => format!(
            "{node} wrote a checkpoint through record {through} that is not the master's \
             state at that record"
        ),
        None => format!(
            "{node} wrote a checkpoint through record {through}, which no step of its \
             master said was due"
        ),
    };
    c.violation(t, v);
}

#[allow(clippy::too_many_arguments)]
pub fn master_step(
    c: &mut Checks,
    node: &str,
    t: i64,
    now: Time,
    input: &ms::Input,
    effects: &ms::Effects,
    master: &Master,
    to_true: impl Fn(i64) -> i64,
) {
    c.steps += 1;
    let tr = &mut c.trace;
    tr.add(node.as_bytes());
    tr.add_u64(now.0);
    match input {
        // Who sent it is left out of the hash: a run's trace hash stays comparable
        // with runs from before requests were authenticated.
        ms::Input::Request { id, req, .. } => {
            tr.add_u64(*id);
            tr.add(&req.encode_to_vec());
        }
        ms::Input::CallResult { id, result } => {
            tr.add_u64(*id);
            tr.add_u64(u64::from(result.as_ref().is_ok_and(|r| r.error.is_none())));
        }
        ms::Input::LogSynced { through } => tr.add_u64(*through),
        ms::Input::Tick => tr.add(b"tick"),
        ms::Input::Malformed { id, error } => {
            tr.add_u64(*id);
            tr.add(error.as_bytes());
        }
    }
    for (seq, rec) in &effects.log {
        tr.add_u64(*seq);
        tr.add(&rec.encode_to_vec());
    }
    for (id, r) in &effects.replies {
        tr.add_u64(*id);
        tr.add(&r.encode_to_vec());
    }
    for call in &effects.calls {
        tr.add(call.to.as_bytes());
        tr.add(&call.req.encode_to_vec());
    }
    if let Some(through) = effects.checkpoint_due {
        tr.add_u64(through);
        let meta = master.meta();
        c.checkpoints_due.insert(
            (node.to_string(), through),
            super::Due {
                checkpoint: meta.checkpoint(through),
                state: tessera_core::fuzz::oplog::dump(meta),
                chunk_size: meta.default_chunk_size,
            },
        );
    }
    if let Some(w) = &mut c.clones {
        w.master_step(node, t, input, effects, master);
    }
    let damaged = &c.corrupted;
    let found = c.churn.master_step(node, master, effects, |h| {
        damaged.iter().any(|(_, d)| *d == h)
    });
    for v in found {
        c.violation(t, v);
    }
    for v in c.refusals.master_step(node, input, effects, master) {
        c.violation(t, v);
    }
    // What any master (a deposed leader too) took: heartbeats judged, removes logged,
    // removes of deleted files clients asked for.
    if let ms::Input::Request { req, .. } = input {
        use tessera_core::pb::master_request::Req as MReq;
        match &req.req {
            Some(MReq::Heartbeat(hb)) => {
                c.heartbeats_judged
                    .insert((node.to_string(), hb.address.clone()), c.steps);
            }
            Some(MReq::Delete(d))
                if d.path
                    .rsplit('/')
                    .next()
                    .is_some_and(|n| tessera_core::master::deleted_at(n).is_some()) =>
            {
                c.removes_asked.insert(d.path.clone());
            }
            _ => {}
        }
    }
    // The master's first ordering rule, judged from outside: a namespace request is
    // answered Ok only once everything its master had logged when it took the request is
    // durable (its own record, and any record its answer could reflect). Other errors may
    // go at once, but a refusal for the state of a name only once that state is durable
    // (`refusals.rs`). Any master, a deposed leader's too.
    if let ms::Input::Request { id, req, .. } = input {
        use tessera_core::pb::master_request::Req as MReq;
        if matches!(
            req.req,
            Some(
                MReq::Mkdir(_)
                    | MReq::Create(_)
                    | MReq::Delete(_)
                    | MReq::Rename(_)
                    | MReq::List(_)
                    | MReq::Stat(_)
                    | MReq::ExtendFile(_)
                    | MReq::ReserveAppend(_)
            )
        ) {
            let asked = format!("{:?}", req.req).chars().take(200).collect();
            c.answers_due
                .insert((node.to_string(), *id), (master.last_seq(), asked));
        }
    }
    for (id, resp) in &effects.replies {
        let Some((need, asked)) = c.answers_due.remove(&(node.to_string(), *id)) else {
            continue;
        };
        if resp.error.is_none() && master.synced_seq() < need {
            let v = format!(
                "{node} answered request {id} Ok while its log was durable only through \
                 record {}, before record {need}, the last it had logged when it took the \
                 request ({asked})",
                master.synced_seq()
            );
            c.violation(t, v);
        }
    }
    let gc_delay = master.config().gc_delay.as_millis() as u64;
    // By the master's clock, which never goes back: after the machine's clock jumps back,
    // the collector's delay is still measured from the latest time the master saw
    // (master-failover-5 seed 58673410: a remove 21 ms "early" by the clock, just after
    // it had jumped back).
    let master_now = master.now().as_millis();
    for (_, rec) in &effects.log {
        if let Some(tessera_core::pb::log_record::Op::Rename(o)) = &rec.op {
            c.renames_logged
                .insert(o.src.clone(), (node.to_string(), c.steps));
        }
        if let Some(tessera_core::pb::log_record::Op::Remove(o)) = &rec.op {
            c.removes_logged
                .insert(o.path.clone(), (node.to_string(), c.steps));
            // The collector removes a deleted file only once it has been deleted for
            // the delay (it can be read and undeleted until then); a client may remove
            // one at once.
            let deleted = o
                .path
                .rsplit('/')
                .next()
                .and_then(tessera_core::master::deleted_at);
            if let Some(ms) = deleted
                && !c.removes_asked.contains(&o.path)
                && ms.saturating_add(gc_delay) > master_now
            {
                c.violation(
                    t,
                    format!(
                        "{node} removed {}, deleted at {ms} ms, at {master_now} ms by its \
                         clock: before the collector's delay of {gc_delay} ms was up",
                        o.path,
                    ),
                );
            }
        }
    }
    // In a master group, only the newest leader's master is judged by its tables (see
    // `Checks::top_epoch`).
    let epoch = master.epoch();
    if epoch < c.top_epoch {
        return;
    }
    if epoch > c.top_epoch {
        c.top_epoch = epoch;
        c.master_fp = None;
    }
    if let ms::Input::LogSynced { through } = input {
        c.versions.master_synced(node, *through);
    }
    for (seq, rec) in &effects.log {
        match &rec.op {
            Some(tessera_core::pb::log_record::Op::SetVersion(o)) => {
                c.versions.master_logged(node, *seq, o.handle, o.version);
            }
            Some(tessera_core::pb::log_record::Op::Rename(o))
                if o.dst.starts_with(NS_DIR)
                    && o.dst
                        .rsplit('/')
                        .next()
                        .is_some_and(|n| n.starts_with(tessera_core::master::DELETED_PREFIX)) =>
            {
                c.ns_deleted.insert(o.dst.clone(), t);
            }
            Some(tessera_core::pb::log_record::Op::Remove(o)) if o.path.starts_with(NS_DIR) => {
                // Moved since it was deleted (with its directory): the delete was
                // before now, and now is the safe bound.
                let deleted = c.ns_deleted.get(&o.path).copied().unwrap_or(t);
                c.ns_reclaimed = Some(c.ns_reclaimed.map_or(deleted, |r| r.max(deleted)));
            }
            _ => {}
        }
    }
    // A new leader that fenced every older lease holder instead of waiting.
    if master.leases().quiet_ended_early() && c.quiet_ended.insert((node.to_string(), epoch)) {
        *c.faults.entry("quiet_ended_early").or_default() += 1;
        // Every server that may hold an older term's lease has given them up: none may
        // be left on a chunk that existed when this leader started.
        let left = c.leases.valid_below(t, master.leases().quiet_below());
        if !left.is_empty() {
            c.violation(
                t,
                format!(
                    "{node} (term {epoch}) ended its quiet period early while older leases \
                     were still held (server, chunk, until ms): {left:?}"
                ),
            );
        }
    }
    // The master's leases, in true time, for the holders' leases to be measured against.
    let skew = master.config().max_clock_skew;
    c.leases.master_saw(
        master
            .leases()
            .held()
            .filter(|(h, _)| !master.leases().is_granting(*h))
            .map(|(h, l)| {
                let primary = master.servers().get(l.primary).addr.clone();
                (h, (primary, to_true((l.expires + skew).0 as i64)))
            })
            .collect(),
    );
    let mut found = Vec::new();
    if let Err(e) = master.check_queues() {
        found.push(format!("master invariant: {e}"));
    }
    // The whole-table checks read only the master's tables and what `versions` records;
    // while neither changed (nothing logged, the same fingerprint) they would find
    // nothing new, and most steps change neither.
    let fp = (fingerprint(master), c.versions.generation());
    let unchanged = effects.log.is_empty() && c.missing.quiet() && c.master_fp == Some(fp);
    if !unchanged {
        for (h, chunk) in master.meta().chunks.iter() {
            if let Some(v) = c.versions.master(h, chunk.version) {
                found.push(v);
            }
        }
        if let Err(e) = master.check_tables() {
            found.push(format!("master invariant: {e}"));
        }
        // Every step that changed something, not only those that logged: a chunk can be
        // collected by one that did not.
        if let Some(v) = references::check(master) {
            found.push(v);
        }
        let cc = &mut *c;
        if let Some(v) = super::locations::check(master, &cc.versions, &mut cc.missing, t) {
            found.push(v);
        }
        // A copy counted as spare must still be counted when a fault is placed. A chunk
        // whose version is being granted has no spare copy (the grant may drop any of
        // them when it ends).
        c.listed = master
            .meta()
            .chunks
            .iter()
            .filter(|(h, _)| !master.leases().is_granting(*h))
            .map(|(h, chunk)| {
                let addrs = chunk
                    .replicas
                    .as_slice()
                    .iter()
                    .map(|&s| master.servers().get(s).addr.clone())
                    .collect();
                (h, addrs)
            })
            .collect();
        // The checks above may have moved the generation on (the master they leave alone).
        c.master_fp = Some((fp.0, c.versions.generation()));
    }
    if matches!(input, ms::Input::Tick) {
        let mut r = ReplicationReport::of(master, t);
        if let (Some(e), Some(h)) = (&mut r.example, r.example_handle) {
            e.push_str(&format!(" held by {:?}", c.versions.holders(h)));
        }
        c.replication = r;
    }
    for v in found {
        c.violation(t, v);
    }
}

/// A hash of everything in the master the whole-table checks read but the namespace
/// (which changes only by logging): each chunk's version, references, goal and replicas
/// (and whether each is alive), its lease and whether one is being granted. The
/// checkers' own record of versions has its generation beside it.
fn fingerprint(master: &Master) -> u64 {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut add = |v: u64| x = (x.rotate_left(23) ^ v).wrapping_mul(0x2545_f491_4f6c_dd1d);
    add(master.last_seq());
    let leases = master.leases();
    for (h, c) in master.meta().chunks.iter() {
        add(h);
        add(c.version);
        add(u64::from(c.refcount) << 8 | u64::from(c.goal));
        for &s in c.replicas.as_slice() {
            add(s as u64);
            add(u64::from(master.servers().is_alive(s)));
        }
        add(u64::from(leases.is_granting(h)));
        if let Some(l) = leases.get(h) {
            add(l.version);
            add(l.primary as u64);
            add(l.expires.0 << 1 | u64::from(l.void));
            for &s in &l.replicas {
                add(s as u64);
            }
        }
    }
    x
}

/// After a chunkserver step at true time `t` on `node`, whose clock read `now`;
/// `to_true` turns a reading of the node's clock into true time.
#[allow(clippy::too_many_arguments)]
pub fn chunkserver_step(
    c: &mut Checks,
    node: &str,
    t: i64,
    now: Time,
    input: &cs::Input,
    effects: &cs::Effects,
    server: &Chunkserver,
    to_true: impl Fn(i64) -> i64,
) {
    c.steps += 1;
    let tr = &mut c.trace;
    tr.add(node.as_bytes());
    tr.add_u64(now.0);
    match input {
        cs::Input::Request { id, req, .. } => {
            tr.add_u64(*id);
            tr.add_u64(req.encoded_len() as u64);
            if let Some(tessera_core::pb::chunk_request::Req::SetVersion(o)) = &req.req {
                c.versions.server_ordered(node, *id, o.handle, o.version);
            }
            if let Some(tessera_core::pb::chunk_request::Req::Mend(m)) = &req.req {
                c.mends_asked.insert((node.to_string(), *id), m.handle);
            }
        }
        cs::Input::CallResult { id, result } => {
            tr.add_u64(*id);
            tr.add_u64(u64::from(result.is_ok()));
        }
        cs::Input::StoreDone { id, result } => {
            tr.add_u64(*id);
            tr.add_u64(u64::from(result.is_ok()));
        }
        cs::Input::Tick => tr.add(b"tick"),
        cs::Input::DiskSpace { free } => tr.add_u64(free.map_or(u64::MAX, |f| f)),
        cs::Input::Malformed { id, error } => {
            tr.add_u64(*id);
            tr.add(error.as_bytes());
        }
    }
    c.mutations.step(node, input, effects, server, t);
    if let Some((at, _)) = c
        .clones
        .as_mut()
        .and_then(|w| w.chunkserver_step(node, t, input, effects, server))
    {
        let h = c.clones.as_ref().map_or(0, |w| w.handle);
        *c.faults.entry("clone_read_rot").or_default() += 1;
        c.corrupted.insert((at.clone(), h));
    }
    for (id, r) in &effects.replies {
        tr.add_u64(*id);
        tr.add_u64(r.encoded_len() as u64);
        tr.add_u64(r.error.as_ref().map_or(0, |e| e.code as u64));
        c.versions.server_answered(node, *id, r.error.is_none());
        if let Some(h) = c.mends_asked.remove(&(node.to_string(), *id)) {
            c.mends[usize::from(r.error.is_some())] += 1;
            if r.error.is_none() {
                c.mended.insert((node.to_string(), h));
            }
        }
    }
    for (id, op) in &effects.store {
        tr.add_u64(*id);
        tr.add(format!("{:?}", std::mem::discriminant(op)).as_bytes());
    }
    if let Some(stored) = &mut c.stored {
        for (_, op) in &effects.store {
            if let cs::StoreOp::Write {
                handle,
                offset,
                data,
                ..
            } = op
                && !data.is_empty()
            {
                stored
                    .writes
                    .entry(*handle)
                    .or_default()
                    .push((*offset, data.clone()));
            }
        }
    }
    let mut found = Vec::new();
    for call in &effects.calls {
        if let cs::Outgoing::Master(tessera_core::pb::MasterRequest {
            req: Some(tessera_core::pb::master_request::Req::ReportCorrupt(r)),
            ..
        }) = &call.req
        {
            if r.by_scrubber {
                c.scrub_found.insert((node.to_string(), r.handle));
            }
            found.extend(super::corruption::check(&c.corrupted, node, r.handle));
        }
    }
    tr.add_u64(effects.calls.len() as u64);
    // Leases, in true time.
    let leases: HashMap<u64, i64> = server
        .leases()
        .map(|(h, until)| (h, to_true(until.0 as i64)))
        .collect();
    if let Some(v) = c.leases.update(node, t, leases) {
        found.push(v);
    }
    if let Err(e) = server.check_invariants() {
        found.push(format!("{node} invariant: {e}"));
    }
    let held: HashMap<u64, u64> = server.chunks().map(|(h, v, _)| (h, v)).collect();
    for (&h, &v) in &held {
        if let Some(x) = c.versions.server(node, h, v) {
            found.push(x);
        }
        if c.versions.master_version(h).is_some_and(|m| v < m) {
            c.stale_seen.insert((node.to_string(), h, v));
        }
    }
    c.versions.server_dropped(node, |h| held.contains_key(&h));
    for v in found {
        c.violation(t, v);
    }
}
