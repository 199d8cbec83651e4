//! Data-parallel training across devices and hosts (DESIGN §3, collectives).
//!
//! A run of N workers, one per device, is a *world* of N ranks. Workers find each other
//! the way torchrun's do: each reads `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and
//! `MASTER_PORT` ([`DistEnv`]), and rank 0 listens on the master address while the others
//! connect ([`Rendezvous`]). Over that connection rank 0 shares the vendor library's
//! communicator id (NCCL's unique id), and every rank watches the others: a worker that
//! stops before the run ends (killed, crashed, or failed with an error) makes every other
//! rank stop with an error that names it ([`Rendezvous::watch`]).
//!
//! The collectives themselves (all-reduce, broadcast, barrier) are a [`Collective`], which
//! a device makes with [`crate::Device::join_collective`]: the HIP backend through NCCL
//! (RCCL on AMD), the CPU through the rendezvous connection itself ([`HostCollective`]);
//! other backends say `Unsupported`.

mod buckets;
mod host;
mod rendezvous;

use std::fmt::Debug;
use std::sync::Arc;

pub use buckets::{GradientBuckets, BUCKET_BYTES};
pub use host::HostCollective;
pub use rendezvous::{Rendezvous, CONNECT_TIMEOUT};

use crate::{Device, Error, Result, TensorRef};

/// Collectives among the ranks of one world, on one device per rank. Every rank makes the
/// same calls in the same order, with tensors of the same shapes and dtypes; a call
/// that some rank never makes waits for it (the [`Rendezvous`] watch ends such a wait
/// when a rank stops).
pub trait Collective: Send + Sync + Debug {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Starts replacing each tensor (contiguous) with its sum over all ranks, after the work
    /// queued so far on the device. Backends may run it beside work queued later (NCCL on a
    /// stream of its own), so until [`Collective::wait`] the tensors must be kept alive and
    /// neither read nor written.
    fn all_reduce_sum(&self, tensors: &[TensorRef<'_>]) -> Result<()>;
    /// Starts copying each tensor (contiguous) of rank `root` into the same tensor of every
    /// other rank; the same rules as [`Collective::all_reduce_sum`].
    fn broadcast(&self, tensors: &[TensorRef<'_>], root: usize) -> Result<()>;
    /// Makes work queued on the device from now on wait for the collectives started so far.
    fn wait(&self) -> Result<()>;
    /// Returns once every rank has called it and the work each queued before has finished
    /// (before a worker exits, so that no rank is left waiting on its collectives).
    fn barrier(&self) -> Result<()>;
}

/// Joins the world of `rendezvous` with `device` (every rank calls it once, at the same
/// point): the ranks must use one backend, whose collectives speak one protocol, and then
/// the device makes its [`Collective`] ([`crate::Device::join_collective`]).
pub fn join(device: &Arc<dyn Device>, rendezvous: &Arc<Rendezvous>) -> Result<Arc<dyn Collective>> {
    rendezvous.agree("backend", &device.info().backend)?;
    device.clone().join_collective(rendezvous)
}

/// Where a worker stands in its world, from torchrun's environment variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DistEnv {
    pub rank: usize,
    pub world_size: usize,
    /// The worker's index among the workers of its host: the device ordinal it takes when
    /// none is named.
    pub local_rank: usize,
    pub master_addr: String,
    pub master_port: u16,
}

impl DistEnv {
    /// The variables torchrun sets, and that `tessera train --devices` sets for its workers.
    pub const VARIABLES: [&'static str; 5] = [
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    ];

    /// The world this process belongs to: `None` without `WORLD_SIZE` (a run of its own),
    /// an error naming the variable where one is missing or malformed.
    pub fn from_env() -> Result<Option<DistEnv>> {
        DistEnv::from_lookup(|name| std::env::var(name).ok())
    }

    /// [`DistEnv::from_env`] over any source of variables.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Option<DistEnv>> {
        let Some(world) = var("WORLD_SIZE") else {
            return Ok(None);
        };
        let number = |name: &str, value: Option<String>| -> Result<usize> {
            let value = value.ok_or_else(|| {
                Error::invalid(
                    "data-parallel environment",
                    format!("WORLD_SIZE is set but {name} is not"),
                )
            })?;
            value.trim().parse().map_err(|_| {
                Error::invalid(
                    "data-parallel environment",
                    format!("{name}={value:?} is not a non-negative integer"),
                )
            })
        };
        let world_size = number("WORLD_SIZE", Some(world))?;
        let rank = number("RANK", var("RANK"))?;
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", Some(v))?,
            None => rank,
        };
        let master_addr = var("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let port = number("MASTER_PORT", var("MASTER_PORT"))?;
        let master_port = u16::try_from(port).ok().filter(|&p| p > 0).ok_or_else(|| {
            Error::invalid(
                "data-parallel environment",
                format!("MASTER_PORT={port} is not a port (1 to 65535)"),
            )
        })?;
        if world_size == 0 || rank >= world_size {
            return Err(Error::invalid(
                "data-parallel environment",
                format!("RANK={rank} must be below WORLD_SIZE={world_size} (at least 1)"),
            ));
        }
        Ok(Some(DistEnv {
            rank,
            world_size,
            local_rank,
            master_addr,
            master_port,
        }))
    }
}

/// Checks that `t` is contiguous, as collectives need: they move whole buffers' ranges.
pub fn check_contiguous(op: &str, t: &TensorRef<'_>) -> Result<()> {
    if t.layout.is_contiguous() {
        return Ok(());
    }
    Err(Error::invalid(
        op,
        format!(
            "needs contiguous tensors; got shape {:?} with strides {:?}",
            t.layout.shape, t.layout.strides
        ),
    ))
}

/// The error of a collective that cannot go on: a rank that stopped, a connection lost.
pub(crate) fn collective_error(detail: impl Into<String>) -> Error {
    Error::Collective {
        detail: detail.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(vars: &'a [(&str, &str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn no_world_size_is_a_run_of_its_own() {
        assert_eq!(
            DistEnv::from_lookup(lookup(&[("RANK", "3")])).unwrap(),
            None
        );
    }

    #[test]
    fn torchrun_variables_are_read() {
        let env = DistEnv::from_lookup(lookup(&[
            ("WORLD_SIZE", "8"),
            ("RANK", "5"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            env,
            DistEnv {
                rank: 5,
                world_size: 8,
                local_rank: 1,
                master_addr: "node0".into(),
                master_port: 29500,
            }
        );
    }

    #[test]
    fn bad_variables_are_named() {
        let cases: [&[(&str, &str)]; 4] = [
            &[("WORLD_SIZE", "2"), ("MASTER_PORT", "1")],
            &[("WORLD_SIZE", "2"), ("RANK", "2"), ("MASTER_PORT", "1")],
            &[("WORLD_SIZE", "two"), ("RANK", "0"), ("MASTER_PORT", "1")],
            &[("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_PORT", "70000")],
        ];
        let named = ["RANK", "RANK=2", "WORLD_SIZE", "MASTER_PORT"];
        for (vars, name) in cases.iter().zip(named) {
            let err = DistEnv::from_lookup(lookup(vars)).unwrap_err().to_string();
            assert!(err.contains(name), "{err}");
        }
    }
}
