//! How a parameter's initial values are drawn ([`Init`]: zeros, uniform, normal or a constant):
//! a pure function of a counter (the seed and the value's position or row id), so every server
//! count draws the same model and a row starts the same on any server. A normal draw is a
//! Box-Muller transform of the counter's hash's two halves.

use serde::{Deserialize, Serialize};

use crate::base::layout::mix64;

/// How initial values are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum Init {
    /// All zeros.
    Zeros,
    /// Uniform in `[-scale, scale]`.
    Uniform {
        /// Half-width of the interval.
        scale: f32,
    },
    /// Normal with mean 0 and standard deviation `std` (FuxiCTR's embeddings, N(0, 1e-4), and
    /// Glorot-normal weights; Paddle's `gaussian_random`).
    Normal {
        /// Standard deviation.
        std: f32,
    },
    /// Every value `value` (a normalization's gain starts at 1).
    Constant {
        /// The value.
        value: f32,
    },
}

impl Init {
    /// Checks the initializer's number: finite (an `embedding_init` of 1e300 is an infinite
    /// f32, and every row would start infinite), a uniform scale 0 or more.
    pub fn check(&self) -> Result<(), String> {
        match *self {
            Init::Zeros => Ok(()),
            Init::Uniform { scale } if scale.is_finite() && scale >= 0.0 => Ok(()),
            Init::Uniform { scale } => {
                Err(format!("a uniform initializer's scale is {scale}: it must be finite, 0 or more"))
            }
            // A draw reaches 6.8 standard deviations: 7 of them must be a finite f32.
            Init::Normal { std } if std >= 0.0 && (std as f64 * 7.0) <= f32::MAX as f64 => Ok(()),
            Init::Normal { std } => {
                Err(format!("a normal initializer's std is {std:e}: it must be 0 or more, and 7 of it a finite number"))
            }
            Init::Constant { value } if value.is_finite() => Ok(()),
            Init::Constant { value } => Err(format!("a constant initializer's value is {value}: it must be finite")),
        }
    }

    /// The initial value at counter `key`, a pure function of its inputs.
    #[inline]
    pub fn value(&self, key: u64) -> f32 {
        match *self {
            Init::Zeros => 0.0,
            Init::Constant { value } => value,
            Init::Uniform { scale } => {
                // 24 random bits give a uniform f32 in [0, 1) exactly.
                let u = (mix64(key) >> 40) as f32 / (1u64 << 24) as f32;
                scale * (2.0 * u - 1.0)
            }
            Init::Normal { std } => {
                // Box-Muller on the key's two 32-bit halves; the first is kept off 0 (ln 0),
                // so a draw is at most 6.8 standard deviations out.
                let bits = mix64(key);
                let u1 = ((bits >> 32) as f64 + 0.5) / 4_294_967_296.0;
                let u2 = (bits & 0xffff_ffff) as f64 / 4_294_967_296.0;
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                (std as f64 * z) as f32
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_normal_draw_has_its_std_and_is_a_function_of_the_key() {
        let init = Init::Normal { std: 0.5 };
        let draws: Vec<f64> = (0..200_000u64).map(|k| init.value(k) as f64).collect();
        let n = draws.len() as f64;
        let mean = draws.iter().sum::<f64>() / n;
        let sd = (draws.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        assert!(mean.abs() < 0.005 && (sd - 0.5).abs() < 0.005, "mean {mean} sd {sd}");
        // About 4.55% of a normal lies beyond 2 standard deviations.
        let tails = draws.iter().filter(|v| v.abs() > 1.0).count() as f64 / n;
        assert!((tails - 0.0455).abs() < 0.003, "{tails}");
        assert!(draws.iter().all(|v| v.abs() < 0.5 * 6.8));
        assert_eq!(init.value(12345), init.value(12345));
        assert_eq!(Init::Normal { std: 0.0 }.value(7), 0.0);
    }

    #[test]
    fn initializers_with_a_number_that_is_not_finite_or_negative_are_refused() {
        assert!(Init::Normal { std: 1e-4 }.check().is_ok());
        assert!(Init::Normal { std: -1.0 }.check().is_err());
        assert!(Init::Normal { std: f32::NAN }.check().is_err());
        // Finite, but a draw 6.8 of it out would be infinite.
        assert!(Init::Normal { std: 1e38 }.check().is_err());
        assert!(Init::Normal { std: 4.8e37 }.check().is_ok());
        assert!(Init::Normal { std: 4.8e37 }.value(u64::MAX).is_finite());
        assert!(Init::Uniform { scale: f32::INFINITY }.check().is_err());
        assert!(Init::Constant { value: f32::NAN }.check().is_err());
    }
}
