//! Reusable network pieces on flat f32 slices: matrix multiply, a linear layer, activations,
//! a stack of layers (MLP), embedding gather/scatter and losses. Pure math: no I/O, no tables.
//!
//! Parameters live in one flat vector (the dense vector the servers hold) and every layer knows
//! its offsets into it, so a pull lands straight in the model and the gradient vector pushes
//! without conversion. Matrices are row-major, one sample per row. The matrix multiply is the
//! `gemm` crate (chosen from `../shared/research/deps.md`: it matched PyTorch+MKL on this
//! machine), called single-threaded: a trainer parallelizes over the batch instead.
//!
//! Gradients are sums over the batch (losses return sums too); the server divides by the
//! number of samples, so several trainers' pushes add up exactly like one larger batch.

use crate::table::{DenseParam, Init};

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)`; `a` and `b` are given with (row, column)
/// strides, so transposes cost nothing.
#[allow(clippy::too_many_arguments)]
pub fn matmul(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [f32],
    accumulate: bool,
    a: &[f32],
    a_strides: (usize, usize),
    b: &[f32],
    b_strides: (usize, usize),
) {
    if m == 0 || n == 0 {
        return;
    }
    let last = |rs: usize, cs: usize, rows: usize, cols: usize| (rows - 1) * rs + (cols - 1) * cs;
    assert!(dst.len() >= m * n, "matmul: dst too small");
    if k > 0 {
        assert!(a.len() > last(a_strides.0, a_strides.1, m, k), "matmul: lhs too small");
        assert!(b.len() > last(b_strides.0, b_strides.1, k, n), "matmul: rhs too small");
    } else if !accumulate {
        dst[..m * n].fill(0.0);
        return;
    }
    // SAFETY: the asserts above keep every index gemm computes from the given sizes and strides
    // inside the three slices; dst does not alias a or b (it is a distinct &mut).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_strides.1 as isize,
            a_strides.0 as isize,
            b.as_ptr(),
            b_strides.1 as isize,
            b_strides.0 as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `y = x W + b`, with `W` (input x output) and `b` stored in the flat parameter vector.
#[derive(Clone, Debug)]
pub struct Linear {
    /// Input width.
    pub input: usize,
    /// Output width.
    pub output: usize,
    /// Offset of `W` in the flat parameters.
    pub w: usize,
    /// Offset of `b` in the flat parameters.
    pub b: usize,
}

impl Linear {
    /// A layer whose parameters start at `offset`, with their specs (PyTorch's default
    /// initialization: uniform in +-1/sqrt(input) for weights and bias).
    pub fn new(name: &str, input: usize, output: usize, offset: usize) -> (Linear, Vec<DenseParam>) {
        let scale = 1.0 / (input as f32).sqrt();
        let layer = Linear { input, output, w: offset, b: offset + input * output };
        let params = vec![
            DenseParam { name: format!("{name}.w"), len: input * output, init: Init::Uniform { scale } },
            DenseParam { name: format!("{name}.b"), len: output, init: Init::Uniform { scale } },
        ];
        (layer, params)
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.input * self.output + self.output
    }

    /// Always false: a layer has at least its bias.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// `y (rows x output) = x (rows x input) W + b`.
    pub fn forward(&self, params: &[f32], x: &[f32], rows: usize, y: &mut [f32]) {
        let (i, o) = (self.input, self.output);
        let bias = &params[self.b..self.b + o];
        for r in 0..rows {
            y[r * o..(r + 1) * o].copy_from_slice(bias);
        }
        matmul(rows, o, i, y, true, x, (i, 1), &params[self.w..self.w + i * o], (o, 1));
    }

    /// Adds `dW = x^T dy` and `db = sum dy` into `grads`; writes `dx = dy W^T` if asked.
    pub fn backward(
        &self,
        params: &[f32],
        x: &[f32],
        dy: &[f32],
        rows: usize,
        grads: &mut [f32],
        dx: Option<&mut [f32]>,
    ) {
        let (i, o) = (self.input, self.output);
        matmul(i, o, rows, &mut grads[self.w..self.w + i * o], true, x, (1, i), dy, (o, 1));
        let db = &mut grads[self.b..self.b + o];
        for r in 0..rows {
            db.iter_mut().zip(&dy[r * o..(r + 1) * o]).for_each(|(g, d)| *g += d);
        }
        if let Some(dx) = dx {
            matmul(rows, i, o, dx, false, dy, (o, 1), &params[self.w..self.w + i * o], (1, o));
        }
    }
}

/// Element-wise non-linearity after a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// max(0, z).
    Relu,
    /// 1 / (1 + e^-z).
    Sigmoid,
    /// z.
    Identity,
}

impl Activation {
    /// Applies the activation in place.
    pub fn forward(self, z: &mut [f32]) {
        match self {
            Activation::Relu => z.iter_mut().for_each(|v| *v = v.max(0.0)),
            Activation::Sigmoid => z.iter_mut().for_each(|v| *v = sigmoid(*v)),
            Activation::Identity => {}
        }
    }

    /// Turns `dy` (gradient w.r.t. the activation's output `y`) into the gradient w.r.t. its input.
    pub fn backward(self, y: &[f32], dy: &mut [f32]) {
        match self {
            Activation::Relu => dy.iter_mut().zip(y).for_each(|(d, &y)| {
                if y <= 0.0 {
                    *d = 0.0
                }
            }),
            Activation::Sigmoid => dy.iter_mut().zip(y).for_each(|(d, &y)| *d *= y * (1.0 - y)),
            Activation::Identity => {}
        }
    }
}

/// The logistic function, stable for large |z|.
#[inline]
pub fn sigmoid(z: f32) -> f32 {
    if z >= 0.0 {
        1.0 / (1.0 + (-z).exp())
    } else {
        let e = z.exp();
        e / (1.0 + e)
    }
}

/// A stack of linear layers, each followed by its activation.
#[derive(Clone, Debug)]
pub struct Mlp {
    /// The layers.
    pub layers: Vec<Linear>,
    /// One activation per layer.
    pub activations: Vec<Activation>,
}

/// Buffers an [`Mlp`] reuses from step to step.
#[derive(Default)]
pub struct MlpWork {
    /// Output of every layer (after its activation).
    outs: Vec<Vec<f32>>,
    grad: Vec<f32>,
    grad_in: Vec<f32>,
}

impl Mlp {
    /// Layers of `widths[0] -> widths[1] -> ...`, named `name.0`, `name.1`, ..., parameters
    /// starting at `offset`; hidden layers use `hidden`, the last one `last`.
    pub fn new(
        name: &str,
        widths: &[usize],
        hidden: Activation,
        last: Activation,
        offset: usize,
    ) -> (Mlp, Vec<DenseParam>) {
        let (mut layers, mut activations, mut params) = (Vec::new(), Vec::new(), Vec::new());
        let mut at = offset;
        for (l, w) in widths.windows(2).enumerate() {
            let (layer, p) = Linear::new(&format!("{name}.{l}"), w[0], w[1], at);
            at += layer.len();
            layers.push(layer);
            activations.push(if l + 2 == widths.len() { last } else { hidden });
            params.extend(p);
        }
        (Mlp { layers, activations }, params)
    }

    /// Output width.
    pub fn output(&self) -> usize {
        self.layers.last().map_or(0, |l| l.output)
    }

    /// Runs the stack on `x` (rows x input); the result is `work.output()`.
    pub fn forward(&self, params: &[f32], x: &[f32], rows: usize, work: &mut MlpWork) {
        work.outs.resize_with(self.layers.len(), Vec::new);
        for (l, layer) in self.layers.iter().enumerate() {
            let (before, after) = work.outs.split_at_mut(l);
            let input = if l == 0 { x } else { &before[l - 1][..] };
            let out = &mut after[0];
            out.resize(rows * layer.output, 0.0);
            layer.forward(params, input, rows, out);
            self.activations[l].forward(out);
        }
    }

    #[allow(clippy::too_many_arguments)]
    /// Back-propagates `dy` (gradient w.r.t. the final output, after its activation), adding
    /// parameter gradients into `grads`; writes the gradient w.r.t. `x` into `dx` if asked.
    pub fn backward(
        &self,
        params: &[f32],
        x: &[f32],
        dy: &[f32],
        rows: usize,
        work: &mut MlpWork,
        grads: &mut [f32],
        dx: Option<&mut [f32]>,
    ) {
        work.grad.clear();
        work.grad.extend_from_slice(dy);
        let mut dx = dx;
        for l in (0..self.layers.len()).rev() {
            let layer = &self.layers[l];
            self.activations[l].backward(&work.outs[l], &mut work.grad);
            let input = if l == 0 { x } else { &work.outs[l - 1][..] };
            if l == 0 {
                layer.backward(params, input, &work.grad, rows, grads, dx.as_deref_mut());
            } else {
                work.grad_in.resize(rows * layer.input, 0.0);
                layer.backward(params, input, &work.grad, rows, grads, Some(&mut work.grad_in));
                std::mem::swap(&mut work.grad, &mut work.grad_in);
            }
        }
    }
}

impl MlpWork {
    /// The last forward pass's output.
    pub fn output(&self) -> &[f32] {
        self.outs.last().map_or(&[], |v| &v[..])
    }
}

/// Copies embedding rows into an input matrix: for sample `r` and slot `s`, the `dim` floats of
/// row `index[r * slots + s]` of `rows` go to columns `s*dim..` of row `r` of `x` (width `stride`).
pub fn gather_rows(rows: &[f32], index: &[u32], slots: usize, dim: usize, x: &mut [f32], stride: usize) {
    for (k, &u) in index.iter().enumerate() {
        let (r, s) = (k / slots, k % slots);
        let u = u as usize;
        x[r * stride + s * dim..r * stride + (s + 1) * dim].copy_from_slice(&rows[u * dim..(u + 1) * dim]);
    }
}

/// The reverse of [`gather_rows`]: adds the input-gradient columns back onto their rows.
pub fn scatter_add_rows(dx: &[f32], index: &[u32], slots: usize, dim: usize, stride: usize, row_grads: &mut [f32]) {
    for (k, &u) in index.iter().enumerate() {
        let (r, s) = (k / slots, k % slots);
        let u = u as usize;
        let src = &dx[r * stride + s * dim..r * stride + (s + 1) * dim];
        row_grads[u * dim..(u + 1) * dim].iter_mut().zip(src).for_each(|(g, d)| *g += d);
    }
}

/// Binary log-loss on logits: returns the loss summed over samples and writes
/// `d loss / d logit = sigmoid(z) - y` and the predicted probabilities.
pub fn bce_with_logits(logits: &[f32], labels: &[f32], dlogits: &mut [f32], probs: &mut [f32]) -> f64 {
    let mut loss = 0.0f64;
    for i in 0..logits.len() {
        let (z, y) = (logits[i], labels[i]);
        // log(1 + e^z) - y z, written to avoid overflow.
        loss += (z.max(0.0) - z * y + (-z.abs()).exp().ln_1p()) as f64;
        let p = sigmoid(z);
        probs[i] = p;
        dlogits[i] = p - y;
    }
    loss
}

/// Mean squared error's per-sample term on predictions: returns `sum (z - y)^2` and writes
/// `d loss / d z = 2 (z - y)` (PaddlePaddle's `square_error_cost`, summed instead of averaged:
/// servers divide by the batch's sample count).
pub fn square_error(preds: &[f32], labels: &[f32], dpreds: &mut [f32]) -> f64 {
    let mut loss = 0.0f64;
    for i in 0..preds.len() {
        let e = preds[i] - labels[i];
        loss += (e as f64) * (e as f64);
        dpreds[i] = 2.0 * e;
    }
    loss
}

/// Softmax cross-entropy over `classes` logits per sample with integer class labels: returns
/// the summed `-ln p(label)` and writes `d loss / d logit = softmax - onehot`. Labels must be
/// checked to lie in `0..classes` beforehand.
pub fn softmax_cross_entropy(logits: &[f32], labels: &[f32], classes: usize, dlogits: &mut [f32]) -> f64 {
    let mut loss = 0.0f64;
    for (r, (z, d)) in logits.chunks_exact(classes).zip(dlogits.chunks_exact_mut(classes)).enumerate() {
        let max = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut sum = 0.0f32;
        for (dv, &zv) in d.iter_mut().zip(z) {
            *dv = (zv - max).exp();
            sum += *dv;
        }
        let label = labels[r] as usize;
        loss += (sum.ln() - (z[label] - max)) as f64;
        let inv = 1.0 / sum;
        d.iter_mut().for_each(|v| *v *= inv);
        d[label] -= 1.0;
    }
    loss
}

#[cfg(test)]
mod tests {
    use super::*;

    fn init(params: &[DenseParam]) -> Vec<f32> {
        let spec = crate::table::DenseSpec {
            params: params.to_vec(),
            block_size: 64,
            seed: 11,
            optimizer: crate::table::Optimizer::sgd(0.1),
        };
        let mut v = vec![0.0; spec.total()];
        spec.init_range(0, &mut v);
        v
    }

    fn loss(mlp: &Mlp, params: &[f32], x: &[f32], labels: &[f32], rows: usize) -> f64 {
        let mut work = MlpWork::default();
        mlp.forward(params, x, rows, &mut work);
        let out = work.output().to_vec();
        let (mut d, mut p) = (vec![0.0; rows], vec![0.0; rows]);
        bce_with_logits(&out, labels, &mut d, &mut p)
    }

    /// Analytic gradients of a small ReLU/sigmoid MLP with log-loss match central finite
    /// differences (in f64 terms, within f32 noise).
    #[test]
    fn mlp_gradients_match_finite_differences() {
        let (mlp, specs) = Mlp::new("t", &[5, 7, 6, 1], Activation::Relu, Activation::Identity, 0);
        let mut mlp = mlp;
        mlp.activations[1] = Activation::Sigmoid;
        let params = init(&specs);
        let rows = 4;
        let x: Vec<f32> = (0..rows * 5).map(|i| ((i * 37 % 11) as f32 - 5.0) / 4.0).collect();
        let labels = [1.0, 0.0, 0.0, 1.0];
        let mut work = MlpWork::default();
        mlp.forward(&params, &x, rows, &mut work);
        let out = work.output().to_vec();
        let (mut d, mut p) = (vec![0.0; rows], vec![0.0; rows]);
        bce_with_logits(&out, &labels, &mut d, &mut p);
        let mut grads = vec![0.0; params.len()];
        let mut dx = vec![0.0; rows * 5];
        mlp.backward(&params, &x, &d, rows, &mut work, &mut grads, Some(&mut dx));

        let eps = 1e-2f32;
        for k in (0..params.len()).step_by(3) {
            let (mut hi, mut lo) = (params.clone(), params.clone());
            hi[k] += eps;
            lo[k] -= eps;
            let numeric =
                (loss(&mlp, &hi, &x, &labels, rows) - loss(&mlp, &lo, &x, &labels, rows)) / (2.0 * eps as f64);
            assert!(
                (numeric - grads[k] as f64).abs() < 2e-3 + 2e-2 * numeric.abs(),
                "param {k}: numeric {numeric}, analytic {}",
                grads[k]
            );
        }
        for k in 0..x.len() {
            let (mut hi, mut lo) = (x.clone(), x.clone());
            hi[k] += eps;
            lo[k] -= eps;
            let numeric = (loss(&mlp, &params, &hi, &labels, rows) - loss(&mlp, &params, &lo, &labels, rows))
                / (2.0 * eps as f64);
            assert!(
                (numeric - dx[k] as f64).abs() < 2e-3 + 2e-2 * numeric.abs(),
                "input {k}: numeric {numeric}, analytic {}",
                dx[k]
            );
        }
    }

    #[test]
    fn matmul_handles_transposed_views() {
        // a = [[1,2],[3,4]], b = [[5,6],[7,8]]; a^T b = [[26,30],[38,44]].
        let (a, b) = ([1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let mut c = [0.0; 4];
        matmul(2, 2, 2, &mut c, false, &a, (1, 2), &b, (2, 1));
        assert_eq!(c, [26.0, 30.0, 38.0, 44.0]);
        matmul(2, 2, 2, &mut c, true, &a, (2, 1), &b, (2, 1));
        assert_eq!(c, [26.0 + 19.0, 30.0 + 22.0, 38.0 + 43.0, 44.0 + 50.0]);
    }

    #[test]
    fn softmax_cross_entropy_matches_finite_differences_and_is_stable() {
        let logits = [0.5f32, -1.0, 2.0, 300.0, 0.0, -300.0];
        let labels = [2.0f32, 1.0];
        let mut d = [0.0f32; 6];
        let l = softmax_cross_entropy(&logits, &labels, 3, &mut d);
        assert!(l.is_finite() && (l - (0.24131 + 300.0)).abs() < 1e-3, "{l}");
        let eps = 1e-2f32;
        for k in 0..3 {
            let (mut hi, mut lo) = (logits, logits);
            hi[k] += eps;
            lo[k] -= eps;
            let mut scratch = [0.0f32; 6];
            let numeric = (softmax_cross_entropy(&hi, &labels, 3, &mut scratch)
                - softmax_cross_entropy(&lo, &labels, 3, &mut scratch))
                / (2.0 * eps as f64);
            assert!((numeric - d[k] as f64).abs() < 1e-3, "logit {k}: {numeric} vs {}", d[k]);
        }
        let mut e = [0.0f32; 2];
        assert_eq!(square_error(&[3.0, 1.0], &[1.0, 1.0], &mut e), 4.0);
        assert_eq!(e, [4.0, 0.0]);
    }

    #[test]
    fn log_loss_is_stable_for_large_logits() {
        let (mut d, mut p) = ([0.0; 2], [0.0; 2]);
        let l = bce_with_logits(&[100.0, -100.0], &[0.0, 1.0], &mut d, &mut p);
        assert!((l - 200.0).abs() < 1e-3, "{l}");
        assert_eq!(d, [1.0, -1.0]);
    }
}
