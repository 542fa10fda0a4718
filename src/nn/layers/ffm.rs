//! `ffm`: a field-aware factorization machine's second-order term.
//!
//! In an FFM each feature has one latent vector per other field, and a pair of features
//! interacts through the vector each keeps for the other's field. oar stores those vectors as
//! one embedding row of `F * K` floats (table `dim = F * K`), so the layer reads an `(F, F * K)`
//! field tensor: field `i`'s vector for field `j` is floats `j K .. (j + 1) K` of field `i`.

use super::one_input;
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};

/// `y = sum_{i < j} <v_{i,j}, v_{j,i}>`. Backward: `dv_{i,j} = dy v_{j,i}` for `i != j`.
#[derive(Debug)]
pub struct FfmLayer {
    fields: usize,
    k: usize,
}

/// `ffm`: no settings; one field tensor `(F, F * K)` (an embedding of `F` slots in a table
/// of `dim = F * K`) -> 1.
pub fn ffm(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    let input = one_input(inputs)?;
    let f = input.fields;
    if f < 2 || input.dim % f != 0 || input.dim == 0 {
        return Err(format!(
            "needs a field tensor (F x F*K): F >= 2 slots looked up in a table whose dim is F times the latent \
             size; got {input}"
        ));
    }
    Ok(Box::new(FfmLayer { fields: f, k: input.dim / f }))
}

impl FfmLayer {
    /// Offset, in a sample, of field `i`'s vector for field `j`.
    #[inline]
    fn at(&self, i: usize, j: usize) -> usize {
        (i * self.fields + j) * self.k
    }
}

impl Layer for FfmLayer {
    fn output(&self) -> Shape {
        Shape::flat(1)
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        let (f, k) = (self.fields, self.k);
        let size = f * f * k;
        for r in 0..ctx.rows {
            let v = &x[0][r * size..(r + 1) * size];
            let mut sum = 0.0f32;
            for i in 0..f {
                for j in i + 1..f {
                    let (a, b) = (self.at(i, j), self.at(j, i));
                    sum += v[a..a + k].iter().zip(&v[b..b + k]).map(|(p, q)| p * q).sum::<f32>();
                }
            }
            y[r] = sum;
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        // v (N, F, F, K) times its field-transpose, summed over the pairs i < j.
        let (f, k) = (self.fields, self.k);
        let v = g.reshape(x[0], &[-1, f as i64, f as i64, k as i64]);
        let t = g.op("Transpose", &[&v], vec![Attr::Ints("perm", vec![0, 2, 1, 3])]);
        let prod = g.op("Mul", &[&v, &t], Vec::new());
        let upper: Vec<f32> = (0..f * f).map(|p| if p / f < p % f { 1.0 } else { 0.0 }).collect();
        let mask = g.floats("pairs", &[f, f, 1], &upper);
        let pairs = g.op("Mul", &[&prod, &mask], Vec::new());
        let sum = g.reduce_sum(&pairs, &[1, 2, 3], false);
        g.reshape_to(&sum, &[-1, 1], y);
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
        let Some(dx) = dx[0].as_deref_mut() else { return };
        let (f, k) = (self.fields, self.k);
        let size = f * f * k;
        for r in 0..ctx.rows {
            let v = &x[0][r * size..(r + 1) * size];
            let d = &mut dx[r * size..(r + 1) * size];
            for i in 0..f {
                for j in 0..f {
                    if i != j {
                        let (a, b) = (self.at(i, j), self.at(j, i));
                        d[a..a + k].iter_mut().zip(&v[b..b + k]).for_each(|(d, q)| *d += dy[r] * q);
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
    fn ffm_matches_finite_differences() {
        for (f, k, rows) in [(2, 1, 1), (3, 2, 3), (4, 3, 2)] {
            let s = Shape { fields: f, dim: f * k };
            let layer = ffm(&mut args("{}"), &[s]).unwrap();
            check_layer(layer.as_ref(), &[s], rows, f as u64).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }

    #[test]
    fn each_pair_meets_through_the_vector_kept_for_the_other_field() {
        // Three fields, K = 1: v[i][j] is field i's scalar for field j.
        let v = [0.0f32, 2.0, 3.0, 5.0, 0.0, 7.0, 11.0, 13.0, 0.0];
        let layer = ffm(&mut args("{}"), &[Shape { fields: 3, dim: 3 }]).unwrap();
        let mut y = [0.0];
        layer.forward(&Ctx { rows: 1, train: false, seeds: &[] }, &[], &[&v], &mut y, &mut []);
        // v01 v10 + v02 v20 + v12 v21 = 2*5 + 3*11 + 7*13.
        assert_eq!(y[0], 10.0 + 33.0 + 91.0);
    }

    #[test]
    fn ffm_refuses_a_width_that_is_not_fields_times_k() {
        let e = ffm(&mut args("{}"), &[Shape { fields: 3, dim: 4 }]).unwrap_err();
        assert!(e.contains("F x F*K") && e.contains("3 x 4"), "{e}");
        assert!(ffm(&mut args("{}"), &[Shape::flat(4)]).is_err());
    }
}
