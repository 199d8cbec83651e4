//! safetensors files: checked loading and atomic saving.
//!
//! Loading validates the header, every dtype and every byte range against the file size before
//! any tensor is touched (the `safetensors` crate does the range checks with checked
//! arithmetic), and reports a [`crate::Error::Format`] naming the file. Saving writes a
//! temporary file beside the target, syncs it and renames it over the target, so a crash
//! leaves either the old file or the new one, never a torn one.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use safetensors::tensor::{Dtype as StDtype, TensorView};

use crate::{DType, Error, Result, Tensor};

/// A tensor held on the host, as stored in a file.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Little-endian element bytes, row-major.
    pub bytes: Vec<u8>,
}

impl HostTensor {
    pub fn from_tensor(t: &Tensor) -> Result<Self> {
        let t = t.contiguous()?;
        let mut bytes = vec![0u8; t.numel() * t.dtype().size()];
        t.device()
            .read(t.buffer(), t.layout().offset * t.dtype().size(), &mut bytes)?;
        Ok(HostTensor {
            dtype: t.dtype(),
            shape: t.shape().to_vec(),
            bytes,
        })
    }

    pub fn from_f64(values: &[f64], shape: &[usize], dtype: DType) -> Self {
        HostTensor {
            dtype,
            shape: shape.to_vec(),
            bytes: crate::encode_f64(values, dtype),
        }
    }

    pub fn to_f64(&self) -> Vec<f64> {
        crate::decode_f64(&self.bytes, self.dtype)
    }

    pub fn to_tensor(&self, device: &std::sync::Arc<dyn crate::Device>) -> Result<Tensor> {
        let buffer = device.alloc(self.bytes.len())?;
        device.write(&buffer, 0, &self.bytes)?;
        Ok(Tensor::from_parts(
            buffer,
            crate::Layout::contiguous(&self.shape),
            self.dtype,
            device.clone(),
        ))
    }
}

fn from_st(dtype: StDtype) -> Option<DType> {
    Some(match dtype {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::F64 => DType::F64,
        StDtype::I32 => DType::I32,
        StDtype::U32 => DType::U32,
        StDtype::BOOL => DType::Bool,
        _ => return None,
    })
}

fn to_st(dtype: DType) -> StDtype {
    match dtype {
        DType::F32 => StDtype::F32,
        DType::F16 => StDtype::F16,
        DType::BF16 => StDtype::BF16,
        DType::F64 => StDtype::F64,
        DType::I32 => StDtype::I32,
        DType::U32 => StDtype::U32,
        DType::Bool => StDtype::BOOL,
    }
}

/// Reads every tensor of a safetensors file. `I64` tensors (token ids written by PyTorch) are
/// narrowed to `I32` when every value fits, else rejected.
pub fn load(path: &Path) -> Result<BTreeMap<String, HostTensor>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    parse(&bytes, &path.display().to_string())
}

/// [`load`] on bytes already in memory; `origin` names them in errors.
pub fn parse(bytes: &[u8], origin: &str) -> Result<BTreeMap<String, HostTensor>> {
    let file = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| Error::format(origin, format!("not a valid safetensors file: {e}")))?;
    let mut out = BTreeMap::new();
    for (name, view) in file.tensors() {
        let shape = view.shape().to_vec();
        let data = view.data();
        let tensor = match (view.dtype(), from_st(view.dtype())) {
            (_, Some(dtype)) => HostTensor {
                dtype,
                shape,
                bytes: data.to_vec(),
            },
            (StDtype::I64, None) => {
                let mut narrowed = Vec::with_capacity(data.len() / 2);
                for chunk in data.chunks_exact(8) {
                    let v = i64::from_le_bytes(chunk.try_into().expect("chunks of 8"));
                    let v = i32::try_from(v).map_err(|_| {
                        Error::format(origin, format!("{name}: i64 value {v} does not fit i32"))
                    })?;
                    narrowed.extend_from_slice(&v.to_le_bytes());
                }
                HostTensor {
                    dtype: DType::I32,
                    shape,
                    bytes: narrowed,
                }
            }
            (other, None) => {
                return Err(Error::format(
                    origin,
                    format!("{name}: unsupported dtype {other:?}"),
                ))
            }
        };
        let expected = crate::numel(&tensor.shape).checked_mul(tensor.dtype.size());
        if expected != Some(tensor.bytes.len()) {
            return Err(Error::format(
                origin,
                format!(
                    "{name}: {} bytes for shape {:?} {}",
                    tensor.bytes.len(),
                    tensor.shape,
                    tensor.dtype
                ),
            ));
        }
        out.insert(name, tensor);
    }
    Ok(out)
}

/// Writes tensors (and string metadata) to `path` atomically.
pub fn save(
    path: &Path,
    tensors: &BTreeMap<String, HostTensor>,
    metadata: &BTreeMap<String, String>,
) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, t)| {
            TensorView::new(to_st(t.dtype), t.shape.clone(), &t.bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::format(path.display().to_string(), format!("{name}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let meta = if metadata.is_empty() {
        None
    } else {
        Some(metadata.clone().into_iter().collect())
    };
    let bytes = safetensors::tensor::serialize(views, &meta)
        .map_err(|e| Error::format(path.display().to_string(), e.to_string()))?;
    write_atomic(path, &bytes)
}

/// Reads the string metadata of a safetensors file.
pub fn load_metadata(path: &Path) -> Result<BTreeMap<String, String>> {
    let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| {
        Error::format(
            path.display().to_string(),
            format!("not a valid safetensors file: {e}"),
        )
    })?;
    Ok(meta
        .metadata()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect())
}

/// The temporary file [`write_atomic`] writes `path` through in process `pid`.
fn temporary(dir: &Path, file_name: &std::ffi::OsStr, pid: u32) -> PathBuf {
    dir.join(format!(".{}.tmp{pid}", file_name.to_string_lossy()))
}

/// Removes the temporary files of [`write_atomic`] for `path` left by processes that no longer
/// run (killed while writing): where `/proc` lists processes, those of absent processes, else
/// every one but this process's.
pub fn remove_stale_temporaries(path: &Path) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let Some(file_name) = path.file_name() else {
        return Ok(());
    };
    let prefix = format!(".{}.tmp", file_name.to_string_lossy());
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io(dir, e)),
    };
    let proc_fs = Path::new("/proc/self").exists();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        let running = match proc_fs {
            true => Path::new("/proc").join(pid.to_string()).exists(),
            false => pid == std::process::id(),
        };
        if !running {
            std::fs::remove_file(entry.path()).map_err(|e| Error::io(entry.path(), e))?;
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` through a synced temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let file_name = path
        .file_name()
        .ok_or_else(|| Error::format(path.display().to_string(), "not a file path"))?;
    let tmp = temporary(dir, file_name, std::process::id());
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
        Ok(())
    })();
    result.map_err(|e: std::io::Error| {
        let _ = std::fs::remove_file(&tmp);
        Error::io(path, e)
    })
}
