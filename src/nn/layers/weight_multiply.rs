//! `weight_multiply`: each value of a flat input times its own learned vector, so numeric
//! features become fields beside the embeddings (DeepFM's dense features).

use super::dense::LinearInit;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::table::{DenseParam, Init};

/// `y[k] = x_k * W_k` for the `K` input values, `W` (`K x dim`) the parameter `w`, by default
/// uniform in +-0.05 like embeddings.
#[derive(Debug)]
pub struct WeightMultiplyLayer {
    values: usize,
    dim: usize,
    init: Init,
}

/// The default initial half-width of `w`: the embeddings' default, since the output sits
/// beside them.
const INIT_SCALE: f32 = 0.05;

/// `weight_multiply`: `dim` (required), `init = "uniform"` (+-0.05) or, each value's vector
/// taken as a 1 x `dim` linear map, `"xavier"` or `"xavier_normal"` (FuxiCTR's numeric
/// fields, an `nn.Linear(1, dim)` its model starts Glorot-normal); one input of any shape,
/// read as its `K` values -> `(K, dim)`.
pub fn weight_multiply(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let dim = args.required_usize("dim")?;
    let init = match LinearInit::parse_hidden(args)? {
        LinearInit::Uniform => Init::Uniform { scale: INIT_SCALE },
        other => other.of(1, dim).0,
    };
    args.finish()?;
    let [input] = inputs else { return Err(format!("takes one input, got {}", inputs.len())) };
    if dim == 0 {
        return Err("dim must be positive".into());
    }
    if input.size() == 0 {
        return Err("input is empty".into());
    }
    Ok(Box::new(WeightMultiplyLayer { values: input.size(), dim, init }))
}

impl Layer for WeightMultiplyLayer {
    fn output(&self) -> Shape {
        Shape { fields: self.values, dim: self.dim }
    }

    fn params(&self) -> Vec<DenseParam> {
        vec![DenseParam::new("w", self.values * self.dim, self.init)]
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        let (k, d) = (self.values, self.dim);
        let w = &params[..k * d];
        for r in 0..ctx.rows {
            let out = &mut y[r * k * d..(r + 1) * k * d];
            for ((o, wk), xk) in out.chunks_exact_mut(d).zip(w.chunks_exact(d)).zip(&x[0][r * k..(r + 1) * k]) {
                o.iter_mut().zip(wk).for_each(|(o, w)| *o = xk * w);
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        let (k, d) = (self.values, self.dim);
        let w = g.floats("w", &[k, d], &params[..k * d]);
        let values = g.reshape(x[0], &[-1, k as i64, 1]);
        let m = g.op("Mul", &[&values, &w], Vec::new());
        let out = g.reshape(&m, &[-1, (k * d) as i64]);
        g.identity(&out, y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        params: &[f32],
        x: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        _: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let (k, d) = (self.values, self.dim);
        // dW_k += sum_r x_rk dy_rk; dx_rk += dy_rk . W_k.
        let (w, gw) = (&params[..k * d], &mut grads[..k * d]);
        let mut dx = dx[0].as_deref_mut();
        for r in 0..ctx.rows {
            let g = &dy[r * k * d..(r + 1) * k * d];
            for (j, (gk, wk)) in g.chunks_exact(d).zip(w.chunks_exact(d)).enumerate() {
                let xk = x[0][r * k + j];
                gw[j * d..(j + 1) * d].iter_mut().zip(gk).for_each(|(a, b)| *a += xk * b);
                if let Some(dx) = dx.as_deref_mut() {
                    dx[r * k + j] += gk.iter().zip(wk).map(|(a, b)| a * b).sum::<f32>();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::layer::check_layer;

    use super::super::test_args as args;

    #[test]
    fn weight_multiply_matches_finite_differences() {
        for (json, shape, rows) in [
            (r#"{"dim": 1}"#, Shape::flat(1), 1),
            (r#"{"dim": 4}"#, Shape::flat(3), 2),
            (r#"{"dim": 2}"#, Shape { fields: 2, dim: 3 }, 4),
            (r#"{"dim": 5}"#, Shape::flat(2), 3),
        ] {
            let layer = weight_multiply(&mut args(json), &[shape]).unwrap();
            let dim = serde_json::from_str::<serde_json::Value>(json).unwrap()["dim"].as_u64().unwrap() as usize;
            assert_eq!(layer.output(), Shape { fields: shape.size(), dim });
            check_layer(layer.as_ref(), &[shape], rows, 17).unwrap_or_else(|e| panic!("{json} on {shape}: {e}"));
        }
    }

    #[test]
    fn weight_multiply_values() {
        let layer = weight_multiply(&mut args(r#"{"dim": 2}"#), &[Shape::flat(2)]).unwrap();
        let p = layer.params();
        assert_eq!((p[0].name.as_str(), p[0].len, p[0].init), ("w", 4, Init::Uniform { scale: 0.05 }));
        let w = [1.0f32, 2.0, -1.0, 0.5];
        let x = [3.0f32, 2.0, 0.0, -1.0];
        let mut y = [0.0; 8];
        layer.forward(&Ctx { rows: 2, train: false, seeds: &[0, 0] }, &w, &[&x], &mut y, &mut []);
        assert_eq!(y, [3.0, 6.0, -2.0, 1.0, 0.0, 0.0, 1.0, -0.5]);
        // Each value's vector as a 1 x dim map: Glorot's variance 2 / (1 + dim).
        let normal = weight_multiply(&mut args(r#"{"dim": 10, "init": "xavier_normal"}"#), &[Shape::flat(2)]).unwrap();
        assert_eq!(normal.params()[0].init, Init::Normal { std: (2.0f32 / 11.0).sqrt() });
        let uniform = weight_multiply(&mut args(r#"{"dim": 2, "init": "xavier"}"#), &[Shape::flat(2)]).unwrap();
        assert_eq!(uniform.params()[0].init, Init::Uniform { scale: 2.0f32.sqrt() });
    }

    #[test]
    fn weight_multiply_refuses_bad_settings() {
        let flat = [Shape::flat(3)];
        assert!(weight_multiply(&mut args("{}"), &flat).unwrap_err().contains("needs dim"));
        assert!(weight_multiply(&mut args(r#"{"dim": 0}"#), &flat).unwrap_err().contains("dim must be positive"));
        assert!(weight_multiply(&mut args(r#"{"dim": 2.5}"#), &flat)
            .unwrap_err()
            .contains("dim must be a whole number"));
        assert!(weight_multiply(&mut args(r#"{"dim": 2, "bias": true}"#), &flat)
            .unwrap_err()
            .contains("unknown setting(s) bias"));
        assert!(weight_multiply(&mut args(r#"{"dim": 2, "init": "zeros"}"#), &flat)
            .unwrap_err()
            .contains("init must be"));
        assert!(weight_multiply(&mut args(r#"{"dim": 2}"#), &[flat[0], flat[0]])
            .unwrap_err()
            .contains("takes one input"));
    }
}
