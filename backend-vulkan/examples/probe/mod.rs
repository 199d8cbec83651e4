//! What the probes share: the loader and instance, WGSL to SPIR-V through naga, host-visible
//! buffers, a compute queue, and the best of a second of submissions.

use std::error::Error;
use std::time::Instant;

use ash::vk;

pub type Outcome<T> = Result<T, Box<dyn Error>>;

/// Loads the Vulkan loader, makes a Vulkan 1.3 instance, runs `work` with it and destroys it.
pub fn with_instance(work: impl FnOnce(&ash::Entry, &ash::Instance) -> Outcome<()>) -> Outcome<()> {
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
    let result = work(&entry, &instance);
    // SAFETY: every object created from the instance was destroyed by `work`.
    unsafe { instance.destroy_instance(None) };
    result
}

/// Physical device `index` of the instance, and its name.
pub fn pick(instance: &ash::Instance, index: usize) -> Outcome<(vk::PhysicalDevice, String)> {
    // SAFETY: the instance is alive.
    let devices = unsafe { instance.enumerate_physical_devices() }?;
    let pd = *devices.get(index).ok_or("no such Vulkan device")?;
    // SAFETY: `pd` came from this instance.
    let props = unsafe { instance.get_physical_device_properties(pd) };
    let name = props
        .device_name_as_c_str()
        .map_or_else(|_| "?".to_string(), |n| n.to_string_lossy().into_owned());
    Ok((pd, name))
}

/// Makes a device of `pd` as `create` says, with one queue of `family`, runs `work` with it and
/// destroys it.
pub fn with_device(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    family: u32,
    create: vk::DeviceCreateInfo<'_>,
    work: impl FnOnce(&ash::Device) -> Outcome<()>,
) -> Outcome<()> {
    let priorities = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&priorities)];
    let create = vk::DeviceCreateInfo {
        queue_create_info_count: 1,
        p_queue_create_infos: queues.as_ptr(),
        ..create
    };
    // SAFETY: the create info and what it points to (the queues here, the caller's extensions
    // and feature chain) live through the call.
    let device = unsafe { instance.create_device(pd, &create, None) }?;
    let result = work(&device);
    // SAFETY: `work` waited for the device and destroyed what it created.
    unsafe { device.destroy_device(None) };
    result
}

/// The index of a queue family of `pd` that runs compute work.
pub fn compute_family(instance: &ash::Instance, pd: vk::PhysicalDevice) -> Outcome<u32> {
    // SAFETY: `pd` came from this instance.
    let families = unsafe { instance.get_physical_device_queue_family_properties(pd) };
    Ok(families
        .iter()
        .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
        .ok_or("no compute queue")? as u32)
}

/// The SPIR-V of a WGSL compute kernel whose entry point is `main`, validated by naga.
pub fn spirv(source: &str) -> Outcome<Vec<u32>> {
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

/// A host-visible storage buffer of `bytes` and its memory, in the device's own memory where
/// the host can map that ([`device_local`]): in the host's, every access crosses the bus.
pub fn buffer(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    bytes: u64,
) -> Outcome<(vk::Buffer, vk::DeviceMemory)> {
    let info = vk::BufferCreateInfo::default()
        .size(bytes)
        .usage(vk::BufferUsageFlags::STORAGE_BUFFER | vk::BufferUsageFlags::TRANSFER_DST);
    // SAFETY: the device is alive and the create info valid.
    let buffer = unsafe { device.create_buffer(&info, None) }?;
    // SAFETY: `buffer` belongs to `device`.
    let needs = unsafe { device.get_buffer_memory_requirements(buffer) };
    // SAFETY: `pd` came from this instance.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    let host = vk::MemoryPropertyFlags::HOST_VISIBLE | vk::MemoryPropertyFlags::HOST_COHERENT;
    let kind = [host | vk::MemoryPropertyFlags::DEVICE_LOCAL, host]
        .into_iter()
        .find_map(|wanted| {
            (0..memory.memory_type_count).find(|&i| {
                needs.memory_type_bits & (1 << i) != 0
                    && memory.memory_types[i as usize]
                        .property_flags
                        .contains(wanted)
            })
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

/// A compute pipeline running `words`' `main` under `layout`, and its shader module.
pub fn pipeline(
    device: &ash::Device,
    words: &[u32],
    layout: vk::PipelineLayout,
) -> Outcome<(vk::Pipeline, vk::ShaderModule)> {
    // SAFETY: the create infos live through the calls; the caller destroys both objects.
    unsafe {
        let module = device
            .create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)?;
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout);
        let pipeline = device
            .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
            .map_err(|(_, e)| e)?[0];
        Ok((pipeline, module))
    }
}

/// The shortest of at least a second of submissions of `cb` (each waited for), in seconds:
/// the first ones run at lower clocks.
pub fn best_submission(
    device: &ash::Device,
    queue: vk::Queue,
    cb: vk::CommandBuffer,
) -> Outcome<f64> {
    // SAFETY: `cb` is executable and not pending between submissions (each is waited for);
    // the fence is created, waited on and destroyed here.
    unsafe {
        let fence = device.create_fence(&vk::FenceCreateInfo::default(), None)?;
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
        device.destroy_fence(fence, None);
        Ok(best)
    }
}

/// A set layout of `count` storage buffers at bindings 0.. (`flags` may ask for push
/// descriptors) and a pipeline layout of that one set and `push_bytes` of push constants.
pub fn layouts(
    device: &ash::Device,
    count: u32,
    flags: vk::DescriptorSetLayoutCreateFlags,
    push_bytes: u32,
) -> Outcome<(vk::DescriptorSetLayout, vk::PipelineLayout)> {
    let bindings: Vec<_> = (0..count)
        .map(|b| {
            vk::DescriptorSetLayoutBinding::default()
                .binding(b)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .descriptor_count(1)
                .stage_flags(vk::ShaderStageFlags::COMPUTE)
        })
        .collect();
    let ranges = [vk::PushConstantRange::default()
        .stage_flags(vk::ShaderStageFlags::COMPUTE)
        .size(push_bytes)];
    let ranges = if push_bytes == 0 {
        &ranges[..0]
    } else {
        &ranges[..]
    };
    // SAFETY: the create infos live through the calls; the caller destroys both layouts.
    unsafe {
        let set_layout = device.create_descriptor_set_layout(
            &vk::DescriptorSetLayoutCreateInfo::default()
                .flags(flags)
                .bindings(&bindings),
            None,
        )?;
        let layouts = [set_layout];
        let pipeline_layout = device.create_pipeline_layout(
            &vk::PipelineLayoutCreateInfo::default()
                .set_layouts(&layouts)
                .push_constant_ranges(ranges),
            None,
        )?;
        Ok((set_layout, pipeline_layout))
    }
}

/// The writes that bind `infos` to bindings 0.. of `set` (null for a push descriptor set).
pub fn writes<'a>(
    set: vk::DescriptorSet,
    infos: &'a [[vk::DescriptorBufferInfo; 1]],
) -> Vec<vk::WriteDescriptorSet<'a>> {
    infos
        .iter()
        .enumerate()
        .map(|(b, info)| {
            vk::WriteDescriptorSet::default()
                .dst_set(set)
                .dst_binding(b as u32)
                .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                .buffer_info(info)
        })
        .collect()
}

/// Whole-buffer descriptor infos for `buffers`.
pub fn whole(buffers: &[vk::Buffer]) -> Vec<[vk::DescriptorBufferInfo; 1]> {
    buffers
        .iter()
        .map(|&b| {
            [vk::DescriptorBufferInfo::default()
                .buffer(b)
                .range(vk::WHOLE_SIZE)]
        })
        .collect()
}

/// A pool holding one set of `set_layout`, with `buffers` bound to its bindings 0...
pub fn descriptor_set(
    device: &ash::Device,
    set_layout: vk::DescriptorSetLayout,
    buffers: &[vk::Buffer],
) -> Outcome<(vk::DescriptorPool, vk::DescriptorSet)> {
    let sizes = [vk::DescriptorPoolSize::default()
        .ty(vk::DescriptorType::STORAGE_BUFFER)
        .descriptor_count(buffers.len() as u32)];
    let layouts = [set_layout];
    // SAFETY: the create infos live through the calls; the caller destroys the pool.
    unsafe {
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
        let infos = whole(buffers);
        device.update_descriptor_sets(&writes(set, &infos), &[]);
        Ok((pool, set))
    }
}

/// A command pool of `family` and one primary command buffer from it.
pub fn command_buffer(
    device: &ash::Device,
    family: u32,
) -> Outcome<(vk::CommandPool, vk::CommandBuffer)> {
    // SAFETY: the create infos live through the calls; the caller destroys the pool.
    unsafe {
        let commands = device.create_command_pool(
            &vk::CommandPoolCreateInfo::default().queue_family_index(family),
            None,
        )?;
        let cb = device.allocate_command_buffers(
            &vk::CommandBufferAllocateInfo::default()
                .command_pool(commands)
                .command_buffer_count(1),
        )?[0];
        Ok((commands, cb))
    }
}

/// Whether [`buffer`] puts buffers in the device's own memory.
pub fn device_local(instance: &ash::Instance, pd: vk::PhysicalDevice) -> bool {
    let wanted = vk::MemoryPropertyFlags::HOST_VISIBLE
        | vk::MemoryPropertyFlags::HOST_COHERENT
        | vk::MemoryPropertyFlags::DEVICE_LOCAL;
    // SAFETY: `pd` came from this instance.
    let memory = unsafe { instance.get_physical_device_memory_properties(pd) };
    memory.memory_types[..memory.memory_type_count as usize]
        .iter()
        .any(|t| t.property_flags.contains(wanted))
}
