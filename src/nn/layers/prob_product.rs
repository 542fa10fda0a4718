//! `prob_product`: the logit of a product of two probabilities, ESMM's CTCVR head.
//!
//! ESMM trains the click-through rate `pCTR = sigmoid(a)` on every impression and the
//! conversion rate `pCVR = sigmoid(b)` only through their product `pCTCVR = pCTR * pCVR`,
//! whose label (clicked and converted) is known on every impression too. oar's heads take
//! logits, so this layer outputs `logit(pCTCVR)` and a `log_loss` head on it trains exactly
//! ESMM's CTCVR loss; the CVR tower's own probability is `sigmoid(b)`.

use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::sigmoid;

/// The smallest `1 - p` used: keeps the logit finite when the product is 1 to f32 precision.
const MIN_COMPLEMENT: f32 = 1e-7;

/// `y = ln p - ln(1 - p)` with `p = sigmoid(a) sigmoid(b)`. Backward:
/// `dy/da = sigmoid(-a) / (1 - p)` (and likewise for `b`).
#[derive(Debug)]
pub struct ProbProductLayer;

/// `prob_product`: no settings; two inputs of width 1 (logits) -> 1 (a logit).
pub fn prob_product(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    match inputs {
        [a, b] if a.size() == 1 && b.size() == 1 => Ok(Box::new(ProbProductLayer)),
        [a, b] => Err(format!("takes two logits (width 1), got widths {} and {}", a.size(), b.size())),
        _ => Err(format!("takes two inputs (the CTR and the CVR logits), got {}", inputs.len())),
    }
}

/// `(ln p, 1 - p)` of `p = sigmoid(a) sigmoid(b)`, in a form stable for large `|a|`, `|b|`.
fn product(a: f32, b: f32) -> (f32, f32) {
    // ln sigmoid(z) = -softplus(-z).
    let ln_sigmoid = |z: f32| -((-z).max(0.0) + (-z.abs()).exp().ln_1p());
    let ln_p = ln_sigmoid(a) + ln_sigmoid(b);
    (ln_p, (-ln_p.exp_m1()).max(MIN_COMPLEMENT))
}

impl Layer for ProbProductLayer {
    fn output(&self) -> Shape {
        Shape::flat(1)
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        for r in 0..ctx.rows {
            let (ln_p, complement) = product(x[0][r], x[1][r]);
            y[r] = ln_p - complement.ln();
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        let a = g.op("Sigmoid", &[x[0]], Vec::new());
        let b = g.op("Sigmoid", &[x[1]], Vec::new());
        let p = g.op("Mul", &[&a, &b], Vec::new());
        let one = g.scalar("one", 1.0);
        let c = g.op("Sub", &[&one, &p], Vec::new());
        let floor = g.scalar("min_complement", MIN_COMPLEMENT);
        let c = g.op("Max", &[&c, &floor], Vec::new());
        let ln_p = g.op("Log", &[&p], Vec::new());
        let ln_c = g.op("Log", &[&c], Vec::new());
        g.op_to("Sub", &[&ln_p, &ln_c], Vec::new(), y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        _: &[f32],
        x: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        _: &mut [f32],
        _: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        for r in 0..ctx.rows {
            let (_, complement) = product(x[0][r], x[1][r]);
            for (i, d) in dx.iter_mut().enumerate() {
                if let Some(d) = d.as_deref_mut() {
                    d[r] += dy[r] * sigmoid(-x[i][r]) / complement;
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
    fn prob_product_matches_finite_differences() {
        let s = [Shape::flat(1), Shape::flat(1)];
        let layer = prob_product(&mut args("{}"), &s).unwrap();
        for seed in 0..4 {
            check_layer(layer.as_ref(), &s, 6, seed).unwrap();
        }
    }

    #[test]
    fn its_sigmoid_is_the_product_of_the_probabilities() {
        let layer = prob_product(&mut args("{}"), &[Shape::flat(1), Shape::flat(1)]).unwrap();
        let (a, b) = ([0.3f32, -4.0, 30.0, -60.0], [1.2f32, 2.0, 30.0, 5.0]);
        let mut y = [0.0; 4];
        layer.forward(&Ctx { rows: 4, train: false, seeds: &[] }, &[], &[&a, &b], &mut y, &mut []);
        for r in 0..4 {
            let want = sigmoid(a[r]) as f64 * sigmoid(b[r]) as f64;
            assert!(y[r].is_finite(), "row {r}: {}", y[r]);
            assert!(
                (sigmoid(y[r]) as f64 - want).abs() < 1e-6 * want.max(1e-3),
                "row {r}: {} vs {want}",
                sigmoid(y[r])
            );
        }
    }

    #[test]
    fn prob_product_refuses_wide_inputs() {
        let e = prob_product(&mut args("{}"), &[Shape::flat(2), Shape::flat(1)]).unwrap_err();
        assert!(e.contains("widths 2 and 1"), "{e}");
        assert!(prob_product(&mut args("{}"), &[Shape::flat(1)]).unwrap_err().contains("two inputs"));
    }
}
