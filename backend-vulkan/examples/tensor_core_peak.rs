//! The ceiling of f16 products on a device's tensor cores through Vulkan, as vkpeak's
//! `fp16-matrix` measures it: every subgroup of many workgroups multiplies fragments it
//! already holds (16x16x16 f16 into f32, `VK_KHR_cooperative_matrix`) in a long loop, with no
//! memory traffic beside a first load and a last store (`held`). `staged` rows load each
//! step's fragments from workgroup memory first, as a tiled matmul does; `direct` rows load
//! them from the buffer, through the caches. A matmul kernel cannot beat the first figure;
//! the others bound one that feeds its multiplications in those ways.
//!
//! `cargo run --release -p tessera-vulkan --example tensor_core_peak [device index]`

use ash::vk;
use probe::Outcome;

mod probe;

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

fn main() -> Outcome<()> {
    let index: usize = std::env::args().nth(1).map_or(Ok(0), |a| a.parse())?;
    probe::with_instance(|entry, instance| measure(entry, instance, index))
}

fn measure(entry: &ash::Entry, instance: &ash::Instance, index: usize) -> Outcome<()> {
    let (pd, name) = probe::pick(instance, index)?;
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
    let family = probe::compute_family(instance, pd)?;
    let extensions = [ash::khr::cooperative_matrix::NAME.as_ptr()];
    let mut v11 = vk::PhysicalDeviceVulkan11Features::default().storage_buffer16_bit_access(true);
    let mut v12 = vk::PhysicalDeviceVulkan12Features::default()
        .shader_float16(true)
        .vulkan_memory_model(true);
    let mut coop_feature =
        vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default().cooperative_matrix(true);
    let create = vk::DeviceCreateInfo::default()
        .enabled_extension_names(&extensions)
        .push_next(&mut v11)
        .push_next(&mut v12)
        .push_next(&mut coop_feature);
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
    // SAFETY: `pd` came from this instance.
    let limits = unsafe { instance.get_physical_device_properties(pd) }.limits;
    println!(
        "{name:?}: {GROUPS} workgroups of {THREADS}, {STEPS} steps; workgroup memory up to {} bytes; buffers in device memory: {}",
        limits.max_compute_shared_memory_size,
        probe::device_local(instance, pd)
    );
    println!("{:>8} {:>10} {:>10}", "kernel", "fragments", "TFLOP/s");
    for feed in [Feed::Held, Feed::Staged, Feed::Direct] {
        for (rows, cols) in SHAPES {
            let source = kernel(rows, cols, feed);
            let words = probe::spirv(&source)?;
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

/// The shortest dispatch's wall time, in seconds.
fn time_kernel(
    instance: &ash::Instance,
    pd: vk::PhysicalDevice,
    device: &ash::Device,
    family: u32,
    words: &[u32],
    outputs: u64,
) -> Outcome<f64> {
    let src_bytes = 2 * SOURCE_HALVES as u64;
    let (src, src_mem) = probe::buffer(instance, pd, device, src_bytes)?;
    let (dst, dst_mem) = probe::buffer(instance, pd, device, outputs * 4)?;
    // SAFETY: `src_mem` is host-visible, bound to `src` and mapped over its `src_bytes`,
    // which hold SOURCE_HALVES f16 values (0x3c00 is 1.0).
    unsafe {
        let p = device.map_memory(src_mem, 0, src_bytes, vk::MemoryMapFlags::empty())?;
        std::slice::from_raw_parts_mut(p as *mut u16, SOURCE_HALVES as usize).fill(0x3c00);
        device.unmap_memory(src_mem);
    }
    let (set_layout, pipeline_layout) =
        probe::layouts(device, 2, vk::DescriptorSetLayoutCreateFlags::empty(), 0)?;
    let (pipeline, module) = probe::pipeline(device, words, pipeline_layout)?;
    let (pool, set) = probe::descriptor_set(device, set_layout, &[src, dst])?;
    let (commands, cb) = probe::command_buffer(device, family)?;
    // SAFETY: every object used below belongs to `device` and is destroyed once the device
    // is idle, at the end of this function; `cb` is recorded before it is submitted.
    unsafe {
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
        let best = probe::best_submission(device, device.get_device_queue(family, 0), cb)?;
        let p = device.map_memory(dst_mem, 0, 4, vk::MemoryMapFlags::empty())? as *const f32;
        let first = *p;
        device.unmap_memory(dst_mem);
        device.device_wait_idle()?;
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
                let words = probe::spirv(&kernel(rows, cols, feed))
                    .unwrap_or_else(|e| panic!("{rows}x{cols}, {feed:?}: {e}"));
                assert_eq!(words[0], 0x0723_0203, "SPIR-V's magic number");
            }
        }
    }
}
