//! The value-by-value comparison both golden checks share (the case's tolerance in
//! `golden::compare`, the half-precision rule in `golden::half`).

/// What comparing a result with its reference value by value found.
pub(crate) struct ValueCheck {
    /// The largest |got − want| over the finite expected values; NaN when a non-finite value
    /// was given where a number was expected, or an expected non-finite value was missed.
    pub max_abs_err: f64,
    /// Whether every value was within its tolerance and every expected non-finite value met
    /// (and the lengths agree).
    pub passed: bool,
    /// Whether a NaN or infinity came where a number was expected.
    pub non_finite: bool,
}

/// `got` against `want` value by value, the rule both golden checks share: a finite expected
/// value `w` is met within `tolerance(w)`, an expected NaN (`null` in a case) by a NaN only and
/// an expected ±∞ by itself; a NaN or infinity where a number is expected fails.
pub(crate) fn compare_values(
    got: &[f64],
    want: &[f64],
    tolerance: impl Fn(f64) -> f64,
) -> ValueCheck {
    let mut max_abs_err = 0.0f64;
    let mut passed = got.len() == want.len();
    let mut non_finite = false;
    let mut missed = false;
    for (&g, &w) in got.iter().zip(want) {
        if !w.is_finite() {
            if !(g == w || (g.is_nan() && w.is_nan())) {
                missed = true;
                passed = false;
            }
            continue;
        }
        if !g.is_finite() {
            non_finite = true;
            passed = false;
            continue;
        }
        let e = (g - w).abs();
        max_abs_err = max_abs_err.max(e);
        passed &= e <= tolerance(w);
    }
    ValueCheck {
        max_abs_err: if non_finite || missed {
            f64::NAN
        } else {
            max_abs_err
        },
        passed,
        non_finite,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_outside_its_tolerance_fails() {
        let found = compare_values(&[1.0, 2.5], &[1.0, 2.0], |_| 0.1);
        assert!(!found.passed);
        assert_eq!(found.max_abs_err, 0.5);
        assert!(compare_values(&[1.05, 2.0], &[1.0, 2.0], |_| 0.1).passed);
        // The tolerance may depend on the expected value.
        assert!(compare_values(&[110.0], &[100.0], |w| 0.2 * w).passed);
    }

    #[test]
    fn expected_non_finite_values_are_met_exactly() {
        let (nan, inf) = (f64::NAN, f64::INFINITY);
        assert!(compare_values(&[nan, inf, -inf], &[nan, inf, -inf], |_| 1.0).passed);
        for (got, want) in [
            (0.0, nan),
            (inf, nan),
            (nan, inf),
            (-inf, inf),
            (1e300, inf),
        ] {
            let found = compare_values(&[got], &[want], |_| 1.0);
            assert!(!found.passed, "{got} for {want}");
            assert!(found.max_abs_err.is_nan());
            assert!(!found.non_finite);
        }
    }

    #[test]
    fn a_non_finite_value_for_a_number_fails() {
        for got in [f64::NAN, f64::INFINITY] {
            let found = compare_values(&[got], &[1.0], |_| f64::MAX);
            assert!(!found.passed && found.non_finite && found.max_abs_err.is_nan());
        }
    }

    #[test]
    fn lengths_that_differ_fail() {
        assert!(!compare_values(&[1.0], &[1.0, 2.0], |_| 1.0).passed);
        assert!(!compare_values(&[1.0, 2.0], &[1.0], |_| 1.0).passed);
    }
}
