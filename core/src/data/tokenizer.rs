//! Tokenizers: text to token ids and back.

use serde_json::Value;

use crate::{Error, Result};

/// Turns text into token ids and back. Implementations are immutable after construction, so
/// one tokenizer can be shared across threads (data loading, generation).
pub trait Tokenizer: Send + Sync {
    /// The token ids of `text`.
    fn encode(&self, text: &str) -> Result<Vec<u32>>;

    /// The text of `tokens`. Byte sequences that are not valid UTF-8 (a multi-byte character
    /// cut between tokens, or ids outside the vocabulary) become U+FFFD rather than an error,
    /// because generation streams arbitrary prefixes.
    fn decode(&self, tokens: &[u32]) -> String;

    /// The number of distinct token ids; every id from [`encode`](Tokenizer::encode) is below it.
    fn vocab_size(&self) -> usize;

    /// A short name for logs (`"byte"`, `"gpt2"`, `"tokenizer.json"`).
    fn name(&self) -> &str;

    /// The end-of-text token, if the vocabulary has one; generation stops on it.
    fn eos(&self) -> Option<u32> {
        None
    }

    /// What a checkpoint stores to rebuild this tokenizer with [`from_record`](super::from_record): the name of a
    /// built-in tokenizer, or everything a file-based one needs.
    fn record(&self) -> Value {
        Value::String(self.name().to_string())
    }
}

/// Text of generated tokens as soon as it is whole. Decoding one token at a time is wrong for
/// most tokenizers (SentencePiece drops the space that starts a token decoded alone; byte
/// pieces of one character arrive as several tokens), so each new token is decoded with a few
/// before it, and only the text beyond theirs is released, once it does not end in a cut
/// character (the approach of Hugging Face's `DecodeStream`).
pub struct TextStream<'a> {
    tokenizer: &'a dyn Tokenizer,
    tokens: Vec<u32>,
    /// Start of the context decoded with each new token.
    prefix: usize,
    /// End of the tokens whose text is out.
    read: usize,
}

/// Tokens of context decoded before new ones (enough for any tokenizer's merges of spacing).
const STREAM_CONTEXT: usize = 4;

impl<'a> TextStream<'a> {
    /// A stream continuing `prompt`, whose text the caller has already shown.
    pub fn new(tokenizer: &'a dyn Tokenizer, prompt: &[u32]) -> Self {
        let tail = &prompt[prompt.len().saturating_sub(STREAM_CONTEXT)..];
        TextStream {
            tokenizer,
            tokens: tail.to_vec(),
            prefix: 0,
            read: tail.len(),
        }
    }

    /// Adds a token; returns the text that is now whole (often empty while a character is cut).
    pub fn push(&mut self, token: u32) -> String {
        self.tokens.push(token);
        let shown = self.tokenizer.decode(&self.tokens[self.prefix..self.read]);
        let now = self.tokenizer.decode(&self.tokens[self.prefix..]);
        if now.ends_with(REPLACEMENT) {
            return String::new();
        }
        let Some(new) = now.strip_prefix(shown.as_str()) else {
            return String::new();
        };
        let new = new.to_string();
        self.advance();
        new
    }

    /// The text still held back (a cut character at the end becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        if self.read == self.tokens.len() {
            return String::new();
        }
        let shown = self.tokenizer.decode(&self.tokens[self.prefix..self.read]);
        let now = self.tokenizer.decode(&self.tokens[self.prefix..]);
        self.advance();
        match now.strip_prefix(shown.as_str()) {
            Some(new) => new.to_string(),
            None => now,
        }
    }

    fn advance(&mut self) {
        self.read = self.tokens.len();
        self.prefix = self.read.saturating_sub(STREAM_CONTEXT);
        if self.prefix > 4 * STREAM_CONTEXT {
            self.tokens.drain(..self.prefix);
            self.read -= self.prefix;
            self.prefix = 0;
        }
    }
}

/// One token per byte of UTF-8: vocabulary 256, no merges and no special tokens. It needs no
/// data files and handles any text, which makes it the tokenizer for small models and tests.
#[derive(Clone, Copy, Debug, Default)]
pub struct ByteTokenizer;

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
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
pub(super) const REPLACEMENT: &str = "\u{FFFD}";

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
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        Ok(self.bpe.encode_with_special_tokens(text))
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
        let ids = t.encode(text).unwrap();
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
        let ids = t.encode("Hello world").unwrap();
        assert_eq!(ids, vec![15496, 995]);
        assert_eq!(t.decode(&ids), "Hello world");
        assert_eq!(t.eos(), Some(50256));
        assert_eq!(t.vocab_size(), 50257);
        assert_eq!(t.encode("a<|endoftext|>b").unwrap(), vec![64, 50256, 65]);
        let text = "Unicode: ünïcödé 🦀 and spaces  \n";
        assert_eq!(t.decode(&t.encode(text).unwrap()), text);
        assert_eq!(t.decode(&[15496, 60000]), "Hello\u{FFFD}");
    }

    #[test]
    fn a_stream_holds_cut_characters_back() {
        let t = ByteTokenizer;
        let text = "aé🦀b";
        let ids = t.encode(text).unwrap();
        let mut stream = TextStream::new(&t, &ids[..1]);
        let pieces: Vec<String> = ids[1..].iter().map(|&id| stream.push(id)).collect();
        assert_eq!(pieces, ["", "é", "", "", "", "🦀", "b"]);
        assert_eq!(stream.finish(), "");
        let long: String = "ab".repeat(40);
        let ids = t.encode(&long).unwrap();
        let mut stream = TextStream::new(&t, &[]);
        let out: String = ids.iter().map(|&id| stream.push(id)).collect();
        assert_eq!(out, long);
    }
}
