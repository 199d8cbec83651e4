// Helpers every kernel gets. The launch's parameter block, `params` (declared before this
// file: immediates, or a window of the submission's parameter buffer), is the kernel's own.

const WG: u32 = 256u;

fn nan() -> f32 { return bitcast<f32>(0x7fc00000u); }
fn inf() -> f32 { return bitcast<f32>(0x7f800000u); }
// NaN test on the bits, immune to compilers that assume finite math.
fn is_nan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }

// The flat index of a workgroup in a 2-D grid, and the number of workgroups.
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 { return wid.x + wid.y * nwg.x; }
fn group_count(nwg: vec3<u32>) -> u32 { return nwg.x * nwg.y; }

// Float to integer as `Cast` defines it: truncate toward zero, saturate, NaN to 0.
fn f2i(v: f32) -> i32 {
    if (is_nan(v)) { return 0; }
    if (v >= 2147483648.0) { return 2147483647; }
    if (v <= -2147483648.0) { return -2147483647 - 1; }
    return i32(v);
}
fn f2u(v: f32) -> u32 {
    if (is_nan(v) || v <= 0.0) { return 0u; }
    if (v >= 4294967296.0) { return 4294967295u; }
    return u32(v);
}

// `0 * x` without the compiler folding it to 0: NaN for NaN and infinite `x`.
fn zero_times(x: f32) -> f32 { if (is_nan(x) || abs(x) == inf()) { return nan(); } return 0.0; }

fn max_nan(a: f32, b: f32) -> f32 { if (is_nan(a) || is_nan(b)) { return nan(); } return max(a, b); }
fn min_nan(a: f32, b: f32) -> f32 { if (is_nan(a) || is_nan(b)) { return nan(); } return min(a, b); }

// tanh from one exponential of a non-positive argument: no overflow for large |x|.
fn tanh_s(x: f32) -> f32 {
    if (is_nan(x)) { return x; }
    let ax = abs(x);
    if (ax < 0.0004) { return x; }
    let e = exp(-2.0 * ax);
    let t = (1.0 - e) / (1.0 + e);
    return select(t, -t, x < 0.0);
}
fn sigmoid(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
fn silu(x: f32) -> f32 { return x / (1.0 + exp(-x)); }
const GELU_K: f32 = 0.7978845608028654;
fn gelu(x: f32) -> f32 { return 0.5 * x * (1.0 + tanh_s(GELU_K * (x + 0.044715 * x * x * x))); }
fn relu(x: f32) -> f32 { if (x > 0.0 || is_nan(x)) { return x; } return 0.0; }

// powf as Rust defines it, including negative bases with integral exponents.
fn powf(x: f32, y: f32) -> f32 {
    if (y == 0.0 || x == 1.0) { return 1.0; }
    if (is_nan(x) || is_nan(y)) { return nan(); }
    let ax = abs(x);
    var r: f32;
    if (ax == 0.0) {
        r = select(0.0, inf(), y < 0.0);
    } else if (ax == inf()) {
        r = select(inf(), 0.0, y < 0.0);
    } else if (y == 1.0) {
        r = ax;
    } else if (y == 2.0) {
        r = ax * ax;
    } else {
        r = exp2(y * log2(ax));
    }
    if (x < 0.0 || (x == 0.0 && bitcast<u32>(x) != 0u)) {
        if (floor(y) != y) {
            if (x == 0.0 || ax == inf()) { return r; }
            return nan();
        }
        let odd = abs(y) < 16777216.0 && (u32(abs(y)) & 1u) == 1u;
        if (odd) { return -r; }
    }
    return r;
}

// Workgroup scratch of one f32 per thread, for reductions.
var<workgroup> red: array<f32, 256>;
