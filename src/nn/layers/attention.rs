//! `self_attention`: multi-head self-attention over a field (or sequence) tensor, AutoInt's
//! interacting layer and BST's transformer attention.

use super::dense::LinearInit;
use super::{export_real, is_real};
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::{matmul, Activation};
use crate::table::{DenseParam, Init};

/// The score a masked key gets: its weight underflows to exactly 0.
const MASKED: f32 = -1e9;

/// For the input's `F` vectors `X` (plus learned position vectors `P` with `positions`):
/// per head `h`, `O_h = softmax(Q_h K_h^T * s + mask) V_h` with `Q = X Wq`, `K = X Wk`,
/// `V = X Wv` (no biases, as AutoInt), `s = 1/sqrt(dim)` with `scale` (else 1, AutoInt's
/// default); the heads concatenated, plus `X Wr` with `residual`, through `activation` (ReLU):
/// `(F, heads * dim)`. An optional second input, a mask of `F` values (a `sequence_mask`),
/// hides the keys whose mask is 0 from every query.
#[derive(Debug)]
pub struct SelfAttentionLayer {
    input: Shape,
    heads: usize,
    dim: usize,
    residual: bool,
    scale: bool,
    positions: bool,
    masked: bool,
    activation: Activation,
    init: LinearInit,
}

/// `self_attention`: `heads = 2`, `dim` (per head, default the input's D), `residual = true`,
/// `scale = false`, `positions = false`, `activation = "relu"`, `init = "uniform"` (the
/// projections +-1/sqrt(D), as PyTorch's default), `"xavier"` (Glorot-uniform) or
/// `"xavier_normal"` (Glorot-normal, as FuxiCTR's AutoInt starts them); position vectors stay
/// +-1/sqrt(D); inputs a field tensor `(F, D)` and optionally its
/// mask (`F`) -> `(F, heads * dim)`.
pub fn self_attention(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let heads = args.usize("heads")?.unwrap_or(2);
    let dim = args.usize("dim")?;
    let residual = args.bool("residual")?.unwrap_or(true);
    let scale = args.bool("scale")?.unwrap_or(false);
    let positions = args.bool("positions")?.unwrap_or(false);
    let activation = args.activation("activation")?.unwrap_or(Activation::Relu);
    let init = LinearInit::parse_hidden(args)?;
    args.finish()?;
    let (input, masked) = match inputs {
        [x] => (*x, false),
        [x, m] if m.size() == x.fields => (*x, true),
        [x, m] => return Err(format!("the mask has {} values for {} vectors", m.size(), x.fields)),
        _ => return Err(format!("takes a field tensor and optionally its mask, got {} inputs", inputs.len())),
    };
    if input.fields < 2 || input.dim == 0 {
        return Err(format!("needs a field tensor (F x D) with F >= 2, got {input}"));
    }
    let dim = dim.unwrap_or(input.dim);
    if heads == 0 || dim == 0 {
        return Err("heads and dim must be positive".into());
    }
    Ok(Box::new(SelfAttentionLayer { input, heads, dim, residual, scale, positions, masked, activation, init }))
}

impl SelfAttentionLayer {
    /// Floats per vector of the output (all heads).
    fn width(&self) -> usize {
        self.heads * self.dim
    }

    fn factor(&self) -> f32 {
        if self.scale {
            1.0 / (self.dim as f32).sqrt()
        } else {
            1.0
        }
    }

    /// Projection matrices: q, k, v and the residual one.
    fn projections(&self) -> usize {
        3 + self.residual as usize
    }

    /// Per-sample scratch layout: the input with positions, Q, K, V, the attention weights.
    fn layout(&self) -> [usize; 5] {
        let (f, d, w) = (self.input.fields, self.input.dim, self.width());
        let x = if self.positions { f * d } else { 0 };
        [x, f * w, f * w, f * w, self.heads * f * f]
    }
}

/// `rows * n` floats of region `k` of a scratch laid out as `layout` per sample, regions
/// batch-major (region 0 for every sample, then region 1, ...).
fn region(layout: &[usize; 5], rows: usize, k: usize) -> std::ops::Range<usize> {
    let start: usize = layout[..k].iter().map(|n| n * rows).sum();
    start..start + layout[k] * rows
}

/// Adds `src` (rows of `src.len() / rows` floats) into columns `col..` of `dst`, whose rows
/// are `width` floats: one head's block of a tensor holding all heads side by side.
fn add_columns(dst: &mut [f32], width: usize, col: usize, src: &[f32]) {
    let rows = dst.len() / width;
    let n = src.len() / rows;
    for (d, s) in dst.chunks_exact_mut(width).zip(src.chunks_exact(n)) {
        d[col..col + n].iter_mut().zip(s).for_each(|(a, b)| *a += b);
    }
}

impl Layer for SelfAttentionLayer {
    fn output(&self) -> Shape {
        Shape { fields: self.input.fields, dim: self.width() }
    }

    fn params(&self) -> Vec<DenseParam> {
        let (f, d, w) = (self.input.fields, self.input.dim, self.width());
        let weights = self.init.of(d, w).0;
        let mut p: Vec<DenseParam> = ["q", "k", "v", "residual"][..self.projections()]
            .iter()
            .map(|n| DenseParam::new(format!("w_{n}"), d * w, weights))
            .collect();
        if self.positions {
            p.push(DenseParam::new("positions", f * d, Init::Uniform { scale: 1.0 / (d as f32).sqrt() }));
        }
        p
    }

    fn scratch(&self) -> usize {
        self.layout().iter().sum()
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (rows, f, d, w, a) = (ctx.rows, self.input.fields, self.input.dim, self.width(), self.dim);
        let n = rows * f;
        let layout = self.layout();
        let (xs_part, rest) = scratch.split_at_mut(region(&layout, rows, 1).start);
        let input: &[f32] = if self.positions {
            let pos = &params[self.projections() * d * w..];
            for (r, out) in xs_part.chunks_exact_mut(f * d).enumerate() {
                let row = &x[0][r * f * d..(r + 1) * f * d];
                out.iter_mut().zip(row.iter().zip(pos)).for_each(|(o, (v, p))| *o = v + p);
            }
            xs_part
        } else {
            x[0]
        };
        let (q, rest) = rest.split_at_mut(n * w);
        let (k, rest) = rest.split_at_mut(n * w);
        let (v, att) = rest.split_at_mut(n * w);
        let proj = |i: usize| &params[i * d * w..(i + 1) * d * w];
        matmul(n, w, d, q, false, input, (d, 1), proj(0), (w, 1));
        matmul(n, w, d, k, false, input, (d, 1), proj(1), (w, 1));
        matmul(n, w, d, v, false, input, (d, 1), proj(2), (w, 1));
        if self.residual {
            matmul(n, w, d, y, false, input, (d, 1), proj(3), (w, 1));
        } else {
            y[..n * w].fill(0.0);
        }
        let s = self.factor();
        let mut head = vec![0.0f32; f * a];
        for r in 0..rows {
            let at = r * f * w;
            for h in 0..self.heads {
                let scores = &mut att[(r * self.heads + h) * f * f..][..f * f];
                let (qh, kh) = (&q[at + h * a..], &k[at + h * a..]);
                matmul(f, f, a, scores, false, qh, (w, 1), kh, (1, w));
                for i in 0..f {
                    let row = &mut scores[i * f..(i + 1) * f];
                    for (j, z) in row.iter_mut().enumerate() {
                        // A masked score is a constant: no gradient flows through it.
                        *z = if self.masked && !is_real(x[1][r * f + j]) { MASKED } else { *z * s };
                    }
                    crate::nn::softmax(row);
                }
                matmul(f, a, f, &mut head, false, scores, (f, 1), &v[at + h * a..], (w, 1));
                add_columns(&mut y[at..at + f * w], w, h * a, &head);
            }
        }
        self.activation.forward(&mut y[..n * w]);
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        let (f, d, w) = (self.input.fields as i64, self.input.dim, self.width());
        let (heads, a) = (self.heads as i64, self.dim as i64);
        let mut input = g.reshape(x[0], &[-1, f, d as i64]);
        if self.positions {
            let pos = g.floats("positions", &[f as usize, d], &params[self.projections() * d * w..]);
            input = g.op("Add", &[&input, &pos], Vec::new());
        }
        let proj = |g: &mut crate::onnx::Graph, i: usize, name: &str| {
            let m = g.floats(name, &[d, w], &params[i * d * w..(i + 1) * d * w]);
            g.op("MatMul", &[&input, &m], Vec::new())
        };
        let q = proj(g, 0, "w_q");
        let k = proj(g, 1, "w_k");
        let v = proj(g, 2, "w_v");
        let res = self.residual.then(|| proj(g, 3, "w_residual"));
        let split = |g: &mut crate::onnx::Graph, t: &str, perm: Vec<i64>| {
            let t = g.reshape(t, &[-1, f, heads, a]);
            g.op("Transpose", &[&t], vec![Attr::Ints("perm", perm)])
        };
        let q = split(g, &q, vec![0, 2, 1, 3]);
        let k = split(g, &k, vec![0, 2, 3, 1]);
        let v = split(g, &v, vec![0, 2, 1, 3]);
        let mut scores = g.op("MatMul", &[&q, &k], Vec::new());
        if self.scale {
            let s = g.scalar("scale", self.factor());
            scores = g.op("Mul", &[&scores, &s], Vec::new());
        }
        if self.masked {
            let keep = export_real(g, x[1]);
            let keep = g.reshape(&keep, &[-1, 1, 1, f]);
            let masked = g.scalar("masked", MASKED);
            scores = g.op("Where", &[&keep, &scores, &masked], Vec::new());
        }
        let weights = g.op("Softmax", &[&scores], vec![Attr::Int("axis", -1)]);
        let o = g.op("MatMul", &[&weights, &v], Vec::new());
        let o = g.op("Transpose", &[&o], vec![Attr::Ints("perm", vec![0, 2, 1, 3])]);
        let mut o = g.reshape(&o, &[-1, f, w as i64]);
        if let Some(res) = res {
            o = g.op("Add", &[&o, &res], Vec::new());
        }
        let o = g.reshape(&o, &[-1, f * w as i64]);
        self.activation.export_onnx(g, &o, y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        params: &[f32],
        x: &[&[f32]],
        y: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let (rows, f, d, w, a) = (ctx.rows, self.input.fields, self.input.dim, self.width(), self.dim);
        let n = rows * f;
        let layout = self.layout();
        let input: &[f32] = if self.positions { &scratch[region(&layout, rows, 0)] } else { x[0] };
        let q = &scratch[region(&layout, rows, 1)];
        let k = &scratch[region(&layout, rows, 2)];
        let v = &scratch[region(&layout, rows, 3)];
        let att = &scratch[region(&layout, rows, 4)];
        let mut dpre = dy.to_vec();
        self.activation.backward(y, &mut dpre);
        let (mut dq, mut dk, mut dv) = (vec![0.0f32; n * w], vec![0.0f32; n * w], vec![0.0f32; n * w]);
        let (mut da, mut ds) = (vec![0.0f32; f * f], vec![0.0f32; f * f]);
        let mut head = vec![0.0f32; f * a];
        let s = self.factor();
        for r in 0..rows {
            let at = r * f * w;
            for h in 0..self.heads {
                let weights = &att[(r * self.heads + h) * f * f..][..f * f];
                let (o, col) = (&dpre[at + h * a..], at + h * a);
                // dA = dO V^T, dV = A^T dO.
                matmul(f, f, a, &mut da, false, o, (w, 1), &v[col..], (1, w));
                matmul(f, a, f, &mut head, false, weights, (1, f), o, (w, 1));
                add_columns(&mut dv[at..at + f * w], w, h * a, &head);
                for i in 0..f {
                    let (p, g) = (&weights[i * f..(i + 1) * f], &da[i * f..(i + 1) * f]);
                    let dot: f32 = p.iter().zip(g).map(|(p, g)| p * g).sum();
                    for j in 0..f {
                        let hidden = self.masked && !is_real(x[1][r * f + j]);
                        ds[i * f + j] = if hidden { 0.0 } else { p[j] * (g[j] - dot) * s };
                    }
                }
                // S = Q K^T: dQ = dS K, dK = dS^T Q.
                matmul(f, a, f, &mut head, false, &ds, (f, 1), &k[col..], (w, 1));
                add_columns(&mut dq[at..at + f * w], w, h * a, &head);
                matmul(f, a, f, &mut head, false, &ds, (1, f), &q[col..], (w, 1));
                add_columns(&mut dk[at..at + f * w], w, h * a, &head);
            }
        }
        let projections = self.projections();
        let mut dinput = vec![0.0f32; n * d];
        let (pgrads, pos_grads) = grads.split_at_mut(projections * d * w);
        let mut sources = vec![&dq, &dk, &dv];
        if self.residual {
            sources.push(&dpre);
        }
        for (i, g) in sources.into_iter().enumerate() {
            // P = X W_i: dW_i = X^T dP, dX = dP W_i^T.
            matmul(d, w, n, &mut pgrads[i * d * w..(i + 1) * d * w], true, input, (1, d), g, (w, 1));
            matmul(n, d, w, &mut dinput, true, g, (w, 1), &params[i * d * w..(i + 1) * d * w], (1, w));
        }
        if self.positions {
            for sample in dinput.chunks_exact(f * d) {
                pos_grads.iter_mut().zip(sample).for_each(|(p, g)| *p += g);
            }
        }
        if let Some(dx) = dx[0].as_deref_mut() {
            dx.iter_mut().zip(&dinput).for_each(|(a, b)| *a += b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_args as args;
    use super::*;
    use crate::nn::layer::check_layer;

    #[test]
    fn self_attention_matches_finite_differences() {
        let settings = [
            r#"{"heads": 1, "activation": "identity"}"#,
            r#"{"heads": 2, "dim": 3, "scale": true, "activation": "identity"}"#,
            r#"{"heads": 2, "dim": 2, "residual": false, "positions": true, "activation": "tanh"}"#,
        ];
        for (n, json) in settings.iter().enumerate() {
            for (f, d, rows) in [(2, 2, 1), (3, 4, 2)] {
                let s = Shape { fields: f, dim: d };
                let layer = self_attention(&mut args(json), &[s]).unwrap();
                check_layer(layer.as_ref(), &[s], rows, (n * 10 + f) as u64)
                    .unwrap_or_else(|e| panic!("{json} {s}: {e}"));
            }
        }
    }

    #[test]
    fn xavier_starts_the_projections_glorot_uniform_or_normal_and_leaves_the_positions() {
        let s = Shape { fields: 4, dim: 10 };
        let json = r#"{"heads": 2, "dim": 8, "positions": true, "init": "xavier"}"#;
        let params = self_attention(&mut args(json), &[s]).unwrap().params();
        // 10 inputs, 16 outputs: sqrt(6 / 26); the default is 1 / sqrt(10).
        let glorot = Init::Uniform { scale: (6.0f32 / 26.0).sqrt() };
        assert!(params[..4].iter().all(|p| p.init == glorot), "{params:?}");
        assert_eq!(params[4].init, Init::Uniform { scale: 1.0 / 10f32.sqrt() });
        let default = self_attention(&mut args(r#"{"heads": 2, "dim": 8}"#), &[s]).unwrap().params();
        assert!(default.iter().all(|p| p.init == Init::Uniform { scale: 1.0 / 10f32.sqrt() }));
        assert!(self_attention(&mut args(r#"{"init": "zeros"}"#), &[s]).is_err());
        // Glorot-normal: the same variance, 2 / 26.
        let json = r#"{"heads": 2, "dim": 8, "init": "xavier_normal"}"#;
        let normal = self_attention(&mut args(json), &[s]).unwrap().params();
        assert!(normal.iter().all(|p| p.init == Init::Normal { std: (2.0f32 / 26.0).sqrt() }), "{normal:?}");
    }

    #[test]
    fn a_masked_key_gets_no_weight_and_the_gradient_still_checks() {
        let s = Shape { fields: 3, dim: 2 };
        let layer = self_attention(&mut args(r#"{"heads": 1, "residual": false}"#), &[s, Shape::flat(3)]).unwrap();
        // Values large in key 2 only: with key 2 masked the output cannot see them.
        let x = [0.1, 0.2, 0.3, 0.1, 50.0, 60.0];
        let identity = [1.0, 0.0, 0.0, 1.0];
        let params: Vec<f32> = [identity; 3].concat();
        let mut scratch = vec![0.0; layer.scratch()];
        let ctx = Ctx { rows: 1, train: false, seeds: &[] };
        let mut y = [0.0; 6];
        layer.forward(&ctx, &params, &[&x, &[1.0, 1.0, 0.0]], &mut y, &mut scratch);
        assert!(y.iter().all(|v| *v < 1.0), "the masked key leaked: {y:?}");
        layer.forward(&ctx, &params, &[&x, &[1.0, 1.0, 1.0]], &mut y, &mut scratch);
        assert!(y.iter().any(|v| *v > 10.0), "unmasked, key 2 dominates: {y:?}");
        check_layer(layer.as_ref(), &[s, Shape::flat(3)], 3, 5).unwrap();
    }

    #[test]
    fn self_attention_refuses_flat_inputs_and_bad_masks() {
        assert!(self_attention(&mut args("{}"), &[Shape::flat(6)]).unwrap_err().contains("F >= 2"));
        let e = self_attention(&mut args("{}"), &[Shape { fields: 3, dim: 2 }, Shape::flat(2)]).unwrap_err();
        assert!(e.contains("2 values for 3 vectors"), "{e}");
    }
}
