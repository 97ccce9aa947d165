//! The bearer: `Authorization: Bearer <key>`, compared as bytes in constant time.
//!
//! Why its own file: this is the door's one secret. laya.serve compares the header with
//! `hmac.compare_digest` on UTF-8 bytes, after a bug where a non-ASCII header made the
//! comparison raise (a 500 any client could cause). Here the header's raw bytes are compared
//! with `Bearer ` and the key file's bytes: no decoding, so no header can make it fail, and
//! every byte is looked at whatever the first difference, so the time says nothing about the
//! key but its length.

use std::path::Path;

use super::DoorError;

/// The bytes an `Authorization` header must hold exactly.
#[derive(Clone)]
pub struct Bearer(Vec<u8>);

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Bearer(<redacted>)")
    }
}

impl Bearer {
    pub fn new(key: &[u8]) -> Bearer {
        let mut expected = b"Bearer ".to_vec();
        expected.extend_from_slice(key);
        Bearer(expected)
    }

    /// Whether `header` (the first `Authorization` header's bytes, if any) is exactly
    /// `Bearer <key>`: the scheme's case, one space, the key's bytes.
    pub fn admits(&self, header: Option<&[u8]>) -> bool {
        constant_time_eq(header.unwrap_or(b""), &self.0)
    }
}

/// `a == b`, in a time that depends only on the lengths.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u8::from(a.len() != b.len());
    for (i, expected) in b.iter().enumerate() {
        diff |= a.get(i).copied().unwrap_or(0) ^ expected;
    }
    std::hint::black_box(diff) == 0
}

/// The key in `path`: the file's whole content, trailing newlines (`\n`, `\r`) trimmed, as
/// `[mqtt] password_file` reads its password. An empty key is refused (it would make
/// `Bearer ` the credential).
pub fn read_key_file(path: &Path) -> Result<Vec<u8>, DoorError> {
    let err = |message: String| DoorError::KeyFile { path: path.display().to_string(), message };
    let mut key = std::fs::read(path).map_err(|e| err(e.to_string()))?;
    while key.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
        key.pop();
    }
    if key.is_empty() {
        return Err(err("the file is empty; it must hold the bearer's key".into()));
    }
    if key.iter().any(|b| *b < 0x20 || *b == 0x7f) {
        return Err(err("the key holds a control character, which an HTTP header cannot carry".into()));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_header_is_admitted() {
        let b = Bearer::new(b"edge-test-key");
        assert!(b.admits(Some(b"Bearer edge-test-key")));
        for wrong in [
            &b"bearer edge-test-key"[..],
            b"Bearer  edge-test-key",
            b"Bearer edge-test-ke",
            b"Bearer edge-test-keyy",
            b"edge-test-key",
            b"",
            b"Bearer s\xe9cret",
        ] {
            assert!(!b.admits(Some(wrong)), "{wrong:?}");
        }
        assert!(!b.admits(None));
    }
}
