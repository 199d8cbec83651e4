//! The catalog's dtype rules, in one place for every backend: which dtype combinations an op
//! gives a meaning to. A backend adds only what its device lacks: dtypes it cannot store
//! (`DeviceInfo::dtypes`), and any op it computes for fewer dtypes than the catalog allows,
//! which it reports as `Unsupported` itself. Shapes and the dtypes that follow from the
//! inputs (outputs, statistics) are checked at launch by [`super::validate_kernel_launch`].

use crate::error::dtypes_str;
use crate::{DType, Error, Op, Result};

/// Whether `op` gives inputs of `dtypes` a meaning: no math on bool or integers, ids and
/// indices of an index dtype, masks of bool.
pub fn catalog_allows(op: &Op, dtypes: &[DType]) -> bool {
    let float = |i: usize| dtypes.get(i).is_none_or(|d| d.is_float());
    let index = |i: usize| dtypes.get(i).is_none_or(|d| d.is_index());
    let not_bool = |i: usize| dtypes.get(i).is_none_or(|&d| d != DType::Bool);
    match op {
        Op::RandUniform { dtype } | Op::RandNormal { dtype } => dtype.is_float(),
        Op::Fill { .. } | Op::Arange { .. } | Op::Cast { .. } | Op::Copy | Op::Concat { .. } => {
            true
        }
        Op::Compare(_) => not_bool(0),
        Op::Where => dtypes.first().is_none_or(|&d| d == DType::Bool),
        Op::Embedding | Op::Gather { .. } => index(1),
        Op::EmbeddingBackward | Op::ScatterAdd { .. } => index(0) && not_bool(1),
        Op::IndexCopy { .. } => index(1),
        Op::CachedAttention => float(0) && float(1) && float(2) && index(3),
        Op::AppendAttention => float(0) && float(1) && index(2) && float(3),
        Op::CrossEntropy | Op::CrossEntropyBackward => float(0) && index(1),
        _ => (0..dtypes.len()).all(|i| {
            let stats_or_scale = matches!(
                (op, i),
                (Op::LayerNormBackward, 2 | 3)
                    | (Op::RmsNormBackward, 2)
                    | (Op::AttentionBackward { .. }, 4)
            ) || (op.updates_in_place() && i + 1 == dtypes.len());
            stats_or_scale || float(i)
        }),
    }
}

/// The dtype an op creates or converts to, beside its inputs' (`Fill`, `Cast`, ...).
fn own_dtype(op: &Op) -> Option<DType> {
    match op {
        Op::Fill { dtype } | Op::Arange { dtype } => Some(*dtype),
        Op::RandUniform { dtype } | Op::RandNormal { dtype } => Some(*dtype),
        Op::Cast { to } => Some(*to),
        _ => None,
    }
}

/// `op` for inputs of `dtypes` on a device of backend `backend` that stores `stored`: the
/// catalog's rules, and every dtype involved one the device stores. The error names the
/// backend, the op and the dtypes.
pub fn check_dtypes(backend: &str, op: &Op, dtypes: &[DType], stored: &[DType]) -> Result<()> {
    let storable = dtypes
        .iter()
        .chain(own_dtype(op).as_ref())
        .all(|d| stored.contains(d));
    if storable && catalog_allows(op, dtypes) {
        return Ok(());
    }
    Err(unsupported_dtypes(backend, op, dtypes))
}

/// The error for `op` on inputs of `dtypes`, which `backend` does not compute.
pub fn unsupported_dtypes(backend: &str, op: &Op, dtypes: &[DType]) -> Error {
    Error::unsupported(backend, format!("{} for {}", op.name(), dtypes_str(dtypes)))
}
