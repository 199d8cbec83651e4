//! `VK_NV_cooperative_matrix2`: workgroup-scope cooperative matrices of flexible sizes, loaded
//! and stored through tensor layouts, which the tensor-core matmul (`tensor_matmul.rs`) is
//! built on. ash 0.38 predates the extension, so its name, structures and query are declared
//! here from the Vulkan registry.

use std::ffi::{c_void, CStr};

use ash::vk;
use tessera_wgsl::{TensorAttention, TensorMatmul};

use crate::bfloat16::BFLOAT16;

/// The device extension.
pub(crate) const COOPERATIVE_MATRIX2: &CStr = c"VK_NV_cooperative_matrix2";

/// `VkPhysicalDeviceCooperativeMatrix2FeaturesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct Matrix2Features {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    workgroup_scope: vk::Bool32,
    flexible_dimensions: vk::Bool32,
    reductions: vk::Bool32,
    conversions: vk::Bool32,
    per_element_operations: vk::Bool32,
    tensor_addressing: vk::Bool32,
    block_loads: vk::Bool32,
}

impl Default for Matrix2Features {
    fn default() -> Matrix2Features {
        Matrix2Features {
            s_type: vk::StructureType::from_raw(1000593000),
            p_next: std::ptr::null_mut(),
            workgroup_scope: vk::FALSE,
            flexible_dimensions: vk::FALSE,
            reductions: vk::FALSE,
            conversions: vk::FALSE,
            per_element_operations: vk::FALSE,
            tensor_addressing: vk::FALSE,
            block_loads: vk::FALSE,
        }
    }
}

impl Matrix2Features {
    /// What the tensor-core matmul needs: workgroup-scope matrices of its tile's sizes,
    /// tensor layouts, and per-element functions (its rounding to bf16); with `attention`,
    /// also what the tensor-core attention needs: row reductions, and conversions of sums
    /// into operands.
    pub(crate) fn for_tensor_kernels(attention: bool) -> Matrix2Features {
        let also = if attention { vk::TRUE } else { vk::FALSE };
        Matrix2Features {
            workgroup_scope: vk::TRUE,
            flexible_dimensions: vk::TRUE,
            per_element_operations: vk::TRUE,
            tensor_addressing: vk::TRUE,
            reductions: also,
            conversions: also,
            ..Matrix2Features::default()
        }
    }

    fn offered(&self) -> bool {
        self.workgroup_scope == vk::TRUE
            && self.flexible_dimensions == vk::TRUE
            && self.per_element_operations == vk::TRUE
            && self.tensor_addressing == vk::TRUE
    }
}

// SAFETY: the structure is laid out as the registry declares it, with its structure type and
// chain pointer first, and the Vulkan specification allows it in both chains.
unsafe impl vk::ExtendsPhysicalDeviceFeatures2 for Matrix2Features {}
// SAFETY: as above.
unsafe impl vk::ExtendsDeviceCreateInfo for Matrix2Features {}

/// `VkPhysicalDeviceCooperativeMatrix2PropertiesNV`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Matrix2Properties {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    workgroup_scope_max_workgroup_size: u32,
    flexible_dimensions_max_dimension: u32,
    workgroup_scope_reserved_shared_memory: u32,
}

impl Default for Matrix2Properties {
    fn default() -> Matrix2Properties {
        Matrix2Properties {
            s_type: vk::StructureType::from_raw(1000593002),
            p_next: std::ptr::null_mut(),
            workgroup_scope_max_workgroup_size: 0,
            flexible_dimensions_max_dimension: 0,
            workgroup_scope_reserved_shared_memory: 0,
        }
    }
}

// SAFETY: as for the features.
unsafe impl vk::ExtendsPhysicalDeviceProperties2 for Matrix2Properties {}

/// `VkCooperativeMatrixFlexibleDimensionsPropertiesNV`: one combination of types and scope
/// the device multiplies, in sizes that are multiples of the granularities.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct FlexibleDimensions {
    s_type: vk::StructureType,
    p_next: *mut c_void,
    m_granularity: u32,
    n_granularity: u32,
    k_granularity: u32,
    a_type: vk::ComponentTypeKHR,
    b_type: vk::ComponentTypeKHR,
    c_type: vk::ComponentTypeKHR,
    result_type: vk::ComponentTypeKHR,
    saturating_accumulation: vk::Bool32,
    scope: vk::ScopeKHR,
    workgroup_invocations: u32,
}

impl Default for FlexibleDimensions {
    fn default() -> FlexibleDimensions {
        FlexibleDimensions {
            s_type: vk::StructureType::from_raw(1000593001),
            p_next: std::ptr::null_mut(),
            m_granularity: 0,
            n_granularity: 0,
            k_granularity: 0,
            a_type: vk::ComponentTypeKHR::FLOAT16,
            b_type: vk::ComponentTypeKHR::FLOAT16,
            c_type: vk::ComponentTypeKHR::FLOAT16,
            result_type: vk::ComponentTypeKHR::FLOAT16,
            saturating_accumulation: vk::FALSE,
            scope: vk::ScopeKHR::SUBGROUP,
            workgroup_invocations: 0,
        }
    }
}

/// `vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV`.
type FlexibleDimensionsQuery =
    unsafe extern "system" fn(vk::PhysicalDevice, *mut u32, *mut FlexibleDimensions) -> vk::Result;

/// What the device's workgroup-scope matrices run, each for (f16, bf16) operands: the
/// tensor-core matmul and the tensor-core attention.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TensorKernels {
    pub(crate) matmul: (bool, bool),
    pub(crate) attention: (bool, bool),
}

/// Which tensor-core kernels `pd` runs, for which operand dtypes: the features, sizes and
/// invocations they need, and each product of their tiles listed with f32 sums. The caller
/// has checked that `pd` lists the extension (and, for bf16, `VK_KHR_shader_bfloat16` with
/// its cooperative matrices).
pub(crate) fn tensor_kernels(
    entry: &ash::Entry,
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
) -> TensorKernels {
    let mut features = Matrix2Features::default();
    {
        let mut all = vk::PhysicalDeviceFeatures2::default().push_next(&mut features);
        // SAFETY: `pd` came from this instance and lists the extension; the chain lives
        // through the call.
        unsafe { instance.get_physical_device_features2(pd, &mut all) };
    }
    let mut properties = Matrix2Properties::default();
    {
        let mut all = vk::PhysicalDeviceProperties2::default().push_next(&mut properties);
        // SAFETY: as above.
        unsafe { instance.get_physical_device_properties2(pd, &mut all) };
    }
    if !features.offered() {
        return TensorKernels::default();
    }
    // SAFETY: the name is a valid C string; the instance is alive.
    let query = unsafe {
        entry.get_instance_proc_addr(
            instance.handle(),
            c"vkGetPhysicalDeviceCooperativeMatrixFlexibleDimensionsPropertiesNV".as_ptr(),
        )
    };
    let Some(query) = query else {
        return TensorKernels::default();
    };
    // SAFETY: the loader returned this command's entry point, whose signature is declared
    // above from the registry.
    let query: FlexibleDimensionsQuery = unsafe { std::mem::transmute(query) };
    let mut count = 0u32;
    // SAFETY: `pd` came from this instance; a null array asks for the count.
    if unsafe { query(pd, &mut count, std::ptr::null_mut()) } != vk::Result::SUCCESS {
        return TensorKernels::default();
    }
    let mut all = vec![FlexibleDimensions::default(); count as usize];
    // SAFETY: `all` holds `count` initialized structures.
    let listed = unsafe { query(pd, &mut count, all.as_mut_ptr()) };
    if listed != vk::Result::SUCCESS && listed != vk::Result::INCOMPLETE {
        return TensorKernels::default();
    }
    all.truncate(count as usize);
    // Whether workgroups of `threads` multiply `input` operands in every tile of `tiles`.
    let multiplies = |input: vk::ComponentTypeKHR, threads: u32, tiles: &[[u32; 3]]| {
        let largest = tiles.iter().flatten().copied().max().unwrap_or(0);
        properties.workgroup_scope_max_workgroup_size >= threads
            && properties.flexible_dimensions_max_dimension >= largest
            && all.iter().any(|d| {
                d.scope == vk::ScopeKHR::WORKGROUP
                    && d.workgroup_invocations == threads
                    && d.a_type == input
                    && d.b_type == input
                    && d.c_type == vk::ComponentTypeKHR::FLOAT32
                    && d.result_type == vk::ComponentTypeKHR::FLOAT32
                    && d.saturating_accumulation == vk::FALSE
                    && tiles.iter().all(|&[tm, tn, tk]| {
                        tm % d.m_granularity.max(1) == 0
                            && tn % d.n_granularity.max(1) == 0
                            && tk % d.k_granularity.max(1) == 0
                    })
            })
    };
    let matmul_tiles = [TensorMatmul::TILE, TensorMatmul::NARROW_TILE];
    let attention_tiles = TensorAttention::HEADS.map(TensorAttention::tile);
    let attention_features = features.reductions == vk::TRUE && features.conversions == vk::TRUE;
    let matmul = |input| multiplies(input, TensorMatmul::THREADS, &matmul_tiles);
    let attention =
        |input| attention_features && multiplies(input, TensorAttention::THREADS, &attention_tiles);
    TensorKernels {
        matmul: (matmul(vk::ComponentTypeKHR::FLOAT16), matmul(BFLOAT16)),
        attention: (
            attention(vk::ComponentTypeKHR::FLOAT16),
            attention(BFLOAT16),
        ),
    }
}
