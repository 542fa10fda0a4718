//! `gru` and `augru`: recurrent layers over a masked sequence, DIEN's interest extractor and its
//! attention-update GRU (interest evolution).

use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::{matmul, sigmoid};
use crate::table::{DenseParam, Init};

/// A GRU (PyTorch's equations, gates in the order reset, update, new):
/// `r = s(x Wir + bir + h Whr + bhr)`, `z = s(x Wiz + biz + h Whz + bhz)`,
/// `n = tanh(x Win + bin + r * (h Whn + bhn))`, `h' = (1 - z) n + z h`; with `attention` (AUGRU,
/// DIEN), the update is scaled by the position's attention score `a`: `u = a (1 - z)`,
/// `h' = (1 - u) h + u n`. A masked position (mask 0) leaves the state as it was, so a
/// right-padded sequence ends in the state after its last behaviour. The state starts at 0.
#[derive(Debug)]
pub struct GruLayer {
    len: usize,
    input: usize,
    hidden: usize,
    /// Every position's state `(L, H)` (zeros at masked positions) instead of the last state.
    all: bool,
    attention: bool,
    masked: bool,
}

/// `gru`: `hidden` (required), `output = "last"` (the final state, `H`) or `"all"` (every
/// position's, `(L, H)`); inputs the sequence `(L, E)` and optionally its mask (`L`).
pub fn gru(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    build(args, inputs, false)
}

/// `augru`: `hidden` (required); inputs the sequence `(L, E)`, its attention scores (`L`,
/// e.g. `target_attention` with `output = "scores"`) and optionally its mask -> the final
/// state (`H`).
pub fn augru(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    build(args, inputs, true)
}

fn build(args: &mut LayerArgs, inputs: &[Shape], attention: bool) -> Result<Box<dyn Layer>, String> {
    let hidden = args.required_usize("hidden")?;
    let all = match (attention, args.string("output")?.as_deref()) {
        (_, None | Some("last")) => false,
        (false, Some("all")) => true,
        (_, Some(other)) => return Err(format!("output must be \"last\" or \"all\" (gru only), got {other:?}")),
    };
    args.finish()?;
    let seq = inputs.first().ok_or("takes a sequence")?;
    let extra = &inputs[1..];
    let wanted = if attention {
        "the sequence, its attention scores and optionally its mask"
    } else {
        "the sequence and optionally its mask"
    };
    let (scores, mask) = match (attention, extra) {
        (false, []) => (None, None),
        (false, [m]) => (None, Some(m)),
        (true, [a]) => (Some(a), None),
        (true, [a, m]) => (Some(a), Some(m)),
        _ => return Err(format!("takes {wanted}, got {} inputs", inputs.len())),
    };
    for (what, s) in [("attention scores", scores), ("mask", mask)] {
        if let Some(s) = s {
            if s.size() != seq.fields {
                return Err(format!("the {what} have {} values for a sequence of {}", s.size(), seq.fields));
            }
        }
    }
    if hidden == 0 || seq.dim == 0 {
        return Err("hidden and the sequence's vectors must be non-empty".into());
    }
    Ok(Box::new(GruLayer { len: seq.fields, input: seq.dim, hidden, all, attention, masked: mask.is_some() }))
}

/// Offsets of the scratch's regions for `rows` samples: the input projections `(rows L, 3H)`,
/// the states `(L + 1, rows, H)`, and per step the gates r, z, n and `h Whn + bhn` `(L, rows, H)`.
struct Regions {
    xg: usize,
    h: usize,
    r: usize,
    z: usize,
    n: usize,
    hn: usize,
    end: usize,
}

impl GruLayer {
    fn regions(&self, rows: usize) -> Regions {
        let (l, h) = (self.len, self.hidden);
        let xg = 0;
        let hs = xg + rows * l * 3 * h;
        let r = hs + (l + 1) * rows * h;
        let z = r + l * rows * h;
        let n = z + l * rows * h;
        let hn = n + l * rows * h;
        Regions { xg, h: hs, r, z, n, hn, end: hn + l * rows * h }
    }

    /// Parameter offsets: input weights `(E, 3H)`, recurrent weights `(H, 3H)`, their biases.
    fn offsets(&self) -> (usize, usize, usize, usize) {
        let (e, h) = (self.input, self.hidden);
        let wi = 0;
        let wh = wi + e * 3 * h;
        let bi = wh + h * 3 * h;
        (wi, wh, bi, bi + 3 * h)
    }

    fn valid(&self, x: &[&[f32]], r: usize, t: usize) -> bool {
        !self.masked || super::is_real(x[x.len() - 1][r * self.len + t])
    }

    fn score(&self, x: &[&[f32]], r: usize, t: usize) -> f32 {
        if self.attention {
            x[1][r * self.len + t]
        } else {
            1.0
        }
    }
}

impl Layer for GruLayer {
    fn output(&self) -> Shape {
        if self.all {
            Shape { fields: self.len, dim: self.hidden }
        } else {
            Shape::flat(self.hidden)
        }
    }

    fn params(&self) -> Vec<DenseParam> {
        let (e, h) = (self.input, self.hidden);
        let init = Init::Uniform { scale: 1.0 / (h as f32).sqrt() };
        vec![
            DenseParam::new("w_input", e * 3 * h, init),
            DenseParam::new("w_state", h * 3 * h, init),
            DenseParam::new("b_input", 3 * h, init),
            DenseParam::new("b_state", 3 * h, init),
        ]
    }

    fn scratch(&self) -> usize {
        self.regions(1).end + self.hidden
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let (rows, l, e, h) = (ctx.rows, self.len, self.input, self.hidden);
        let g = self.regions(rows);
        let (wi, wh, bi, bh) = self.offsets();
        let (xg, rest) = scratch[g.xg..].split_at_mut(g.h - g.xg);
        matmul(rows * l, 3 * h, e, xg, false, x[0], (e, 1), &params[wi..wi + e * 3 * h], (3 * h, 1));
        for row in xg.chunks_exact_mut(3 * h) {
            row.iter_mut().zip(&params[bi..bi + 3 * h]).for_each(|(v, b)| *v += b);
        }
        let (states, gates) = rest.split_at_mut(g.r - g.h);
        states[..rows * h].fill(0.0);
        let mut hh = vec![0.0f32; rows * 3 * h];
        for t in 0..l {
            let (before, after) = states.split_at_mut((t + 1) * rows * h);
            let prev = &before[t * rows * h..];
            let next = &mut after[..rows * h];
            matmul(rows, 3 * h, h, &mut hh, false, prev, (h, 1), &params[wh..wh + h * 3 * h], (3 * h, 1));
            for r in 0..rows {
                let (p, o) = (&prev[r * h..(r + 1) * h], &mut next[r * h..(r + 1) * h]);
                let at = t * rows * h + r * h;
                if !self.valid(x, r, t) {
                    o.copy_from_slice(p);
                    continue;
                }
                let a = self.score(x, r, t);
                let xr = &xg[(r * l + t) * 3 * h..(r * l + t + 1) * 3 * h];
                let hr = &hh[r * 3 * h..(r + 1) * 3 * h];
                for k in 0..h {
                    let rg = sigmoid(xr[k] + hr[k] + params[bh + k]);
                    let zg = sigmoid(xr[h + k] + hr[h + k] + params[bh + h + k]);
                    let hn = hr[2 * h + k] + params[bh + 2 * h + k];
                    let ng = (xr[2 * h + k] + rg * hn).tanh();
                    let u = a * (1.0 - zg);
                    o[k] = (1.0 - u) * p[k] + u * ng;
                    let base = at + k;
                    gates[base] = rg;
                    gates[(g.z - g.r) + base] = zg;
                    gates[(g.n - g.r) + base] = ng;
                    gates[(g.hn - g.r) + base] = hn;
                }
            }
        }
        for r in 0..rows {
            if self.all {
                for t in 0..l {
                    let out = &mut y[(r * l + t) * h..(r * l + t + 1) * h];
                    if self.valid(x, r, t) {
                        out.copy_from_slice(&states[(t + 1) * rows * h + r * h..][..h]);
                    } else {
                        out.fill(0.0);
                    }
                }
            } else {
                y[r * h..(r + 1) * h].copy_from_slice(&states[l * rows * h + r * h..][..h]);
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        use crate::onnx::Attr;
        if self.attention {
            return Err("has no ONNX form: ONNX's GRU has no attention-scaled update gate (AUGRU)".into());
        }
        let (l, e, h) = (self.len as i64, self.input, self.hidden);
        let (wi, wh, bi, bh) = self.offsets();
        // ONNX wants each gate's weights as rows, in the order update, reset, new.
        let gate_rows = |w: &[f32], inputs: usize| -> Vec<f32> {
            let mut out = Vec::with_capacity(w.len());
            for gate in [1, 0, 2] {
                for k in 0..h {
                    out.extend((0..inputs).map(|i| w[i * 3 * h + gate * h + k]));
                }
            }
            out
        };
        let reorder = |b: &[f32]| -> Vec<f32> {
            [1, 0, 2].iter().flat_map(|&gate| b[gate * h..(gate + 1) * h].to_vec()).collect()
        };
        let w = g.floats("w", &[1, 3 * h, e], &gate_rows(&params[wi..wi + e * 3 * h], e));
        let rw = g.floats("r", &[1, 3 * h, h], &gate_rows(&params[wh..wh + h * 3 * h], h));
        let mut b = reorder(&params[bi..bi + 3 * h]);
        b.extend(reorder(&params[bh..bh + 3 * h]));
        let b = g.floats("b", &[1, 6 * h], &b);
        let seq = g.reshape(x[0], &[-1, l, e as i64]);
        let seq = g.op("Transpose", &[&seq], vec![Attr::Ints("perm", vec![1, 0, 2])]);
        let lens = if self.masked {
            let real = super::export_real(g, x[x.len() - 1]);
            let real = g.op("Cast", &[&real], vec![Attr::Int("to", crate::onnx::proto::data_type::INT32 as i64)]);
            g.reduce_sum(&real, &[1], false)
        } else {
            String::new()
        };
        let attrs = vec![Attr::Int("hidden_size", h as i64), Attr::Int("linear_before_reset", 1)];
        let (all, last) = (format!("{y}/all"), format!("{y}/last"));
        g.op_outputs("GRU", &[&seq, &w, &rw, &b, &lens], attrs, &[&all, &last]);
        if self.all {
            // (L, 1, N, H) -> (N, L, H); ONNX zeroes the positions past each sequence's length.
            let states = g.op("Transpose", &[&all], vec![Attr::Ints("perm", vec![2, 0, 1, 3])]);
            g.reshape_to(&states, &[-1, l * h as i64], y);
        } else {
            g.reshape_to(&last, &[-1, h as i64], y);
        }
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
        let (rows, l, e, h) = (ctx.rows, self.len, self.input, self.hidden);
        let g = self.regions(rows);
        let (wi, wh, bi, bh) = self.offsets();
        let s = &scratch[..g.end];
        let mut dh = vec![0.0f32; rows * h];
        if !self.all {
            dh.copy_from_slice(&dy[..rows * h]);
        }
        let mut dxg = vec![0.0f32; rows * l * 3 * h];
        let mut dhg = vec![0.0f32; rows * 3 * h];
        let mut dscores = vec![0.0f32; if self.attention { rows * l } else { 0 }];
        for t in (0..l).rev() {
            let prev = &s[g.h + t * rows * h..g.h + (t + 1) * rows * h];
            dhg.fill(0.0);
            for r in 0..rows {
                if !self.valid(x, r, t) {
                    continue;
                }
                if self.all {
                    for k in 0..h {
                        dh[r * h + k] += dy[(r * l + t) * h + k];
                    }
                }
                let a = self.score(x, r, t);
                let at = t * rows * h + r * h;
                for k in 0..h {
                    let (rg, zg, ng, hn) = (s[g.r + at + k], s[g.z + at + k], s[g.n + at + k], s[g.hn + at + k]);
                    let (d, p) = (dh[r * h + k], prev[r * h + k]);
                    let u = a * (1.0 - zg);
                    // h' = (1 - u) p + u n.
                    let dn = d * u;
                    let du = d * (ng - p);
                    if self.attention {
                        dscores[r * l + t] += du * (1.0 - zg);
                    }
                    let dz = -du * a;
                    let dan = dn * (1.0 - ng * ng);
                    let dar = dan * hn * rg * (1.0 - rg);
                    let daz = dz * zg * (1.0 - zg);
                    let xi = (r * l + t) * 3 * h;
                    dxg[xi + k] = dar;
                    dxg[xi + h + k] = daz;
                    dxg[xi + 2 * h + k] = dan;
                    dhg[r * 3 * h + k] = dar;
                    dhg[r * 3 * h + h + k] = daz;
                    dhg[r * 3 * h + 2 * h + k] = dan * rg;
                    dh[r * h + k] = d * (1.0 - u);
                }
            }
            // The recurrent weights and biases, and the previous state's gradient.
            matmul(h, 3 * h, rows, &mut grads[wh..wh + h * 3 * h], true, prev, (1, h), &dhg, (3 * h, 1));
            for row in dhg.chunks_exact(3 * h) {
                grads[bh..bh + 3 * h].iter_mut().zip(row).for_each(|(gr, d)| *gr += d);
            }
            matmul(rows, h, 3 * h, &mut dh, true, &dhg, (3 * h, 1), &params[wh..wh + h * 3 * h], (1, 3 * h));
        }
        matmul(e, 3 * h, rows * l, &mut grads[wi..wi + e * 3 * h], true, x[0], (1, e), &dxg, (3 * h, 1));
        for row in dxg.chunks_exact(3 * h) {
            grads[bi..bi + 3 * h].iter_mut().zip(row).for_each(|(gr, d)| *gr += d);
        }
        if let Some(dx0) = dx[0].as_deref_mut() {
            matmul(rows * l, e, 3 * h, dx0, true, &dxg, (3 * h, 1), &params[wi..wi + e * 3 * h], (1, 3 * h));
        }
        if self.attention {
            if let Some(da) = dx[1].as_deref_mut() {
                da.iter_mut().zip(&dscores).for_each(|(a, b)| *a += b);
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
    fn gru_and_augru_match_finite_differences() {
        let seq = Shape { fields: 4, dim: 3 };
        for json in [r#"{"hidden": 2}"#, r#"{"hidden": 3, "output": "all"}"#] {
            let layer = gru(&mut args(json), &[seq]).unwrap();
            check_layer(layer.as_ref(), &[seq], 3, 1).unwrap_or_else(|e| panic!("{json}: {e}"));
            let masked = gru(&mut args(json), &[seq, Shape::flat(4)]).unwrap();
            check_layer(masked.as_ref(), &[seq, Shape::flat(4)], 3, 2).unwrap_or_else(|e| panic!("{json} masked: {e}"));
        }
        let layer = augru(&mut args(r#"{"hidden": 2}"#), &[seq, Shape::flat(4)]).unwrap();
        check_layer(layer.as_ref(), &[seq, Shape::flat(4)], 3, 3).unwrap();
        let masked = augru(&mut args(r#"{"hidden": 2}"#), &[seq, Shape::flat(4), Shape::flat(4)]).unwrap();
        check_layer(masked.as_ref(), &[seq, Shape::flat(4), Shape::flat(4)], 3, 4).unwrap();
    }

    #[test]
    fn a_masked_position_keeps_the_state_and_a_zero_score_too() {
        let seq = Shape { fields: 3, dim: 1 };
        let layer = augru(&mut args(r#"{"hidden": 1}"#), &[seq, Shape::flat(3), Shape::flat(3)]).unwrap();
        let params: Vec<f32> =
            (0..layer.params().iter().map(|p| p.len).sum::<usize>()).map(|k| 0.3 + 0.1 * k as f32).collect();
        let mut scratch = vec![0.0; layer.scratch()];
        let ctx = Ctx { rows: 1, train: false, seeds: &[] };
        let run = |scores: &[f32], mask: &[f32], scratch: &mut Vec<f32>| {
            let mut y = [0.0];
            layer.forward(&ctx, &params, &[&[1.0, -2.0, 0.5], scores, mask], &mut y, scratch);
            y[0]
        };
        let two = run(&[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0], &mut scratch);
        assert_eq!(two, run(&[1.0, 1.0, 0.7], &[1.0, 1.0, 0.0], &mut scratch), "masked: the state is kept");
        assert_eq!(two, run(&[1.0, 1.0, 0.0], &[1.0, 1.0, 1.0], &mut scratch));
        assert_ne!(two, run(&[1.0, 1.0, 0.5], &[1.0, 1.0, 1.0], &mut scratch), "a score moves the state");
    }

    #[test]
    fn gru_refuses_bad_inputs() {
        let seq = Shape { fields: 3, dim: 2 };
        assert!(gru(&mut args("{}"), &[seq]).unwrap_err().contains("hidden"));
        let e = augru(&mut args(r#"{"hidden": 2}"#), &[seq, Shape::flat(2)]).unwrap_err();
        assert!(e.contains("2 values for a sequence of 3"), "{e}");
        assert!(augru(&mut args(r#"{"hidden": 2, "output": "all"}"#), &[seq, Shape::flat(3)]).is_err());
    }
}
