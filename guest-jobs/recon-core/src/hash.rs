//! A small deterministic hasher for the matcher's hash maps.
//!
//! `std`'s default `RandomState` asks the operating system for a random seed, which a pure
//! WebAssembly guest should not need. The inputs are the job's own data files, so a fixed,
//! fast mixing function is enough.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

const MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// Word-at-a-time multiply/rotate hasher with a final avalanche step.
#[derive(Clone, Copy, Default)]
pub(crate) struct MixHasher {
    state: u64,
}

impl MixHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(23) ^ word).wrapping_mul(MULTIPLIER);
    }
}

impl Hasher for MixHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0u8; 8];
            word[..rest.len()].copy_from_slice(rest);
            // Tag the tail with its length so "ab" and "ab\0" differ.
            self.add(u64::from_le_bytes(word) ^ ((rest.len() as u64) << 59));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn write_i32(&mut self, n: i32) {
        self.add(n as u32 as u64);
    }

    fn write_i64(&mut self, n: i64) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        // Final avalanche so that both the low bits (bucket) and the high bits (control
        // bytes) of the hash depend on every input bit.
        let mut x = self.state;
        x ^= x >> 33;
        x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        x ^= x >> 33;
        x = x.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
        x ^ (x >> 33)
    }
}

/// A `HashMap` with the deterministic hasher.
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<MixHasher>>;

/// A `HashSet` with the deterministic hasher.
pub(crate) type FastSet<T> = HashSet<T, BuildHasherDefault<MixHasher>>;

/// 64-bit FNV-1a over a byte string (used for checksums and input fingerprints).
pub(crate) fn fnv1a64(state: u64, bytes: &[u8]) -> u64 {
    let mut h = state;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01B3);
    }
    h
}

/// FNV-1a's offset basis (the state to start from).
pub(crate) const FNV_OFFSET: u64 = 0xCBF2_9CE4_8422_2325;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn hash_of<T: Hash + ?Sized>(value: &T) -> u64 {
        BuildHasherDefault::<MixHasher>::default().hash_one(value)
    }

    #[test]
    fn deterministic_and_distinguishes_tails() {
        assert_eq!(hash_of(&"INV-1042"), hash_of(&"INV-1042"));
        assert_ne!(hash_of(&"INV-1042"), hash_of(&"INV-1043"));
        assert_ne!(hash_of(&b"ab"[..]), hash_of(&b"ab\0"[..]));
        assert_ne!(hash_of(&(100i64, 5i32)), hash_of(&(100i64, 6i32)));
    }

    #[test]
    fn fnv_known_values() {
        assert_eq!(fnv1a64(FNV_OFFSET, b""), 0xCBF2_9CE4_8422_2325);
        assert_eq!(fnv1a64(FNV_OFFSET, b"a"), 0xAF63_DC4C_8601_EC8C);
    }
}
