//! Client workloads. Every outcome, success or error, updates a model; every read is
//! judged by it.
//! - `Private`: each client works serially in its own directory: creates files, writes at
//!   random offsets (across chunk boundaries, past the end), reads and checks every byte,
//!   renames, deletes.
//! - `Shared`: every client writes the same few files at once, some writes overlapping
//!   anywhere, some inside the client's own stripe; reads are judged by the history model.
//!   Beside them, clients plain-append to the same few files (every acknowledged append
//!   must be there, at its offset) and put to and delete the same few paths (a put that
//!   succeeded holds its bytes until a delete may have come).
//! - `Appends`: every client record-appends to the same few files and reads them back,
//!   judged by the append model.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use tessera_core::auth::ServerRole;
use tessera_core::client::Client;
use tessera_core::error::FsError;
use tessera_core::record;

use tessera_tracefile::workload::{ClientOp, Script};

use crate::check::Shared;
use crate::check::model::{FileModel, Model};
use crate::check::namespace::{CHILD, NAMES, NsOp, Outcome};
use crate::net::SimNet;
use crate::runtime::SimRuntime;

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Kind {
    Private,
    Shared {
        files: usize,
    },
    Appends {
        files: usize,
    },
    /// The client operations found in recorded traces (`tessera-scenarios replay`),
    /// judged as `Private` files are: each group of directories is one client's.
    Replay(&'static Script),
}

#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub kind: Kind,
    /// Private files only: reads are replaced by writes (data is left idle, unread).
    pub no_reads: bool,
    pub ops: usize,
    pub max_files: usize,
    /// Largest write, in bytes.
    pub max_write: u64,
    /// Files grow to at most this many bytes.
    pub max_file: u64,
    /// Pause between operations.
    pub think: Duration,
    /// Share of operations that are deletes (per mille).
    pub delete_permille: u64,
}

pub type C = Client<SimRuntime, SimNet>;

fn rand() -> u64 {
    madsim::rand::random()
}

/// Bytes no other write produces: client, sequence number and position are mixed in.
pub fn pattern(client: usize, seq: u64, len: u64) -> Bytes {
    let base = (client as u64).wrapping_mul(0x9E37_79B9) ^ seq.wrapping_mul(0x85EB_CA6B);
    (0..len)
        .map(|i| (base.wrapping_add(i.wrapping_mul(31)) >> 3) as u8)
        .collect::<Vec<_>>()
        .into()
}

pub struct ClientRun {
    pub id: usize,
    /// The chunk size the run started with, for checks that look at chunks: that of
    /// the shared files, made before any fault (a restarted master may give files made
    /// later another, see `Knobs::restart_chunk_size`).
    pub chunk_size: u64,
    pub model: Model,
    pub ok: u64,
    pub errors: u64,
    /// Files of the shared directory this client last saw there (made, or found by a
    /// stat or listing), which its writes go to most of the time: others may have
    /// moved or deleted them since.
    pub ns_files: Vec<String>,
    /// The last race at one name this client struck in (`ns_race`).
    pub ns_raced: Option<u64>,
    /// Directories a replay's operations went to (listed after healing); empty for
    /// other workloads, whose files are in `/c<id>`.
    pub dirs: std::collections::BTreeSet<String>,
    /// Files of `model` this client knows are there: it made them, or moved them in
    /// place, with an acknowledged call, and no call of unknown outcome touched them
    /// since (nobody else uses `/c<id>`). A write to one may fail, but never "not found".
    pub known: std::collections::BTreeSet<String>,
    /// Files a replay record-appended to, judged by the append model, not `model`.
    pub append_files: Vec<String>,
    /// A replay's client (its directories are those in `dirs`).
    pub replay: bool,
    /// Replayed operations: done, and left out (a path the model cannot judge).
    pub replayed: u64,
    pub replay_skipped: u64,
}

impl ClientRun {
    pub fn new(id: usize, chunk_size: u64) -> ClientRun {
        ClientRun {
            id,
            chunk_size,
            model: Model::default(),
            ok: 0,
            errors: 0,
            ns_files: Vec::new(),
            ns_raced: None,
            dirs: Default::default(),
            known: Default::default(),
            append_files: Vec::new(),
            replay: false,
            replayed: 0,
            replay_skipped: 0,
        }
    }
}

/// Runs a client operation, unless the client crashes in the middle of it: with the
/// run's client-crash rate (see `Checks::client_crash_permille`), the operation is cut
/// off at a moment the seed picks, as a killed process would leave it: whatever it sent
/// is on its way, whatever it had not sent never goes, and its caller learns nothing.
/// It counts as a crash only if it cut the operation short.
pub async fn crashable<T>(
    checks: &Shared,
    op: impl std::future::Future<Output = Result<T, FsError>>,
) -> Result<T, FsError> {
    let permille = checks.lock().expect("checks").client_crash_permille;
    if permille == 0 || rand() % 1000 >= permille {
        return op.await;
    }
    let after = madsim::time::sleep(Duration::from_millis(rand() % 2_000));
    futures::pin_mut!(op, after);
    match futures::future::select(op, after).await {
        futures::future::Either::Left((r, _)) => r,
        futures::future::Either::Right(_) => {
            checks.lock().expect("checks").fault("client_crash", 1);
            Err(FsError::Unavailable("the client crashed".into()))
        }
    }
}

/// `client` as the CLI makes it, shadow reads on, for writes: no write may take a
/// shadow's answer (its view may predate the file's create), which a client with shadow
/// reads off could never show. The workload's reads keep them off: its checks judge
/// reads as linearizable, which a shadow's answer is not.
fn writer(client: &C) -> C {
    client.clone().with_shadow_reads(true)
}

/// A write of some kind (`what`) to a file its client knows is there gave `result`: it
/// may fail for many reasons, but not with "not found" (a master, or a shadow standing
/// in for it, that has not applied the file's create must not be the one a write asks:
/// a put creates its file and writes it at once), nor as an invalid request.
fn known_file<T>(
    checks: &Shared,
    start: madsim::time::Instant,
    what: String,
    result: &Result<T, FsError>,
) {
    checks.lock().expect("checks").known_writes_checked += 1;
    match result {
        Err(e @ FsError::NotFound(_)) => violation(
            checks,
            start,
            format!("{what} failed \"{e}\", though its client knows the file is there"),
        ),
        // The workload asks only what the protocol allows (sizes, offsets, lengths
        // within bounds): a refusal as invalid is a server or client refusing a
        // well-formed request, which faults never cause.
        Err(e @ FsError::InvalidArgument(_)) => violation(
            checks,
            start,
            format!("{what} was refused \"{e}\", though the request was well-formed"),
        ),
        _ => {}
    }
}

fn violation(checks: &Shared, start: madsim::time::Instant, what: String) {
    let t = start.elapsed().as_millis() as i64;
    checks.lock().expect("checks").violation(t, what);
}

fn now_ms(start: madsim::time::Instant) -> i64 {
    start.elapsed().as_millis() as i64
}

/// The files shared workloads use; created by [`setup`] before clients start.
pub fn shared_paths(w: &Workload) -> Vec<String> {
    match w.kind {
        Kind::Private | Kind::Replay(_) => vec![],
        Kind::Shared { files } => (0..files).map(|i| format!("/shared/w{i}")).collect(),
        Kind::Appends { files } => (0..files).map(|i| format!("/shared/log{i}")).collect(),
    }
}

/// The files shared workloads plain-append to; created by [`setup`].
pub fn plain_append_paths(w: &Workload) -> Vec<String> {
    match w.kind {
        Kind::Shared { files } => (0..files).map(|i| format!("/shared/a{i}")).collect(),
        _ => vec![],
    }
}

/// The paths shared workloads put to and delete (they start absent).
pub fn put_paths(w: &Workload) -> Vec<String> {
    match w.kind {
        Kind::Shared { files } => (0..files).map(|i| format!("/shared/p{i}")).collect(),
        _ => vec![],
    }
}

/// Creates the shared files and registers their models.
pub async fn setup(client: &C, w: &Workload, checks: &Shared) {
    let paths = shared_paths(w);
    if paths.is_empty() {
        return;
    }
    {
        let mut c = checks.lock().expect("checks");
        for p in put_paths(w) {
            c.puts.insert(p, Default::default());
        }
    }
    for dir in ["/shared", NS_DIR] {
        while !matches!(
            client.mkdir(dir, true).await,
            Ok(()) | Err(FsError::AlreadyExists(_))
        ) {
            madsim::time::sleep(Duration::from_millis(500)).await;
        }
    }
    let appended = plain_append_paths(w);
    for p in paths.iter().chain(&appended) {
        while !matches!(
            client.create(p, 0).await,
            Ok(()) | Err(FsError::AlreadyExists(_))
        ) {
            madsim::time::sleep(Duration::from_millis(500)).await;
        }
        let mut c = checks.lock().expect("checks");
        match w.kind {
            Kind::Shared { .. } if appended.contains(p) => {
                c.plain_appends.insert(p.clone(), Default::default());
            }
            Kind::Shared { .. } => {
                c.histories.insert(p.clone(), Default::default());
            }
            Kind::Appends { .. } => {
                c.appends.insert(p.clone(), Default::default());
                c.stored.get_or_insert_with(Default::default);
            }
            Kind::Private | Kind::Replay(_) => {}
        }
    }
}

/// Runs `w` as client `id`; returns the model of what it left behind.
pub async fn run(
    client: C,
    id: usize,
    clients: usize,
    w: Workload,
    checks: Shared,
    start: madsim::time::Instant,
    chunk_size: u64,
) -> ClientRun {
    let dir = format!("/c{id}");
    let mut run = ClientRun::new(id, chunk_size);
    match w.kind {
        Kind::Private => {}
        Kind::Replay(script) => {
            replay_run(&client, &mut run, script, clients, &checks, start).await;
            return run;
        }
        Kind::Shared { .. } => {
            shared_run(&client, &mut run, &w, &checks, start).await;
            return run;
        }
        Kind::Appends { .. } => {
            appends_run(&client, &mut run, &w, &checks, start).await;
            return run;
        }
    }
    // The directory must exist before anything else; retry through faults.
    loop {
        match client.mkdir(&dir, true).await {
            Ok(()) | Err(FsError::AlreadyExists(_)) => break,
            Err(_) => madsim::time::sleep(Duration::from_millis(500)).await,
        }
    }
    for seq in 0..w.ops as u64 {
        madsim::time::sleep(w.think).await;
        let files: Vec<String> = run.model.files.keys().cloned().collect();
        let roll = rand() % 1000;
        if files.is_empty() || (files.len() < w.max_files && roll < 150) {
            let path = format!("{dir}/{}", name(seq));
            create(&client, &mut run, &path, &checks).await;
        } else {
            let path = files[(rand() % files.len() as u64) as usize].clone();
            if roll < 150 + w.delete_permille {
                delete(&client, &mut run, &path, &checks).await;
            } else if roll < 170 + w.delete_permille {
                reserved(&client, &mut run, &path, seq, &checks, start).await;
            } else if roll < 200 + w.delete_permille {
                let to = format!("{dir}/{}", name(seq));
                rename(&client, &mut run, &path, &to, &checks).await;
            } else if roll < 220 + w.delete_permille {
                list_check(&client, &mut run, &checks, start).await;
            } else if roll < 600 || w.no_reads {
                write(&client, &mut run, &path, seq, &w, &checks, start).await;
            } else {
                read(&client, &mut run, &path, &checks, start).await;
            }
        }
    }
    run
}

// ---- replay of recorded client operations --------------------------------------------

/// The largest write or read a replay makes, and the furthest offset it writes or
/// reads at: the simulator keeps file data, and the model, in memory.
const REPLAY_MAX_IO: u64 = 8 << 20;
const REPLAY_MAX_OFFSET: u64 = 256 << 20;

/// When the replayed operations begin, after the cluster started (setup takes ~2 s).
const REPLAY_LEAD: Duration = Duration::from_secs(3);

/// Runs this client's share of `script`: the groups `group % clients == id`, each
/// operation at its recorded time after the replay began (or as soon as the one before
/// it is done), judged by the model as a private workload's are. Paths the model cannot
/// judge (a file made before the traces began and never created in them is created
/// first; a directory's rename or delete is not replayed) are counted as skipped.
async fn replay_run(
    client: &C,
    run: &mut ClientRun,
    script: &Script,
    clients: usize,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let base = start + REPLAY_LEAD;
    run.replay = true;
    let id = run.id;
    let mine = script
        .steps
        .iter()
        .filter(|st| st.group % clients.max(1) == id);
    for (n, st) in mine.enumerate() {
        let due = base + Duration::from_millis(st.at_ms);
        if due > madsim::time::Instant::now() {
            madsim::time::sleep_until(due).await;
        }
        let seq = n as u64;
        let done = match &st.op {
            ClientOp::Mkdir { path } => {
                // Recorded requests include refused ones (the path is a file, say): a
                // refusal is an answer, not a failure, and only a directory that was
                // made is listed after healing.
                match crashable(checks, client.mkdir(path, true)).await {
                    Ok(()) => {
                        run.ok += 1;
                        run.dirs.insert(path.clone());
                    }
                    Err(e) if refused(&e) => run.ok += 1,
                    Err(_) => run.errors += 1,
                }
                true
            }
            ClientOp::Create { path } => {
                if run.model.files.contains_key(path)
                    || run.append_files.contains(path)
                    || run.model.limbo.contains(path)
                    || run.dirs.contains(path)
                {
                    false
                } else {
                    replay_create(client, run, path, checks).await;
                    true
                }
            }
            ClientOp::Delete { path } if run.model.files.contains_key(path) => {
                delete(client, run, path, checks).await;
                true
            }
            ClientOp::Rename { from, to }
                if run.model.files.contains_key(from)
                    && !run.model.files.contains_key(to)
                    && !run.model.limbo.contains(to)
                    && !run.append_files.contains(to) =>
            {
                let there = parents(client, run, to).await;
                // A rename the master refuses outright (a reserved name, say, as the
                // recorded client may have tried on purpose) changes nothing.
                let result = if there {
                    crashable(checks, client.rename(from, to)).await
                } else {
                    Err(FsError::InvalidArgument(
                        "no directory to rename into".into(),
                    ))
                };
                match result {
                    Err(FsError::InvalidArgument(_)) => run.ok += u64::from(there),
                    result => renamed(client, run, from, to, result).await,
                }
                there
            }
            ClientOp::Write { path, offset, len } => {
                if run.append_files.contains(path) || *offset > REPLAY_MAX_OFFSET {
                    false
                } else {
                    if !run.model.files.contains_key(path)
                        && !run.model.limbo.contains(path)
                        && !run.dirs.contains(path)
                    {
                        replay_create(client, run, path, checks).await;
                    }
                    if run.model.files.contains_key(path) {
                        let len = (*len).clamp(1, REPLAY_MAX_IO);
                        let data = pattern(run.id, 2_000_000 + seq, len);
                        write_at(client, run, path, *offset, data, checks, start).await;
                        true
                    } else {
                        false
                    }
                }
            }
            ClientOp::Append { path, len } => {
                if !run.append_files.contains(path)
                    && !run.model.files.contains_key(path)
                    && !run.model.limbo.contains(path)
                    && !run.dirs.contains(path)
                {
                    replay_create(client, run, path, checks).await;
                }
                // A file becomes an append file (judged by the append model, whose
                // records identify themselves) only while nothing else was written to
                // it: bytes written before would be unaccounted for there.
                let empty = run.model.files.get(path).is_some_and(|f| f.len_max == 0);
                if empty {
                    run.model.files.remove(path);
                    run.append_files.push(path.clone());
                    let mut c = checks.lock().expect("checks");
                    c.appends.entry(path.clone()).or_default();
                    c.stored.get_or_insert_with(Default::default);
                }
                if run.append_files.contains(path) {
                    let max = Client::<SimRuntime, SimNet>::max_record(run.chunk_size);
                    let payload = (*len).saturating_sub(record::HEADER as u64).clamp(1, max);
                    append_sized(client, run, path, seq, payload, checks, start).await;
                    true
                } else {
                    false
                }
            }
            ClientOp::Read { path, offset, len } => {
                if run.model.files.contains_key(path) && *offset <= REPLAY_MAX_OFFSET {
                    let len = (*len).clamp(1, REPLAY_MAX_IO);
                    read_at(client, run, path, *offset, len, checks, start).await;
                    true
                } else if run.append_files.contains(path) {
                    read_appends(client, run, path, checks, start, "").await;
                    true
                } else {
                    false
                }
            }
            _ => false,
        };
        if done {
            run.replayed += 1;
        } else {
            run.replay_skipped += 1;
        }
    }
}

/// Makes the directories above `path` (a replay names paths anywhere); whether they
/// are there.
async fn parents(client: &C, run: &mut ClientRun, path: &str) -> bool {
    let dir = parent_of(path);
    if dir == "/" || run.dirs.contains(dir) {
        return true;
    }
    if client.mkdir(dir, true).await.is_ok() {
        run.dirs.insert(dir.to_string());
        true
    } else {
        false
    }
}

/// An answer the master gives to a request it will never carry out as asked: the
/// recorded client may have made it on purpose (a reserved name, a path in use).
fn refused(e: &FsError) -> bool {
    matches!(
        e,
        FsError::InvalidArgument(_)
            | FsError::AlreadyExists(_)
            | FsError::NotADirectory(_)
            | FsError::NotFound(_)
    )
}

/// Creates `path` for a replay: the model holds it if the create landed; a path the
/// master refused is left alone (in use by a file made outside the model, or a
/// directory, or an invalid name), one left in doubt goes to limbo.
async fn replay_create(client: &C, run: &mut ClientRun, path: &str, checks: &Shared) {
    if !parents(client, run, path).await {
        run.model.limbo.push(path.to_string());
        return;
    }
    match crashable(checks, client.create(path, 0)).await {
        Ok(()) => {
            run.ok += 1;
            run.model
                .files
                .insert(path.to_string(), FileModel::default());
        }
        Err(e) if refused(&e) => {
            run.ok += 1;
            run.model.limbo.push(path.to_string());
        }
        Err(_) => {
            run.errors += 1;
            // A lost reply may hide a success: ask, once the call can no longer land.
            settle().await;
            match client.stat(path).await {
                Ok(info) if !info.is_dir => {
                    run.model
                        .files
                        .insert(path.to_string(), FileModel::default());
                }
                Err(FsError::NotFound(_)) => {}
                _ => run.model.limbo.push(path.to_string()),
            }
        }
    }
}

async fn write_at(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    off: u64,
    data: Bytes,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let result = crashable(checks, writer(client).write(path, off, data.clone())).await;
    if !run.replay && run.known.contains(path) {
        let what = format!("a write to {path} (made by its client)");
        known_file(checks, start, what, &result);
    }
    let f = run.model.files.get_mut(path).expect("modelled");
    match result {
        Ok(()) => {
            run.ok += 1;
            f.write_ok(off, &data);
        }
        Err(_) => {
            run.errors += 1;
            f.write_failed(off, &data);
        }
    }
}

async fn read_at(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    off: u64,
    len: u64,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let f = run.model.files.get(path).expect("modelled");
    match client.read(path, off, len).await {
        Ok(got) => {
            run.ok += 1;
            checks.lock().expect("checks").reads_checked += 1;
            if let Err(e) = f.check_read(off, len, &got) {
                let detail = explain(client, path, off, len, &got, f).await;
                violation(checks, start, format!("{path}: {e}; {detail}"));
            }
        }
        Err(_) => run.errors += 1,
    }
}

/// After healing, each file a replay appended to reads back as the append model says.
async fn verify_replay_appends(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    for path in run.append_files.clone() {
        let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
        while !read_appends(client, run, &path, checks, start, "after healing, ").await {
            if madsim::time::Instant::now() >= give_up {
                violation(
                    checks,
                    start,
                    format!("after healing, {path} cannot be read"),
                );
                break;
            }
            madsim::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// A file name of some kind, unique by `seq`: plain, with spaces, dots, punctuation,
/// other scripts, the longest a component may be, or containing (not starting with) the
/// prefix deleted entries get. Every one of them is the user's to use.
fn name(seq: u64) -> String {
    let n = match rand() % 8 {
        0 => format!("a name with spaces {seq}"),
        1 => format!(".hidden.{seq}."),
        2 => format!("#%&*?[]{{}}'\"$!~{seq}"),
        3 => format!("файл-日本語-{seq}"),
        4 => format!("x.tessera-deleted-{seq}"),
        5 => {
            let tag = format!("-{seq}");
            let fill = "l".repeat(tessera_core::path::MAX_NAME - tag.len());
            format!("{fill}{tag}")
        }
        _ => format!("f{seq}"),
    };
    assert!(n.len() <= tessera_core::path::MAX_NAME);
    n
}

/// Tries to give `path` a name only deletes may give, or to create one: both must be
/// refused as invalid, leaving the file where it was. A rename that went through would
/// make the garbage collector take a live file for a deleted one.
async fn reserved(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    seq: u64,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let dir = path.rsplit_once('/').map_or("", |(d, _)| d);
    let to = format!("{dir}/{}1-{seq}", tessera_core::master::DELETED_PREFIX);
    let (what, result) = if rand().is_multiple_of(2) {
        ("rename to", client.rename(path, &to).await)
    } else {
        ("create of", client.create(&to, 0).await)
    };
    match result {
        Err(FsError::InvalidArgument(_)) => run.ok += 1,
        Err(_) => run.errors += 1,
        Ok(()) => violation(
            checks,
            start,
            format!("{what} the reserved name {to} was accepted"),
        ),
    }
}

/// Waits until a call that failed can no longer take effect: a request of it may still
/// be on its way when its client gave up (the client crashed, or a link holds it until
/// just before its deadline, at most the longest RPC timeout), or wait at the master for
/// a lock. Asking before that may see the state from before it lands.
async fn settle() {
    madsim::time::sleep(Duration::from_secs(5)).await;
}

async fn create(client: &C, run: &mut ClientRun, path: &str, checks: &Shared) {
    match crashable(checks, client.create(path, 0)).await {
        Ok(()) => {
            run.ok += 1;
            run.known.insert(path.to_string());
            run.model
                .files
                .insert(path.to_string(), FileModel::default());
        }
        Err(_) => {
            run.errors += 1;
            // A lost reply may hide a success: ask, once the call can no longer land.
            settle().await;
            match client.stat(path).await {
                Ok(_) => {
                    run.model
                        .files
                        .insert(path.to_string(), FileModel::default());
                }
                Err(FsError::NotFound(_)) => {}
                Err(_) => run.model.limbo.push(path.to_string()),
            }
        }
    }
}

async fn delete(client: &C, run: &mut ClientRun, path: &str, checks: &Shared) {
    run.known.remove(path);
    match crashable(checks, client.delete(path, false)).await {
        Ok(()) => {
            run.ok += 1;
            run.model.files.remove(path);
        }
        Err(_) => {
            run.errors += 1;
            settle().await;
            match client.stat(path).await {
                Ok(_) => {}
                Err(FsError::NotFound(_)) => {
                    run.model.files.remove(path);
                }
                Err(_) => {
                    run.model.files.remove(path);
                    run.model.limbo.push(path.to_string());
                }
            }
        }
    }
}

async fn rename(client: &C, run: &mut ClientRun, from: &str, to: &str, checks: &Shared) {
    let result = crashable(checks, client.rename(from, to)).await;
    renamed(client, run, from, to, result).await;
}

/// The model after a rename of `from` to `to` that gave `result`.
async fn renamed(
    client: &C,
    run: &mut ClientRun,
    from: &str,
    to: &str,
    result: Result<(), FsError>,
) {
    run.known.remove(from);
    let moved = match result {
        Ok(()) => {
            run.ok += 1;
            run.known.insert(to.to_string());
            Some(true)
        }
        Err(_) => {
            run.errors += 1;
            settle().await;
            match (client.stat(from).await, client.stat(to).await) {
                (Err(FsError::NotFound(_)), Ok(_)) => Some(true),
                (Ok(_), Err(FsError::NotFound(_))) => Some(false),
                _ => None,
            }
        }
    };
    match moved {
        Some(true) => {
            let f = run
                .model
                .files
                .remove(from)
                .expect("renaming a modelled file");
            run.model.files.insert(to.to_string(), f);
        }
        Some(false) => {}
        None => {
            run.model.files.remove(from);
            run.model.limbo.push(from.to_string());
            run.model.limbo.push(to.to_string());
        }
    }
}

async fn write(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    seq: u64,
    w: &Workload,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let f = run.model.files.get(path).expect("modelled");
    let room = w.max_file.saturating_sub(1);
    let off = rand() % (f.len_max + w.max_write).min(room).max(1);
    let len = (1 + rand() % w.max_write).min(w.max_file - off).max(1);
    let data = pattern(run.id, seq, len);
    write_at(client, run, path, off, data, checks, start).await;
}

async fn read(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let f = run.model.files.get(path).expect("modelled");
    let off = rand() % f.len_max.max(1);
    let len = 1 + rand() % (f.len_max.max(1) * 2);
    read_at(client, run, path, off, len, checks, start).await;
}

/// Retries `op` while it fails, for up to two minutes of simulated time: right after
/// healing, a restarted master grants no lease for one lease period, and locations settle.
pub async fn patiently<T, F: std::future::Future<Output = Result<T, FsError>>>(
    mut op: impl FnMut() -> F,
) -> Result<T, FsError> {
    let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
    loop {
        match op().await {
            Ok(v) => return Ok(v),
            Err(e) if madsim::time::Instant::now() >= give_up => return Err(e),
            Err(_) => madsim::time::sleep(Duration::from_secs(1)).await,
        }
    }
}

/// Makes the file `path` (replication 0: the master's default), asking again while it
/// fails; made by an attempt whose answer was lost, it is made all the same.
pub async fn made(client: &C, path: &str) -> Result<(), FsError> {
    patiently(|| async {
        match client.create(path, 0).await {
            Err(FsError::AlreadyExists(_)) => Ok(()),
            r => r,
        }
    })
    .await
}

/// The liveness check: every modelled file reads back whole and correct, and a fresh
/// write to each succeeds and reads back (leases are granted, clients make progress).
pub async fn verify_all(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let files: Vec<String> = run.model.files.keys().cloned().collect();
    for (n, path) in files.iter().enumerate() {
        let f = run.model.files[path].clone();
        match patiently(|| client.read(path, 0, u64::MAX)).await {
            Ok(got) => {
                checks.lock().expect("checks").reads_checked += 1;
                if let Err(e) = f.check_read(0, u64::MAX, &got) {
                    violation(checks, start, format!("after healing, {path}: {e}"));
                }
            }
            Err(e) => violation(
                checks,
                start,
                format!("after healing, {path} cannot be read: {e}"),
            ),
        }
        let data = pattern(run.id, 1_000_000 + n as u64, 100);
        match patiently(|| client.write(path, 0, data.clone())).await {
            Ok(()) => {
                let m = run.model.files.get_mut(path).expect("modelled");
                m.write_ok(0, &data);
                match patiently(|| client.read(path, 0, 100)).await {
                    Ok(got) if got == data => {}
                    Ok(_) => violation(
                        checks,
                        start,
                        format!("after healing, {path}: a fresh write did not read back"),
                    ),
                    Err(e) => violation(
                        checks,
                        start,
                        format!("after healing, {path}: read after write failed: {e}"),
                    ),
                }
            }
            Err(e) => violation(
                checks,
                start,
                format!("after healing, no progress writing {path}: {e}"),
            ),
        }
        verify_replicas(client, path, Judge::Model, run, checks, start).await;
    }
    verify_replay_appends(client, run, checks, start).await;
    verify_namespace(client, run, checks, start).await;
}

/// The namespace model, through `list` and `stat`: the client's directory holds exactly
/// the files it created and did not delete or rename away (deletes and renames stay
/// done, nothing comes back, nothing is lost), each with a length its writes allow.
/// Paths an error left in doubt are not judged.
async fn verify_namespace(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    // A private workload's files are all in its directory; a replay's in those its
    // operations named.
    let dirs: Vec<String> = if run.replay {
        run.dirs.iter().cloned().collect()
    } else {
        vec![format!("/c{}", run.id)]
    };
    let mut listed = Vec::new();
    for dir in &dirs {
        let replay = run.replay;
        let here = match patiently(|| client.list(dir, false)).await {
            Ok(l) => l,
            // A replay's directory another group's recorded operations took away (its
            // directory deletes and renames are not replayed), with no file of the
            // model in it.
            Err(FsError::NotFound(_) | FsError::NotADirectory(_))
                if replay && !run.model.files.keys().any(|p| parent_of(p) == dir.as_str()) =>
            {
                continue;
            }
            Err(e) => {
                violation(
                    checks,
                    start,
                    format!("after healing, {dir} cannot be listed: {e}"),
                );
                continue;
            }
        };
        checks.lock().expect("checks").listings_checked += 1;
        // A replay's directories may hold others' directories, and its own append
        // files (judged by the append model): those are not judged here.
        let here: Vec<_> = here
            .into_iter()
            .filter(|e| {
                !replay
                    || run.model.files.contains_key(&e.path)
                    || !(e.is_dir || run.append_files.contains(&e.path))
            })
            .collect();
        for m in listing_mismatches(&run.model, dir, &here) {
            violation(checks, start, format!("after healing, {m}"));
        }
        listed.extend(here);
    }
    for (path, f) in &run.model.files {
        if !listed.iter().any(|e| &e.path == path) {
            continue; // reported above
        }
        match patiently(|| client.stat(path)).await {
            Ok(info) if info.length < f.len_min || info.length > f.len_max => violation(
                checks,
                start,
                format!(
                    "after healing, {path} stats {} bytes long; its writes allow {}..={}",
                    info.length, f.len_min, f.len_max
                ),
            ),
            Ok(_) => {}
            Err(e) => violation(
                checks,
                start,
                format!("after healing, {path} cannot be stat'ed: {e}"),
            ),
        }
    }
}

/// Lists the client's directory in the middle of its work, faults and all: a listing
/// that succeeds must match the model as `verify_namespace` demands.
async fn list_check(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let dir = format!("/c{}", run.id);
    match client.list(&dir, false).await {
        Ok(listed) => {
            run.ok += 1;
            checks.lock().expect("checks").listings_checked += 1;
            for m in listing_mismatches(&run.model, &dir, &listed) {
                violation(checks, start, format!("a listing during the run: {m}"));
            }
        }
        Err(_) => run.errors += 1,
    }
}

/// How a listing of `dir` differs from the model of its files (paths in doubt aside).
fn listing_mismatches(
    model: &Model,
    dir: &str,
    listed: &[tessera_core::pb::FileInfo],
) -> Vec<String> {
    let doubt = |p: &str| model.limbo.iter().any(|l| l == p);
    let mut out = Vec::new();
    for e in listed {
        match model.files.get(&e.path) {
            _ if doubt(&e.path) => {}
            None => out.push(format!(
                "{dir} lists {}, which was never made or is gone",
                e.path
            )),
            Some(_) if e.is_dir => out.push(format!("{} is listed as a directory", e.path)),
            Some(f) if e.length < f.len_min || e.length > f.len_max => out.push(format!(
                "{} is listed {} bytes long; its writes allow {}..={}",
                e.path, e.length, f.len_min, f.len_max
            )),
            Some(_) => {}
        }
    }
    for path in model.files.keys().filter(|p| parent_of(p) == dir) {
        if !listed.iter().any(|e| &e.path == path) {
            out.push(format!("{path} is missing from the listing of {dir}"));
        }
    }
    out
}

/// The directory `path` is in.
fn parent_of(path: &str) -> &str {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((d, _)) => d,
    }
}

/// For a failed read check: what the master and each replica say about the first bad
/// byte's chunk, so a failure can be understood from the run's output alone.
async fn explain(client: &C, path: &str, off: u64, want: u64, got: &[u8], f: &FileModel) -> String {
    use prost::Message;
    use tessera_core::pb::{
        self, chunk_request::Req as CReq, master_request::Req as MReq, master_response::Resp,
    };
    use tessera_core::runtime::{Runtime, Transport};
    let bad = (0..got.len())
        .find(|&i| f.check_read(off + i as u64, 1, &got[i..=i]).is_err())
        .map_or(off, |i| off + i as u64);
    let (rt, net, master) = client.parts();
    let call = |to: String, server: ServerRole, body: Vec<u8>| {
        let deadline = rt.now() + Duration::from_secs(2);
        let net = net.clone();
        async move { net.call(&to, server, body.into(), deadline).await }
    };
    let req = pb::MasterRequest {
        req: Some(MReq::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        })),
        ..Default::default()
    };
    let _ = master;
    let Ok(bytes) = call(
        client.masters().current(),
        ServerRole::Master,
        req.encode_to_vec(),
    )
    .await
    else {
        return "master unreachable".into();
    };
    let Ok(pb::MasterResponse {
        resp: Some(Resp::GetChunks(info)),
        ..
    }) = pb::MasterResponse::decode(bytes)
    else {
        return "no locations".into();
    };
    let idx = bad / info.chunk_size;
    let mut out = format!(
        "read {want}@{off} got {}; file_length={} bad byte {bad} in chunk index {idx}",
        got.len(),
        info.file_length
    );
    let Some(c) = info.chunks.iter().find(|c| c.index == idx) else {
        return out + " (no such chunk)";
    };
    out += &format!(
        " handle={} version={} replicas={:?}",
        c.handle, c.version, c.replicas
    );
    for (i, r) in c.replicas.iter().enumerate() {
        let req = pb::ChunkRequest {
            req: Some(CReq::Read(pb::ReadChunkRequest {
                handle: c.handle,
                version: c.version,
                offset: bad % info.chunk_size,
                length: 1,
                capability: c.capabilities.get(i).cloned(),
            })),
        };
        let answer = match call(r.clone(), ServerRole::Chunkserver, req.encode_to_vec())
            .await
            .map(pb::ChunkResponse::decode)
        {
            Ok(Ok(pb::ChunkResponse {
                resp: Some(pb::chunk_response::Resp::Read(rd)),
                ..
            })) => format!("len={} byte={:?}", rd.chunk_length, rd.data.first()),
            Ok(Ok(other)) => format!("{:?}", other.error),
            Ok(Err(e)) => format!("decode: {e}"),
            Err(e) => format!("{e}"),
        };
        out += &format!("; {r}: {answer}");
    }
    out
}

// ---- shared files: many writers --------------------------------------------------------

fn pick<T: Clone>(xs: &[T]) -> T {
    xs[(rand() % xs.len() as u64) as usize].clone()
}

async fn shared_run(
    client: &C,
    run: &mut ClientRun,
    w: &Workload,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let paths = shared_paths(w);
    let (appended, put) = (plain_append_paths(w), put_paths(w));
    // Each client also has a stripe of every file to itself (disjoint writes).
    let stripe = (w.max_file / 8).max(1);
    for seq in 0..w.ops as u64 {
        madsim::time::sleep(w.think).await;
        // A race at one name is called: join it.
        let race = checks.lock().expect("checks").ns_race;
        if let Some((k, at)) = race
            && at > now_ms(start)
            && run.ns_raced != Some(k)
        {
            ns_race(client, run, checks, start, k).await;
            continue;
        }
        let path = pick(&paths);
        let roll = rand() % 1000;
        if roll >= 700 {
            // Plain appends and puts to the same few files and paths.
            match roll {
                700..800 => {
                    let path = pick(&appended);
                    plain_append(client, run, &path, seq, w.max_write, checks, start).await;
                }
                800..840 => {
                    read_plain_appends(client, run, &pick(&appended), checks, start, "").await;
                }
                840..920 => put_one(client, run, &pick(&put), seq, w, checks, start).await,
                920..960 => delete_put(client, run, &pick(&put), checks, start).await,
                _ => {
                    read_put(client, run, &pick(&put), checks, start, "").await;
                }
            }
        } else if roll < 400 {
            let (off, len) = if rand().is_multiple_of(2) {
                let off = rand() % (w.max_file - 1);
                (off, (1 + rand() % w.max_write).min(w.max_file - off))
            } else {
                let base = (run.id as u64 % 8) * stripe;
                let off = base + rand() % stripe;
                (off, (1 + rand() % w.max_write).min(base + stripe - off))
            };
            let data = pattern(run.id, seq, len);
            let n = checks
                .lock()
                .expect("checks")
                .histories
                .get_mut(&path)
                .expect("shared file")
                .begin(now_ms(start), off, data.clone());
            let result = crashable(checks, writer(client).write(&path, off, data)).await;
            // Made before any client started, and never deleted.
            known_file(checks, start, format!("a write to {path}"), &result);
            let ok = result.is_ok();
            if ok {
                run.ok += 1;
            } else {
                run.errors += 1;
            }
            checks
                .lock()
                .expect("checks")
                .histories
                .get_mut(&path)
                .expect("shared file")
                .end(n, now_ms(start), ok);
        } else if roll >= 500 {
            ns_op(client, run, checks, start).await;
        } else {
            let off = rand() % w.max_file;
            let len = 1 + rand() % (2 * w.max_write);
            read_shared(client, run, &path, off, len, checks, start, "").await;
        }
    }
}

// ---- namespace operations of several clients on one directory ---------------------------

/// The directory shared clients create, delete, rename, stat and list names in.
pub use crate::check::NS_DIR;

/// How long before a race at one name strikes it is called (`ns_race`): a little more
/// than a client's think time and an operation, so that every client joins.
const RACE_LEAD: Duration = Duration::from_millis(700);

fn ns_name(n: u8) -> String {
    format!("{NS_DIR}/n{n}")
}

fn ns_outcome<T>(r: &Result<T, FsError>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(FsError::AlreadyExists(_)) => Outcome::Exists,
        Err(FsError::NotFound(_)) => Outcome::Missing,
        Err(FsError::NotADirectory(_)) => Outcome::NotDir,
        Err(FsError::NotEmpty(_)) => Outcome::NotEmpty,
        Err(_) => Outcome::Unknown,
    }
}

/// A namespace operation's answer, passed through. The names it takes are all valid
/// and not reserved, so a master that calls one invalid is wrong, whatever it was asked:
/// that answer is no "outcome unknown".
fn ns_seen<T>(
    checks: &Shared,
    start: madsim::time::Instant,
    op: NsOp,
    r: Result<T, FsError>,
) -> Result<T, FsError> {
    if let Err(FsError::InvalidArgument(m)) = &r {
        checks.lock().expect("checks").violation(
            now_ms(start),
            format!("namespace: {op:?} on valid names was refused as invalid: {m}"),
        );
    }
    r
}

fn ns_stat(r: &Result<tessera_core::pb::FileInfo, FsError>) -> Outcome {
    match r {
        Ok(info) => Outcome::Found { dir: info.is_dir },
        Err(_) => ns_outcome(r),
    }
}

fn ns_child(n: u8) -> String {
    format!("{}/{CHILD}", ns_name(n))
}

/// One namespace operation on [`NS_DIR`], recorded for the linearizability check
/// ([`crate::check::namespace`]), or a write into one of its files.
async fn ns_op(client: &C, run: &mut ClientRun, checks: &Shared, start: madsim::time::Instant) {
    // A group: one operation in four reads from a replica the seed picks, so shadows
    // (and leaders cut off from their group) answer often, failovers included.
    if client.masters().len() > 1 && rand().is_multiple_of(4) {
        let op = match rand() % 3 {
            0 => NsOp::Stat((rand() % u64::from(NAMES)) as u8),
            1 => NsOp::StatIn((rand() % u64::from(NAMES)) as u8),
            _ => NsOp::List,
        };
        let to = pick(&client.masters().all());
        return ns_shadow_read(client, run, checks, start, op, &to).await;
    }
    let a = (rand() % u64::from(NAMES)) as u8;
    let b = (a + 1 + (rand() % u64::from(NAMES - 1)) as u8) % NAMES;
    let op = match rand() % 20 {
        0..=1 => NsOp::Create(a),
        2 => NsOp::Mkdir(a),
        3 => NsOp::CreateIn(a),
        4..=5 => {
            // A directory's life: made, given its file, written, then deleted (with or
            // without `recursive`), its file deleted, or the whole moved.
            if ns_do(client, run, checks, start, NsOp::Mkdir(a)).await == Outcome::Ok
                && ns_do(client, run, checks, start, NsOp::CreateIn(a)).await == Outcome::Ok
            {
                ns_write(client, run, &ns_child(a), checks, start).await;
            }
            match rand() % 4 {
                0 => NsOp::Delete(a, false),
                1 => NsOp::Delete(a, true),
                2 => NsOp::DeleteIn(a),
                _ => NsOp::Rename(a, b),
            }
        }
        6 => NsOp::Delete(a, rand().is_multiple_of(2)),
        7 => NsOp::DeleteIn(a),
        8..=9 => {
            // Most renames rotate a file another client is writing now, if one is (or
            // the directory holding it): the race of a writer with a rotation, whose
            // write must land in the old file or fail, never lengthen the new one. Wait
            // a little for a write to be on its way, then strike at a moment of it the
            // seed picks.
            let give_up = madsim::time::Instant::now() + Duration::from_millis(300);
            let writing = loop {
                let w = checks.lock().expect("checks").ns_writing.clone();
                if w.is_some() || madsim::time::Instant::now() >= give_up {
                    break w;
                }
                madsim::time::sleep(Duration::from_millis(2)).await;
            };
            if writing.is_some() {
                madsim::time::sleep(Duration::from_millis(rand() % 250)).await;
            }
            let busy = writing.and_then(|p| {
                (0..NAMES)
                    .find(|&k| p == ns_name(k) || p == ns_child(k))
                    .map(|k| (k, p == ns_child(k)))
            });
            match busy {
                Some((k, child)) if !rand().is_multiple_of(4) => {
                    let b = (k + 1 + (rand() % u64::from(NAMES - 1)) as u8) % NAMES;
                    let moved = ns_do(client, run, checks, start, NsOp::Rename(k, b)).await;
                    if moved == Outcome::Ok && child {
                        ns_do(client, run, checks, start, NsOp::Mkdir(k)).await;
                        ns_do(client, run, checks, start, NsOp::CreateIn(k)).await;
                    } else if moved == Outcome::Ok {
                        ns_do(client, run, checks, start, NsOp::Create(k)).await;
                    }
                    return;
                }
                _ => NsOp::Rename(a, b),
            }
        }
        10 => NsOp::Stat(a),
        11 => NsOp::StatIn(a),
        12 => NsOp::List,
        13 | 14 => {
            // A race at one name: call one (unless one is called), then strike with
            // whoever joins (`ns_race`).
            let k = {
                let mut c = checks.lock().expect("checks");
                let now = now_ms(start);
                match c.ns_race {
                    Some((k, at)) if at > now => k,
                    _ => {
                        let k = c.ns_races.keys().next_back().map_or(1, |k| k + 1);
                        c.ns_race = Some((k, now + RACE_LEAD.as_millis() as i64));
                        c.ns_races.insert(k, 0);
                        k
                    }
                }
            };
            return ns_race(client, run, checks, start, k).await;
        }
        _ => {
            let path = match rand() % 4 {
                0 => ns_name(a),
                1 => ns_child(a),
                _ if run.ns_files.is_empty() => ns_child(a),
                _ => pick(&run.ns_files),
            };
            return ns_write(client, run, &path, checks, start).await;
        }
    };
    if matches!(op, NsOp::Stat(_) | NsOp::StatIn(_) | NsOp::List)
        && client.masters().len() > 1
        && rand().is_multiple_of(2)
    {
        let to = pick(&client.masters().all());
        return ns_shadow_read(client, run, checks, start, op, &to).await;
    }
    let outcome = ns_do(client, run, checks, start, op).await;
    // Half the renames of a file are a rotation, as of a log: the name is made anew at
    // once, while writers of the old file may still be at it.
    if matches!(op, NsOp::Rename(..)) && outcome == Outcome::Ok && rand().is_multiple_of(2) {
        ns_do(client, run, checks, start, NsOp::Create(a)).await;
    }
}

/// A race at one name: every client that joins the race called last (`Checks::ns_race`)
/// waits for its moment and strikes the name it picks, as the others racing then do:
/// renames onto it from other names, creates, directories and deletes of it, at once.
/// The master must order them as its locks say (a rename onto a name whose create is
/// not yet durable waits for it, `check::refusals`).
async fn ns_race(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
    k: u64,
) {
    let at = {
        let mut c = checks.lock().expect("checks");
        let Some((called, at)) = c.ns_race else {
            return;
        };
        if called != k || run.ns_raced == Some(k) {
            return;
        }
        run.ns_raced = Some(k);
        *c.ns_races.entry(k).or_default() += 1;
        at
    };
    madsim::time::sleep_until(start + Duration::from_millis(at.max(0) as u64)).await;
    let d = (k.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u8 % NAMES;
    let from = (d + 1 + (rand() % u64::from(NAMES - 1)) as u8) % NAMES;
    let op = match rand() % 6 {
        0..=2 => NsOp::Rename(from, d),
        3 => NsOp::Create(d),
        4 => NsOp::Mkdir(d),
        _ => NsOp::Delete(d, rand().is_multiple_of(2)),
    };
    ns_do(client, run, checks, start, op).await;
}

/// A stat or listing of [`NS_DIR`] asked of a master replica the seed picks, letting a
/// shadow answer. A shadow's answer is judged as the stale read it is: it may show any
/// state the history passed through before it ended, never one no order of the
/// operations gives, never a record no leader had committed, and never a state older
/// than the lag it claims (`Checks::shadow_answer`).
async fn ns_shadow_read(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
    op: NsOp,
    to: &str,
) {
    use prost::Message;
    use tessera_core::pb::{self, master_request::Req, master_response::Resp};
    use tessera_core::runtime::{Runtime, Transport};
    let req = match op {
        NsOp::Stat(a) => Req::Stat(pb::StatRequest { path: ns_name(a) }),
        NsOp::StatIn(a) => Req::Stat(pb::StatRequest { path: ns_child(a) }),
        _ => Req::List(pb::ListRequest {
            path: NS_DIR.into(),
            ..Default::default()
        }),
    };
    let body = pb::MasterRequest {
        req: Some(req),
        stale_ok: true,
        ..Default::default()
    };
    let asked = now_ms(start);
    let n = checks
        .lock()
        .expect("checks")
        .namespace
        .begin(run.id, asked, op);
    let (rt, net, _) = client.parts();
    let deadline = rt.now() + Duration::from_secs(2);
    let answer = net
        .call(
            to,
            ServerRole::Master,
            body.encode_to_vec().into(),
            deadline,
        )
        .await
        .ok()
        .and_then(|b| pb::MasterResponse::decode(b).ok());
    let outcome = match &answer {
        None => Outcome::Unknown,
        Some(r) => {
            let result = match (&r.error, &r.resp) {
                (Some(e), _) => Err(FsError::from_pb(e)),
                (None, Some(resp)) => Ok(resp.clone()),
                (None, None) => Err(FsError::Internal("empty answer".into())),
            };
            match (op, result) {
                (NsOp::List, Ok(Resp::List(l))) if !l.more => ns_listed(&l.entries, checks, start),
                (NsOp::List, _) => Outcome::Unknown,
                (_, Ok(Resp::Stat(info))) => ns_stat(&Ok(info)),
                (_, Ok(_)) => Outcome::Unknown,
                (_, Err(e)) => ns_stat(&Err(e)),
            }
        }
    };
    let shadow = answer.and_then(|r| r.shadow);
    let mut c = checks.lock().expect("checks");
    if let Some(sh) = &shadow {
        let who = sh.address.clone();
        // Judged as of when it was asked: the shadow made its claim after that, and its
        // answer may have been held on the way back. A shadow's steps judge its claims
        // exactly, as it makes them (`check::step::replica_step`).
        c.shadow_answer(asked, &who, sh.seq, sh.lag_ms);
        if outcome != Outcome::Unknown {
            c.namespace.stale(n);
            c.shadow_reads += 1;
        }
    }
    c.namespace.end(n, now_ms(start), outcome);
    if outcome == Outcome::Unknown {
        run.errors += 1;
    } else {
        run.ok += 1;
    }
}

/// Does `op`, records it with its answer, and returns the answer.
async fn ns_do(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
    op: NsOp,
) -> Outcome {
    let n = checks
        .lock()
        .expect("checks")
        .namespace
        .begin(run.id, now_ms(start), op);
    let outcome = match op {
        NsOp::Create(a) => ns_outcome(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.create(&ns_name(a), 0)).await,
        )),
        NsOp::Mkdir(a) => ns_outcome(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.mkdir(&ns_name(a), false)).await,
        )),
        NsOp::CreateIn(a) => ns_outcome(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.create(&ns_child(a), 0)).await,
        )),
        NsOp::Delete(a, recursive) => ns_outcome(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.delete(&ns_name(a), recursive)).await,
        )),
        NsOp::DeleteIn(a) => ns_outcome(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.delete(&ns_child(a), false)).await,
        )),
        NsOp::Rename(a, b) => ns_outcome(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.rename(&ns_name(a), &ns_name(b))).await,
        )),
        NsOp::Stat(a) => ns_stat(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.stat(&ns_name(a))).await,
        )),
        NsOp::StatIn(a) => ns_stat(&ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.stat(&ns_child(a))).await,
        )),
        NsOp::List => match ns_seen(
            checks,
            start,
            op,
            crashable(checks, client.list(NS_DIR, false)).await,
        ) {
            Ok(listed) => ns_listed(&listed, checks, start),
            Err(_) => Outcome::Unknown,
        },
    };
    if outcome == Outcome::Unknown {
        run.errors += 1;
    } else {
        run.ok += 1;
    }
    let seen = match (op, outcome) {
        (NsOp::Create(a), Outcome::Ok | Outcome::Exists)
        | (NsOp::Stat(a), Outcome::Found { dir: false }) => Some(ns_name(a)),
        (NsOp::CreateIn(a), Outcome::Ok | Outcome::Exists)
        | (NsOp::StatIn(a), Outcome::Found { dir: false }) => Some(ns_child(a)),
        (NsOp::Rename(a, b), Outcome::Ok) => {
            let (from, to) = (ns_name(a), ns_name(b));
            for p in run.ns_files.iter_mut() {
                if let Some(rest) = p.strip_prefix(&from) {
                    *p = format!("{to}{rest}");
                }
            }
            None
        }
        _ => None,
    };
    if let Some(p) = seen.filter(|p| !run.ns_files.contains(p)) {
        run.ns_files.push(p);
        if run.ns_files.len() > 4 {
            run.ns_files.remove(0);
        }
    }
    checks
        .lock()
        .expect("checks")
        .namespace
        .end(n, now_ms(start), outcome);
    outcome
}

/// Bytes an [`ns_write`] writes: at an offset no other write of the run uses.
const NS_SLOT: u64 = 16;

/// Writes into a file of [`NS_DIR`], one after another while they succeed (up to
/// four), as a writer filling a file would, while others may rename or delete it or
/// move it with its directory. Every write has a region of its own (a slot of
/// [`NS_SLOT`] bytes), so an acknowledged one must be found whole, at its offset, in
/// some file of the tree after healing, whatever was renamed or deleted (a deleted file
/// keeps its bytes under its hidden name until the collector takes it), see
/// [`verify_ns_writes`].
async fn ns_write(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    for _ in 0..4 {
        let began = now_ms(start);
        let off = {
            let mut c = checks.lock().expect("checks");
            c.ns_slots += 1;
            (c.ns_slots - 1) * NS_SLOT
        };
        let data = pattern(run.id, 3_000_000 + off, NS_SLOT);
        checks
            .lock()
            .expect("checks")
            .ns_tried
            .insert(off, data.clone());
        checks.lock().expect("checks").ns_writing = Some(path.to_string());
        let result = crashable(checks, client.write(path, off, data.clone())).await;
        checks.lock().expect("checks").ns_writing = None;
        if result.is_err() {
            run.errors += 1;
            return;
        }
        run.ok += 1;
        let mut c = checks.lock().expect("checks");
        c.writes_acked += 1;
        c.ns_writes.push((path.to_string(), off, data, began));
    }
}

/// A listing of [`NS_DIR`] as the names it shows as files and as directories; a name no
/// client uses is a violation of its own.
fn ns_listed(
    listed: &[tessera_core::pb::FileInfo],
    checks: &Shared,
    start: madsim::time::Instant,
) -> Outcome {
    let (mut files, mut dirs) = (0u8, 0u8);
    for e in listed {
        let n = e
            .path
            .strip_prefix(NS_DIR)
            .and_then(|r| r.strip_prefix("/n"))
            .and_then(|n| n.parse::<u8>().ok())
            .filter(|&n| n < NAMES);
        match n {
            Some(n) if e.is_dir => dirs |= 1 << n,
            Some(n) => files |= 1 << n,
            None => violation(
                checks,
                start,
                format!("{NS_DIR} lists {}, which no client makes", e.path),
            ),
        }
    }
    Outcome::Listed { files, dirs }
}

/// After healing: one more listing of [`NS_DIR`], then the whole history must be
/// linearizable.
async fn verify_ns(client: &C, run: &mut ClientRun, checks: &Shared, start: madsim::time::Instant) {
    let at = now_ms(start);
    let outcome = match patiently(|| client.list(NS_DIR, false)).await {
        Ok(listed) => ns_listed(&listed, checks, start),
        Err(e) => {
            violation(
                checks,
                start,
                format!("after healing, {NS_DIR} cannot be listed: {e}"),
            );
            return;
        }
    };
    run.ok += 1;
    {
        let mut c = checks.lock().expect("checks");
        let n = c.namespace.begin(run.id, at, NsOp::List);
        c.namespace.end(n, now_ms(start), outcome);
    }
    // A group: each replica's listing too, the shadows' from the state they applied.
    if client.masters().len() > 1 {
        for to in client.masters().all() {
            ns_shadow_read(client, run, checks, start, NsOp::List, &to).await;
        }
    }
    // And what each directory holds: a file made in it moved and went with it.
    for a in 0..NAMES {
        let at = now_ms(start);
        let (child, give_up) = (
            ns_child(a),
            madsim::time::Instant::now() + Duration::from_secs(120),
        );
        // Asked until it answers: found, missing, or not a directory.
        let outcome = loop {
            let o = ns_stat(&client.stat(&child).await);
            if o != Outcome::Unknown || madsim::time::Instant::now() >= give_up {
                break o;
            }
            madsim::time::sleep(Duration::from_secs(1)).await;
        };
        let mut c = checks.lock().expect("checks");
        let n = c.namespace.begin(run.id, at, NsOp::StatIn(a));
        c.namespace.end(n, now_ms(start), outcome);
    }
    let verdict = {
        let mut c = checks.lock().expect("checks");
        let verdict = c.namespace.check();
        // A search that gave up checked nothing (the run then says so, and fails as
        // one that did not exercise its subject).
        if verdict == Ok(true) {
            c.ns_ops_checked = c.namespace.definite() as u64;
        } else {
            c.ns_ops_checked = 0;
            c.shadow_reads = 0;
        }
        verdict
    };
    match verdict {
        Ok(true) => {}
        Ok(false) => tracing::warn!("the namespace history has too many orders to check"),
        Err(e) => violation(checks, start, format!("after healing, {e}")),
    }
    verify_ns_writes(client, run, checks, start).await;
}

/// After healing, the files of [`NS_DIR`] and what they hold:
/// - every acknowledged [`ns_write`] is found whole at its offset in some file (deleted
///   ones too, under their hidden names), unless it began before the deletion of a file
///   the master has since removed for good (the collector, or a deleted name deleted
///   again), which may have taken it;
/// - a file's length was set by a write into that file: its last [`NS_SLOT`] bytes are
///   the bytes of the write (acknowledged or not) given that slot. A file lengthened
///   over bytes it lacks (a write extending the file that took its name, say) ends in
///   someone else's slot or in zeros.
async fn verify_ns_writes(
    client: &C,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let mut files: Vec<(String, Bytes)> = Vec::new();
    let mut dirs = vec![NS_DIR.to_string()];
    // Asked until answered; a deleted entry may be collected meanwhile (NotFound).
    async fn answered<T, F: std::future::Future<Output = Result<T, FsError>>>(
        mut op: impl FnMut() -> F,
    ) -> Result<T, FsError> {
        let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
        loop {
            match op().await {
                Err(e)
                    if !matches!(e, FsError::NotFound(_))
                        && madsim::time::Instant::now() < give_up =>
                {
                    madsim::time::sleep(Duration::from_secs(1)).await;
                }
                other => return other,
            }
        }
    }
    let hidden = |p: &str| p.contains(tessera_core::master::DELETED_PREFIX);
    while let Some(dir) = dirs.pop() {
        let listed = match answered(|| client.list(&dir, true)).await {
            Ok(l) => l,
            Err(FsError::NotFound(_)) if hidden(&dir) => continue,
            Err(e) => {
                violation(
                    checks,
                    start,
                    format!("after healing, {dir} cannot be listed: {e}"),
                );
                return;
            }
        };
        for e in listed {
            if e.is_dir {
                dirs.push(e.path);
                continue;
            }
            match answered(|| client.read(&e.path, 0, u64::MAX)).await {
                Ok(bytes) => files.push((e.path, bytes)),
                Err(FsError::NotFound(_)) if hidden(&e.path) => {}
                Err(err) => {
                    violation(
                        checks,
                        start,
                        format!("after healing, {} cannot be read: {err}", e.path),
                    );
                    return;
                }
            }
        }
    }
    run.ok += 1;
    let (writes, tried, reclaimed) = {
        let c = checks.lock().expect("checks");
        (c.ns_writes.clone(), c.ns_tried.clone(), c.ns_reclaimed)
    };
    for (path, bytes) in &files {
        let Some(last) = (bytes.len() as u64).checked_sub(NS_SLOT) else {
            if bytes.is_empty() {
                continue;
            }
            violation(
                checks,
                start,
                format!(
                    "after healing, {path} is {} bytes long, which no write made it",
                    bytes.len()
                ),
            );
            return;
        };
        if tried
            .get(&last)
            .is_none_or(|d| bytes[last as usize..] != d[..])
        {
            violation(
                checks,
                start,
                format!(
                    "after healing, {path} is {} bytes long but does not end in the bytes of \
                     the write that made it so (given offset {last}): lengthened over bytes \
                     it lacks",
                    bytes.len()
                ),
            );
            return;
        }
    }
    // A write that began before a file was deleted may have been in it; if the
    // collector has taken that file since, the write may be gone with it.
    let writes: Vec<_> = writes
        .into_iter()
        .filter(|w| reclaimed.is_none_or(|deleted| w.3 > deleted))
        .collect();
    for (path, off, data, _) in &writes {
        let (from, to) = (*off as usize, (*off + NS_SLOT) as usize);
        let found = files
            .iter()
            .any(|(_, bytes)| bytes.get(from..to) == Some(&data[..]));
        if !found {
            let held: Vec<String> = files
                .iter()
                .map(|(p, b)| format!("{p} ({} bytes)", b.len()))
                .collect();
            violation(
                checks,
                start,
                format!(
                    "after healing, the acknowledged write of {NS_SLOT} bytes at {off} to {path} \
                     is in no file of {NS_DIR}: {}",
                    held.join(", ")
                ),
            );
            return;
        }
    }
    let mut c = checks.lock().expect("checks");
    c.ns_writes_checked += writes.len() as u64;
    c.ns_files_checked += files.len() as u64;
}

// ---- plain appends and puts to shared files ---------------------------------------------

#[allow(clippy::too_many_arguments)]
async fn plain_append(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    seq: u64,
    max: u64,
    checks: &Shared,
    start: madsim::time::Instant,
) -> bool {
    let data = pattern(run.id, seq, 1 + rand() % max);
    checks
        .lock()
        .expect("checks")
        .plain_appends
        .get_mut(path)
        .expect("plain append file")
        .begin(data.len() as u64);
    let result = crashable(checks, writer(client).append(path, data.clone())).await;
    // Made before any client started, and never deleted.
    known_file(checks, start, format!("an append to {path}"), &result);
    match result {
        Ok(at) => {
            run.ok += 1;
            let mut c = checks.lock().expect("checks");
            c.writes_acked += 1;
            c.plain_appends
                .get_mut(path)
                .expect("plain append file")
                .acked(at, data, now_ms(start));
            true
        }
        Err(_) => {
            run.errors += 1;
            false
        }
    }
}

async fn read_plain_appends(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    checks: &Shared,
    start: madsim::time::Instant,
    when: &str,
) -> bool {
    let rs = now_ms(start);
    let got = match client.read(path, 0, u64::MAX).await {
        Ok(g) => g,
        Err(_) => {
            run.errors += 1;
            return false;
        }
    };
    run.ok += 1;
    let verdict = {
        let mut c = checks.lock().expect("checks");
        c.reads_checked += 1;
        let model = &c.plain_appends[path];
        model
            .check_length(got.len() as u64)
            .and_then(|()| model.check(&got, 0, u64::MAX, rs))
    };
    if let Err(e) = verdict {
        violation(checks, start, format!("{when}{path}: {e}"));
    }
    true
}

async fn put_one(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    seq: u64,
    w: &Workload,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let data = pattern(run.id, seq, 1 + rand() % w.max_write);
    let n = checks
        .lock()
        .expect("checks")
        .puts
        .get_mut(path)
        .expect("put path")
        .begin_put(now_ms(start), data.clone());
    let result = crashable(checks, writer(client).put(path, 0, data)).await;
    // A put makes its own file under a name of its own and writes it: whatever became of
    // `path` meanwhile, nothing may answer that its file is not there.
    let what = format!("a put to {path} (a write into the file it made)");
    known_file(checks, start, what, &result);
    let ok = result.is_ok();
    if ok {
        run.ok += 1;
        checks.lock().expect("checks").writes_acked += 1;
    } else {
        run.errors += 1;
    }
    checks
        .lock()
        .expect("checks")
        .puts
        .get_mut(path)
        .expect("put path")
        .end(n, now_ms(start), ok);
}

async fn delete_put(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let n = checks
        .lock()
        .expect("checks")
        .puts
        .get_mut(path)
        .expect("put path")
        .begin_delete(now_ms(start));
    let ok = crashable(checks, client.delete(path, false)).await.is_ok();
    if ok {
        run.ok += 1;
    } else {
        run.errors += 1;
    }
    checks
        .lock()
        .expect("checks")
        .puts
        .get_mut(path)
        .expect("put path")
        .end(n, now_ms(start), ok);
}

/// Reads a put path whole and judges it; false if the read failed (other than the path
/// not being there, which is judged).
async fn read_put(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    checks: &Shared,
    start: madsim::time::Instant,
    when: &str,
) -> bool {
    let rs = now_ms(start);
    let got = match client.read(path, 0, u64::MAX).await {
        Ok(g) => Some(g),
        Err(FsError::NotFound(_)) => None,
        Err(_) => {
            run.errors += 1;
            return false;
        }
    };
    let re = now_ms(start);
    run.ok += 1;
    let verdict = {
        let mut c = checks.lock().expect("checks");
        c.reads_checked += 1;
        c.puts[path].check_read(rs, re, got.as_deref())
    };
    if let Err(e) = verdict {
        violation(checks, start, format!("{when}{path}: {e}"));
    }
    true
}

#[allow(clippy::too_many_arguments)]
async fn read_shared(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    off: u64,
    len: u64,
    checks: &Shared,
    start: madsim::time::Instant,
    when: &str,
) -> bool {
    let rs = now_ms(start);
    let got = client.read(path, off, len).await;
    let re = now_ms(start);
    match got {
        Ok(got) => {
            run.ok += 1;
            let verdict = {
                let mut c = checks.lock().expect("checks");
                c.reads_checked += 1;
                c.histories[path].check_read(rs, re, off, len, &got)
            };
            if let Err(e) = verdict {
                violation(checks, start, format!("{when}{path}: {e}"));
            }
            true
        }
        Err(_) => {
            run.errors += 1;
            false
        }
    }
}

// ---- record append ---------------------------------------------------------------------

async fn appends_run(
    client: &C,
    run: &mut ClientRun,
    w: &Workload,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let paths = shared_paths(w);
    let max = Client::<SimRuntime, SimNet>::max_record(run.chunk_size).min(w.max_write);
    for seq in 0..w.ops as u64 {
        madsim::time::sleep(w.think).await;
        let path = pick(&paths);
        if rand() % 1000 < 750 {
            append_one(client, run, &path, seq, max, checks, start).await;
        } else {
            read_appends(client, run, &path, checks, start, "").await;
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn append_one(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    seq: u64,
    max: u64,
    checks: &Shared,
    start: madsim::time::Instant,
) -> bool {
    append_sized(client, run, path, seq, 1 + rand() % max, checks, start).await
}

/// Record-appends a record of `len` bytes of payload to `path`, an append file.
#[allow(clippy::too_many_arguments)]
async fn append_sized(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    seq: u64,
    len: u64,
    checks: &Shared,
    start: madsim::time::Instant,
) -> bool {
    let payload = pattern(run.id, seq, len);
    let id = rand();
    checks
        .lock()
        .expect("checks")
        .appends
        .get_mut(path)
        .expect("append file")
        .attempted
        .insert(id, payload.clone());
    let result = crashable(
        checks,
        writer(client).record_append(path, record::frame(id, &payload)),
    )
    .await;
    // The shared files were made before any client started, and are never deleted; a
    // replay's may be another client's to delete.
    if !run.replay {
        known_file(checks, start, format!("a record append to {path}"), &result);
    }
    match result {
        Ok(at) => {
            run.ok += 1;
            let mut c = checks.lock().expect("checks");
            c.writes_acked += 1;
            c.appends
                .get_mut(path)
                .expect("append file")
                .acked
                .push((id, at, now_ms(start)));
            true
        }
        Err(_) => {
            run.errors += 1;
            false
        }
    }
}

async fn read_appends(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    checks: &Shared,
    start: madsim::time::Instant,
    when: &str,
) -> bool {
    let rs = now_ms(start);
    let got = match client.read(path, 0, u64::MAX).await {
        Ok(g) => g,
        Err(_) => {
            run.errors += 1;
            return false;
        }
    };
    run.ok += 1;
    // Chunks are never reassigned, so the handles fetched now are the ones read.
    let handles = get_chunks(client, path).await.ok().map(|i| {
        i.chunks
            .iter()
            .map(|c| (c.index, c.handle))
            .collect::<BTreeMap<u64, u64>>()
    });
    let mut c = checks.lock().expect("checks");
    c.reads_checked += 1;
    let verdict = c.appends[path].check(
        &got,
        0,
        u64::MAX,
        run.chunk_size,
        rs,
        handles.as_ref(),
        c.stored.as_ref(),
    );
    match verdict {
        Ok(n) => c.records_checked += n as u64,
        Err(e) => {
            drop(c);
            violation(checks, start, format!("{when}{path}: {e}"));
        }
    }
    true
}

// ---- liveness and every replica, after healing ----------------------------------------

/// After healing, for shared and append files: every file reads back right, a fresh
/// write or append succeeds, and every replica of every chunk is judged on its own.
pub async fn verify_shared(
    client: &C,
    run: &mut ClientRun,
    w: &Workload,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let when = "after healing, ";
    for (n, path) in shared_paths(w).iter().enumerate() {
        let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
        let read_ok = loop {
            let ok = match w.kind {
                Kind::Shared { .. } => {
                    read_shared(client, run, path, 0, u64::MAX, checks, start, when).await
                }
                _ => read_appends(client, run, path, checks, start, when).await,
            };
            if ok || madsim::time::Instant::now() >= give_up {
                break ok;
            }
            madsim::time::sleep(Duration::from_secs(1)).await;
        };
        if !read_ok {
            violation(checks, start, format!("{when}{path} cannot be read"));
        }
        let seq = 2_000_000 + (run.id * 100 + n) as u64;
        let progressed = match w.kind {
            Kind::Shared { .. } => {
                let data = pattern(run.id, seq, 100);
                let k = checks
                    .lock()
                    .expect("checks")
                    .histories
                    .get_mut(path)
                    .expect("shared")
                    .begin(now_ms(start), 0, data.clone());
                let r = patiently(|| client.write(path, 0, data.clone())).await;
                checks
                    .lock()
                    .expect("checks")
                    .histories
                    .get_mut(path)
                    .expect("shared")
                    .end(k, now_ms(start), r.is_ok());
                r.is_ok()
            }
            _ => {
                let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
                loop {
                    if append_one(client, run, path, seq, 100, checks, start).await {
                        break true;
                    }
                    if madsim::time::Instant::now() >= give_up {
                        break false;
                    }
                    madsim::time::sleep(Duration::from_secs(1)).await;
                }
            }
        };
        if !progressed {
            violation(checks, start, format!("{when}no progress writing {path}"));
        }
        let judge = match w.kind {
            Kind::Shared { .. } => Judge::History,
            _ => Judge::Records,
        };
        verify_replicas(client, path, judge, run, checks, start).await;
    }
    for (n, path) in plain_append_paths(w).iter().enumerate() {
        verify_plain_appends(client, run, path, n, checks, start).await;
    }
    for (n, path) in put_paths(w).iter().enumerate() {
        verify_puts(client, run, path, n, checks, start).await;
    }
    if matches!(w.kind, Kind::Shared { .. }) {
        verify_ns(client, run, checks, start).await;
    }
}

/// After healing, a plain-append file: it reads back with every acknowledged append in
/// place, a fresh append succeeds, and every replica holds every acknowledged append.
async fn verify_plain_appends(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    n: usize,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let when = "after healing, ";
    let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
    while !read_plain_appends(client, run, path, checks, start, when).await {
        if madsim::time::Instant::now() >= give_up {
            violation(checks, start, format!("{when}{path} cannot be read"));
            break;
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }
    let seq = 3_000_000 + (run.id * 100 + n) as u64;
    let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
    while !plain_append(client, run, path, seq, 100, checks, start).await {
        if madsim::time::Instant::now() >= give_up {
            violation(
                checks,
                start,
                format!("{when}no progress appending to {path}"),
            );
            break;
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }
    // The fresh append is judged too.
    read_plain_appends(client, run, path, checks, start, when).await;
    verify_replicas(client, path, Judge::PlainAppends, run, checks, start).await;
}

/// After healing, a put path: what it holds is judged, and a put to a fresh path beside
/// it succeeds and reads back exactly.
async fn verify_puts(
    client: &C,
    run: &mut ClientRun,
    path: &str,
    n: usize,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    let when = "after healing, ";
    let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
    while !read_put(client, run, path, checks, start, when).await {
        if madsim::time::Instant::now() >= give_up {
            violation(checks, start, format!("{when}{path} cannot be read"));
            break;
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }
    let data = pattern(run.id, 4_000_000 + n as u64, 100);
    let give_up = madsim::time::Instant::now() + Duration::from_secs(120);
    // A fresh name each attempt: a failed put may still have put its file in place.
    for attempt in 0.. {
        let fresh = format!("{path}.after{}.{attempt}", run.id);
        if client.put(&fresh, 0, data.clone()).await.is_ok() {
            match patiently(|| client.read(&fresh, 0, u64::MAX)).await {
                Ok(got) if got == data => {}
                Ok(_) => violation(
                    checks,
                    start,
                    format!("{when}{fresh}: a fresh put did not read back"),
                ),
                Err(e) => violation(
                    checks,
                    start,
                    format!("{when}{fresh}: read after put failed: {e}"),
                ),
            }
            break;
        }
        if madsim::time::Instant::now() >= give_up {
            violation(checks, start, format!("{when}no progress putting {path}"));
            break;
        }
        madsim::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The master's chunk list of `path`, asked directly.
pub async fn get_chunks(
    client: &C,
    path: &str,
) -> Result<tessera_core::pb::GetChunksResponse, String> {
    use prost::Message;
    use tessera_core::pb::{self, master_request::Req as MReq, master_response::Resp};
    use tessera_core::runtime::{Runtime, Transport};
    let (rt, net, master) = client.parts();
    let req = pb::MasterRequest {
        req: Some(MReq::GetChunks(pb::GetChunksRequest {
            path: path.into(),
            first_index: 0,
            count: 0,
        })),
        ..Default::default()
    };
    let deadline = rt.now() + Duration::from_secs(5);
    // A master group: the replica the client believes leads, followed on as it would.
    let _ = master;
    let to = client.masters().current();
    let bytes = match net
        .call(
            &to,
            ServerRole::Master,
            req.encode_to_vec().into(),
            deadline,
        )
        .await
    {
        Ok(b) => b,
        Err(e) => {
            client.masters().unreachable(&to);
            return Err(e.to_string());
        }
    };
    let decoded = pb::MasterResponse::decode(bytes.clone());
    if let Ok(pb::MasterResponse { error: Some(e), .. }) = &decoded {
        client
            .masters()
            .after(&to, &tessera_core::FsError::from_pb(e));
    }
    match decoded {
        Ok(pb::MasterResponse {
            resp: Some(Resp::GetChunks(info)),
            ..
        }) => Ok(info),
        Ok(r) => Err(format!("the master answered {:?}", r.error)),
        Err(e) => Err(e.to_string()),
    }
}

/// Reads `len` bytes of chunk `handle` at `version` from one replica, directly.
async fn read_replica(
    client: &C,
    replica: &str,
    handle: u64,
    version: u64,
    len: u64,
    capability: Option<tessera_core::pb::Capability>,
) -> Result<Bytes, String> {
    use prost::Message;
    use tessera_core::pb::{self, chunk_request::Req as CReq, chunk_response::Resp};
    use tessera_core::runtime::{Runtime, Transport};
    let (rt, net, _) = client.parts();
    let req = pb::ChunkRequest {
        req: Some(CReq::Read(pb::ReadChunkRequest {
            handle,
            version,
            offset: 0,
            length: len,
            capability,
        })),
    };
    let deadline = rt.now() + Duration::from_secs(5);
    let bytes = net
        .call(
            replica,
            ServerRole::Chunkserver,
            req.encode_to_vec().into(),
            deadline,
        )
        .await
        .map_err(|e| e.to_string())?;
    match pb::ChunkResponse::decode(bytes) {
        Ok(pb::ChunkResponse {
            error: None,
            resp: Some(Resp::Read(r)),
            ..
        }) => Ok(r.data),
        Ok(r) => Err(format!("it answered {:?}", r.error)),
        Err(e) => Err(e.to_string()),
    }
}

/// Which model judges a file's replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judge {
    /// A client's private file ([`FileModel`]).
    Model,
    /// A file many clients write ([`crate::check::history`]).
    History,
    /// A file written by record append ([`crate::check::appends`]).
    Records,
    /// A file written by plain append ([`crate::check::plain_appends`]).
    PlainAppends,
}

/// Judges every replica of every chunk of `path` on its own: each must hold what the
/// file's model allows (GFS's consistency is about *all* replicas, not the one a reader
/// happened to pick). The bytes past a replica's end read as zeros, as a reader sees
/// them, up to the file's length.
pub async fn verify_replicas(
    client: &C,
    path: &str,
    judge: Judge,
    run: &mut ClientRun,
    checks: &Shared,
    start: madsim::time::Instant,
) {
    // After healing the master answers, and every replica it lists serves its copy: a
    // few tries ride out a listing that changed meanwhile (a copy just found corrupt).
    let mut tries = 0;
    let info = loop {
        match get_chunks(client, path).await {
            Ok(info) => break info,
            Err(e) if tries >= 30 => {
                violation(
                    checks,
                    start,
                    format!("the master did not list the chunks of {path}: {e}"),
                );
                return;
            }
            Err(_) => {
                tries += 1;
                madsim::time::sleep(Duration::from_secs(2)).await;
            }
        }
    };
    let cs = info.chunk_size;
    let handles: BTreeMap<u64, u64> = info.chunks.iter().map(|c| (c.index, c.handle)).collect();
    for c in &info.chunks {
        let base = c.index * cs;
        let extent = info.file_length.saturating_sub(base).min(cs);
        if c.version == 0 || extent == 0 {
            continue;
        }
        // Each replica's bytes, to compare them with one another too.
        let mut copies: Vec<(String, Bytes)> = Vec::new();
        for (i, r) in c.replicas.iter().enumerate() {
            let mut tries = 0;
            let mut cap = c.capabilities.get(i).cloned();
            let mut d = loop {
                match read_replica(client, r, c.handle, c.version, cs, cap.clone()).await {
                    Ok(d) => break Some(d.to_vec()),
                    Err(_) if tries < 5 => {
                        tries += 1;
                        madsim::time::sleep(Duration::from_secs(2)).await;
                        // A fresh capability: the last may have expired meanwhile, or the
                        // server (restarted) may not hold the key that signed it.
                        if let Ok(i) = get_chunks(client, path).await
                            && let Some(x) = i.chunks.iter().find(|x| x.handle == c.handle)
                            && let Some(at) = x.replicas.iter().position(|a| a == r)
                        {
                            cap = x.capabilities.get(at).cloned();
                        }
                    }
                    Err(e) => {
                        // Listed still? Then it must serve what it holds.
                        let listed = get_chunks(client, path).await.is_ok_and(|i| {
                            i.chunks
                                .iter()
                                .any(|x| x.handle == c.handle && x.replicas.contains(r))
                        });
                        if listed {
                            violation(
                                checks,
                                start,
                                format!(
                                    "replica {r} of {path} chunk {} (handle {} v{}) is listed but unreadable: {e}",
                                    c.index, c.handle, c.version
                                ),
                            );
                        }
                        break None;
                    }
                }
            };
            let Some(mut d) = d.take() else {
                continue;
            };
            if (d.len() as u64) < extent {
                d.resize(extent as usize, 0);
            }
            let d = Bytes::from(d);
            copies.push((r.clone(), d.clone()));
            let rs = now_ms(start);
            let verdict = {
                let mut ch = checks.lock().expect("checks");
                ch.reads_checked += 1;
                match judge {
                    Judge::Model => run
                        .model
                        .files
                        .get(path)
                        .map_or(Ok(()), |f| f.check_read(base, d.len() as u64, &d)),
                    Judge::History => {
                        ch.histories[path].check_read(rs, rs, base, d.len() as u64, &d)
                    }
                    Judge::PlainAppends => ch.plain_appends[path]
                        .check(&d, base, base + d.len() as u64, rs)
                        .map(|_| ()),
                    Judge::Records => {
                        let found = ch.appends[path].check(
                            &d,
                            base,
                            base + cs,
                            cs,
                            rs,
                            Some(&handles),
                            ch.stored.as_ref(),
                        );
                        // Each replica's records are read back and judged: they count.
                        found.map(|n| ch.records_checked += n as u64)
                    }
                }
            };
            if let Err(e) = verdict {
                violation(
                    checks,
                    start,
                    format!(
                        "replica {r} of {path} chunk {} (handle {} v{}): {e}",
                        c.index, c.handle, c.version
                    ),
                );
            }
        }
        if judge == Judge::History {
            let unsettled = checks.lock().expect("checks").histories[path].unsettled();
            if let Some(e) = differing(&copies, base, extent, &unsettled) {
                violation(
                    checks,
                    start,
                    format!(
                        "replicas of {path} chunk {} (handle {} v{}) differ: {e}",
                        c.index, c.handle, c.version
                    ),
                );
            }
        }
    }
}

/// Where two replicas of a chunk (holding the file's bytes from `base`) differ within
/// its first `extent` bytes, outside every region in `unsettled` (see
/// [`crate::check::history::History::unsettled`]).
fn differing(
    copies: &[(String, Bytes)],
    base: u64,
    extent: u64,
    unsettled: &[(u64, u64)],
) -> Option<String> {
    let (first, rest) = copies.split_first()?;
    let mut settled = vec![true; extent as usize];
    for &(from, to) in unsettled {
        let from = from.saturating_sub(base).min(extent) as usize;
        let to = to.saturating_sub(base).min(extent) as usize;
        settled[from..to.max(from)].fill(false);
    }
    for (r, d) in rest {
        let Some(at) = (0..extent as usize).find(|&i| settled[i] && first.1.get(i) != d.get(i))
        else {
            continue;
        };
        return Some(format!(
            "{} holds {:?} at file offset {}, {r} holds {:?}, where only acknowledged writes \
             wrote (GFS: consistent)",
            first.0,
            first.1.get(at),
            base + at as u64,
            d.get(at)
        ));
    }
    None
}
