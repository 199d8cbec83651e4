//! Tessera core: the traits backends implement ([`Device`], [`Buffer`], [`Kernel`]), dtypes and
//! strided layouts, the op catalog ([`Op`]), the caching allocator, [`Tensor`] with define-by-run
//! autograd, and everything built on tensors: nn modules, models, optimizers, data,
//! checkpoints, generation, and data-parallel training ([`dist`]: collectives across
//! devices and hosts, which the trainer uses through [`train::Trainer::join`]).
//!
//! There is no global mutable state: devices own their pools and kernel caches, and the only
//! per-thread state is the `no_grad` depth.

pub mod checkpoint;
pub mod data;
mod device;
pub mod dist;
mod dtype;
mod error;
pub mod exec;
pub mod generate;
pub mod io;
mod layout;
pub mod memory;
pub mod models;
pub mod nn;
pub mod ops;
pub mod optim;
mod registry;
mod replay;
pub mod rng;
mod tensor;
pub mod train;

pub use device::{
    check_byte_range, same_device, Buffer, Device, DeviceInfo, Features, Kernel, KernelTime,
    KernelTotals, Limits, MemoryStats, PendingBytes, ReadyBytes, Recording, TensorRef,
};
pub use dtype::{decode_f64, encode_f64, DType, Element};
pub use error::{dtypes_str, Error, Result};
pub use layout::{broadcast_shapes, contiguous_strides, merge_dims, normalize_axis, numel, Layout};
pub use ops::{BinaryOp, CompareOp, Conv2dParams, Op, OpFamily, ReduceOp, TensorSpec, UnaryOp};
pub use registry::{
    absent_backends, check_collectives, default_device, devices, open_device, BackendEntry,
    DeviceListing,
};
pub use replay::ReplayedStep;
pub use tensor::{is_grad_enabled, no_grad, NoGradGuard, PendingVec, Tensor};

/// Re-exported so backend crates register with the same `inventory` as core.
pub use inventory;
