//! `batch_norm` and `data_norm`: normalization whose statistics the servers keep.
//!
//! Both keep, per value of their input, three statistics as dense parameters that the
//! optimizer does not train: a count `n`, a sum `s` and a square sum `q`, pushed as sums and
//! accumulated by the servers with Paddle's summary rule `p = decay * p + pushed`
//! ([`Update::Summary`]), as Paddle's parameter servers keep `data_norm`'s `BatchSize`,
//! `BatchSum` and `BatchSquareSum`. Each training step pushes, per value, the rows it saw `N`,
//! their sum `sum x` and a square sum: for `data_norm` Paddle's, around the kept mean,
//! `sum (x - s/n)^2 + N * eps`; for `batch_norm` around the batch's mean (so `q/n` follows the
//! batches' variance, as PyTorch's `running_var`). Counts and sums add over threads, trainers
//! and steps, so the servers hold the same counts and sums whichever way the batches were split.
//!
//! - `data_norm` (Paddle's): `y = (x - s/n) * sqrt(n/q)`, in training as in evaluation. Its
//!   output depends on no other row of the batch, so sync training stays equal to local.
//! - `batch_norm` (Ioffe and Szegedy): in training
//!   `y = gain * (x - mean_B) / sqrt(var_B + eps) + bias` with the batch's (each thread's
//!   share of it) mean and biased variance; in
//!   evaluation, prediction and export the kept statistics replace them (mean `s/n`, variance
//!   `q/n`). Like every data-parallel batch norm without cross-device synchronisation, a step's
//!   output depends on how the batch was split (threads, trainers): sync 2 x 2 is not bit-equal
//!   to local with it, as it is without it.

use super::one_input;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::table::{DenseParam, Init};

/// Which normalization a [`NormStatsLayer`] computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormKind {
    /// Batch statistics in training, kept statistics otherwise; a learned gain and bias.
    Batch,
    /// Kept statistics always (Paddle's `data_norm`); no learned parameters.
    Data,
}

/// A normalization whose per-value statistics the servers keep (see the module's documentation).
#[derive(Debug)]
pub struct NormStatsLayer {
    kind: NormKind,
    input: Shape,
    eps: f32,
    decay: f32,
    prior: f32,
}

fn build(kind: NormKind, args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let (eps, decay, prior) = match kind {
        NormKind::Batch => (1e-5, 0.9, 1.0),
        NormKind::Data => (1e-4, 0.999_999_9, 1e4),
    };
    let eps = args.f32("eps")?.unwrap_or(eps);
    let decay = args.f32("decay")?.unwrap_or(decay);
    let prior = args.f32("prior")?.unwrap_or(prior);
    args.finish()?;
    let input = one_input(inputs)?;
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(format!("eps must be positive, got {eps}"));
    }
    if !(0.0..=1.0).contains(&decay) {
        return Err(format!("decay must be in [0, 1], got {decay}"));
    }
    if !(prior > 0.0 && prior.is_finite()) {
        return Err(format!("prior (the statistics' starting count) must be positive, got {prior}"));
    }
    Ok(Box::new(NormStatsLayer { kind, input, eps, decay, prior }))
}

/// `batch_norm`: `decay = 0.9` (per update: the kept statistics follow about the last 10
/// steps, as PyTorch's momentum 0.1), `prior = 1` (the kept count before any data: mean 0,
/// variance 1), `eps = 1e-5`; any input -> the same shape, each value normalized on its own.
pub fn batch_norm(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    build(NormKind::Batch, args, inputs)
}

/// `data_norm`: Paddle's defaults, `decay = 0.9999999` (`summary_decay_rate`), `prior = 1e4`
/// (`batch_size` and `batch_square` start at 1e4, `batch_sum` at 0), `eps = 1e-4`; any input
/// -> the same shape.
pub fn data_norm(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    build(NormKind::Data, args, inputs)
}

/// The statistics' parameters (count, sum, square sum of `w` values each), starting as `prior`
/// samples of mean 0 and variance 1.
pub(super) fn stats_params(w: usize, prior: f32, decay: f32) -> [DenseParam; 3] {
    let prior = Init::Constant { value: prior };
    [
        DenseParam::summary("count", w, prior, decay),
        DenseParam::summary("sum", w, Init::Zeros, decay),
        DenseParam::summary("square_sum", w, prior, decay),
    ]
}

/// The kept mean and (biased) variance of value `k` from statistics `st` (count, sum, square
/// sum of `w` values each).
pub(super) fn kept(st: &[f32], w: usize, k: usize) -> (f32, f32) {
    let (n, s, q) = (st[k], st[w + k], st[2 * w + k]);
    (s / n, q / n)
}

/// Adds the batch's sums to the statistics' pushed sums `g` (count, sum, square sum of `w`
/// values each) for `rows` rows of `x`: the square sum around the mean of the statistics
/// `kept` (Paddle's data_norm kernel) or, without, around the batch's own mean, plus `extra`
/// per row (data_norm's eps).
pub(super) fn push_sums(x: &[f32], rows: usize, w: usize, kept_stats: Option<&[f32]>, extra: f32, g: &mut [f32]) {
    for k in 0..w {
        let sum: f32 = (0..rows).map(|r| x[r * w + k]).sum();
        let mean = kept_stats.map_or(sum / rows as f32, |st| kept(st, w, k).0);
        g[k] += rows as f32;
        g[w + k] += sum;
        g[2 * w + k] += (0..rows).map(|r| (x[r * w + k] - mean).powi(2)).sum::<f32>() + extra * rows as f32;
    }
}

/// Normalizes each of the `w` values of `rows` rows of `x` over the rows (batch mean, biased
/// variance): the normalized values into `normed`, each value's `1 / std` into `inv_std`.
pub(super) fn normalize_batch(x: &[f32], rows: usize, w: usize, eps: f32, normed: &mut [f32], inv_std: &mut [f32]) {
    for k in 0..w {
        let mean = (0..rows).map(|r| x[r * w + k]).sum::<f32>() / rows as f32;
        let var = (0..rows).map(|r| (x[r * w + k] - mean).powi(2)).sum::<f32>() / rows as f32;
        let inv = 1.0 / (var + eps).sqrt();
        inv_std[k] = inv;
        for r in 0..rows {
            normed[r * w + k] = (x[r * w + k] - mean) * inv;
        }
    }
}

/// Backward of [`normalize_batch`]: given `g`, the gradient of the normalized values, adds
/// `dx = inv / N * (N g - sum g - h sum(g h))` into `dx`.
pub(super) fn normalize_batch_backward(
    g: &[f32],
    normed: &[f32],
    inv_std: &[f32],
    rows: usize,
    w: usize,
    dx: &mut [f32],
) {
    for k in 0..w {
        let (mut sum, mut dot) = (0.0f32, 0.0f32);
        for r in 0..rows {
            sum += g[r * w + k];
            dot += g[r * w + k] * normed[r * w + k];
        }
        let scale = inv_std[k] / rows as f32;
        for r in 0..rows {
            dx[r * w + k] += scale * (rows as f32 * g[r * w + k] - sum - normed[r * w + k] * dot);
        }
    }
}

impl NormStatsLayer {
    /// Floats per sample.
    fn width(&self) -> usize {
        self.input.size()
    }

    /// Offset of the statistics in the layer's parameters (after gain and bias for batch_norm).
    fn stats_at(&self) -> usize {
        match self.kind {
            NormKind::Batch => 2 * self.width(),
            NormKind::Data => 0,
        }
    }

    /// The kept mean and the factor `1 / std` for value `k`.
    fn kept(&self, params: &[f32], k: usize) -> (f32, f32) {
        let (mean, var) = kept(&params[self.stats_at()..], self.width(), k);
        let inv = match self.kind {
            NormKind::Batch => 1.0 / (var + self.eps).sqrt(),
            NormKind::Data => 1.0 / var.sqrt(),
        };
        (mean, inv)
    }

    /// Evaluation's (and data_norm's) `y = a x + b` for value `k`, from the kept statistics
    /// (and batch_norm's gain and bias).
    fn affine(&self, params: &[f32], k: usize) -> (f32, f32) {
        let (mean, inv) = self.kept(params, k);
        match self.kind {
            NormKind::Batch => {
                let (gain, bias) = (params[k], params[self.width() + k]);
                (gain * inv, bias - mean * inv * gain)
            }
            NormKind::Data => (inv, -mean * inv),
        }
    }

    /// Training with batch statistics (batch_norm in training).
    fn batch_stats(&self, ctx: &Ctx) -> bool {
        self.kind == NormKind::Batch && ctx.train
    }
}

impl Layer for NormStatsLayer {
    fn output(&self) -> Shape {
        self.input
    }

    fn params(&self) -> Vec<DenseParam> {
        let w = self.width();
        let mut p = Vec::new();
        if self.kind == NormKind::Batch {
            p.push(DenseParam::new("gain", w, Init::Constant { value: 1.0 }));
            p.push(DenseParam::new("bias", w, Init::Zeros));
        }
        p.extend(stats_params(w, self.prior, self.decay));
        p
    }

    /// The normalized values, then (batch_norm) each value's batch `1 / std` in the first row.
    fn scratch(&self) -> usize {
        match self.kind {
            NormKind::Batch => 2 * self.width(),
            NormKind::Data => 0,
        }
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (w, rows) = (self.width(), ctx.rows);
        if !self.batch_stats(ctx) {
            for k in 0..w {
                let (a, b) = self.affine(params, k);
                for r in 0..rows {
                    y[r * w + k] = a * x[0][r * w + k] + b;
                }
            }
            return;
        }
        let (gain, bias) = params.split_at(w);
        let (normed, inv_std) = scratch.split_at_mut(rows * w);
        normalize_batch(x[0], rows, w, self.eps, normed, inv_std);
        for (i, (y, h)) in y.iter_mut().zip(normed.iter()).enumerate() {
            *y = gain[i % w] * h + bias[i % w];
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        // Evaluation: y = a * x + b per value, from the kept statistics.
        let w = self.width();
        let (a, b): (Vec<f32>, Vec<f32>) = (0..w).map(|k| self.affine(params, k)).unzip();
        let a = g.floats("scale", &[w], &a);
        let b = g.floats("shift", &[w], &b);
        let scaled = g.op("Mul", &[x[0], &a], vec![]);
        g.op_to("Add", &[&scaled, &b], vec![], y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        params: &[f32],
        x: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let (w, rows) = (self.width(), ctx.rows);
        // The statistics' pushed sums (not derivatives: the servers' summary rule adds them).
        let at = self.stats_at();
        match self.kind {
            NormKind::Batch => push_sums(x[0], rows, w, None, 0.0, &mut grads[at..]),
            NormKind::Data => push_sums(x[0], rows, w, Some(&params[at..]), self.eps, &mut grads[at..]),
        }
        let mut dx = dx[0].as_deref_mut();
        if !self.batch_stats(ctx) {
            // data_norm: the statistics are constants of the step, dx = dy * scale.
            if let Some(dx) = dx.as_deref_mut() {
                for k in 0..w {
                    let (_, inv) = self.kept(params, k);
                    for r in 0..rows {
                        dx[r * w + k] += dy[r * w + k] * inv;
                    }
                }
            }
            return;
        }
        let gain = &params[..w];
        let (normed, inv_std) = scratch.split_at(rows * w);
        let (dgain, rest) = grads.split_at_mut(w);
        let dbias = &mut rest[..w];
        for (i, (g, h)) in dy.iter().zip(normed).enumerate() {
            dgain[i % w] += g * h;
            dbias[i % w] += g;
        }
        if let Some(dx) = dx {
            let dh: Vec<f32> = dy.iter().enumerate().map(|(i, g)| g * gain[i % w]).collect();
            normalize_batch_backward(&dh, normed, inv_std, rows, w, dx);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_args as args;
    use super::*;
    use crate::nn::layer::check_layer;

    fn run(layer: &dyn Layer, params: &[f32], x: &[f32], rows: usize, train: bool) -> (Vec<f32>, Vec<f32>) {
        let ctx = Ctx { rows, train, seeds: &[] };
        let mut y = vec![0.0; x.len()];
        let mut scratch = vec![0.0; rows * layer.scratch()];
        layer.forward(&ctx, params, &[x], &mut y, &mut scratch);
        let mut grads = vec![0.0; params.len()];
        let mut dx = vec![0.0; x.len()];
        layer.backward(&ctx, params, &[x], &y, &vec![1.0; x.len()], &mut scratch, &mut grads, &mut [Some(&mut dx[..])]);
        (y, grads)
    }

    #[test]
    fn both_match_finite_differences_of_their_trained_parameters_and_inputs() {
        for (f, d, rows) in [(1, 3, 4), (2, 2, 5), (1, 1, 2)] {
            let s = Shape { fields: f, dim: d };
            for make in [batch_norm, data_norm] {
                let layer = make(&mut args("{}"), &[s]).unwrap();
                check_layer(layer.as_ref(), &[s], rows, d as u64).unwrap_or_else(|e| panic!("{s}: {e}"));
            }
        }
    }

    #[test]
    fn data_norm_is_paddles_formula_and_pushes_paddles_sums() {
        // One value, kept n = 4, s = 8, q = 16: mean 2, scale sqrt(4/16) = 0.5.
        let layer = data_norm(&mut args(r#"{"eps": 0.5}"#), &[Shape::flat(1)]).unwrap();
        let (y, grads) = run(layer.as_ref(), &[4.0, 8.0, 16.0], &[1.0, 2.0, 6.0], 3, true);
        assert_eq!(y, [-0.5, 0.0, 2.0]);
        // N = 3, sum 9, sum (x - 2)^2 = 1 + 0 + 16, plus N eps = 1.5.
        assert_eq!(grads, [3.0, 9.0, 18.5]);
        // The same in evaluation: data_norm never looks at the batch.
        assert_eq!(run(layer.as_ref(), &[4.0, 8.0, 16.0], &[1.0, 2.0, 6.0], 3, false).0, y);
    }

    #[test]
    fn batch_norm_uses_the_batch_in_training_and_the_kept_statistics_otherwise() {
        let layer = batch_norm(&mut args(r#"{"eps": 0.0001}"#), &[Shape::flat(1)]).unwrap();
        // gain 2, bias 1; kept n = 2, s = 2, q = 8: mean 1, variance 4.
        let params = [2.0, 1.0, 2.0, 2.0, 8.0];
        let (y, grads) = run(layer.as_ref(), &params, &[1.0, 3.0], 2, true);
        // Batch mean 2, variance 1: h = -1, 1 (eps 1e-4 moves it by 5e-5).
        assert!((y[0] + 1.0).abs() < 1e-3 && (y[1] - 3.0).abs() < 1e-3, "{y:?}");
        // Pushed: N = 2, sum 4, square sum around the batch mean 2: 1 + 1.
        assert_eq!(&grads[2..], &[2.0, 4.0, 2.0]);
        let (y, _) = run(layer.as_ref(), &params, &[1.0, 3.0], 2, false);
        // (x - 1) / 2 * 2 + 1.
        assert!((y[0] - 1.0).abs() < 1e-3 && (y[1] - 3.0).abs() < 1e-3, "{y:?}");
    }

    #[test]
    fn bad_settings_are_refused() {
        for (json, word) in [(r#"{"decay": 1.5}"#, "decay"), (r#"{"prior": 0}"#, "prior"), (r#"{"eps": -1}"#, "eps")] {
            let e = batch_norm(&mut args(json), &[Shape::flat(2)]).unwrap_err();
            assert!(e.contains(word), "{e}");
        }
    }
}
