//! The checkpoint's tokenizer and the four special tokens laya's layout uses.
//!
//! laya calls its Hugging Face tokenizer as `tok(text, add_special_tokens=False)`; the same
//! `tokenizer.json` through the `tokenizers` crate gives the same ids. Transformers switches off
//! any truncation or padding stored in `tokenizer.json` for such a call, so we do too.
//!
//! A fleet asks the same few questions about ever new states, so the instructions and option
//! texts of a request have nearly always been tokenized before, and tokenizing them again was
//! two thirds of the agent's own time per question. [`Tokenizer::encode_recurring`] keeps the ids
//! of recent short texts; the state, new every time, goes through [`Tokenizer::encode`]. A text
//! always tokenizes to the same ids, so a remembered encoding is the encoding.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Texts remembered by [`Tokenizer::encode_recurring`], at most.
pub const RECURRING_ENTRIES: usize = 4096;
/// Longer texts are not remembered: the whole memo stays under 10 MiB (typical questions: a few
/// hundred KiB).
pub const RECURRING_MAX_BYTES: usize = 512;

/// Encodings of recently seen texts, in two generations: lookups search both and move a hit
/// from the old to the young one; when the young one is full it becomes the old one and the old
/// one is dropped. Texts in use stay, one-off texts age out, and no text is ever stale.
#[derive(Default)]
struct Memo {
    young: HashMap<Box<str>, Box<[u32]>>,
    old: HashMap<Box<str>, Box<[u32]>>,
}

impl Memo {
    fn get(&mut self, text: &str) -> Option<Vec<u32>> {
        if let Some(ids) = self.young.get(text) {
            return Some(ids.to_vec());
        }
        let (text, ids) = self.old.remove_entry(text)?;
        let out = ids.to_vec();
        self.insert(text, ids);
        Some(out)
    }

    fn insert(&mut self, text: Box<str>, ids: Box<[u32]>) {
        // Two threads may miss the same text at once; the second finds the first's entry.
        if self.young.contains_key(&text) {
            return;
        }
        if self.young.len() >= RECURRING_ENTRIES / 2 {
            self.old = std::mem::take(&mut self.young);
        }
        self.young.insert(text, ids);
    }

    fn len(&self) -> usize {
        self.young.len() + self.old.len()
    }
}

/// How often [`Tokenizer::encode_recurring`] found a text remembered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoStats {
    pub hits: u64,
    pub misses: u64,
    /// Texts remembered now.
    pub entries: usize,
}

/// A checkpoint's tokenizer with its CLS, SEP, MASK and PAD tokens resolved.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    memo: Mutex<Memo>,
    hits: AtomicU64,
    misses: AtomicU64,
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
        drop(bytes);
        let tokenizer = Tokenizer {
            inner,
            memo: Mutex::default(),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            cls,
            sep,
            mask,
            pad,
        };
        // The parse's intermediate values are garbage now (15.6 MiB of RSS for a 50280-token
        // vocabulary): see `heap`.
        crate::platform::heap::release_freed();
        Ok(tokenizer)
    }

    /// `tok(text, add_special_tokens=False)["input_ids"]`.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// [`encode`](Self::encode) for texts that come back (instructions, options): the ids of a
    /// recent text up to [`RECURRING_MAX_BYTES`] long are remembered.
    pub fn encode_recurring(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        if text.len() > RECURRING_MAX_BYTES {
            return self.encode(text);
        }
        // A panic elsewhere while the lock was held leaves a memo that is still consistent.
        let remembered = self.memo.lock().unwrap_or_else(|e| e.into_inner()).get(text);
        if let Some(ids) = remembered {
            self.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(ids);
        }
        let ids = self.encode(text)?;
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.memo.lock().unwrap_or_else(|e| e.into_inner()).insert(text.into(), ids.as_slice().into());
        Ok(ids)
    }

    /// Hits and misses of [`encode_recurring`](Self::encode_recurring) since loading.
    pub fn memo_stats(&self) -> MemoStats {
        MemoStats {
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
            entries: self.memo.lock().unwrap_or_else(|e| e.into_inner()).len(),
        }
    }

    /// The vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models/bpe-t5/tokenizer");
        Tokenizer::load(&dir).expect("fixture tokenizer")
    }

    #[test]
    fn a_remembered_encoding_is_the_fresh_encoding() {
        let tok = tokenizer();
        let texts = ["noul question: Is this a bug report?", " billing", " technical", "", " ünïcödé 🙂 [MASK]"];
        for t in texts {
            let fresh = tok.encode(t).expect("encode");
            assert_eq!(tok.encode_recurring(t).expect("first"), fresh, "{t:?}");
            assert_eq!(tok.encode_recurring(t).expect("second"), fresh, "{t:?}");
        }
        assert_eq!(tok.memo_stats(), MemoStats { hits: 5, misses: 5, entries: 5 });
    }

    #[test]
    fn the_memo_stays_bounded_and_keeps_the_texts_in_use() {
        let tok = tokenizer();
        let hot = "choice question: Which team?";
        for i in 0..3 * RECURRING_ENTRIES {
            tok.encode_recurring(&format!(" option {i}")).expect("encode");
            if i % 100 == 0 {
                tok.encode_recurring(hot).expect("hot");
            }
            assert!(tok.memo_stats().entries <= RECURRING_ENTRIES);
        }
        let before = tok.memo_stats();
        assert_eq!(before.misses, 3 * RECURRING_ENTRIES as u64 + 1, "only the hot text was ever found");
        tok.encode_recurring(hot).expect("hot");
        tok.encode_recurring(" option 0").expect("aged out");
        let after = tok.memo_stats();
        assert_eq!((after.hits - before.hits, after.misses - before.misses), (1, 1));
    }

    #[test]
    fn long_texts_are_encoded_but_not_remembered() {
        let tok = tokenizer();
        let long = "word ".repeat(RECURRING_MAX_BYTES);
        let fresh = tok.encode(&long).expect("encode");
        assert_eq!(tok.encode_recurring(&long).expect("first"), fresh);
        assert_eq!(tok.encode_recurring(&long).expect("second"), fresh);
        assert_eq!(tok.memo_stats(), MemoStats { hits: 0, misses: 0, entries: 0 });
    }
}
