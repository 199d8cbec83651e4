//! Gradient clipping by global norm, on the device.

use super::ParamGroup;
use crate::{DType, Error, Result, Tensor};

/// The global L2 norm of every gradient and the factor `min(1, max_norm / (norm + 1e-6))`
/// that clips it, both `[1]` f32 tensors on the device: pass the factor to
/// [`super::Optimizer::step`] as `grad_scale`. Nothing is read back to the host.
/// `inv_loss_scale` multiplies gradients first (loss-scale removal; 1 when unused).
pub fn clip_grad_norm(
    groups: &[ParamGroup],
    max_norm: f64,
    inv_loss_scale: f64,
) -> Result<(Tensor, Tensor)> {
    let _guard = crate::no_grad();
    let grads: Vec<Vec<Tensor>> = groups
        .iter()
        .map(|g| g.params.iter().filter_map(|(_, p)| p.grad()).collect())
        .collect();
    let first = grads
        .iter()
        .flatten()
        .next()
        .ok_or_else(|| Error::invalid("clip_grad_norm", "no parameter has a gradient"))?;
    let device = first.device().clone();
    let by_dtype = |d: DType| -> Result<Option<Tensor>> {
        // A group's gradients packed back to back are summed as one tensor.
        let mut parts = Vec::new();
        for group in &grads {
            let same: Vec<&Tensor> = group.iter().filter(|g| g.dtype() == d).collect();
            match Tensor::span(&same) {
                Some(all) => parts.push(all),
                None => parts.extend(same.into_iter().cloned()),
            }
        }
        if parts.is_empty() {
            return Ok(None);
        }
        let parts: Vec<&Tensor> = parts.iter().collect();
        Ok(Some(Tensor::squared_norm(&parts)?.to_dtype(DType::F32)?))
    };
    let mut total = Tensor::zeros(&[1], DType::F32, &device)?;
    for d in DType::FLOATS {
        if let Some(s) = by_dtype(d)? {
            total = total.add(&s)?;
        }
    }
    let norm = total.sqrt()?.mul_scalar(inv_loss_scale)?;
    let limit = Tensor::full(&[1], max_norm, DType::F32, &device)?;
    let factor =
        limit
            .div(&norm.add_scalar(1e-6)?)?
            .minimum(&Tensor::ones(&[1], DType::F32, &device)?)?;
    Ok((norm, factor.mul_scalar(inv_loss_scale)?))
}
