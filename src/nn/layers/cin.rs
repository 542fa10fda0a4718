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

impl CinLayer {
    /// Vectors feeding layer `k` (the previous layer's, or the input's for the first).
    fn before(&self, k: usize) -> usize {
        if k == 0 {
            self.input.fields
        } else {
            self.layers[k - 1]
        }
    }

    /// Per sample, where layer `k`'s products `Z` and outputs `X` start in the scratch.
    fn offsets(&self, k: usize) -> (usize, usize) {
        let (f, d) = (self.input.fields, self.input.dim);
        let mut at = 0;
        for l in 0..k {
            at += self.before(l) * f * d + self.layers[l] * d;
        }
        (at, at + self.before(k) * f * d)
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
        self.offsets(self.layers.len()).0
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (f, d) = (self.input.fields, self.input.dim);
        let (per, out) = (self.scratch(), self.output().size());
        for r in 0..ctx.rows {
            let x0 = &x[0][r * f * d..(r + 1) * f * d];
            let s = &mut scratch[r * per..(r + 1) * per];
            let (mut p, mut pooled) = (0, 0);
            for (k, &h) in self.layers.iter().enumerate() {
                let (hp, (z_at, x_at)) = (self.before(k), self.offsets(k));
                let prev_at = (k > 0).then(|| self.offsets(k - 1).1);
                for i in 0..hp {
                    for j in 0..f {
                        for t in 0..d {
                            let prev = match prev_at {
                                None => x0[i * d + t],
                                Some(at) => s[at + i * d + t],
                            };
                            s[z_at + (i * f + j) * d + t] = prev * x0[j * d + t];
                        }
                    }
                }
                let (w, b) = (&params[p..p + h * hp * f], &params[p + h * hp * f..p + h * hp * f + h]);
                p += h * hp * f + h;
                let (zs, xs) = s.split_at_mut(x_at);
                let xk = &mut xs[..h * d];
                matmul(h, d, hp * f, xk, false, w, (hp * f, 1), &zs[z_at..], (d, 1));
                for (o, row) in xk.chunks_exact_mut(d).enumerate() {
                    row.iter_mut().for_each(|v| *v += b[o]);
                    y[r * out + pooled + o] = row.iter().sum();
                }
                pooled += h;
            }
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
        x: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let (f, d) = (self.input.fields, self.input.dim);
        let (per, out) = (self.scratch(), self.output().size());
        let widest = self.layers.iter().chain([&f]).max().copied().unwrap_or(f);
        let mut dz = vec![0.0f32; widest * f * d];
        let (mut dxk, mut dprev) = (vec![0.0f32; widest * d], vec![0.0f32; widest * d]);
        let mut dx0 = vec![0.0f32; f * d];
        // Each layer's parameter offset.
        let mut starts = Vec::new();
        let mut p = 0;
        for (k, &h) in self.layers.iter().enumerate() {
            starts.push(p);
            p += h * self.before(k) * f + h;
        }
        let pooled_at: Vec<usize> = self.layers.iter().scan(0, |a, &h| Some(std::mem::replace(a, *a + h))).collect();
        for r in 0..ctx.rows {
            let x0 = &x[0][r * f * d..(r + 1) * f * d];
            let s = &scratch[r * per..(r + 1) * per];
            dx0.fill(0.0);
            let mut carried = false;
            for k in (0..self.layers.len()).rev() {
                let (h, hp, (z_at, _)) = (self.layers[k], self.before(k), self.offsets(k));
                // dX_k: the pooled output's gradient on every value, plus what layer k+1 sent.
                for o in 0..h {
                    let g = dy[r * out + pooled_at[k] + o];
                    for t in 0..d {
                        dxk[o * d + t] = g + if carried { dprev[o * d + t] } else { 0.0 };
                    }
                }
                let p = starts[k];
                let (w, (dw, rest)) = (&params[p..p + h * hp * f], grads[p..].split_at_mut(h * hp * f));
                let z = &s[z_at..z_at + hp * f * d];
                matmul(h, hp * f, d, dw, true, &dxk, (d, 1), z, (1, d));
                for o in 0..h {
                    rest[o] += dxk[o * d..(o + 1) * d].iter().sum::<f32>();
                }
                matmul(hp * f, d, h, &mut dz, false, w, (1, hp * f), &dxk, (d, 1));
                // Z[i F + j] = prev[i] * x0[j].
                dprev[..hp * d].fill(0.0);
                let prev = match k {
                    0 => x0,
                    _ => &s[self.offsets(k - 1).1..][..hp * d],
                };
                for i in 0..hp {
                    for j in 0..f {
                        for t in 0..d {
                            let g = dz[(i * f + j) * d + t];
                            let prev = prev[i * d + t];
                            dprev[i * d + t] += g * x0[j * d + t];
                            dx0[j * d + t] += g * prev;
                        }
                    }
                }
                carried = true;
            }
            // Layer 0's `prev` was the input itself.
            dx0.iter_mut().zip(&dprev[..f * d]).for_each(|(a, b)| *a += b);
            if let Some(dx) = dx[0].as_deref_mut() {
                dx[r * f * d..(r + 1) * f * d].iter_mut().zip(&dx0).for_each(|(a, b)| *a += b);
            }
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
