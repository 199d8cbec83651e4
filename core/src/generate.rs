//! Autoregressive generation with a KV cache.

use crate::models::Transformer;
use crate::nn::KvCache;
use crate::rng::RngState;
use crate::{DType, Error, Op, PendingVec, ReplayedStep, Result, Tensor};

/// How the next token is chosen. `temperature == 0` is greedy (argmax on the device); otherwise
/// logits are divided by the temperature, cut to the `top_k` most likely tokens and to the
/// smallest set whose probability reaches `top_p`, and sampled with the keyed generator.
#[derive(Clone, Debug, PartialEq)]
pub struct Sampling {
    pub temperature: f64,
    pub top_k: Option<usize>,
    pub top_p: Option<f64>,
}

impl Sampling {
    pub fn greedy() -> Self {
        Sampling {
            temperature: 0.0,
            top_k: None,
            top_p: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(Error::invalid(
                "generate",
                format!("temperature must be >= 0; got {}", self.temperature),
            ));
        }
        if self.top_k == Some(0) {
            return Err(Error::invalid("generate", "top_k must be at least 1"));
        }
        if let Some(p) = self.top_p {
            if !(p > 0.0 && p <= 1.0) {
                return Err(Error::invalid(
                    "generate",
                    format!("top_p must be in (0, 1]; got {p}"),
                ));
            }
        }
        Ok(())
    }

    /// Picks a token from one row of logits on the host.
    pub fn pick(&self, logits: &[f64], rng: &mut RngState) -> u32 {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if self.temperature == 0.0 {
            return order[0] as u32;
        }
        if let Some(k) = self.top_k {
            order.truncate(k.max(1));
        }
        let top = logits[order[0]];
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| ((logits[i] - top) / self.temperature).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if let Some(top_p) = self.top_p {
            let mut mass = 0.0;
            let keep = probs.iter().position(|&p| {
                mass += p;
                mass >= top_p
            });
            let keep = keep.map_or(probs.len(), |i| i + 1);
            order.truncate(keep);
            probs.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|p| *p /= total);
        }
        let mut u = rng.next_f64();
        for (&i, &p) in order.iter().zip(&probs) {
            if u < p {
                return i as u32;
            }
            u -= p;
        }
        order[order.len() - 1] as u32
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct GenerateOptions {
    pub max_new_tokens: usize,
    pub sampling: Sampling,
    /// Generation stops after producing any of these (which is kept in the output).
    pub stop_tokens: Vec<u32>,
}

/// Continues `prompt` with up to `max_new_tokens` tokens, calling `on_token` with each new
/// token as soon as it reaches the host (streaming; greedy decoding reads a token back while
/// the next step runs). Returns the prompt followed by the new tokens. Stops early at a stop
/// token or at the model's last position.
pub fn generate(
    model: &Transformer,
    prompt: &[u32],
    options: &GenerateOptions,
    rng: &mut RngState,
    on_token: &mut dyn FnMut(u32),
) -> Result<Vec<u32>> {
    options.sampling.validate()?;
    let vocab = model.config.vocab_size;
    if prompt.is_empty() {
        return Err(Error::invalid(
            "generate",
            "the prompt must hold at least one token",
        ));
    }
    if prompt.len() > model.config.max_positions {
        return Err(Error::invalid(
            "generate",
            format!(
                "the prompt has {} tokens; the model reads at most {}",
                prompt.len(),
                model.config.max_positions
            ),
        ));
    }
    if let Some(&bad) = prompt.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::Index {
            op: "generate".into(),
            index: bad as isize,
            size: vocab,
            shape: vec![prompt.len()],
        });
    }
    let _guard = crate::no_grad();
    if options.sampling.temperature == 0.0 {
        return generate_greedy(model, prompt, options, on_token);
    }
    let device = model.device();
    let mut cache = KvCache::new(model.blocks.len());
    let mut out = prompt.to_vec();
    let mut next_input: Vec<u32> = prompt.to_vec();
    for _ in 0..options.max_new_tokens {
        if cache.len() + next_input.len() > model.config.max_positions {
            break;
        }
        let ids = Tensor::from_slice(&next_input, &[1, next_input.len()], device)?;
        let logits = model.forward(&ids, Some(&mut cache))?;
        let row = logits.select(1, -1)?.to_vec_f64()?;
        let token = options.sampling.pick(&row, rng);
        out.push(token);
        on_token(token);
        if options.stop_tokens.contains(&token) {
            break;
        }
        next_input = vec![token];
    }
    Ok(out)
}

/// Greedy decoding with every step's work the same: the prompt fills a KV cache of fixed
/// capacity, then each step reads its token and position from device tensors, writes the
/// next token and position back into them, and is replayed where the device records work
/// ([`ReplayedStep`]): one launch per token instead of one per kernel. The chosen token is
/// read back one step late, while the next step runs, so a stop token is seen after one more
/// step has been queued, whose result is dropped.
fn generate_greedy(
    model: &Transformer,
    prompt: &[u32],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(u32),
) -> Result<Vec<u32>> {
    let mut step = ReplayedStep::new(model.device());
    greedy_steps(model, prompt, options, on_token, &mut step)
}

/// Greedy decoding as `generate_greedy` runs it (every step's work the same, replayed where
/// the device records work), with the decoding step run by `step` (replayed, or eager for a
/// reference).
pub fn greedy_steps(
    model: &Transformer,
    prompt: &[u32],
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(u32),
    step: &mut ReplayedStep,
) -> Result<Vec<u32>> {
    let device = model.device();
    let mut out = prompt.to_vec();
    if options.max_new_tokens == 0 {
        return Ok(out);
    }
    // Every new token but the last is fed back at the next position.
    let capacity = (prompt.len() + options.max_new_tokens - 1).min(model.config.max_positions);
    let new_tokens = options
        .max_new_tokens
        .min(model.config.max_positions + 1 - prompt.len());
    let mut cache = KvCache::with_capacity(model.blocks.len(), capacity);
    let ids = Tensor::from_slice(prompt, &[1, prompt.len()], device)?;
    let logits = model.forward(&ids, Some(&mut cache))?;
    // The token as argmax leaves it (i32, which the embedding takes), each step's written in
    // place over the last one's.
    let token = logits.select(1, -1)?.argmax(-1, true)?;
    let argmax = Op::ArgMax {
        axis: 1,
        keepdim: true,
    };
    // The position as f32 (exact to 2^24), since the catalog adds floats only, and as the i32
    // the model reads. A step computes the next position beside its embeddings and writes both
    // forms of it after its argmax, so none of these launches waits for another (each wait
    // between dependent launches costs a few microseconds on GPUs, whatever they do).
    let position = Tensor::full(&[1], prompt.len() as f64, DType::F32, device)?;
    let at = position.to_dtype(DType::I32)?;
    let cast = Op::Cast { to: DType::I32 };
    let mut pending = token.to_vec_later::<i32>()?;
    let mut decode = || -> Result<()> {
        let next = position.add_scalar(1.0)?;
        let logits = model.forward_at(&token, &at, &mut cache)?;
        Tensor::apply_in_place(&argmax, &[&logits.select(1, -1)?], &[&token], &[])?;
        Tensor::apply_in_place(&cast, &[&next], &[&at], &[])?;
        position.copy_from(&next)
    };
    for _ in 1..new_tokens {
        step.run(&mut decode)?;
        let read = std::mem::replace(&mut pending, token.to_vec_later::<i32>()?);
        if emit(read, &mut out, options, on_token)? {
            return Ok(out);
        }
    }
    emit(pending, &mut out, options, on_token)?;
    Ok(out)
}

/// Appends a token read from the device and reports it; true at a stop token.
fn emit(
    read: PendingVec<i32>,
    out: &mut Vec<u32>,
    options: &GenerateOptions,
    on_token: &mut dyn FnMut(u32),
) -> Result<bool> {
    let index = read.wait()?[0];
    let token = u32::try_from(index)
        .map_err(|_| Error::invalid("generate", format!("argmax returned {index}")))?;
    out.push(token);
    on_token(token);
    Ok(options.stop_tokens.contains(&token))
}

/// Greedy continuation of equal-length prompts as one batch: `new_tokens` tokens each, chosen
/// by argmax on the device with a KV cache. Used to score held-out problems quickly.
pub fn greedy_batch(
    model: &Transformer,
    prompts: &[Vec<u32>],
    new_tokens: usize,
) -> Result<Vec<Vec<u32>>> {
    let Some(first) = prompts.first() else {
        return Ok(Vec::new());
    };
    let len = first.len();
    if len == 0 || prompts.iter().any(|p| p.len() != len) {
        return Err(Error::invalid(
            "greedy_batch",
            "prompts must be non-empty and of one length",
        ));
    }
    let _guard = crate::no_grad();
    let device = model.device();
    let n = prompts.len();
    let mut cache = KvCache::new(model.blocks.len());
    let flat: Vec<u32> = prompts.concat();
    let mut ids = Tensor::from_slice(&flat, &[n, len], device)?;
    let mut out = vec![Vec::with_capacity(new_tokens); n];
    for _ in 0..new_tokens {
        let logits = model.forward(&ids, Some(&mut cache))?;
        let next = logits.select(1, -1)?.argmax(-1, true)?;
        for (row, t) in out.iter_mut().zip(next.to_vec::<i32>()?) {
            row.push(t as u32);
        }
        ids = next.to_dtype(DType::U32)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_first_maximum() {
        let mut rng = RngState::new(0);
        assert_eq!(Sampling::greedy().pick(&[0.1, 3.0, 3.0, -1.0], &mut rng), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let mut rng = RngState::new(7);
        let s = Sampling {
            temperature: 5.0,
            top_k: Some(1),
            top_p: None,
        };
        for _ in 0..20 {
            assert_eq!(s.pick(&[0.0, 2.0, 1.0], &mut rng), 1);
        }
    }

    #[test]
    fn top_p_keeps_the_nucleus() {
        let mut rng = RngState::new(3);
        let s = Sampling {
            temperature: 1.0,
            top_k: None,
            top_p: Some(0.5),
        };
        let logits = [10.0, 0.0, 0.0, 0.0];
        for _ in 0..20 {
            assert_eq!(s.pick(&logits, &mut rng), 0);
        }
    }
}
