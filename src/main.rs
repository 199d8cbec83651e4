//! The `tessera` command: `devices`, `train`, `generate`, `bench`.

use clap::Parser;

/// Decoding records about a hundred kernel launches per token, and wgpu allocates and frees
/// small objects for each; mimalloc serves those faster than the system allocator. The
/// library leaves the allocator to the program embedding it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let cli = match tessera::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let text = e.render().to_string();
            eprintln!(
                "{}",
                text.lines().next().unwrap_or("error: invalid arguments")
            );
            std::process::exit(2);
        }
    };
    if let Err(e) = tessera::cli::run(cli) {
        eprintln!("error: {e}");
        std::process::exit(tessera::cli::exit_code(&e));
    }
}
