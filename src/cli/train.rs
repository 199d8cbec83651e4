//! `tessera train`: the built-in addition task by default, or any text file.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::invalid;
use super::plot::{self, Metrics};
use super::tokenizer::TokenizerSpec;
use super::world::{check_world_size, join_world, worker_device, World};
use crate::checkpoint;
use crate::data::{
    from_record, AdditionTask, AdditionTokenizer, Split, TextDataset, Tokenizer, SUCCESS_BAR,
};
use crate::dist::DistEnv;
use crate::generate::greedy_batch;
use crate::io;
use crate::models::{Transformer, TransformerConfig};
use crate::optim::Schedule;
use crate::rng::RngState;
use crate::train::{Precision, TrainOptions, Trainer};
use crate::{DType, Device, Error, Result, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum FamilyArg {
    Gpt2,
    Llama,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
pub enum PrecisionArg {
    F32,
    Bf16,
    F16,
}

/// Options of `tessera train`. A resumed run keeps the options it was started with, except
/// `--steps`, `--device`, `--devices`, `--bucket-mb`, `--out`, `--overwrite`,
/// `--halt-after`, `--quiet` and `--log-scale`; another option given with `--resume` that
/// differs from the run's own is refused, not ignored (a resumed data-parallel run keeps
/// its number of workers too).
#[derive(Args, Clone, Debug, Serialize, Deserialize)]
pub struct TrainArgs {
    /// Text file to train on; without it, the built-in multi-digit addition task.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Tokenizer for --data: byte, gpt2, or a Hugging Face tokenizer.json (or its directory).
    /// The checkpoint records it, so `generate` and `--resume` use it again.
    #[arg(long, default_value = "byte")]
    pub tokenizer: TokenizerSpec,
    /// Operand digits of the addition task.
    #[arg(long, default_value_t = AdditionTask::DEFAULT_DIGITS)]
    pub digits: usize,
    /// Device to train on (e.g. cpu, wgpu:0); default: TESSERA_DEVICE, else the best present
    /// (under torchrun's variables, the best backend's device LOCAL_RANK).
    #[arg(long)]
    pub device: Option<String>,
    /// Train data-parallel on these devices, one worker each (e.g. cuda:0,cuda:1): --batch
    /// is each worker's, so a step takes their sum. Across hosts, start one `tessera train`
    /// per device with torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    /// MASTER_PORT) instead.
    #[arg(long, conflicts_with = "device")]
    #[serde(default)]
    pub devices: Option<String>,
    /// Data-parallel training sums gradients over the workers in buckets of this many MiB,
    /// each started as soon as the backward pass has finished its gradients (PyTorch DDP's
    /// bucket_cap_mb).
    #[arg(long, default_value_t = 25)]
    #[serde(default = "default_bucket_mb")]
    pub bucket_mb: usize,
    /// Model family.
    #[arg(long, value_enum, default_value = "gpt2")]
    pub family: FamilyArg,
    /// Transformer blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 128)]
    pub d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Key/value heads (Llama; default: --heads).
    #[arg(long)]
    pub kv_heads: Option<usize>,
    /// MLP width (default: 4 x d_model for GPT-2, 8/3 x d_model for Llama).
    #[arg(long)]
    pub d_ff: Option<usize>,
    /// Sequences per micro-batch.
    #[arg(long, default_value_t = 64)]
    pub batch: usize,
    /// Tokens per sequence for --data (the addition task fixes its own).
    #[arg(long, default_value_t = 128)]
    pub seq: usize,
    /// Micro-batches accumulated per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub accum: usize,
    /// Optimizer steps at most (training on the addition task stops earlier once it reaches
    /// the success bar, unless --no-early-stop).
    #[arg(long, default_value_t = 6000)]
    pub steps: u64,
    /// Peak learning rate.
    #[arg(long, default_value_t = 1e-3)]
    pub lr: f64,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 100)]
    pub warmup: u64,
    /// Final learning rate of the cosine decay (default: lr / 10).
    #[arg(long)]
    pub min_lr: Option<f64>,
    /// Decoupled weight decay of matrices (biases and norms get none).
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Clip the global gradient norm to this (0 turns clipping off).
    #[arg(long, default_value_t = 1.0)]
    pub grad_clip: f64,
    /// Compute precision; master weights and optimizer state stay f32.
    #[arg(long, value_enum, default_value = "f32")]
    pub precision: PrecisionArg,
    /// Seed of initialization, data order and dropout.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Evaluate every this many steps.
    #[arg(long, default_value_t = 250)]
    pub eval_every: u64,
    /// Held-out problems (addition) or validation batches x batch (text) per evaluation.
    #[arg(long, default_value_t = 500)]
    pub eval_size: usize,
    /// Write a checkpoint every this many steps (and at the end).
    #[arg(long, default_value_t = 500)]
    pub checkpoint_every: u64,
    /// Log metrics every this many steps.
    #[arg(long, default_value_t = 10)]
    pub log_every: u64,
    /// Keep training after the addition task reaches its success bar.
    #[arg(long)]
    pub no_early_stop: bool,
    /// Output directory for the checkpoint, metrics and plot.
    #[arg(long, default_value = "runs/latest")]
    pub out: PathBuf,
    /// Continue the run saved in this checkpoint.
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Replace another run's checkpoint, metrics and plot in --out (without it, a run refuses
    /// an --out that holds another run's, unless it resumes that run).
    #[arg(long)]
    #[serde(default)]
    pub overwrite: bool,
    /// Stop (with a checkpoint) after this many steps of this invocation, keeping the
    /// schedule of --steps, so that a long run can be split into sessions with --resume.
    #[arg(long)]
    pub halt_after: Option<u64>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// Plot the loss on a logarithmic scale (`tessera plot --log-scale` redraws a run's plots).
    #[arg(long)]
    #[serde(default)]
    pub log_scale: bool,
}

fn default_bucket_mb() -> usize {
    25
}

/// Memory one parameter takes in training, at least: f32 weight, gradient and AdamW's two
/// moments.
const TRAINING_BYTES_PER_PARAMETER: usize = 16;

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct TrainSummary {
    pub checkpoint: PathBuf,
    /// The SVG and PNG plots of the metrics.
    pub plots: [PathBuf; 2],
    pub metrics: PathBuf,
    pub steps: u64,
    pub final_loss: f64,
    /// Held-out exact-match accuracy (addition) at the last evaluation.
    pub accuracy: Option<f64>,
    pub validation_loss: Option<f64>,
}

enum Task {
    Addition(AdditionTask),
    Text(TextDataset),
}

impl Task {
    /// The task, its vocabulary size, sequence length and tokenizer. A resumed run passes the
    /// tokenizer its checkpoint recorded, so it needs no tokenizer file beside it.
    fn load(
        args: &TrainArgs,
        recorded: Option<&serde_json::Value>,
    ) -> Result<(Task, usize, usize, Box<dyn Tokenizer>)> {
        match &args.data {
            None => {
                let task = AdditionTask::new(args.digits)?.with_eval_size(args.eval_size);
                let (vocab, seq) = (task.vocab_size(), task.seq_len());
                Ok((
                    Task::Addition(task),
                    vocab,
                    seq,
                    Box::new(AdditionTokenizer),
                ))
            }
            Some(path) => {
                let tokenizer = match recorded {
                    Some(record) => from_record(record, "the resumed checkpoint")?,
                    None => args
                        .tokenizer
                        .open()?
                        .filter(|t| t.name() != "addition")
                        .ok_or_else(|| {
                            invalid(
                                "train --tokenizer",
                                "text data needs byte, gpt2 or a tokenizer.json",
                            )
                        })?,
                };
                let data = TextDataset::from_file(
                    path,
                    tokenizer.as_ref(),
                    crate::data::DEFAULT_VAL_FRACTION,
                )?;
                Ok((
                    Task::Text(data),
                    tokenizer.vocab_size(),
                    args.seq,
                    tokenizer,
                ))
            }
        }
    }

    /// This rank's share of a micro-batch: the world's `batch x world` windows are drawn
    /// from `rng` on every rank (the order one worker would see them in) and rank `rank`
    /// takes the `batch` after its `rank x batch`.
    fn batch(
        &self,
        batch: usize,
        seq: usize,
        (rank, world): (usize, usize),
        rng: &mut RngState,
        device: &Arc<dyn Device>,
    ) -> Result<(Tensor, Tensor)> {
        let (inputs, targets) = match self {
            Task::Addition(t) => {
                let (i, t, _) = t.sample_batch(batch * world, rng);
                (i, t)
            }
            Task::Text(d) => d.batch(Split::Train, batch * world, seq, rng)?,
        };
        let mine = rank * batch * seq..(rank + 1) * batch * seq;
        Ok((
            Tensor::from_slice(&inputs[mine.clone()], &[batch, seq], device)?,
            Tensor::from_slice(&targets[mine], &[batch, seq], device)?,
        ))
    }
}

fn validate(args: &TrainArgs) -> Result<()> {
    let positive = [
        ("--layers", args.layers),
        ("--d-model", args.d_model),
        ("--heads", args.heads),
        ("--batch", args.batch),
        ("--accum", args.accum),
        ("--bucket-mb", args.bucket_mb),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(invalid("train", format!("{name} must be at least 1")));
    }
    if !args.d_model.is_multiple_of(args.heads) {
        return Err(invalid(
            "train",
            format!(
                "--d-model {} is not divisible by --heads {}",
                args.d_model, args.heads
            ),
        ));
    }
    let finite_non_negative = |v: f64| v.is_finite() && v >= 0.0;
    let usable = args.lr > 0.0
        && args.lr.is_finite()
        && finite_non_negative(args.weight_decay)
        && finite_non_negative(args.grad_clip);
    if !usable {
        return Err(invalid(
            "train",
            "--lr must be positive and finite; --weight-decay and --grad-clip finite and >= 0",
        ));
    }
    if let Some(min_lr) = args.min_lr {
        if !(finite_non_negative(min_lr) && min_lr <= args.lr) {
            return Err(invalid(
                "train",
                format!(
                    "--min-lr {min_lr} must be finite, >= 0 and at most --lr {}",
                    args.lr
                ),
            ));
        }
    }
    if args.steps == 0 || !(1..=AdditionTask::MAX_EVAL_SIZE).contains(&args.eval_size) {
        return Err(invalid(
            "train",
            format!(
                "--steps must be at least 1 and --eval-size in 1..={}",
                AdditionTask::MAX_EVAL_SIZE
            ),
        ));
    }
    if args.eval_every == 0 || args.checkpoint_every == 0 || args.log_every == 0 {
        return Err(invalid(
            "train",
            "--eval-every, --checkpoint-every and --log-every must be at least 1",
        ));
    }
    if args.data.is_some() && args.seq < 2 {
        return Err(invalid("train", "--seq must be at least 2"));
    }
    Ok(())
}

/// The most tokens of one micro-batch: its ids, positions and logits rows are indexed with
/// 32-bit integers by the GPU kernels.
const MAX_MICRO_BATCH_TOKENS: usize = i32::MAX as usize;

/// Checks the tokens of a micro-batch (`--batch` sequences of `seq`) and of a step (times
/// `--accum`) with checked arithmetic, before anything of that size is allocated.
fn check_step_size(args: &TrainArgs, seq: usize, world_size: usize) -> Result<()> {
    let micro = args.batch.checked_mul(seq);
    let step = micro
        .and_then(|m| m.checked_mul(args.accum))
        .and_then(|m| m.checked_mul(world_size));
    match (micro, step) {
        (Some(micro), Some(_)) if micro <= MAX_MICRO_BATCH_TOKENS => Ok(()),
        _ => Err(invalid(
            "train",
            format!(
                "--batch {} of {seq} tokens times --accum {} is past {MAX_MICRO_BATCH_TOKENS} \
                 tokens per micro-batch or does not fit a machine word",
                args.batch, args.accum
            ),
        )),
    }
}

fn model_config(args: &TrainArgs, vocab: usize, seq: usize) -> TransformerConfig {
    let positions = seq.max(16);
    match args.family {
        FamilyArg::Gpt2 => {
            let mut c =
                TransformerConfig::gpt2(vocab, positions, args.d_model, args.layers, args.heads);
            c.d_ff = args.d_ff.unwrap_or(4 * args.d_model);
            c
        }
        FamilyArg::Llama => {
            let d_ff = args.d_ff.unwrap_or((8 * args.d_model / 3).div_ceil(8) * 8);
            TransformerConfig::llama(
                vocab,
                positions,
                args.d_model,
                args.layers,
                args.heads,
                args.kv_heads.unwrap_or(args.heads),
                d_ff,
            )
        }
    }
}

fn options(args: &TrainArgs) -> TrainOptions {
    let precision = match args.precision {
        PrecisionArg::F32 => Precision::F32,
        PrecisionArg::Bf16 => Precision::Bf16,
        PrecisionArg::F16 => Precision::F16,
    };
    TrainOptions {
        schedule: Schedule {
            peak: args.lr,
            min_lr: args.min_lr.unwrap_or(args.lr / 10.0),
            warmup: args.warmup,
            total: args.steps,
        },
        weight_decay: args.weight_decay,
        betas: (0.9, 0.98),
        eps: 1e-8,
        grad_clip: (args.grad_clip > 0.0).then_some(args.grad_clip),
        precision,
    }
}

/// Makes `--out` this run's: an `--out` holding another run's checkpoint or metrics is
/// refused (its checkpoint would be replaced and the metrics of both runs mixed) unless this
/// run resumes that checkpoint, or `--overwrite` is given, which clears the old metrics.
fn claim_out(args: &TrainArgs, checkpoint: &Path, metrics: &Path) -> Result<()> {
    let resumes_it = match &args.resume {
        Some(resume) => std::fs::canonicalize(resume)
            .ok()
            .zip(std::fs::canonicalize(checkpoint).ok())
            .is_some_and(|(a, b)| a == b),
        None => false,
    };
    let held = [checkpoint, metrics].into_iter().find(|p| p.exists());
    match held {
        Some(found) if !resumes_it && !args.overwrite => Err(Error::invalid(
            "train",
            format!(
                "{} holds another run's {}: pass --resume {} to continue it, --overwrite to \
                 replace it, or another --out",
                args.out.display(),
                found
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().into()),
                checkpoint.display()
            ),
        )),
        Some(_) if !resumes_it => std::fs::remove_file(metrics)
            .or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Ok(()),
                _ => Err(e),
            })
            .map_err(|e| Error::io(metrics, e)),
        _ => Ok(()),
    }
}

/// Options a resumed run takes from this invocation; every other one is the run's own.
const RESUME_OPTIONS: [&str; 10] = [
    "steps",
    "bucket_mb",
    "device",
    "devices",
    "out",
    "quiet",
    "resume",
    "overwrite",
    "halt_after",
    "log_scale",
];

/// Refuses options given to a resumed run that it would ignore (set away from their default
/// and from the run's own value), instead of dropping them without a word.
fn refuse_ignored_options(args: &TrainArgs, stored: &serde_json::Value) -> Result<()> {
    let super::Command::Train(defaults) =
        <super::Cli as clap::Parser>::parse_from(["tessera", "train"]).command
    else {
        return Ok(());
    };
    let (given, defaults) = (json!(args), json!(defaults));
    let ignored: Vec<String> = given
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, value)| {
            !RESUME_OPTIONS.contains(&name.as_str())
                && defaults.get(name.as_str()) != Some(value)
                && stored.get(name.as_str()) != Some(value)
        })
        .map(|(name, value)| format!("--{} {value}", name.replace('_', "-")))
        .collect();
    if ignored.is_empty() {
        return Ok(());
    }
    Err(invalid(
        "train",
        format!(
            "a resumed run keeps the options it was started with; {} would be ignored: drop \
             them, or start a new run",
            ignored.join(", ")
        ),
    ))
}

/// The options a run uses: a resumed run's stored options, with this invocation's steps,
/// device and output settings.
fn effective_args(args: &TrainArgs) -> Result<(TrainArgs, Option<checkpoint::Loaded>)> {
    let Some(path) = &args.resume else {
        return Ok((args.clone(), None));
    };
    let loaded = checkpoint::load(path)?;
    let stored = loaded.state.run.get("args").cloned().ok_or_else(|| {
        Error::format(
            path.display().to_string(),
            "checkpoint holds no training options",
        )
    })?;
    refuse_ignored_options(args, &stored)?;
    let mut merged: TrainArgs = serde_json::from_value(stored)
        .map_err(|e| Error::format(path.display().to_string(), format!("training options: {e}")))?;
    merged.steps = args.steps;
    merged.device.clone_from(&args.device);
    merged.devices.clone_from(&args.devices);
    merged.bucket_mb = args.bucket_mb;
    merged.out.clone_from(&args.out);
    merged.quiet = args.quiet;
    merged.log_scale = args.log_scale;
    merged.resume.clone_from(&args.resume);
    merged.overwrite = args.overwrite;
    merged.halt_after = args.halt_after;
    Ok((merged, Some(loaded)))
}

/// Trains as `tessera train` does and reports where the results went. In a data-parallel
/// world (torchrun's variables, which `tessera train --devices` sets for its workers) rank 0
/// alone writes the checkpoint, metrics and plots and prints; the summary of other ranks
/// names the files rank 0 writes.
pub fn run(args: &TrainArgs) -> Result<TrainSummary> {
    let env = DistEnv::from_env()?;
    if args.devices.is_some() && env.is_none() {
        return Err(invalid(
            "train --devices",
            "starts one worker per device from the tessera program (tessera::cli::run)",
        ));
    }
    let (args, resumed) = effective_args(args)?;
    validate(&args)?;
    let device = worker_device(args.device.as_deref(), env.as_ref())?;
    let (world, collective) = match &env {
        Some(env) => {
            let (world, collective) = join_world(env, &device)?;
            (world, Some(collective))
        }
        None => (World::alone(), None),
    };
    let quiet = args.quiet || !world.is_root();
    let recorded = resumed.as_ref().and_then(|l| l.state.run.get("tokenizer"));
    let (task, vocab, seq, tokenizer) = Task::load(&args, recorded)?;
    check_step_size(&args, seq, world.size)?;
    let mut trainer = match resumed {
        Some(loaded) => {
            let path = args.resume.clone().unwrap_or_default();
            check_world_size(&loaded.state.run, world.size, &path)?;
            Trainer::from_checkpoint(loaded, &device, options(&args), &path)?
        }
        None => {
            let config = model_config(&args, vocab, seq);
            config.validate("train")?;
            device.info().check_fits(
                "train",
                "training the model (f32 weights, gradients and two AdamW moments: 16 bytes per parameter)",
                config.parameter_count().and_then(|n| n.checked_mul(TRAINING_BYTES_PER_PARAMETER)),
            )?;
            let mut rng = RngState::new(args.seed);
            let model = Transformer::new(&config, &device, DType::F32, &mut rng)?;
            let run =
                json!({ "args": args, "tokenizer": tokenizer.record(), "world_size": world.size });
            Trainer::new(
                model,
                options(&args),
                rng,
                RngState::new(args.seed ^ 0xda7a_5eed),
                run,
            )?
        }
    };
    if let Some(collective) = collective {
        trainer.set_bucket_bytes(args.bucket_mb.saturating_mul(1 << 20));
        trainer.join(collective)?;
    }
    let checkpoint_path = args.out.join("checkpoint.safetensors");
    let metrics_path = args.out.join("metrics.jsonl");
    let mut metrics = if world.is_root() {
        std::fs::create_dir_all(&args.out).map_err(|e| Error::io(&args.out, e))?;
        claim_out(&args, &checkpoint_path, &metrics_path)?;
        io::remove_stale_temporaries(&checkpoint_path)?;
        Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&metrics_path)
                .map_err(|e| Error::io(&metrics_path, e))?,
        )
    } else {
        None
    };
    let mut log = |value: serde_json::Value| -> Result<()> {
        match &mut metrics {
            Some(file) => writeln!(file, "{value}").map_err(|e| Error::io(&metrics_path, e)),
            None => Ok(()),
        }
    };

    let info = device.info();
    let params: usize = crate::nn::parameters(trainer.weights())
        .iter()
        .map(|(_, t)| t.numel())
        .sum();
    let step_tokens = args.batch * seq * args.accum * world.size;
    if world.is_root() {
        println!(
            "training {} ({} parameters) on {} ({}){}, {} tokens per step, {} precision",
            match &task {
                Task::Addition(t) => format!("{}-digit addition", t.digits()),
                Task::Text(d) => format!("on {}", d.source()),
            },
            params,
            info.id(),
            info.name,
            if world.size > 1 {
                format!(" and {} other worker(s)", world.size - 1)
            } else {
                String::new()
            },
            step_tokens,
            format!("{:?}", args.precision).to_lowercase(),
        );
    }
    let bar = progress_bar(&args, quiet, trainer.state.step);
    let start = Instant::now();
    let (mut last_loss, mut accuracy, mut val_loss) = (f64::NAN, None, None);
    let mut window = (Instant::now(), trainer.state.step);
    let halt_at = args
        .halt_after
        .map_or(args.steps, |n| (trainer.state.step + n).min(args.steps));
    while trainer.state.step < halt_at {
        let mut micro = Vec::with_capacity(args.accum);
        for _ in 0..args.accum {
            micro.push(task.batch(
                args.batch,
                seq,
                (world.rank, world.size),
                &mut trainer.state.data_rng,
                &device,
            )?);
        }
        let report = trainer.step(&micro)?;
        let step = trainer.state.step;
        if report.skipped && world.is_root() {
            println!(
                "step {step}: gradients not finite, update skipped; loss scale now {}",
                trainer.state.loss_scale
            );
        }
        if world.is_root() && (step % args.log_every == 0 || step == args.steps) {
            last_loss = report.loss.item()?;
            let elapsed = window.0.elapsed().as_secs_f64();
            let tokens = ((step - window.1) as usize * step_tokens) as f64;
            let tokens_per_s = if elapsed > 0.0 { tokens / elapsed } else { 0.0 };
            window = (Instant::now(), step);
            log(
                json!({ "step": step, "loss": last_loss, "lr": report.lr, "grad_norm": report.grad_norm.item()?,
                        "tokens_per_s": tokens_per_s, "elapsed_s": start.elapsed().as_secs_f64() }),
            )?;
            bar.set_position(step);
            bar.set_message(format!("loss {last_loss:.4}  {tokens_per_s:.0} tok/s"));
        }
        let last = step == args.steps;
        if step % args.eval_every == 0 || last {
            let mut reached = false;
            if world.is_root() {
                let (line, bar_reached) =
                    evaluate(&task, &trainer, &args, seq, &mut accuracy, &mut val_loss)?;
                log(
                    json!({ "step": step, "eval": line.clone(), "elapsed_s": start.elapsed().as_secs_f64() }),
                )?;
                bar.suspend(|| println!("step {step}: {}", describe(&line)));
                reached = bar_reached && !args.no_early_stop;
                if reached {
                    bar.suspend(|| {
                        println!(
                            "reached the success bar ({:.0}% exact match) at step {step}",
                            SUCCESS_BAR * 100.0
                        )
                    });
                }
            }
            if world.decide(reached)? {
                break;
            }
        }
        if world.is_root() && step % args.checkpoint_every == 0 {
            trainer.save(&checkpoint_path)?;
        }
    }
    bar.finish_and_clear();
    if let Some(collective) = trainer.collective() {
        collective.barrier()?;
    }
    if let Some(rendezvous) = &world.rendezvous {
        rendezvous.finish();
    }
    let mut plots = [args.out.join("loss.svg"), args.out.join("loss.png")];
    if world.is_root() {
        trainer.save(&checkpoint_path)?;
        plots = plot::write_plots(&Metrics::read(&metrics_path)?, &args.out, args.log_scale)?;
        if let (Task::Addition(_), Some(acc)) = (&task, accuracy) {
            let verdict = if acc >= SUCCESS_BAR {
                "reached"
            } else {
                "did not reach"
            };
            println!(
                "held-out exact match {:.1}%: {verdict} the success bar of {:.0}%",
                acc * 100.0,
                SUCCESS_BAR * 100.0
            );
        }
        println!(
            "trained {} steps in {:.1} s; final loss {last_loss:.4}",
            trainer.state.step,
            start.elapsed().as_secs_f64()
        );
        println!("checkpoint: {}", checkpoint_path.display());
        println!("plots:      {}, {}", plots[0].display(), plots[1].display());
        println!("metrics:    {}", metrics_path.display());
    }
    Ok(TrainSummary {
        checkpoint: checkpoint_path,
        plots,
        metrics: metrics_path,
        steps: trainer.state.step,
        final_loss: last_loss,
        accuracy,
        validation_loss: val_loss,
    })
}

fn progress_bar(args: &TrainArgs, quiet: bool, position: u64) -> indicatif::ProgressBar {
    if quiet {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(args.steps).with_position(position);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:30} {pos}/{len} steps [{elapsed_precise}] {msg}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Held-out accuracy (addition) or validation loss (text). Returns the metrics and whether
/// the success bar is reached.
fn evaluate(
    task: &Task,
    trainer: &Trainer,
    args: &TrainArgs,
    seq: usize,
    accuracy: &mut Option<f64>,
    val_loss: &mut Option<f64>,
) -> Result<(serde_json::Value, bool)> {
    let _guard = crate::no_grad();
    let model = &trainer.model;
    match task {
        Task::Addition(t) => {
            let problems = t.heldout_problems(t.eval_size());
            let prompts: Vec<Vec<u32>> = problems
                .iter()
                .map(|&(a, b)| t.encode_problem(a, b))
                .collect::<Result<_>>()?;
            let mut answers = greedy_batch(model, &prompts, t.answer_len())?.into_iter();
            let acc = t.score_problems(&problems, |_| answers.next().unwrap_or_default())?;
            *accuracy = Some(acc);
            Ok((
                json!({ "heldout_exact_match": acc, "problems": problems.len() }),
                acc >= SUCCESS_BAR,
            ))
        }
        Task::Text(d) => {
            let mut rng = RngState::new(0x7661_6c69_6461_7465);
            let batches = args.eval_size.div_ceil(args.batch).clamp(1, 8);
            let mut total = 0.0;
            for _ in 0..batches {
                let (i, tg) = d.batch(Split::Validation, args.batch, seq, &mut rng)?;
                let i = Tensor::from_slice(&i, &[args.batch, seq], model.device())?;
                let tg = Tensor::from_slice(&tg, &[args.batch, seq], model.device())?;
                total += model.loss_with_targets(&i, &tg)?.item()?;
            }
            let loss = total / batches as f64;
            *val_loss = Some(loss);
            Ok((json!({ "validation_loss": loss }), false))
        }
    }
}

fn describe(line: &serde_json::Value) -> String {
    if let Some(acc) = line.get("heldout_exact_match").and_then(|v| v.as_f64()) {
        format!("held-out exact match {:.1}%", acc * 100.0)
    } else if let Some(loss) = line.get("validation_loss").and_then(|v| v.as_f64()) {
        format!("validation loss {loss:.4}")
    } else {
        line.to_string()
    }
}
