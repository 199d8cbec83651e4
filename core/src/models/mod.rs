//! GPT-2 and Llama families: one decoder-only [`Transformer`] whose parts follow the config's
//! [`Family`], with Hugging Face names, loading and saving.

mod config;
mod hf;
mod transformer;

pub use config::{Family, TransformerConfig};
pub use hf::hf_stop_tokens;
pub use transformer::{Block, Transformer};
