//! What the suite runs on and where it writes: the devices under test, the shared fixtures
//! folder, the target directory.

use std::path::PathBuf;
use std::sync::Arc;

use tessera::{Device, DeviceListing};

/// Every device present, narrowed to the backends named in `TESSERA_DEVICES`
/// (comma-separated backend names or device ids, e.g. `cpu,wgpu:0`). A name that matches no
/// device present fails the test that asked, so that a suite never passes over nothing
/// (`TESSERA_DEVICES=vulkan` without a Vulkan driver, say).
pub fn listings_under_test() -> Vec<DeviceListing> {
    let present = tessera::devices();
    let Some(names) = std::env::var("TESSERA_DEVICES")
        .ok()
        .filter(|s| !s.trim().is_empty())
    else {
        return present;
    };
    let names: Vec<&str> = names.split(',').map(str::trim).collect();
    let named = |d: &DeviceListing, w: &str| w == d.backend || w == d.id;
    for w in &names {
        assert!(
            present.iter().any(|d| named(d, w)),
            "TESSERA_DEVICES names {w:?}, but no such device is present (present: {})",
            present
                .iter()
                .map(|d| d.id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    present
        .into_iter()
        .filter(|d| names.iter().any(|w| named(d, w)))
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
