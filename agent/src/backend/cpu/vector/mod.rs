//! Vectorised passes of the CPU model outside its products: softmax's `exp`, the GeGLU's erf GELU,
//! layer norm and RoPE's rotation, on the `pulp` crate's SIMD types with the instruction set chosen
//! at run time.
//!
//! Why: with the products at ~90% of the machine's peak, ~16% of a layer was small scalar passes
//! (BENCHMARKS.md, "Where a layer's time goes"): libm's `expf` once per attention score, libm's
//! `erff` once per GeGLU element, candle's scalar `layer_norm`. No tensor library this project uses
//! has a vectorised pass for them that fits (candle's are the scalar ones), so issue #43 allows
//! these helpers, written once, generically over `pulp::Simd` (the crate `gemm` already uses for
//! its own dispatch), and run on the widest [`Isa`] the CPU has: AVX-512 (`pulp::x86::V4`),
//! AVX2 with FMA (`V3`), NEON on aarch64, or the scalar path, which is the code these helpers
//! replace (libm's `expf` and `erff`, a plain loop) on every target.
//!
//! Each helper documents its maximum error against the scalar libm result, and its tests hold
//! every path this CPU has to it (`Isa::available`). `LAYA_CPU_KERNELS` (`avx512f`, `fma`,
//! `neon` or `scalar`) forces one path for the whole process, the `gemm` microkernels of the
//! linear layers included (`panels::Kernel::detect`): the way to run the conformance tests, or a
//! benchmark, on a narrower path than the CPU's widest. A name this CPU cannot run is ignored (the
//! widest is used), never run.

mod erf;
mod exp;
mod norm;
mod rope;

use std::sync::OnceLock;

pub use erf::gelu_gate;
pub use exp::softmax;
pub use norm::layer_norm;
pub use rope::rotate;

/// The environment variable that forces one instruction set (see the module doc).
pub const FORCE_VAR: &str = "LAYA_CPU_KERNELS";

/// An instruction set the helpers run on, holding `pulp`'s proof that the CPU has it.
#[derive(Debug, Clone, Copy)]
pub enum Isa {
    /// AVX-512 F, BW, CD, DQ and VL (16 floats a vector).
    #[cfg(target_arch = "x86_64")]
    Avx512(pulp::x86::V4),
    /// AVX2 with FMA (8 floats a vector).
    #[cfg(target_arch = "x86_64")]
    Avx2(pulp::x86::V3),
    /// NEON (4 floats a vector).
    #[cfg(target_arch = "aarch64")]
    Neon(pulp::aarch64::Neon),
    /// The scalar code the helpers replace: libm's `expf` and `erff`, plain loops.
    Scalar,
}

impl Isa {
    /// The name, the same as the `gemm` kernel set of the same width (`--version`'s `cpu
    /// kernels`): `avx512f`, `fma`, `neon` or `scalar`.
    pub fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(_) => "avx512f",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(_) => "fma",
            #[cfg(target_arch = "aarch64")]
            Isa::Neon(_) => "neon",
            Isa::Scalar => "scalar",
        }
    }

    /// Every instruction set this CPU runs, widest first, the scalar path last.
    pub fn available() -> Vec<Isa> {
        let mut sets = Vec::new();
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V4::try_new() {
            sets.push(Isa::Avx512(simd));
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = pulp::x86::V3::try_new() {
            sets.push(Isa::Avx2(simd));
        }
        #[cfg(target_arch = "aarch64")]
        if let Some(simd) = pulp::aarch64::Neon::try_new() {
            sets.push(Isa::Neon(simd));
        }
        sets.push(Isa::Scalar);
        sets
    }

    /// The instruction set of this process: the one `LAYA_CPU_KERNELS` names if this CPU runs
    /// it, else the widest. Chosen once.
    pub fn active() -> Isa {
        static ACTIVE: OnceLock<Isa> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let sets = Isa::available();
            let forced = forced();
            sets.iter().copied().find(|isa| forced.as_deref() == Some(isa.name())).unwrap_or(sets[0])
        })
    }
}

/// The name `LAYA_CPU_KERNELS` gives, if any (read once per process, shared with `panels`).
pub(super) fn forced() -> Option<String> {
    static FORCED: OnceLock<Option<String>> = OnceLock::new();
    FORCED.get_or_init(|| std::env::var(FORCE_VAR).ok().map(|v| v.trim().to_ascii_lowercase())).clone()
}

/// A pass written once over `pulp::Simd`, with the scalar code it replaces.
trait Pass: pulp::WithSimd + Sized {
    /// The scalar path (libm, plain loops).
    fn scalar(self) -> Self::Output;

    /// Runs on `isa`.
    #[inline(always)]
    fn run(self, isa: Isa) -> Self::Output {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512(simd) => pulp::Simd::vectorize(simd, self),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2(simd) => pulp::Simd::vectorize(simd, self),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon(simd) => pulp::Simd::vectorize(simd, self),
            Isa::Scalar => self.scalar(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_this_cpu_has_is_offered_widest_first_and_the_active_one_is_the_forced_or_the_widest() {
        let names: Vec<&str> = Isa::available().iter().map(|isa| isa.name()).collect();
        #[cfg(target_arch = "x86_64")]
        let want: Vec<&str> =
            [("avx512f", pulp::x86::V4::try_new().is_some()), ("fma", pulp::x86::V3::try_new().is_some())]
                .into_iter()
                .filter_map(|(name, has)| has.then_some(name))
                .chain(["scalar"])
                .collect();
        #[cfg(target_arch = "aarch64")]
        let want = vec!["neon", "scalar"];
        #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
        let want = vec!["scalar"];
        assert_eq!(names, want);
        // Run with LAYA_CPU_KERNELS set, this checks the override; a name this CPU lacks is ignored.
        let forced = forced().filter(|name| want.contains(&name.as_str()));
        assert_eq!(Isa::active().name(), forced.as_deref().unwrap_or(want[0]));
    }

    #[test]
    fn every_vector_path_runs_its_own_instructions_not_the_scalar_code() {
        // The scalar path is libm; a vector path's exp differs from it in the last bit somewhere
        // (its error is documented, not zero), so a dispatch that fell back would show here.
        let mut x: Vec<f32> = (0..4096).map(|i| -20.0 + i as f32 * 0.009_77).collect();
        let mut want = x.clone();
        softmax_scalar_exp(&mut want);
        for isa in Isa::available().into_iter().filter(|isa| isa.name() != "scalar") {
            let mut got = x.clone();
            exp::softmax_on(isa, &mut got);
            assert!(got.iter().zip(&want).any(|(g, w)| g != w), "{} gave libm's floats", isa.name());
        }
        exp::softmax_on(Isa::Scalar, &mut x);
        assert_eq!(x, want, "the scalar path is the scalar loop");
    }

    /// The softmax loop of attention before issue #43.
    fn softmax_scalar_exp(s: &mut [f32]) {
        let max = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0f32;
        for v in s.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        s.iter_mut().for_each(|v| *v /= sum);
    }
}

#[cfg(test)]
pub(super) mod accuracy {
    //! What the helpers' accuracy tests share: distances in ulps and the inputs swept.

    /// The distance in ulps between two floats: how many representable floats lie between them
    /// (0 for equal values and for two NaNs, +0 and -0 one apart, the largest finite float and
    /// infinity one apart). `u32::MAX` when only one is NaN.
    pub fn ulps(a: f32, b: f32) -> u32 {
        if a.is_nan() || b.is_nan() {
            return if a.is_nan() && b.is_nan() { 0 } else { u32::MAX };
        }
        // Floats as integers in the order of their values (negative ones mirrored).
        let ordered = |x: f32| {
            let bits = x.to_bits() as i64;
            if bits & 0x8000_0000 != 0 { -(bits & 0x7fff_ffff) - 1 } else { bits }
        };
        ordered(a).abs_diff(ordered(b)).min(u32::MAX as u64) as u32
    }

    /// The step between swept bit patterns: `LAYA_SWEEP_STEP` (1 sweeps every float: seconds a
    /// helper in a release build), else every 2^8th pattern, which a dev build runs in seconds.
    pub fn step() -> usize {
        std::env::var("LAYA_SWEEP_STEP").ok().and_then(|s| s.parse().ok()).filter(|&s| s > 0).unwrap_or(1 << 8)
    }

    /// Calls `each` with the inputs of a sweep, a few million at a time: every `step`th bit pattern
    /// of both signs, plus the 256 floats on either side of each point in `special` and of the
    /// special values (zeros, the smallest and largest subnormals, the smallest normal, one, the
    /// largest finite, infinities, NaNs). Returns how many there were.
    pub fn sweep(special: &[f32], mut each: impl FnMut(&[f32])) -> usize {
        let mut patterns = (0..=u32::MAX).step_by(step()).map(f32::from_bits);
        let mut count = 0;
        loop {
            let chunk: Vec<f32> = patterns.by_ref().take(1 << 22).collect();
            if chunk.is_empty() {
                break;
            }
            count += chunk.len();
            each(&chunk);
        }
        let mut out = Vec::new();
        let always = [0.0, f32::from_bits(1), f32::from_bits(0x007f_ffff), f32::MIN_POSITIVE, 1.0, f32::MAX];
        for p in special.iter().chain(&always).flat_map(|&p| [p, -p]) {
            let bits = p.to_bits();
            for delta in 0..=256u32 {
                for b in [bits.wrapping_add(delta), bits.wrapping_sub(delta)] {
                    // Stay on the same sign: wrapping across zero changes the sign bit.
                    if (b ^ bits) & 0x8000_0000 == 0 {
                        out.push(f32::from_bits(b));
                    }
                }
            }
        }
        out.extend([f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, f32::from_bits(0x7fc0_0001)]);
        each(&out);
        count + out.len()
    }
}
