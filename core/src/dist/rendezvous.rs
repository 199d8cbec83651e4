//! How the workers of a world find and watch each other: rank 0 listens on
//! `MASTER_ADDR:MASTER_PORT`, every other rank connects twice (a data link, over which rank 0
//! shares bytes such as NCCL's unique id, and a liveness link), and from then on each rank
//! knows when another stops.
//!
//! Liveness works on what the operating system does for a process however it ends: it
//! closes the process's sockets. A rank that ends normally says so first
//! ([`Rendezvous::finish`]); a link that closes without that word means the rank at its
//! other end stopped early. Rank 0 then tells every other rank which rank stopped, and each
//! rank's watch calls its failure handler ([`Rendezvous::watch`]).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{collective_error, DistEnv};
use crate::Result;

/// How long ranks wait for each other to start.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(300);

/// How long rank 0 waits for a new connection's greeting: a stray connection to the port
/// that says nothing must not hold up the ranks behind it.
const GREETING_TIMEOUT: Duration = Duration::from_secs(10);

/// The first bytes of every link, so that a stray connection to the port is refused.
const MAGIC: [u8; 4] = *b"TSRA";
const DATA_LINK: u8 = 0;
const LIVENESS_LINK: u8 = 1;
/// Liveness words: the rank ended normally; or a rank (the next four bytes) stopped early.
const FINISHED: u8 = 0;
const STOPPED: u8 = 1;

/// The links of one rank to the others (rank 0: to every rank; other ranks: to rank 0).
pub struct Rendezvous {
    rank: usize,
    world_size: usize,
    /// Rank 0: the link to rank `i + 1` at `i`; others: the link to rank 0.
    data: Mutex<Vec<TcpStream>>,
    liveness: Arc<Mutex<Vec<TcpStream>>>,
    finished: Arc<AtomicBool>,
}

impl std::fmt::Debug for Rendezvous {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rendezvous")
            .field("rank", &self.rank)
            .field("world_size", &self.world_size)
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn io_error(what: &str, e: std::io::Error) -> crate::Error {
    collective_error(format!("{what}: {e}"))
}

impl Rendezvous {
    /// Meets the other ranks of `env`'s world, waiting up to `timeout` for all of them.
    pub fn connect(env: &DistEnv, timeout: Duration) -> Result<Arc<Rendezvous>> {
        let (data, liveness) = if env.rank == 0 {
            Rendezvous::accept_all(env, timeout)?
        } else {
            let data = Rendezvous::connect_link(env, DATA_LINK, timeout)?;
            let liveness = Rendezvous::connect_link(env, LIVENESS_LINK, timeout)?;
            (vec![data], vec![liveness])
        };
        Ok(Arc::new(Rendezvous {
            rank: env.rank,
            world_size: env.world_size,
            data: Mutex::new(data),
            liveness: Arc::new(Mutex::new(liveness)),
            finished: Arc::new(AtomicBool::new(false)),
        }))
    }

    fn accept_all(env: &DistEnv, timeout: Duration) -> Result<(Vec<TcpStream>, Vec<TcpStream>)> {
        let peers = env.world_size - 1;
        let listener = TcpListener::bind(("0.0.0.0", env.master_port)).map_err(|e| {
            io_error(
                &format!("rank 0 listening on port {} (MASTER_PORT)", env.master_port),
                e,
            )
        })?;
        listener
            .set_nonblocking(true)
            .map_err(|e| io_error("listening", e))?;
        let mut data: Vec<Option<TcpStream>> = (0..peers).map(|_| None).collect();
        let mut liveness: Vec<Option<TcpStream>> = (0..peers).map(|_| None).collect();
        let deadline = Instant::now() + timeout;
        while data.iter().chain(&liveness).any(Option::is_none) {
            let (mut stream, _) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() > deadline {
                        let missing: Vec<String> = (1..=peers)
                            .filter(|r| data[r - 1].is_none() || liveness[r - 1].is_none())
                            .map(|r| r.to_string())
                            .collect();
                        return Err(collective_error(format!(
                            "rank 0 waited {} s for ranks {} to connect",
                            timeout.as_secs(),
                            missing.join(", ")
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(io_error("accepting a rank", e)),
            };
            stream
                .set_nonblocking(false)
                .and_then(|_| stream.set_nodelay(true))
                .and_then(|_| stream.set_read_timeout(Some(GREETING_TIMEOUT)))
                .map_err(|e| io_error("accepting a rank", e))?;
            let mut hello = [0u8; 13];
            if stream.read_exact(&mut hello).is_err() || hello[..4] != MAGIC {
                continue;
            }
            let kind = hello[4];
            let rank = u32::from_le_bytes([hello[5], hello[6], hello[7], hello[8]]) as usize;
            let world = u32::from_le_bytes([hello[9], hello[10], hello[11], hello[12]]) as usize;
            if world != env.world_size || rank == 0 || rank >= env.world_size {
                return Err(collective_error(format!(
                    "a worker connected as rank {rank} of {world}; this world has {} ranks",
                    env.world_size
                )));
            }
            stream
                .set_read_timeout(None)
                .map_err(|e| io_error("accepting a rank", e))?;
            let slot = match kind {
                DATA_LINK => &mut data[rank - 1],
                _ => &mut liveness[rank - 1],
            };
            if slot.replace(stream).is_some() {
                return Err(collective_error(format!(
                    "two workers connected as rank {rank}"
                )));
            }
        }
        Ok((
            data.into_iter().flatten().collect(),
            liveness.into_iter().flatten().collect(),
        ))
    }

    fn connect_link(env: &DistEnv, kind: u8, timeout: Duration) -> Result<TcpStream> {
        let target = format!("{}:{}", env.master_addr, env.master_port);
        let deadline = Instant::now() + timeout;
        loop {
            let attempt = target
                .to_socket_addrs()
                .and_then(|mut addrs| {
                    addrs.next().ok_or_else(|| {
                        std::io::Error::new(std::io::ErrorKind::NotFound, "no address")
                    })
                })
                .and_then(|addr| TcpStream::connect_timeout(&addr, Duration::from_secs(5)));
            match attempt {
                Ok(mut stream) => {
                    stream
                        .set_nodelay(true)
                        .map_err(|e| io_error("connecting to rank 0", e))?;
                    let mut hello = MAGIC.to_vec();
                    hello.push(kind);
                    hello.extend((env.rank as u32).to_le_bytes());
                    hello.extend((env.world_size as u32).to_le_bytes());
                    stream
                        .write_all(&hello)
                        .map_err(|e| io_error("connecting to rank 0", e))?;
                    return Ok(stream);
                }
                Err(e) if Instant::now() > deadline => {
                    return Err(collective_error(format!(
                        "rank {} could not reach rank 0 at {target} (MASTER_ADDR:MASTER_PORT) \
                         within {} s: {e}",
                        env.rank,
                        timeout.as_secs()
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world_size(&self) -> usize {
        self.world_size
    }

    /// Rank 0's `bytes`, on every rank (what other ranks pass is ignored).
    pub fn share_from_root(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        let mut links = lock(&self.data);
        if self.rank == 0 {
            for (i, link) in links.iter_mut().enumerate() {
                write_frame(link, bytes).map_err(|e| lost(i + 1, e))?;
            }
            Ok(bytes.to_vec())
        } else {
            read_frame(&mut links[0]).map_err(|e| lost(0, e))
        }
    }

    /// Every rank's `bytes` by rank, on rank 0; `None` elsewhere.
    pub fn gather_to_root(&self, bytes: &[u8]) -> Result<Option<Vec<Vec<u8>>>> {
        let mut links = lock(&self.data);
        if self.rank == 0 {
            let mut all = vec![bytes.to_vec()];
            for (i, link) in links.iter_mut().enumerate() {
                all.push(read_frame(link).map_err(|e| lost(i + 1, e))?);
            }
            Ok(Some(all))
        } else {
            write_frame(&mut links[0], bytes).map_err(|e| lost(0, e))?;
            Ok(None)
        }
    }

    /// Checks that every rank passes the same `value` of `what` (each rank's backend, say):
    /// an error on every rank names the ranks that differ from rank 0.
    pub fn agree(&self, what: &str, value: &str) -> Result<()> {
        let verdict = match self.gather_to_root(value.as_bytes())? {
            Some(all) => {
                let differing: Vec<String> = all
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| v.as_slice() != value.as_bytes())
                    .map(|(rank, v)| format!("rank {rank} has {}", String::from_utf8_lossy(v)))
                    .collect();
                let verdict = if differing.is_empty() {
                    String::new()
                } else {
                    format!(
                        "every rank needs the same {what}; rank 0 has {value}, {}",
                        differing.join(", ")
                    )
                };
                self.share_from_root(verdict.as_bytes())?
            }
            None => self.share_from_root(&[])?,
        };
        if verdict.is_empty() {
            Ok(())
        } else {
            Err(collective_error(String::from_utf8_lossy(&verdict)))
        }
    }

    /// Watches the other ranks from background threads: when one stops before the run
    /// ends, `on_failure` is called once with a line that names it. The caller decides what
    /// a failure does; `tessera train` ends the worker, since collectives already queued
    /// would wait for the lost rank for ever.
    pub fn watch(&self, on_failure: Arc<dyn Fn(String) + Send + Sync>) -> Result<()> {
        let links = lock(&self.liveness);
        for (i, link) in links.iter().enumerate() {
            let mut reader = link
                .try_clone()
                .map_err(|e| io_error("watching the other ranks", e))?;
            let (root, finished, all, on_failure) = (
                self.rank == 0,
                self.finished.clone(),
                self.liveness.clone(),
                on_failure.clone(),
            );
            std::thread::spawn(move || {
                let mut word = [0u8; 1];
                let stopped = match reader.read(&mut word) {
                    Ok(1) if word[0] == FINISHED => return,
                    Ok(1) if word[0] == STOPPED && !root => {
                        let mut rank = [0u8; 4];
                        match reader.read_exact(&mut rank) {
                            Ok(()) => u32::from_le_bytes(rank) as usize,
                            Err(_) => 0,
                        }
                    }
                    _ => {
                        if root {
                            i + 1
                        } else {
                            0
                        }
                    }
                };
                if finished.load(Ordering::SeqCst) {
                    return;
                }
                if root {
                    let mut word = vec![STOPPED];
                    word.extend((stopped as u32).to_le_bytes());
                    for (j, link) in lock(&all).iter_mut().enumerate() {
                        if j != i {
                            let _ = link.write_all(&word);
                        }
                    }
                }
                on_failure(format!("rank {stopped} stopped before the run ended"));
            });
        }
        Ok(())
    }

    /// Tells the other ranks that this one ends normally: its links closing is no failure.
    pub fn finish(&self) {
        self.finished.store(true, Ordering::SeqCst);
        for link in lock(&self.liveness).iter_mut() {
            let _ = link.write_all(&[FINISHED]);
        }
    }
}

/// The error of a lost data link to `rank`.
fn lost(rank: usize, e: std::io::Error) -> crate::Error {
    crate::Error::RankLost {
        rank,
        detail: e.to_string(),
    }
}

fn write_frame(link: &mut TcpStream, bytes: &[u8]) -> std::io::Result<()> {
    link.write_all(&(bytes.len() as u64).to_le_bytes())?;
    link.write_all(bytes)
}

fn read_frame(link: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 8];
    link.read_exact(&mut len)?;
    let len = usize::try_from(u64::from_le_bytes(len))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let mut out = vec![0u8; len];
    link.read_exact(&mut out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A free port on the loopback interface.
    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn world(n: usize) -> Vec<Arc<Rendezvous>> {
        let port = free_port();
        let handles: Vec<_> = (0..n)
            .map(|rank| {
                let env = DistEnv {
                    rank,
                    world_size: n,
                    local_rank: rank,
                    master_addr: "127.0.0.1".into(),
                    master_port: port,
                };
                std::thread::spawn(move || Rendezvous::connect(&env, Duration::from_secs(20)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    }

    /// What `f` returns on each rank, run on a thread per rank, by rank.
    fn on_every_rank<T: Send + 'static>(
        ranks: &[Arc<Rendezvous>],
        f: fn(&Rendezvous) -> T,
    ) -> Vec<T> {
        let handles: Vec<_> = ranks
            .iter()
            .cloned()
            .map(|r| std::thread::spawn(move || f(&r)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    }

    #[test]
    fn ranks_share_and_gather_bytes() {
        let results = on_every_rank(&world(3), |r| {
            let shared = r.share_from_root(&[r.rank() as u8 + 10]).unwrap();
            let gathered = r.gather_to_root(&[r.rank() as u8; 3]).unwrap();
            (shared, gathered)
        });
        for (shared, _) in &results {
            assert_eq!(shared, &[10]);
        }
        assert_eq!(
            results[0].1,
            Some(vec![vec![0, 0, 0], vec![1, 1, 1], vec![2, 2, 2]])
        );
        assert_eq!(results[1].1, None);
    }

    #[test]
    fn ranks_that_disagree_are_named() {
        let results = on_every_rank(&world(3), |r| {
            let backend = if r.rank() == 2 { "cpu" } else { "cuda" };
            r.agree("backend", backend).map_err(|e| e.to_string())
        });
        for result in results {
            let err = result.unwrap_err();
            assert!(err.contains("rank 2 has cpu"), "{err}");
        }
    }

    #[test]
    fn a_rank_that_stops_early_is_named_to_every_other_rank() {
        let mut ranks = world(3);
        let (tx, rx) = mpsc::channel();
        for r in &ranks[..2] {
            let tx = Mutex::new(tx.clone());
            let me = r.rank();
            r.watch(Arc::new(move |why| {
                let _ = lock(&tx).send((me, why));
            }))
            .unwrap();
        }
        // Rank 2 goes away without finishing: its links close.
        drop(ranks.pop());
        let mut heard: Vec<(usize, String)> = (0..2)
            .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
            .collect();
        heard.sort();
        assert_eq!(
            heard,
            vec![
                (0, "rank 2 stopped before the run ended".to_string()),
                (1, "rank 2 stopped before the run ended".to_string()),
            ]
        );
    }

    #[test]
    fn ranks_that_finish_are_no_failure() {
        let ranks = world(2);
        let (tx, rx) = mpsc::channel::<String>();
        for r in &ranks {
            let tx = Mutex::new(tx.clone());
            r.watch(Arc::new(move |why| {
                let _ = lock(&tx).send(why);
            }))
            .unwrap();
        }
        for r in &ranks {
            r.finish();
        }
        drop(ranks);
        assert!(rx.recv_timeout(Duration::from_millis(500)).is_err());
    }
}
