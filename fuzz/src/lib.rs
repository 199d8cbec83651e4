//! Fuzzing the parsers of outside bytes on stable Rust: safetensors files, `config.json`,
//! checkpoints (parsed and built into a model, as `generate` does), Hugging Face
//! `tokenizer.json` files (read, then encoding and decoding a sample) and text data (byte-level
//! and GPT-2 tokenized). Each [`Target`] starts from valid seeds; a seeded [`Mutator`] flips
//! bits, overwrites bytes with interesting values (sizes such as 2^32 or 2^64 - 1 in every
//! width and as decimal text), inserts, deletes, duplicates and splices. An input fails when
//! the parser panics, takes longer than [`SLOW`], or allocates more than [`allocation_bound`]
//! of its length at once: sizes read from a file must be checked against it before anything
//! is allocated. An allocation the system refuses aborts the process (Rust's allocation
//! error handler), which ends the run with its backtrace: a failure too. A parser returning
//! an error is a pass.
//!
//! `cargo test -p tessera-fuzz` runs a bounded number of inputs per target; `cargo run
//! --release -p tessera-fuzz -- --runs 1000000` a long run (failing inputs are written to
//! `target/fuzz/`). Binaries that fuzz install `peak_alloc::PeakAlloc` as their global
//! allocator (`#[global_allocator] static ALLOC: PeakAlloc = PeakAlloc;`), whose peak the
//! allocation check reads; without it the check sees nothing.

mod mutate;
mod targets;
mod tokenizer_seeds;

pub use mutate::Mutator;
pub use peak_alloc::PeakAlloc;
pub use targets::{targets, Target};

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// Longest one input may take.
pub const SLOW: Duration = Duration::from_secs(2);

/// The most bytes live at once while parsing an input of `len` bytes: parsing copies tensors
/// (and widens them to check their values), builds JSON trees and token lists, a small
/// multiple of the input, plus a fixed allowance for the parsers' own tables.
pub fn allocation_bound(len: usize) -> usize {
    len.saturating_mul(48).saturating_add(64 << 20)
}

/// Why an input failed.
#[derive(Debug)]
pub enum Failure {
    Panic(String),
    Slow(Duration),
    Allocation { peak: usize, bound: usize },
}

/// What a run found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub runs: u64,
    /// Inputs the parser accepted (the rest it refused with an error).
    pub accepted: u64,
    pub failures: Vec<(Vec<u8>, Failure)>,
    pub slowest: Duration,
    /// The largest share of its bound ([`allocation_bound`]) an input's peak allocation took.
    pub largest_share_of_bound: f64,
}

/// Runs `target` on `runs` mutations of its seeds, from `seed`.
pub fn fuzz(target: &Target, runs: u64, seed: u64) -> Outcome {
    let seeds = (target.seeds)();
    let mut mutator = Mutator::new(seed);
    let mut outcome = Outcome::default();
    let quiet = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for i in 0..runs {
        let input = mutator.mutate(&seeds[i as usize % seeds.len()], &seeds);
        let before = PeakAlloc.current_usage();
        PeakAlloc.reset_peak_usage();
        let start = Instant::now();
        let result = catch_unwind(AssertUnwindSafe(|| (target.run)(&input)));
        let took = start.elapsed();
        let peak = PeakAlloc.peak_usage().saturating_sub(before);
        outcome.runs += 1;
        outcome.slowest = outcome.slowest.max(took);
        let bound = allocation_bound(input.len());
        outcome.largest_share_of_bound = outcome
            .largest_share_of_bound
            .max(peak as f64 / bound as f64);
        let failure = match result {
            Err(payload) => Some(Failure::Panic(panic_text(&payload))),
            Ok(_) if took > SLOW => Some(Failure::Slow(took)),
            Ok(_) if peak > bound => Some(Failure::Allocation { peak, bound }),
            Ok(accepted) => {
                outcome.accepted += u64::from(accepted);
                None
            }
        };
        if let Some(failure) = failure {
            outcome.failures.push((input, failure));
        }
    }
    std::panic::set_hook(quiet);
    outcome
}

fn panic_text(payload: &Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
