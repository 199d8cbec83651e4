//! Typed kernel parameters: each kernel's parameter block is a struct declared once with
//! [`param_block!`], from which both follow: the Rust struct a planner fills by name, and the
//! WGSL `struct Params` the kernel reads as `params.rows`. The words are the fields in order,
//! each `u32`/`f32` one word and arrays their elements, so the WGSL layout (4-byte members,
//! no padding, as storage and immediates lay them out) matches the Rust packing.

/// Bindings one launch may have (the WebGPU default for storage buffers per stage).
pub(crate) const MAX_BINDINGS: usize = 8;

/// One field of a parameter block: its WGSL type and its words.
pub(crate) trait Field {
    /// Words the field takes.
    const WORDS: usize;
    fn wgsl() -> String;
    fn push(&self, words: &mut Vec<u32>);
}

impl Field for u32 {
    const WORDS: usize = 1;
    fn wgsl() -> String {
        "u32".into()
    }
    fn push(&self, words: &mut Vec<u32>) {
        words.push(*self);
    }
}

impl Field for f32 {
    const WORDS: usize = 1;
    fn wgsl() -> String {
        "f32".into()
    }
    fn push(&self, words: &mut Vec<u32>) {
        words.push(self.to_bits());
    }
}

impl<T: Field, const N: usize> Field for [T; N] {
    const WORDS: usize = N * T::WORDS;
    fn wgsl() -> String {
        format!("array<{}, {N}>", T::wgsl())
    }
    fn push(&self, words: &mut Vec<u32>) {
        for v in self {
            v.push(words);
        }
    }
}

/// A kernel's parameter block.
pub(crate) trait ParamBlock {
    /// The WGSL declaration `struct Params { ... }`.
    fn wgsl() -> String;
    /// The words a launch passes, in field order.
    fn words(&self) -> Vec<u32>;
    /// How many words the block takes.
    const WORDS: usize;
    /// The index of field `name`'s first word, for kernels not written in WGSL.
    fn word_of(name: &str) -> Option<usize>;
}

/// Declares a parameter block: `param_block! { /// doc
/// NameParams { /// doc
/// rows: u32, eps: f32, offsets: [u32; MAX_BINDINGS] } }`.
macro_rules! param_block {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default)]
        pub(crate) struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
        }

        impl $crate::params::ParamBlock for $name {
            fn wgsl() -> String {
                let mut s = String::from("struct Params {\n");
                $(
                    s += &format!(
                        "    {}: {},\n",
                        stringify!($field),
                        <$ty as $crate::params::Field>::wgsl()
                    );
                )*
                s + "}\n"
            }

            fn words(&self) -> Vec<u32> {
                let mut words = Vec::new();
                $($crate::params::Field::push(&self.$field, &mut words);)*
                words
            }

            const WORDS: usize = 0 $(+ <$ty as $crate::params::Field>::WORDS)*;

            fn word_of(name: &str) -> Option<usize> {
                let mut at = 0;
                $(
                    if name == stringify!($field) {
                        return Some(at);
                    }
                    at += <$ty as $crate::params::Field>::WORDS;
                )*
                let _ = at;
                None
            }
        }
    };
}
pub(crate) use param_block;

/// The element offsets of a launch's bindings in order (inputs, then outputs), as the
/// `offsets` field of a parameter block.
pub(crate) fn offsets<const N: usize>(o: &[usize]) -> [u32; N] {
    let mut words = [0; N];
    for (w, &o) in words.iter_mut().zip(o) {
        *w = o as u32;
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    param_block! {
        /// A block of every field kind.
        Sample {
            rows: u32,
            eps: f32,
            offsets: [u32; 3],
        }
    }

    #[test]
    fn the_wgsl_declaration_and_the_words_follow_the_fields_in_order() {
        assert_eq!(
            Sample::wgsl(),
            "struct Params {\n    rows: u32,\n    eps: f32,\n    offsets: array<u32, 3>,\n}\n"
        );
        let block = Sample {
            rows: 7,
            eps: 0.5,
            offsets: [1, 2, 3],
        };
        assert_eq!(block.words(), vec![7, 0.5f32.to_bits(), 1, 2, 3]);
        assert_eq!(Sample::word_of("eps"), Some(1));
        assert_eq!(Sample::word_of("offsets"), Some(2));
        assert_eq!(Sample::word_of("columns"), None);
        assert_eq!(Sample::WORDS, block.words().len());
    }

    /// Every kernel's block fits the 64 words that immediates hold.
    #[test]
    fn every_block_fits_immediates() {
        let words = [
            crate::attention::AttentionParams::default().words().len(),
            crate::attention::RotaryParams::default().words().len(),
            crate::conv::Im2colParams::default().words().len(),
            crate::elementwise::MapParams::default().words().len(),
            crate::loss::LossParams::default().words().len(),
            crate::matmul::MatmulParams::default().words().len(),
            crate::movement::MovementParams::default().words().len(),
            crate::norm::NormParams::default().words().len(),
            crate::optim::AdamParams::default().words().len(),
            crate::optim::SgdParams::default().words().len(),
            crate::optim::SquaresParams::default().words().len(),
            crate::optim::SumParams::default().words().len(),
            crate::random::FillParams::default().words().len(),
            crate::random::ArangeParams::default().words().len(),
            crate::random::RandomParams::default().words().len(),
            crate::reduce::ReduceParams::default().words().len(),
        ];
        assert!(words.iter().all(|&w| w <= 64), "{words:?}");
    }
}
