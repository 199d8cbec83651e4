//! The process's Vulkan instance and the physical devices that can run the kernels.
//!
//! One instance serves every device and lives as long as the process: the loader is read
//! once, and a missing loader or driver means no devices, never a crash. Creating and
//! destroying logical devices is serialized ([`DEVICE_SETUP`]): NVIDIA's driver crashes when
//! threads do it at once.

use std::ffi::CStr;
use std::sync::{Mutex, OnceLock};

use ash::vk;

use crate::bfloat16::{Bfloat16Features, BFLOAT16, SHADER_BFLOAT16};
use crate::cooperative_matrix2::{tensor_kernels, TensorKernels, COOPERATIVE_MATRIX2};

/// Held while a logical device is created or destroyed.
pub(crate) static DEVICE_SETUP: Mutex<()> = Mutex::new(());

/// The loaded library and the instance made from it.
pub(crate) struct Instance {
    /// Keeps the loader loaded while the instance lives.
    _entry: ash::Entry,
    pub(crate) instance: ash::Instance,
    /// Physical devices that can run the kernels, in the order the loader lists them.
    pub(crate) devices: Vec<Physical>,
}

/// A physical device and what opening it needs.
#[derive(Clone, Debug)]
pub(crate) struct Physical {
    pub(crate) handle: vk::PhysicalDevice,
    pub(crate) name: String,
    /// A queue family with compute.
    pub(crate) queue_family: u32,
    /// Valid bits of the queue family's timestamps (0: none).
    pub(crate) timestamp_bits: u32,
    pub(crate) cpu: bool,
    /// `VK_KHR_zero_initialize_workgroup_memory`: the driver zeroes workgroup memory itself,
    /// so kernels need not carry naga's zeroing code (with it, lavapipe recompiled the matmul
    /// kernels on every run despite its shader cache, as wgpu, which also uses the driver's
    /// zeroing, does not).
    pub(crate) zero_initializes_workgroup_memory: bool,
    /// Whether the device offers `robustBufferAccess`: reads and writes past a binding stay
    /// inside its buffer, so kernels need no bounds checks of their own on buffers.
    pub(crate) robust_buffers: bool,
    /// Tensor cores the shared `coop` matmul kernel can use ([`tensor_cores`]).
    pub(crate) tensor_cores: bool,
    /// Whether they also multiply bf16, which the kernel reaches through
    /// `VK_KHR_shader_bfloat16` (`bfloat16.rs`).
    pub(crate) bf16_tensor_cores: bool,
    /// Whether the tensor-core matmul of workgroup-scope matrices runs for every dtype the
    /// `coop` kernel takes (`cooperative_matrix2.rs`).
    pub(crate) tensor_matmul: bool,
    /// Whether the tensor-core attention runs too, for the same dtypes
    /// (`tensor_attention.rs`).
    pub(crate) tensor_attention: bool,

    /// Whether cooperative-matrix kernels are pinned to full subgroups of 32 through
    /// subgroup size control (`VK_EXT_subgroup_size_control`): needed where the device may
    /// pick another size (AMD's 32 or 64), and used wherever it is offered.
    pub(crate) pin_subgroups: bool,
}

/// Vulkan 1.2: timeline semaphores, 16-bit storage and `shaderFloat16` are core there.
const API_VERSION: u32 = vk::API_VERSION_1_2;

/// Vulkan 1.3, asked for where the loader offers it: the tensor-core matmul is SPIR-V 1.6
/// (`VK_NV_cooperative_matrix2` requires it), which a device takes from 1.3 on.
const SPIRV_1_6_VERSION: u32 = vk::API_VERSION_1_3;

/// The instance, or why there is none (no loader, no driver, too old a driver).
pub(crate) fn instance() -> Result<&'static Instance, String> {
    static INSTANCE: OnceLock<Result<Instance, String>> = OnceLock::new();
    INSTANCE.get_or_init(create).as_ref().map_err(Clone::clone)
}

fn create() -> Result<Instance, String> {
    // SAFETY: loading the Vulkan loader runs its initialization; the library is the system's
    // `libvulkan`, and the entry keeps it loaded for as long as the instance uses it.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("no Vulkan loader: {e}"))?;
    // SAFETY: a query with no inputs on a loaded entry.
    let version = unsafe { entry.try_enumerate_instance_version() }
        .map_err(|e| format!("vkEnumerateInstanceVersion: {e}"))?
        .unwrap_or(vk::API_VERSION_1_0);
    if version < API_VERSION {
        return Err(format!(
            "the Vulkan loader offers {}.{}; Tessera needs 1.2",
            vk::api_version_major(version),
            vk::api_version_minor(version)
        ));
    }
    let api = version.min(SPIRV_1_6_VERSION);
    let app = vk::ApplicationInfo::default()
        .application_name(c"tessera")
        .engine_name(c"tessera")
        .api_version(api);
    let info = vk::InstanceCreateInfo::default().application_info(&app);
    let _setup = DEVICE_SETUP.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: `info` and what it points to live through the call; the instance is destroyed
    // never (it serves the process).
    let instance = unsafe { entry.create_instance(&info, None) }
        .map_err(|e| format!("vkCreateInstance: {e}"))?;
    // SAFETY: the instance is valid.
    let handles = unsafe { instance.enumerate_physical_devices() }
        .map_err(|e| format!("vkEnumeratePhysicalDevices: {e}"))?;
    let devices = handles
        .into_iter()
        .filter_map(|pd| usable(&entry, &instance, api, pd))
        .collect();
    Ok(Instance {
        _entry: entry,
        instance,
        devices,
    })
}

/// Extensions a device must have.
pub(crate) const REQUIRED_EXTENSIONS: [&CStr; 1] = [ash::khr::push_descriptor::NAME];

/// `pd` with what opening it needs, if it can run the kernels: Vulkan 1.2, a compute queue,
/// push descriptors, timeline semaphores and 16-bit storage. `api` is the instance's version.
fn usable(
    entry: &ash::Entry,
    instance: &ash::Instance,
    api: u32,
    pd: vk::PhysicalDevice,
) -> Option<Physical> {
    // SAFETY: `pd` came from this instance.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    if props.api_version < API_VERSION {
        return None;
    }
    // SAFETY: as above.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let queue_family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))?;
    // SAFETY: as above.
    let extensions = unsafe { instance.enumerate_device_extension_properties(pd) }.ok()?;
    let has = |name: &CStr| {
        extensions
            .iter()
            .any(|e| e.extension_name_as_c_str() == Ok(name))
    };
    if !REQUIRED_EXTENSIONS.iter().all(|&n| has(n)) {
        return None;
    }
    let (v11, v12) = features(instance, pd);
    // SAFETY: as above.
    let core = unsafe { instance.get_physical_device_features(pd) };
    let zero_initializes_workgroup_memory =
        has(ZERO_INITIALIZE_WORKGROUP_MEMORY) && zero_initialize_feature(instance, pd);
    let size_control = has(SUBGROUP_SIZE_CONTROL) && subgroup_size_control_features(instance, pd);
    let cores = (has(COOPERATIVE_MATRIX)
        && v12.vulkan_memory_model == vk::TRUE
        && v12.vulkan_memory_model_device_scope == vk::TRUE
        && v12.shader_float16 == vk::TRUE)
        .then(|| tensor_cores(entry, instance, pd, size_control));
    let tensor_cores = cores.as_ref().is_some_and(|c| c.f16);
    let bf16_tensor_cores = tensor_cores
        && cores.is_some_and(|c| c.bf16)
        && has(SHADER_BFLOAT16)
        && bfloat16_features(instance, pd);
    let spirv_1_6 = api.min(props.api_version) >= SPIRV_1_6_VERSION;
    let kernels = if tensor_cores && spirv_1_6 && has(COOPERATIVE_MATRIX2) {
        tensor_kernels(entry, instance, pd)
    } else {
        TensorKernels::default()
    };
    // Each kernel runs for every dtype the `coop` kernel takes, or not at all.
    let every_dtype = |(f16, bf16): (bool, bool)| f16 && (bf16 || !bf16_tensor_cores);
    let tensor_matmul = every_dtype(kernels.matmul);
    let tensor_attention = tensor_matmul && every_dtype(kernels.attention);
    if v12.timeline_semaphore == vk::FALSE || v11.storage_buffer16_bit_access == vk::FALSE {
        return None;
    }
    let name = props
        .device_name_as_c_str()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "Vulkan device".into());
    Some(Physical {
        handle: pd,
        name,
        queue_family: queue_family as u32,
        timestamp_bits: families[queue_family].timestamp_valid_bits,
        cpu: props.device_type == vk::PhysicalDeviceType::CPU,
        zero_initializes_workgroup_memory,
        robust_buffers: core.robust_buffer_access == vk::TRUE,
        tensor_cores,
        bf16_tensor_cores,
        tensor_matmul,
        tensor_attention,
        pin_subgroups: tensor_cores && size_control,
    })
}

/// The cooperative-matrix extension (tensor cores).
pub(crate) const COOPERATIVE_MATRIX: &CStr = ash::khr::cooperative_matrix::NAME;

/// The extension that lets a device's subgroup size vary and lets a pipeline pin it.
pub(crate) const SUBGROUP_SIZE_CONTROL: &CStr = ash::ext::subgroup_size_control::NAME;

/// Whether `pd` offers both features of subgroup size control: a pipeline may ask for a size
/// (`subgroupSizeControl`) and for full subgroups (`computeFullSubgroups`).
fn subgroup_size_control_features(instance: &ash::Instance, pd: vk::PhysicalDevice) -> bool {
    let mut control = vk::PhysicalDeviceSubgroupSizeControlFeatures::default();
    let mut all = vk::PhysicalDeviceFeatures2::default().push_next(&mut control);
    // SAFETY: `pd` came from this instance and lists the extension (checked by the caller);
    // the chain lives through the call.
    unsafe { instance.get_physical_device_features2(pd, &mut all) };
    control.subgroup_size_control == vk::TRUE && control.compute_full_subgroups == vk::TRUE
}

/// Which of f16 and bf16 `pd` multiplies as 16x16x16 cooperative matrices into f32 in
/// subgroups of exactly 32 invocations: the shape the shared `coop` matmul kernel is written
/// for (NVIDIA's tensor cores), as the wgpu backend checks it. With subgroup size control
/// (`size_control`) 32 need only be among the sizes compute pipelines may ask for (the
/// kernel's pipelines then pin it); without it, it must be the device's one size.
fn tensor_cores(
    entry: &ash::Entry,
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    size_control: bool,
) -> TensorCores {
    let mut subgroup = vk::PhysicalDeviceSubgroupProperties::default();
    let mut range = vk::PhysicalDeviceSubgroupSizeControlProperties::default();
    {
        let mut props = vk::PhysicalDeviceProperties2::default().push_next(&mut subgroup);
        if size_control {
            props = props.push_next(&mut range);
        }
        // SAFETY: `pd` came from this instance; the chain lives through the call and holds
        // only structures of what `pd` offers.
        unsafe { instance.get_physical_device_properties2(pd, &mut props) };
    }
    let only_32 = if size_control {
        (range.min_subgroup_size..=range.max_subgroup_size).contains(&32)
            && range
                .required_subgroup_size_stages
                .contains(vk::ShaderStageFlags::COMPUTE)
    } else {
        subgroup.subgroup_size == 32
    };
    let coop = ash::khr::cooperative_matrix::Instance::new(entry, instance);
    // SAFETY: the extension is present on `pd` (checked by the caller), which came from this
    // instance.
    let shapes =
        unsafe { coop.get_physical_device_cooperative_matrix_properties(pd) }.unwrap_or_default();
    let multiplies = |input: vk::ComponentTypeKHR| {
        only_32
            && shapes.iter().any(|c| {
                (c.m_size, c.n_size, c.k_size) == (16, 16, 16)
                    && c.a_type == input
                    && c.b_type == input
                    && c.c_type == vk::ComponentTypeKHR::FLOAT32
                    && c.result_type == vk::ComponentTypeKHR::FLOAT32
                    && c.scope == vk::ScopeKHR::SUBGROUP
            })
    };
    TensorCores {
        f16: multiplies(vk::ComponentTypeKHR::FLOAT16),
        bf16: multiplies(BFLOAT16),
    }
}

/// The inputs a device's tensor cores take in the `coop` kernel's shape.
struct TensorCores {
    f16: bool,
    bf16: bool,
}

/// Whether `pd` offers bfloat16 values and cooperative matrices of them in kernels.
fn bfloat16_features(instance: &ash::Instance, pd: vk::PhysicalDevice) -> bool {
    let mut bf16 = Bfloat16Features::default();
    let mut all = vk::PhysicalDeviceFeatures2::default().push_next(&mut bf16);
    // SAFETY: `pd` came from this instance and lists the extension (checked by the caller);
    // the chain lives through the call.
    unsafe { instance.get_physical_device_features2(pd, &mut all) };
    bf16.shader_bfloat16_type == vk::TRUE && bf16.shader_bfloat16_cooperative_matrix == vk::TRUE
}

/// The extension that lets the driver zero workgroup memory (core in Vulkan 1.3, still listed).
pub(crate) const ZERO_INITIALIZE_WORKGROUP_MEMORY: &CStr =
    ash::khr::zero_initialize_workgroup_memory::NAME;

/// Whether `pd` offers `shaderZeroInitializeWorkgroupMemory`.
fn zero_initialize_feature(instance: &ash::Instance, pd: vk::PhysicalDevice) -> bool {
    let mut zero = vk::PhysicalDeviceZeroInitializeWorkgroupMemoryFeatures::default();
    let mut all = vk::PhysicalDeviceFeatures2::default().push_next(&mut zero);
    // SAFETY: `pd` came from this instance; the chain lives through the call.
    unsafe { instance.get_physical_device_features2(pd, &mut all) };
    zero.shader_zero_initialize_workgroup_memory == vk::TRUE
}

/// The Vulkan 1.1 and 1.2 features `pd` offers.
pub(crate) fn features(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> (
    vk::PhysicalDeviceVulkan11Features<'static>,
    vk::PhysicalDeviceVulkan12Features<'static>,
) {
    let mut v11 = vk::PhysicalDeviceVulkan11Features::default();
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default();
    {
        let mut all = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut v11)
            .push_next(&mut v12);
        // SAFETY: `pd` came from this instance; the chain lives through the call.
        unsafe { instance.get_physical_device_features2(pd, &mut all) };
    }
    v11.p_next = std::ptr::null_mut();
    v12.p_next = std::ptr::null_mut();
    (v11, v12)
}
