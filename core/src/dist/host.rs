//! Collectives for devices whose memory the host reads directly (the CPU): tensors travel
//! over the rendezvous links, and rank 0 adds them.

use std::sync::Arc;

use super::{check_contiguous, collective_error, Collective, Rendezvous};
use crate::{decode_f64, encode_f64, Device, Error, Result, TensorRef};

/// All-reduce and broadcast through rank 0 over TCP: each rank's tensors go to rank 0,
/// which adds them in rank order (in f64, rounded once to the dtype) and sends the sums
/// back. Simple and exact rather than fast; it is what the CPU device offers, so data
/// parallelism runs and is tested on machines without a GPU.
#[derive(Debug)]
pub struct HostCollective {
    device: Arc<dyn Device>,
    rendezvous: Arc<Rendezvous>,
}

impl HostCollective {
    pub fn new(device: Arc<dyn Device>, rendezvous: Arc<Rendezvous>) -> HostCollective {
        HostCollective { device, rendezvous }
    }

    /// The bytes of every tensor, one after the other.
    fn read_all(&self, op: &str, tensors: &[TensorRef<'_>]) -> Result<Vec<u8>> {
        let mut bytes = Vec::new();
        for t in tensors {
            let (offset, len) = span(op, t)?;
            let mut part = vec![0u8; len];
            self.device.read(t.buffer, offset, &mut part)?;
            bytes.extend(part);
        }
        Ok(bytes)
    }

    /// Writes `bytes` (as [`HostCollective::read_all`] lays them out) back into the tensors.
    fn write_all(&self, op: &str, tensors: &[TensorRef<'_>], bytes: &[u8]) -> Result<()> {
        let mut at = 0;
        for t in tensors {
            let (offset, len) = span(op, t)?;
            let part = bytes.get(at..at + len).ok_or_else(|| {
                collective_error(format!("{op}: the ranks' tensors differ in size"))
            })?;
            self.device.write(t.buffer, offset, part)?;
            at += len;
        }
        Ok(())
    }
}

/// The byte offset and length of a contiguous tensor in its buffer.
fn span(op: &str, t: &TensorRef<'_>) -> Result<(usize, usize)> {
    check_contiguous(op, t)?;
    let size = t.dtype.size();
    Ok((t.layout.offset * size, t.layout.numel() * size))
}

impl Collective for HostCollective {
    fn rank(&self) -> usize {
        self.rendezvous.rank()
    }

    fn world_size(&self) -> usize {
        self.rendezvous.world_size()
    }

    fn all_reduce_sum(&self, tensors: &[TensorRef<'_>]) -> Result<()> {
        let op = "all_reduce_sum";
        let mine = self.read_all(op, tensors)?;
        let sums = match self.rendezvous.gather_to_root(&mine)? {
            Some(all) => {
                if all.iter().any(|b| b.len() != mine.len()) {
                    return Err(collective_error(format!(
                        "{op}: the ranks' tensors differ in size"
                    )));
                }
                let mut out = Vec::with_capacity(mine.len());
                let mut at = 0;
                for t in tensors {
                    let len = t.layout.numel() * t.dtype.size();
                    let mut sum = vec![0.0f64; t.layout.numel()];
                    for bytes in &all {
                        for (s, v) in sum
                            .iter_mut()
                            .zip(decode_f64(&bytes[at..at + len], t.dtype))
                        {
                            *s += v;
                        }
                    }
                    out.extend(encode_f64(&sum, t.dtype));
                    at += len;
                }
                self.rendezvous.share_from_root(&out)?
            }
            None => self.rendezvous.share_from_root(&[])?,
        };
        self.write_all(op, tensors, &sums)
    }

    fn broadcast(&self, tensors: &[TensorRef<'_>], root: usize) -> Result<()> {
        let op = "broadcast";
        if root >= self.world_size() {
            return Err(Error::invalid(
                op,
                format!("root {root} is not a rank of {}", self.world_size()),
            ));
        }
        let mine = self.read_all(op, tensors)?;
        let theirs = match self.rendezvous.gather_to_root(&mine)? {
            Some(mut all) => self.rendezvous.share_from_root(&all.swap_remove(root))?,
            None => self.rendezvous.share_from_root(&[])?,
        };
        if self.rank() != root {
            self.write_all(op, tensors, &theirs)?;
        }
        Ok(())
    }

    fn wait(&self) -> Result<()> {
        Ok(())
    }

    fn barrier(&self) -> Result<()> {
        self.device.synchronize()?;
        self.rendezvous.gather_to_root(&[])?;
        self.rendezvous.share_from_root(&[])?;
        Ok(())
    }
}
