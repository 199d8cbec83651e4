//! Batched matmul with bias, activation and residual epilogues: one register-blocked tiled
//! kernel reading every operand in place through its strides. Each operand's tile loader walks
//! the operand's dimension with the smaller stride (k, or rows / columns), chosen here per
//! launch, so global reads coalesce for plain and transposed layouts alike. f16 matmuls run on
//! cooperative matrices (tensor cores) where the adapter offers them; matmuls of at most
//! [`MAX_FEW_ROWS`] rows run a kernel whose threads split K instead. When few output tiles meet
//! a long K (weight gradients), the tiled kernel splits K over workgroups into partial sums
//! that a second kernel adds in order, so results stay deterministic.

use tessera_core::{DType, Layout, Op, Result, TensorRef, UnaryOp};

use crate::device::Core;
use crate::shader::{groups_for, key, run, run_grid, unsupported, Params};

const SRC: &str = include_str!("kernels/matmul.wgsl");

/// Matmuls with at most this many rows whose `b` is contiguous in k (a `linear` weight) run
/// the few-rows kernel: decoding's matrix-vector products.
const MAX_FEW_ROWS: usize = 8;

/// Threads per output column of the few-rows kernel: more for narrower matrices, so that a
/// matrix-vector product still spreads over enough workgroups to keep memory busy.
fn few_rows_lanes(n: usize) -> usize {
    match n {
        0..1024 => 128,
        1024..2048 => 64,
        _ => 32,
    }
}

/// The per-row code of the few-rows kernel for `m` rows and `lanes` threads per column.
fn few_rows_code(m: usize, lanes: usize) -> Vec<(&'static str, String)> {
    let each = |t: &str| {
        (0..m)
            .map(|r| t.replace('#', &r.to_string()))
            .collect::<String>()
    };
    let a = |k: &str| format!("ld1(a_base + #u * sam + ({k}) * sak)");
    let mac4 = "let w0 = ld2(bn + kk * sbk);\nlet w1 = ld2(bn + (kk + LANES) * sbk);\n\
                let w2 = ld2(bn + (kk + 2u * LANES) * sbk);\nlet w3 = ld2(bn + (kk + 3u * LANES) * sbk);\n"
        .to_string()
        + &each(&format!(
            "acc# += {} * w0 + {} * w1 + {} * w2 + {} * w3;\n",
            a("kk"),
            a("kk + LANES"),
            a("kk + 2u * LANES"),
            a("kk + 3u * LANES")
        ));
    vec![
        ("LANES_U", format!("{lanes}u")),
        ("PARTS", (m.max(1) * 256).to_string()),
        ("ZERO", each("var acc# = 0.0;\n")),
        ("MAC4", mac4),
        (
            "MAC1",
            "let w0 = ld2(bn + kk * sbk);\n".to_string()
                + &each(&format!("acc# += {} * w0;\n", a("kk"))),
        ),
        ("SAVE", each("part[#u * 256u + lid] = acc#;\n")),
    ]
}

/// The tensor-core kernel's staging code: each thread's sixteen elements of each operand per
/// step, held in named variables between the fetch and the store to workgroup memory.
fn coop_staging_code() -> Vec<(&'static str, String)> {
    let each = |t: &str| {
        (0..16)
            .map(|j| t.replace('#', &j.to_string()))
            .collect::<String>()
    };
    vec![
        ("DECLARE", each("var xa#: f16;\nvar xb#: f16;\n")),
        (
            "FETCH",
            each(
                "xa# = elem_a(lid + 256u * #u, m, k, m0, k0, a_base);\n\
                 xb# = elem_b(lid + 256u * #u, n, k, n0, k0, b_base);\n",
            ),
        ),
        (
            "STASH",
            each("put_a(lid + 256u * #u, xa#);\nput_b(lid + 256u * #u, xb#);\n"),
        ),
    ]
}

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
    let batch: usize = a.layout.shape[..r - 2].iter().product();
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
    let mut subst = vec![
        ("EPILOGUE", epilogue),
        ("STORE", format!("st{next}")),
        ("A_AT", a_at.to_string()),
        ("B_AT", b_at.to_string()),
    ];
    let few_rows = m <= MAX_FEW_ROWS && b_at == "along_k";
    let tensor_cores = core.coop_f16() && a.dtype == DType::F16 && b.dtype == DType::F16;
    let tile_grid = [
        core.dim(n.div_ceil(128)),
        core.dim(m.div_ceil(128)),
        core.dim(batch),
    ];
    let mut problem = Problem {
        inputs,
        m,
        n,
        k,
        batch,
        bias_at,
        res_at,
        splits: 1,
        k_per_split: k,
    };
    let (section, variant, grid) = if few_rows {
        let lanes = few_rows_lanes(n);
        subst.extend(few_rows_code(m, lanes));
        let grid = [core.dim(n.div_ceil(256 / lanes)), 1, core.dim(batch)];
        ("rows", format!("rows{m}x{lanes}"), grid)
    } else if tensor_cores {
        subst[2].1 = a_at.replace("along", "coop");
        subst[3].1 = b_at.replace("along", "coop");
        subst.extend(coop_staging_code());
        ("coop", format!("coop/{a_at}/{b_at}"), tile_grid)
    } else {
        let tile_count = m.div_ceil(128) * n.div_ceil(128) * batch;
        let (splits, k_per_split) = split_k(tile_count, k);
        let partial_bytes = 4 * batch * splits * m * n;
        if splits > 1 && partial_bytes as u64 <= core.max_binding() {
            problem.splits = splits;
            problem.k_per_split = k_per_split;
            return launch_split(core, op, outputs, subst, &problem, tile_grid, partial_bytes);
        }
        ("matmul", format!("tiled128/{a_at}/{b_at}"), tile_grid)
    };
    let grid = if m * n * batch == 0 { [0, 0, 0] } else { grid };
    run_grid(
        core,
        &key(op, inputs, outputs, &variant),
        SRC,
        section,
        &subst,
        inputs,
        outputs,
        grid,
        |o, p| problem.params(o, p),
    )
}

/// Output tiles fewer than this leave SMs idle on large GPUs: the tiled kernel then splits K.
const SPLIT_K_TILES: usize = 264;
/// The least k a split takes.
const MIN_K_PER_SPLIT: usize = 512;

/// How the tiled kernel splits K for `tiles` output tiles: (splits, k per split, a multiple
/// of the kernel's k step).
fn split_k(tiles: usize, k: usize) -> (usize, usize) {
    if tiles >= SPLIT_K_TILES || k < 2 * MIN_K_PER_SPLIT {
        return (1, k);
    }
    let splits = SPLIT_K_TILES.div_ceil(tiles).min(k / MIN_K_PER_SPLIT);
    let k_per_split = k.div_ceil(splits).next_multiple_of(8);
    (k.div_ceil(k_per_split), k_per_split)
}

/// The tiled kernel over K in `problem.splits` parts into f32 partial sums, then
/// `sum_splits` adding them in order and applying the epilogue.
fn launch_split(
    core: &Core,
    op: &Op,
    outputs: &[TensorRef<'_>],
    subst: Vec<(&'static str, String)>,
    problem: &Problem<'_>,
    tile_grid: [u32; 3],
    partial_bytes: usize,
) -> Result<()> {
    let inputs = problem.inputs;
    let partials = core.scratch(partial_bytes)?;
    let layout = Layout::contiguous(&[partial_bytes / 4]);
    let sums = TensorRef {
        buffer: &partials,
        layout: &layout,
        dtype: DType::F32,
    };
    let raw = [("EPILOGUE", String::new()), ("STORE", "st3".to_string())];
    let mut split_subst = subst.clone();
    split_subst[..2].clone_from_slice(&raw);
    let variant = format!("tiled128/{}/{}/split", subst[2].1, subst[3].1);
    let parts = Problem {
        inputs: &inputs[..2],
        bias_at: None,
        res_at: None,
        ..*problem
    };
    run_grid(
        core,
        &key(op, &inputs[..2], &[sums], &variant),
        SRC,
        "matmul",
        &split_subst,
        &inputs[..2],
        &[sums],
        [
            tile_grid[0],
            tile_grid[1],
            core.dim(problem.batch * problem.splits),
        ],
        |o, p| parts.params(o, p),
    )?;
    let mut finish = inputs.to_vec();
    finish[0] = sums;
    run(
        core,
        &key(op, &finish, outputs, "sum_splits"),
        SRC,
        "sum_splits",
        &subst[..2],
        &finish,
        outputs,
        groups_for(problem.batch * problem.m * problem.n),
        |o, p| problem.params(o, p),
    )
}

/// One matmul launch's sizes and operands, which its parameters are made from.
#[derive(Clone, Copy)]
struct Problem<'a> {
    inputs: &'a [TensorRef<'a>],
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    /// Bindings (from 1) of the bias and the residual.
    bias_at: Option<usize>,
    res_at: Option<usize>,
    splits: usize,
    k_per_split: usize,
}

impl Problem<'_> {
    /// The parameters the kernels read (`kernels/matmul.wgsl`), given the bindings' offsets.
    fn params(&self, o: &[usize], p: &mut Params) {
        let inputs = self.inputs;
        let (a, b) = (&inputs[0].layout, &inputs[1].layout);
        let r = a.rank();
        p.u(self.m).u(self.n).u(self.k).u(self.batch).u(r - 2);
        p.u(o[0]).u(a.strides[r - 2]).u(a.strides[r - 1]);
        p.u(o[1]).u(b.strides[r - 2]).u(b.strides[r - 1]);
        match self.bias_at {
            Some(i) => p.u(o[i - 1]).u(inputs[i - 1].layout.strides[0]),
            None => p.u(0).u(0),
        };
        let res = self.res_at.map(|i| &inputs[i - 1].layout);
        match (self.res_at, res) {
            (Some(i), Some(t)) => p.u(o[i - 1]).u(t.strides[r - 2]).u(t.strides[r - 1]),
            _ => p.u(0).u(0).u(0),
        };
        p.u(o[inputs.len()]);
        p.all(&a.shape[..r - 2])
            .all(&a.strides[..r - 2])
            .all(&b.strides[..r - 2]);
        match res {
            Some(t) => p.all(&t.strides[..r - 2]),
            None => p.all(&vec![0; r - 2]),
        };
        p.u(self.splits).u(self.k_per_split);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shader::source;

    /// The tensor-core kernel runs only on adapters with cooperative matrices (not lavapipe),
    /// so its WGSL is at least checked everywhere: parsed and validated as the device would.
    #[test]
    fn the_tensor_core_kernel_is_valid_wgsl() {
        let f16 = |output| (DType::F16, output);
        for (a_at, b_at, epilogue, bindings) in [
            ("coop_k", "coop_mn", "", vec![f16(false), f16(false), f16(true)]),
            (
                "coop_mn",
                "coop_k",
                "v += ld3(p[11] + gn * p[12]);\nv = gelu(v);\nv += ld4(r_base + gm * p[14] + gn * p[15]);\n",
                vec![f16(false), f16(false), f16(false), f16(false), f16(true)],
            ),
        ] {
            let store = format!("st{}", bindings.len());
            let subst = [
                ("EPILOGUE", epilogue.to_string()),
                ("STORE", store),
                ("A_AT", a_at.to_string()),
                ("B_AT", b_at.to_string()),
            ];
            let mut subst = subst.to_vec();
            subst.extend(coop_staging_code());
            let src = source(SRC, "coop", &bindings, &subst);
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .subgroup_stages(naga::valid::ShaderStages::COMPUTE)
            .subgroup_operations(naga::valid::SubgroupOperationSet::all())
            .validate(&module)
            .unwrap_or_else(|e| panic!("{}", e.emit_to_string(&src)));
        }
    }
}
