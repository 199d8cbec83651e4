//! An opened Vulkan device: its queue, memory, pipelines and the batch being recorded, and
//! the shared kernels' [`Gpu`] over it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use ash::vk;
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};
use tessera_core::memory::{Pool, RecordingPools};
use tessera_core::{Buffer, DeviceInfo, Error, Features, Limits, Result};
use tessera_wgsl::{device_dtypes, Caps, Dispatch, Gpu, Source};

use crate::bfloat16::{Bfloat16Features, SHADER_BFLOAT16};
use crate::cooperative_matrix2::{Matrix2Features, COOPERATIVE_MATRIX2};
use crate::instance::{
    features, instance, Physical, COOPERATIVE_MATRIX, DEVICE_SETUP, REQUIRED_EXTENSIONS,
    SUBGROUP_SIZE_CONTROL, ZERO_INITIALIZE_WORKGROUP_MEMORY,
};
use crate::memory::{lock, vk_err, vulkan_buffer, Block, Shared, SharedPool, VulkanBuffer};
use crate::pipelines::Pipelines;
use crate::profile::Profiler;
use crate::record::{wait_for, Queue, Recorder, MAX_BATCH};

/// Push-constant bytes kernels use at most: the largest parameter block, 64 words. Devices
/// with fewer (Vulkan guarantees 128) pass larger blocks through the parameter buffer.
const PUSH_CONSTANT_BYTES: u32 = 256;

/// Everything a device owns; kernels hold a weak handle to it.
pub(crate) struct Context {
    pub(crate) info: DeviceInfo,
    pub(crate) caps: Caps,
    pub(crate) push_descriptor: ash::khr::push_descriptor::Device,
    pub(crate) queue: vk::Queue,
    /// Signalled with each batch's number when the batch has finished.
    pub(crate) timeline: vk::Semaphore,
    pub(crate) recorder: Mutex<Recorder>,
    pub(crate) pipelines: Pipelines,
    pub(crate) pool: SharedPool,
    /// The pools of live recordings (`replay.rs`), counted in the memory statistics.
    pub(crate) recording_pools: RecordingPools<Block>,
    pub(crate) next_id: AtomicU64,
    pub(crate) syncs: AtomicU64,
    /// Nanoseconds per timestamp tick and the queue's valid timestamp bits (0: none).
    timestamps: (f32, u32),
    /// Declared last: dropped after everything above that uses the device.
    pub(crate) shared: Arc<Shared>,
}

impl Context {
    /// Opens the physical device `ordinal` (the `N` of `vulkan:N`).
    pub(crate) fn open(ordinal: usize) -> Result<Context> {
        let name = format!("vulkan:{ordinal}");
        let device_err = |detail: String| Error::Device {
            name: name.clone(),
            detail,
        };
        let inst = instance().map_err(device_err)?;
        let physical = inst
            .devices
            .get(ordinal)
            .cloned()
            .ok_or_else(|| device_err("no such Vulkan device".into()))?;
        let instance = &inst.instance;
        let pd = physical.handle;
        // SAFETY: `pd` came from this instance.
        let props = unsafe { instance.get_physical_device_properties(pd) };
        let push_constant_bytes = props
            .limits
            .max_push_constants_size
            .min(PUSH_CONSTANT_BYTES);
        let (_, offered12) = features(instance, pd);
        let f16 = offered12.shader_float16 == vk::TRUE;
        let mut v11 =
            vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(true);
        let tensor_cores = physical.tensor_cores;
        let mut v12 = vk::PhysicalDeviceVulkan12Features::default()
            .timeline_semaphore(true)
            .shader_float16(f16)
            .vulkan_memory_model(tensor_cores)
            .vulkan_memory_model_device_scope(tensor_cores);
        let mut coop_feature =
            vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
        let bf16_tensor_cores = physical.bf16_tensor_cores;
        let mut bf16_feature = Bfloat16Features::for_tensor_cores();
        let tensor_matmul = physical.tensor_matmul;
        let mut matrix2_feature = Matrix2Features::for_tensor_kernels(physical.tensor_attention);
        let pin_subgroups = physical.pin_subgroups;
        let mut size_control_feature = vk::PhysicalDeviceSubgroupSizeControlFeatures::default()
            .subgroup_size_control(true)
            .compute_full_subgroups(true);
        let zero_init = physical.zero_initializes_workgroup_memory;
        let mut zero_init_feature =
            vk::PhysicalDeviceZeroInitializeWorkgroupMemoryFeatures::default()
                .shader_zero_initialize_workgroup_memory(true);
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default()
            .queue_family_index(physical.queue_family)
            .queue_priorities(&priorities)];
        let mut extensions: Vec<*const std::ffi::c_char> =
            REQUIRED_EXTENSIONS.iter().map(|n| n.as_ptr()).collect();
        if zero_init {
            extensions.push(ZERO_INITIALIZE_WORKGROUP_MEMORY.as_ptr());
        }
        if tensor_cores {
            extensions.push(COOPERATIVE_MATRIX.as_ptr());
        }
        if bf16_tensor_cores {
            extensions.push(SHADER_BFLOAT16.as_ptr());
        }
        if pin_subgroups {
            extensions.push(SUBGROUP_SIZE_CONTROL.as_ptr());
        }
        if tensor_matmul {
            extensions.push(COOPERATIVE_MATRIX2.as_ptr());
        }

        let core_features =
            vk::PhysicalDeviceFeatures::default().robust_buffer_access(physical.robust_buffers);
        let create = vk::DeviceCreateInfo::default()
            .queue_create_infos(&queues)
            .enabled_extension_names(&extensions)
            .enabled_features(&core_features)
            .push_next(&mut v11)
            .push_next(&mut v12);
        let create = if zero_init {
            create.push_next(&mut zero_init_feature)
        } else {
            create
        };
        let create = if tensor_cores {
            create.push_next(&mut coop_feature)
        } else {
            create
        };
        let create = if pin_subgroups {
            create.push_next(&mut size_control_feature)
        } else {
            create
        };
        let create = if bf16_tensor_cores {
            create.push_next(&mut bf16_feature)
        } else {
            create
        };
        let create = if tensor_matmul {
            create.push_next(&mut matrix2_feature)
        } else {
            create
        };

        let device = {
            let _setup = lock(&DEVICE_SETUP);
            // SAFETY: `pd` came from this instance; `create` and what it points to live
            // through the call; the features requested are ones the device offers.
            unsafe { instance.create_device(pd, &create, None) }
                .map_err(|e| device_err(format!("vkCreateDevice: {e}")))?
        };
        let allocator = Allocator::new(&AllocatorCreateDesc {
            instance: instance.clone(),
            device: device.clone(),
            physical_device: pd,
            debug_settings: Default::default(),
            buffer_device_address: false,
            allocation_sizes: Default::default(),
        });
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                let _setup = lock(&DEVICE_SETUP);
                // SAFETY: nothing was made on the device yet.
                unsafe { device.destroy_device(None) };
                return Err(device_err(format!("gpu-allocator: {e}")));
            }
        };
        // SAFETY: the queue family and index were requested at creation.
        let queue = unsafe { device.get_device_queue(physical.queue_family, 0) };
        let push_descriptor = ash::khr::push_descriptor::Device::new(instance, &device);
        let shared = Arc::new(Shared::new(device, allocator));
        let mut timeline_type = vk::SemaphoreTypeCreateInfo::default()
            .semaphore_type(vk::SemaphoreType::TIMELINE)
            .initial_value(0);
        let semaphore_info = vk::SemaphoreCreateInfo::default().push_next(&mut timeline_type);
        // SAFETY: the device is valid; the info lives through the call.
        let timeline = unsafe { shared.device.create_semaphore(&semaphore_info, None) }
            .map_err(|e| vk_err("vkCreateSemaphore", e))?;
        let recorder = Recorder::new(&shared, physical.queue_family)?;
        let (info, caps) = describe(instance, &physical, ordinal, f16, push_constant_bytes);
        Ok(Context {
            info,
            caps,
            push_descriptor,
            queue,
            timeline,
            recorder: Mutex::new(recorder),
            pipelines: Pipelines::new(
                &shared,
                &props,
                push_constant_bytes,
                zero_init,
                pin_subgroups,
                physical.robust_buffers,
            )?,
            pool: Arc::new(Mutex::new(Pool::default())),
            recording_pools: RecordingPools::default(),
            next_id: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
            timestamps: (props.limits.timestamp_period, physical.timestamp_bits),
            shared,
        })
    }

    /// The parts of the device recording and submitting use.
    pub(crate) fn queue(&self) -> Queue<'_> {
        Queue {
            shared: &self.shared,
            push_descriptor: &self.push_descriptor,
            queue: self.queue,
            timeline: self.timeline,
            param_layout: self.pipelines.param_set_layout(),
            align: self.caps.limits.binding_align as u64,
        }
    }

    pub(crate) fn recorder(&self) -> MutexGuard<'_, Recorder> {
        lock(&self.recorder)
    }

    /// A buffer of `bytes` from the device's pool, or from the recording's while the calling
    /// thread records a step.
    pub(crate) fn alloc(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        let pool = self.recording_pool().unwrap_or_else(|| self.pool.clone());
        let class = tessera_core::memory::size_class(bytes);
        if class > self.info.limits.max_buffer_bytes {
            return Err(Error::OutOfMemory {
                requested: bytes,
                in_use: lock(&self.pool).stats().in_use,
                limit: self.info.limits.max_buffer_bytes,
            });
        }
        match self.alloc_block(bytes, &pool) {
            Err(Error::OutOfMemory { .. }) => {
                // Cached blocks go back to the driver once the queue is done with them.
                self.drain()?;
                lock(&self.pool).trim(|_| true);
                self.shared.collect(self.completed()?);
                self.alloc_block(bytes, &pool)
            }
            other => other,
        }
    }

    fn alloc_block(&self, bytes: usize, from: &SharedPool) -> Result<Arc<dyn Buffer>> {
        let mut pool = lock(from);
        let in_use = pool.stats().in_use;
        let (block, class) = pool.alloc(
            bytes,
            |_| true,
            |class| {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                Block::new(&self.shared, class, id).map_err(|e| match e {
                    Error::OutOfMemory { requested, .. } => Error::OutOfMemory {
                        requested,
                        in_use,
                        limit: self.info.limits.memory_bytes.unwrap_or(0),
                    },
                    other => other,
                })
            },
        )?;
        drop(pool);
        Ok(Arc::new(VulkanBuffer::new(
            block,
            bytes,
            class,
            from.clone(),
        )))
    }

    /// The number of the last batch the queue has finished.
    pub(crate) fn completed(&self) -> Result<u64> {
        // SAFETY: the semaphore belongs to this device.
        unsafe {
            self.shared
                .device
                .get_semaphore_counter_value(self.timeline)
        }
        .map_err(|e| vk_err("vkGetSemaphoreCounterValue", e))
    }

    /// Waits until batch `value` has finished, then frees what it kept alive.
    pub(crate) fn wait(&self, value: u64) -> Result<()> {
        wait_for(&self.shared, self.timeline, value)?;
        let done = self.completed()?;
        self.recorder().reclaim(&self.shared, done);
        self.shared.collect(done);
        Ok(())
    }

    /// Starts (clearing the times so far) or stops timing every dispatch.
    pub(crate) fn set_profiling(&self, on: bool) -> Result<()> {
        // Under the recorder's lock, so that no batch recorded meanwhile uses the old queries.
        let mut recorder = self.recorder();
        if recorder.capture.is_some() {
            return Err(Error::invalid(
                "set_profiling",
                "the device is recording a step for replay; profile after it ends",
            ));
        }
        let value = recorder.submit(&self.queue())?;
        wait_for(&self.shared, self.timeline, value)?;
        if let Some(old) = recorder.profiler.take() {
            old.destroy(&self.shared.device);
        }
        if on {
            let (period, bits) = self.timestamps;
            recorder.profiler = Some(Profiler::new(&self.shared.device, MAX_BATCH, period, bits)?);
            recorder.profile.clear();
        }
        Ok(())
    }

    /// Submits what was recorded and waits for all of it.
    pub(crate) fn drain(&self) -> Result<()> {
        let value = self.recorder().submit(&self.queue())?;
        self.wait(value)
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        let _ = self.drain();
        // SAFETY: the queue is idle; the recorder's pool and the semaphore belong to this
        // device and go once.
        unsafe {
            let _ = self.shared.device.device_wait_idle();
            self.recorder().destroy(&self.shared);
            self.shared.device.destroy_semaphore(self.timeline, None);
        }
    }
}

/// What the device is and offers, for core and for the kernels.
fn describe(
    instance: &ash::Instance,
    physical: &Physical,
    ordinal: usize,
    f16: bool,
    push_constant_bytes: u32,
) -> (DeviceInfo, Caps) {
    let pd = physical.handle;
    let mut maintenance3 = vk::PhysicalDeviceMaintenance3Properties::default();
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let properties = {
        let mut props2 = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut maintenance3)
            .push_next(&mut subgroup);
        // SAFETY: `pd` came from this instance; the chain lives through the call.
        unsafe { instance.get_physical_device_properties2(pd, &mut props2) };
        props2.properties
    };
    let limits = properties.limits;
    // SAFETY: as above.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    let device_local = memory.memory_heaps[..memory.memory_heap_count as usize]
        .iter()
        .filter(|h| h.flags.contains(vk::MemoryHeapFlags::DEVICE_LOCAL))
        .map(|h| h.size)
        .max();
    let wanted = vk::SubgroupFeatureFlags::BASIC
        | vk::SubgroupFeatureFlags::VOTE
        | vk::SubgroupFeatureFlags::ARITHMETIC
        | vk::SubgroupFeatureFlags::BALLOT
        | vk::SubgroupFeatureFlags::SHUFFLE
        | vk::SubgroupFeatureFlags::SHUFFLE_RELATIVE;
    let subgroups = subgroup
        .supported_stages
        .contains(vk::ShaderStageFlags::COMPUTE)
        && subgroup.supported_operations.contains(wanted);
    // The `coop` kernel also reads its tiles with subgroup operations.
    let tensor_cores = physical.tensor_cores && f16 && subgroups;
    let align = limits.min_storage_buffer_offset_alignment.max(4);
    let max_binding = u64::from(limits.max_storage_buffer_range);
    let max_binding = max_binding - max_binding % align;
    let groups = limits
        .max_compute_work_group_count
        .iter()
        .min()
        .copied()
        .unwrap_or(65535);
    let limits = Limits {
        max_buffer_bytes: usize::try_from(maintenance3.max_memory_allocation_size)
            .unwrap_or(usize::MAX),
        max_binding_bytes: max_binding as usize,
        binding_align: align as usize,
        max_workgroup_size: limits.max_compute_work_group_invocations as usize,
        max_workgroups_per_dim: groups as usize,
        memory_bytes: device_local.and_then(|b| usize::try_from(b).ok()),
    };
    let info = DeviceInfo {
        backend: "vulkan".into(),
        ordinal,
        name: physical.name.clone(),
        dtypes: device_dtypes(f16),
        features: Features {
            f16,
            bf16: true,
            subgroups,
            cooperative_matrix: tensor_cores,
        },
        limits: limits.clone(),
    };
    let caps = Caps {
        limits,
        workgroup_memory: properties.limits.max_compute_shared_memory_size as usize,
        coop_f16: tensor_cores,
        coop_bf16: tensor_cores && physical.bf16_tensor_cores,
        tensor_matmul: tensor_cores && physical.tensor_matmul,
        tensor_attention: tensor_cores && physical.tensor_attention,
        cpu: physical.cpu,
        immediate_words: push_constant_bytes as usize / 4,
        subgroups,
    };
    (info, caps)
}

impl Gpu for Context {
    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn backend(&self) -> &str {
        "vulkan"
    }

    fn scratch(&self, bytes: usize) -> Result<Arc<dyn Buffer>> {
        self.alloc(bytes)
    }

    fn capacity(&self, buffer: &Arc<dyn Buffer>) -> Result<u64> {
        Ok(vulkan_buffer(buffer)?.capacity())
    }

    fn dispatch(
        &self,
        dispatch: &Dispatch<'_>,
        source: &mut dyn FnMut() -> Result<Source>,
    ) -> Result<()> {
        if dispatch.grid.contains(&0) {
            return Ok(());
        }
        let pipeline = self.pipelines.get(
            dispatch.key,
            dispatch.bindings.len(),
            dispatch.immediate,
            dispatch.specialize.then_some(dispatch.params),
            source,
        )?;
        let mut buffers = Vec::with_capacity(dispatch.bindings.len());
        for b in dispatch.bindings {
            buffers.push(vk::DescriptorBufferInfo {
                buffer: vulkan_buffer(b.buffer)?.handle(),
                offset: b.offset,
                range: b.size,
            });
        }
        let mut recorder = self.recorder();
        if let Some(capture) = recorder.capture_here() {
            capture.keep(dispatch.bindings)?;
        }
        recorder.dispatch(
            &self.queue(),
            &pipeline,
            &buffers,
            dispatch.params,
            dispatch.immediate,
            dispatch.grid,
        )
    }
}
