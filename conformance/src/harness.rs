//! The conformance harness: forward, backward and gradient checks of every sample on every
//! device present, against the CPU reference computing in f64.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tessera::{open_device, DType, Device, Error, Op, Tensor, TensorSpec};

use crate::check::Check;
use crate::env::target_dir;
use crate::prepare::{
    generate, needed_dtypes, prepare, reference_outputs, round_to, run_on_device, seed_of, Case,
    HostTensor, LaunchError, LaunchPlan, SplitMix,
};
use crate::samples::{uniform, Kind, Sample};
use crate::timing::{Key, Ledger, Timing, COMPARE, REFERENCE};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Pass,
    Unsupported,
    Fail,
}

/// One line of the coverage table: the worst outcome over all samples of an op.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub op: String,
    pub dtype: String,
    pub backend: String,
    pub device: String,
    pub check: Check,
    pub status: Status,
    /// The largest absolute error seen (infinite, written as null, for NaN/inf mismatches).
    pub max_error: f64,
}

/// A failing (or unsupported) sample, with what went wrong.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub row: Row,
    pub sample: String,
    pub detail: String,
}

/// Everything one run found.
#[derive(Debug, Default)]
pub struct Report {
    /// One row per (op, dtype, backend, device, check).
    pub rows: Vec<Row>,
    /// Every sample that failed, with details.
    pub failures: Vec<Outcome>,
    /// Every sample a backend reported unsupported.
    pub unsupported: Vec<Outcome>,
    /// Where the time went, for keeping the suite's run time in check
    /// ([`crate::timing::slowest_lines`]).
    pub timings: Vec<Timing>,
}

/// `assert_close`-style tolerances `(rtol, atol)`, or `None` for exact comparison.
pub fn tolerance(dtype: DType) -> Option<(f64, f64)> {
    match dtype {
        DType::F32 => Some((1.3e-6, 1e-5)),
        DType::F16 => Some((1e-3, 1e-5)),
        DType::BF16 => Some((1.6e-2, 1e-5)),
        DType::F64 => Some((1e-7, 1e-7)),
        DType::I32 | DType::U32 | DType::Bool => None,
    }
}

/// The worst element of a comparison.
#[derive(Clone, Debug)]
pub struct Worst {
    pub index: usize,
    pub got: f64,
    pub expected: f64,
    pub allowed: f64,
}

/// The result of comparing one output with its reference.
#[derive(Clone, Debug)]
pub struct Comparison {
    pub ok: bool,
    pub max_error: f64,
    pub worst: Option<Worst>,
    pub mismatches: usize,
}

/// Compares `got` (stored as `dtype`) with the reference rounded to `dtype`: NaN and infinity
/// positions must match; finite values within `s (atol + rtol |expected|)`,
/// `s = sqrt(max(1, reduction))`; integers and bools exactly.
pub fn compare(got: &[f64], reference: &[f64], dtype: DType, reduction: usize) -> Comparison {
    let expected = round_to(reference, dtype);
    let s = (reduction.max(1) as f64).sqrt();
    let tol = tolerance(dtype);
    let mut out = Comparison {
        ok: got.len() == expected.len(),
        max_error: 0.0,
        worst: None,
        mismatches: 0,
    };
    let mut worst_ratio = -1.0f64;
    for (index, (&g, &e)) in got.iter().zip(&expected).enumerate() {
        let same = g == e || (g.is_nan() && e.is_nan());
        let (ok, err, allowed) = match tol {
            Some((rtol, atol)) if e.is_finite() && g.is_finite() => {
                let allowed = s * (atol + rtol * e.abs());
                let err = (g - e).abs();
                (err <= allowed, err, allowed)
            }
            _ => (same, if same { 0.0 } else { (g - e).abs() }, 0.0),
        };
        let err = if err.is_nan() { f64::INFINITY } else { err };
        out.max_error = out.max_error.max(err);
        if !ok {
            out.ok = false;
            out.mismatches += 1;
        }
        let ratio = if allowed > 0.0 {
            err / allowed
        } else if ok {
            0.0
        } else {
            f64::INFINITY
        };
        if ratio > worst_ratio {
            worst_ratio = ratio;
            out.worst = Some(Worst {
                index,
                got: g,
                expected: e,
                allowed,
            });
        }
    }
    out
}

fn describe(c: &Comparison, what: &str, len: usize) -> String {
    match &c.worst {
        Some(w) => format!(
            "{what}: {} of {len} elements off; worst at index {}: got {:e}, expected {:e} (|diff| {:e}, allowed {:e})",
            c.mismatches,
            w.index,
            w.got,
            w.expected,
            (w.got - w.expected).abs(),
            w.allowed
        ),
        None => format!("{what}: {len} elements but the reference has a different count"),
    }
}

/// One device under test, opened once per worker of [`Suite::run`]: a driver that compiles
/// kernels on its queue's thread (lavapipe compiles each kernel with LLVM when it first runs)
/// then compiles for both workers at once instead of making one wait for the other.
#[derive(Clone, Debug)]
pub struct Target {
    pub device: Arc<dyn Device>,
    /// The device again, opened for other workers (worker `w` uses instance `w` modulo their
    /// count, [`device`](Self::device) being instance 0).
    pub more: Vec<Arc<dyn Device>>,
    pub backend: String,
    pub name: String,
}

impl Target {
    /// `open` called once per worker, at most [`MAX_INSTANCES`] times.
    pub fn open(
        backend: &str,
        name: String,
        mut open: impl FnMut() -> Result<Arc<dyn Device>, Error>,
    ) -> Result<Target, Error> {
        let device = open()?;
        let more = (1..workers().min(MAX_INSTANCES))
            .map(|_| open())
            .collect::<Result<_, _>>()?;
        Ok(Target {
            device,
            more,
            backend: backend.to_string(),
            name,
        })
    }

    /// The instance worker `worker` launches on.
    fn on(&self, worker: usize) -> &Arc<dyn Device> {
        match worker % (1 + self.more.len()) {
            0 => &self.device,
            w => &self.more[w - 1],
        }
    }

    fn has(&self, dtype: DType) -> bool {
        self.device.info().dtypes.contains(&dtype)
    }
}

/// The (sample, check) jobs in groups of an op with its backward ops (whose kernels its
/// backward check launches), the groups with the most jobs first, each group's forward checks
/// before its backward checks and gradchecks. A worker runs a whole group, so workers seldom
/// need the same kernel at once (groups share few: a matmul's backward sums its bias gradient
/// with a reduction): a driver that compiles each kernel when it first runs (lavapipe, with
/// LLVM: seconds for a large kernel) compiles it once instead of once per worker, and the
/// group's later samples on the same worker find it compiled. Taking single jobs instead, two
/// workers ran neighbouring samples of one op and compiled its kernels twice at the same time.
pub fn job_groups(samples: &[Sample], checks: &[Check]) -> Vec<Vec<(usize, Check)>> {
    let group = |s: &Sample| {
        let name = s.op.name();
        match name.find("_backward") {
            Some(end) => name[..end].to_string(),
            None => name,
        }
    };
    let mut groups: BTreeMap<String, Vec<(usize, Check)>> = BTreeMap::new();
    for &check in checks {
        for (i, sample) in samples.iter().enumerate() {
            groups.entry(group(sample)).or_default().push((i, check));
        }
    }
    let mut groups: Vec<Vec<(usize, Check)>> = groups.into_values().collect();
    groups.sort_by_key(|jobs| std::cmp::Reverse(jobs.len()));
    groups
}

/// The most instances of one device a suite opens: enough for the cores of a CI machine,
/// few enough not to fill a GPU host (16 cores) with devices and their memory pools.
pub const MAX_INSTANCES: usize = 4;

/// The workers of [`Suite::run`]: one per core.
pub fn workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

/// The devices under test and the reference CPU device (its own instance).
pub struct Suite {
    pub targets: Vec<Target>,
    pub reference: Arc<dyn Device>,
}

/// Central-difference step and PyTorch gradcheck tolerances.
const FD_EPS: f64 = 1e-6;
const GC_ATOL: f64 = 1e-5;
const GC_RTOL: f64 = 1e-3;

impl Suite {
    /// The devices [`crate::env::listings_under_test`] selects, and a CPU reference.
    pub fn from_env() -> Result<Suite, Error> {
        let mut targets = Vec::new();
        for listing in crate::env::listings_under_test() {
            targets.push(Target::open(
                listing.backend,
                format!("{} ({})", listing.id, listing.name),
                || open_device(&listing.id),
            )?);
        }
        Ok(Suite {
            targets,
            reference: open_device("cpu:0")?,
        })
    }

    /// Runs the given checks over `samples`, spread over the machine's cores: each worker
    /// takes the next group of jobs of [`job_groups`] and runs all of it.
    pub fn run(&self, samples: &[Sample], checks: &[Check]) -> Report {
        let groups = job_groups(samples, checks);
        let next = AtomicUsize::new(0);
        let results = Mutex::new(Vec::new());
        let ledger = Ledger::default();
        std::thread::scope(|scope| {
            for worker in 0..workers() {
                let (next, results, ledger, groups) = (&next, &results, &ledger, &groups);
                scope.spawn(move || {
                    while let Some(jobs) = groups.get(next.fetch_add(1, Ordering::Relaxed)) {
                        for &(i, check) in jobs {
                            let outcomes = match check {
                                Check::Forward => self.forward(&samples[i], worker, ledger),
                                Check::Backward => self.backward(&samples[i], worker, ledger),
                                Check::Gradcheck => self.gradcheck(&samples[i], worker, ledger),
                            };
                            results.lock().expect("results lock").extend(outcomes);
                        }
                    }
                });
            }
        });
        let mut report = aggregate(results.into_inner().expect("results lock"));
        report.timings = ledger.into_timings();
        report
    }

    /// The row context of one (target, op, dtype, check, sample).
    fn at<'a>(
        &self,
        t: &'a Target,
        op: &'a Op,
        dtype: DType,
        check: Check,
        sample: &'a Sample,
    ) -> At<'a> {
        At {
            t,
            op,
            dtype,
            check,
            sample,
        }
    }

    /// Kernel-level forward check of one sample on every target and dtype.
    pub fn forward(&self, sample: &Sample, worker: usize, ledger: &Ledger) -> Vec<Outcome> {
        let mut out = Vec::new();
        let op_name = sample.op.name();
        for &dtype in &sample.dtypes {
            let targets: Vec<&Target> = self.targets.iter().filter(|t| t.has(dtype)).collect();
            if targets.is_empty() {
                continue;
            }
            let key = Key {
                check: Check::Forward,
                op: &op_name,
                sample: &sample.desc,
                dtype,
            };
            let fail = |t: &Target, detail: String| {
                self.at(t, &sample.op, dtype, Check::Forward, sample)
                    .outcome(Status::Fail, f64::INFINITY, detail)
            };
            let prepared = ledger.time(key, REFERENCE, || prepare(sample, dtype, &self.reference));
            let case = match prepared {
                Ok(c) => c,
                Err(e) => {
                    out.extend(
                        targets
                            .iter()
                            .map(|t| fail(t, format!("reference failed preparing inputs: {e}"))),
                    );
                    continue;
                }
            };
            let mut reference: Option<Result<Vec<HostTensor>, String>> = None;
            for t in targets {
                let needed = needed_dtypes(&case, sample.out_shape.as_deref());
                if !needed.iter().all(|d| t.has(*d))
                    || (t.backend == "cpu" && case.same_as_reference())
                {
                    continue;
                }
                let plan = LaunchPlan {
                    op: &case.op,
                    scalars: &sample.scalars,
                    out_shape: sample.out_shape.as_deref(),
                    out_view: sample.out_view.as_ref(),
                    in_place: sample.in_place,
                };
                let launched =
                    ledger.time(key, &t.name, || run_on_device(t.on(worker), &case, &plan));
                let got = match launched {
                    Ok(g) => g,
                    Err(LaunchError::Unsupported(m)) => {
                        out.push(self.at(t, &case.op, dtype, Check::Forward, sample).outcome(
                            Status::Unsupported,
                            0.0,
                            m,
                        ));
                        continue;
                    }
                    Err(LaunchError::Failed(m)) => {
                        out.push(fail(t, format!("launch failed: {m}")));
                        continue;
                    }
                };
                let want = reference.get_or_insert_with(|| {
                    ledger.time(key, REFERENCE, || {
                        reference_outputs(&self.reference, &case, sample)
                            .map_err(|e| format!("reference failed: {e}"))
                    })
                });
                let want = match want {
                    Ok(w) => w,
                    Err(e) => {
                        out.push(fail(t, e.clone()));
                        continue;
                    }
                };
                out.push(ledger.time(key, COMPARE, || {
                    self.judge(t, &case, sample, Check::Forward, &got, want)
                }));
            }
        }
        out
    }

    /// Compares every output of a case and makes one outcome of it.
    fn judge(
        &self,
        t: &Target,
        case: &Case,
        sample: &Sample,
        check: Check,
        got: &[HostTensor],
        want: &[HostTensor],
    ) -> Outcome {
        let mut max_error = 0.0f64;
        let mut details = Vec::new();
        if got.len() != want.len() {
            details.push(format!(
                "{} outputs, the reference has {}",
                got.len(),
                want.len()
            ));
        }
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            let c = compare(&g.values, &w.values, g.dtype, sample.reduction_of(i));
            max_error = max_error.max(c.max_error);
            if !c.ok {
                details.push(describe(
                    &c,
                    &format!("output {i} {:?} {}", g.shape, g.dtype),
                    g.values.len(),
                ));
            }
        }
        let status = if details.is_empty() {
            Status::Pass
        } else {
            Status::Fail
        };
        self.at(t, &case.op, case.dtype, check, sample).outcome(
            status,
            max_error,
            details.join("; "),
        )
    }

    /// Tensor-level backward check: input gradients for a random upstream gradient.
    pub fn backward(&self, sample: &Sample, worker: usize, ledger: &Ledger) -> Vec<Outcome> {
        let mut out = Vec::new();
        let op_name = sample.op.name();
        if !sample.backward
            || !sample.op.differentiable()
            || !sample
                .inputs
                .iter()
                .any(|i| i.grad && i.kind == Kind::Float)
        {
            return out;
        }
        for &dtype in sample.dtypes.iter().filter(|d| {
            d.is_float() && (sample.half_chain || !matches!(d, DType::F16 | DType::BF16))
        }) {
            // f16/bf16 gradients go through a chain of ops that each round to the dtype (the
            // forward output, pre-activations, partial products), so they are compared with
            // the CPU running the same chain in the same dtype; the CPU's own half-precision
            // backward kernels are checked against f64 by the forward rows of the backward ops.
            let half = matches!(dtype, DType::F16 | DType::BF16);
            let targets: Vec<&Target> = self
                .targets
                .iter()
                .filter(|t| t.has(dtype) && !(t.backend == "cpu" && (dtype == DType::F64 || half)))
                .collect();
            if targets.is_empty() {
                continue;
            }
            let key = Key {
                check: Check::Backward,
                op: &op_name,
                sample: &sample.desc,
                dtype,
            };
            let fail = |t: &Target, detail: String| {
                self.at(t, &sample.op, dtype, Check::Backward, sample)
                    .outcome(Status::Fail, f64::INFINITY, detail)
            };
            let prepared = ledger.time(key, REFERENCE, || {
                prepare(sample, dtype, &self.reference).and_then(|case| {
                    let up = upstream(sample, &case)?;
                    Ok((case, up))
                })
            });
            let (case, up) = match prepared {
                Ok(p) => p,
                Err(e) => {
                    out.extend(
                        targets
                            .iter()
                            .map(|t| fail(t, format!("reference failed preparing inputs: {e}"))),
                    );
                    continue;
                }
            };
            let mut reference: Option<Result<Vec<Option<Vec<f64>>>, String>> = None;
            let needed = needed_dtypes(&case, sample.out_shape.as_deref());
            for t in targets {
                if !needed.iter().all(|d| t.has(*d)) {
                    continue;
                }
                let got = match ledger.time(key, &t.name, || {
                    tensor_grads(t.on(worker), &case, &case.op, false, sample, &up)
                }) {
                    Ok(g) => g,
                    Err(e @ Error::Unsupported { .. }) => {
                        out.push(
                            self.at(t, &case.op, dtype, Check::Backward, sample)
                                .outcome(Status::Unsupported, 0.0, e.to_string()),
                        );
                        continue;
                    }
                    Err(e) => {
                        out.push(fail(t, format!("backward failed: {e}")));
                        continue;
                    }
                };
                let want = reference.get_or_insert_with(|| {
                    let (op, in_f64) = if half {
                        (&case.op, false)
                    } else {
                        (&case.ref_op, true)
                    };
                    ledger.time(key, REFERENCE, || {
                        tensor_grads(&self.reference, &case, op, in_f64, sample, &up)
                            .map_err(|e| format!("reference backward failed: {e}"))
                    })
                });
                let want = match want {
                    Ok(w) => w,
                    Err(e) => {
                        out.push(fail(t, e.clone()));
                        continue;
                    }
                };
                let mut max_error = 0.0f64;
                let mut details = Vec::new();
                for (i, (g, w)) in got.iter().zip(want.iter()).enumerate() {
                    match (g, w) {
                        (Some(g), Some(w)) => {
                            let c = compare(g, w, case.inputs[i].dtype, sample.grad_reduction);
                            max_error = max_error.max(c.max_error);
                            if !c.ok {
                                details.push(describe(
                                    &c,
                                    &format!("grad of input {i} {:?}", case.inputs[i].shape),
                                    g.len(),
                                ));
                            }
                        }
                        (None, None) => {}
                        (g, _) => details.push(format!(
                            "grad of input {i}: {} on the device but {} in the reference",
                            if g.is_some() { "present" } else { "missing" },
                            if g.is_some() { "missing" } else { "present" }
                        )),
                    }
                }
                let status = if details.is_empty() {
                    Status::Pass
                } else {
                    Status::Fail
                };
                out.push(
                    self.at(t, &case.op, dtype, Check::Backward, sample)
                        .outcome(status, max_error, details.join("; ")),
                );
            }
        }
        out
    }

    /// Central finite differences in f64 on the CPU against autograd.
    pub fn gradcheck(&self, sample: &Sample, worker: usize, ledger: &Ledger) -> Vec<Outcome> {
        let Some(t) = self.targets.iter().find(|t| t.backend == "cpu") else {
            return Vec::new();
        };
        if !sample.gradcheck
            || !sample.op.differentiable()
            || !sample
                .inputs
                .iter()
                .any(|i| i.grad && i.kind == Kind::Float)
        {
            return Vec::new();
        }
        let dtype = DType::F64;
        let op_name = sample.op.name();
        let key = Key {
            check: Check::Gradcheck,
            op: &op_name,
            sample: &sample.desc,
            dtype,
        };
        let result = ledger.time(key, REFERENCE, || prepare(sample, dtype, &self.reference).map_err(Error::from_detail).and_then(|case| {
            let up = upstream(sample, &case).map_err(Error::from_detail)?;
            let device = t.on(worker);
            let analytic = tensor_grads(device, &case, &case.op, false, sample, &up)?;
            let mut max_error = 0.0f64;
            let mut details = Vec::new();
            for (i, grad) in analytic.iter().enumerate() {
                let Some(grad) = grad else { continue };
                for (j, &a) in grad.iter().enumerate() {
                    let mut plus = case.clone();
                    plus.inputs[i].values[j] += FD_EPS;
                    let mut minus = case.clone();
                    minus.inputs[i].values[j] -= FD_EPS;
                    let numeric = (objective(device, &plus, sample, &up)? - objective(device, &minus, sample, &up)?) / (2.0 * FD_EPS);
                    let err = (a - numeric).abs();
                    max_error = max_error.max(err);
                    let close = err <= GC_ATOL + GC_RTOL * numeric.abs();
                    if !close && details.len() < 4 {
                        details.push(format!("input {i} element {j}: autograd {a:e}, finite differences {numeric:e}"));
                    }
                }
            }
            Ok((max_error, details))
        }));
        let outcome = match result {
            Ok((max_error, details)) => {
                let status = if details.is_empty() {
                    Status::Pass
                } else {
                    Status::Fail
                };
                self.at(t, &sample.op, dtype, Check::Gradcheck, sample)
                    .outcome(status, max_error, details.join("; "))
            }
            Err(e @ Error::Unsupported { .. }) => self
                .at(t, &sample.op, dtype, Check::Gradcheck, sample)
                .outcome(Status::Unsupported, 0.0, e.to_string()),
            Err(e) => self
                .at(t, &sample.op, dtype, Check::Gradcheck, sample)
                .outcome(
                    Status::Fail,
                    f64::INFINITY,
                    format!("gradcheck failed: {e}"),
                ),
        };
        vec![outcome]
    }

    /// Forward and backward rows that leave a catalog op unsupported (or untested) in f32, and
    /// in f16/bf16 where the device lists them.
    pub fn coverage_gaps(&self, report: &Report) -> Vec<String> {
        let mut names: Vec<String> = Op::catalog().iter().map(|o| o.name()).collect();
        names.dedup();
        let mut gaps = Vec::new();
        for t in &self.targets {
            for dtype in [DType::F32, DType::F16, DType::BF16] {
                if dtype != DType::F32 && !t.has(dtype) {
                    continue;
                }
                for name in &names {
                    let rows: Vec<&Row> = report
                        .rows
                        .iter()
                        .filter(|r| r.op == *name && r.device == t.name && r.dtype == dtype.name())
                        .collect();
                    let forward = rows.iter().find(|r| r.check == Check::Forward);
                    match forward {
                        None => {
                            gaps.push(format!("{}: {name} {dtype}: no forward sample ran", t.name))
                        }
                        Some(r) if r.status == Status::Unsupported => {
                            gaps.push(format!("{}: {name} {dtype}: unsupported", t.name))
                        }
                        Some(_) => {}
                    }
                    if rows
                        .iter()
                        .any(|r| r.check == Check::Backward && r.status == Status::Unsupported)
                    {
                        gaps.push(format!("{}: {name} {dtype}: backward unsupported", t.name));
                    }
                }
            }
        }
        gaps
    }
}

/// Where an outcome belongs: target, op, dtype, check and sample.
struct At<'a> {
    t: &'a Target,
    op: &'a Op,
    dtype: DType,
    check: Check,
    sample: &'a Sample,
}

impl At<'_> {
    fn outcome(&self, status: Status, max_error: f64, detail: String) -> Outcome {
        Outcome {
            row: Row {
                op: self.op.name(),
                dtype: self.dtype.name().into(),
                backend: self.t.backend.clone(),
                device: self.t.name.clone(),
                check: self.check,
                status,
                max_error,
            },
            sample: self.sample.desc.clone(),
            detail,
        }
    }
}

trait FromDetail {
    fn from_detail(detail: String) -> Self;
}

impl FromDetail for Error {
    fn from_detail(detail: String) -> Self {
        Error::invalid("conformance", detail)
    }
}

/// A random upstream gradient for output 0, as that output's dtype stores it.
fn upstream(sample: &Sample, case: &Case) -> Result<HostTensor, String> {
    let specs = case
        .op
        .infer(&case.specs(), sample.out_shape.as_deref())
        .map_err(|e| e.to_string())?;
    let spec = &specs[0];
    let n = spec.shape.iter().product();
    let mut rng = SplitMix::new(seed_of(&sample.desc, 1000));
    Ok(HostTensor {
        shape: spec.shape.clone(),
        dtype: spec.dtype,
        values: round_to(&generate(&uniform(-1.0, 1.0), n, &mut rng), spec.dtype),
    })
}

/// Builds the case's inputs as tensors (`reference`: in the reference dtypes).
fn leaves(
    device: &Arc<dyn Device>,
    case: &Case,
    reference: bool,
    track: bool,
) -> Result<Vec<Tensor>, Error> {
    case.inputs
        .iter()
        .map(|p| {
            let dtype = if reference { p.ref_dtype } else { p.dtype };
            let t = Tensor::from_f64(&p.values, &p.shape, dtype, device)?;
            Ok(if track && p.grad {
                t.requires_grad()
            } else {
                t
            })
        })
        .collect()
}

/// Runs `op` through the Tensor API with gradients on, back-propagates `up` from output 0 and
/// returns each input's gradient.
fn tensor_grads(
    device: &Arc<dyn Device>,
    case: &Case,
    op: &Op,
    reference: bool,
    sample: &Sample,
    up: &HostTensor,
) -> Result<Vec<Option<Vec<f64>>>, Error> {
    let inputs = leaves(device, case, reference, true)?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let outs = Tensor::apply(op, &refs, &sample.scalars, sample.out_shape.as_deref())?;
    let up_dtype = if reference {
        let specs: Vec<TensorSpec> = case
            .inputs
            .iter()
            .map(|p| TensorSpec::new(&p.shape, p.ref_dtype))
            .collect();
        op.infer(&specs, sample.out_shape.as_deref())?[0].dtype
    } else {
        up.dtype
    };
    let upstream = Tensor::from_f64(&up.values, &up.shape, up_dtype, device)?;
    outs[0].backward_with(&upstream)?;
    inputs
        .iter()
        .zip(&case.inputs)
        .map(|(t, p)| {
            if p.grad {
                t.grad().map(|g| g.to_vec_f64()).transpose()
            } else {
                Ok(None)
            }
        })
        .collect()
}

/// `sum(up * op(inputs)[0])` in f64, without gradients.
fn objective(
    device: &Arc<dyn Device>,
    case: &Case,
    sample: &Sample,
    up: &HostTensor,
) -> Result<f64, Error> {
    let inputs = leaves(device, case, false, false)?;
    let refs: Vec<&Tensor> = inputs.iter().collect();
    let outs = Tensor::apply(
        &case.op,
        &refs,
        &sample.scalars,
        sample.out_shape.as_deref(),
    )?;
    Ok(outs[0]
        .to_vec_f64()?
        .iter()
        .zip(&up.values)
        .map(|(y, u)| y * u)
        .sum())
}

/// One row per (op, dtype, backend, device, check): fail beats unsupported beats pass.
fn aggregate(outcomes: Vec<Outcome>) -> Report {
    let mut rows: BTreeMap<(String, String, String, String, Check), Row> = BTreeMap::new();
    let mut report = Report::default();
    for o in outcomes {
        let r = &o.row;
        let key = (
            r.op.clone(),
            r.dtype.clone(),
            r.backend.clone(),
            r.device.clone(),
            r.check,
        );
        let entry = rows.entry(key).or_insert_with(|| Row {
            max_error: 0.0,
            status: Status::Pass,
            ..r.clone()
        });
        entry.status = entry.status.max(r.status);
        entry.max_error = entry.max_error.max(r.max_error);
        match r.status {
            Status::Fail => report.failures.push(o),
            Status::Unsupported => report.unsupported.push(o),
            Status::Pass => {}
        }
    }
    report.rows = rows.into_values().collect();
    report
}

impl Report {
    /// The coverage table of one check: ops down, `device dtype` across.
    pub fn table(&self, check: Check) -> String {
        let rows: Vec<&Row> = self.rows.iter().filter(|r| r.check == check).collect();
        if rows.is_empty() {
            return format!("{}: no rows\n", check.name());
        }
        let mut columns: Vec<(String, DType)> = Vec::new();
        for r in &rows {
            let col = (
                r.device.clone(),
                DType::parse(&r.dtype).unwrap_or(DType::F32),
            );
            if !columns.contains(&col) {
                columns.push(col);
            }
        }
        columns.sort();
        let mut names: Vec<String> = Op::catalog().iter().map(|o| o.name()).collect();
        names.dedup();
        let width = names.iter().map(String::len).max().unwrap_or(4) + 2;
        let mut out = format!(
            "{} coverage (pass / FAIL / unsup / - not run)\n",
            check.name()
        );
        let devices: HashSet<&String> = columns.iter().map(|c| &c.0).collect();
        for d in devices {
            out += &format!("  columns on {d}\n");
        }
        out += &format!("{:width$}", "op");
        for (_, dtype) in &columns {
            out += &format!("{:>7}", dtype.name());
        }
        out += "\n";
        for name in &names {
            out += &format!("{name:width$}");
            for (device, dtype) in &columns {
                let cell = rows
                    .iter()
                    .find(|r| r.op == *name && r.device == *device && r.dtype == dtype.name())
                    .map_or("-", |r| match r.status {
                        Status::Pass => "pass",
                        Status::Fail => "FAIL",
                        Status::Unsupported => "unsup",
                    });
                out += &format!("{cell:>7}");
            }
            out += "\n";
        }
        out
    }

    /// A summary line per check: rows passing, failing, unsupported.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for check in Check::ALL {
            let count = |s: Status| {
                self.rows
                    .iter()
                    .filter(|r| r.check == check && r.status == s)
                    .count()
            };
            out += &format!(
                "{}: {} rows pass, {} fail, {} unsupported\n",
                check.name(),
                count(Status::Pass),
                count(Status::Fail),
                count(Status::Unsupported)
            );
        }
        out
    }

    /// Failing samples, one per line.
    pub fn failure_lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .failures
            .iter()
            .map(|o| {
                format!(
                    "FAIL {} {} {} on {}: {}: {}",
                    o.row.check.name(),
                    o.row.op,
                    o.row.dtype,
                    o.row.device,
                    o.sample,
                    o.detail
                )
            })
            .collect();
        lines.sort();
        lines
    }

    /// Writes the rows as a JSON array to `<target>/conformance/coverage.json`.
    pub fn write_json(&self) -> std::io::Result<PathBuf> {
        let dir = target_dir().join("conformance");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("coverage.json");
        let json = serde_json::to_string_pretty(&self.rows).map_err(std::io::Error::other)?;
        std::fs::write(&path, json)?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_is_an_op_with_its_backward_ops_largest_first() {
        let sample = |op: Op| Sample::new(op, "", Vec::new());
        let samples = [
            sample(Op::Softmax),
            sample(Op::LayerNorm),
            sample(Op::SoftmaxBackward),
            sample(Op::LayerNormBackward),
            sample(Op::Softmax),
        ];
        let groups = job_groups(&samples, &[Check::Forward, Check::Backward]);
        let softmax = vec![
            (0, Check::Forward),
            (2, Check::Forward),
            (4, Check::Forward),
            (0, Check::Backward),
            (2, Check::Backward),
            (4, Check::Backward),
        ];
        let layer_norm = vec![
            (1, Check::Forward),
            (3, Check::Forward),
            (1, Check::Backward),
            (3, Check::Backward),
        ];
        assert_eq!(groups, vec![softmax, layer_norm]);
    }

    #[test]
    fn nan_and_infinity_positions_must_match() {
        let nan = f64::NAN;
        assert!(
            compare(
                &[nan, f64::INFINITY, 1.0],
                &[nan, f64::INFINITY, 1.0],
                DType::F32,
                1
            )
            .ok
        );
        assert!(!compare(&[nan, 1.0], &[1.0, 1.0], DType::F32, 1).ok);
        assert!(!compare(&[1.0, 1.0], &[nan, 1.0], DType::F32, 1).ok);
        assert!(!compare(&[f64::NEG_INFINITY], &[f64::INFINITY], DType::F32, 1).ok);
        assert!(!compare(&[1e30], &[f64::INFINITY], DType::F64, 1).ok);
    }

    #[test]
    fn tolerances_scale_with_the_reduction() {
        let off = 1.0 + 2e-5;
        assert!(!compare(&[off], &[1.0], DType::F32, 1).ok);
        assert!(compare(&[off], &[1.0], DType::F32, 16).ok);
        assert!(!compare(&[2.0], &[1.0], DType::I32, 1_000_000).ok);
    }

    #[test]
    fn the_reference_is_rounded_to_the_output_dtype() {
        // 70000 overflows f16: the device's inf is what rounding the reference gives.
        assert!(compare(&[f64::INFINITY], &[70_000.0], DType::F16, 1).ok);
        assert!(compare(&[1.0], &[1.0 + 1e-4], DType::F16, 1).ok);
    }
}
