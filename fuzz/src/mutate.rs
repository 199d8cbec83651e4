//! Mutations of valid inputs, from a seeded generator so that a run can be repeated.

/// Values that break sizes and counts: around powers of two, in every width, and as text.
const INTERESTING: [u64; 12] = [
    0,
    1,
    0x7f,
    0xff,
    0x7fff,
    0xffff,
    0x7fff_ffff,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
];

/// A seeded mutator (SplitMix64).
pub struct Mutator {
    state: u64,
}

impl Mutator {
    pub fn new(seed: u64) -> Mutator {
        Mutator { state: seed }
    }

    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    /// `input` changed by one to eight mutations, some splicing in parts of `others`.
    pub fn mutate(&mut self, input: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
        let mut out = input.to_vec();
        for _ in 0..1 + self.below(8) {
            self.once(&mut out, others);
        }
        out
    }

    fn once(&mut self, out: &mut Vec<u8>, others: &[Vec<u8>]) {
        let at = self.below(out.len() + 1);
        match self.below(9) {
            0 if !out.is_empty() => {
                let i = self.below(out.len());
                out[i] ^= 1 << self.below(8);
            }
            1 if !out.is_empty() => {
                let i = self.below(out.len());
                out[i] = self.next() as u8;
            }
            2 => {
                let value = INTERESTING[self.below(INTERESTING.len())];
                let width = [1, 2, 4, 8][self.below(4)];
                let bytes = value.to_le_bytes();
                let end = (at + width).min(out.len());
                out.splice(at..end, bytes[..width].iter().copied());
            }
            3 => {
                // A number written as text, where JSON and headers keep their sizes.
                let value = INTERESTING[self.below(INTERESTING.len())];
                let digits = out[at..].iter().take_while(|b| b.is_ascii_digit()).count();
                out.splice(at..at + digits, value.to_string().into_bytes());
            }
            4 if !out.is_empty() => {
                let len = 1 + self.below(out.len().min(64));
                let end = (at + len).min(out.len());
                out.drain(at..end);
            }
            5 => {
                let len = 1 + self.below(16);
                let fill: Vec<u8> = (0..len).map(|_| self.next() as u8).collect();
                out.splice(at..at, fill);
            }
            6 if !out.is_empty() => {
                let from = self.below(out.len());
                let len = 1 + self.below((out.len() - from).min(256));
                let copy = out[from..from + len].to_vec();
                out.splice(at..at, copy);
            }
            7 if !others.is_empty() => {
                let other = &others[self.below(others.len())];
                let from = self.below(other.len() + 1);
                out.truncate(at);
                out.extend_from_slice(&other[from..]);
            }
            _ => out.truncate(at),
        }
    }
}
