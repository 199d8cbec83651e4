//! Compiled pipelines and their layouts, cached per device.
//!
//! Group 0 of a pipeline is the parameter buffer (read-only storage at a dynamic offset), left
//! empty where parameters are immediates; group 1 holds the data bindings, from binding 1. A
//! data group's layout depends only on its number of bindings, so one cached bind group
//! serves pipelines of both kinds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tessera_core::{Error, Result};
use tessera_wgsl::{PipelineCache, Source};

use crate::sync::lock;

/// A compiled pipeline, its cache key (the kernel's name in profiles), the number of data
/// bindings its layout has and whether its parameters are immediates.
#[derive(Debug)]
pub(crate) struct Pipeline {
    pub(crate) pipeline: wgpu::ComputePipeline,
    pub(crate) name: String,
    pub(crate) bindings: usize,
    pub(crate) immediate: bool,
}

/// The pipelines of one device and the layouts they share.
pub(crate) struct Pipelines {
    device: wgpu::Device,
    /// Words of immediates a pipeline with immediates declares.
    immediate_words: usize,
    /// Group 0 of pipelines reading the parameter buffer: read-only storage at a dynamic
    /// offset. Pipelines with immediates leave group 0 empty.
    pub(crate) param_layout: wgpu::BindGroupLayout,
    /// Group 1's layout by its number of data bindings.
    group_layouts: Mutex<HashMap<usize, wgpu::BindGroupLayout>>,
    /// Pipeline layouts by number of data bindings and whether parameters are immediates.
    layouts: Mutex<HashMap<(usize, bool), wgpu::PipelineLayout>>,
    cache: PipelineCache<Pipeline>,
}

impl Pipelines {
    pub(crate) fn new(device: &wgpu::Device, immediate_words: usize) -> Pipelines {
        let param_layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("tessera params"),
            entries: &[wgpu::BindGroupLayoutEntry {
                binding: 0,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only: true },
                    has_dynamic_offset: true,
                    min_binding_size: None,
                },
                count: None,
            }],
        });
        Pipelines {
            device: device.clone(),
            immediate_words,
            param_layout,
            group_layouts: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            cache: PipelineCache::default(),
        }
    }

    /// Group 1's layout for `bindings` data bindings, shared by pipelines with and without
    /// immediates, so one cached bind group serves both.
    pub(crate) fn group_layout(&self, bindings: usize) -> wgpu::BindGroupLayout {
        lock(&self.group_layouts)
            .entry(bindings)
            .or_insert_with(|| {
                let entries: Vec<wgpu::BindGroupLayoutEntry> = (1..=bindings)
                    .map(|b| wgpu::BindGroupLayoutEntry {
                        binding: b as u32,
                        visibility: wgpu::ShaderStages::COMPUTE,
                        ty: wgpu::BindingType::Buffer {
                            ty: wgpu::BufferBindingType::Storage { read_only: false },
                            has_dynamic_offset: false,
                            min_binding_size: None,
                        },
                        count: None,
                    })
                    .collect();
                self.device
                    .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                        label: Some("tessera bindings"),
                        entries: &entries,
                    })
            })
            .clone()
    }

    fn layout(&self, bindings: usize, immediate: bool) -> wgpu::PipelineLayout {
        let group = self.group_layout(bindings);
        lock(&self.layouts)
            .entry((bindings, immediate))
            .or_insert_with(|| {
                self.device
                    .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                        label: Some("tessera layout"),
                        bind_group_layouts: &[
                            (!immediate).then_some(&self.param_layout),
                            Some(&group),
                        ],
                        immediate_size: if immediate {
                            4 * self.immediate_words as u32
                        } else {
                            0
                        },
                    })
            })
            .clone()
    }

    /// The pipeline cached under `key` (with parameters as immediates or not), compiling
    /// `source()` on a miss. `key` must name the op, its dtypes and any variant, as the source
    /// depends on nothing else but whether parameters are `immediate`.
    pub(crate) fn get(
        &self,
        key: &str,
        bindings: usize,
        immediate: bool,
        source: &mut dyn FnMut() -> Result<Source>,
    ) -> Result<Arc<Pipeline>> {
        self.cache.get_or_build(key, immediate, || match source()? {
            Source::Wgsl(src) => self.build(key, bindings, immediate, src),
            // Never asked for: the adapter's caps offer no tensor-core kernels.
            Source::TensorMatmul(_) => Err(Error::unsupported("wgpu", "tensor-matmul kernels")),
            Source::TensorAttention(_) => {
                Err(Error::unsupported("wgpu", "tensor-attention kernels"))
            }
        })
    }

    /// Compiles the pipeline `key` from `src`.
    fn build(&self, key: &str, bindings: usize, immediate: bool, src: String) -> Result<Pipeline> {
        let layout = self.layout(bindings, immediate);
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key),
                source: wgpu::ShaderSource::Wgsl(src.clone().into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: Some(&layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(err) = pollster::block_on(scope.pop()) {
            let numbered: Vec<String> = src
                .lines()
                .enumerate()
                .map(|(i, l)| format!("{:4} {l}", i + 1))
                .collect();
            return Err(Error::Compile {
                backend: "wgpu".into(),
                op: key.into(),
                log: format!("{err}\n{}", numbered.join("\n")),
            });
        }
        Ok(Pipeline {
            pipeline,
            name: key.to_string(),
            bindings,
            immediate,
        })
    }
}
