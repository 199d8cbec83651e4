//! Data-parallel training end to end, through `tessera train --devices`: N workers with
//! batch b each follow one worker with batch N x b (losses and parameters, within f32
//! reduction-order tolerance), a worker that is killed stops every worker and leaves the
//! checkpoint whole, a resumed run keeps its world size, and devices without a collective
//! library are refused in one line.
//!
//! The workers run on `TESSERA_DP_DEVICES` (default `cpu,cpu`: the CPU's collectives go
//! over TCP, so this runs without a GPU); on GPUs, e.g. `TESSERA_DP_DEVICES=cuda:0,cuda:1`,
//! with `TESSERA_BIN` naming the `tessera` program where it was built elsewhere.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera::checkpoint;

fn tessera() -> Command {
    match std::env::var_os("TESSERA_BIN") {
        Some(bin) if !bin.is_empty() => Command::new(bin),
        _ => Command::new(env!("CARGO_BIN_EXE_tessera")),
    }
}

fn devices() -> Vec<String> {
    std::env::var("TESSERA_DP_DEVICES")
        .ok()
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "cpu,cpu".into())
        .split(',')
        .map(str::to_string)
        .collect()
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-dp-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The smallest model `train` builds, logging every step, evaluating never.
const TINY: &[&str] = &[
    "--quiet",
    "--digits",
    "1",
    "--d-model",
    "16",
    "--heads",
    "2",
    "--layers",
    "1",
    "--eval-every",
    "100000",
    "--log-every",
    "1",
];

fn train(placement: &[&str], extra: &[&str], out: &Path) -> Output {
    let out = tessera()
        .arg("train")
        .args(TINY)
        .args(placement)
        .args(extra)
        .args(["--out", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "train {placement:?} {extra:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `(loss, grad_norm)` of each logged step.
fn logged(out: &Path) -> Vec<(f64, f64)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter_map(|v| Some((v.get("loss")?.as_f64()?, v.get("grad_norm")?.as_f64()?)))
        .collect()
}

fn parameters(out: &Path) -> BTreeMap<String, Vec<f64>> {
    let loaded = checkpoint::load(&out.join("checkpoint.safetensors")).unwrap();
    loaded
        .model
        .into_iter()
        .map(|(name, t)| (name, t.to_f64()))
        .collect()
}

fn close(a: f64, b: f64, atol: f64, rtol: f64) -> bool {
    (a - b).abs() <= atol + rtol * b.abs()
}

#[test]
fn n_workers_with_batch_b_follow_one_worker_with_batch_n_b() {
    let devices = devices();
    let n = devices.len();
    let (dir_n, dir_1) = (temp_dir("n-workers"), temp_dir("one-worker"));
    let common = ["--steps", "10", "--accum", "2"];
    let list = devices.join(",");
    let batch = (4 * n).to_string();
    train(
        &["--devices", &list],
        &[&common[..], &["--batch", "4"]].concat(),
        &dir_n,
    );
    train(
        &["--device", &devices[0]],
        &[&common[..], &["--batch", &batch]].concat(),
        &dir_1,
    );
    let (steps_n, steps_1) = (logged(&dir_n), logged(&dir_1));
    assert_eq!(steps_n.len(), 10);
    assert_eq!(steps_n.len(), steps_1.len());
    for (step, ((loss_n, norm_n), (loss_1, norm_1))) in steps_n.iter().zip(&steps_1).enumerate() {
        assert!(
            close(*loss_n, *loss_1, 0.0, 1e-5),
            "step {}: loss {loss_n} with {n} workers, {loss_1} with one",
            step + 1
        );
        assert!(
            close(*norm_n, *norm_1, 0.0, 1e-4),
            "step {}: gradient norm {norm_n} with {n} workers, {norm_1} with one",
            step + 1
        );
    }
    let (params_n, params_1) = (parameters(&dir_n), parameters(&dir_1));
    assert_eq!(params_n.len(), params_1.len());
    for (name, values) in &params_n {
        for (a, b) in values.iter().zip(&params_1[name]) {
            assert!(
                close(*a, *b, 1e-5, 1e-4),
                "{name}: {a} with {n} workers, {b} with one"
            );
        }
    }
}

/// The process ids of `parent`'s children (Linux's /proc).
fn children(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| {
                    let after_name = stat.rsplit_once(')')?.1;
                    after_name.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// The `RANK` a worker process was started with.
fn rank_of(pid: u32) -> Option<usize> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .filter_map(|var| std::str::from_utf8(var).ok())
        .find_map(|var| var.strip_prefix("RANK="))
        .and_then(|r| r.parse().ok())
}

#[cfg(target_os = "linux")]
#[test]
fn killing_a_worker_stops_every_worker_and_keeps_the_checkpoint() {
    let devices = devices();
    let victim = devices.len() - 1;
    let dir = temp_dir("kill");
    let ckpt = dir.join("checkpoint.safetensors");
    let mut launcher = tessera()
        .arg("train")
        .args(TINY)
        .args(["--devices", &devices.join(",")])
        .args(["--steps", "1000000", "--checkpoint-every", "1"])
        .args(["--out", dir.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !ckpt.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "no checkpoint was written"
        );
        assert!(
            launcher.try_wait().unwrap().is_none(),
            "training ended early"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let workers = children(launcher.id());
    assert_eq!(workers.len(), devices.len(), "one worker per device");
    let target = workers
        .iter()
        .copied()
        .find(|&pid| rank_of(pid) == Some(victim))
        .expect("a worker of the last rank");
    Command::new("kill")
        .args(["-9", &target.to_string()])
        .status()
        .unwrap();
    let stopped = Instant::now();
    let status = loop {
        if let Some(status) = launcher.try_wait().unwrap() {
            break status;
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(60),
            "the workers did not stop after rank {victim} was killed"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut launcher.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success(), "the launch succeeded: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let last = stderr.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains(&format!("worker rank {victim}")) && last.contains("signal 9"),
        "the last line should name the killed worker: {stderr}"
    );
    for pid in workers {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "worker {pid} still runs"
        );
    }
    let loaded = checkpoint::load(&ckpt).expect("the checkpoint stays loadable");
    assert!(loaded.state.step >= 1);
}

#[test]
fn a_resumed_run_keeps_its_world_size() {
    let devices = devices();
    if devices.len() < 2 {
        eprintln!("skipped: needs two workers to change the world size");
        return;
    }
    let dir = temp_dir("resume");
    let ckpt = dir.join("checkpoint.safetensors");
    let list = devices.join(",");
    train(&["--devices", &list], &["--steps", "3"], &dir);
    let resume = ["--steps", "6", "--resume", ckpt.to_str().unwrap()];
    let refused = tessera()
        .arg("train")
        .args(TINY)
        .args(["--device", &devices[0]])
        .args(resume)
        .args(["--out", dir.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains(&format!("trained by {} worker(s)", devices.len())),
        "{stderr}"
    );
    train(&["--devices", &list], &resume, &dir);
    assert_eq!(checkpoint::load(&ckpt).unwrap().state.step, 6);
}

/// Where a device list's backend has no collectives (wgpu), or lacks its libraries (CUDA
/// and NCCL on a machine without them, as CI's), training stops before any worker starts,
/// in one line that names what is missing. Where CUDA and NCCL are installed, the CUDA runs
/// simply train (a step), and only the wgpu list has something to refuse.
#[test]
fn devices_without_collectives_are_refused_in_one_line() {
    let dir = temp_dir("refused");
    let out_dir = dir.to_str().unwrap();
    for list in ["cuda:0,cuda:1", "wgpu:0,wgpu:1"] {
        let out = tessera()
            .args(["train", "--quiet", "--steps", "1", "--out", out_dir])
            .args(["--devices", list])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            continue;
        }
        assert!(!stderr.contains("panicked"), "{list}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{list}: {stderr}");
    }
    let out = tessera()
        .args(["train", "--quiet", "--steps", "1", "--out", out_dir])
        .args(["--devices", "cuda:0", "--overwrite"])
        .output()
        .unwrap();
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        if cfg!(feature = "hip") {
            assert!(
                stderr.contains("libnccl"),
                "the missing library is named: {stderr}"
            );
        }
    }
}

/// Workers started one by one with torchrun's variables, as on several hosts (here on one,
/// over loopback), train together as `--devices` workers do.
#[test]
fn workers_started_with_torchrun_variables_train_together() {
    let devices = devices();
    let dir = temp_dir("torchrun");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let workers: Vec<_> = devices
        .iter()
        .enumerate()
        .map(|(rank, device)| {
            tessera()
                .arg("train")
                .args(TINY)
                .args(["--device", device, "--steps", "4"])
                .args(["--out", dir.to_str().unwrap()])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", devices.len().to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("MASTER_ADDR", "localhost")
                .env("MASTER_PORT", port.to_string())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for (rank, worker) in workers.into_iter().enumerate() {
        let out = worker.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let loaded = checkpoint::load(&dir.join("checkpoint.safetensors")).unwrap();
    assert_eq!(loaded.state.step, 4);
    assert_eq!(loaded.state.run["world_size"], devices.len());
    assert_eq!(logged(&dir).len(), 4, "rank 0 alone writes the metrics");
}
