//! Backend-neutral execution: what every backend's launch of an op shares, so that a
//! backend holds only what is its own.
//!
//! - The op-to-family map is [`crate::Op::family`]; every dispatch matches on it.
//! - The catalog's dtype rules are [`crate::ops::check_dtypes`]; a backend adds only what its
//!   device lacks.
//! - [`KernelCache`]: a device's kernels by op and input dtypes.
//! - [`split`]: ops over tensors larger than one kernel binding, run as parts that fit,
//!   against the small [`PartLauncher`] trait (used by backends that bind windows of
//!   buffers: wgpu, and Vulkan through the same kernels crate).
//! - [`DiskCache`]: compiled kernels kept on disk between runs.
//! - [`unfused`]: fused ops run as the ops they fuse, where a backend has no fused kernel.

mod cache;
mod disk;
pub mod split;
pub mod unfused;

pub use cache::KernelCache;
pub use disk::{fnv1a, DiskCache};
pub use split::{binding_window, Part, PartLauncher};
