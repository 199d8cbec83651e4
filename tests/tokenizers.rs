//! Hugging Face tokenizers through the command: a Llama-style model directory generates with
//! its own `tokenizer.json` and stop tokens, and a run trained with a `tokenizer.json` records
//! it, so that generating from or resuming the checkpoint needs the file no more.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::json;
use tessera::checkpoint;

fn tessera() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tessera"))
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tessera-tok-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A word-level `tokenizer.json`: id `i` is the word `words[i]`, words split at whitespace,
/// decoded joined by spaces; `<unk>` must be one of the words.
fn word_level_json(words: &[String]) -> String {
    let vocab: serde_json::Map<String, serde_json::Value> = words
        .iter()
        .enumerate()
        .map(|(i, w)| (w.clone(), json!(i)))
        .collect();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [],
        "normalizer": null,
        "pre_tokenizer": { "type": "Whitespace" },
        "post_processor": null,
        "decoder": null,
        "model": { "type": "WordLevel", "vocab": vocab, "unk_token": "<unk>" }
    })
    .to_string()
}

/// Runs the command, expecting success; returns its standard output.
fn output_of(args: &[&str]) -> String {
    let out = tessera().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{args:?} failed: {stderr}");
    String::from_utf8(out.stdout).unwrap()
}

/// Token ids stored in the fixture's `expected.safetensors` (what transformers computed).
fn fixture_ids(fixture: &Path, name: &str) -> Vec<u32> {
    let expected = tessera::io::load(&fixture.join("expected.safetensors")).unwrap();
    expected[name]
        .to_f64()
        .into_iter()
        .map(|v| v as u32)
        .collect()
}

#[test]
fn a_llama_directory_generates_with_its_tokenizer_and_stop_tokens() {
    let fixture = tessera::shared_dir().join("fixtures/hf/llama-tiny");
    let dir = temp_dir("llama-dir");
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixture.join(file), dir.join(file)).unwrap();
    }
    // Words `w3`..`w511` for the 512 ids of the tiny Llama, so that text and ids map one to one.
    let mut words: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    words.extend((3..512).map(|i| format!("w{i}")));
    std::fs::write(dir.join("tokenizer.json"), word_level_json(&words)).unwrap();
    let prompt_ids = fixture_ids(&fixture, "generate.prompt");
    let greedy = fixture_ids(&fixture, "generate.greedy");
    let text = |ids: &[u32]| -> String {
        let words: Vec<&str> = ids.iter().map(|&i| words[i as usize].as_str()).collect();
        words.join(" ")
    };
    let prompt = text(&prompt_ids);
    let model = dir.to_str().unwrap();
    let args = [
        "generate", "--model", model, "--device", "cpu", "--prompt", &prompt,
    ];
    let args = [&args[..], &["--max-new-tokens", "12"]].concat();
    // Transformers' greedy continuation of the same ids, as the directory's tokenizer writes it.
    assert_eq!(output_of(&args).trim_end(), text(&greedy));

    // generation_config.json's stop tokens (a list, as Llama 3 writes them) end generation,
    // and a stop token is not printed.
    let stop = greedy[prompt_ids.len() + 3];
    std::fs::write(
        dir.join("generation_config.json"),
        json!({ "eos_token_id": [2, stop] }).to_string(),
    )
    .unwrap();
    let until_stop = &greedy[..prompt_ids.len() + 3];
    assert_eq!(output_of(&args).trim_end(), text(until_stop));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_run_trained_with_a_tokenizer_json_records_it() {
    let dir = temp_dir("train");
    let words: Vec<String> = ["<unk>", "the", "cat", "sat", "on", "mat", "."]
        .map(String::from)
        .to_vec();
    let tokenizer = dir.join("tokenizer.json");
    std::fs::write(&tokenizer, word_level_json(&words)).unwrap();
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, "the cat sat on the mat . ".repeat(200)).unwrap();
    let out = dir.join("run");
    let (corpus_arg, tokenizer_arg, out_arg) = (
        corpus.to_str().unwrap(),
        tokenizer.to_str().unwrap(),
        out.to_str().unwrap(),
    );
    let train = |steps: &str, extra: &[&str]| {
        let base = [
            "train", "--quiet", "--device", "cpu", "--out", out_arg, "--steps", steps,
        ];
        output_of(&[&base[..], extra].concat())
    };
    let model = [
        "--layers",
        "1",
        "--d-model",
        "16",
        "--heads",
        "2",
        "--seq",
        "8",
        "--batch",
        "4",
        "--eval-every",
        "5",
        "--eval-size",
        "1",
        "--checkpoint-every",
        "5",
    ];
    let first = [
        &model[..],
        &["--data", corpus_arg, "--tokenizer", tokenizer_arg],
    ]
    .concat();
    train("5", &first);
    let checkpoint_path = out.join("checkpoint.safetensors");
    let loaded = checkpoint::load(&checkpoint_path).unwrap();
    assert_eq!(loaded.config.vocab_size, words.len());
    let record = &loaded.state.run["tokenizer"];
    assert_eq!(record["kind"], "tokenizer.json");
    assert_eq!(
        record["json"].as_str(),
        Some(std::fs::read_to_string(&tokenizer).unwrap().as_str())
    );

    // Without the file, generation and resuming use the recorded tokenizer.
    std::fs::remove_file(&tokenizer).unwrap();
    let checkpoint_arg = checkpoint_path.to_str().unwrap();
    let generated = output_of(&[
        "generate",
        "--model",
        checkpoint_arg,
        "--device",
        "cpu",
        "--prompt",
        "the cat",
        "--max-new-tokens",
        "6",
    ]);
    let mut pieces = generated.split_whitespace();
    assert_eq!(pieces.next(), Some("the"));
    assert_eq!(pieces.next(), Some("cat"));
    let continuation: Vec<&str> = pieces.collect();
    assert_eq!(continuation.len(), 6, "{generated:?}");
    assert!(
        continuation.iter().all(|w| words.iter().any(|k| k == w)),
        "{generated:?} holds text the tokenizer cannot have written"
    );
    train("10", &["--resume", checkpoint_arg]);
    assert_eq!(checkpoint::load(&checkpoint_path).unwrap().state.step, 10);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_arguments_that_name_nothing_are_refused() {
    let dir = temp_dir("bad");
    let corpus = dir.join("corpus.txt");
    std::fs::write(&corpus, "some text").unwrap();
    let missing = dir.join("missing.json");
    let empty_dir = dir.join("empty");
    std::fs::create_dir_all(&empty_dir).unwrap();
    let broken = dir.join("broken.json");
    std::fs::write(&broken, r#"{"model": {"type": "BPE", "vocab": 7}}"#).unwrap();
    for (tokenizer, names) in [
        ("gtp2", "gtp2"),
        (missing.to_str().unwrap(), "missing.json"),
        (empty_dir.to_str().unwrap(), "no tokenizer.json"),
        (broken.to_str().unwrap(), "broken.json"),
        ("addition", "text data"),
    ] {
        let args = [
            "train",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--data",
            corpus.to_str().unwrap(),
            "--out",
            dir.to_str().unwrap(),
            "--tokenizer",
            tokenizer,
        ];
        let out = tessera().args(args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{tokenizer} accepted");
        assert_eq!(stderr.trim().lines().count(), 1, "{tokenizer}: {stderr}");
        assert!(stderr.contains(names), "{tokenizer}: {stderr}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
