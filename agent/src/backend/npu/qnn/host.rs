//! The host side of the host/NPU split: graph choice, the encoder's inputs for one row (token
//! embeddings gathered on the host, the attention biases), and the conversions to and from each
//! tensor's encoding.
//!
//! V68 ignores runtime integer Gather indices on-chip, so the embedding lookup stays on the host;
//! the graph starts at the embedding LayerNorm. The biases are the CPU reference's
//! (`model::masks`): 0 where a query may attend to a key, `f32::MIN` where it may not.

use candle_core::{Device, Tensor};

use crate::backend::cpu::encoder::Encoder;
use crate::backend::cpu::{ModelError, masks};

use super::binary::Encoding;

pub use crate::bundle::MINMAX_MAX_TOKENS;

/// The index of the smallest usable graph (by sequence length) whose length holds `len`
/// tokens, or `None`. Each graph is `(seq_len, usable)`, usability being the bundle's
/// calibration guard ([`crate::bundle::Manifest::usable`]).
pub fn choose_graph(graphs: &[(usize, bool)], len: usize) -> Option<usize> {
    graphs
        .iter()
        .enumerate()
        .filter(|(_, (l, usable))| *usable && *l >= len)
        .min_by_key(|(_, (l, _))| *l)
        .map(|(i, _)| i)
}

/// Deliberate host-step faults, for tests that prove the NPU comparisons can fail. Never set in
/// production; see `QnnBackend::set_host_fault`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HostFault {
    #[default]
    None,
    /// Both masks attend everywhere: no key padding, no sliding window.
    WrongMasks,
    /// Quantize with the offset's sign flipped: `q = x / scale + offset`.
    FlippedOffset,
}

/// `[L, L]` global and sliding biases for a row of `len` tokens padded to `l`.
pub fn biases(len: usize, l: usize, window: usize, fault: HostFault) -> (Vec<f32>, Vec<f32>) {
    if fault == HostFault::WrongMasks {
        return (vec![0.0; l * l], vec![0.0; l * l]);
    }
    (masks::attention_biases(&[len], l, None), masks::attention_biases(&[len], l, Some(window)))
}

/// `UFIXED_POINT_16`: `q = clamp(round(x / scale - offset), 0, 65535)`. A masked position
/// (`f32::MIN`) saturates to 0, the lowest representable value.
pub fn quantize_u16(x: f32, scale: f32, offset: i32, fault: HostFault) -> u16 {
    let offset = if fault == HostFault::FlippedOffset { -(offset as f64) } else { offset as f64 };
    let q = (x as f64 / scale as f64 - offset).round();
    q.clamp(0.0, 65535.0) as u16
}

/// `float = (q + offset) * scale`.
pub fn dequantize_u16(q: u16, scale: f32, offset: i32) -> f32 {
    ((q as i64 + offset as i64) as f64 * scale as f64) as f32
}

/// The graph's three inputs for one row, as the bytes its tensors take: the token embeddings of
/// `ids` padded to `l` with `pad_id`, the global and the sliding-window bias, each converted to
/// its tensor's encoding (`encodings` in the order `inputs_embeds`, `gmask`, `smask`).
pub fn prepare_inputs(
    encoder: &Encoder,
    ids: &[u32],
    pad_id: u32,
    l: usize,
    encodings: [Encoding; 3],
    fault: HostFault,
) -> Result<[Vec<u8>; 3], ModelError> {
    let mut padded = ids.to_vec();
    padded.resize(l, pad_id);
    let ids_t = Tensor::from_vec(padded, (1, l), &Device::Cpu)?;
    let embeds: Vec<f32> = encoder.embed(&ids_t)?.flatten_all()?.to_vec1()?;
    let (gmask, smask) = biases(ids.len(), l, encoder.config.sliding_window(), fault);
    Ok([encode(&embeds, encodings[0], fault), encode(&gmask, encodings[1], fault), encode(&smask, encodings[2], fault)])
}

/// The graph's output bytes (`[1, l, d]` in `encoding`) as float hidden states of the row's
/// `len` real tokens.
pub fn read_output(bytes: &[u8], encoding: Encoding, l: usize, d: usize, len: usize) -> Result<Tensor, ModelError> {
    let hidden = Tensor::from_vec(decode(bytes, encoding), (1, l, d), &Device::Cpu)?;
    Ok(hidden.narrow(1, 0, len)?)
}

/// Encodes float values as a tensor's bytes (little-endian, as the runtime reads them).
pub fn encode(values: &[f32], encoding: Encoding, fault: HostFault) -> Vec<u8> {
    match encoding {
        Encoding::Float32 => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Encoding::Float16 => values.iter().flat_map(|&v| f32_to_f16(v).to_le_bytes()).collect(),
        Encoding::Ufixed16 { scale, offset } => {
            values.iter().flat_map(|&v| quantize_u16(v, scale, offset, fault).to_le_bytes()).collect()
        }
    }
}

/// Decodes a tensor's bytes to floats.
pub fn decode(bytes: &[u8], encoding: Encoding) -> Vec<f32> {
    match encoding {
        Encoding::Float32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect(),
        Encoding::Float16 => bytes.chunks_exact(2).map(|c| f16_to_f32(u16::from_le_bytes([c[0], c[1]]))).collect(),
        Encoding::Ufixed16 { scale, offset } => {
            bytes.chunks_exact(2).map(|c| dequantize_u16(u16::from_le_bytes([c[0], c[1]]), scale, offset)).collect()
        }
    }
}

/// IEEE half from single, round to nearest even; `f32::MIN` becomes `-inf`'s neighbour
/// `-65504` (half's lowest finite), so masked biases stay finite.
fn f32_to_f16(x: f32) -> u16 {
    let h = half_bits(x);
    if (h & 0x7C00) == 0x7C00 && (h & 0x03FF) == 0 && x.is_finite() { (h & 0x8000) | 0x7BFF } else { h }
}

fn half_bits(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = ((b >> 23) & 0xFF) as i32;
    let man = b & 0x007F_FFFF;
    if exp == 0xFF {
        return sign | 0x7C00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1F {
        return sign | 0x7C00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = m >> shift;
        let rem = m & ((1 << shift) - 1);
        let mid = 1 << (shift - 1);
        let round = (rem > mid || (rem == mid && (half & 1) == 1)) as u32;
        return sign | (half + round) as u16;
    }
    let half = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1FFF;
    let round = (rem > 0x1000 || (rem == 0x1000 && (half & 1) == 1)) as u32;
    sign | (half + round) as u16
}

fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x03FF) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3FF) << 13)
        }
        (0x1F, m) => sign | 0x7F80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_smallest_usable_graph_that_holds_the_row_is_chosen() {
        let g = [(256, true), (128, true)];
        assert_eq!(choose_graph(&g, 10), Some(1));
        assert_eq!(choose_graph(&g, 128), Some(1));
        assert_eq!(choose_graph(&g, 129), Some(0));
        assert_eq!(choose_graph(&g, 257), None);
        let g = [(256, false), (512, true)];
        assert_eq!(choose_graph(&g, 20), Some(1));
        assert_eq!(choose_graph(&[(256, false)], 20), None);
    }

    #[test]
    fn masked_positions_quantize_to_the_lowest_value_and_attended_ones_to_the_zero_point() {
        // The fixture masks: scale 100/65535, offset -65535 (float 0.0 is q = 65535).
        let (scale, offset) = (0.001_525_902_2_f32, -65535);
        assert_eq!(quantize_u16(masks::MASKED, scale, offset, HostFault::None), 0);
        assert_eq!(quantize_u16(0.0, scale, offset, HostFault::None), 65535);
        assert_eq!(quantize_u16(-100.0, scale, offset, HostFault::None), 0);
        assert!((dequantize_u16(0, scale, offset) + 100.0).abs() < 1e-3);
    }

    #[test]
    fn quantization_round_trips_within_half_a_step() {
        let (scale, offset) = (1.646_630_7e-5_f32, -34940);
        for x in [-0.5f32, -0.01, 0.0, 0.123, 0.49] {
            let y = dequantize_u16(quantize_u16(x, scale, offset, HostFault::None), scale, offset);
            assert!((x - y).abs() <= scale / 2.0 + 1e-9, "{x} -> {y}");
        }
    }

    #[test]
    fn half_conversion_keeps_masks_finite() {
        assert_eq!(f16_to_f32(f32_to_f16(1.5)), 1.5);
        assert_eq!(f16_to_f32(f32_to_f16(f32::MIN)), -65504.0);
        assert_eq!(f16_to_f32(f32_to_f16(0.0)), 0.0);
    }
}
