//! numpy's float32 arithmetic as laya's decoder meets it.
//!
//! laya turns logits into probabilities with numpy on `float32` arrays: `np.exp`, `np.log`,
//! `.sum()`. numpy's x86-64 builds compute `exp` and `log` with their own vectorised
//! rational approximations (Cody-Waite reduction, a 5th/2nd-order and a 5th/5th-order
//! minimax ratio, fused multiply-adds), not with the C library, and sum with 8-way pairwise
//! blocks. Those results differ from correctly rounded ones in the last bits, which is enough to
//! flip a probability rounded to 4 decimals now and then. To publish laya's exact numbers the
//! same algorithms are written out here in scalar form; `f32::mul_add` is a fused
//! multiply-add on every target, so the results are the same on x86-64 and aarch64.
//!
//! The constants are numpy's published coefficients (numpy/_core/src/common/npy_simd_data.h and
//! npy_math.h); the implementation is ours. tests/fixtures/laya-0.3.20/vectors holds numpy's own
//! outputs to check it against.

const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2: f32 = std::f32::consts::LN_2;
const SQRT1_2: f32 = std::f32::consts::FRAC_1_SQRT_2;
// The constants below keep numpy's own spelling (npy_math's loops), longer than an f32 holds.
/// Cody-Waite split of -ln 2.
#[allow(clippy::excessive_precision)]
const CODY_WAITE_HIGH: f32 = -6.931_457_52e-1;
#[allow(clippy::excessive_precision)]
const CODY_WAITE_LOW: f32 = -1.428_606_77e-6;
/// Adding and subtracting 1.5 * 2^23 rounds a float to the nearest integer (ties to even).
const RINT_MAGIC: f32 = 12_582_912.0;
#[allow(clippy::excessive_precision)]
const EXP_XMAX: f32 = 88.722_839_355_468_75;
#[allow(clippy::excessive_precision)]
const EXP_XMIN: f32 = -103.972_084_045_410_156_25;

#[allow(clippy::excessive_precision)]
const EXP_P: [f32; 6] = [
    9.999999999980870924916e-01,
    7.257664613233124478488e-01,
    2.473615434895520810817e-01,
    5.114512081637298353406e-02,
    6.757896990527504603057e-03,
    5.082762527590693718096e-04,
];
#[allow(clippy::excessive_precision)]
const EXP_Q: [f32; 3] = [1.0, -2.742335390411667452936e-01, 2.159509375685829852307e-02];

#[allow(clippy::excessive_precision)]
const LOG_P: [f32; 6] = [
    0.0,
    9.999999999999998702752e-01,
    2.112677543073053063722e+00,
    1.480000633576506585156e+00,
    3.808837741388407920751e-01,
    2.589979117907922693523e-02,
];
#[allow(clippy::excessive_precision)]
const LOG_Q: [f32; 6] = [
    1.0,
    2.612677543073109236779e+00,
    2.453006071784736363091e+00,
    9.864942958519418960339e-01,
    1.546476374983906719538e-01,
    5.875095403124574342950e-03,
];

/// `poly * 2^quadrant` by exponent arithmetic, with numpy's split for results that go subnormal.
fn scale_by_power_of_two(poly: f32, quadrant: f32) -> f32 {
    const MIN_QUADRANT: f32 = -125.0;
    if quadrant <= MIN_QUADRANT {
        let diff = -(quadrant - MIN_QUADRANT);
        let two_power_diff = 1u32.checked_shl(diff.round_ties_even() as u32).unwrap_or(0) as f32;
        let exponent = (MIN_QUADRANT as i32) << 23;
        let scaled = f32::from_bits((poly.to_bits() as i32).wrapping_add(exponent) as u32);
        scaled / two_power_diff
    } else {
        let exponent = (quadrant.round_ties_even() as i32) << 23;
        f32::from_bits((poly.to_bits() as i32).wrapping_add(exponent) as u32)
    }
}

/// `np.exp` on one `float32`.
pub fn exp(x_in: f32) -> f32 {
    if x_in.is_nan() {
        return f32::NAN;
    }
    if x_in >= EXP_XMAX {
        return f32::INFINITY;
    }
    if x_in <= EXP_XMIN {
        return 0.0;
    }
    let x = x_in;
    let quadrant = (x * LOG2E + RINT_MAGIC) - RINT_MAGIC;
    let mut r = quadrant.mul_add(CODY_WAITE_HIGH, x);
    r = quadrant.mul_add(CODY_WAITE_LOW, r);
    r = quadrant.mul_add(0.0, r);
    let mut num = EXP_P[5].mul_add(r, EXP_P[4]);
    num = num.mul_add(r, EXP_P[3]);
    num = num.mul_add(r, EXP_P[2]);
    num = num.mul_add(r, EXP_P[1]);
    num = num.mul_add(r, EXP_P[0]);
    let mut den = EXP_Q[2].mul_add(r, EXP_Q[1]);
    den = den.mul_add(r, EXP_Q[0]);
    scale_by_power_of_two(num / den, quadrant)
}

/// `np.log` on one `float32`.
pub fn log(x_in: f32) -> f32 {
    if x_in.is_nan() {
        return f32::NAN;
    }
    if x_in < 0.0 {
        return -f32::NAN;
    }
    if x_in == 0.0 {
        return f32::NEG_INFINITY;
    }
    if x_in == f32::INFINITY {
        return f32::INFINITY;
    }
    // Exponent and mantissa in [0.5, 1); subnormals are scaled by 2^100 first.
    let (bits, bias) = if x_in < f32::MIN_POSITIVE {
        ((x_in * f32::from_bits(0x7180_0000)).to_bits(), 100.0)
    } else {
        (x_in.to_bits(), 0.0)
    };
    let mut exponent = ((bits >> 23) as i32 - 0x7E) as f32 - bias;
    let mut x = f32::from_bits((bits & 0x007F_FFFF) | (126 << 23));
    if x <= SQRT1_2 {
        x = x + x;
        exponent -= 1.0;
    }
    x -= 1.0;
    let mut num = LOG_P[5].mul_add(x, LOG_P[4]);
    num = num.mul_add(x, LOG_P[3]);
    num = num.mul_add(x, LOG_P[2]);
    num = num.mul_add(x, LOG_P[1]);
    num = num.mul_add(x, LOG_P[0]);
    let mut den = LOG_Q[5].mul_add(x, LOG_Q[4]);
    den = den.mul_add(x, LOG_Q[3]);
    den = den.mul_add(x, LOG_Q[2]);
    den = den.mul_add(x, LOG_Q[1]);
    den = den.mul_add(x, LOG_Q[0]);
    exponent.mul_add(LN2, num / den)
}

/// Float types numpy sums pairwise.
pub trait Summand: Copy + std::ops::Add<Output = Self> + std::ops::AddAssign {
    const ZERO: Self;
}

impl Summand for f32 {
    const ZERO: f32 = 0.0;
}

impl Summand for f64 {
    const ZERO: f64 = 0.0;
}

/// numpy's pairwise summation (`@TYPE@_pairwise_sum`): sequential below 8 items, eight
/// interleaved accumulators up to 128, halves (on a multiple of 8) above.
fn pairwise<T: Summand>(a: &[T]) -> T {
    let n = a.len();
    if n < 8 {
        let mut res = T::ZERO;
        for &v in a {
            res += v;
        }
        res
    } else if n <= 128 {
        let mut r = [a[0], a[1], a[2], a[3], a[4], a[5], a[6], a[7]];
        let whole = n - n % 8;
        let mut i = 8;
        while i < whole {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &v in &a[whole..] {
            res += v;
        }
        res
    } else {
        let mut half = n / 2;
        half -= half % 8;
        pairwise(&a[..half]) + pairwise(&a[half..])
    }
}

/// `arr.sum()` of a contiguous 1-D array: the identity plus the pairwise sum.
pub fn sum<T: Summand>(a: &[T]) -> T {
    T::ZERO + pairwise(a)
}

/// `arr.max()` (NaN propagates, as in numpy).
pub fn max(a: &[f32]) -> f32 {
    let mut m = f32::NEG_INFINITY;
    for &v in a {
        if v.is_nan() {
            return f32::NAN;
        }
        if v > m {
            m = v;
        }
    }
    m
}

/// `arr.argmax()`: the first maximum (the first NaN if there is one).
pub fn argmax(a: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in a.iter().enumerate() {
        if v.is_nan() {
            return i;
        }
        if v > a[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_and_log_are_close_to_the_true_functions() {
        // Above -87 the result is a normal float; below, numpy keeps only subnormal precision.
        for i in -1740..200 {
            let x = i as f32 * 0.05;
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            assert!((got - want).abs() <= want * 3e-7, "exp({x}) = {got}, want {want}");
        }
        for i in 1..4000 {
            let x = i as f32 * 0.013;
            let want = (x as f64).ln();
            let got = log(x) as f64;
            assert!((got - want).abs() <= 1e-6 + want.abs() * 4e-7, "log({x}) = {got}, want {want}");
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-200.0), 0.0);
        assert_eq!(exp(100.0), f32::INFINITY);
        assert_eq!(log(0.0), f32::NEG_INFINITY);
        assert!(log(-1.0).is_nan());
    }

    #[test]
    fn pairwise_sum_uses_eight_accumulators_from_eight_items() {
        // With eight accumulators the tiny terms are added to each other before meeting 1e8.
        let mut a = vec![1.0e8f32];
        a.extend(std::iter::repeat_n(3.0f32, 15));
        let sequential = a.iter().fold(0.0f32, |s, v| s + v);
        assert_ne!(sum(&a), sequential);
        assert_eq!(sum(&a[..5]), a[..5].iter().fold(0.0f32, |s, v| s + v));
    }
}
