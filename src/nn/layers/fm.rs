//! `fm`: a factorization machine's second-order term over a field tensor.

use super::one_input;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};

/// `y = 0.5 * sum_d [(sum_f v_fd)^2 - sum_f v_fd^2]`, the sum of the dot products of every
/// pair of the input's `F` vectors, in `O(F D)`. Backward: `dv_fd = dy * (S_d - v_fd)` with
/// `S_d = sum_f v_fd`.
#[derive(Debug)]
pub struct FmLayer {
    input: Shape,
}

/// `fm`: no settings; one field tensor `(F, D)` with `F >= 2` -> 1.
pub fn fm(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    let input = one_input(inputs)?;
    if input.fields < 2 {
        return Err(format!(
            "needs a field tensor (F x D) with F >= 2, e.g. an embedding or a concat of embeddings; got the flat \
             input {input}"
        ));
    }
    if input.dim == 0 {
        return Err(format!("input {input} has no values"));
    }
    Ok(Box::new(FmLayer { input }))
}

impl Layer for FmLayer {
    fn output(&self) -> Shape {
        Shape::flat(1)
    }

    /// The field sum `S` of each sample, kept for backward.
    fn scratch(&self) -> usize {
        self.input.dim
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (size, dim) = (self.input.size(), self.input.dim);
        for r in 0..ctx.rows {
            let v = &x[0][r * size..(r + 1) * size];
            let s = &mut scratch[r * dim..(r + 1) * dim];
            s.fill(0.0);
            for field in v.chunks_exact(dim) {
                s.iter_mut().zip(field).for_each(|(s, v)| *s += v);
            }
            let squares: f32 = v.iter().map(|v| v * v).sum();
            let sum_squared: f32 = s.iter().map(|s| s * s).sum();
            y[r] = 0.5 * (sum_squared - squares);
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        // 0.5 * (|sum of fields|^2 - sum of squares), per sample.
        let fields = g.reshape(x[0], &[-1, self.input.fields as i64, self.input.dim as i64]);
        let s = g.reduce_sum(&fields, &[1], false);
        let ss = g.op("Mul", &[&s, &s], Vec::new());
        let sum_squared = g.reduce_sum(&ss, &[1], true);
        let xx = g.op("Mul", &[x[0], x[0]], Vec::new());
        let squares = g.reduce_sum(&xx, &[1], true);
        let d = g.op("Sub", &[&sum_squared, &squares], Vec::new());
        let half = g.scalar("half", 0.5);
        g.op_to("Mul", &[&d, &half], Vec::new(), y);
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
        let Some(dx) = dx[0].as_deref_mut() else { return };
        let (size, dim) = (self.input.size(), self.input.dim);
        for r in 0..ctx.rows {
            let s = &scratch[r * dim..(r + 1) * dim];
            let v = &x[0][r * size..(r + 1) * size];
            let d = &mut dx[r * size..(r + 1) * size];
            for (df, vf) in d.chunks_exact_mut(dim).zip(v.chunks_exact(dim)) {
                for ((d, v), s) in df.iter_mut().zip(vf).zip(s) {
                    *d += dy[r] * (s - v);
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
    fn fm_matches_finite_differences() {
        for (fields, dim, rows) in [(2, 1, 1), (2, 3, 4), (3, 4, 2), (5, 2, 3), (4, 8, 1)] {
            let s = Shape { fields, dim };
            let layer = fm(&mut args("{}"), &[s]).unwrap();
            assert_eq!(layer.output(), Shape::flat(1));
            check_layer(layer.as_ref(), &[s], rows, fields as u64).unwrap_or_else(|e| panic!("{s}, {rows} rows: {e}"));
        }
    }

    #[test]
    fn fm_equals_the_sum_of_pairwise_dots() {
        let s = Shape { fields: 3, dim: 2 };
        let x = [1.0f32, 2.0, -3.0, 0.5, 4.0, -1.0, 0.0, 1.0, 2.0, 2.0, -1.0, 3.0];
        let layer = fm(&mut args("{}"), &[s]).unwrap();
        let mut y = [0.0; 2];
        let mut scratch = vec![0.0; 2 * layer.scratch()];
        layer.forward(&Ctx { rows: 2, train: false, seeds: &[0, 0] }, &[], &[&x], &mut y, &mut scratch);
        // Row 0: <(1,2),(-3,.5)> + <(1,2),(4,-1)> + <(-3,.5),(4,-1)> = -2 + 2 - 12.5 = -12.5.
        assert!((y[0] + 12.5).abs() < 1e-5, "{}", y[0]);
        for r in 0..2 {
            let v = |f: usize| &x[r * 6 + 2 * f..r * 6 + 2 * f + 2];
            let mut brute = 0.0f32;
            for i in 0..3 {
                for j in i + 1..3 {
                    brute += v(i).iter().zip(v(j)).map(|(a, b)| a * b).sum::<f32>();
                }
            }
            assert!((y[r] - brute).abs() < 1e-5, "row {r}: {} vs {brute}", y[r]);
        }
    }

    #[test]
    fn fm_refuses_flat_inputs() {
        let e = fm(&mut args("{}"), &[Shape::flat(8)]).unwrap_err();
        assert!(e.contains("needs a field tensor (F x D)") && e.contains("embedding") && e.contains("8"), "{e}");
        assert!(fm(&mut args(r#"{"k": 2}"#), &[Shape { fields: 2, dim: 2 }]).unwrap_err().contains("unknown setting"));
        let two = Shape { fields: 2, dim: 2 };
        assert!(fm(&mut args("{}"), &[two, two]).unwrap_err().contains("takes one input"));
    }

    /// `fm` whose backward forgets the `- v_fd` term: check_layer must catch it.
    #[derive(Debug)]
    struct ForgetfulFm(FmLayer);

    impl Layer for ForgetfulFm {
        fn output(&self) -> Shape {
            self.0.output()
        }
        fn scratch(&self) -> usize {
            self.0.scratch()
        }
        fn forward(&self, ctx: &Ctx, p: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
            self.0.forward(ctx, p, x, y, scratch)
        }
        fn backward(
            &self,
            ctx: &Ctx,
            _: &[f32],
            _: &[&[f32]],
            _: &[f32],
            dy: &[f32],
            scratch: &mut [f32],
            _: &mut [f32],
            dx: &mut [Option<&mut [f32]>],
        ) {
            let (size, dim) = (self.0.input.size(), self.0.input.dim);
            let dx = dx[0].as_deref_mut().unwrap();
            for r in 0..ctx.rows {
                for (k, d) in dx[r * size..(r + 1) * size].iter_mut().enumerate() {
                    *d += dy[r] * scratch[r * dim + k % dim];
                }
            }
        }
    }

    #[test]
    fn check_layer_catches_a_wrong_backward() {
        let s = Shape { fields: 3, dim: 2 };
        let good = FmLayer { input: s };
        check_layer(&good, &[s], 3, 9).unwrap();
        let e = check_layer(&ForgetfulFm(FmLayer { input: s }), &[s], 3, 9).unwrap_err();
        assert!(e.starts_with("input 0["), "{e}");
    }
}
