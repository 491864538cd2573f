//! Plain appends (`Client::append`): every acknowledged append's bytes are in the file,
//! intact, at the offset its append returned, on every replica.
//!
//! The master gives each append a region of its own at the file's end, so nothing else
//! ever writes there: an acknowledged append is never overwritten, and its bytes must
//! show in any read that began after it was acknowledged. Bytes outside acknowledged
//! regions are not judged here (a failed append may leave zeros or part of its data).

use bytes::Bytes;

#[derive(Clone, Debug, Default)]
pub struct PlainAppends {
    /// Acknowledged appends: the offset returned, the bytes, and when (true ms).
    acked: Vec<(u64, Bytes, i64)>,
}

impl PlainAppends {
    pub fn acked(&mut self, at: u64, data: Bytes, when: i64) {
        self.acked.push((at, data, when));
    }

    /// Judges `data`, the file's bytes from offset `base`, read at true time `rs`
    /// (acknowledgements after that need not show): the read was to cover the file up
    /// to `limit` (or its end, if sooner), and every append acknowledged before `rs`
    /// must be there where it overlaps `base..limit`. Returns how many appends it saw.
    pub fn check(&self, data: &[u8], base: u64, limit: u64, rs: i64) -> Result<usize, String> {
        let got_end = base + data.len() as u64;
        let mut seen = 0;
        for (at, bytes, when) in &self.acked {
            let end = at + bytes.len() as u64;
            if *when >= rs || end <= base || *at >= limit {
                continue;
            }
            let (lo, hi) = ((*at).max(base), end.min(limit));
            if hi > got_end {
                return Err(format!(
                    "the append of {} bytes at {at}, acknowledged at {when}ms, is missing: \
                     the read ends at {got_end}",
                    bytes.len()
                ));
            }
            let have = &data[(lo - base) as usize..(hi - base) as usize];
            let want = &bytes[(lo - at) as usize..(hi - at) as usize];
            if have != want {
                let first = (0..want.len()).find(|&i| have[i] != want[i]).unwrap_or(0);
                return Err(format!(
                    "the append of {} bytes at {at}, acknowledged at {when}ms, was overwritten: \
                     byte {} holds {} for {}",
                    bytes.len(),
                    lo + first as u64,
                    have[first],
                    want[first]
                ));
            }
            seen += 1;
        }
        Ok(seen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledged_append_must_show_whole() {
        let mut a = PlainAppends::default();
        a.acked(2, Bytes::from_static(b"abc"), 10);
        assert_eq!(a.check(b"\0\0abc", 0, u64::MAX, 11), Ok(1));
        // Acknowledged after the read began: need not show.
        assert_eq!(a.check(b"\0\0", 0, u64::MAX, 10), Ok(0));
        assert!(a.check(b"\0\0", 0, u64::MAX, 11).is_err());
        assert!(a.check(b"\0\0abd", 0, u64::MAX, 11).is_err());
        // A window of the file: only the part inside it is judged.
        assert_eq!(a.check(b"bc", 3, 5, 11), Ok(1));
        assert!(a.check(b"bx", 3, 5, 11).is_err());
        assert_eq!(a.check(b"\0\0", 0, 2, 11), Ok(0));
    }
}
