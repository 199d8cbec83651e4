//! Batched matmul with bias, activation and residual epilogues: one register-blocked tiled
//! kernel reading every operand in place through its strides. Each operand's tile loader walks
//! the operand's dimension with the smaller stride (k, or rows / columns), chosen here per
//! launch, so global reads coalesce for plain and transposed layouts alike.

use tessera_core::{Op, Result, TensorRef, UnaryOp};

use crate::device::Core;
use crate::shader::{key, run_grid, unsupported};

const SRC: &str = include_str!("kernels/matmul.wgsl");

pub(crate) fn launch(
    core: &Core,
    op: &Op,
    inputs: &[TensorRef<'_>],
    outputs: &[TensorRef<'_>],
) -> Result<()> {
    let Op::Matmul {
        bias,
        activation,
        residual,
    } = op
    else {
        return Err(unsupported(op));
    };
    let (a, b) = (&inputs[0], &inputs[1]);
    let r = a.layout.rank();
    let (m, k, n) = (
        a.layout.shape[r - 2],
        a.layout.shape[r - 1],
        b.layout.shape[r - 1],
    );
    let batch_shape = &a.layout.shape[..r - 2];
    let batch: usize = batch_shape.iter().product();
    let mut epilogue = String::new();
    let mut next = 3;
    let bias_at = (*bias).then(|| {
        next += 1;
        next - 1
    });
    let res_at = (*residual).then(|| {
        next += 1;
        next - 1
    });
    if let Some(i) = bias_at {
        epilogue += &format!("v += ld{i}(p[11] + gn * p[12]);\n");
    }
    match activation {
        Some(UnaryOp::Relu) => epilogue += "v = relu(v);\n",
        Some(UnaryOp::Gelu) => epilogue += "v = gelu(v);\n",
        Some(UnaryOp::Silu) => epilogue += "v = silu(v);\n",
        Some(_) => return Err(unsupported(op)),
        None => {}
    }
    if let Some(i) = res_at {
        epilogue += &format!("v += ld{i}(r_base + gm * p[14] + gn * p[15]);\n");
    }
    let (sa, sb) = (&a.layout.strides, &b.layout.strides);
    let along = |k_fast: bool| if k_fast { "along_k" } else { "along_mn" };
    let (a_at, b_at) = (along(sa[r - 1] <= sa[r - 2]), along(sb[r - 2] <= sb[r - 1]));
    let subst = [
        ("EPILOGUE", epilogue),
        ("STORE", format!("st{next}")),
        ("A_AT", a_at.to_string()),
        ("B_AT", b_at.to_string()),
    ];
    let grid = if m * n * batch == 0 {
        [0, 0, 0]
    } else {
        [
            core.dim(n.div_ceil(128)),
            core.dim(m.div_ceil(128)),
            core.dim(batch),
        ]
    };
    let bs = |t: &TensorRef<'_>| t.layout.strides[..r - 2].to_vec();
    run_grid(
        core,
        &key(op, inputs, outputs, &format!("tiled128/{a_at}/{b_at}")),
        SRC,
        "matmul",
        &subst,
        inputs,
        outputs,
        grid,
        |o, p| {
            p.u(m).u(n).u(k).u(batch).u(r - 2);
            p.u(o[0])
                .u(a.layout.strides[r - 2])
                .u(a.layout.strides[r - 1]);
            p.u(o[1])
                .u(b.layout.strides[r - 2])
                .u(b.layout.strides[r - 1]);
            match bias_at {
                Some(i) => p.u(o[i - 1]).u(inputs[i - 1].layout.strides[0]),
                None => p.u(0).u(0),
            };
            let res = res_at.map(|i| &inputs[i - 1]);
            match res_at {
                Some(i) => p
                    .u(o[i - 1])
                    .u(inputs[i - 1].layout.strides[r - 2])
                    .u(inputs[i - 1].layout.strides[r - 1]),
                None => p.u(0).u(0).u(0),
            };
            p.u(o[inputs.len()]);
            p.all(batch_shape).all(&bs(a)).all(&bs(b));
            match res {
                Some(t) => p.all(&bs(t)),
                None => p.all(&vec![0; r - 2]),
            };
        },
    )
}
