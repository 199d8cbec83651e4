//! Model configuration, and reading and writing Hugging Face `config.json`.

use std::path::Path;

use serde_json::{json, Value};

use crate::{Error, Result};

/// The two transformer families Tessera runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// Learned positions, layer norm, GELU (tanh) MLP, biases, fused QKV.
    Gpt2,
    /// Rotary positions, RMS norm, SwiGLU MLP, grouped-query heads, no biases by default.
    Llama,
}

/// Everything that fixes a model's shapes.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub max_positions: usize,
    pub d_model: usize,
    pub n_layer: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub d_ff: usize,
    pub norm_eps: f64,
    pub rope_theta: f64,
    pub tie_embeddings: bool,
    /// Biases on the attention projections (always for GPT-2).
    pub attention_bias: bool,
    /// Biases on the MLP projections (always for GPT-2).
    pub mlp_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
}

impl TransformerConfig {
    /// A GPT-2 shaped model (`d_ff = 4 d_model`, tied embeddings).
    pub fn gpt2(
        vocab_size: usize,
        max_positions: usize,
        d_model: usize,
        n_layer: usize,
        n_head: usize,
    ) -> Self {
        TransformerConfig {
            family: Family::Gpt2,
            vocab_size,
            max_positions,
            d_model,
            n_layer,
            n_head,
            n_kv_head: n_head,
            head_dim: d_model / n_head.max(1),
            d_ff: 4 * d_model,
            norm_eps: 1e-5,
            rope_theta: 10_000.0,
            tie_embeddings: true,
            attention_bias: true,
            mlp_bias: true,
            bos_token_id: None,
            eos_token_id: None,
        }
    }

    /// A Llama shaped model.
    pub fn llama(
        vocab_size: usize,
        max_positions: usize,
        d_model: usize,
        n_layer: usize,
        n_head: usize,
        n_kv_head: usize,
        d_ff: usize,
    ) -> Self {
        TransformerConfig {
            family: Family::Llama,
            n_kv_head,
            d_ff,
            norm_eps: 1e-6,
            tie_embeddings: false,
            attention_bias: false,
            mlp_bias: false,
            ..TransformerConfig::gpt2(vocab_size, max_positions, d_model, n_layer, n_head)
        }
    }

    /// GPT-2 124M (the benchmark model).
    pub fn gpt2_small() -> Self {
        TransformerConfig {
            bos_token_id: Some(50256),
            eos_token_id: Some(50256),
            ..TransformerConfig::gpt2(50257, 1024, 768, 12, 12)
        }
    }

    /// The number of parameters the model of this config has, or `None` where counting it
    /// overflows (sizes read from files are checked with it before anything is built).
    pub fn parameter_count(&self) -> Option<usize> {
        let gpt2 = self.family == Family::Gpt2;
        let (d, ff) = (self.d_model, self.d_ff);
        let q = self.n_head.checked_mul(self.head_dim)?;
        let kv = self.n_kv_head.checked_mul(self.head_dim)?;
        let sum = |terms: &[Option<usize>]| {
            terms
                .iter()
                .try_fold(0usize, |acc, t| acc.checked_add((*t)?))
        };
        let mul = |a: usize, b: usize| a.checked_mul(b);
        // Layer norms have a weight and a bias, RMS norms a weight.
        let norm = if gpt2 { mul(2, d) } else { Some(d) };
        let qkv_out = sum(&[Some(q), mul(2, kv)])?;
        let attention_bias = if self.attention_bias {
            sum(&[Some(qkv_out), Some(d)])
        } else {
            Some(0)
        };
        let attention = sum(&[mul(d, qkv_out), mul(q, d), attention_bias]);
        // GPT-2: fc and proj; Llama: gate, up and down.
        let mlp_weights = if gpt2 { 2 } else { 3 };
        let mlp_in = if gpt2 { ff } else { mul(2, ff)? };
        let mlp_bias = if self.mlp_bias {
            sum(&[Some(mlp_in), Some(d)])
        } else {
            Some(0)
        };
        let mlp = sum(&[mul(d, ff)?.checked_mul(mlp_weights), mlp_bias]);
        let block = sum(&[norm, norm, attention, mlp])?;
        let positions = if gpt2 {
            mul(self.max_positions, d)
        } else {
            Some(0)
        };
        let head = if self.tie_embeddings {
            Some(0)
        } else {
            mul(self.vocab_size, d)
        };
        sum(&[
            mul(self.vocab_size, d),
            positions,
            mul(self.n_layer, block),
            norm,
            head,
        ])
    }

    /// Checks that the shapes fit together.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let bad = |m: String| Err(Error::format(origin, m));
        if [
            self.vocab_size,
            self.max_positions,
            self.d_model,
            self.n_layer,
            self.n_head,
            self.n_kv_head,
            self.head_dim,
            self.d_ff,
        ]
        .contains(&0)
        {
            return bad(format!("every size must be positive: {self:?}"));
        }
        // Sizes come from files: every product is checked before anything is built, and no
        // tensor of the model may hold more elements than kernels index (32 bits).
        let attention = self.n_head.checked_mul(self.head_dim);
        let kv = self.n_kv_head.checked_mul(self.head_dim);
        // (Llama's rotary tables cover only the positions used: `nn::Rotary`.)
        let gpt2 = self.family == Family::Gpt2;
        let positions = if gpt2 { self.max_positions } else { 1 };
        let (vocab, d) = (self.vocab_size, self.d_model);
        let tensors = [
            ("vocab_size x hidden size", Some(vocab), d),
            ("positions x hidden size", Some(positions), d),
            ("heads x head_dim x hidden size", attention, d),
            ("key/value heads x head_dim x hidden size", kv, d),
            ("hidden size x feed-forward size", Some(d), self.d_ff),
        ];
        for (what, rows, cols) in tensors {
            let elements = rows.and_then(|r| r.checked_mul(cols));
            if elements.is_none_or(|n| n > u32::MAX as usize) {
                return bad(format!(
                    "{what} is past 2^32 elements, the most one tensor holds: {self:?}"
                ));
            }
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return bad(format!(
                "{} heads are not a multiple of {} key/value heads",
                self.n_head, self.n_kv_head
            ));
        }
        if gpt2 && attention != Some(self.d_model) {
            return bad(format!(
                "GPT-2 needs n_embd {} divisible by n_head {}",
                self.d_model, self.n_head
            ));
        }
        if self.family == Family::Llama && !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "rotary embeddings need an even head_dim; got {}",
                self.head_dim
            ));
        }
        if !(self.norm_eps >= 0.0 && self.rope_theta > 0.0) {
            return bad("norm epsilon must be >= 0 and rope theta > 0".into());
        }
        Ok(())
    }

    /// Reads a Hugging Face `config.json` (`model_type` gpt2 or llama).
    pub fn from_hf_json(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_hf_str(&text, &path.display().to_string())
    }

    pub fn from_hf_str(text: &str, origin: &str) -> Result<Self> {
        let v: Value = serde_json::from_str(text)
            .map_err(|e| Error::format(origin, format!("invalid JSON: {e}")))?;
        let get = |key: &str| v.get(key).filter(|x| !x.is_null());
        let size = |key: &str| -> Result<usize> {
            get(key)
                .and_then(Value::as_u64)
                .map(|x| x as usize)
                .ok_or_else(|| Error::format(origin, format!("missing or non-integer `{key}`")))
        };
        let opt_size = |key: &str| get(key).and_then(Value::as_u64).map(|x| x as usize);
        let float = |key: &str, default: f64| get(key).and_then(Value::as_f64).unwrap_or(default);
        let flag = |key: &str, default: bool| get(key).and_then(Value::as_bool).unwrap_or(default);
        let token = |key: &str| {
            get(key)
                .and_then(Value::as_u64)
                .and_then(|x| u32::try_from(x).ok())
        };
        let model_type = get("model_type").and_then(Value::as_str).unwrap_or("");
        let cfg = match model_type {
            "gpt2" => {
                let act = get("activation_function")
                    .and_then(Value::as_str)
                    .unwrap_or("gelu_new");
                if !matches!(act, "gelu_new" | "gelu_pytorch_tanh") {
                    return Err(Error::format(origin, format!("activation `{act}` is not supported (GPT-2 models here use the tanh GELU)")));
                }
                if flag("scale_attn_by_inverse_layer_idx", false)
                    || !flag("scale_attn_weights", true)
                {
                    return Err(Error::format(
                        origin,
                        "only GPT-2's standard 1/sqrt(head_dim) attention scaling is supported",
                    ));
                }
                let d = size("n_embd")?;
                let mut c = TransformerConfig::gpt2(
                    size("vocab_size")?,
                    size("n_positions")?,
                    d,
                    size("n_layer")?,
                    size("n_head")?,
                );
                c.d_ff = opt_size("n_inner").unwrap_or(4 * d);
                c.norm_eps = float("layer_norm_epsilon", 1e-5);
                c.tie_embeddings = flag("tie_word_embeddings", true);
                c.bos_token_id = token("bos_token_id");
                c.eos_token_id = token("eos_token_id");
                c
            }
            "llama" => {
                let act = get("hidden_act").and_then(Value::as_str).unwrap_or("silu");
                if act != "silu" {
                    return Err(Error::format(
                        origin,
                        format!("hidden_act `{act}` is not supported (Llama models here use SiLU)"),
                    ));
                }
                let (d, heads) = (size("hidden_size")?, size("num_attention_heads")?);
                let mut c = TransformerConfig::llama(
                    size("vocab_size")?,
                    size("max_position_embeddings")?,
                    d,
                    size("num_hidden_layers")?,
                    heads,
                    opt_size("num_key_value_heads").unwrap_or(heads),
                    size("intermediate_size")?,
                );
                c.head_dim = opt_size("head_dim").unwrap_or(d / heads.max(1));
                c.norm_eps = float("rms_norm_eps", 1e-6);
                let rope = get("rope_parameters").or_else(|| get("rope_scaling"));
                if let Some(kind) = rope
                    .and_then(|r| r.get("rope_type"))
                    .and_then(Value::as_str)
                {
                    if kind != "default" {
                        return Err(Error::format(
                            origin,
                            format!("rope_type `{kind}` is not supported"),
                        ));
                    }
                }
                c.rope_theta = rope
                    .and_then(|r| r.get("rope_theta"))
                    .and_then(Value::as_f64)
                    .or_else(|| get("rope_theta").and_then(Value::as_f64))
                    .unwrap_or(10_000.0);
                c.tie_embeddings = flag("tie_word_embeddings", false);
                c.attention_bias = flag("attention_bias", false);
                c.mlp_bias = flag("mlp_bias", false);
                c.bos_token_id = token("bos_token_id");
                c.eos_token_id = token("eos_token_id");
                c
            }
            other => {
                return Err(Error::format(
                    origin,
                    format!("model_type `{other}` is not supported (gpt2, llama)"),
                ))
            }
        };
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// The Hugging Face `config.json` for this model.
    pub fn to_hf_json(&self) -> Value {
        match self.family {
            Family::Gpt2 => json!({
                "architectures": ["GPT2LMHeadModel"],
                "model_type": "gpt2",
                "activation_function": "gelu_new",
                "vocab_size": self.vocab_size,
                "n_positions": self.max_positions,
                "n_embd": self.d_model,
                "n_layer": self.n_layer,
                "n_head": self.n_head,
                "n_inner": self.d_ff,
                "layer_norm_epsilon": self.norm_eps,
                "tie_word_embeddings": self.tie_embeddings,
                "bos_token_id": self.bos_token_id,
                "eos_token_id": self.eos_token_id,
                "dtype": "float32",
            }),
            Family::Llama => json!({
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_act": "silu",
                "vocab_size": self.vocab_size,
                "max_position_embeddings": self.max_positions,
                "hidden_size": self.d_model,
                "num_hidden_layers": self.n_layer,
                "num_attention_heads": self.n_head,
                "num_key_value_heads": self.n_kv_head,
                "head_dim": self.head_dim,
                "intermediate_size": self.d_ff,
                "rms_norm_eps": self.norm_eps,
                "rope_theta": self.rope_theta,
                "tie_word_embeddings": self.tie_embeddings,
                "attention_bias": self.attention_bias,
                "mlp_bias": self.mlp_bias,
                "bos_token_id": self.bos_token_id,
                "eos_token_id": self.eos_token_id,
                "dtype": "float32",
            }),
        }
    }
}
