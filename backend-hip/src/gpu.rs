//! A device's runtime state that the op planners launch through: the driver, the memory
//! pool, the kernels compiled so far, and the recording in progress (CUDA graphs: the
//! recording thread's allocations come from a pool of the recording's own, and the buffers
//! its kernels touch stay alive with the graph).
//!
//! A kernel's source is the prelude, the planner's defines, its parameter struct and its
//! family's file (`kernels/<family>.hip`). Compiled code is kept in memory per planner key and
//! on disk (core's [`DiskCache`], folder `hip/`) under the hash of the compiler, architecture
//! and source, so a second run loads what the first compiled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use tessera_core::exec::{fnv1a, DiskCache};
use tessera_core::memory::{Pool, RecordingPools};
use tessera_core::{
    Buffer, DeviceInfo, Error, KernelTime, KernelTotals, MemoryStats, Recording, Result, TensorRef,
};

use crate::driver::{DevicePtr, Driver, Event, Function, Graph, Grid};
use crate::memory::{self, lock, Block, SharedPool};
use crate::params::Params;

const PRELUDE: &str = include_str!("../kernels/prelude.hip");

/// What a kernel is compiled from: its family's source, the entry point, defines, and the
/// C++ declaration of its parameter struct.
pub(crate) struct Source {
    pub family: &'static str,
    pub entry: &'static str,
    pub defines: Vec<(String, String)>,
    pub params: String,
}

impl Source {
    pub(crate) fn new<P: Params>(family: &'static str, entry: &'static str) -> Source {
        Source {
            family,
            entry,
            defines: Vec::new(),
            params: P::cxx(),
        }
    }

    pub(crate) fn define(mut self, name: &str, value: impl Into<String>) -> Source {
        self.defines.push((name.into(), value.into()));
        self
    }

    /// The whole translation unit.
    pub(crate) fn text(&self) -> String {
        let mut s = String::from(PRELUDE);
        for (name, value) in &self.defines {
            s += &format!("#define {name} {value}\n");
        }
        s += &self.params;
        s += self.family;
        s
    }
}

pub(crate) struct Gpu {
    pub driver: Arc<dyn Driver>,
    pub info: DeviceInfo,
    pub pool: SharedPool,
    functions: Mutex<HashMap<String, Function>>,
    disk: Option<DiskCache>,
    pub syncs: AtomicU64,
    profile: Mutex<Profile>,
    capture: Mutex<Option<Capture>>,
    /// The pools of live recordings, whose memory their graphs hold for as long as they live.
    recording_pools: RecordingPools<Block>,
    /// Whether kernels may start before the one ahead of them has finished: on unless
    /// `TESSERA_EARLY_LAUNCH=0`, and off while kernels are timed (an early start would
    /// blur each kernel's events).
    start_early: AtomicBool,
}

/// A recording in progress: the thread whose work is captured, the pool its allocations come
/// from, and the buffers from elsewhere that its kernels touch, by address (kept for as long
/// as the graph lives, so none returns to a pool while a replay may use it).
struct Capture {
    thread: ThreadId,
    pool: SharedPool,
    kept: HashMap<usize, Arc<dyn Buffer>>,
}

/// A captured graph with the memory it runs on. Dropping it waits for its replays.
pub(crate) struct GpuRecording {
    driver: Arc<dyn Driver>,
    graph: Graph,
    _pool: SharedPool,
    _kept: Vec<Arc<dyn Buffer>>,
}

impl std::fmt::Debug for GpuRecording {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRecording")
            .field("graph", &self.graph)
            .field("buffers", &self._kept.len())
            .finish()
    }
}

impl Recording for GpuRecording {
    fn replay(&self) -> Result<()> {
        self.driver.launch_graph(self.graph)
    }
}

impl Drop for GpuRecording {
    fn drop(&mut self) {
        self.driver.destroy_graph(self.graph);
    }
}

/// Kernel times while profiling: launches bracketed by events, resolved into totals when
/// asked for (or when many are pending).
#[derive(Default)]
struct Profile {
    on: bool,
    pending: Vec<(String, Event, Event)>,
    totals: KernelTotals,
}

/// Pending timed launches past which they are resolved (a wait for the queue).
const MAX_PENDING_TIMES: usize = 4096;

impl Gpu {
    pub(crate) fn new(driver: Arc<dyn Driver>, info: DeviceInfo) -> Gpu {
        Gpu {
            driver,
            info,
            pool: SharedPool::default(),
            functions: Mutex::new(HashMap::new()),
            disk: DiskCache::for_backend("hip"),
            syncs: AtomicU64::new(0),
            profile: Mutex::new(Profile::default()),
            capture: Mutex::new(None),
            recording_pools: RecordingPools::default(),
            start_early: AtomicBool::new(early_launch_allowed()),
        }
    }

    pub(crate) fn backend(&self) -> &'static str {
        self.driver.backend()
    }

    /// The most shared memory one block may ask for, in bytes.
    pub(crate) fn max_shared_bytes(&self) -> usize {
        self.driver.max_shared_bytes()
    }

    /// The kernel the planner calls `key`, compiled from `source()` the first time.
    pub(crate) fn function(
        &self,
        key: &str,
        source: impl FnOnce() -> Result<Source>,
    ) -> Result<Function> {
        if let Some(&f) = lock(&self.functions).get(key) {
            return Ok(f);
        }
        if self.recording_here() {
            // Loading a module inside a stream capture invalidates the capture.
            return Err(Error::invalid(
                "begin_recording",
                format!(
                    "kernel {key} is first used inside a recording, where it cannot be \
                     loaded; run the step once before recording it"
                ),
            ));
        }
        let source = source()?;
        let text = source.text();
        let compiler = self.driver.compiler();
        let name = format!(
            "{}-{:016x}",
            self.driver.arch(),
            fnv1a(format!("{compiler}\n{text}").as_bytes())
        );
        let image = match self.disk.as_ref().and_then(|d| d.load(&name)) {
            Some(image) => image,
            None => {
                let image =
                    self.driver
                        .compile(&text, source.entry)
                        .map_err(|log| Error::Compile {
                            backend: self.backend().into(),
                            op: key.into(),
                            log,
                        })?;
                if let Some(disk) = &self.disk {
                    disk.store(&name, &image);
                }
                image
            }
        };
        let f = self.driver.load(&image, source.entry)?;
        lock(&self.functions).insert(key.to_string(), f);
        Ok(f)
    }

    /// Launches kernel `key` (built from `source()` the first time) with `params`.
    pub(crate) fn run<P: Params>(
        &self,
        key: &str,
        source: impl FnOnce() -> Result<Source>,
        grid: Grid,
        params: &P,
    ) -> Result<()> {
        let f = self.function(key, source)?;
        let start_early = self.start_early.load(Ordering::Relaxed);
        self.driver.launch(f, grid, &params.bytes(), start_early)
    }

    /// Runs `enqueue`, timing what it queues as kernel `name()` while profiling.
    pub(crate) fn timed(
        &self,
        name: impl FnOnce() -> String,
        enqueue: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        if !lock(&self.profile).on {
            return enqueue();
        }
        let start = self.driver.event()?;
        enqueue()?;
        let end = self.driver.event()?;
        let mut profile = lock(&self.profile);
        profile.pending.push((name(), start, end));
        if profile.pending.len() >= MAX_PENDING_TIMES {
            self.resolve(&mut profile)?;
        }
        Ok(())
    }

    fn resolve(&self, profile: &mut Profile) -> Result<()> {
        for (name, start, end) in std::mem::take(&mut profile.pending) {
            let seconds = self.driver.seconds_between(start, end)?;
            profile.totals.add(&name, seconds);
        }
        Ok(())
    }

    /// Starts (clearing earlier times) or stops timing launches.
    pub(crate) fn set_profiling(&self, on: bool) -> Result<()> {
        if on {
            // Fails where the driver cannot time, before anything changes.
            let probe = self.driver.event()?;
            let end = self.driver.event()?;
            self.driver.seconds_between(probe, end)?;
        }
        let mut profile = lock(&self.profile);
        self.resolve(&mut profile)?;
        if on {
            profile.totals.clear();
        }
        profile.on = on;
        self.start_early
            .store(!on && early_launch_allowed(), Ordering::Relaxed);
        Ok(())
    }

    /// Kernel times since profiling started, slowest first.
    pub(crate) fn profile(&self) -> Vec<KernelTime> {
        let mut profile = lock(&self.profile);
        let _ = self.resolve(&mut profile);
        profile.totals.report()
    }

    /// A buffer of `bytes` from the pool (scratch for partial results, say); while the
    /// calling thread records, from the recording's pool.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let pool = match &*lock(&self.capture) {
            Some(c) if c.thread == std::thread::current().id() => c.pool.clone(),
            _ => self.pool.clone(),
        };
        memory::alloc(&self.driver, &pool, bytes)
    }

    /// Whether the calling thread is recording.
    pub(crate) fn recording_here(&self) -> bool {
        lock(&self.capture)
            .as_ref()
            .is_some_and(|c| c.thread == std::thread::current().id())
    }

    /// While the calling thread records, keeps the buffers of `tensors` that did not come
    /// from the recording's pool alive as long as the recording.
    pub(crate) fn keep(&self, tensors: &[TensorRef<'_>]) {
        let mut capture = lock(&self.capture);
        let Some(c) = capture
            .as_mut()
            .filter(|c| c.thread == std::thread::current().id())
        else {
            return;
        };
        for t in tensors {
            if !memory::from_pool(t.buffer, &c.pool) {
                let key = Arc::as_ptr(t.buffer) as *const () as usize;
                c.kept.entry(key).or_insert_with(|| t.buffer.clone());
            }
        }
    }

    /// Starts recording the calling thread's work (`Device::begin_recording`).
    pub(crate) fn begin_recording(&self) -> Result<()> {
        // Timing brackets every launch with events, which a graph cannot hold: profiled
        // steps run eagerly, kernel by kernel.
        if lock(&self.profile).on {
            return Err(Error::unsupported(
                self.backend(),
                "recording work while kernels are profiled",
            ));
        }
        let mut capture = lock(&self.capture);
        if capture.is_some() {
            return Err(Error::invalid(
                "begin_recording",
                "the device is already recording (one recording at a time)",
            ));
        }
        self.driver.begin_capture()?;
        *capture = Some(Capture {
            thread: std::thread::current().id(),
            pool: Arc::new(Mutex::new(Pool::for_recording())),
            kept: HashMap::new(),
        });
        Ok(())
    }

    /// Ends the calling thread's recording (`Device::end_recording`).
    pub(crate) fn end_recording(&self) -> Result<Box<dyn Recording>> {
        let capture = {
            let mut slot = lock(&self.capture);
            match slot.take() {
                Some(c) if c.thread == std::thread::current().id() => c,
                other => {
                    *slot = other;
                    return Err(Error::invalid(
                        "end_recording",
                        "this thread is not recording on the device",
                    ));
                }
            }
        };
        let graph = self.driver.end_capture()?;
        self.recording_pools.hold(&capture.pool);
        Ok(Box::new(GpuRecording {
            driver: self.driver.clone(),
            graph,
            _pool: capture.pool,
            _kept: capture.kept.into_values().collect(),
        }))
    }

    /// The memory statistics of the device's pool, with the memory live recordings hold
    /// counted as in use from the start of the peak's window (a conservative peak: a
    /// recording keeps its step's memory for as long as it lives).
    pub(crate) fn memory(&self) -> MemoryStats {
        self.recording_pools.add_to(lock(&self.pool).stats())
    }

    /// The device address of `t`'s first element.
    pub(crate) fn ptr(&self, t: &TensorRef<'_>) -> Result<DevicePtr> {
        memory::address(self.backend(), t)
    }

    pub(crate) fn count_sync(&self) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }
}

/// Whether the environment lets kernels start early (`TESSERA_EARLY_LAUNCH=0` turns it off,
/// to compare or to rule it out when something looks wrong).
fn early_launch_allowed() -> bool {
    std::env::var("TESSERA_EARLY_LAUNCH").map_or(true, |v| v != "0")
}

/// Blocks of `threads` for `n` items, one item per thread, grid-stride beyond the grid's
/// limit: the x dimension up to 65,535 blocks and y for the rest.
pub(crate) fn grid_for(n: usize, threads: u32) -> Grid {
    let blocks = n.div_ceil(threads as usize).max(1);
    let x = blocks.min(65_535);
    let y = blocks.div_ceil(x).min(65_535);
    Grid {
        blocks: [x as u32, y as u32, 1],
        threads,
        shared_bytes: 0,
    }
}

/// One block per row for `rows` rows: x up to 65,535 blocks, y for the rest (the kernels
/// loop over rows past the grid).
pub(crate) fn rows_grid(rows: usize, threads: u32, shared_bytes: u32) -> Grid {
    let x = rows.clamp(1, 65_535);
    let y = rows.div_ceil(x).clamp(1, 65_535);
    Grid {
        blocks: [x as u32, y as u32, 1],
        threads,
        shared_bytes,
    }
}
