//! Hugging Face model directories: `config.json` plus `model.safetensors`.
//!
//! GPT-2 checkpoints store the weights of their `Conv1D` layers (`c_attn`, `c_proj`, `c_fc`)
//! as `[in, out]`; Tessera keeps every linear weight as `[out, in]`, so those are transposed on
//! the way in and out. Tied GPT-2 embeddings are stored once, as `transformer.wte.weight`.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::transformer::InitKind;
use super::{Family, Transformer, TransformerConfig};
use crate::io::{self, HostTensor};
use crate::nn::parameters;
use crate::{DType, Device, Error, Result, Tensor};

fn is_conv1d(family: Family, name: &str) -> bool {
    family == Family::Gpt2
        && [".c_attn.weight", ".c_proj.weight", ".c_fc.weight"]
            .iter()
            .any(|s| name.ends_with(s))
}

/// The 2-D transpose of a host tensor of any dtype.
fn transpose_2d(t: &HostTensor) -> HostTensor {
    let (rows, cols, size) = (t.shape[0], t.shape[1], t.dtype.size());
    let mut bytes = vec![0u8; t.bytes.len()];
    for r in 0..rows {
        for c in 0..cols {
            let (src, dst) = ((r * cols + c) * size, (c * rows + r) * size);
            bytes[dst..dst + size].copy_from_slice(&t.bytes[src..src + size]);
        }
    }
    HostTensor {
        dtype: t.dtype,
        shape: vec![cols, rows],
        bytes,
    }
}

/// The stop tokens a Hugging Face model directory names: `eos_token_id` of its
/// `generation_config.json` and of its `config.json` (each a single id or a list, as Llama 3
/// writes it), in that order, without repeats. Absent files name none.
pub fn hf_stop_tokens(dir: &Path) -> Result<Vec<u32>> {
    let mut stops = Vec::new();
    for name in ["generation_config.json", "config.json"] {
        let path = dir.join(name);
        if !path.is_file() {
            continue;
        }
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        let json: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| Error::format(&origin, e.to_string()))?;
        let ids = match json.get("eos_token_id") {
            None | Some(serde_json::Value::Null) => Vec::new(),
            Some(serde_json::Value::Array(list)) => list.iter().collect(),
            Some(one) => vec![one],
        };
        for id in ids {
            let id = id
                .as_u64()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| {
                    Error::format(&origin, format!("eos_token_id `{id}` is no token id"))
                })?;
            if !stops.contains(&id) {
                stops.push(id);
            }
        }
    }
    Ok(stops)
}

impl Transformer {
    /// Loads `dir/config.json` and `dir/model.safetensors` onto `device` in `dtype`.
    pub fn from_hf_dir(dir: &Path, device: &Arc<dyn Device>, dtype: DType) -> Result<Self> {
        let config = TransformerConfig::from_hf_json(&dir.join("config.json"))?;
        Transformer::from_safetensors(&config, &dir.join("model.safetensors"), device, dtype)
    }

    /// Builds a model of `config` with the weights of a safetensors file.
    pub fn from_safetensors(
        config: &TransformerConfig,
        path: &Path,
        device: &Arc<dyn Device>,
        dtype: DType,
    ) -> Result<Self> {
        let tensors = io::load(path)?;
        Transformer::from_host_tensors(config, &tensors, &path.display().to_string(), device, dtype)
    }

    /// Builds a model from named host tensors in Hugging Face layout; `origin` names them in
    /// errors. Every parameter must be present with the right shape; other entries (such as
    /// GPT-2's attention-mask buffers) are ignored.
    pub fn from_host_tensors(
        config: &TransformerConfig,
        tensors: &BTreeMap<String, HostTensor>,
        origin: &str,
        device: &Arc<dyn Device>,
        dtype: DType,
    ) -> Result<Self> {
        let family = config.family;
        let mut source = |name: &str, shape: &[usize], _: InitKind| -> Result<Tensor> {
            let stored = tensors
                .get(name)
                .or_else(|| {
                    name.strip_prefix("transformer.")
                        .and_then(|short| tensors.get(short))
                })
                .ok_or_else(|| Error::format(origin, format!("missing tensor `{name}`")))?;
            if !stored.dtype.is_float() {
                return Err(Error::format(
                    origin,
                    format!("`{name}` is {}, not a float type", stored.dtype),
                ));
            }
            if stored.to_f64().iter().any(|v| !v.is_finite()) {
                return Err(Error::format(
                    origin,
                    format!("`{name}` holds values that are not finite (NaN or infinity)"),
                ));
            }
            let conv = is_conv1d(family, name) && stored.shape.len() == 2;
            let oriented = if conv {
                transpose_2d(stored)
            } else {
                stored.clone()
            };
            if oriented.shape != shape {
                let want: Vec<usize> = if conv {
                    shape.iter().rev().copied().collect()
                } else {
                    shape.to_vec()
                };
                return Err(Error::format(
                    origin,
                    format!(
                        "`{name}` has shape {:?}, the config needs {want:?}",
                        stored.shape
                    ),
                ));
            }
            Ok(oriented.to_tensor(device)?.to_dtype(dtype)?.requires_grad())
        };
        Transformer::build(config, device, dtype, &mut source)
    }

    /// Every parameter in Hugging Face layout and names.
    pub fn state_dict(&self) -> Result<BTreeMap<String, HostTensor>> {
        parameters(self)
            .into_iter()
            .map(|(name, t)| Ok((name.clone(), self.to_hf_layout(&name, &t)?)))
            .collect()
    }

    /// Every accumulated gradient in Hugging Face layout and names (parameters without a
    /// gradient are left out).
    pub fn grads_hf(&self) -> Result<BTreeMap<String, HostTensor>> {
        parameters(self)
            .into_iter()
            .filter_map(|(name, t)| t.grad().map(|g| (name, g)))
            .map(|(name, g)| Ok((name.clone(), self.to_hf_layout(&name, &g)?)))
            .collect()
    }

    /// Converts a tensor stored under a Hugging Face name to Tessera's layout (GPT-2's
    /// `Conv1D` weights are transposed); other tensors are returned as they are.
    pub fn hf_to_internal_layout(family: Family, name: &str, t: &HostTensor) -> HostTensor {
        if is_conv1d(family, name) && t.shape.len() == 2 {
            transpose_2d(t)
        } else {
            t.clone()
        }
    }

    fn to_hf_layout(&self, name: &str, t: &Tensor) -> Result<HostTensor> {
        let host = HostTensor::from_tensor(t)?;
        Ok(if is_conv1d(self.config.family, name) {
            transpose_2d(&host)
        } else {
            host
        })
    }

    /// Writes `dir/config.json` and `dir/model.safetensors` (each atomically).
    pub fn save_hf(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        let config = serde_json::to_string_pretty(&self.config.to_hf_json())
            .map_err(|e| Error::format(dir.display().to_string(), e.to_string()))?;
        io::write_atomic(&dir.join("config.json"), config.as_bytes())?;
        io::save(
            &dir.join("model.safetensors"),
            &self.state_dict()?,
            &BTreeMap::new(),
        )
    }
}
