//! `reduce_sum`: the sum of a field tensor's vectors, or of all its values.

use super::one_input;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};

/// Sums a `(F, D)` input over its fields (to one vector of `D`) or over everything (to one
/// value per sample).
#[derive(Debug)]
pub struct ReduceSumLayer {
    input: Shape,
    /// Sum over every value (else over the fields only).
    all: bool,
}

/// `reduce_sum`: `over = "fields"` ((F, D) -> D) or `"all"` ((F, D) -> 1).
pub fn reduce_sum(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let over = args.string("over")?.unwrap_or_else(|| "fields".into());
    args.finish()?;
    let all = match over.as_str() {
        "fields" => false,
        "all" => true,
        other => return Err(format!("over must be \"fields\" or \"all\", got {other:?}")),
    };
    let input = one_input(inputs)?;
    if input.size() == 0 {
        return Err("input is empty".into());
    }
    Ok(Box::new(ReduceSumLayer { input, all }))
}

impl Layer for ReduceSumLayer {
    fn output(&self) -> Shape {
        if self.all {
            Shape::flat(1)
        } else {
            Shape { fields: 1, dim: self.input.dim }
        }
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        let (size, dim) = (self.input.size(), self.input.dim);
        for (r, row) in x[0][..ctx.rows * size].chunks_exact(size).enumerate() {
            if self.all {
                y[r] = row.iter().sum();
            } else {
                let out = &mut y[r * dim..(r + 1) * dim];
                out.fill(0.0);
                for field in row.chunks_exact(dim) {
                    out.iter_mut().zip(field).for_each(|(o, v)| *o += v);
                }
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        let s = if self.all {
            g.reduce_sum(x[0], &[1], true)
        } else {
            let fields = g.reshape(x[0], &[-1, self.input.fields as i64, self.input.dim as i64]);
            g.reduce_sum(&fields, &[1], false)
        };
        g.identity(&s, y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        _: &[f32],
        _: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        _: &mut [f32],
        _: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let Some(dx) = dx[0].as_deref_mut() else { return };
        let (size, dim) = (self.input.size(), self.input.dim);
        for (r, row) in dx[..ctx.rows * size].chunks_exact_mut(size).enumerate() {
            if self.all {
                row.iter_mut().for_each(|d| *d += dy[r]);
            } else {
                let g = &dy[r * dim..(r + 1) * dim];
                for field in row.chunks_exact_mut(dim) {
                    field.iter_mut().zip(g).for_each(|(d, g)| *d += g);
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
    fn reduce_sum_matches_finite_differences() {
        for (json, shape, out) in [
            ("{}", Shape { fields: 3, dim: 4 }, Shape { fields: 1, dim: 4 }),
            (r#"{"over": "fields"}"#, Shape { fields: 1, dim: 5 }, Shape::flat(5)),
            (r#"{"over": "all"}"#, Shape { fields: 4, dim: 2 }, Shape::flat(1)),
            (r#"{"over": "all"}"#, Shape::flat(7), Shape::flat(1)),
        ] {
            let layer = reduce_sum(&mut args(json), &[shape]).unwrap();
            assert_eq!(layer.output(), out, "{json} on {shape}");
            for rows in [1, 3] {
                check_layer(layer.as_ref(), &[shape], rows, 5).unwrap_or_else(|e| panic!("{json} on {shape}: {e}"));
            }
        }
    }

    #[test]
    fn reduce_sum_values() {
        let s = Shape { fields: 2, dim: 3 };
        let x = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0, -1.0, 0.0, 1.0, 4.0, 4.0, 4.0];
        let ctx = Ctx { rows: 2, train: false, seeds: &[0, 0] };
        let mut y = [0.0; 6];
        reduce_sum(&mut args("{}"), &[s]).unwrap().forward(&ctx, &[], &[&x], &mut y, &mut []);
        assert_eq!(y, [11.0, 22.0, 33.0, 3.0, 4.0, 5.0]);
        let mut y = [0.0; 2];
        reduce_sum(&mut args(r#"{"over": "all"}"#), &[s]).unwrap().forward(&ctx, &[], &[&x], &mut y, &mut []);
        assert_eq!(y, [66.0, 12.0]);
    }

    #[test]
    fn reduce_sum_refuses_bad_settings() {
        let s = [Shape { fields: 2, dim: 3 }];
        let e = reduce_sum(&mut args(r#"{"over": "rows"}"#), &s).unwrap_err();
        assert!(e.contains("over must be") && e.contains("rows"), "{e}");
        assert!(reduce_sum(&mut args(r#"{"over": 1}"#), &s).unwrap_err().contains("over must be a string"));
        assert!(reduce_sum(&mut args(r#"{"axis": 1}"#), &s).unwrap_err().contains("unknown setting(s) axis"));
        assert!(reduce_sum(&mut args("{}"), &[s[0], s[0]]).unwrap_err().contains("takes one input, got 2"));
    }
}
