//! `f64` fields in JSON that round-trip when they are not finite.
//!
//! JSON has no NaN or infinity; `serde_json` writes them as `null` and then refuses `null` for an
//! `f64`, so a diverged run's summary or checkpoint would not load again. With
//! `#[serde(with = "crate::json_float")]` a finite value is written as a number and NaN, +∞ and
//! −∞ as the strings `"NaN"`, `"inf"` and `"-inf"`; reading accepts those, numbers, and `null`
//! (as NaN, for files written before).

use serde::{Deserialize, Deserializer, Serializer};

/// A number, one of the non-finite spellings, or null.
#[derive(Deserialize)]
#[serde(untagged)]
enum Repr {
    Number(f64),
    Text(String),
    Null(()),
}

/// Writes `x` as a number when finite, else as `"NaN"`, `"inf"` or `"-inf"`.
pub fn serialize<S: Serializer>(x: &f64, serializer: S) -> Result<S::Ok, S::Error> {
    if x.is_finite() {
        serializer.serialize_f64(*x)
    } else if x.is_nan() {
        serializer.serialize_str("NaN")
    } else if *x > 0.0 {
        serializer.serialize_str("inf")
    } else {
        serializer.serialize_str("-inf")
    }
}

/// Reads what [`serialize`] writes (and `null` as NaN).
pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    match Repr::deserialize(deserializer)? {
        Repr::Number(x) => Ok(x),
        Repr::Null(()) => Ok(f64::NAN),
        Repr::Text(s) => match s.as_str() {
            "NaN" => Ok(f64::NAN),
            "inf" => Ok(f64::INFINITY),
            "-inf" => Ok(f64::NEG_INFINITY),
            other => Err(serde::de::Error::custom(format!(
                "expected a number, \"NaN\", \"inf\" or \"-inf\", got \"{other}\""
            ))),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};

    #[derive(Debug, Serialize, Deserialize)]
    struct Holder {
        #[serde(with = "crate::json_float")]
        x: f64,
    }

    #[test]
    fn non_finite_values_round_trip() {
        for x in [
            1.5,
            0.0,
            -2.0e300,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ] {
            let text = serde_json::to_string(&Holder { x }).unwrap();
            let back: Holder = serde_json::from_str(&text).unwrap();
            assert!(
                back.x == x || (x.is_nan() && back.x.is_nan()),
                "{x} -> {text}"
            );
        }
        let old: Holder = serde_json::from_str(r#"{"x": null}"#).unwrap();
        assert!(old.x.is_nan());
        assert!(serde_json::from_str::<Holder>(r#"{"x": "huge"}"#).is_err());
    }
}
