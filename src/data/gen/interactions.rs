//! `oar gen interactions`: Criteo-format lines from a planted model whose click depends on
//! pairs of fields, the effect that factorization machines, field-aware FMs and xDeepFM's
//! compressed interaction network are built to learn and a DNN over concatenated embeddings
//! learns slowly. Built like [`crate::data::gen`]: every draw a pure function of (seed, stream, line),
//! parts in parallel, the planted model's test AUC in `meta.json`.
//!
//! A line has 13 empty integer fields and 26 categorical ones:
//! - every field's value is a Zipf(1.1) rank over 300 values, written as 8 hex digits (the
//!   field's number, then the rank);
//! - each value has a first-order weight, normal with standard deviation 0.3;
//! - `logit = -1 + sum of first-order weights + sum over the 66 pairs (i, j) of the first 12
//!   fields of a dot product of two planted vectors of 4 normals of standard deviation 0.4`:
//!   - `--effect pairs` (a factorization machine's model): each value of those fields has one
//!     vector, `<v_i(x_i), v_j(x_j)>`;
//!   - `--effect field-pairs` (a field-aware FM's): each value has one vector per partner
//!     field, `<v_ij(x_i), v_ji(x_j)>`, 11 x 4 numbers per value: more than an FM of dimension
//!     10 can hold.
//!
//! Either way the pairs' part of the logit has a standard deviation of about 2.6, the
//! first-order part about 1.5.

use std::io::Write;

use crate::base::layout::mix64;
use crate::data::format::criteo::{DENSE, SLOTS};
use crate::data::gen::{sigmoid, write_parts, zipf, Draws, GenConfig, PlantedReport};

/// Values per field.
pub const VOCAB: u32 = 300;
/// Fields whose values interact in pairs (the first ones).
pub const INTERACTING: usize = 12;
/// Length of the planted vectors.
pub const RANK: usize = 4;
/// Standard deviation of each planted vector component.
pub const VECTOR_STD: f64 = 0.4;
/// Standard deviation of each value's first-order weight.
pub const WEIGHT_STD: f64 = 0.3;
/// Bias of the logit.
pub const BIAS: f64 = -1.0;

/// Which planted interaction `oar gen interactions` writes (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Effect {
    /// One vector per value: a factorization machine's model.
    #[default]
    Pairs,
    /// One vector per value and partner field: a field-aware factorization machine's model.
    FieldPairs,
}

/// The planted first-order weight of value `value` of field `field`.
fn weight(seed: u64, field: usize, value: u32) -> f64 {
    let d = Draws { base: mix64(seed ^ 0x1a7e ^ mix64((field as u64) << 32 | value as u64)) };
    WEIGHT_STD * d.normal(0)
}

/// The planted vector of value `value` of field `field` for partner field `partner` (`None`:
/// the one vector of the `pairs` effect).
fn vector(seed: u64, field: usize, partner: Option<usize>, value: u32) -> [f64; RANK] {
    let key = (field as u64) << 40 | (partner.map_or(0, |p| p as u64 + 1)) << 32 | value as u64;
    let d = Draws { base: mix64(seed ^ 0x1a7e ^ mix64(key)) };
    let mut v = [0.0; RANK];
    for (k, x) in v.iter_mut().enumerate() {
        *x = VECTOR_STD * d.normal(1 + k as u64);
    }
    v
}

/// Line `line` of `stream` under `effect`: the 26 values and the planted logit.
fn sample(seed: u64, stream: u64, line: u64, effect: Effect) -> ([u32; SLOTS], f64) {
    let d = Draws::new(seed ^ 0x1a7e, stream, line);
    let mut values = [0; SLOTS];
    let mut logit = BIAS;
    for (s, value) in values.iter_mut().enumerate() {
        *value = zipf(d.uniform(s as u64), VOCAB, 1.1);
        logit += weight(seed, s, *value);
    }
    // The pairs effect's vectors are drawn once per field, not once per pair they enter.
    let own: Option<[[f64; RANK]; INTERACTING]> =
        (effect == Effect::Pairs).then(|| std::array::from_fn(|i| vector(seed, i, None, values[i])));
    let v = |i: usize, partner: usize| match &own {
        Some(own) => own[i],
        None => vector(seed, i, Some(partner), values[i]),
    };
    for i in 0..INTERACTING {
        for j in i + 1..INTERACTING {
            let (a, b) = (v(i, j), v(j, i));
            logit += a.iter().zip(&b).map(|(a, b)| a * b).sum::<f64>();
        }
    }
    (values, logit)
}

/// Writes line `line` of `stream` under `effect` into `out`; returns (label, planted
/// probability).
fn write(effect: Effect, seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    let (values, logit) = sample(seed, stream, line, effect);
    let p = sigmoid(logit);
    let label = (Draws::new(seed ^ 0x1a7e, stream, line).uniform(999) < p) as u8;
    let w = |r: std::io::Result<()>| r.expect("writing to a Vec cannot fail");
    w(write!(out, "{label}"));
    out.extend_from_slice(&[b'\t'; DENSE]);
    for (s, value) in values.iter().enumerate() {
        w(write!(out, "\t{s:02x}{value:06x}"));
    }
    out.push(b'\n');
    (label as f32, p)
}

/// Generates the data set described by `config` with the planted `effect`.
pub fn generate(config: &GenConfig, effect: Effect) -> anyhow::Result<PlantedReport> {
    let report = write_parts(config, &|seed, stream, line, out| write(effect, seed, stream, line, out))?;
    let planted = serde_json::json!({
        "effect": format!("{effect:?}"),
        "vocab": VOCAB,
        "zipf_exponent": 1.1,
        "interacting_fields": INTERACTING,
        "rank": RANK,
        "vector_std": VECTOR_STD,
        "weight_std": WEIGHT_STD,
        "bias": BIAS,
        "format": "criteo (13 empty integer fields, 26 categorical)",
    });
    PlantedReport { report, planted }.save(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_reproducible_criteo_with_the_planted_pairs_in_their_logit() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for line in 0..300 {
            write(Effect::Pairs, 5, 1, line, &mut a);
            write(Effect::Pairs, 5, 1, line, &mut b);
        }
        assert_eq!(a, b);
        let mut batch = crate::data::Batch::new(1, DENSE, SLOTS);
        for line in a.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            crate::data::format::criteo::parse_line(line, &mut batch).unwrap();
        }
        assert_eq!(batch.len(), 300);
        let (labels, probs): (Vec<f32>, Vec<f32>) =
            (0..300).map(|line| write(Effect::Pairs, 5, 1, line, &mut Vec::new())).map(|(y, p)| (y, p as f32)).unzip();
        assert!(crate::observe::metrics::auc(&probs, &labels).unwrap() > 0.8);
    }

    #[test]
    fn the_logit_is_the_first_order_weights_plus_the_planted_dot_products() {
        for effect in [Effect::Pairs, Effect::FieldPairs] {
            let (values, logit) = sample(5, 1, 7, effect);
            assert!(values.iter().all(|&x| x < VOCAB));
            let first: f64 = (0..SLOTS).map(|s| weight(5, s, values[s])).sum();
            // By hand: the partner's field number picks the field-aware vector.
            let v = |s: usize, partner: usize| match effect {
                Effect::Pairs => vector(5, s, None, values[s]),
                Effect::FieldPairs => vector(5, s, Some(partner), values[s]),
            };
            let mut pairs = 0.0;
            for i in 0..INTERACTING {
                for j in i + 1..INTERACTING {
                    pairs += (0..RANK).map(|k| v(i, j)[k] * v(j, i)[k]).sum::<f64>();
                }
            }
            assert!((logit - (BIAS + first + pairs)).abs() < 1e-12, "{effect:?}");
        }
        // Field-aware vectors differ by partner; the pairs effect's do not depend on one.
        assert_ne!(vector(5, 0, Some(1), 3), vector(5, 0, Some(2), 3));
        assert_ne!(vector(5, 0, None, 3), vector(5, 0, Some(1), 3));
    }
}
