//! The counter-based random generator every backend implements bit for bit.

const M0: u32 = 0xD251_1F53;
const M1: u32 = 0xCD9E_8D57;
const W0: u32 = 0x9E37_79B9;
const W1: u32 = 0xBB67_AE85;

/// Philox4x32-10 (Salmon et al., 2011): four 32-bit words from a 128-bit counter and a 64-bit
/// key. Pure integer arithmetic, so every backend produces identical words.
pub fn philox4x32(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for round in 0..10 {
        if round > 0 {
            k[0] = k[0].wrapping_add(W0);
            k[1] = k[1].wrapping_add(W1);
        }
        let p0 = u64::from(M0) * u64::from(c[0]);
        let p1 = u64::from(M1) * u64::from(c[2]);
        c = [
            ((p1 >> 32) as u32) ^ c[1] ^ k[0],
            p1 as u32,
            ((p0 >> 32) as u32) ^ c[3] ^ k[1],
            p0 as u32,
        ];
    }
    c
}

/// The words for element `index` of a random op launched with `key` and `counter` (the
/// launch scalars of `RandUniform`/`RandNormal`, see the catalog).
pub fn element_words(key: u64, counter: u64, index: u64) -> [u32; 4] {
    philox4x32(
        [
            index as u32,
            (index >> 32) as u32,
            counter as u32,
            (counter >> 32) as u32,
        ],
        [key as u32, (key >> 32) as u32],
    )
}

/// Uniform in `[0, 1)` from one word, exactly representable in f32.
pub fn unit_uniform(word: u32) -> f64 {
    f64::from(word >> 8) * (1.0 / 16_777_216.0)
}

/// A host-side stream of keys and counters for random ops, so that successive calls draw
/// fresh numbers. Its whole state is two integers, saved in checkpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RngState {
    pub key: u64,
    pub counter: u64,
}

impl RngState {
    pub fn new(seed: u64) -> Self {
        RngState {
            key: seed,
            counter: 0,
        }
    }

    /// The `(key, counter)` for the next random op; advances the stream.
    pub fn next_launch(&mut self) -> (u64, u64) {
        let out = (self.key, self.counter);
        self.counter = self.counter.wrapping_add(1);
        out
    }

    /// A host-side uniform value in `[0, 1)` (data sampling, shuffles).
    pub fn next_f64(&mut self) -> f64 {
        let (k, c) = self.next_launch();
        let w = philox4x32(
            [c as u32, (c >> 32) as u32, 0x686f_7374, 0],
            [k as u32, (k >> 32) as u32],
        );
        ((u64::from(w[0]) << 21) ^ u64::from(w[1] >> 11)) as f64 / (1u64 << 53) as f64
    }

    /// A host-side integer in `0..n` (n > 0).
    pub fn next_below(&mut self, n: usize) -> usize {
        ((self.next_f64() * n as f64) as usize).min(n.saturating_sub(1))
    }
}

/// Splits a u64 into the two f64 launch scalars `(lo, hi)`, each exact.
pub fn split_u64(x: u64) -> [f64; 2] {
    [f64::from(x as u32), f64::from((x >> 32) as u32)]
}

/// Joins two launch scalars made by [`split_u64`].
pub fn join_u64(lo: f64, hi: f64) -> u64 {
    (lo as u64) | ((hi as u64) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Known-answer vectors from the Random123 distribution (kat_vectors, philox4x32_10).
    #[test]
    fn philox_known_answers() {
        assert_eq!(
            philox4x32([0, 0, 0, 0], [0, 0]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32([0xffff_ffff; 4], [0xffff_ffff; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }
}
