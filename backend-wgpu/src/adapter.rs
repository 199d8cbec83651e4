//! Finding adapters and opening one: its features and limits decide what the kernels may use
//! ([`Caps`]).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tessera_core::memory::Pool;
use tessera_core::{DeviceInfo, Error, Features, Limits, Result};
use tessera_wgsl::{device_dtypes, Caps, WG};

use crate::batch::{Core, State, MAX_IMMEDIATE_WORDS, MIN_IMMEDIATE_WORDS};
use crate::pipelines::Pipelines;
use crate::sync::lock;

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

impl Core {
    /// Opens `adapter` as device `wgpu:{ordinal}`, as `options` say.
    pub(crate) fn open(
        adapter: wgpu::Adapter,
        ordinal: usize,
        options: &WgpuOptions,
    ) -> Result<Core> {
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
            dtypes: device_dtypes(f16),
            features: Features {
                f16,
                bf16: true,
                subgroups,
                cooperative_matrix: coop_f16,
            },
            limits: Limits {
                max_buffer_bytes: usize::try_from(limits.max_buffer_size).unwrap_or(usize::MAX),
                max_binding_bytes: usize::try_from(max_binding).unwrap_or(usize::MAX),
                binding_align: align as usize,
                max_workgroup_size: limits.max_compute_invocations_per_workgroup as usize,
                max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension as usize,
                // wgpu does not report memory sizes; an allocation past it fails as an error.
                memory_bytes: None,
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
        let caps = Caps {
            limits: info.limits.clone(),
            workgroup_memory: limits.max_compute_workgroup_storage_size as usize,
            coop_f16,
            // wgpu takes WGSL (or SPIR-V only through an unsafe passthrough), so its f16 type
            // cannot be re-encoded as bf16: bf16 matmuls run the plain kernels.
            coop_bf16: false,
            // Nor can it run SPIR-V of its own.
            tensor_matmul: false,
            tensor_attention: false,
            cpu: ainfo.device_type == wgpu::DeviceType::Cpu,
            immediate_words,
            subgroups: subgroups && options.subgroups,
        };
        let pipelines = Pipelines::new(&device, immediate_words);
        Ok(Core {
            pipelines,
            caps,
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
                profile: Default::default(),
            }),
            next_id: AtomicU64::new(1),
            syncs: AtomicU64::new(0),
        })
    }
}
