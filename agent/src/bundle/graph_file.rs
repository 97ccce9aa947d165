//! What `laya-edge check` can tell of an NPU graph file without its runtime, so that a graph
//! truncated on its way to a board is named even in a bundle whose manifest lists no sha256.
//!
//! An RKNN-Toolkit2 file says how long it is. Its layout, read from RKNN-Toolkit2 2.3.2's files
//! (`tests/fixtures/rknn/demo/demo.rknn`, file version 6): a 64-byte header (`RKNN`, 4 zero
//! bytes, the file version as a little-endian u64, the model's size as a little-endian u64 at
//! bytes 16..24), the model, then the size of a JSON description as a little-endian u64 and the
//! description. A file that does not start with `RKNN` is left to the runtime (the fake runtime's
//! graphs are JSON), and so is a QNN context binary, whose layout only libQnnSystem reads; both
//! are refused empty.

use std::io::Read;
use std::path::Path;

use super::BundleError;

/// The RKNN file magic.
const RKNN_MAGIC: &[u8; 4] = b"RKNN";

/// The RKNN header's length.
const RKNN_HEADER: u64 = 64;

/// What was checked of one graph file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checked {
    /// Its own header accounts for every byte of it.
    Complete,
    /// Not a layout this module reads: only its size (not empty) was checked.
    SizeOnly,
}

/// Checks `file` (a graph of a `backend` bundle) as far as its layout allows without a runtime.
pub fn check(backend: &str, file: &Path) -> Result<Checked, BundleError> {
    let bad = |message: String| BundleError::Graph { path: file.to_owned(), message };
    let read_err = |source| BundleError::Read { path: file.to_owned(), source };
    let mut f = std::fs::File::open(file).map_err(read_err)?;
    let len = f.metadata().map_err(read_err)?.len();
    if len == 0 {
        return Err(bad("the graph file is empty".into()));
    }
    let mut header = [0u8; RKNN_HEADER as usize];
    let got = read_up_to(&mut f, &mut header).map_err(read_err)?;
    if backend != "rknn" || got < 4 || &header[..4] != RKNN_MAGIC {
        return Ok(Checked::SizeOnly);
    }
    if (got as u64) < RKNN_HEADER {
        return Err(bad(format!("truncated: {len} bytes, shorter than an RKNN header ({RKNN_HEADER} bytes)")));
    }
    let u64_at = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or([0; 8]));
    let model = u64_at(&header[16..24]);
    let description_at = RKNN_HEADER.checked_add(model).filter(|&at| at.checked_add(8).is_some_and(|end| end <= len));
    let Some(description_at) = description_at else {
        return Err(bad(format!(
            "truncated: its header says the model takes {model} bytes after the {RKNN_HEADER}-byte header, and the file has {len} bytes"
        )));
    };
    let mut size = [0u8; 8];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut size, description_at).map_err(read_err)?;
    let description = u64_at(&size);
    let end = description_at.checked_add(8).and_then(|at| at.checked_add(description));
    if end != Some(len) {
        let want = end.map_or("more than 2^64".to_owned(), |e| e.to_string());
        return Err(bad(format!(
            "truncated or extended: its header and description size say {want} bytes, the file has {len}"
        )));
    }
    Ok(Checked::Complete)
}

/// Reads until `buf` is full or the file ends; how many bytes were read.
fn read_up_to(f: &mut std::fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn demo() -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/rknn/demo/demo.rknn");
        std::fs::read(path).expect("the RKNN fixture")
    }

    fn written(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("laya-graph-file-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("g.rknn");
        std::fs::write(&path, bytes).expect("write");
        path
    }

    #[test]
    fn rockchips_demo_graph_is_complete_and_every_truncation_of_it_is_refused() {
        let bytes = demo();
        assert_eq!(check("rknn", &written("whole", &bytes)).unwrap(), Checked::Complete);
        for cut in [1, 100, 2000, bytes.len() - 60, bytes.len() - 8] {
            let path = written(&format!("cut{cut}"), &bytes[..bytes.len() - cut]);
            let err = check("rknn", &path).expect_err("a truncated graph");
            assert!(err.to_string().contains("truncated") && err.to_string().contains("g.rknn"), "{err}");
        }
        let mut longer = bytes.clone();
        longer.extend_from_slice(b"junk");
        assert!(check("rknn", &written("longer", &longer)).is_err());
    }

    #[test]
    fn files_of_other_layouts_are_checked_for_size_only_and_refused_empty() {
        assert_eq!(check("rknn", &written("fake", br#"{"fake_rknn_graph": 1}"#)).unwrap(), Checked::SizeOnly);
        assert_eq!(check("qnn", &written("qnn", &[0, 0, 0, 2])).unwrap(), Checked::SizeOnly);
        assert!(check("qnn", &written("empty", b"")).unwrap_err().to_string().contains("empty"));
    }
}
