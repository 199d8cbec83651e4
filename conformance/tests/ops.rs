//! The whole conformance suite: forward, backward and gradcheck over every catalog op on every
//! device present. The suite runs once per test binary; each test asserts on its part.

use std::io::Write;
use std::sync::OnceLock;

use rstest::rstest;
use tessera::Op;
use tessera_conformance::env::op_under_test;
use tessera_conformance::timing::{slowest_lines, write_json};
use tessera_conformance::{all_samples, samples, Check, Report, Status, Suite};

struct Run {
    suite: Suite,
    report: Report,
}

fn run() -> &'static Run {
    static RUN: OnceLock<Run> = OnceLock::new();
    RUN.get_or_init(|| {
        let suite = Suite::from_env().expect("opening the devices under test");
        assert!(
            !suite.targets.is_empty(),
            "no device to test (TESSERA_DEVICES filters out everything?)"
        );
        // `TESSERA_OPS=conv2d,attention` narrows a run to those ops while working on them; the
        // coverage tests then fail, since the other ops have no rows.
        let samples: Vec<_> = all_samples()
            .into_iter()
            .filter(|s| op_under_test(&s.op.name()))
            .collect();
        let report = suite.run(&samples, &Check::ALL);
        for check in Check::ALL {
            println!("{}", report.table(check));
        }
        print!("{}", report.summary());
        // Straight to stderr, past the test harness's capture: CI logs show where time goes.
        let mut stderr = std::io::stderr();
        for line in slowest_lines(&report.timings, 15) {
            let _ = writeln!(stderr, "{line}");
        }
        for line in report.failure_lines() {
            println!("{line}");
        }
        match report.write_json() {
            Ok(path) => println!("coverage written to {}", path.display()),
            Err(e) => println!("could not write coverage.json: {e}"),
        }
        match write_json(&report.timings, "timings") {
            Ok(path) => println!("timings written to {}", path.display()),
            Err(e) => println!("could not write timings.json: {e}"),
        }
        Run { suite, report }
    })
}

#[rstest]
#[case::forward(Check::Forward)]
#[case::backward(Check::Backward)]
#[case::gradcheck(Check::Gradcheck)]
fn every_sample_matches_the_reference(#[case] check: Check) {
    let run = run();
    let failures: Vec<String> = run
        .report
        .failure_lines()
        .into_iter()
        .filter(|l| l.starts_with(&format!("FAIL {} ", check.name())))
        .collect();
    let rows = run
        .report
        .rows
        .iter()
        .filter(|r| r.check == check && r.status == Status::Fail)
        .count();
    assert!(
        failures.is_empty(),
        "{rows} {} rows fail:\n{}",
        check.name(),
        failures.join("\n")
    );
}

#[test]
fn every_backend_supports_every_op() {
    let run = run();
    let gaps = run.suite.coverage_gaps(&run.report);
    assert!(
        gaps.is_empty(),
        "{} coverage gaps:\n{}",
        gaps.len(),
        gaps.join("\n")
    );
}

#[test]
fn every_catalog_op_has_samples() {
    for op in Op::catalog() {
        let list = samples(&op);
        assert!(!list.is_empty(), "{} has no samples", op.name());
        assert!(
            list.iter().any(|s| s.dtypes.contains(&tessera::DType::F32)),
            "{} has no f32 sample",
            op.name()
        );
        if op.differentiable() {
            assert!(
                list.iter().any(|s| s.gradcheck),
                "{} has no gradcheck sample",
                op.name()
            );
        }
    }
}

#[test]
fn strided_views_only_where_the_op_reads_them() {
    for s in all_samples() {
        for (i, input) in s.inputs.iter().enumerate() {
            assert!(
                s.op.reads_layout(i, &input.view.layout(&input.shape)),
                "{}: input {i} is strided but the op needs row-major",
                s.desc
            );
        }
    }
}
