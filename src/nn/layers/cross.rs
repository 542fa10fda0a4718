//! `cross`: the cross network of DCN (version 1) and DCN-V2 (version 2, full or low rank).

use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::matmul;
use crate::table::{DenseParam, Init};

/// The form of each cross layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CrossKind {
    /// DCN: `x_{l+1} = x_0 (x_l . w_l) + b_l + x_l`, `w_l` and `b_l` vectors of `W`.
    Vector,
    /// DCN-V2: `x_{l+1} = x_0 ⊙ (W_l x_l + b_l) + x_l`, `W_l` a `W x W` matrix.
    Matrix,
    /// DCN-V2 low rank: `W_l = U_l V_l` with `U_l` (`W x rank`) and `V_l` (`rank x W`).
    LowRank(usize),
}

/// A stack of cross layers on a flat input of width `W`; the output has width `W` too.
///
/// Parameters, per layer `l` in order (matrices row-major, `M[i][j]` at `i * cols + j`):
/// version 1 `{l}.w` (W), `{l}.b` (W); version 2 `{l}.w` (W x W), `{l}.b` (W); version 2
/// with `rank` `{l}.u` (W x rank), `{l}.v` (rank x W), `{l}.b` (W). Weights are uniform in
/// +-1/sqrt(fan-in) (`1/sqrt(W)`, for `u` `1/sqrt(rank)`), biases zero.
#[derive(Debug)]
pub struct CrossLayer {
    width: usize,
    layers: usize,
    kind: CrossKind,
}

/// `cross`: `layers` (required, >= 1), `version = 1` (or 2), `rank` (version 2 only: low rank).
pub fn cross(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let layers = args.required_usize("layers")?;
    let version = args.usize("version")?.unwrap_or(1);
    let rank = args.usize("rank")?;
    args.finish()?;
    let [input] = inputs else { return Err(format!("takes one input, got {}", inputs.len())) };
    if layers == 0 {
        return Err("layers must be at least 1".into());
    }
    let kind = match (version, rank) {
        (1, None) => CrossKind::Vector,
        (1, Some(_)) => return Err("rank needs version = 2 (version 1 has no matrix to factor)".into()),
        (2, None) => CrossKind::Matrix,
        (2, Some(0)) => return Err("rank must be at least 1".into()),
        (2, Some(r)) => CrossKind::LowRank(r),
        (v, _) => return Err(format!("version must be 1 or 2, got {v}")),
    };
    let width = input.size();
    if width == 0 {
        return Err("input is empty".into());
    }
    Ok(Box::new(CrossLayer { width, layers, kind }))
}

/// Where one cross layer's parameters start in the layer's slice.
struct Offsets {
    /// `w` (v1 vector, v2 matrix) or `u` (low rank).
    w: usize,
    /// `v` (low rank only).
    v: usize,
    b: usize,
}

impl CrossLayer {
    fn rank(&self) -> usize {
        match self.kind {
            CrossKind::LowRank(r) => r,
            _ => 0,
        }
    }

    /// Floats of one cross layer's weights (bias excluded).
    fn weights(&self) -> usize {
        let w = self.width;
        match self.kind {
            CrossKind::Vector => w,
            CrossKind::Matrix => w * w,
            CrossKind::LowRank(r) => 2 * w * r,
        }
    }

    fn offsets(&self, l: usize) -> Offsets {
        let at = l * (self.weights() + self.width);
        let v = at + self.width * self.rank();
        Offsets { w: at, v, b: at + self.weights() }
    }

    /// Per sample and layer: the saved pre-product `z_l` (v1 the scalar `x_l . w_l`, v2
    /// `W_l x_l + b_l`).
    fn z_width(&self) -> usize {
        match self.kind {
            CrossKind::Vector => 1,
            _ => self.width,
        }
    }

    /// The scratch's parts, in floats per sample: `x_1 .. x_{L-1}`, `z_0 .. z_{L-1}`,
    /// `t_l = V_l x_l` (low rank), then backward's workspace (two gradients of width W, `dz`,
    /// `dt`).
    fn parts(&self) -> [usize; 4] {
        let (w, l) = (self.width, self.layers);
        [(l - 1) * w, l * self.z_width(), l * self.rank(), 3 * w + self.rank()]
    }
}

impl Layer for CrossLayer {
    fn output(&self) -> Shape {
        Shape::flat(self.width)
    }

    fn params(&self) -> Vec<DenseParam> {
        let w = self.width;
        let scale = 1.0 / (w as f32).sqrt();
        let bias = |l: usize| DenseParam::new(format!("{l}.b"), w, Init::Zeros);
        let mut p = Vec::new();
        for l in 0..self.layers {
            match self.kind {
                CrossKind::Vector | CrossKind::Matrix => {
                    p.push(DenseParam::new(format!("{l}.w"), self.weights(), Init::Uniform { scale }));
                }
                CrossKind::LowRank(r) => {
                    let u_scale = 1.0 / (r as f32).sqrt();
                    p.push(DenseParam::new(format!("{l}.u"), w * r, Init::Uniform { scale: u_scale }));
                    p.push(DenseParam::new(format!("{l}.v"), r * w, Init::Uniform { scale }));
                }
            }
            p.push(bias(l));
        }
        p
    }

    fn scratch(&self) -> usize {
        self.parts().iter().sum()
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (rows, w) = (ctx.rows, self.width);
        let n = rows * w;
        let x0 = &x[0][..n];
        let [xs_len, zs_len, ts_len, _] = self.parts().map(|p| p * rows);
        let (xs, rest) = scratch.split_at_mut(xs_len);
        let (zs, rest) = rest.split_at_mut(zs_len);
        let ts = &mut rest[..ts_len];
        let (zw, r) = (rows * self.z_width(), rows * self.rank());
        for l in 0..self.layers {
            let (before, after) = xs.split_at_mut(l * n);
            let xl: &[f32] = if l == 0 { x0 } else { &before[(l - 1) * n..] };
            let out: &mut [f32] = if l + 1 == self.layers { &mut y[..n] } else { &mut after[..n] };
            let z = &mut zs[l * zw..(l + 1) * zw];
            let o = self.offsets(l);
            let b = &params[o.b..o.b + w];
            match self.kind {
                CrossKind::Vector => {
                    // z = x_l w (one scalar per row); out = x0 z + b + x_l.
                    matmul(rows, 1, w, z, false, xl, (w, 1), &params[o.w..o.w + w], (1, 1));
                    let samples = out.chunks_exact_mut(w).zip(x0.chunks_exact(w)).zip(xl.chunks_exact(w));
                    for (((out, x0), xl), s) in samples.zip(z.iter()) {
                        for (((o, x0), xl), b) in out.iter_mut().zip(x0).zip(xl).zip(b) {
                            *o = x0 * s + b + xl;
                        }
                    }
                }
                CrossKind::Matrix | CrossKind::LowRank(_) => {
                    for row in z.chunks_exact_mut(w) {
                        row.copy_from_slice(b);
                    }
                    if let CrossKind::LowRank(k) = self.kind {
                        // t = x_l V^T, z += t U^T.
                        let t = &mut ts[l * r..(l + 1) * r];
                        matmul(rows, k, w, t, false, xl, (w, 1), &params[o.v..o.v + k * w], (1, w));
                        matmul(rows, w, k, z, true, t, (k, 1), &params[o.w..o.w + w * k], (1, k));
                    } else {
                        // z += x_l W^T.
                        matmul(rows, w, w, z, true, xl, (w, 1), &params[o.w..o.w + w * w], (1, w));
                    }
                    for (((o, x0), z), xl) in out.iter_mut().zip(x0).zip(z.iter()).zip(xl) {
                        *o = x0 * z + xl;
                    }
                }
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        let w = self.width;
        let x0 = x[0];
        let mut xl = x0.to_string();
        for l in 0..self.layers {
            let o = self.offsets(l);
            let b = g.floats("b", &[w], &params[o.b..o.b + w]);
            let trans_b = || vec![Attr::Int("transB", 1)];
            let next = match self.kind {
                CrossKind::Vector => {
                    let wv = g.floats("w", &[w, 1], &params[o.w..o.w + w]);
                    let z = g.op("MatMul", &[&xl, &wv], Vec::new());
                    let p = g.op("Mul", &[x0, &z], Vec::new());
                    let pb = g.op("Add", &[&p, &b], Vec::new());
                    g.op("Add", &[&pb, &xl], Vec::new())
                }
                CrossKind::Matrix => {
                    let m = g.floats("w", &[w, w], &params[o.w..o.w + w * w]);
                    let z = g.op("Gemm", &[&xl, &m, &b], trans_b());
                    let p = g.op("Mul", &[x0, &z], Vec::new());
                    g.op("Add", &[&p, &xl], Vec::new())
                }
                CrossKind::LowRank(k) => {
                    let u = g.floats("u", &[w, k], &params[o.w..o.w + w * k]);
                    let v = g.floats("v", &[k, w], &params[o.v..o.v + k * w]);
                    let t = g.op("Gemm", &[&xl, &v], trans_b());
                    let z = g.op("Gemm", &[&t, &u, &b], trans_b());
                    let p = g.op("Mul", &[x0, &z], Vec::new());
                    g.op("Add", &[&p, &xl], Vec::new())
                }
            };
            xl = next;
        }
        g.identity(&xl, y);
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
        let (rows, w) = (ctx.rows, self.width);
        let n = rows * w;
        let x0 = &x[0][..n];
        let [xs_len, zs_len, ts_len, _] = self.parts().map(|p| p * rows);
        let (xs, rest) = scratch.split_at_mut(xs_len);
        let (zs, rest) = rest.split_at_mut(zs_len);
        let (ts, work) = rest.split_at_mut(ts_len);
        let (g, work) = work.split_at_mut(n);
        let (g_next, work) = work.split_at_mut(n);
        let (dz, dt) = work.split_at_mut(n);
        let (zw, r) = (rows * self.z_width(), rows * self.rank());
        let mut dx0 = dx[0].as_deref_mut();
        // `g` is the gradient w.r.t. x_{l+1}.
        g.copy_from_slice(&dy[..n]);
        for l in (0..self.layers).rev() {
            let xl: &[f32] = if l == 0 { x0 } else { &xs[(l - 1) * n..l * n] };
            let z = &zs[l * zw..(l + 1) * zw];
            let o = self.offsets(l);
            g_next.copy_from_slice(g);
            match self.kind {
                CrossKind::Vector => {
                    // ds = g . x0 per row (kept in dz[..rows]); dx0 += g s; dw += ds^T x_l; db += sum g;
                    // dx_l = g + ds w.
                    let ds = &mut dz[..rows];
                    for row in 0..rows {
                        let span = row * w..(row + 1) * w;
                        ds[row] = g[span.clone()].iter().zip(&x0[span.clone()]).map(|(a, b)| a * b).sum();
                        if let Some(d) = dx0.as_deref_mut() {
                            d[span.clone()].iter_mut().zip(&g[span]).for_each(|(d, g)| *d += g * z[row]);
                        }
                    }
                    matmul(1, w, rows, &mut grads[o.w..o.w + w], true, ds, (rows, 1), xl, (w, 1));
                    matmul(rows, w, 1, g_next, true, ds, (1, 1), &params[o.w..o.w + w], (w, 1));
                    for row in g.chunks_exact(w) {
                        grads[o.b..o.b + w].iter_mut().zip(row).for_each(|(d, g)| *d += g);
                    }
                }
                CrossKind::Matrix | CrossKind::LowRank(_) => {
                    // dx0 += g ⊙ z; dz = g ⊙ x0; db += sum dz; then through W_l (or U_l V_l).
                    if let Some(d) = dx0.as_deref_mut() {
                        d.iter_mut().zip(g.iter()).zip(z).for_each(|((d, g), z)| *d += g * z);
                    }
                    dz.iter_mut().zip(g.iter()).zip(x0).for_each(|((d, g), x0)| *d = g * x0);
                    for row in dz.chunks_exact(w) {
                        grads[o.b..o.b + w].iter_mut().zip(row).for_each(|(d, g)| *d += g);
                    }
                    if let CrossKind::LowRank(k) = self.kind {
                        let t = &ts[l * r..(l + 1) * r];
                        let dt = &mut dt[..r];
                        // dU += dz^T t; dt = dz U; dV += dt^T x_l; dx_l += dt V.
                        matmul(w, k, rows, &mut grads[o.w..o.w + w * k], true, dz, (1, w), t, (k, 1));
                        matmul(rows, k, w, dt, false, dz, (w, 1), &params[o.w..o.w + w * k], (k, 1));
                        matmul(k, w, rows, &mut grads[o.v..o.v + k * w], true, dt, (1, k), xl, (w, 1));
                        matmul(rows, w, k, g_next, true, dt, (k, 1), &params[o.v..o.v + k * w], (w, 1));
                    } else {
                        // dW += dz^T x_l; dx_l += dz W.
                        matmul(w, w, rows, &mut grads[o.w..o.w + w * w], true, dz, (1, w), xl, (w, 1));
                        matmul(rows, w, w, g_next, true, dz, (w, 1), &params[o.w..o.w + w * w], (w, 1));
                    }
                }
            }
            g.copy_from_slice(g_next);
        }
        if let Some(d) = dx0 {
            d.iter_mut().zip(g.iter()).for_each(|(d, g)| *d += g);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::layer::check_layer;

    use super::super::test_args as args;

    #[test]
    fn cross_matches_finite_differences() {
        for (json, shape, rows) in [
            (r#"{"layers": 1}"#, Shape::flat(3), 1),
            (r#"{"layers": 3}"#, Shape::flat(4), 3),
            (r#"{"layers": 2, "version": 1}"#, Shape { fields: 2, dim: 3 }, 2),
            (r#"{"layers": 1, "version": 2}"#, Shape::flat(3), 2),
            (r#"{"layers": 3, "version": 2}"#, Shape::flat(5), 3),
            (r#"{"layers": 2, "version": 2, "rank": 1}"#, Shape::flat(4), 2),
            (r#"{"layers": 3, "version": 2, "rank": 2}"#, Shape { fields: 3, dim: 2 }, 3),
            (r#"{"layers": 2, "version": 2, "rank": 6}"#, Shape::flat(4), 1),
        ] {
            let layer = cross(&mut args(json), &[shape]).unwrap();
            assert_eq!(layer.output(), Shape::flat(shape.size()));
            check_layer(layer.as_ref(), &[shape], rows, 11).unwrap_or_else(|e| panic!("{json} on {shape}: {e}"));
        }
    }

    #[test]
    fn cross_parameters_are_named_and_sized() {
        let names = |json: &str| -> Vec<(String, usize)> {
            cross(&mut args(json), &[Shape::flat(4)]).unwrap().params().into_iter().map(|p| (p.name, p.len)).collect()
        };
        let own = |v: &[(&str, usize)]| v.iter().map(|(n, l)| (n.to_string(), *l)).collect::<Vec<_>>();
        assert_eq!(names(r#"{"layers": 2}"#), own(&[("0.w", 4), ("0.b", 4), ("1.w", 4), ("1.b", 4)]));
        assert_eq!(names(r#"{"layers": 1, "version": 2}"#), own(&[("0.w", 16), ("0.b", 4)]));
        assert_eq!(names(r#"{"layers": 1, "version": 2, "rank": 3}"#), own(&[("0.u", 12), ("0.v", 12), ("0.b", 4)]));
        let p = cross(&mut args(r#"{"layers": 1}"#), &[Shape::flat(4)]).unwrap().params();
        assert_eq!(p[0].init, Init::Uniform { scale: 0.5 });
        assert_eq!(p[1].init, Init::Zeros);
    }

    /// One layer on x0 = (1, 2), by hand.
    #[test]
    fn cross_one_layer_by_hand() {
        let ctx = Ctx { rows: 1, train: false, seeds: &[0] };
        let x = [1.0f32, 2.0];
        let run = |json: &str, params: &[f32]| {
            let layer = cross(&mut args(json), &[Shape::flat(2)]).unwrap();
            let mut y = [0.0; 2];
            let mut scratch = vec![0.0; layer.scratch()];
            layer.forward(&ctx, params, &[&x], &mut y, &mut scratch);
            y
        };
        // v1, w = (3, -1), b = (0.5, 1): x.w = 1; y = x0 * 1 + b + x0 = (2.5, 5).
        assert_eq!(run(r#"{"layers": 1}"#, &[3.0, -1.0, 0.5, 1.0]), [2.5, 5.0]);
        // v2, W = [[1, 2], [0, -1]], b = (1, 0): W x + b = (6, -2); y = (1*6 + 1, 2*(-2) + 2) = (7, -2).
        assert_eq!(run(r#"{"layers": 1, "version": 2}"#, &[1.0, 2.0, 0.0, -1.0, 1.0, 0.0]), [7.0, -2.0]);
        // rank 1, U = (1, 2)^T, V = (1, 1): W = [[1, 1], [2, 2]], W x = (3, 6); with b = 0,
        // y = (1*3 + 1, 2*6 + 2) = (4, 14).
        assert_eq!(run(r#"{"layers": 1, "version": 2, "rank": 1}"#, &[1.0, 2.0, 1.0, 1.0, 0.0, 0.0]), [4.0, 14.0]);
        // Two v1 layers: x1 = (2.5, 5); x1.w = 2.5; x2 = x0 * 2.5 + b + x1 = (5.5, 11).
        assert_eq!(run(r#"{"layers": 2}"#, &[3.0, -1.0, 0.5, 1.0, 3.0, -1.0, 0.5, 1.0]), [5.5, 11.0]);
    }

    #[test]
    fn cross_refuses_bad_settings() {
        let flat = [Shape::flat(4)];
        let err = |json: &str| cross(&mut args(json), &flat).unwrap_err();
        assert!(err("{}").contains("needs layers"));
        assert!(err(r#"{"layers": 0}"#).contains("layers must be at least 1"));
        assert!(err(r#"{"layers": 1, "version": 3}"#).contains("version must be 1 or 2, got 3"));
        assert!(err(r#"{"layers": 1, "rank": 2}"#).contains("rank needs version = 2"));
        assert!(err(r#"{"layers": 1, "version": 2, "rank": 0}"#).contains("rank must be at least 1"));
        assert!(err(r#"{"layers": 1, "depth": 2}"#).contains("unknown setting(s) depth"));
        assert!(cross(&mut args(r#"{"layers": 1}"#), &[flat[0], flat[0]]).unwrap_err().contains("takes one input"));
    }
}
