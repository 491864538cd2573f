//! The model of a file many clients write at once (GFS §2.7.1), judged against real
//! (simulated) time.
//!
//! Every write is recorded with the true time it started and ended and whether it was
//! acknowledged. A byte read may hold the value of any write that covers it, unless that
//! write was *superseded* before the read began: an acknowledged write covering the byte
//! started after the first one ended, and itself ended before the read began. Writes
//! that overlap in time may land in either order, so concurrent writes leave a region
//! consistent but undefined: mingled fragments, but only of values clients wrote. A
//! serial acknowledged write supersedes everything before it, so its region is defined.
//!
//! A failed write can still land later than its writer gave up (a delayed request is
//! ordered when it reaches the primary), so it is superseded only by a write that
//! started `LATE_MS` after it ended. A client's request to a chunkserver may arrive up to
//! `net::MAX_LATE` after its caller gave up (`late_request`), and a request may wait in a
//! server's queues and disks: a disk may stop answering for 16 s (`faults.rs`), and
//! thirty seconds covers that and the queues. An acknowledged write has no such slack:
//! an earlier attempt of it that arrives late must not land (the primary refuses a
//! writer's attempt older than its latest).

use bytes::Bytes;

/// How long after its writer gave up a failed write may still land.
pub const LATE_MS: i64 = 30_000;

#[derive(Clone, Debug)]
pub struct Write {
    pub start: i64,
    /// None while in flight.
    pub end: Option<i64>,
    pub ok: bool,
    pub off: u64,
    pub data: Bytes,
}

impl Write {
    fn end_off(&self) -> u64 {
        self.off + self.data.len() as u64
    }

    /// Whether `later`, an acknowledged write, orders after this one for sure.
    fn overtaken_by(&self, later: &Write) -> bool {
        let Some(end) = self.end else {
            return false;
        };
        let slack = if self.ok { 0 } else { LATE_MS };
        later.ok && later.start > end + slack
    }
}

#[derive(Clone, Debug, Default)]
pub struct History {
    writes: Vec<Write>,
}

impl History {
    /// A write begins; returns its number for [`History::end`].
    pub fn begin(&mut self, start: i64, off: u64, data: Bytes) -> usize {
        self.writes.push(Write {
            start,
            end: None,
            ok: false,
            off,
            data,
        });
        self.writes.len() - 1
    }

    pub fn end(&mut self, n: usize, end: i64, ok: bool) {
        let w = &mut self.writes[n];
        w.end = Some(end);
        w.ok = ok;
    }

    /// The regions (start, end offsets) of acknowledged writes.
    pub fn acked(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.writes
            .iter()
            .filter(|w| w.ok)
            .map(|w| (w.off, w.end_off()))
    }

    pub fn writes(&self) -> usize {
        self.writes.len()
    }

    /// The regions (start, end offsets) of writes that failed or never ended: replicas
    /// may differ there. Everywhere else only acknowledged writes touched the file, so
    /// every replica holds the same bytes (GFS §2.7.1: consistent), whatever order
    /// concurrent writes landed in.
    pub fn unsettled(&self) -> Vec<(u64, u64)> {
        self.writes
            .iter()
            .filter(|w| !w.ok || w.end.is_none())
            .map(|w| (w.off, w.end_off()))
            .collect()
    }

    /// Judges a read of `want` bytes at `off` that began at `rs`, ended at `re`, and
    /// returned `got`.
    pub fn check_read(
        &self,
        rs: i64,
        re: i64,
        off: u64,
        want: u64,
        got: &[u8],
    ) -> Result<(), String> {
        // Length: at least what acknowledged writes done before the read made it, at most
        // what any write begun before the read ended could have made it.
        let len_min = self
            .writes
            .iter()
            .filter(|w| w.ok && w.end.is_some_and(|e| e < rs))
            .map(Write::end_off)
            .max()
            .unwrap_or(0);
        let len_max = self
            .writes
            .iter()
            .filter(|w| w.start < re)
            .map(Write::end_off)
            .max()
            .unwrap_or(0)
            .max(len_min);
        let lo = want.min(len_min.saturating_sub(off));
        let hi = want.min(len_max.saturating_sub(off));
        let n = got.len() as u64;
        if n < lo || n > hi {
            return Err(format!(
                "read of {want} at {off} returned {n} bytes; the file's length is {len_min}..={len_max}"
            ));
        }
        let end = off + n;
        // Writes that touch the range and began before the read ended.
        let touching: Vec<&Write> = self
            .writes
            .iter()
            .filter(|w| w.start < re && w.off < end && w.end_off() > off)
            .collect();
        // Between consecutive boundaries the covering set is the same.
        let mut cuts: Vec<u64> = vec![off, end];
        for w in &touching {
            cuts.push(w.off.clamp(off, end));
            cuts.push(w.end_off().clamp(off, end));
        }
        cuts.sort_unstable();
        cuts.dedup();
        for seg in cuts.windows(2) {
            let (s, e) = (seg[0], seg[1]);
            let covering: Vec<&Write> = touching
                .iter()
                .copied()
                .filter(|w| w.off <= s && w.end_off() >= e)
                .collect();
            let done_before = |x: &&Write| x.ok && x.end.is_some_and(|t| t < rs);
            let candidates: Vec<&Write> = covering
                .iter()
                .copied()
                .filter(|w| !covering.iter().any(|x| done_before(x) && w.overtaken_by(x)))
                .collect();
            let zero_ok = !covering.iter().any(done_before);
            for p in s..e {
                let b = got[(p - off) as usize];
                let allowed = (zero_ok && b == 0)
                    || candidates.iter().any(|w| w.data[(p - w.off) as usize] == b);
                if !allowed {
                    let values: Vec<u8> = candidates
                        .iter()
                        .map(|w| w.data[(p - w.off) as usize])
                        .collect();
                    return Err(format!(
                        "byte {p} read as {b}; allowed: {values:?}{} ({} writes cover it)",
                        if zero_ok { " or 0" } else { "" },
                        covering.len()
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &[u8]) -> Bytes {
        Bytes::copy_from_slice(s)
    }

    #[test]
    fn serial_writes_define_concurrent_ones_mingle() {
        let mut h = History::default();
        let a = h.begin(0, 0, b(b"aaaa"));
        h.end(a, 10, true);
        assert!(h.check_read(20, 30, 0, 10, b"aaaa").is_ok());
        assert!(h.check_read(20, 30, 0, 10, b"aaa").is_err(), "lost bytes");
        assert!(
            h.check_read(20, 30, 0, 10, b"aaaz").is_err(),
            "nobody wrote z"
        );
        assert!(
            h.check_read(5, 30, 0, 10, b"").is_ok(),
            "read began before the ack"
        );
        // Two overlapping in time: any mix of the two, byte by byte.
        let x = h.begin(40, 0, b(b"xxxx"));
        let y = h.begin(41, 2, b(b"yyyy"));
        h.end(x, 50, true);
        h.end(y, 52, true);
        assert!(h.check_read(60, 70, 0, 10, b"xxyyyy").is_ok());
        assert!(h.check_read(60, 70, 0, 10, b"xxxxyy").is_ok());
        assert!(
            h.check_read(60, 70, 0, 10, b"aaxxyy").is_err(),
            "a is overtaken by both"
        );
        // A later serial write defines its region.
        let z = h.begin(80, 0, b(b"zzzzzz"));
        h.end(z, 90, true);
        assert!(h.check_read(100, 110, 0, 10, b"zzzzzz").is_ok());
        assert!(h.check_read(100, 110, 0, 10, b"zzzyzz").is_err());
        // A read overlapping the write may see old or new.
        let w = h.begin(120, 1, b(b"ww"));
        assert!(h.check_read(119, 125, 0, 10, b"zwzzzz").is_ok());
        h.end(w, 130, true);
    }

    #[test]
    fn a_failed_write_may_land_late() {
        let mut h = History::default();
        let a = h.begin(0, 0, b(b"aa"));
        h.end(a, 10, true);
        let f = h.begin(20, 0, b(b"ff"));
        h.end(f, 30, false);
        assert!(h.check_read(40, 50, 0, 2, b"fa").is_ok(), "inconsistent");
        assert!(h.check_read(40, 50, 0, 2, b"aa").is_ok());
        // Soon after, an acknowledged write may still be overtaken by the failed one.
        let c = h.begin(100, 0, b(b"cc"));
        h.end(c, 110, true);
        assert!(h.check_read(120, 130, 0, 2, b"fc").is_ok());
        // Long after, not.
        let d = h.begin(30 + LATE_MS + 1, 0, b(b"dd"));
        h.end(d, 40 + LATE_MS, true);
        assert!(
            h.check_read(50 + LATE_MS, 60 + LATE_MS, 0, 2, b"dd")
                .is_ok()
        );
        assert!(
            h.check_read(50 + LATE_MS, 60 + LATE_MS, 0, 2, b"fd")
                .is_err()
        );
    }
}
