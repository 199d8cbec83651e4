//! Matmul samples: batched, broadcast batches, transposed operands, every epilogue, K = 0,
//! few rows, split K, sizes in whole tiles, and large products with sizes off multiples of 8;
//! normalized products (`NormMatmul`) of both norms, in one kernel's reach and past it.

use tessera::ops::NormKind;
use tessera::{DType, Op, UnaryOp};

use super::{input, uniform, Gen, Input, Sample, View};

fn operands(a: &[usize], b: &[usize], va: View, vb: View) -> Vec<Input> {
    vec![
        input(a, uniform(-1.0, 1.0)).view(va),
        input(b, uniform(-1.0, 1.0)).view(vb),
    ]
}

/// A plain matmul of `a` and `b` through the given views.
fn plain(a: &[usize], b: &[usize], va: View, vb: View) -> Sample {
    let k = a[a.len() - 1];
    let op = Op::Matmul {
        bias: false,
        activation: None,
        residual: false,
    };
    Sample::new(op, format!("{a:?} x {b:?}"), operands(a, b, va, vb)).reduce(k)
}

/// A matmul with an epilogue; `a [.., M, K]`, `b [.., K, N]` through view `vb`.
fn fused(
    a: &[usize],
    b: &[usize],
    vb: View,
    bias: bool,
    activation: Option<UnaryOp>,
    residual: bool,
) -> Sample {
    let r = a.len();
    let (k, n) = (a[r - 1], b[r - 1]);
    let mut out_shape = a[..r - 1].to_vec();
    out_shape.push(n);
    let b_view = vb.describe();
    let mut inputs = operands(a, b, View::Contiguous, vb);
    if bias {
        inputs.push(input(&[n], uniform(-1.0, 1.0)));
    }
    if residual {
        inputs.push(input(&out_shape, uniform(-1.0, 1.0)));
    }
    let act = activation.map_or("none", |u| u.name());
    let op = Op::Matmul {
        bias,
        activation,
        residual,
    };
    Sample::new(
        op,
        format!("{a:?} x {b:?} bias {bias} act {act} residual {residual}{b_view}"),
        inputs,
    )
    .reduce(k)
}

pub(super) fn samples() -> Vec<Sample> {
    let c = || View::Contiguous;
    let mut out = vec![
        plain(&[17, 33], &[33, 9], c(), c()),
        plain(&[65, 257], &[257, 129], c(), c()),
        plain(&[2, 3, 5, 7], &[2, 3, 7, 4], c(), c()),
        plain(
            &[2, 3, 5, 7],
            &[2, 3, 7, 4],
            c(),
            View::Broadcast(vec![7, 4]),
        ),
        plain(
            &[2, 5, 7],
            &[2, 7, 4],
            View::Broadcast(vec![1, 5, 7]),
            View::Offset(3),
        ),
        plain(&[17, 33], &[33, 9], View::Permuted(vec![1, 0]), c()),
        plain(&[17, 33], &[33, 9], c(), View::Permuted(vec![1, 0])),
        plain(
            &[3, 17, 33],
            &[3, 33, 9],
            View::Permuted(vec![0, 2, 1]),
            View::Permuted(vec![1, 0, 2]),
        ),
        plain(&[9, 20], &[20, 6], View::Padded(3), View::Padded(1)),
        plain(&[3, 1030], &[1030, 5], c(), c()),
        plain(&[1, 257], &[257, 300], c(), c()),
        plain(&[1, 1], &[1, 1], c(), c()),
        plain(&[0, 8], &[8, 3], c(), c()),
        plain(&[4, 0], &[0, 5], c(), c()),
        fused(&[4, 0], &[0, 5], c(), true, Some(UnaryOp::Gelu), true),
        // Few rows with b contiguous in k (a linear weight, as in decoding): K past four
        // rounds of the threads per column with a remainder, for each width class (128, 64
        // and 32 threads per column), batches, up to the eight-row limit and one past it.
        plain(&[1, 1030], &[1030, 300], c(), View::Permuted(vec![1, 0])),
        plain(&[2, 520], &[520, 1100], c(), View::Permuted(vec![1, 0])),
        plain(&[1, 300], &[300, 2100], c(), View::Permuted(vec![1, 0])),
        plain(
            &[8, 70],
            &[70, 9],
            View::Padded(2),
            View::Permuted(vec![1, 0]),
        ),
        plain(&[9, 70], &[70, 9], c(), View::Permuted(vec![1, 0])),
        // ... and with K a multiple of 16 bytes' worth (backends may load such rows wide),
        // one row alone and a few with every epilogue.
        plain(&[1, 768], &[768, 96], c(), View::Permuted(vec![1, 0])),
        fused(
            &[3, 512],
            &[512, 70],
            View::Permuted(vec![1, 0]),
            true,
            Some(UnaryOp::Gelu),
            true,
        ),
        fused(
            &[8, 256],
            &[256, 33],
            View::Permuted(vec![1, 0]),
            true,
            None,
            true,
        ),
        // ... and K long enough that backends may split it between threads whose sums meet
        // (decoding's down projection, with an odd number of columns; K shared out unevenly).
        fused(
            &[2, 3072],
            &[3072, 33],
            View::Permuted(vec![1, 0]),
            true,
            None,
            true,
        ),
        plain(&[1, 2056], &[2056, 7], c(), View::Permuted(vec![1, 0])),
        plain(
            &[2, 3, 131],
            &[2, 131, 17],
            c(),
            View::Permuted(vec![0, 2, 1]),
        ),
        fused(
            &[2, 1, 300],
            &[2, 300, 41],
            View::Permuted(vec![0, 2, 1]),
            true,
            Some(UnaryOp::Gelu),
            true,
        ),
        // Few output tiles over a long K (weight gradients) split K: the first as a
        // weight gradient's transposed operand, the second with a broadcast batch and every
        // epilogue.
        plain(&[40, 2100], &[2100, 70], View::Permuted(vec![1, 0]), c()),
        // Rows of an odd length (an LM head's logits) against an operand in whole 16-byte
        // vectors: staged element by element and as vectors in one kernel.
        plain(&[40, 2099], &[2099, 72], c(), c()),
        fused(
            &[2, 20, 1500],
            &[2, 1500, 30],
            View::Broadcast(vec![1500, 30]),
            true,
            Some(UnaryOp::Gelu),
            true,
        ),
        plain(&[2, 3], &[3, 4], c(), c()).gradcheck(),
        // Sizes in whole multiples of 256 x 256 x 32, which tiles of a tensor-core kernel may
        // cover exactly (backends may then load them without bounds checks): batched, a
        // linear weight with a bias and a residual, a transposed operand, an output 64 wide,
        // and a long K that may be split.
        plain(&[2, 256, 64], &[2, 64, 256], c(), c()),
        fused(
            &[256, 96],
            &[96, 512],
            View::Permuted(vec![1, 0]),
            true,
            None,
            true,
        ),
        plain(&[256, 64], &[64, 256], View::Permuted(vec![1, 0]), c()),
        plain(&[2, 256, 32], &[2, 32, 64], c(), c()),
        plain(&[256, 4096], &[4096, 256], View::Permuted(vec![1, 0]), c()).no_backward(),
        // Large products with sizes off multiples of 8, as an LM head's over an odd
        // vocabulary makes them (backends may pad such products for their BLAS): the input
        // gradient (K odd), the weight gradient (a transposed operand, odd output rows), and
        // the forward with a bias. Forward only: their point is size.
        plain(&[1024, 4100], &[4100, 72], c(), c()).no_backward(),
        plain(&[4100, 1024], &[1024, 72], View::Permuted(vec![1, 0]), c()).no_backward(),
        fused(
            &[72, 1024],
            &[1024, 4100],
            View::Permuted(vec![1, 0]),
            true,
            None,
            false,
        )
        .no_backward(),
    ];
    for activation in [
        None,
        Some(UnaryOp::Relu),
        Some(UnaryOp::Gelu),
        Some(UnaryOp::Silu),
    ] {
        for bias in [false, true] {
            for residual in [false, true] {
                if bias || residual || activation.is_some() {
                    out.push(fused(&[13, 31], &[31, 19], c(), bias, activation, residual));
                }
            }
        }
        out.push(fused(&[2, 5, 7], &[2, 7, 3], c(), true, activation, true));
        out.push(fused(&[2, 3], &[3, 4], c(), true, activation, true).gradcheck());
    }
    out
}

/// How a normalized product's sample fills `x` and the norm's parameters.
#[derive(Clone, Copy, PartialEq)]
enum Rows {
    /// Uniform values (f32 and f64, whose rounding of the normalized rows is far below the
    /// tolerance), eps 1e-5.
    Random,
    /// Rows alternating `m + s` and `m - s` for a power of two `s` (`m = 0` for RMS norm),
    /// weights and shifts on a grid of eighths, eps 0: every statistic and normalized value
    /// is exact in f16 and bf16, so rounding the normalized rows to the dtype (which the op
    /// allows a backend to do or not) rounds nothing, and an f64 reference checks the 16-bit
    /// kernels as it checks any product. (With random rows that rounding moves the result by
    /// more than a product's tolerance where terms cancel.)
    Exact,
}

/// Row `r`'s `m` and `s` for [`Rows::Exact`].
fn exact_row(norm: NormKind, r: usize) -> (f64, f64) {
    let m = [0.75, -1.5, 2.0, 0.25][r % 4];
    let s = [0.5, 0.25, 1.0, 2.0][r % 4];
    match norm {
        NormKind::Layer => (m, s),
        NormKind::Rms => (0.0, s),
    }
}

/// A normalized product `norm(x [M, K]) @ b [K, N]` with `b` seen through `b_view` (a linear's
/// weight is `b` transposed), then an epilogue.
#[allow(clippy::too_many_arguments)]
fn normed(
    rows: Rows,
    norm: NormKind,
    [m, k, n]: [usize; 3],
    b_view: View,
    bias: bool,
    activation: Option<UnaryOp>,
    residual: bool,
) -> Sample {
    let b_described = b_view.describe();
    let eighths = |lo: i32, hi: i32| Gen::Values((lo..=hi).map(|i| f64::from(i) / 8.0).collect());
    let (x, weight, shift, eps, dtypes) = match rows {
        Rows::Random => (
            uniform(-2.0, 3.0),
            uniform(0.5, 1.5),
            uniform(-0.5, 0.5),
            1e-5,
            vec![DType::F32, DType::F64],
        ),
        Rows::Exact => {
            let values = (0..m * k)
                .map(|i| {
                    let (mean, s) = exact_row(norm, i / k);
                    if i % 2 == 0 {
                        mean + s
                    } else {
                        mean - s
                    }
                })
                .collect();
            (
                Gen::Values(values),
                eighths(4, 12),
                eighths(-4, 4),
                0.0,
                vec![DType::F16, DType::BF16],
            )
        }
    };
    let mut inputs = vec![
        input(&[m, k], x),
        input(&[k, n], uniform(-1.0, 1.0)).view(b_view),
        input(&[k], weight),
    ];
    if norm == NormKind::Layer {
        inputs.push(input(&[k], shift));
    }
    if bias {
        inputs.push(input(&[n], uniform(-1.0, 1.0)));
    }
    if residual {
        inputs.push(input(&[m, n], uniform(-1.0, 1.0)));
    }
    let act = activation.map_or("none", |u| u.name());
    let exact = if rows == Rows::Exact {
        " exact rows"
    } else {
        ""
    };
    let op = Op::NormMatmul {
        norm,
        bias,
        activation,
        residual,
    };
    Sample::new(
        op,
        format!(
            "{norm:?}{exact} [{m}, {k}] x [{k}, {n}] bias {bias} act {act} residual \
             {residual}{b_described}"
        ),
        inputs,
    )
    .scalars(&[eps])
    .dtypes(&dtypes)
    .reduce(k)
}

/// Normalized products: decoding's (few rows, K in whole 16-byte vectors: one kernel on
/// GPUs) with every epilogue, K over many subgroup strides, many columns, and the shapes that run as the
/// norm and then the product (many rows, K off whole vectors, an untransposed `b`); each with
/// both norms, random rows in f32 and f64 and exact rows in f16 and bf16 ([`Rows`]).
/// Products past one binding are left to the norm's and the matmul's own large samples,
/// which such products run as.
pub(super) fn normed_samples() -> Vec<Sample> {
    let weight = || View::Permuted(vec![1, 0]);
    let mut out = Vec::new();
    for rows in [Rows::Random, Rows::Exact] {
        for norm in [NormKind::Layer, NormKind::Rms] {
            let gelu = Some(UnaryOp::Gelu);
            out.extend([
                normed(rows, norm, [1, 768, 96], weight(), true, None, false),
                normed(rows, norm, [3, 512, 70], weight(), true, gelu, true),
                normed(rows, norm, [8, 256, 33], weight(), true, None, true),
                normed(
                    rows,
                    norm,
                    [2, 2048, 40],
                    weight(),
                    false,
                    Some(UnaryOp::Silu),
                    false,
                ),
                normed(
                    rows,
                    norm,
                    [20, 64, 48],
                    weight(),
                    true,
                    Some(UnaryOp::Relu),
                    true,
                ),
                normed(rows, norm, [2, 34, 9], weight(), true, None, true),
                normed(rows, norm, [1, 64, 40], View::Contiguous, true, None, false),
                // Enough columns that a backend may give each thread group several, one
                // past a whole number of them, and a K past one step of loads.
                normed(rows, norm, [1, 768, 2305], weight(), true, gelu, false),
                normed(rows, norm, [2, 1280, 601], weight(), true, None, true),
            ]);
        }
    }
    out
}
