//! Elementwise ops: casts, copies, unary and binary math, comparisons, select, SwiGLU.
//!
//! All of them read strided and broadcast (stride-0) inputs in place and write a row-major
//! output of the same shape. NaN propagates through arithmetic as IEEE 754 says.

use super::{require_float, require_same_dtype, specs_str, Op, TensorSpec};
use crate::{DType, Error, Result};

/// Unary float functions. `x` is the input, `y` the output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `|x|`; gradient `sign(x)`, 0 at 0.
    Abs,
    /// `e^x`
    Exp,
    /// natural log; `-inf` at 0, NaN below.
    Log,
    /// `sqrt(x)`; NaN below 0.
    Sqrt,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// `1 / x`
    Recip,
    /// `x * x`
    Square,
    Tanh,
    /// `1 / (1 + e^-x)`
    Sigmoid,
    /// `max(x, 0)`; gradient 0 at 0 (PyTorch's choice).
    Relu,
    /// GELU, tanh approximation (GPT-2's `gelu_new`):
    /// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
    Gelu,
    /// `x * sigmoid(x)` (SiLU, swish).
    Silu,
    Sin,
    Cos,
    /// `x * scale + shift`; scalars `scale`, `shift`.
    Affine,
    /// `x ^ exponent`; scalar `exponent`. Follows `powf` (NaN for negative bases with
    /// non-integer exponents).
    PowScalar,
}

impl UnaryOp {
    pub const ALL: [UnaryOp; 17] = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Recip,
        UnaryOp::Square,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu,
        UnaryOp::Silu,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Affine,
        UnaryOp::PowScalar,
    ];

    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Abs => "abs",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Recip => "recip",
            UnaryOp::Square => "square",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Silu => "silu",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Affine => "affine",
            UnaryOp::PowScalar => "pow_scalar",
        }
    }

    pub fn scalar_names(self) -> &'static [&'static str] {
        match self {
            UnaryOp::Affine => &["scale", "shift"],
            UnaryOp::PowScalar => &["exponent"],
            _ => &[],
        }
    }

    /// All unary ops have a gradient (`UnaryBackward`).
    pub fn differentiable(self) -> bool {
        true
    }

    /// Activations a matmul epilogue may apply.
    pub fn is_epilogue_activation(self) -> bool {
        matches!(self, UnaryOp::Relu | UnaryOp::Gelu | UnaryOp::Silu)
    }

    /// The function in f64, the definition every backend follows. `s` holds the scalars.
    pub fn eval(self, x: f64, s: &[f64]) -> f64 {
        match self {
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => x.ln(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Rsqrt => 1.0 / x.sqrt(),
            UnaryOp::Recip => 1.0 / x,
            UnaryOp::Square => x * x,
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Relu => {
                if x > 0.0 || x.is_nan() {
                    x
                } else {
                    0.0
                }
            }
            UnaryOp::Gelu => 0.5 * x * (1.0 + (GELU_K * (x + 0.044715 * x * x * x)).tanh()),
            UnaryOp::Silu => x / (1.0 + (-x).exp()),
            UnaryOp::Sin => x.sin(),
            UnaryOp::Cos => x.cos(),
            UnaryOp::Affine => x * s[0] + s[1],
            UnaryOp::PowScalar => x.powf(s[0]),
        }
    }

    /// The derivative `dy/dx` at `x`, in f64.
    pub fn derivative(self, x: f64, s: &[f64]) -> f64 {
        match self {
            UnaryOp::Neg => -1.0,
            UnaryOp::Abs => {
                if x > 0.0 {
                    1.0
                } else if x < 0.0 {
                    -1.0
                } else {
                    0.0 * x
                }
            }
            UnaryOp::Exp => x.exp(),
            UnaryOp::Log => 1.0 / x,
            UnaryOp::Sqrt => 0.5 / x.sqrt(),
            UnaryOp::Rsqrt => -0.5 / (x * x.sqrt()),
            UnaryOp::Recip => -1.0 / (x * x),
            UnaryOp::Square => 2.0 * x,
            UnaryOp::Tanh => 1.0 - x.tanh().powi(2),
            UnaryOp::Sigmoid => {
                let sg = 1.0 / (1.0 + (-x).exp());
                sg * (1.0 - sg)
            }
            UnaryOp::Relu => {
                if x > 0.0 {
                    1.0
                } else {
                    0.0 * x
                }
            }
            UnaryOp::Gelu => {
                let inner = GELU_K * (x + 0.044715 * x * x * x);
                let t = inner.tanh();
                0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * GELU_K * (1.0 + 3.0 * 0.044715 * x * x)
            }
            UnaryOp::Silu => {
                let sg = 1.0 / (1.0 + (-x).exp());
                sg * (1.0 + x * (1.0 - sg))
            }
            UnaryOp::Sin => x.cos(),
            UnaryOp::Cos => -x.sin(),
            UnaryOp::Affine => s[0],
            UnaryOp::PowScalar => {
                if s[0] == 0.0 {
                    0.0
                } else {
                    s[0] * x.powf(s[0] - 1.0)
                }
            }
        }
    }
}

/// `sqrt(2 / pi)`, the constant of the tanh GELU.
pub const GELU_K: f64 = 0.797_884_560_802_865_4;

/// Binary float ops on two inputs of the output's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// Elementwise maximum; NaN if either input is NaN. Gradient goes to `a` on ties.
    Maximum,
    /// Elementwise minimum; NaN if either input is NaN. Gradient goes to `a` on ties.
    Minimum,
    /// `a ^ b` (`powf`).
    Pow,
}

impl BinaryOp {
    pub const ALL: [BinaryOp; 7] = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Maximum,
        BinaryOp::Minimum,
        BinaryOp::Pow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Maximum => "maximum",
            BinaryOp::Minimum => "minimum",
            BinaryOp::Pow => "pow",
        }
    }

    /// The op in f64, the definition every backend follows.
    pub fn eval(self, a: f64, b: f64) -> f64 {
        match self {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
            BinaryOp::Maximum => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.max(b)
                }
            }
            BinaryOp::Minimum => {
                if a.is_nan() || b.is_nan() {
                    f64::NAN
                } else {
                    a.min(b)
                }
            }
            BinaryOp::Pow => a.powf(b),
        }
    }
}

/// Comparisons giving `Bool`. Any comparison with NaN is false, except `Ne`, which is true.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompareOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl CompareOp {
    pub const ALL: [CompareOp; 6] = [
        CompareOp::Eq,
        CompareOp::Ne,
        CompareOp::Lt,
        CompareOp::Le,
        CompareOp::Gt,
        CompareOp::Ge,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CompareOp::Eq => "eq",
            CompareOp::Ne => "ne",
            CompareOp::Lt => "lt",
            CompareOp::Le => "le",
            CompareOp::Gt => "gt",
            CompareOp::Ge => "ge",
        }
    }

    pub fn eval(self, a: f64, b: f64) -> bool {
        match self {
            CompareOp::Eq => a == b,
            CompareOp::Ne => a != b,
            CompareOp::Lt => a < b,
            CompareOp::Le => a <= b,
            CompareOp::Gt => a > b,
            CompareOp::Ge => a >= b,
        }
    }
}

/// Shape and dtype inference for the family:
/// - `Cast { to }`: `x` of any dtype to `to`. Float to float rounds to nearest-even; float to
///   integer truncates toward zero and saturates, NaN to 0; anything to bool is `x != 0`;
///   bool to numbers is 0 or 1.
/// - `Copy`: `x` to an output of the same shape and dtype, which may be any non-overlapping
///   strided view (this is how strided views are made contiguous and how slices are written).
/// - `Unary(op)`: float `x` to `y`. `UnaryBackward(op)`: `(x, dy)` to `dx = dy * op'(x)`.
/// - `Binary(op)`: float `(a, b)` of one shape and dtype to `a op b`.
/// - `Compare(op)`: `(a, b)` of one shape and dtype (float or integer) to bool.
/// - `Where`: `(cond: bool, a, b)` to `cond ? a : b`; `a` and `b` share a dtype (any).
/// - `SwiGlu`: `(gate, up)` to `silu(gate) * up`. `SwiGluBackward`: `(gate, up, dy)` to
///   `(dgate, dup)`.
pub(super) fn infer(op: &Op, name: &str, inputs: &[TensorSpec]) -> Result<Vec<TensorSpec>> {
    let first = &inputs[0];
    if let Some(other) = inputs.iter().find(|s| s.shape != first.shape) {
        return Err(Error::shape(
            name,
            format!(
                "inputs must share one shape (broadcast first); got {:?} and {:?}",
                first.shape, other.shape
            ),
        ));
    }
    let same = |dtype: DType| TensorSpec::new(&first.shape, dtype);
    Ok(match op {
        Op::Cast { to } => vec![same(*to)],
        Op::Copy => vec![same(first.dtype)],
        Op::Unary(_) => {
            require_float(name, inputs, &[0])?;
            vec![same(first.dtype)]
        }
        Op::UnaryBackward(_) | Op::Binary(_) | Op::SwiGlu => {
            require_float(name, inputs, &[0, 1])?;
            require_same_dtype(name, inputs, &[0, 1])?;
            vec![same(first.dtype)]
        }
        Op::SwiGluBackward => {
            require_float(name, inputs, &[0, 1, 2])?;
            require_same_dtype(name, inputs, &[0, 1, 2])?;
            vec![same(first.dtype), same(first.dtype)]
        }
        Op::Compare(_) => {
            require_same_dtype(name, inputs, &[0, 1])?;
            if first.dtype == DType::Bool {
                return Err(Error::dtype(
                    name,
                    format!("cannot compare bool tensors ({})", specs_str(inputs)),
                ));
            }
            vec![same(DType::Bool)]
        }
        Op::Where => {
            if first.dtype != DType::Bool {
                return Err(Error::dtype(
                    name,
                    format!("condition must be bool; got {}", specs_str(inputs)),
                ));
            }
            require_same_dtype(name, inputs, &[1, 2])?;
            vec![same(inputs[1].dtype)]
        }
        _ => unreachable!("not an elementwise op: {op:?}"),
    })
}
