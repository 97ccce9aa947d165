//! The model's layer norms (the encoder's, without bias in ModernBERT, and the head's), as a
//! candle op over the last dimension on the vectorised rows of [`super::vector::layer_norm`].
//!
//! Why not `candle_nn::LayerNorm`: its op is a scalar loop that takes the variance as
//! `E[x^2] - mean^2` in f32 (see `vector/norm.rs` for why that is worse than what laya's PyTorch
//! computes), and without a bias it is given a tensor of zeros to add.

use candle_core::{CpuStorage, CustomOp1, DType, Layout, Shape, Tensor};

use super::dense::contiguous_f32;
use super::vector;

/// `(x - mean) / sqrt(var + eps) * weight (+ bias)` over the last dimension.
#[derive(Debug, Clone)]
pub struct LayerNorm {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    eps: f32,
}

impl LayerNorm {
    /// A norm from a `[d]` weight, an optional `[d]` bias and epsilon (taken in f32, as
    /// candle's and PyTorch's float kernels take it).
    pub fn new(weight: &Tensor, bias: Option<&Tensor>, eps: f64) -> candle_core::Result<LayerNorm> {
        let d = weight.dims1()?;
        let bias = match bias {
            Some(b) if b.dims1()? != d => {
                candle_core::bail!("layer norm: a bias of {} for a weight of {d}", b.dims1()?)
            }
            Some(b) => Some(b.to_dtype(DType::F32)?.to_vec1::<f32>()?),
            None => None,
        };
        Ok(LayerNorm { weight: weight.to_dtype(DType::F32)?.to_vec1::<f32>()?, bias, eps: eps as f32 })
    }

    /// The norm of `x` `[.., d]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op1_no_bwd(self)
    }
}

impl CustomOp1 for LayerNorm {
    fn name(&self) -> &'static str {
        "layer-norm"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let x = contiguous_f32(s, l, "layer norm: input")?;
        let d = self.weight.len();
        if l.dims().last() != Some(&d) || d == 0 {
            candle_core::bail!("layer norm: input {:?} for a weight of {d}", l.dims());
        }
        let mut out = vec![0f32; x.len()];
        let parallel = candle_core::utils::get_num_threads() > 1 && x.len() > d;
        vector::layer_norm(x, &self.weight, self.bias.as_deref(), self.eps, &mut out, parallel);
        Ok((CpuStorage::F32(out), l.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Module};

    use super::*;

    fn random(shape: &[usize]) -> Tensor {
        Tensor::randn(0f32, 1.0, shape, &Device::Cpu).unwrap()
    }

    #[test]
    fn the_norm_is_candles_layer_norm_with_and_without_bias_within_float_error() {
        let (w, b) = ((random(&[96]) + 1.0).unwrap(), random(&[96]));
        let zeros = Tensor::zeros(96, DType::F32, &Device::Cpu).unwrap();
        for shape in [&[1, 96][..], &[3, 5, 96], &[700, 96]] {
            let x = (random(shape) * 3.0).unwrap();
            for (ours, theirs) in [
                (LayerNorm::new(&w, Some(&b), 1e-5).unwrap(), candle_nn::LayerNorm::new(w.clone(), b.clone(), 1e-5)),
                (LayerNorm::new(&w, None, 1e-6).unwrap(), candle_nn::LayerNorm::new(w.clone(), zeros.clone(), 1e-6)),
            ] {
                let (got, want) = (ours.forward(&x).unwrap(), theirs.forward(&x).unwrap());
                assert_eq!(got.dims(), want.dims());
                let worst: f32 =
                    (got - want).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap();
                assert!(worst < 1e-5, "{shape:?}: {worst}");
            }
        }
    }

    #[test]
    fn a_wrong_width_or_bias_is_an_error_not_a_panic() {
        let norm = LayerNorm::new(&random(&[8]), None, 1e-5).unwrap();
        assert!(norm.forward(&random(&[2, 7])).is_err());
        assert!(LayerNorm::new(&random(&[8]), Some(&random(&[7])), 1e-5).is_err());
        assert!(LayerNorm::new(&random(&[0]), None, 1e-5).unwrap().forward(&random(&[2, 0])).is_err());
    }
}
