//! The reference model of one client's namespace and file contents.
//!
//! Each byte of a file has the set of values it may hold. An acknowledged (serial) write
//! makes its bytes *defined*: exactly the written value. A failed write leaves them
//! *inconsistent*: the old values or the new ones. Bytes nobody wrote read as zero. The
//! file's length is known within bounds: a failed write may or may not have extended it.
//! A read is correct when its length lies within the bounds and every byte is allowed;
//! anything else is a byte that was never written, or a lost acknowledged write.

use std::collections::BTreeMap;

#[derive(Clone, Debug, Default)]
pub struct FileModel {
    /// One allowed value per byte; index = offset. Unwritten bytes are zero.
    values: Vec<u8>,
    /// Bytes a failed write left in doubt: every other value they may hold. Rare, so a
    /// map beside the dense values (a set per byte made the model the simulator's cost).
    doubt: BTreeMap<usize, Vec<u8>>,
    pub len_min: u64,
    pub len_max: u64,
}

impl FileModel {
    fn grow(&mut self, end: usize) {
        if self.values.len() < end {
            self.values.resize(end, 0);
        }
    }

    fn allows(&self, pos: usize, b: u8) -> bool {
        match self.values.get(pos) {
            Some(&v) => v == b || self.doubt.get(&pos).is_some_and(|d| d.contains(&b)),
            None => b == 0,
        }
    }

    fn allowed(&self, pos: usize) -> Vec<u8> {
        let mut a = vec![self.values.get(pos).copied().unwrap_or(0)];
        if let Some(d) = self.doubt.get(&pos) {
            a.extend_from_slice(d);
        }
        a
    }

    pub fn write_ok(&mut self, off: u64, data: &[u8]) {
        if data.is_empty() {
            // Nothing written: the length stays (the client asks no extension).
            return;
        }
        let (off, end) = (off as usize, off as usize + data.len());
        self.grow(end);
        self.values[off..end].copy_from_slice(data);
        // The region is defined now.
        let doubtful: Vec<usize> = self.doubt.range(off..end).map(|(k, _)| *k).collect();
        for k in doubtful {
            self.doubt.remove(&k);
        }
        self.len_min = self.len_min.max(end as u64);
        self.len_max = self.len_max.max(end as u64);
    }

    pub fn write_failed(&mut self, off: u64, data: &[u8]) {
        let off = off as usize;
        self.grow(off + data.len());
        for (i, &b) in data.iter().enumerate() {
            if !self.allows(off + i, b) {
                self.doubt.entry(off + i).or_default().push(b);
            }
        }
        self.len_max = self.len_max.max((off + data.len()) as u64);
    }

    /// Checks a read of `want` bytes at `off` that returned `got`.
    pub fn check_read(&self, off: u64, want: u64, got: &[u8]) -> Result<(), String> {
        let lo = want.min(self.len_min.saturating_sub(off));
        let hi = want.min(self.len_max.saturating_sub(off));
        let n = got.len() as u64;
        if n < lo || n > hi {
            return Err(format!(
                "read of {want} at {off} returned {n} bytes; the file's length is {}..={}",
                self.len_min, self.len_max
            ));
        }
        let start = off as usize;
        let end = (start + got.len()).min(self.values.len());
        // Fast path: compare the dense values, then look closer only at differences.
        let dense = if start < end {
            &self.values[start..end]
        } else {
            &[][..]
        };
        if dense == got {
            return Ok(());
        }
        for (i, b) in got.iter().enumerate() {
            if dense.get(i) == Some(b) {
                continue;
            }
            let pos = start + i;
            if !self.allows(pos, *b) {
                return Err(format!(
                    "byte {pos} read as {b}, but only {:?} was ever written there",
                    Some(self.allowed(pos))
                ));
            }
        }
        Ok(())
    }

    /// Whether every byte up to `len_max` is defined (no failed write left doubt).
    pub fn is_defined(&self) -> bool {
        self.len_min == self.len_max && self.doubt.range(..self.len_max as usize).next().is_none()
    }
}

/// One client's files.
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub files: BTreeMap<String, FileModel>,
    /// Paths whose fate an error left unknown: not checked any more.
    pub limbo: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defined_and_inconsistent_regions() {
        let mut f = FileModel::default();
        f.write_ok(0, b"abcd");
        assert!(f.check_read(0, 10, b"abcd").is_ok());
        assert!(f.check_read(0, 10, b"abXd").is_err(), "a byte nobody wrote");
        assert!(
            f.check_read(0, 10, b"ab").is_err(),
            "an acknowledged write lost"
        );
        f.write_failed(2, b"zzzz");
        assert!(f.check_read(0, 10, b"abzd").is_ok());
        assert!(f.check_read(0, 10, b"abcdzz").is_ok());
        assert!(f.check_read(0, 10, b"abcdzzz").is_err());
        f.write_ok(10, b"q");
        assert!(
            f.check_read(6, 10, &[0, 0, 0, 0, b'q']).is_ok(),
            "the gap reads as zeros"
        );
        assert!(!f.is_defined());
    }
}
