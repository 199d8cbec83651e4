//! `tessera bench` on the CPU with a tiny model: it prints JSON lines with every field the
//! PyTorch peer prints plus our counters, and `--peer` pairs the peer's lines into a table
//! (with a stand-in interpreter, so no test needs torch) or explains why it cannot.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

const TINY: [&str; 22] = [
    "bench",
    "--device",
    "cpu",
    "--layers",
    "2",
    "--d-model",
    "64",
    "--heads",
    "2",
    "--vocab",
    "512",
    "--seq",
    "32",
    "--batch",
    "2",
    "--steps",
    "2",
    "--warmup",
    "1",
    "--new-tokens",
    "8",
    "--decode-runs=1",
];

fn tessera(extra: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(TINY)
        .args(extra)
        .output()
        .expect("run tessera");
    assert!(
        out.status.success(),
        "tessera bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l}: {e}")))
        .collect()
}

fn number(line: &Value, key: &str) -> f64 {
    line.get(key)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("`{key}` missing or not a number in {line}"))
}

#[test]
fn tiny_model_prints_every_field() {
    let lines = json_lines(&tessera(&[]));
    assert_eq!(lines.len(), 2, "{lines:?}");
    let (train, decode) = (&lines[0], &lines[1]);
    assert_eq!(train["bench"], "train");
    assert_eq!(
        (train["batch"].as_u64(), train["seq"].as_u64()),
        (Some(2), Some(32))
    );
    assert_eq!(train["dtype"], "fp32");
    assert_eq!(train["compile"], false);
    assert_eq!(train["impl"], "tessera");
    assert!(
        train["device"]
            .as_str()
            .is_some_and(|d| d.starts_with("cpu:0")),
        "{train}"
    );
    for key in [
        "ms_per_step",
        "tokens_per_s",
        "peak_mem_mib",
        "host_syncs_per_step",
        "allocations_per_step",
        "loss",
    ] {
        assert!(number(train, key).is_finite(), "{key} in {train}");
    }
    assert!(
        number(train, "ms_per_step") > 0.0 && number(train, "allocations_per_step") > 0.0,
        "{train}"
    );
    assert_eq!(
        number(train, "host_syncs_per_step"),
        0.0,
        "a training step makes no host synchronization: {train}"
    );
    assert_eq!(decode["bench"], "decode");
    assert_eq!(
        (
            decode["batch"].as_u64(),
            decode["prompt"].as_u64(),
            decode["new_tokens"].as_u64()
        ),
        (Some(1), Some(16), Some(8))
    );
    for key in [
        "tokens_per_s",
        "ms_per_token",
        "peak_mem_mib",
        "host_syncs_per_token",
        "allocations_per_token",
    ] {
        assert!(number(decode, key).is_finite(), "{key} in {decode}");
    }
}

#[test]
fn peer_without_torch_is_a_note_not_an_error() {
    let out = tessera(&["train", "--peer", "--python", "/nonexistent/python3"]);
    assert_eq!(json_lines(&out).len(), 1);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--peer skipped"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[cfg(unix)]
#[test]
fn peer_lines_are_paired_into_a_table() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("tessera-test-bench-peer-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let script: PathBuf = dir.join("torch_gpt2.py");
    std::fs::write(&script, "").unwrap();
    // Stands in for a Python with torch: accepts the import probe and answers the script's
    // command line with a line of the shape the real peer prints.
    let python = dir.join("python");
    std::fs::write(
        &python,
        "#!/bin/sh\n[ \"$1\" = -c ] && exit 0\necho '{\"bench\": \"train\", \"batch\": 2, \"seq\": 32, \"dtype\": \"fp32\", \"compile\": false, \
         \"ms_per_step\": 1.0, \"tokens_per_s\": 64000.0, \"peak_mem_mib\": null, \"device\": \"cpu (2 threads)\"}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = tessera(&[
        "train",
        "--peer",
        "--python",
        python.to_str().unwrap(),
        "--peer-script",
        script.to_str().unwrap(),
    ]);
    let lines = json_lines(&out);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[1]["impl"], "pytorch");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ratio") && stdout.contains("tokens/s"),
        "{stdout}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    for arg in [
        "train --batch 2 --seq 32 --warmup 1 --iters 2",
        "--layers 2 --heads 2 --embd 64 --vocab 512",
        "--dtype fp32 --device cpu",
    ] {
        assert!(
            stderr.contains(arg),
            "peer not called with `{arg}`: {stderr}"
        );
    }
}
