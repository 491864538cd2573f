//! Checkers: one invariant to a file, apart from the code they check. They build
//! without madsim: the simulator and the in-process fuzzing world (`crate::world`) share
//! them. `step.rs` runs them after every step of every node (the simulator's observer,
//! `observer.rs`, calls it); the workload feeds the model
//! (`model.rs`) every client operation. A violation is recorded with the simulated time
//! and fails the run.

pub mod appends;
pub mod authority;
pub mod churn;
pub mod clones;
pub mod copies;
pub mod corruption;
pub mod history;
pub mod leases;
pub mod locations;
pub mod model;
pub mod namespace;
#[cfg(madsim)]
pub mod observer;
pub mod plain_appends;
pub mod puts;
pub mod references;
pub mod refusals;
pub mod replication;
pub mod step;
pub mod trace;
pub mod versions;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

/// The directory whose namespace operations the simulator's clients race on.
pub const NS_DIR: &str = "/shared/ns";

/// What every checker shares in one run.
#[derive(Default)]
pub struct Checks {
    pub violations: Vec<String>,
    pub trace: trace::TraceHash,
    pub leases: leases::LeaseBoard,
    pub versions: versions::Versions,
    pub replication: replication::ReplicationReport,
    /// Set while the master's log holds a damaged value (what and where); a master
    /// that stops at recovery then counts in `master_refusals`, not as a violation.
    pub log_damage: Option<String>,
    /// Times the master refused to start on a damaged log.
    pub master_refusals: u64,
    /// Counters for the run's summary.
    pub steps: u64,
    pub reads_checked: u64,
    /// Directory listings compared with the namespace model.
    pub listings_checked: u64,
    /// Shared clients' operations on one directory, checked for linearizability.
    pub namespace: namespace::NsHistory,
    /// Of those, how many had a known answer, once the check ran (0: it did not run).
    pub ns_ops_checked: u64,
    /// Writes into the shared directory's files: slots given out (see
    /// `workload::ns_write`), those acknowledged (path, offset, bytes, true ms begun),
    /// and how many were found after healing.
    pub ns_slots: u64,
    /// Races at one name (`workload::ns_race`): for each, the clients that struck; and
    /// the race called last, with the true ms it strikes at.
    pub ns_races: BTreeMap<u64, u32>,
    pub ns_race: Option<(u64, i64)>,
    /// The longest operation of the long-lived client (`long_lived.rs`), in ms.
    pub long_lived_max_ms: u64,
    pub ns_writes: Vec<(String, u64, bytes::Bytes, i64)>,
    pub ns_writes_checked: u64,
    /// Copies the master lists on live servers that do not hold them (`locations.rs`).
    pub missing: locations::Missing,
    /// Every write's slot (offset) and bytes, acknowledged or not, and how many files
    /// were checked to end in the bytes of one.
    pub ns_tried: HashMap<u64, bytes::Bytes>,
    pub ns_files_checked: u64,
    /// The file of the shared directory a write is on its way to, if any (renames go
    /// for it, to race with it).
    pub ns_writing: Option<String>,
    /// Entries below the shared directory deleted (hidden name, true ms of the delete),
    /// and the latest delete whose entry the master has since removed for good: a
    /// write that began before it may be gone with it.
    pub ns_deleted: HashMap<String, i64>,
    pub ns_reclaimed: Option<i64>,
    pub writes_acked: u64,
    /// Writes, appends and puts to files their client knows are there (it made them, or
    /// moved them in place, with an acknowledged call, and nothing it did since left
    /// that in doubt): none may fail with "not found" (see `workload::known_file`).
    pub known_writes_checked: u64,
    /// Refusals judged against the records their master had not made durable
    /// (`refusals.rs`).
    pub refusals: refusals::Refusals,
    /// Servers a master declared dead and clones it ordered (`churn.rs`).
    pub churn: churn::Churn,
    /// One chunk's clones, while the clone-race phase watches them (`clones.rs`).
    pub clones: Option<clones::CloneWatch>,
    /// Chunks whose listed copies were compared byte for byte after healing.
    pub copies_compared: u64,
    /// Pairs of those copies that differed, each difference where a failed mutation
    /// left its range inconsistent.
    pub copies_inconsistent: u64,
    /// Clients' writes and appends not answered Ok, by chunk (`copies.rs`).
    pub mutations: copies::Mutations,
    /// Files many clients write at once, by path.
    pub histories: BTreeMap<String, history::History>,
    /// Files written by record append, by path.
    pub appends: BTreeMap<String, appends::AppendLog>,
    /// Files written by plain append, by path.
    pub plain_appends: BTreeMap<String, plain_appends::PlainAppends>,
    /// Paths several clients put to and delete, by path.
    pub puts: BTreeMap<String, puts::PutLog>,
    /// Every byte chunkservers stored, kept only in runs that judge record appends.
    pub stored: Option<appends::Stored>,
    /// (server, chunk) copies the scrubber reported corrupt.
    pub scrub_found: HashSet<(String, u64)>,
    /// Orders to mend a corrupt last copy a chunkserver took (server, request) and the
    /// chunk each is for, until answered (or the server crashed); how many were answered
    /// mended, and failed; and the (server, chunk) copies answered mended.
    pub mends_asked: HashMap<(String, u64), u64>,
    pub mends: [u64; 2],
    pub mended: HashSet<(String, u64)>,
    /// Paths a master logged removed (by its node), and when (the step count): the
    /// lost-remove phase's evidence that the master took the remove it then loses.
    pub removes_logged: HashMap<String, (String, u64)>,
    /// Sources of renames a master logged (by its node), and when (the step count): the
    /// lost-rename phase's evidence that the master took the rename it then loses.
    pub renames_logged: HashMap<String, (String, u64)>,
    /// (master node, term) whose quiet period ended early (`master/leases.rs`).
    pub quiet_ended: std::collections::HashSet<(String, u64)>,
    /// When each (master node, chunkserver address) heartbeat was last judged by a
    /// master (the step count).
    pub heartbeats_judged: HashMap<(String, String), u64>,
    /// Deleted (hidden) paths a client asked to remove: the only ones a master may
    /// remove before the collector's delay is up.
    pub removes_asked: HashSet<String>,
    /// Namespace requests a master took and has not answered, by (master, request): the
    /// last record it had logged once it took each, and the request (for messages). An
    /// Ok answer leaves only once that record is durable (`step::master_step`).
    pub answers_due: HashMap<(String, u64), (u64, String)>,
    /// Copies seen on a chunkserver at a version below the master's: (server, chunk,
    /// version), each counted once.
    pub stale_seen: HashSet<(String, u64, u64)>,
    /// Records found by readers, for the run's summary.
    pub records_checked: u64,
    /// How often each kind of fault actually happened (changed what a node saw).
    pub faults: BTreeMap<&'static str, u64>,
    /// The servers the master lists for each chunk not being granted, as of its last step.
    pub listed: std::collections::HashMap<u64, Vec<String>>,
    /// What the master's whole-table checks last saw (`step::master_step`): while it
    /// stays the same they have nothing new to look at.
    /// (The master's fingerprint, `Versions::generation`.)
    pub master_fp: Option<(u64, u64)>,
    /// (server, chunk) copies whose bytes the run corrupted on purpose (see
    /// `corruption.rs`).
    pub corrupted: HashSet<(String, u64)>,
    /// Servers the fault scheduler has impaired now (dead, cut off, disk full or stuck,
    /// holding corrupted data): a copy there is no spare.
    pub impaired: HashSet<String>,
    /// Of every thousand client operations, how many the client crashes in the middle of
    /// (`workload::crashable`); set by the fault scheduler.
    pub client_crash_permille: u64,
    /// A master group: the highest term a leader's master has stepped in. The master
    /// checks judge only its master: a deposed leader still running has an old view,
    /// and what it does is judged where it lands (the chunkservers' checks).
    pub top_epoch: u64,
    /// A master group: leaders' read authority and the reads they answered, in true
    /// time (`authority.rs`).
    pub authority: authority::Authority,
    /// A master group: the replica that led each term (at most one may).
    pub leaders: HashMap<u64, String>,
    /// A master group: which replicas run a master now, by node.
    pub serving: BTreeMap<String, bool>,
    /// A master group: the highest commit index a leader has reported; the last master
    /// log record a replica had applied from entries up to it (committed), and when each
    /// new one was first seen, in true time.
    pub leader_commit: u64,
    pub committed_seq: u64,
    pub committed_at: Vec<(i64, u64)>,
    /// Reads of the shared directory a shadow master answered, each judged.
    pub shadow_reads: u64,
    /// Checkpoints master replicas built beside their event loops and took back.
    pub group_checkpoints: u64,
    /// Checkpoints a master alone's driver built beside it and wrote; and, by node and
    /// record, the master's own state at each step that said one was due, which the
    /// checkpoint written through that record must equal.
    pub master_checkpoints: u64,
    /// The parts those checkpoints were stored in (`driver::checkpoint`).
    pub master_checkpoint_parts: u64,
    /// Checkpoints stored in fewer parts than the one they replaced (whose parts past
    /// the new last must go), and by node the parts of the last one written.
    pub master_checkpoints_shrunk: u64,
    pub last_checkpoint_parts: HashMap<String, u32>,
    pub checkpoints_due: HashMap<(String, u64), Due>,
    /// Snapshots replicas made whole from parts another sent (`snapshot_parts.rs`), and
    /// how many each replica had made as of its last step (it counts from its start).
    pub snapshots_from_parts: u64,
    pub parts_seen: std::collections::HashMap<String, u64>,
    /// How far a replica's own measure of a span may fall short of true time: its
    /// clock's drift (ppm), and a fixed margin for clock jumps and a message held in
    /// flight (`ms`).
    pub lag_slack: (i64, i64),
}

impl Checks {
    /// A master run on `node` starts: the previous run's checkpoints and the answers it
    /// owed die with it (the next run numbers its requests from 1 again).
    pub fn master_started(&mut self, node: &str) {
        self.checkpoints_due.retain(|(n, _), _| n != node);
        self.answers_due.retain(|(n, _), _| n != node);
        self.refusals.master_started(node);
    }

    /// Judges a shadow master's answer, given at true time `t`: from record `seq`, its
    /// state current `lag_ms` ago by its own clock. Nothing past what a leader had
    /// committed, and no lag shorter than it was.
    pub fn shadow_answer(&mut self, t: i64, who: &str, seq: u64, lag_ms: u64) {
        self.shadow_claim(t, who, seq, lag_ms);
        if seq > self.committed_seq {
            let v = format!(
                "shadow master {who} answered from log record {seq}, past the last one any \
                 leader had committed ({})",
                self.committed_seq
            );
            self.violation(t, v);
        }
    }

    /// Judges a shadow's claim, at true time `t`, that its state (through record `seq`)
    /// was the latest committed one `lag_ms` ago by its own clock: no leader had
    /// committed a later record by then.
    pub fn shadow_claim(&mut self, t: i64, who: &str, seq: u64, lag_ms: u64) {
        if lag_ms == u64::MAX {
            return;
        }
        let (ppm, fixed) = self.lag_slack;
        let lag = lag_ms as i64;
        let allowed = lag + lag * ppm / 1_000_000 + fixed;
        let then = t - allowed;
        let n = self.committed_at.partition_point(|&(at, _)| at <= then);
        let committed_then = n.checked_sub(1).map_or(0, |i| self.committed_at[i].1);
        if committed_then > seq {
            let v = format!(
                "shadow master {who} holds log record {seq} and claims it current {lag_ms} ms \
                 ago by its clock, but a leader had committed record {committed_then} {allowed} \
                 ms before (true time)"
            );
            self.violation(t, v);
        }
    }
}

impl Checks {
    /// Counts `n` faults of `kind` that happened.
    pub fn fault(&mut self, kind: &'static str, n: u64) {
        if n > 0 {
            *self.faults.entry(kind).or_default() += n;
        }
    }

    /// Whether a server other than `server` holds an intact copy of `h` that the master
    /// counts (it lists the server, which holds the master's version or `server`'s, if
    /// newer): the copy on `server` may then be damaged without the chunk's data
    /// depending on it alone. A chunk written while fewer than its goal of copies took
    /// the version has fewer than R copies, so the R−1 budget is per chunk, not per
    /// server.
    pub fn spare_copy(&self, server: &str, h: u64) -> bool {
        self.spare_copy_without(server, h, None)
    }

    /// As [`Checks::spare_copy`], with `also` (a server about to be impaired) not
    /// counted either. A spare must be on a server not impaired now: a copy on a full or
    /// dead server misses the next version and is deleted as stale.
    fn spare_copy_without(&self, server: &str, h: u64, also: Option<&str>) -> bool {
        let want = self
            .versions
            .master_version(h)
            .max(self.versions.server_version(server, h))
            .unwrap_or(0);
        let listed = self.listed.get(&h).map_or(&[][..], Vec::as_slice);
        self.versions.holders(h).iter().any(|(s, v)| {
            s != server
                && Some(s.as_str()) != also
                && *v >= want
                && listed.contains(s)
                && !self.impaired.contains(s)
                && !self.corrupted.contains(&(s.clone(), h))
        })
    }

    /// Whether `server` may be impaired without leaving a chunk with a corrupted copy
    /// with no intact copy on a server that is not impaired: the R−1 budget holds per
    /// chunk, and a corrupted copy already spends one of it (a chunk may also have fewer
    /// than R copies, written while servers were down).
    pub fn may_impair(&self, server: &str) -> bool {
        self.corrupted.iter().all(|(s, h)| {
            s == server
                || self.versions.server_version(s, *h).is_none()
                || self.spare_copy_without(s, *h, Some(server))
        })
    }

    /// Records a violation; the same one seen again later is not repeated.
    pub fn violation(&mut self, true_ms: i64, what: String) {
        if self.violations.iter().any(|v| v.ends_with(&what)) {
            return;
        }
        if self.violations.len() < 20 {
            self.violations.push(format!("t={true_ms}ms: {what}"));
        }
    }
}

pub type Shared = Arc<Mutex<Checks>>;

pub fn shared() -> Shared {
    Arc::new(Mutex::new(Checks::default()))
}

/// A master alone's state at the step that said a checkpoint was due, which the
/// checkpoint written for it must hold (`step::master_checkpointed`).
#[derive(Debug)]
pub struct Due {
    /// The checkpoint of that state.
    pub checkpoint: tessera_core::pb::Checkpoint,
    /// The state itself as text (`fuzz::oplog::dump`), read from its structures rather
    /// than through the checkpoint builder, so that a field the builder leaves out
    /// shows; and the default chunk size to restore a checkpoint with.
    pub state: String,
    pub chunk_size: u64,
}
