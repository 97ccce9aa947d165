//! A linear layer, `y = x W^T + b (+ residual)`, on weights packed once at load
//! ([`super::panels`]), instead of candle_nn's `Linear`.
//!
//! Why not `Linear`: it multiplies, then adds the bias in a second pass over a fresh output, and
//! the layer adds the residual in a third; and it (like any plain `gemm` call) packs the weight
//! matrix again on every multiply. Here the destination starts as the bias (or the residual
//! plus the bias) and the product `W x^T` is added to it in the same pass, written straight into
//! the row-major output (the weight rows are the microkernels' long side). The float results
//! are the same sums in a different order (fixture tolerances hold; the tests below compare
//! with `Linear`).

use std::sync::Arc;

use candle_core::{CpuStorage, CustomOp1, CustomOp2, DType, Layout, Shape, Tensor};

use super::bf16::{Bf16Kernel, Bf16Weights};
use super::int8::{I8Kernel, QuantWeights};
use super::panels::{Kernel, PackedWeights};
use crate::config::CpuWeights;

/// A `[out, inp]` weight packed for this CPU's kernels in `mode`, read in place when it is a
/// contiguous f32 tensor (the loaded weights are: `weights.rs` widens everything to f32), so that
/// loading holds the tensor and its packed copy, not a third, plain copy of the largest matrix on
/// the way.
fn packed(weight: &Tensor, out: usize, inp: usize, mode: CpuWeights) -> candle_core::Result<Product> {
    let pack = |w: &[f32]| -> candle_core::Result<Product> {
        Ok(match mode {
            CpuWeights::F32 => Product::F32(PackedWeights::pack(Kernel::detect(), w, out, inp)),
            CpuWeights::Int8 => {
                Product::Int8(QuantWeights::quantise(I8Kernel::detect(), w, out, inp).map_err(candle_core::Error::Msg)?)
            }
            CpuWeights::Bf16 => Product::Bf16(
                Bf16Weights::convert(Bf16Kernel::detect().map_err(candle_core::Error::Msg)?, w, out, inp)
                    .map_err(candle_core::Error::Msg)?,
            ),
        })
    };
    if weight.dtype() == DType::F32 {
        let (storage, layout) = weight.storage_and_layout();
        if let (candle_core::Storage::Cpu(CpuStorage::F32(data)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return pack(&data[start..end]);
        }
    }
    let plain = weight.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
    pack(&plain)
}

/// A layer's weights as its product reads them: f32 panels (the reference), or the quantised
/// CPU modes' int8 or bf16 ones (`[cpu] weights`).
#[derive(Clone)]
enum Product {
    F32(PackedWeights),
    Int8(QuantWeights),
    Bf16(Bf16Weights),
}

impl Product {
    fn rows(&self) -> usize {
        match self {
            Product::F32(w) => w.rows(),
            Product::Int8(w) => w.rows(),
            Product::Bf16(w) => w.rows(),
        }
    }
}

/// The floats of a custom op's CPU input (`what`: the op and the input, for the error), which
/// must be f32 and contiguous: the check every op of this backend makes on what candle hands it.
pub(super) fn contiguous_f32<'a>(s: &'a CpuStorage, l: &Layout, what: &str) -> candle_core::Result<&'a [f32]> {
    let CpuStorage::F32(data) = s else { candle_core::bail!("{what} is not f32") };
    let Some((start, end)) = l.contiguous_offsets() else { candle_core::bail!("{what} not contiguous") };
    Ok(&data[start..end])
}

/// `y = x W^T + b` over the last dimension of `x`, optionally `+ residual`.
#[derive(Clone)]
pub struct Dense {
    /// `[out, inp]`, packed for the widest kernel set of this CPU; views of one packed f32 matrix
    /// share it ([`Dense::narrow`]).
    weight: Product,
    /// `[out]`, this layer's outputs only.
    bias: Option<Arc<Vec<f32>>>,
    inp: usize,
}

impl Dense {
    /// A layer from a `[out, inp]` weight and an optional `[out]` bias (f32).
    pub fn new(weight: &Tensor, bias: Option<&Tensor>) -> candle_core::Result<Dense> {
        Dense::with_weights(weight, bias, CpuWeights::F32)
    }

    /// A layer whose product runs in `mode`: f32, or weights quantised here to int8 (per output
    /// channel) or bf16; the bias stays f32.
    pub fn with_weights(weight: &Tensor, bias: Option<&Tensor>, mode: CpuWeights) -> candle_core::Result<Dense> {
        let (out, inp) = weight.dims2()?;
        let weight = packed(weight, out, inp, mode)?;
        let bias = match bias {
            Some(b) => {
                if b.dims1()? != out {
                    candle_core::bail!("bias of {} features for a weight of {out} outputs", b.dims1()?);
                }
                Some(Arc::new(b.to_dtype(DType::F32)?.to_vec1::<f32>()?))
            }
            None => None,
        };
        Ok(Dense { weight, bias, inp })
    }

    /// The outputs `start..start + len` of this layer alone (shares the packed weights where
    /// `start` is on a panel boundary, as the head's `d` is).
    pub fn narrow(&self, start: usize, len: usize) -> candle_core::Result<Dense> {
        let Product::F32(packed) = &self.weight else {
            candle_core::bail!("only an f32 layer is narrowed (the quantised modes keep the head in f32)");
        };
        let Some(weight) = packed.select(start..start + len).map(Product::F32) else {
            candle_core::bail!("outputs {start}..{} of a layer of {}", start + len, self.out());
        };
        let bias = self.bias.as_ref().map(|b| Arc::new(b[start..start + len].to_vec()));
        Ok(Dense { weight, bias, inp: self.inp })
    }

    /// Output features.
    pub fn out(&self) -> usize {
        self.weight.rows()
    }

    /// Input features.
    pub fn inp(&self) -> usize {
        self.inp
    }

    /// `x W^T + b` for `x` `[.., inp]`.
    pub fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op1_no_bwd(self)
    }

    /// `residual + x W^T + b`, the residual shaped like the output.
    pub fn forward_add(&self, x: &Tensor, residual: &Tensor) -> candle_core::Result<Tensor> {
        x.contiguous()?.apply_op2_no_bwd(&residual.contiguous()?, &Residual(self))
    }

    /// The output (`n` rows of `self.out()`): the residual if any, plus the bias if any, plus
    /// the product of the `n` rows of `x`.
    fn run(&self, x: &[f32], n: usize, residual: Option<&[f32]>) -> candle_core::Result<Vec<f32>> {
        // What the product is added to. The residual is copied as it is (not zeroed first,
        // then copied: a whole pass over the output, which for the feed-forward is the largest
        // buffer of the layer).
        let mut dst = residual.map_or_else(|| vec![0f32; n * self.out()], <[f32]>::to_vec);
        // Sizes are checked there.
        self.add_to(x, n, &mut dst)?;
        Ok(dst)
    }

    /// Adds `x W^T + b` for the `n` rows of `x` (`n x inputs`, row-major) to `dst` (`n x
    /// outputs`): the layer's product for a caller that owns the output.
    pub fn add_to(&self, x: &[f32], n: usize, dst: &mut [f32]) -> candle_core::Result<()> {
        let (m, k) = (self.out(), self.inp);
        if x.len() != n * k || dst.len() != n * m {
            candle_core::bail!("dense: {} inputs and {} outputs for {n} rows of {k} -> {m}", x.len(), dst.len());
        }
        if let Some(b) = &self.bias {
            for row in dst.chunks_exact_mut(m) {
                row.iter_mut().zip(b.iter()).for_each(|(y, b)| *y += b);
            }
        }
        let threads = candle_core::utils::get_num_threads();
        match &self.weight {
            Product::F32(w) => w.multiply_add(x, n, dst, m, threads),
            Product::Int8(w) => w.multiply_add(x, n, dst, m, threads),
            Product::Bf16(w) => w.multiply_add(x, n, dst, m, threads),
        }
        Ok(())
    }

    /// Input checks shared by both ops: f32, contiguous, last dimension `inp`; the rows and the
    /// output shape.
    fn shape_of<'a>(&self, s: &'a CpuStorage, l: &Layout) -> candle_core::Result<(&'a [f32], usize, Shape)> {
        let data = contiguous_f32(s, l, "dense: input")?;
        let dims = l.dims();
        let Some((&last, lead)) = dims.split_last() else { candle_core::bail!("dense: a scalar input") };
        if last != self.inp {
            candle_core::bail!("dense: input of {last} features for a layer of {}", self.inp);
        }
        let mut out_dims = lead.to_vec();
        out_dims.push(self.out());
        Ok((data, lead.iter().product(), Shape::from(out_dims)))
    }
}

impl CustomOp1 for Dense {
    fn name(&self) -> &'static str {
        "dense"
    }

    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, n, shape) = self.shape_of(s, l)?;
        Ok((CpuStorage::F32(self.run(x, n, None)?), shape))
    }
}

/// [`Dense`] with a residual added in the same pass.
struct Residual<'a>(&'a Dense);

impl CustomOp2 for Residual<'_> {
    fn name(&self) -> &'static str {
        "dense-residual"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (x, n, shape) = self.0.shape_of(s1, l1)?;
        if l2.dims() != shape.dims() {
            candle_core::bail!("dense: residual {:?} for an output {:?}", l2.dims(), shape.dims());
        }
        let residual = contiguous_f32(s2, l2, "dense: residual")?;
        Ok((CpuStorage::F32(self.0.run(x, n, Some(residual))?), shape))
    }
}

#[cfg(test)]
mod tests {
    use candle_core::{Device, Module};

    use super::*;

    fn random(shape: &[usize]) -> Tensor {
        Tensor::randn(0f32, 0.5, shape, &Device::Cpu).unwrap()
    }

    fn worst(a: &Tensor, b: &Tensor) -> f32 {
        (a - b).unwrap().abs().unwrap().flatten_all().unwrap().max(0).unwrap().to_scalar().unwrap()
    }

    #[test]
    fn a_dense_layer_equals_candles_linear_with_and_without_bias_at_every_row_count() {
        for rows in [1, 5, 17, 128] {
            let (w, b, x) = (random(&[96, 64]), random(&[96]), random(&[2, rows, 64]));
            let want = candle_nn::Linear::new(w.clone(), Some(b.clone())).forward(&x).unwrap();
            let got = Dense::new(&w, Some(&b)).unwrap().forward(&x).unwrap();
            assert_eq!(got.dims(), want.dims());
            assert!(worst(&got, &want) < 1e-4, "{rows} rows: {}", worst(&got, &want));
            let want = candle_nn::Linear::new(w.clone(), None).forward(&x).unwrap();
            let got = Dense::new(&w, None).unwrap().forward(&x).unwrap();
            assert!(worst(&got, &want) < 1e-4, "{rows} rows without bias");
        }
    }

    #[test]
    fn the_residual_is_added_and_a_narrowed_layer_computes_its_outputs_alone() {
        let (w, b) = (random(&[96, 64]), random(&[96]));
        let narrowed = candle_nn::Linear::new(w.narrow(0, 32, 32).unwrap(), Some(b.narrow(0, 32, 32).unwrap()));
        let dense = Dense::new(&w, Some(&b)).unwrap().narrow(32, 32).unwrap();
        for rows in [3, 40] {
            let (x, r) = (random(&[rows, 64]), random(&[rows, 32]));
            let want = (narrowed.forward(&x).unwrap() + &r).unwrap();
            let got = dense.forward_add(&x, &r).unwrap();
            assert!(worst(&got, &want) < 1e-4, "{rows} rows: {}", worst(&got, &want));
            let without_bias = Dense::new(&w, None).unwrap().narrow(32, 32).unwrap().forward_add(&x, &r).unwrap();
            let want = (candle_nn::Linear::new(w.narrow(0, 32, 32).unwrap(), None).forward(&x).unwrap() + &r).unwrap();
            assert!(worst(&without_bias, &want) < 1e-4, "{rows} rows without bias");
        }
        // A strided input (a transposed view) is read in its logical order.
        let xt = random(&[64, 3]).t().unwrap();
        let want = candle_nn::Linear::new(w.clone(), Some(b.clone())).forward(&xt).unwrap();
        assert!(worst(&Dense::new(&w, Some(&b)).unwrap().forward(&xt).unwrap(), &want) < 1e-4);
    }

    #[test]
    fn a_weight_read_in_place_or_through_a_copy_gives_the_same_layer() {
        // A contiguous f32 weight is packed from its own storage; a transposed view and an f64
        // tensor go through a copy.
        let w = random(&[96, 64]);
        let x = random(&[7, 64]);
        let want = Dense::new(&w, None).unwrap().forward(&x).unwrap();
        let view = w.t().unwrap().contiguous().unwrap().t().unwrap();
        assert!(!view.is_contiguous());
        for other in [view, w.to_dtype(DType::F64).unwrap()] {
            let got = Dense::new(&other, None).unwrap().forward(&x).unwrap();
            assert!(worst(&got, &want) < 1e-6, "{:?}", other.dtype());
        }
    }

    #[test]
    fn a_wrong_input_width_or_residual_shape_is_an_error_not_a_panic() {
        let dense = Dense::new(&random(&[8, 4]), None).unwrap();
        assert!(dense.forward(&random(&[2, 5])).is_err());
        assert!(dense.forward_add(&random(&[2, 4]), &random(&[2, 7])).is_err());
        assert!(dense.narrow(4, 5).is_err());
    }
}
