//! The `glu_gate` layer of `examples/custom_layer`: `y = x * sigmoid(x Wg + bg)`, each input value
//! scaled by a gate computed from the whole input. `tests/integration/models.rs` includes this
//! file to check its backward pass against finite differences.

use oar::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use oar::nn::{matmul, sigmoid};
use oar::table::{DenseParam, Init};

/// `y = x * sigmoid(x Wg + bg)` on a flat input of width `w`.
#[derive(Debug)]
struct Gate {
    w: usize,
}

/// The factory a job file's `type = "glu_gate"` calls: no settings, one input of any shape.
pub fn gate(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    match inputs {
        [x] => Ok(Box::new(Gate { w: x.size() })),
        _ => Err("takes one input".into()),
    }
}

impl Layer for Gate {
    fn output(&self) -> Shape {
        Shape::flat(self.w)
    }

    fn params(&self) -> Vec<DenseParam> {
        let scale = 1.0 / (self.w as f32).sqrt();
        vec![
            DenseParam::new("w", self.w * self.w, Init::Uniform { scale }),
            // Gates start half open and learn from there.
            DenseParam::new("b", self.w, Init::Zeros),
        ]
    }

    /// The gate values, kept for backward, plus a workspace.
    fn scratch(&self) -> usize {
        2 * self.w
    }

    fn forward(&self, ctx: &Ctx, p: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (w, n) = (self.w, ctx.rows);
        let gates = &mut scratch[..n * w];
        for r in 0..n {
            gates[r * w..(r + 1) * w].copy_from_slice(&p[w * w..]);
        }
        matmul(n, w, w, gates, true, x[0], (w, 1), &p[..w * w], (w, 1));
        gates.iter_mut().for_each(|g| *g = sigmoid(*g));
        y.iter_mut().zip(x[0].iter().zip(gates.iter())).for_each(|(y, (x, g))| *y = x * g);
    }

    fn backward(
        &self,
        ctx: &Ctx,
        p: &[f32],
        x: &[&[f32]],
        _y: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let (w, n) = (self.w, ctx.rows);
        let (gates, dz) = scratch.split_at_mut(n * w);
        let dz = &mut dz[..n * w];
        // y = x g, g = sigmoid(z): dz = dy x g (1 - g); dx gets dy g directly and dz Wg^T.
        for i in 0..n * w {
            dz[i] = dy[i] * x[0][i] * gates[i] * (1.0 - gates[i]);
        }
        matmul(w, w, n, &mut grads[..w * w], true, x[0], (1, w), dz, (w, 1));
        for r in 0..n {
            grads[w * w..].iter_mut().zip(&dz[r * w..(r + 1) * w]).for_each(|(g, d)| *g += d);
        }
        if let Some(dx) = dx[0].as_deref_mut() {
            dx.iter_mut().zip(dy.iter().zip(gates.iter())).for_each(|(d, (dy, g))| *d += dy * g);
            matmul(n, w, w, dx, true, dz, (w, 1), &p[..w * w], (1, w));
        }
    }
}
