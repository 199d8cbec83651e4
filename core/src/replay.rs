//! Steps recorded once and replayed (DESIGN §3): a decoding step or a training step whose
//! launches are the same every time, queued by one replay of the device's recording instead
//! of one host call per kernel.
//!
//! A step talks to the rest of the program only through tensors that outlive it: it reads
//! its inputs and per-step values (token, position) from device buffers and writes its
//! results into device buffers with in-place ops (`copy_from`, `index_copy`). What the step
//! returns is dropped, so an eager step and a replayed one leave the same bits in the same
//! buffers. Devices that cannot record run every step eagerly.

use std::sync::Arc;

use crate::{Device, Error, Recording, Result};

/// A step run eagerly on its first call (which compiles its kernels and fills the memory
/// pool's cache), recorded on its second and replayed from then on, on devices that record
/// work; eagerly on every call elsewhere.
pub struct ReplayedStep {
    device: Arc<dyn Device>,
    state: State,
}

enum State {
    /// Before the first call.
    Warming,
    /// The next call is recorded.
    Warm,
    Recorded(Box<dyn Recording>),
    Eager,
}

impl ReplayedStep {
    /// A step on `device`, replayed where the device can record work.
    pub fn new(device: &Arc<dyn Device>) -> ReplayedStep {
        ReplayedStep {
            device: device.clone(),
            state: State::Warming,
        }
    }

    /// A step that always runs eagerly (a reference for replayed ones, say).
    pub fn eager(device: &Arc<dyn Device>) -> ReplayedStep {
        ReplayedStep {
            device: device.clone(),
            state: State::Eager,
        }
    }

    /// Whether calls from now on replay a recording.
    pub fn is_replayed(&self) -> bool {
        matches!(self.state, State::Recorded(_))
    }

    /// Runs one step: `step` queues its work on the device (eagerly, or into the recording
    /// on the second call), or the recording is replayed.
    pub fn run(&mut self, step: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        match &self.state {
            State::Recorded(recording) => recording.replay(),
            State::Eager => step(),
            State::Warming => {
                step()?;
                self.state = State::Warm;
                Ok(())
            }
            State::Warm => {
                match self.record(step) {
                    Ok(recording) => self.state = State::Recorded(recording),
                    Err(Error::Unsupported { .. }) => {
                        self.state = State::Eager;
                        step()?;
                    }
                    Err(e) => return Err(e),
                }
                Ok(())
            }
        }
    }

    /// Records `step` and replays it once: the second call's work.
    fn record(&self, step: &mut dyn FnMut() -> Result<()>) -> Result<Box<dyn Recording>> {
        // A recording keeps the memory its step allocates for as long as it lives; what the
        // eager step left cached goes back first, so the two are not held at once.
        self.device.empty_cache();
        self.device.begin_recording()?;
        let recorded = step();
        let recording = self.device.end_recording();
        recorded?;
        let recording = recording?;
        recording.replay()?;
        Ok(recording)
    }
}
