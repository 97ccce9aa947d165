//! Python's float formatting and rounding, digit for digit.
//!
//! laya serialises states with `json.dumps`, which writes floats with `repr()`: the shortest
//! digits that round-trip, in fixed notation when the decimal point lands within 16 digits and
//! as `1e-07` / `1e+20` otherwise, always with a `.0` on integral values. Its answers go through
//! `round(x, 4)`, which rounds the exact binary value half-to-even. Both are reproduced here so
//! that a prompt and a reply compare equal to laya's byte for byte.

/// `repr(x)` for a Python float (also what `json.dumps` writes, with `allow_nan` spellings for
/// the non-finite values: `NaN`, `Infinity`, `-Infinity`).
pub fn json_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    repr(x)
}

/// `repr(x)` for a finite Python float (`nan`, `inf`, `-inf` for the others).
pub fn repr(x: f64) -> String {
    if x.is_nan() {
        return "nan".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "inf" } else { "-inf" }.to_owned();
    }
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if x == 0.0 {
        return format!("{sign}0.0");
    }
    // `{:e}` without a precision prints the shortest digits that round-trip, like Python's repr.
    let (digits, exp) = shortest_digits(x.abs());
    let n = digits.len() as i32;
    // Python's decpt: the value is 0.DIGITS x 10^decpt.
    let decpt = exp + 1;
    let body = if decpt <= -4 || decpt > 16 {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let e = decpt - 1;
        let esign = if e < 0 { '-' } else { '+' };
        format!("{first}{frac}e{esign}{:02}", e.abs())
    } else if decpt <= 0 {
        format!("0.{}{digits}", "0".repeat((-decpt) as usize))
    } else if decpt >= n {
        format!("{digits}{}.0", "0".repeat((decpt - n) as usize))
    } else {
        let (int, frac) = digits.split_at(decpt as usize);
        format!("{int}.{frac}")
    };
    format!("{sign}{body}")
}

/// Significant digits and decimal exponent (`d.ddd x 10^exp`) of a positive finite `x`, chosen
/// as Python's `repr` chooses them: the fewest digits that read back as `x`, and among those the
/// nearest to `x`, an exact tie going to the even digit.
fn shortest_digits(x: f64) -> (String, i32) {
    // `{:e}` prints the shortest round-tripping digits, but may break a tie between two equally
    // near candidates the other way. Ties need more precision than a double has below 16 digits.
    let (digits, exp) = split_sci(&format!("{x:e}"));
    if digits.len() < 16 {
        return (digits, exp);
    }
    // Round the exact binary value (at most 767 significant digits) half-to-even instead.
    let (exact, exact_exp) = split_sci(&format!("{x:.800e}"));
    let n = digits.len();
    let exact = format!("{exact:0<width$}", width = n + 1);
    let (keep, rest) = exact.split_at(n);
    let mut d: Vec<u8> = keep.bytes().map(|b| b - b'0').collect();
    let first = rest.as_bytes()[0] - b'0';
    let beyond = rest.bytes().skip(1).any(|b| b != b'0');
    let mut e = exact_exp;
    if first > 5 || (first == 5 && (beyond || d[n - 1] % 2 == 1)) {
        let mut i = n;
        loop {
            if i == 0 {
                d.insert(0, 1);
                d.pop();
                e += 1;
                break;
            }
            i -= 1;
            if d[i] == 9 {
                d[i] = 0;
            } else {
                d[i] += 1;
                break;
            }
        }
    }
    let nearest: String = d.iter().map(|v| char::from(b'0' + v)).collect();
    let candidate = format!("{}.{}e{e}", &nearest[..1], &nearest[1..]);
    if candidate.parse::<f64>().ok() == Some(x) { (nearest.trim_end_matches('0').to_owned(), e) } else { (digits, exp) }
}

/// `"d.ddde-7"` into (`"dddd"` without trailing zeros, `-7`).
fn split_sci(sci: &str) -> (String, i32) {
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci, "0"));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let digits = digits.trim_end_matches('0');
    let digits = if digits.is_empty() { "0".to_owned() } else { digits.to_owned() };
    (digits, exp.parse().unwrap_or(0))
}

/// Python's `round(x, ndigits)` for a float: the exact binary value rounded half-to-even to
/// `ndigits` decimals, converted back to the nearest float.
pub fn round(x: f64, ndigits: usize) -> f64 {
    if !x.is_finite() || x == 0.0 {
        return x;
    }
    round_on_integers(x, ndigits).unwrap_or_else(|| round_on_digits(x, ndigits))
}

/// [`round`] on the binary value's own integers: `|x| = m x 2^e`, so `|x| x 10^n` is
/// `m x 10^n / 2^-e`, whose quotient and remainder say which way to go and whether it is a tie.
/// `None` where they do not fit in 128 bits (`|x|` below ~1e-23, or `ndigits` past 21); every
/// probability and score an answer rounds fits. Beside a flood the decimal expansion
/// ([`round_on_digits`], ~50 digits through the formatter's exact mode) was 3-4% of the service
/// thread (BENCHMARKS.md).
fn round_on_integers(x: f64, ndigits: usize) -> Option<f64> {
    let bits = x.abs().to_bits();
    let (biased, fraction) = ((bits >> 52) & 0x7ff, bits & ((1 << 52) - 1));
    let (m, e) = if biased == 0 { (fraction, -1074) } else { (fraction | 1 << 52, biased as i32 - 1075) };
    if e >= 0 {
        return Some(x); // an integer: no digit after the point to round
    }
    let shift = e.unsigned_abs();
    if shift >= 127 {
        return None;
    }
    let scaled = u128::from(m).checked_mul(10u128.checked_pow(u32::try_from(ndigits).ok()?)?)?;
    let (quotient, remainder, half) = (scaled >> shift, scaled & ((1 << shift) - 1), 1u128 << (shift - 1));
    let up = remainder > half || (remainder == half && quotient % 2 == 1);
    let digits = quotient + u128::from(up);
    // The nearest float to digits x 10^-n: one correctly rounded division where both are exact
    // floats (as a decimal parser's fast path does), else the parser itself.
    let magnitude = if digits <= 1 << 53 && ndigits <= 22 {
        digits as f64 / 10f64.powi(ndigits as i32)
    } else {
        format!("{digits}e-{ndigits}").parse().ok()?
    };
    Some(if x < 0.0 { -magnitude } else { magnitude })
}

/// [`round`] on the decimal expansion: the general case.
fn round_on_digits(x: f64, ndigits: usize) -> f64 {
    // Exact decimal expansion far enough to see past the rounding digit. A tie can only occur
    // when the expansion terminates right after it, which a long expansion shows exactly.
    let exact = format!("{:.*}", ndigits + 40, x.abs());
    let (int_part, frac_part) = exact.split_once('.').unwrap_or((&exact, ""));
    let (keep, rest) = frac_part.split_at(ndigits.min(frac_part.len()));
    let mut digits: Vec<u8> = int_part.bytes().chain(keep.bytes()).map(|b| b - b'0').collect();
    let first_rest = rest.as_bytes().first().map_or(0, |b| b - b'0');
    let beyond_nonzero = rest.bytes().skip(1).any(|b| b != b'0');
    let last_odd = digits.last().is_some_and(|d| d % 2 == 1);
    let round_up = first_rest > 5 || (first_rest == 5 && (beyond_nonzero || last_odd));
    if round_up {
        let mut i = digits.len();
        loop {
            if i == 0 {
                digits.insert(0, 1);
                break;
            }
            i -= 1;
            if digits[i] == 9 {
                digits[i] = 0;
            } else {
                digits[i] += 1;
                break;
            }
        }
    }
    let split = digits.len() - keep.len();
    let text: String = digits.iter().map(|d| char::from(b'0' + d)).collect();
    let (i, f) = text.split_at(split);
    let magnitude: f64 = format!("{i}.{f}0").parse().unwrap_or(x.abs());
    if x < 0.0 { -magnitude } else { magnitude }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::excessive_precision)] // the exact tie, spelled out
    fn repr_matches_python_for_the_documented_forms() {
        let cases = [
            (1e-7, "1e-07"),
            (1e20, "1e+20"),
            (100.0, "100.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1.0 / 3.0, "0.3333333333333333"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (5e-324, "5e-324"),
            (f64::MAX, "1.7976931348623157e+308"),
            (1.5e-5, "1.5e-05"),
            (-2.5, "-2.5"),
            // An exact tie at 17 digits goes to the even digit, as in Python.
            (-1185280097986668.25, "-1185280097986668.2"),
        ];
        for (x, want) in cases {
            assert_eq!(repr(x), want, "repr({x:e})");
        }
        assert_eq!(json_repr(f64::NAN), "NaN");
        assert_eq!(json_repr(f64::NEG_INFINITY), "-Infinity");
    }

    #[test]
    fn round_is_half_even_on_the_exact_binary_value() {
        assert_eq!(round(2.5, 0), 2.0);
        assert_eq!(round(0.125, 2), 0.12);
        assert_eq!(round(0.375, 2), 0.38);
        // 0.12345 is stored as 0.123450000000000004174..., so it rounds up.
        assert_eq!(round(0.12345, 4), 0.1235);
        assert_eq!(round(0.99995, 4), 1.0); // stored just above the tie
        assert_eq!(round(9.99996, 4), 10.0);
        assert_eq!(round(-0.00001, 4), -0.0);
        assert!(round(-0.00001, 4).is_sign_negative());
    }

    #[test]
    fn rounding_on_the_binary_integers_gives_what_the_decimal_expansion_gives() {
        // Random bit patterns, random values in (0, 1) and around 1, and exact ties (multiples of
        // small powers of two), at 0 to 8 decimals, against the expansion path.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let (mut checked, mut fast) = (0, 0);
        for i in 0..60_000 {
            let r = next();
            let x = match i % 4 {
                0 => f64::from_bits(r),
                1 => (r >> 11) as f64 / (1u64 << 53) as f64,
                2 => 1.0 + ((r >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 1e-3,
                _ => (r % 4096) as f64 / f64::from(1u32 << (r >> 60)) - 100.0,
            };
            if !x.is_finite() || x == 0.0 {
                continue;
            }
            for n in 0..=8 {
                let (on_integers, on_digits) = (round_on_integers(x, n), round_on_digits(x, n));
                if let Some(v) = on_integers {
                    assert_eq!(v.to_bits(), on_digits.to_bits(), "round({x:e}, {n})");
                    fast += 1;
                }
                checked += 1;
            }
        }
        assert!(fast * 10 > checked * 7, "the integer path answered {fast} of {checked}");
        assert_eq!(round_on_integers(1e-30, 4), None);
    }
}
