//! Tokenizers: text to token ids and back.

use crate::{Error, Result};

/// Turns text into token ids and back. Implementations are immutable after construction, so
/// one tokenizer can be shared across threads (data loading, generation).
pub trait Tokenizer: Send + Sync {
    /// The token ids of `text`.
    fn encode(&self, text: &str) -> Vec<u32>;

    /// The text of `tokens`. Byte sequences that are not valid UTF-8 (a multi-byte character
    /// cut between tokens, or ids outside the vocabulary) become U+FFFD rather than an error,
    /// because generation streams arbitrary prefixes.
    fn decode(&self, tokens: &[u32]) -> String;

    /// The number of distinct token ids; every id from [`encode`](Tokenizer::encode) is below it.
    fn vocab_size(&self) -> usize;

    /// A short name for logs and checkpoint metadata (`"byte"`, `"gpt2"`).
    fn name(&self) -> &str;

    /// The end-of-text token, if the vocabulary has one; generation stops on it.
    fn eos(&self) -> Option<u32> {
        None
    }
}

/// One token per byte of UTF-8: vocabulary 256, no merges and no special tokens. It needs no
/// data files and handles any text, which makes it the tokenizer for small models and tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Vec<u32> {
        text.bytes().map(u32::from).collect()
    }

    fn decode(&self, tokens: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(tokens.len());
        for &t in tokens {
            match u8::try_from(t) {
                Ok(b) => bytes.push(b),
                Err(_) => bytes.extend_from_slice(REPLACEMENT.as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn vocab_size(&self) -> usize {
        256
    }

    fn name(&self) -> &str {
        "byte"
    }
}

/// U+FFFD, written in place of ids a vocabulary does not have.
const REPLACEMENT: &str = "\u{FFFD}";

/// GPT-2's byte-level BPE (the `r50k_base` ranks, 50,257 tokens). The ranks are compiled into
/// the `tiktoken-rs` crate with `include_str!`, so construction never touches the network or
/// the file system.
pub struct Gpt2Tokenizer {
    bpe: tiktoken_rs::CoreBPE,
}

/// GPT-2's `<|endoftext|>`, the last id of its vocabulary.
const GPT2_EOS: u32 = 50256;

impl Gpt2Tokenizer {
    /// Parses the embedded ranks (tens of milliseconds): build one and share it.
    pub fn new() -> Result<Self> {
        let bpe = tiktoken_rs::r50k_base()
            .map_err(|e| Error::format("tiktoken-rs r50k_base", e.to_string()))?;
        Ok(Gpt2Tokenizer { bpe })
    }
}

impl std::fmt::Debug for Gpt2Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Gpt2Tokenizer")
    }
}

impl Tokenizer for Gpt2Tokenizer {
    /// `<|endoftext|>` in the text becomes the single token 50256, as with Hugging Face's GPT-2
    /// tokenizer, because corpora use it to separate documents.
    fn encode(&self, text: &str) -> Vec<u32> {
        self.bpe.encode_with_special_tokens(text)
    }

    fn decode(&self, tokens: &[u32]) -> String {
        let mut bytes = Vec::with_capacity(tokens.len() * 4);
        for &t in tokens {
            match self.bpe.decode_bytes(&[t]) {
                Ok(b) => bytes.extend_from_slice(&b),
                Err(_) => bytes.extend_from_slice(REPLACEMENT.as_bytes()),
            }
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    fn vocab_size(&self) -> usize {
        GPT2_EOS as usize + 1
    }

    fn name(&self) -> &str {
        "gpt2"
    }

    fn eos(&self) -> Option<u32> {
        Some(GPT2_EOS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_round_trip() {
        let t = ByteTokenizer;
        let text = "héllo, wörld\n";
        let ids = t.encode(text);
        assert_eq!(ids.len(), text.len());
        assert!(ids.iter().all(|&i| i < 256));
        assert_eq!(t.decode(&ids), text);
        assert_eq!(t.vocab_size(), 256);
        assert_eq!(t.eos(), None);
    }

    #[test]
    fn byte_decode_is_lossy() {
        let t = ByteTokenizer;
        assert_eq!(t.decode(&[0xC3]), "\u{FFFD}");
        assert_eq!(t.decode(&[104, 1000, 105]), "h\u{FFFD}i");
    }

    #[test]
    fn gpt2_known_ids() {
        let t = Gpt2Tokenizer::new().unwrap();
        let ids = t.encode("Hello world");
        assert_eq!(ids, vec![15496, 995]);
        assert_eq!(t.decode(&ids), "Hello world");
        assert_eq!(t.eos(), Some(50256));
        assert_eq!(t.vocab_size(), 50257);
        assert_eq!(t.encode("a<|endoftext|>b"), vec![64, 50256, 65]);
        let text = "Unicode: ünïcödé 🦀 and spaces  \n";
        assert_eq!(t.decode(&t.encode(text)), text);
        assert_eq!(t.decode(&[15496, 60000]), "Hello\u{FFFD}");
    }
}
