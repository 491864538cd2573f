//! A hash of everything every node did: each step's node, time, input kind and effects.
//! Two runs of one seed must give the same hash; that is what the determinism check
//! compares. FNV-1a, so the value does not depend on the process.

#[derive(Clone, Copy, Debug)]
pub struct TraceHash(u64);

impl Default for TraceHash {
    fn default() -> Self {
        TraceHash(0xcbf2_9ce4_8422_2325)
    }
}

impl TraceHash {
    pub fn add(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    pub fn add_u64(&mut self, v: u64) {
        self.add(&v.to_le_bytes());
    }

    pub fn value(&self) -> u64 {
        self.0
    }
}
