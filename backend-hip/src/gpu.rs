//! A device's runtime state that the op planners launch through: the driver, the memory
//! pool, and the kernels compiled so far.
//!
//! A kernel's source is the prelude, the planner's defines, its parameter struct and its
//! family's file (`kernels/<family>.hip`). Compiled code is kept in memory per planner key and
//! on disk (core's [`DiskCache`], folder `hip/`) under the hash of the compiler, architecture
//! and source, so a second run loads what the first compiled.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tessera_core::exec::{fnv1a, DiskCache};
use tessera_core::{Buffer, DeviceInfo, Error, KernelTime, KernelTotals, Result, TensorRef};

use crate::driver::{DevicePtr, Driver, Event, Function, Grid};
use crate::memory::{self, lock, SharedPool};
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
        }
    }

    pub(crate) fn backend(&self) -> &'static str {
        self.driver.backend()
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
        self.driver.launch(f, grid, &params.bytes())
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
        Ok(())
    }

    /// Kernel times since profiling started, slowest first.
    pub(crate) fn profile(&self) -> Vec<KernelTime> {
        let mut profile = lock(&self.profile);
        let _ = self.resolve(&mut profile);
        profile.totals.report()
    }

    /// A buffer of `bytes` from the pool (scratch for partial results, say).
    pub(crate) fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        memory::alloc(&self.driver, &self.pool, bytes)
    }

    /// The device address of `t`'s first element.
    pub(crate) fn ptr(&self, t: &TensorRef<'_>) -> Result<DevicePtr> {
        memory::address(self.backend(), t)
    }

    pub(crate) fn count_sync(&self) {
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }
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
