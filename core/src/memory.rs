//! The caching allocator every device uses (DESIGN §5).
//!
//! Requests round up to size classes with at most 1/8 waste. Freed blocks wait in per-class
//! free lists; a block is handed out again only once its owner says it is ready, which keeps
//! reuse ordered after the device's queued work: a backend whose queue runs every use of a
//! buffer in order (wgpu) says so at once, one without that guarantee waits until the queue
//! has passed the block's last use. `reserved` (in use plus cached) may
//! not pass the limit: the pool first returns cached blocks to the system, then fails with
//! [`Error::OutOfMemory`] and stays usable.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::{Error, MemoryStats, Result};

/// The size class of a request: a multiple of `2^(floor(log2 bytes) - 3)`, so at most 1/8
/// larger than the request, and a multiple of 4 bytes (GPU copies need it), so requests under
/// 32 bytes may round up by up to 3 bytes; at least 4 bytes.
pub fn size_class(bytes: usize) -> usize {
    let bytes = bytes.max(4);
    let log = usize::BITS - 1 - bytes.leading_zeros();
    let granule = 1usize << log.saturating_sub(3).max(2);
    bytes.div_ceil(granule) * granule
}

/// A caching pool of blocks of type `B` (a backend's raw allocation).
#[derive(Debug)]
pub struct Pool<B> {
    free: HashMap<usize, Vec<B>>,
    cached: usize,
    stats: MemoryStats,
    /// Whether a request its class cannot serve from the cache takes a ready block of up to
    /// twice its class before reserving a new one ([`Pool::for_recording`]).
    larger_blocks: bool,
}

impl<B> Default for Pool<B> {
    fn default() -> Self {
        Pool {
            free: HashMap::new(),
            cached: 0,
            stats: MemoryStats::default(),
            larger_blocks: false,
        }
    }
}

impl<B> Pool<B> {
    /// The pool of a recording (`Device::begin_recording`), which holds everything it
    /// reserves for as long as the recording lives, so what counts is its reservation, not
    /// what is in use: a request its own class cannot serve takes a ready block of up to
    /// twice its size before reserving one. The blocks a step frees late in its backward
    /// pass (activations) then serve what it allocates there (the parameters' gradients,
    /// sized otherwise).
    pub fn for_recording() -> Self {
        Pool {
            larger_blocks: true,
            ..Pool::default()
        }
    }

    /// Takes a ready cached block of `bytes`' class, or creates one with `create(class)`.
    /// Returns the block and its class (pass both back to [`Pool::release`]).
    pub fn alloc(
        &mut self,
        bytes: usize,
        ready: impl Fn(&B) -> bool,
        create: impl FnOnce(usize) -> Result<B>,
    ) -> Result<(B, usize)> {
        let class = size_class(bytes);
        self.stats.allocations += 1;
        if let Some(block) = self.take_cached(class, &ready) {
            return Ok((block, class));
        }
        if self.larger_blocks {
            let mut larger: Vec<usize> = self
                .free
                .keys()
                .copied()
                .filter(|&c| c > class && c <= 2 * class)
                .collect();
            larger.sort_unstable();
            for c in larger {
                if let Some(block) = self.take_cached(c, &ready) {
                    return Ok((block, c));
                }
            }
        }
        if let Some(limit) = self.stats.limit {
            if self.stats.reserved + class > limit {
                self.trim(&ready);
            }
            if self.stats.reserved + class > limit {
                self.stats.allocations -= 1;
                return Err(Error::OutOfMemory {
                    requested: bytes,
                    in_use: self.stats.in_use,
                    limit,
                });
            }
        }
        let block = create(class).inspect_err(|_| self.stats.allocations -= 1)?;
        self.stats.reserved += class;
        self.note_in_use(class);
        Ok((block, class))
    }

    /// A ready cached block of `class`, now in use.
    fn take_cached(&mut self, class: usize, ready: &impl Fn(&B) -> bool) -> Option<B> {
        let list = self.free.get_mut(&class)?;
        let pos = list.iter().position(ready)?;
        let block = list.swap_remove(pos);
        self.cached -= class;
        self.stats.reuses += 1;
        self.note_in_use(class);
        Some(block)
    }

    fn note_in_use(&mut self, class: usize) {
        self.stats.in_use += class;
        self.stats.peak = self.stats.peak.max(self.stats.in_use);
    }

    /// Returns a block to the cache.
    pub fn release(&mut self, block: B, class: usize) {
        self.stats.in_use -= class;
        self.cached += class;
        self.free.entry(class).or_default().push(block);
    }

    /// Drops cached blocks that are ready, returning their memory.
    pub fn trim(&mut self, ready: impl Fn(&B) -> bool) {
        for (class, list) in self.free.iter_mut() {
            let before = list.len();
            list.retain(|b| !ready(b));
            let freed = (before - list.len()) * class;
            self.cached -= freed;
            self.stats.reserved -= freed;
        }
        self.free.retain(|_, l| !l.is_empty());
    }

    pub fn set_limit(&mut self, limit: Option<usize>) {
        self.stats.limit = limit;
    }

    pub fn reset_peak(&mut self) {
        self.stats.peak = self.stats.in_use;
    }

    pub fn stats(&self) -> MemoryStats {
        self.stats.clone()
    }
}

/// The pools of a device's live recordings (`Device::begin_recording`): a recording's
/// allocations come from a pool of its own, whose memory it holds for as long as it lives.
/// The device's statistics count that memory as in use from the start of the peak's window
/// (a conservative peak).
#[derive(Debug)]
pub struct RecordingPools<B> {
    pools: Mutex<Vec<Weak<Mutex<Pool<B>>>>>,
}

impl<B> Default for RecordingPools<B> {
    fn default() -> Self {
        RecordingPools {
            pools: Mutex::new(Vec::new()),
        }
    }
}

impl<B> RecordingPools<B> {
    /// Counts `pool`'s memory for as long as something holds it.
    pub fn hold(&self, pool: &Arc<Mutex<Pool<B>>>) {
        let mut pools = self.pools.lock().unwrap_or_else(PoisonError::into_inner);
        pools.retain(|p| p.strong_count() > 0);
        pools.push(Arc::downgrade(pool));
    }

    /// `device`'s statistics with the memory the live recordings hold added.
    pub fn add_to(&self, mut device: MemoryStats) -> MemoryStats {
        let held: usize = self
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(Weak::upgrade)
            .map(|p| {
                p.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .stats()
                    .reserved
            })
            .sum();
        device.in_use += held;
        device.peak += held;
        device.reserved += held;
        device
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_waste_at_most_an_eighth() {
        for bytes in (1..5000).chain([1 << 20, (1 << 20) + 1, 123_456_789]) {
            let c = size_class(bytes);
            assert!(c >= bytes);
            assert!(
                c.is_multiple_of(4) && ((c - bytes.max(4)) * 8 <= bytes.max(4) || c - bytes < 4),
                "{bytes} -> {c}"
            );
        }
    }

    #[test]
    fn limit_gives_out_of_memory_and_pool_recovers() {
        let mut pool: Pool<Vec<u8>> = Pool::default();
        pool.set_limit(Some(1000));
        let (a, ca) = pool.alloc(600, |_| true, |c| Ok(vec![0; c])).unwrap();
        let err = pool.alloc(600, |_| true, |c| Ok(vec![0; c])).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { requested: 600, .. }));
        pool.release(a, ca);
        let (b, _) = pool.alloc(600, |_| true, |c| Ok(vec![0; c])).unwrap();
        assert_eq!(b.len(), ca);
        assert_eq!(pool.stats().reuses, 1);
    }

    /// A recording's pool serves a request from a cached block of up to twice its class
    /// (counted at the block's class) before reserving; a device's pool only from its own
    /// class, and neither from a block more than twice as large.
    #[test]
    fn recording_pools_reuse_blocks_up_to_twice_the_size() {
        let create = |c: usize| Ok(vec![0u8; c]);
        for (mut pool, reuses) in [(Pool::for_recording(), true), (Pool::default(), false)] {
            let (big, big_class) = pool.alloc(1 << 20, |_| true, create).unwrap();
            pool.release(big, big_class);
            let (small, small_class) = pool.alloc(600 << 10, |_| true, create).unwrap();
            assert_eq!(small.len() == big_class, reuses);
            assert_eq!(small_class, small.len());
            assert_eq!(pool.stats().in_use, small_class);
            let reserved = if reuses {
                big_class
            } else {
                big_class + small_class
            };
            assert_eq!(pool.stats().reserved, reserved);
            pool.release(small, small_class);
            let (tiny, tiny_class) = pool.alloc(100 << 10, |_| true, create).unwrap();
            assert_eq!(tiny.len(), tiny_class);
            assert!(tiny_class < 200 << 10);
        }
    }
}
