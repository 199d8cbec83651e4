//! Tessera's WGSL kernels and their planners, shared by the backends that run WGSL compute
//! kernels (wgpu today; Vulkan through naga's SPIR-V output).
//!
//! What this crate owns:
//! - the kernel sources, one file per op family under `kernels/`, and their assembly into one
//!   module per launch (`source.rs`): parameter block, shared helpers, bindings generated for
//!   the launch's dtypes, one `// @kernel NAME` section;
//! - typed kernel parameters (`params.rs`): each kernel's parameter block is a struct declared
//!   once with `param_block!`, beside its planner; the kernel reads `params.rows`, the planner
//!   fills `rows` by name, and the words are the fields in order (at most 64, what immediates
//!   hold). Shapes and strides are fixed-size arrays: 8 dimensions (6 batch dimensions for
//!   matmul) after merging those every operand steps through alike; an op past them is
//!   `Unsupported`, never truncated. The fields a family file's shared helpers read are in
//!   every block of that file (one block per file but for the optimizers' and creation ops');
//! - the family planners (`elementwise.rs`, `matmul.rs`, ...) that turn an op launch into
//!   dispatches: pipeline key, source, bindings, parameter words and grid ([`Dispatch`]);
//! - the splits that depend on how these kernels compute an op (matmul along K, convolutions
//!   over im2col columns, embedding over table rows); every other op past one binding splits
//!   through core's [`tessera_core::exec::split`], which calls back here for each part;
//! - ops composed of other kernels where that is faster: attention's backward as matmul
//!   products around a row pass on GPUs (`attention_products.rs`);
//! - two markers a kernel's source may carry for the backend that compiles it:
//!   [`INDICES_IN_RANGE`] (no index clamps needed) and [`F16_IS_BF16`] (its `f16` values are
//!   bf16, for a backend that can re-encode the type: Vulkan);
//! - the choice of a backend's own kernel where WGSL cannot say what makes one fast: a
//!   dispatch's [`Source`] is WGSL, a [`TensorMatmul`] or a [`TensorAttention`] (Vulkan's
//!   workgroup-scope cooperative matrices), each reading the parameter block of the WGSL
//!   kernels it stands in for ([`matmul_param_word`], [`attention_param_word`]).
//!
//! What it does not own: compiling, recording, submitting and synchronizing work, bind
//! groups, memory, host copies, profiling. A backend implements [`Gpu`] (capabilities,
//! scratch, one dispatch) and calls [`launch`]; it keeps its compiled kernels in a
//! [`PipelineCache`] by the dispatch's key.
//!
//! Kernels read and write every operand in place through its strides; data is f32, f16
//! (where the device has it) or bf16 (16 bits packed in `u32` words), with i32/u32 indices
//! and bool masks; arithmetic is f32 and 16-bit results round once, to nearest even.

mod attention;
mod attention_products;
mod cache;
mod conv;
mod dispatch;
mod elementwise;
mod epilogue;
mod gpu;
mod kernel;
mod loss;
mod matmul;
mod movement;
mod norm;
mod normed_rows;
mod optim;
mod params;
mod random;
mod reduce;
mod source;

pub use attention::{attention_param_word, attention_param_words};
pub use cache::PipelineCache;
pub use dispatch::{check_supported, launch};
pub use gpu::{
    device_dtypes, AttentionPass, Band, BandKind, Binding, Caps, Dispatch, Gpu, Source,
    TensorAttention, TensorMatmul, F16_IS_BF16, INDICES_IN_RANGE, WG,
};
pub use kernel::WgslKernel;
pub use matmul::{matmul_param_word, matmul_param_words, MAX_BATCH_DIMS};
