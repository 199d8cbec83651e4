//! `tessera bench`: end-to-end training-step and greedy-decoding figures for GPT-2 shaped
//! models, as JSON lines with the fields of the PyTorch peer (`../shared/bench/torch_gpt2.py`),
//! and with `--peer` that script run in the same invocation on the same kind of device, so
//! both figures come from one machine in one sitting and their ratio means something.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, ValueEnum};
use serde_json::{json, Map, Value};

use super::invalid;
use crate::generate::{generate, GenerateOptions, Sampling};
use crate::models::{Transformer, TransformerConfig};
use crate::optim::Schedule;
use crate::rng::RngState;
use crate::train::{Precision, TrainOptions, Trainer};
use crate::{DType, Device, Error, KernelTime, Result, Tensor};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchWhat {
    /// Training steps (forward, backward, AdamW).
    Train,
    /// Greedy decoding at batch 1 with a KV cache.
    Decode,
    /// Both, training first.
    All,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BenchDtype {
    F32,
    Bf16,
    F16,
}

impl BenchDtype {
    fn precision(self) -> Precision {
        match self {
            BenchDtype::F32 => Precision::F32,
            BenchDtype::Bf16 => Precision::Bf16,
            BenchDtype::F16 => Precision::F16,
        }
    }

    /// The name the peer script uses, which is also what the JSON lines report, so that the
    /// two sides' lines compare field for field.
    fn peer_name(self) -> &'static str {
        match self {
            BenchDtype::F32 => "fp32",
            BenchDtype::Bf16 => "bf16",
            BenchDtype::F16 => "fp16",
        }
    }
}

/// Options of `tessera bench`. The defaults are GPT-2 124M at the peer's training shape; the
/// model options change the size.
#[derive(Args, Clone, Debug)]
pub struct BenchArgs {
    /// What to measure.
    #[arg(value_enum, default_value = "all")]
    pub what: BenchWhat,
    /// Device to measure (e.g. cpu, wgpu:0); default: TESSERA_DEVICE, else the best present.
    #[arg(long)]
    pub device: Option<String>,
    /// Sequences per training step.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per training sequence.
    #[arg(long, default_value_t = 1024)]
    pub seq: usize,
    /// Compute precision (training keeps f32 master weights; decoding runs the model in it).
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: BenchDtype,
    /// Timed training steps (the peer's --iters).
    #[arg(long, default_value_t = 10)]
    pub steps: usize,
    /// Untimed training steps before them.
    #[arg(long, default_value_t = 3)]
    pub warmup: usize,
    /// Prompt tokens before decoding.
    #[arg(long, default_value_t = 16)]
    pub prompt: usize,
    /// Tokens decoded per run.
    #[arg(long, default_value_t = 256)]
    pub new_tokens: usize,
    /// Timed decoding runs (after one untimed run).
    #[arg(long, default_value_t = 3)]
    pub decode_runs: usize,
    /// Transformer blocks.
    #[arg(long, default_value_t = 12)]
    pub layers: usize,
    /// Model width.
    #[arg(long, default_value_t = 768)]
    pub d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 12)]
    pub heads: usize,
    /// Vocabulary size.
    #[arg(long, default_value_t = 50257)]
    pub vocab: usize,
    /// Also run the PyTorch peer with the same sizes on the same kind of device and print a
    /// table of both figures and their ratio.
    #[arg(long)]
    pub peer: bool,
    /// Python interpreter for --peer.
    #[arg(long, default_value = "python3")]
    pub python: String,
    /// The peer script (default: bench/torch_gpt2.py in TESSERA_SHARED, else in ../shared
    /// beside the workspace or the working directory).
    #[arg(long)]
    pub peer_script: Option<PathBuf>,
    /// After the timed runs, time each kernel of one more training step (or decoding run) on
    /// the device and print the kernels by total time on stderr (the timed figures are taken
    /// without it).
    #[arg(long)]
    pub profile: bool,
}

fn validate(args: &BenchArgs) -> Result<()> {
    let positive = [
        ("--batch", args.batch),
        ("--steps", args.steps),
        ("--layers", args.layers),
        ("--d-model", args.d_model),
        ("--heads", args.heads),
        ("--vocab", args.vocab),
        ("--prompt", args.prompt),
        ("--new-tokens", args.new_tokens),
        ("--decode-runs", args.decode_runs),
    ];
    if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err(invalid("bench", format!("{name} must be at least 1")));
    }
    if !args.d_model.is_multiple_of(args.heads) {
        return Err(invalid(
            "bench",
            format!(
                "--d-model {} is not divisible by --heads {}",
                args.d_model, args.heads
            ),
        ));
    }
    if args.seq < 2 {
        return Err(invalid("bench", "--seq must be at least 2"));
    }
    if args.vocab > u32::MAX as usize {
        return Err(invalid("bench", "--vocab must fit token ids in u32"));
    }
    // The decoding model has a position per prompt and new token; its tables are indexed
    // with 32-bit integers.
    match args.prompt.checked_add(args.new_tokens) {
        Some(positions) if positions <= i32::MAX as usize => {}
        _ => {
            return Err(invalid(
                "bench",
                format!(
                    "--prompt {} plus --new-tokens {} is past {} positions",
                    args.prompt,
                    args.new_tokens,
                    i32::MAX
                ),
            ))
        }
    }
    match args.batch.checked_mul(args.seq) {
        Some(tokens) if tokens <= i32::MAX as usize => Ok(()),
        _ => Err(invalid(
            "bench",
            format!(
                "--batch {} of --seq {} is past {} tokens per step",
                args.batch,
                args.seq,
                i32::MAX
            ),
        )),
    }
}

/// The benchmark model: GPT-2 shaped, with as many positions as the peer's model has
/// (`max(1024, seq)`) and enough for the decoding run.
fn config(args: &BenchArgs) -> TransformerConfig {
    let positions = 1024.max(args.seq).max(args.prompt + args.new_tokens);
    TransformerConfig::gpt2(args.vocab, positions, args.d_model, args.layers, args.heads)
}

/// What every JSON line says about the device: its id and the adapter's own name.
fn device_label(device: &Arc<dyn Device>) -> String {
    let info = device.info();
    format!("{} ({})", info.id(), info.name)
}

fn random_ids(n: usize, vocab: usize, rng: &mut RngState) -> Vec<u32> {
    (0..n).map(|_| rng.next_below(vocab) as u32).collect()
}

const MIB: f64 = (1u64 << 20) as f64;

/// Device counters read around a timed region: host synchronizations and allocation requests.
struct Counters {
    syncs: u64,
    allocations: u64,
}

impl Counters {
    fn read(device: &Arc<dyn Device>) -> Counters {
        Counters {
            syncs: device.host_syncs(),
            allocations: device.memory().allocations,
        }
    }

    /// Per-unit deltas since `self`, read before the closing `synchronize` so that the
    /// benchmark's own wait is not counted against the code under test.
    fn per(&self, now: &Counters, units: usize) -> (f64, f64) {
        let n = units as f64;
        (
            (now.syncs - self.syncs) as f64 / n,
            (now.allocations - self.allocations) as f64 / n,
        )
    }
}

/// Times `--steps` training steps after `--warmup` untimed ones, on one fixed batch of random
/// tokens (as the peer does), with the trainer's AdamW and no gradient clipping.
pub fn bench_train(args: &BenchArgs, device: &Arc<dyn Device>) -> Result<Value> {
    let config = config(args);
    let mut rng = RngState::new(0);
    let model = Transformer::new(&config, device, DType::F32, &mut rng)?;
    let params: usize = crate::nn::parameters(&model)
        .iter()
        .map(|(_, t)| t.numel())
        .sum();
    let options = TrainOptions {
        schedule: Schedule::constant(3e-4),
        weight_decay: 0.01,
        betas: (0.9, 0.999),
        eps: 1e-8,
        grad_clip: None,
        precision: args.dtype.precision(),
    };
    let mut trainer = Trainer::new(model, options, rng, RngState::new(1), Value::Null)?;
    let mut data_rng = RngState::new(2);
    let shape = [args.batch, args.seq];
    let inputs = Tensor::from_slice(
        &random_ids(args.batch * args.seq, args.vocab, &mut data_rng),
        &shape,
        device,
    )?;
    let targets = Tensor::from_slice(
        &random_ids(args.batch * args.seq, args.vocab, &mut data_rng),
        &shape,
        device,
    )?;
    let batch = [(inputs, targets)];
    let mut last = None;
    for _ in 0..args.warmup {
        last = Some(trainer.step(&batch)?.loss);
    }
    device.synchronize()?;
    device.reset_peak();
    let before = Counters::read(device);
    let start = Instant::now();
    for _ in 0..args.steps {
        last = Some(trainer.step(&batch)?.loss);
    }
    let after = Counters::read(device);
    device.synchronize()?;
    let seconds = start.elapsed().as_secs_f64() / args.steps as f64;
    let (syncs, allocations) = before.per(&after, args.steps);
    let peak = device.memory().peak as f64 / MIB;
    let replayed = trainer.replayed_last_step();
    if args.profile {
        // Replayed steps queue one graph: profiled kernels run one by one.
        trainer.set_replay(false);
        profiled("one training step", device, || {
            trainer.step(&batch).map(drop)
        })?;
    }
    let loss = last.map(|l| l.item()).transpose()?.unwrap_or(f64::NAN);
    Ok(json!({
        "bench": "train", "batch": args.batch, "seq": args.seq, "dtype": args.dtype.peer_name(),
        "compile": false, "ms_per_step": seconds * 1e3,
        "tokens_per_s": (args.batch * args.seq) as f64 / seconds,
        "peak_mem_mib": peak, "host_syncs_per_step": syncs, "allocations_per_step": allocations,
        "steps": args.steps, "warmup": args.warmup, "params": params, "loss": loss,
        "replayed": replayed, "device": device_label(device), "impl": "tessera",
    }))
}

/// Times greedy decoding of `--new-tokens` tokens after a `--prompt`-token random prompt, at
/// batch 1 with a KV cache, the model in `--dtype`: one untimed run, then `--decode-runs`.
pub fn bench_decode(args: &BenchArgs, device: &Arc<dyn Device>) -> Result<Value> {
    let config = config(args);
    let mut rng = RngState::new(0);
    let mut model = Transformer::new(&config, device, DType::F32, &mut rng)?;
    let dtype = args.dtype.precision().dtype();
    if dtype != DType::F32 {
        model.to_device(&device.clone(), dtype)?;
    }
    let prompt = random_ids(args.prompt, args.vocab, &mut RngState::new(3));
    let options = GenerateOptions {
        max_new_tokens: args.new_tokens,
        sampling: Sampling::greedy(),
        stop_tokens: Vec::new(),
    };
    let run = |rng: &mut RngState| -> Result<usize> {
        let out = generate(&model, &prompt, &options, rng, &mut |_| {})?;
        Ok(out.len() - prompt.len())
    };
    run(&mut rng)?;
    device.synchronize()?;
    device.reset_peak();
    let before = Counters::read(device);
    let start = Instant::now();
    let mut tokens = 0;
    for _ in 0..args.decode_runs {
        tokens += run(&mut rng)?;
    }
    let after = Counters::read(device);
    device.synchronize()?;
    let seconds = start.elapsed().as_secs_f64();
    let (syncs, allocations) = before.per(&after, tokens.max(1));
    let peak = device.memory().peak as f64 / MIB;
    if args.profile {
        profiled("one decoding run", device, || run(&mut rng).map(drop))?;
    }
    Ok(json!({
        "bench": "decode", "batch": 1, "prompt": args.prompt, "dtype": args.dtype.peer_name(),
        "new_tokens": args.new_tokens, "tokens_per_s": tokens as f64 / seconds,
        "ms_per_token": seconds * 1e3 / tokens.max(1) as f64,
        "peak_mem_mib": peak,
        "host_syncs_per_token": syncs, "allocations_per_token": allocations, "runs": args.decode_runs,
        "device": device_label(device), "impl": "tessera",
    }))
}

/// Runs `work` with kernel profiling on and prints the kernels by device time on stderr, or a
/// note where the device cannot time kernels.
fn profiled(what: &str, device: &Arc<dyn Device>, work: impl FnOnce() -> Result<()>) -> Result<()> {
    if let Err(e) = device.set_profiling(true) {
        eprintln!("no kernel profile: {e}");
        return Ok(());
    }
    let done = work().and_then(|()| device.synchronize());
    let times = device.profile();
    device.set_profiling(false)?;
    done?;
    eprint!("{}", profile_table(what, &times));
    Ok(())
}

/// The kernels of a profile by total device time: the slowest 30, then the rest in one line.
pub fn profile_table(what: &str, times: &[KernelTime]) -> String {
    let total: f64 = times.iter().map(|t| t.seconds).sum();
    let launches: u64 = times.iter().map(|t| t.launches).sum();
    let mut out = format!(
        "kernel time of {what}: {:.3} ms in {launches} launches\n{:>10} {:>6} {:>8}  kernel\n",
        total * 1e3,
        "ms",
        "%",
        "launches"
    );
    let share = |s: f64| if total > 0.0 { 100.0 * s / total } else { 0.0 };
    for t in times.iter().take(30) {
        out += &format!(
            "{:>10.3} {:>6.1} {:>8}  {}\n",
            t.seconds * 1e3,
            share(t.seconds),
            t.launches,
            t.name
        );
    }
    if times.len() > 30 {
        let rest: f64 = times[30..].iter().map(|t| t.seconds).sum();
        out += &format!(
            "{:>10.3} {:>6.1} {:>8}  ({} more kernels)\n",
            rest * 1e3,
            share(rest),
            times[30..].iter().map(|t| t.launches).sum::<u64>(),
            times.len() - 30
        );
    }
    out
}

/// Runs `tessera bench`: our JSON lines first, then with `--peer` the peer's lines and the
/// comparison table.
pub fn run(args: &BenchArgs) -> Result<()> {
    validate(args)?;
    let device = super::open_device(args.device.as_deref())?;
    let mut ours = Vec::new();
    if matches!(args.what, BenchWhat::Train | BenchWhat::All) {
        eprintln!(
            "measuring training: batch {} x seq {}, {} steps after {} warmup",
            args.batch, args.seq, args.steps, args.warmup
        );
        ours.push(bench_train(args, &device)?);
        println!("{}", ours[ours.len() - 1]);
    }
    if matches!(args.what, BenchWhat::Decode | BenchWhat::All) {
        eprintln!(
            "measuring decoding: {} new tokens after a {}-token prompt, {} runs",
            args.new_tokens, args.prompt, args.decode_runs
        );
        ours.push(bench_decode(args, &device)?);
        println!("{}", ours[ours.len() - 1]);
    }
    if args.peer {
        let kind = if device.info().backend == "cpu" {
            "cpu"
        } else {
            "cuda"
        };
        match peer(args, kind)? {
            PeerOutcome::Lines(theirs) => {
                for line in &theirs {
                    println!("{line}");
                }
                print!("{}", table(&ours, &theirs));
            }
            PeerOutcome::Unavailable(note) => eprintln!("{note}"),
        }
    }
    Ok(())
}

enum PeerOutcome {
    Lines(Vec<Value>),
    /// Python, torch or transformers is missing: a note, not an error, since our own figures
    /// stand on their own.
    Unavailable(String),
}

/// Where the peer script is: `--peer-script`, `TESSERA_SHARED/bench/torch_gpt2.py`, or
/// `../shared/bench/torch_gpt2.py` beside the workspace this binary was built from or beside
/// the working directory.
pub fn peer_script(explicit: Option<&PathBuf>) -> Option<PathBuf> {
    if let Some(p) = explicit {
        return Some(p.clone());
    }
    let rel = ["bench", "torch_gpt2.py"].iter().collect::<PathBuf>();
    [crate::shared_dir(), PathBuf::from("../shared")]
        .map(|dir| dir.join(&rel))
        .into_iter()
        .find(|p| p.is_file())
}

const INSTALL_HINT: &str = "install the CPU build with `pip install torch --index-url https://download.pytorch.org/whl/cpu` \
     and then `pip install transformers` (a CUDA build for a GPU: see pytorch.org)";

fn peer(args: &BenchArgs, kind: &str) -> Result<PeerOutcome> {
    let Some(script) = peer_script(args.peer_script.as_ref()) else {
        return Ok(PeerOutcome::Unavailable(
            "note: --peer skipped: bench/torch_gpt2.py not found (set TESSERA_SHARED or --peer-script)".into(),
        ));
    };
    let probe = Command::new(&args.python)
        .args(["-c", "import torch, transformers"])
        .output();
    match probe {
        Err(e) => {
            return Ok(PeerOutcome::Unavailable(format!(
                "note: --peer skipped: cannot run `{}`: {e}",
                args.python
            )))
        }
        Ok(out) if !out.status.success() => {
            let why = String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
                .to_string();
            return Ok(PeerOutcome::Unavailable(format!("note: --peer skipped: {} cannot import torch and transformers ({why}); {INSTALL_HINT}", args.python)));
        }
        Ok(_) => {}
    }
    let sizes = [
        ("--layers", args.layers),
        ("--heads", args.heads),
        ("--embd", args.d_model),
        ("--vocab", args.vocab),
    ];
    let mut runs: Vec<Vec<String>> = Vec::new();
    if matches!(args.what, BenchWhat::Train | BenchWhat::All) {
        let mut a = vec!["train".to_string()];
        for (k, v) in [
            ("--batch", args.batch),
            ("--seq", args.seq),
            ("--warmup", args.warmup),
            ("--iters", args.steps),
        ] {
            a.extend([k.to_string(), v.to_string()]);
        }
        runs.push(a);
    }
    if matches!(args.what, BenchWhat::Decode | BenchWhat::All) {
        let mut a = vec!["decode".to_string()];
        for (k, v) in [
            ("--batch", 1),
            ("--prompt", args.prompt),
            ("--new-tokens", args.new_tokens),
        ] {
            a.extend([k.to_string(), v.to_string()]);
        }
        runs.push(a);
    }
    let mut lines = Vec::new();
    for mut a in runs {
        for (k, v) in sizes {
            a.extend([k.to_string(), v.to_string()]);
        }
        a.extend([
            "--dtype".into(),
            args.dtype.peer_name().into(),
            "--device".into(),
            kind.into(),
        ]);
        eprintln!(
            "running the peer: {} {} {}",
            args.python,
            script.display(),
            a.join(" ")
        );
        let out = Command::new(&args.python)
            .arg(&script)
            .args(&a)
            .output()
            .map_err(|e| Error::io(&script, e))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = err.lines().rev().take(5).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(invalid(
                "bench --peer",
                format!("{} failed: {}", script.display(), tail.join(" | ")),
            ));
        }
        for line in String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.trim_start().starts_with('{'))
        {
            let mut v: Value = serde_json::from_str(line).map_err(|e| {
                Error::format(
                    script.display().to_string(),
                    format!("bad JSON line `{line}`: {e}"),
                )
            })?;
            if let Some(obj) = v.as_object_mut() {
                obj.insert("impl".into(), json!("pytorch"));
            }
            lines.push(v);
        }
    }
    Ok(PeerOutcome::Lines(lines))
}

/// The comparison table: one row per figure both sides report, with `tessera / pytorch`.
pub fn table(ours: &[Value], theirs: &[Value]) -> String {
    let rows: [(&str, &str, &str); 4] = [
        ("train", "tokens_per_s", "tokens/s, higher is better"),
        ("train", "ms_per_step", "ms/step, lower is better"),
        ("train", "peak_mem_mib", "peak MiB, lower is better"),
        ("decode", "tokens_per_s", "tokens/s, higher is better"),
    ];
    let find = |lines: &[Value], bench: &str| -> Option<Map<String, Value>> {
        lines
            .iter()
            .find(|l| l.get("bench").and_then(Value::as_str) == Some(bench))
            .and_then(|l| l.as_object().cloned())
    };
    let mut out = format!(
        "{:<8} {:<28} {:>14} {:>14} {:>8}\n",
        "bench", "figure", "tessera", "pytorch", "ratio"
    );
    for (bench, key, label) in rows {
        let (Some(a), Some(b)) = (find(ours, bench), find(theirs, bench)) else {
            continue;
        };
        let x = a.get(key).and_then(Value::as_f64);
        let y = b.get(key).and_then(Value::as_f64);
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        let ratio = match (x, y) {
            (Some(x), Some(y)) if y != 0.0 => format!("{:.2}", x / y),
            _ => "-".into(),
        };
        out += &format!(
            "{bench:<8} {label:<28} {:>14} {:>14} {ratio:>8}\n",
            fmt(x),
            fmt(y)
        );
    }
    if let (Some(a), Some(b)) = (
        find(ours, "train").or(find(ours, "decode")),
        find(theirs, "train").or(find(theirs, "decode")),
    ) {
        let name = |m: &Map<String, Value>| {
            m.get("device")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string()
        };
        out += &format!(
            "tessera on {}; pytorch on {}; ratio = tessera / pytorch\n",
            name(&a),
            name(&b)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_pairs_figures_and_divides() {
        let ours = [
            json!({"bench": "train", "tokens_per_s": 200.0, "ms_per_step": 10.0, "peak_mem_mib": 5.0, "device": "cpu:0"}),
        ];
        let theirs = [
            json!({"bench": "train", "tokens_per_s": 100.0, "ms_per_step": 20.0, "peak_mem_mib": null, "device": "cpu (2 threads)"}),
        ];
        let t = table(&ours, &theirs);
        assert!(t.contains("2.00") && t.contains("0.50"), "{t}");
        assert!(!t.contains("decode"), "{t}");
    }
}
