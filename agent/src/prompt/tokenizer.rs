//! The checkpoint's tokenizer and the four special tokens laya's layout uses.
//!
//! laya calls its Hugging Face tokenizer as `tok(text, add_special_tokens=False)`; the same
//! `tokenizer.json` through the `tokenizers` crate gives the same ids. Transformers switches off
//! any truncation or padding stored in `tokenizer.json` for such a call, so we do too.

use std::path::{Path, PathBuf};

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};

/// Why a tokenizer could not be loaded or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error(
        "the tokenizer in {dir} names no {name} (looked in the bundle manifest, special_tokens_map.json and tokenizer_config.json)"
    )]
    MissingSpecial { dir: PathBuf, name: &'static str },
    #[error("the tokenizer's {name} {token:?} is not in its vocabulary")]
    UnknownSpecial { name: &'static str, token: String },
    #[error("tokenizing failed: {0}")]
    Encode(String),
}

/// A special token: its text (what laya replaces in user text) and its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecialToken {
    pub text: String,
    pub id: u32,
}

/// Special token texts named explicitly (by an NPU bundle's manifest); `None` falls back to the
/// tokenizer's own config files.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokenNames {
    pub cls: Option<String>,
    pub sep: Option<String>,
    pub mask: Option<String>,
    pub pad: Option<String>,
}

/// A checkpoint's tokenizer with its CLS, SEP, MASK and PAD tokens resolved.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    pub cls: SpecialToken,
    pub sep: SpecialToken,
    pub mask: SpecialToken,
    pub pad: SpecialToken,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("cls", &self.cls)
            .field("sep", &self.sep)
            .field("mask", &self.mask)
            .field("pad", &self.pad)
            .finish_non_exhaustive()
    }
}

fn read_json(path: &Path) -> Result<Option<Value>, TokenizerError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(TokenizerError::Read { path: path.to_owned(), source }),
    };
    json::parse(&bytes, ParseOptions::default())
        .map(Some)
        .map_err(|e| TokenizerError::Parse { path: path.to_owned(), message: e.to_string() })
}

/// A special token entry is either a string or an AddedToken object with a `content`.
fn token_text(entry: &Value) -> Option<String> {
    match entry {
        Value::Str(s) => Some(s.clone()),
        Value::Object(m) => m.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and the special tokens named in `dir/special_tokens_map.json`
    /// (which takes precedence, as in transformers) or `dir/tokenizer_config.json`.
    pub fn load(dir: &Path) -> Result<Tokenizer, TokenizerError> {
        Self::load_file(&dir.join("tokenizer.json"), None)
    }

    /// Loads a `tokenizer.json` file. The special tokens come from `names` when given (an NPU
    /// bundle's manifest), else from `special_tokens_map.json` / `tokenizer_config.json` beside it.
    pub fn load_file(path: &Path, names: Option<&SpecialTokenNames>) -> Result<Tokenizer, TokenizerError> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let path = path.to_owned();
        let bytes = std::fs::read(&path).map_err(|source| TokenizerError::Read { path: path.clone(), source })?;
        let mut inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| TokenizerError::Parse { path: path.clone(), message: e.to_string() })?;
        inner
            .with_truncation(None)
            .map_err(|e| TokenizerError::Parse { path: path.clone(), message: e.to_string() })?;
        inner.with_padding(None);

        let special_map = read_json(&dir.join("special_tokens_map.json"))?;
        let config = read_json(&dir.join("tokenizer_config.json"))?;
        let resolve = |key: &'static str, name: &'static str| -> Result<SpecialToken, TokenizerError> {
            let given = names.and_then(|n| match key {
                "cls_token" => n.cls.clone(),
                "sep_token" => n.sep.clone(),
                "mask_token" => n.mask.clone(),
                _ => n.pad.clone(),
            });
            let text = given
                .or_else(|| {
                    [&special_map, &config].into_iter().flatten().find_map(|doc| doc.get(key).and_then(token_text))
                })
                .ok_or_else(|| TokenizerError::MissingSpecial { dir: dir.to_owned(), name })?;
            let id =
                inner.token_to_id(&text).ok_or_else(|| TokenizerError::UnknownSpecial { name, token: text.clone() })?;
            Ok(SpecialToken { text, id })
        };
        let cls = resolve("cls_token", "CLS token")?;
        let sep = resolve("sep_token", "SEP token")?;
        let mask = resolve("mask_token", "MASK token")?;
        let pad = resolve("pad_token", "PAD token")?;
        Ok(Tokenizer { inner, cls, sep, mask, pad })
    }

    /// `tok(text, add_special_tokens=False)["input_ids"]`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}
