//! Learning-rate schedules and dynamic loss scaling.

/// Linear warmup to `peak`, then cosine decay to `min_lr` at `total` steps (constant after).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Schedule {
    pub peak: f64,
    pub min_lr: f64,
    pub warmup: u64,
    pub total: u64,
}

impl Schedule {
    pub fn constant(lr: f64) -> Self {
        Schedule {
            peak: lr,
            min_lr: lr,
            warmup: 0,
            total: 0,
        }
    }

    /// The learning rate for update number `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        if step >= self.total || self.total <= self.warmup {
            return if self.total > self.warmup {
                self.min_lr
            } else {
                self.peak
            };
        }
        let progress = (step - self.warmup) as f64 / (self.total - self.warmup) as f64;
        self.min_lr
            + 0.5 * (self.peak - self.min_lr) * (1.0 + (std::f64::consts::PI * progress).cos())
    }
}

/// Dynamic loss scaling for f16 training: the loss is multiplied by `scale` before backward;
/// a step whose gradients are not finite is skipped and the scale halves; after `interval`
/// good steps in a row the scale doubles.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScaler {
    pub scale: f64,
    pub interval: u64,
    good_steps: u64,
    pub skipped: u64,
}

impl LossScaler {
    pub fn new(initial: f64, interval: u64) -> Self {
        LossScaler {
            scale: initial,
            interval,
            good_steps: 0,
            skipped: 0,
        }
    }

    /// Records whether the last gradients were finite; returns whether to apply the step.
    pub fn update(&mut self, finite: bool) -> bool {
        if finite {
            self.good_steps += 1;
            if self.good_steps >= self.interval {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        } else {
            self.scale = (self.scale / 2.0).max(1.0);
            self.good_steps = 0;
            self.skipped += 1;
        }
        finite
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warmup_then_cosine() {
        let s = Schedule {
            peak: 1.0,
            min_lr: 0.1,
            warmup: 10,
            total: 110,
        };
        assert!((s.lr(0) - 0.1).abs() < 1e-12);
        assert!((s.lr(9) - 1.0).abs() < 1e-12);
        assert!((s.lr(10) - 1.0).abs() < 1e-12);
        assert!((s.lr(60) - 0.55).abs() < 1e-12);
        assert!((s.lr(110) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn loss_scaler_halves_on_overflow_and_grows_after_interval() {
        let mut s = LossScaler::new(1024.0, 2);
        assert!(!s.update(false));
        assert_eq!((s.scale, s.skipped), (512.0, 1));
        assert!(s.update(true));
        assert!(s.update(true));
        assert_eq!(s.scale, 1024.0);
    }
}
