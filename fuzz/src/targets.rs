//! The parsers of outside bytes, each with valid seeds to mutate.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use clap::Parser;
use tessera::checkpoint;
use tessera::cli::{Cli, Command};
use tessera::data::{
    from_record, ByteTokenizer, Gpt2Tokenizer, HfTokenizer, TextDataset, Tokenizer,
};
use tessera::io::HostTensor;
use tessera::models::{Family, Transformer, TransformerConfig};
use tessera::{open_device, DType, Device};

use crate::tokenizer_seeds::{tokenizer_seeds, SAMPLE_TEXT};

/// A parser fed with mutated inputs. `run` returns whether it accepted the input.
pub struct Target {
    pub name: &'static str,
    pub run: fn(&[u8]) -> bool,
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "safetensors",
            run: |bytes| tessera::io::parse(bytes, "fuzz").is_ok(),
            seeds: || [checkpoints(), fixture_files("model.safetensors")].concat(),
        },
        Target {
            name: "config",
            run: |bytes| {
                let text = String::from_utf8_lossy(bytes);
                TransformerConfig::from_hf_str(&text, "fuzz").is_ok_and(|config| {
                    // Built as `generate --model DIR` builds it, with the fixture's weights.
                    let weights = match config.family {
                        Family::Gpt2 => &fixture_weights()[0],
                        Family::Llama => &fixture_weights()[1],
                    };
                    Transformer::from_host_tensors(&config, weights, "fuzz", cpu(), DType::F32)
                        .is_ok()
                })
            },
            seeds: configs,
        },
        Target {
            name: "checkpoint",
            run: |bytes| {
                checkpoint::parse(bytes, "fuzz").is_ok_and(|loaded| {
                    // The recorded tokenizer, as `generate` rebuilds it.
                    let recorded = loaded.state.run.get("tokenizer");
                    let tokenizer_ok = recorded.is_none_or(|r| from_record(r, "fuzz").is_ok());
                    tokenizer_ok
                        && Transformer::from_host_tensors(
                            &loaded.config,
                            &loaded.model,
                            "fuzz",
                            cpu(),
                            DType::F32,
                        )
                        .is_ok()
                })
            },
            seeds: checkpoints,
        },
        Target {
            name: "tokenizer",
            run: |bytes| {
                let text = String::from_utf8_lossy(bytes).into_owned();
                HfTokenizer::from_json(text, "fuzz").is_ok_and(|t| {
                    t.encode(SAMPLE_TEXT).is_ok_and(|ids| {
                        // Decoding any ids, the model's output included, must not fail.
                        let mut probe = ids.clone();
                        probe.extend([u32::MAX, t.vocab_size() as u32]);
                        !t.decode(&probe).is_empty() || ids.is_empty()
                    })
                })
            },
            seeds: tokenizer_seeds,
        },
        Target {
            name: "text",
            run: |bytes| {
                let text = String::from_utf8_lossy(bytes);
                let bytes_ok = TextDataset::from_text(&text, &ByteTokenizer, 0.1, "fuzz").is_ok();
                let gpt2_ok = TextDataset::from_text(&text, gpt2(), 0.1, "fuzz").is_ok();
                bytes_ok && gpt2_ok
            },
            seeds: texts,
        },
    ]
}

fn cpu() -> &'static Arc<dyn Device> {
    static CPU: OnceLock<Arc<dyn Device>> = OnceLock::new();
    CPU.get_or_init(|| open_device("cpu").expect("the CPU device"))
}

/// The weights of the shared GPT-2 and Llama fixtures (empty where absent).
fn fixture_weights() -> &'static [BTreeMap<String, HostTensor>; 2] {
    static WEIGHTS: OnceLock<[BTreeMap<String, HostTensor>; 2]> = OnceLock::new();
    WEIGHTS.get_or_init(|| {
        ["gpt2-tiny", "llama-tiny"].map(|f| {
            let path = tessera::shared_dir()
                .join("fixtures/hf")
                .join(f)
                .join("model.safetensors");
            tessera::io::load(&path).unwrap_or_default()
        })
    })
}

fn gpt2() -> &'static Gpt2Tokenizer {
    static GPT2: OnceLock<Gpt2Tokenizer> = OnceLock::new();
    GPT2.get_or_init(|| Gpt2Tokenizer::new().expect("GPT-2's ranks"))
}

/// `file` of each shared Hugging Face fixture present.
fn fixture_files(file: &str) -> Vec<Vec<u8>> {
    ["gpt2-tiny", "llama-tiny"]
        .iter()
        .filter_map(|f| {
            std::fs::read(tessera::shared_dir().join("fixtures/hf").join(f).join(file)).ok()
        })
        .collect()
}

fn configs() -> Vec<Vec<u8>> {
    let llama = TransformerConfig::llama(512, 64, 64, 2, 4, 2, 176);
    let built =
        [TransformerConfig::gpt2_small(), llama].map(|c| c.to_hf_json().to_string().into_bytes());
    [built.to_vec(), fixture_files("config.json")].concat()
}

/// Checkpoints of one training step of a tiny GPT-2 and a tiny Llama, written by `train`.
fn checkpoints() -> Vec<Vec<u8>> {
    let dir = std::env::temp_dir().join(format!("tessera-fuzz-seeds-{}", std::process::id()));
    let seeds = ["gpt2", "llama"].map(|family| {
        let out = dir.join(family);
        let _ = std::fs::remove_dir_all(&out);
        let argv = [
            "tessera",
            "train",
            "--quiet",
            "--device",
            "cpu",
            "--digits",
            "1",
            "--d-model",
            "16",
            "--heads",
            "2",
            "--layers",
            "1",
            "--steps",
            "1",
            "--family",
            family,
            "--out",
        ];
        let mut argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
        argv.push(out.display().to_string());
        let Command::Train(args) = Cli::parse_from(argv).command else {
            unreachable!("parsed as train")
        };
        let summary = tessera::cli::train::run(&args).expect("a seed checkpoint");
        std::fs::read(summary.checkpoint).expect("the seed checkpoint")
    });
    let _ = std::fs::remove_dir_all(&dir);
    seeds.to_vec()
}

fn texts() -> Vec<Vec<u8>> {
    let mut seeds = vec![
        b"To be, or not to be, that is the question.\n".to_vec(),
        "caf\u{e9} \u{1f600} \u{4e2d}\u{6587}\n".as_bytes().to_vec(),
    ];
    if let Ok(text) = std::fs::read(tessera::shared_dir().join("data/tinyshakespeare.txt")) {
        seeds.push(text[..text.len().min(4096)].to_vec());
    }
    seeds
}
