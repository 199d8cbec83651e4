//! `tessera train --devices a,b,...`: one worker process per device on this host, started
//! the way torchrun starts them (this program again, with `RANK`, `WORLD_SIZE`,
//! `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` set), and watched: when one worker fails,
//! the others stop (each notices through its rendezvous links, or is ended here after a
//! grace period) and the launch fails with a line that names the worker.

use std::ffi::OsString;
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

use super::train::TrainArgs;
use super::world::PEER_STOPPED_EXIT;
use crate::{Error, Result};

/// How long the other workers get to stop on their own once one has failed.
const GRACE: Duration = Duration::from_secs(15);

/// The devices of `--devices`, checked before any worker starts: one backend, with
/// collectives (the missing library is named in one line).
fn parse_devices(list: &str) -> Result<Vec<String>> {
    let devices: Vec<String> = list
        .split(',')
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty())
        .collect();
    let specs: Vec<&str> = devices.iter().map(String::as_str).collect();
    crate::check_collectives(&specs)?;
    Ok(devices)
}

/// This program's arguments without `--devices` (the workers get `--device` instead).
fn worker_arguments() -> Vec<OsString> {
    let mut out = Vec::new();
    let mut args = std::env::args_os().skip(1);
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--devices") => {
                args.next();
            }
            Some(a) if a.starts_with("--devices=") => {}
            _ => out.push(arg),
        }
    }
    out
}

/// A free TCP port on this host for rank 0 to listen on.
fn free_port() -> Result<u16> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| Error::io("a free port for the workers' rendezvous", e))
}

/// Starts a worker per device of `--devices` and waits for them all.
pub fn run(args: &TrainArgs) -> Result<()> {
    let devices = parse_devices(args.devices.as_deref().unwrap_or_default())?;
    let program = std::env::current_exe().map_err(|e| Error::io("the tessera program", e))?;
    let port = free_port()?;
    let arguments = worker_arguments();
    let mut workers: Vec<(String, Child)> = Vec::new();
    for (rank, device) in devices.iter().enumerate() {
        let spawned = Command::new(&program)
            .args(&arguments)
            .arg("--device")
            .arg(device)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", devices.len().to_string())
            .env("LOCAL_RANK", rank.to_string())
            .env("MASTER_ADDR", "127.0.0.1")
            .env("MASTER_PORT", port.to_string())
            .spawn();
        match spawned {
            Ok(child) => workers.push((device.clone(), child)),
            Err(e) => {
                stop_all(&mut workers);
                return Err(Error::io(&program, e));
            }
        }
    }
    watch(workers)
}

/// Waits for every worker. Once one fails the others get [`GRACE`] to stop on their own
/// before they are ended; the error names the worker that failed first of its own accord
/// (not one that stopped because another rank had: [`PEER_STOPPED_EXIT`]).
fn watch(mut workers: Vec<(String, Child)>) -> Result<()> {
    let mut done = vec![false; workers.len()];
    let mut failures: Vec<(usize, ExitStatus)> = Vec::new();
    let mut first_failure: Option<Instant> = None;
    loop {
        for (rank, (_, child)) in workers.iter_mut().enumerate() {
            if done[rank] {
                continue;
            }
            if let Ok(Some(status)) = child.try_wait() {
                done[rank] = true;
                if !status.success() {
                    failures.push((rank, status));
                    first_failure.get_or_insert_with(Instant::now);
                }
            }
        }
        if done.iter().all(|&d| d) {
            break;
        }
        if first_failure.is_some_and(|at| at.elapsed() > GRACE) {
            stop_all(&mut workers);
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // A worker ended by a signal is the likeliest cause, then one that failed on its own.
    let cause = failures
        .iter()
        .find(|(_, status)| status.code().is_none())
        .or_else(|| {
            failures
                .iter()
                .find(|(_, status)| status.code() != Some(PEER_STOPPED_EXIT))
        })
        .or(failures.first());
    match cause {
        None => Ok(()),
        Some(&(rank, status)) => Err(Error::Collective {
            detail: format!(
                "worker rank {rank} on {} {}; every worker has stopped",
                workers[rank].0,
                describe(status)
            ),
        }),
    }
}

fn stop_all(workers: &mut [(String, Child)]) {
    for (_, child) in workers.iter_mut() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn describe(status: ExitStatus) -> String {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(signal) = status.signal() {
            return format!("was ended by signal {signal}");
        }
    }
    match status.code() {
        Some(code) => format!("exited with status {code}"),
        None => "stopped".into(),
    }
}
