//! Tessera: train and run transformer language models on any GPU through one API.
//!
//! This umbrella crate re-exports [`tessera_core`] and links the backends enabled by cargo
//! features (`wgpu`, `vulkan`, `hip`; the CPU reference is always present), so their
//! registrations are visible to [`devices`] and [`open_device`].

pub mod cli;

pub use tessera_core::*;

pub use tessera_cpu;
#[cfg(feature = "hip")]
pub use tessera_hip;
#[cfg(feature = "vulkan")]
pub use tessera_vulkan;
#[cfg(feature = "wgpu")]
pub use tessera_wgpu;

/// The folder of shared fixtures, data and benchmark scripts: `TESSERA_SHARED`, else
/// `../shared` beside the workspace this crate was built from.
pub fn shared_dir() -> std::path::PathBuf {
    match std::env::var_os("TESSERA_SHARED") {
        Some(dir) if !dir.is_empty() => dir.into(),
        _ => std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared"),
    }
}

/// Backends compiled into this build, for `tessera devices` and error messages.
pub fn compiled_backends() -> Vec<&'static str> {
    let mut names = vec!["cpu"];
    if cfg!(feature = "wgpu") {
        names.push("wgpu");
    }
    if cfg!(feature = "vulkan") {
        names.push("vulkan");
    }
    if cfg!(feature = "hip") {
        names.push("hip");
    }
    names
}
