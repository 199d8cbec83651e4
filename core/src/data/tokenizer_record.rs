//! Tokenizers recorded in checkpoints: the name of a built-in one, or a `tokenizer.json`'s
//! text ([`Tokenizer::record`]), rebuilt for `generate` and `--resume`.

use serde_json::Value;

use super::hf_tokenizer::{HfTokenizer, RECORD_KIND};
use super::{AdditionTokenizer, ByteTokenizer, Gpt2Tokenizer, Tokenizer};
use crate::{Error, Result};

/// Rebuilds the tokenizer a checkpoint recorded with [`Tokenizer::record`]; `origin` names the
/// checkpoint in errors.
pub fn from_record(record: &Value, origin: &str) -> Result<Box<dyn Tokenizer>> {
    match record {
        Value::String(name) => match name.as_str() {
            "byte" => Ok(Box::new(ByteTokenizer)),
            "gpt2" => Ok(Box::new(Gpt2Tokenizer::new()?)),
            "addition" => Ok(Box::new(AdditionTokenizer)),
            other => Err(Error::format(
                origin,
                format!("unknown recorded tokenizer `{other}`"),
            )),
        },
        Value::Object(o) if o.get("kind").and_then(Value::as_str) == Some(RECORD_KIND) => {
            Ok(Box::new(HfTokenizer::from_record(record, origin)?))
        }
        other => Err(Error::format(
            origin,
            format!(
                "recorded tokenizer is neither a name nor a tokenizer.json record: {}",
                truncate(&other.to_string(), 80)
            ),
        )),
    }
}

fn truncate(s: &str, max_chars: usize) -> String {
    match s.char_indices().nth(max_chars) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_the_built_in_tokenizers() {
        for t in [&ByteTokenizer as &dyn Tokenizer, &AdditionTokenizer] {
            let back = from_record(&t.record(), "test").unwrap();
            assert_eq!(back.name(), t.name());
        }
        assert!(from_record(&Value::String("gtp2".into()), "test").is_err());
        assert!(from_record(&serde_json::json!([1]), "test").is_err());
    }
}
