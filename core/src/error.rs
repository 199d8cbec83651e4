//! The one error type of the runtime.

use crate::DType;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Every failure a user can reach. Messages name the op, the shapes and the dtypes involved.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Shapes that do not fit the op.
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: String, detail: String },
    /// Dtypes that do not fit the op.
    #[error("{op}: dtype mismatch: {detail}")]
    DType { op: String, detail: String },
    /// An axis beyond the tensor's rank.
    #[error("{op}: axis {axis} out of range for a tensor of rank {rank} (shape {shape:?})")]
    Axis {
        op: String,
        axis: isize,
        rank: usize,
        shape: Vec<usize>,
    },
    /// An index or range beyond a dimension.
    #[error("{op}: index {index} out of range for dimension of size {size} (shape {shape:?})")]
    Index {
        op: String,
        index: isize,
        size: usize,
        shape: Vec<usize>,
    },
    /// Tensors on different devices given to one op.
    #[error("{op}: tensors on different devices: {first} and {second}; move them with `to_device` first")]
    DeviceMismatch {
        op: String,
        first: String,
        second: String,
    },
    /// An input that is empty where the op needs at least one element.
    #[error("{op}: empty input (shape {shape:?}) where at least one element is required")]
    Empty { op: String, shape: Vec<usize> },
    /// Anything else wrong with the arguments of a call.
    #[error("{op}: invalid argument: {detail}")]
    Invalid { op: String, detail: String },
    /// The backend cannot run this op (for these dtypes). Never hidden by a fallback.
    #[error("{backend} does not support {op}")]
    Unsupported { backend: String, op: String },
    /// The device's pool cannot satisfy an allocation under its limit. The device stays usable.
    #[error(
        "out of memory: requested {requested} bytes with {in_use} in use and a limit of {limit}"
    )]
    OutOfMemory {
        requested: usize,
        in_use: usize,
        limit: usize,
    },
    /// No device matches a name, or a backend failed to open one.
    #[error("device {name}: {detail}")]
    Device { name: String, detail: String },
    /// A kernel failed to compile; carries the compiler log.
    #[error("{backend}: kernel {op} failed to compile:\n{log}")]
    Compile {
        backend: String,
        op: String,
        log: String,
    },
    /// Backend runtime failures (driver errors, lost devices).
    #[error("{backend}: {detail}")]
    Backend { backend: String, detail: String },
    /// A collective across ranks that cannot go on: a rank stopped, a link was lost, the
    /// vendor's collective library failed.
    #[error("collective: {detail}")]
    Collective { detail: String },
    /// The link to another rank of a data-parallel world broke: that rank stopped.
    #[error("collective: the link to rank {rank} failed ({detail}); it has stopped")]
    RankLost { rank: usize, detail: String },
    /// Malformed, truncated or inconsistent files (safetensors, configs, checkpoints).
    #[error("{path}: {detail}")]
    Format { path: String, detail: String },
    /// File-system failures, with the path.
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

impl Error {
    pub fn shape(op: &str, detail: impl Into<String>) -> Self {
        Error::Shape {
            op: op.into(),
            detail: detail.into(),
        }
    }
    pub fn dtype(op: &str, detail: impl Into<String>) -> Self {
        Error::DType {
            op: op.into(),
            detail: detail.into(),
        }
    }
    pub fn invalid(op: &str, detail: impl Into<String>) -> Self {
        Error::Invalid {
            op: op.into(),
            detail: detail.into(),
        }
    }
    pub fn format(path: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Format {
            path: path.into(),
            detail: detail.into(),
        }
    }
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
    pub fn unsupported(backend: &str, op: impl Into<String>) -> Self {
        Error::Unsupported {
            backend: backend.into(),
            op: op.into(),
        }
    }
}

/// Formats dtypes for error messages and profiles: `[f32, i32]`, `[297 x f32]`.
pub fn dtypes_str(dtypes: &[DType]) -> String {
    // Runs of more than three (a group's optimizer update) as `297 x f32`.
    let mut parts = Vec::new();
    let mut rest = dtypes;
    while let Some(&first) = rest.first() {
        let run = rest.iter().take_while(|&&d| d == first).count();
        if run > 3 {
            parts.push(format!("{run} x {}", first.name()));
        } else {
            parts.extend(std::iter::repeat_n(first.name().to_string(), run));
        }
        rest = &rest[run..];
    }
    format!("[{}]", parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_lists_shorten_long_runs() {
        use DType::*;
        assert_eq!(dtypes_str(&[F32, I32]), "[f32, i32]");
        assert_eq!(dtypes_str(&[F16, F16, F16, F32]), "[f16, f16, f16, f32]");
        let group = [vec![BF16; 12], vec![F32]].concat();
        assert_eq!(dtypes_str(&group), "[12 x bf16, f32]");
    }
}
