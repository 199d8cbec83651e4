//! What the planners need from a device: its capabilities, scratch memory, and the dispatch
//! of one kernel. A backend implements [`Gpu`]; nothing here knows which API records the work.

use std::sync::Arc;

use tessera_core::exec::{binding_window, PartLauncher};
use tessera_core::{Buffer, DType, Error, Limits, Result, TensorRef, UnaryOp};

/// What a device's kernels are built for, beyond the op and its dtypes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Build {
    /// The parameter block as immediates, of which the device has this many words; `None`: a
    /// window of the submission's parameter buffer.
    pub immediate_words: Option<usize>,
    /// Whether `wg_sum`/`wg_max` reduce within subgroups first (the adapter's `SUBGROUP`).
    pub subgroups: bool,
}

/// Marks a kernel whose `f16` values are bf16 bits ([`Caps::coop_bf16`]). WGSL has no bf16
/// type, so the tensor-core matmul holds its bf16 tiles as `f16`: it only converts f32 values
/// into them, stores and loads them, and multiplies them on cooperative matrices, each of
/// which means the same on bf16 once the backend re-encodes the type.
pub const F16_IS_BF16: &str = "// @f16-is-bf16";

/// Marks a kernel whose every index into a workgroup, private or parameter array is in range
/// by construction: bounded by its workgroup's builtins and constants, or by parameters the
/// planner checked, never by data. A backend may compile it without index clamps.
pub const INDICES_IN_RANGE: &str = "// @indices-in-range";

/// What a dispatch runs: a WGSL module, or a kernel the backend writes itself.
#[derive(Clone, Debug)]
pub enum Source {
    Wgsl(String),
    TensorMatmul(TensorMatmul),
    TensorAttention(TensorAttention),
}

/// A matmul for a backend's own tensor-core kernel ([`Caps::tensor_matmul`]), where WGSL
/// cannot say what makes it fast: Vulkan's workgroup-scope cooperative matrices loaded
/// straight from the operands through tensor layouts (`VK_NV_cooperative_matrix2`), the
/// driver staging them through workgroup memory.
///
/// The kernel computes `out[z, m, n] = epilogue(a[z, m, :] x b[z, :, n])` over output tiles of
/// [`TensorMatmul::tile`] (grid x over n, y over m, z over the batch times the split-K
/// parts), with f32 sums stored as the output's dtype at `out_offset + z * m * n`, row-major.
/// It reads the launch's matmul parameter words ([`crate::matmul_param_word`]): sizes, offsets,
/// operand strides, split-K and batch dimensions, the bias's and residual's. Bindings: `a`,
/// `b`, the bias and the residual where the epilogue has them, the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMatmul {
    /// Both operands' dtype: f16, or bf16.
    pub input: DType,
    /// f32 (sums for an epilogue or split-K to finish), f16 or bf16.
    pub output: DType,
    /// Whether `a` is contiguous along k (row-major; else along m).
    pub a_k_contiguous: bool,
    /// Whether `b` is contiguous along k (a transposed weight; else along n).
    pub b_k_contiguous: bool,
    /// Whether the tile is [`TensorMatmul::NARROW_TILE`] rather than [`TensorMatmul::TILE`].
    pub narrow: bool,
    /// The epilogue, as the WGSL kernels apply it: the bias's dtype (a binding after `b`),
    /// an activation (ReLU, GELU or SiLU), the residual's dtype (the binding after the bias).
    pub bias: Option<DType>,
    pub activation: Option<UnaryOp>,
    pub residual: Option<DType>,
    /// Where causal attention's mask leaves work out ([`Band`]).
    pub band: Option<Band>,
}

/// A product of causal attention's backward whose tiles need only part of k, or none:
/// per batch entry, key `j` is visible to query `i` when `j <= i + offset` (`offset`: keys
/// past queries). The tensor-core kernel narrows each tile's loop over k to where the band
/// has non-zero operands; what it leaves out is zero (or, for [`BandKind::Scores`], never
/// read), so kernels that run the whole product give the same result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Band {
    pub kind: BandKind,
    pub offset: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BandKind {
    /// The output is scores `[queries, keys]` (`S`, `dP`): a tile whose every key is hidden
    /// from its every query is not computed (the row pass reads only visible scores).
    Scores,
    /// `a` is `[queries, keys]` of scores' gradients, zero past the visible keys (`dq = dS
    /// k`): a tile's rows need k only up to the last row's last visible key.
    QueryRows,
    /// `a` is `[keys, queries]`, transposed scores' gradients or probabilities (`dk = dS^T q`,
    /// `dv = P^T dout`), zero before the first query that sees each key: a tile's rows need k
    /// only from its first key's first query.
    KeyRows,
}

impl TensorMatmul {
    /// Output rows and columns per workgroup, and k per step. On the H100 at 4096^3, compiled
    /// for the product's sizes (f16, TFLOP/s): 128 x 256 x 32 267, 256 x 128 x 32 253; and
    /// faster on each of GPT-2's products but the LM head (`benches/README.md`). Reading
    /// its sizes, on the H200: 256 x 128 x 32 147, 128 x 256 x 32 144, 128 x 128 x 64 136.
    /// Compiled for the sizes on the H200, no tile takes GPT-2's products over a k of 768
    /// past about 200 TFLOP/s: 128 x 128 x 32 with 128 threads gains 3-5% there and loses 5%
    /// at 4096^3 (`benches/README.md`).
    pub const TILE: [u32; 3] = [128, 256, 32];
    /// The tile of [`TensorMatmul::narrow`] kernels, for outputs of at most its width:
    /// attention's products over its head dimension.
    pub const NARROW_TILE: [u32; 3] = [256, 64, 32];
    /// Invocations per workgroup.
    pub const THREADS: u32 = 256;

    /// Whether this kernel's tiles cover a product of `m x n` over `k`, in parts of
    /// `k_per_split`, exactly: each a whole multiple of the tile's side.
    pub fn covers(&self, m: usize, n: usize, k: usize, k_per_split: usize) -> bool {
        let [tm, tn, tk] = self.tile().map(|t| t as usize);
        m.is_multiple_of(tm)
            && n.is_multiple_of(tn)
            && k.is_multiple_of(tk)
            && k_per_split.is_multiple_of(tk)
    }

    /// This kernel's tile.
    pub fn tile(&self) -> [u32; 3] {
        if self.narrow {
            Self::NARROW_TILE
        } else {
            Self::TILE
        }
    }
}

/// Attention on a backend's own tensor-core kernel ([`Caps::tensor_attention`]): Vulkan's
/// workgroup-scope cooperative matrices (`VK_NV_cooperative_matrix2`), which WGSL cannot
/// declare. Each workgroup takes [`TensorAttention::ROWS`] query rows of one (batch, head):
/// grid x over the blocks of rows, y over batch x heads, walking the keys in blocks of
/// [`TensorAttention::head`] and multiplying on tensor cores with f32 sums. It reads the
/// launch's attention parameter words ([`crate::attention_param_word`]). Its planners send it
/// only contiguous q (and out, lse, dout), key and value rows of `head` contiguous elements,
/// and causal attention with at least as many keys as queries. What it computes is its
/// [`AttentionPass`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorAttention {
    /// q's, k's, v's and the output's dtype: f16, or bf16.
    pub dtype: DType,
    /// The head size of q, k and v, one of [`TensorAttention::HEADS`]; also the keys a step.
    pub head: u32,
    /// What it computes.
    pub pass: AttentionPass,
}

/// What a [`TensorAttention`] kernel computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttentionPass {
    /// Flash attention's forward with an online softmax. Bindings: q, k, v, then the output
    /// (the operands' dtype) and each row's log-sum-exp of its scaled scores (f32), as the
    /// WGSL forward writes them.
    Forward,
    /// For the backward pass as products (`attention_products.rs`): each score's
    /// probability `P = exp(scale S - lse)` (0 where the key is hidden) and gradient
    /// `dS = scale P (dP - delta)`, with `S = q k^T`, `dP = dout v^T` and
    /// `delta = sum_j P dP` per row, each stored as two values of the dtype (rounded, and
    /// what rounding left out), row-major `[batch, heads, q_len, k_len]`, zeros where hidden.
    /// Bindings: q, k, v, the log-sum-exp, dout, then P's two parts and dS's.
    ScoresGradient,
}

impl TensorAttention {
    /// Query rows per workgroup.
    pub const ROWS: u32 = 64;
    /// Invocations per workgroup.
    pub const THREADS: u32 = 128;
    /// The head sizes it is built for.
    pub const HEADS: [u32; 2] = [64, 128];

    /// How many of its bindings, the last ones, it writes.
    pub fn outputs(&self) -> usize {
        match self.pass {
            AttentionPass::Forward => 2,
            AttentionPass::ScoresGradient => 4,
        }
    }

    /// Whether its blocks cover `q_len` query rows over `k_len` keys exactly: the backend may
    /// then compile it for the launch's parameters, its loads and stores unclamped
    /// ([`Dispatch::specialize`]).
    pub fn covers(&self, q_len: usize, k_len: usize) -> bool {
        q_len.is_multiple_of(Self::ROWS as usize) && k_len.is_multiple_of(self.head as usize)
    }

    /// The tile each of its products multiplies, as (m, n, k): the scores `q k^T`, `p v`
    /// and `dout v^T` are each [`TensorAttention::ROWS`] x `head` over `head`.
    pub fn tile(head: u32) -> [u32; 3] {
        [Self::ROWS, head, head]
    }
}

/// Threads per workgroup of every kernel (the WebGPU minimum guaranteed limit).
pub const WG: u64 = 256;

/// What a device offers the kernels, fixed when it opens.
#[derive(Clone, Debug)]
pub struct Caps {
    /// `max_binding_bytes` and `binding_align` place bindings and decide how ops split;
    /// `max_workgroups_per_dim` shapes grids.
    pub limits: Limits,
    /// Bytes of workgroup memory a kernel may use.
    pub workgroup_memory: usize,
    /// Whether f16 matmuls run on cooperative matrices (tensor cores).
    pub coop_f16: bool,
    /// Whether bf16 matmuls run on cooperative matrices: the same kernel, its tiles declared
    /// `f16` and its source marked [`F16_IS_BF16`], for a backend that re-encodes the 16-bit
    /// float type as bfloat16 where it compiles the kernel (Vulkan's SPIR-V).
    pub coop_bf16: bool,
    /// Whether the device is a CPU driver (lavapipe): it compiles every kernel with LLVM at
    /// first use, so kernels prefer loops to unrolled code there.
    pub cpu: bool,
    /// Whether the backend builds [`TensorMatmul`] kernels, for f16 and (with `coop_bf16`)
    /// bf16 operands; they then take the matmuls the `coop` kernel would.
    pub tensor_matmul: bool,
    /// Whether the backend builds [`TensorAttention`] kernels, for the dtypes of
    /// `coop_f16` and `coop_bf16`; they then take attention's forward over many query rows,
    /// and the score gradients of its backward as products.
    pub tensor_attention: bool,
    /// Parameter words a launch may pass as immediates (push constants); 0: none.
    pub immediate_words: usize,
    /// Whether workgroup reductions use subgroup operations.
    pub subgroups: bool,
}

/// The dtypes the kernels run on a device: f32, bf16 (16 bits in `u32` words), i32, u32 and
/// bool everywhere, f16 where the device has it (`f16`).
pub fn device_dtypes(f16: bool) -> Vec<DType> {
    [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::U32,
        DType::Bool,
    ]
    .into_iter()
    .filter(|&d| d != DType::F16 || f16)
    .collect()
}

/// One binding of a dispatch: a byte window of a buffer of the device.
#[derive(Clone, Copy, Debug)]
pub struct Binding<'a> {
    pub buffer: &'a Arc<dyn Buffer>,
    /// Start in bytes, a multiple of the device's `binding_align`.
    pub offset: u64,
    /// Length in bytes, a multiple of 4.
    pub size: u64,
}

/// One kernel dispatch, described for any API that runs WGSL compute kernels.
#[derive(Clone, Copy, Debug)]
pub struct Dispatch<'a> {
    /// The pipeline cache key: the op, its dtypes and the kernel variant. Kernels built with
    /// parameters as immediates and as a buffer share a key ([`Dispatch::immediate`] tells
    /// them apart).
    pub key: &'a str,
    /// Data bindings, group 1 from binding 1 in order.
    pub bindings: &'a [Binding<'a>],
    /// The parameter block, `u32` words.
    pub params: &'a [u32],
    /// Whether the kernel reads `params` as immediates (else from the submission's parameter
    /// buffer, group 0).
    pub immediate: bool,
    /// Workgroups along x, y and z; a zero dispatches nothing.
    pub grid: [u32; 3],
    /// Whether the backend may compile the kernel for this very parameter block, a pipeline
    /// per distinct block: set for the tensor-core matmul where its tiles cover the product
    /// exactly ([`TensorMatmul::covers`]), which NVIDIA's compiler then makes almost twice as
    /// fast (`backend-vulkan`'s `tensor_matmul.rs`), or cover its k in a very large product;
    /// and for the tensor-core attention where its blocks cover the rows and keys
    /// ([`TensorAttention::covers`]). Only there, so that work of changing sizes (prompts of
    /// each length) does not each time wait for a compile. Backends may ignore it.
    pub specialize: bool,
}

/// A device that runs WGSL compute kernels: wgpu, and Vulkan through naga.
pub trait Gpu {
    fn caps(&self) -> &Caps;
    /// The backend's name, for errors.
    fn backend(&self) -> &str;
    /// A scratch buffer of at least `bytes`, from the device's pool.
    fn scratch(&self, bytes: usize) -> Result<Arc<dyn Buffer>>;
    /// Bytes allocated for `buffer` (at least its length): what a binding of it whole spans.
    /// An error for a buffer of another device.
    fn capacity(&self, buffer: &Arc<dyn Buffer>) -> Result<u64>;
    /// Records `dispatch` with the pipeline cached under its key, compiling `source()` on a
    /// miss (generating the source costs more host time than the rest of a launch).
    fn dispatch(
        &self,
        dispatch: &Dispatch<'_>,
        source: &mut dyn FnMut() -> Result<Source>,
    ) -> Result<()>;
}

impl dyn Gpu + '_ {
    /// The most bytes one binding may span.
    pub(crate) fn max_binding(&self) -> u64 {
        Planner(self).max_binding()
    }

    /// The alignment of a binding's start, in bytes.
    pub(crate) fn align(&self) -> u64 {
        self.caps().limits.binding_align as u64
    }

    pub(crate) fn is_cpu(&self) -> bool {
        self.caps().cpu
    }

    pub(crate) fn coop_f16(&self) -> bool {
        self.caps().coop_f16
    }

    pub(crate) fn coop_bf16(&self) -> bool {
        self.caps().coop_bf16
    }

    pub(crate) fn workgroup_memory(&self) -> usize {
        self.caps().workgroup_memory
    }

    fn max_groups(&self) -> u64 {
        self.caps().limits.max_workgroups_per_dim.max(1) as u64
    }

    /// Bytes a binding of `t` spans.
    pub(crate) fn binding_bytes(&self, t: &TensorRef<'_>) -> u64 {
        Planner(self).binding_bytes(t)
    }

    /// Whether every tensor of `tensors` fits one binding, so an op over them runs in one
    /// launch (as core's splitting decides it).
    pub(crate) fn fits(&self, tensors: &[TensorRef<'_>]) -> bool {
        Planner(self).fits(tensors)
    }

    /// The binding of a tensor and its element offset inside that binding.
    ///
    /// A buffer that fits one binding is bound whole, whatever part of it `t` spans, so the
    /// launches over one buffer share one cached bind group (decoding's views of a growing
    /// KV cache would otherwise need a new one every token).
    pub(crate) fn view<'a>(&self, t: &TensorRef<'a>) -> Result<(Binding<'a>, u32)> {
        let capacity = self.capacity(t.buffer)?;
        let max = self.max_binding();
        let (start, size) = if capacity <= max {
            (0, capacity)
        } else {
            let (start, size) = binding_window(t.layout, t.dtype, self.align());
            (start, size.min(capacity.saturating_sub(start)))
        };
        if size > max || start + size > capacity {
            return Err(Error::unsupported(
                self.backend(),
                format!("a tensor view of {size} bytes (the device binds at most {max})"),
            ));
        }
        let elem = t.dtype.size() as u64;
        let offset = u32::try_from((t.layout.offset as u64 * elem - start) / elem)
            .map_err(|_| Error::unsupported(self.backend(), "views past 2^32 elements"))?;
        let binding = Binding {
            buffer: t.buffer,
            offset: start,
            size,
        };
        Ok((binding, offset))
    }

    /// A 2-D grid of at least `groups` workgroups where the device allows, else as many as
    /// fit; kernels loop over the rest.
    pub(crate) fn grid(&self, groups: u64) -> [u32; 3] {
        let max = self.max_groups();
        let y = groups.div_ceil(max).clamp(1, max);
        let x = groups.div_ceil(y).clamp(1, max);
        [x as u32, y as u32, 1]
    }

    /// `n` clamped to the grid's per-dimension limit (kernels loop over the rest).
    pub(crate) fn dim(&self, n: usize) -> u32 {
        (n as u64).min(self.max_groups()) as u32
    }

    /// What the kernel of a launch passing `words` parameter words is built for: immediates
    /// where they hold the words, subgroup reductions where the device has them.
    pub(crate) fn build(&self, words: usize) -> Build {
        let caps = self.caps();
        Build {
            immediate_words: (caps.immediate_words > 0 && words <= caps.immediate_words)
                .then_some(caps.immediate_words),
            subgroups: caps.subgroups,
        }
    }
}

/// A device seen by core's splitting ([`tessera_core::exec::split`]) through these kernels.
pub(crate) struct Planner<'a>(pub &'a dyn Gpu);
