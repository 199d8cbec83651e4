//! From an op to its family's planner (a file per family, as in every backend), and what the
//! planners share.
//!
//! Each family file has the same three functions: `supports` (whether its kernels run an op
//! on given input dtypes), `launch` (plan and enqueue one validated launch) and `samples`
//! (the kernel sources `launch` would compile for an op and dtypes, so that a test compiles
//! every kernel for every architecture without a GPU).

mod attention;
mod conv;
mod elementwise;
mod loss;
mod matmul;
mod movement;
mod norm;
mod optim;
mod random;
mod reduce;

use tessera_core::ops::check_dtypes;
use tessera_core::{DType, Error, Op, OpFamily, Result, TensorRef};

use crate::gpu::Gpu;
#[cfg(test)]
use crate::gpu::Source;

/// Whether this backend runs `op` on inputs of `dtypes`: the catalog's dtype rules, the
/// dtypes the device stores, and what the family's kernels cover.
pub(crate) fn check_supported(gpu: &Gpu, op: &Op, dtypes: &[DType]) -> Result<()> {
    check_dtypes(gpu.backend(), op, dtypes, &gpu.info.dtypes)?;
    let supported = match op.family() {
        OpFamily::Random => random::supports(op, dtypes),
        OpFamily::Elementwise => elementwise::supports(op, dtypes),
        OpFamily::Reduce => reduce::supports(op, dtypes),
        OpFamily::Matmul => matmul::supports(op, dtypes),
        OpFamily::Movement => movement::supports(op, dtypes),
        OpFamily::Norm => norm::supports(op, dtypes),
        OpFamily::Attention => attention::supports(op, dtypes),
        OpFamily::Loss => loss::supports(op, dtypes),
        OpFamily::Optim => optim::supports(op, dtypes),
        OpFamily::Conv => conv::supports(op, dtypes),
    };
    if supported {
        Ok(())
    } else {
        Err(tessera_core::ops::unsupported_dtypes(
            gpu.backend(),
            op,
            dtypes,
        ))
    }
}

/// Launches `op`, already validated against the catalog; while profiling, its kernels are
/// timed together under the op and its input dtypes.
pub(crate) fn launch(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    let name = || {
        let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype).collect();
        format!("{op:?} {}", tessera_core::dtypes_str(&dtypes))
    };
    gpu.timed(name, || launch_family(gpu, op, inputs, outputs, scalars))
}

fn launch_family(
    gpu: &Gpu,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
    scalars: &[f64],
) -> Result<()> {
    let (i, o, s) = (inputs, outputs, scalars);
    match op.family() {
        OpFamily::Random => random::launch(gpu, op, i, o, s),
        OpFamily::Elementwise => elementwise::launch(gpu, op, i, o, s),
        OpFamily::Reduce => reduce::launch(gpu, op, i, o, s),
        OpFamily::Matmul => matmul::launch(gpu, op, i, o, s),
        OpFamily::Movement => movement::launch(gpu, op, i, o, s),
        OpFamily::Norm => norm::launch(gpu, op, i, o, s),
        OpFamily::Attention => attention::launch(gpu, op, i, o, s),
        OpFamily::Loss => loss::launch(gpu, op, i, o, s),
        OpFamily::Optim => optim::launch(gpu, op, i, o, s),
        OpFamily::Conv => conv::launch(gpu, op, i, o, s),
    }
}

/// The kernel sources `launch` compiles for `op` on inputs of `dtypes`.
#[cfg(test)]
pub(crate) fn samples(op: &Op, dtypes: &[DType]) -> Vec<Source> {
    match op.family() {
        OpFamily::Random => random::samples(op, dtypes),
        OpFamily::Elementwise => elementwise::samples(op, dtypes),
        OpFamily::Reduce => reduce::samples(op, dtypes),
        OpFamily::Matmul => matmul::samples(op, dtypes),
        OpFamily::Movement => movement::samples(op, dtypes),
        OpFamily::Norm => norm::samples(op, dtypes),
        OpFamily::Attention => attention::samples(op, dtypes),
        OpFamily::Loss => loss::samples(op, dtypes),
        OpFamily::Optim => optim::samples(op, dtypes),
        OpFamily::Conv => conv::samples(op, dtypes),
    }
}

pub(crate) fn unsupported(gpu: &Gpu, op: &Op) -> Error {
    Error::unsupported(gpu.backend(), op.name())
}

/// The C++ type a dtype is stored as (the prelude's).
pub(crate) fn cxx_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F32 => "float",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::F64 => "double",
        DType::I32 => "i32",
        DType::U32 => "u32",
        DType::Bool => "u8",
    }
}

/// The unsigned integer of `dtype`'s size: its bits, for kernels that only move or fill them.
pub(crate) fn raw_type(dtype: DType) -> &'static str {
    match dtype.size() {
        1 => "u8",
        2 => "u16",
        _ => "u32",
    }
}

/// The index type that reaches every element of `tensors`: `u32` where it can (cheaper
/// division), `u64` past 2^32 elements.
pub(crate) fn index_type(tensors: &[&TensorRef<'_>]) -> &'static str {
    let fits = tensors
        .iter()
        .all(|t| t.layout.extent() < u32::MAX as usize && t.layout.numel() < u32::MAX as usize);
    if fits {
        "u32"
    } else {
        "u64"
    }
}

#[cfg(test)]
mod tests {
    use tessera_core::ops::catalog_allows;
    use tessera_core::{DType, Op};

    use super::Source;

    use crate::driver::{amd, cuda};

    /// Input dtypes for `op` with float data of `float`: index inputs as i32, masks as bool.
    fn sample_dtypes(op: &Op, float: DType) -> Vec<DType> {
        use Op::*;
        let f = float;
        let i = DType::I32;
        let b = DType::Bool;
        match op {
            Fill { .. } | Arange { .. } | RandUniform { .. } | RandNormal { .. } => vec![],
            Cast { .. }
            | Copy
            | Unary(_)
            | Reduce { .. }
            | ArgMax { .. }
            | Softmax
            | LogSoftmax => vec![f],
            UnaryBackward(_) | Binary(_) | Compare(_) | SwiGlu | SoftmaxBackward
            | LogSoftmaxBackward => vec![f, f],
            Where => vec![b, f, f],
            SwiGluBackward => vec![f, f, f],
            Matmul { bias, residual, .. } => {
                vec![f; 2 + usize::from(*bias) + usize::from(*residual)]
            }
            NormMatmul {
                norm,
                bias,
                residual,
                ..
            } => vec![f; 2 + norm.params() + usize::from(*bias) + usize::from(*residual)],
            Concat { .. } => vec![f, f],
            SquaredNorm => vec![f, f],
            Embedding | Gather { .. } => vec![f, i],
            EmbeddingBackward | ScatterAdd { .. } => vec![i, f],
            IndexCopy { .. } => vec![f, i, f],
            LayerNorm | Rotary => vec![f, f, f],
            RmsNorm => vec![f, f],
            LayerNormBackward => vec![f, f, DType::F32, DType::F32, f],
            RmsNormBackward => vec![f, f, DType::F32, f],
            Attention { .. } => vec![f, f, f],
            CachedAttention => vec![f, f, f, i],
            AppendAttention => vec![f, f, i, f],
            AttentionBackward { .. } => vec![f, f, f, f, DType::F32, f],
            CrossEntropy => vec![f, i],
            CrossEntropyBackward => vec![f, i, DType::F32, DType::F32],
            AdamUpdate { .. } => vec![f, f, f, f, DType::F32],
            SgdUpdate { momentum, .. } => vec![f; 3 + usize::from(*momentum)],
            Conv2d { bias, .. } => vec![f; 2 + usize::from(*bias)],
            Conv2dBackwardData { .. } | Conv2dBackwardWeight { .. } => vec![f, f],
        }
    }

    /// The kernels of every catalog op in f32, f16 and bf16, without repeats.
    fn every_kernel() -> Vec<Source> {
        let mut sources = Vec::new();
        for op in Op::catalog() {
            for float in [DType::F32, DType::F16, DType::BF16] {
                let dtypes = sample_dtypes(&op, float);
                if catalog_allows(&op, &dtypes) {
                    sources.extend(super::samples(&op, &dtypes));
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        sources.retain(|s| seen.insert(s.text()));
        sources
    }

    /// Every kernel entry's first statement waits for the kernel queued ahead of it
    /// (`start_after_previous`, or `start_after_previous_prefetching`, whose L2 prefetch is
    /// a hint that reads nothing into the kernel): launches may ask for an early start, and a
    /// kernel that touched memory before that wait would race with the work before it.
    #[test]
    fn every_kernel_waits_for_the_work_before_it() {
        let mut families: Vec<&str> = every_kernel().iter().map(|s| s.family).collect();
        families.sort_unstable();
        families.dedup();
        let mut entries = 0;
        for family in families {
            for (at, _) in family.match_indices("\nKERNEL ") {
                let body = at + family[at..].find('{').expect("a kernel has a body") + 1;
                let signature = &family[at + 1..body];
                let first_code = family[body..]
                    .lines()
                    .map(str::trim)
                    .find(|line| !line.is_empty() && !line.starts_with("//"));
                assert!(
                    first_code.is_some_and(|line| line.starts_with("start_after_previous")),
                    "`{signature}` does not start with start_after_previous()"
                );
                entries += 1;
            }
        }
        assert!(entries >= 40, "found only {entries} kernel entries");
    }

    /// Compiles every kernel for each of `archs` with `compile`, the machine's cores sharing
    /// the list (hiprtc takes them one at a time: `amd::compile`), and fails with every
    /// compiler log.
    fn compile_all(archs: &[&str], compile: fn(&str, &str, &str) -> Result<Vec<u8>, String>) {
        let sources = every_kernel();
        assert!(!sources.is_empty());
        let jobs: Vec<(&str, &Source)> = archs
            .iter()
            .flat_map(|&arch| sources.iter().map(move |s| (arch, s)))
            .collect();
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        let failures: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|w| {
                    let jobs = &jobs;
                    scope.spawn(move || {
                        jobs.iter()
                            .skip(w)
                            .step_by(workers)
                            .filter_map(|(arch, source)| {
                                compile(&source.text(), source.entry, arch)
                                    .err()
                                    .map(|log| format!("{arch} {}:\n{log}", source.entry))
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| {
                    h.join()
                        .unwrap_or_else(|_| vec!["a compile thread panicked".into()])
                })
                .collect()
        });
        assert!(
            failures.is_empty(),
            "{} of {} kernels failed:\n{}",
            failures.len(),
            jobs.len(),
            failures.join("\n")
        );
    }

    /// Every kernel of every catalog op in f32, f16 and bf16, compiled with hiprtc for a
    /// wave64 (CDNA, `gfx90a`) and a wave32 (RDNA, `gfx1030`) architecture: an AMD compile
    /// error fails here, without an AMD GPU. (RDNA 3's `gfx1100` would be the newer wave32
    /// target, but Debian's ROCm 5.2 hiprtc predates it and aborts.) Needs Debian's
    /// `libamdhip64-5` (hiprtc) and `rocm-device-libs`; where they are absent the test says so
    /// and checks nothing, unless `TESSERA_REQUIRE_HIPRTC` is set (CI sets it), which makes
    /// their absence a failure.
    ///
    /// hiprtc compiles one kernel at a time in a process (`amd::compile`), so each
    /// architecture is compiled by a process of its own: this test binary again, running this
    /// test with `AMD_ARCH_VARIABLE` naming the architecture.
    #[test]
    fn every_kernel_compiles_for_amd() {
        if let Some(lib) = amd::missing() {
            assert!(
                std::env::var_os("TESSERA_REQUIRE_HIPRTC").is_none(),
                "{lib} is missing and TESSERA_REQUIRE_HIPRTC is set"
            );
            eprintln!("skipped: {lib} is not installed, so no AMD compile was checked");
            return;
        }
        if let Ok(arch) = std::env::var(AMD_ARCH_VARIABLE) {
            compile_all(&[&arch], amd::compile);
            return;
        }
        let program = std::env::current_exe().expect("the test binary's path");
        let children: Vec<_> = ["gfx90a", "gfx1030"]
            .into_iter()
            .map(|arch| {
                let child = std::process::Command::new(&program)
                    .args(["--exact", "ops::tests::every_kernel_compiles_for_amd"])
                    .args(["--nocapture", "--test-threads", "1"])
                    .env(AMD_ARCH_VARIABLE, arch)
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .expect("the test binary starts again");
                (arch, child)
            })
            .collect();
        for (arch, child) in children {
            let out = child.wait_with_output().expect("the compile process ends");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "{arch}:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The variable naming the one AMD architecture a compile process checks.
    const AMD_ARCH_VARIABLE: &str = "TESSERA_AMD_COMPILE_ARCH";

    /// The same kernels, and the NVIDIA-only tensor-core ones, compiled with NVRTC for the
    /// H100 (`sm_90a`), where NVRTC is installed (it needs no GPU); elsewhere the test says it
    /// checked nothing.
    #[test]
    fn every_kernel_compiles_for_nvidia() {
        if !cuda::nvrtc_present() {
            eprintln!("skipped: NVRTC is not installed, so no NVIDIA compile was checked");
            return;
        }
        compile_all(&["sm_90a"], cuda::compile);
    }
}
