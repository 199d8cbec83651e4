//! Element types.

use std::fmt;

/// The element type of a buffer.
///
/// Floating types are the ones ops compute on. `F16` and `BF16` are stored as 16-bit values and
/// computed in f32 by every backend (the result is rounded to nearest-even when stored). `Bool`
/// is stored as one byte, 0 or 1. Index tensors (embedding ids, gather indices, targets) are
/// `I32` or `U32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    F64,
    I32,
    U32,
    Bool,
}

impl DType {
    pub const ALL: [DType; 7] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::F64,
        DType::I32,
        DType::U32,
        DType::Bool,
    ];
    /// The floating types, in the order the conformance table lists them.
    pub const FLOATS: [DType; 4] = [DType::F32, DType::F16, DType::BF16, DType::F64];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F64 => 8,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16 | DType::F64)
    }

    /// Types that can index: embedding ids, gather indices, cross-entropy targets.
    pub fn is_index(self) -> bool {
        matches!(self, DType::I32 | DType::U32)
    }

    /// The name used in safetensors files, error messages and the coverage table.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::U32 => "u32",
            DType::Bool => "bool",
        }
    }

    pub fn parse(name: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == name)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Rust element types that map to a [`DType`], for moving data between host and device.
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    const DTYPE: DType;
    /// Converts to f64 exactly (every element type fits).
    fn to_f64(self) -> f64;
    /// Converts from f64: floats round to nearest-even; integers truncate toward zero and
    /// saturate, NaN becomes 0 (Rust `as` semantics); bool is `value != 0`.
    fn from_f64(v: f64) -> Self;
}

macro_rules! element {
    ($t:ty, $d:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = $d;
            fn to_f64(self) -> f64 {
                $to(self)
            }
            fn from_f64(v: f64) -> Self {
                $from(v)
            }
        }
    };
}
element!(f32, DType::F32, |x: f32| x as f64, |v: f64| v as f32);
element!(f64, DType::F64, |x: f64| x, |v: f64| v);
element!(half::f16, DType::F16, |x: half::f16| x.to_f64(), |v| {
    half::f16::from_f32(f32_round_to_odd(v))
});
element!(half::bf16, DType::BF16, |x: half::bf16| x.to_f64(), |v| {
    half::bf16::from_f32(f32_round_to_odd(v))
});

/// f64 to f32 rounding to odd: truncate, and set the last bit if anything was lost. Rounding
/// that to nearest-even f16 or bf16 (both at least two bits shorter than f32) is the correctly
/// rounded result. `half`'s own `from_f64` drops the low 32 mantissa bits before rounding, so
/// values just past a tie can round the wrong way.
fn f32_round_to_odd(x: f64) -> f32 {
    let f = x as f32;
    if x.is_nan() || f64::from(f) == x {
        return f;
    }
    let toward_zero = if f64::from(f).abs() > x.abs() {
        f32::from_bits(f.to_bits() - 1)
    } else {
        f
    };
    f32::from_bits(toward_zero.to_bits() | 1)
}
element!(i32, DType::I32, |x: i32| x as f64, |v: f64| v as i32);
element!(u32, DType::U32, |x: u32| x as f64, |v: f64| v as u32);

/// Encodes host values as the little-endian bytes of `dtype`, with [`Element::from_f64`]'s
/// rounding rules.
pub fn encode_f64(values: &[f64], dtype: DType) -> Vec<u8> {
    fn enc<T: Element>(values: &[f64]) -> Vec<u8> {
        let v: Vec<T> = values.iter().map(|&x| T::from_f64(x)).collect();
        bytemuck::cast_slice(&v).to_vec()
    }
    match dtype {
        DType::F32 => enc::<f32>(values),
        DType::F64 => enc::<f64>(values),
        DType::F16 => enc::<half::f16>(values),
        DType::BF16 => enc::<half::bf16>(values),
        DType::I32 => enc::<i32>(values),
        DType::U32 => enc::<u32>(values),
        DType::Bool => values.iter().map(|&x| u8::from(x != 0.0)).collect(),
    }
}

/// Decodes little-endian bytes of `dtype` into f64 values (exact for every dtype).
pub fn decode_f64(bytes: &[u8], dtype: DType) -> Vec<f64> {
    fn dec<T: Element>(bytes: &[u8]) -> Vec<f64> {
        bytes
            .chunks_exact(std::mem::size_of::<T>())
            .map(|c| bytemuck::pod_read_unaligned::<T>(c).to_f64())
            .collect()
    }
    match dtype {
        DType::F32 => dec::<f32>(bytes),
        DType::F64 => dec::<f64>(bytes),
        DType::F16 => dec::<half::f16>(bytes),
        DType::BF16 => dec::<half::bf16>(bytes),
        DType::I32 => dec::<i32>(bytes),
        DType::U32 => dec::<u32>(bytes),
        DType::Bool => bytes.iter().map(|&b| f64::from(b != 0)).collect(),
    }
}
