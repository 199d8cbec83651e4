//! The shared WGSL kernels compiled to SPIR-V by naga, as compute pipelines cached per device.
//!
//! A kernel takes its data bindings as a push descriptor set (set 1, bindings from 1, as the
//! WGSL declares them) and its parameters as push constants where the device has room for its
//! block; a larger block comes from the batch's parameter buffer, bound as set 0 at a dynamic
//! offset (`params.rs`). Set 0 is an empty layout for kernels with push constants.
//!
//! naga validates each module before the driver sees it, and writes it with the options
//! wgpu's Vulkan backend uses (indices and buffer accesses clamped into bounds, workgroup
//! memory zeroed), so a kernel behaves alike on both backends, with two exceptions: buffer
//! accesses are left to the driver where it keeps them in bounds (`robustBufferAccess`), and
//! indices are not clamped in kernels marked as keeping them in range by construction
//! (`INDICES_IN_RANGE`). A kernel marked `F16_IS_BF16` gets its 16-bit float type re-encoded
//! as bfloat16 (`bfloat16.rs`). The driver's compiled pipelines are kept on disk between runs
//! (`driver_cache.rs`).
//!
//! With `TESSERA_VULKAN_SPIRV_DIR` set, every module is also written into that folder as it
//! is compiled, named by a hash of its words, for a validator (`spirv-val`) or a
//! disassembler; CI validates every module the test suite compiles on lavapipe this way.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use ash::vk;
use naga::back::spv;
use naga::proc::{BoundsCheckPolicies, BoundsCheckPolicy};
use naga::valid::{Capabilities, ValidationFlags, Validator};
use tessera_core::{Error, Result};
use tessera_wgsl::{AttentionPass, PipelineCache, Source, F16_IS_BF16, INDICES_IN_RANGE};

use crate::bfloat16::f16_as_bf16;
use crate::driver_cache::DriverCache;
use crate::memory::{lock, vk_err, Shared};
use crate::{tensor_attention, tensor_matmul, tensor_scores_gradient};

/// A compiled kernel and the layout it binds with. Pipelines live until their device goes
/// (after its queue has finished), or are dropped unused when two threads compiled one kernel
/// at once.
pub(crate) struct Pipeline {
    /// The kernel's cache key: its name in profiles.
    pub(crate) name: String,
    pub(crate) pipeline: vk::Pipeline,
    pub(crate) layout: vk::PipelineLayout,
    /// Whether the kernel writes each data binding (stores into it or updates it atomically),
    /// in binding order: where the recorder needs a barrier.
    pub(crate) writes: Vec<bool>,
    shared: Arc<Shared>,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        // SAFETY: no pending work uses the pipeline (see the type's docs).
        unsafe { self.shared.device.destroy_pipeline(self.pipeline, None) };
    }
}

/// The pipelines of one device and the layouts they share (dropped after the pipelines).
pub(crate) struct Pipelines {
    cache: PipelineCache<Pipeline>,
    layouts: Layouts,
    /// The driver's compiled pipelines, kept on disk between runs.
    driver_cache: DriverCache,
    /// How kernels get their workgroup memory zeroed: by the driver where it can, else by
    /// code naga writes into each kernel.
    zero_initialize: spv::ZeroInitializeWorkgroupMemoryMode,
    /// Whether kernels on cooperative matrices ask for full subgroups of
    /// [`COOPERATIVE_SUBGROUP`] (the device may pick other sizes, or offers the control).
    pin_subgroups: bool,
    /// How kernels check their buffer indices: not at all where the device was opened with
    /// `robustBufferAccess` (it keeps every access inside its buffer; naga's clamps cost the
    /// H100 a quarter of its f16 matmul throughput), else clamped by naga.
    buffer_checks: BoundsCheckPolicy,
    /// Pipelines compiled for one parameter block ([`tessera_wgsl::Dispatch::specialize`]).
    specialized: AtomicUsize,
}

/// Pipelines a device compiles for single parameter blocks at most: one per distinct product
/// shape, which a training step has a few dozen of; past this, kernels read their parameters.
const MAX_SPECIALIZED: usize = 512;

/// The subgroup size the cooperative-matrix kernels are written for.
const COOPERATIVE_SUBGROUP: u32 = 32;

/// Set 0 (empty, or the parameter buffer), and set 1's push-descriptor layout with the
/// pipeline layout by number of data bindings and whether parameters are push constants.
struct Layouts {
    shared: Arc<Shared>,
    push_constant_bytes: u32,
    empty_set: vk::DescriptorSetLayout,
    param_set: vk::DescriptorSetLayout,
    sets: Mutex<HashMap<usize, vk::DescriptorSetLayout>>,
    by_bindings: Mutex<HashMap<(usize, bool), vk::PipelineLayout>>,
}

impl Pipelines {
    pub(crate) fn new(
        shared: &Arc<Shared>,
        props: &vk::PhysicalDeviceProperties,
        push_constant_bytes: u32,
        driver_zeroes_workgroup_memory: bool,
        pin_subgroups: bool,
        robust_buffers: bool,
    ) -> Result<Pipelines> {
        let set_layout = |info: &vk::DescriptorSetLayoutCreateInfo| {
            // SAFETY: the device is valid; `info` lives through the call.
            unsafe { shared.device.create_descriptor_set_layout(info, None) }
                .map_err(|e| vk_err("vkCreateDescriptorSetLayout", e))
        };
        let empty_set = set_layout(&vk::DescriptorSetLayoutCreateInfo::default())?;
        let param_binding = [vk::DescriptorSetLayoutBinding::default()
            .binding(0)
            .descriptor_type(vk::DescriptorType::STORAGE_BUFFER_DYNAMIC)
            .descriptor_count(1)
            .stage_flags(vk::ShaderStageFlags::COMPUTE)];
        let param_set =
            set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&param_binding))?;
        let driver_cache = DriverCache::open(shared, props)?;
        Ok(Pipelines {
            pin_subgroups,
            buffer_checks: if robust_buffers {
                BoundsCheckPolicy::Unchecked
            } else {
                BoundsCheckPolicy::Restrict
            },
            cache: PipelineCache::default(),
            specialized: AtomicUsize::new(0),
            driver_cache,
            zero_initialize: if driver_zeroes_workgroup_memory {
                spv::ZeroInitializeWorkgroupMemoryMode::Native
            } else {
                spv::ZeroInitializeWorkgroupMemoryMode::Polyfill
            },
            layouts: Layouts {
                shared: shared.clone(),
                push_constant_bytes,
                empty_set,
                param_set,
                sets: Mutex::new(HashMap::new()),
                by_bindings: Mutex::new(HashMap::new()),
            },
        })
    }

    /// Set 0's layout for kernels that read their parameters from the parameter buffer.
    pub(crate) fn param_set_layout(&self) -> vk::DescriptorSetLayout {
        self.layouts.param_set
    }
}

impl Layouts {
    /// Set 1's push-descriptor layout for `bindings` data bindings.
    fn data_set(&self, bindings: usize) -> Result<vk::DescriptorSetLayout> {
        let mut sets = lock(&self.sets);
        if let Some(set) = sets.get(&bindings) {
            return Ok(*set);
        }
        let entries: Vec<vk::DescriptorSetLayoutBinding> = (1..=bindings as u32)
            .map(|b| {
                vk::DescriptorSetLayoutBinding::default()
                    .binding(b)
                    .descriptor_type(vk::DescriptorType::STORAGE_BUFFER)
                    .descriptor_count(1)
                    .stage_flags(vk::ShaderStageFlags::COMPUTE)
            })
            .collect();
        let info = vk::DescriptorSetLayoutCreateInfo::default()
            .flags(vk::DescriptorSetLayoutCreateFlags::PUSH_DESCRIPTOR_KHR)
            .bindings(&entries);
        // SAFETY: the device is valid; `info` and `entries` live through the call.
        let set = unsafe { self.shared.device.create_descriptor_set_layout(&info, None) }
            .map_err(|e| vk_err("vkCreateDescriptorSetLayout", e))?;
        sets.insert(bindings, set);
        Ok(set)
    }

    fn layout(&self, bindings: usize, immediate: bool) -> Result<vk::PipelineLayout> {
        let data = self.data_set(bindings)?;
        let mut layouts = lock(&self.by_bindings);
        if let Some(layout) = layouts.get(&(bindings, immediate)) {
            return Ok(*layout);
        }
        let first = if immediate {
            self.empty_set
        } else {
            self.param_set
        };
        let sets = [first, data];
        let ranges = [vk::PushConstantRange {
            stage_flags: vk::ShaderStageFlags::COMPUTE,
            offset: 0,
            size: self.push_constant_bytes,
        }];
        let mut info = vk::PipelineLayoutCreateInfo::default().set_layouts(&sets);
        if immediate {
            info = info.push_constant_ranges(&ranges);
        }
        // SAFETY: the device is valid; both set layouts belong to it; `info` and the arrays
        // it points to live through the call.
        let layout = unsafe { self.shared.device.create_pipeline_layout(&info, None) }
            .map_err(|e| vk_err("vkCreatePipelineLayout", e))?;
        layouts.insert((bindings, immediate), layout);
        Ok(layout)
    }
}

impl Pipelines {
    /// The pipeline cached under `key`, compiling `source()` on a miss; for the parameter
    /// words `fixed` alone where given, while fewer than [`MAX_SPECIALIZED`] are.
    pub(crate) fn get(
        &self,
        key: &str,
        bindings: usize,
        immediate: bool,
        fixed: Option<&[u32]>,
        source: &mut dyn FnMut() -> Result<Source>,
    ) -> Result<Arc<Pipeline>> {
        let room = || self.specialized.load(Ordering::Relaxed) < MAX_SPECIALIZED;
        if let Some(words) = fixed.filter(|_| room()) {
            let fixed_key = format!("{key}/{words:?}");
            return self.cache.get_or_build(&fixed_key, immediate, || {
                self.specialized.fetch_add(1, Ordering::Relaxed);
                self.build(key, bindings, immediate, source()?, Some(words))
            });
        }
        self.cache.get_or_build(key, immediate, || {
            self.build(key, bindings, immediate, source()?, None)
        })
    }

    fn build(
        &self,
        key: &str,
        bindings: usize,
        immediate: bool,
        src: Source,
        fixed: Option<&[u32]>,
    ) -> Result<Pipeline> {
        let (words, writes, cooperative) = match src {
            Source::Wgsl(src) => {
                let (words, writes) = to_spirv(
                    key,
                    &src,
                    bindings,
                    self.zero_initialize,
                    self.buffer_checks,
                )?;
                (words, writes, src.contains("coop_mat"))
            }
            Source::TensorMatmul(kernel) => {
                let words = tensor_matmul::spirv(&kernel, fixed).map_err(|log| Error::Compile {
                    backend: "vulkan".into(),
                    op: key.into(),
                    log,
                })?;
                // The inputs are read, the output (the last binding) written.
                let writes = (1..=bindings).map(|b| b == bindings).collect();
                (words, writes, true)
            }
            Source::TensorAttention(kernel) => {
                let words = match kernel.pass {
                    AttentionPass::Forward => tensor_attention::spirv(&kernel, fixed),
                    AttentionPass::ScoresGradient => tensor_scores_gradient::spirv(&kernel, fixed),
                };
                let words = words.map_err(|log| Error::Compile {
                    backend: "vulkan".into(),
                    op: key.into(),
                    log,
                })?;
                // q, k and v (and what else the pass reads) are read; its outputs, the last
                // bindings, written.
                let outputs = kernel.outputs();
                let writes = (1..=bindings).map(|b| b + outputs > bindings).collect();
                (words, writes, true)
            }
        };
        write_module(&words)?;
        let layout = self.layouts.layout(bindings, immediate)?;
        let shared = &self.layouts.shared;
        let device = &shared.device;
        let module_info = vk::ShaderModuleCreateInfo::default().code(&words);
        // SAFETY: the device is valid; `words` is a SPIR-V module naga validated and wrote.
        let module = unsafe { device.create_shader_module(&module_info, None) }
            .map_err(|e| vk_err("vkCreateShaderModule", e))?;
        // A kernel on cooperative matrices is written for full subgroups of 32.
        let mut subgroup_size = vk::PipelineShaderStageRequiredSubgroupSizeCreateInfo::default()
            .required_subgroup_size(COOPERATIVE_SUBGROUP);
        let stage = vk::PipelineShaderStageCreateInfo::default()
            .stage(vk::ShaderStageFlags::COMPUTE)
            .module(module)
            .name(c"main");
        let stage = if self.pin_subgroups && cooperative {
            stage
                .flags(vk::PipelineShaderStageCreateFlags::REQUIRE_FULL_SUBGROUPS_EXT)
                .push_next(&mut subgroup_size)
        } else {
            stage
        };
        let info = vk::ComputePipelineCreateInfo::default()
            .stage(stage)
            .layout(layout);
        // SAFETY: as above; the module, layout and cache belong to this device and live through
        // the call (the cache is synchronized by the driver); the module is destroyed once the
        // pipeline holds its code.
        let created = unsafe {
            let created = device.create_compute_pipelines(self.driver_cache.handle, &[info], None);
            device.destroy_shader_module(module, None);
            created
        };
        let pipeline = created
            .map_err(|(_, e)| Error::Compile {
                backend: "vulkan".into(),
                op: key.into(),
                log: format!("vkCreateComputePipelines: {e}"),
            })?
            .into_iter()
            .next()
            .ok_or_else(|| vk_err("vkCreateComputePipelines", vk::Result::ERROR_UNKNOWN))?;
        self.driver_cache.grew();
        Ok(Pipeline {
            name: if fixed.is_some() {
                format!("{key}/fixed")
            } else {
                key.to_string()
            },
            pipeline,
            layout,
            writes,
            shared: shared.clone(),
        })
    }
}

impl Drop for Layouts {
    fn drop(&mut self) {
        let device = &self.shared.device;
        // SAFETY: the pipelines made with these layouts are gone and the queue is idle (the
        // context drains it first); every handle was created on this device.
        unsafe {
            for (_, layout) in lock(&self.by_bindings).drain() {
                device.destroy_pipeline_layout(layout, None);
            }
            for (_, set) in lock(&self.sets).drain() {
                device.destroy_descriptor_set_layout(set, None);
            }
            device.destroy_descriptor_set_layout(self.empty_set, None);
            device.destroy_descriptor_set_layout(self.param_set, None);
        }
    }
}

/// Writes `words` into the folder `TESSERA_VULKAN_SPIRV_DIR` names, if it names one, as
/// `<hash of the words>.spv`.
fn write_module(words: &[u32]) -> Result<()> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    let dir = DIR.get_or_init(|| {
        std::env::var_os("TESSERA_VULKAN_SPIRV_DIR")
            .filter(|d| !d.is_empty())
            .map(PathBuf::from)
    });
    let Some(dir) = dir else {
        return Ok(());
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    words.hash(&mut hasher);
    let path = dir.join(format!("{:016x}.spv", hasher.finish()));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    std::fs::write(&path, bytes).map_err(|source| Error::Io {
        path: path.display().to_string(),
        source,
    })
}

/// WGSL to validated SPIR-V words, with whether the kernel may write each of its `bindings`
/// data bindings.
pub(crate) fn to_spirv(
    key: &str,
    src: &str,
    bindings: usize,
    zero_initialize: spv::ZeroInitializeWorkgroupMemoryMode,
    buffer_checks: BoundsCheckPolicy,
) -> Result<(Vec<u32>, Vec<bool>)> {
    let compile_error = |log: String| {
        let numbered: Vec<String> = src
            .lines()
            .enumerate()
            .map(|(i, l)| format!("{:4} {l}", i + 1))
            .collect();
        Error::Compile {
            backend: "vulkan".into(),
            op: key.into(),
            log: format!("{log}\n{}", numbered.join("\n")),
        }
    };
    let module =
        naga::front::wgsl::parse_str(src).map_err(|e| compile_error(e.emit_to_string(src)))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::all())
        .validate(&module)
        .map_err(|e| compile_error(format!("{e:?}")))?;
    let options = spv::Options {
        // SPIR-V 1.5, the newest Vulkan 1.2 takes.
        lang_version: (1, 5),
        flags: spv::WriterFlags::empty(),
        bounds_check_policies: BoundsCheckPolicies {
            // A kernel that keeps its indices in range by construction needs no clamps.
            index: if src.contains(INDICES_IN_RANGE) {
                BoundsCheckPolicy::Unchecked
            } else {
                BoundsCheckPolicy::Restrict
            },
            buffer: buffer_checks,
            image_load: BoundsCheckPolicy::Restrict,
            binding_array: BoundsCheckPolicy::Unchecked,
        },
        zero_initialize_workgroup_memory: zero_initialize,
        ..spv::Options::default()
    };
    let pipeline = spv::PipelineOptions {
        shader_stage: naga::ShaderStage::Compute,
        entry_point: "main".into(),
    };
    // naga's writer has panicked on valid modules (a cooperative store whose index was
    // computed inline): a kernel it cannot write fails to compile, and the process goes on.
    let written =
        std::panic::catch_unwind(|| spv::write_vec(&module, &info, &options, Some(&pipeline)))
            .map_err(|_| compile_error("naga's SPIR-V writer panicked on this kernel".into()))?;
    let mut words = written.map_err(|e| compile_error(format!("SPIR-V output: {e}")))?;
    if src.contains(F16_IS_BF16) {
        words = f16_as_bf16(&words).map_err(compile_error)?;
    }
    Ok((words, written_bindings(&module, &info, bindings)))
}

/// Whether the kernel (`module`'s entry point, with the functions it calls) stores into, or
/// updates atomically, each of group 1's bindings 1 to `bindings`; a binding the module does
/// not declare counts as written, to be safe. The shared WGSL kernels declare every binding
/// `read_write`, so the declaration says nothing; what the code does decides whether a later
/// dispatch waits (`record.rs`): two dispatches that only read a buffer run without a wait
/// between them, where each wait costs about 5 us on the H100.
fn written_bindings(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    bindings: usize,
) -> Vec<bool> {
    let mut writes = vec![true; bindings];
    let uses = info.get_entry_point(0);
    for (handle, var) in module.global_variables.iter() {
        let Some(naga::ResourceBinding { group: 1, binding }) = var.binding else {
            continue;
        };
        if let Some(slot) = (binding as usize)
            .checked_sub(1)
            .and_then(|i| writes.get_mut(i))
        {
            *slot = uses[handle].contains(naga::valid::GlobalUse::WRITE);
        }
    }
    writes
}
