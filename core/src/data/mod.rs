//! Training data: tokenizers (built-in, and Hugging Face `tokenizer.json` files), text files cut into random training windows, and the built-in
//! addition task that the default `train` uses because it needs no download.
//!
//! Everything here works on host token ids (`Vec<u32>`); callers turn them into tensors with
//! [`Tensor::from_slice`](crate::Tensor::from_slice). All sampling draws from a
//! [`RngState`](crate::rng::RngState), whose two integers are saved in checkpoints, so a
//! resumed run sees exactly the batches the uninterrupted run would have seen: the RNG state
//! *is* the data position.

mod addition;
mod hf_tokenizer;
mod text;
mod tokenizer;
mod tokenizer_record;

pub use addition::{parse_problem, AdditionTask, AdditionTokenizer, SUCCESS_BAR};
pub use hf_tokenizer::HfTokenizer;
pub use text::{Split, TextDataset, DEFAULT_VAL_FRACTION};
pub use tokenizer::{ByteTokenizer, Gpt2Tokenizer, TextStream, Tokenizer};
pub use tokenizer_record::from_record;

/// The target value that training ignores: core's cross-entropy gives zero loss (and zero
/// gradient) to any target outside `0..V`, and `u32::MAX` is outside every vocabulary. Targets
/// stay `u32` end to end so that token ids and targets share one type and one tensor dtype.
pub const IGNORE_TARGET: u32 = u32::MAX;
