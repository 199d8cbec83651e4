//! Turning a [`Sample`] into concrete values for one tested dtype, and launching ops at the
//! kernel level with guarded outputs.

use std::collections::HashSet;
use std::sync::Arc;

use tessera::ops::{in_place_input, stats_dtype, updated_params};
use tessera::{
    decode_f64, encode_f64, Buffer, DType, Device, Error, Layout, Op, TensorRef, TensorSpec,
};

use crate::samples::{Gen, Input, Kind, Sample, View};

/// Elements of guard region before and after every output.
pub const GUARD: usize = 64;
/// Byte pattern of output guard regions (and gaps inside strided outputs).
pub const GUARD_BYTE: u8 = 0xA5;
/// Byte pattern of every element a kernel should not read or should write: NaN in every float
/// dtype, so reads of padding and unwritten outputs show up.
pub const FILL_BYTE: u8 = 0xFF;

/// A small deterministic generator (SplitMix64), seeded per input.
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform integer in `lo..hi`.
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.next_u64() % (hi - lo).max(1) as u64) as i64
    }
}

/// A stable seed from text (FNV-1a), so a sample's values do not depend on its position.
pub fn seed_of(text: &str, salt: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ salt.wrapping_mul(0x1000_0000_01b3);
    for b in text.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x1000_0000_01b3);
    }
    h
}

/// `n` values of a plain (non-`Forward`) generator.
pub fn generate(gen: &Gen, n: usize, rng: &mut SplitMix) -> Vec<f64> {
    match gen {
        Gen::Uniform { lo, hi } => (0..n).map(|_| lo + (hi - lo) * rng.unit()).collect(),
        Gen::Lattice { step, phase, range } => (0..n)
            .map(|_| (rng.int(-range, *range) as f64 + phase) * step)
            .collect(),
        Gen::Distinct { scale } => {
            let mut v: Vec<f64> = (0..n)
                .map(|i| (i as f64 - n as f64 / 2.0) * scale)
                .collect();
            for i in (1..n).rev() {
                v.swap(i, rng.int(0, i as i64 + 1) as usize);
            }
            v
        }
        Gen::Ints { lo, hi } => (0..n).map(|_| rng.int(*lo, *hi) as f64).collect(),
        Gen::Bool => (0..n).map(|_| (rng.next_u64() & 1) as f64).collect(),
        Gen::Special(base) => {
            let specials = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0];
            let mut v = generate(base, n, rng);
            for x in &mut v {
                if rng.int(0, 4) == 0 {
                    *x = specials[rng.int(0, specials.len() as i64) as usize];
                }
            }
            v
        }
        Gen::Values(values) => (0..n).map(|i| values[i % values.len()]).collect(),
        Gen::Forward { .. } => unreachable!("forward-derived inputs are computed by the reference"),
    }
}

/// Values as the given dtype stores them.
pub fn round_to(values: &[f64], dtype: DType) -> Vec<f64> {
    decode_f64(&encode_f64(values, dtype), dtype)
}

/// The dtype the reference computes in for tested dtype `dtype`.
pub fn reference_dtype(dtype: DType) -> DType {
    if dtype.is_float() {
        DType::F64
    } else {
        dtype
    }
}

/// One input resolved for a tested dtype.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub shape: Vec<usize>,
    /// Dtype on the tested device, and in the reference.
    pub dtype: DType,
    pub ref_dtype: DType,
    /// The view's layout in its storage and the storage values (`layout.extent()` long).
    pub layout: Layout,
    pub storage: Vec<f64>,
    /// The logical values, row-major, already rounded to `dtype`.
    pub values: Vec<f64>,
    pub grad: bool,
}

/// A sample resolved for one tested dtype: ops and inputs for the device and the reference.
#[derive(Clone, Debug)]
pub struct Case {
    pub dtype: DType,
    pub op: Op,
    pub ref_op: Op,
    pub inputs: Vec<Prepared>,
}

impl Case {
    pub fn dtypes(&self) -> Vec<DType> {
        self.inputs.iter().map(|i| i.dtype).collect()
    }

    pub fn ref_dtypes(&self) -> Vec<DType> {
        self.inputs.iter().map(|i| i.ref_dtype).collect()
    }

    pub fn specs(&self) -> Vec<TensorSpec> {
        self.inputs
            .iter()
            .map(|i| TensorSpec::new(&i.shape, i.dtype))
            .collect()
    }

    /// Whether the reference runs exactly the computation the device runs (cpu rows of f64 or
    /// integer dtypes), which makes a comparison meaningless.
    pub fn same_as_reference(&self) -> bool {
        self.op == self.ref_op && self.dtypes() == self.ref_dtypes()
    }
}

fn input_dtypes(kind: Kind, dtype: DType) -> (DType, DType) {
    match kind {
        Kind::Float => (dtype, reference_dtype(dtype)),
        Kind::Stats => (stats_dtype(dtype), reference_dtype(stats_dtype(dtype))),
        Kind::Fixed(d) => (d, d),
    }
}

/// Places logical values into storage through a layout (used for forward-derived inputs).
fn scatter(layout: &Layout, values: &[f64]) -> Vec<f64> {
    let mut storage = vec![f64::NAN; layout.extent()];
    for (pos, &v) in layout.indices().zip(values) {
        storage[pos] = v;
    }
    storage
}

/// Resolves `sample` for tested dtype `dtype`; `reference` computes forward-derived inputs.
pub fn prepare(sample: &Sample, dtype: DType, reference: &Arc<dyn Device>) -> Result<Case, String> {
    let mut inputs: Vec<Option<Prepared>> = vec![None; sample.inputs.len()];
    let plain = |i: usize, inp: &Input| {
        let (dev, refd) = input_dtypes(inp.kind, dtype);
        let layout = inp.view.layout(&inp.shape);
        let mut rng = SplitMix::new(seed_of(&sample.desc, i as u64 + 1));
        let storage = round_to(&generate(&inp.gen, layout.extent(), &mut rng), dev);
        let values = layout.indices().map(|p| storage[p]).collect();
        Prepared {
            shape: inp.shape.clone(),
            dtype: dev,
            ref_dtype: refd,
            layout,
            storage,
            values,
            grad: inp.grad && inp.kind == Kind::Float,
        }
    };
    for (i, inp) in sample.inputs.iter().enumerate() {
        if !matches!(inp.gen, Gen::Forward { .. }) {
            inputs[i] = Some(plain(i, inp));
        }
    }
    for (i, inp) in sample.inputs.iter().enumerate() {
        let Gen::Forward {
            op,
            args,
            scalars,
            output,
        } = &inp.gen
        else {
            continue;
        };
        let (dev, refd) = input_dtypes(inp.kind, dtype);
        let arg_inputs: Vec<HostTensor> = args
            .iter()
            .map(|&a| {
                let p = inputs[a]
                    .as_ref()
                    .expect("sample bug: forward input from another derived input");
                HostTensor {
                    shape: p.shape.clone(),
                    dtype: p.ref_dtype,
                    values: p.values.clone(),
                }
            })
            .collect();
        let outs = run_contiguous(reference, op, &arg_inputs, scalars, None)
            .map_err(|e| format!("computing input {i} with {}: {e}", op.name()))?;
        let layout = inp.view.layout(&inp.shape);
        let values = round_to(&outs[*output].values, dev);
        let storage = scatter(&layout, &values);
        inputs[i] = Some(Prepared {
            shape: inp.shape.clone(),
            dtype: dev,
            ref_dtype: refd,
            layout,
            storage,
            values,
            grad: false,
        });
    }
    // A cast keeps its target in the reference, so the reference rounds exactly once.
    let ref_op = if sample.retype {
        sample.op_for(reference_dtype(dtype))
    } else {
        sample.op.clone()
    };
    Ok(Case {
        dtype,
        op: sample.op_for(dtype),
        ref_op,
        inputs: inputs
            .into_iter()
            .map(|p| p.expect("every input prepared"))
            .collect(),
    })
}

/// Logical values of a tensor on the host.
#[derive(Clone, Debug)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub values: Vec<f64>,
}

/// A buffer on a device with a view into it and the bytes it started with.
struct Placed {
    buffer: Arc<dyn Buffer>,
    layout: Layout,
    dtype: DType,
    image: Vec<u8>,
    /// Which elements of the buffer the view covers.
    covered: Vec<bool>,
}

fn coverage(layout: &Layout, elems: usize) -> Vec<bool> {
    let mut covered = vec![false; elems];
    for p in layout.indices() {
        covered[p] = true;
    }
    covered
}

/// Uploads storage values for a view, with `tail` filler elements after it. Elements the view
/// does not cover hold [`FILL_BYTE`].
fn upload(
    device: &Arc<dyn Device>,
    dtype: DType,
    layout: &Layout,
    storage: &[f64],
    tail: usize,
) -> Result<Placed, Error> {
    let elems = (layout.extent() + tail).max(1);
    let size = dtype.size();
    let covered = coverage(layout, elems);
    let mut image = vec![FILL_BYTE; elems * size];
    let encoded = encode_f64(storage, dtype);
    for (i, c) in covered.iter().enumerate().take(storage.len()) {
        if *c {
            image[i * size..(i + 1) * size].copy_from_slice(&encoded[i * size..(i + 1) * size]);
        }
    }
    let buffer = device.alloc(image.len())?;
    device.write(&buffer, 0, &image)?;
    Ok(Placed {
        buffer,
        layout: layout.clone(),
        dtype,
        image,
        covered,
    })
}

/// Allocates an output with guard regions: the view starts [`GUARD`] elements in, and
/// [`GUARD`] elements follow it.
fn guarded_output(
    device: &Arc<dyn Device>,
    spec: &TensorSpec,
    view: Option<&View>,
) -> Result<Placed, Error> {
    let mut layout = view.map_or_else(
        || Layout::contiguous(&spec.shape),
        |v| v.layout(&spec.shape),
    );
    layout.offset += GUARD;
    let elems = layout.extent().max(GUARD) + GUARD;
    let size = spec.dtype.size();
    let covered = coverage(&layout, elems);
    let mut image = vec![GUARD_BYTE; elems * size];
    for (i, c) in covered.iter().enumerate() {
        if *c {
            image[i * size..(i + 1) * size].fill(FILL_BYTE);
        }
    }
    let buffer = device.alloc(image.len())?;
    device.write(&buffer, 0, &image)?;
    Ok(Placed {
        buffer,
        layout,
        dtype: spec.dtype,
        image,
        covered,
    })
}

/// Reads a placed tensor back: its logical values, after checking that every byte outside
/// the view is unchanged and that bool outputs hold only 0 or 1.
fn read_back(device: &Arc<dyn Device>, placed: &Placed, what: &str) -> Result<Vec<f64>, String> {
    let mut bytes = vec![0u8; placed.image.len()];
    device
        .read(&placed.buffer, 0, &mut bytes)
        .map_err(|e| format!("reading {what}: {e}"))?;
    let size = placed.dtype.size();
    for (i, c) in placed.covered.iter().enumerate() {
        let (now, before) = (
            &bytes[i * size..(i + 1) * size],
            &placed.image[i * size..(i + 1) * size],
        );
        if !c && now != before {
            let region = if i < placed.layout.offset {
                "before"
            } else {
                "after or inside"
            };
            return Err(format!(
                "{what}: element {i} of the buffer, {region} the view {:?}, was overwritten: {now:02x?} instead of {before:02x?}",
                placed.layout
            ));
        }
    }
    if placed.dtype == DType::Bool {
        if let Some(p) = placed.layout.indices().find(|&p| bytes[p] > 1) {
            return Err(format!(
                "{what}: bool element at buffer index {p} holds {:#04x}, not 0 or 1",
                bytes[p]
            ));
        }
    }
    let all = decode_f64(&bytes, placed.dtype);
    Ok(placed.layout.indices().map(|p| all[p]).collect())
}

/// Why a launch gave no outputs.
#[derive(Debug)]
pub enum LaunchError {
    Unsupported(String),
    Failed(String),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Unsupported(m) | LaunchError::Failed(m) => f.write_str(m),
        }
    }
}

impl From<Error> for LaunchError {
    fn from(e: Error) -> Self {
        match e {
            Error::Unsupported { .. } => LaunchError::Unsupported(e.to_string()),
            other => LaunchError::Failed(other.to_string()),
        }
    }
}

/// Which input an in-place update writes, by output: the parameters, then the optimizer
/// state (`m` and `v`, or the momentum buffer), an index copy's `dst`, an appending
/// attention's cache (its output is new: `None`).
fn in_place_inputs(op: &Op, inputs: usize, outputs: usize) -> Vec<Option<usize>> {
    let params = updated_params(op, inputs);
    (0..outputs)
        .map(|o| in_place_input(op, params, o))
        .collect()
}

/// Where a launch's output lies: over the input it updates in place, or in its own buffer.
enum Output {
    Over(usize),
    Own(Placed),
}

/// How to launch: the device side uses the sample's views, guards and in-place outputs.
pub struct LaunchPlan<'a> {
    pub op: &'a Op,
    pub scalars: &'a [f64],
    pub out_shape: Option<&'a [usize]>,
    pub out_view: Option<&'a View>,
    pub in_place: bool,
}

/// Runs `case` on `device` through the kernel interface, with inputs in their views and
/// guarded outputs; returns the outputs' logical values.
pub fn run_on_device(
    device: &Arc<dyn Device>,
    case: &Case,
    plan: &LaunchPlan<'_>,
) -> Result<Vec<HostTensor>, LaunchError> {
    let specs = plan.op.infer(&case.specs(), plan.out_shape)?;
    let kernel = device.kernel(plan.op, &case.dtypes())?;
    let placed_in: Vec<Placed> = case
        .inputs
        .iter()
        .map(|p| upload(device, p.dtype, &p.layout, &p.storage, GUARD))
        .collect::<Result<_, _>>()?;
    let aliases = if plan.in_place {
        in_place_inputs(plan.op, case.inputs.len(), specs.len())
    } else {
        vec![None; specs.len()]
    };
    // Each output is an input updated in place, or a guarded buffer of its own.
    let placed_out: Vec<Output> = specs
        .iter()
        .zip(&aliases)
        .enumerate()
        .map(|(i, (s, alias))| match alias {
            Some(a) => Ok(Output::Over(*a)),
            None => guarded_output(device, s, if i == 0 { plan.out_view } else { None })
                .map(Output::Own),
        })
        .collect::<Result<_, _>>()?;
    let refs = |p: &Placed| (p.buffer.clone(), p.layout.clone(), p.dtype);
    let ins: Vec<_> = placed_in.iter().map(refs).collect();
    let outs: Vec<_> = placed_out
        .iter()
        .map(|out| match out {
            Output::Over(a) => ins[*a].clone(),
            Output::Own(p) => refs(p),
        })
        .collect();
    kernel.launch(&tensor_refs(&ins), &tensor_refs(&outs), plan.scalars)?;
    let mut result = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let (placed, what) = match &placed_out[i] {
            Output::Over(a) => (
                &placed_in[*a],
                format!("output {i} (in place over input {a})"),
            ),
            Output::Own(p) => (p, format!("output {i}")),
        };
        let values = read_back(device, placed, &what).map_err(LaunchError::Failed)?;
        result.push(HostTensor {
            shape: spec.shape.clone(),
            dtype: spec.dtype,
            values,
        });
    }
    if aliases.iter().all(Option::is_none) {
        for (i, placed) in placed_in.iter().enumerate() {
            read_back(device, placed, &format!("input {i}")).map_err(LaunchError::Failed)?;
        }
    }
    Ok(result)
}

fn tensor_refs(v: &[(Arc<dyn Buffer>, Layout, DType)]) -> Vec<TensorRef<'_>> {
    v.iter()
        .map(|(buffer, layout, dtype)| TensorRef {
            buffer,
            layout,
            dtype: *dtype,
        })
        .collect()
}

/// Runs `op` on contiguous host inputs (the reference path).
pub fn run_contiguous(
    device: &Arc<dyn Device>,
    op: &Op,
    inputs: &[HostTensor],
    scalars: &[f64],
    out_shape: Option<&[usize]>,
) -> Result<Vec<HostTensor>, LaunchError> {
    let inputs: Vec<Prepared> = inputs
        .iter()
        .map(|t| Prepared {
            shape: t.shape.clone(),
            dtype: t.dtype,
            ref_dtype: t.dtype,
            layout: Layout::contiguous(&t.shape),
            storage: t.values.clone(),
            values: t.values.clone(),
            grad: false,
        })
        .collect();
    let dtype = inputs.first().map_or(DType::F64, |p| p.dtype);
    let case = Case {
        dtype,
        op: op.clone(),
        ref_op: op.clone(),
        inputs,
    };
    run_on_device(
        device,
        &case,
        &LaunchPlan {
            op,
            scalars,
            out_shape,
            out_view: None,
            in_place: false,
        },
    )
}

/// The reference outputs of a case: the reference op on the rounded inputs, in f64.
pub fn reference_outputs(
    reference: &Arc<dyn Device>,
    case: &Case,
    sample: &Sample,
) -> Result<Vec<HostTensor>, LaunchError> {
    let inputs: Vec<HostTensor> = case
        .inputs
        .iter()
        .map(|p| HostTensor {
            shape: p.shape.clone(),
            dtype: p.ref_dtype,
            values: p.values.clone(),
        })
        .collect();
    run_contiguous(
        reference,
        &case.ref_op,
        &inputs,
        &sample.scalars,
        sample.out_shape.as_deref(),
    )
}

/// Distinct dtypes a case needs a device to hold (inputs and outputs).
pub fn needed_dtypes(case: &Case, out_shape: Option<&[usize]>) -> HashSet<DType> {
    let mut all: HashSet<DType> = case.dtypes().into_iter().collect();
    if let Ok(outs) = case.op.infer(&case.specs(), out_shape) {
        all.extend(outs.iter().map(|s| s.dtype));
    }
    all
}
