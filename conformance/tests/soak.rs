//! Training for many steps on every device under test leaves memory flat after warm-up: the
//! device's memory in use constant, what its pool reserves never growing, its allocations
//! after warm-up served from its cache, the process's resident memory growing by less than
//! [`RSS_GROWTH`]. `TESSERA_SOAK_STEPS` sets the steps
//! (100 by default; 1,000 for the long soak); the figures go to stderr. A file of its own, so
//! that no other test shares the process whose resident memory is measured.

use tessera::data::AdditionTask;
use tessera_conformance::devices_under_test;

mod common;
use common::{batch, small_gpt_trainer};

/// Resident memory a soak may gain after warm-up (a leak of 80 KiB a step fails 100 steps).
const RSS_GROWTH: usize = 8 << 20;

/// The process's resident bytes (`/proc/self/statm`, Linux); `None` elsewhere.
fn resident_bytes() -> Option<usize> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: usize = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

#[test]
fn memory_is_flat_over_many_training_steps() {
    let steps: usize = std::env::var("TESSERA_SOAK_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100)
        .max(20);
    let warm = steps / 10;
    for device in devices_under_test() {
        let id = device.info().id();
        let task = AdditionTask::new(2).unwrap();
        let mut t = small_gpt_trainer(&device, &task);
        let (mut in_use, mut reserved, mut resident) = (Vec::new(), Vec::new(), Vec::new());
        let mut served = Vec::new();
        let start = std::time::Instant::now();
        for _ in 0..steps {
            let b = batch(&task, &mut t);
            drop(t.step(&[b]).unwrap());
            device.synchronize().unwrap();
            let stats = device.memory();
            in_use.push(stats.in_use);
            reserved.push(stats.reserved);
            served.push((stats.allocations, stats.reuses));
            resident.push(resident_bytes());
        }
        eprintln!(
            "{id}: {steps} steps in {:.1} s; in use {} -> {} B, reserved {} -> {} B, resident {:?} -> {:?} B (after {warm} warm-up steps -> last)",
            start.elapsed().as_secs_f64(),
            in_use[warm],
            in_use[steps - 1],
            reserved[warm],
            reserved[steps - 1],
            resident[warm],
            resident[steps - 1],
        );
        assert!(
            in_use[warm..].iter().all(|&m| m == in_use[warm]),
            "{id}: memory in use drifts: {in_use:?}"
        );
        assert!(
            reserved[warm..].iter().all(|&m| m <= reserved[warm]),
            "{id}: the pool keeps growing: {reserved:?}"
        );
        // After warm-up (a replayed step allocates once, while it is recorded), nearly every
        // allocation comes from the pool's cache.
        let (allocations, reuses) = (
            served[steps - 1].0 - served[warm].0,
            served[steps - 1].1 - served[warm].1,
        );
        assert!(
            reuses as f64 >= 0.9 * allocations as f64,
            "{id}: after warm-up the pool served {reuses} of {allocations} allocations from its cache: {:?}",
            device.memory()
        );
        match (resident[warm], resident[steps - 1]) {
            (Some(first), Some(last)) => assert!(
                last <= first + RSS_GROWTH,
                "{id}: resident memory grows from {first} to {last} bytes"
            ),
            _ => eprintln!("note: resident memory is not measured on this system"),
        }
    }
}
