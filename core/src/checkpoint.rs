//! Training checkpoints: one safetensors file holding the model's parameters
//! (`model.<hf name>`), the optimizer state (`optim.*`) and, in its metadata, the model config
//! and the training state (step, RNG states, data position, loss scale). Written atomically,
//! so an interrupted save leaves the previous checkpoint intact.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use crate::io::{self, HostTensor};
use crate::models::{Transformer, TransformerConfig};
use crate::optim::Optimizer;
use crate::rng::RngState;
use crate::{Error, Result};

/// Everything besides tensors that a resumed run needs to continue bit for bit.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainState {
    /// Optimizer updates done.
    pub step: u64,
    /// Generator for dropout and other model randomness.
    pub rng: RngState,
    /// Generator that picks training data (its position in the data stream).
    pub data_rng: RngState,
    pub loss_scale: f64,
    /// Free-form run settings, checked on resume so a run continues with what it started with.
    pub run: Value,
}

fn rng_json(r: &RngState) -> Value {
    json!({ "key": r.key.to_string(), "counter": r.counter.to_string() })
}

fn rng_from(v: &Value, origin: &str, what: &str) -> Result<RngState> {
    let field = |k: &str| -> Result<u64> {
        v.get(k)
            .and_then(Value::as_str)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::format(origin, format!("{what}.{k} missing or not an integer")))
    };
    Ok(RngState {
        key: field("key")?,
        counter: field("counter")?,
    })
}

/// The checkpoint format this build writes and reads.
pub const FORMAT: &str = "tessera-checkpoint-1";

/// Saves model, optimizer and state to `path` atomically.
pub fn save(
    path: &Path,
    model: &Transformer,
    optimizer: &dyn Optimizer,
    state: &TrainState,
) -> Result<()> {
    let mut tensors: BTreeMap<String, HostTensor> = model
        .state_dict()?
        .into_iter()
        .map(|(k, v)| (format!("model.{k}"), v))
        .collect();
    tensors.extend(optimizer.state()?);
    let meta = json!({
        "format": FORMAT,
        "config": model.config.to_hf_json(),
        "step": state.step.to_string(),
        "rng": rng_json(&state.rng),
        "data_rng": rng_json(&state.data_rng),
        "loss_scale": state.loss_scale,
        "run": state.run,
    });
    let metadata = BTreeMap::from([("tessera".to_string(), meta.to_string())]);
    io::save(path, &tensors, &metadata)
}

/// A checkpoint read back from disk.
pub struct Loaded {
    pub config: TransformerConfig,
    pub model: BTreeMap<String, HostTensor>,
    pub optimizer: BTreeMap<String, HostTensor>,
    pub state: TrainState,
}

/// Reads a checkpoint written by [`save`], validating its metadata.
pub fn load(path: &Path) -> Result<Loaded> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse(&bytes, &path.display().to_string())
}

/// Reads a checkpoint from its bytes; `origin` names it in errors.
pub fn parse(bytes: &[u8], origin: &str) -> Result<Loaded> {
    let origin = origin.to_string();
    let tensors = io::parse(bytes, &origin)?;
    let (_, header) = safetensors::SafeTensors::read_metadata(bytes)
        .map_err(|e| Error::format(&origin, e.to_string()))?;
    let raw = header
        .metadata()
        .as_ref()
        .and_then(|m| m.get("tessera"))
        .ok_or_else(|| {
            Error::format(&origin, "not a Tessera checkpoint (no `tessera` metadata)")
        })?;
    let meta: Value =
        serde_json::from_str(raw).map_err(|e| Error::format(&origin, format!("metadata: {e}")))?;
    match meta.get("format").and_then(Value::as_str) {
        Some(FORMAT) => {}
        other => {
            return Err(Error::format(
                &origin,
                format!(
                    "checkpoint format {} (this build reads {FORMAT})",
                    other.map_or_else(|| "missing".to_string(), |f| format!("`{f}`"))
                ),
            ))
        }
    }
    let config_text = meta
        .get("config")
        .map(Value::to_string)
        .ok_or_else(|| Error::format(&origin, "metadata has no config"))?;
    let config = TransformerConfig::from_hf_str(&config_text, &origin)?;
    let step = meta
        .get("step")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::format(&origin, "metadata step missing"))?;
    let state = TrainState {
        step,
        rng: rng_from(meta.get("rng").unwrap_or(&Value::Null), &origin, "rng")?,
        data_rng: rng_from(
            meta.get("data_rng").unwrap_or(&Value::Null),
            &origin,
            "data_rng",
        )?,
        loss_scale: meta
            .get("loss_scale")
            .and_then(Value::as_f64)
            .unwrap_or(1.0),
        run: meta.get("run").cloned().unwrap_or(Value::Null),
    };
    let (mut model, mut optimizer) = (BTreeMap::new(), BTreeMap::new());
    for (name, t) in tensors {
        if let Some(short) = name.strip_prefix("model.") {
            model.insert(short.to_string(), t);
        } else {
            optimizer.insert(name, t);
        }
    }
    Ok(Loaded {
        config,
        model,
        optimizer,
        state,
    })
}
