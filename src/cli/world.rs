//! A `tessera train` worker's part in a data-parallel world: which device it takes, how it
//! meets the other ranks and joins their collectives, what stops it when another rank stops,
//! and the world size a resumed run must keep. `launch.rs` starts the workers of
//! `--devices`; `train.rs` runs each one.

use std::path::Path;
use std::sync::Arc;

use super::invalid;
use crate::dist::{Collective, DistEnv, Rendezvous, CONNECT_TIMEOUT};
use crate::{Device, Error, Result};

/// This worker's place in a data-parallel world: its rank and the links to the other
/// ranks. A run of its own is a world of one without links.
pub(super) struct World {
    pub rank: usize,
    pub size: usize,
    pub rendezvous: Option<Arc<Rendezvous>>,
}

impl World {
    pub fn alone() -> World {
        World {
            rank: 0,
            size: 1,
            rendezvous: None,
        }
    }

    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// Rank 0's `value` on every rank (the rendezvous link carries it).
    pub fn decide(&self, value: bool) -> Result<bool> {
        match &self.rendezvous {
            Some(r) => Ok(r.share_from_root(&[u8::from(value)])? == [1]),
            None => Ok(value),
        }
    }
}

/// The device of this worker: `--device`, else under torchrun's variables device
/// `LOCAL_RANK` of `TESSERA_DEVICE`'s backend or of the best backend present, else the
/// default.
pub(super) fn worker_device(spec: Option<&str>, env: Option<&DistEnv>) -> Result<Arc<dyn Device>> {
    let (None, Some(env)) = (spec, env) else {
        return super::open_device(spec);
    };
    let chosen = std::env::var("TESSERA_DEVICE")
        .ok()
        .filter(|d| !d.is_empty());
    let backend = match chosen {
        Some(device) => device.split(':').next().unwrap_or_default().to_string(),
        None => crate::devices()
            .first()
            .map(|d| d.backend.to_string())
            .ok_or_else(|| Error::Device {
                name: format!("local rank {}", env.local_rank),
                detail: "no backend reports a device".into(),
            })?,
    };
    crate::open_device(&format!("{backend}:{}", env.local_rank))
}

/// The exit status of a worker that stops because another rank stopped first: the launcher
/// names that other rank, the cause.
pub(crate) const PEER_STOPPED_EXIT: i32 = 3;

/// Meets the other ranks of `env`'s world and joins its collectives on `device`. A rank
/// that stops early ends this worker too, with a line that names it: collectives already
/// queued would otherwise wait for it for ever.
pub(super) fn join_world(
    env: &DistEnv,
    device: &Arc<dyn Device>,
) -> Result<(World, Arc<dyn Collective>)> {
    let rendezvous = Rendezvous::connect(env, CONNECT_TIMEOUT)?;
    let (rank, id) = (env.rank, device.info().id());
    rendezvous.watch(Arc::new(move |why| {
        eprintln!("error: rank {rank} ({id}): {why}; stopping");
        std::process::exit(PEER_STOPPED_EXIT);
    }))?;
    let collective = crate::dist::join(device, &rendezvous)?;
    Ok((
        World {
            rank: env.rank,
            size: env.world_size,
            rendezvous: Some(rendezvous),
        },
        collective,
    ))
}

/// Refuses to resume a data-parallel run with another number of workers: each step's batch
/// and the data each worker reads would change.
pub(super) fn check_world_size(
    state: &serde_json::Value,
    world_size: usize,
    path: &Path,
) -> Result<()> {
    let trained = state
        .get("world_size")
        .and_then(|v| v.as_u64())
        .unwrap_or(1) as usize;
    if trained == world_size {
        return Ok(());
    }
    Err(invalid(
        "train --resume",
        format!(
            "{} was trained by {trained} worker(s); resuming it needs {trained} too, not \
             {world_size} (--devices with {trained} devices, or WORLD_SIZE={trained})",
            path.display()
        ),
    ))
}
