//! What the micro benchmarks share: the devices to measure, the sizes to measure at, and a
//! criterion measurement that waits for the device before reading the clock and reports
//! throughput in TFLOP/s (compute-bound ops) or GB/s (memory-bound ops).
//!
//! `TESSERA_DEVICES=cpu,wgpu:0` narrows the devices (backend names or device ids, as in the
//! conformance suite). `TESSERA_BENCH_SIZES=quick|full` picks the sizes: `full` is the issue's
//! list (square 1024/2048/4096, GPT-2 124M shapes at batch 8 x 1024 tokens, attention at 1024
//! and 4096 tokens, every float dtype), `quick` trims them (fewer rows and heads, attention in
//! f32 only) so that a 2-core CPU finishes each bench target in a few minutes. The default is
//! `quick` on the CPU and `full` elsewhere.

use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::measurement::{Measurement, ValueFormatter, WallTime};
use criterion::{Criterion, Throughput};
use tessera::{DType, Device};

pub use criterion;
pub use tessera;

/// Every device present, narrowed by `TESSERA_DEVICES`, each opened once.
pub fn devices() -> Vec<Arc<dyn Device>> {
    let filter: Option<Vec<String>> = std::env::var("TESSERA_DEVICES")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.split(',').map(|p| p.trim().to_string()).collect());
    tessera::devices()
        .into_iter()
        .filter(|d| {
            filter
                .as_ref()
                .is_none_or(|f| f.iter().any(|w| *w == d.backend || *w == d.id))
        })
        .map(|d| {
            tessera::open_device(&d.id)
                .unwrap_or_else(|e| panic!("{} is listed but does not open: {e}", d.id))
        })
        .collect()
}

/// The float dtypes worth measuring that `device` supports, f32 first.
pub fn float_dtypes(device: &Arc<dyn Device>) -> Vec<DType> {
    [DType::F32, DType::F16, DType::BF16]
        .into_iter()
        .filter(|d| device.info().dtypes.contains(d))
        .collect()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Profile {
    Quick,
    Full,
}

impl Profile {
    /// `TESSERA_BENCH_SIZES`, else `quick` for the CPU and `full` for anything else.
    pub fn for_device(device: &Arc<dyn Device>) -> Profile {
        Profile::parse(
            std::env::var("TESSERA_BENCH_SIZES").ok().as_deref(),
            &device.info().backend,
        )
    }

    pub fn parse(setting: Option<&str>, backend: &str) -> Profile {
        match setting.map(str::trim) {
            Some("full") => Profile::Full,
            Some("quick") => Profile::Quick,
            Some(other) if !other.is_empty() => {
                panic!("TESSERA_BENCH_SIZES must be quick or full; got `{other}`")
            }
            _ if backend == "cpu" => Profile::Quick,
            _ => Profile::Full,
        }
    }

    pub fn sizes(self) -> Sizes {
        match self {
            Profile::Full => Sizes {
                square: vec![1024, 2048, 4096],
                gpt2_rows: 8 * 1024,
                attention: vec![
                    AttentionShape {
                        batch: 8,
                        heads: 12,
                        seq: 1024,
                        head_dim: 64,
                    },
                    AttentionShape {
                        batch: 2,
                        heads: 12,
                        seq: 4096,
                        head_dim: 64,
                    },
                ],
                attention_low_precision: true,
                norm_rows: 8 * 1024,
                loss_rows: 8 * 1024,
                adam_params: 124_439_808,
            },
            Profile::Quick => Sizes {
                square: vec![1024, 2048],
                gpt2_rows: 256,
                attention: vec![
                    AttentionShape {
                        batch: 1,
                        heads: 4,
                        seq: 1024,
                        head_dim: 64,
                    },
                    AttentionShape {
                        batch: 1,
                        heads: 1,
                        seq: 4096,
                        head_dim: 64,
                    },
                ],
                attention_low_precision: false,
                norm_rows: 2048,
                loss_rows: 128,
                adam_params: 16 << 20,
            },
        }
    }
}

/// Sizes of one benchmark run.
#[derive(Clone, Debug, PartialEq)]
pub struct Sizes {
    /// Square matmul sizes.
    pub square: Vec<usize>,
    /// Token rows of the GPT-2 124M projections (batch x sequence).
    pub gpt2_rows: usize,
    pub attention: Vec<AttentionShape>,
    /// Attention in f16 and bf16 too, not only f32 (the CPU computes those in f32, so its
    /// quick run skips them).
    pub attention_low_precision: bool,
    /// Rows of width 768 for layer norm.
    pub norm_rows: usize,
    /// Rows of 50,257 logits for cross-entropy.
    pub loss_rows: usize,
    /// Elements updated by AdamW (full: GPT-2 124M's parameter count).
    pub adam_params: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    pub seq: usize,
    pub head_dim: usize,
}

impl AttentionShape {
    /// Multiply-add FLOPs of causal attention forward: two `T x T x D` products per head,
    /// halved by the mask (FlashAttention's convention).
    pub fn forward_flops(&self) -> u64 {
        (4 * self.batch * self.heads * self.seq * self.seq * self.head_dim / 2) as u64
    }

    /// Backward counts 2.5 times the forward (five products instead of two).
    pub fn backward_flops(&self) -> u64 {
        self.forward_flops() * 5 / 2
    }
}

/// GPT-2 124M's projections as `(name, in, out)`: each runs as `[rows, in] @ [out, in]^T`.
pub const GPT2_PROJECTIONS: [(&str, usize, usize); 5] = [
    ("qkv", 768, 2304),
    ("attn_out", 768, 768),
    ("mlp_fc", 768, 3072),
    ("mlp_proj", 3072, 768),
    ("lm_head", 768, 50257),
];

/// Wall time measured from a synchronized device to a synchronized device, so that an
/// asynchronous backend's queued work is inside the interval and nothing before it is.
pub struct Synced {
    device: Arc<dyn Device>,
}

impl Synced {
    pub fn new(device: Arc<dyn Device>) -> Self {
        Synced { device }
    }

    fn sync(&self) {
        self.device
            .synchronize()
            .unwrap_or_else(|e| panic!("{} failed to synchronize: {e}", self.device.info().id()));
    }
}

impl Measurement for Synced {
    type Intermediate = Instant;
    type Value = Duration;

    fn start(&self) -> Instant {
        self.sync();
        Instant::now()
    }
    fn end(&self, start: Instant) -> Duration {
        self.sync();
        start.elapsed()
    }
    fn add(&self, a: &Duration, b: &Duration) -> Duration {
        *a + *b
    }
    fn zero(&self) -> Duration {
        Duration::ZERO
    }
    fn to_f64(&self, value: &Duration) -> f64 {
        value.as_nanos() as f64
    }
    fn formatter(&self) -> &dyn ValueFormatter {
        &RateFormatter
    }
}

static WALL: WallTime = WallTime;

/// Times as criterion prints them; throughput as TFLOP/s when it is given in elements (each
/// element one FLOP) and as decimal GB/s when it is given in bytes.
struct RateFormatter;

impl ValueFormatter for RateFormatter {
    fn scale_values(&self, typical: f64, values: &mut [f64]) -> &'static str {
        WALL.formatter().scale_values(typical, values)
    }
    fn scale_throughputs(
        &self,
        typical: f64,
        throughput: &Throughput,
        values: &mut [f64],
    ) -> &'static str {
        match *throughput {
            Throughput::Elements(flops) => {
                values
                    .iter_mut()
                    .for_each(|ns| *ns = flops as f64 / *ns / 1e3);
                "TFLOP/s"
            }
            Throughput::Bytes(bytes) | Throughput::BytesDecimal(bytes) => {
                values.iter_mut().for_each(|ns| *ns = bytes as f64 / *ns);
                "GB/s"
            }
            #[allow(unreachable_patterns)]
            _ => WALL
                .formatter()
                .scale_throughputs(typical, throughput, values),
        }
    }
    fn scale_for_machines(&self, values: &mut [f64]) -> &'static str {
        WALL.formatter().scale_for_machines(values)
    }
}

/// A criterion instance for one device: few samples and short windows (each iteration of the
/// large sizes is long on a CPU), command-line filters honoured.
pub fn criterion_for(device: &Arc<dyn Device>) -> Criterion<Synced> {
    Criterion::default()
        .with_measurement(Synced::new(device.clone()))
        .sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args()
}

/// Times `iters` runs of `timed`, each after an untimed `setup` (e.g. the forward pass whose
/// backward is measured), synchronizing around every timed part.
pub fn time_after_setup<S>(
    device: &Arc<dyn Device>,
    iters: u64,
    mut setup: impl FnMut() -> S,
    mut timed: impl FnMut(S),
) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let state = setup();
        device.synchronize().expect("synchronize");
        let start = Instant::now();
        timed(state);
        device.synchronize().expect("synchronize");
        total += start.elapsed();
    }
    total
}

/// The short name criterion ids use for a dtype.
pub fn dtype_name(dtype: DType) -> String {
    format!("{dtype}").to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_defaults_follow_the_backend() {
        assert_eq!(Profile::parse(None, "cpu"), Profile::Quick);
        assert_eq!(Profile::parse(Some(""), "wgpu"), Profile::Full);
        assert_eq!(Profile::parse(Some("full"), "cpu"), Profile::Full);
        assert_eq!(Profile::parse(Some(" quick "), "hip"), Profile::Quick);
    }

    #[test]
    fn attention_flops_follow_the_flash_attention_convention() {
        let s = AttentionShape {
            batch: 1,
            heads: 1,
            seq: 2,
            head_dim: 3,
        };
        assert_eq!(s.forward_flops(), 24);
        assert_eq!(s.backward_flops(), 60);
    }

    #[test]
    fn rates_are_tflops_and_gigabytes() {
        let mut v = [1e6];
        assert_eq!(
            RateFormatter.scale_throughputs(1e6, &Throughput::Elements(2_000_000_000), &mut v),
            "TFLOP/s"
        );
        assert!((v[0] - 2.0).abs() < 1e-12);
        let mut v = [1e6];
        assert_eq!(
            RateFormatter.scale_throughputs(1e6, &Throughput::Bytes(3_000_000), &mut v),
            "GB/s"
        );
        assert!((v[0] - 3.0).abs() < 1e-12);
    }
}
