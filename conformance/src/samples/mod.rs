//! Conformance samples: for every op of the catalog, the concrete launches the suite runs.
//!
//! [`samples`] matches exhaustively on [`Op`], so an op added to the catalog does not compile
//! here until it has samples. One file per op family, as in `core/src/ops`. Each [`Sample`]
//! names a concrete op (static parameters varied), its inputs (shape, value generator, how the
//! input is laid out in its buffer), scalars, and what the harness should check.

mod attention;
mod conv;
mod elementwise;
mod loss;
mod matmul;
mod movement;
mod norm;
mod optim;
mod random;
mod reduce;
pub mod windows;

use tessera::{DType, Layout, Op};

/// How an input's values are produced. Values are deterministic: the harness seeds each
/// input from the sample's description and the input's position.
#[derive(Clone, Debug, PartialEq)]
pub enum Gen {
    /// Uniform in `[lo, hi)`.
    Uniform { lo: f64, hi: f64 },
    /// `(k + phase) * step` for integer `k` in `-range..range`: keeps values a known distance
    /// from kinks (relu, abs at 0) and from each other (maximum/minimum ties) for gradcheck.
    Lattice { step: f64, phase: f64, range: i64 },
    /// All values distinct, spaced `scale` apart (no ties for max/min/argmax gradients).
    Distinct { scale: f64 },
    /// Integers in `lo..hi` (indices, ties, exact casts).
    Ints { lo: i64, hi: i64 },
    /// 0 or 1.
    Bool,
    /// The base generator with NaN, +inf, -inf, 0 and -0 sprinkled in.
    Special(Box<Gen>),
    /// The given values, cycled.
    Values(Vec<f64>),
    /// Output `output` of `op` run by the reference (CPU, f64) on earlier inputs `args`, so
    /// that statistics fed to backward ops (mean, rstd, lse, out) are consistent.
    Forward {
        op: Op,
        args: Vec<usize>,
        scalars: Vec<f64>,
        output: usize,
    },
}

/// Uniform in `[lo, hi)`.
pub fn uniform(lo: f64, hi: f64) -> Gen {
    Gen::Uniform { lo, hi }
}

/// Uniform in `[-1, 1)` with NaN and infinities mixed in.
pub fn special() -> Gen {
    Gen::Special(Box::new(uniform(-1.0, 1.0)))
}

/// Which dtype an input has, relative to the dtype a row tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// The tested dtype (the reference uses f64).
    Float,
    /// The statistics dtype of the tested dtype: f32, f64 for f64 (the reference uses f64).
    Stats,
    /// Always this dtype (indices, bool conditions, the optimizers' f32 `grad_scale`).
    Fixed(DType),
}

/// How an input sits in its buffer. Strided views are only used for ops that read strided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum View {
    Contiguous,
    /// Row-major, starting this many elements into the buffer.
    Offset(usize),
    /// Stored row-major in another dimension order and read through strides: view dim `d` is
    /// storage dim `perm[d]`.
    Permuted(Vec<usize>),
    /// Rows stored with this many extra elements each (one before, the rest after), so the
    /// view has an offset and a row pitch larger than its width.
    Padded(usize),
    /// Stored with this shape and broadcast to the input's shape with stride-0 dims.
    Broadcast(Vec<usize>),
    /// The first rows of a buffer with this many more rows (second-to-last dim), as a KV
    /// cache with room for more positions: rows contiguous, outer dims further apart.
    Capacity(usize),
}

impl View {
    /// The layout of a view of `shape`, and how many elements its storage spans.
    pub fn layout(&self, shape: &[usize]) -> Layout {
        match self {
            View::Contiguous => Layout::contiguous(shape),
            View::Offset(k) => Layout::contiguous(shape).with_offset(*k),
            View::Permuted(perm) => {
                let mut storage = vec![0; shape.len()];
                for (d, &p) in perm.iter().enumerate() {
                    storage[p] = shape[d];
                }
                Layout::contiguous(&storage).permute(perm)
            }
            View::Padded(extra) => {
                let last = shape.len() - 1;
                let mut storage = shape.to_vec();
                storage[last] += extra;
                Layout::contiguous(&storage).narrow(last, 1.min(*extra), shape[last])
            }
            View::Capacity(extra) => {
                let rows = shape.len() - 2;
                let mut storage = shape.to_vec();
                storage[rows] += extra;
                Layout::contiguous(&storage).narrow(rows, 0, shape[rows])
            }
            View::Broadcast(src) => Layout::contiguous(src)
                .broadcast_to(shape)
                .unwrap_or_else(|| panic!("sample bug: {src:?} does not broadcast to {shape:?}")),
        }
    }

    /// A short name for sample descriptions and failure reports.
    pub fn describe(&self) -> String {
        match self {
            View::Contiguous => String::new(),
            View::Offset(k) => format!(" offset {k}"),
            View::Permuted(p) => format!(" permuted {p:?}"),
            View::Padded(e) => format!(" padded +{e}"),
            View::Broadcast(s) => format!(" broadcast from {s:?}"),
            View::Capacity(e) => format!(" room for {e} more rows"),
        }
    }
}

/// One input of a sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Input {
    pub shape: Vec<usize>,
    pub kind: Kind,
    pub gen: Gen,
    pub view: View,
    /// Whether the backward check asks for this input's gradient (float inputs only).
    pub grad: bool,
}

/// A float input of the tested dtype, contiguous, whose gradient is checked.
pub fn input(shape: &[usize], gen: Gen) -> Input {
    Input {
        shape: shape.to_vec(),
        kind: Kind::Float,
        gen,
        view: View::Contiguous,
        grad: true,
    }
}

/// An input of a fixed dtype (indices, conditions), never differentiated.
pub fn fixed(shape: &[usize], dtype: DType, gen: Gen) -> Input {
    Input {
        shape: shape.to_vec(),
        kind: Kind::Fixed(dtype),
        gen,
        view: View::Contiguous,
        grad: false,
    }
}

/// A statistics input (f32, f64 for f64), never differentiated.
pub fn stats(shape: &[usize], gen: Gen) -> Input {
    Input {
        shape: shape.to_vec(),
        kind: Kind::Stats,
        gen,
        view: View::Contiguous,
        grad: false,
    }
}

impl Input {
    pub fn view(mut self, view: View) -> Self {
        self.view = view;
        self
    }

    pub fn no_grad(mut self) -> Self {
        self.grad = false;
        self
    }
}

/// One concrete launch of an op, with what to check.
#[derive(Clone, Debug)]
pub struct Sample {
    pub op: Op,
    pub desc: String,
    pub inputs: Vec<Input>,
    pub scalars: Vec<f64>,
    pub out_shape: Option<Vec<usize>>,
    /// Reduction length of each output (the last entry repeats) for tolerance scaling.
    pub reduction: Vec<usize>,
    /// Reduction length behind the input gradients, for the backward check.
    pub grad_reduction: usize,
    /// Candidate tested dtypes; the harness keeps those the device lists.
    pub dtypes: Vec<DType>,
    /// The op's own dtype field (creation ops' output, a cast's target) is the tested dtype.
    pub retype: bool,
    /// Run the Tensor-level backward check on this sample.
    pub backward: bool,
    /// Run that check in f16/bf16 too (see [`Sample::no_half_chain`]).
    pub half_chain: bool,
    /// Small enough for finite differences (cpu, f64).
    pub gradcheck: bool,
    /// Optimizer updates and index copies: outputs are the input buffers, updated in place.
    pub in_place: bool,
    /// A strided layout for output 0 (only `Copy` writes strided outputs).
    pub out_view: Option<View>,
}

impl Sample {
    pub fn new(op: Op, desc: impl Into<String>, inputs: Vec<Input>) -> Self {
        let backward = op.differentiable();
        let views: String = inputs.iter().map(|i| i.view.describe()).collect();
        Sample {
            desc: format!("{} {}{views}", op.name(), desc.into()),
            backward,
            half_chain: true,
            op,
            inputs,
            scalars: Vec::new(),
            out_shape: None,
            reduction: vec![1],
            grad_reduction: 1,
            dtypes: DType::FLOATS.to_vec(),
            retype: false,
            gradcheck: false,
            in_place: false,
            out_view: None,
        }
    }

    pub fn scalars(mut self, scalars: &[f64]) -> Self {
        self.scalars = scalars.to_vec();
        self
    }

    pub fn out_shape(mut self, shape: &[usize]) -> Self {
        self.out_shape = Some(shape.to_vec());
        self
    }

    /// One reduction length for every output and for the gradients.
    pub fn reduce(mut self, len: usize) -> Self {
        self.reduction = vec![len];
        self.grad_reduction = len;
        self
    }

    /// Reduction lengths per output, and the longest one for the gradients.
    pub fn reduce_each(mut self, lens: &[usize]) -> Self {
        self.reduction = lens.to_vec();
        self.grad_reduction = lens.iter().copied().max().unwrap_or(1);
        self
    }

    pub fn grad_reduce(mut self, len: usize) -> Self {
        self.grad_reduction = len;
        self
    }

    pub fn dtypes(mut self, dtypes: &[DType]) -> Self {
        self.dtypes = dtypes.to_vec();
        self
    }

    /// Large samples: f32 only, no backward (their point is grid and row sizes).
    pub fn large(mut self) -> Self {
        self.dtypes = vec![DType::F32];
        self.backward = false;
        self
    }

    pub fn retype(mut self) -> Self {
        self.retype = true;
        self
    }

    /// No f16/bf16 backward check. A half-precision backward check compares two chains that
    /// each round the forward output to the dtype; over hundreds of thousands of outputs one of
    /// them lands on the other side of a rounding boundary on the device (which computes in
    /// f32) than in the reference (f64), and a backward that cancels (softmax's) amplifies
    /// that one ulp past the chain's tolerance. Such rows still run the backward check in
    /// f32 and f64, and the half-precision backward kernels are checked against f64 by their
    /// own forward rows.
    pub fn no_half_chain(mut self) -> Self {
        self.half_chain = false;
        self
    }

    pub fn no_backward(mut self) -> Self {
        self.backward = false;
        self
    }

    pub fn gradcheck(mut self) -> Self {
        self.gradcheck = self.op.differentiable();
        self
    }

    pub fn in_place(mut self) -> Self {
        self.in_place = true;
        self
    }

    pub fn out_view(mut self, view: View) -> Self {
        self.desc = format!("{} out{}", self.desc, view.describe());
        self.out_view = Some(view);
        self
    }

    /// The reduction length behind output `i`.
    pub fn reduction_of(&self, i: usize) -> usize {
        self.reduction
            .get(i)
            .or(self.reduction.last())
            .copied()
            .unwrap_or(1)
    }

    /// The op as launched for tested dtype `dtype` (creation ops and retyped casts take it).
    pub fn op_for(&self, dtype: DType) -> Op {
        if !self.retype {
            return self.op.clone();
        }
        match &self.op {
            Op::Fill { .. } => Op::Fill { dtype },
            Op::Arange { .. } => Op::Arange { dtype },
            Op::RandUniform { .. } => Op::RandUniform { dtype },
            Op::RandNormal { .. } => Op::RandNormal { dtype },
            Op::Cast { .. } => Op::Cast { to: dtype },
            other => other.clone(),
        }
    }
}

/// Every sample of one catalog op: its family's and the large ones of [`windows`] (not
/// [`windows::scaled_samples`], which only the small-binding test of the wgpu backend runs).
pub fn samples(op: &Op) -> Vec<Sample> {
    let mut list = family_samples(op);
    list.extend(windows::samples(op, windows::ROWS, windows::COLS));
    list
}

/// The samples of one catalog op written for its family. The match is exhaustive on purpose:
/// a new op needs samples.
pub fn family_samples(op: &Op) -> Vec<Sample> {
    match op {
        Op::Fill { .. } | Op::Arange { .. } | Op::RandUniform { .. } | Op::RandNormal { .. } => {
            random::samples(op)
        }
        Op::Cast { .. } => elementwise::cast(),
        Op::Copy => elementwise::copy(),
        Op::Unary(u) => elementwise::unary(*u),
        Op::UnaryBackward(u) => elementwise::unary_backward(*u),
        Op::Binary(b) => elementwise::binary(*b),
        Op::Compare(c) => elementwise::compare(*c),
        Op::Where => elementwise::select(),
        Op::SwiGlu => elementwise::swiglu(),
        Op::SwiGluBackward => elementwise::swiglu_backward(),
        Op::Reduce { op, .. } => reduce::reduce(*op),
        Op::ArgMax { .. } => reduce::argmax(),
        Op::Softmax | Op::LogSoftmax => reduce::softmax(op),
        Op::SoftmaxBackward | Op::LogSoftmaxBackward => reduce::softmax_backward(op),
        Op::Matmul { .. } => matmul::samples(),
        Op::NormMatmul { .. } => matmul::normed_samples(),
        Op::Concat { .. } => movement::concat(),
        Op::Embedding => movement::embedding(),
        Op::EmbeddingBackward => movement::embedding_backward(),
        Op::Gather { .. } => movement::gather(),
        Op::ScatterAdd { .. } => movement::scatter_add(),
        Op::IndexCopy { .. } => movement::index_copy(),
        Op::LayerNorm | Op::RmsNorm => norm::forward(op),
        Op::LayerNormBackward | Op::RmsNormBackward => norm::backward(op),
        Op::Rotary => attention::rotary(),
        Op::Attention { .. } => attention::forward(),
        Op::AttentionBackward { .. } => attention::backward(),
        Op::CachedAttention => attention::cached(),
        Op::AppendAttention => attention::append(),
        Op::CrossEntropy => loss::forward(),
        Op::CrossEntropyBackward => loss::backward(),
        Op::AdamUpdate {
            decoupled_weight_decay,
        } => optim::adam(*decoupled_weight_decay),
        Op::SgdUpdate { .. } => optim::sgd(),
        Op::SquaredNorm => optim::squared_norm(),
        Op::Conv2d { .. } => conv::forward(),
        Op::Conv2dBackwardData { .. } => conv::backward_data(),
        Op::Conv2dBackwardWeight { .. } => conv::backward_weight(),
    }
}

/// Every sample of the whole catalog, grouped by catalog entry.
pub fn all_samples() -> Vec<Sample> {
    Op::catalog().iter().flat_map(samples).collect()
}

/// The float dtypes plus the index and bool dtypes, for ops that take any dtype.
pub const ANY_DTYPE: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::F64,
    DType::I32,
    DType::Bool,
];

impl Input {
    /// The dtype class, for sample descriptions (`i32 ids` vs `u32 ids`).
    pub fn kind_name(&self) -> String {
        match self.kind {
            Kind::Float => "float".into(),
            Kind::Stats => "stats".into(),
            Kind::Fixed(d) => d.name().into(),
        }
    }
}
