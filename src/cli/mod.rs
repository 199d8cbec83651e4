//! The command-line program, as a library so tests can drive it without a subprocess.

pub mod bench;
pub mod generate;
pub mod launch;
pub mod plot;
pub mod tokenizer;
pub mod train;
mod world;

use clap::{Parser, Subcommand};

use crate::{Error, Result};

#[derive(Parser, Debug)]
#[command(
    name = "tessera",
    version,
    about = "Train and run transformer language models on any GPU"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// List the devices present, best first, and the backends compiled in.
    Devices,
    /// Train a model: the built-in addition task by default, or a text file with --data.
    Train(train::TrainArgs),
    /// Generate text from a Tessera checkpoint or a Hugging Face model directory.
    Generate(generate::GenerateArgs),
    /// Redraw a run's plots (loss.svg, loss.png) from its metrics.jsonl.
    Plot(plot::PlotArgs),
    /// Measure training steps and greedy decoding (JSON lines); --peer runs PyTorch beside.
    Bench(bench::BenchArgs),
}

pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Devices => devices(),
        Command::Train(args) if args.devices.is_some() && !is_worker() => launch::run(&args),
        Command::Train(args) => train::run(&args).map(|_| ()),
        Command::Generate(args) => generate::run(&args),
        Command::Plot(args) => plot::run(&args),
        Command::Bench(args) => bench::run(&args),
    }
}

/// The exit status for an error: a data-parallel worker that stops because another rank
/// stopped says so ([`world::PEER_STOPPED_EXIT`]), so that the launcher names that rank.
pub fn exit_code(error: &Error) -> i32 {
    match error {
        Error::RankLost { .. } if is_worker() => world::PEER_STOPPED_EXIT,
        _ => 1,
    }
}

/// Whether this process is a worker of a data-parallel world (torchrun's variables set).
fn is_worker() -> bool {
    std::env::var_os("WORLD_SIZE").is_some()
}

fn devices() -> Result<()> {
    println!(
        "backends compiled in: {}",
        crate::compiled_backends().join(", ")
    );
    let list = crate::devices();
    if list.is_empty() {
        println!("no devices present");
    }
    for d in list {
        println!("{:<10} {}", d.id, d.name);
    }
    for (backend, why) in crate::absent_backends() {
        println!("{backend}: no devices: {why}");
    }
    Ok(())
}

/// Opens `--device`, or the default device (`TESSERA_DEVICE`, else the best present).
pub fn open_device(spec: Option<&str>) -> Result<std::sync::Arc<dyn crate::Device>> {
    match spec {
        Some(s) => crate::open_device(s),
        None => crate::default_device(),
    }
}

pub(crate) fn invalid(what: &str, detail: impl Into<String>) -> Error {
    Error::invalid(what, detail)
}
