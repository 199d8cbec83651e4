//! hipBLASLt, AMD's counterpart of cuBLASLt, loaded at run time with libloading: the backend
//! builds without ROCm, and an AMD device without hipBLASLt still opens, its matmuls saying
//! which library they lack. The GEMMs are planned as on NVIDIA (`cuda.rs`): one descriptor,
//! three layouts and the heuristic's first algorithm per shape, kept for the driver's life.
//! **No AMD GPU has run this code**: it is compiled and unit-tested without one.
//!
//! Every number and struct layout here comes from the headers named beside it. They hold from
//! hipBLASLt 0.6 (ROCm 6.0) through 1.x (ROCm 7); ROCm 5's hipBLASLt (0.1 to 0.3) took
//! `hipblasDatatype_t` and its own `hipblasLtComputeType_t` (`HIPBLASLT_COMPUTE_F32 = 300`),
//! other numbers for the same calls, so a library older than 0.6 is refused by its version.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, OnceLock, PoisonError};

use libloading::Library;
use tessera_core::{DType, Error, Result};

use super::{driver_error, DevicePtr, Gemm};

const BACKEND: &str = "hip";

/// The library in words, for messages.
pub(crate) const DESCRIPTION: &str = "libhipblaslt (hipBLASLt)";

/// The library's names, newest first: the development link, then hipBLASLt 1.x (ROCm 7) and
/// 0.x (ROCm 6, or ROCm 5's, which the version check refuses).
const LIBRARY_NAMES: [&str; 3] = ["libhipblaslt.so", "libhipblaslt.so.1", "libhipblaslt.so.0"];

/// hipBLASLt's workspace, as cuBLASLt's on NVIDIA.
pub(crate) const WORKSPACE_BYTES: usize = 32 << 20;

/// hipBLASLt 0.6.0 (ROCm 6.0), the first whose C API takes `hipDataType` and
/// `hipblasComputeType_t`, as `hipblasLtGetVersion` encodes versions
/// (`major * 100000 + minor * 100 + patch`, library/src/amd_detail/hipblaslt.cpp).
const MIN_VERSION: c_int = 600;

/// Enum values of the C API, from the header named at each.
mod abi {
    use std::ffi::c_int;

    // hip/library_types.h (ROCm/HIP), `hipDataType`.
    pub const HIP_R_32F: c_int = 0;
    pub const HIP_R_16F: c_int = 2;
    pub const HIP_R_16BF: c_int = 14;

    // hipblas-common.h (ROCm/hipBLAS-common, ROCm 6.3 on; hipblas.h in ROCm 6.0 to 6.2, the
    // same numbers), `hipblasComputeType_t`. `_32F` is exact f32: TF32-like `xf32` is only
    // `HIPBLAS_COMPUTE_32F_FAST_TF32` (6).
    pub const HIPBLAS_COMPUTE_32F: c_int = 2;

    // hipblas-common.h, `hipblasOperation_t` (rocBLAS's numbers, not cuBLAS's 0 and 1).
    pub const HIPBLAS_OP_N: i32 = 111;
    pub const HIPBLAS_OP_T: i32 = 112;

    // hipblas-common.h, `hipblasStatus_t`.
    pub const HIPBLAS_STATUS_SUCCESS: c_int = 0;
    pub const STATUS_NAMES: [&str; 12] = [
        "HIPBLAS_STATUS_SUCCESS",
        "HIPBLAS_STATUS_NOT_INITIALIZED",
        "HIPBLAS_STATUS_ALLOC_FAILED",
        "HIPBLAS_STATUS_INVALID_VALUE",
        "HIPBLAS_STATUS_MAPPING_ERROR",
        "HIPBLAS_STATUS_EXECUTION_FAILED",
        "HIPBLAS_STATUS_INTERNAL_ERROR",
        "HIPBLAS_STATUS_NOT_SUPPORTED",
        "HIPBLAS_STATUS_ARCH_MISMATCH",
        "HIPBLAS_STATUS_HANDLE_IS_NULLPTR",
        "HIPBLAS_STATUS_INVALID_ENUM",
        "HIPBLAS_STATUS_UNKNOWN",
    ];

    // hipblaslt.h (ROCm/hipBLASLt, now ROCm/rocm-libraries projects/hipblaslt),
    // `hipblasLtMatmulDescAttributes_t`, with the value types its comments give.
    /// `int32_t`, a `hipblasOperation_t`.
    pub const MATMUL_DESC_TRANSA: c_int = 0;
    /// `int32_t`, a `hipblasOperation_t`.
    pub const MATMUL_DESC_TRANSB: c_int = 1;
    /// `uint32_t`, a `hipblasLtEpilogue_t`.
    pub const MATMUL_DESC_EPILOGUE: c_int = 2;
    /// `const void*`.
    pub const MATMUL_DESC_BIAS_POINTER: c_int = 3;
    /// `int32_t`, a `hipDataType`.
    pub const MATMUL_DESC_BIAS_DATA_TYPE: c_int = 4;

    // hipblaslt.h, `hipblasLtEpilogue_t`: the bias vector (one value per row of D) added to
    // every column.
    pub const EPILOGUE_BIAS: u32 = 4;

    // hipblaslt.h, `hipblasLtMatrixLayoutAttribute_t`.
    /// `int32_t`.
    pub const MATRIX_LAYOUT_BATCH_COUNT: c_int = 0;
    /// `int64_t`, in elements.
    pub const MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: c_int = 1;

    // hipblaslt.h, `hipblasLtMatmulPreferenceAttributes_t`. There is no alignment or
    // reduction-scheme preference as in cuBLASLt: the heuristic sees no pointers.
    /// `uint64_t`.
    pub const MATMUL_PREF_MAX_WORKSPACE_BYTES: c_int = 1;
}

/// `hipblasLtMatmulAlgo_t` (hipblaslt.h, AMD platform): 16 opaque bytes and the workspace
/// bound, 24 bytes in all. hipBLASLt writes it in the heuristic and reads it in the matmul.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct MatmulAlgo {
    data: [u8; 16],
    max_workspace_bytes: usize,
}

/// `hipblasLtMatmulHeuristicResult_t` (hipblaslt.h): the algorithm, its workspace, its
/// status (`hipblasStatus_t`, a C enum), its waves count and four reserved ints: 56 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct HeuristicResult {
    algo: MatmulAlgo,
    workspace_size: usize,
    state: c_int,
    waves_count: f32,
    reserved: [c_int; 4],
}

type Status = c_int;
type Handle = *mut c_void;
type MatmulDesc = *mut c_void;
type Layout = *mut c_void;
type Preference = *mut c_void;
type SetAttribute<T> = unsafe extern "C" fn(T, c_int, *const c_void, usize) -> Status;

/// The library's C functions the backend calls (hipblaslt.h).
pub(crate) struct HipBlasLt {
    _lib: Library,
    create: unsafe extern "C" fn(*mut Handle) -> Status,
    destroy: unsafe extern "C" fn(Handle) -> Status,
    get_version: unsafe extern "C" fn(Handle, *mut c_int) -> Status,
    /// `hipblasLtMatrixLayoutCreate(layout, hipDataType, rows, cols, ld)`.
    layout_create: unsafe extern "C" fn(*mut Layout, c_int, u64, u64, i64) -> Status,
    layout_destroy: unsafe extern "C" fn(Layout) -> Status,
    layout_set: SetAttribute<Layout>,
    /// `hipblasLtMatmulDescCreate(desc, hipblasComputeType_t, scale hipDataType)`.
    desc_create: unsafe extern "C" fn(*mut MatmulDesc, c_int, c_int) -> Status,
    desc_destroy: unsafe extern "C" fn(MatmulDesc) -> Status,
    desc_set: SetAttribute<MatmulDesc>,
    pref_create: unsafe extern "C" fn(*mut Preference) -> Status,
    pref_destroy: unsafe extern "C" fn(Preference) -> Status,
    pref_set: SetAttribute<Preference>,
    /// `hipblasLtMatmulAlgoGetHeuristic(handle, desc, A, B, C, D, pref, requested, results,
    /// returned)`.
    #[allow(clippy::type_complexity)]
    heuristic: unsafe extern "C" fn(
        Handle,
        MatmulDesc,
        Layout,
        Layout,
        Layout,
        Layout,
        Preference,
        c_int,
        *mut HeuristicResult,
        *mut c_int,
    ) -> Status,
    /// `hipblasLtMatmul(handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc,
    /// algo, workspace, workspace bytes, stream)`.
    #[allow(clippy::type_complexity)]
    matmul: unsafe extern "C" fn(
        Handle,
        MatmulDesc,
        *const c_void,
        *const c_void,
        Layout,
        *const c_void,
        Layout,
        *const c_void,
        *const c_void,
        Layout,
        *mut c_void,
        Layout,
        *const MatmulAlgo,
        *mut c_void,
        usize,
        *mut c_void,
    ) -> Status,
}

/// hipBLASLt, loaded once; the error names the library when it is absent or lacks a
/// function. Loading it runs its initializers: callers take the HIP runtime's turns first
/// (`amd.rs`).
pub(crate) fn library() -> std::result::Result<&'static HipBlasLt, String> {
    static LIB: OnceLock<std::result::Result<HipBlasLt, String>> = OnceLock::new();
    LIB.get_or_init(|| load(&LIBRARY_NAMES))
        .as_ref()
        .map_err(Clone::clone)
}

fn load(names: &[&'static str]) -> std::result::Result<HipBlasLt, String> {
    let found = names.iter().find_map(|name| {
        // SAFETY: loading hipBLASLt runs its initializers, which only set up the library's own
        // state.
        unsafe { Library::new(name) }.ok().map(|lib| (*name, lib))
    });
    let Some((name, lib)) = found else {
        return Err(format!("{DESCRIPTION} is not installed"));
    };
    fn sym<T: Copy>(lib: &Library, lib_name: &str, name: &str) -> std::result::Result<T, String> {
        // SAFETY: every call below names a hipBLASLt C function whose type is `T`
        // (hipblaslt.h, the same from ROCm 6.0 on).
        unsafe { lib.get::<T>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("{lib_name} lacks {}: {e}", name.trim_end_matches('\0')))
    }
    Ok(HipBlasLt {
        create: sym(&lib, name, "hipblasLtCreate\0")?,
        destroy: sym(&lib, name, "hipblasLtDestroy\0")?,
        get_version: sym(&lib, name, "hipblasLtGetVersion\0")?,
        layout_create: sym(&lib, name, "hipblasLtMatrixLayoutCreate\0")?,
        layout_destroy: sym(&lib, name, "hipblasLtMatrixLayoutDestroy\0")?,
        layout_set: sym(&lib, name, "hipblasLtMatrixLayoutSetAttribute\0")?,
        desc_create: sym(&lib, name, "hipblasLtMatmulDescCreate\0")?,
        desc_destroy: sym(&lib, name, "hipblasLtMatmulDescDestroy\0")?,
        desc_set: sym(&lib, name, "hipblasLtMatmulDescSetAttribute\0")?,
        pref_create: sym(&lib, name, "hipblasLtMatmulPreferenceCreate\0")?,
        pref_destroy: sym(&lib, name, "hipblasLtMatmulPreferenceDestroy\0")?,
        pref_set: sym(&lib, name, "hipblasLtMatmulPreferenceSetAttribute\0")?,
        heuristic: sym(&lib, name, "hipblasLtMatmulAlgoGetHeuristic\0")?,
        matmul: sym(&lib, name, "hipblasLtMatmul\0")?,
        _lib: lib,
    })
}

/// The name of a `hipblasStatus_t`.
fn status_name(status: Status) -> String {
    usize::try_from(status)
        .ok()
        .and_then(|i| abi::STATUS_NAMES.get(i))
        .map_or_else(|| format!("hipblasStatus_t {status}"), |s| s.to_string())
}

fn check(what: &str, status: Status) -> Result<()> {
    if status == abi::HIPBLAS_STATUS_SUCCESS {
        return Ok(());
    }
    Err(driver_error(BACKEND, what, status_name(status)))
}

/// Refuses hipBLASLt before 0.6 (ROCm 5's), whose calls take other numbers.
fn check_version(version: c_int) -> std::result::Result<(), String> {
    if version >= MIN_VERSION {
        return Ok(());
    }
    let (major, minor, patch) = (version / 100_000, version / 100 % 1000, version % 100);
    Err(format!(
        "{DESCRIPTION} {major}.{minor}.{patch} is older than 0.6 (ROCm 6.0), the first whose C \
         API this backend speaks"
    ))
}

/// `hipDataType` of a matrix dtype.
fn data_type(dtype: DType) -> Option<c_int> {
    match dtype {
        DType::F32 => Some(abi::HIP_R_32F),
        DType::F16 => Some(abi::HIP_R_16F),
        DType::BF16 => Some(abi::HIP_R_16BF),
        _ => None,
    }
}

/// `hipblasOperation_t` of a transpose flag.
fn operation(transpose: bool) -> i32 {
    if transpose {
        abi::HIPBLAS_OP_T
    } else {
        abi::HIPBLAS_OP_N
    }
}

/// The GEMM a plan is for: dtypes, sizes, leading dimensions and strides, transposes, and
/// whether `c` and a bias are present. (cuBLASLt's key adds the pointers' alignments, which
/// its heuristic takes; hipBLASLt's takes none.)
type GemmKey = (DType, DType, [usize; 10], bool, bool, bool, bool);

fn key(g: &Gemm) -> GemmKey {
    (
        g.dtype,
        g.out_dtype,
        [
            g.m, g.n, g.k, g.batch, g.lda, g.stride_a, g.ldb, g.stride_b, g.ldd, g.stride_d,
        ],
        g.transpose_a,
        g.transpose_b,
        g.c.is_some(),
        g.bias.is_some(),
    )
}

/// hipBLASLt's plan for one GEMM shape: its descriptor, the layouts of a, b and c/d, and the
/// algorithm the heuristic chose. Whatever was created is destroyed on drop, so a plan that
/// fails half-made leaks nothing.
struct Plan {
    lib: &'static HipBlasLt,
    desc: MatmulDesc,
    layouts: [Layout; 3],
    algo: MatmulAlgo,
}

impl Plan {
    /// Sets one attribute on the descriptor from a value of the type the header gives.
    fn set_desc<T>(&self, attribute: c_int, value: &T) -> Result<()> {
        // SAFETY: `desc` was created by hipBLASLt; it copies `size_of::<T>()` bytes from
        // `value`, of the type the attribute documents.
        check("hipblasLtMatmulDescSetAttribute", unsafe {
            (self.lib.desc_set)(
                self.desc,
                attribute,
                value as *const T as *const c_void,
                std::mem::size_of::<T>(),
            )
        })
    }

    /// Sets one attribute on layout `i`, likewise.
    fn set_layout<T>(&self, i: usize, attribute: c_int, value: &T) -> Result<()> {
        // SAFETY: as in `set_desc`, for a layout hipBLASLt created.
        check("hipblasLtMatrixLayoutSetAttribute", unsafe {
            (self.lib.layout_set)(
                self.layouts[i],
                attribute,
                value as *const T as *const c_void,
                std::mem::size_of::<T>(),
            )
        })
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: each non-null handle was created by hipBLASLt for this plan and is not used
        // after it is dropped.
        unsafe {
            for &layout in &self.layouts {
                if !layout.is_null() {
                    (self.lib.layout_destroy)(layout);
                }
            }
            if !self.desc.is_null() {
                (self.lib.desc_destroy)(self.desc);
            }
        }
    }
}

/// A preference descriptor, destroyed on drop.
struct Pref {
    lib: &'static HipBlasLt,
    pref: Preference,
}

impl Drop for Pref {
    fn drop(&mut self) {
        if !self.pref.is_null() {
            // SAFETY: created by hipBLASLt, used only while the heuristic ran.
            unsafe { (self.lib.pref_destroy)(self.pref) };
        }
    }
}

/// hipBLASLt on one device: its handle and its plans, made once per shape. The caller owns
/// the workspace and the stream each GEMM runs with.
pub(crate) struct Blas {
    lib: &'static HipBlasLt,
    handle: Handle,
    plans: Mutex<HashMap<GemmKey, Plan>>,
}

impl Blas {
    /// Creates a handle on the current device. Never inside a stream capture: handle creation
    /// allocates and sets memory, which a capture refuses (ROCm/rocm-libraries issue 11838).
    /// The error says why matmuls cannot run: the library absent or too old, or the handle
    /// refused.
    pub(crate) fn open() -> std::result::Result<Blas, String> {
        let lib = library()?;
        let mut handle = std::ptr::null_mut();
        // SAFETY: writes one handle, destroyed in `Drop` or below.
        let created = unsafe { (lib.create)(&mut handle) };
        if created != abi::HIPBLAS_STATUS_SUCCESS {
            return Err(format!("hipblasLtCreate: {}", status_name(created)));
        }
        let blas = Blas {
            lib,
            handle,
            plans: Mutex::new(HashMap::new()),
        };
        let mut version = 0;
        // SAFETY: the handle was just created; writes one int.
        let asked = unsafe { (lib.get_version)(blas.handle, &mut version) };
        if asked != abi::HIPBLAS_STATUS_SUCCESS {
            return Err(format!("hipblasLtGetVersion: {}", status_name(asked)));
        }
        check_version(version)?;
        Ok(blas)
    }

    /// hipBLASLt's plan for `g`: descriptor, layouts and the heuristic's algorithm.
    fn plan(&self, g: &Gemm, workspace_bytes: usize) -> Result<Plan> {
        let data = |dtype: DType| {
            data_type(dtype).ok_or_else(|| {
                Error::unsupported(BACKEND, format!("matmul in {dtype} (hipBLASLt)"))
            })
        };
        let types = [data(g.dtype)?, data(g.dtype)?, data(g.out_dtype)?];
        let batch = i32::try_from(g.batch)
            .map_err(|_| Error::invalid("matmul", format!("{} batches", g.batch)))?;
        let mut plan = Plan {
            lib: self.lib,
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: MatmulAlgo::default(),
        };
        // f32 stays exact f32 (no xf32); 16-bit data accumulate in f32, scaled in f32.
        // SAFETY: writes one descriptor handle, owned by `plan`.
        check("hipblasLtMatmulDescCreate", unsafe {
            (self.lib.desc_create)(&mut plan.desc, abi::HIPBLAS_COMPUTE_32F, abi::HIP_R_32F)
        })?;
        plan.set_desc(abi::MATMUL_DESC_TRANSA, &operation(g.transpose_a))?;
        plan.set_desc(abi::MATMUL_DESC_TRANSB, &operation(g.transpose_b))?;
        if g.bias.is_some() {
            plan.set_desc(abi::MATMUL_DESC_EPILOGUE, &abi::EPILOGUE_BIAS)?;
            let bias_type: i32 = types[2];
            plan.set_desc(abi::MATMUL_DESC_BIAS_DATA_TYPE, &bias_type)?;
        }
        for (i, (&(rows, cols, ld, stride), &data)) in
            g.stored_shapes().iter().zip(&types).enumerate()
        {
            // SAFETY: writes one layout handle, owned by `plan`.
            check("hipblasLtMatrixLayoutCreate", unsafe {
                (self.lib.layout_create)(
                    &mut plan.layouts[i],
                    data,
                    rows as u64,
                    cols as u64,
                    ld as i64,
                )
            })?;
            plan.set_layout(i, abi::MATRIX_LAYOUT_BATCH_COUNT, &batch)?;
            plan.set_layout(i, abi::MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &(stride as i64))?;
        }
        let mut pref = Pref {
            lib: self.lib,
            pref: std::ptr::null_mut(),
        };
        // SAFETY: writes one preference handle, destroyed when `pref` drops.
        check("hipblasLtMatmulPreferenceCreate", unsafe {
            (self.lib.pref_create)(&mut pref.pref)
        })?;
        let workspace = workspace_bytes as u64;
        // SAFETY: copies the `uint64_t` the attribute documents.
        check("hipblasLtMatmulPreferenceSetAttribute", unsafe {
            (self.lib.pref_set)(
                pref.pref,
                abi::MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &workspace as *const u64 as *const c_void,
                std::mem::size_of::<u64>(),
            )
        })?;
        let mut result = HeuristicResult::default();
        let mut returned: c_int = 0;
        // SAFETY: the descriptor, layouts and preference were created above; hipBLASLt writes
        // at most the one result asked for (a struct of the header's layout) and the count.
        // C and D share a layout, as on NVIDIA.
        check("hipblasLtMatmulAlgoGetHeuristic", unsafe {
            (self.lib.heuristic)(
                self.handle,
                plan.desc,
                plan.layouts[0],
                plan.layouts[1],
                plan.layouts[2],
                plan.layouts[2],
                pref.pref,
                1,
                &mut result,
                &mut returned,
            )
        })?;
        if returned < 1 || result.state != abi::HIPBLAS_STATUS_SUCCESS {
            return Err(driver_error(
                BACKEND,
                "hipblasLtMatmulAlgoGetHeuristic",
                format!(
                    "no algorithm for a {}x{}x{} GEMM of {} into {} on this GPU ({})",
                    g.m,
                    g.n,
                    g.k,
                    g.dtype,
                    g.out_dtype,
                    status_name(result.state)
                ),
            ));
        }
        plan.algo = result.algo;
        Ok(plan)
    }

    /// Queues `g` on `stream` with the caller's workspace. The plans' lock is held through
    /// the call, as the bias pointer is set on the shared descriptor; every GEMM, captured or
    /// not, runs on the device's one stream, so the handle never serves two streams at once.
    pub(crate) fn gemm(
        &self,
        g: &Gemm,
        workspace: DevicePtr,
        workspace_bytes: usize,
        stream: *mut c_void,
    ) -> Result<()> {
        let key = key(g);
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        let plan = match plans.entry(key) {
            Entry::Occupied(planned) => planned.into_mut(),
            Entry::Vacant(unplanned) => unplanned.insert(self.plan(g, workspace_bytes)?),
        };
        if let Some(bias) = g.bias {
            plan.set_desc(abi::MATMUL_DESC_BIAS_POINTER, &(bias as *const c_void))?;
        }
        let alpha = 1.0f32;
        let beta = if g.c.is_some() { 1.0f32 } else { 0.0 };
        let c = g.c.unwrap_or(g.d);
        // SAFETY: the plan describes these pointers' shapes, which the caller checked lie in
        // their buffers; alpha and beta are f32 host scalars (the default pointer mode, of the
        // f32 scale type); the workspace holds `workspace_bytes`, the bound the heuristic had.
        check("hipblasLtMatmul", unsafe {
            (self.lib.matmul)(
                self.handle,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                g.a as *const c_void,
                plan.layouts[0],
                g.b as *const c_void,
                plan.layouts[1],
                &beta as *const f32 as *const c_void,
                c as *const c_void,
                plan.layouts[2],
                g.d as *mut c_void,
                plan.layouts[2],
                &plan.algo,
                workspace as *mut c_void,
                workspace_bytes,
                stream,
            )
        })
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        self.plans
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
        // SAFETY: the handle was created in `open`; its plans are gone and it is not used
        // again. (hipBLASLt waits for the device here.)
        unsafe { (self.lib.destroy)(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use std::mem::{align_of, offset_of, size_of};

    use super::*;

    fn gemm() -> Gemm {
        Gemm {
            dtype: DType::F16,
            out_dtype: DType::F16,
            m: 64,
            n: 32,
            k: 16,
            batch: 3,
            a: 0x1000,
            lda: 64,
            stride_a: 64 * 16,
            transpose_a: false,
            b: 0x2000,
            ldb: 16,
            stride_b: 16 * 32,
            transpose_b: false,
            c: None,
            bias: None,
            d: 0x3000,
            ldd: 64,
            stride_d: 64 * 32,
        }
    }

    /// The structs hipBLASLt writes and reads have hipblaslt.h's layout on a 64-bit host:
    /// `uint8_t data[16]; size_t max_workspace_bytes;` and `algo; size_t workspaceSize;
    /// hipblasStatus_t state; float wavesCount; int reserved[4];`.
    #[test]
    fn structs_have_the_header_layout() {
        assert_eq!(size_of::<MatmulAlgo>(), 24);
        assert_eq!(align_of::<MatmulAlgo>(), 8);
        assert_eq!(offset_of!(MatmulAlgo, max_workspace_bytes), 16);
        assert_eq!(size_of::<HeuristicResult>(), 56);
        assert_eq!(offset_of!(HeuristicResult, workspace_size), 24);
        assert_eq!(offset_of!(HeuristicResult, state), 32);
        assert_eq!(offset_of!(HeuristicResult, waves_count), 36);
        assert_eq!(offset_of!(HeuristicResult, reserved), 40);
    }

    #[test]
    fn dtypes_and_transposes_take_the_headers_numbers() {
        assert_eq!(data_type(DType::F32), Some(0));
        assert_eq!(data_type(DType::F16), Some(2));
        assert_eq!(data_type(DType::BF16), Some(14));
        assert_eq!(data_type(DType::I32), None);
        assert_eq!(data_type(DType::F64), None);
        assert_eq!(operation(false), 111);
        assert_eq!(operation(true), 112);
        assert_eq!(status_name(3), "HIPBLAS_STATUS_INVALID_VALUE");
        assert_eq!(status_name(11), "HIPBLAS_STATUS_UNKNOWN");
        assert_eq!(status_name(42), "hipblasStatus_t 42");
        assert_eq!(status_name(-1), "hipblasStatus_t -1");
    }

    /// ROCm 5.7's hipBLASLt (0.3.0, encoded 300) is refused, naming its version; 0.6 and 1.x
    /// pass.
    #[test]
    fn versions_before_rocm6_are_refused() {
        let refused = check_version(300).unwrap_err();
        assert!(refused.contains("0.3.0"), "{refused}");
        assert!(refused.contains("libhipblaslt"), "{refused}");
        assert!(check_version(599).is_err());
        assert!(check_version(600).is_ok());
        assert!(check_version(100_100).is_ok());
    }

    /// The stored shapes follow the transposes, as cuBLASLt's do on NVIDIA.
    #[test]
    fn stored_shapes_follow_the_transposes() {
        let g = gemm();
        assert_eq!(
            g.stored_shapes(),
            [(64, 16, 64, 1024), (16, 32, 16, 512), (64, 32, 64, 2048)]
        );
        let t = Gemm {
            transpose_a: true,
            lda: 16,
            transpose_b: true,
            ldb: 32,
            ..g
        };
        assert_eq!(
            t.stored_shapes(),
            [(16, 64, 16, 1024), (32, 16, 32, 512), (64, 32, 64, 2048)]
        );
    }

    /// A plan is shared by GEMMs that differ only in their pointers, and not by ones whose
    /// descriptor differs (a bias epilogue, `c`, the output dtype, the output's stride).
    #[test]
    fn plans_are_keyed_by_what_they_describe() {
        let g = gemm();
        let moved = Gemm {
            a: 0x9000,
            b: 0xa000,
            d: 0xb000,
            ..g
        };
        assert_eq!(key(&g), key(&moved));
        assert_ne!(key(&g), key(&Gemm { bias: Some(8), ..g }));
        assert_ne!(key(&g), key(&Gemm { c: Some(8), ..g }));
        assert_ne!(
            key(&g),
            key(&Gemm {
                out_dtype: DType::F32,
                ..g
            })
        );
        assert_ne!(key(&g), key(&Gemm { stride_d: 0, ..g }));
    }

    /// An absent library is an error that names it, never a panic.
    #[test]
    fn an_absent_library_is_named() {
        let Err(why) = load(&["libtessera-no-such-hipblaslt.so.0"]) else {
            panic!("a library that does not exist loaded");
        };
        assert_eq!(why, "libhipblaslt (hipBLASLt) is not installed");
    }
}
