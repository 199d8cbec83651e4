//! The tensor-core matmul written as SPIR-V ([`TensorMatmul`]): workgroup-scope cooperative
//! matrices (`VK_NV_cooperative_matrix2`) loaded straight from the operands through tensor
//! layouts, which the driver stages through workgroup memory in its own pipelined way. WGSL
//! cannot declare such matrices, so the kernel is built here with rspirv rather than from the
//! shared source; it reads the shared matmul parameter block and binds what the shared `coop`
//! kernel binds (`a`, `b`, the bias and residual of its epilogue, the output), so the planner
//! (`tessera-wgsl`'s `matmul.rs`) chooses between them per launch.
//!
//! Each workgroup owns one output tile of `tile[0] x tile[1]` ([`TensorMatmul::tile`]): over
//! its split's range of k it loads a `tile[0] x tile[2]` slice of `a` and a `tile[2] x
//! tile[1]` slice of `b` per step and multiplies them into an f32 accumulator, in a fixed
//! order (results are deterministic). A per-element function then finishes the sums as the
//! WGSL epilogue does (bias, activation, residual) and rounds bf16 outputs, before they are
//! converted to the output's dtype and stored. A transposed operand (contiguous along m, or
//! `b` along k) loads through a tensor view that swaps its two dimensions.
//!
//! **Causal bands.** Causal attention's backward products carry a
//! [`Band`](tessera_wgsl::Band): each tile's loop over k runs only where the mask leaves its
//! operand non-zero, and tiles of scores that no query sees are neither multiplied nor
//! stored. On the H200 (GPT-2's bf16 step) the scores' products went from 4.1 to 3.0 ms, the
//! gradients' from 7.9 to 6.7: with 256-row tiles a triangle keeps about 60% of the tiles'
//! k, and the scores' products are bound by their f32 stores.
//!
//! **Compiled per product.** Where its tiles cover the product exactly, the planner lets the
//! backend compile this kernel for the launch's parameter block (`Dispatch::specialize`): its
//! sizes, strides and offsets become constants (a pipeline per distinct block, about 20 in a
//! GPT-2 training step, each compiled in 0.1 to 1.3 s once and then kept by the driver's cache
//! on disk), and its loads and stores do not clamp ([`tiles_cover`]), from operands declared
//! as 16-byte vectors so that their pointers are known aligned. NVIDIA's compiler lays out the
//! loads far better for sizes it knows. Other products (an LM head's odd vocabulary, prompts
//! of any length) read their parameters, and tensor layouts clamp: elements past the matrix
//! (its edges, the split's end of k) load as zero, and stores past it are dropped.
//!
//! On the H100 at 4096^3 in f16 (TFLOP/s): reading the block 151; constant 253; with the
//! 128 x 256 tile 267; unclamped stores too 283 (bf16 290). Unclamped loads without constant
//! sizes ran at a third of the speed. NVIDIA's own reference kernels
//! (vk_cooperative_matrix_perf) reach 280 to 292 on the same device, so this is about what
//! Vulkan offers there: the driver's cooperative matrices multiply at about 610 held in
//! registers and 520 fed from padded workgroup memory (`examples/tensor_core_peak.rs`), and
//! a workgroup may have only 48 KiB of that memory. A kernel staging the operands itself
//! (16-byte loads into padded workgroup tiles of two stages) reached 100 to 134 when it read
//! its sizes, and tiles of 64 k or loop bodies unrolled by hand ran slower
//! (`benches/README.md`). (WGSL cannot express a self-staging kernel at all: naga types a
//! cooperative load by the scalar its pointer points to, so a tile stored as words cannot be
//! loaded as halves.)

use std::collections::HashMap;

use rspirv::binary::Assemble;
use rspirv::dr::{Builder, Operand};
use rspirv::spirv::{
    AddressingModel, BuiltIn, Capability, Decoration, ExecutionMode, ExecutionModel, FPEncoding,
    FunctionControl, MemoryAccess, MemoryModel, Op, Scope, SelectionControl, StorageClass,
    TensorAddressingOperands, TensorClampMode, Word,
};
use tessera_core::{DType, UnaryOp};
use tessera_wgsl::{matmul_param_word, matmul_param_words, BandKind, TensorMatmul, MAX_BATCH_DIMS};

/// `CooperativeMatrixUse` values.
pub(crate) const USE_A: u32 = 0;
pub(crate) const USE_B: u32 = 1;
pub(crate) const USE_ACCUMULATOR: u32 = 2;
/// The matmul parameter block's batch dimensions.
const BATCH_DIMS: u32 = MAX_BATCH_DIMS as u32;

/// The kernel's SPIR-V words, reading its parameter block, or compiled for the block `fixed`
/// alone; or what stops it (a dtype it does not take, or a parameter the block lacks).
pub(crate) fn spirv(kernel: &TensorMatmul, fixed: Option<&[u32]>) -> Result<Vec<u32>, String> {
    let input = scalar(kernel.input)?;
    if input == Scalar::F32 {
        return Err("a tensor-core matmul of f32 operands".into());
    }
    let output = scalar(kernel.output)?;
    let mut writer = Writer::new(
        input,
        output,
        ParamBlock {
            words: matmul_param_words(),
            word_of: matmul_param_word,
        },
    );
    writer.fixed = fixed.map(<[u32]>::to_vec);
    writer.module(kernel)
}

/// Whether the tiles of `kernel` cover the product of parameter block `words` exactly
/// ([`TensorMatmul::covers`]).
fn tiles_cover(kernel: &TensorMatmul, words: &[u32]) -> bool {
    let word = |field| matmul_param_word(field).and_then(|at| words.get(at).copied());
    match [word("m"), word("n"), word("k"), word("k_per_split")] {
        [Some(m), Some(n), Some(k), Some(k_per_split)] => {
            kernel.covers(m as usize, n as usize, k as usize, k_per_split as usize)
        }
        _ => false,
    }
}

/// The kernel's declaration of dtype `d`.
pub(crate) fn scalar(d: DType) -> Result<Scalar, String> {
    match d {
        DType::F32 => Ok(Scalar::F32),
        DType::F16 => Ok(Scalar::F16),
        DType::BF16 => Ok(Scalar::BF16),
        _ => Err(format!("a tensor-core matmul with {} values", d.name())),
    }
}

/// A dtype as the kernel declares it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Scalar {
    F32,
    F16,
    BF16,
}

impl Scalar {
    fn bytes(self) -> u32 {
        match self {
            Scalar::F32 => 4,
            _ => 2,
        }
    }
}

/// A kernel's parameter block: how many words, and where each field's first word is.
#[derive(Clone, Copy)]
pub(crate) struct ParamBlock {
    pub(crate) words: usize,
    pub(crate) word_of: fn(&str) -> Option<usize>,
}

/// The builder and the ids it has handed out for types and constants; the tensor-core
/// attention (`tensor_attention.rs`) writes its kernel with it too.
pub(crate) struct Writer {
    pub(crate) b: Builder,
    input: Scalar,
    output: Scalar,
    pub(crate) u32: Word,
    pub(crate) bool: Word,
    floats: HashMap<Scalar, Word>,
    constants: HashMap<u32, Word>,
    /// The parameter block the kernel reads.
    block: ParamBlock,
    /// The push-constant block of parameter words and its element pointer type.
    params: Word,
    param_ptr: Word,
    /// The per-element function finishing each output (id, type), once asked for.
    finish_fn: Option<(Word, Word)>,
    /// The bias's and the residual's buffers and dtypes, where the epilogue reads them.
    bias: Option<(Word, Scalar)>,
    residual: Option<(Word, Scalar)>,
    /// f32 constants by their bits, and the GLSL.std.450 instruction set.
    float_constants: HashMap<u32, Word>,
    glsl: Option<Word>,
    /// The parameter block the kernel is compiled for, its words constants; `None` where it
    /// reads them.
    pub(crate) fixed: Option<Vec<u32>>,
}

/// What the loop over k of a tile needs: matrix types (`a`, `b`, sum), zero matrices, the
/// transposing view, the sum's and k's variables, the tile's
/// first row, column and k, the extents (m, n, the split's end of k), and where the loop
/// stops (the split's end of k, or before it where a [`Band`](tessera_wgsl::Band) leaves the rest out).
struct Steps {
    kernel: TensorMatmul,
    mats: [Word; 3],
    zeros: [Word; 2],
    transpose: Word,
    sum_var: Word,
    k_var: Word,
    origin: [Word; 3],
    extents: [Word; 3],
    k_until: Word,
    /// Whether the tiles cover the product exactly ([`tiles_cover`]): loads need no clamping.
    exact: bool,
}

impl Writer {
    pub(crate) fn new(input: Scalar, output: Scalar, block: ParamBlock) -> Writer {
        let mut b = Builder::new();
        b.set_version(1, 6);
        let u32 = b.type_int(32, 0);
        let bool = b.type_bool();
        Writer {
            b,
            input,
            output,
            u32,
            bool,
            floats: HashMap::new(),
            constants: HashMap::new(),
            block,
            params: 0,
            param_ptr: 0,
            finish_fn: None,
            bias: None,
            residual: None,
            float_constants: HashMap::new(),
            glsl: None,
            fixed: None,
        }
    }

    pub(crate) fn float(&mut self, s: Scalar) -> Word {
        if let Some(&t) = self.floats.get(&s) {
            return t;
        }
        let t = match s {
            Scalar::F32 => self.b.type_float(32, None),
            Scalar::F16 => self.b.type_float(16, None),
            Scalar::BF16 => self.b.type_float(16, Some(FPEncoding::BFloat16KHR)),
        };
        self.floats.insert(s, t);
        t
    }

    pub(crate) fn uint(&mut self, v: u32) -> Word {
        if let Some(&c) = self.constants.get(&v) {
            return c;
        }
        let c = self.b.constant_bit32(self.u32, v);
        self.constants.insert(v, c);
        c
    }

    /// A workgroup-scope cooperative matrix type.
    pub(crate) fn matrix(&mut self, s: Scalar, rows: u32, columns: u32, usage: u32) -> Word {
        let component = self.float(s);
        let scope = self.uint(Scope::Workgroup as u32);
        let (rows, columns, usage) = (self.uint(rows), self.uint(columns), self.uint(usage));
        self.b
            .type_cooperative_matrix_khr(component, scope, rows, columns, usage)
    }

    /// A matrix of `matrix` type with every element zero.
    pub(crate) fn zeros(&mut self, s: Scalar, matrix: Word) -> Word {
        let t = self.float(s);
        let zero = self.b.constant_null(t);
        self.b.constant_composite(matrix, [zero])
    }

    /// A storage buffer of `s` values at set 1, `binding`, declared as an array of 16-byte
    /// vectors where `vectors` (tensor loads then know their pointers are aligned).
    pub(crate) fn buffer(
        &mut self,
        s: Scalar,
        binding: u32,
        writable: bool,
        vectors: bool,
    ) -> Word {
        let (element, stride) = if vectors {
            (self.vector16(), 16)
        } else {
            (self.float(s), s.bytes())
        };
        // One array and block type per binding, so that each takes its own decorations.
        let array = self.b.id();
        let inst = rspirv::dr::Instruction::new(
            Op::TypeRuntimeArray,
            None,
            Some(array),
            vec![Operand::IdRef(element)],
        );
        self.b.module_mut().types_global_values.push(inst);
        let block = self.b.type_struct([array]);
        self.b.decorate(
            array,
            Decoration::ArrayStride,
            [Operand::LiteralBit32(stride)],
        );
        self.b.decorate(block, Decoration::Block, []);
        self.b
            .member_decorate(block, 0, Decoration::Offset, [Operand::LiteralBit32(0)]);
        let pointer = self
            .b
            .type_pointer(None, StorageClass::StorageBuffer, block);
        let var = self
            .b
            .variable(pointer, None, StorageClass::StorageBuffer, None);
        self.b
            .decorate(var, Decoration::DescriptorSet, [Operand::LiteralBit32(1)]);
        self.b
            .decorate(var, Decoration::Binding, [Operand::LiteralBit32(binding)]);
        if writable {
            self.b.decorate(var, Decoration::NonReadable, []);
        } else {
            self.b.decorate(var, Decoration::NonWritable, []);
        }
        var
    }

    /// A read-only buffer of dtype `d` at the binding after those in `interface`, added there.
    fn read_binding(
        &mut self,
        d: DType,
        interface: &mut Vec<Word>,
    ) -> Result<(Word, Scalar), String> {
        let s = scalar(d)?;
        let var = self.buffer(s, interface.len() as u32 + 1, false, false);
        interface.push(var);
        Ok((var, s))
    }

    /// The push-constant block: the parameter words as one array.
    pub(crate) fn declare_params(&mut self) -> Word {
        let count = self.uint(self.block.words as u32);
        let array = self.b.type_array(self.u32, count);
        self.b
            .decorate(array, Decoration::ArrayStride, [Operand::LiteralBit32(4)]);
        let block = self.b.type_struct([array]);
        self.b.decorate(block, Decoration::Block, []);
        self.b
            .member_decorate(block, 0, Decoration::Offset, [Operand::LiteralBit32(0)]);
        let pointer = self.b.type_pointer(None, StorageClass::PushConstant, block);
        self.params = self
            .b
            .variable(pointer, None, StorageClass::PushConstant, None);
        self.param_ptr = self
            .b
            .type_pointer(None, StorageClass::PushConstant, self.u32);
        self.params
    }

    /// Loads parameter word `field` (plus `index` for an array's element).
    pub(crate) fn param(&mut self, field: &str, index: u32) -> Result<Word, String> {
        let at = (self.block.word_of)(field)
            .ok_or_else(|| format!("the parameter block lacks `{field}`"))? as u32
            + index;
        if let Some(words) = &self.fixed {
            let value = *words
                .get(at as usize)
                .ok_or_else(|| format!("the fixed parameter block has no word {at} (`{field}`)"))?;
            return Ok(self.uint(value));
        }
        let (zero, at) = (self.uint(0), self.uint(at));
        let ptr = self
            .b
            .access_chain(self.param_ptr, None, self.params, [zero, at])
            .map_err(build)?;
        self.b.load(self.u32, None, ptr, None, []).map_err(build)
    }

    /// An instruction `op` of result type `t` on the ids `operands`, at the end of the block.
    pub(crate) fn inst(&mut self, op: Op, t: Word, operands: &[Word]) -> Result<Word, String> {
        let r = self.b.id();
        let operands = operands.iter().map(|&id| Operand::IdRef(id)).collect();
        let inst = rspirv::dr::Instruction::new(op, Some(t), Some(r), operands);
        self.b
            .insert_into_block(rspirv::dr::InsertPoint::End, inst)
            .map_err(build)?;
        Ok(r)
    }

    /// A `u32` operation on `x` and `y`.
    pub(crate) fn op(&mut self, op: Op, x: Word, y: Word) -> Result<Word, String> {
        self.inst(op, self.u32, &[x, y])
    }

    pub(crate) fn add(&mut self, x: Word, y: Word) -> Result<Word, String> {
        self.op(Op::IAdd, x, y)
    }

    pub(crate) fn mul(&mut self, x: Word, y: Word) -> Result<Word, String> {
        self.op(Op::IMul, x, y)
    }

    pub(crate) fn min(&mut self, x: Word, y: Word) -> Result<Word, String> {
        let less = self.b.u_less_than(self.bool, None, x, y).map_err(build)?;
        self.b.select(self.u32, None, less, x, y).map_err(build)
    }

    /// A tensor layout of clamp mode `clamp` with dimensions `dims` and strides `strides`
    /// (outer first).
    pub(crate) fn layout(
        &mut self,
        clamp: TensorClampMode,
        dims: [Word; 2],
        strides: [Word; 2],
    ) -> Result<Word, String> {
        let t = self.layout_type(clamp);
        let layout = self.b.create_tensor_layout_nv(t, None).map_err(build)?;
        let layout = self
            .b
            .tensor_layout_set_dimension_nv(t, None, layout, dims)
            .map_err(build)?;
        self.b
            .tensor_layout_set_stride_nv(t, None, layout, strides)
            .map_err(build)
    }

    fn layout_type(&mut self, clamp: TensorClampMode) -> Word {
        let (two, clamp) = (self.uint(2), self.uint(clamp as u32));
        self.b.type_tensor_layout_nv(two, clamp)
    }

    /// `layout` cut to `[at[0], at[0] + size[0]) x [at[1], at[1] + size[1])`.
    pub(crate) fn slice(
        &mut self,
        layout: Word,
        clamp: TensorClampMode,
        at: [Word; 2],
        size: [u32; 2],
    ) -> Result<Word, String> {
        let t = self.layout_type(clamp);
        let (s0, s1) = (self.uint(size[0]), self.uint(size[1]));
        self.b
            .tensor_layout_slice_nv(t, None, layout, [at[0], s0, at[1], s1])
            .map_err(build)
    }

    fn module(mut self, kernel: &TensorMatmul) -> Result<Vec<u32>, String> {
        let [tm, tn, tk] = kernel.tile();
        let epilogue =
            kernel.bias.is_some() || kernel.residual.is_some() || kernel.activation.is_some();
        let finishing = epilogue || self.output == Scalar::BF16;
        let per_element: &[Capability] = if finishing {
            &[Capability::CooperativeMatrixPerElementOperationsNV]
        } else {
            &[]
        };
        self.declare_module(per_element);

        let (input, output) = (self.input, self.output);
        let mat_a = self.matrix(input, tm, tk, USE_A);
        let mat_b = self.matrix(input, tk, tn, USE_B);
        let acc = self.matrix(Scalar::F32, tm, tn, USE_ACCUMULATOR);
        let out_mat = self.matrix(output, tm, tn, USE_ACCUMULATOR);
        let zero_a = self.zeros(input, mat_a);
        let zero_b = self.zeros(input, mat_b);
        let zero_acc = self.zeros(Scalar::F32, acc);
        // Tiles covering the product exactly load without clamping, from operands declared as
        // 16-byte vectors (`aligned`): both only pay where the sizes are constants.
        let exact = self
            .fixed
            .as_deref()
            .is_some_and(|words| tiles_cover(kernel, words));
        let a_var = self.buffer(input, 1, false, exact);
        let b_var = self.buffer(input, 2, false, exact);
        let mut interface = vec![a_var, b_var];
        // The epilogue's inputs take the bindings after `b`, in order.
        self.bias = kernel
            .bias
            .map(|d| self.read_binding(d, &mut interface))
            .transpose()?;
        self.residual = kernel
            .residual
            .map(|d| self.read_binding(d, &mut interface))
            .transpose()?;
        let o_var = self.buffer(output, interface.len() as u32 + 1, true, false);
        let params = self.declare_params();
        let (wid_var, uvec3) = self.workgroup_id();
        let one = self.uint(1);
        let view_t = self.transpose_view_type();
        let acc_ptr = self.b.type_pointer(None, StorageClass::Function, acc);
        let u32_ptr = self.b.type_pointer(None, StorageClass::Function, self.u32);
        let main = self.begin_entry()?;
        let sum_var = self.b.variable(acc_ptr, None, StorageClass::Function, None);
        let k_var = self.b.variable(u32_ptr, None, StorageClass::Function, None);

        // Which tile, batch entry and part of k this workgroup takes.
        let wid = self.b.load(uvec3, None, wid_var, None, []).map_err(build)?;
        let u = self.u32;
        let tile_n = self.b.composite_extract(u, None, wid, [0]).map_err(build)?;
        let tile_m = self.b.composite_extract(u, None, wid, [1]).map_err(build)?;
        let z = self.b.composite_extract(u, None, wid, [2]).map_err(build)?;
        let (c_tm, c_tn) = (self.uint(tm), self.uint(tn));
        let m0 = self.mul(tile_m, c_tm)?;
        let n0 = self.mul(tile_n, c_tn)?;
        let m = self.param("m", 0)?;
        let n = self.param("n", 0)?;
        let k = self.param("k", 0)?;
        let splits = self.param("splits", 0)?;
        let k_per_split = self.param("k_per_split", 0)?;
        let part = self.op(Op::UMod, z, splits)?;
        let entry = self.op(Op::UDiv, z, splits)?;
        let k_start = self.mul(part, k_per_split)?;
        let k_past = self.add(k_start, k_per_split)?;
        let k_end = self.min(k, k_past)?;

        // Element offsets of this batch entry in `a` and `b`, the innermost batch dimension
        // last, as the WGSL kernels' `batch_offsets`.
        let rank = self.param("batch_rank", 0)?;
        let mut rest = entry;
        let mut a_base = self.param("a_offset", 0)?;
        let mut b_base = self.param("b_offset", 0)?;
        let mut r_base = self.param("res_offset", 0)?;
        for d in (0..BATCH_DIMS).rev() {
            let cd = self.uint(d);
            let active = self
                .b
                .u_less_than(self.bool, None, cd, rank)
                .map_err(build)?;
            let size = self.param("batch_shape", d)?;
            let size = self.b.select(u, None, active, size, one).map_err(build)?;
            let index = self.op(Op::UMod, rest, size)?;
            rest = self.op(Op::UDiv, rest, size)?;
            let zero = self.uint(0);
            let index = self.b.select(u, None, active, index, zero).map_err(build)?;
            let a_stride = self.param("a_batch_strides", d)?;
            let b_stride = self.param("b_batch_strides", d)?;
            let a_step = self.mul(index, a_stride)?;
            let b_step = self.mul(index, b_stride)?;
            a_base = self.add(a_base, a_step)?;
            b_base = self.add(b_base, b_step)?;
            if self.residual.is_some() {
                let r_stride = self.param("res_batch_strides", d)?;
                let r_step = self.mul(index, r_stride)?;
                r_base = self.add(r_base, r_step)?;
            }
        }
        let mn = self.mul(m, n)?;
        let out_step = self.mul(z, mn)?;
        let out_offset = self.param("out_offset", 0)?;
        let o_base = self.add(out_offset, out_step)?;

        // Every load and store goes through clamping layouts: loads of the same tiles
        // through layouts that do not clamp ran at half the speed on the H200 (72 against
        // 144 TFLOP/s at 4096^3, f16), even with the alignment of strides and offsets stated,
        // and at a third on the H100 (46 against 152).
        let a_lead = if kernel.a_k_contiguous {
            self.param("a_row_stride", 0)?
        } else {
            self.param("a_k_stride", 0)?
        };
        let b_lead = if kernel.b_k_contiguous {
            self.param("b_col_stride", 0)?
        } else {
            self.param("b_k_stride", 0)?
        };
        let transpose = self.b.create_tensor_view_nv(view_t, None).map_err(build)?;
        self.b.store(sum_var, zero_acc, None, []).map_err(build)?;
        let (k_from, k_until, hidden) = self.band_range(kernel, [m0, n0], [k_start, k_end])?;
        let steps = Steps {
            kernel: *kernel,
            mats: [mat_a, mat_b, acc],
            zeros: [zero_a, zero_b],
            transpose,
            sum_var,
            k_var,
            origin: [m0, n0, k_from],
            extents: [m, n, k_end],
            k_until,
            exact,
        };
        let (a_elem, a_rem) = self.aligned(input, a_var, a_base, exact)?;
        let (b_elem, b_rem) = self.aligned(input, b_var, b_base, exact)?;
        self.steps(&steps, [a_lead, b_lead], [a_elem, b_elem], [a_rem, b_rem])?;
        let mut sum = self.b.load(acc, None, sum_var, None, []).map_err(build)?;
        if finishing {
            let finish = self.finish_fn()?;
            let operands = [sum, finish, m0, n0, r_base];
            sum = self.inst(Op::CooperativeMatrixPerElementOpNV, acc, &operands)?;
        }
        let result = if output == Scalar::F32 {
            sum
        } else {
            self.b.f_convert(out_mat, None, sum).map_err(build)?
        };
        let (o_elem, o_rem) = self.aligned(output, o_var, o_base, false)?;
        let n_span = self.add(n, o_rem)?;
        let n_at = self.add(n0, o_rem)?;
        let clamp = if exact {
            TensorClampMode::Undefined
        } else {
            TensorClampMode::Constant
        };
        let layout_o = self.layout(clamp, [m, n_span], [n, one])?;
        let slice_o = self.slice(layout_o, clamp, [m0, n_at], [tm, tn])?;
        match hidden {
            // A tile of scores no query sees is not stored (the workgroup's branch is uniform).
            Some(hidden) => {
                let (store, merge) = (self.b.id(), self.b.id());
                self.b
                    .selection_merge(merge, SelectionControl::NONE)
                    .map_err(build)?;
                self.b
                    .branch_conditional(hidden, merge, store, [])
                    .map_err(build)?;
                self.b.begin_block(Some(store)).map_err(build)?;
                self.store_tensor(o_elem, result, slice_o)?;
                self.b.branch(merge).map_err(build)?;
                self.b.begin_block(Some(merge)).map_err(build)?;
            }
            None => self.store_tensor(o_elem, result, slice_o)?,
        }
        let finish = self.finish_fn;
        interface.extend([o_var, params, wid_var]);
        self.end_entry(main, interface, TensorMatmul::THREADS)?;
        if let Some((id, fn_t)) = finish {
            self.emit_finish(id, fn_t, kernel)?;
        }
        Ok(self.b.module().assemble())
    }

    /// Where the loop over k of the tile at rows and columns `origin` runs within the split's
    /// `k_range`: all of it, or the part its [`Band`](tessera_wgsl::Band) leaves in (steps of the tile's k apart
    /// from the split's start, so that exact tiles stay whole); and for scores, whether the
    /// tile is hidden whole (it then neither multiplies nor stores).
    fn band_range(
        &mut self,
        kernel: &TensorMatmul,
        origin: [Word; 2],
        k_range: [Word; 2],
    ) -> Result<(Word, Word, Option<Word>), String> {
        let ([m0, n0], [k_start, k_end]) = (origin, k_range);
        let Some(band) = kernel.band else {
            return Ok((k_start, k_end, None));
        };
        let [tm, _, tk] = kernel.tile();
        let u = self.u32;
        match band.kind {
            // Every key of the tile hidden from every query: no k at all.
            BandKind::Scores => {
                let last_seen = self.uint(tm - 1 + band.offset);
                let last_seen = self.add(m0, last_seen)?;
                let hidden = self
                    .b
                    .u_greater_than(self.bool, None, n0, last_seen)
                    .map_err(build)?;
                let until = self
                    .b
                    .select(u, None, hidden, k_start, k_end)
                    .map_err(build)?;
                Ok((k_start, until, Some(hidden)))
            }
            // Keys past the tile's last query's last visible one are zero.
            BandKind::QueryRows => {
                let reach = self.uint(tm + band.offset);
                let reach = self.add(m0, reach)?;
                Ok((k_start, self.min(k_end, reach)?, None))
            }
            // Queries before the tile's first key's first one are zero: from there, rounded
            // down to the split's steps.
            BandKind::KeyRows => {
                let offset = self.uint(band.offset);
                let seen = self
                    .b
                    .u_greater_than(self.bool, None, m0, offset)
                    .map_err(build)?;
                let first = self.op(Op::ISub, m0, offset)?;
                let zero = self.uint(0);
                let first = self.b.select(u, None, seen, first, zero).map_err(build)?;
                let later = self
                    .b
                    .u_greater_than(self.bool, None, first, k_start)
                    .map_err(build)?;
                let skipped = self.op(Op::ISub, first, k_start)?;
                let c_tk = self.uint(tk);
                let steps = self.op(Op::UDiv, skipped, c_tk)?;
                let skipped = self.mul(steps, c_tk)?;
                let from = self.add(k_start, skipped)?;
                let from = self
                    .b
                    .select(u, None, later, from, k_start)
                    .map_err(build)?;
                Ok((from, k_end, None))
            }
        }
    }

    /// The loop over k of one workgroup's tile: each step's slices of `a` and `b` loaded
    /// through clamping layouts (leading strides `leads`; from the 16-byte aligned
    /// `elements`, `rems` elements before each operand's first) and multiplied into the sum.
    /// One slice a step: four or eight (the loop unrolled by hand, as llama.cpp does) ran at
    /// 29-32 TFLOP/s against 152 on the H100.
    fn steps(
        &mut self,
        s: &Steps,
        leads: [Word; 2],
        elements: [Word; 2],
        rems: [Word; 2],
    ) -> Result<(), String> {
        let [tm, tn, tk] = s.kernel.tile();
        let [mat_a, mat_b, acc] = s.mats;
        let [m0, n0, k_start] = s.origin;
        let [m, n, k_end] = s.extents;
        let one = self.uint(1);
        let clamp = if s.exact {
            TensorClampMode::Undefined
        } else {
            TensorClampMode::Constant
        };
        // The contiguous dimension (the layouts' inner one) starts `rem` elements in.
        let (a_outer, a_inner) = if s.kernel.a_k_contiguous {
            (m, k_end)
        } else {
            (k_end, m)
        };
        let (b_outer, b_inner) = if s.kernel.b_k_contiguous {
            (n, k_end)
        } else {
            (k_end, n)
        };
        let a_inner = self.add(a_inner, rems[0])?;
        let b_inner = self.add(b_inner, rems[1])?;
        let layout_a = self.layout(clamp, [a_outer, a_inner], [leads[0], one])?;
        let layout_b = self.layout(clamp, [b_outer, b_inner], [leads[1], one])?;
        let u = self.u32;
        self.b.store(s.k_var, k_start, None, []).map_err(build)?;
        let (header, body, step, merge) = (self.b.id(), self.b.id(), self.b.id(), self.b.id());
        self.b.branch(header).map_err(build)?;

        self.b.begin_block(Some(header)).map_err(build)?;
        let k0 = self.b.load(u, None, s.k_var, None, []).map_err(build)?;
        let more = self
            .b
            .u_less_than(self.bool, None, k0, s.k_until)
            .map_err(build)?;
        self.b
            .loop_merge(merge, step, rspirv::spirv::LoopControl::NONE, [])
            .map_err(build)?;
        self.b
            .branch_conditional(more, body, merge, [])
            .map_err(build)?;

        self.b.begin_block(Some(body)).map_err(build)?;
        let slice_a = if s.kernel.a_k_contiguous {
            let k_at = self.add(k0, rems[0])?;
            self.slice(layout_a, clamp, [m0, k_at], [tm, tk])?
        } else {
            let m_at = self.add(m0, rems[0])?;
            self.slice(layout_a, clamp, [k0, m_at], [tk, tm])?
        };
        let slice_b = if s.kernel.b_k_contiguous {
            let k_at = self.add(k0, rems[1])?;
            self.slice(layout_b, clamp, [n0, k_at], [tn, tk])?
        } else {
            let n_at = self.add(n0, rems[1])?;
            self.slice(layout_b, clamp, [k0, n_at], [tk, tn])?
        };
        let x = self.load_tensor(
            mat_a,
            elements[0],
            s.zeros[0],
            slice_a,
            !s.kernel.a_k_contiguous,
            s.transpose,
        )?;
        let y = self.load_tensor(
            mat_b,
            elements[1],
            s.zeros[1],
            slice_b,
            s.kernel.b_k_contiguous,
            s.transpose,
        )?;
        let sum = self.b.load(acc, None, s.sum_var, None, []).map_err(build)?;
        let sum = self
            .b
            .cooperative_matrix_mul_add_khr(acc, None, x, y, sum, None)
            .map_err(build)?;
        self.b.store(s.sum_var, sum, None, []).map_err(build)?;
        self.b.branch(step).map_err(build)?;

        self.b.begin_block(Some(step)).map_err(build)?;
        let c_tk = self.uint(tk);
        let next = self.add(k0, c_tk)?;
        self.b.store(s.k_var, next, None, []).map_err(build)?;
        self.b.branch(header).map_err(build)?;
        self.b.begin_block(Some(merge)).map_err(build)?;
        Ok(())
    }

    /// The module's capabilities (with `extra`), extensions and memory model, for its input
    /// and output dtypes.
    pub(crate) fn declare_module(&mut self, extra: &[Capability]) {
        for &c in [
            Capability::Shader,
            Capability::VulkanMemoryModel,
            Capability::StorageBuffer16BitAccess,
            Capability::CooperativeMatrixKHR,
            Capability::TensorAddressingNV,
            Capability::CooperativeMatrixTensorAddressingNV,
        ]
        .iter()
        .chain(extra)
        {
            self.b.capability(c);
        }
        let bf16 = self.input == Scalar::BF16 || self.output == Scalar::BF16;
        if self.input == Scalar::F16 || self.output == Scalar::F16 {
            self.b.capability(Capability::Float16);
        }
        if bf16 {
            self.b.capability(Capability::BFloat16TypeKHR);
            self.b.capability(Capability::BFloat16CooperativeMatrixKHR);
        }
        for e in [
            "SPV_KHR_cooperative_matrix",
            "SPV_NV_cooperative_matrix2",
            "SPV_NV_tensor_addressing",
        ] {
            self.b.extension(e);
        }
        if bf16 {
            self.b.extension("SPV_KHR_bfloat16");
        }
        self.b
            .memory_model(AddressingModel::Logical, MemoryModel::Vulkan);
    }

    /// The `WorkgroupId` input variable and its `uvec3` type.
    pub(crate) fn workgroup_id(&mut self) -> (Word, Word) {
        let uvec3 = self.b.type_vector(self.u32, 3);
        (self.builtin_input(uvec3, BuiltIn::WorkgroupId), uvec3)
    }

    /// The `LocalInvocationIndex` input variable (a `u32`).
    pub(crate) fn local_index(&mut self) -> Word {
        self.builtin_input(self.u32, BuiltIn::LocalInvocationIndex)
    }

    /// An input variable of type `t` decorated as `builtin`.
    fn builtin_input(&mut self, t: Word, builtin: BuiltIn) -> Word {
        let in_ptr = self.b.type_pointer(None, StorageClass::Input, t);
        let var = self.b.variable(in_ptr, None, StorageClass::Input, None);
        self.b
            .decorate(var, Decoration::BuiltIn, [Operand::BuiltIn(builtin)]);
        var
    }

    /// The type of a tensor view that swaps a 2-D layout's dimensions.
    pub(crate) fn transpose_view_type(&mut self) -> Word {
        let (two, one, zero) = (self.uint(2), self.uint(1), self.uint(0));
        let no_dims = self.b.constant_false(self.bool);
        self.b.type_tensor_view_nv(two, no_dims, [one, zero])
    }

    /// Begins the entry point's function and its first block.
    pub(crate) fn begin_entry(&mut self) -> Result<Word, String> {
        let void = self.b.type_void();
        let fn_t = self.b.type_function(void, []);
        let entry = self
            .b
            .begin_function(void, None, FunctionControl::NONE, fn_t)
            .map_err(build)?;
        self.b.begin_block(None).map_err(build)?;
        Ok(entry)
    }

    /// Ends the entry point `entry` and declares it, over the variables of `interface`, for
    /// workgroups of `threads`.
    pub(crate) fn end_entry(
        &mut self,
        entry: Word,
        interface: Vec<Word>,
        threads: u32,
    ) -> Result<(), String> {
        self.b.ret().map_err(build)?;
        self.b.end_function().map_err(build)?;
        self.b
            .entry_point(ExecutionModel::GLCompute, entry, "main", interface);
        self.b
            .execution_mode(entry, ExecutionMode::LocalSize, [threads, 1, 1]);
        Ok(())
    }

    /// Stores `matrix` through `slice` from the aligned pointer `ptr`.
    pub(crate) fn store_tensor(
        &mut self,
        ptr: Word,
        matrix: Word,
        slice: Word,
    ) -> Result<(), String> {
        self.b
            .cooperative_matrix_store_tensor_nv(
                ptr,
                matrix,
                slice,
                MemoryAccess::NONE,
                TensorAddressingOperands::NONE,
                [],
            )
            .map_err(build)
    }

    /// A matrix of type `t` loaded from `ptr` through `slice`, elements outside it keeping
    /// `object`'s; through the `transpose` view where `transposed`.
    pub(crate) fn load_tensor(
        &mut self,
        t: Word,
        ptr: Word,
        object: Word,
        slice: Word,
        transposed: bool,
        transpose: Word,
    ) -> Result<Word, String> {
        let (operands, extra) = if transposed {
            (
                TensorAddressingOperands::TENSOR_VIEW,
                vec![Operand::IdRef(transpose)],
            )
        } else {
            (TensorAddressingOperands::NONE, vec![])
        };
        self.b
            .cooperative_matrix_load_tensor_nv(
                t,
                None,
                ptr,
                object,
                slice,
                MemoryAccess::NONE,
                operands,
                extra,
            )
            .map_err(build)
    }

    /// The id of the per-element function that finishes each output, emitted after the entry
    /// point: `(row, column, value, tile's first row, its first column, the residual's batch
    /// offset)`.
    fn finish_fn(&mut self) -> Result<Word, String> {
        if let Some((id, _)) = self.finish_fn {
            return Ok(id);
        }
        let (f32_t, u) = (self.float(Scalar::F32), self.u32);
        let fn_t = self.b.type_function(f32_t, [u, u, f32_t, u, u, u]);
        let id = self.b.id();
        self.finish_fn = Some((id, fn_t));
        Ok(id)
    }

    /// The finishing function, as the WGSL kernels' epilogue: the bias, the activation and
    /// the residual, then (bf16 outputs) rounding to nearest-even bf16, which makes the
    /// conversion exact whatever rounding the driver's conversion does. Rows and columns past
    /// the matrix read the last row or column (their outputs are not stored).
    fn emit_finish(&mut self, id: Word, fn_t: Word, kernel: &TensorMatmul) -> Result<(), String> {
        let (f32_t, u) = (self.float(Scalar::F32), self.u32);
        self.b
            .begin_function(f32_t, Some(id), FunctionControl::NONE, fn_t)
            .map_err(build)?;
        let row = self.b.function_parameter(u).map_err(build)?;
        let col = self.b.function_parameter(u).map_err(build)?;
        let mut v = self.b.function_parameter(f32_t).map_err(build)?;
        let m0 = self.b.function_parameter(u).map_err(build)?;
        let n0 = self.b.function_parameter(u).map_err(build)?;
        let r_base = self.b.function_parameter(u).map_err(build)?;
        self.b.begin_block(None).map_err(build)?;
        let one = self.uint(1);
        let (m, n) = (self.param("m", 0)?, self.param("n", 0)?);
        let (last_row, last_col) = (self.op(Op::ISub, m, one)?, self.op(Op::ISub, n, one)?);
        let gm = self.add(m0, row)?;
        let gm = self.min(gm, last_row)?;
        let gn = self.add(n0, col)?;
        let gn = self.min(gn, last_col)?;
        if let Some((var, s)) = self.bias {
            let stride = self.param("bias_stride", 0)?;
            let at = self.mul(gn, stride)?;
            let offset = self.param("bias_offset", 0)?;
            let at = self.add(offset, at)?;
            let x = self.load_value(var, s, at)?;
            v = self.inst(Op::FAdd, f32_t, &[v, x])?;
        }
        if let Some(activation) = kernel.activation {
            v = self.activate(activation, v)?;
        }
        if let Some((var, s)) = self.residual {
            let rows = self.param("res_row_stride", 0)?;
            let cols = self.param("res_col_stride", 0)?;
            let down = self.mul(gm, rows)?;
            let across = self.mul(gn, cols)?;
            let at = self.add(r_base, down)?;
            let at = self.add(at, across)?;
            let x = self.load_value(var, s, at)?;
            v = self.inst(Op::FAdd, f32_t, &[v, x])?;
        }
        if self.output == Scalar::BF16 {
            v = self.round_to_bf16(v)?;
        }
        self.b.ret_value(v).map_err(build)?;
        self.b.end_function().map_err(build)
    }

    /// Element `at` of buffer `var` (of `s` values) as f32.
    fn load_value(&mut self, var: Word, s: Scalar, at: Word) -> Result<Word, String> {
        let ptr = self.element_ptr(s, var, at)?;
        let t = self.float(s);
        let x = self.b.load(t, None, ptr, None, []).map_err(build)?;
        if s == Scalar::F32 {
            return Ok(x);
        }
        let f32_t = self.float(Scalar::F32);
        self.b.f_convert(f32_t, None, x).map_err(build)
    }

    pub(crate) fn constant(&mut self, v: f32) -> Word {
        if let Some(&c) = self.float_constants.get(&v.to_bits()) {
            return c;
        }
        let t = self.float(Scalar::F32);
        let c = self.b.constant_bit32(t, v.to_bits());
        self.float_constants.insert(v.to_bits(), c);
        c
    }

    /// GLSL.std.450 instruction `number` on `x`.
    pub(crate) fn glsl(&mut self, number: u32, x: Word) -> Result<Word, String> {
        let set = match self.glsl {
            Some(set) => set,
            None => {
                let set = self.b.ext_inst_import("GLSL.std.450");
                self.glsl = Some(set);
                set
            }
        };
        let t = self.float(Scalar::F32);
        self.b
            .ext_inst(t, None, set, number, [Operand::IdRef(x)])
            .map_err(build)
    }

    /// `activation` of `x`, as `common.wgsl` defines it (ReLU keeping NaN, GELU's tanh form
    /// with the same overflow-free tanh, SiLU).
    fn activate(&mut self, activation: UnaryOp, x: Word) -> Result<Word, String> {
        const EXP: u32 = 27;
        const FABS: u32 = 4;
        let (f, b) = (self.float(Scalar::F32), self.bool);
        let (zero, one) = (self.constant(0.0), self.constant(1.0));
        match activation {
            UnaryOp::Relu => {
                let above = self.inst(Op::FOrdGreaterThan, b, &[x, zero])?;
                let nan = self.inst(Op::IsNan, b, &[x])?;
                let keep = self.inst(Op::LogicalOr, b, &[above, nan])?;
                self.inst(Op::Select, f, &[keep, x, zero])
            }
            UnaryOp::Silu => {
                let neg = self.inst(Op::FNegate, f, &[x])?;
                let e = self.glsl(EXP, neg)?;
                let d = self.inst(Op::FAdd, f, &[one, e])?;
                self.inst(Op::FDiv, f, &[x, d])
            }
            UnaryOp::Gelu => {
                // 0.044715 * x * x * x, multiplied in WGSL's order.
                let c = self.constant(0.044715);
                let cx = self.inst(Op::FMul, f, &[c, x])?;
                let cx2 = self.inst(Op::FMul, f, &[cx, x])?;
                let cx3 = self.inst(Op::FMul, f, &[cx2, x])?;
                let inner = self.inst(Op::FAdd, f, &[x, cx3])?;
                let k = self.constant(0.797_884_6);
                let y = self.inst(Op::FMul, f, &[k, inner])?;
                // tanh(y) from exp(-2 |y|), small |y| as y.
                let ay = self.glsl(FABS, y)?;
                let minus_two = self.constant(-2.0);
                let arg = self.inst(Op::FMul, f, &[minus_two, ay])?;
                let e = self.glsl(EXP, arg)?;
                let num = self.inst(Op::FSub, f, &[one, e])?;
                let den = self.inst(Op::FAdd, f, &[one, e])?;
                let t = self.inst(Op::FDiv, f, &[num, den])?;
                let minus_t = self.inst(Op::FNegate, f, &[t])?;
                let negative = self.inst(Op::FOrdLessThan, b, &[y, zero])?;
                let t = self.inst(Op::Select, f, &[negative, minus_t, t])?;
                let tiny = self.constant(0.0004);
                let small = self.inst(Op::FOrdLessThan, b, &[ay, tiny])?;
                let t = self.inst(Op::Select, f, &[small, y, t])?;
                let half = self.constant(0.5);
                let hx = self.inst(Op::FMul, f, &[half, x])?;
                let one_t = self.inst(Op::FAdd, f, &[one, t])?;
                self.inst(Op::FMul, f, &[hx, one_t])
            }
            other => Err(format!("a tensor-core matmul with a {other:?} epilogue")),
        }
    }

    /// `x` rounded to the nearest bf16 value (ties to even; NaN stays NaN), still as f32.
    pub(crate) fn round_to_bf16(&mut self, x: Word) -> Result<Word, String> {
        let (f32_t, u) = (self.float(Scalar::F32), self.u32);
        let bits = self.b.bitcast(u, None, x).map_err(build)?;
        let sixteen = self.uint(16);
        let one = self.uint(1);
        let odd = self.op(Op::ShiftRightLogical, bits, sixteen)?;
        let odd = self.op(Op::BitwiseAnd, odd, one)?;
        let half = self.uint(0x7fff);
        let biased = self.add(bits, half)?;
        let biased = self.add(biased, odd)?;
        let high = self.uint(0xffff_0000);
        let rounded = self.op(Op::BitwiseAnd, biased, high)?;
        let quiet = self.uint(0x0040_0000);
        let quiet = self.op(Op::BitwiseOr, bits, quiet)?;
        let quiet = self.op(Op::BitwiseAnd, quiet, high)?;
        let nan = self.b.is_nan(self.bool, None, x).map_err(build)?;
        let chosen = self.b.select(u, None, nan, quiet, rounded).map_err(build)?;
        self.b.bitcast(f32_t, None, chosen).map_err(build)
    }

    /// A 16-byte aligned pointer into the array of buffer `var` (of `s` values, or of 16-byte
    /// vectors where `vectors`) at or before element `at`, and how many elements before `at`
    /// it is: tensor loads and stores take aligned pointers only.
    pub(crate) fn aligned(
        &mut self,
        s: Scalar,
        var: Word,
        at: Word,
        vectors: bool,
    ) -> Result<(Word, Word), String> {
        let per_vector = 16 / s.bytes();
        let mask = self.uint(per_vector - 1);
        let rem = self.op(Op::BitwiseAnd, at, mask)?;
        if vectors {
            let shift = self.uint(per_vector.trailing_zeros());
            let vector = self.op(Op::ShiftRightLogical, at, shift)?;
            let t = self.vector16();
            let ptr = self.b.type_pointer(None, StorageClass::StorageBuffer, t);
            let zero = self.uint(0);
            let ptr = self
                .b
                .access_chain(ptr, None, var, [zero, vector])
                .map_err(build)?;
            return Ok((ptr, rem));
        }
        let start = self.op(Op::ISub, at, rem)?;
        Ok((self.element_ptr(s, var, start)?, rem))
    }

    /// The 16-byte vector type, four `u32`.
    fn vector16(&mut self) -> Word {
        let u = self.u32;
        self.b.type_vector(u, 4)
    }

    /// A pointer to element `at` of a buffer's array, where a tensor layout's element 0 is.
    pub(crate) fn element_ptr(&mut self, s: Scalar, var: Word, at: Word) -> Result<Word, String> {
        let zero = self.uint(0);
        let element = self.float(s);
        let ptr = self
            .b
            .type_pointer(None, StorageClass::StorageBuffer, element);
        self.b
            .access_chain(ptr, None, var, [zero, at])
            .map_err(build)
    }
}

/// A builder error as text.
pub(crate) fn build(e: rspirv::dr::Error) -> String {
    format!("building a tensor-core kernel: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_wgsl::Band;

    /// A kernel without an epilogue: `[input, output]` dtypes, whether `a` and `b` are
    /// contiguous along k, whether narrow.
    fn plain(dtypes: [DType; 2], k_contiguous: [bool; 2], narrow: bool) -> TensorMatmul {
        TensorMatmul {
            input: dtypes[0],
            output: dtypes[1],
            a_k_contiguous: k_contiguous[0],
            b_k_contiguous: k_contiguous[1],
            narrow,
            bias: None,
            activation: None,
            residual: None,
            band: None,
        }
    }

    fn every_kernel() -> Vec<TensorMatmul> {
        let mut all = Vec::new();
        for input in [DType::F16, DType::BF16] {
            for output in [DType::F32, input] {
                for a_k_contiguous in [true, false] {
                    for b_k_contiguous in [true, false] {
                        for narrow in [false, true] {
                            let contiguous = [a_k_contiguous, b_k_contiguous];
                            all.push(plain([input, output], contiguous, narrow));
                        }
                    }
                }
            }
            // Causal attention's bands, on the layouts its products take.
            let bands = [
                (BandKind::Scores, [true, true], false, DType::F32),
                (BandKind::QueryRows, [true, false], true, input),
                (BandKind::KeyRows, [false, false], true, DType::F32),
            ];
            for (kind, contiguous, narrow, output) in bands {
                for offset in [0, 64] {
                    all.push(TensorMatmul {
                        band: Some(Band { kind, offset }),
                        ..plain([input, output], contiguous, narrow)
                    });
                }
            }
            // Epilogues: a bias (of the output's dtype, or f32), each activation, a residual.
            let activations = [
                None,
                Some(UnaryOp::Relu),
                Some(UnaryOp::Gelu),
                Some(UnaryOp::Silu),
            ];
            for (i, activation) in activations.into_iter().enumerate() {
                all.push(TensorMatmul {
                    bias: Some(if i < 2 { input } else { DType::F32 }),
                    activation,
                    residual: (i != 1).then_some(input),
                    ..plain([input, input], [true, i % 2 == 0], false)
                });
            }
        }
        all
    }

    /// Every variant assembles into a module rspirv reads back, with one entry point.
    #[test]
    fn every_variant_is_a_module() {
        for kernel in every_kernel() {
            let words = spirv(&kernel, None).unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
            let module = rspirv::dr::load_words(&words).expect("reads back");
            assert_eq!(module.entry_points.len(), 1, "{kernel:?}");
        }
    }

    /// A parameter block of sizes `m x k x n` in one part, with row-major operands.
    fn block(m: u32, n: u32, k: u32) -> Vec<u32> {
        let mut words = vec![0; matmul_param_words()];
        for (field, value) in [
            ("m", m),
            ("n", n),
            ("k", k),
            ("splits", 1),
            ("k_per_split", k),
            ("a_row_stride", k),
            ("a_k_stride", 1),
            ("b_k_stride", n),
            ("b_col_stride", 1),
        ] {
            words[matmul_param_word(field).expect("a matmul parameter")] = value;
        }
        words
    }

    /// Compiled for a block, every variant is a module too, whether its tiles cover the
    /// product exactly (unclamped loads from vector-typed operands) or not; a block too short
    /// is refused.
    #[test]
    fn every_variant_compiles_for_a_fixed_block() {
        let [tm, tn, tk] = TensorMatmul::TILE;
        for kernel in every_kernel() {
            let exact = block(2 * tm, 3 * tn, 4 * tk);
            let ragged = block(tm + 1, tn, tk + 8);
            assert!(tiles_cover(&kernel, &exact), "{kernel:?}");
            assert!(!tiles_cover(&kernel, &ragged), "{kernel:?}");
            for words in [exact, ragged] {
                let words = spirv(&kernel, Some(&words)).unwrap_or_else(|e| panic!("{e}"));
                let module = rspirv::dr::load_words(&words).expect("reads back");
                assert_eq!(module.entry_points.len(), 1, "{kernel:?}");
            }
            let short = spirv(&kernel, Some(&[7; 3])).unwrap_err();
            assert!(short.contains("no word"), "{short}");
        }
    }

    /// f32 operands and integer outputs are refused with the dtype named.
    #[test]
    fn other_dtypes_are_refused() {
        let kernel = plain([DType::F32, DType::F32], [true, true], false);
        assert!(spirv(&kernel, None).unwrap_err().contains("f32"));
        let kernel = TensorMatmul {
            input: DType::F16,
            output: DType::I32,
            ..kernel
        };
        assert!(spirv(&kernel, None).unwrap_err().contains("i32"));
        let kernel = TensorMatmul {
            output: DType::F16,
            activation: Some(UnaryOp::Exp),
            ..kernel
        };
        assert!(spirv(&kernel, None).unwrap_err().contains("Exp"));
    }
}
