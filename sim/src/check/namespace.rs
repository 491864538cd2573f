//! Namespace operations of several clients on one directory are linearizable.
//!
//! Shared clients create, delete, rename, stat and list a few names in one directory at
//! once, through faults. Every operation is recorded with the true times it began and
//! ended and what it answered. The history must be explained by one order of the
//! operations, each taking effect at a moment between its start and its end, in which
//! each answer is the one the directory at that moment gives: a create succeeds only on
//! an absent name and fails with AlreadyExists only on a present one, a listing names
//! exactly the names present, and so on. An operation whose outcome is unknown (it
//! failed for good with a transport error, or its client crashed) may take effect at any
//! moment after its start, or never.
//!
//! The search is Wing and Gong's, with Lowe's memo of (operations placed, directory
//! state): at each step, any operation not yet placed that began before every pending
//! definite operation ended may go next, if its answer fits the state.

use std::collections::HashSet;

/// How many names the clients share (one bit of the state each).
pub const NAMES: u8 = 6;

/// Beyond this many search steps the check gives up and says so (not a violation).
const MAX_STEPS: usize = 2_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NsOp {
    Create(u8),
    Delete(u8),
    Rename(u8, u8),
    Stat(u8),
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
    /// A listing: the names it showed, as a bit set.
    Listed(u8),
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
fn step(state: u8, op: NsOp, outcome: Outcome) -> Option<u8> {
    let has = |n: u8| state & (1 << n) != 0;
    match (op, outcome) {
        (NsOp::Create(n), Outcome::Ok | Outcome::Unknown) if !has(n) => Some(state | 1 << n),
        (NsOp::Create(n), Outcome::Exists) if has(n) => Some(state),
        (NsOp::Delete(n), Outcome::Ok | Outcome::Unknown) if has(n) => Some(state & !(1 << n)),
        (NsOp::Delete(n), Outcome::Missing) if !has(n) => Some(state),
        (NsOp::Rename(a, b), Outcome::Ok | Outcome::Unknown) if has(a) && !has(b) => {
            Some(state & !(1 << a) | 1 << b)
        }
        (NsOp::Rename(a, _), Outcome::Missing) if !has(a) => Some(state),
        (NsOp::Rename(a, b), Outcome::Exists) if has(a) && has(b) => Some(state),
        (NsOp::Stat(n), Outcome::Ok) if has(n) => Some(state),
        (NsOp::Stat(n), Outcome::Missing) if !has(n) => Some(state),
        (NsOp::List, Outcome::Listed(names)) if names == state => Some(state),
        _ => None,
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
                e.outcome != Outcome::Unknown || !matches!(e.op, NsOp::Stat(_) | NsOp::List)
            })
            .collect();
        let words = ev.len().div_ceil(64);
        let mut seen: HashSet<(Vec<u64>, u8)> = HashSet::new();
        let mut stack: Vec<(Vec<u64>, u8, usize)> = vec![(vec![0; words], 0, 0)];
        let mut deepest: (usize, Vec<u64>) = (0, vec![0; words]);
        let mut steps = 0;
        let placed = |done: &[u64], i: usize| done[i / 64] & (1 << (i % 64)) != 0;
        while let Some((done, state, depth)) = stack.pop() {
            steps += 1;
            if steps > MAX_STEPS {
                return Ok(false);
            }
            if depth > deepest.0 {
                deepest = (depth, done.clone());
            }
            // The earliest end of a definite operation not yet placed: whatever goes
            // next began before it.
            let frontier = (0..ev.len())
                .filter(|&i| !placed(&done, i) && ev[i].outcome != Outcome::Unknown)
                .map(|i| ev[i].end)
                .min();
            let Some(frontier) = frontier else {
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
        let stuck = (0..ev.len())
            .filter(|&i| !placed(&done, i) && ev[i].outcome != Outcome::Unknown)
            .min_by_key(|&i| ev[i].end)
            .map(|i| {
                let e = ev[i];
                format!(
                    "client {} {:?} answered {:?} in {}..{} ms",
                    e.client, e.op, e.outcome, e.start, e.end
                )
            })
            .unwrap_or_default();
        Err(format!(
            "no order of {} operations on the shared directory explains their answers \
             (at most {depth} placed; stuck at: {stuck})",
            ev.len()
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

    #[test]
    fn sequential_histories_are_judged_by_the_directory() {
        // create, stat, rename, list, delete: all as a directory answers.
        let good = h(&[
            (0, 1, Create(0), Ok),
            (2, 3, Stat(0), Ok),
            (4, 5, Rename(0, 1), Ok),
            (6, 7, List, Listed(0b10)),
            (8, 9, Delete(1), Ok),
            (10, 11, Delete(1), Missing),
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
            (2, 3, Delete(0), Ok),
            (4, 5, List, Listed(0b1)),
        ]);
        assert!(bad.check().is_err());
        // A rename that copied instead of moving.
        let bad = h(&[
            (0, 1, Create(0), Ok),
            (2, 3, Rename(0, 1), Ok),
            (4, 5, Stat(0), Ok),
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
        let ok = h(&[(0, 10, Create(0), Ok), (1, 2, Stat(0), Ok)]);
        assert_eq!(ok.check(), Result::Ok(true));
    }

    #[test]
    fn an_unknown_outcome_took_effect_or_did_not() {
        // A create that failed for good: a later listing may show the name, or not.
        for listed in [0, 1] {
            let hist = h(&[(0, 1, Create(0), Unknown), (5, 6, List, Listed(listed))]);
            assert_eq!(hist.check(), Result::Ok(true), "listed {listed}");
        }
        // But it cannot take effect twice: two listings that disagree in the wrong order.
        let bad = h(&[
            (0, 1, Create(0), Unknown),
            (5, 6, List, Listed(1)),
            (7, 8, List, Listed(0)),
        ]);
        assert!(bad.check().is_err());
        // A create retried after its reply was lost that answers AlreadyExists because of
        // its own first attempt: nobody else made the name.
        let bad = h(&[(0, 9, Create(0), Exists), (10, 11, Stat(0), Ok)]);
        assert!(bad.check().is_err());
    }
}
