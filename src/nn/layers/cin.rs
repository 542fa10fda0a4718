//! `cin`: xDeepFM's compressed interaction network, explicit vector-wise feature crosses of
//! rising order.

use super::one_input;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::matmul;
use crate::table::{DenseParam, Init};

/// Layer `k` maps the previous layer's `H` vectors and the input's `F` vectors to `H_k`
/// vectors: `X_k[h] = sum_{i, j} W_k[h, i F + j] (X_{k-1}[i] * X_0[j]) + b_k[h]` (element-wise
/// products of `D`-vectors; a 1x1 convolution over the `H F` products, as FuxiCTR's CIN), with
/// no activation. The output is every layer's vectors summed over `D`, concatenated: one
/// value per feature map, `sum H_k` in all (followed by a `linear` to a logit in xDeepFM).
#[derive(Debug)]
pub struct CinLayer {
    input: Shape,
    layers: Vec<usize>,
}

/// `cin`: `layers = [H_1, H_2, ...]` (feature maps per layer, required); one field tensor
/// `(F, D)` -> `sum H_k`.
pub fn cin(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let layers = args.usize_list("layers")?.ok_or("needs layers, the feature maps of each layer, e.g. [16, 16]")?;
    args.finish()?;
    let input = one_input(inputs)?;
    if input.fields < 2 {
        return Err(format!("needs a field tensor (F x D) with F >= 2, got {input}"));
    }
    if layers.is_empty() || layers.contains(&0) {
        return Err("layers must be a non-empty list of positive widths".into());
    }
    Ok(Box::new(CinLayer { input, layers }))
}

/// Where each part of the scratch starts, in floats a sample. A part of `n` floats a sample
/// that starts at `at` takes `rows * n` floats from `rows * at`: the batch's rows lie together,
/// one row per (sample, position in `D`), so a layer's product over the whole batch is one
/// matrix product (DeepCTR's and FuxiCTR's 1x1 convolution) instead of one small product per
/// sample. Those ran at half the reference BLAS's speed (`oar bench --roofline --model
/// xDeepFM`), their `D` columns too few for the kernel's tiles.
struct Parts {
    /// Layer `k`'s products `Z_k` (`H_{k-1} F` a row) and outputs `X_k` (`H_k` a row); the
    /// input's vectors transposed (`F` a row) start at 0.
    z: Vec<usize>,
    x: Vec<usize>,
    /// The backward pass's work: a layer's output gradient, the gradient it sends to the layer
    /// before (each as wide as the widest layer or the input), and the input's (`F` a row).
    dx: usize,
    dprev: usize,
    dx0: usize,
    total: usize,
}

impl CinLayer {
    /// Vectors feeding layer `k` (the previous layer's, or the input's for the first).
    fn before(&self, k: usize) -> usize {
        if k == 0 {
            self.input.fields
        } else {
            self.layers[k - 1]
        }
    }

    fn parts(&self) -> Parts {
        let (f, d) = (self.input.fields, self.input.dim);
        let widest = self.layers.iter().copied().chain([f]).max().unwrap_or(f);
        let (mut z, mut x, mut at) = (Vec::new(), Vec::new(), d * f);
        for (k, &h) in self.layers.iter().enumerate() {
            z.push(at);
            at += d * self.before(k) * f;
            x.push(at);
            at += d * h;
        }
        let (dx, dprev, dx0) = (at, at + d * widest, at + 2 * d * widest);
        Parts { z, x, dx, dprev, dx0, total: dx0 + d * f }
    }

    /// Each layer's offset in the parameters (its weights, then its bias).
    fn param_starts(&self) -> Vec<usize> {
        let f = self.input.fields;
        let mut starts = Vec::new();
        let mut p = 0;
        for (k, &h) in self.layers.iter().enumerate() {
            starts.push(p);
            p += h * self.before(k) * f + h;
        }
        starts
    }
}

impl Layer for CinLayer {
    fn output(&self) -> Shape {
        Shape::flat(self.layers.iter().sum())
    }

    fn params(&self) -> Vec<DenseParam> {
        let f = self.input.fields;
        let mut p = Vec::new();
        for (k, &h) in self.layers.iter().enumerate() {
            let fan_in = self.before(k) * f;
            let init = Init::Uniform { scale: 1.0 / (fan_in as f32).sqrt() };
            p.push(DenseParam::new(format!("{k}.w"), h * fan_in, init));
            p.push(DenseParam::new(format!("{k}.b"), h, init));
        }
        p
    }

    fn scratch(&self) -> usize {
        self.parts().total
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (f, d, rows) = (self.input.fields, self.input.dim, ctx.rows);
        let (parts, out, n) = (self.parts(), self.output().size(), ctx.rows * self.input.dim);
        // The input's vectors transposed: row (r D + t) holds sample r's F values at position t.
        let x0t = &mut scratch[..n * f];
        for r in 0..rows {
            for j in 0..f {
                for t in 0..d {
                    x0t[(r * d + t) * f + j] = x[0][(r * f + j) * d + t];
                }
            }
        }
        let starts = self.param_starts();
        let mut pooled = 0;
        for (k, &h) in self.layers.iter().enumerate() {
            let (hp, p) = (self.before(k), starts[k]);
            let width = hp * f;
            let (done, rest) = scratch.split_at_mut(rows * parts.z[k]);
            let (zk, rest) = rest.split_at_mut(n * width);
            let xk = &mut rest[..n * h];
            let x0t = &done[..n * f];
            let prev = if k == 0 { x0t } else { &done[rows * parts.x[k - 1]..][..n * hp] };
            // Z[i F + j] = prev[i] * x0[j], position by position.
            for c in 0..n {
                let (x0c, zc) = (&x0t[c * f..(c + 1) * f], &mut zk[c * width..(c + 1) * width]);
                for (i, zi) in zc.chunks_exact_mut(f).enumerate() {
                    let v = prev[c * hp + i];
                    zi.iter_mut().zip(x0c).for_each(|(z, x)| *z = v * x);
                }
            }
            let (w, b) = (&params[p..p + h * width], &params[p + h * width..p + h * width + h]);
            xk.chunks_exact_mut(h).for_each(|row| row.copy_from_slice(b));
            matmul(n, h, width, xk, true, zk, (width, 1), w, (1, width));
            for r in 0..rows {
                let yr = &mut y[r * out + pooled..r * out + pooled + h];
                yr.fill(0.0);
                for xc in xk[r * d * h..(r + 1) * d * h].chunks_exact(h) {
                    yr.iter_mut().zip(xc).for_each(|(a, v)| *a += v);
                }
            }
            pooled += h;
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        let (f, d) = (self.input.fields, self.input.dim);
        let x0 = g.reshape(x[0], &[-1, f as i64, d as i64]);
        let (mut prev, mut p, mut pooled) = (x0.clone(), 0, Vec::new());
        for (k, &h) in self.layers.iter().enumerate() {
            let hp = self.before(k);
            let z = g.op("Einsum", &[&prev, &x0], vec![Attr::Str("equation", "nid,njd->nijd".into())]);
            let z = g.reshape(&z, &[-1, (hp * f) as i64, d as i64]);
            let w = g.floats("w", &[h, hp * f], &params[p..p + h * hp * f]);
            let b = g.floats("b", &[h, 1], &params[p + h * hp * f..p + h * hp * f + h]);
            p += h * hp * f + h;
            let xk = g.op("Einsum", &[&w, &z], vec![Attr::Str("equation", "hc,ncd->nhd".into())]);
            let xk = g.op("Add", &[&xk, &b], Vec::new());
            pooled.push(g.reduce_sum(&xk, &[2], false));
            prev = xk;
        }
        let refs: Vec<&str> = pooled.iter().map(String::as_str).collect();
        g.op_to("Concat", &refs, vec![Attr::Int("axis", 1)], y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        params: &[f32],
        _: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let (f, d, rows) = (self.input.fields, self.input.dim, ctx.rows);
        let (parts, out, n) = (self.parts(), self.output().size(), ctx.rows * self.input.dim);
        let starts = self.param_starts();
        let (kept, work) = scratch.split_at_mut(rows * parts.dx);
        let (dxk_all, work) = work.split_at_mut(rows * (parts.dprev - parts.dx));
        let (dprev_all, dx0t) = work.split_at_mut(rows * (parts.dx0 - parts.dprev));
        let dx0t = &mut dx0t[..n * f];
        dx0t.fill(0.0);
        let pooled_at: Vec<usize> = self.layers.iter().scan(0, |a, &h| Some(std::mem::replace(a, *a + h))).collect();
        for k in (0..self.layers.len()).rev() {
            let (h, hp, p) = (self.layers[k], self.before(k), starts[k]);
            let width = hp * f;
            // dX_k: the pooled output's gradient at every position, plus what layer k+1 sent.
            let dxk = &mut dxk_all[..n * h];
            for (c, row) in dxk.chunks_exact_mut(h).enumerate() {
                row.copy_from_slice(&dy[(c / d) * out + pooled_at[k]..][..h]);
                if k + 1 < self.layers.len() {
                    row.iter_mut().zip(&dprev_all[c * h..(c + 1) * h]).for_each(|(a, g)| *a += g);
                }
            }
            let (w, (dw, db)) = (&params[p..p + h * width], grads[p..].split_at_mut(h * width));
            let (done, rest) = kept.split_at_mut(rows * parts.z[k]);
            let zk = &mut rest[..n * width];
            matmul(h, width, n, dw, true, dxk, (1, h), zk, (width, 1));
            for row in dxk.chunks_exact(h) {
                db[..h].iter_mut().zip(row).for_each(|(a, g)| *a += g);
            }
            // dZ_k takes Z_k's place: nothing reads Z_k after its weights' gradient.
            matmul(n, width, h, zk, false, dxk, (h, 1), w, (width, 1));
            let x0t = &done[..n * f];
            let prev = if k == 0 { x0t } else { &done[rows * parts.x[k - 1]..][..n * hp] };
            spread(zk, prev, x0t, &mut dprev_all[..n * hp], dx0t, (hp, f));
        }
        // Layer 0's `prev` was the input itself.
        dx0t.iter_mut().zip(&dprev_all[..n * f]).for_each(|(a, g)| *a += g);
        if let Some(dx) = dx[0].as_deref_mut() {
            for r in 0..rows {
                for j in 0..f {
                    for t in 0..d {
                        dx[(r * f + j) * d + t] += dx0t[(r * d + t) * f + j];
                    }
                }
            }
        }
    }
}

/// A layer's product gradients `dz` (a row of `hp f` per position) through `Z[i f + j] =
/// prev[i] * x0[j]`: sets `dprev` (the layer before's output gradient, `hp` a row) and adds into
/// `dx0t` (the input's, transposed, `f` a row).
fn spread(dz: &[f32], prev: &[f32], x0t: &[f32], dprev: &mut [f32], dx0t: &mut [f32], (hp, f): (usize, usize)) {
    let width = hp * f;
    for c in 0..x0t.len() / f {
        let (x0c, dx0c) = (&x0t[c * f..(c + 1) * f], &mut dx0t[c * f..(c + 1) * f]);
        for (i, g) in dz[c * width..(c + 1) * width].chunks_exact(f).enumerate() {
            let v = prev[c * hp + i];
            dprev[c * hp + i] = g.iter().zip(x0c).map(|(g, x)| g * x).sum();
            dx0c.iter_mut().zip(g).for_each(|(a, g)| *a += g * v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_args as args;
    use super::*;
    use crate::nn::layer::check_layer;

    #[test]
    fn cin_matches_finite_differences() {
        for (f, d, layers, rows) in [(2, 1, "[1]", 1), (3, 2, "[2, 3]", 2), (4, 3, "[3, 2, 2]", 2)] {
            let s = Shape { fields: f, dim: d };
            let layer = cin(&mut args(&format!(r#"{{"layers": {layers}}}"#)), &[s]).unwrap();
            check_layer(layer.as_ref(), &[s], rows, f as u64).unwrap_or_else(|e| panic!("{s} {layers}: {e}"));
        }
    }

    #[test]
    fn a_first_layer_is_a_weighted_sum_of_pairwise_products() {
        // F = 2, D = 1, one map with weights on (0,0), (0,1), (1,0), (1,1) and bias 0.5.
        let layer = cin(&mut args(r#"{"layers": [1]}"#), &[Shape { fields: 2, dim: 1 }]).unwrap();
        let params = [1.0, 2.0, 3.0, 4.0, 0.5];
        let mut y = [0.0];
        let mut scratch = vec![0.0; layer.scratch()];
        layer.forward(&Ctx { rows: 1, train: false, seeds: &[] }, &params, &[&[2.0, 3.0]], &mut y, &mut scratch);
        assert_eq!(y[0], 4.0 + 2.0 * 6.0 + 3.0 * 6.0 + 4.0 * 9.0 + 0.5);
    }

    #[test]
    fn cin_needs_its_layers_and_fields() {
        let s = Shape { fields: 3, dim: 2 };
        assert!(cin(&mut args("{}"), &[s]).unwrap_err().contains("needs layers"));
        assert!(cin(&mut args(r#"{"layers": [0]}"#), &[s]).unwrap_err().contains("positive"));
        assert!(cin(&mut args(r#"{"layers": [2]}"#), &[Shape::flat(6)]).unwrap_err().contains("F >= 2"));
    }
}
