//! Matmul samples: batched, broadcast batches, transposed operands, every epilogue, K = 0,
//! few rows, split K, and large products with sizes off multiples of 8.

use tessera::{Op, UnaryOp};

use super::{input, uniform, Input, Sample, View};

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
