//! Tessera's conformance suite: every op of the catalog and every gradient, on every device
//! present, against the CPU reference computing in f64 (DESIGN §7).
//!
//! - [`check`]: the kinds of check (forward, backward, gradient check).
//! - [`samples`]: what to run, per op (an exhaustive match, so new ops need samples).
//! - [`prepare`]: resolving samples into values and launching kernels with guarded outputs.
//! - [`harness`]: the forward, backward and finite-difference checks, the coverage table and
//!   `target/conformance/coverage.json`.
//! - [`timing`]: where the run's time went (slowest samples and ops), and
//!   `target/conformance/timings.json`.
//!
//! `TESSERA_DEVICES=cpu,wgpu` narrows the devices (and `TESSERA_OPS=matmul,conv2d` the ops of
//! the `ops` and `wgpu_options` tests); `cargo test -p tessera-conformance` runs it.

pub mod check;
pub mod env;
pub mod harness;
pub mod prepare;
pub mod samples;
pub mod timing;

pub use check::Check;
pub use env::{devices_under_test, target_dir};
pub use harness::{compare, tolerance, Report, Row, Status, Suite};
pub use samples::{all_samples, samples, Sample};
pub use tessera::shared_dir;
