//! `next_item_loss`: DIEN's auxiliary loss (Zhou et al. 2019, section 4.2), which makes each
//! interest state of the extraction GRU predict the behaviour that follows it: an MLP scores
//! each state against the next behaviour and against a negative, and the layer's output is the
//! sample's loss, for a `value` head.

use super::dense::{LinearInit, MlpLayer};
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::Activation;
use crate::table::DenseParam;

/// For interest states `h_t` (`(L, H)`, a `gru` with `output = "all"`), the behaviours `e_t`
/// (`(L, E)`, the sequence the GRU read) and sampled negative behaviours `n_t` (`(L, E)`, one per
/// position, embedded alike), each pair of real positions `(t, t + 1)` is scored by a small MLP
/// of `[h_t, e_{t+1}]` (a positive) and of `[h_t, n_{t+1}]` (a negative). The output, one value
/// per sample, is the mean over the sample's pairs of the two log-losses,
/// `log(1 + e^-s_pos) + log(1 + e^s_neg)` (0 for a history shorter than 2): the sample's
/// auxiliary loss, trained by a head with `loss = "value"` whose `weight` is DIEN's alpha.
/// The paper sums over the positions; averaging per sample keeps a long history's loss on the
/// scale of a short one's. (FuxiCTR 2.3.10's `DIEN` masks the pairs alike but never reduces them
/// to a scalar: `examples/zoo/reference/run_din.py`.)
#[derive(Debug)]
pub struct NextItemLossLayer {
    len: usize,
    hidden_dim: usize,
    dim: usize,
    masked: bool,
    mlp: MlpLayer,
}

/// `next_item_loss`: `hidden = [100, 50]` (FuxiCTR's `aux_hidden_units`), `activation =
/// "relu"`, `init = "uniform"` (or `"xavier"`, `"xavier_normal"`); inputs the interest states (`(L, H)`), the
/// behaviours (`(L, E)`), the negative behaviours (`(L, E)`) and optionally the sequence's mask
/// (`L`) -> 1.
pub fn next_item_loss(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let hidden = args.usize_list("hidden")?.unwrap_or_else(|| vec![100, 50]);
    let activation = args.activation("activation")?.unwrap_or(Activation::Relu);
    let init = LinearInit::parse_hidden(args)?;
    args.finish()?;
    let (states, seq, neg, masked) = match inputs {
        [h, e, n] => (h, e, n, false),
        [h, e, n, m] if m.size() == e.fields => (h, e, n, true),
        [_, e, _, m] => return Err(format!("the mask has {} values for a sequence of {}", m.size(), e.fields)),
        _ => {
            return Err(format!(
            "takes the interest states, the behaviours, the negative behaviours and optionally the mask; got {} inputs",
            inputs.len()
        ))
        }
    };
    if states.fields != seq.fields || neg != seq {
        return Err(format!(
            "the states ({states}), the behaviours ({seq}) and the negatives ({neg}) must have the same positions, \
             and the negatives the behaviours' width"
        ));
    }
    if seq.fields < 2 {
        return Err(format!("needs sequences of 2 or more positions, got {}", seq.fields));
    }
    if hidden.contains(&0) {
        return Err("hidden widths must be positive".into());
    }
    let mlp = MlpLayer::new(states.dim + seq.dim, &hidden, activation, 0.0, Some(1), Activation::Identity, args.salt())
        .with_init(init);
    Ok(Box::new(NextItemLossLayer { len: seq.fields, hidden_dim: states.dim, dim: seq.dim, masked, mlp }))
}

impl NextItemLossLayer {
    /// Scored pairs per sample at most: a positive and a negative per `(t, t + 1)`.
    fn pairs(&self) -> usize {
        2 * (self.len - 1)
    }

    /// Whether positions `t` and `t + 1` of sample `r` are both real.
    fn is_pair(&self, x: &[&[f32]], r: usize, t: usize) -> bool {
        let real = |l: usize| !self.masked || super::is_real(x[3][r * self.len + l]);
        real(t) && real(t + 1)
    }

    /// Per sample, its first row among the MLP's inputs and the positions `t` of its pairs:
    /// row `first + 2 k` scores `(t_k, e_{t_k+1})`, row `first + 2 k + 1` `(t_k, n_{t_k+1})`. A
    /// function of the mask alone, so backward finds forward's layout again.
    fn layout(&self, x: &[&[f32]], rows: usize) -> Vec<(usize, Vec<usize>)> {
        let mut at = 0;
        (0..rows)
            .map(|r| {
                let ts: Vec<usize> = (0..self.len - 1).filter(|&t| self.is_pair(x, r, t)).collect();
                let first = at;
                at += 2 * ts.len();
                (first, ts)
            })
            .collect()
    }

    /// Writes the MLP's input rows of `layout` into `feat`.
    fn features(&self, x: &[&[f32]], layout: &[(usize, Vec<usize>)], feat: &mut [f32]) {
        let (h, e) = (self.hidden_dim, self.dim);
        let w = h + e;
        for (r, (first, ts)) in layout.iter().enumerate() {
            for (k, &t) in ts.iter().enumerate() {
                let state = &x[0][(r * self.len + t) * h..][..h];
                for (j, source) in [x[1], x[2]].into_iter().enumerate() {
                    let f = &mut feat[(first + 2 * k + j) * w..][..w];
                    f[..h].copy_from_slice(state);
                    f[h..].copy_from_slice(&source[(r * self.len + t + 1) * e..][..e]);
                }
            }
        }
    }
}

/// Rows of the MLP that `layout` fills.
fn rows_used(layout: &[(usize, Vec<usize>)]) -> usize {
    layout.last().map_or(0, |(first, ts)| first + 2 * ts.len())
}

/// `log(1 + e^z)`, without overflow.
fn softplus(z: f32) -> f32 {
    z.max(0.0) + (-z.abs()).exp().ln_1p()
}

impl Layer for NextItemLossLayer {
    fn output(&self) -> Shape {
        Shape::flat(1)
    }

    fn is_loss(&self) -> bool {
        true
    }

    fn params(&self) -> Vec<DenseParam> {
        self.mlp.params()
    }

    fn scratch(&self) -> usize {
        // Per sample at most: the pairs' input rows, the MLP's own scratch and scores.
        self.pairs() * (self.hidden_dim + self.dim + self.mlp.scratch() + 1)
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let n = ctx.rows * self.pairs();
        let (feat, rest) = scratch.split_at_mut(n * (self.hidden_dim + self.dim));
        let (mlp_scratch, scores) = rest.split_at_mut(n * self.mlp.scratch());
        let samples = self.layout(x, ctx.rows);
        self.features(x, &samples, feat);
        let used = rows_used(&samples);
        let inner = Ctx { rows: used, train: ctx.train, seeds: &[] };
        let w = self.hidden_dim + self.dim;
        self.mlp.forward(
            &inner,
            params,
            &[&feat[..used * w]],
            &mut scores[..used],
            &mut mlp_scratch[..used * self.mlp.scratch()],
        );
        for (r, (first, ts)) in samples.iter().enumerate() {
            let s = &scores[*first..first + 2 * ts.len()];
            let total: f32 = s.chunks_exact(2).map(|p| softplus(-p[0]) + softplus(p[1])).sum();
            y[r] = if ts.is_empty() { 0.0 } else { total / ts.len() as f32 };
        }
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
        let (h, e) = (self.hidden_dim, self.dim);
        let w = h + e;
        let n = ctx.rows * self.pairs();
        let (feat, rest) = scratch.split_at_mut(n * w);
        let (mlp_scratch, scores) = rest.split_at_mut(n * self.mlp.scratch());
        let samples = self.layout(x, ctx.rows);
        let used = rows_used(&samples);
        // d loss / d score: sigmoid(s) - 1 for a positive, sigmoid(s) for a negative, over the
        // sample's pair count.
        let mut dscores = vec![0.0f32; used];
        for (r, (first, ts)) in samples.iter().enumerate() {
            let scale = dy[r] / ts.len().max(1) as f32;
            for k in 0..2 * ts.len() {
                let p = crate::nn::sigmoid(scores[first + k]);
                dscores[first + k] = scale * if k % 2 == 0 { p - 1.0 } else { p };
            }
        }
        let inner = Ctx { rows: used, train: true, seeds: &[] };
        let mut dfeat = vec![0.0f32; used * w];
        self.mlp.backward(
            &inner,
            params,
            &[&feat[..used * w]],
            &scores[..used],
            &dscores,
            &mut mlp_scratch[..used * self.mlp.scratch()],
            grads,
            &mut [Some(&mut dfeat)],
        );
        for (r, (first, ts)) in samples.iter().enumerate() {
            for (k, &t) in ts.iter().enumerate() {
                for (j, target) in [1, 2].into_iter().enumerate() {
                    let f = &dfeat[(first + 2 * k + j) * w..][..w];
                    if let Some(ds) = dx[0].as_deref_mut() {
                        ds[(r * self.len + t) * h..][..h].iter_mut().zip(&f[..h]).for_each(|(a, b)| *a += b);
                    }
                    if let Some(d) = dx[target].as_deref_mut() {
                        d[(r * self.len + t + 1) * e..][..e].iter_mut().zip(&f[h..]).for_each(|(a, b)| *a += b);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_args as args;
    use super::*;
    use crate::nn::layer::check_layer;

    fn shapes(len: usize, h: usize, e: usize, mask: bool) -> Vec<Shape> {
        let mut s = vec![Shape { fields: len, dim: h }, Shape { fields: len, dim: e }, Shape { fields: len, dim: e }];
        if mask {
            s.push(Shape::flat(len));
        }
        s
    }

    #[test]
    fn next_item_loss_gradients_match_finite_differences() {
        // tanh, not the default relu: among the 32 scored pairs some relu unit sits within the
        // finite difference's step of its kink. (With a mask, `check_layer`'s random values
        // leave few real pairs: the test below holds prefix masks.)
        for mask in [false, true] {
            let inputs = shapes(5, 3, 4, mask);
            let layer = next_item_loss(&mut args(r#"{"hidden": [6, 5], "activation": "tanh"}"#), &inputs).unwrap();
            check_layer(layer.as_ref(), &inputs, 4, 7).unwrap();
        }
    }

    /// Several samples with prefix masks of different lengths (so different pair counts and
    /// first rows), against finite differences of the inputs and parameters, the mask held.
    #[test]
    fn gradients_of_samples_with_different_histories_match_finite_differences() {
        let (len, h, e, rows) = (5, 3, 4, 4);
        let inputs = shapes(len, h, e, true);
        let layer = next_item_loss(&mut args(r#"{"hidden": [6], "activation": "tanh"}"#), &inputs).unwrap();
        let draw = |k: u64, n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((crate::base::layout::mix64(k << 32 | i as u64) >> 40) as f32 / (1u64 << 24) as f32) - 0.5)
                .collect()
        };
        let total: usize = layer.params().iter().map(|p| p.len).sum();
        let params = draw(1, total);
        let mut mask = vec![0.0; rows * len];
        for (r, real) in [5, 3, 0, 2].into_iter().enumerate() {
            mask[r * len..r * len + real].fill(1.0);
        }
        let xs = [draw(2, rows * len * h), draw(3, rows * len * e), draw(4, rows * len * e)];
        let weights = draw(5, rows);
        let ctx = Ctx { rows, train: true, seeds: &[] };
        let mut scratch = vec![0.0; rows * layer.scratch()];
        let loss = |params: &[f32], xs: &[Vec<f32>; 3], scratch: &mut [f32]| -> f64 {
            let mut y = vec![0.0; rows];
            layer.forward(&ctx, params, &[&xs[0], &xs[1], &xs[2], &mask], &mut y, scratch);
            y.iter().zip(&weights).map(|(a, b)| *a as f64 * *b as f64).sum()
        };
        let mut y = vec![0.0; rows];
        layer.forward(&ctx, &params, &[&xs[0], &xs[1], &xs[2], &mask], &mut y, &mut scratch);
        assert_eq!(y[2], 0.0, "no pair, no loss");
        assert!(y.iter().enumerate().all(|(r, v)| r == 2 || *v > 0.0), "{y:?}");
        let mut grads = vec![0.0; total];
        let mut dxs: Vec<Vec<f32>> = xs.iter().map(|x| vec![0.0; x.len()]).collect();
        {
            let (a, rest) = dxs.split_at_mut(1);
            let (b, c) = rest.split_at_mut(1);
            let mut dx = [Some(&mut a[0][..]), Some(&mut b[0][..]), Some(&mut c[0][..]), None];
            let refs: [&[f32]; 4] = [&xs[0], &xs[1], &xs[2], &mask];
            layer.backward(&ctx, &params, &refs, &y, &weights, &mut scratch, &mut grads, &mut dx);
        }
        let eps = 1e-2f32;
        let close = |n: f64, a: f32| (n - a as f64).abs() <= 1e-3 + 1e-2 * n.abs();
        for k in 0..total {
            let (mut hi, mut lo) = (params.clone(), params.clone());
            hi[k] += eps;
            lo[k] -= eps;
            let n = (loss(&hi, &xs, &mut scratch) - loss(&lo, &xs, &mut scratch)) / (2.0 * eps as f64);
            assert!(close(n, grads[k]), "parameter {k}: {n} against {}", grads[k]);
        }
        for i in 0..3 {
            for k in 0..xs[i].len() {
                let (mut hi, mut lo) = (xs.clone(), xs.clone());
                hi[i][k] += eps;
                lo[i][k] -= eps;
                let n = (loss(&params, &hi, &mut scratch) - loss(&params, &lo, &mut scratch)) / (2.0 * eps as f64);
                assert!(close(n, dxs[i][k]), "input {i}[{k}]: {n} against {}", dxs[i][k]);
            }
        }
        // Positions past a history's end, and the last position's state, get no gradient.
        assert!(dxs[0][(3 * len + 1) * h..(3 * len + 5) * h].iter().all(|v| *v == 0.0));
        assert!(dxs[1][(2 * len) * e..(3 * len) * e].iter().all(|v| *v == 0.0));
    }

    #[test]
    fn the_loss_is_the_mean_log_loss_of_next_behaviours_against_negatives_over_real_pairs() {
        // No hidden layer: score = w . [h_t, x_{t+1}] + b, so the loss is computed by hand.
        let inputs = shapes(4, 1, 1, true);
        let layer = next_item_loss(&mut args(r#"{"hidden": []}"#), &inputs).unwrap();
        // params: 0.w (2 x 1), 0.b (1): score = h + 2 x.
        let params = [1.0, 2.0, 0.0];
        let h = [0.5, -1.0, 2.0, 0.0];
        let pos = [0.0, 1.0, -1.0, 3.0];
        let neg = [0.0, 0.5, 0.25, -2.0];
        // Three real positions: pairs (0, 1) and (1, 2).
        let mask = [1.0, 1.0, 1.0, 0.0];
        let xs: [&[f32]; 4] = [&h, &pos, &neg, &mask];
        let ctx = Ctx { rows: 1, train: true, seeds: &[] };
        let mut y = [0.0];
        let mut scratch = vec![0.0; layer.scratch()];
        layer.forward(&ctx, &params, &xs, &mut y, &mut scratch);
        let score = |h: f32, x: f32| h + 2.0 * x;
        let want = (softplus(-score(0.5, 1.0))
            + softplus(score(0.5, 0.5))
            + softplus(-score(-1.0, -1.0))
            + softplus(score(-1.0, 0.25)))
            / 2.0;
        assert!((y[0] - want).abs() < 1e-6, "{} against {want}", y[0]);
        // A history of one real position has no pair and no loss.
        let short = [1.0, 0.0, 0.0, 0.0];
        layer.forward(&ctx, &params, &[&h, &pos, &neg, &short], &mut y, &mut scratch);
        assert_eq!(y[0], 0.0);
    }

    #[test]
    fn bad_inputs_are_named() {
        let e = |inputs: &[Shape]| next_item_loss(&mut args("{}"), inputs).unwrap_err();
        assert!(e(&shapes(5, 3, 4, false)[..2]).contains("takes the interest states"));
        let mut s = shapes(5, 3, 4, false);
        s[2] = Shape { fields: 5, dim: 3 };
        assert!(e(&s).contains("the negatives the behaviours' width"));
        assert!(e(&shapes(1, 3, 4, false)).contains("2 or more positions"));
        let mut s = shapes(5, 3, 4, true);
        s[3] = Shape::flat(4);
        assert!(e(&s).contains("the mask has 4 values"));
    }
}
