//! Hugging Face tokenizers: any `tokenizer.json` (Llama, Mistral, Qwen, GPT-2 and the rest),
//! read offline through the `tokenizers` crate.
//!
//! Decisions, as `transformers` makes them:
//! - [`encode`](Tokenizer::encode) adds the file's special tokens (its post-processor: Llama's
//!   beginning-of-text `<s>`, for example), as `tokenizer(text)` does.
//! - [`decode`](Tokenizer::decode) keeps special tokens; ids the vocabulary lacks become U+FFFD.
//! - The end-of-text token is `eos_token` of a `tokenizer_config.json` beside the file, when
//!   there is one; model directories add their `generation_config.json` stop tokens on top.
//! - A checkpoint records the file's text verbatim ([`Tokenizer::record`]), so that generating
//!   from it needs no file beside it and cannot pick up a different one.
//!
//! The `tokenizers` crate (0.22) panics on some malformed files instead of returning an error,
//! as fuzzing found (`tessera-fuzz tokenizer`): reading a file whose decoder is not valid
//! (`decoders/mod.rs`: `expect("Helper")`), and encoding with a template post-processor that
//! names a special token it does not define (`processors/template.rs`: a map lookup). Every
//! call into the crate therefore goes through [`guarded`], which turns such a panic into an
//! error naming the file; the panic's own message still reaches standard error through the
//! process's panic hook.

use std::path::Path;

use serde_json::{json, Value};

use super::tokenizer::{Tokenizer, REPLACEMENT};
use crate::{Error, Result};

/// A tokenizer read from a Hugging Face `tokenizer.json`.
pub struct HfTokenizer {
    inner: tokenizers::Tokenizer,
    /// The file's text, recorded in checkpoints.
    json: String,
    vocab_size: usize,
    eos: Option<u32>,
}

/// The `kind` of a recorded Hugging Face tokenizer in checkpoint metadata.
pub(super) const RECORD_KIND: &str = "tokenizer.json";

impl HfTokenizer {
    /// Reads `path` (a `tokenizer.json`, or a directory holding one) and the end-of-text token
    /// from a `tokenizer_config.json` beside it, if present.
    pub fn from_file(path: &Path) -> Result<Self> {
        let file = if path.is_dir() {
            path.join("tokenizer.json")
        } else {
            path.to_path_buf()
        };
        let json = std::fs::read_to_string(&file).map_err(|e| Error::io(&file, e))?;
        let origin = file.display().to_string();
        let mut tokenizer = Self::from_json(json, &origin)?;
        let config = file.with_file_name("tokenizer_config.json");
        if config.is_file() {
            let text = std::fs::read_to_string(&config).map_err(|e| Error::io(&config, e))?;
            tokenizer.eos = tokenizer.eos_from_config(&text, &config.display().to_string())?;
        }
        Ok(tokenizer)
    }

    /// Parses the text of a `tokenizer.json`; `origin` names it in errors.
    pub fn from_json(json: String, origin: &str) -> Result<Self> {
        let inner = guarded(origin, "reading", || json.parse::<tokenizers::Tokenizer>())?
            .map_err(|e| Error::format(origin, format!("tokenizer.json: {e}")))?;
        let vocab_size = inner.get_vocab_size(true);
        if vocab_size == 0 {
            return Err(Error::format(
                origin,
                "tokenizer.json has an empty vocabulary",
            ));
        }
        Ok(HfTokenizer {
            inner,
            json,
            vocab_size,
            eos: None,
        })
    }

    /// Sets the end-of-text token (from a model's `generation_config.json`, for example).
    pub fn with_eos(mut self, eos: Option<u32>) -> Self {
        self.eos = eos;
        self
    }

    /// The id of `token` (a special token's text such as `</s>`), if the vocabulary has it.
    pub fn token_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// `eos_token` of a `tokenizer_config.json` (a string or `{"content": ...}`) as an id.
    fn eos_from_config(&self, text: &str, origin: &str) -> Result<Option<u32>> {
        let config: Value = serde_json::from_str(text)
            .map_err(|e| Error::format(origin, format!("tokenizer_config.json: {e}")))?;
        let eos = match config.get("eos_token") {
            Some(Value::String(s)) => Some(s.as_str()),
            Some(Value::Object(o)) => o.get("content").and_then(Value::as_str),
            _ => None,
        };
        match eos {
            None => Ok(None),
            Some(token) => self.token_id(token).map(Some).ok_or_else(|| {
                Error::format(
                    origin,
                    format!("eos_token `{token}` is not in the tokenizer's vocabulary"),
                )
            }),
        }
    }

    /// Restores a tokenizer recorded by [`Tokenizer::record`].
    pub(super) fn from_record(record: &Value, origin: &str) -> Result<Self> {
        let json = record
            .get("json")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::format(origin, "recorded tokenizer has no `json` text"))?;
        let eos = match record.get("eos") {
            None | Some(Value::Null) => None,
            Some(v) => Some(
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        Error::format(origin, format!("recorded tokenizer eos `{v}`"))
                    })?,
            ),
        };
        let tokenizer = Self::from_json(json.to_string(), origin)?;
        if let Some(id) = eos {
            if id as usize >= tokenizer.vocab_size {
                return Err(Error::format(
                    origin,
                    format!(
                        "recorded tokenizer eos {id} is outside its {}-token vocabulary",
                        tokenizer.vocab_size
                    ),
                ));
            }
        }
        Ok(tokenizer.with_eos(eos))
    }
}

/// Runs `call` into the `tokenizers` crate, turning a panic into an error (see the module
/// docs for the panics known).
fn guarded<T>(origin: &str, doing: &str, call: impl FnOnce() -> T) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(call)).map_err(|payload| {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_default();
        Error::format(
            origin,
            format!(
                "tokenizer.json is malformed: the tokenizers crate failed {doing} it ({message})"
            ),
        )
    })
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HfTokenizer({} tokens)", self.vocab_size)
    }
}

impl Tokenizer for HfTokenizer {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let encoding = guarded("tokenizer.json", "encoding", || {
            self.inner.encode(text, true)
        })?
        .map_err(|e| Error::format("tokenizer.json", format!("encoding failed: {e}")))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Runs of known ids decode together; an id the vocabulary lacks becomes U+FFFD, and the
    /// run after it decodes behind the last known token, so that spacing rules that look at
    /// the start of the text (SentencePiece's dropped first space) apply as without the gap.
    fn decode(&self, tokens: &[u32]) -> String {
        let decode = |ids: &[u32]| match guarded("tokenizer.json", "decoding", || {
            self.inner.decode(ids, false)
        }) {
            Ok(Ok(text)) => text,
            _ => REPLACEMENT.to_string(),
        };
        let mut text = String::new();
        let mut last_known: Option<u32> = None;
        for run in tokens.split_inclusive(|&t| self.inner.id_to_token(t).is_none()) {
            let (known, gap) = match run.split_last() {
                Some((&last, rest)) if self.inner.id_to_token(last).is_none() => (rest, true),
                _ => (run, false),
            };
            if !known.is_empty() {
                match last_known {
                    None => text.push_str(&decode(known)),
                    Some(before) => {
                        let context = decode(&[before]);
                        let with = decode(&[&[before], known].concat());
                        text.push_str(with.strip_prefix(context.as_str()).unwrap_or(&with));
                    }
                }
                last_known = known.last().copied();
            }
            if gap {
                text.push_str(REPLACEMENT);
            }
        }
        text
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    fn name(&self) -> &str {
        RECORD_KIND
    }

    fn eos(&self) -> Option<u32> {
        self.eos
    }

    fn record(&self) -> Value {
        json!({ "kind": RECORD_KIND, "json": self.json, "eos": self.eos })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{from_record, TextStream};

    /// Ids of the Llama-style test tokenizer, fixed by the vocabulary the test writes.
    const BOS: u32 = 1;
    const EOS: u32 = 2;
    const BYTE_0: u32 = 3;
    const H: u32 = 262;
    const HI: u32 = 263;

    /// A Llama-2-style `tokenizer.json` (SentencePiece BPE with byte fallback, `▁` for spaces,
    /// `<s>` added in front): `<unk> <s> </s>`, the 256 byte tokens, then `▁ h i ▁h ▁hi`.
    fn llama_style_json() -> String {
        let mut vocab = serde_json::Map::new();
        for (i, t) in ["<unk>", "<s>", "</s>"].iter().enumerate() {
            vocab.insert(t.to_string(), json!(i));
        }
        for b in 0..256u32 {
            vocab.insert(format!("<0x{b:02X}>"), json!(BYTE_0 + b));
        }
        for (i, t) in ["▁", "h", "i", "▁h", "▁hi"].iter().enumerate() {
            vocab.insert(t.to_string(), json!(259 + i));
        }
        let special = |id: u32, content: &str| {
            json!({ "id": id, "content": content, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true })
        };
        json!({
            "version": "1.0",
            "truncation": null,
            "padding": null,
            "added_tokens": [special(0, "<unk>"), special(BOS, "<s>"), special(EOS, "</s>")],
            "normalizer": { "type": "Sequence", "normalizers": [
                { "type": "Prepend", "prepend": "▁" },
                { "type": "Replace", "pattern": { "String": " " }, "content": "▁" }
            ]},
            "pre_tokenizer": null,
            "post_processor": {
                "type": "TemplateProcessing",
                "single": [
                    { "SpecialToken": { "id": "<s>", "type_id": 0 } },
                    { "Sequence": { "id": "A", "type_id": 0 } }
                ],
                "pair": [
                    { "SpecialToken": { "id": "<s>", "type_id": 0 } },
                    { "Sequence": { "id": "A", "type_id": 0 } },
                    { "Sequence": { "id": "B", "type_id": 1 } }
                ],
                "special_tokens": { "<s>": { "id": "<s>", "ids": [BOS], "tokens": ["<s>"] } }
            },
            "decoder": { "type": "Sequence", "decoders": [
                { "type": "Replace", "pattern": { "String": "▁" }, "content": " " },
                { "type": "ByteFallback" },
                { "type": "Fuse" },
                { "type": "Strip", "content": " ", "start": 1, "stop": 0 }
            ]},
            "model": {
                "type": "BPE", "dropout": null, "unk_token": "<unk>",
                "continuing_subword_prefix": null, "end_of_word_suffix": null,
                "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                "vocab": vocab, "merges": ["▁ h", "▁h i"]
            }
        })
        .to_string()
    }

    fn llama_style() -> HfTokenizer {
        HfTokenizer::from_json(llama_style_json(), "test").unwrap()
    }

    #[test]
    fn encodes_to_the_ids_its_vocabulary_and_merges_define() {
        let t = llama_style();
        assert_eq!(t.vocab_size(), 264);
        assert_eq!(t.encode("hi hi").unwrap(), vec![BOS, HI, HI]);
        // `é` is not in the vocabulary: its two UTF-8 bytes become byte tokens.
        assert_eq!(
            t.encode("hé").unwrap(),
            vec![BOS, H, BYTE_0 + 0xC3, BYTE_0 + 0xA9]
        );
        assert_eq!(t.token_id("</s>"), Some(EOS));
    }

    #[test]
    fn decodes_back_to_the_text() {
        let t = llama_style();
        for text in ["hi hi", "hé", "h i  ih", "ünï 🦀"] {
            let ids = t.encode(text).unwrap();
            assert_eq!(t.decode(&ids[1..]), text, "ids {ids:?}");
        }
        assert_eq!(t.decode(&[BOS, HI]), "<s> hi");
        assert_eq!(t.decode(&[HI, 5000, HI]), "hi\u{FFFD} hi");
    }

    #[test]
    fn the_end_token_comes_from_tokenizer_config_or_the_record() {
        let dir = std::env::temp_dir().join(format!("tessera-hf-tok-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), llama_style_json()).unwrap();
        assert_eq!(HfTokenizer::from_file(&dir).unwrap().eos(), None);
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"eos_token": {"content": "</s>"}, "bos_token": "<s>"}"#,
        )
        .unwrap();
        let t = HfTokenizer::from_file(&dir.join("tokenizer.json")).unwrap();
        assert_eq!(t.eos(), Some(EOS));
        std::fs::write(
            dir.join("tokenizer_config.json"),
            r#"{"eos_token": "<end>"}"#,
        )
        .unwrap();
        let err = HfTokenizer::from_file(&dir).unwrap_err().to_string();
        assert!(err.contains("<end>"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();

        let restored = from_record(&t.record(), "test").unwrap();
        assert_eq!(restored.eos(), Some(EOS));
        assert_eq!(
            restored.encode("hé hi").unwrap(),
            t.encode("hé hi").unwrap()
        );
        let mut bad = t.record();
        bad["eos"] = json!(264);
        assert!(from_record(&bad, "test").is_err());
    }

    #[test]
    fn malformed_files_are_errors() {
        for text in ["", "{}", "[1,2]", r#"{"model": {"type": "BPE"}}"#] {
            assert!(
                HfTokenizer::from_json(text.to_string(), "test").is_err(),
                "{text}"
            );
        }
        let broken = llama_style_json().replace("\"▁h i\"", "\"▁h zz\"");
        assert!(HfTokenizer::from_json(broken, "test").is_err());
    }

    /// Files on which the `tokenizers` crate panics (found by fuzzing) are errors.
    #[test]
    fn files_the_tokenizers_crate_panics_on_are_errors() {
        // A syntax error inside the decoder (here a raw control character in a string).
        let file = llama_style_json().replace("\"ByteFallback\"", "\"Byte\u{1}Fallback\"");
        let err = HfTokenizer::from_json(file, "test").unwrap_err();
        assert!(err.to_string().contains("malformed"), "{err}");

        let mut file: Value = serde_json::from_str(&llama_style_json()).unwrap();
        file["post_processor"]["special_tokens"] = json!({});
        let t = HfTokenizer::from_json(file.to_string(), "test").unwrap();
        let err = t.encode("hi").unwrap_err();
        assert!(err.to_string().contains("encoding"), "{err}");
    }

    #[test]
    fn streaming_releases_whole_characters_with_their_spaces() {
        let t = llama_style();
        let mut stream = TextStream::new(&t, &[BOS, H]);
        assert_eq!(stream.push(BYTE_0 + 0xC3), "");
        assert_eq!(stream.push(BYTE_0 + 0xA9), "é");
        assert_eq!(stream.push(HI), " hi");
        assert_eq!(stream.push(HI), " hi");
        assert_eq!(stream.push(BYTE_0 + 0xC3), "");
        assert_eq!(stream.finish(), "\u{FFFD}");
    }
}
