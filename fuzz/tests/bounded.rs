//! A bounded fuzzing run of every parser of outside bytes: thousands of mutated inputs each,
//! none of which may panic, hang or allocate far beyond its size.

use tessera_fuzz::{fuzz, targets, PeakAlloc};

#[global_allocator]
static ALLOC: PeakAlloc = PeakAlloc;

#[test]
fn mutated_inputs_never_panic_hang_or_overallocate() {
    for target in targets() {
        let outcome = fuzz(&target, 3_000, 1);
        let failures: Vec<String> = outcome
            .failures
            .iter()
            .take(5)
            .map(|(input, failure)| format!("{failure:?} on {} bytes", input.len()))
            .collect();
        assert!(
            failures.is_empty(),
            "{}: {} of {} inputs failed: {failures:?}",
            target.name,
            outcome.failures.len(),
            outcome.runs
        );
        assert!(outcome.runs == 3_000 && outcome.accepted < outcome.runs);
    }
}
