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
    /// Allowed values per byte; index = offset.
    allowed: Vec<Vec<u8>>,
    pub len_min: u64,
    pub len_max: u64,
}

impl FileModel {
    fn grow(&mut self, end: usize) {
        if self.allowed.len() < end {
            self.allowed.resize(end, vec![0]);
        }
    }

    pub fn write_ok(&mut self, off: u64, data: &[u8]) {
        let end = off as usize + data.len();
        self.grow(end);
        for (i, b) in data.iter().enumerate() {
            self.allowed[off as usize + i] = vec![*b];
        }
        // A gap before the write is zero-filled; bytes there were allowed zero already.
        self.len_min = self.len_min.max(end as u64);
        self.len_max = self.len_max.max(end as u64);
    }

    pub fn write_failed(&mut self, off: u64, data: &[u8]) {
        let end = off as usize + data.len();
        self.grow(end);
        for (i, b) in data.iter().enumerate() {
            let a = &mut self.allowed[off as usize + i];
            if !a.contains(b) {
                a.push(*b);
            }
        }
        self.len_max = self.len_max.max(end as u64);
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
        for (i, b) in got.iter().enumerate() {
            let pos = off as usize + i;
            let ok = match self.allowed.get(pos) {
                Some(a) => a.contains(b),
                None => *b == 0,
            };
            if !ok {
                return Err(format!(
                    "byte {pos} read as {b}, but only {:?} was ever written there",
                    self.allowed.get(pos)
                ));
            }
        }
        Ok(())
    }

    /// Whether every byte up to `len_max` is defined (no failed write left doubt).
    pub fn is_defined(&self) -> bool {
        self.len_min == self.len_max
            && self
                .allowed
                .iter()
                .take(self.len_max as usize)
                .all(|a| a.len() == 1)
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
