//! Namespace operations of several clients on one directory are linearizable.
//!
//! Shared clients make, delete, rename, stat and list a few names in one directory at
//! once, through faults: files, and directories that may hold one file of their own, so
//! a directory is renamed or deleted whole (recursively) while others make, stat and
//! write the file inside it. Every operation is recorded with the true times it began
//! and ended and what it answered. The history must be explained by one order of the
//! operations, each taking effect at a moment between its start and its end, in which
//! each answer is the one the tree at that moment gives: a create succeeds only on an
//! absent name and fails with AlreadyExists only on a present one, a listing names
//! exactly the names present with their kinds, a file made in a directory moves with it,
//! and so on. An operation whose outcome is unknown (it failed for good with a transport
//! error, or its client crashed) may take effect at any moment after its start, or
//! never.
//!
//! The search is Wing and Gong's, with Lowe's memo of (operations placed, tree state):
//! at each step, any operation not yet placed that began before every pending definite
//! operation ended may go next, if its answer fits the state.

use std::collections::HashSet;

/// How many names the clients share (two bits of the state each, see [`Kind`]).
pub const NAMES: u8 = 4;

/// The one name a directory of the shared ones may hold.
pub const CHILD: &str = "f";

/// Beyond this many search steps the check gives up and says so (not a violation).
const MAX_STEPS: usize = 2_000_000;

/// What a shared name holds: two bits of the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Absent = 0,
    File = 1,
    /// A directory without [`CHILD`].
    Dir = 2,
    /// A directory holding the file [`CHILD`].
    DirWithChild = 3,
}

/// The tree's state: a [`Kind`] per name.
type State = u16;

fn kind(state: State, n: u8) -> Kind {
    match (state >> (2 * n)) & 3 {
        0 => Kind::Absent,
        1 => Kind::File,
        2 => Kind::Dir,
        _ => Kind::DirWithChild,
    }
}

fn with(state: State, n: u8, k: Kind) -> State {
    state & !(3 << (2 * n)) | (k as State) << (2 * n)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsOp {
    /// A file at the name.
    Create(u8),
    /// A directory at the name (not `-p`).
    Mkdir(u8),
    /// The file [`CHILD`] in the directory at the name.
    CreateIn(u8),
    /// Deletes the name, recursively or not.
    Delete(u8, bool),
    /// Deletes [`CHILD`] in the directory at the name.
    DeleteIn(u8),
    Rename(u8, u8),
    Stat(u8),
    StatIn(u8),
    List,
}

/// What an operation answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// AlreadyExists.
    Exists,
    /// NotFound.
    Missing,
    /// NotADirectory: a file where a directory was named.
    NotDir,
    /// NotEmpty: a directory deleted without `recursive` held a file.
    NotEmpty,
    /// A stat found the name: a directory or not.
    Found {
        dir: bool,
    },
    /// A listing: the names it showed as files and as directories, as bit sets.
    Listed {
        files: u8,
        dirs: u8,
    },
    /// Failed for good without saying whether it was done (transport error, crash).
    Unknown,
}

#[derive(Clone, Debug)]
struct Event {
    client: usize,
    start: i64,
    end: i64,
    op: NsOp,
    outcome: Outcome,
}

/// The recorded history of one directory.
#[derive(Clone, Debug, Default)]
pub struct NsHistory {
    events: Vec<Event>,
}

/// The state after `op` answered `outcome` in `state`, if that answer fits it. An
/// operation of unknown outcome is placed only where it takes effect (placed nowhere, it
/// never did).
fn step(state: State, op: NsOp, outcome: Outcome) -> Option<State> {
    use Kind::*;
    use Outcome as O;
    let done = matches!(outcome, O::Ok | O::Unknown);
    let k = |n| kind(state, n);
    match op {
        NsOp::Create(n) | NsOp::Mkdir(n) => match (k(n), outcome) {
            (Absent, _) if done => {
                let made = if matches!(op, NsOp::Mkdir(_)) {
                    Dir
                } else {
                    File
                };
                Some(with(state, n, made))
            }
            (File | Dir | DirWithChild, O::Exists) => Some(state),
            _ => None,
        },
        NsOp::CreateIn(n) => match (k(n), outcome) {
            (Dir, _) if done => Some(with(state, n, DirWithChild)),
            (DirWithChild, O::Exists) | (Absent, O::Missing) | (File, O::NotDir) => Some(state),
            _ => None,
        },
        NsOp::Delete(n, recursive) => match (k(n), outcome) {
            (File | Dir, _) if done => Some(with(state, n, Absent)),
            (DirWithChild, _) if done && recursive => Some(with(state, n, Absent)),
            (DirWithChild, O::NotEmpty) if !recursive => Some(state),
            (Absent, O::Missing) => Some(state),
            _ => None,
        },
        NsOp::DeleteIn(n) => match (k(n), outcome) {
            (DirWithChild, _) if done => Some(with(state, n, Dir)),
            (Absent | Dir, O::Missing) | (File, O::NotDir) => Some(state),
            _ => None,
        },
        NsOp::Rename(a, b) => match (k(a), k(b), outcome) {
            (Absent, _, O::Missing) => Some(state),
            (ka, Absent, _) if ka != Absent && done => Some(with(with(state, a, Absent), b, ka)),
            (ka, kb, O::Exists) if ka != Absent && kb != Absent => Some(state),
            _ => None,
        },
        NsOp::Stat(n) => match (k(n), outcome) {
            (Absent, O::Missing)
            | (File, O::Found { dir: false })
            | (Dir | DirWithChild, O::Found { dir: true }) => Some(state),
            _ => None,
        },
        NsOp::StatIn(n) => match (k(n), outcome) {
            (Absent | Dir, O::Missing)
            | (File, O::NotDir)
            | (DirWithChild, O::Found { dir: false }) => Some(state),
            _ => None,
        },
        NsOp::List => {
            let O::Listed { files, dirs } = outcome else {
                return None;
            };
            let fits = (0..NAMES).all(|n| {
                let (f, d) = (files & 1 << n != 0, dirs & 1 << n != 0);
                match k(n) {
                    Absent => !f && !d,
                    File => f && !d,
                    Dir | DirWithChild => d && !f,
                }
            });
            fits.then_some(state)
        }
    }
}

impl NsHistory {
    /// An operation begins at true time `start`; returns its index for [`NsHistory::end`].
    pub fn begin(&mut self, client: usize, start: i64, op: NsOp) -> usize {
        self.events.push(Event {
            client,
            start,
            end: i64::MAX,
            op,
            outcome: Outcome::Unknown,
        });
        self.events.len() - 1
    }

    /// Operation `n` answered `outcome` at true time `end`. An unknown outcome keeps no
    /// end: it may take effect at any time after its start.
    pub fn end(&mut self, n: usize, end: i64, outcome: Outcome) {
        let e = &mut self.events[n];
        e.outcome = outcome;
        if outcome != Outcome::Unknown {
            e.end = end;
        }
    }

    /// Operation `n` was answered by a shadow master, from a state that may be older
    /// than its start: it may take effect at any moment before it ended (the state a
    /// shadow shows is the one some moment of the history had), not only after it began.
    pub fn stale(&mut self, n: usize) {
        self.events[n].start = i64::MIN;
    }

    /// How many operations have a known answer (the ones the check must place).
    pub fn definite(&self) -> usize {
        self.events
            .iter()
            .filter(|e| e.outcome != Outcome::Unknown)
            .count()
    }

    /// Checks the history from an empty directory. Ok(false): the search gave up (too
    /// many orders to try), which proves nothing either way.
    pub fn check(&self) -> Result<bool, String> {
        // A read whose answer is unknown changed nothing and says nothing.
        let ev: Vec<&Event> = self
            .events
            .iter()
            .filter(|e| {
                e.outcome != Outcome::Unknown
                    || !matches!(e.op, NsOp::Stat(_) | NsOp::StatIn(_) | NsOp::List)
            })
            .collect();
        let words = ev.len().div_ceil(64);
        let mut seen: HashSet<(Vec<u64>, State)> = HashSet::new();
        let mut stack: Vec<(Vec<u64>, State, usize)> = vec![(vec![0; words], 0, 0)];
        let mut deepest: (usize, Vec<u64>) = (0, vec![0; words]);
        let mut steps = 0;
        let placed = |done: &[u64], i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        let is_read = |op: NsOp| matches!(op, NsOp::Stat(_) | NsOp::StatIn(_) | NsOp::List);
        while let Some((mut done, state, mut depth)) = stack.pop() {
            steps += 1;
            if steps > MAX_STEPS {
                return Ok(false);
            }
            // The earliest end of a definite operation not yet placed: whatever goes
            // next began before it.
            let frontier = |done: &[u64]| {
                (0..ev.len())
                    .filter(|&i| !placed(done, i) && ev[i].outcome != Outcome::Unknown)
                    .map(|i| ev[i].end)
                    .min()
            };
            // A read that may go now and fits the state goes at once: it changes
            // nothing, and placed it only moves the frontier later, so no order that
            // explains the history is lost (and stale reads, which may go almost
            // anywhere, do not multiply the orders tried).
            while let Some(f) = frontier(&done) {
                let fits = (0..ev.len()).find(|&i| {
                    !placed(&done, i)
                        && ev[i].start <= f
                        && is_read(ev[i].op)
                        && step(state, ev[i].op, ev[i].outcome) == Some(state)
                });
                let Some(i) = fits else {
                    break;
                };
                done[i / 64] |= 1 << (i % 64);
                depth += 1;
            }
            if depth > deepest.0 {
                deepest = (depth, done.clone());
            }
            let Some(frontier) = frontier(&done) else {
                return Ok(true);
            };
            for i in 0..ev.len() {
                if placed(&done, i) || ev[i].start > frontier {
                    continue;
                }
                if let Some(next) = step(state, ev[i].op, ev[i].outcome) {
                    let mut d = done.clone();
                    d[i / 64] |= 1 << (i % 64);
                    if seen.insert((d.clone(), next)) {
                        stack.push((d, next, depth + 1));
                    }
                }
            }
        }
        // No order explains the history. Name the definite operation that ended first
        // among those the longest partial order could not place.
        let (depth, done) = deepest;
        let show = |e: &Event| {
            let end = if e.end == i64::MAX {
                "-".to_string()
            } else {
                e.end.to_string()
            };
            format!(
                "client {} {:?} answered {:?} in {}..{end} ms",
                e.client, e.op, e.outcome, e.start
            )
        };
        let stuck_at = (0..ev.len())
            .filter(|&i| !placed(&done, i) && ev[i].outcome != Outcome::Unknown)
            .min_by_key(|&i| ev[i].end);
        let stuck = stuck_at.map(|i| show(ev[i])).unwrap_or_default();
        // Every operation on the names the stuck one names, in the order they began.
        let names = |op: NsOp| match op {
            NsOp::Rename(a, b) => vec![a, b],
            NsOp::List => (0..NAMES).collect(),
            NsOp::Create(n)
            | NsOp::Mkdir(n)
            | NsOp::CreateIn(n)
            | NsOp::Delete(n, _)
            | NsOp::DeleteIn(n)
            | NsOp::Stat(n)
            | NsOp::StatIn(n) => vec![n],
        };
        let theirs = stuck_at.map(|i| names(ev[i].op)).unwrap_or_default();
        let mut related: Vec<&Event> = ev
            .iter()
            .copied()
            .filter(|e| e.op != NsOp::List && names(e.op).iter().any(|n| theirs.contains(n)))
            .collect();
        related.sort_by_key(|e| e.start);
        let related: Vec<String> = related.into_iter().map(show).collect();
        Err(format!(
            "no order of {} operations on the shared directory explains their answers \
             (at most {depth} placed; stuck at: {stuck}; operations on its names: {})",
            ev.len(),
            related.join(", ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(ops: &[(i64, i64, NsOp, Outcome)]) -> NsHistory {
        let mut h = NsHistory::default();
        for (c, &(s, e, op, out)) in ops.iter().enumerate() {
            let n = h.begin(c, s, op);
            h.end(n, e, out);
        }
        h
    }

    use NsOp::*;
    use Outcome::*;

    const FILE: Outcome = Found { dir: false };
    const DIR: Outcome = Found { dir: true };

    fn files(files: u8) -> Outcome {
        Listed { files, dirs: 0 }
    }

    #[test]
    fn sequential_histories_are_judged_by_the_directory() {
        // create, stat, rename, list, delete: all as a directory answers.
        let good = h(&[
            (0, 1, Create(0), Ok),
            (2, 3, Stat(0), FILE),
            (4, 5, Rename(0, 1), Ok),
            (6, 7, List, files(0b10)),
            (8, 9, Delete(1, false), Ok),
            (10, 11, Delete(1, false), Missing),
            (12, 13, Create(2), Ok),
            (14, 15, Create(2), Exists),
        ]);
        assert_eq!(good.check(), Result::Ok(true));
        // A create that failed with AlreadyExists on a name nobody made.
        let bad = h(&[(0, 1, Create(0), Exists)]);
        assert!(bad.check().is_err());
        // A delete that succeeded, yet the name is listed after.
        let bad = h(&[
            (0, 1, Create(0), Ok),
            (2, 3, Delete(0, false), Ok),
            (4, 5, List, files(0b1)),
        ]);
        assert!(bad.check().is_err());
        // A rename that copied instead of moving.
        let bad = h(&[
            (0, 1, Create(0), Ok),
            (2, 3, Rename(0, 1), Ok),
            (4, 5, Stat(0), FILE),
        ]);
        assert!(bad.check().is_err());
    }

    #[test]
    fn overlapping_operations_may_take_effect_in_either_order() {
        // Two creates of one name at once: one wins, either one.
        let race = h(&[(0, 10, Create(0), Exists), (1, 9, Create(0), Ok)]);
        assert_eq!(race.check(), Result::Ok(true));
        // But not when the failure ended before the success began.
        let bad = h(&[(0, 1, Create(0), Exists), (2, 9, Create(0), Ok)]);
        assert!(bad.check().is_err());
        // A stat overlapping a create may see either state.
        let ok = h(&[(0, 10, Create(0), Ok), (1, 2, Stat(0), Missing)]);
        assert_eq!(ok.check(), Result::Ok(true));
        let ok = h(&[(0, 10, Create(0), Ok), (1, 2, Stat(0), FILE)]);
        assert_eq!(ok.check(), Result::Ok(true));
    }

    /// A shadow's answer may show any state the history passed through before it ended,
    /// older than its start; never one no order of the operations produces.
    #[test]
    fn a_shadows_answer_may_be_old_but_never_invented() {
        let hist = |stat: Outcome, stale: bool| {
            let mut h = h(&[
                (0, 1, Create(0), Ok),
                (2, 3, Rename(0, 1), Ok),
                (4, 5, Create(2), Ok),
                (6, 7, Stat(0), stat),
            ]);
            if stale {
                h.stale(3);
            }
            h
        };
        // After the rename, /n0 is gone; a shadow may still show it as it was.
        assert!(hist(FILE, false).check().is_err());
        assert_eq!(hist(FILE, true).check(), Result::Ok(true));
        assert_eq!(hist(Missing, true).check(), Result::Ok(true));
        // Never as a directory: no moment of the history had one there.
        assert!(hist(DIR, true).check().is_err());
        // A listing showing n0 and n1 at once: the rename moved, it did not copy.
        let mut both = h(&[
            (0, 1, Create(0), Ok),
            (2, 3, Rename(0, 1), Ok),
            (6, 7, List, files(0b11)),
        ]);
        both.stale(2);
        assert!(both.check().is_err());
        // Nor a stale answer showing what came after it ended.
        let mut future = h(&[(0, 1, Stat(0), FILE), (2, 3, Create(0), Ok)]);
        future.stale(0);
        assert!(future.check().is_err());
    }

    #[test]
    fn an_unknown_outcome_took_effect_or_did_not() {
        // A create that failed for good: a later listing may show the name, or not.
        for listed in [0, 1] {
            let hist = h(&[(0, 1, Create(0), Unknown), (5, 6, List, files(listed))]);
            assert_eq!(hist.check(), Result::Ok(true), "listed {listed}");
        }
        // But it cannot take effect twice: two listings that disagree in the wrong order.
        let bad = h(&[
            (0, 1, Create(0), Unknown),
            (5, 6, List, files(1)),
            (7, 8, List, files(0)),
        ]);
        assert!(bad.check().is_err());
        // A create retried after its reply was lost that answers AlreadyExists because of
        // its own first attempt: nobody else made the name.
        let bad = h(&[(0, 9, Create(0), Exists), (10, 11, Stat(0), FILE)]);
        assert!(bad.check().is_err());
    }

    #[test]
    fn a_directory_moves_and_goes_with_its_file() {
        let good = h(&[
            (0, 1, Mkdir(0), Ok),
            (2, 3, CreateIn(0), Ok),
            (4, 5, Delete(0, false), NotEmpty),
            (6, 7, Rename(0, 1), Ok),
            (8, 9, StatIn(1), FILE),
            (10, 11, StatIn(0), Missing),
            (12, 13, Stat(1), DIR),
            (
                14,
                15,
                List,
                Listed {
                    files: 0,
                    dirs: 0b10,
                },
            ),
            (16, 17, Create(2), Ok),
            (18, 19, CreateIn(2), NotDir),
            (20, 21, Delete(1, true), Ok),
            (22, 23, Mkdir(1), Ok),
            (24, 25, StatIn(1), Missing),
            (26, 27, DeleteIn(1), Missing),
        ]);
        assert_eq!(good.check(), Result::Ok(true));
        // A directory renamed without the file it held.
        let bad = h(&[
            (0, 1, Mkdir(0), Ok),
            (2, 3, CreateIn(0), Ok),
            (6, 7, Rename(0, 1), Ok),
            (8, 9, StatIn(1), Missing),
        ]);
        assert!(bad.check().is_err());
        // A recursive delete that left the file to a directory made at the name later.
        let bad = h(&[
            (0, 1, Mkdir(0), Ok),
            (2, 3, CreateIn(0), Ok),
            (4, 5, Delete(0, true), Ok),
            (6, 7, Mkdir(0), Ok),
            (8, 9, StatIn(0), FILE),
        ]);
        assert!(bad.check().is_err());
        // A listing that shows a directory as a file.
        let bad = h(&[(0, 1, Mkdir(0), Ok), (2, 3, List, files(1))]);
        assert!(bad.check().is_err());
        // A non-recursive delete of a directory holding a file must refuse.
        let bad = h(&[
            (0, 1, Mkdir(0), Ok),
            (2, 3, CreateIn(0), Ok),
            (4, 5, Delete(0, false), Ok),
        ]);
        assert!(bad.check().is_err());
        // Its file deleted, an empty directory goes without `recursive`.
        let good = h(&[
            (0, 1, Mkdir(0), Ok),
            (2, 3, CreateIn(0), Ok),
            (4, 5, DeleteIn(0), Ok),
            (6, 7, Delete(0, false), Ok),
        ]);
        assert_eq!(good.check(), Result::Ok(true));
    }
}
