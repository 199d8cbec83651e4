//! A text file as a stream of tokens, cut into random training windows.

use std::path::Path;

use super::Tokenizer;
use crate::rng::RngState;
use crate::{Error, Result};

/// The share of tokens held out for validation when the caller has no opinion.
pub const DEFAULT_VAL_FRACTION: f64 = 0.1;

/// Which part of a [`TextDataset`] to draw from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    Train,
    Validation,
}

impl Split {
    fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
        }
    }
}

/// The tokens of one text, split into a training part and a validation part.
///
/// The validation part is the *last* `val_fraction` of the tokens rather than a random sample:
/// windows are contiguous, so a random split would let training windows overlap validation
/// text, and a tail split keeps validation loss an honest measure of held-out text.
#[derive(Clone, Debug)]
pub struct TextDataset {
    train: Vec<u32>,
    val: Vec<u32>,
    source: String,
}

impl TextDataset {
    /// Reads `path` and tokenizes it. Bytes that are not UTF-8 are replaced (U+FFFD) rather
    /// than rejected, since real corpora often contain a few. An empty file is an
    /// [`Error::Format`]; a file that cannot be read is an [`Error::Io`].
    pub fn from_file(
        path: impl AsRef<Path>,
        tokenizer: &dyn Tokenizer,
        val_fraction: f64,
    ) -> Result<Self> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| Error::io(path, e))?;
        let text = String::from_utf8_lossy(&bytes);
        Self::from_text(&text, tokenizer, val_fraction, &path.display().to_string())
    }

    /// Tokenizes `text`; `source` names it in error messages (a path, or `"<inline>"`).
    pub fn from_text(
        text: &str,
        tokenizer: &dyn Tokenizer,
        val_fraction: f64,
        source: &str,
    ) -> Result<Self> {
        if text.is_empty() {
            return Err(Error::format(source, "the text is empty"));
        }
        Self::from_tokens(tokenizer.encode(text)?, val_fraction, source)
    }

    /// Splits already tokenized text: the last `round(len * val_fraction)` tokens become the
    /// validation part. `val_fraction` must lie in `[0, 1)`.
    pub fn from_tokens(tokens: Vec<u32>, val_fraction: f64, source: &str) -> Result<Self> {
        if !(0.0..1.0).contains(&val_fraction) {
            return Err(Error::invalid(
                "TextDataset",
                format!("val_fraction must be in [0, 1); got {val_fraction}"),
            ));
        }
        if tokens.is_empty() {
            return Err(Error::format(source, "the text has no tokens"));
        }
        let n_val = (tokens.len() as f64 * val_fraction).round() as usize;
        let mut train = tokens;
        let val = train.split_off(train.len() - n_val);
        Ok(TextDataset {
            train,
            val,
            source: source.to_string(),
        })
    }

    /// The tokens of one split.
    pub fn tokens(&self, split: Split) -> &[u32] {
        match split {
            Split::Train => &self.train,
            Split::Validation => &self.val,
        }
    }

    /// What the text came from, as given at construction.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// `batch` windows of `seq + 1` consecutive tokens, each starting at a uniform position of
    /// `split` (one draw from `rng` per row, so the stream of batches depends only on the RNG
    /// state). Returns `(inputs, targets)`, each `batch * seq` row-major, where
    /// `targets[r * seq + i]` is the token after `inputs[r * seq + i]`.
    ///
    /// Fails with [`Error::Format`] when the split is shorter than one window, naming the
    /// source and both sizes so the fix (a longer file or a shorter `seq`) is clear.
    pub fn batch(
        &self,
        split: Split,
        batch: usize,
        seq: usize,
        rng: &mut RngState,
    ) -> Result<(Vec<u32>, Vec<u32>)> {
        if batch == 0 || seq == 0 {
            return Err(Error::invalid(
                "TextDataset::batch",
                format!("batch and seq must be positive; got batch {batch}, seq {seq}"),
            ));
        }
        let tokens = self.tokens(split);
        if tokens.len() < seq + 1 {
            return Err(Error::format(
                self.source.as_str(),
                format!(
                    "the {} split has {} tokens, fewer than the {} one window of seq {seq} needs",
                    split.name(),
                    tokens.len(),
                    seq + 1
                ),
            ));
        }
        let starts = tokens.len() - seq;
        let mut inputs = Vec::with_capacity(batch * seq);
        let mut targets = Vec::with_capacity(batch * seq);
        for _ in 0..batch {
            let s = rng.next_below(starts);
            inputs.extend_from_slice(&tokens[s..s + seq]);
            targets.extend_from_slice(&tokens[s + 1..s + seq + 1]);
        }
        Ok((inputs, targets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::ByteTokenizer;

    #[test]
    fn split_and_windows() {
        let tokens: Vec<u32> = (0..100).collect();
        let ds = TextDataset::from_tokens(tokens, 0.1, "<test>").unwrap();
        assert_eq!(ds.tokens(Split::Train), &(0..90).collect::<Vec<u32>>()[..]);
        assert_eq!(
            ds.tokens(Split::Validation),
            &(90..100).collect::<Vec<u32>>()[..]
        );

        let mut rng = RngState::new(7);
        let (x, y) = ds.batch(Split::Train, 4, 8, &mut rng).unwrap();
        assert_eq!((x.len(), y.len()), (32, 32));
        for r in 0..4 {
            let row = &x[r * 8..r * 8 + 8];
            for i in 0..8 {
                assert_eq!(y[r * 8 + i], row[i] + 1);
                assert!(y[r * 8 + i] < 90, "train window reached validation tokens");
            }
        }
        let (v, _) = ds.batch(Split::Validation, 2, 9, &mut rng).unwrap();
        assert_eq!(
            v,
            [(90..99).collect::<Vec<u32>>(), (90..99).collect()].concat()
        );
    }

    #[test]
    fn batches_follow_rng_state() {
        let ds = TextDataset::from_tokens((0..1000).collect(), 0.1, "<test>").unwrap();
        let mut a = RngState::new(3);
        let first = ds.batch(Split::Train, 4, 16, &mut a).unwrap();
        let saved = a;
        let second = ds.batch(Split::Train, 4, 16, &mut a).unwrap();
        let mut resumed = saved;
        assert_eq!(ds.batch(Split::Train, 4, 16, &mut resumed).unwrap(), second);
        assert_ne!(first, second);
        assert_eq!(resumed, a);
    }

    #[test]
    fn too_short_names_source_and_sizes() {
        let ds = TextDataset::from_text("hello", &ByteTokenizer, 0.0, "tiny.txt").unwrap();
        let err = ds
            .batch(Split::Train, 1, 8, &mut RngState::new(0))
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, Error::Format { .. }));
        assert!(
            msg.contains("tiny.txt") && msg.contains("5 tokens") && msg.contains('9'),
            "{msg}"
        );
        assert!(ds.batch(Split::Train, 1, 4, &mut RngState::new(0)).is_ok());
        assert!(ds
            .batch(Split::Validation, 1, 1, &mut RngState::new(0))
            .is_err());
    }

    #[test]
    fn files() {
        let dir = std::env::temp_dir().join(format!("tessera-data-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("good.txt");
        std::fs::write(&good, b"abc\xffdef").unwrap();
        let ds = TextDataset::from_file(&good, &ByteTokenizer, 0.0).unwrap();
        assert_eq!(
            ByteTokenizer.decode(ds.tokens(Split::Train)),
            "abc\u{FFFD}def"
        );

        let empty = dir.join("empty.txt");
        std::fs::write(&empty, b"").unwrap();
        let err = TextDataset::from_file(&empty, &ByteTokenizer, 0.1).unwrap_err();
        assert!(matches!(err, Error::Format { .. }) && err.to_string().contains("empty.txt"));

        let missing = dir.join("missing.txt");
        let err = TextDataset::from_file(&missing, &ByteTokenizer, 0.1).unwrap_err();
        assert!(matches!(err, Error::Io { .. }) && err.to_string().contains("missing.txt"));

        assert!(TextDataset::from_file(&good, &ByteTokenizer, 1.0).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
