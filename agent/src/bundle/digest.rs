//! SHA-256 of bundle files: a bundle's manifest lists every file with its digest, so a file
//! truncated on the way to a board, or replaced by another build's, is caught and named before
//! anything loads it (a truncated context binary otherwise fails deep inside the runtime as
//! "malformed binary", without the file's name).

use std::io::Read;
use std::path::Path;

/// The lowercase hex SHA-256 of a file's bytes, read in pieces (graphs can be hundreds of MB).
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        ctx.update(&buf[..n]);
    }
    Ok(hex(ctx.finish().as_ref()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Whether `s` looks like [`sha256_file`]'s output.
pub fn is_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_of_known_bytes_is_the_standard_one() {
        // FIPS 180-2's "abc" example.
        let path = std::env::temp_dir().join(format!("laya-digest-{}", std::process::id()));
        std::fs::write(&path, b"abc").unwrap();
        let d = sha256_file(&path).unwrap();
        std::fs::remove_file(&path).ok();
        assert_eq!(d, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert!(is_sha256(&d));
        assert!(!is_sha256(&d.to_uppercase()) && !is_sha256(&d[1..]));
    }
}
