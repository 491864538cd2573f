//! Plain appends (`Client::append`): every acknowledged append's bytes are in the file,
//! intact, at the offset its append returned, on every replica.
//!
//! The master gives each append a region of its own at the file's end, so nothing else
//! ever writes there: an acknowledged append is never overwritten, and its bytes must
//! show in any read that began after it was acknowledged. Bytes outside acknowledged
//! regions are not judged here (a failed append may leave zeros or part of its data).
//!
//! Each append reserves its region once, however often it has to ask (a lost reply is
//! asked for again with the same token), so the file is never longer than the appends
//! begun so far put together: a longer file holds a region given out twice, zeros no
//! failed append accounts for.

use bytes::Bytes;

#[derive(Clone, Debug, Default)]
pub struct PlainAppends {
    /// Acknowledged appends: the offset returned, the bytes, and when (true ms).
    acked: Vec<(u64, Bytes, i64)>,
    /// Bytes of every append begun so far, acknowledged, failed or still going.
    begun: u64,
}

impl PlainAppends {
    /// An append of `len` bytes is about to ask for its region.
    pub fn begin(&mut self, len: u64) {
        self.begun += len;
    }

    /// Judges the file's length, read when the appends begun so far are all there are
    /// (the read has returned): no longer than their bytes together.
    pub fn check_length(&self, length: u64) -> Result<(), String> {
        if length > self.begun {
            return Err(format!(
                "the file is {length} bytes, but the appends begun so far add up to {}: \
                 a region was given out twice",
                self.begun
            ));
        }
        Ok(())
    }

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

    #[test]
    fn a_file_longer_than_its_appends_is_refused() {
        let mut a = PlainAppends::default();
        assert_eq!(a.check_length(0), Ok(()));
        a.begin(3);
        a.begin(2);
        assert_eq!(a.check_length(5), Ok(()));
        assert_eq!(a.check_length(3), Ok(()));
        assert!(a.check_length(6).is_err());
    }
}
