//! What a dependent launch costs through Vulkan, and what the state recorded with it adds.
//! A command buffer holds a chain of [`CHAIN`] dispatches of a kernel that adds one to each
//! element of a buffer, each dispatch waiting for the one before it behind a barrier (the
//! recorder's, `record.rs`), with the state the backend records per dispatch added piece by
//! piece: push constants, a push descriptor set, another pipeline. `overlapped` leaves the
//! barriers out (the dispatches may run together), the floor a wait adds to. `grid` rows run
//! one dispatch whose workgroups meet [`CHAIN`] times through an atomic counter in the
//! buffer instead of between launches: what a wait costs inside one launch, where every
//! workgroup is resident at once (Vulkan does not promise that; these few are on any GPU).
//! The time per step is the best submission's over [`CHAIN`].
//!
//! `cargo run --release -p tessera-vulkan --example dispatch_chain [device index]`

use ash::vk;
use probe::Outcome;

mod probe;

/// Dependent steps per submission.
const CHAIN: u32 = 512;
/// Threads per workgroup.
const THREADS: u32 = 64;
/// Workgroups per dispatch: one; one a multiprocessor of an H100; eight a multiprocessor.
const GROUP_COUNTS: [u32; 3] = [1, 132, 1056];
/// Spins a workgroup of the `grid` kernel waits for the others before it gives up and counts
/// a timeout (so that a device that does not run them all at once fails instead of hanging).
const SPINS: u32 = 1 << 22;

/// What is recorded with each dispatch of the chain.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Chain {
    /// No barrier: the dispatches may overlap.
    Overlapped,
    /// A barrier before each dispatch; the pipeline and a descriptor set bound once.
    Barrier,
    /// And the push constants again before each dispatch.
    Constants,
    /// And the buffers as a push descriptor set before each dispatch.
    Descriptors,
    /// And another pipeline (of the same code) bound before each dispatch.
    Pipelines,
}

const CHAINS: [Chain; 5] = [
    Chain::Overlapped,
    Chain::Barrier,
    Chain::Constants,
    Chain::Descriptors,
    Chain::Pipelines,
];

fn main() -> Outcome<()> {
    let index: usize = std::env::args().nth(1).map_or(Ok(0), |a| a.parse())?;
    probe::with_instance(|_, instance| measure(instance, index))
}

fn measure(instance: &ash::Instance, index: usize) -> Outcome<()> {
    let (pd, name) = probe::pick(instance, index)?;
    let family = probe::compute_family(instance, pd)?;
    let extensions = [ash::khr::push_descriptor::NAME.as_ptr()];
    let create = vk::DeviceCreateInfo::default().enabled_extension_names(&extensions);
    probe::with_device(instance, pd, family, create, |device| {
        run_all(instance, pd, device, family, &name)
    })
}

fn run_all(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    family: u32,
    name: &str,
) -> Outcome<()> {
    let local = probe::device_local(instance, pd);
    println!("{name:?}: {CHAIN} dependent steps of workgroups of {THREADS}; buffers in device memory: {local}");
    println!("{:>12} {:>10} {:>12}", "steps", "workgroups", "us a step");
    for groups in GROUP_COUNTS {
        for chain in CHAINS {
            let seconds = time_chain(instance, pd, device, family, chain, groups)?;
            let label = format!("{chain:?}").to_lowercase();
            println!(
                "{label:>12} {groups:>10} {:>12.2}",
                seconds * 1e6 / CHAIN as f64
            );
        }
    }
    for groups in [132, 264] {
        let (seconds, stale, gave_up) = time_grid(instance, pd, device, family, groups)?;
        println!(
            "{:>12} {groups:>10} {:>12.2}  ({stale} stale reads, {gave_up} waits given up)",
            "grid",
            seconds * 1e6 / CHAIN as f64
        );
    }
    Ok(())
}

/// The chain's kernel: one added to each thread's element, the one from push constants.
const CHAIN_KERNEL: &str = "\
struct Step { one: f32 }
var<immediate> step: Step;
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {
    data[g.x] += step.one;
}
";

/// The best submission of a chain of `groups`-workgroup dispatches recorded as `chain` says,
/// in seconds; an error if a chain with barriers lost an addition.
fn time_chain(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    family: u32,
    chain: Chain,
    groups: u32,
) -> Outcome<f64> {
    let elements = groups * THREADS;
    let (data, data_mem) = probe::buffer(instance, pd, device, elements as u64 * 4)?;
    let words = probe::spirv(CHAIN_KERNEL)?;
    let (set_layout, layout) =
        probe::layouts(device, 1, vk::DescriptorSetLayoutCreateFlags::empty(), 4)?;
    let (push_set_layout, push_layout) = probe::layouts(
        device,
        1,
        vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR,
        4,
    )?;
    let pushes = matches!(chain, Chain::Descriptors | Chain::Pipelines);
    let used_layout = if pushes { push_layout } else { layout };
    let pipelines = [
        probe::pipeline(device, &words, used_layout)?,
        probe::pipeline(device, &words, used_layout)?,
    ];
    let (pool, set) = probe::descriptor_set(device, set_layout, &[data])?;
    let (commands, cb) = probe::command_buffer(device, family)?;
    // The device enables the extension these entry points belong to (`measure`).
    let push_descriptor = ash::khr::push_descriptor::Device::new(instance, device);
    let infos = probe::whole(&[data]);
    let one = 1.0f32.to_ne_bytes();
    // SAFETY: every object used below belongs to `device` and is destroyed once the device
    // is idle, at the end of this function; `cb` is recorded before it is submitted.
    unsafe {
        device.begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default())?;
        device.cmd_fill_buffer(cb, data, 0, vk::WHOLE_SIZE, 0);
        barrier(device, cb);
        for step in 0..CHAIN {
            if step > 0 && chain != Chain::Overlapped {
                barrier(device, cb);
            }
            let pipeline = pipelines[if chain == Chain::Pipelines {
                step as usize % 2
            } else {
                0
            }]
            .0;
            if step == 0 || chain == Chain::Pipelines {
                device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline);
            }
            if pushes {
                push_descriptor.cmd_push_descriptor_set(
                    cb,
                    vk::PipelineBindPoint::COMPUTE,
                    push_layout,
                    0,
                    &probe::writes(vk::DescriptorSet::null(), &infos),
                );
            } else if step == 0 {
                device.cmd_bind_descriptor_sets(
                    cb,
                    vk::PipelineBindPoint::COMPUTE,
                    layout,
                    0,
                    &[set],
                    &[],
                );
            }
            if step == 0 || chain != Chain::Overlapped && chain != Chain::Barrier {
                device.cmd_push_constants(cb, used_layout, vk::ShaderStageFlags::COMPUTE, 0, &one);
            }
            device.cmd_dispatch(cb, groups, 1, 1);
        }
        device.end_command_buffer(cb)?;
        let best = probe::best_submission(device, device.get_device_queue(family, 0), cb)?;
        let p = device.map_memory(data_mem, 0, vk::WHOLE_SIZE, vk::MemoryMapFlags::empty())?;
        let values = std::slice::from_raw_parts(p as *const f32, elements as usize);
        let lost = values.iter().filter(|&&v| v != CHAIN as f32).count();
        device.unmap_memory(data_mem);
        device.device_wait_idle()?;
        device.destroy_command_pool(commands, None);
        device.destroy_descriptor_pool(pool, None);
        for (pipeline, module) in pipelines {
            device.destroy_pipeline(pipeline, None);
            device.destroy_shader_module(module, None);
        }
        for (set_layout, layout) in [(set_layout, layout), (push_set_layout, push_layout)] {
            device.destroy_pipeline_layout(layout, None);
            device.destroy_descriptor_set_layout(set_layout, None);
        }
        device.destroy_buffer(data, None);
        device.free_memory(data_mem, None);
        if lost > 0 && chain != Chain::Overlapped {
            return Err(format!("{chain:?}: {lost} of {elements} elements lost additions").into());
        }
        Ok(best)
    }
}

/// The `grid` kernel: [`CHAIN`] rounds, each reading the last round's half of `data` (its own
/// element and a neighbour's, another workgroup's) and writing the other half, then waiting
/// until every workgroup has arrived (`sync[0]`). A neighbour's value that is not the last
/// round's counts in `sync[1]` (lavapipe has some: this wait does not make writes visible
/// there), a wait given up in `sync[2]`.
fn grid_kernel() -> String {
    format!(
        "\
@group(0) @binding(0) var<storage, read_write> data: array<f32>;
@group(0) @binding(1) var<storage, read_write> sync: array<atomic<u32>, 3>;
@compute @workgroup_size({THREADS})
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(local_invocation_index) lid: u32, @builtin(num_workgroups) nwg: vec3<u32>) {{
    let total = nwg.x * {THREADS}u;
    for (var r = 0u; r < {CHAIN}u; r++) {{
        let read_at = (r % 2u) * total;
        let write_at = total - read_at;
        let neighbour = data[read_at + (g.x + {THREADS}u) % total];
        if (neighbour != f32(r)) {{ atomicAdd(&sync[1], 1u); }}
        data[write_at + g.x] = data[read_at + g.x] + 1.0;
        storageBarrier();
        if (lid == 0u) {{
            atomicAdd(&sync[0], 1u);
            let arrived = (r + 1u) * nwg.x;
            var spins = 0u;
            while (atomicLoad(&sync[0]) < arrived) {{
                spins += 1u;
                if (spins == {SPINS}u) {{ atomicAdd(&sync[2], 1u); break; }}
            }}
        }}
        storageBarrier();
    }}
}}
"
    )
}

/// The best submission of one `grid` dispatch of `groups` workgroups, in seconds, with the
/// stale reads and the waits given up over all submissions.
fn time_grid(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    family: u32,
    groups: u32,
) -> Outcome<(f64, u32, u32)> {
    let elements = groups * THREADS;
    let (data, data_mem) = probe::buffer(instance, pd, device, 2 * elements as u64 * 4)?;
    let (sync, sync_mem) = probe::buffer(instance, pd, device, 12)?;
    let words = probe::spirv(&grid_kernel())?;
    let (set_layout, layout) =
        probe::layouts(device, 2, vk::DescriptorSetLayoutCreateFlags::empty(), 0)?;
    let (pipeline, module) = probe::pipeline(device, &words, layout)?;
    let (pool, set) = probe::descriptor_set(device, set_layout, &[data, sync])?;
    let (commands, cb) = probe::command_buffer(device, family)?;
    // SAFETY: every object used below belongs to `device` and is destroyed once the device
    // is idle, at the end of this function; `cb` is recorded before it is submitted.
    unsafe {
        device.begin_command_buffer(cb, &vk::CommandBufferBeginInfo::default())?;
        device.cmd_fill_buffer(cb, data, 0, vk::WHOLE_SIZE, 0);
        device.cmd_fill_buffer(cb, sync, 0, 4, 0);
        barrier(device, cb);
        device.cmd_bind_pipeline(cb, vk::PipelineBindPoint::COMPUTE, pipeline);
        device.cmd_bind_descriptor_sets(cb, vk::PipelineBindPoint::COMPUTE, layout, 0, &[set], &[]);
        device.cmd_dispatch(cb, groups, 1, 1);
        device.end_command_buffer(cb)?;
        let best = probe::best_submission(device, device.get_device_queue(family, 0), cb)?;
        let p = device.map_memory(sync_mem, 0, 12, vk::MemoryMapFlags::empty())? as *const u32;
        let (stale, gave_up) = (*p.add(1), *p.add(2));
        device.unmap_memory(sync_mem);
        device.device_wait_idle()?;
        device.destroy_command_pool(commands, None);
        device.destroy_descriptor_pool(pool, None);
        device.destroy_pipeline(pipeline, None);
        device.destroy_shader_module(module, None);
        device.destroy_pipeline_layout(layout, None);
        device.destroy_descriptor_set_layout(set_layout, None);
        for (b, m) in [(data, data_mem), (sync, sync_mem)] {
            device.destroy_buffer(b, None);
            device.free_memory(m, None);
        }
        Ok((best, stale, gave_up))
    }
}

/// The recorder's barrier: compute and copies before it, then compute and copies after.
fn barrier(device: &ash::Device, cb: vk::CommandBuffer) {
    let work = vk::PipelineStageFlags::COMPUTE_SHADER | vk::PipelineStageFlags::TRANSFER;
    let barrier = [vk::MemoryBarrier::default()
        .src_access_mask(vk::AccessFlags::SHADER_WRITE | vk::AccessFlags::TRANSFER_WRITE)
        .dst_access_mask(vk::AccessFlags::SHADER_READ | vk::AccessFlags::SHADER_WRITE)];
    // SAFETY: `cb` is recording; the barrier array lives through the call.
    unsafe {
        device.cmd_pipeline_barrier(
            cb,
            work,
            work,
            vk::DependencyFlags::empty(),
            &barrier,
            &[],
            &[],
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both kernels are WGSL naga validates and writes as SPIR-V.
    #[test]
    fn kernels_compile() {
        for source in [CHAIN_KERNEL.to_string(), grid_kernel()] {
            let words = probe::spirv(&source).unwrap_or_else(|e| panic!("{source}: {e}"));
            assert_eq!(words[0], 0x0723_0203, "SPIR-V's magic number");
        }
    }
}
