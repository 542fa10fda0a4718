//! `layer_norm`: layer normalization over each field's vector (or a flat input's values).

use super::one_input;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::table::{DenseParam, Init};

/// `y = gain * (x - mean) / sqrt(var + eps) + bias`, mean and (biased) variance over each
/// vector's `D` values; `gain` (starting at 1) and `bias` (at 0) have `D` values, shared by the
/// fields, as PyTorch's `LayerNorm(D)` on a `(B, F, D)` tensor.
#[derive(Debug)]
pub struct LayerNormLayer {
    input: Shape,
    eps: f32,
}

/// `layer_norm`: `eps = 1e-5`; any input -> the same shape.
pub fn layer_norm(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let eps = args.f32("eps")?.unwrap_or(1e-5);
    args.finish()?;
    let input = one_input(inputs)?;
    if !(eps > 0.0 && eps.is_finite()) {
        return Err(format!("eps must be positive, got {eps}"));
    }
    if input.dim < 2 {
        return Err(format!("normalizes vectors of 2 or more values, got {input}"));
    }
    Ok(Box::new(LayerNormLayer { input, eps }))
}

impl Layer for LayerNormLayer {
    fn output(&self) -> Shape {
        self.input
    }

    fn params(&self) -> Vec<DenseParam> {
        let d = self.input.dim;
        vec![DenseParam::new("gain", d, Init::Constant { value: 1.0 }), DenseParam::new("bias", d, Init::Zeros)]
    }

    /// Each vector's normalized values, then its inverse standard deviation.
    fn scratch(&self) -> usize {
        self.input.size() + self.input.fields
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let d = self.input.dim;
        let n = ctx.rows * self.input.fields;
        let (gain, bias) = params.split_at(d);
        let (normed, inv_std) = scratch.split_at_mut(n * d);
        for v in 0..n {
            let xs = &x[0][v * d..(v + 1) * d];
            let mean = xs.iter().sum::<f32>() / d as f32;
            let var = xs.iter().map(|a| (a - mean) * (a - mean)).sum::<f32>() / d as f32;
            let inv = 1.0 / (var + self.eps).sqrt();
            inv_std[v] = inv;
            for k in 0..d {
                let h = (xs[k] - mean) * inv;
                normed[v * d + k] = h;
                y[v * d + k] = gain[k] * h + bias[k];
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        let (f, d) = (self.input.fields as i64, self.input.dim);
        let v = g.reshape(x[0], &[-1, f, d as i64]);
        let gain = g.floats("gain", &[d], &params[..d]);
        let bias = g.floats("bias", &[d], &params[d..2 * d]);
        let attrs = vec![Attr::Int("axis", -1), Attr::Float("epsilon", self.eps)];
        let out = g.op("LayerNormalization", &[&v, &gain, &bias], attrs);
        g.reshape_to(&out, &[-1, f * d as i64], y);
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
        let d = self.input.dim;
        let n = ctx.rows * self.input.fields;
        let gain = &params[..d];
        let (normed, inv_std) = scratch.split_at(n * d);
        let (dgain, dbias) = grads.split_at_mut(d);
        let mut dx = dx[0].as_deref_mut();
        for v in 0..n {
            let h = &normed[v * d..(v + 1) * d];
            let g = &dy[v * d..(v + 1) * d];
            for k in 0..d {
                dgain[k] += g[k] * h[k];
                dbias[k] += g[k];
            }
            if let Some(dx) = dx.as_deref_mut() {
                // dx = inv/D * (D dh - sum dh - h sum(dh h)), dh = dy * gain.
                let (mut sum, mut dot) = (0.0f32, 0.0f32);
                for k in 0..d {
                    let dh = g[k] * gain[k];
                    sum += dh;
                    dot += dh * h[k];
                }
                let scale = inv_std[v] / d as f32;
                for k in 0..d {
                    dx[v * d + k] += scale * (d as f32 * g[k] * gain[k] - sum - h[k] * dot);
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

    #[test]
    fn layer_norm_matches_finite_differences() {
        for (f, d, rows) in [(1, 2, 1), (3, 4, 2), (1, 7, 3)] {
            let s = Shape { fields: f, dim: d };
            let layer = layer_norm(&mut args("{}"), &[s]).unwrap();
            check_layer(layer.as_ref(), &[s], rows, d as u64).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }

    #[test]
    fn each_vector_comes_out_with_mean_zero_and_unit_variance() {
        let s = Shape { fields: 2, dim: 4 };
        let layer = layer_norm(&mut args("{}"), &[s]).unwrap();
        let params = [1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0];
        let x = [1.0, 2.0, 3.0, 4.0, -10.0, 0.0, 10.0, 40.0];
        let mut y = [0.0; 8];
        let mut scratch = vec![0.0; layer.scratch()];
        layer.forward(&Ctx { rows: 1, train: false, seeds: &[] }, &params, &[&x], &mut y, &mut scratch);
        for v in y.chunks(4) {
            let mean = v.iter().sum::<f32>() / 4.0;
            let var = v.iter().map(|a| (a - mean) * (a - mean)).sum::<f32>() / 4.0;
            assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-3, "{v:?}");
        }
    }

    #[test]
    fn layer_norm_refuses_single_values_and_bad_eps() {
        assert!(layer_norm(&mut args("{}"), &[Shape { fields: 3, dim: 1 }]).unwrap_err().contains("2 or more"));
        assert!(layer_norm(&mut args(r#"{"eps": 0}"#), &[Shape::flat(4)]).unwrap_err().contains("eps"));
    }
}
