//! [`Tensor`]: a cheap handle to a strided view of device memory, with its autograd node.
//!
//! Every computation goes through [`Tensor::apply`], which runs one catalog op on the tensors'
//! device and records its backward (written in catalog ops, so gradients run on the same
//! device). Views (reshape, transpose, permute, narrow, expand) only change the layout and
//! share the buffer. Tensors cross devices only through [`Tensor::to_device`].

mod autograd;
mod elementwise;
mod matmul;
mod movement;
mod nn;
mod reduce;

pub use autograd::{is_grad_enabled, no_grad, NoGradGuard};

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::layout::normalize_axis;
use crate::ops::TensorSpec;
use crate::{numel, same_device, DType, Device, Element, Error, Layout, Op, Result, TensorRef};
use autograd::Node;

#[derive(Clone)]
pub struct Tensor(Arc<Inner>);

/// Elements on their way to the host, from [`Tensor::to_vec_later`].
pub struct PendingVec<T> {
    bytes: Box<dyn crate::PendingBytes>,
    element: std::marker::PhantomData<T>,
}

impl<T: Element> PendingVec<T> {
    /// Waits for the copy and returns the elements.
    pub fn wait(self) -> Result<Vec<T>> {
        let bytes = self.bytes.wait()?;
        let mut out = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
        bytemuck::cast_slice_mut::<T, u8>(&mut out).copy_from_slice(&bytes);
        Ok(out)
    }
}

struct Inner {
    buffer: Arc<dyn crate::Buffer>,
    layout: Layout,
    dtype: DType,
    device: Arc<dyn Device>,
    /// Set on tensors computed by a recorded op.
    node: Option<Arc<Node>>,
    /// Leaves that accumulate gradients, and everything computed from them.
    requires_grad: bool,
    /// The accumulated gradient of a leaf.
    grad: Mutex<Option<Tensor>>,
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({:?} {} on {})",
            self.shape(),
            self.dtype(),
            self.device().info().id()
        )
    }
}

impl Tensor {
    // ---- construction -------------------------------------------------------------------

    /// A tensor over `buffer` with any layout that fits it.
    pub fn from_parts(
        buffer: Arc<dyn crate::Buffer>,
        layout: Layout,
        dtype: DType,
        device: Arc<dyn Device>,
    ) -> Tensor {
        Tensor(Arc::new(Inner {
            buffer,
            layout,
            dtype,
            device,
            node: None,
            requires_grad: false,
            grad: Mutex::new(None),
        }))
    }

    fn with_node(&self, node: Option<Arc<Node>>) -> Tensor {
        let requires_grad = node.is_some();
        Tensor(Arc::new(Inner {
            buffer: self.0.buffer.clone(),
            layout: self.0.layout.clone(),
            dtype: self.0.dtype,
            device: self.0.device.clone(),
            node,
            requires_grad,
            grad: Mutex::new(None),
        }))
    }

    fn view(&self, layout: Layout) -> Tensor {
        Tensor::from_parts(
            self.0.buffer.clone(),
            layout,
            self.0.dtype,
            self.0.device.clone(),
        )
    }

    /// Uploads host values, converted to `dtype` as [`Element::from_f64`] converts.
    pub fn from_f64(
        values: &[f64],
        shape: &[usize],
        dtype: DType,
        device: &Arc<dyn Device>,
    ) -> Result<Tensor> {
        Tensor::from_bytes(
            &crate::encode_f64(values, dtype),
            shape,
            dtype,
            device,
            values.len(),
        )
    }

    /// Uploads a host slice of a Rust element type.
    pub fn from_slice<T: Element>(
        values: &[T],
        shape: &[usize],
        device: &Arc<dyn Device>,
    ) -> Result<Tensor> {
        Tensor::from_bytes(
            bytemuck::cast_slice(values),
            shape,
            T::DTYPE,
            device,
            values.len(),
        )
    }

    fn from_bytes(
        bytes: &[u8],
        shape: &[usize],
        dtype: DType,
        device: &Arc<dyn Device>,
        len: usize,
    ) -> Result<Tensor> {
        if numel(shape) != len {
            return Err(Error::shape(
                "from_data",
                format!("{len} values do not fill shape {shape:?} ({dtype})"),
            ));
        }
        let buffer = device.alloc(bytes.len())?;
        device.write(&buffer, 0, bytes)?;
        Ok(Tensor::from_parts(
            buffer,
            Layout::contiguous(shape),
            dtype,
            device.clone(),
        ))
    }

    /// A scalar (rank-0) tensor.
    pub fn scalar(value: f64, dtype: DType, device: &Arc<dyn Device>) -> Result<Tensor> {
        Tensor::full(&[], value, dtype, device)
    }

    pub fn full(
        shape: &[usize],
        value: f64,
        dtype: DType,
        device: &Arc<dyn Device>,
    ) -> Result<Tensor> {
        Tensor::create(device, Op::Fill { dtype }, &[value], shape)
    }

    pub fn zeros(shape: &[usize], dtype: DType, device: &Arc<dyn Device>) -> Result<Tensor> {
        Tensor::full(shape, 0.0, dtype, device)
    }

    pub fn ones(shape: &[usize], dtype: DType, device: &Arc<dyn Device>) -> Result<Tensor> {
        Tensor::full(shape, 1.0, dtype, device)
    }

    /// Zero tensors of `shapes` laid back to back in one allocation, in order: their
    /// [`Tensor::span`] is one flat view, so that an op over all of them (an optimizer's
    /// update, say) is one launch instead of one per tensor.
    pub fn zeros_packed(
        shapes: &[&[usize]],
        dtype: DType,
        device: &Arc<dyn Device>,
    ) -> Result<Vec<Tensor>> {
        let total = shapes.iter().map(|s| s.iter().product::<usize>()).sum();
        let flat = Tensor::zeros(&[total], dtype, device)?;
        let mut at = flat.layout().offset;
        Ok(shapes
            .iter()
            .map(|shape| {
                let layout = Layout::contiguous(shape).with_offset(at);
                at += layout.numel();
                Tensor::from_parts(flat.buffer().clone(), layout, dtype, device.clone())
            })
            .collect())
    }

    /// One flat view of `tensors` where they lie back to back in one buffer, in order, each
    /// contiguous and all of one dtype (as [`Tensor::zeros_packed`] lays them); `None`
    /// otherwise. The view tracks no gradient: it is for updates in place.
    pub fn span(tensors: &[&Tensor]) -> Option<Tensor> {
        let first = tensors.first()?;
        let start = first.layout().offset;
        let mut end = start;
        for t in tensors {
            let next = t.is_contiguous()
                && t.shares_buffer(first)
                && t.dtype() == first.dtype()
                && t.layout().offset == end;
            if !next {
                return None;
            }
            end += t.numel();
        }
        let layout = Layout::contiguous(&[end - start]).with_offset(start);
        Some(Tensor::from_parts(
            first.buffer().clone(),
            layout,
            first.dtype(),
            first.device().clone(),
        ))
    }

    /// `[start, start + step, ...]`, `n` values.
    pub fn arange(
        n: usize,
        start: f64,
        step: f64,
        dtype: DType,
        device: &Arc<dyn Device>,
    ) -> Result<Tensor> {
        Tensor::create(device, Op::Arange { dtype }, &[start, step], &[n])
    }

    /// Uniform values in `[low, high)` from the keyed generator; advances `rng`.
    pub fn rand_uniform(
        shape: &[usize],
        low: f64,
        high: f64,
        dtype: DType,
        rng: &mut crate::rng::RngState,
        device: &Arc<dyn Device>,
    ) -> Result<Tensor> {
        let (key, counter) = rng.next_launch();
        let [k0, k1] = crate::rng::split_u64(key);
        let [c0, c1] = crate::rng::split_u64(counter);
        Tensor::create(
            device,
            Op::RandUniform { dtype },
            &[k0, k1, c0, c1, low, high],
            shape,
        )
    }

    /// Normal values with `mean` and `std` from the keyed generator; advances `rng`.
    pub fn randn(
        shape: &[usize],
        mean: f64,
        std: f64,
        dtype: DType,
        rng: &mut crate::rng::RngState,
        device: &Arc<dyn Device>,
    ) -> Result<Tensor> {
        let (key, counter) = rng.next_launch();
        let [k0, k1] = crate::rng::split_u64(key);
        let [c0, c1] = crate::rng::split_u64(counter);
        Tensor::create(
            device,
            Op::RandNormal { dtype },
            &[k0, k1, c0, c1, mean, std],
            shape,
        )
    }

    fn create(
        device: &Arc<dyn Device>,
        op: Op,
        scalars: &[f64],
        shape: &[usize],
    ) -> Result<Tensor> {
        Ok(Tensor::apply_on(device, &op, &[], scalars, Some(shape))?.remove(0))
    }

    // ---- accessors ----------------------------------------------------------------------

    pub fn shape(&self) -> &[usize] {
        &self.0.layout.shape
    }

    pub fn rank(&self) -> usize {
        self.0.layout.rank()
    }

    pub fn numel(&self) -> usize {
        self.0.layout.numel()
    }

    pub fn dtype(&self) -> DType {
        self.0.dtype
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.0.device
    }

    pub fn layout(&self) -> &Layout {
        &self.0.layout
    }

    pub fn buffer(&self) -> &Arc<dyn crate::Buffer> {
        &self.0.buffer
    }

    pub fn is_contiguous(&self) -> bool {
        self.0.layout.is_contiguous()
    }

    /// The size of dimension `axis` (negative counts from the end).
    pub fn dim(&self, axis: isize) -> Result<usize> {
        Ok(self.shape()[normalize_axis("dim", axis, self.shape())?])
    }

    pub(crate) fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            buffer: &self.0.buffer,
            layout: &self.0.layout,
            dtype: self.0.dtype,
        }
    }

    /// Whether two handles view the same storage (used by in-place updates).
    pub fn shares_buffer(&self, other: &Tensor) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.0.buffer), Arc::as_ptr(&other.0.buffer))
    }

    // ---- host transfer ------------------------------------------------------------------

    /// Reads the elements in row-major order as f64 (waits for the device).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        let t = self.contiguous()?;
        let size = t.dtype().size();
        let mut bytes = vec![0u8; t.numel() * size];
        t.device()
            .read(t.buffer(), t.layout().offset * size, &mut bytes)?;
        Ok(crate::decode_f64(&bytes, t.dtype()))
    }

    /// Reads the elements as `T`, which must be the tensor's dtype.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.expect_element::<T>("to_vec")?;
        let t = self.contiguous()?;
        let mut out = vec![T::zeroed(); t.numel()];
        let size = t.dtype().size();
        t.device().read(
            t.buffer(),
            t.layout().offset * size,
            bytemuck::cast_slice_mut(&mut out),
        )?;
        Ok(out)
    }

    /// Starts reading the elements as `T` (the tensor's dtype) and returns without waiting:
    /// the values are those after the work queued so far, and work queued meanwhile runs on
    /// (PyTorch's `non_blocking` copy to the host).
    pub fn to_vec_later<T: Element>(&self) -> Result<PendingVec<T>> {
        self.expect_element::<T>("to_vec_later")?;
        let t = self.contiguous()?;
        let size = t.dtype().size();
        let bytes =
            t.device()
                .read_later(t.buffer(), t.layout().offset * size, t.numel() * size)?;
        Ok(PendingVec {
            bytes,
            element: std::marker::PhantomData,
        })
    }

    fn expect_element<T: Element>(&self, op: &str) -> Result<()> {
        if T::DTYPE == self.dtype() {
            return Ok(());
        }
        Err(Error::dtype(
            op,
            format!(
                "tensor is {:?} {}, asked for {}",
                self.shape(),
                self.dtype(),
                T::DTYPE
            ),
        ))
    }

    /// The single element of a one-element tensor, as f64.
    pub fn item(&self) -> Result<f64> {
        if self.numel() != 1 {
            return Err(Error::shape(
                "item",
                format!("needs exactly one element; shape {:?}", self.shape()),
            ));
        }
        Ok(self.to_vec_f64()?[0])
    }

    /// A copy on `device` (through the host). Gradients do not flow across devices.
    pub fn to_device(&self, device: &Arc<dyn Device>) -> Result<Tensor> {
        if same_device(self.device(), device) {
            return Ok(self.clone());
        }
        let t = self.contiguous()?;
        let size = t.dtype().size();
        let mut bytes = vec![0u8; t.numel() * size];
        t.device()
            .read(t.buffer(), t.layout().offset * size, &mut bytes)?;
        Tensor::from_bytes(&bytes, t.shape(), t.dtype(), device, t.numel())
    }

    // ---- running ops --------------------------------------------------------------------

    /// Runs a catalog op on the inputs' device and records its backward when gradients are
    /// enabled and an input requires them. Inputs are made contiguous first when the op does
    /// not read strided inputs. Returns the op's outputs; the first is the differentiable one.
    pub fn apply(
        op: &Op,
        inputs: &[&Tensor],
        scalars: &[f64],
        out_shape: Option<&[usize]>,
    ) -> Result<Vec<Tensor>> {
        let first = inputs
            .first()
            .ok_or_else(|| Error::invalid(&op.name(), "needs a device; use apply_on"))?;
        Tensor::apply_on(&first.device().clone(), op, inputs, scalars, out_shape)
    }

    /// [`Tensor::apply`] with an explicit device, for ops without inputs.
    pub fn apply_on(
        device: &Arc<dyn Device>,
        op: &Op,
        inputs: &[&Tensor],
        scalars: &[f64],
        out_shape: Option<&[usize]>,
    ) -> Result<Vec<Tensor>> {
        let outputs = Tensor::launch(device, op, inputs, scalars, out_shape)?;
        autograd::record(op, inputs, scalars, outputs)
    }

    /// Runs a catalog op without recording anything.
    fn launch(
        device: &Arc<dyn Device>,
        op: &Op,
        inputs: &[&Tensor],
        scalars: &[f64],
        out_shape: Option<&[usize]>,
    ) -> Result<Vec<Tensor>> {
        let name = op.name();
        check_saved(&name, inputs)?;
        for t in inputs {
            if !same_device(t.device(), device) {
                return Err(Error::DeviceMismatch {
                    op: name,
                    first: device.info().id(),
                    second: t.device().info().id(),
                });
            }
        }
        let owned: Vec<Tensor> = inputs
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if op.reads_layout(i, t.layout()) {
                    Ok((*t).clone())
                } else {
                    t.contiguous()
                }
            })
            .collect::<Result<_>>()?;
        let inputs: Vec<&Tensor> = owned.iter().collect();
        let specs: Vec<TensorSpec> = inputs
            .iter()
            .map(|t| TensorSpec::new(t.shape(), t.dtype()))
            .collect();
        let out_specs = op.infer(&specs, out_shape)?;
        let dtypes: Vec<DType> = specs.iter().map(|s| s.dtype).collect();
        let kernel = device.kernel(op, &dtypes)?;
        let outputs = out_specs
            .iter()
            .map(|s| {
                let bytes = numel(&s.shape).checked_mul(s.dtype.size()).ok_or_else(|| {
                    Error::invalid(
                        &name,
                        format!("output {:?} {} is too large", s.shape, s.dtype),
                    )
                })?;
                let buffer = device.alloc(bytes)?;
                Ok(Tensor::from_parts(
                    buffer,
                    Layout::contiguous(&s.shape),
                    s.dtype,
                    device.clone(),
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let in_refs: Vec<TensorRef<'_>> = inputs.iter().map(|t| t.as_ref()).collect();
        let out_refs: Vec<TensorRef<'_>> = outputs.iter().map(|t| t.as_ref()).collect();
        kernel.launch(&in_refs, &out_refs, scalars)?;
        Ok(outputs)
    }

    /// Runs an op whose outputs are existing tensors updated in place (optimizer updates).
    /// Never recorded.
    pub fn apply_in_place(
        op: &Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        scalars: &[f64],
    ) -> Result<()> {
        let name = op.name();
        let device = inputs
            .first()
            .ok_or_else(|| Error::invalid(&name, "needs inputs"))?
            .device();
        check_saved(&name, inputs)?;
        for t in inputs.iter().chain(outputs) {
            if !same_device(t.device(), device) {
                return Err(Error::DeviceMismatch {
                    op: name,
                    first: device.info().id(),
                    second: t.device().info().id(),
                });
            }
            if !t.is_contiguous() {
                return Err(Error::invalid(
                    &name,
                    format!("in-place operands must be contiguous; got {:?}", t.layout()),
                ));
            }
        }
        let dtypes: Vec<DType> = inputs.iter().map(|t| t.dtype()).collect();
        let kernel = device.kernel(op, &dtypes)?;
        let in_refs: Vec<TensorRef<'_>> = inputs.iter().map(|t| t.as_ref()).collect();
        let out_refs: Vec<TensorRef<'_>> = outputs.iter().map(|t| t.as_ref()).collect();
        kernel.launch(&in_refs, &out_refs, scalars)
    }

    /// Writes `src` into this tensor's elements in place, as PyTorch's `copy_`: this tensor
    /// may be a view (a narrowed slice of a larger buffer, say), and every tensor sharing the
    /// buffer sees the write. Not recorded: it fails on tensors that track gradients.
    pub fn copy_from(&self, src: &Tensor) -> Result<()> {
        if src.shape() != self.shape() || src.dtype() != self.dtype() {
            return Err(Error::shape(
                "copy_from",
                format!(
                    "the source must match the destination {:?} {}; got {:?} {}",
                    self.shape(),
                    self.dtype(),
                    src.shape(),
                    src.dtype()
                ),
            ));
        }
        if self.tracks_grad() || (is_grad_enabled() && src.tracks_grad()) {
            return Err(Error::invalid(
                "copy_from",
                "in-place writes are not recorded; use them on tensors without gradients",
            ));
        }
        let overlapping = self
            .shape()
            .iter()
            .zip(&self.layout().strides)
            .any(|(&n, &stride)| n > 1 && stride == 0);
        if overlapping {
            return Err(Error::invalid(
                "copy_from",
                format!("the destination {:?} repeats elements", self.layout()),
            ));
        }
        Tensor::apply_in_view(&Op::Copy, src, self)
    }

    /// Runs a one-input op writing into `dst`, a view of an existing buffer. Never recorded.
    fn apply_in_view(op: &Op, src: &Tensor, dst: &Tensor) -> Result<()> {
        check_saved(&op.name(), &[src, dst])?;
        if !same_device(src.device(), dst.device()) {
            return Err(Error::DeviceMismatch {
                op: op.name(),
                first: dst.device().info().id(),
                second: src.device().info().id(),
            });
        }
        let kernel = dst.device().kernel(op, &[src.dtype()])?;
        kernel.launch(&[src.as_ref()], &[dst.as_ref()], &[])
    }

    // ---- views --------------------------------------------------------------------------

    /// A row-major copy, or the tensor itself if it already is row-major.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.clone());
        }
        Ok(Tensor::apply(&Op::Copy, &[self], &[], None)?.remove(0))
    }

    /// The same elements in a new shape; one dimension may be `usize::MAX` meaning "the rest".
    /// Copies first when the layout cannot be reshaped in place.
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        let shape = self.resolve_shape(shape)?;
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let src = self.contiguous()?;
        let layout = src.layout().reshape(&shape).ok_or_else(|| {
            Error::shape(
                "reshape",
                format!("cannot view {:?} as {shape:?}", self.shape()),
            )
        })?;
        let out = src.view(layout);
        autograd::record_view(out, self, autograd::ViewKind::Reshape)
    }

    fn resolve_shape(&self, shape: &[usize]) -> Result<Vec<usize>> {
        let requested = shape;
        let mut shape = shape.to_vec();
        let holes: Vec<usize> = (0..shape.len())
            .filter(|&i| shape[i] == usize::MAX)
            .collect();
        let err = || {
            Error::shape(
                "reshape",
                format!(
                    "cannot reshape {:?} ({} elements) to {requested:?}",
                    self.shape(),
                    self.numel()
                ),
            )
        };
        match holes.as_slice() {
            [] => {}
            [h] => {
                let known: usize = shape
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| i != h)
                    .map(|(_, &d)| d)
                    .product();
                if known == 0 || !self.numel().is_multiple_of(known) {
                    return Err(err());
                }
                shape[*h] = self.numel() / known;
            }
            _ => return Err(err()),
        }
        if numel(&shape) != self.numel() {
            return Err(err());
        }
        Ok(shape)
    }

    /// Swaps two axes (a view).
    pub fn transpose(&self, a: isize, b: isize) -> Result<Tensor> {
        let a = normalize_axis("transpose", a, self.shape())?;
        let b = normalize_axis("transpose", b, self.shape())?;
        let out = self.view(self.layout().transpose(a, b));
        autograd::record_view(out, self, autograd::ViewKind::Transpose(a, b))
    }

    /// Reorders axes (a view): output axis `i` is input axis `perm[i]`.
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        let mut seen = vec![false; self.rank()];
        let valid = perm.len() == self.rank()
            && perm
                .iter()
                .all(|&p| p < seen.len() && !std::mem::replace(&mut seen[p], true));
        if !valid {
            return Err(Error::invalid(
                "permute",
                format!(
                    "{perm:?} is not a permutation of the axes of {:?}",
                    self.shape()
                ),
            ));
        }
        let out = self.view(self.layout().permute(perm));
        autograd::record_view(out, self, autograd::ViewKind::Permute(perm.to_vec()))
    }

    /// Elements `start..start + len` along `axis` (a view).
    pub fn narrow(&self, axis: isize, start: usize, len: usize) -> Result<Tensor> {
        let a = normalize_axis("narrow", axis, self.shape())?;
        let size = self.shape()[a];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Index {
                op: "narrow".into(),
                index: start.saturating_add(len) as isize,
                size,
                shape: self.shape().to_vec(),
            });
        }
        let out = self.view(self.layout().narrow(a, start, len));
        autograd::record_view(out, self, autograd::ViewKind::Narrow { axis: a, start })
    }

    /// Element `index` along `axis`, removing that axis (a view). Negative indices count from
    /// the end.
    pub fn select(&self, axis: isize, index: isize) -> Result<Tensor> {
        let a = normalize_axis("select", axis, self.shape())?;
        let size = self.shape()[a] as isize;
        let i = if index < 0 { index + size } else { index };
        if i < 0 || i >= size {
            return Err(Error::Index {
                op: "select".into(),
                index,
                size: size as usize,
                shape: self.shape().to_vec(),
            });
        }
        let mut shape = self.shape().to_vec();
        shape.remove(a);
        self.narrow(a as isize, i as usize, 1)?.reshape(&shape)
    }

    /// Broadcasts to `shape` (a view with stride-0 dimensions).
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        if shape == self.shape() {
            return Ok(self.clone());
        }
        let layout = self.layout().broadcast_to(shape).ok_or_else(|| {
            Error::shape(
                "expand",
                format!("cannot broadcast {:?} to {shape:?}", self.shape()),
            )
        })?;
        let out = self.view(layout);
        autograd::record_view(out, self, autograd::ViewKind::Expand)
    }

    /// Inserts a size-1 axis at `axis` (`-1` appends).
    pub fn unsqueeze(&self, axis: isize) -> Result<Tensor> {
        let rank = self.rank() as isize;
        let a = if axis < 0 { axis + rank + 1 } else { axis };
        if a < 0 || a > rank {
            return Err(Error::Axis {
                op: "unsqueeze".into(),
                axis,
                rank: self.rank(),
                shape: self.shape().to_vec(),
            });
        }
        let mut shape = self.shape().to_vec();
        shape.insert(a as usize, 1);
        self.reshape(&shape)
    }

    /// Splits `axis` into `chunks` equal parts (views).
    pub fn chunk(&self, chunks: usize, axis: isize) -> Result<Vec<Tensor>> {
        let a = normalize_axis("chunk", axis, self.shape())?;
        let size = self.shape()[a];
        if chunks == 0 || !size.is_multiple_of(chunks) {
            return Err(Error::shape(
                "chunk",
                format!(
                    "axis {a} of {:?} does not split into {chunks} equal parts",
                    self.shape()
                ),
            ));
        }
        let part = size / chunks;
        (0..chunks)
            .map(|i| self.narrow(a as isize, i * part, part))
            .collect()
    }

    /// Converts to `dtype` (rounding as the `cast` op documents).
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        if dtype == self.dtype() {
            return Ok(self.clone());
        }
        Ok(Tensor::apply(&Op::Cast { to: dtype }, &[self], &[], None)?.remove(0))
    }

    /// A handle that stops gradients: same storage, no autograd history.
    pub fn detach(&self) -> Tensor {
        self.view(self.layout().clone())
    }

    /// This tensor's shape, dtype and device without its storage: what a backward keeps of
    /// a tensor whose data it does not read.
    pub(crate) fn unsaved(&self) -> Tensor {
        Tensor::from_parts(
            Arc::new(Unsaved),
            self.layout().clone(),
            self.dtype(),
            self.device().clone(),
        )
    }
}

/// The storage of an [`Tensor::unsaved`] tensor: none. An op given one fails.
#[derive(Debug)]
struct Unsaved;

impl crate::Buffer for Unsaved {
    fn len(&self) -> usize {
        0
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An error for an op given an [`Unsaved`] tensor: a backward that reads data it did not
/// save, which is a bug in the autograd's list of what each backward reads.
fn check_saved(name: &str, tensors: &[&Tensor]) -> Result<()> {
    if tensors.iter().any(|t| t.0.buffer.as_any().is::<Unsaved>()) {
        return Err(Error::invalid(
            name,
            "an input is a tensor the backward pass did not save (autograd's saved-tensor \
             list misses it)",
        ));
    }
    Ok(())
}
