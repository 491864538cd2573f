//! Checkpoints of a master alone, built beside its event loop.
//!
//! A checkpoint of the whole namespace takes time in proportion to its size (a walk of
//! every file and chunk, then an encoding), and a master that built one inside `handle`
//! answered nothing meanwhile: no request, no heartbeat, no call result. So the master
//! only says when one is due (`Effects::checkpoint_due`), and its driver keeps a second
//! copy of the state here, fed the same records in the same order as they are logged.
//! The driver runs the checkpointer on a task of its own, and encodes a checkpoint's
//! pieces into stored parts as the walk gives them (`driver::checkpoint::Sealed::build`).
//! The parts go into the next batch the driver writes, with the removal of the records
//! they cover (`driver::commit`). Records logged meanwhile stay in the log.
//!
//! The copy starts from what recovery read (the latest checkpoint and the log after
//! it), rebuilt on the checkpointer's own task, so a restart is not slowed either. The
//! cost is a second copy of the namespace in memory and a second application of each
//! record, as a master group's replica pays (`group::checkpointer`).

use super::meta::Meta;
use crate::error::FsError;
use crate::pb;
use crate::types::LogSeq;

/// What the driver tells its checkpointer, in the order it happens.
#[derive(Clone, Debug)]
pub enum Feed {
    /// Records the master logged, in order, each numbered one past the last fed.
    Apply(Vec<(LogSeq, pb::LogRecord)>),
    /// Build a checkpoint through record `through`: the last one fed.
    Take { through: LogSeq },
}

pub struct Checkpointer {
    meta: Meta,
    seq: LogSeq,
}

impl Checkpointer {
    /// The state a master recovered from `checkpoint` and `tail` (see `Master::recover`).
    pub fn recover(
        chunk_size: u64,
        checkpoint: Option<&pb::Checkpoint>,
        tail: &[(LogSeq, pb::LogRecord)],
    ) -> Result<Checkpointer, FsError> {
        let (meta, seq) = Meta::replay(chunk_size, checkpoint, tail.iter().map(|(s, r)| (*s, r)))?;
        Ok(Checkpointer { meta, seq })
    }

    /// The last record applied.
    pub fn seq(&self) -> LogSeq {
        self.seq
    }

    /// Applies records the master logged, in order, each numbered one past the last.
    ///
    /// The master applied every record before it was fed here, in the same order, so a
    /// record that is out of order or does not apply is a bug: it panics (the driver
    /// stops, and the next start recovers from the store, which this never touched).
    pub fn apply(&mut self, records: Vec<(LogSeq, pb::LogRecord)>) {
        for (seq, rec) in records {
            assert_eq!(
                seq,
                self.seq + 1,
                "the checkpointer was fed record {seq} after record {}",
                self.seq
            );
            if let Err(e) = self.meta.apply(&rec) {
                panic!("record {seq} applied in the master but not in its checkpointer: {e}");
            }
            self.seq = seq;
        }
    }

    /// The checkpoint through record `through`, the last one applied, in pieces built
    /// as they are taken (`Meta::checkpoint_pieces`): the driver encodes them into the
    /// stored parts one by one, so the checkpoint is never whole in memory.
    pub fn take(&self, through: LogSeq) -> impl Iterator<Item = pb::Checkpoint> + '_ {
        // A checkpoint labelled past what it holds would let the driver delete records
        // it does not hold; one labelled short would replay records twice.
        assert_eq!(
            through, self.seq,
            "a checkpoint asked through record {through} of a state through record {}",
            self.seq
        );
        self.meta.checkpoint_pieces(self.seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::checkpoint::Sealed;
    use crate::master::{Input, Master, MasterConfig};
    use crate::pb::master_request::Req;
    use crate::types::Time;

    /// What the driver stores of the checkpoint built through `through`, read back.
    fn built_through(cp: &Checkpointer, through: LogSeq) -> pb::Checkpoint {
        let sealed = Sealed::build(through, cp.take(through), 64);
        assert!(sealed.size().0 > 1, "in parts");
        sealed.read().expect("reads back")
    }

    fn create(path: &str) -> Input {
        Input::Request {
            id: 0,
            req: pb::MasterRequest {
                req: Some(Req::Create(pb::CreateRequest {
                    path: path.into(),
                    ..Default::default()
                })),
                ..Default::default()
            },
            from: crate::auth::Caller::Insecure,
        }
    }

    /// Fed what the master logs, the checkpointer builds the checkpoint the master's own
    /// state gives, through the record it was due at; restarted from a checkpoint and the
    /// records after it, and fed on, it does again.
    #[test]
    fn the_checkpointer_builds_the_masters_state_from_the_records_it_logged() {
        let cfg = MasterConfig {
            checkpoint_every: 5,
            ..MasterConfig::default()
        };
        let mut m = Master::recover(cfg.clone(), Time(0), None, Vec::new()).unwrap();
        let mut cp = Checkpointer::recover(cfg.chunk_size, None, &[]).unwrap();
        let (mut built, mut log) = (Vec::new(), Vec::new());
        for i in 0..22 {
            let mut e = m.handle(Time(i), create(&format!("/f{i}")));
            let through = m.last_seq();
            let synced = m.handle(Time(i), Input::LogSynced { through });
            e.log.extend(synced.log);
            assert!(!e.log.is_empty(), "a create logs");
            log.extend(e.log.iter().cloned());
            cp.apply(std::mem::take(&mut e.log));
            if let Some(due) = e.checkpoint_due.or(synced.checkpoint_due) {
                assert_eq!(due, m.last_seq());
                let c = built_through(&cp, due);
                assert_eq!(c, m.meta().checkpoint(due), "through {due}");
                built.push(c);
            }
        }
        assert!(built.len() >= 3, "{} checkpoints", built.len());
        let last = built.last().expect("one");
        let after: Vec<_> = log
            .iter()
            .filter(|(s, _)| *s > last.through_seq)
            .cloned()
            .collect();
        assert!(
            after.len() >= 2,
            "records after the last checkpoint: {after:?}"
        );
        let (older, newer) = after.split_at(after.len() / 2);
        let mut again = Checkpointer::recover(cfg.chunk_size, Some(last), older).unwrap();
        again.apply(newer.to_vec());
        let through = m.last_seq();
        let c = built_through(&again, through);
        assert_eq!(c, m.meta().checkpoint(through));
    }

    fn three_records() -> (Checkpointer, Vec<(LogSeq, pb::LogRecord)>) {
        let cfg = MasterConfig::default();
        let mut m = Master::recover(cfg.clone(), Time(0), None, Vec::new()).unwrap();
        let mut log = Vec::new();
        for i in 0..3 {
            log.extend(m.handle(Time(i), create(&format!("/g{i}"))).log);
        }
        assert!(log.len() >= 3, "{log:?}");
        (
            Checkpointer::recover(cfg.chunk_size, None, &[]).unwrap(),
            log,
        )
    }

    /// Asked through a record it does not hold, it stops.
    #[test]
    #[should_panic(expected = "asked through record 3 of a state through record 2")]
    fn a_checkpoint_asked_past_what_was_fed_is_a_bug() {
        let (mut cp, mut log) = three_records();
        log.truncate(2);
        cp.apply(log);
        let _ = cp.take(3);
    }

    /// Fed a record out of order, it stops.
    #[test]
    #[should_panic(expected = "fed record 3 after record 1")]
    fn a_record_fed_out_of_order_is_a_bug() {
        let (mut cp, mut log) = three_records();
        log.remove(1);
        cp.apply(log);
    }
}
