//! Dice, DIN's data-adaptive activation (Zhou et al. 2018), for `target_attention`'s hidden
//! units: `a = z * (alpha + (1 - alpha) * p)`, `p = sigmoid((z - mean) / sqrt(var + eps))`,
//! with the batch's mean and variance per unit in training and the servers' running statistics
//! otherwise (kept as `batch_norm` keeps them: count, sum and square sum under the summary
//! rule). As FuxiCTR's `Dice`: `alpha` starts at 0, `eps = 1e-9`, the statistics follow the
//! batches with PyTorch's momentum 0.01 (decay 0.99); the batch is every position of every
//! sample (padding included), as the attention MLP sees them.

use super::batch_norm::{kept, normalize_batch, normalize_batch_backward, push_sums, stats_params};
use crate::table::{DenseParam, Init};

/// Added to the variance (FuxiCTR's Dice).
const EPS: f32 = 1e-9;
/// The running statistics' decay per update (PyTorch's momentum 0.01).
const DECAY: f32 = 0.99;

/// A Dice activation's parameters for `w` units: `alpha`, then its statistics.
pub(super) fn params(prefix: &str, w: usize) -> Vec<DenseParam> {
    let mut p = vec![DenseParam::new(format!("{prefix}.alpha"), w, Init::Zeros)];
    p.extend(stats_params(w, 1.0, DECAY).into_iter().map(|q| DenseParam { name: format!("{prefix}.{}", q.name), ..q }));
    p
}

/// Floats of a layer's parameters for `w` units.
pub(super) fn params_len(w: usize) -> usize {
    4 * w
}

/// Scratch floats per position for `w` units (the normalized values; the first position's
/// also hold each unit's batch `1 / std`).
pub(super) fn scratch_len(w: usize) -> usize {
    2 * w
}

/// `p` for unit `k` given its normalized value.
fn gate(h: f32) -> f32 {
    1.0 / (1.0 + (-h).exp())
}

/// Computes `a` from the pre-activations `z` (`n` rows of `w`); `p` holds alpha and the
/// statistics, `scratch` [`scratch_len`] floats per row.
pub(super) fn forward(train: bool, p: &[f32], z: &[f32], n: usize, w: usize, a: &mut [f32], scratch: &mut [f32]) {
    let (alpha, stats) = p[..params_len(w)].split_at(w);
    let (normed, inv) = scratch[..2 * n * w].split_at_mut(n * w);
    if train {
        normalize_batch(z, n, w, EPS, normed, &mut inv[..w]);
    } else {
        for k in 0..w {
            let (mean, var) = kept(stats, w, k);
            let i = 1.0 / (var + EPS).sqrt();
            for r in 0..n {
                normed[r * w + k] = (z[r * w + k] - mean) * i;
            }
        }
    }
    for (i, ((a, z), h)) in a.iter_mut().zip(z).zip(normed.iter()).enumerate() {
        let (g, al) = (gate(*h), alpha[i % w]);
        *a = z * (al + (1.0 - al) * g);
    }
}

/// Turns `d` (the gradient of `a`) into the gradient of `z` in place (training: batch
/// statistics), adding alpha's gradient and the statistics' pushed sums into `grads` (the
/// layer's [`params_len`] floats).
pub(super) fn backward(p: &[f32], z: &[f32], n: usize, w: usize, scratch: &[f32], d: &mut [f32], grads: &mut [f32]) {
    let alpha = &p[..w];
    let (normed, inv) = scratch[..2 * n * w].split_at(n * w);
    let (dalpha, dstats) = grads[..params_len(w)].split_at_mut(w);
    push_sums(z, n, w, None, 0.0, dstats);
    // a = z (alpha + (1 - alpha) p(h)): the direct part, and dh through the gate.
    let mut dh = vec![0.0f32; n * w];
    for i in 0..n * w {
        let (g, al) = (gate(normed[i]), alpha[i % w]);
        dalpha[i % w] += d[i] * z[i] * (1.0 - g);
        dh[i] = d[i] * z[i] * (1.0 - al) * g * (1.0 - g);
        d[i] *= al + (1.0 - al) * g;
    }
    normalize_batch_backward(&dh, normed, &inv[..w], n, w, d);
}

/// ONNX nodes for evaluation: `z * (alpha + (1 - alpha) * sigmoid(z * s + t))` with `s`, `t`
/// from the running statistics; returns the output's name.
pub(super) fn export(g: &mut crate::onnx::Graph, p: &[f32], z: &str, w: usize) -> String {
    let (alpha, stats) = p[..params_len(w)].split_at(w);
    let (mut s, mut t) = (vec![0.0; w], vec![0.0; w]);
    for k in 0..w {
        let (mean, var) = kept(stats, w, k);
        s[k] = 1.0 / (var + EPS).sqrt();
        t[k] = -mean * s[k];
    }
    let one_minus: Vec<f32> = alpha.iter().map(|a| 1.0 - a).collect();
    let (s, t) = (g.floats("dice_scale", &[w], &s), g.floats("dice_shift", &[w], &t));
    let (alpha, one_minus) = (g.floats("dice_alpha", &[w], alpha), g.floats("dice_one_minus_alpha", &[w], &one_minus));
    let h = g.op("Mul", &[z, &s], Vec::new());
    let h = g.op("Add", &[&h, &t], Vec::new());
    let gate = g.op("Sigmoid", &[&h], Vec::new());
    let gate = g.op("Mul", &[&gate, &one_minus], Vec::new());
    let factor = g.op("Add", &[&gate, &alpha], Vec::new());
    g.op("Mul", &[z, &factor], Vec::new())
}
