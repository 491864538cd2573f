//! The `mutation_protocol` fuzz target (`fuzz/fuzz_targets/mutation_protocol.rs`): the
//! fuzzer's bytes choose a run of the in-process world (`crate::world`): client writes at
//! offsets and record appends (each starting with a lease request), which message is
//! delivered next, lost, duplicated or held back behind others, deadlines passing,
//! storage operations finishing in any order across chunks, crashes and restarts of the
//! master and chunkservers losing what they had not synced, bits flipped on disks, full
//! disks, ticks and clock advances. The simulator's per-step invariants run after every
//! step (one primary per chunk, versions never go back, no live chunk collected, no stale
//! location, each state machine's own). Then the world heals (everything restarted, time
//! runs on until the clients are done) and every replica of every chunk is read back and
//! judged by the consistency checkers (`check::history`, `check::appends`).
//!
//! A violation panics, which is what the fuzzer looks for. `run` returns how many
//! actions the input chose.

use bytes::Bytes;
use tessera_core::pb;
use tessera_core::pb::master_request::Req;
use tessera_core::pb::master_response::Resp;

use crate::world::{OpKind, Settings, World};

/// The file clients write at offsets, and the one they record-append to.
pub const WRITES: &str = "/w";
pub const APPENDS: &str = "/a";

/// Actions one input may choose.
const MAX_ACTIONS: usize = 1000;
/// Client operations under way at once.
const MAX_ACTIVE: usize = 4;

/// What a run did, for the experiment's and the tests' counts.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub actions: usize,
    pub writes: usize,
    pub writes_acked: usize,
    pub appends: usize,
    pub appends_acked: usize,
    /// Replicas read back and judged.
    pub reads: u64,
    pub steps: u64,
    /// Faults that happened: crashes, lost and duplicated messages, deadlines, flipped
    /// bits, full disks.
    pub faults: std::collections::BTreeMap<&'static str, u64>,
}

/// Runs the world `data` describes; panics on a violation. Returns the actions taken.
pub fn run(data: &[u8]) -> usize {
    report(data).actions
}

/// As [`run`], with what the run did.
pub fn report(data: &[u8]) -> Report {
    if data.len() < 2 {
        return Report::default();
    }
    let mut at = 0;
    let mut next = || -> u8 {
        let b = data.get(at).copied().unwrap_or(0);
        at += 1;
        b
    };
    let servers = 3 + usize::from(next() & 1);
    let seed = u64::from(next());
    let mut settings = Settings::new(servers, seed);
    // Clocks disagree, within the skew the master allows for.
    let skew = settings.master.max_clock_skew.as_millis() as i64 / 2;
    for off in settings.offsets.iter_mut() {
        *off = i64::from(next() % 5) * skew / 2 - skew;
    }
    let mut w = World::new(settings);
    if std::env::var_os("MP_DEBUG").is_some() {
        w.log = Some(Vec::new());
    }
    setup(&mut w);
    let mut actions = 0;
    let mut left = data.len().saturating_sub(2 + servers + 1);
    while left > 0 && actions < MAX_ACTIONS {
        let (a, b, c) = (next(), next(), next());
        left = left.saturating_sub(3);
        actions += 1;
        act(&mut w, a, b, c);
        fail_on_violation(&w, actions);
    }
    let acted = w.checks.steps;
    heal(&mut w);
    fail_on_violation(&w, actions);
    let healed = w.checks.steps;
    // A read that finds a chunk's one current copy corrupt (a flipped bit no scrub had
    // met yet) does what a client's would: the copy is reported, and the master revives
    // the older copies that hold every acknowledged write. The files are judged again
    // once that has settled, as a client's retry would read them.
    let mut again = 0;
    while judge(&mut w, again < JUDGE_AGAIN) == Judged::Again {
        again += 1;
        converge(&mut w);
        fail_on_violation(&w, actions);
    }
    if std::env::var_os("MP_PHASES").is_some() {
        eprintln!(
            "phases: acted {acted} healed {healed} judged {} now {}",
            w.checks.steps, w.now
        );
    }
    let ops = |append: bool, acked: bool| {
        w.clients
            .iter()
            .filter(|c| matches!(c.kind, OpKind::Append { .. }) == append)
            .filter(|c| !acked || c.outcome == Some(true))
            .count()
    };
    Report {
        actions,
        writes: ops(false, false),
        writes_acked: ops(false, true),
        appends: ops(true, false),
        appends_acked: ops(true, true),
        reads: w.checks.reads_checked,
        steps: w.checks.steps,
        faults: w.checks.faults.clone(),
    }
}

/// One action, chosen by `a`, with arguments `b` and `c`.
fn act(w: &mut World, a: u8, b: u8, c: u8) {
    let servers = w.servers.len();
    let s = usize::from(b) % servers;
    match a % 32 {
        // The network and the disks do most of the work.
        0..=7 => {
            w.deliver(usize::from(b));
        }
        8..=10 => {
            w.finish_store(s, usize::from(c));
        }
        11 => {
            if w.drop_message(usize::from(b)) {
                w.checks.fault("loss", 1);
            }
        }
        12 => {
            if w.duplicate(usize::from(b)) {
                w.checks.fault("duplicate", 1);
            }
        }
        13 => {
            if w.deadline(usize::from(b)) {
                w.checks.fault("deadline", 1);
            }
        }
        14 | 15 => {
            w.sync_master();
        }
        16 => w.tick_master(),
        17 => w.tick_server(s),
        18 => w.advance([10, 100, 500, 1_000, 3_000, 5_000, 11_000, 30_000][usize::from(c % 8)]),
        19 => {
            if w.master_up() {
                w.crash_master();
                w.checks.fault("master_crash", 1);
            } else {
                w.start_master()
            }
        }
        20 => {
            if !w.server_up(s) {
                w.start_server(s)
            } else if w.may_impair(s) {
                w.crash_server(s);
                w.checks.fault("crash", 1);
            }
        }
        21 => {
            if w.flip_bit(s, usize::from(c), usize::from(c) * 131 + usize::from(b))
                .is_some()
            {
                w.checks.fault("bit_flip", 1);
            }
        }
        22 => {
            let free = if c & 1 == 0 { Some(0) } else { None };
            if free.is_none() || w.may_impair(s) {
                if free.is_some() && w.server_up(s) {
                    w.checks.fault("full_disk", 1);
                }
                w.disk_space(s, free);
            }
        }
        23..=27 if w.active() < MAX_ACTIVE => {
            let chunk = w.settings.master.chunk_size;
            // Offsets crowd a few places, so writes overlap and cross into a second chunk.
            let off = u64::from(b % 16) * 256 + if c & 0x80 != 0 { chunk - 512 } else { 0 };
            let len = 1 + usize::from(c & 0x3f) * 37;
            let fill = (w.clients.len() as u8).wrapping_mul(29).wrapping_add(1) | 1;
            w.start_write(WRITES, off, Bytes::from(vec![fill; len]));
        }
        28..=31 if w.active() < MAX_ACTIVE => {
            let len = 1 + usize::from(c) * 3;
            let payload: Vec<u8> = (0..len).map(|i| (i as u8) ^ b).collect();
            w.start_append(APPENDS, &payload);
        }
        _ => {
            w.deliver(usize::from(c));
        }
    }
}

fn fail_on_violation(w: &World, actions: usize) {
    if let Some(e) = &w.refused {
        panic!("after {actions} actions: the master refused to start: {e}");
    }
    if !w.checks.violations.is_empty() {
        w.print_log();
        panic!(
            "after {actions} actions, at t={}ms: {}",
            w.now,
            w.checks.violations.join("\n")
        );
    }
}

/// A master call, run to its answer with everything else that is under way.
fn master_call(w: &mut World, req: Req) -> Option<pb::MasterResponse> {
    w.probe_master(req)
}

/// Every server reports to the master, and the files exist.
fn setup(w: &mut World) {
    for i in 0..w.servers.len() {
        w.tick_server(i);
    }
    w.settle(10_000);
    for path in [WRITES, APPENDS] {
        let r = master_call(
            w,
            Req::Create(pb::CreateRequest {
                path: path.into(),
                replication: 3,
                // The clients' to write: they are in the root's group, the file's.
                mode: Some(0o664),
            }),
        );
        assert!(
            r.as_ref().is_some_and(|r| r.error.is_none()),
            "setup: create {path}: {r:?}"
        );
    }
}

/// How far time moves between the heal phase's rounds of ticks. 1 s rounds took 2.3x
/// fewer steps, but the `fuzz-quiet-period-too-short` plant's input then healed past
/// its bug: the rounds stay at 250 ms until that input is found again.
const HEAL_STEP_MS: i64 = 250;
/// Every how many of those rounds the chunkservers heartbeat.
const HEARTBEAT_ROUNDS: usize = 4;

/// How many times the files are judged again after a read found a chunk's current
/// copies corrupt (see `report`).
const JUDGE_AGAIN: usize = 2;

/// Everything restarts; time runs on, with every message delivered, until the clients
/// are done and leases and re-replication have settled.
fn heal(w: &mut World) {
    w.start_master();
    for i in 0..w.servers.len() {
        w.start_server(i);
        w.disk_space(i, None);
    }
    w.end_impairments();
    converge(w);
}

/// Time runs on, with every message delivered, until the clients are done and the master
/// has no revival waiting.
fn converge(w: &mut World) {
    for round in 0..400 {
        w.settle(20_000);
        if round % 4 == 3 {
            // Calls nobody will answer (their requests waited on a crashed node's
            // state) pass their deadlines.
            while w.deadline(0) {
                w.settle(20_000);
            }
        }
        w.tick_master();
        // Heartbeats once a second (a cluster's own pick is 200 ms to 1 s): they are most
        // of a heal's steps, and the master's clock needs them no oftener.
        if round % HEARTBEAT_ROUNDS == 0 {
            for i in 0..w.servers.len() {
                w.tick_server(i);
            }
        }
        w.settle(20_000);
        // Healed once the clients are done and the master has no revival waiting (one
        // may wait out a lease, `core/src/master/fallback.rs`).
        let reviving = w.master().is_some_and(|m| m.awaiting_revival());
        if w.active() == 0 && round >= 2 && !reviving {
            break;
        }
        w.advance(HEAL_STEP_MS);
    }
    assert_eq!(w.active(), 0, "clients still busy after healing");
}

#[derive(Debug, PartialEq, Eq)]
enum Judged {
    Done,
    /// A chunk holding acknowledged data had no readable copy, and a copy was refused as
    /// corrupt (reported to the master by that refusal): judge again once the master
    /// has had time to revive older copies.
    Again,
}

/// Reads every replica of every chunk of both files and judges what it holds. With
/// `may_retry`, a chunk whose listed copies were all found corrupt by these reads asks
/// for another try rather than failing (every other chunk is judged all the same).
/// Fails the run with what the judge found, after the world's log (with `MP_DEBUG`).
macro_rules! fail {
    ($w:expr, $($arg:tt)*) => {{
        $w.print_log();
        panic!($($arg)*)
    }};
}

fn judge(w: &mut World, may_retry: bool) -> Judged {
    let chunk = w.settings.master.chunk_size;
    let mut reads = 0;
    let mut again = false;
    for path in [WRITES, APPENDS] {
        let Some(pb::MasterResponse {
            error: None,
            resp: Some(Resp::GetChunks(info)),
            ..
        }) = master_call(
            w,
            Req::GetChunks(pb::GetChunksRequest {
                path: path.into(),
                first_index: 0,
                count: 0,
            }),
        )
        else {
            fail!(w, "{path}: no chunk list after healing");
        };
        let handles = info.chunks.iter().map(|c| (c.index, c.handle)).collect();
        for loc in &info.chunks {
            let base = loc.index * chunk;
            let mut readable = 0;
            let mut refused = 0;
            // Each replica's bytes, for the comparison below.
            let mut copies: Vec<(String, Bytes)> = Vec::new();
            for addr in &loc.replicas {
                let Some(i) = w.servers.iter().position(|s| &s.addr == addr) else {
                    fail!(
                        w,
                        "{path}: chunk {} listed on {addr}, no such server",
                        loc.handle
                    );
                };
                let got = match w.probe_read(i, loc.handle, loc.version, chunk) {
                    Ok(d) => d,
                    // A corrupt copy refuses to be read: the checksums did their job.
                    Err((Some(pb::ErrorCode::Corrupt), _))
                        if w.checks.corrupted.contains(&(addr.clone(), loc.handle)) =>
                    {
                        refused += 1;
                        continue;
                    }
                    Err((_, e)) => fail!(w, "{path}: reading chunk {} on {addr}: {e}", loc.handle),
                };
                // As a client reads it: up to the file's length, a hole as zeros.
                let want = info.file_length.saturating_sub(base).min(chunk) as usize;
                let mut got = got.to_vec();
                got.resize(want, 0);
                let got = Bytes::from(got);
                copies.push((addr.clone(), got.clone()));
                readable += 1;
                reads += 1;
                let now = w.now;
                let verdict = if path == WRITES {
                    match w.checks.histories.get(path) {
                        Some(h) => h.check_read(now, now, base, chunk, &got),
                        None => Ok(()),
                    }
                } else {
                    match w.checks.appends.get(path) {
                        Some(log) => log
                            .check(
                                &got,
                                base,
                                base + chunk,
                                chunk,
                                now,
                                Some(&handles),
                                w.checks.stored.as_ref(),
                            )
                            .map(|_| ()),
                        None => Ok(()),
                    }
                };
                if let Err(e) = verdict {
                    if std::env::var_os("MP_DEBUG").is_some() {
                        eprintln!(
                            "faults {:?} corrupted {:?} clients {:#?}",
                            w.checks.faults, w.checks.corrupted, w.clients
                        );
                        w.print_log();
                    }
                    panic!(
                        "{path}: chunk {} (index {}) v{} on {addr}: {e}",
                        loc.handle, loc.index, loc.version
                    );
                }
            }
            // Where only acknowledged writes touched the file, every replica holds the same
            // bytes, in whatever order concurrent writes landed (GFS §2.7.1: consistent).
            if path == WRITES
                && let Some(h) = w.checks.histories.get(path)
                && let Some((a, first)) = copies.first()
            {
                let unsettled = h.unsettled();
                for (b, other) in &copies[1..] {
                    let n = first.len().min(other.len());
                    if let Some(at) = (0..n).find(|&i| {
                        let off = base + i as u64;
                        first[i] != other[i]
                            && !unsettled.iter().any(|(s, e)| *s <= off && off < *e)
                    }) {
                        fail!(
                            w,
                            "{path}: replicas differ: chunk {} at file offset {}: {a} holds {}, {b} holds {}",
                            loc.handle,
                            base + at as u64,
                            first[at],
                            other[at]
                        );
                    }
                }
            }
            // Whether acknowledged data lives in this chunk.
            let here = |at: u64| at / chunk == loc.index;
            let acked = w
                .checks
                .histories
                .get(path)
                .is_some_and(|h| h.acked().any(|(off, _)| here(off)))
                || w.checks
                    .appends
                    .get(path)
                    .is_some_and(|l| l.acked.iter().any(|(_, at, _)| here(*at)));
            if readable == 0 && acked && refused > 0 && may_retry {
                // Every other chunk is still judged now; this one again later.
                again = true;
                continue;
            }
            if readable == 0 && acked {
                w.print_log();
                panic!(
                    "{path}: chunk {} (index {}) has no readable copy (listed: {:?})",
                    loc.handle, loc.index, loc.replicas
                );
            }
        }
        // Acknowledged data in a chunk the file no longer lists is lost data.
        let listed = |off: u64| info.chunks.iter().any(|c| c.index == off / chunk);
        if let Some(h) = w.checks.histories.get(path)
            && let Some((off, end)) = h.acked().find(|(off, _)| !listed(*off))
        {
            fail!(
                w,
                "{path}: the write of {off}..{end} was acknowledged; its chunk is gone"
            );
        }
        if let Some(log) = w.checks.appends.get(path)
            && let Some((id, at, _)) = log.acked.iter().find(|(_, at, _)| !listed(*at))
        {
            fail!(
                w,
                "{path}: record {id:x} was acknowledged at {at}; its chunk is gone"
            );
        }
    }
    w.checks.reads_checked += reads;
    if again { Judged::Again } else { Judged::Done }
}

/// Action codes (the first byte of an action, modulo 32), for seeds and tests.
pub mod code {
    pub const DELIVER: u8 = 0;
    pub const FINISH_STORE: u8 = 8;
    pub const DROP: u8 = 11;
    pub const DUPLICATE: u8 = 12;
    pub const DEADLINE: u8 = 13;
    pub const SYNC: u8 = 14;
    pub const TICK_MASTER: u8 = 16;
    pub const TICK_SERVER: u8 = 17;
    pub const ADVANCE: u8 = 18;
    pub const MASTER_CRASH_OR_START: u8 = 19;
    pub const SERVER_CRASH_OR_START: u8 = 20;
    pub const FLIP: u8 = 21;
    pub const DISK: u8 = 22;
    pub const WRITE: u8 = 23;
    pub const APPEND: u8 = 28;
}

/// Builds an input: the settings bytes, then actions of three bytes each.
pub fn input(four_servers: bool, seed: u8, actions: &[[u8; 3]]) -> Vec<u8> {
    let servers = if four_servers { 4 } else { 3 };
    let mut v = vec![u8::from(four_servers), seed];
    v.extend(std::iter::repeat_n(2, servers + 1));
    for a in actions {
        v.extend_from_slice(a);
    }
    v
}

/// Everything in flight runs `n` times over: the next message delivered, each server's
/// next storage operation finished, the log synced.
fn drain(n: usize) -> Vec<[u8; 3]> {
    use code::*;
    let mut v = Vec::new();
    for _ in 0..n {
        v.push([DELIVER, 0, 0]);
        for s in 0..4 {
            v.push([FINISH_STORE, s, 0]);
        }
        v.push([SYNC, 0, 0]);
    }
    v
}

/// The corpus a fuzzing run starts from (`fuzz/corpus/mutation_protocol/`): each reaches
/// a part of the protocol (`sim/tests/mutation_protocol.rs` checks that they do).
pub fn seeds() -> Vec<Vec<u8>> {
    use code::*;
    let with = |head: &[[u8; 3]], n: usize, tail: &[[u8; 3]], m: usize| {
        let mut v = head.to_vec();
        v.extend(drain(n));
        v.extend_from_slice(tail);
        v.extend(drain(m));
        v
    };
    vec![
        // 0: two writes, delivered in order: acknowledged and read back.
        input(
            false,
            1,
            &with(&[[WRITE, 1, 0x05], [WRITE, 2, 0x85]], 40, &[], 0),
        ),
        // 1: record appends until a chunk fills and is padded.
        input(
            false,
            2,
            &with(
                &[[APPEND, 1, 200], [APPEND, 2, 250], [APPEND, 3, 250]],
                70,
                &[[APPEND, 4, 255], [APPEND, 5, 255], [APPEND, 6, 255]],
                70,
            ),
        ),
        // 2: a chunkserver crashes mid-write and comes back.
        input(
            true,
            3,
            &with(
                &[[WRITE, 4, 0x10]],
                8,
                &[[SERVER_CRASH_OR_START, 1, 0], [SERVER_CRASH_OR_START, 1, 0]],
                40,
            ),
        ),
        // 3: the master crashes mid-append and comes back.
        input(
            false,
            4,
            &with(
                &[[APPEND, 7, 30]],
                5,
                &[[MASTER_CRASH_OR_START, 0, 0], [MASTER_CRASH_OR_START, 0, 0]],
                40,
            ),
        ),
        // 4: a written copy has a bit flipped, then is read.
        input(
            false,
            5,
            &with(&[[WRITE, 0, 0x3f]], 40, &[[FLIP, 0, 0], [FLIP, 1, 3]], 10),
        ),
        // 5: messages lost, duplicated and overtaken by deadlines.
        input(
            false,
            6,
            &with(
                &[
                    [WRITE, 3, 0x22],
                    [APPEND, 1, 9],
                    [DUPLICATE, 0, 0],
                    [DROP, 1, 0],
                ],
                6,
                &[[DEADLINE, 0, 0], [DUPLICATE, 2, 0], [DELIVER, 3, 0]],
                40,
            ),
        ),
        // 6: a full disk while writing, freed later.
        input(
            true,
            7,
            &with(
                &[[DISK, 2, 0], [WRITE, 5, 0x30], [WRITE, 6, 0x31]],
                30,
                &[[DISK, 2, 1]],
                30,
            ),
        ),
        // 7: time passes between steps: leases expire and are granted anew.
        input(
            false,
            8,
            &with(
                &[[WRITE, 7, 0x12], [ADVANCE, 0, 6], [TICK_MASTER, 0, 0]],
                20,
                &[[ADVANCE, 0, 7], [TICK_SERVER, 0, 0], [WRITE, 8, 0x13]],
                40,
            ),
        ),
    ]
}
