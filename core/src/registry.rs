//! Backend registration and device selection.
//!
//! Each backend crate submits a [`BackendEntry`] with `inventory::submit!`. Nothing here is
//! mutable: [`open_device`] returns a new device instance on every call, each with its own pool
//! and kernel cache.

use std::sync::Arc;

use crate::{Device, Error, Result};

/// A backend as it registers itself.
pub struct BackendEntry {
    /// The prefix of its device names (`cpu`, `wgpu`, ...).
    pub name: &'static str,
    /// Higher is preferred when no device is named.
    pub priority: i32,
    /// Lists the devices present, as human-readable names by ordinal. Must not panic when a
    /// driver or library is missing: it reports no devices instead.
    pub probe: fn() -> Vec<String>,
    /// Opens device `ordinal`.
    pub open: fn(usize) -> Result<Arc<dyn Device>>,
    /// Why the backend lists no devices, where it can tell (a driver library that is not
    /// installed, say), for `tessera devices`.
    pub why_absent: fn() -> Option<String>,
    /// Why the backend's devices cannot join collectives (data-parallel training), where
    /// they cannot: the collective library that is not installed, or that the backend has
    /// none. `None`: they can.
    pub why_no_collectives: fn() -> Option<String>,
}

inventory::collect!(BackendEntry);

/// A device found by probing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceListing {
    /// `backend:ordinal`.
    pub id: String,
    pub backend: &'static str,
    pub name: String,
    pub priority: i32,
}

fn entries() -> Vec<&'static BackendEntry> {
    let mut all: Vec<&BackendEntry> = inventory::iter::<BackendEntry>.into_iter().collect();
    all.sort_by(|a, b| b.priority.cmp(&a.priority).then(a.name.cmp(b.name)));
    all
}

/// Every device present, best first.
pub fn devices() -> Vec<DeviceListing> {
    let mut out = Vec::new();
    for e in entries() {
        for (ordinal, name) in (e.probe)().into_iter().enumerate() {
            out.push(DeviceListing {
                id: format!("{}:{ordinal}", e.name),
                backend: e.name,
                name,
                priority: e.priority,
            });
        }
    }
    out
}

/// For each compiled-in backend that lists no devices and can tell why, its name and the
/// reason.
pub fn absent_backends() -> Vec<(&'static str, String)> {
    entries()
        .into_iter()
        .filter(|e| (e.probe)().is_empty())
        .filter_map(|e| (e.why_absent)().map(|why| (e.name, why)))
        .collect()
}

/// Opens a device by name: `cpu`, `cpu:0`, `wgpu:1`. A bare backend name means ordinal 0.
pub fn open_device(spec: &str) -> Result<Arc<dyn Device>> {
    let (backend, ordinal) = match spec.split_once(':') {
        Some((b, o)) => {
            let ordinal = o.parse::<usize>().map_err(|_| Error::Device {
                name: spec.into(),
                detail: "expected backend:ordinal, e.g. cpu:0".into(),
            })?;
            (b, ordinal)
        }
        None => (spec, 0),
    };
    let entry = entry(spec, backend)?;
    let present = (entry.probe)();
    if ordinal >= present.len() {
        return Err(Error::Device {
            name: spec.into(),
            detail: format!("backend {backend} has {} device(s) present", present.len()),
        });
    }
    (entry.open)(ordinal)
}

/// The registered backend `backend` of device name `spec`, or an error that lists those
/// compiled in.
fn entry(spec: &str, backend: &str) -> Result<&'static BackendEntry> {
    let all = entries();
    all.iter()
        .find(|e| e.name == backend)
        .copied()
        .ok_or_else(|| Error::Device {
            name: spec.into(),
            detail: format!(
                "no such backend; compiled in: {} (enable others with cargo features)",
                all.iter().map(|e| e.name).collect::<Vec<_>>().join(", ")
            ),
        })
}

/// Checks before workers start that the devices named by `specs` can join collectives
/// together: one backend (whose collectives speak one protocol) that has them. The error
/// names the missing library, the backend without collectives or the backends that
/// differ, in one line.
pub fn check_collectives(specs: &[&str]) -> Result<()> {
    let backend_of = |spec: &str| spec.split_once(':').map_or(spec, |(b, _)| b).to_string();
    let Some(first) = specs.first() else {
        return Err(Error::invalid("data-parallel training", "names no device"));
    };
    let backend = backend_of(first);
    if let Some(other) = specs.iter().find(|s| backend_of(s) != backend) {
        return Err(Error::invalid(
            "data-parallel training",
            format!("every worker needs the same backend: {first} and {other} differ"),
        ));
    }
    if let Some(why) = (entry(first, &backend)?.why_no_collectives)() {
        return Err(Error::unsupported(
            &backend,
            format!("data-parallel training on {}: {why}", specs.join(",")),
        ));
    }
    Ok(())
}

/// The device named by `TESSERA_DEVICE`, else the best device present.
pub fn default_device() -> Result<Arc<dyn Device>> {
    if let Ok(spec) = std::env::var("TESSERA_DEVICE") {
        if !spec.is_empty() {
            return open_device(&spec);
        }
    }
    let best = devices().into_iter().next().ok_or_else(|| Error::Device {
        name: "default".into(),
        detail: "no backend reports a device".into(),
    })?;
    open_device(&best.id)
}

impl dyn Device {
    /// For each compiled-in backend that lists no devices and can tell why, its name and the
    /// reason.
    pub fn absent_backends() -> Vec<(&'static str, String)> {
        entries()
            .into_iter()
            .filter(|e| (e.probe)().is_empty())
            .filter_map(|e| (e.why_absent)().map(|why| (e.name, why)))
            .collect()
    }

    /// Opens a device by name; see [`open_device`].
    pub fn open(spec: &str) -> Result<Arc<dyn Device>> {
        open_device(spec)
    }
}
