//! What the suite runs on and where it writes: the devices under test, the shared fixtures
//! folder, the target directory.

use std::path::PathBuf;
use std::sync::Arc;

use tessera::{Device, DeviceListing};

/// Every device present, narrowed to the backends named in `TESSERA_DEVICES`
/// (comma-separated backend names or device ids, e.g. `cpu,wgpu:0`).
pub fn listings_under_test() -> Vec<DeviceListing> {
    let filter: Option<Vec<String>> = std::env::var("TESSERA_DEVICES")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(',').map(|p| p.trim().to_string()).collect());
    tessera::devices()
        .into_iter()
        .filter(|d| {
            filter
                .as_ref()
                .is_none_or(|f| f.iter().any(|w| *w == d.backend || *w == d.id))
        })
        .collect()
}

/// [`listings_under_test`], each opened once.
pub fn devices_under_test() -> Vec<Arc<dyn Device>> {
    listings_under_test()
        .into_iter()
        .map(|d| {
            tessera::open_device(&d.id)
                .unwrap_or_else(|e| panic!("{} is listed but does not open: {e}", d.id))
        })
        .collect()
}

/// Whether op `name` is under test: every op, or those named in `TESSERA_OPS` (a
/// comma-separated list, to narrow a run while working on some ops; tests that count rows
/// then fail).
pub fn op_under_test(name: &str) -> bool {
    std::env::var("TESSERA_OPS").map_or(true, |only| only.split(',').any(|o| o == name))
}

/// The workspace target directory: `CARGO_TARGET_DIR`, else `../target` of this crate.
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target"),
    }
}
