//! The wgpu device opened with options other than the defaults, against the CPU reference.
//! Both tests pass vacuously, with a note, where no wgpu device is under test.
//!
//! - Ops over tensors larger than one storage binding: bindings capped at 64 KiB, launch
//!   parameters as immediates where the adapter has them (not the default, which the `ops`
//!   test runs) and workgroup reductions as trees (no subgroups). Every sample of the ops
//!   that run over windows (their families' samples and the large and scaled-only ones of
//!   `samples::windows`, scaled to `[70, 300]`, 84 KB in f32; cross-entropy and attention
//!   (cached too), whose families have rows or heads wider than 64 KiB, the latter only)
//!   matches, none
//!   unsupported. The full-size samples (past lavapipe's 128 MiB) run in the `ops` test.
//! - Workgroup reductions as trees (no subgroups), parameters as immediates: every sample of
//!   the ops whose kernels reduce over a workgroup matches.
#![cfg(feature = "wgpu")]

use std::sync::{Arc, Mutex, MutexGuard};

use tessera::tessera_wgpu::{WgpuDevice, WgpuOptions};
use tessera::{open_device, DType, Op, OpFamily};
use tessera_conformance::env::{listings_under_test, op_under_test};
use tessera_conformance::harness::Target;
use tessera_conformance::samples::{family_samples, windows};
use tessera_conformance::{Check, Sample, Status, Suite};

/// The binding cap: small enough that most samples need several windows.
const MAX_BINDING: u64 = 64 << 10;

/// Ops whose family samples have parts wider than 64 KiB (rows of vocabularies past 65,536,
/// heads of 600 positions): only their `samples::windows` run here. Every other op runs its
/// family samples too (every op runs over windows: `backend-wgpu/src/windows.rs`).
fn has_parts_past_the_cap(op: &Op) -> bool {
    op.family() == OpFamily::Loss
        || matches!(
            op,
            Op::Attention { .. } | Op::AttentionBackward { .. } | Op::CachedAttention
        )
}

/// Ops whose kernels reduce over a workgroup (`wg_sum`/`wg_max`).
fn reduces_over_workgroups(op: &Op) -> bool {
    use Op::*;
    matches!(
        op,
        Softmax
            | LogSoftmax
            | SoftmaxBackward
            | LogSoftmaxBackward
            | LayerNorm
            | LayerNormBackward
            | RmsNorm
            | RmsNormBackward
            | Attention { .. }
            | CrossEntropy
            | SquaredNorm
    )
}

/// Held by each test while it has its devices open: NVIDIA's Vulkan driver can crash the
/// process when one device is destroyed while another is at work in another thread (seen as
/// an occasional segfault of this binary on the H100; wgpu issue 8365 describes the teardown
/// race), so the tests take turns. A test's own instances (one per worker of the suite) are
/// idle when they are dropped together at its end.
static ONE_DEVICE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn one_device_at_a_time() -> MutexGuard<'static, ()> {
    ONE_DEVICE_AT_A_TIME
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The suite of the first wgpu device under test opened with `options`, or `None` (with a
/// note) where there is none.
fn suite(options: WgpuOptions, what: &str) -> Option<Suite> {
    let Some(listing) = listings_under_test()
        .into_iter()
        .find(|d| d.backend == "wgpu")
    else {
        eprintln!("no wgpu device under test; skipping");
        return None;
    };
    let ordinal: usize = listing
        .id
        .trim_start_matches("wgpu:")
        .parse()
        .expect("wgpu ids are wgpu:N");
    let target = Target::open(
        "wgpu",
        format!("{} ({}, {what})", listing.id, listing.name),
        || Ok(Arc::new(WgpuDevice::open_with(ordinal, &options)?)),
    )
    .expect("a listed wgpu device opens");
    Some(Suite {
        targets: vec![target],
        reference: open_device("cpu:0").expect("the CPU reference opens"),
    })
}

/// Runs the forward check of `samples` and asserts that none fails or is unsupported and
/// that at least `min_f32` f32 rows pass.
fn forward_passes(suite: &Suite, samples: &[Sample], min_f32: usize, what: &str) {
    let samples: Vec<Sample> = samples
        .iter()
        .filter(|s| op_under_test(&s.op.name()))
        .cloned()
        .collect();
    let report = suite.run(&samples, &[Check::Forward]);
    println!("{}", report.table(Check::Forward));
    let mut problems: Vec<String> = report.failure_lines();
    problems.extend(
        report
            .unsupported
            .iter()
            .map(|o| format!("UNSUPPORTED {} {}: {}", o.row.op, o.sample, o.detail)),
    );
    assert!(
        problems.is_empty(),
        "{} samples fail or are unsupported {what}:\n{}",
        problems.len(),
        problems.join("\n")
    );
    let passed = report
        .rows
        .iter()
        .filter(|r| r.dtype == DType::F32.name() && r.status == Status::Pass)
        .count();
    assert!(passed >= min_f32, "only {passed} f32 rows ran");
}

#[test]
fn ops_past_one_binding_match_the_reference() {
    let options = WgpuOptions {
        max_binding_bytes: MAX_BINDING,
        immediates: true,
        subgroups: false,
    };
    let what = "bindings of 64 KiB, immediates, no subgroups";
    let _device = one_device_at_a_time();
    let Some(suite) = suite(options, what) else {
        return;
    };
    let samples: Vec<_> = Op::catalog()
        .iter()
        .flat_map(|op| {
            let mut list = Vec::new();
            if !has_parts_past_the_cap(op) {
                list.extend(family_samples(op));
            }
            list.extend(windows::samples(op, 70, 300));
            list.extend(windows::scaled_samples(op, 70, 300));
            list
        })
        .collect();
    forward_passes(&suite, &samples, 40, "with 64 KiB bindings");
}

#[test]
fn workgroup_reductions_without_subgroups_match_the_reference() {
    let options = WgpuOptions {
        immediates: true,
        subgroups: false,
        ..WgpuOptions::default()
    };
    let _device = one_device_at_a_time();
    let Some(suite) = suite(options, "immediates, no subgroups") else {
        return;
    };
    let samples: Vec<_> = Op::catalog()
        .iter()
        .filter(|op| reduces_over_workgroups(op))
        .flat_map(family_samples)
        .collect();
    forward_passes(&suite, &samples, 10, "without subgroups");
}
