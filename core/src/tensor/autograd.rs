//! Define-by-run reverse-mode autograd, written once for every backend.
//!
//! A tensor computed from inputs that require gradients carries a [`Node`]: its inputs' nodes
//! (or the leaves themselves) and a function from the output's gradient to the inputs'
//! gradients, expressed in catalog ops so it runs on the same device. [`Tensor::backward`]
//! walks the nodes in reverse topological order on one thread and adds gradients into
//! leaves, where they accumulate until [`Tensor::zero_grad`]. Recording stops inside
//! [`no_grad`] scopes; the depth is per thread, like PyTorch's grad mode.
//!
//! Memory follows PyTorch's rules: a node keeps the storage of only the inputs and outputs
//! its backward reads ([`backward_reads`]), and drops them when that backward runs, so a
//! graph is backpropagated once.
//!
//! A narrow's gradient is its source's zeros with the slice written in. Where several
//! narrows of one tensor meet (a fused QKV projection split three ways), the later slices
//! are copied into the first one's zeros rather than each padded to full size and added: one
//! fill and three copies instead of three fills and two full-size additions.

use std::cell::Cell;
use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use super::Tensor;
use crate::{BinaryOp, CompareOp, DType, Error, Op, ReduceOp, Result};

type BackwardFn = dyn FnOnce(&Tensor) -> Result<Vec<Option<Tensor>>> + Send;

pub(crate) struct Node {
    inputs: Vec<Input>,
    /// Taken when the backward pass runs it, which frees the tensors it saved (PyTorch's
    /// rule without `retain_graph`): the pass's memory shrinks as it goes.
    backward: Mutex<Option<Box<BackwardFn>>>,
    name: String,
    /// Where a narrow view lies in its source; its backward then returns the slice's gradient
    /// as is, and the accumulation places it.
    narrow: Option<Narrowed>,
}

/// What the backward walk needs of one of a node's inputs. Not its storage: an
/// intermediate tensor is freed as soon as nothing reads it any more, and a backward that
/// reads one saves it itself ([`record`]).
enum Input {
    /// Takes no gradient.
    Constant,
    /// Computed by another node.
    Computed {
        node: Arc<Node>,
        shape: Vec<usize>,
        dtype: DType,
    },
    /// A leaf that takes gradients (a parameter), where they accumulate.
    Leaf(Tensor),
}

impl Input {
    fn of(t: &Tensor) -> Input {
        if !t.0.requires_grad {
            return Input::Constant;
        }
        match &t.0.node {
            Some(node) => Input::Computed {
                node: node.clone(),
                shape: t.shape().to_vec(),
                dtype: t.dtype(),
            },
            None => Input::Leaf(t.clone()),
        }
    }

    fn leaf(&self) -> Option<&Tensor> {
        match self {
            Input::Leaf(t) => Some(t),
            _ => None,
        }
    }

    fn node(&self) -> Option<&Arc<Node>> {
        match self {
            Input::Computed { node, .. } => Some(node),
            _ => None,
        }
    }
}

/// A narrow view's place in its source.
struct Narrowed {
    src_shape: Vec<usize>,
    axis: usize,
    start: usize,
}

/// The slices written so far into a gradient that narrows' gradients alone have formed (a
/// buffer of this backward pass, zeros elsewhere): along `axis`, `(start, len)` ranges.
struct Slices {
    axis: usize,
    ranges: Vec<(usize, usize)>,
}

thread_local! {
    static NO_GRAD_DEPTH: Cell<usize> = const { Cell::new(0) };
}

/// Disables recording on this thread until dropped.
pub struct NoGradGuard(());

impl Drop for NoGradGuard {
    fn drop(&mut self) {
        NO_GRAD_DEPTH.with(|d| d.set(d.get() - 1));
    }
}

/// Starts a scope in which no op is recorded: `let _guard = no_grad();`.
pub fn no_grad() -> NoGradGuard {
    NO_GRAD_DEPTH.with(|d| d.set(d.get() + 1));
    NoGradGuard(())
}

pub fn is_grad_enabled() -> bool {
    NO_GRAD_DEPTH.with(|d| d.get() == 0)
}

fn attach(out: Tensor, inputs: &[&Tensor], name: String, backward: Box<BackwardFn>) -> Tensor {
    let node = Node {
        inputs: inputs.iter().map(|t| Input::of(t)).collect(),
        backward: Mutex::new(Some(backward)),
        name,
        narrow: None,
    };
    out.with_node(Some(Arc::new(node)))
}

fn wants_grad(inputs: &[&Tensor]) -> bool {
    is_grad_enabled() && inputs.iter().any(|t| t.0.requires_grad)
}

/// Attaches the backward of `op` to its first output when gradients are wanted.
pub(super) fn record(
    op: &Op,
    inputs: &[&Tensor],
    scalars: &[f64],
    mut outputs: Vec<Tensor>,
) -> Result<Vec<Tensor>> {
    if !op.differentiable() || !wants_grad(inputs) || outputs.is_empty() {
        return Ok(outputs);
    }
    // What the backward does not read is saved as its shape alone, so its storage is freed
    // once nothing else uses it. Outputs are saved without their history, so the graph
    // holds no cycle.
    let saved_inputs: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if backward_reads(op, Saved::Input(i)) {
                (*t).clone()
            } else {
                t.unsaved()
            }
        })
        .collect();
    let saved_outputs: Vec<Tensor> = outputs
        .iter()
        .enumerate()
        .map(|(i, t)| {
            if backward_reads(op, Saved::Output(i)) {
                t.detach()
            } else {
                t.unsaved()
            }
        })
        .collect();
    let wanted: Vec<bool> = inputs.iter().map(|t| t.0.requires_grad).collect();
    let (op_c, scalars) = (op.clone(), scalars.to_vec());
    let backward =
        Box::new(move |g: &Tensor| vjp(&op_c, &saved_inputs, &saved_outputs, &wanted, &scalars, g));
    let first = outputs.remove(0);
    outputs.insert(0, attach(first, inputs, op.name(), backward));
    Ok(outputs)
}

/// An input or output of an op, by position.
#[derive(Clone, Copy)]
enum Saved {
    Input(usize),
    Output(usize),
}

/// Whether [`vjp`] of `op` reads the data of `which` (not only its shape and dtype), which
/// must then live until the backward pass; PyTorch's autograd saves tensors by the same
/// rule. An op not listed keeps everything.
fn backward_reads(op: &Op, which: Saved) -> bool {
    use Saved::{Input as In, Output as Out};
    match (op, which) {
        (Op::Cast { .. } | Op::Copy | Op::Concat { .. }, _) => false,
        (Op::Unary(_), In(i)) => i == 0,
        (Op::Binary(b), which) => match (b, which) {
            (BinaryOp::Add | BinaryOp::Sub, _) => false,
            (BinaryOp::Mul | BinaryOp::Maximum | BinaryOp::Minimum, In(_)) => true,
            (BinaryOp::Div, In(i)) => i == 1,
            (BinaryOp::Pow, In(_)) => true,
            (BinaryOp::Div | BinaryOp::Pow, Out(i)) => i == 0,
            (_, Out(_)) => false,
        },
        (Op::Where, In(i)) => i == 0,
        (Op::SwiGlu, In(_)) => true,
        (Op::Reduce { op, .. }, which) => {
            matches!(op, ReduceOp::Max | ReduceOp::Min) && matches!(which, In(0) | Out(0))
        }
        (Op::Softmax | Op::LogSoftmax, Out(i)) => i == 0,
        (Op::Softmax | Op::LogSoftmax, In(_)) => false,
        (
            Op::Matmul {
                bias, activation, ..
            },
            In(i),
        ) => i < 2 || (i == 2 && *bias && activation.is_some()),
        (Op::Embedding | Op::Gather { .. }, In(i)) => i == 1,
        (Op::LayerNorm, In(i)) => i < 2,
        (Op::LayerNorm, Out(i)) => i == 1 || i == 2,
        (Op::RmsNorm, In(i)) => i < 2,
        (Op::RmsNorm, Out(i)) => i == 1,
        (Op::Rotary, In(i)) => i == 1 || i == 2,
        (Op::Attention { .. }, In(i)) => i < 3,
        (Op::Attention { .. }, Out(i)) => i < 2,
        (Op::CrossEntropy, In(i)) => i < 2,
        (Op::CrossEntropy, Out(i)) => i == 1,
        (Op::Conv2d { .. }, In(i)) => i < 2,
        (
            Op::Unary(_)
            | Op::Where
            | Op::SwiGlu
            | Op::Matmul { .. }
            | Op::Embedding
            | Op::Gather { .. }
            | Op::Rotary
            | Op::Conv2d { .. },
            Out(_),
        ) => false,
        _ => true,
    }
}

/// Views that carry gradients back to their source.
pub(super) enum ViewKind {
    Reshape,
    Transpose(usize, usize),
    Permute(Vec<usize>),
    Narrow { axis: usize, start: usize },
    Expand,
}

pub(super) fn record_view(out: Tensor, src: &Tensor, kind: ViewKind) -> Result<Tensor> {
    if !wants_grad(&[src]) {
        return Ok(out);
    }
    let src_shape = src.shape().to_vec();
    if let ViewKind::Narrow { axis, start } = kind {
        // The slice's gradient goes back as is; `backward_with` places it.
        let node = Node {
            inputs: vec![Input::of(src)],
            backward: Mutex::new(Some(Box::new(|g: &Tensor| Ok(vec![Some(g.clone())])))),
            name: "view".into(),
            narrow: Some(Narrowed {
                src_shape,
                axis,
                start,
            }),
        };
        return Ok(out.with_node(Some(Arc::new(node))));
    }
    let backward: Box<BackwardFn> = Box::new(move |g: &Tensor| {
        let gi = match &kind {
            ViewKind::Reshape => g.reshape(&src_shape)?,
            ViewKind::Transpose(a, b) => g.transpose(*a as isize, *b as isize)?,
            ViewKind::Permute(perm) => {
                let mut inverse = vec![0; perm.len()];
                for (i, &p) in perm.iter().enumerate() {
                    inverse[p] = i;
                }
                g.permute(&inverse)?
            }
            ViewKind::Narrow { .. } => unreachable!("narrows return above"),
            ViewKind::Expand => g.sum_to_shape(&src_shape)?,
        };
        Ok(vec![Some(gi)])
    });
    Ok(attach(out, &[src], "view".into(), backward))
}

impl Tensor {
    /// A leaf handle on the same storage that records gradients into [`Tensor::grad`].
    pub fn requires_grad(&self) -> Tensor {
        Tensor(Arc::new(super::Inner {
            buffer: self.0.buffer.clone(),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            node: None,
            requires_grad: true,
            grad: std::sync::Mutex::new(None),
        }))
    }

    /// Whether gradients flow into or through this tensor.
    pub fn tracks_grad(&self) -> bool {
        self.0.requires_grad
    }

    /// The accumulated gradient of a leaf.
    pub fn grad(&self) -> Option<Tensor> {
        self.0
            .grad
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the accumulated gradient (optimizers and gradient clipping use this).
    pub fn set_grad(&self, grad: Option<Tensor>) {
        *self.0.grad.lock().unwrap_or_else(|e| e.into_inner()) = grad;
    }

    /// Whether this leaf's gradient is held by the leaf alone: no other handle or view
    /// shares its storage (an add's backward passes one gradient to both its inputs), so it
    /// may be written in place while the backward pass goes on (by a hook of
    /// [`Tensor::backward_with_hooks`], say).
    pub fn grad_is_exclusive(&self) -> bool {
        let slot = self.0.grad.lock().unwrap_or_else(|e| e.into_inner());
        slot.as_ref()
            .is_some_and(|g| Arc::strong_count(&g.0) == 1 && Arc::strong_count(&g.0.buffer) == 1)
    }

    pub fn zero_grad(&self) {
        self.set_grad(None);
    }

    /// Backpropagates from a one-element tensor (seed 1).
    pub fn backward(&self) -> Result<()> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "backward",
                format!(
                    "needs a one-element tensor or an explicit gradient; shape {:?}",
                    self.shape()
                ),
            ));
        }
        let seed = Tensor::ones(self.shape(), self.dtype(), self.device())?;
        self.backward_with(&seed)
    }

    /// Backpropagates `grad` (the gradient of some scalar with respect to this tensor).
    pub fn backward_with(&self, grad: &Tensor) -> Result<()> {
        self.backward_with_hooks(grad, &[], &mut |_| Ok(()))
    }

    /// [`Tensor::backward_with`] that calls `ready(i)` as soon as `leaves[i]`'s gradient is
    /// complete for this pass (its last contribution added), while the rest of the pass is
    /// still to be queued: data-parallel training starts reducing gradients there, beside
    /// the rest of the backward pass. Each leaf is reported once, in an order that depends
    /// only on the graph (the same on every rank); leaves the pass does not reach are
    /// reported at its end.
    pub fn backward_with_hooks(
        &self,
        grad: &Tensor,
        leaves: &[Tensor],
        ready: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        let mut pending = PendingLeaves::new(leaves);
        self.backpropagate(grad, &mut pending, ready)?;
        pending.report_rest(ready)
    }

    fn backpropagate(
        &self,
        grad: &Tensor,
        pending: &mut PendingLeaves,
        ready: &mut dyn FnMut(usize) -> Result<()>,
    ) -> Result<()> {
        if !self.0.requires_grad {
            return Err(Error::invalid(
                "backward",
                "the tensor does not require gradients",
            ));
        }
        if grad.shape() != self.shape() || grad.dtype() != self.dtype() {
            return Err(Error::shape(
                "backward",
                format!(
                    "gradient {:?} {} does not match tensor {:?} {}",
                    grad.shape(),
                    grad.dtype(),
                    self.shape(),
                    self.dtype()
                ),
            ));
        }
        let _guard = no_grad();
        let Some(root) = self.0.node.clone() else {
            return accumulate_leaf(self, grad.clone());
        };
        let order = topological_order(&root);
        pending.count_uses(&order);
        let mut grads: HashMap<usize, Tensor> = HashMap::new();
        let mut sliced: HashMap<usize, Slices> = HashMap::new();
        grads.insert(node_id(&root), grad.clone());
        for node in order.iter().rev() {
            let Some(g) = grads.remove(&node_id(node)) else {
                pending.used_by(node, ready)?;
                continue;
            };
            sliced.remove(&node_id(node));
            let backward = node
                .backward
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take()
                .ok_or_else(|| {
                    Error::invalid(
                        "backward",
                        format!(
                            "the graph through {} was already backpropagated, which freed \
                             what it saved; run the forward pass again",
                            node.name
                        ),
                    )
                })?;
            let input_grads = backward(&g)?;
            for (input, gi) in node.inputs.iter().zip(input_grads) {
                let Some(gi) = gi else { continue };
                let (shape, dtype) = match input {
                    Input::Constant => continue,
                    Input::Computed { shape, dtype, .. } => (shape.as_slice(), *dtype),
                    Input::Leaf(t) => (t.shape(), t.dtype()),
                };
                let expected = match &node.narrow {
                    Some(_) => g.shape(),
                    None => shape,
                };
                if gi.shape() != expected || gi.dtype() != dtype {
                    return Err(Error::shape(
                        &node.name,
                        format!(
                            "backward produced {:?} {} for an input of {:?} {}",
                            gi.shape(),
                            gi.dtype(),
                            shape,
                            dtype
                        ),
                    ));
                }
                match input.node() {
                    Some(n) => {
                        let id = node_id(n);
                        let prev = grads.remove(&id);
                        let sum = match &node.narrow {
                            Some(at) => add_slice(prev, gi, at, sliced.entry(id))?,
                            None => {
                                sliced.remove(&id);
                                match prev {
                                    Some(prev) => prev.add(&gi)?,
                                    None => gi,
                                }
                            }
                        };
                        grads.insert(id, sum);
                    }
                    None => {
                        let gi = match &node.narrow {
                            Some(at) => gi.pad_into(&at.src_shape, at.axis, at.start)?,
                            None => gi,
                        };
                        if let Some(leaf) = input.leaf() {
                            accumulate_leaf(leaf, gi)?
                        }
                    }
                }
            }
            pending.used_by(node, ready)?;
        }
        Ok(())
    }
}

/// The leaves a backward pass reports as ready ([`Tensor::backward_with_hooks`]), with how
/// many of the graph's nodes still have to add to each one's gradient.
struct PendingLeaves {
    /// Leaf identity (its handle's address) to its index and remaining uses.
    leaves: HashMap<usize, (usize, usize)>,
    reported: Vec<bool>,
}

impl PendingLeaves {
    fn new(leaves: &[Tensor]) -> PendingLeaves {
        PendingLeaves {
            leaves: leaves
                .iter()
                .enumerate()
                .map(|(i, t)| (leaf_id(t), (i, 0)))
                .collect(),
            reported: vec![false; leaves.len()],
        }
    }

    fn count_uses(&mut self, order: &[Arc<Node>]) {
        for node in order {
            for input in node.inputs.iter().filter_map(Input::leaf) {
                if let Some((_, uses)) = self.leaves.get_mut(&leaf_id(input)) {
                    *uses += 1;
                }
            }
        }
    }

    /// `node` is done: the leaves among its inputs have one use fewer to wait for.
    fn used_by(&mut self, node: &Node, ready: &mut dyn FnMut(usize) -> Result<()>) -> Result<()> {
        for input in node.inputs.iter().filter_map(Input::leaf) {
            if let Some((index, uses)) = self.leaves.get_mut(&leaf_id(input)) {
                *uses = uses.saturating_sub(1);
                if *uses == 0 && !self.reported[*index] {
                    self.reported[*index] = true;
                    ready(*index)?;
                }
            }
        }
        Ok(())
    }

    /// Reports the leaves the pass did not reach, in index order.
    fn report_rest(&mut self, ready: &mut dyn FnMut(usize) -> Result<()>) -> Result<()> {
        for index in 0..self.reported.len() {
            if !self.reported[index] {
                self.reported[index] = true;
                ready(index)?;
            }
        }
        Ok(())
    }
}

fn leaf_id(t: &Tensor) -> usize {
    Arc::as_ptr(&t.0) as usize
}

/// Adds a narrow's gradient `slice` (placed `at`) to its source's gradient so far, `prev`:
/// written into `prev` where `prev` holds only other slices along the same axis, apart from
/// this one (`slices` says which); padded with zeros and added otherwise.
fn add_slice(
    prev: Option<Tensor>,
    slice: Tensor,
    at: &Narrowed,
    slices: Entry<'_, usize, Slices>,
) -> Result<Tensor> {
    let range = (at.start, slice.shape()[at.axis]);
    let apart = |ranges: &[(usize, usize)]| {
        ranges
            .iter()
            .all(|&(s, n)| s + n <= range.0 || range.0 + range.1 <= s)
    };
    match (prev, slices) {
        (None, Entry::Vacant(slot)) => {
            slot.insert(Slices {
                axis: at.axis,
                ranges: vec![range],
            });
            slice.pad_into(&at.src_shape, at.axis, at.start)
        }
        (Some(prev), Entry::Occupied(mut slot))
            if slot.get().axis == at.axis && apart(&slot.get().ranges) =>
        {
            let region = Tensor::from_parts(
                prev.buffer().clone(),
                prev.layout().narrow(at.axis, at.start, range.1),
                prev.dtype(),
                prev.device().clone(),
            );
            Tensor::apply_in_view(&Op::Copy, &slice, &region)?;
            slot.get_mut().ranges.push(range);
            Ok(prev)
        }
        (prev, slices) => {
            if let Entry::Occupied(slot) = slices {
                slot.remove();
            }
            let padded = slice.pad_into(&at.src_shape, at.axis, at.start)?;
            match prev {
                Some(prev) => prev.add(&padded),
                None => Ok(padded),
            }
        }
    }
}

fn accumulate_leaf(leaf: &Tensor, g: Tensor) -> Result<()> {
    let mut slot = leaf.0.grad.lock().unwrap_or_else(|e| e.into_inner());
    let sum = match slot.take() {
        Some(prev) => prev.add(&g)?,
        None => g.contiguous()?,
    };
    *slot = Some(sum);
    Ok(())
}

fn node_id(n: &Arc<Node>) -> usize {
    Arc::as_ptr(n) as usize
}

/// Nodes reachable from `root` in post-order: each node after the nodes producing its inputs.
fn topological_order(root: &Arc<Node>) -> Vec<Arc<Node>> {
    let mut order = Vec::new();
    let mut visited = HashSet::new();
    let mut stack: Vec<(Arc<Node>, bool)> = vec![(root.clone(), false)];
    while let Some((node, expanded)) = stack.pop() {
        if expanded {
            order.push(node);
            continue;
        }
        if !visited.insert(node_id(&node)) {
            continue;
        }
        stack.push((node.clone(), true));
        for n in node.inputs.iter().filter_map(Input::node) {
            if !visited.contains(&node_id(n)) {
                stack.push((n.clone(), false));
            }
        }
    }
    order
}

fn first(outputs: Vec<Tensor>) -> Tensor {
    outputs
        .into_iter()
        .next()
        .expect("catalog ops have at least one output")
}

/// The vector-Jacobian product of `op`: input gradients from the first output's gradient.
/// `wanted` says which inputs take gradients; a product leaves the others out (an LM head's
/// constant bias, whose gradient would be a sum over every logit).
fn vjp(
    op: &Op,
    x: &[Tensor],
    y: &[Tensor],
    wanted: &[bool],
    scalars: &[f64],
    g: &Tensor,
) -> Result<Vec<Option<Tensor>>> {
    let run =
        |op: Op, inputs: &[&Tensor], scalars: &[f64], out: Option<&[usize]>| -> Result<Tensor> {
            Ok(first(Tensor::apply(&op, inputs, scalars, out)?))
        };
    Ok(match op {
        Op::Cast { .. } => vec![x[0]
            .dtype()
            .is_float()
            .then(|| g.to_dtype(x[0].dtype()))
            .transpose()?],
        Op::Copy => vec![Some(g.clone())],
        Op::Unary(u) => vec![Some(run(
            Op::UnaryBackward(*u),
            &[&x[0], g],
            scalars,
            None,
        )?)],
        Op::Binary(b) => {
            let (a, bb) = (&x[0], &x[1]);
            match b {
                BinaryOp::Add => vec![Some(g.clone()), Some(g.clone())],
                BinaryOp::Sub => vec![Some(g.clone()), Some(g.neg()?)],
                BinaryOp::Mul => vec![Some(g.mul(bb)?), Some(g.mul(a)?)],
                BinaryOp::Div => vec![Some(g.div(bb)?), Some(g.mul(&y[0])?.div(bb)?.neg()?)],
                BinaryOp::Maximum | BinaryOp::Minimum => {
                    let cmp = if *b == BinaryOp::Maximum {
                        CompareOp::Ge
                    } else {
                        CompareOp::Le
                    };
                    let to_a = run(Op::Compare(cmp), &[a, bb], &[], None)?;
                    let zero = Tensor::zeros(&[], g.dtype(), g.device())?.expand(g.shape())?;
                    vec![
                        Some(Tensor::where_(&to_a, g, &zero)?),
                        Some(Tensor::where_(&to_a, &zero, g)?),
                    ]
                }
                BinaryOp::Pow => {
                    let da = g.mul(bb)?.mul(&a.pow(&bb.affine(1.0, -1.0)?)?)?;
                    let db = g.mul(&y[0])?.mul(&a.log()?)?;
                    vec![Some(da), Some(db)]
                }
            }
        }
        Op::Where => {
            let zero = Tensor::zeros(&[], g.dtype(), g.device())?.expand(g.shape())?;
            vec![
                None,
                Some(Tensor::where_(&x[0], g, &zero)?),
                Some(Tensor::where_(&x[0], &zero, g)?),
            ]
        }
        Op::SwiGlu => {
            let mut d = Tensor::apply(&Op::SwiGluBackward, &[&x[0], &x[1], g], &[], None)?;
            let du = d.pop();
            vec![d.pop(), du]
        }
        Op::Reduce { op: kind, axes, .. } => {
            let shape = x[0].shape();
            let kept = crate::ops::ReduceOp::kept_shape(shape, axes);
            let gk = g.reshape(&kept)?;
            let count: usize = axes.iter().map(|&a| shape[a]).product();
            let gi = match kind {
                ReduceOp::Sum => gk.expand(shape)?,
                ReduceOp::Mean => gk.affine(1.0 / count as f64, 0.0)?.expand(shape)?,
                ReduceOp::Max | ReduceOp::Min => {
                    let yk = y[0].reshape(&kept)?.expand(shape)?;
                    let mask = run(Op::Compare(CompareOp::Eq), &[&x[0], &yk], &[], None)?
                        .to_dtype(g.dtype())?;
                    let ties = mask.sum(axes, true)?;
                    mask.mul(&gk.div(&ties)?.expand(shape)?)?
                }
            };
            vec![Some(gi)]
        }
        Op::Softmax => vec![Some(run(Op::SoftmaxBackward, &[&y[0], g], &[], None)?)],
        Op::LogSoftmax => vec![Some(run(Op::LogSoftmaxBackward, &[&y[0], g], &[], None)?)],
        Op::Matmul {
            bias,
            activation,
            residual,
        } => {
            let (a, b) = (&x[0], &x[1]);
            let g_pre = match activation {
                Some(act) => {
                    let inputs: Vec<&Tensor> = x[..2 + usize::from(*bias)].iter().collect();
                    let pre = run(
                        Op::Matmul {
                            bias: *bias,
                            activation: None,
                            residual: false,
                        },
                        &inputs,
                        &[],
                        None,
                    )?;
                    run(Op::UnaryBackward(*act), &[&pre, g], &[], None)?
                }
                None => g.clone(),
            };
            // A linear layer's `b` is its weight `[out, in]` transposed: its gradient is taken
            // as `g^T a` and handed back transposed, so that it reaches the weight row-major
            // instead of being copied there.
            let b_transposed = a.rank() == 2 && b.rank() == 2 && b.transpose(0, 1)?.is_contiguous();
            let grad_b = match (wanted[1], b_transposed) {
                (false, _) => None,
                (true, true) => Some(g_pre.transpose(0, 1)?.matmul(a)?.transpose(0, 1)?),
                (true, false) => Some(a.transpose(-1, -2)?.matmul(&g_pre)?),
            };
            let grad_a = match wanted[0] {
                true => Some(g_pre.matmul(&b.transpose(-1, -2)?)?),
                false => None,
            };
            let mut grads = vec![grad_a, grad_b];
            if *bias {
                let lead: Vec<usize> = (0..g.rank() - 1).collect();
                grads.push(wanted[2].then(|| g_pre.sum(&lead, false)).transpose()?);
            }
            if *residual {
                grads.push(Some(g.clone()));
            }
            grads
        }
        Op::Concat { axis } => {
            let mut start = 0;
            let mut grads = Vec::with_capacity(x.len());
            for t in x {
                let len = t.shape()[*axis];
                grads.push(Some(g.narrow(*axis as isize, start, len)?));
                start += len;
            }
            grads
        }
        Op::Embedding => vec![
            Some(run(
                Op::EmbeddingBackward,
                &[&x[1], g],
                &[],
                Some(x[0].shape()),
            )?),
            None,
        ],
        Op::Gather { axis } => vec![
            Some(run(
                Op::ScatterAdd { axis: *axis },
                &[&x[1], g],
                &[],
                Some(x[0].shape()),
            )?),
            None,
        ],
        Op::LayerNorm => {
            let d = Tensor::apply(
                &Op::LayerNormBackward,
                &[&x[0], &x[1], &y[1], &y[2], g],
                &[],
                None,
            )?;
            d.into_iter().map(Some).collect()
        }
        Op::RmsNorm => {
            let d = Tensor::apply(&Op::RmsNormBackward, &[&x[0], &x[1], &y[1], g], &[], None)?;
            d.into_iter().map(Some).collect()
        }
        Op::Rotary => vec![
            Some(run(Op::Rotary, &[g, &x[1], &x[2].neg()?], &[], None)?),
            None,
            None,
        ],
        Op::Attention { causal } => {
            let inputs = [&x[0], &x[1], &x[2], &y[0], &y[1], g];
            let d = Tensor::apply(
                &Op::AttentionBackward { causal: *causal },
                &inputs,
                scalars,
                None,
            )?;
            d.into_iter().map(Some).collect()
        }
        Op::CrossEntropy => vec![
            Some(run(
                Op::CrossEntropyBackward,
                &[&x[0], &x[1], &y[1], g],
                &[],
                None,
            )?),
            None,
        ],
        Op::Conv2d { params, bias } => {
            let p = *params;
            let mut grads = vec![
                Some(run(
                    Op::Conv2dBackwardData { params: p },
                    &[g, &x[1]],
                    &[],
                    Some(x[0].shape()),
                )?),
                Some(run(
                    Op::Conv2dBackwardWeight { params: p },
                    &[&x[0], g],
                    &[],
                    Some(x[1].shape()),
                )?),
            ];
            if *bias {
                grads.push(Some(g.sum(&[0, 2, 3], false)?));
            }
            grads
        }
        other => return Err(Error::invalid(&other.name(), "has no gradient")),
    })
}

impl ReduceOp {
    /// The shape of a reduction's output with the reduced axes kept as size 1.
    pub fn kept_shape(shape: &[usize], axes: &[usize]) -> Vec<usize> {
        shape
            .iter()
            .enumerate()
            .map(|(i, &d)| if axes.contains(&i) { 1 } else { d })
            .collect()
    }
}

impl Tensor {
    /// Zeros of `shape` with this tensor written at `start` along `axis` (narrow's gradient).
    pub(super) fn pad_into(&self, shape: &[usize], axis: usize, start: usize) -> Result<Tensor> {
        let out = Tensor::zeros(shape, self.dtype(), self.device())?;
        let region = Tensor::from_parts(
            out.buffer().clone(),
            out.layout().narrow(axis, start, self.shape()[axis]),
            self.dtype(),
            self.device().clone(),
        );
        Tensor::apply_in_view(&Op::Copy, self, &region)?;
        Ok(out)
    }

    /// Sums broadcast dimensions away so the result has `shape` (expand's gradient).
    pub(super) fn sum_to_shape(&self, shape: &[usize]) -> Result<Tensor> {
        let lead = self.rank() - shape.len();
        let axes: Vec<usize> = (0..self.rank())
            .filter(|&i| i < lead || (shape[i - lead] == 1 && self.shape()[i] != 1))
            .collect();
        if axes.is_empty() {
            return self.reshape(shape);
        }
        self.sum(&axes, true)?.reshape(shape)
    }
}
