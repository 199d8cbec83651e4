//! A model's size is known before it is built, and a model the device cannot hold is refused
//! by an error instead of ending the process when an allocation fails.

use std::process::Command;
use std::sync::Arc;

use tessera::models::{Transformer, TransformerConfig};
use tessera::rng::RngState;
use tessera::{open_device, DType, Device};

fn cpu() -> Arc<dyn Device> {
    open_device("cpu").unwrap()
}

#[test]
fn the_parameter_count_of_a_config_is_its_models() {
    let mut llama_with_biases = TransformerConfig::llama(96, 32, 24, 2, 4, 2, 40);
    llama_with_biases.attention_bias = true;
    llama_with_biases.mlp_bias = true;
    let mut gpt2_untied = TransformerConfig::gpt2(50, 16, 32, 3, 4);
    gpt2_untied.tie_embeddings = false;
    gpt2_untied.d_ff = 48;
    let mut llama_tied = TransformerConfig::llama(64, 8, 16, 1, 2, 1, 24);
    llama_tied.tie_embeddings = true;
    for config in [
        TransformerConfig::gpt2(64, 16, 32, 2, 4),
        gpt2_untied,
        TransformerConfig::llama(96, 32, 24, 2, 4, 2, 40),
        llama_with_biases,
        llama_tied,
    ] {
        let model = Transformer::new(&config, &cpu(), DType::F32, &mut RngState::new(0)).unwrap();
        let built: usize = tessera::nn::parameters(&model)
            .iter()
            .map(|(_, t)| t.numel())
            .sum();
        assert_eq!(config.parameter_count(), Some(built), "{config:?}");
    }
}

#[test]
fn a_model_larger_than_the_devices_memory_is_refused_before_it_is_built() {
    let device = cpu();
    let Some(memory) = device.info().limits.memory_bytes else {
        // Only where the CPU's memory cannot be read (not Linux): nothing to check against.
        eprintln!("the CPU reports no memory size; skipped");
        return;
    };
    let layers = |n| TransformerConfig::gpt2(256, 64, 256, n, 4);
    let per_layer = layers(2).parameter_count().unwrap() - layers(1).parameter_count().unwrap();
    // Twice as many f32 weights as the memory holds.
    let config = layers(2 * memory / 4 / per_layer);
    let err = Transformer::new(&config, &device, DType::F32, &mut RngState::new(0))
        .err()
        .expect("a model larger than memory was built");
    assert!(err.to_string().contains("GiB of memory"), "{err}");

    // The command: training needs 16 bytes per parameter, refused with one error line.
    let layers = (2 * memory / 16 / per_layer).to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "train",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--d-model",
            "256",
        ])
        .args(["--layers", &layers, "--out"])
        .arg(std::env::temp_dir().join(format!("tessera-size-{}", std::process::id())))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("16 bytes per parameter"), "{stderr}");
}
