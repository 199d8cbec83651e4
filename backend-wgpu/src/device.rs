//! The wgpu device: adapter probing, the pool, batched command recording, host copies,
//! pipeline and bind group caches, and kernel dispatch by op family.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard, PoisonError, Weak};

use tessera_core::memory::Pool;
use tessera_core::ops::validate_kernel_launch;
use tessera_core::{
    dtypes_str, Buffer, DType, Device, DeviceInfo, Error, Features, Kernel, KernelTime, Limits,
    MemoryStats, Op, OpFamily, PendingBytes, ReadyBytes, Result, TensorRef,
};

use crate::buffer::{wgpu_buffer, Block, SharedPool, WgpuBuffer};
use crate::shader::Build;
use crate::{
    attention, conv, elementwise, loss, matmul, movement, norm, optim, random, reduce, windows,
};

/// Bytes one launch's parameter block may take: the size of the dynamic-offset binding.
pub(crate) const PARAM_BLOCK: u64 = 1024;
/// The most parameter words a launch passes as immediates (256 bytes, what desktop Vulkan
/// drivers offer as push constants); launches with more go through the parameter buffer.
const MAX_IMMEDIATE_WORDS: usize = 64;
/// Fewer immediate words than this (Vulkan guarantees 128 bytes) and the device does without.
const MIN_IMMEDIATE_WORDS: usize = 32;
/// Size of each per-submission parameter buffer.
const PARAM_CAPACITY: u64 = 256 * 1024;
/// Dispatches recorded before a batch is submitted without waiting for a sync point, so the
/// GPU starts working while the host records more. Each submission costs host time (about
/// 30 µs on the H100's host): a decoding step (about 128 launches) goes out in one, and its
/// device time overlaps the recording of the next step, which does not wait for it.
const MAX_BATCH: usize = 128;
/// Staging buffers kept for reads to the host (more are made while many reads are pending).
const MAX_STAGING_BUFFERS: usize = 4;
/// Bind groups kept per device; the cache is cleared when it grows past this.
const MAX_BIND_GROUPS: usize = 4096;
/// Threads per workgroup of every kernel (the WebGPU minimum guaranteed limit).
pub(crate) const WG: u64 = 256;

/// Serializes creating Vulkan instances and devices. It guards no data: NVIDIA's driver
/// corrupts its heap when several are created at once in one process (seen on an H100 with
/// four test threads each opening a device), while one at a time is safe.
static VULKAN_SETUP: Mutex<()> = Mutex::new(());

/// Every Vulkan adapter, hardware before software. Any failure (no loader, no driver, a panic
/// inside the driver probe) gives an empty list.
pub(crate) fn adapters() -> Vec<wgpu::Adapter> {
    let _setup = lock(&VULKAN_SETUP);
    let found = std::panic::catch_unwind(|| {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN;
        let instance = wgpu::Instance::new(desc);
        pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN))
    });
    let mut list = found.unwrap_or_default();
    let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    list.sort_by_key(rank);
    list
}

fn backend_err(detail: impl Into<String>) -> Error {
    Error::Backend {
        backend: "wgpu".into(),
        detail: detail.into(),
    }
}

/// A compiled pipeline, its cache key (the kernel's name in profiles), the number of data
/// bindings its layout has and whether its parameters are immediates.
#[derive(Debug)]
pub(crate) struct Pipeline {
    pipeline: wgpu::ComputePipeline,
    name: String,
    bindings: usize,
    immediate: bool,
}

/// How [`WgpuDevice::open_with`] opens an adapter. The default is what `open_device("wgpu:N")`
/// gives: every limit the adapter offers, subgroup reductions, parameters through the
/// parameter buffer.
#[derive(Clone, Debug)]
pub struct WgpuOptions {
    /// The most bytes one storage binding spans (rounded down to the adapter's offset
    /// alignment, at least 16 alignments), below the adapter's own limit where that is larger.
    /// Tensors past it run over windows, as they do past the adapter's limit, so small tensors
    /// can exercise those paths.
    pub max_binding_bytes: u64,
    /// Whether launch parameters go through immediates where the adapter has them; without,
    /// every launch reads its parameters from the per-submission parameter buffer. Off by
    /// default: on an H100 (Vulkan, driver 580) kernels reading immediates took 11% longer
    /// when decoding GPT-2 (411 against 371 ms of kernels per 256 tokens; copies 7.2 against
    /// 5.7 µs) and attention's key gradients 20% longer, though the words are the same.
    pub immediates: bool,
    /// Whether workgroup reductions (norms, softmax, loss, attention's decoding split, norms
    /// of gradients) reduce within subgroups first where the adapter has `SUBGROUP`; without,
    /// they reduce by a tree through workgroup memory.
    pub subgroups: bool,
}

impl Default for WgpuOptions {
    fn default() -> Self {
        Self {
            max_binding_bytes: u64::MAX,
            immediates: false,
            subgroups: true,
        }
    }
}

/// Kernel timing while profiling: each dispatch's pass writes a timestamp at its start and its
/// end; at submission they are resolved, read back after the queue drains and summed per kernel.
struct Profiler {
    queries: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Kernels recorded in the current batch, in dispatch order.
    recorded: Vec<String>,
}

/// One binding of a dispatch: a byte window of a buffer.
pub(crate) struct Bind<'a> {
    pub buf: &'a WgpuBuffer,
    pub offset: u64,
    pub size: u64,
}

#[derive(Debug)]
struct ParamBuf {
    buffer: wgpu::Buffer,
    /// Group 0 of every pipeline: this buffer at a dynamic offset.
    bind_group: wgpu::BindGroup,
    last_use: u64,
}

/// Data bind groups (group 1) are cached by the (buffer, offset, size) of each binding; the
/// parameter buffer has its own group, so which one a batch uses never misses this cache.
type BindKey = Vec<(u64, u64, u64)>;

/// Kernels are cached per op descriptor and input dtypes.
type KernelKey = (Op, Vec<DType>);

/// The batch being recorded and what it needs at submission.
struct State {
    /// Sequence number of the batch being recorded; batch `s` is done once `completed >= s`.
    seq: u64,
    /// The compute pass the batch's dispatches are recorded into: one pass for many
    /// dispatches (wgpu still orders dependent dispatches with barriers), ended before the
    /// encoder records anything else. Profiling gives each dispatch its own pass instead, for
    /// its timestamps. Declared before the encoder, so it drops first.
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    dispatches: usize,
    params: Option<ParamBuf>,
    param_data: Vec<u8>,
    free_params: Vec<ParamBuf>,
    /// Work or host writes queued since the last submission.
    dirty: bool,
    bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// Host-visible buffers for reads, unmapped and free.
    staging: Vec<wgpu::Buffer>,
    /// The latest submission, which reads wait for.
    submitted: Option<wgpu::SubmissionIndex>,
    profiler: Option<Profiler>,
    /// Launches and seconds per kernel since profiling started.
    profile: HashMap<String, (u64, f64)>,
}

/// Everything a device owns; kernels hold a weak handle to it.
pub(crate) struct Core {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: DeviceInfo,
    align: u64,
    max_binding: u64,
    max_groups: u64,
    workgroup_memory: usize,
    /// Whether f16 matmuls may run on cooperative matrices (see [`tensor_cores`]).
    coop_f16: bool,
    /// Whether the adapter is a CPU driver (lavapipe): it compiles every kernel with LLVM at
    /// first use, so kernels prefer loops to unrolled code there.
    cpu: bool,
    /// Whether the adapter writes timestamps in compute passes (for profiling).
    timestamps: bool,
    pool: SharedPool,
    completed: Arc<AtomicU64>,
    errors: Arc<Mutex<Vec<String>>>,
    state: Mutex<State>,
    /// Pipelines by cache key: reading parameters from the parameter buffer (`[0]`) and
    /// from immediates (`[1]`).
    pipelines: Mutex<[HashMap<String, Arc<Pipeline>>; 2]>,
    /// Parameter words a launch may pass as immediates (0: the adapter has none).
    immediate_words: usize,
    /// Whether workgroup reductions use subgroup operations.
    subgroups: bool,
    /// Group 0 of pipelines reading the parameter buffer: read-only storage at a dynamic
    /// offset. Pipelines with immediates leave group 0 empty.
    param_layout: wgpu::BindGroupLayout,
    /// Group 1's layout by its number of data bindings.
    group_layouts: Mutex<HashMap<usize, wgpu::BindGroupLayout>>,
    /// Pipeline layouts by number of data bindings and whether parameters are immediates.
    layouts: Mutex<HashMap<(usize, bool), wgpu::PipelineLayout>>,
    next_id: AtomicU64,
    syncs: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Core {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Fails with the driver errors reported since the last check, if any.
    fn check_errors(&self) -> Result<()> {
        let mut errors = lock(&self.errors);
        if errors.is_empty() {
            return Ok(());
        }
        let all = std::mem::take(&mut *errors).join("\n");
        Err(backend_err(all))
    }

    /// Submits the batch being recorded, with its parameter block.
    fn flush(&self, st: &mut State) {
        if !st.dirty {
            return;
        }
        if let Some(pb) = &st.params {
            if !st.param_data.is_empty() {
                self.queue.write_buffer(&pb.buffer, 0, &st.param_data);
            }
        }
        st.pass = None;
        let timed = st.profiler.as_ref().map_or(0, |p| p.recorded.len()) as u64;
        if let (Some(prof), Some(encoder)) = (&st.profiler, &mut st.encoder) {
            if timed > 0 {
                encoder.resolve_query_set(&prof.queries, 0..2 * timed as u32, &prof.resolve, 0);
                encoder.copy_buffer_to_buffer(&prof.resolve, 0, &prof.readback, 0, 16 * timed);
            }
        }
        let cmds = st.encoder.take().map(|e| e.finish());
        st.submitted = Some(self.queue.submit(cmds));
        let seq = st.seq;
        let done = self.completed.clone();
        self.queue.on_submitted_work_done(move || {
            done.fetch_max(seq, Ordering::AcqRel);
        });
        if let Some(mut pb) = st.params.take() {
            pb.last_use = seq;
            st.free_params.push(pb);
        }
        st.param_data.clear();
        st.dispatches = 0;
        st.dirty = false;
        st.seq += 1;
        if timed > 0 {
            self.collect_times(st, timed);
        }
    }

    /// Waits for the batch just submitted and adds its kernels' times to the profile.
    fn collect_times(&self, st: &mut State, timed: u64) {
        let Some(prof) = st.profiler.as_mut() else {
            return;
        };
        let slice = prof.readback.slice(0..16 * timed);
        let (tx, rx) = mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        let mapped = self
            .device
            .poll(wgpu::PollType::wait_indefinitely())
            .is_ok()
            && matches!(rx.recv(), Ok(Ok(())));
        let period = f64::from(self.queue.get_timestamp_period()) * 1e-9;
        let recorded = std::mem::take(&mut prof.recorded);
        if mapped {
            if let Ok(view) = slice.get_mapped_range() {
                let ticks: Vec<u64> = view
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                    .collect();
                for (name, pair) in recorded.into_iter().zip(ticks.chunks_exact(2)) {
                    let entry = st.profile.entry(name).or_insert((0, 0.0));
                    entry.0 += 1;
                    entry.1 += pair[1].saturating_sub(pair[0]) as f64 * period;
                }
            }
            prof.readback.unmap();
        }
    }

    fn wait_idle(&self) -> Result<()> {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| backend_err(format!("poll: {e}")))?;
        self.check_errors()
    }

    fn param_buffer(&self, st: &mut State) -> ParamBuf {
        let done = self.completed.load(Ordering::Acquire);
        if let Some(pos) = st.free_params.iter().position(|p| p.last_use <= done) {
            return st.free_params.swap_remove(pos);
        }
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("tessera params"),
            size: PARAM_CAPACITY,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("tessera params"),
            layout: &self.param_layout,
            entries: &[wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &buffer,
                    offset: 0,
                    size: wgpu::BufferSize::new(PARAM_BLOCK),
                }),
            }],
        });
        ParamBuf {
            buffer,
            bind_group,
            last_use: 0,
        }
    }

    /// Group 1's layout for `bindings` data bindings, shared by pipelines with and without
    /// immediates, so one cached bind group serves both.
    fn group_layout(&self, bindings: usize) -> wgpu::BindGroupLayout {
        lock(&self.group_layouts)
            .entry(bindings)
            .or_insert_with(|| {
                let entries: Vec<wgpu::BindGroupLayoutEntry> = (1..=bindings)
                    .map(|b| wgpu::BindGroupLayoutEntry {
                        binding: b as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: false },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    })
                    .collect();
                self.device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some("tessera bindings"),
                        entries: &entries,
                    })
            })
            .clone()
    }

    fn layout(&self, bindings: usize, immediate: bool) -> wgpu::PipelineLayout {
        let group = self.group_layout(bindings);
        lock(&self.layouts)
            .entry((bindings, immediate))
            .or_insert_with(|| {
                self.device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some("tessera layout"),
                        bind_group_layouts: &[
                            (!immediate).then_some(&self.param_layout),
                            Some(&group),
                        ],
                        immediate_size: if immediate {
                            4 * self.immediate_words as u32
                        } else {
                            0
                        },
                    })
            })
            .clone()
    }

    /// What the kernel of a launch passing `words` parameter words is built for: immediates
    /// where they hold the words, subgroup reductions where the device has them.
    pub(crate) fn build(&self, words: usize) -> Build {
        Build {
            immediate_words: (self.immediate_words > 0 && words <= self.immediate_words)
                .then_some(self.immediate_words),
            subgroups: self.subgroups,
        }
    }

    /// The pipeline cached under `key` (with parameters as immediates or not), compiling
    /// `source()` on a miss. `key` must name the op, its dtypes and any variant, as the source
    /// depends on nothing else but what [`Core::build`] gives (and `immediate` is
    /// its `immediate_words.is_some()`).
    pub(crate) fn pipeline(
        &self,
        key: &str,
        bindings: usize,
        immediate: bool,
        source: impl FnOnce() -> Result<String>,
    ) -> Result<Arc<Pipeline>> {
        if let Some(p) = lock(&self.pipelines)[usize::from(immediate)].get(key) {
            return Ok(p.clone());
        }
        let src = source()?;
        let layout = self.layout(bindings, immediate);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key),
                source: wgpu::ShaderSource::Wgsl(src.clone().into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(err) = pollster::block_on(scope.pop()) {
            let numbered: Vec<String> = src
                .lines()
                .enumerate()
                .map(|(i, l)| format!("{:4} {l}", i + 1))
                .collect();
            return Err(Error::Compile {
                backend: "wgpu".into(),
                op: key.into(),
                log: format!("{err}\n{}", numbered.join("\n")),
            });
        }
        let p = Arc::new(Pipeline {
            pipeline,
            name: key.to_string(),
            bindings,
            immediate,
        });
        lock(&self.pipelines)[usize::from(immediate)].insert(key.to_string(), p.clone());
        Ok(p)
    }

    /// The bytes of `t`'s buffer that a binding of `t` spans: from its first element, aligned
    /// down to the adapter's offset alignment, to its last, rounded up to a word.
    fn window(&self, t: &TensorRef<'_>) -> Result<(u64, u64)> {
        let buf = wgpu_buffer(t.buffer)?;
        let size = t.dtype.size() as u64;
        let start = t.layout.offset as u64 * size;
        let aligned = start - start % self.align;
        let end =
            ((t.layout.extent() as u64 * size).max(start + 4).div_ceil(4) * 4).min(buf.capacity());
        Ok((aligned, end.saturating_sub(aligned).max(4)))
    }

    /// Bytes a binding of `t` spans (`u64::MAX` for a buffer of another backend).
    pub(crate) fn binding_bytes(&self, t: &TensorRef<'_>) -> u64 {
        self.window(t).map_or(u64::MAX, |(_, window)| window)
    }

    /// Whether every tensor of `tensors` fits one binding, so an op over them runs in one
    /// launch.
    pub(crate) fn fits(&self, tensors: &[TensorRef<'_>]) -> bool {
        tensors
            .iter()
            .all(|t| self.binding_bytes(t) <= self.max_binding)
    }

    /// The binding window of a tensor and its element offset inside that window.
    ///
    /// A buffer that fits one binding is bound whole, whatever part of it `t` spans, so the
    /// launches over one buffer share one cached bind group (decoding's views of a growing
    /// KV cache would otherwise need a new one every token).
    pub(crate) fn view<'a>(&self, t: &TensorRef<'a>) -> Result<(Bind<'a>, u32)> {
        let buf = wgpu_buffer(t.buffer)?;
        let (aligned, window) = if buf.capacity() <= self.max_binding {
            (0, buf.capacity())
        } else {
            self.window(t)?
        };
        if window > self.max_binding || aligned + window > buf.capacity() {
            return Err(Error::unsupported(
                "wgpu",
                format!(
                    "a tensor view of {window} bytes (the adapter binds at most {})",
                    self.max_binding
                ),
            ));
        }
        let size = t.dtype.size() as u64;
        let start = t.layout.offset as u64 * size;
        let offset = u32::try_from((start - aligned) / size)
            .map_err(|_| Error::unsupported("wgpu", "views past 2^32 elements"))?;
        Ok((
            Bind {
                buf,
                offset: aligned,
                size: window,
            },
            offset,
        ))
    }

    /// A 2-D grid of at least `groups` workgroups where the device allows, else as many as
    /// fit; kernels loop over the rest.
    pub(crate) fn grid(&self, groups: u64) -> [u32; 3] {
        let y = groups.div_ceil(self.max_groups).clamp(1, self.max_groups);
        let x = groups.div_ceil(y).clamp(1, self.max_groups);
        [x as u32, y as u32, 1]
    }

    /// The alignment of a binding's start, in bytes.
    pub(crate) fn align(&self) -> u64 {
        self.align
    }

    /// The most bytes one storage binding may span.
    pub(crate) fn max_binding(&self) -> u64 {
        self.max_binding
    }

    /// Whether f16 matmuls run on cooperative matrices.
    pub(crate) fn coop_f16(&self) -> bool {
        self.coop_f16
    }

    /// Whether the adapter is a CPU driver.
    pub(crate) fn is_cpu(&self) -> bool {
        self.cpu
    }

    /// Bytes of workgroup memory a kernel may use.
    pub(crate) fn workgroup_memory(&self) -> usize {
        self.workgroup_memory
    }

    /// `n` clamped to the grid's per-dimension limit (kernels loop over the rest).
    pub(crate) fn dim(&self, n: usize) -> u32 {
        (n as u64).min(self.max_groups) as u32
    }

    /// Records one dispatch into the current batch.
    pub(crate) fn dispatch(
        &self,
        pipe: &Pipeline,
        binds: &[Bind<'_>],
        params: &[u32],
        groups: [u32; 3],
    ) -> Result<()> {
        if params.len() as u64 * 4 > PARAM_BLOCK {
            return Err(Error::unsupported(
                "wgpu",
                format!(
                    "a launch with {} parameter words (tensors of too high a rank)",
                    params.len()
                ),
            ));
        }
        if binds.len() != pipe.bindings {
            return Err(backend_err(format!(
                "{} bindings for a pipeline of {}",
                binds.len(),
                pipe.bindings
            )));
        }
        if groups.contains(&0) {
            return Ok(());
        }
        let mut guard = self.state();
        let st = &mut *guard;
        if st.dispatches >= MAX_BATCH || st.param_data.len() as u64 + PARAM_BLOCK > PARAM_CAPACITY {
            self.flush(st);
        }
        let mut immediates = [0u32; MAX_IMMEDIATE_WORDS];
        let param_group = if pipe.immediate {
            immediates
                .get_mut(..params.len())
                .ok_or_else(|| backend_err("too many parameters for immediates"))?
                .copy_from_slice(params);
            None
        } else {
            if st.params.is_none() {
                st.params = Some(self.param_buffer(st));
            }
            let offset = st.param_data.len() as u32;
            st.param_data
                .extend(params.iter().flat_map(|w| w.to_le_bytes()));
            let padded = (st.param_data.len() as u64).div_ceil(self.align) * self.align;
            st.param_data.resize(padded as usize, 0);
            let pb = st
                .params
                .as_ref()
                .ok_or_else(|| backend_err("no parameter buffer"))?;
            Some((pb.bind_group.clone(), offset))
        };
        let key: BindKey = binds.iter().map(|b| (b.buf.id, b.offset, b.size)).collect();
        if st.bind_groups.len() >= MAX_BIND_GROUPS {
            st.bind_groups.clear();
        }
        let bg = match st.bind_groups.get(&key) {
            Some(bg) => bg.clone(),
            None => {
                let bgl = self.group_layout(binds.len());
                let entries: Vec<wgpu::BindGroupEntry> = binds
                    .iter()
                    .enumerate()
                    .map(|(i, b)| wgpu::BindGroupEntry {
                        binding: i as u32 + 1,
                        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                            buffer: &b.buf.buffer,
                            offset: b.offset,
                            size: wgpu::BufferSize::new(b.size),
                        }),
                    })
                    .collect();
                let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &bgl,
                    entries: &entries,
                });
                st.bind_groups.insert(key, bg.clone());
                bg
            }
        };
        let timestamp_writes = st.profiler.as_mut().map(|prof| {
            let at = 2 * prof.recorded.len() as u32;
            prof.recorded.push(pipe.name.clone());
            wgpu::ComputePassTimestampWrites {
                query_set: &prof.queries,
                beginning_of_pass_write_index: Some(at),
                end_of_pass_write_index: Some(at + 1),
            }
        });
        let timed = timestamp_writes.is_some();
        if timed || st.pass.is_none() {
            st.pass = None;
            let pass = Self::encoder(&self.device, &mut st.encoder)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: None,
                    timestamp_writes,
                })
                .forget_lifetime();
            st.pass = Some(pass);
        }
        let pass = st
            .pass
            .as_mut()
            .ok_or_else(|| backend_err("no compute pass"))?;
        pass.set_pipeline(&pipe.pipeline);
        match &param_group {
            Some((group, offset)) => pass.set_bind_group(0, group, &[*offset]),
            None => {
                pass.set_immediates(0, bytemuck::cast_slice(&immediates[..self.immediate_words]))
            }
        }
        pass.set_bind_group(1, &bg, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        if timed {
            st.pass = None;
        }
        st.dispatches += 1;
        st.dirty = true;
        Ok(())
    }

    /// The batch's command encoder, created on first use. No compute pass may be open on it.
    fn encoder<'e>(
        device: &wgpu::Device,
        encoder: &'e mut Option<wgpu::CommandEncoder>,
    ) -> &'e mut wgpu::CommandEncoder {
        encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tessera batch"),
            })
        })
    }

    /// A scratch buffer from the pool, for kernels that need intermediate results.
    pub(crate) fn scratch(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.alloc(bytes.max(4))
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let class = tessera_core::memory::size_class(bytes);
        if class as u64 > self.info.limits.max_buffer_bytes as u64 {
            let stats = lock(&self.pool).stats();
            return Err(Error::OutOfMemory {
                requested: bytes,
                in_use: stats.in_use,
                limit: self.info.limits.max_buffer_bytes,
            });
        }
        match self.alloc_block(bytes) {
            Err(Error::OutOfMemory { .. }) => {
                // Cached blocks of other classes go back to the driver, then one more try.
                lock(&self.pool).trim(|_| true);
                self.alloc_block(bytes)
            }
            other => other,
        }
    }

    /// Submits what is recorded and waits for the queue.
    fn drain(&self) -> Result<()> {
        let mut st = self.state();
        self.flush(&mut st);
        drop(st);
        self.wait_idle()
    }

    fn alloc_block(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let mut pool = lock(&self.pool);
        let in_use = pool.stats().in_use;
        // Stream-ordered reuse: every use of a buffer runs on this device's one queue in
        // recording order, and wgpu orders each use after the previous ones (barriers between
        // dispatches and submissions; host writes submit the recorded work first), so a freed
        // block may serve the next allocation at once, even while queued work still reads it.
        let (block, class) = pool.alloc(
            bytes,
            |_| true,
            |class| {
                let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
                let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("tessera"),
                    size: class as u64,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                if pollster::block_on(scope.pop()).is_some() {
                    return Err(Error::OutOfMemory {
                        requested: bytes,
                        in_use,
                        limit: self.info.limits.max_buffer_bytes,
                    });
                }
                Ok(Block {
                    buffer,
                    id: self.next_id.fetch_add(1, Ordering::Relaxed),
                })
            },
        )?;
        drop(pool);
        Ok(Arc::new(WgpuBuffer::new(
            block,
            bytes,
            class,
            self.pool.clone(),
        )))
    }

    fn read_into(self: &Arc<Self>, buf: &WgpuBuffer, offset: usize, out: &mut [u8]) -> Result<()> {
        self.start_read(buf, offset, out.len())?.wait_into(out)
    }

    /// Records a copy of `len` bytes at `offset` into a host-visible staging buffer, submits
    /// it and starts mapping it.
    fn start_read(
        self: &Arc<Self>,
        buf: &WgpuBuffer,
        offset: usize,
        len: usize,
    ) -> Result<HostCopy> {
        let start = (offset as u64) / 4 * 4;
        let end = ((offset + len) as u64).div_ceil(4) * 4;
        let size = end - start;
        let mut st = self.state();
        let staging = match st.staging.iter().position(|s| s.size() >= size) {
            Some(i) => st.staging.swap_remove(i),
            None => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("tessera staging"),
                size: size.next_power_of_two().max(256),
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        st.pass = None;
        Self::encoder(&self.device, &mut st.encoder).copy_buffer_to_buffer(
            &buf.buffer,
            start,
            &staging,
            0,
            size,
        );
        st.dirty = true;
        self.flush(&mut st);
        let submission = st.submitted.clone();
        drop(st);
        let (tx, rx) = mpsc::channel();
        staging
            .slice(0..size)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        Ok(HostCopy {
            core: self.clone(),
            staging,
            submission,
            size,
            skip: (offset as u64 - start) as usize,
            len,
            mapped: rx,
        })
    }
}

/// A copy to the host on its way: submitted, its staging buffer being mapped.
struct HostCopy {
    core: Arc<Core>,
    staging: wgpu::Buffer,
    /// The submission that holds the copy: waiting for it waits for nothing queued later.
    submission: Option<wgpu::SubmissionIndex>,
    size: u64,
    skip: usize,
    len: usize,
    mapped: mpsc::Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
}

impl HostCopy {
    fn wait_into(self, out: &mut [u8]) -> Result<()> {
        let core = &self.core;
        core.device
            .poll(wgpu::PollType::Wait {
                submission_index: self.submission.clone(),
                timeout: None,
            })
            .map_err(|e| backend_err(format!("poll: {e}")))?;
        core.check_errors()?;
        self.mapped
            .recv()
            .map_err(|_| backend_err("buffer mapping was dropped"))?
            .map_err(|e| backend_err(format!("mapping the staging buffer: {e}")))?;
        {
            let view = self
                .staging
                .slice(0..self.size)
                .get_mapped_range()
                .map_err(|e| backend_err(format!("reading the staging buffer: {e}")))?;
            out.copy_from_slice(&view[self.skip..self.skip + self.len]);
        }
        self.staging.unmap();
        let mut st = core.state();
        if st.staging.len() < MAX_STAGING_BUFFERS {
            st.staging.push(self.staging);
        }
        Ok(())
    }
}

impl PendingBytes for HostCopy {
    fn wait(self: Box<Self>) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.wait_into(&mut out)?;
        Ok(out)
    }
}

/// One wgpu adapter opened as a device. Cheap to share: all state lives behind one `Arc`.
pub struct WgpuDevice {
    core: Arc<Core>,
    kernels: Mutex<HashMap<KernelKey, Arc<dyn Kernel>>>,
}

impl fmt::Debug for WgpuDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuDevice")
            .field("info", &self.core.info)
            .field("memory", &self.memory())
            .finish()
    }
}

/// Whether the adapter multiplies 16x16x16 f16 cooperative matrices into f32 in subgroups of
/// exactly 32 invocations, the shape the `coop` matmul kernel is written for (NVIDIA's tensor
/// cores through `VK_KHR_cooperative_matrix`).
fn tensor_cores(adapter: &wgpu::Adapter) -> bool {
    let info = adapter.get_info();
    let offered = adapter.features();
    offered.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|c| {
            (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
                && c.ab_type == wgpu::CooperativeScalarType::F16
                && c.cr_type == wgpu::CooperativeScalarType::F32
        })
}

impl WgpuDevice {
    /// Bytes of launch parameters passed as immediates (0: all go through the parameter
    /// buffer).
    pub fn immediate_bytes(&self) -> usize {
        4 * self.core.immediate_words
    }

    /// Whether workgroup reductions reduce within subgroups first.
    pub fn subgroup_reductions(&self) -> bool {
        self.core.subgroups
    }

    /// Opens `adapter` with every limit it offers.
    pub fn open(adapter: wgpu::Adapter, ordinal: usize) -> Result<Self> {
        Self::open_adapter(adapter, ordinal, &WgpuOptions::default())
    }

    /// Opens adapter `ordinal` (the `N` of `wgpu:N`) as `options` say.
    pub fn open_with(ordinal: usize, options: &WgpuOptions) -> Result<Self> {
        let adapter = adapters()
            .into_iter()
            .nth(ordinal)
            .ok_or_else(|| Error::Device {
                name: format!("wgpu:{ordinal}"),
                detail: "no such wgpu adapter".into(),
            })?;
        Self::open_adapter(adapter, ordinal, options)
    }

    fn open_adapter(adapter: wgpu::Adapter, ordinal: usize, options: &WgpuOptions) -> Result<Self> {
        let ainfo = adapter.get_info();
        let limits = adapter.limits();
        let align = u64::from(limits.min_storage_buffer_offset_alignment.max(4));
        let max_binding = options
            .max_binding_bytes
            .max(16 * align)
            .min(limits.max_storage_buffer_binding_size);
        let max_binding = max_binding - max_binding % align;
        let setup = lock(&VULKAN_SETUP);
        let offered = adapter.features();
        let timestamps = offered.contains(wgpu::Features::TIMESTAMP_QUERY);
        let f16 = offered.contains(wgpu::Features::SHADER_F16);
        let subgroups = offered.contains(wgpu::Features::SUBGROUP);
        let coop_f16 = f16 && subgroups && tensor_cores(&adapter);
        let immediate_words = (limits.max_immediate_size as usize / 4).min(MAX_IMMEDIATE_WORDS);
        let immediate_words = if options.immediates
            && offered.contains(wgpu::Features::IMMEDIATES)
            && immediate_words >= MIN_IMMEDIATE_WORDS
        {
            immediate_words
        } else {
            0
        };
        let mut wanted =
            wgpu::Features::TIMESTAMP_QUERY | wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
        if immediate_words > 0 {
            wanted |= wgpu::Features::IMMEDIATES;
        }
        if coop_f16 {
            wanted |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let experimental_features = if coop_f16 {
            // SAFETY: the only experimental feature requested is cooperative matrices, used
            // only in the configuration the adapter reports (`tensor_cores`), by one kernel
            // whose matrices are loaded from and stored to workgroup arrays sized for them.
            unsafe { wgpu::ExperimentalFeatures::enabled() }
        } else {
            wgpu::ExperimentalFeatures::disabled()
        };
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("tessera"),
            required_features: offered & wanted,
            required_limits: limits.clone(),
            experimental_features,
            ..Default::default()
        }))
        .map_err(|e| Error::Device {
            name: format!("wgpu:{ordinal}"),
            detail: e.to_string(),
        })?;
        drop(setup);
        let errors: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(Vec::new()));
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            lock(&sink).push(e.to_string())
        }));
        let info = DeviceInfo {
            backend: "wgpu".into(),
            ordinal,
            name: format!("{} ({:?}, {})", ainfo.name, ainfo.device_type, ainfo.driver),
            dtypes: [
                DType::F32,
                DType::F16,
                DType::BF16,
                DType::I32,
                DType::U32,
                DType::Bool,
            ]
            .into_iter()
            .filter(|&d| d != DType::F16 || f16)
            .collect(),
            features: Features {
                f16,
                bf16: true,
                subgroups,
                cooperative_matrix: coop_f16,
            },
            limits: Limits {
                max_buffer_bytes: usize::try_from(limits.max_buffer_size).unwrap_or(usize::MAX),
                max_binding_bytes: usize::try_from(max_binding).unwrap_or(usize::MAX),
                max_workgroup_size: limits.max_compute_invocations_per_workgroup as usize,
                max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension as usize,
            },
        };
        if (limits.max_compute_invocations_per_workgroup as u64) < WG
            || limits.max_storage_buffers_per_shader_stage < 8
        {
            return Err(Error::Device {
                name: info.id(),
                detail: "the adapter's compute limits are below WebGPU's defaults".into(),
            });
        }
        let param_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("tessera params"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: true },
                    has_dynamic_offset: true,
                    min_binding_size: None,
                },
                count: None,
            }],
        });
        let core = Core {
            param_layout,
            immediate_words,
            subgroups: subgroups && options.subgroups,
            align,
            max_binding,
            max_groups: u64::from(limits.max_compute_workgroups_per_dimension.max(1)),
            workgroup_memory: limits.max_compute_workgroup_storage_size as usize,
            coop_f16,
            cpu: ainfo.device_type == wgpu::DeviceType::Cpu,
            timestamps,
            device,
            queue,
            info,
            pool: Arc::new(Mutex::new(Pool::default())),
            completed: Arc::new(AtomicU64::new(0)),
            errors,
            state: Mutex::new(State {
                seq: 1,
                encoder: None,
                pass: None,
                dispatches: 0,
                params: None,
                param_data: Vec::new(),
                free_params: Vec::new(),
                dirty: false,
                bind_groups: HashMap::new(),
                staging: Vec::new(),
                submitted: None,
                profiler: None,
                profile: HashMap::new(),
            }),
            pipelines: Mutex::new([HashMap::new(), HashMap::new()]),
            group_layouts: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            syncs: AtomicU64::new(0),
        };
        Ok(WgpuDevice {
            core: Arc::new(core),
            kernels: Mutex::new(HashMap::new()),
        })
    }
}

fn byte_range(op: &str, buffer: &Arc<dyn Buffer>, offset: usize, len: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= buffer.len() => Ok(()),
        _ => Err(Error::invalid(
            op,
            format!(
                "{len} bytes at offset {offset} do not fit a buffer of {} bytes",
                buffer.len()
            ),
        )),
    }
}

impl Device for WgpuDevice {
    fn info(&self) -> &DeviceInfo {
        &self.core.info
    }

    fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.core.alloc(bytes)
    }

    fn write(&self, buffer: &Arc<dyn Buffer>, offset: usize, data: &[u8]) -> Result<()> {
        byte_range("write", buffer, offset, data.len())?;
        if data.is_empty() {
            return Ok(());
        }
        let buf = wgpu_buffer(buffer)?;
        let start = offset / 4 * 4;
        let end = (offset + data.len()).div_ceil(4) * 4;
        let mut bytes = vec![0u8; end - start];
        if start != offset || end != offset + data.len() {
            // The words at the edges hold bytes outside the write: keep them.
            let edge = (buf.capacity() as usize).min(end);
            self.core
                .read_into(buf, start, &mut bytes[..edge - start])?;
        }
        bytes[offset - start..offset - start + data.len()].copy_from_slice(data);
        let core = &self.core;
        let mut st = core.state();
        // Host writes land before the next submission: submit the kernels queued so far first.
        core.flush(&mut st);
        core.queue.write_buffer(&buf.buffer, start as u64, &bytes);
        st.dirty = true;
        Ok(())
    }

    fn read(&self, buffer: &Arc<dyn Buffer>, offset: usize, out: &mut [u8]) -> Result<()> {
        self.core.syncs.fetch_add(1, Ordering::Relaxed);
        byte_range("read", buffer, offset, out.len())?;
        if out.is_empty() {
            return self.synchronize_inner();
        }
        self.core.read_into(wgpu_buffer(buffer)?, offset, out)
    }

    fn read_later(
        &self,
        buffer: &Arc<dyn Buffer>,
        offset: usize,
        len: usize,
    ) -> Result<Box<dyn PendingBytes>> {
        self.core.syncs.fetch_add(1, Ordering::Relaxed);
        byte_range("read_later", buffer, offset, len)?;
        if len == 0 {
            self.synchronize_inner()?;
            return Ok(Box::new(ReadyBytes(Vec::new())));
        }
        Ok(Box::new(self.core.start_read(
            wgpu_buffer(buffer)?,
            offset,
            len,
        )?))
    }

    fn kernel(&self, op: &Op, input_dtypes: &[DType]) -> Result<Arc<dyn Kernel>> {
        let key = (op.clone(), input_dtypes.to_vec());
        let mut cache = lock(&self.kernels);
        if let Some(k) = cache.get(&key) {
            return Ok(k.clone());
        }
        if !supported(op, input_dtypes, self.core.info.features.f16) {
            return Err(Error::unsupported(
                "wgpu",
                format!("{} for {}", op.name(), dtypes_str(input_dtypes)),
            ));
        }
        let kernel: Arc<dyn Kernel> = Arc::new(WgpuKernel {
            op: op.clone(),
            dtypes: input_dtypes.to_vec(),
            core: Arc::downgrade(&self.core),
        });
        cache.insert(key, kernel.clone());
        Ok(kernel)
    }

    fn synchronize(&self) -> Result<()> {
        self.core.syncs.fetch_add(1, Ordering::Relaxed);
        self.synchronize_inner()
    }

    fn memory(&self) -> MemoryStats {
        lock(&self.core.pool).stats()
    }

    fn set_memory_limit(&self, limit: Option<usize>) {
        lock(&self.core.pool).set_limit(limit);
    }

    fn empty_cache(&self) {
        // Cached bind groups keep their buffers alive: drop them with the blocks. wgpu frees a
        // buffer's memory once the work already submitted or recorded with it is done.
        self.core.state().bind_groups.clear();
        lock(&self.core.pool).trim(|_| true);
    }

    fn reset_peak(&self) {
        lock(&self.core.pool).reset_peak();
    }

    fn host_syncs(&self) -> u64 {
        self.core.syncs.load(Ordering::Relaxed)
    }

    fn set_profiling(&self, on: bool) -> Result<()> {
        if on && !self.core.timestamps {
            return Err(Error::unsupported(
                "wgpu",
                "kernel profiling (the adapter has no timestamp queries)",
            ));
        }
        self.core.drain()?;
        let core = &self.core;
        let mut st = core.state();
        st.profiler = on.then(|| {
            let slots = 2 * MAX_BATCH as u64;
            let buffer = |label, usage| {
                core.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some(label),
                    size: 8 * slots,
                    usage,
                    mapped_at_creation: false,
                })
            };
            Profiler {
                queries: core.device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("tessera profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: slots as u32,
                }),
                resolve: buffer(
                    "tessera profile resolve",
                    wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                ),
                readback: buffer(
                    "tessera profile readback",
                    wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                ),
                recorded: Vec::new(),
            }
        });
        if on {
            st.profile.clear();
        }
        Ok(())
    }

    fn profile(&self) -> Vec<KernelTime> {
        let st = self.core.state();
        let mut times: Vec<KernelTime> = st
            .profile
            .iter()
            .map(|(name, &(launches, seconds))| KernelTime {
                name: name.clone(),
                launches,
                seconds,
            })
            .collect();
        times.sort_by(|a, b| b.seconds.total_cmp(&a.seconds));
        times
    }
}

impl WgpuDevice {
    fn synchronize_inner(&self) -> Result<()> {
        self.core.drain()
    }
}

/// The dtypes this backend computes: floats (f32, f16 where the adapter has `SHADER_F16`, and
/// bf16; 16-bit floats are computed in f32), i32/u32 indices and bool masks.
fn supported(op: &Op, d: &[DType], f16: bool) -> bool {
    let float = |t: DType| matches!(t, DType::F32 | DType::BF16) || (t == DType::F16 && f16);
    let storable = |t: DType| float(t) || matches!(t, DType::I32 | DType::U32 | DType::Bool);
    let float_at = |i: usize| d.get(i).is_none_or(|&t| float(t));
    let index = |i: usize| d.get(i).is_none_or(|t| t.is_index());
    let all_float = || d.iter().all(|&t| float(t));
    match op {
        Op::Fill { dtype } | Op::Arange { dtype } => storable(*dtype),
        Op::RandUniform { dtype } | Op::RandNormal { dtype } => float(*dtype),
        Op::Cast { to } => storable(*to) && d.iter().all(|&t| storable(t)),
        Op::Copy | Op::Concat { .. } => d.iter().all(|&t| storable(t)),
        Op::Compare(_) => d
            .iter()
            .all(|&t| float(t) || matches!(t, DType::I32 | DType::U32)),
        Op::Where => d.first() == Some(&DType::Bool) && d[1..].iter().all(|&t| storable(t)),
        Op::Embedding | Op::Gather { .. } => float_at(0) && index(1),
        Op::EmbeddingBackward | Op::ScatterAdd { .. } => index(0) && float_at(1),
        Op::CrossEntropy | Op::CrossEntropyBackward => {
            float_at(0) && index(1) && d[2..].iter().all(|&t| float(t))
        }
        Op::Conv2d { .. } | Op::Conv2dBackwardData { .. } | Op::Conv2dBackwardWeight { .. } => {
            conv::SUPPORTED && all_float()
        }
        _ => all_float(),
    }
}

/// A catalog op bound to the input dtypes it was requested for.
struct WgpuKernel {
    op: Op,
    dtypes: Vec<DType>,
    core: Weak<Core>,
}

impl fmt::Debug for WgpuKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WgpuKernel")
            .field("op", &self.op)
            .field("dtypes", &self.dtypes)
            .finish()
    }
}

impl Kernel for WgpuKernel {
    fn op(&self) -> &Op {
        &self.op
    }

    fn launch(
        &self,
        inputs: &[TensorRef<'_>],
        outputs: &[TensorRef<'_>],
        scalars: &[f64],
    ) -> Result<()> {
        validate_kernel_launch(&self.op, &self.dtypes, inputs, outputs, scalars)?;
        let core = self
            .core
            .upgrade()
            .ok_or_else(|| backend_err("the device of this kernel was dropped"))?;
        let too_big = inputs
            .iter()
            .chain(outputs)
            .any(|t| t.layout.extent() > u32::MAX as usize);
        if too_big {
            return Err(Error::unsupported(
                "wgpu",
                format!("{} on tensors past 2^32 elements", self.op.name()),
            ));
        }
        windows::launch(&core, &self.op, inputs, outputs, scalars)
    }
}

/// Runs `op` by its family's kernels, every operand bound whole.
pub(crate) fn launch_family(
    core: &Core,
    op: &Op,
    i: &[TensorRef<'_>],
    o: &[TensorRef<'_>],
    s: &[f64],
) -> Result<()> {
    match op.family() {
        OpFamily::Random => random::launch(core, op, o, s, 0),
        OpFamily::Elementwise => elementwise::launch(core, op, i, o, s),
        OpFamily::Reduce => reduce::launch(core, op, i, o),
        OpFamily::Matmul => matmul::launch(core, op, i, o),
        OpFamily::Movement => movement::launch(core, op, i, o),
        OpFamily::Norm => norm::launch(core, op, i, o, s),
        OpFamily::Attention => attention::launch(core, op, i, o, s),
        OpFamily::Loss => loss::launch(core, op, i, o),
        OpFamily::Optim => optim::launch(core, op, i, o, s),
        OpFamily::Conv => conv::launch(core, op, i, o),
    }
}
