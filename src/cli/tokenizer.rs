//! `--tokenizer`: a built-in tokenizer by name, or a Hugging Face `tokenizer.json`.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::invalid;
use crate::data::{AdditionTokenizer, ByteTokenizer, Gpt2Tokenizer, HfTokenizer, Tokenizer};
use crate::Result;

/// A tokenizer as the command line names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TokenizerSpec {
    /// `auto`: what the model brings (a checkpoint's recorded tokenizer, a model directory's
    /// `tokenizer.json`), else GPT-2's for a 50,257-token vocabulary.
    Auto,
    /// `byte`: one token per byte (vocabulary 256).
    Byte,
    /// `gpt2`: GPT-2's byte-pair encoding (vocabulary 50,257), built in.
    Gpt2,
    /// `addition`: the addition task's characters `0-9 + = .`.
    Addition,
    /// A `tokenizer.json` file, or a directory holding one (and maybe `tokenizer_config.json`).
    File(PathBuf),
}

/// What `--tokenizer` accepts, for help and errors.
pub const TOKENIZER_HELP: &str =
    "auto, byte, gpt2, addition, or a tokenizer.json (or its directory)";

impl FromStr for TokenizerSpec {
    type Err = Infallible;

    fn from_str(s: &str) -> std::result::Result<Self, Infallible> {
        Ok(match s {
            "auto" => TokenizerSpec::Auto,
            "byte" => TokenizerSpec::Byte,
            "gpt2" => TokenizerSpec::Gpt2,
            "addition" => TokenizerSpec::Addition,
            path => TokenizerSpec::File(PathBuf::from(path)),
        })
    }
}

impl TokenizerSpec {
    /// Builds the named tokenizer; `None` for `auto`, which the caller resolves.
    pub fn open(&self) -> Result<Option<Box<dyn Tokenizer>>> {
        Ok(Some(match self {
            TokenizerSpec::Auto => return Ok(None),
            TokenizerSpec::Byte => Box::new(ByteTokenizer),
            TokenizerSpec::Gpt2 => Box::new(Gpt2Tokenizer::new()?),
            TokenizerSpec::Addition => Box::new(AdditionTokenizer),
            TokenizerSpec::File(path) => Box::new(open_file(path)?),
        }))
    }
}

fn open_file(path: &Path) -> Result<HfTokenizer> {
    if !path.exists() {
        return Err(invalid(
            "--tokenizer",
            format!(
                "`{}` is neither a built-in tokenizer nor a file (give {TOKENIZER_HELP})",
                path.display()
            ),
        ));
    }
    if path.is_dir() && !path.join("tokenizer.json").is_file() {
        return Err(invalid(
            "--tokenizer",
            format!("the directory {} holds no tokenizer.json", path.display()),
        ));
    }
    HfTokenizer::from_file(path)
}
