//! Ops over tensors larger than one storage binding, on a wgpu device whose bindings are
//! capped at 64 KiB: every sample of the ops that run over windows (their families' samples
//! and the large ones of `samples::windows`, scaled to `[70, 300]`, 84 KB in f32) matches
//! the CPU reference, none unsupported. The full-size samples (past lavapipe's 128 MiB) run
//! in the `ops` test. Passes vacuously, with a note, where no wgpu device is under test.
#![cfg(feature = "wgpu")]

use std::sync::Arc;

use tessera::tessera_wgpu::WgpuDevice;
use tessera::{open_device, DType, Op};
use tessera_conformance::env::listings_under_test;
use tessera_conformance::harness::Target;
use tessera_conformance::samples::{family_samples, windows};
use tessera_conformance::{Check, Status, Suite};

/// The binding cap: small enough that most samples need several windows.
const MAX_BINDING: u64 = 64 << 10;

/// Ops that run over windows (`backend-wgpu/src/windows.rs`).
fn windowed(op: &Op) -> bool {
    use Op::*;
    matches!(
        op,
        Cast { .. }
            | Copy
            | Unary(_)
            | UnaryBackward(_)
            | Binary(_)
            | Compare(_)
            | Where
            | SwiGlu
            | SwiGluBackward
            | Fill { .. }
            | Arange { .. }
            | RandUniform { .. }
            | RandNormal { .. }
            | AdamUpdate { .. }
            | SgdUpdate { .. }
            | SquaredNorm
            | Concat { .. }
            | Embedding
            | EmbeddingBackward
            | Matmul { .. }
    )
}

#[test]
fn ops_past_one_binding_match_the_reference() {
    let Some(listing) = listings_under_test()
        .into_iter()
        .find(|d| d.backend == "wgpu")
    else {
        eprintln!("no wgpu device under test; skipping");
        return;
    };
    let ordinal: usize = listing
        .id
        .trim_start_matches("wgpu:")
        .parse()
        .expect("wgpu ids are wgpu:N");
    let device = WgpuDevice::open_with_max_binding(ordinal, MAX_BINDING)
        .expect("a listed wgpu device opens");
    let suite = Suite {
        targets: vec![Target {
            device: Arc::new(device),
            backend: "wgpu".into(),
            name: format!("{} ({}, bindings of 64 KiB)", listing.id, listing.name),
        }],
        reference: open_device("cpu:0").expect("the CPU reference opens"),
    };
    let samples: Vec<_> = Op::catalog()
        .iter()
        .filter(|op| windowed(op))
        .flat_map(|op| {
            let mut list = family_samples(op);
            list.extend(windows::samples(op, 70, 300));
            list
        })
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
        "{} samples fail or are unsupported with 64 KiB bindings:\n{}",
        problems.len(),
        problems.join("\n")
    );
    let passed = |dtype: DType| {
        report
            .rows
            .iter()
            .filter(|r| r.dtype == dtype.name() && r.status == Status::Pass)
            .count()
    };
    assert!(
        passed(DType::F32) >= 40,
        "only {} f32 rows ran",
        passed(DType::F32)
    );
}
