//! `dot_interaction`: DLRM's pairwise dot products of the dense vector and the embeddings.

use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};

/// With `z = [dense, f_1 .. f_F]` (`F + 1` vectors of `D`), the output is the dense vector
/// followed by `<z_i, z_j>` for every `i < j` (in order `i = 0..F`, `j = i+1..=F`): width
/// `D + (F + 1) F / 2`.
#[derive(Debug)]
pub struct DotInteractionLayer {
    fields: usize,
    dim: usize,
}

/// `dot_interaction`: no settings; inputs a flat dense vector of `D` and a field tensor
/// `(F, D)` of the same `D`.
pub fn dot_interaction(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    let [dense, fields] = inputs else {
        return Err(format!(
            "takes two inputs, a flat dense vector of D and a field tensor (F x D); got {}",
            inputs.len()
        ));
    };
    if dense.fields != 1 {
        return Err(format!(
            "the first input must be a flat dense vector (e.g. an mlp's output), got {dense}; the fields go second"
        ));
    }
    if dense.dim != fields.dim {
        return Err(format!(
            "the dense vector's width must equal the fields' dim: dense {dense}, fields {fields} ({} != {})",
            dense.dim, fields.dim
        ));
    }
    if fields.size() == 0 {
        return Err(format!("the field tensor {fields} is empty"));
    }
    Ok(Box::new(DotInteractionLayer { fields: fields.fields, dim: fields.dim }))
}

impl DotInteractionLayer {
    /// Vector `i` of `z` for sample `r`: the dense vector or field `i - 1`.
    fn z<'a>(&self, x: &[&'a [f32]], r: usize, i: usize) -> &'a [f32] {
        let d = self.dim;
        if i == 0 {
            &x[0][r * d..(r + 1) * d]
        } else {
            let at = (r * self.fields + i - 1) * d;
            &x[1][at..at + d]
        }
    }
}

impl Layer for DotInteractionLayer {
    fn output(&self) -> Shape {
        Shape::flat(self.dim + (self.fields + 1) * self.fields / 2)
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        let (d, width) = (self.dim, self.output().size());
        for r in 0..ctx.rows {
            let out = &mut y[r * width..(r + 1) * width];
            out[..d].copy_from_slice(self.z(x, r, 0));
            let mut p = d;
            for i in 0..=self.fields {
                let zi = self.z(x, r, i);
                for j in i + 1..=self.fields {
                    out[p] = zi.iter().zip(self.z(x, r, j)).map(|(a, b)| a * b).sum();
                    p += 1;
                }
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        let (f, d) = (self.fields as i64, self.dim as i64);
        let dense = g.reshape(x[0], &[-1, 1, d]);
        let fields = g.reshape(x[1], &[-1, f, d]);
        let z = g.op("Concat", &[&dense, &fields], vec![Attr::Int("axis", 1)]);
        let zt = g.op("Transpose", &[&z], vec![Attr::Ints("perm", vec![0, 2, 1])]);
        let products = g.op("MatMul", &[&z, &zt], Vec::new());
        let flat = g.reshape(&products, &[-1, (f + 1) * (f + 1)]);
        let pairs: Vec<i64> = (0..=f).flat_map(|i| (i + 1..=f).map(move |j| i * (f + 1) + j)).collect();
        let at = g.ints("pairs", &pairs);
        let dots = g.op("Gather", &[&flat, &at], vec![Attr::Int("axis", 1)]);
        g.op_to("Concat", &[x[0], &dots], vec![Attr::Int("axis", 1)], y);
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
        let (d, f, width) = (self.dim, self.fields, self.output().size());
        let [d_dense, d_fields] = dx else { unreachable!("two inputs") };
        // dz_i for sample r, if that input wants a gradient.
        fn grad<'a>(
            d_dense: &'a mut Option<&mut [f32]>,
            d_fields: &'a mut Option<&mut [f32]>,
            r: usize,
            i: usize,
            f: usize,
            d: usize,
        ) -> Option<&'a mut [f32]> {
            if i == 0 {
                d_dense.as_deref_mut().map(|g| &mut g[r * d..(r + 1) * d])
            } else {
                let at = (r * f + i - 1) * d;
                d_fields.as_deref_mut().map(|g| &mut g[at..at + d])
            }
        }
        for r in 0..ctx.rows {
            let g = &dy[r * width..(r + 1) * width];
            if let Some(dd) = d_dense.as_deref_mut() {
                dd[r * d..(r + 1) * d].iter_mut().zip(&g[..d]).for_each(|(a, b)| *a += b);
            }
            let mut p = d;
            for i in 0..=f {
                for j in i + 1..=f {
                    let gij = g[p];
                    p += 1;
                    let (zi, zj) = (self.z(x, r, i), self.z(x, r, j));
                    if let Some(di) = grad(d_dense, d_fields, r, i, f, d) {
                        di.iter_mut().zip(zj).for_each(|(a, b)| *a += gij * b);
                    }
                    if let Some(dj) = grad(d_dense, d_fields, r, j, f, d) {
                        dj.iter_mut().zip(zi).for_each(|(a, b)| *a += gij * b);
                    }
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
    fn dot_interaction_matches_finite_differences() {
        for (fields, dim, rows) in [(1, 1, 1), (1, 3, 2), (2, 3, 3), (4, 2, 2), (3, 5, 1)] {
            let inputs = [Shape::flat(dim), Shape { fields, dim }];
            let layer = dot_interaction(&mut args("{}"), &inputs).unwrap();
            assert_eq!(layer.output(), Shape::flat(dim + (fields + 1) * fields / 2));
            check_layer(layer.as_ref(), &inputs, rows, 3).unwrap_or_else(|e| panic!("F {fields}, D {dim}: {e}"));
        }
    }

    #[test]
    fn dot_interaction_equals_explicit_dots() {
        // dense (1, 2); fields (3, 0), (-1, 4).
        let dense = [1.0f32, 2.0];
        let fields = [3.0f32, 0.0, -1.0, 4.0];
        let layer = dot_interaction(&mut args("{}"), &[Shape::flat(2), Shape { fields: 2, dim: 2 }]).unwrap();
        let mut y = [0.0; 5];
        layer.forward(&Ctx { rows: 1, train: false, seeds: &[0] }, &[], &[&dense, &fields], &mut y, &mut []);
        // <d,f1> = 3, <d,f2> = 7, <f1,f2> = -3.
        assert_eq!(y, [1.0, 2.0, 3.0, 7.0, -3.0]);
    }

    #[test]
    fn dot_interaction_refuses_mismatched_inputs() {
        let err = |inputs: &[Shape]| dot_interaction(&mut args("{}"), inputs).unwrap_err();
        let e = err(&[Shape::flat(4), Shape { fields: 3, dim: 8 }]);
        assert!(e.contains("dense 4") && e.contains("fields 3 x 8"), "{e}");
        let e = err(&[Shape { fields: 2, dim: 4 }, Shape { fields: 3, dim: 4 }]);
        assert!(e.contains("first input must be a flat dense vector") && e.contains("2 x 4"), "{e}");
        assert!(err(&[Shape::flat(4)]).contains("takes two inputs"));
        let ok = [Shape::flat(2), Shape { fields: 2, dim: 2 }];
        assert!(dot_interaction(&mut args(r#"{"self": true}"#), &ok).unwrap_err().contains("unknown setting(s) self"));
    }
}
