//! Block hashes as map keys: a whole chain keyed by its last block, and a hasher for values
//! that are already XXH64 outputs.

use std::hash::{BuildHasherDefault, Hash, Hasher};

use crate::prefixhash::BlockHash;

/// A block-hash sequence as a map key. Chained hashes make the last block stand for the whole
/// sequence, so only it (and the length) is hashed; equality still compares every block.
#[derive(PartialEq, Eq)]
pub(super) struct Chain<'a>(pub(super) &'a [BlockHash]);

impl Hash for Chain<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.0.last().copied().unwrap_or(0) ^ self.0.len() as u64);
    }
}

/// Block hashes are already XXH64 outputs: spread them with one multiply instead of SipHash.
#[derive(Default)]
pub(crate) struct BlockHasher(u64);

impl Hasher for BlockHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(5) ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }
}

pub(crate) type BuildBlockHasher = BuildHasherDefault<BlockHasher>;
