//! The code that finishes a matmul's outputs (bias, activation, residual, store), as the
//! matmul kernels generate it.

use tessera_core::{Op, UnaryOp};

/// The code that finishes each output value `v` after the products: bias, activation,
/// residual, and the store into the output binding.
pub(crate) struct Epilogue {
    pub(crate) code: String,
    pub(crate) store: String,
    /// Bindings (from 1) of the bias and the residual.
    pub(crate) bias_at: Option<usize>,
    pub(crate) res_at: Option<usize>,
    /// The activation as the kernels' `activate` reads it from the parameters.
    pub(crate) activation: usize,
}

impl Epilogue {
    /// The epilogue of a matmul op; `None` for an activation the kernels lack.
    pub(crate) fn of(op: &Op) -> Option<Epilogue> {
        // The epilogue's operands follow a and b (and a normalized product's norm).
        let (bias, activation, residual, mut next) = match op {
            Op::Matmul {
                bias,
                activation,
                residual,
            } => (bias, activation, residual, 3),
            Op::NormMatmul {
                norm,
                bias,
                activation,
                residual,
            } => (bias, activation, residual, 3 + norm.params()),
            _ => return None,
        };
        let mut code = String::new();
        let bias_at = bias.then(|| {
            next += 1;
            next - 1
        });
        let res_at = residual.then(|| {
            next += 1;
            next - 1
        });
        if let Some(i) = bias_at {
            code += &format!("v += {};\n", bias_load(i));
        }
        let activation = match activation {
            None => 0,
            Some(UnaryOp::Relu) => 1,
            Some(UnaryOp::Gelu) => 2,
            Some(UnaryOp::Silu) => 3,
            Some(_) => return None,
        };
        if activation > 0 {
            code += "v = activate(v);\n";
        }
        if let Some(i) = res_at {
            code += &format!("v += {};\n", residual_load(i, "gm"));
        }
        Some(Epilogue {
            code,
            store: format!("st{next}"),
            bias_at,
            res_at,
            activation,
        })
    }

    /// The epilogue for a kernel that reads its operands before the products (`rows_wide`,
    /// `rows_normed`),
    /// generated when it compiles: the loads of column `gn`'s bias into `eb`, of row `#`'s
    /// residual into `er#` (once per row), and the code applying them to `v`, row `#`'s sum.
    pub(crate) fn early_late(&self) -> (String, String, String) {
        let (mut early, mut early_row, mut late) = (String::new(), String::new(), String::new());
        if let Some(i) = self.bias_at {
            early += &format!("let eb = {};\n", bias_load(i));
            late += "v += eb;\n";
        }
        if self.activation > 0 {
            late += "v = activate(v);\n";
        }
        if let Some(i) = self.res_at {
            early_row += &format!("let er# = {};\n", residual_load(i, "#u"));
            late += "v += er#;\n";
        }
        (early, early_row, late)
    }
}

/// The bias of column `gn`, from binding `i`.
fn bias_load(i: usize) -> String {
    format!("ld{i}(params.bias_offset + gn * params.bias_stride)")
}

/// The residual of output (`row`, `gn`), from binding `i`.
fn residual_load(i: usize, row: &str) -> String {
    format!("ld{i}(r_base + {row} * params.res_row_stride + gn * params.res_col_stride)")
}
