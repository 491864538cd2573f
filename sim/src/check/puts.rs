//! Puts to paths several clients put to and delete at once: a put that succeeded leaves
//! exactly its own bytes at the path, until a delete could have removed them.
//!
//! A put renames its finished file into place, and the rename fails if the path exists;
//! so once a put is acknowledged, only a delete can make the path hold anything else
//! (another put needs the path free). A read that began after an acknowledged put must
//! therefore return that put's bytes exactly, unless a delete of the path could have
//! come between: one that began before the read ended and could have been applied after
//! the put's rename. That is all this judges; what a read finds otherwise (another
//! put's bytes, nothing) is allowed.

use bytes::Bytes;

use super::history::LATE_MS;

#[derive(Clone, Debug)]
enum What {
    Put(Bytes),
    Delete,
}

#[derive(Clone, Debug)]
struct Op {
    what: What,
    start: i64,
    /// None while in flight.
    end: Option<i64>,
    ok: bool,
}

#[derive(Clone, Debug, Default)]
pub struct PutLog {
    ops: Vec<Op>,
}

impl PutLog {
    /// A put of `data` begins; returns its number for [`PutLog::end`].
    pub fn begin_put(&mut self, start: i64, data: Bytes) -> usize {
        self.begin(start, What::Put(data))
    }

    /// A delete of the path begins; returns its number for [`PutLog::end`].
    pub fn begin_delete(&mut self, start: i64) -> usize {
        self.begin(start, What::Delete)
    }

    fn begin(&mut self, start: i64, what: What) -> usize {
        self.ops.push(Op {
            what,
            start,
            end: None,
            ok: false,
        });
        self.ops.len() - 1
    }

    pub fn end(&mut self, n: usize, end: i64, ok: bool) {
        let op = &mut self.ops[n];
        op.end = Some(end);
        op.ok = ok;
    }

    /// The bytes a read that began at `rs` and ended at `re` must return, if any: those
    /// of the put acknowledged last before `rs`, unless a delete may have come after it.
    pub fn must_hold(&self, rs: i64, re: i64) -> Option<&Bytes> {
        let (start, data) = self
            .ops
            .iter()
            .filter_map(|op| match (&op.what, op.end) {
                (What::Put(d), Some(end)) if op.ok && end < rs => Some((end, op.start, d)),
                _ => None,
            })
            .max_by_key(|(end, _, _)| *end)
            .map(|(_, start, d)| (start, d))?;
        let deleted = self.ops.iter().any(|op| {
            // A delete whose reply was lost may still be applied a while after.
            let latest = op.end.map(|e| if op.ok { e } else { e + LATE_MS });
            matches!(op.what, What::Delete) && op.start < re && latest.is_none_or(|l| l > start)
        });
        (!deleted).then_some(data)
    }

    /// Judges a read of the whole path that began at `rs`, ended at `re`, and returned
    /// `got` (None: the path was not found).
    pub fn check_read(&self, rs: i64, re: i64, got: Option<&[u8]>) -> Result<(), String> {
        let Some(want) = self.must_hold(rs, re) else {
            return Ok(());
        };
        match got {
            Some(g) if g == &want[..] => Ok(()),
            Some(g) => Err(format!(
                "a put of {} bytes succeeded and nothing could have removed it, but the \
                 path holds {} other bytes",
                want.len(),
                g.len()
            )),
            None => Err(format!(
                "a put of {} bytes succeeded and nothing could have removed it, but the \
                 path is not found",
                want.len()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledged_put_holds_until_a_delete_may_have_come() {
        let mut p = PutLog::default();
        let a = p.begin_put(0, Bytes::from_static(b"aa"));
        p.end(a, 10, true);
        assert!(p.check_read(11, 12, Some(b"aa")).is_ok());
        assert!(p.check_read(11, 12, Some(b"bb")).is_err());
        assert!(p.check_read(11, 12, None).is_err());
        // A read that began before the put was acknowledged is not judged.
        assert!(p.check_read(5, 12, None).is_ok());
        // A delete that began before the read ended may have removed it.
        let d = p.begin_delete(20);
        assert!(p.check_read(15, 21, None).is_ok());
        assert!(p.check_read(15, 19, None).is_err());
        p.end(d, 25, true);
        let b = p.begin_put(26, Bytes::from_static(b"bb"));
        p.end(b, 30, true);
        assert!(p.check_read(31, 32, Some(b"bb")).is_ok());
        assert!(p.check_read(31, 32, Some(b"aa")).is_err());
        // A failed delete that ended before the put began could still land after it.
        let mut q = PutLog::default();
        let d = q.begin_delete(0);
        q.end(d, 1, false);
        let a = q.begin_put(2, Bytes::from_static(b"aa"));
        q.end(a, 10, true);
        assert!(q.check_read(11, 12, None).is_ok());
    }
}
