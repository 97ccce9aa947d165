//! `model.safetensors`: its header checked against the architecture, each tensor read into its
//! own f32 buffer.
//!
//! laya refuses a checkpoint whose tensors do not match the model it builds
//! (`_verify_compatibility`, then a strict `load_state_dict`). The same checks run here before
//! anything is computed, and every problem names the tensor.
//!
//! Why the tensors are read (`pread`) and not used from a memory map: the model keeps its own
//! f32 copy of every tensor, and every page of a mapping that the copying touches stays in the
//! process's RSS beside the copy until the mapping is dropped, so a worker peaked at twice its
//! model while loading. Releasing each tensor's pages after copying (`madvise(MADV_DONTNEED)`)
//! is not enough: the kernel's fault-around maps the neighbouring cached pages again on the next
//! tensor's faults. Read into its destination, a tensor costs its own bytes only (plus, for f16
//! and bf16, its stored bytes while it is widened). BENCHMARKS.md, "(d) Memory", has the figures.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype, Metadata, SafeTensors};

use super::ModelError;

/// The checkpoint: its header, and the file to read each tensor from.
pub struct Weights {
    path: PathBuf,
    file: File,
    /// Where the tensor data starts in the file: after the header's length and the header.
    data_start: u64,
    metadata: Metadata,
}

/// What the architecture expects: tensor name -> shape.
pub type Expected = BTreeMap<String, Vec<usize>>;

/// Buffers laya saves that the forward pass does not read.
const IGNORED_BUFFERS: &[&str] = &["temperature"];

impl Weights {
    /// Opens `path` and checks its header (f32, f16 or bf16 tensors are read by [`Weights::get`]).
    pub fn open(path: &Path) -> Result<Weights, ModelError> {
        if !path.is_file() {
            return Err(ModelError::NoWeights(path.to_owned()));
        }
        let err = |message: String| ModelError::Weights { path: path.to_owned(), message };
        let file = File::open(path).map_err(|e| err(e.to_string()))?;
        // The safetensors crate checks the header against the whole file's length (every
        // tensor's byte range lies inside it, back to back), so it is given the file mapped;
        // only the header's pages are read, and the mapping is gone when this returns.
        // SAFETY: the file is mapped read-only and not modified while mapped: model files are
        // installed read-only (laya-edge never writes them); the mapping lives only for this
        // parse and no reference into it outlives it (the metadata is owned).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| err(e.to_string()))?;
        let (header, metadata) = SafeTensors::read_metadata(&map).map_err(|e| err(e.to_string()))?;
        drop(map);
        Ok(Weights { path: path.to_owned(), file, data_start: 8 + header as u64, metadata })
    }

    /// Checks names and shapes like laya: missing tensors, shape mismatches and unexpected
    /// tensors are all reported, at most five of each kind named.
    pub fn verify(&self, expected: &Expected) -> Result<(), ModelError> {
        let found: BTreeMap<String, Vec<usize>> =
            self.metadata.tensors().into_iter().map(|(name, info)| (name, info.shape.clone())).collect();
        let mut problems = Vec::new();
        let missing: Vec<&String> = expected.keys().filter(|k| !found.contains_key(*k)).collect();
        if !missing.is_empty() {
            problems.push(format!(
                "missing {} parameter tensors (e.g. {:?})",
                missing.len(),
                missing.iter().take(5).collect::<Vec<_>>()
            ));
        }
        let mismatched: Vec<String> = expected
            .iter()
            .filter_map(|(k, shape)| {
                let got = found.get(k)?;
                (got != shape).then(|| format!("{k}: expected {shape:?}, found {got:?}"))
            })
            .collect();
        if !mismatched.is_empty() {
            problems.push(format!(
                "{} shape mismatches: {}",
                mismatched.len(),
                mismatched.iter().take(5).cloned().collect::<Vec<_>>().join("; ")
            ));
        }
        let unexpected: Vec<&String> =
            found.keys().filter(|k| !expected.contains_key(*k) && !IGNORED_BUFFERS.contains(&k.as_str())).collect();
        if !unexpected.is_empty() {
            problems.push(format!(
                "{} unexpected tensors (e.g. {:?})",
                unexpected.len(),
                unexpected.iter().take(5).collect::<Vec<_>>()
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(ModelError::Weights {
                path: self.path.clone(),
                message: format!("the checkpoint does not match its configured architecture: {}", problems.join("; ")),
            })
        }
    }

    /// One tensor as f32 (shapes were checked by [`Weights::verify`]), read from the file into
    /// its own buffer.
    pub fn get(&self, name: &str) -> Result<Tensor, ModelError> {
        let err = |message: String| ModelError::Weights { path: self.path.clone(), message };
        let info = self.metadata.info(name).ok_or_else(|| err(format!("{name}: not in the checkpoint")))?;
        let (start, end) = info.data_offsets;
        let offset = self.data_start + start as u64;
        let shape = info.shape.as_slice();
        let read = |buf: &mut [u8]| self.file.read_exact_at(buf, offset).map_err(|e| err(format!("{name}: {e}")));
        let stored = match info.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::BF16,
            other => return Err(err(format!("{name} is stored as {other:?}; only f32, f16 and bf16 are supported"))),
        };
        // read_metadata checked that the byte range holds exactly the shape's elements.
        let count = (end - start) / stored.size_in_bytes();
        if stored == DType::F32 {
            let mut values = vec![0f32; count];
            // SAFETY: the byte view covers exactly `values`' `count` initialized f32s (4 bytes
            // each, u8 needs no alignment), and any bit pattern is a valid f32; `values` is not
            // used otherwise while the view lives.
            let bytes = unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), count * 4) };
            read(bytes)?;
            if cfg!(target_endian = "big") {
                // safetensors stores little-endian values.
                values.iter_mut().for_each(|v| *v = f32::from_bits(u32::from_le(v.to_bits())));
            }
            return Tensor::from_vec(values, shape, &Device::Cpu).map_err(|e| err(format!("{name}: {e}")));
        }
        let mut bytes = vec![0u8; end - start];
        read(&mut bytes)?;
        Tensor::from_raw_buffer(&bytes, stored, shape, &Device::Cpu)
            .and_then(|t| t.to_dtype(DType::F32))
            .map_err(|e| err(format!("{name}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use candle_core::safetensors::MmapedSafetensors;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("laya-weights-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir.join("model.safetensors")
    }

    /// Resident bytes of this process's mappings of `path` (`Rss` in /proc/self/smaps).
    fn resident_bytes_of(path: &Path) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        let name = path.to_str().expect("utf-8 path");
        let mut inside = false;
        let mut kib = 0;
        for line in smaps.lines() {
            if let Some(field) = line.split_whitespace().next()
                && field.contains('-')
                && !field.ends_with(':')
            {
                inside = line.ends_with(name);
            } else if inside && let Some(rest) = line.strip_prefix("Rss:") {
                kib += rest.trim().trim_end_matches("kB").trim().parse::<usize>().expect("Rss kB");
            }
        }
        kib * 1024
    }

    fn values(t: &Tensor) -> Vec<f32> {
        t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
    }

    #[test]
    fn a_checkpoint_s_tensors_are_read_as_candle_reads_them_and_none_of_its_pages_stays_resident() {
        let src =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models/bpe-t5/model.safetensors");
        let path = scratch("rss");
        std::fs::copy(&src, &path).unwrap();
        let size = std::fs::metadata(&path).unwrap().len() as usize;
        let weights = Weights::open(&path).unwrap();
        let mut names: Vec<String> = weights.metadata.tensors().into_keys().collect();
        names.sort();
        assert!(names.len() > 10, "{} tensors", names.len());
        // SAFETY: a private copy nothing writes.
        let reference = unsafe { MmapedSafetensors::new(&src) }.unwrap();
        let mut copied = 0;
        let mut held = Vec::new();
        for name in &names {
            let t = weights.get(name).unwrap();
            let want = reference.load(name, &Device::Cpu).unwrap();
            assert_eq!(t.dims(), want.dims(), "{name}");
            assert_eq!(values(&t), values(&want.to_dtype(DType::F32).unwrap()), "{name}");
            copied += t.elem_count() * 4;
            held.push(t);
        }
        assert!(copied > size * 9 / 10, "{copied} bytes of tensors from a file of {size}");
        let resident = resident_bytes_of(&path);
        assert_eq!(resident, 0, "{resident} of {size} bytes of the checkpoint file still resident");
        drop(weights);
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }

    #[test]
    fn f16_and_bf16_tensors_are_widened_to_f32_and_other_types_are_refused_by_name() {
        let path = scratch("dtypes");
        let x = Tensor::new(&[[0.5f32, -1.25, 3.0], [1e-3, 65504.0, -0.0]], &Device::Cpu).unwrap();
        let tensors: HashMap<&str, Tensor> = HashMap::from([
            ("a.f16", x.to_dtype(DType::F16).unwrap()),
            ("b.bf16", x.to_dtype(DType::BF16).unwrap()),
            ("c.f32", x.clone()),
            ("d.i64", Tensor::new(&[1i64, 2], &Device::Cpu).unwrap()),
        ]);
        candle_core::safetensors::save(&tensors, &path).unwrap();
        let weights = Weights::open(&path).unwrap();
        for name in ["a.f16", "b.bf16", "c.f32"] {
            let got = weights.get(name).unwrap();
            assert_eq!(got.dtype(), DType::F32, "{name}");
            assert_eq!(got.dims(), [2, 3], "{name}");
            assert_eq!(values(&got), values(&tensors[name].to_dtype(DType::F32).unwrap()), "{name}");
        }
        let refused = weights.get("d.i64").unwrap_err().to_string();
        assert!(refused.contains("d.i64 is stored as I64; only f32, f16 and bf16 are supported"), "{refused}");
        let missing = weights.get("e").unwrap_err().to_string();
        assert!(missing.contains("e: not in the checkpoint"), "{missing}");
        std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
    }
}
