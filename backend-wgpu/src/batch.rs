//! The batch being recorded: the device's state, dispatches recorded into one compute pass of
//! one command encoder, their parameter blocks, data bind groups, and submission.
//!
//! Launch parameters are `u32` words written into a per-submission parameter buffer
//! (read-only storage: WGSL's uniform arrays would need 16-byte elements) and reached through
//! a dynamic offset, or passed as immediates where the device is opened with them. No buffer
//! is created per dispatch. Batches are submitted at sync points (a read, a `synchronize`, a
//! host write) or every [`MAX_BATCH`] dispatches, so the GPU works while the host records.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tessera_core::{Buffer, DeviceInfo, Error, Result};
use tessera_wgsl::{Caps, Dispatch, Gpu, Source};

use crate::buffer::{wgpu_buffer, SharedPool, WgpuBuffer};
use crate::pipelines::{Pipeline, Pipelines};
use crate::profile::Profiler;
use crate::sync::{backend_err, lock};
use tessera_core::KernelTotals;

/// Bytes one launch's parameter block may take: the size of the dynamic-offset binding.
pub(crate) const PARAM_BLOCK: u64 = 1024;
/// The most parameter words a launch passes as immediates (256 bytes, what desktop Vulkan
/// drivers offer as push constants); launches with more go through the parameter buffer.
pub(crate) const MAX_IMMEDIATE_WORDS: usize = 64;
/// Fewer immediate words than this (Vulkan guarantees 128 bytes) and the device does without.
pub(crate) const MIN_IMMEDIATE_WORDS: usize = 32;
/// Size of each per-submission parameter buffer.
const PARAM_CAPACITY: u64 = 256 * 1024;
/// Dispatches recorded before a batch is submitted without waiting for a sync point, so the
/// GPU starts working while the host records more. Each submission costs host time (about
/// 30 µs on the H100's host): a decoding step (about 128 launches) goes out in one, and its
/// device time overlaps the recording of the next step, which does not wait for it.
pub(crate) const MAX_BATCH: usize = 128;
/// Staging buffers kept for reads to the host (more are made while many reads are pending).
pub(crate) const MAX_STAGING_BUFFERS: usize = 4;
/// Bind groups kept per device; the cache is cleared when it grows past this.
const MAX_BIND_GROUPS: usize = 4096;

/// One binding of a dispatch: a byte window of a buffer.
pub(crate) struct Bind<'a> {
    pub buf: &'a WgpuBuffer,
    pub offset: u64,
    pub size: u64,
}

#[derive(Debug)]
pub(crate) struct ParamBuf {
    buffer: wgpu::Buffer,
    /// Group 0 of every pipeline: this buffer at a dynamic offset.
    bind_group: wgpu::BindGroup,
    last_use: u64,
}

/// Data bind groups (group 1) are cached by the (buffer, offset, size) of each binding; the
/// parameter buffer has its own group, so which one a batch uses never misses this cache.
pub(crate) type BindKey = Vec<(u64, u64, u64)>;

/// The batch being recorded and what it needs at submission.
pub(crate) struct State {
    /// Sequence number of the batch being recorded; batch `s` is done once `completed >= s`.
    pub(crate) seq: u64,
    /// The compute pass the batch's dispatches are recorded into: one pass for many
    /// dispatches (wgpu still orders dependent dispatches with barriers), ended before the
    /// encoder records anything else. Profiling gives each dispatch its own pass instead, for
    /// its timestamps. Declared before the encoder, so it drops first.
    pub(crate) pass: Option<wgpu::ComputePass<'static>>,
    pub(crate) encoder: Option<wgpu::CommandEncoder>,
    pub(crate) dispatches: usize,
    pub(crate) params: Option<ParamBuf>,
    pub(crate) param_data: Vec<u8>,
    pub(crate) free_params: Vec<ParamBuf>,
    /// Work or host writes queued since the last submission.
    pub(crate) dirty: bool,
    pub(crate) bind_groups: HashMap<BindKey, wgpu::BindGroup>,
    /// Host-visible buffers for reads, unmapped and free.
    pub(crate) staging: Vec<wgpu::Buffer>,
    /// The latest submission, which reads wait for.
    pub(crate) submitted: Option<wgpu::SubmissionIndex>,
    pub(crate) profiler: Option<Profiler>,
    /// Launches and seconds per kernel since profiling started.
    pub(crate) profile: KernelTotals,
}

/// Everything a device owns; kernels hold a weak handle to it.
pub(crate) struct Core {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    pub(crate) info: DeviceInfo,
    /// What the kernels may use; `caps.limits` is `info.limits`.
    pub(crate) caps: Caps,
    /// Whether the adapter writes timestamps in compute passes (for profiling).
    pub(crate) timestamps: bool,
    pub(crate) pool: SharedPool,
    pub(crate) completed: Arc<AtomicU64>,
    pub(crate) errors: Arc<Mutex<Vec<String>>>,
    pub(crate) state: Mutex<State>,
    pub(crate) pipelines: Pipelines,
    pub(crate) next_id: AtomicU64,
    pub(crate) syncs: AtomicU64,
}

impl Core {
    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Fails with the driver errors reported since the last check, if any.
    pub(crate) fn check_errors(&self) -> Result<()> {
        let mut errors = lock(&self.errors);
        if errors.is_empty() {
            return Ok(());
        }
        let all = std::mem::take(&mut *errors).join("\n");
        Err(backend_err(all))
    }

    /// Submits the batch being recorded, with its parameter block.
    pub(crate) fn flush(&self, st: &mut State) {
        if !st.dirty {
            return;
        }
        if let Some(pb) = &st.params {
            if !st.param_data.is_empty() {
                self.queue.write_buffer(&pb.buffer, 0, &st.param_data);
            }
        }
        st.pass = None;
        if let (Some(prof), Some(encoder)) = (&st.profiler, &mut st.encoder) {
            prof.resolve(encoder);
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
        if let Some(prof) = &mut st.profiler {
            prof.collect(&self.device, &self.queue, &mut st.profile);
        }
    }

    pub(crate) fn wait_idle(&self) -> Result<()> {
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
            layout: &self.pipelines.param_layout,
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

    /// Records one dispatch into the current batch.
    fn record(
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
            let padded = (st.param_data.len() as u64)
                .div_ceil(self.caps.limits.binding_align as u64)
                * self.caps.limits.binding_align as u64;
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
                let bgl = self.pipelines.group_layout(binds.len());
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
        let timestamp_writes = st
            .profiler
            .as_mut()
            .map(|prof| prof.timestamp_writes(&pipe.name));
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
            None => pass.set_immediates(
                0,
                bytemuck::cast_slice(&immediates[..self.caps.immediate_words]),
            ),
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
    pub(crate) fn encoder<'e>(
        device: &wgpu::Device,
        encoder: &'e mut Option<wgpu::CommandEncoder>,
    ) -> &'e mut wgpu::CommandEncoder {
        encoder.get_or_insert_with(|| {
            device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("tessera batch"),
            })
        })
    }

    /// Submits what is recorded and waits for the queue.
    pub(crate) fn drain(&self) -> Result<()> {
        let mut st = self.state();
        self.flush(&mut st);
        drop(st);
        self.wait_idle()
    }
}

impl Gpu for Core {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn backend(&self) -> &str {
        "wgpu"
    }

    fn scratch(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.alloc(bytes.max(4))
    }

    fn capacity(&self, buffer: &Arc<dyn Buffer>) -> Result<u64> {
        Ok(wgpu_buffer(buffer)?.capacity())
    }

    fn dispatch(
        &self,
        dispatch: &Dispatch<'_>,
        source: &mut dyn FnMut() -> Result<Source>,
    ) -> Result<()> {
        let binds = dispatch
            .bindings
            .iter()
            .map(|b| {
                Ok(Bind {
                    buf: wgpu_buffer(b.buffer)?,
                    offset: b.offset,
                    size: b.size,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let pipe = self
            .pipelines
            .get(dispatch.key, binds.len(), dispatch.immediate, source)?;
        self.record(&pipe, &binds, dispatch.params, dispatch.grid)
    }
}
