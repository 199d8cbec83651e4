//! The ceiling of f16 products on a device's tensor cores through Vulkan, as vkpeak's
//! `fp16-matrix` measures it: every subgroup of many workgroups multiplies fragments it
//! already holds (16x16x16 f16 into f32, `VK_KHR_cooperative_matrix`) in a long loop, with no
//! memory traffic beside a first load and a last store (`held`). `staged` rows load each
//! step's fragments from workgroup memory first, as a tiled matmul does; `direct` rows load
//! them from the buffer, through the caches. A matmul kernel cannot beat the first figure;
//! the others bound one that feeds its multiplications in those ways.
//!
//! `cargo run --release -p tessera-vulkan --example tensor_core_peak [device index]`

use std::error::Error;
use std::ffi::CStr;
use std::time::Instant;

use ash::vk;

/// Workgroups per dispatch (many waves on any GPU) and threads per workgroup.
const GROUPS: u32 = 132 * 16;
const THREADS: u32 = 256;
/// Multiply-adds per accumulator and dispatch.
const STEPS: u32 = 4096;
/// Accumulators per subgroup, as rows x columns of 16x16 fragments.
const SHAPES: [(u32, u32); 6] = [(1, 1), (2, 2), (2, 4), (4, 2), (4, 4), (8, 2)];
/// Halves between rows of the staged fragments: 64 k and 8 of padding, so that the 16 rows
/// of a fragment start in different banks.
const STAGE_STRIDE: u32 = 72;
/// The k walked by [`Feed::Direct`] fragments, and the halves between their rows.
const DIRECT_K: u32 = 1024;
const DIRECT_STRIDE: u32 = DIRECT_K + 8;
/// Halves of the source buffer: [`DIRECT_K`] rows of [`DIRECT_STRIDE`].
const SOURCE_HALVES: u32 = DIRECT_K * DIRECT_STRIDE;

fn main() -> Result<(), Box<dyn Error>> {
    let index: usize = std::env::args().nth(1).map_or(Ok(0), |a| a.parse())?;
    // SAFETY: loading the Vulkan loader runs its initialization; nothing else is loaded yet.
    let entry = unsafe { ash::Entry::load() }.map_err(|e| format!("no Vulkan loader: {e}"))?;
    let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
    // SAFETY: the create info and what it points to live through the call.
    let instance = unsafe {
        entry.create_instance(
            &vk::InstanceCreateInfo::default().application_info(&app),
            None,
        )
    }?;
    let result = measure(&entry, &instance, index);
    // SAFETY: every object created from the instance was destroyed by `measure`.
    unsafe { instance.destroy_instance(None) };
    result
}

fn measure(
    entry: &ash::Entry,
    instance: &ash::Instance,
    index: usize,
) -> Result<(), Box<dyn Error>> {
    // SAFETY: the instance is alive.
    let devices = unsafe { instance.enumerate_physical_devices() }?;
    let pd = *devices.get(index).ok_or("no such Vulkan device")?;
    // SAFETY: `pd` came from this instance.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    // SAFETY: the driver fills in a NUL-terminated name.
    let name = unsafe { CStr::from_ptr(props.device_name.as_ptr()) };
    // SAFETY: `pd` came from this instance.
    let listed = unsafe { instance.enumerate_device_extension_properties(pd) }?;
    let has_extension = listed
        .iter()
        .any(|e| e.extension_name_as_c_str() == Ok(ash::khr::cooperative_matrix::NAME));
    if !has_extension {
        return Err(format!("{name:?} has no VK_KHR_cooperative_matrix").into());
    }
    let coop = ash::khr::cooperative_matrix::Instance::new(entry, instance);
    // SAFETY: `pd` came from this instance, which has the extension's entry points.
    let shapes = unsafe { coop.get_physical_device_cooperative_matrix_properties(pd) }?;
    let offered = shapes.iter().any(|s| {
        (s.m_size, s.n_size, s.k_size) == (16, 16, 16)
            && s.a_type == vk::ComponentTypeKHR::FLOAT16
            && s.c_type == vk::ComponentTypeKHR::FLOAT32
            && s.scope == vk::ScopeKHR::SUBGROUP
    });
    if !offered {
        return Err(format!("{name:?} has no 16x16x16 f16 -> f32 cooperative matrices").into());
    }
    // SAFETY: `pd` came from this instance.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    let family = families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or("no compute queue")? as u32;
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let extensions = [ash::khr::cooperative_matrix::NAME.as_ptr()];
    let mut v11 = vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(true);
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default()
        .shader_float16(true)
        .vulkan_memory_model(true);
    let mut coop_feature =
        vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let create = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&extensions)
        .push_next(&mut v11)
        .push_next(&mut v12)
        .push_next(&mut coop_feature);
    // SAFETY: the create info and its chain live through the call.
    let device = unsafe { instance.create_device(pd, &create, None) }?;
    let result = run_all(instance, pd, &device, family, name);
    // SAFETY: `run_all` waited for the device and destroyed what it created.
    unsafe { device.destroy_device(None) };
    result
}

fn run_all(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    family: u32,
    name: &CStr,
) -> Result<(), Box<dyn Error>> {
    // SAFETY: `pd` came from this instance.
    let limits = unsafe { instance.get_physical_device_properties(pd) }.limits;
    println!(
        "{name:?}: {GROUPS} workgroups of {THREADS}, {STEPS} steps; workgroup memory up to {} bytes",
        limits.max_compute_shared_memory_size
    );
    println!("{:>8} {:>10} {:>10}", "kernel", "fragments", "TFLOP/s");
    for feed in [Feed::Held, Feed::Staged, Feed::Direct] {
        for (rows, cols) in SHAPES {
            let source = kernel(rows, cols, feed);
            let words = spirv(&source)?;
            let outputs = (GROUPS * THREADS / 32 * rows * cols * 256) as u64;
            let seconds = time_kernel(instance, pd, device, family, &words, outputs)?;
            let products = (GROUPS * THREADS / 32) as f64 * (rows * cols * STEPS) as f64;
            let tflops = products * 2.0 * 16.0 * 16.0 * 16.0 / seconds / 1e12;
            let label = format!("{feed:?}").to_lowercase();
            println!("{label:>8} {:>10} {tflops:>10.1}", format!("{rows}x{cols}"));
        }
    }
    Ok(())
}

/// Where each step's fragments come from.
#[derive(Clone, Copy, Debug)]
enum Feed {
    /// Registers: loaded once, before the loop.
    Held,
    /// Workgroup memory, rows [`STAGE_STRIDE`] halves apart.
    Staged,
    /// The buffer, walking [`DIRECT_K`] of k in rows [`DIRECT_STRIDE`] apart (A: 128 rows,
    /// B: 64 columns), more than a multiprocessor's L1 holds, so that they come from L2 as a
    /// matmul's operands would; the workgroup's subgroups read the same fragments.
    Direct,
}

/// The WGSL kernel: each subgroup's `rows x cols` accumulators, `STEPS` products each.
fn kernel(rows: u32, cols: u32, feed: Feed) -> String {
    let mut s = String::from(
        "enable f16;\nenable wgpu_cooperative_matrix;\n\
         @group(0) @binding(0) var<storage, read> src: array<f16>;\n\
         @group(0) @binding(1) var<storage, read_write> dst: array<f32>;\n\
         var<workgroup> stage: array<f16, 9216>;\n\
         @compute @workgroup_size(256)\n\
         fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {\n\
         let sg = lid / 32u;\n\
         for (var e = lid; e < 9216u; e += 256u) { stage[e] = src[e]; }\n\
         workgroupBarrier();\n",
    );
    for r in 0..rows {
        s += &format!(
            "var a{r} = coopLoad<coop_mat16x16<f16, A>>(&src[{}], 64u);\n",
            r * 16
        );
        for c in 0..cols {
            s += &format!("var c{r}{c} = coop_mat16x16<f32, C>();\n");
        }
    }
    for c in 0..cols {
        s += &format!(
            "var b{c} = coopLoad<coop_mat16x16<f16, B>>(&src[{}], 64u);\n",
            1024 + c * 16
        );
    }
    s += &format!("for (var i = 0u; i < {STEPS}u; i++) {{\n");
    let (array, stride, k_mask) = match feed {
        Feed::Held => ("", 0, 0),
        Feed::Staged => ("stage", STAGE_STRIDE, 3),
        Feed::Direct => ("src", DIRECT_STRIDE, DIRECT_K / 16 - 1),
    };
    if !array.is_empty() {
        s += &format!("let k = (i & {k_mask}u) * 16u;\n");
        for r in 0..rows {
            s += &format!(
                "a{r} = coopLoad<coop_mat16x16<f16, A>>(&{array}[{} + k], {stride}u);\n",
                r * 16 * stride
            );
        }
        for c in 0..cols {
            s += &format!(
                "b{c} = coopLoad<coop_mat16x16<f16, B>>(&{array}[k * {stride}u + {}], {stride}u);\n",
                c * 16
            );
        }
    }
    for r in 0..rows {
        for c in 0..cols {
            s += &format!("c{r}{c} = coopMultiplyAdd(a{r}, b{c}, c{r}{c});\n");
        }
    }
    s += "}\n";
    let per_subgroup = rows * cols * 256;
    s += &format!("let base = (wid.x * 8u + sg) * {per_subgroup}u;\n");
    for r in 0..rows {
        for c in 0..cols {
            let at = (r * cols + c) * 256;
            s += &format!("coopStore(c{r}{c}, &dst[base + {at}u], 16u);\n");
        }
    }
    s += "}\n";
    s
}

fn spirv(source: &str) -> Result<Vec<u32>, Box<dyn Error>> {
    use naga::back::spv;
    let module = naga::front::wgsl::parse_str(source).map_err(|e| e.emit_to_string(source))?;
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    let options = spv::Options {
        lang_version: (1, 5),
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    Ok(spv::write_vec(&module, &info, &options, Some(&pipeline))?)
}

/// A host-visible buffer of `bytes` and its memory.
fn buffer(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    bytes: u64,
) -> Result<(vk::Buffer, vk::DeviceMemory), Box<dyn Error>> {
    let info = vk::BufferCreateInfo::default()
        .size(bytes)
        .usage(vk::BufferUsageFlags::STORAGE_BUFFER);
    // SAFETY: the device is alive and the create info valid.
    let buffer = unsafe { device.create_buffer(&info, None) }?;
    // SAFETY: `buffer` belongs to `device`.
    let needs = unsafe { device.get_buffer_memory_requirements(buffer) };
    // SAFETY: `pd` came from this instance.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let kind = (0..memory.memory_type_count)
        .find(|&i| {
            needs.memory_type_bits & (1 << i) != 0
                && memory.memory_types[i as usize]
                    .property_flags
                    .contains(wanted)
        })
        .ok_or("no host-visible memory")?;
    let alloc = vk::MemoryAllocateInfo::default()
        .allocation_size(needs.size)
        .memory_type_index(kind);
    // SAFETY: the allocate info names a memory type of this device.
    let mem = unsafe { device.allocate_memory(&alloc, None) }?;
    // SAFETY: `mem` is unbound, of a type the buffer accepts, and large enough.
    unsafe { device.bind_buffer_memory(buffer, mem, 0) }?;
    Ok((buffer, mem))
}

/// The shortest dispatch's wall time, in seconds.
fn time_kernel(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    family: u32,
    words: &[u32],
    outputs: u64,
) -> Result<f64, Box<dyn Error>> {
    let src_bytes = 2 * SOURCE_HALVES as u64;
    let (src, src_mem) = buffer(instance, pd, device, src_bytes)?;
    let (dst, dst_mem) = buffer(instance, pd, device, outputs * 4)?;
    // SAFETY: `src_mem` is host-visible, bound to `src` and mapped over its `src_bytes`,
    // which hold SOURCE_HALVES f16 values (0x3c00 is 1.0).
    unsafe {
        let p = device.map_memory(src_mem, 0, src_bytes, vk::MemoryMapFlags::empty())?;
        std::slice::from_raw_parts_mut(p as *mut u16, SOURCE_HALVES as usize).fill(0x3c00);
        device.unmap_memory(src_mem);
    }
    let bindings: Vec<_> = (0..2)
        .map(|b| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    // SAFETY: every create info below lives through its call, and each object is destroyed
    // once the device is idle, at the end of this function.
    unsafe {
        let set_layout = device.create_descriptor_set_layout(
            &vk::DescriptorSetLayoutCreateInfo::default().bindings(&bindings),
            None,
        )?;
        let layouts = [set_layout];
        let pipeline_layout = device.create_pipeline_layout(
            &vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts),
            None,
        )?;
        let module = device
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(pipeline_layout);
        let pipeline = device
            .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
            .map_err(|(_, e)| e)?[0];
        let sizes = [vk::DescriptorPoolSize::default()
            .ty(vk::DescriptorType::STORAGE_BUFFER)
            .descriptor_count(2)];
        let pool = device.create_descriptor_pool(
            &vk::DescriptorPoolCreateInfo::default()
                .max_sets(1)
                .pool_sizes(&sizes),
            None,
        )?;
        let set = device.allocate_descriptor_sets(
            &vk::DescriptorSetAllocateInfo::default()
                .descriptor_pool(pool)
                .set_layouts(&layouts),
        )?[0];
        let infos = [
            [vk::DescriptorBufferInfo::default()
                .buffer(src)
                .range(vk::WHOLE_SIZE)],
            [vk::DescriptorBufferInfo::default()
                .buffer(dst)
                .range(vk::WHOLE_SIZE)],
        ];
        let writes: Vec<_> = infos
            .iter()
            .enumerate()
            .map(|(b, info)| {
                vk::WriteDescriptorSet::default()
                    .dst_set(set)
                    .dst_binding(b as u32)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .buffer_info(info)
            })
            .collect();
        device.update_descriptor_sets(&writes, &[]);
        let commands = device.create_command_pool(
            &vk::CommandPoolCreateInfo::default().queue_family_index(family),
            None,
        )?;
        let cb = device.allocate_command_buffers(
            &vk::CommandBufferAllocateInfo::default()
                .command_pool(commands)
                .command_buffer_count(1),
        )?[0];
        device.begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default())?;
        device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline);
        device.cmd_bind_descriptor_sets(
            cb,
            vk::PipelineBindPoint::COMPUTE,
            pipeline_layout,
            0,
            &[set],
            &[],
        );
        device.cmd_dispatch(cb, GROUPS, 1, 1);
        device.end_command_buffer(cb)?;
        let queue = device.get_device_queue(family, 0);
        let fence = device.create_fence(&vk::FenceCreateInfo::default(), None)?;
        // The best of at least a second of dispatches: the first ones run at lower clocks.
        let mut best = f64::INFINITY;
        let started = Instant::now();
        while started.elapsed().as_secs_f64() < 1.0 {
            let cbs = [cb];
            let submit = vk::SubmitInfo::default().command_buffers(&cbs);
            let start = Instant::now();
            device.queue_submit(queue, &[submit], fence)?;
            device.wait_for_fences(&[fence], true, u64::MAX)?;
            best = best.min(start.elapsed().as_secs_f64());
            device.reset_fences(&[fence])?;
        }
        let p = device.map_memory(dst_mem, 0, 4, vk::MemoryMapFlags::empty())? as *const f32;
        let first = *p;
        device.unmap_memory(dst_mem);
        device.device_wait_idle()?;
        device.destroy_fence(fence, None);
        device.destroy_command_pool(commands, None);
        device.destroy_descriptor_pool(pool, None);
        device.destroy_pipeline(pipeline, None);
        device.destroy_shader_module(module, None);
        device.destroy_pipeline_layout(pipeline_layout, None);
        device.destroy_descriptor_set_layout(set_layout, None);
        for (b, m) in [(src, src_mem), (dst, dst_mem)] {
            device.destroy_buffer(b, None);
            device.free_memory(m, None);
        }
        // Each sum adds STEPS products of ones over k = 16.
        let expected = (STEPS * 16) as f32;
        if first != expected {
            return Err(format!("the kernel summed {first}, not {expected}").into());
        }
        Ok(best)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every variant is a kernel naga validates and writes as SPIR-V.
    #[test]
    fn every_variant_compiles() {
        for feed in [Feed::Held, Feed::Staged, Feed::Direct] {
            for (rows, cols) in SHAPES {
                let words = spirv(&kernel(rows, cols, feed))
                    .unwrap_or_else(|e| panic!("{rows}x{cols}, {feed:?}: {e}"));
                assert_eq!(words[0], 0x0723_0203, "SPIR-V's magic number");
            }
        }
    }
}
