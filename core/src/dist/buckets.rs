//! Gradients reduced in buckets while the backward pass goes on, as PyTorch's DDP does.

use std::sync::Arc;

use super::Collective;
use crate::{Result, Tensor};

/// The bytes of gradients reduced together by default: PyTorch DDP's bucket size. Fewer,
/// larger buckets cost fewer launches; smaller ones start reducing earlier in the pass.
pub const BUCKET_BYTES: usize = 25 << 20;

/// Gradients as they become ready, all-reduced (summed) in buckets of at least
/// `bucket_bytes` each (the last may be smaller), in the order they were pushed (the same
/// on every rank).
pub struct GradientBuckets {
    collective: Arc<dyn Collective>,
    bucket_bytes: usize,
    filling: Vec<Tensor>,
    bytes: usize,
    /// Gradients whose reduction has started, kept alive until [`GradientBuckets::finish`].
    started: Vec<Tensor>,
}

impl GradientBuckets {
    pub fn new(collective: Arc<dyn Collective>, bucket_bytes: usize) -> GradientBuckets {
        GradientBuckets {
            collective,
            bucket_bytes,
            filling: Vec::new(),
            bytes: 0,
            started: Vec::new(),
        }
    }

    /// Adds a finished gradient (contiguous); starts reducing the bucket once it is full.
    pub fn push(&mut self, gradient: Tensor) -> Result<()> {
        self.bytes += gradient.numel() * gradient.dtype().size();
        self.filling.push(gradient);
        if self.bytes >= self.bucket_bytes {
            self.start()?;
        }
        Ok(())
    }

    fn start(&mut self) -> Result<()> {
        if self.filling.is_empty() {
            return Ok(());
        }
        let refs: Vec<_> = self.filling.iter().map(Tensor::as_ref).collect();
        self.collective.all_reduce_sum(&refs)?;
        self.started.append(&mut self.filling);
        self.bytes = 0;
        Ok(())
    }

    /// Reduces what is left with the rest, and makes work queued from now on wait for every
    /// reduction: the gradients hold the sums over all ranks.
    pub fn finish(mut self) -> Result<()> {
        self.start()?;
        self.collective.wait()
    }
}
