//! One storage operation at a time per chunk, in the order the state machine issued
//! them: the chunkserver keeps one job per chunk running, and a job's operations depend
//! on each other. Sans-IO, so the real driver and the in-process fuzzing world
//! (`tessera-sim`'s `world`) order storage the same way.

use std::collections::{HashMap, VecDeque};

use crate::chunkserver::{OpId, StoreOp};
use crate::types::ChunkHandle;

#[derive(Debug, Default)]
pub struct ChunkQueues {
    /// Operations waiting for an earlier one on the same chunk; a key is present while
    /// an operation on that chunk is running.
    waiting: HashMap<ChunkHandle, VecDeque<(OpId, StoreOp)>>,
}

impl ChunkQueues {
    /// The state machine issued `op`: returns it if it may start now (nothing runs on its
    /// chunk), else keeps it behind the operation that does.
    pub fn issue(&mut self, id: OpId, op: StoreOp) -> Option<(OpId, StoreOp)> {
        let h = op.handle();
        match self.waiting.get_mut(&h) {
            Some(q) => {
                q.push_back((id, op));
                None
            }
            None => {
                self.waiting.insert(h, VecDeque::new());
                Some((id, op))
            }
        }
    }

    /// The running operation on chunk `h` finished: the next one to start, if any.
    pub fn finished(&mut self, h: ChunkHandle) -> Option<(OpId, StoreOp)> {
        let q = self.waiting.get_mut(&h)?;
        let next = q.pop_front();
        if next.is_none() {
            self.waiting.remove(&h);
        }
        next
    }

    /// Operations issued and not yet finished, running ones included.
    pub fn len(&self) -> usize {
        self.waiting.values().map(|q| q.len() + 1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn del(h: ChunkHandle) -> StoreOp {
        StoreOp::Delete { handle: h }
    }

    #[test]
    fn one_operation_per_chunk_runs_in_issue_order() {
        let mut q = ChunkQueues::default();
        assert_eq!(q.issue(1, del(7)).map(|(id, _)| id), Some(1));
        assert_eq!(q.issue(2, del(8)).map(|(id, _)| id), Some(2));
        assert!(q.issue(3, del(7)).is_none());
        assert!(q.issue(4, del(7)).is_none());
        assert_eq!(q.len(), 4);
        assert_eq!(q.finished(7).map(|(id, _)| id), Some(3));
        assert_eq!(q.finished(8).map(|(id, _)| id), None);
        assert_eq!(q.finished(7).map(|(id, _)| id), Some(4));
        assert_eq!(q.finished(7).map(|(id, _)| id), None);
        assert!(q.is_empty());
        assert_eq!(q.issue(5, del(7)).map(|(id, _)| id), Some(5));
    }
}
