//! The `tessera` command end to end: training learns, resumes bit for bit, survives being
//! killed mid-checkpoint, and every loader turns bad input into one error line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use clap::Parser;
use tessera::checkpoint;
use tessera::cli::train::{run, TrainArgs};
use tessera::cli::{Cli, Command as Sub};

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn train_args(extra: &[&str]) -> TrainArgs {
    let mut argv = vec!["tessera", "train", "--quiet", "--device", "cpu"];
    argv.extend_from_slice(extra);
    match Cli::parse_from(argv).command {
        Sub::Train(a) => a,
        other => panic!("parsed {other:?}"),
    }
}

/// The smallest model `train` builds: 1-digit addition, one layer of width 16.
const TINY_MODEL: &str = "--digits 1 --d-model 16 --heads 2 --layers 1";

/// Training options for [`TINY_MODEL`] followed by `extra`.
fn tiny_args(extra: &[&str]) -> TrainArgs {
    let mut argv: Vec<&str> = TINY_MODEL.split(' ').collect();
    argv.extend(extra);
    train_args(&argv)
}

fn tensors(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let loaded = checkpoint::load(path).unwrap();
    loaded
        .model
        .into_iter()
        .chain(loaded.optimizer)
        .map(|(k, v)| (k, v.bytes))
        .collect()
}

#[test]
fn two_digit_addition_is_learned() {
    let dir = temp_dir("learn");
    let out = dir.to_str().unwrap();
    let args = train_args(&[
        "--digits",
        "2",
        "--d-model",
        "64",
        "--steps",
        "1500",
        "--eval-every",
        "100",
        "--out",
        out,
    ]);
    let summary = run(&args).unwrap();
    let acc = summary.accuracy.expect("addition reports accuracy");
    assert!(
        acc >= tessera::data::SUCCESS_BAR,
        "held-out exact match {acc} after {} steps",
        summary.steps
    );
    assert!(summary.checkpoint.exists() && summary.metrics.exists());
    let svg = std::fs::read_to_string(&summary.plots[0]).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("polyline"));
    assert!(std::fs::read(&summary.plots[1])
        .unwrap()
        .starts_with(b"\x89PNG"));
    // A problem asked as people write it is answered as people write it: most-significant
    // digit first, no padding, no end token (the model writes 64 as `4 6 0 .`).
    let output = tessera()
        .args(["generate", "--model", summary.checkpoint.to_str().unwrap()])
        .args(["--prompt", "12+52=", "--device", "cpu"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let line = String::from_utf8(output.stdout).unwrap();
    let sum = line
        .trim()
        .strip_prefix("12+52=")
        .expect("the problem echoed");
    assert!(
        sum.parse::<u64>().is_ok() && !sum.starts_with('0'),
        "answer `{sum}` is not written as a number"
    );
}

#[test]
fn resumed_run_matches_the_uninterrupted_one_bit_for_bit() {
    let (a, b) = (temp_dir("whole"), temp_dir("split"));
    let common = [
        "--digits",
        "2",
        "--d-model",
        "32",
        "--heads",
        "2",
        "--steps",
        "12",
        "--eval-every",
        "5",
        "--checkpoint-every",
        "4",
    ];
    let mut whole: Vec<&str> = common.to_vec();
    whole.extend(["--out", a.to_str().unwrap()]);
    run(&train_args(&whole)).unwrap();
    let mut first: Vec<&str> = common.to_vec();
    first.extend(["--out", b.to_str().unwrap(), "--halt-after", "5"]);
    assert_eq!(run(&train_args(&first)).unwrap().steps, 5);
    let ckpt = b.join("checkpoint.safetensors");
    let resume = [
        "--resume",
        ckpt.to_str().unwrap(),
        "--steps",
        "12",
        "--out",
        b.to_str().unwrap(),
    ];
    assert_eq!(run(&train_args(&resume)).unwrap().steps, 12);
    let (x, y) = (tensors(&a.join("checkpoint.safetensors")), tensors(&ckpt));
    assert_eq!(x.keys().collect::<Vec<_>>(), y.keys().collect::<Vec<_>>());
    for (name, bytes) in &x {
        assert!(
            bytes == &y[name],
            "{name} differs between the uninterrupted and the resumed run"
        );
    }
    let (sa, sb) = (
        checkpoint::load(&a.join("checkpoint.safetensors"))
            .unwrap()
            .state,
        checkpoint::load(&ckpt).unwrap().state,
    );
    assert_eq!(
        (sa.step, sa.rng, sa.data_rng),
        (sb.step, sb.rng, sb.data_rng)
    );
}

fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

#[test]
fn killing_a_run_while_it_checkpoints_leaves_a_loadable_checkpoint() {
    let dir = temp_dir("kill");
    let ckpt = dir.join("checkpoint.safetensors");
    let mut last_step = 0;
    for (i, wait_ms) in [900u64, 1300, 1700, 2100, 2500].into_iter().enumerate() {
        let mut cmd = tessera();
        cmd.args([
            "train",
            "--quiet",
            "--device",
            "cpu",
            "--digits",
            "2",
            "--d-model",
            "32",
            "--heads",
            "2",
        ])
        .args([
            "--steps",
            "100000",
            "--checkpoint-every",
            "1",
            "--eval-every",
            "100000",
            "--out",
            dir.to_str().unwrap(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        if i > 0 && ckpt.exists() {
            cmd.args(["--resume", ckpt.to_str().unwrap()]);
        }
        let mut child = cmd.spawn().unwrap();
        std::thread::sleep(Duration::from_millis(wait_ms));
        child.kill().unwrap();
        child.wait().unwrap();
        if !ckpt.exists() {
            continue;
        }
        let loaded = checkpoint::load(&ckpt).unwrap_or_else(|e| panic!("after kill {i}: {e}"));
        assert!(
            loaded.state.step >= last_step,
            "the checkpoint went back in time"
        );
        last_step = loaded.state.step;
    }
    assert!(last_step > 0, "no checkpoint was ever written");
}

/// Runs the command and checks it fails with one error line and no panic.
fn fails(args: &[&str]) {
    let out = tessera().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{args:?} succeeded");
    assert!(!stderr.contains("panicked"), "{args:?} panicked: {stderr}");
    assert_eq!(
        stderr.trim().lines().count(),
        1,
        "{args:?} should print one error line, got: {stderr}"
    );
}

#[test]
fn bad_arguments_give_one_error_line() {
    fails(&["train", "--no-such-flag"]);
    fails(&["train", "--steps", "many"]);
    fails(&["train", "--device", "nonexistent:0", "--steps", "1"]);
    fails(&["train", "--device", "cpu:7", "--steps", "1"]);
    fails(&["train", "--d-model", "30", "--heads", "4", "--steps", "1"]);
    fails(&["train", "--data", "/nonexistent/corpus.txt", "--steps", "1"]);
    fails(&["generate", "--model", "/nonexistent/checkpoint.safetensors"]);
    fails(&["generate", "--model", "/nonexistent-dir/"]);
    fails(&["bogus-command"]);
    for [flag, value] in [
        ["--prompt", "18446744073709551615"],
        ["--batch", "4611686018427387904"],
    ] {
        let args = ["bench", "decode", "--device", "cpu", flag, value];
        fails(&args);
        let stderr = String::from_utf8(tessera().args(args).output().unwrap().stderr).unwrap();
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }
    // Sizes that wrap or cannot be allocated, and values no run can use, are refused before
    // anything runs, by an error naming the option.
    let out = temp_dir("bad-arguments");
    for [flag, value] in [
        ["--accum", "18446744073709551615"],
        ["--batch", "4611686018427387904"],
        ["--batch", "1000000000"],
        ["--weight-decay", "nan"],
        ["--grad-clip", "nan"],
        ["--min-lr", "nan"],
        ["--min-lr", "1"],
        ["--eval-size", "0"],
        ["--eval-size", "1000000000"],
        ["--steps", "0"],
    ] {
        let mut args = vec!["train", "--device", "cpu", "--out", out.to_str().unwrap()];
        args.extend(TINY_MODEL.split(' '));
        if flag != "--steps" {
            args.extend(["--steps", "1"]);
        }
        args.extend([flag, value]);
        fails(&args);
        let stderr = String::from_utf8(tessera().args(&args).output().unwrap().stderr).unwrap();
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }
}

#[test]
fn corrupt_and_truncated_files_give_one_error_line() {
    let dir = temp_dir("corrupt");
    let d = dir.to_str().unwrap();
    let args = tiny_args(&["--steps", "2", "--out", d]);
    let good = run(&args).unwrap().checkpoint;
    let bytes = std::fs::read(&good).unwrap();
    let bad = dir.join("bad.safetensors");
    let mut cases: Vec<Vec<u8>> = vec![
        Vec::new(),
        b"not a safetensors file".to_vec(),
        u64::MAX.to_le_bytes().to_vec(),
    ];
    for cut in [7, 8, 9, 40, bytes.len() / 2, bytes.len() - 1] {
        cases.push(bytes[..cut].to_vec());
    }
    let mut flipped = bytes.clone();
    flipped[20] ^= 0x5a;
    cases.push(flipped);
    for case in &cases {
        std::fs::write(&bad, case).unwrap();
        fails(&[
            "generate",
            "--model",
            bad.to_str().unwrap(),
            "--ids",
            "1",
            "--device",
            "cpu",
        ]);
        fails(&[
            "train",
            "--resume",
            bad.to_str().unwrap(),
            "--steps",
            "3",
            "--out",
            d,
        ]);
    }
    let hf = dir.join("hf");
    std::fs::create_dir_all(&hf).unwrap();
    for config in [
        "",
        "{",
        "{\"model_type\": \"gpt2\"}",
        "{\"model_type\": \"bert\"}",
        "[1,2]",
    ] {
        std::fs::write(hf.join("config.json"), config).unwrap();
        std::fs::write(hf.join("model.safetensors"), &bytes).unwrap();
        fails(&[
            "generate",
            "--model",
            hf.to_str().unwrap(),
            "--ids",
            "1",
            "--device",
            "cpu",
        ]);
    }
}

/// Every prefix and many single-bit corruptions of a valid file: the loader returns an error
/// or a value, and never panics.
#[test]
fn safetensors_loader_survives_every_truncation_and_bit_flips() {
    let dir = temp_dir("fuzz");
    let args = tiny_args(&["--steps", "1", "--out", dir.to_str().unwrap()]);
    let bytes = std::fs::read(run(&args).unwrap().checkpoint).unwrap();
    for cut in 0..bytes.len().min(4096) {
        assert!(
            tessera::io::parse(&bytes[..cut], "prefix").is_err(),
            "a {cut}-byte prefix parsed"
        );
    }
    let mut state = 0x1234_5678_u64;
    for _ in 0..2000 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut copy = bytes.clone();
        let at = (state >> 33) as usize % copy.len();
        copy[at] ^= 1 << ((state >> 29) & 7);
        let _ = tessera::io::parse(&copy, "flipped");
    }
}

/// A run refuses an `--out` holding another run's checkpoint and metrics, unless it resumes
/// that run or is told to `--overwrite`, which replaces both (no metrics of two runs in one
/// file) and removes checkpoint temporaries left by killed processes.
#[test]
fn another_runs_out_is_refused_unless_overwritten() {
    let dir = temp_dir("claim");
    let d = dir.to_str().unwrap();
    let tiny = ["--steps", "3", "--log-every", "1", "--out", d];
    let first = run(&tiny_args(&tiny)).unwrap();
    let checkpoint = std::fs::read(&first.checkpoint).unwrap();
    let metrics = std::fs::read_to_string(&first.metrics).unwrap();
    let refused = run(&tiny_args(&tiny)).unwrap_err().to_string();
    assert!(refused.contains("--overwrite"), "{refused}");
    assert_eq!(std::fs::read(&first.checkpoint).unwrap(), checkpoint);
    assert_eq!(std::fs::read_to_string(&first.metrics).unwrap(), metrics);

    let stale = dir.join(".checkpoint.safetensors.tmp4000000000");
    std::fs::write(&stale, b"left by a killed run").unwrap();
    let mut overwrite = tiny.to_vec();
    overwrite.extend(["--overwrite", "--seed", "7"]);
    let second = run(&tiny_args(&overwrite)).unwrap();
    assert!(!stale.exists());
    assert_ne!(std::fs::read(&second.checkpoint).unwrap(), checkpoint);
    let lines = |text: &str| text.lines().count();
    let rewritten = std::fs::read_to_string(&second.metrics).unwrap();
    assert_eq!(lines(&rewritten), lines(&metrics), "{rewritten}");

    let resume = [
        "--resume",
        second.checkpoint.to_str().unwrap(),
        "--steps",
        "5",
        "--out",
        d,
    ];
    assert_eq!(run(&train_args(&resume)).unwrap().steps, 5);
    // Options the resumed run would ignore are refused by name.
    let mut ignored = resume.to_vec();
    ignored.extend(["--lr", "0.5", "--batch", "3"]);
    let refused = run(&train_args(&ignored)).unwrap_err().to_string();
    assert!(
        refused.contains("--lr 0.5") && refused.contains("--batch 3"),
        "{refused}"
    );
}

/// A checkpoint of another format is refused by name, not read as this one.
#[test]
fn a_checkpoint_of_another_format_is_refused() {
    let dir = temp_dir("format");
    let tiny = ["--steps", "1", "--out", dir.to_str().unwrap()];
    let path = run(&tiny_args(&tiny)).unwrap().checkpoint;
    let bytes = std::fs::read(&path).unwrap();
    let (from, to) = (b"tessera-checkpoint-1", b"tessera-checkpoint-9");
    let at = bytes
        .windows(from.len())
        .position(|w| w == from)
        .expect("the format is in the header");
    let mut other = bytes.clone();
    other[at..at + to.len()].copy_from_slice(to);
    let renamed = dir.join("other.safetensors");
    std::fs::write(&renamed, other).unwrap();
    let err = tessera::checkpoint::load(&renamed)
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("tessera-checkpoint-9"), "{err}");
    assert!(tessera::checkpoint::load(&path).is_ok());
}

/// Sizes in a model directory's `config.json` that wrap, overflow a tensor or name more
/// layers than the weights hold give one error line, before anything of their size is
/// allocated (once panics, aborts and tens of GB of rotary tables); a Llama's
/// `max_position_embeddings` only bounds how far it may go, and costs nothing up front.
#[test]
fn config_sizes_from_outside_are_checked_before_anything_is_built() {
    let cases = [
        ("gpt2-tiny", "n_layer", "18446744073709551615", false),
        ("gpt2-tiny", "n_layer", "1000000000", false),
        ("gpt2-tiny", "n_positions", "1000000000000000000", false),
        ("gpt2-tiny", "vocab_size", "4294967296", false),
        ("llama-tiny", "num_hidden_layers", "1000000000", false),
        ("llama-tiny", "head_dim", "9223372036854775808", false),
        ("llama-tiny", "head_dim", "4294967296", false),
        (
            "llama-tiny",
            "max_position_embeddings",
            "1000000000000000000",
            true,
        ),
        ("llama-tiny", "max_position_embeddings", "100000000", true),
    ];
    for (fixture, key, value, loads) in cases {
        let source = tessera::shared_dir().join("fixtures/hf").join(fixture);
        if !source.exists() {
            eprintln!(
                "note: {} is absent; the case of {key} is not run",
                source.display()
            );
            continue;
        }
        let dir = temp_dir(&format!("config-{fixture}-{key}-{value}"));
        std::fs::copy(
            source.join("model.safetensors"),
            dir.join("model.safetensors"),
        )
        .unwrap();
        let config = std::fs::read_to_string(source.join("config.json")).unwrap();
        let mut config: serde_json::Value = serde_json::from_str(&config).unwrap();
        config[key] = serde_json::from_str(value).unwrap();
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let model = dir.to_str().unwrap();
        let args = [
            "generate", "--model", model, "--ids", "1", "--device", "cpu",
        ];
        if loads {
            let out = tessera()
                .args(args)
                .args(["--max-new-tokens", "3"])
                .output()
                .unwrap();
            assert!(out.status.success(), "{key} {value}: {out:?}");
        } else {
            fails(&args);
        }
    }
}

/// Inputs a model cannot read are refused by name instead of dropped or ignored: prompt
/// characters outside the addition task's, a prompt longer than the context, weights that
/// are not finite.
#[test]
fn unreadable_inputs_are_refused_by_name() {
    let dir = temp_dir("unreadable");
    let tiny = ["--steps", "1", "--out", dir.to_str().unwrap()];
    let checkpoint = run(&tiny_args(&tiny)).unwrap().checkpoint;
    let model = checkpoint.to_str().unwrap();
    let stderr = |args: &[&str]| {
        fails(args);
        String::from_utf8(tessera().args(args).output().unwrap().stderr).unwrap()
    };
    let foreign = stderr(&[
        "generate", "--model", model, "--prompt", "1+x=", "--device", "cpu",
    ]);
    assert!(foreign.contains("`x`"), "{foreign}");
    let long: Vec<String> = (0..100).map(|_| "1".to_string()).collect();
    let long = long.join(",");
    let too_long = stderr(&[
        "generate", "--model", model, "--ids", &long, "--device", "cpu",
    ]);
    assert!(too_long.contains("100 tokens"), "{too_long}");

    let source = tessera::shared_dir().join("fixtures/hf/gpt2-tiny");
    if !source.exists() {
        eprintln!(
            "note: {} is absent; the non-finite case is not run",
            source.display()
        );
        return;
    }
    let hf = dir.join("nan");
    std::fs::create_dir_all(&hf).unwrap();
    std::fs::copy(source.join("config.json"), hf.join("config.json")).unwrap();
    let mut tensors = tessera::io::load(&source.join("model.safetensors")).unwrap();
    let weight = tensors
        .iter_mut()
        .find(|(name, t)| name.ends_with("ln_f.weight") && t.dtype == tessera::DType::F32)
        .map(|(_, t)| t)
        .expect("a final norm weight in f32");
    weight.bytes[..4].copy_from_slice(&f32::NAN.to_le_bytes());
    tessera::io::save(&hf.join("model.safetensors"), &tensors, &BTreeMap::new()).unwrap();
    let model = hf.to_str().unwrap();
    let nan = stderr(&[
        "generate", "--model", model, "--ids", "1", "--device", "cpu",
    ]);
    assert!(
        nan.contains("ln_f.weight") && nan.contains("not finite"),
        "{nan}"
    );
}

/// Where the Vulkan loader finds no driver (its own `VK_DRIVER_FILES` and `VK_ICD_FILENAMES`
/// name a file that does not exist), the backends over Vulkan list no devices and `tessera
/// devices` still lists the CPU, says why each has none, and succeeds: probing neither
/// fails nor crashes. A machine
/// without the loader itself takes the same path through the loader's failure to load, which
/// a test cannot arrange while the system has one.
#[test]
fn without_a_vulkan_driver_the_vulkan_backends_list_no_devices() {
    let missing = temp_dir("no-driver").join("no_such_icd.json");
    let out = tessera()
        .arg("devices")
        .env("VK_DRIVER_FILES", &missing)
        .env("VK_ICD_FILENAMES", &missing)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stdout.lines().any(|l| l.starts_with("cpu:0 ")),
        "the CPU is listed:\n{stdout}"
    );
    let backends = [
        ("wgpu", cfg!(feature = "wgpu")),
        ("vulkan", cfg!(feature = "vulkan")),
    ];
    for (backend, compiled) in backends {
        let device_line = |l: &str| {
            l.strip_prefix(backend)
                .and_then(|rest| rest.strip_prefix(':'))
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        };
        assert!(
            !stdout.lines().any(device_line),
            "{backend} lists a device without a driver:\n{stdout}"
        );
        assert!(
            !compiled || stdout.contains(&format!("{backend}: no devices: ")),
            "{backend} says why it has no device:\n{stdout}"
        );
    }
}
