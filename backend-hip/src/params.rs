//! Kernel parameter structs, declared once with [`hip_params!`]: the Rust struct a planner
//! fills by name, and the C++ `struct Params` the kernel takes by value, whose bytes
//! [`Params::bytes`] lays out as the C ABI does (each field at its natural alignment, the size
//! rounded to the largest), so the two agree by construction.

/// One field type of a parameter struct.
pub(crate) trait Field {
    /// The C++ declaration of a field `name` of this type.
    fn cxx(name: &str) -> String;
    fn align() -> usize;
    fn push(&self, bytes: &mut Vec<u8>);
}

macro_rules! scalar_field {
    ($ty:ty, $cxx:literal) => {
        impl Field for $ty {
            fn cxx(name: &str) -> String {
                format!("{} {name}", $cxx)
            }
            fn align() -> usize {
                std::mem::size_of::<$ty>()
            }
            fn push(&self, bytes: &mut Vec<u8>) {
                pad_to(bytes, Self::align());
                bytes.extend_from_slice(&self.to_ne_bytes());
            }
        }
    };
}

scalar_field!(u32, "unsigned int");
scalar_field!(i32, "int");
scalar_field!(f32, "float");
scalar_field!(u64, "unsigned long long");
scalar_field!(i64, "long long");

impl<T: Field, const N: usize> Field for [T; N] {
    /// `T name[N]`, with an array element's own extents after `[N]` (`[[u32; 8]; 5]` is
    /// `unsigned int name[5][8]`).
    fn cxx(name: &str) -> String {
        T::cxx(&format!("{name}[{N}]"))
    }
    fn align() -> usize {
        T::align()
    }
    fn push(&self, bytes: &mut Vec<u8>) {
        for v in self {
            v.push(bytes);
        }
    }
}

pub(crate) fn pad_to(bytes: &mut Vec<u8>, align: usize) {
    bytes.resize(bytes.len().next_multiple_of(align), 0);
}

/// A kernel's parameter struct.
pub(crate) trait Params {
    /// The C++ declaration `struct Params { ... };`.
    fn cxx() -> String;
    /// The struct's bytes as the kernel receives them.
    fn bytes(&self) -> Vec<u8>;
}

/// Declares a parameter struct: `hip_params! { /// doc
/// NormParams { /// doc
/// x: u64, rows: u32, eps: f32 } }`. Device addresses are `u64` fields.
macro_rules! hip_params {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default)]
        pub(crate) struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
        }

        impl $crate::params::Params for $name {
            fn cxx() -> String {
                let mut s = String::from("struct Params {\n");
                $(
                    s += &format!(
                        "    {};\n",
                        <$ty as $crate::params::Field>::cxx(stringify!($field))
                    );
                )*
                s + "};\n"
            }

            fn bytes(&self) -> Vec<u8> {
                let mut bytes = Vec::new();
                let mut align = 1;
                $(
                    $crate::params::Field::push(&self.$field, &mut bytes);
                    align = align.max(<$ty as $crate::params::Field>::align());
                )*
                $crate::params::pad_to(&mut bytes, align);
                bytes
            }
        }
    };
}
pub(crate) use hip_params;

#[cfg(test)]
mod tests {
    use super::*;

    hip_params! {
        /// A struct of every field kind, with padding where the C ABI puts it.
        Sample {
            rows: u32,
            ptr: u64,
            eps: f32,
            dims: [i64; 2],
            last: u32,
            table: [[u32; 3]; 2],
        }
    }

    #[test]
    fn the_cxx_declaration_and_the_bytes_follow_the_c_abi() {
        assert_eq!(
            Sample::cxx(),
            "struct Params {\n    unsigned int rows;\n    unsigned long long ptr;\n    float eps;\n    long long dims[2];\n    unsigned int last;\n    unsigned int table[2][3];\n};\n"
        );
        let bytes = Sample {
            rows: 7,
            ptr: 9,
            eps: 0.5,
            dims: [1, 2],
            last: 3,
            table: [[4, 5, 6], [7, 8, 9]],
        }
        .bytes();
        // rows, pad, ptr, eps, pad, dims, last, table (row by row), pad to 8.
        assert_eq!(bytes.len(), 4 + 4 + 8 + 4 + 4 + 16 + 4 + 24 + 4);
        assert_eq!(&bytes[44..48], &4u32.to_ne_bytes());
        assert_eq!(&bytes[56..60], &7u32.to_ne_bytes());
        assert_eq!(&bytes[8..16], &9u64.to_ne_bytes());
        assert_eq!(&bytes[16..20], &0.5f32.to_ne_bytes());
        assert_eq!(&bytes[24..32], &1i64.to_ne_bytes());
        assert_eq!(&bytes[40..44], &3u32.to_ne_bytes());
    }
}
