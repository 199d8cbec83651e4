//! Locks that survive a panicking holder, and the backend's own errors.

use std::sync::{Mutex, MutexGuard, PoisonError};

use tessera_core::Error;

/// Locks `m`, recovering from a panic of an earlier holder (its data stays consistent: every
/// critical section leaves it valid before anything that can panic).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn backend_err(detail: impl Into<String>) -> Error {
    Error::Backend {
        backend: "wgpu".into(),
        detail: detail.into(),
    }
}
