//! The op catalog.
//!
//! Every op the runtime can run, forward and backward, as a descriptor: an [`Op`] holds the
//! op's kind and its static parameters (the things a backend may specialize a kernel on), and
//! nothing that changes from call to call. Run-time floats (learning rates, epsilons, fill
//! values, random keys) travel as launch scalars, listed by [`Op::scalar_names`], so kernel
//! caches keyed by `Op` stay bounded.
//!
//! Each family file documents the exact semantics of its ops. [`Op::infer`] gives output specs
//! from input specs and [`validate_launch`] checks a launch against them; backends call it,
//! through [`validate_kernel_launch`], before enqueueing. Backends match on `Op`; the
//! conformance suite enumerates [`Op::catalog`], so a new op is tested on every backend the
//! moment it exists.
//!
//! Kernel-level conventions, for all ops:
//! - Elementwise, reduce, cast, copy and matmul ops read strided inputs in place (any strides,
//!   stride 0 broadcasts). Every other op requires row-major inputs (any offset); the tensor
//!   API makes inputs contiguous explicitly before calling it.
//! - Outputs are row-major, except [`Op::Copy`], whose output may be any non-overlapping view.
//! - Binary ops take inputs of the output's shape: broadcasting is expressed with stride-0
//!   layouts by the caller.
//! - f16 and bf16 are computed in f32; statistics outputs (norm mean/rstd, attention and
//!   cross-entropy log-sum-exp, losses, norms) are f32, or f64 for f64 inputs.
//! - Only optimizer updates and index copies write in place: their outputs may be the same
//!   buffers and layouts as the corresponding inputs.

mod attention;
mod conv;
mod dtypes;
mod elementwise;
mod loss;
mod matmul;
mod movement;
mod norm;
mod optim;
mod random;
mod reduce;

pub use conv::Conv2dParams;
pub use dtypes::{catalog_allows, check_dtypes, unsupported_dtypes};
pub use optim::adam_factors;

/// The op families: each backend runs an op by its family's kernels, kept in a file named
/// after the family (`norm.rs`, `kernels/norm.wgsl`), so one op is found in the same place in
/// every backend. [`Op::family`] is the one map from ops to families.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpFamily {
    Random,
    Elementwise,
    Reduce,
    Matmul,
    Movement,
    Norm,
    Attention,
    Loss,
    Optim,
    Conv,
}
pub use elementwise::{BinaryOp, CompareOp, UnaryOp};
pub use norm::NormKind;
pub use reduce::ReduceOp;

use crate::error::dtypes_str;
use crate::{DType, Error, Result, TensorRef};

/// Shape and dtype of one tensor argument.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorSpec {
    pub shape: Vec<usize>,
    pub dtype: DType,
}

impl TensorSpec {
    pub fn new(shape: &[usize], dtype: DType) -> Self {
        TensorSpec {
            shape: shape.to_vec(),
            dtype,
        }
    }
}

/// An op descriptor. See the family modules for each op's semantics, inputs, outputs and
/// scalars.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    // random.rs: creation and random
    Fill {
        dtype: DType,
    },
    Arange {
        dtype: DType,
    },
    RandUniform {
        dtype: DType,
    },
    RandNormal {
        dtype: DType,
    },
    // elementwise.rs
    Cast {
        to: DType,
    },
    Copy,
    Unary(UnaryOp),
    UnaryBackward(UnaryOp),
    Binary(BinaryOp),
    Compare(CompareOp),
    Where,
    SwiGlu,
    SwiGluBackward,
    // reduce.rs
    Reduce {
        op: ReduceOp,
        axes: Vec<usize>,
        keepdim: bool,
    },
    ArgMax {
        axis: usize,
        keepdim: bool,
    },
    Softmax,
    LogSoftmax,
    SoftmaxBackward,
    LogSoftmaxBackward,
    // matmul.rs
    Matmul {
        bias: bool,
        activation: Option<UnaryOp>,
        residual: bool,
    },
    NormMatmul {
        norm: NormKind,
        bias: bool,
        activation: Option<UnaryOp>,
        residual: bool,
    },
    // movement.rs
    Concat {
        axis: usize,
    },
    Embedding,
    EmbeddingBackward,
    Gather {
        axis: usize,
    },
    ScatterAdd {
        axis: usize,
    },
    IndexCopy {
        axis: usize,
    },
    // norm.rs
    LayerNorm,
    LayerNormBackward,
    RmsNorm,
    RmsNormBackward,
    // attention.rs
    Rotary,
    Attention {
        causal: bool,
    },
    AttentionBackward {
        causal: bool,
    },
    CachedAttention,
    AppendAttention,
    // loss.rs
    CrossEntropy,
    CrossEntropyBackward,
    // optim.rs
    AdamUpdate {
        decoupled_weight_decay: bool,
    },
    SgdUpdate {
        momentum: bool,
        nesterov: bool,
    },
    SquaredNorm,
    // conv.rs
    Conv2d {
        params: Conv2dParams,
        bias: bool,
    },
    Conv2dBackwardData {
        params: Conv2dParams,
    },
    Conv2dBackwardWeight {
        params: Conv2dParams,
    },
}

impl Op {
    /// One representative of every op in the catalog. Ops with static parameters appear with
    /// typical ones; the conformance samples vary them.
    pub fn catalog() -> Vec<Op> {
        use Op::*;
        let mut ops = vec![
            Fill { dtype: DType::F32 },
            Arange { dtype: DType::F32 },
            RandUniform { dtype: DType::F32 },
            RandNormal { dtype: DType::F32 },
            Cast { to: DType::F32 },
            Copy,
        ];
        ops.extend(UnaryOp::ALL.iter().map(|&u| Unary(u)));
        ops.extend(UnaryOp::ALL.iter().map(|&u| UnaryBackward(u)));
        ops.extend(BinaryOp::ALL.iter().map(|&b| Binary(b)));
        ops.extend(CompareOp::ALL.iter().map(|&c| Compare(c)));
        ops.extend([Where, SwiGlu, SwiGluBackward]);
        ops.extend(ReduceOp::ALL.iter().map(|&op| Reduce {
            op,
            axes: vec![0],
            keepdim: false,
        }));
        ops.extend([
            ArgMax {
                axis: 0,
                keepdim: false,
            },
            Softmax,
            LogSoftmax,
            SoftmaxBackward,
            LogSoftmaxBackward,
            Matmul {
                bias: false,
                activation: None,
                residual: false,
            },
            NormMatmul {
                norm: NormKind::Layer,
                bias: true,
                activation: None,
                residual: false,
            },
            Concat { axis: 0 },
            Embedding,
            EmbeddingBackward,
            Gather { axis: 0 },
            ScatterAdd { axis: 0 },
            IndexCopy { axis: 0 },
            LayerNorm,
            LayerNormBackward,
            RmsNorm,
            RmsNormBackward,
            Rotary,
            Attention { causal: true },
            AttentionBackward { causal: true },
            CachedAttention,
            AppendAttention,
            CrossEntropy,
            CrossEntropyBackward,
            AdamUpdate {
                decoupled_weight_decay: false,
            },
            AdamUpdate {
                decoupled_weight_decay: true,
            },
            SgdUpdate {
                momentum: true,
                nesterov: false,
            },
            SquaredNorm,
            Conv2d {
                params: Conv2dParams::default(),
                bias: true,
            },
            Conv2dBackwardData {
                params: Conv2dParams::default(),
            },
            Conv2dBackwardWeight {
                params: Conv2dParams::default(),
            },
        ]);
        ops
    }

    /// The family whose kernels run this op: the file that holds it in every backend.
    pub fn family(&self) -> OpFamily {
        use Op::*;
        match self {
            Fill { .. } | Arange { .. } | RandUniform { .. } | RandNormal { .. } => {
                OpFamily::Random
            }
            Cast { .. }
            | Copy
            | Unary(_)
            | UnaryBackward(_)
            | Binary(_)
            | Compare(_)
            | Where
            | SwiGlu
            | SwiGluBackward => OpFamily::Elementwise,
            Reduce { .. }
            | ArgMax { .. }
            | Softmax
            | LogSoftmax
            | SoftmaxBackward
            | LogSoftmaxBackward => OpFamily::Reduce,
            Matmul { .. } | NormMatmul { .. } => OpFamily::Matmul,
            Concat { .. }
            | Embedding
            | EmbeddingBackward
            | Gather { .. }
            | ScatterAdd { .. }
            | IndexCopy { .. } => OpFamily::Movement,
            LayerNorm | LayerNormBackward | RmsNorm | RmsNormBackward => OpFamily::Norm,
            Rotary
            | Attention { .. }
            | AttentionBackward { .. }
            | CachedAttention
            | AppendAttention => OpFamily::Attention,
            CrossEntropy | CrossEntropyBackward => OpFamily::Loss,
            AdamUpdate { .. } | SgdUpdate { .. } | SquaredNorm => OpFamily::Optim,
            Conv2d { .. } | Conv2dBackwardData { .. } | Conv2dBackwardWeight { .. } => {
                OpFamily::Conv
            }
        }
    }

    /// The catalog name: the same for every static parameter choice (`sum` for any axes).
    pub fn name(&self) -> String {
        use Op::*;
        match self {
            Fill { .. } => "fill".into(),
            Arange { .. } => "arange".into(),
            RandUniform { .. } => "rand_uniform".into(),
            RandNormal { .. } => "rand_normal".into(),
            Cast { .. } => "cast".into(),
            Copy => "copy".into(),
            Unary(u) => u.name().into(),
            UnaryBackward(u) => format!("{}_backward", u.name()),
            Binary(b) => b.name().into(),
            Compare(c) => c.name().into(),
            Where => "where".into(),
            SwiGlu => "swiglu".into(),
            SwiGluBackward => "swiglu_backward".into(),
            Reduce { op, .. } => op.name().into(),
            ArgMax { .. } => "argmax".into(),
            Softmax => "softmax".into(),
            LogSoftmax => "log_softmax".into(),
            SoftmaxBackward => "softmax_backward".into(),
            LogSoftmaxBackward => "log_softmax_backward".into(),
            Matmul { .. } => "matmul".into(),
            NormMatmul { .. } => "norm_matmul".into(),
            Concat { .. } => "concat".into(),
            Embedding => "embedding".into(),
            EmbeddingBackward => "embedding_backward".into(),
            Gather { .. } => "gather".into(),
            ScatterAdd { .. } => "scatter_add".into(),
            IndexCopy { .. } => "index_copy".into(),
            LayerNorm => "layer_norm".into(),
            LayerNormBackward => "layer_norm_backward".into(),
            RmsNorm => "rms_norm".into(),
            RmsNormBackward => "rms_norm_backward".into(),
            Rotary => "rotary".into(),
            Attention { .. } => "attention".into(),
            AttentionBackward { .. } => "attention_backward".into(),
            CachedAttention => "cached_attention".into(),
            AppendAttention => "append_attention".into(),
            CrossEntropy => "cross_entropy".into(),
            CrossEntropyBackward => "cross_entropy_backward".into(),
            AdamUpdate {
                decoupled_weight_decay: true,
            } => "adamw_update".into(),
            AdamUpdate {
                decoupled_weight_decay: false,
            } => "adam_update".into(),
            SgdUpdate { .. } => "sgd_update".into(),
            SquaredNorm => "squared_norm".into(),
            Conv2d { .. } => "conv2d".into(),
            Conv2dBackwardData { .. } => "conv2d_backward_data".into(),
            Conv2dBackwardWeight { .. } => "conv2d_backward_weight".into(),
        }
    }

    /// Names of the launch scalars, in order.
    pub fn scalar_names(&self) -> &'static [&'static str] {
        use Op::*;
        match self {
            Fill { .. } => &["value"],
            Arange { .. } => &["start", "step"],
            RandUniform { .. } => &[
                "key_lo",
                "key_hi",
                "counter_lo",
                "counter_hi",
                "low",
                "high",
            ],
            RandNormal { .. } => &[
                "key_lo",
                "key_hi",
                "counter_lo",
                "counter_hi",
                "mean",
                "std",
            ],
            Unary(u) | UnaryBackward(u) => u.scalar_names(),
            LayerNorm | RmsNorm | NormMatmul { .. } => &["eps"],
            Attention { .. } | AttentionBackward { .. } | CachedAttention | AppendAttention => {
                &["scale"]
            }
            AdamUpdate { .. } => &["beta1", "beta2", "eps", "weight_decay"],
            SgdUpdate { .. } => &["lr", "momentum", "grad_coef", "weight_decay"],
            _ => &[],
        }
    }

    /// Whether the op reads strided inputs in place. Others need row-major inputs.
    pub fn reads_strided(&self) -> bool {
        use Op::*;
        matches!(
            self,
            Cast { .. }
                | Copy
                | Unary(_)
                | UnaryBackward(_)
                | Binary(_)
                | Compare(_)
                | Where
                | Reduce { .. }
                | ArgMax { .. }
                | Matmul { .. }
        )
    }

    /// Whether the op reads input `input` in place with `layout`; other inputs are made
    /// row-major first. Ops that read strided views read any layout; attention also reads
    /// keys and values whose rows are contiguous but whose heads lie further apart (views of a
    /// KV cache with room for more positions), so decoding never copies its cache. A
    /// normalized product reads its matrix `b` (a linear's transposed weight) in place.
    pub fn reads_layout(&self, input: usize, layout: &crate::Layout) -> bool {
        self.reads_strided()
            || layout.is_contiguous()
            || (matches!(self, Op::Attention { .. } | Op::CachedAttention)
                && matches!(input, 1 | 2)
                && layout.rows_contiguous())
            || (matches!(self, Op::NormMatmul { .. }) && input == 1)
    }

    /// Whether outputs may alias the matching inputs (optimizer updates, index copies, the KV
    /// cache an appending attention writes).
    pub fn updates_in_place(&self) -> bool {
        matches!(
            self,
            Op::AdamUpdate { .. }
                | Op::SgdUpdate { .. }
                | Op::IndexCopy { .. }
                | Op::AppendAttention
        )
    }

    /// Whether the tensor API differentiates this op (so conformance checks its gradients).
    pub fn differentiable(&self) -> bool {
        use Op::*;
        match self {
            Unary(u) => u.differentiable(),
            Cast { to } => to.is_float(),
            Copy
            | Binary(_)
            | Where
            | SwiGlu
            | Softmax
            | LogSoftmax
            | Matmul { .. }
            | Concat { .. } => true,
            Reduce { op, .. } => matches!(
                op,
                ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min
            ),
            Embedding | Gather { .. } | LayerNorm | RmsNorm | Rotary | Attention { .. } => true,
            CrossEntropy | Conv2d { .. } => true,
            _ => false,
        }
    }

    /// Output specs for the given inputs. `out_shape` is required by ops whose output shape
    /// the inputs do not determine (creation ops, scatter-add, embedding and conv backward);
    /// for the others it is checked when given.
    pub fn infer(
        &self,
        inputs: &[TensorSpec],
        out_shape: Option<&[usize]>,
    ) -> Result<Vec<TensorSpec>> {
        let name = self.name();
        let arity = self.arity();
        if let Some(n) = arity {
            if inputs.len() != n {
                return Err(Error::invalid(
                    &name,
                    format!("expected {n} inputs, got {}", inputs.len()),
                ));
            }
        }
        let out = match self.family() {
            OpFamily::Random => random::infer(self, &name, out_shape)?,
            OpFamily::Elementwise => elementwise::infer(self, &name, inputs)?,
            OpFamily::Reduce => reduce::infer(self, &name, inputs)?,
            OpFamily::Matmul => matmul::infer(self, &name, inputs)?,
            OpFamily::Movement => movement::infer(self, &name, inputs, out_shape)?,
            OpFamily::Norm => norm::infer(self, &name, inputs)?,
            OpFamily::Attention => attention::infer(self, &name, inputs)?,
            OpFamily::Loss => loss::infer(self, &name, inputs)?,
            OpFamily::Optim => optim::infer(self, &name, inputs)?,
            OpFamily::Conv => conv::infer(self, &name, inputs, out_shape)?,
        };
        if let (Some(want), Some(first)) = (out_shape, out.first()) {
            if first.shape != want {
                return Err(Error::shape(
                    &name,
                    format!(
                        "output shape {want:?} given, but inputs {} give {:?}",
                        specs_str(inputs),
                        first.shape
                    ),
                ));
            }
        }
        Ok(out)
    }

    /// The fixed number of inputs, or `None` for variadic ops.
    fn arity(&self) -> Option<usize> {
        use Op::*;
        Some(match self {
            Fill { .. } | Arange { .. } | RandUniform { .. } | RandNormal { .. } => 0,
            Cast { .. }
            | Copy
            | Unary(_)
            | Reduce { .. }
            | ArgMax { .. }
            | Softmax
            | LogSoftmax => 1,
            UnaryBackward(_) | Binary(_) | Compare(_) | SwiGlu | SoftmaxBackward
            | LogSoftmaxBackward => 2,
            Where | SwiGluBackward => 3,
            Matmul { bias, residual, .. } => 2 + usize::from(*bias) + usize::from(*residual),
            NormMatmul {
                norm,
                bias,
                residual,
                ..
            } => 2 + norm.params() + usize::from(*bias) + usize::from(*residual),
            Concat { .. } | SquaredNorm => return None,
            Embedding | EmbeddingBackward | Gather { .. } | ScatterAdd { .. } => 2,
            IndexCopy { .. } => 3,
            LayerNorm | Rotary => 3,
            RmsNorm | CrossEntropy => 2,
            LayerNormBackward => 5,
            RmsNormBackward => 4,
            Attention { .. } => 3,
            AttentionBackward { .. } => 6,
            CachedAttention | AppendAttention => 4,
            CrossEntropyBackward => 4,
            AdamUpdate { .. } => return None,
            SgdUpdate { momentum, .. } => 3 + usize::from(*momentum),
            Conv2d { bias, .. } => 2 + usize::from(*bias),
            Conv2dBackwardData { .. } | Conv2dBackwardWeight { .. } => 2,
        })
    }
}

/// Formats specs for error messages: `[2, 3] f32, [3] i32`.
pub fn specs_str(specs: &[TensorSpec]) -> String {
    let parts: Vec<String> = specs
        .iter()
        .map(|s| format!("{:?} {}", s.shape, s.dtype))
        .collect();
    parts.join(", ")
}

pub(crate) fn require_float(name: &str, inputs: &[TensorSpec], which: &[usize]) -> Result<()> {
    for &i in which {
        if !inputs[i].dtype.is_float() {
            return Err(Error::dtype(
                name,
                format!("input {i} must be a float type; got {}", specs_str(inputs)),
            ));
        }
    }
    Ok(())
}

pub(crate) fn require_same_dtype(name: &str, inputs: &[TensorSpec], which: &[usize]) -> Result<()> {
    let first = inputs[which[0]].dtype;
    if which.iter().any(|&i| inputs[i].dtype != first) {
        let d: Vec<DType> = which.iter().map(|&i| inputs[i].dtype).collect();
        return Err(Error::dtype(
            name,
            format!(
                "inputs must share one dtype; got {} ({})",
                dtypes_str(&d),
                specs_str(inputs)
            ),
        ));
    }
    Ok(())
}

pub(crate) fn require_index(name: &str, inputs: &[TensorSpec], i: usize) -> Result<()> {
    if !inputs[i].dtype.is_index() {
        return Err(Error::dtype(
            name,
            format!(
                "input {i} must be i32 or u32 indices; got {}",
                specs_str(inputs)
            ),
        ));
    }
    Ok(())
}

/// Dtype of statistics outputs for inputs of `dtype`: f64 for f64, else f32.
pub fn stats_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Checks a launch against the catalog before anything is enqueued: input and output counts,
/// shapes and dtypes against [`Op::infer`], scalar count, every layout inside its buffer,
/// row-major inputs where the op needs them, row-major outputs, and no output overlapping an
/// input unless the op updates in place.
pub fn validate_launch(
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    let name = op.name();
    let in_specs: Vec<TensorSpec> = inputs
        .iter()
        .map(|t| TensorSpec::new(&t.layout.shape, t.dtype))
        .collect();
    let out_hint = outputs.first().map(|t| t.layout.shape.as_slice());
    let want = op.infer(&in_specs, out_hint)?;
    if want.len() != outputs.len() {
        return Err(Error::invalid(
            &name,
            format!("expected {} outputs, got {}", want.len(), outputs.len()),
        ));
    }
    for (i, (w, o)) in want.iter().zip(outputs).enumerate() {
        if w.shape != o.layout.shape || w.dtype != o.dtype {
            return Err(Error::shape(
                &name,
                format!(
                    "output {i} must be {:?} {}, got {:?} {}",
                    w.shape, w.dtype, o.layout.shape, o.dtype
                ),
            ));
        }
    }
    if scalars.len() != op.scalar_names().len() {
        return Err(Error::invalid(
            &name,
            format!(
                "expected scalars {:?}, got {} values",
                op.scalar_names(),
                scalars.len()
            ),
        ));
    }
    for (kind, list) in [("input", inputs), ("output", outputs)] {
        for (i, t) in list.iter().enumerate() {
            let need = t.layout.extent().checked_mul(t.dtype.size());
            if need.is_none_or(|n| n > t.buffer.len())
                || t.layout.shape.len() != t.layout.strides.len()
            {
                return Err(Error::invalid(
                    &name,
                    format!(
                        "{kind} {i} layout {:?} does not fit its buffer of {} bytes",
                        t.layout,
                        t.buffer.len()
                    ),
                ));
            }
        }
    }
    let unread = inputs
        .iter()
        .enumerate()
        .position(|(i, t)| !op.reads_layout(i, t.layout));
    if let Some(i) = unread {
        return Err(Error::invalid(
            &name,
            format!("input {i} must be row-major; got {:?}", inputs[i].layout),
        ));
    }
    if !matches!(op, Op::Copy) {
        if let Some(i) = outputs.iter().position(|t| !t.layout.is_contiguous()) {
            return Err(Error::invalid(
                &name,
                format!("output {i} must be row-major; got {:?}", outputs[i].layout),
            ));
        }
    }
    let params = updated_params(op, inputs.len());
    for (oi, o) in outputs.iter().enumerate() {
        for (ii, i) in inputs.iter().enumerate() {
            let in_place = in_place_input(op, params, oi) == Some(ii) && i.layout == o.layout;
            if !in_place && overlaps(o, i) {
                return Err(Error::invalid(
                    &name,
                    format!("output {oi} overlaps input {ii}"),
                ));
            }
        }
    }
    Ok(())
}

/// [`validate_launch`] for a kernel compiled for inputs of `built_for`: launching it on inputs
/// of other dtypes is an error too. Backends call this first in every `Kernel::launch`.
pub fn validate_kernel_launch(
    op: &Op,
    built_for: &[DType],
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    validate_launch(op, inputs, outputs, scalars)?;
    let got: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
    if got != built_for {
        return Err(Error::dtype(
            &op.name(),
            format!(
                "kernel built for inputs {} launched with {}",
                dtypes_str(built_for),
                dtypes_str(&got)
            ),
        ));
    }
    Ok(())
}

/// The input that output `output` of an in-place op may share, for an op over `params`
/// parameters (one but for a group's `AdamUpdate`): the parameters are inputs and outputs
/// `0..params`, and the optimizer state after them (`m`, `v` or the momentum buffer) is
/// output `k` and input `k + params`, past the gradients.
pub fn in_place_input(op: &Op, params: usize, output: usize) -> Option<usize> {
    match output {
        _ if !op.updates_in_place() => None,
        // Its output is new; the cache it writes is input 1.
        _ if *op == Op::AppendAttention => (output == 1).then_some(1),
        k if k < params => Some(k),
        k => Some(k + params),
    }
}

/// The parameters an optimizer update over `inputs` inputs updates: `(inputs - 1) / 4` for
/// Adam, one for the others.
pub fn updated_params(op: &Op, inputs: usize) -> usize {
    match op {
        Op::AdamUpdate { .. } => inputs.saturating_sub(1) / 4,
        _ => 1,
    }
}

/// A group's optimizer update as one update per parameter: for each, its inputs (one per
/// role, then the shared last input) and its outputs. For backends (and parts) that update
/// parameters one at a time.
pub fn per_param_operands<'a>(
    op: &Op,
    inputs: &[TensorRef<'a>],
    outputs: &[TensorRef<'a>],
) -> Vec<(Vec<TensorRef<'a>>, Vec<TensorRef<'a>>)> {
    let params = updated_params(op, inputs.len()).max(1);
    let (roles_in, roles_out) = ((inputs.len() - 1) / params, outputs.len() / params);
    (0..params)
        .map(|p| {
            let mut ins: Vec<TensorRef<'a>> =
                (0..roles_in).map(|r| inputs[r * params + p]).collect();
            ins.push(inputs[inputs.len() - 1]);
            let outs = (0..roles_out).map(|r| outputs[r * params + p]).collect();
            (ins, outs)
        })
        .collect()
}

fn overlaps(a: &TensorRef<'_>, b: &TensorRef<'_>) -> bool {
    if !std::ptr::addr_eq(
        std::sync::Arc::as_ptr(a.buffer),
        std::sync::Arc::as_ptr(b.buffer),
    ) {
        return false;
    }
    let range = |t: &TensorRef<'_>| {
        (
            t.layout.offset * t.dtype.size(),
            t.layout.extent() * t.dtype.size(),
        )
    };
    let (a0, a1) = range(a);
    let (b0, b1) = range(b);
    a1 > a0 && b1 > b0 && a0 < b1 && b0 < a1
}
