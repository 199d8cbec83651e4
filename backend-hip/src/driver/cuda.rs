//! NVIDIA: the CUDA driver, NVRTC and cuBLASLt, loaded at run time through cudarc.
//!
//! cudarc's loading panics when a library is absent, so [`missing`] looks for each library
//! with libloading before anything of cudarc's is called, and the backend lists no devices
//! while one is missing. Every call makes the device's primary context current on the calling
//! thread first (threads share the device); work goes to one non-blocking stream.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;

use cudarc::cublaslt::{result as lt, sys as lt_sys};
use cudarc::driver::{result, sys};
use cudarc::nvrtc::sys as rtc;
use tessera_core::{DType, Error, PendingBytes, Result};

use super::{driver_error, param_words, DevicePtr, Driver, Event, Function, Gemm, Graph, Grid};

const BACKEND: &str = "cuda";

/// cuBLASLt's workspace: what NVIDIA recommends on Hopper.
const GEMM_WORKSPACE_BYTES: usize = 32 << 20;

/// The libraries the backend needs that are absent, by their names (none: all present).
pub(crate) fn missing() -> Vec<&'static str> {
    static MISSING: OnceLock<Vec<&'static str>> = OnceLock::new();
    MISSING
        .get_or_init(|| {
            let mut absent = Vec::new();
            // SAFETY: each check only tries to dlopen the library's candidate names.
            unsafe {
                if !sys::is_culib_present() {
                    absent.push("libcuda (the NVIDIA driver)");
                }
                if !rtc::is_culib_present() {
                    absent.push("libnvrtc (NVRTC)");
                }
                if !lt_sys::is_culib_present() {
                    absent.push("libcublasLt (cuBLASLt)");
                }
            }
            absent
        })
        .clone()
}

/// Whether NVRTC can be loaded (compiling needs no GPU).
#[cfg(test)]
pub(crate) fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen NVRTC's candidate names.
    unsafe { rtc::is_culib_present() }
}

/// The NVIDIA devices present, by name; none where a library is missing or the driver
/// reports an error.
pub(crate) fn probe() -> Vec<String> {
    if !missing().is_empty() || result::init().is_err() {
        return Vec::new();
    }
    let count = result::device::get_count().unwrap_or(0);
    (0..count)
        .filter_map(|i| result::device::get(i).ok())
        .map(|dev| result::device::get_name(dev).unwrap_or_else(|_| "NVIDIA GPU".into()))
        .collect()
}

/// Compiles HIP C++ `source` with NVRTC into a cubin for `arch` (`sm_90a`); the error is the
/// compiler's log. Needs NVRTC, not a GPU.
pub(crate) fn compile(
    source: &str,
    name: &str,
    arch: &str,
) -> std::result::Result<Vec<u8>, String> {
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let file = CString::new(format!("{name}.hip")).map_err(|e| e.to_string())?;
    let options: Vec<CString> = [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        "-default-device".into(),
        "-DTESSERA_NVIDIA=1".into(),
        "-DWARP_SIZE=32".into(),
        // The prelude's helpers go unused in most kernels.
        "--diag-suppress=177".into(),
    ]
    .into_iter()
    .map(|o| CString::new(o).expect("options have no NUL"))
    .collect();
    let option_ptrs: Vec<*const std::ffi::c_char> = options.iter().map(|o| o.as_ptr()).collect();
    let mut prog: rtc::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC reads the NUL-terminated strings above and writes its program handle,
    // which is destroyed before returning; the log and cubin are copied into buffers of
    // the sizes NVRTC reports.
    unsafe {
        let created = rtc::nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            file.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if created != rtc::nvrtcResult::NVRTC_SUCCESS {
            return Err(format!("nvrtcCreateProgram: {created:?}"));
        }
        let compiled =
            rtc::nvrtcCompileProgram(prog, option_ptrs.len() as i32, option_ptrs.as_ptr());
        let out = if compiled == rtc::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            rtc::nvrtcGetCUBINSize(prog, &mut size);
            let mut cubin = vec![0u8; size];
            rtc::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut std::ffi::c_char);
            Ok(cubin)
        } else {
            let mut size = 0usize;
            rtc::nvrtcGetProgramLogSize(prog, &mut size);
            let mut log = vec![0u8; size];
            rtc::nvrtcGetProgramLog(prog, log.as_mut_ptr() as *mut std::ffi::c_char);
            Err(String::from_utf8_lossy(&log)
                .trim_end_matches('\0')
                .to_string())
        };
        rtc::nvrtcDestroyProgram(&mut prog);
        out
    }
}

/// cuBLASLt's plan for one GEMM shape: descriptors and the algorithm its heuristic chose.
struct GemmPlan {
    desc: lt_sys::cublasLtMatmulDesc_t,
    layouts: [lt_sys::cublasLtMatrixLayout_t; 3],
    algo: lt_sys::cublasLtMatmulAlgo_t,
}

// SAFETY: the plan's handles are plain descriptors cuBLASLt reads; they are used under the
// `plans` lock or read-only after creation.
unsafe impl Send for GemmPlan {}

/// The GEMM a plan is for: dtypes, sizes, transposes, whether `c` and a bias are present,
/// and the alignment of the four pointers (the heuristic picks kernels for it).
type GemmKey = (DType, DType, [usize; 9], bool, bool, bool, bool, [u32; 4]);

/// The largest power of two up to 256 that `ptr` is a multiple of: what cuBLASLt calls a
/// pointer's alignment.
fn alignment(ptr: DevicePtr) -> u32 {
    if ptr == 0 {
        256
    } else {
        1u32 << ptr.trailing_zeros().min(8)
    }
}

/// Page-locked host blocks for reads started early, reused (a read of a token per decoding
/// step would otherwise allocate one each time). Freed with the driver.
struct PinnedPool {
    ctx: sys::CUcontext,
    free: Mutex<Vec<(usize, usize)>>,
}

// SAFETY: the pool holds host addresses of page-locked blocks and the context handle, used
// under its lock or after making the context current.
unsafe impl Send for PinnedPool {}
// SAFETY: as above.
unsafe impl Sync for PinnedPool {}

impl PinnedPool {
    /// A block of at least `len` bytes: its address and size.
    fn take(&self, len: usize) -> Result<(usize, usize)> {
        let mut free = self.free.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(pos) = free.iter().position(|&(_, size)| size >= len) {
            return Ok(free.swap_remove(pos));
        }
        let size = len.next_power_of_two().max(4096);
        // SAFETY: a page-locked host allocation on the pool's context, freed in `Drop`.
        let ptr = unsafe { result::malloc_host(size, 0) }
            .map_err(|e| driver_error(BACKEND, "cuMemHostAlloc", format!("{e:?}")))?;
        Ok((ptr as usize, size))
    }

    fn give_back(&self, block: (usize, usize)) {
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(block);
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        // SAFETY: the blocks came from `cuMemHostAlloc` on this context and nothing reads them
        // once the pool is dropped (pending reads hold the pool).
        unsafe {
            if result::ctx::set_current(self.ctx).is_ok() {
                for (ptr, _) in self
                    .free
                    .get_mut()
                    .unwrap_or_else(PoisonError::into_inner)
                    .drain(..)
                {
                    let _ = result::free_host(ptr as *mut c_void);
                }
            }
        }
    }
}

/// A copy to a page-locked block, finished when its event has passed.
struct PendingRead {
    pool: Arc<PinnedPool>,
    block: (usize, usize),
    len: usize,
    event: usize,
}

// SAFETY: the block is host memory owned by this read until it gives it back; the event is
// a driver handle any thread may wait on.
unsafe impl Send for PendingRead {}

impl PendingBytes for PendingRead {
    fn wait(self: Box<Self>) -> Result<Vec<u8>> {
        let event = self.event as sys::CUevent;
        // SAFETY: the event was recorded after the copy into the block; once it has passed,
        // the block's first `len` bytes hold the copy.
        let out = unsafe {
            check("cuCtxSetCurrent", result::ctx::set_current(self.pool.ctx))?;
            let waited = check("cuEventSynchronize", result::event::synchronize(event));
            let _ = result::event::destroy(event);
            waited?;
            std::slice::from_raw_parts(self.block.0 as *const u8, self.len).to_vec()
        };
        self.pool.give_back(self.block);
        Ok(out)
    }
}

/// One NVIDIA GPU.
pub(crate) struct CudaDriver {
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    name: String,
    arch: String,
    compute_capability: (i32, i32),
    total_memory: usize,
    max_shared_bytes: usize,
    blas: lt_sys::cublasLtHandle_t,
    workspace: DevicePtr,
    plans: Mutex<HashMap<GemmKey, GemmPlan>>,
    modules: Mutex<Vec<sys::CUmodule>>,
    pinned: Arc<PinnedPool>,
    /// The thread capturing a graph, and its capture stream.
    capture: Mutex<Option<(ThreadId, usize)>>,
    /// The side stream ([`Driver::side_stream`]), once made.
    side: OnceLock<usize>,
}

// SAFETY: the context, stream, cuBLASLt handle and modules are driver handles that the CUDA
// driver and cuBLASLt allow any thread to use once the context is current, which every method
// makes it first; the mutable maps are behind locks.
unsafe impl Send for CudaDriver {}
// SAFETY: as above.
unsafe impl Sync for CudaDriver {}

fn check<E: std::fmt::Debug>(what: &str, r: std::result::Result<(), E>) -> Result<()> {
    r.map_err(|e| driver_error(BACKEND, what, format!("{e:?}")))
}

impl CudaDriver {
    pub(crate) fn open(ordinal: usize) -> Result<CudaDriver> {
        if let Some(lib) = missing().first() {
            return Err(Error::Device {
                name: format!("cuda:{ordinal}"),
                detail: format!("{lib} could not be loaded"),
            });
        }
        check("cuInit", result::init())?;
        let dev = result::device::get(ordinal as i32)
            .map_err(|e| driver_error(BACKEND, "cuDeviceGet", format!("{e:?}")))?;
        let attr = |a: sys::CUdevice_attribute| {
            // SAFETY: `dev` is a device handle the driver returned.
            unsafe { result::device::get_attribute(dev, a) }.unwrap_or(0)
        };
        use sys::CUdevice_attribute::*;
        let cc = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        );
        let max_shared_bytes = attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
            .max(attr(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK))
            as usize;
        // Hopper's and Blackwell's architecture-specific features (wgmma) need the `a` target.
        let arch = match cc {
            (9, 0) | (10, 0) => format!("sm_{}{}a", cc.0, cc.1),
            _ => format!("sm_{}{}", cc.0, cc.1),
        };
        // SAFETY: `dev` is valid; the primary context is released in `Drop`.
        let ctx = unsafe { result::primary_ctx::retain(dev) }
            .map_err(|e| driver_error(BACKEND, "cuDevicePrimaryCtxRetain", format!("{e:?}")))?;
        // SAFETY: `ctx` was just retained.
        check("cuCtxSetCurrent", unsafe { result::ctx::set_current(ctx) })?;
        // SAFETY: `dev` is valid.
        let total_memory = unsafe { result::device::total_mem(dev) }.unwrap_or(0);
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error(BACKEND, "cuStreamCreate", format!("{e:?}")))?;
        let blas = lt::create_handle().map_err(|e| driver_error(BACKEND, "cublasLtCreate", e))?;
        // SAFETY: a plain allocation on the context made current above.
        let workspace = unsafe { result::malloc_sync(GEMM_WORKSPACE_BYTES) }
            .map_err(|e| driver_error(BACKEND, "cuMemAlloc (GEMM workspace)", format!("{e:?}")))?;
        Ok(CudaDriver {
            ctx,
            stream,
            name: result::device::get_name(dev).unwrap_or_else(|_| "NVIDIA GPU".into()),
            arch,
            compute_capability: cc,
            total_memory,
            max_shared_bytes,
            blas,
            workspace,
            plans: Mutex::new(HashMap::new()),
            modules: Mutex::new(Vec::new()),
            pinned: Arc::new(PinnedPool {
                ctx,
                free: Mutex::new(Vec::new()),
            }),
            capture: Mutex::new(None),
            side: OnceLock::new(),
        })
    }

    /// Makes `waiting` wait for the work queued so far on `queued`, through an event.
    fn order(&self, waiting: sys::CUstream, queued: sys::CUstream) -> Result<()> {
        self.bind()?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| driver_error(BACKEND, "cuEventCreate", format!("{e:?}")))?;
        // SAFETY: both streams belong to this context; the event was just created, and
        // destroying it after the wait is queued is allowed (the wait keeps what it needs).
        unsafe {
            let ordered =
                check("cuEventRecord", result::event::record(event, queued)).and_then(|()| {
                    check(
                        "cuStreamWaitEvent",
                        result::stream::wait_event(
                            waiting,
                            event,
                            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                        ),
                    )
                });
            let _ = result::event::destroy(event);
            ordered
        }
    }

    /// The stream the calling thread queues on: its capture stream while it captures a graph,
    /// else the device's stream.
    fn stream(&self) -> sys::CUstream {
        match *self.capture.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((thread, stream)) if thread == std::thread::current().id() => {
                stream as sys::CUstream
            }
            _ => self.stream,
        }
    }

    /// cuBLASLt's plan for `g`, made once per shape.
    fn plan(&self, g: &Gemm) -> Result<GemmKey> {
        let key: GemmKey = (
            g.dtype,
            g.out_dtype,
            [
                g.m, g.n, g.k, g.batch, g.lda, g.stride_a, g.ldb, g.stride_b, g.ldd,
            ],
            g.transpose_a,
            g.transpose_b,
            g.c.is_some(),
            g.bias.is_some(),
            [g.a, g.b, g.c.unwrap_or(g.d), g.d].map(alignment),
        );
        let mut plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        if plans.contains_key(&key) {
            return Ok(key);
        }
        let blas_err =
            |what: &'static str| move |e: lt::CublasError| driver_error(BACKEND, what, e);
        let data_type = |dtype: DType| match dtype {
            DType::F32 => Ok(lt_sys::cudaDataType::CUDA_R_32F),
            DType::F16 => Ok(lt_sys::cudaDataType::CUDA_R_16F),
            DType::BF16 => Ok(lt_sys::cudaDataType::CUDA_R_16BF),
            other => Err(Error::unsupported(
                BACKEND,
                format!("matmul in {other} (cuBLASLt)"),
            )),
        };
        let types = [
            data_type(g.dtype)?,
            data_type(g.dtype)?,
            data_type(g.out_dtype)?,
        ];
        // f32 stays exact f32 (no TF32); 16-bit data accumulate in f32.
        let desc = lt::create_matmul_desc(
            lt_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            lt_sys::cudaDataType::CUDA_R_32F,
        )
        .map_err(blas_err("cublasLtMatmulDescCreate"))?;
        // cuBLAS's `cublasOperation_t`: CUBLAS_OP_N = 0, CUBLAS_OP_T = 1.
        let op = |t: bool| i32::from(t);
        let (op_a, op_b) = (op(g.transpose_a), op(g.transpose_b));
        // SAFETY: the attributes are written from values of the types cuBLASLt documents.
        unsafe {
            lt::set_matmul_desc_attribute(
                desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                &op_a as *const _ as *const c_void,
                std::mem::size_of_val(&op_a),
            )
            .map_err(blas_err("cublasLtMatmulDescSetAttribute"))?;
            lt::set_matmul_desc_attribute(
                desc,
                lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                &op_b as *const _ as *const c_void,
                std::mem::size_of_val(&op_b),
            )
            .map_err(blas_err("cublasLtMatmulDescSetAttribute"))?;
            if g.bias.is_some() {
                let epilogue = lt_sys::cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS;
                lt::set_matmul_desc_attribute(
                    desc,
                    lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_EPILOGUE,
                    &epilogue as *const _ as *const c_void,
                    std::mem::size_of_val(&epilogue),
                )
                .map_err(blas_err("cublasLtMatmulDescSetAttribute"))?;
                lt::set_matmul_desc_attribute(
                    desc,
                    lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                    &types[2] as *const _ as *const c_void,
                    std::mem::size_of_val(&types[2]),
                )
                .map_err(blas_err("cublasLtMatmulDescSetAttribute"))?;
            }
        }
        let shapes = g.stored_shapes();
        let mut layouts = [std::ptr::null_mut(); 3];
        for ((layout, &(rows, cols, ld, stride)), &data) in
            layouts.iter_mut().zip(&shapes).zip(&types)
        {
            *layout = lt::create_matrix_layout(data, rows as u64, cols as u64, ld as i64)
                .map_err(blas_err("cublasLtMatrixLayoutCreate"))?;
            let batch = g.batch as i32;
            let stride = stride as i64;
            // SAFETY: as above.
            unsafe {
                lt::set_matrix_layout_attribute(
                    *layout,
                    lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                    &batch as *const _ as *const c_void,
                    std::mem::size_of_val(&batch),
                )
                .map_err(blas_err("cublasLtMatrixLayoutSetAttribute"))?;
                lt::set_matrix_layout_attribute(
                    *layout,
                    lt_sys::cublasLtMatrixLayoutAttribute_t::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                    &stride as *const _ as *const c_void,
                    std::mem::size_of_val(&stride),
                )
                .map_err(blas_err("cublasLtMatrixLayoutSetAttribute"))?;
            }
        }
        let pref = lt::create_matmul_pref().map_err(blas_err("cublasLtMatmulPreferenceCreate"))?;
        let workspace = GEMM_WORKSPACE_BYTES as u64;
        // SAFETY: `pref` and the descriptors were created above; the preference is destroyed
        // once the heuristic has answered.
        let heuristic = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &workspace as *const _ as *const c_void,
                std::mem::size_of_val(&workspace),
            )
            .map_err(blas_err("cublasLtMatmulPreferenceSetAttribute"))?;
            // Split-K partial sums are added in f32 (CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE),
            // never in the output's 16-bit type, which loses the sums' low bits where they
            // cancel.
            let reduction: u32 = 2;
            lt::set_matmul_pref_attribute(
                pref,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                &reduction as *const _ as *const c_void,
                std::mem::size_of_val(&reduction),
            )
            .map_err(blas_err("cublasLtMatmulPreferenceSetAttribute"))?;
            let aligned = key.7;
            let pref_alignments = [
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                lt_sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
            ];
            for (attribute, bytes) in pref_alignments.into_iter().zip(aligned) {
                lt::set_matmul_pref_attribute(
                    pref,
                    attribute,
                    &bytes as *const _ as *const c_void,
                    std::mem::size_of_val(&bytes),
                )
                .map_err(blas_err("cublasLtMatmulPreferenceSetAttribute"))?;
            }
            let h = lt::get_matmul_algo_heuristic(
                self.blas, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref,
            );
            let _ = lt::destroy_matmul_pref(pref);
            h.map_err(blas_err("cublasLtMatmulAlgoGetHeuristic"))?
        };
        plans.insert(
            key,
            GemmPlan {
                desc,
                layouts,
                algo: heuristic.algo,
            },
        );
        Ok(key)
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: every handle was created by this driver and is not used after this; the
        // stream is drained before memory and modules go.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            for plan in self
                .plans
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
            {
                for layout in plan.layouts {
                    let _ = lt::destroy_matrix_layout(layout);
                }
                let _ = lt::destroy_matmul_desc(plan.desc);
            }
            let _ = lt::destroy_handle(self.blas);
            let _ = result::free_sync(self.workspace);
            for module in self
                .modules
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .drain(..)
            {
                let _ = result::module::unload(module);
            }
            if let Some(&side) = self.side.get() {
                let _ = result::stream::synchronize(side as sys::CUstream);
                let _ = result::stream::destroy(side as sys::CUstream);
            }
            let _ = result::stream::destroy(self.stream);
        }
    }
}

impl Driver for CudaDriver {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn arch(&self) -> &str {
        &self.arch
    }

    fn total_memory(&self) -> usize {
        self.total_memory
    }

    fn max_shared_bytes(&self) -> usize {
        self.max_shared_bytes
    }

    fn compiler(&self) -> String {
        let (mut major, mut minor) = (0, 0);
        // SAFETY: writes two ints.
        unsafe { rtc::nvrtcVersion(&mut major, &mut minor) };
        format!(
            "nvrtc {major}.{minor} sm {}{}",
            self.compute_capability.0, self.compute_capability.1
        )
    }

    fn compile(&self, source: &str, name: &str) -> std::result::Result<Vec<u8>, String> {
        compile(source, name, &self.arch)
    }

    fn load(&self, image: &[u8], entry: &str) -> Result<Function> {
        self.bind()?;
        let entry_c = CString::new(entry).map_err(|e| driver_error(BACKEND, "kernel name", e))?;
        // SAFETY: `image` is a cubin NVRTC produced for this device; the module lives until
        // the driver is dropped, and so does the function taken from it.
        unsafe {
            let module = result::module::load_data(image.as_ptr() as *const c_void)
                .map_err(|e| driver_error(BACKEND, "cuModuleLoadData", format!("{e:?}")))?;
            self.modules
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(module);
            let function = result::module::get_function(module, entry_c)
                .map_err(|e| driver_error(BACKEND, "cuModuleGetFunction", format!("{e:?}")))?;
            // Kernels that ask for more than 48 KiB of shared memory need the opt-in.
            let _ = result::function::set_function_attribute(
                function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                self.max_shared_bytes as i32,
            );
            Ok(Function(function as usize))
        }
    }

    fn launch(
        &self,
        function: Function,
        grid: Grid,
        params: &[u8],
        start_early: bool,
    ) -> Result<()> {
        self.bind()?;
        let mut words = param_words(params);
        let mut args = [words.as_mut_ptr() as *mut c_void];
        // Programmatic dependent launch (Hopper on): the kernel may start while the one ahead
        // of it runs, and waits for it in its first statement.
        let mut attribute = sys::CUlaunchAttribute {
            id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value: sys::CUlaunchAttributeValue {
                programmaticStreamSerializationAllowed: 1,
            },
        };
        let early = start_early && self.compute_capability.0 >= 9;
        let config = sys::CUlaunchConfig {
            gridDimX: grid.blocks[0],
            gridDimY: grid.blocks[1],
            gridDimZ: grid.blocks[2],
            blockDimX: grid.threads,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: grid.shared_bytes,
            hStream: self.stream(),
            attrs: if early {
                &mut attribute
            } else {
                std::ptr::null_mut()
            },
            numAttrs: u32::from(early),
        };
        // SAFETY: `function` came from `load` on this driver; its one parameter is the struct
        // these bytes encode (the planners build both from one declaration); the driver copies
        // the argument and reads the configuration before returning.
        check("cuLaunchKernelEx", unsafe {
            sys::cuLaunchKernelEx(
                &config,
                function.0 as sys::CUfunction,
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
            .result()
        })
    }

    fn alloc(&self, bytes: usize) -> Result<Option<DevicePtr>> {
        self.bind()?;
        // SAFETY: a stream-ordered allocation on this device's stream.
        match unsafe { result::malloc_async(self.stream, bytes.max(1)) } {
            Ok(ptr) => Ok(Some(ptr)),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Ok(None),
            Err(e) => Err(driver_error(BACKEND, "cuMemAllocAsync", format!("{e:?}"))),
        }
    }

    fn free(&self, ptr: DevicePtr) {
        if self.bind().is_ok() {
            // SAFETY: `ptr` came from `alloc`; the free is ordered after queued work.
            let _ = unsafe { result::free_async(ptr, self.stream) };
        }
    }

    fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked the range lies in `dst`'s allocation; from pageable
        // memory the driver has copied `data` out before returning.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                dst,
                data.as_ptr() as *const c_void,
                data.len(),
                self.stream(),
            )
            .result()
        })
    }

    fn download(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked the range; the stream is synchronized before `out` is
        // read or dropped.
        unsafe {
            check(
                "cuMemcpyDtoHAsync",
                sys::cuMemcpyDtoHAsync_v2(
                    out.as_mut_ptr() as *mut c_void,
                    src,
                    out.len(),
                    self.stream(),
                )
                .result(),
            )?;
            check(
                "cuStreamSynchronize",
                result::stream::synchronize(self.stream()),
            )
        }
    }

    fn zero(&self, dst: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked the range.
        check("cuMemsetD8Async", unsafe {
            result::memset_d8_async(dst, 0, bytes, self.stream())
        })
    }

    fn gemm(&self, g: &Gemm) -> Result<()> {
        self.bind()?;
        let key = self.plan(g)?;
        let plans = self.plans.lock().unwrap_or_else(PoisonError::into_inner);
        let plan = &plans[&key];
        let alpha = 1.0f32;
        let beta = if g.c.is_some() { 1.0f32 } else { 0.0 };
        let c = g.c.unwrap_or(g.d);
        // SAFETY: the plan describes these pointers' shapes, which the caller checked lie in
        // their buffers; the workspace is the driver's own. The bias pointer is set on the
        // plan's descriptor under the plans' lock, which is held through the call.
        unsafe {
            if let Some(bias) = g.bias {
                let bias = bias as *const c_void;
                lt::set_matmul_desc_attribute(
                    plan.desc,
                    lt_sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    &bias as *const _ as *const c_void,
                    std::mem::size_of_val(&bias),
                )
                .map_err(|e| driver_error(BACKEND, "cublasLtMatmulDescSetAttribute", e))?;
            }
            lt::matmul(
                self.blas,
                plan.desc,
                &alpha as *const f32 as *const c_void,
                &beta as *const f32 as *const c_void,
                g.a as *const c_void,
                plan.layouts[0],
                g.b as *const c_void,
                plan.layouts[1],
                c as *const c_void,
                plan.layouts[2],
                g.d as *mut c_void,
                plan.layouts[2],
                &plan.algo,
                self.workspace as *mut c_void,
                GEMM_WORKSPACE_BYTES,
                self.stream() as _,
            )
        }
        .map_err(|e| driver_error(BACKEND, "cublasLtMatmul", e))
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream is this driver's.
        check("cuStreamSynchronize", unsafe {
            result::stream::synchronize(self.stream)
        })
    }

    fn download_later(&self, src: DevicePtr, len: usize) -> Result<Box<dyn PendingBytes>> {
        self.bind()?;
        let block = self.pinned.take(len.max(1))?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
            .map_err(|e| driver_error(BACKEND, "cuEventCreate", format!("{e:?}")))?;
        // SAFETY: the caller checked the range; the block is page-locked, owned by the
        // pending read until its event has passed.
        let queued = unsafe {
            let copy = if len > 0 {
                sys::cuMemcpyDtoHAsync_v2(block.0 as *mut c_void, src, len, self.stream()).result()
            } else {
                Ok(())
            };
            copy.and_then(|()| result::event::record(event, self.stream()))
        };
        if let Err(e) = queued {
            // SAFETY: the event was created above and is not used again.
            let _ = unsafe { result::event::destroy(event) };
            self.pinned.give_back(block);
            return Err(driver_error(BACKEND, "cuMemcpyDtoHAsync", format!("{e:?}")));
        }
        Ok(Box::new(PendingRead {
            pool: self.pinned.clone(),
            block,
            len,
            event: event as usize,
        }))
    }

    fn event(&self) -> Result<Event> {
        self.bind()?;
        let event = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
            .map_err(|e| driver_error(BACKEND, "cuEventCreate", format!("{e:?}")))?;
        // SAFETY: records the new event on this driver's stream.
        check("cuEventRecord", unsafe {
            result::event::record(event, self.stream())
        })?;
        Ok(Event(event as usize))
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is the primary context retained in `open`, alive until `Drop`.
        check("cuCtxSetCurrent", unsafe {
            result::ctx::set_current(self.ctx)
        })
    }

    fn side_stream(&self) -> Result<usize> {
        if let Some(&stream) = self.side.get() {
            return Ok(stream);
        }
        self.bind()?;
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error(BACKEND, "cuStreamCreate", format!("{e:?}")))?;
        if let Err(stream) = self.side.set(stream as usize) {
            // SAFETY: another thread made the side stream first; this one is unused.
            let _ = unsafe { result::stream::destroy(stream as sys::CUstream) };
        }
        Ok(*self.side.get().unwrap_or(&(stream as usize)))
    }

    fn side_after_queued(&self) -> Result<()> {
        let side = self.side_stream()? as sys::CUstream;
        self.order(side, self.stream())
    }

    fn queued_after_side(&self) -> Result<()> {
        let side = self.side_stream()? as sys::CUstream;
        self.order(self.stream(), side)
    }

    fn begin_capture(&self) -> Result<()> {
        self.bind()?;
        let mut capture = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
        if capture.is_some() {
            return Err(Error::invalid(
                "begin_recording",
                "the device is already recording (one recording at a time)",
            ));
        }
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| driver_error(BACKEND, "cuStreamCreate", format!("{e:?}")))?;
        // Relaxed: the capturing thread still allocates and loads kernels meanwhile.
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `stream` was just created on this context and is not capturing.
        if let Err(e) = unsafe { sys::cuStreamBeginCapture_v2(stream, mode).result() } {
            // SAFETY: nothing was queued on the new stream.
            let _ = unsafe { result::stream::destroy(stream) };
            return Err(driver_error(
                BACKEND,
                "cuStreamBeginCapture",
                format!("{e:?}"),
            ));
        }
        *capture = Some((std::thread::current().id(), stream as usize));
        Ok(())
    }

    fn end_capture(&self) -> Result<Graph> {
        self.bind()?;
        let stream = {
            let mut capture = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
            match *capture {
                Some((thread, stream)) if thread == std::thread::current().id() => {
                    *capture = None;
                    stream as sys::CUstream
                }
                _ => {
                    return Err(Error::invalid(
                        "end_recording",
                        "this thread is not recording on the device",
                    ))
                }
            }
        };
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `stream` is the capture stream `begin_capture` made; the graph is destroyed
        // once instantiated (the executable graph is independent of it), and the stream once
        // its capture has ended (nothing was run on it).
        unsafe {
            let ended = sys::cuStreamEndCapture(stream, &mut graph).result();
            let _ = result::stream::destroy(stream);
            ended.map_err(|e| driver_error(BACKEND, "cuStreamEndCapture", format!("{e:?}")))?;
            let made = sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0).result();
            let _ = sys::cuGraphDestroy(graph);
            made.map_err(|e| driver_error(BACKEND, "cuGraphInstantiate", format!("{e:?}")))?;
            check(
                "cuGraphUpload",
                sys::cuGraphUpload(exec, self.stream).result(),
            )?;
        }
        Ok(Graph(exec as usize))
    }

    fn launch_graph(&self, graph: Graph) -> Result<()> {
        self.bind()?;
        // SAFETY: `graph` came from `end_capture` on this driver and is not yet destroyed.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(graph.0 as sys::CUgraphExec, self.stream).result()
        })
    }

    fn destroy_graph(&self, graph: Graph) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: the graph came from `end_capture`; its launches have finished once the
        // stream is drained, and it is not used again.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            let _ = sys::cuGraphExecDestroy(graph.0 as sys::CUgraphExec);
        }
    }

    fn seconds_between(&self, start: Event, end: Event) -> Result<f64> {
        self.bind()?;
        let (start, end) = (start.0 as sys::CUevent, end.0 as sys::CUevent);
        // SAFETY: both events came from `event` and are released here, once.
        unsafe {
            let waited = check("cuEventSynchronize", result::event::synchronize(end));
            let ms = waited.and_then(|()| {
                result::event::elapsed(start, end)
                    .map_err(|e| driver_error(BACKEND, "cuEventElapsedTime", format!("{e:?}")))
            });
            let _ = result::event::destroy(start);
            let _ = result::event::destroy(end);
            Ok(f64::from(ms?) / 1e3)
        }
    }
}
