//! NCCL (NVIDIA) and RCCL (AMD), which exports the same C API, loaded at run time with
//! libloading: the backend builds without either, and a machine without one lists its
//! devices as usual and says which library data-parallel training lacks.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use libloading::Library;
use tessera_core::{DType, Error, Result};

/// `ncclUniqueId`: the bytes rank 0 makes and every rank passes to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId(pub(crate) [u8; UNIQUE_ID_BYTES]);

/// `NCCL_UNIQUE_ID_BYTES`, the same in NCCL and RCCL.
pub(crate) const UNIQUE_ID_BYTES: usize = 128;

/// `ncclComm_t`.
pub(crate) type Comm = *mut c_void;
type Status = c_int;

/// `ncclSum` of `ncclRedOp_t`.
pub(crate) const SUM: c_int = 0;

/// `ncclAllReduce` and `ncclBroadcast`: send and receive buffers, count, dtype, the
/// reduction or the root, communicator, stream.
pub(crate) type Call = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> Status;

/// The library's C functions the backend calls.
pub(crate) struct Nccl {
    _lib: Library,
    /// The library's name, for messages.
    pub(crate) name: &'static str,
    pub(crate) get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Status,
    pub(crate) comm_init_rank: unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> Status,
    pub(crate) all_reduce: Call,
    pub(crate) broadcast: Call,
    pub(crate) group_start: unsafe extern "C" fn() -> Status,
    pub(crate) group_end: unsafe extern "C" fn() -> Status,
    pub(crate) comm_destroy: unsafe extern "C" fn(Comm) -> Status,
    pub(crate) comm_abort: unsafe extern "C" fn(Comm) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
}

/// The library names of each vendor's collective library, most specific first.
fn names(backend: &str) -> &'static [&'static str] {
    match backend {
        "hip" => &["librccl.so.1", "librccl.so"],
        _ => &["libnccl.so.2", "libnccl.so"],
    }
}

/// The library a backend's collectives need, in words, for messages.
pub(crate) fn describe(backend: &str) -> &'static str {
    match backend {
        "hip" => "librccl (RCCL)",
        _ => "libnccl (NCCL)",
    }
}

/// The collective library of `backend` (`cuda`: NCCL, `hip`: RCCL), loaded once; an error
/// names the library when it is absent or lacks a function.
pub(crate) fn library(backend: &str) -> std::result::Result<&'static Nccl, String> {
    static NCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    static RCCL: OnceLock<std::result::Result<Nccl, String>> = OnceLock::new();
    let slot = if backend == "hip" { &RCCL } else { &NCCL };
    slot.get_or_init(|| load(backend))
        .as_ref()
        .map_err(Clone::clone)
}

fn load(backend: &str) -> std::result::Result<Nccl, String> {
    let found = names(backend).iter().find_map(|name| {
        // SAFETY: loading the collective library runs its initializers, which only set up
        // the library's own state.
        unsafe { Library::new(name) }.ok().map(|lib| (*name, lib))
    });
    let Some((name, lib)) = found else {
        return Err(format!("{} is not installed", describe(backend)));
    };
    fn sym<T: Copy>(lib: &Library, lib_name: &str, name: &str) -> std::result::Result<T, String> {
        // SAFETY: every call below names an NCCL C function whose type is `T` (nccl.h, the
        // same in RCCL's rccl.h).
        unsafe { lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("{lib_name} lacks {}: {e}", name.trim_end_matches('\0')))
    }
    Ok(Nccl {
        name,
        get_unique_id: sym(&lib, name, "ncclGetUniqueId\0")?,
        comm_init_rank: sym(&lib, name, "ncclCommInitRank\0")?,
        all_reduce: sym(&lib, name, "ncclAllReduce\0")?,
        broadcast: sym(&lib, name, "ncclBroadcast\0")?,
        group_start: sym(&lib, name, "ncclGroupStart\0")?,
        group_end: sym(&lib, name, "ncclGroupEnd\0")?,
        comm_destroy: sym(&lib, name, "ncclCommDestroy\0")?,
        comm_abort: sym(&lib, name, "ncclCommAbort\0")?,
        error_string: sym(&lib, name, "ncclGetErrorString\0")?,
        _lib: lib,
    })
}

impl Nccl {
    /// `Ok` for `ncclSuccess`, else an error with the library's words for `status`.
    pub(crate) fn check(&self, what: &str, status: Status) -> Result<()> {
        if status == 0 {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { CStr::from_ptr((self.error_string)(status)) };
        Err(Error::Collective {
            detail: format!("{what} ({}): {}", self.name, text.to_string_lossy()),
        })
    }
}

/// `ncclDataType_t` of a dtype (the same numbers in RCCL).
pub(crate) fn data_type(dtype: DType) -> c_int {
    match dtype {
        DType::Bool => 1,
        DType::I32 => 2,
        DType::U32 => 3,
        DType::F16 => 6,
        DType::F32 => 7,
        DType::F64 => 8,
        DType::BF16 => 9,
    }
}
