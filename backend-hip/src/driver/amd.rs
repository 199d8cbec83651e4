//! AMD: the HIP runtime and hiprtc (in `libamdhip64`), and hipBLASLt for GEMMs, loaded at run
//! time with libloading, so the crate builds without ROCm.
//!
//! What is here: finding the library, listing devices, compiling the kernels with hiprtc for
//! any AMD architecture (the CI compiles every kernel for `gfx90a` and `gfx1030` this way,
//! without a GPU), and [`AmdDriver`]: memory, copies and launches on one stream through the
//! HIP runtime's C API, the same calls as the CUDA driver's; GEMMs through hipBLASLt
//! (`hipblaslt.rs`), planned per shape as cuBLASLt's are; graph capture and replay (HIP
//! graphs, captured on a stream of the recording thread's own); timing events. A device
//! opens without hipBLASLt (ROCm ships it apart, and not for every architecture): its
//! matmuls then say `Unsupported`, naming what is missing, and `tessera devices` says so
//! beside the device. **No AMD GPU has run this code**: it is written against the headers of
//! ROCm 6 and 7 (hipBLASLt) and of the HIP runtime, compiled and unit-tested without a GPU.
//!
//! The device's properties come from `hipGetDeviceProperties` read at the offsets of ROCm 5's
//! `hipDeviceProp_t` (which ROCm 6 still exports under that name beside its
//! `hipGetDevicePropertiesR0600`); the name read there must match `hipDeviceGetName`, or the
//! device is refused rather than misread.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void, CStr, CString};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::thread::ThreadId;

use libloading::Library;
use tessera_core::{Error, PendingBytes, ReadyBytes, Result};

use super::hipblaslt::{self, Blas};
use super::{driver_error, param_words, DevicePtr, Driver, Event, Function, Gemm, Graph, Grid};

const BACKEND: &str = "hip";

/// The HIP runtime library's names, newest first.
const LIBRARY_NAMES: [&str; 3] = ["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"];

/// The HIP runtime, if it loads.
fn library() -> Option<&'static Library> {
    static LIB: OnceLock<Option<Library>> = OnceLock::new();
    LIB.get_or_init(|| {
        LIBRARY_NAMES.iter().find_map(|name| {
            // SAFETY: loading the HIP runtime runs its initializers, which only set up the
            // library's own state.
            unsafe { Library::new(name) }.ok()
        })
    })
    .as_ref()
}

/// The library the backend needs that is absent, if any.
pub(crate) fn missing() -> Option<&'static str> {
    library()
        .is_none()
        .then_some("libamdhip64 (the HIP runtime)")
}

/// Why matmuls cannot run on AMD GPUs here, if they cannot: hipBLASLt absent or lacking a
/// function. (A library too old, or one that refuses the device, shows at the first matmul.)
pub(crate) fn matmul_missing() -> Option<String> {
    let _turn = LIBRARY_TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    hipblaslt::library().err()
}

/// The AMD devices present, by name, each saying so where matmuls cannot run (hipBLASLt
/// absent); none without the runtime or a GPU.
pub(crate) fn probe() -> Vec<String> {
    let Some(lib) = library() else {
        return Vec::new();
    };
    let _turn = LIBRARY_TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    type GetCount = unsafe extern "C" fn(*mut c_int) -> c_int;
    // SAFETY: `hipGetDeviceCount` has this signature in every HIP release; it writes one int.
    let count = unsafe {
        let Ok(get) = lib.get::<GetCount>(b"hipGetDeviceCount\0") else {
            return Vec::new();
        };
        let mut n = 0;
        if get(&mut n) != 0 {
            return Vec::new();
        }
        n
    };
    if count <= 0 {
        return Vec::new();
    }
    let note = match hipblaslt::library() {
        Ok(_) => String::new(),
        Err(why) => format!(" (no matmul: {why})"),
    };
    (0..count).map(|i| format!("AMD GPU {i}{note}")).collect()
}

/// Turns at the library. ROCm 5.2's runtime and hiprtc set up LLVM on first use and hiprtc
/// keeps process-wide compiler state: two threads inside it at once corrupt the heap or abort
/// the process ("Option 'h' registered more than once", seen in this crate's tests). So
/// probing, opening a device (with loading hipBLASLt, which links the runtime) and every
/// compile take turns; compiles are once per kernel and kept on disk, so little waits. The
/// one piece of process-wide state in the crate: it guards the library's, not ours.
static LIBRARY_TURNS: Mutex<()> = Mutex::new(());

/// Compiles HIP C++ `source` for AMD architecture `arch` (`gfx90a`) with hiprtc, with the
/// defines the kernels' prelude expects; the error is the compiler's log.
pub(crate) fn compile(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, String> {
    let _turn = LIBRARY_TURNS.lock().unwrap_or_else(PoisonError::into_inner);
    compile_now(source, name, arch)
}

fn compile_now(source: &str, name: &str, arch: &str) -> Result<Vec<u8>, String> {
    let lib = library().ok_or("libamdhip64 (hiprtc) is not installed")?;
    type Create = unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int;
    type Compile = unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int;
    type Size = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
    type Copy = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
    type Destroy = unsafe extern "C" fn(*mut *mut c_void) -> c_int;
    let src = CString::new(source).map_err(|e| e.to_string())?;
    let file = CString::new(format!("{name}.hip")).map_err(|e| e.to_string())?;
    let options: Vec<CString> = [
        format!("--offload-arch={arch}"),
        "-O3".into(),
        "-std=c++17".into(),
        "-DTESSERA_AMD=1".into(),
    ]
    .into_iter()
    .map(|o| CString::new(o).expect("options have no NUL"))
    .collect();
    let option_ptrs: Vec<*const c_char> = options.iter().map(|o| o.as_ptr()).collect();
    // SAFETY: the symbols have hiprtc's documented signatures; hiprtc reads the NUL-terminated
    // strings above, writes its program handle (destroyed before returning) and copies the log
    // and code into buffers of the sizes it reports.
    unsafe {
        let symbol = |name: &[u8]| {
            lib.get::<*const c_void>(name)
                .map(|s| *s)
                .map_err(|e| format!("hiprtc: {e}"))
        };
        let create: Create = std::mem::transmute(symbol(b"hiprtcCreateProgram\0")?);
        let compile: Compile = std::mem::transmute(symbol(b"hiprtcCompileProgram\0")?);
        let log_size: Size = std::mem::transmute(symbol(b"hiprtcGetProgramLogSize\0")?);
        let log: Copy = std::mem::transmute(symbol(b"hiprtcGetProgramLog\0")?);
        let code_size: Size = std::mem::transmute(symbol(b"hiprtcGetCodeSize\0")?);
        let code: Copy = std::mem::transmute(symbol(b"hiprtcGetCode\0")?);
        let destroy: Destroy = std::mem::transmute(symbol(b"hiprtcDestroyProgram\0")?);
        let mut prog = std::ptr::null_mut();
        let created = create(
            &mut prog,
            src.as_ptr(),
            file.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        );
        if created != 0 {
            return Err(format!("hiprtcCreateProgram failed ({created})"));
        }
        let out = if compile(prog, option_ptrs.len() as c_int, option_ptrs.as_ptr()) == 0 {
            let mut size = 0;
            code_size(prog, &mut size);
            let mut bytes = vec![0u8; size];
            code(prog, bytes.as_mut_ptr() as *mut c_char);
            Ok(bytes)
        } else {
            let mut size = 0;
            log_size(prog, &mut size);
            let mut bytes = vec![0u8; size];
            log(prog, bytes.as_mut_ptr() as *mut c_char);
            Err(String::from_utf8_lossy(&bytes)
                .trim_end_matches('\0')
                .to_string())
        };
        destroy(&mut prog);
        out
    }
}

/// Offsets in ROCm 5's `hipDeviceProp_t` (792 bytes), measured from its header.
mod props {
    pub const SIZE: usize = 792;
    pub const TOTAL_GLOBAL_MEM: usize = 256;
    pub const SHARED_MEM_PER_BLOCK: usize = 264;
    pub const WARP_SIZE: usize = 276;
    pub const GCN_ARCH_NAME: usize = 396;
}

type HipStream = *mut c_void;

/// The HIP runtime's entry points the driver calls, resolved once.
struct Api {
    set_device: unsafe extern "C" fn(c_int) -> c_int,
    stream_create: unsafe extern "C" fn(*mut HipStream, c_uint) -> c_int,
    stream_destroy: unsafe extern "C" fn(HipStream) -> c_int,
    stream_synchronize: unsafe extern "C" fn(HipStream) -> c_int,
    malloc_async: unsafe extern "C" fn(*mut *mut c_void, usize, HipStream) -> c_int,
    free_async: unsafe extern "C" fn(*mut c_void, HipStream) -> c_int,
    htod: unsafe extern "C" fn(*mut c_void, *const c_void, usize, HipStream) -> c_int,
    dtoh: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, HipStream) -> c_int,
    memset: unsafe extern "C" fn(*mut c_void, u8, usize, HipStream) -> c_int,
    module_load: unsafe extern "C" fn(*mut *mut c_void, *const c_void) -> c_int,
    module_unload: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_function: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, *const c_char) -> c_int,
    #[allow(clippy::type_complexity)]
    launch: unsafe extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    event_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> c_int,
    event_record: unsafe extern "C" fn(*mut c_void, HipStream) -> c_int,
    event_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    event_synchronize: unsafe extern "C" fn(*mut c_void) -> c_int,
    /// `hipEventElapsedTime(float* ms, start, stop)`.
    event_elapsed: unsafe extern "C" fn(*mut f32, *mut c_void, *mut c_void) -> c_int,
    stream_wait_event: unsafe extern "C" fn(HipStream, *mut c_void, c_uint) -> c_int,
    /// `hipMalloc`, for hipBLASLt's workspace (allocated once, outside any stream's order).
    malloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    free: unsafe extern "C" fn(*mut c_void) -> c_int,
}

/// `hipEventDefault` (hip_runtime_api.h): an event that also records a time.
const HIP_EVENT_DEFAULT: c_uint = 0;
/// `hipEventDisableTiming` (hip_runtime_api.h): an event that only orders work.
const HIP_EVENT_DISABLE_TIMING: c_uint = 2;
/// `hipStreamNonBlocking` (hip_runtime_api.h): a stream that does not wait for the null
/// stream.
const HIP_STREAM_NON_BLOCKING: c_uint = 1;
/// `hipStreamCaptureModeRelaxed` of `hipStreamCaptureMode` (hip_runtime_api.h: Global 0,
/// ThreadLocal 1, Relaxed 2), as on NVIDIA: the capturing thread still allocates and loads
/// meanwhile.
const HIP_STREAM_CAPTURE_MODE_RELAXED: c_int = 2;

/// A HIP runtime function of type `T` by its NUL-terminated name.
fn symbol<T: Copy>(lib: &Library, name: &str) -> std::result::Result<T, String> {
    // SAFETY: every caller names a HIP runtime C function whose type is `T`
    // (hip_runtime_api.h, stable since ROCm 5).
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{}: {e}", name.trim_end_matches('\0')))
}

/// The HIP runtime's graph functions (hip_runtime_api.h), where the runtime has them.
struct GraphApi {
    /// `hipStreamBeginCapture(stream, hipStreamCaptureMode)`.
    begin_capture: unsafe extern "C" fn(HipStream, c_int) -> c_int,
    /// `hipStreamEndCapture(stream, hipGraph_t*)`.
    end_capture: unsafe extern "C" fn(HipStream, *mut *mut c_void) -> c_int,
    /// `hipGraphInstantiateWithFlags(hipGraphExec_t*, hipGraph_t, unsigned long long)`.
    instantiate: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_ulonglong) -> c_int,
    /// `hipGraphUpload(exec, stream)`: from ROCm 5.5; without it the first launch uploads.
    upload: Option<unsafe extern "C" fn(*mut c_void, HipStream) -> c_int>,
    launch: unsafe extern "C" fn(*mut c_void, HipStream) -> c_int,
    exec_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
}

impl GraphApi {
    fn load(lib: &Library) -> std::result::Result<GraphApi, String> {
        Ok(GraphApi {
            begin_capture: symbol(lib, "hipStreamBeginCapture\0")?,
            end_capture: symbol(lib, "hipStreamEndCapture\0")?,
            instantiate: symbol(lib, "hipGraphInstantiateWithFlags\0")?,
            upload: symbol(lib, "hipGraphUpload\0").ok(),
            launch: symbol(lib, "hipGraphLaunch\0")?,
            exec_destroy: symbol(lib, "hipGraphExecDestroy\0")?,
            destroy: symbol(lib, "hipGraphDestroy\0")?,
        })
    }
}

impl Api {
    fn load(lib: &Library) -> std::result::Result<Api, String> {
        Ok(Api {
            set_device: symbol(lib, "hipSetDevice\0")?,
            stream_create: symbol(lib, "hipStreamCreateWithFlags\0")?,
            stream_destroy: symbol(lib, "hipStreamDestroy\0")?,
            stream_synchronize: symbol(lib, "hipStreamSynchronize\0")?,
            malloc_async: symbol(lib, "hipMallocAsync\0")?,
            free_async: symbol(lib, "hipFreeAsync\0")?,
            htod: symbol(lib, "hipMemcpyHtoDAsync\0")?,
            dtoh: symbol(lib, "hipMemcpyDtoHAsync\0")?,
            memset: symbol(lib, "hipMemsetD8Async\0")?,
            module_load: symbol(lib, "hipModuleLoadData\0")?,
            module_unload: symbol(lib, "hipModuleUnload\0")?,
            get_function: symbol(lib, "hipModuleGetFunction\0")?,
            launch: symbol(lib, "hipModuleLaunchKernel\0")?,
            error_string: symbol(lib, "hipGetErrorString\0")?,
            event_create: symbol(lib, "hipEventCreateWithFlags\0")?,
            event_record: symbol(lib, "hipEventRecord\0")?,
            event_destroy: symbol(lib, "hipEventDestroy\0")?,
            event_synchronize: symbol(lib, "hipEventSynchronize\0")?,
            event_elapsed: symbol(lib, "hipEventElapsedTime\0")?,
            stream_wait_event: symbol(lib, "hipStreamWaitEvent\0")?,
            malloc: symbol(lib, "hipMalloc\0")?,
            free: symbol(lib, "hipFree\0")?,
        })
    }
}

/// hipErrorOutOfMemory.
const HIP_ERROR_OUT_OF_MEMORY: c_int = 2;

/// hipBLASLt on one device, with its workspace: what GEMMs need.
struct Matmul {
    blas: Blas,
    workspace: DevicePtr,
}

/// One AMD GPU. **Unrun**: written against the HIP runtime's and hipBLASLt's headers,
/// compiled and unit-tested without a GPU, never run on one.
pub(crate) struct AmdDriver {
    api: Api,
    /// The graph functions, or the one this runtime lacks (recording is then refused).
    graphs: std::result::Result<GraphApi, String>,
    ordinal: c_int,
    stream: HipStream,
    name: String,
    arch: String,
    total_memory: usize,
    modules: Mutex<Vec<usize>>,
    /// hipBLASLt, made when the device opens (never inside a capture, which its handle's
    /// creation breaks), or why matmuls cannot run.
    matmul: std::result::Result<Matmul, String>,
    /// The thread capturing a graph, and its capture stream.
    capture: Mutex<Option<(ThreadId, usize)>>,
    /// The side stream ([`Driver::side_stream`]), once made.
    side: OnceLock<usize>,
}

// SAFETY: the streams, modules and hipBLASLt's handle and descriptors are HIP runtime and
// hipBLASLt handles, usable from any thread once the device is current (each method sets it
// first); what changes is behind locks.
unsafe impl Send for AmdDriver {}
// SAFETY: as above.
unsafe impl Sync for AmdDriver {}

/// The device properties the driver reads, from ROCm 5's `hipDeviceProp_t` bytes.
fn read_props(bytes: &[u8]) -> (String, String, u32, usize, usize) {
    let c_string = |at: usize, len: usize| {
        let field = &bytes[at..at + len];
        let end = field.iter().position(|&b| b == 0).unwrap_or(len);
        String::from_utf8_lossy(&field[..end]).into_owned()
    };
    let u64_at = |at: usize| u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap_or([0; 8]));
    let i32_at = |at: usize| i32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap_or([0; 4]));
    let arch = c_string(props::GCN_ARCH_NAME, 256);
    // `gfx90a:sramecc+:xnack-`: the target features follow the architecture.
    let arch = arch.split(':').next().unwrap_or_default().to_string();
    (
        c_string(0, 256),
        arch,
        i32_at(props::WARP_SIZE).max(0) as u32,
        u64_at(props::TOTAL_GLOBAL_MEM) as usize,
        u64_at(props::SHARED_MEM_PER_BLOCK) as usize,
    )
}

impl AmdDriver {
    pub(crate) fn open(ordinal: usize) -> Result<AmdDriver> {
        let device_error = |detail: String| Error::Device {
            name: format!("hip:{ordinal}"),
            detail,
        };
        let lib = library().ok_or_else(|| {
            device_error("libamdhip64 (the HIP runtime) could not be loaded".into())
        })?;
        let _turn = LIBRARY_TURNS.lock().unwrap_or_else(PoisonError::into_inner);
        let api = Api::load(lib).map_err(device_error)?;
        type GetName = unsafe extern "C" fn(*mut c_char, c_int, c_int) -> c_int;
        type GetProps = unsafe extern "C" fn(*mut c_void, c_int) -> c_int;
        let device = ordinal as c_int;
        let mut name_buf = [0u8; 256];
        let mut prop_bytes = vec![0u8; props::SIZE + 1024];
        // SAFETY: the symbols have these signatures; `hipDeviceGetName` writes at most the
        // given length, `hipGetDeviceProperties` at most its struct's size (the buffer has
        // room past ROCm 5's).
        let (named, propped) = unsafe {
            let get_name = lib
                .get::<GetName>(b"hipDeviceGetName\0")
                .map_err(|e| device_error(e.to_string()))?;
            let get_props = lib
                .get::<GetProps>(b"hipGetDeviceProperties\0")
                .map_err(|e| device_error(e.to_string()))?;
            (
                get_name(name_buf.as_mut_ptr() as *mut c_char, 256, device),
                get_props(prop_bytes.as_mut_ptr() as *mut c_void, device),
            )
        };
        if named != 0 || propped != 0 {
            return Err(device_error(format!(
                "hipDeviceGetName / hipGetDeviceProperties failed ({named}, {propped})"
            )));
        }
        let name = CStr::from_bytes_until_nul(&name_buf)
            .map(|c| c.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (prop_name, arch, warp_size, total_memory, _) = read_props(&prop_bytes);
        if prop_name != name || !arch.starts_with("gfx") || !matches!(warp_size, 32 | 64) {
            return Err(device_error(format!(
                "this HIP runtime's device properties are laid out differently from ROCm 5's \
                 (read name {prop_name:?}, arch {arch:?}, warp size {warp_size})"
            )));
        }
        let mut driver = AmdDriver {
            api,
            graphs: GraphApi::load(lib),
            ordinal: device,
            stream: std::ptr::null_mut(),
            name,
            arch,
            total_memory,
            modules: Mutex::new(Vec::new()),
            matmul: Err(String::new()),
            capture: Mutex::new(None),
            side: OnceLock::new(),
        };
        driver.bind()?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: creates a non-blocking stream on the current device.
        driver.check("hipStreamCreateWithFlags", unsafe {
            (driver.api.stream_create)(&mut stream, HIP_STREAM_NON_BLOCKING)
        })?;
        driver.stream = stream;
        driver.matmul = driver.open_matmul();
        Ok(driver)
    }

    /// hipBLASLt's handle and workspace on this device, or why matmuls cannot run. Called
    /// while the device opens, with the library's turn held and the device current.
    fn open_matmul(&self) -> std::result::Result<Matmul, String> {
        let blas = Blas::open()?;
        let mut workspace = std::ptr::null_mut();
        // SAFETY: a plain allocation on the current device, freed in `Drop`.
        let code = unsafe { (self.api.malloc)(&mut workspace, hipblaslt::WORKSPACE_BYTES) };
        self.check("hipMalloc (hipBLASLt's workspace)", code)
            .map_err(|e| e.to_string())?;
        Ok(Matmul {
            blas,
            workspace: workspace as DevicePtr,
        })
    }

    /// The stream the calling thread queues on: its capture stream while it captures a graph,
    /// else the device's stream.
    fn stream(&self) -> HipStream {
        match *self.capture.lock().unwrap_or_else(PoisonError::into_inner) {
            Some((thread, stream)) if thread == std::thread::current().id() => stream as HipStream,
            _ => self.stream,
        }
    }

    /// The graph functions, or `Unsupported` naming the one this runtime lacks.
    fn graphs(&self) -> Result<&GraphApi> {
        self.graphs.as_ref().map_err(|missing| {
            Error::unsupported(
                BACKEND,
                format!("graph capture with this HIP runtime (it lacks {missing})"),
            )
        })
    }

    /// Makes `waiting` wait for the work queued so far on `queued`, through an event.
    fn order(&self, waiting: HipStream, queued: HipStream) -> Result<()> {
        self.bind()?;
        let mut event = std::ptr::null_mut();
        // SAFETY: both streams belong to this device; the event is created here, and
        // destroying it once the wait is queued is allowed (the wait keeps what it needs).
        unsafe {
            self.check(
                "hipEventCreateWithFlags",
                (self.api.event_create)(&mut event, HIP_EVENT_DISABLE_TIMING),
            )?;
            let ordered = self
                .check("hipEventRecord", (self.api.event_record)(event, queued))
                .and_then(|()| {
                    self.check(
                        "hipStreamWaitEvent",
                        (self.api.stream_wait_event)(waiting, event, 0),
                    )
                });
            (self.api.event_destroy)(event);
            ordered
        }
    }

    fn check(&self, what: &str, code: c_int) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static NUL-terminated string for any code.
        let text = unsafe { CStr::from_ptr((self.api.error_string)(code)) };
        Err(driver_error(BACKEND, what, text.to_string_lossy()))
    }
}

impl Drop for AmdDriver {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: the stream, modules, hipBLASLt's handle and workspace are this driver's,
        // unused after this; the stream is drained first.
        unsafe {
            (self.api.stream_synchronize)(self.stream);
            if let Ok(matmul) = std::mem::replace(&mut self.matmul, Err(String::new())) {
                drop(matmul.blas);
                (self.api.free)(matmul.workspace as *mut c_void);
            }
            for module in self
                .modules
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .drain(..)
            {
                (self.api.module_unload)(module as *mut c_void);
            }
            if let Some(&side) = self.side.get() {
                (self.api.stream_synchronize)(side as HipStream);
                (self.api.stream_destroy)(side as HipStream);
            }
            (self.api.stream_destroy)(self.stream);
        }
    }
}

impl Driver for AmdDriver {
    fn backend(&self) -> &'static str {
        BACKEND
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: selects a device by the ordinal that opened it.
        self.check("hipSetDevice", unsafe {
            (self.api.set_device)(self.ordinal)
        })
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

    /// The LDS a workgroup may use on CDNA and RDNA alike.
    fn max_shared_bytes(&self) -> usize {
        64 * 1024
    }

    fn compiler(&self) -> String {
        type Version = unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int;
        let (mut major, mut minor) = (0, 0);
        if let Some(lib) = library() {
            // SAFETY: `hiprtcVersion` writes two ints.
            unsafe {
                if let Ok(version) = lib.get::<Version>(b"hiprtcVersion\0") {
                    version(&mut major, &mut minor);
                }
            }
        }
        format!("hiprtc {major}.{minor}")
    }

    fn compile(&self, source: &str, name: &str) -> std::result::Result<Vec<u8>, String> {
        compile(source, name, &self.arch)
    }

    fn load(&self, image: &[u8], entry: &str) -> Result<Function> {
        self.bind()?;
        let entry_c = CString::new(entry).map_err(|e| driver_error(BACKEND, "kernel name", e))?;
        let mut module = std::ptr::null_mut();
        let mut function = std::ptr::null_mut();
        // SAFETY: `image` is a code object hiprtc built for this device; the module lives until
        // the driver is dropped, and so does the function taken from it.
        unsafe {
            self.check(
                "hipModuleLoadData",
                (self.api.module_load)(&mut module, image.as_ptr() as *const c_void),
            )?;
            self.modules
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(module as usize);
            self.check(
                "hipModuleGetFunction",
                (self.api.get_function)(&mut function, module, entry_c.as_ptr()),
            )?;
        }
        Ok(Function(function as usize))
    }

    fn launch(
        &self,
        function: Function,
        grid: Grid,
        params: &[u8],
        _start_early: bool,
    ) -> Result<()> {
        self.bind()?;
        let mut words = param_words(params);
        let mut args = [words.as_mut_ptr() as *mut c_void];
        // SAFETY: as on NVIDIA: the function's one parameter is the struct these bytes
        // encode, copied by the runtime before returning.
        self.check("hipModuleLaunchKernel", unsafe {
            (self.api.launch)(
                function.0 as *mut c_void,
                grid.blocks[0],
                grid.blocks[1],
                grid.blocks[2],
                grid.threads,
                1,
                1,
                grid.shared_bytes,
                self.stream(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn alloc(&self, bytes: usize) -> Result<Option<DevicePtr>> {
        self.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: a stream-ordered allocation on this device's stream.
        match unsafe { (self.api.malloc_async)(&mut ptr, bytes.max(1), self.stream) } {
            0 => Ok(Some(ptr as DevicePtr)),
            HIP_ERROR_OUT_OF_MEMORY => Ok(None),
            code => self.check("hipMallocAsync", code).map(|()| None),
        }
    }

    fn free(&self, ptr: DevicePtr) {
        if self.bind().is_ok() {
            // SAFETY: `ptr` came from `alloc`; the free is ordered after queued work.
            unsafe { (self.api.free_async)(ptr as *mut c_void, self.stream) };
        }
    }

    fn upload(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked the range; the runtime copies pageable memory out before
        // returning.
        let code = unsafe {
            (self.api.htod)(
                dst as *mut c_void,
                data.as_ptr() as *const c_void,
                data.len(),
                self.stream(),
            )
        };
        self.check("hipMemcpyHtoDAsync", code)
    }

    fn download(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        if out.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked the range; the stream is synchronized before `out` is
        // used.
        unsafe {
            self.check(
                "hipMemcpyDtoHAsync",
                (self.api.dtoh)(
                    out.as_mut_ptr() as *mut c_void,
                    src as *mut c_void,
                    out.len(),
                    self.stream(),
                ),
            )?;
            self.check(
                "hipStreamSynchronize",
                (self.api.stream_synchronize)(self.stream()),
            )
        }
    }

    fn zero(&self, dst: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the caller checked the range.
        let code = unsafe { (self.api.memset)(dst as *mut c_void, 0, bytes, self.stream()) };
        self.check("hipMemsetD8Async", code)
    }

    fn gemm(&self, g: &Gemm) -> Result<()> {
        let matmul = self.matmul.as_ref().map_err(|why| {
            Error::unsupported(BACKEND, format!("matmul on this AMD GPU ({why})"))
        })?;
        self.bind()?;
        matmul.blas.gemm(
            g,
            matmul.workspace,
            hipblaslt::WORKSPACE_BYTES,
            self.stream(),
        )
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: the stream is this driver's.
        self.check("hipStreamSynchronize", unsafe {
            (self.api.stream_synchronize)(self.stream)
        })
    }

    /// A plain read: page-locked staging is not written for AMD yet.
    fn download_later(&self, src: DevicePtr, len: usize) -> Result<Box<dyn PendingBytes>> {
        let mut out = vec![0u8; len];
        self.download(src, &mut out)?;
        Ok(Box::new(ReadyBytes(out)))
    }

    fn side_stream(&self) -> Result<usize> {
        if let Some(&stream) = self.side.get() {
            return Ok(stream);
        }
        self.bind()?;
        let mut stream = std::ptr::null_mut();
        // SAFETY: creates a non-blocking stream on the current device.
        self.check("hipStreamCreateWithFlags", unsafe {
            (self.api.stream_create)(&mut stream, HIP_STREAM_NON_BLOCKING)
        })?;
        if self.side.set(stream as usize).is_err() {
            // SAFETY: another thread made the side stream first; this one is unused.
            unsafe { (self.api.stream_destroy)(stream) };
        }
        Ok(*self.side.get().unwrap_or(&(stream as usize)))
    }

    fn side_after_queued(&self) -> Result<()> {
        let side = self.side_stream()? as HipStream;
        self.order(side, self.stream())
    }

    fn queued_after_side(&self) -> Result<()> {
        let side = self.side_stream()? as HipStream;
        self.order(self.stream(), side)
    }

    fn event(&self) -> Result<Event> {
        self.bind()?;
        let mut event = std::ptr::null_mut();
        // SAFETY: creates an event on the current device and records it on this driver's
        // stream; an event that fails to record is destroyed here, unused.
        unsafe {
            self.check(
                "hipEventCreateWithFlags",
                (self.api.event_create)(&mut event, HIP_EVENT_DEFAULT),
            )?;
            let recorded = self.check(
                "hipEventRecord",
                (self.api.event_record)(event, self.stream()),
            );
            if recorded.is_err() {
                (self.api.event_destroy)(event);
            }
            recorded?;
        }
        Ok(Event(event as usize))
    }

    fn seconds_between(&self, start: Event, end: Event) -> Result<f64> {
        self.bind()?;
        let (start, end) = (start.0 as *mut c_void, end.0 as *mut c_void);
        let mut ms = 0.0f32;
        // SAFETY: both events came from `event` and are released here, once.
        unsafe {
            let waited = self.check("hipEventSynchronize", (self.api.event_synchronize)(end));
            let timed = waited.and_then(|()| {
                self.check(
                    "hipEventElapsedTime",
                    (self.api.event_elapsed)(&mut ms, start, end),
                )
            });
            (self.api.event_destroy)(start);
            (self.api.event_destroy)(end);
            timed?;
        }
        Ok(f64::from(ms) / 1e3)
    }

    fn begin_capture(&self) -> Result<()> {
        let graphs = self.graphs()?;
        self.bind()?;
        let mut capture = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
        if capture.is_some() {
            return Err(Error::invalid(
                "begin_recording",
                "the device is already recording (one recording at a time)",
            ));
        }
        let mut stream = std::ptr::null_mut();
        // SAFETY: creates a non-blocking stream on the current device.
        self.check("hipStreamCreateWithFlags", unsafe {
            (self.api.stream_create)(&mut stream, HIP_STREAM_NON_BLOCKING)
        })?;
        // SAFETY: `stream` was just created on this device and is not capturing.
        let began = self.check("hipStreamBeginCapture", unsafe {
            (graphs.begin_capture)(stream, HIP_STREAM_CAPTURE_MODE_RELAXED)
        });
        if let Err(e) = began {
            // SAFETY: nothing was queued on the new stream.
            unsafe { (self.api.stream_destroy)(stream) };
            return Err(e);
        }
        *capture = Some((std::thread::current().id(), stream as usize));
        Ok(())
    }

    fn end_capture(&self) -> Result<Graph> {
        let graphs = self.graphs()?;
        self.bind()?;
        let stream = {
            let mut capture = self.capture.lock().unwrap_or_else(PoisonError::into_inner);
            match *capture {
                Some((thread, stream)) if thread == std::thread::current().id() => {
                    *capture = None;
                    stream as HipStream
                }
                _ => {
                    return Err(Error::invalid(
                        "end_recording",
                        "this thread is not recording on the device",
                    ))
                }
            }
        };
        let mut graph = std::ptr::null_mut();
        let mut exec = std::ptr::null_mut();
        // SAFETY: `stream` is the capture stream `begin_capture` made; the graph is destroyed
        // once instantiated (the executable graph is independent of it), and the stream once
        // its capture has ended (nothing was run on it).
        unsafe {
            let ended = self.check(
                "hipStreamEndCapture",
                (graphs.end_capture)(stream, &mut graph),
            );
            (self.api.stream_destroy)(stream);
            ended?;
            let made = self.check(
                "hipGraphInstantiateWithFlags",
                (graphs.instantiate)(&mut exec, graph, 0),
            );
            (graphs.destroy)(graph);
            made?;
            if let Some(upload) = graphs.upload {
                let uploaded = self.check("hipGraphUpload", upload(exec, self.stream));
                if let Err(e) = uploaded {
                    (graphs.exec_destroy)(exec);
                    return Err(e);
                }
            }
        }
        Ok(Graph(exec as usize))
    }

    fn launch_graph(&self, graph: Graph) -> Result<()> {
        let graphs = self.graphs()?;
        self.bind()?;
        // SAFETY: `graph` came from `end_capture` on this driver and is not yet destroyed.
        self.check("hipGraphLaunch", unsafe {
            (graphs.launch)(graph.0 as *mut c_void, self.stream)
        })
    }

    fn destroy_graph(&self, graph: Graph) {
        let Ok(graphs) = self.graphs() else {
            return;
        };
        if self.bind().is_err() {
            return;
        }
        // SAFETY: the graph came from `end_capture`; its launches have finished once the
        // stream is drained, and it is not used again.
        unsafe {
            (self.api.stream_synchronize)(self.stream);
            (graphs.exec_destroy)(graph.0 as *mut c_void);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The properties are read where ROCm 5's header puts them.
    #[test]
    fn device_properties_are_read_at_rocm5_offsets() {
        let mut bytes = vec![0u8; props::SIZE];
        bytes[..10].copy_from_slice(b"Radeon Pro");
        bytes[props::TOTAL_GLOBAL_MEM..props::TOTAL_GLOBAL_MEM + 8]
            .copy_from_slice(&(64u64 << 30).to_ne_bytes());
        bytes[props::SHARED_MEM_PER_BLOCK..props::SHARED_MEM_PER_BLOCK + 8]
            .copy_from_slice(&65536u64.to_ne_bytes());
        bytes[props::WARP_SIZE..props::WARP_SIZE + 4].copy_from_slice(&64i32.to_ne_bytes());
        let arch = b"gfx90a:sramecc+:xnack-";
        bytes[props::GCN_ARCH_NAME..props::GCN_ARCH_NAME + arch.len()].copy_from_slice(arch);
        let (name, arch, warp, memory, shared) = read_props(&bytes);
        assert_eq!(name, "Radeon Pro");
        assert_eq!(arch, "gfx90a");
        assert_eq!(warp, 64);
        assert_eq!(memory, 64 << 30);
        assert_eq!(shared, 65536);
    }

    /// Every runtime function the driver resolves, graphs' and events' included, exists under
    /// its name in the HIP runtime installed here, where there is one (CI installs Debian's
    /// ROCm 5.2): a misspelt name would refuse every device, or every recording.
    #[test]
    fn runtime_functions_resolve_where_a_runtime_is_installed() {
        let Some(lib) = library() else {
            eprintln!("skipped: libamdhip64 is not installed, so no symbol was resolved");
            return;
        };
        if let Err(missing) = Api::load(lib) {
            panic!("the HIP runtime lacks {missing}");
        }
        if let Err(missing) = GraphApi::load(lib) {
            panic!("the HIP runtime lacks {missing}");
        }
    }

    /// Probing without hipBLASLt neither panics nor hides it: the reason matmuls cannot run
    /// names the library.
    #[test]
    fn an_absent_hipblaslt_is_named() {
        let devices = probe();
        match matmul_missing() {
            Some(why) => {
                assert!(why.contains("libhipblaslt"), "{why}");
                assert!(devices.iter().all(|d| d.contains(&why)), "{devices:?}");
            }
            None => assert!(
                devices.iter().all(|d| !d.contains("no matmul")),
                "{devices:?}"
            ),
        }
    }
}
