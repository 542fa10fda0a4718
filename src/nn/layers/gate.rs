//! `gate`: GateNet's feature embedding gate, each field's vector scaled by a learned gate of
//! its own values.

use super::one_input;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::sigmoid;
use crate::table::{DenseParam, Init};

/// How fine the gate is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateMode {
    /// One gate per field: `g_f = sigmoid(<w_f, e_f>)`, `w` is `(F, D)`.
    Vector,
    /// One gate per value: `g_f = sigmoid(W_f e_f)`, `W` is `(F, D, D)`.
    Bit,
}

/// `y_f = e_f * g_f` (GateNet, Huang et al. 2020, section 3.1: field-private gate weights,
/// sigmoid). Weights start uniform in +-1/sqrt(D), so the gates start near 1/2.
#[derive(Debug)]
pub struct GateLayer {
    input: Shape,
    mode: GateMode,
}

/// `gate`: `mode = "vector"` (one gate per field) or `"bit"` (one per value); one field
/// tensor `(F, D)` -> `(F, D)`.
pub fn gate(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let mode = match args.string("mode")?.as_deref() {
        None | Some("vector") => GateMode::Vector,
        Some("bit") => GateMode::Bit,
        Some(other) => return Err(format!("mode must be \"vector\" or \"bit\", got {other:?}")),
    };
    args.finish()?;
    let input = one_input(inputs)?;
    if input.size() == 0 {
        return Err("its input is empty".into());
    }
    Ok(Box::new(GateLayer { input, mode }))
}

impl GateLayer {
    /// Gates per field.
    fn width(&self) -> usize {
        match self.mode {
            GateMode::Vector => 1,
            GateMode::Bit => self.input.dim,
        }
    }
}

impl Layer for GateLayer {
    fn output(&self) -> Shape {
        self.input
    }

    fn params(&self) -> Vec<DenseParam> {
        let (f, d) = (self.input.fields, self.input.dim);
        let init = Init::Uniform { scale: 1.0 / (d as f32).sqrt() };
        vec![DenseParam::new("w", f * self.width() * d, init)]
    }

    /// The gates.
    fn scratch(&self) -> usize {
        self.input.fields * self.width()
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (f, d, w) = (self.input.fields, self.input.dim, self.width());
        for r in 0..ctx.rows {
            for field in 0..f {
                let e = &x[0][(r * f + field) * d..(r * f + field + 1) * d];
                let out = &mut y[(r * f + field) * d..(r * f + field + 1) * d];
                let gates = &mut scratch[(r * f + field) * w..(r * f + field + 1) * w];
                for (o, g) in gates.iter_mut().enumerate() {
                    let row = &params[(field * w + o) * d..(field * w + o + 1) * d];
                    *g = sigmoid(row.iter().zip(e).map(|(a, b)| a * b).sum());
                }
                for (k, (o, v)) in out.iter_mut().zip(e).enumerate() {
                    *o = v * gates[if w == 1 { 0 } else { k }];
                }
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        let (f, d, w) = (self.input.fields, self.input.dim, self.width());
        let e = g.reshape(x[0], &[-1, f as i64, d as i64]);
        // Per field, gate o's weights are the row o of a (w, d) matrix: z[n,f,o] = sum_d e w.
        let weights = g.floats("w", &[f, w, d], params);
        let z = g.op("Einsum", &[&e, &weights], vec![Attr::Str("equation", "nfd,fod->nfo".into())]);
        let gates = g.op("Sigmoid", &[&z], Vec::new());
        let out = g.op("Mul", &[&e, &gates], Vec::new());
        g.reshape_to(&out, &[-1, (f * d) as i64], y);
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
        let (f, d, w) = (self.input.fields, self.input.dim, self.width());
        let mut dx = dx[0].as_deref_mut();
        for r in 0..ctx.rows {
            for field in 0..f {
                let at = (r * f + field) * d;
                let e = &x[0][at..at + d];
                let g = &dy[at..at + d];
                let gates = &scratch[(r * f + field) * w..(r * f + field + 1) * w];
                // y_k = e_k gate(k): the direct part of de, then each gate's pre-activation.
                if let Some(dx) = dx.as_deref_mut() {
                    for k in 0..d {
                        dx[at + k] += g[k] * gates[if w == 1 { 0 } else { k }];
                    }
                }
                for (o, &gate) in gates.iter().enumerate() {
                    let dgate: f32 = if w == 1 { g.iter().zip(e).map(|(a, b)| a * b).sum() } else { g[o] * e[o] };
                    let dz = dgate * gate * (1.0 - gate);
                    let p = (field * w + o) * d;
                    grads[p..p + d].iter_mut().zip(e).for_each(|(gr, v)| *gr += dz * v);
                    if let Some(dx) = dx.as_deref_mut() {
                        dx[at..at + d].iter_mut().zip(&params[p..p + d]).for_each(|(dv, wv)| *dv += dz * wv);
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

    #[test]
    fn both_gates_match_finite_differences() {
        for mode in ["vector", "bit"] {
            for (f, d, rows) in [(1, 1, 1), (3, 2, 3), (2, 4, 2)] {
                let s = Shape { fields: f, dim: d };
                let layer = gate(&mut args(&format!(r#"{{"mode": "{mode}"}}"#)), &[s]).unwrap();
                assert_eq!(layer.output(), s);
                check_layer(layer.as_ref(), &[s], rows, d as u64).unwrap_or_else(|e| panic!("{mode} {s}: {e}"));
            }
        }
    }

    #[test]
    fn zero_weights_halve_every_value() {
        let s = Shape { fields: 2, dim: 2 };
        for mode in ["vector", "bit"] {
            let layer = gate(&mut args(&format!(r#"{{"mode": "{mode}"}}"#)), &[s]).unwrap();
            let params = vec![0.0; layer.params()[0].len];
            let mut y = [0.0; 4];
            let mut scratch = vec![0.0; layer.scratch()];
            let ctx = Ctx { rows: 1, train: false, seeds: &[] };
            layer.forward(&ctx, &params, &[&[2.0, -4.0, 6.0, 8.0]], &mut y, &mut scratch);
            assert_eq!(y, [1.0, -2.0, 3.0, 4.0], "{mode}");
        }
    }

    #[test]
    fn gate_refuses_an_unknown_mode() {
        let e = gate(&mut args(r#"{"mode": "field"}"#), &[Shape { fields: 2, dim: 2 }]).unwrap_err();
        assert!(e.contains("\"vector\" or \"bit\""), "{e}");
    }
}
