//! Where the suite's time goes: every timed part of every check (the reference's work, each
//! device's launch and read-back), so that a run prints its slowest samples and ops and
//! writes them all to `target/conformance/timings.json`. A suite that slowly grows past its CI
//! budget shows which sample or kernel did it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Instant;

use serde::Serialize;
use tessera::DType;

use crate::check::Check;
use crate::env::target_dir;

/// Who spent the time: the CPU reference (preparing inputs, reference outputs and gradients,
/// finite differences) or a device under test.
pub const REFERENCE: &str = "reference";

/// Comparing a device's outputs with the reference's.
pub const COMPARE: &str = "compare";

/// One timed part of one check of one sample in one dtype.
#[derive(Clone, Debug, Serialize)]
pub struct Timing {
    pub check: Check,
    pub op: String,
    pub sample: String,
    pub dtype: String,
    /// [`REFERENCE`] or the device's name.
    pub part: String,
    pub seconds: f64,
}

/// The timings of one run, collected from every worker.
#[derive(Debug, Default)]
pub struct Ledger(Mutex<Vec<Timing>>);

/// What a timed part belongs to.
#[derive(Clone, Copy)]
pub struct Key<'a> {
    pub check: Check,
    pub op: &'a str,
    pub sample: &'a str,
    pub dtype: DType,
}

impl Ledger {
    /// Runs `work`, recording its wall time under `key` and `part`.
    pub fn time<T>(&self, key: Key<'_>, part: &str, work: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = work();
        let seconds = start.elapsed().as_secs_f64();
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(Timing {
                check: key.check,
                op: key.op.to_string(),
                sample: key.sample.to_string(),
                dtype: key.dtype.name().to_string(),
                part: part.to_string(),
                seconds,
            });
        out
    }

    pub fn into_timings(self) -> Vec<Timing> {
        self.0
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The `n` largest sums of `seconds` grouped by `group`, largest first, with their count.
fn largest<K: Ord + Clone>(
    timings: &[Timing],
    n: usize,
    group: impl Fn(&Timing) -> K,
) -> Vec<(K, f64, usize)> {
    let mut sums: BTreeMap<K, (f64, usize)> = BTreeMap::new();
    for t in timings {
        let entry = sums.entry(group(t)).or_default();
        entry.0 += t.seconds;
        entry.1 += 1;
    }
    let mut list: Vec<(K, f64, usize)> = sums.into_iter().map(|(k, (s, c))| (k, s, c)).collect();
    list.sort_by(|a, b| b.1.total_cmp(&a.1));
    list.truncate(n);
    list
}

/// The slowest `n` samples (a check of one sample over all its dtypes and parts) and the `n`
/// ops costing most per part (a device's kernels, or the reference), one line each.
pub fn slowest_lines(timings: &[Timing], n: usize) -> Vec<String> {
    let total: f64 = timings.iter().map(|t| t.seconds).sum();
    let mut lines = vec![format!(
        "time: {total:.1} s of work in {} timed parts (workers run in parallel)",
        timings.len()
    )];
    for ((check, sample), seconds, _) in largest(timings, n, |t| (t.check, t.sample.clone())) {
        let parts = largest(
            timings
                .iter()
                .filter(|t| t.check == check && t.sample == sample)
                .cloned()
                .collect::<Vec<_>>()
                .as_slice(),
            4,
            |t| format!("{} {}", t.part, t.dtype),
        );
        let parts: Vec<String> = parts
            .iter()
            .map(|(p, s, _)| format!("{p} {s:.1}"))
            .collect();
        lines.push(format!(
            "slow sample: {seconds:>7.1} s {} {sample} ({})",
            check.name(),
            parts.join(", ")
        ));
    }
    for ((op, part), seconds, count) in largest(timings, n, |t| (t.op.clone(), t.part.clone())) {
        lines.push(format!(
            "slow op:     {seconds:>7.1} s {op} on {part} ({count} parts)"
        ));
    }
    lines
}

/// Writes every timing as JSON to `<target>/conformance/<name>.json`.
pub fn write_json(timings: &[Timing], name: &str) -> std::io::Result<PathBuf> {
    let dir = target_dir().join("conformance");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join(format!("{name}.json"));
    let json = serde_json::to_string(timings).map_err(std::io::Error::other)?;
    std::fs::write(&path, json)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(check: Check, op: &str, sample: &str, part: &str, seconds: f64) -> Timing {
        Timing {
            check,
            op: op.into(),
            sample: sample.into(),
            dtype: "f32".into(),
            part: part.into(),
            seconds,
        }
    }

    #[test]
    fn samples_and_ops_are_ranked_by_their_summed_time() {
        let timings = [
            timing(Check::Forward, "add", "add small", "wgpu:0", 1.0),
            timing(Check::Forward, "matmul", "matmul big", REFERENCE, 2.0),
            timing(Check::Forward, "matmul", "matmul big", "wgpu:0", 2.5),
            timing(Check::Backward, "add", "add small", "wgpu:0", 3.0),
        ];
        let lines = slowest_lines(&timings, 2);
        let expected = [
            "8.5 s of work in 4",
            "4.5 s forward matmul big (wgpu:0 f32 2.5, reference f32 2.0)",
            "3.0 s backward add small",
            "4.0 s add on wgpu:0 (2 parts)",
            "2.5 s matmul on wgpu:0 (1 parts)",
        ];
        assert_eq!(lines.len(), expected.len(), "{lines:#?}");
        for (line, want) in lines.iter().zip(expected) {
            assert!(line.contains(want), "{line:?} lacks {want:?}");
        }
    }
}
