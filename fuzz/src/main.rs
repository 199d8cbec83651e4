//! `tessera-fuzz`: long fuzzing runs of the parsers of outside bytes (see the library docs).
//! Failing inputs are written to `target/fuzz/<target>-<n>.bin`; the exit status is 1 when
//! any input failed.

use clap::Parser;
use tessera_fuzz::{fuzz, targets, PeakAlloc};

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

#[derive(Parser)]
struct Args {
    /// Targets to run (default: all): safetensors, config, checkpoint, tokenizer, text.
    targets: Vec<String>,
    /// Inputs per target.
    #[arg(long, default_value_t = 100_000)]
    runs: u64,
    /// Seed of the mutations.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn main() {
    let args = Args::parse();
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fuzz");
    let mut failed = false;
    for target in targets() {
        if !args.targets.is_empty() && !args.targets.iter().any(|t| t == target.name) {
            continue;
        }
        let start = std::time::Instant::now();
        let outcome = fuzz(&target, args.runs, args.seed);
        println!(
            "{}: {} inputs in {:.1} s, {} accepted, {} failed; slowest {:.1} ms, peak allocation at most {:.1}% of its bound",
            target.name,
            outcome.runs,
            start.elapsed().as_secs_f64(),
            outcome.accepted,
            outcome.failures.len(),
            outcome.slowest.as_secs_f64() * 1e3,
            100.0 * outcome.largest_share_of_bound
        );
        for (n, (input, failure)) in outcome.failures.iter().enumerate().take(2000) {
            let path = out.join(format!("{}-{n}.bin", target.name));
            let written = std::fs::create_dir_all(&out).and_then(|_| std::fs::write(&path, input));
            match written {
                Ok(()) => println!("  {failure:?}: {}", path.display()),
                Err(e) => println!("  {failure:?} (not written: {e})"),
            }
        }
        failed |= !outcome.failures.is_empty();
    }
    std::process::exit(i32::from(failed));
}
