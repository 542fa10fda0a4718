//! `mixture`: experts weighted by a softmax gate, the building block of MMoE and PLE.
//!
//! A multi-gate mixture of experts is written with the layers around it: each expert is an
//! `mlp` (output `D`), a `concat` stacks the experts into an `(E, D)` field tensor, each task's
//! gate is a `linear` with `out = E` over the shared input, and a `mixture` per task mixes the
//! stack with its gate. PLE's extraction layers are the same with each task's stack holding its
//! own experts and the shared ones.

use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};

/// `y = sum_e softmax(g)_e x_e` for experts `x` `(E, D)` and gate logits `g` (`E`).
/// Backward: `dx_e = p_e dy`, `dg_e = p_e (<dy, x_e> - sum_k p_k <dy, x_k>)`.
#[derive(Debug)]
pub struct MixtureLayer {
    experts: usize,
    dim: usize,
}

/// `mixture`: no settings; inputs the experts `(E, D)` (a `concat` of `E` outputs of width
/// `D`) then the gate's logits (`E`) -> `D`.
pub fn mixture(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    let [experts, gate] = inputs else {
        return Err(format!("takes two inputs, the experts (E x D) and the gate (E), got {}", inputs.len()));
    };
    if experts.fields < 2 {
        return Err(format!(
            "the experts must be a field tensor (E x D) with E >= 2, a concat of the experts' outputs; got {experts}"
        ));
    }
    if gate.size() != experts.fields {
        return Err(format!("the gate has {} logits for {} experts", gate.size(), experts.fields));
    }
    Ok(Box::new(MixtureLayer { experts: experts.fields, dim: experts.dim }))
}

impl Layer for MixtureLayer {
    fn output(&self) -> Shape {
        Shape::flat(self.dim)
    }

    /// The gate's probabilities.
    fn scratch(&self) -> usize {
        self.experts
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (e, d) = (self.experts, self.dim);
        for r in 0..ctx.rows {
            let p = &mut scratch[r * e..(r + 1) * e];
            p.copy_from_slice(&x[1][r * e..(r + 1) * e]);
            crate::nn::softmax(p);
            let out = &mut y[r * d..(r + 1) * d];
            out.fill(0.0);
            for (k, expert) in x[0][r * e * d..(r + 1) * e * d].chunks_exact(d).enumerate() {
                out.iter_mut().zip(expert).for_each(|(o, v)| *o += p[k] * v);
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        let (e, d) = (self.experts as i64, self.dim as i64);
        let p = g.op("Softmax", &[x[1]], vec![Attr::Int("axis", -1)]);
        let p = g.reshape(&p, &[-1, e, 1]);
        let experts = g.reshape(x[0], &[-1, e, d]);
        let weighted = g.op("Mul", &[&experts, &p], Vec::new());
        let sum = g.reduce_sum(&weighted, &[1], false);
        g.identity(&sum, y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        _: &[f32],
        x: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        _: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let (e, d) = (self.experts, self.dim);
        let [dexperts, dgate] = dx else { unreachable!("mixture has two inputs") };
        for r in 0..ctx.rows {
            let p = &scratch[r * e..(r + 1) * e];
            let g = &dy[r * d..(r + 1) * d];
            let experts = &x[0][r * e * d..(r + 1) * e * d];
            if let Some(dx) = dexperts {
                for (k, de) in dx[r * e * d..(r + 1) * e * d].chunks_exact_mut(d).enumerate() {
                    de.iter_mut().zip(g).for_each(|(a, b)| *a += p[k] * b);
                }
            }
            if let Some(dg) = dgate {
                let dots: Vec<f32> =
                    experts.chunks_exact(d).map(|v| v.iter().zip(g).map(|(a, b)| a * b).sum()).collect();
                let mean: f32 = dots.iter().zip(p).map(|(a, b)| a * b).sum();
                for k in 0..e {
                    dg[r * e + k] += p[k] * (dots[k] - mean);
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
    fn mixture_matches_finite_differences() {
        for (e, d, rows) in [(2, 1, 1), (3, 4, 3), (5, 2, 2)] {
            let s = [Shape { fields: e, dim: d }, Shape::flat(e)];
            let layer = mixture(&mut args("{}"), &s).unwrap();
            assert_eq!(layer.output(), Shape::flat(d));
            check_layer(layer.as_ref(), &s, rows, e as u64).unwrap_or_else(|err| panic!("{e} x {d}: {err}"));
        }
    }

    #[test]
    fn an_even_gate_averages_and_a_sharp_one_picks() {
        let s = [Shape { fields: 2, dim: 2 }, Shape::flat(2)];
        let layer = mixture(&mut args("{}"), &s).unwrap();
        let experts = [1.0, 2.0, 3.0, 6.0, 1.0, 2.0, 3.0, 6.0];
        let gates = [0.0, 0.0, 40.0, 0.0];
        let mut y = [0.0; 4];
        let mut scratch = [0.0; 4];
        layer.forward(&Ctx { rows: 2, train: false, seeds: &[] }, &[], &[&experts, &gates], &mut y, &mut scratch);
        assert_eq!(y[..2], [2.0, 4.0]);
        assert!((y[2] - 1.0).abs() < 1e-6 && (y[3] - 2.0).abs() < 1e-6, "{y:?}");
    }

    #[test]
    fn mixture_refuses_mismatched_inputs() {
        let e = mixture(&mut args("{}"), &[Shape { fields: 3, dim: 4 }, Shape::flat(2)]).unwrap_err();
        assert!(e.contains("2 logits for 3 experts"), "{e}");
        let e = mixture(&mut args("{}"), &[Shape::flat(8), Shape::flat(1)]).unwrap_err();
        assert!(e.contains("E >= 2"), "{e}");
        assert!(mixture(&mut args("{}"), &[Shape::flat(8)]).unwrap_err().contains("two inputs"));
    }
}
