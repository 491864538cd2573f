//! Replaying a node from its trace: rebuild it from a run's start record, feed it the
//! recorded inputs with the recorded clock readings, and check that each step has the
//! recorded effects. A master's inputs are all in its trace, so its replay is exact. A
//! chunkserver's trace keeps file data as length and CRC only, and what a chunkserver
//! does depends on the data (checksums it computes and verifies), so its runs are
//! counted but not replayed.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::{TraceFile, record};
use crate::master::Master;
use crate::pb::{self, trace_record::Kind};
use crate::types::Time;

/// Records shown before a divergence.
pub const CONTEXT: usize = 20;

/// Where a replay first went another way than the recorded node.
#[derive(Debug)]
pub struct Divergence {
    /// The file and the record in it.
    pub file: String,
    pub record: pb::TraceRecord,
    /// What differs: the recorded effect and the replayed one.
    pub what: String,
    pub expected: String,
    pub actual: String,
    /// The records before it, oldest first.
    pub before: Vec<pb::TraceRecord>,
}

/// What a replay of a node's trace found.
#[derive(Debug, Default)]
pub struct Report {
    /// Runs (starts of the node) replayed, and steps checked in them.
    pub runs: u64,
    pub steps: u64,
    /// Chunkserver runs seen and not replayed, and their steps.
    pub unreplayed_runs: u64,
    pub unreplayed_steps: u64,
    /// Records before the first start record in the files (its run's beginning was
    /// rotated away): not replayed.
    pub skipped: u64,
    /// Notes for the reader: a cut file, a build with other protocol code.
    pub notes: Vec<String>,
    pub divergence: Option<Box<Divergence>>,
}

/// A master being replayed.
struct MasterRun {
    master: Master,
}

enum Run {
    None,
    Master(Box<MasterRun>),
    /// A master the start record could not rebuild: a match if the recorded one did not
    /// start either (took no step).
    Failed(String),
    Chunkserver,
}

/// Replays the trace files of one node, in order.
pub fn replay(files: &[(String, TraceFile)]) -> Report {
    let mut report = Report::default();
    let mut recent: VecDeque<pb::TraceRecord> = VecDeque::with_capacity(CONTEXT + 1);
    let mut run = Run::None;
    let mut last_seq: Option<u64> = None;
    let protocol = super::protocol();
    let mut warned = false;
    for (name, file) in files {
        // A file cut before its header has none to compare.
        if file.header.format != 0 && file.header.protocol != protocol && !warned {
            warned = true;
            report.notes.push(format!(
                "{name}: written by tessera {} with other protocol code (fingerprint \
                 {:016x}; this build's is {protocol:016x}): where the code changed, the \
                 replay may diverge",
                file.header.build, file.header.protocol
            ));
        }
        for rec in &file.records {
            let diverge = |what: String, expected: String, actual: String, recent: &VecDeque<_>| {
                Some(Box::new(Divergence {
                    file: name.clone(),
                    record: rec.clone(),
                    what,
                    expected,
                    actual,
                    before: recent.iter().cloned().collect(),
                }))
            };
            let starts = matches!(
                rec.kind,
                Some(Kind::MasterStart(_) | Kind::ChunkserverStart(_))
            );
            let follows = last_seq.and_then(|l| l.checked_add(1)) == Some(rec.seq);
            if !starts && !matches!(run, Run::None) && !follows {
                report.notes.push(format!(
                    "{name}: record {} follows record {} (records missing): the run is \
                     not replayed past the gap",
                    rec.seq,
                    last_seq.unwrap_or(0)
                ));
                run = Run::None;
            }
            last_seq = Some(rec.seq);
            match (&rec.kind, &mut run) {
                (Some(Kind::MasterStart(s)), _) => {
                    run = match start_master(rec.now_ms, s) {
                        Ok(m) => {
                            report.runs += 1;
                            Run::Master(Box::new(MasterRun { master: m }))
                        }
                        Err(e) => {
                            report.notes.push(format!(
                                "{name}: record {}: the master could not be rebuilt from its \
                                 start record ({e}); nor, as its trace shows no step, did the \
                                 recorded one start",
                                rec.seq
                            ));
                            Run::Failed(e)
                        }
                    }
                }
                (_, Run::Failed(e)) => {
                    report.divergence = diverge(
                        "the master could not be rebuilt from the start record, yet the \
                         recorded one took steps"
                            .into(),
                        "a master".into(),
                        e.clone(),
                        &recent,
                    );
                    return report;
                }
                (Some(Kind::ChunkserverStart(_)), _) => {
                    report.unreplayed_runs += 1;
                    run = Run::Chunkserver;
                }
                (_, Run::None) => report.skipped += 1,
                (Some(Kind::Chunkserver(_)), Run::Chunkserver) => report.unreplayed_steps += 1,
                (Some(Kind::Master(step)), Run::Master(m)) => {
                    report.steps += 1;
                    if let Err((what, expected, actual)) = step_master(&mut m.master, rec, step) {
                        report.divergence = diverge(what, expected, actual, &recent);
                        return report;
                    }
                }
                (kind, _) => {
                    report.divergence = diverge(
                        "a record of another kind than its run's".into(),
                        "a step of the node that started the run".into(),
                        format!("{kind:?}"),
                        &recent,
                    );
                    return report;
                }
            }
            if recent.len() == CONTEXT {
                recent.pop_front();
            }
            recent.push_back(rec.clone());
        }
        if let Some(cut) = &file.cut {
            report.notes.push(format!(
                "{cut} (the node stopped while writing): replayed up to it"
            ));
            run = Run::None;
        }
    }
    report
}

fn start_master(now_ms: u64, s: &pb::TraceMasterStart) -> Result<Master, String> {
    let cfg = record::master_config(s.config.as_ref().ok_or("no settings")?)?;
    let tail = s
        .tail
        .iter()
        .map(|e| {
            e.record
                .clone()
                .map(|r| (e.seq, r))
                .ok_or_else(|| format!("log entry {} without its record", e.seq))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let checkpoint = s.checkpoint.as_ref();
    if s.epoch != 0 {
        // A group's leader taking over from its shadow state's checkpoint.
        let cp = checkpoint.ok_or("a takeover without its checkpoint")?;
        if !tail.is_empty() {
            return Err("a takeover with log records after its checkpoint".into());
        }
        return catch_unwind(AssertUnwindSafe(|| {
            let meta = crate::master::Meta::restore(cp, cfg.chunk_size)?;
            Ok(Master::take_over(
                cfg,
                Time(now_ms),
                meta,
                cp.through_seq,
                s.epoch,
            ))
        }))
        .map_err(|p| format!("the takeover panicked: {}", panic_text(&p)))?
        .map_err(|e: crate::error::FsError| e.to_string());
    }
    // A master alone takes its run's epoch as it recovers (the driver's first step
    // collects the record).
    catch_unwind(AssertUnwindSafe(|| {
        Master::recover(cfg, Time(now_ms), checkpoint, tail).map(|mut m| {
            m.start_alone();
            m
        })
    }))
    .map_err(|p| format!("recovery panicked: {}", panic_text(&p)))?
    .map_err(|e| e.to_string())
}

/// One step: Err((what differs, expected, actual)).
fn step_master(
    master: &mut Master,
    rec: &pb::TraceRecord,
    step: &pb::TraceMasterStep,
) -> Result<(), (String, String, String)> {
    let input = record::master_input(step).map_err(|e| {
        (
            "the record's input cannot be read".into(),
            "an input".into(),
            e,
        )
    })?;
    if let Some(until) = step.authority_ms {
        master.set_authority(Time(until));
    }
    let effects = catch_unwind(AssertUnwindSafe(|| master.handle(Time(rec.now_ms), input)))
        .map_err(|p| {
            (
                "the master stopped on an assertion".into(),
                "the recorded effects".into(),
                format!("panic: {}", panic_text(&p)),
            )
        })?;
    let got = record::master_effects(&effects);
    let mut want = step.clone();
    want.origin = None;
    want.input = None;
    want.authority_ms = None;
    compare(&want, &got)?;
    if rec.seq.is_multiple_of(1024) {
        master.check_invariants().map_err(|e| {
            (
                "the replayed master breaks an invariant".into(),
                "none broken".into(),
                e,
            )
        })?;
    }
    Ok(())
}

fn compare(
    want: &pb::TraceMasterStep,
    got: &pb::TraceMasterStep,
) -> Result<(), (String, String, String)> {
    fn list<T: std::fmt::Debug + PartialEq>(
        what: &str,
        want: &[T],
        got: &[T],
    ) -> Result<(), (String, String, String)> {
        for i in 0..want.len().max(got.len()) {
            let (w, g) = (want.get(i), got.get(i));
            if w != g {
                let show = |x: Option<&T>| x.map_or_else(|| "nothing".into(), |x| format!("{x:?}"));
                return Err((
                    format!(
                        "{what} {} of {} (replayed: {})",
                        i + 1,
                        want.len(),
                        got.len()
                    ),
                    show(w),
                    show(g),
                ));
            }
        }
        Ok(())
    }
    list("log record", &want.log, &got.log)?;
    list("reply", &want.replies, &got.replies)?;
    list("call", &want.calls, &got.calls)?;
    // A checkpoint due, by its record (the driver builds it beside the master; a trace
    // from before that also holds the checkpoint's CRC, which replay cannot rebuild).
    if want.checkpoint_through != got.checkpoint_through {
        return Err((
            "checkpoint due".into(),
            format!("through {}", want.checkpoint_through),
            format!("through {}", got.checkpoint_through),
        ));
    }
    Ok(())
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}
