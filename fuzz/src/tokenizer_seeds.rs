//! Valid `tokenizer.json` files of each model type Hugging Face writes (byte-level BPE as
//! GPT-2's, SentencePiece BPE with byte fallback as Llama's, Unigram, WordPiece, WordLevel),
//! small enough that mutations reach every part of them.

use serde_json::{json, Map, Value};

/// Every seed, as file bytes.
pub fn tokenizer_seeds() -> Vec<Vec<u8>> {
    [
        byte_level_bpe(),
        sentencepiece_bpe(),
        unigram(),
        word_piece(),
        word_level(),
    ]
    .map(|v| v.to_string().into_bytes())
    .to_vec()
}

/// Text each accepted tokenizer encodes and decodes.
pub const SAMPLE_TEXT: &str = "Hello world, héllo wörld! 🦀 <s> [UNK]\n\tthe end</s>";

fn file(model: Value, normalizer: Value, pre: Value, post: Value, decoder: Value) -> Value {
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{ "id": 0, "content": "<unk>", "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true }],
        "normalizer": normalizer,
        "pre_tokenizer": pre,
        "post_processor": post,
        "decoder": decoder,
        "model": model
    })
}

fn vocab<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Map<String, Value> {
    tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), json!(i)))
        .collect()
}

/// GPT-2's byte-to-character table: printable bytes stand for themselves, the rest are moved
/// to U+0100 and up.
fn byte_chars() -> Vec<String> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || b >= 174;
    let mut shifted = 0;
    (0..256u32)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                shifted += 1;
                255 + shifted
            };
            char::from_u32(c).map(String::from).unwrap_or_default()
        })
        .collect()
}

fn byte_level_bpe() -> Value {
    let mut tokens = vec!["<unk>".to_string()];
    tokens.extend(byte_chars());
    tokens.extend(["he", "ll", "hell", "hello", "Ġw", "Ġworld"].map(String::from));
    let model = json!({
        "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": "",
        "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false,
        "vocab": vocab(tokens.iter().map(String::as_str)),
        "merges": ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw orld"]
    });
    let byte_level = json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
                             "use_regex": true });
    file(
        model,
        Value::Null,
        byte_level.clone(),
        byte_level.clone(),
        byte_level,
    )
}

fn sentencepiece_bpe() -> Value {
    let mut tokens = vec!["<unk>".to_string(), "<s>".into(), "</s>".into()];
    tokens.extend((0..256).map(|b| format!("<0x{b:02X}>")));
    tokens.extend(["▁", "h", "e", "l", "o", "▁h", "▁he", "ll"].map(String::from));
    let model = json!({
        "type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
        "vocab": vocab(tokens.iter().map(String::as_str)),
        "merges": ["▁ h", "▁h e", "l l"]
    });
    let normalizer = json!({ "type": "Sequence", "normalizers": [
        { "type": "Prepend", "prepend": "▁" },
        { "type": "Replace", "pattern": { "String": " " }, "content": "▁" }
    ]});
    let post = json!({
        "type": "TemplateProcessing",
        "single": [{ "SpecialToken": { "id": "<s>", "type_id": 0 } },
                   { "Sequence": { "id": "A", "type_id": 0 } }],
        "pair": [{ "Sequence": { "id": "A", "type_id": 0 } },
                 { "Sequence": { "id": "B", "type_id": 1 } }],
        "special_tokens": { "<s>": { "id": "<s>", "ids": [1], "tokens": ["<s>"] } }
    });
    let decoder = json!({ "type": "Sequence", "decoders": [
        { "type": "Replace", "pattern": { "String": "▁" }, "content": " " },
        { "type": "ByteFallback" },
        { "type": "Fuse" },
        { "type": "Strip", "content": " ", "start": 1, "stop": 0 }
    ]});
    file(model, normalizer, Value::Null, post, decoder)
}

fn unigram() -> Value {
    let pieces = [
        ("<unk>", 0.0),
        ("▁", -2.0),
        ("▁hello", -3.0),
        ("▁world", -3.5),
        ("h", -4.0),
        ("e", -4.0),
        ("l", -4.5),
        ("o", -4.5),
        ("!", -5.0),
    ];
    let model = json!({
        "type": "Unigram", "unk_id": 0, "byte_fallback": false,
        "vocab": pieces.iter().map(|(p, s)| json!([p, s])).collect::<Vec<_>>()
    });
    let metaspace = json!({ "type": "Metaspace", "replacement": "▁", "prepend_scheme": "always",
                            "split": true });
    let normalizer = json!({ "type": "Sequence", "normalizers": [
        { "type": "NFKC" }, { "type": "Lowercase" }
    ]});
    file(model, normalizer, metaspace.clone(), Value::Null, metaspace)
}

fn word_piece() -> Value {
    let model = json!({
        "type": "WordPiece", "unk_token": "<unk>", "continuing_subword_prefix": "##",
        "max_input_chars_per_word": 100,
        "vocab": vocab(["<unk>", "[CLS]", "[SEP]", "hello", "world", "##s", ",", "!", "the"])
    });
    let normalizer = json!({ "type": "BertNormalizer", "clean_text": true,
                             "handle_chinese_chars": true, "strip_accents": null,
                             "lowercase": true });
    let post = json!({ "type": "BertProcessing", "sep": ["[SEP]", 2], "cls": ["[CLS]", 1] });
    let decoder = json!({ "type": "WordPiece", "prefix": "##", "cleanup": true });
    file(
        model,
        normalizer,
        json!({ "type": "BertPreTokenizer" }),
        post,
        decoder,
    )
}

fn word_level() -> Value {
    let model = json!({
        "type": "WordLevel", "unk_token": "<unk>",
        "vocab": vocab(["<unk>", "hello", "world", ",", "!", "the", "end"])
    });
    let pre = json!({ "type": "Sequence", "pretokenizers": [
        { "type": "WhitespaceSplit" },
        { "type": "Punctuation", "behavior": "Isolated" },
        { "type": "Digits", "individual_digits": true }
    ]});
    file(model, Value::Null, pre, Value::Null, Value::Null)
}
