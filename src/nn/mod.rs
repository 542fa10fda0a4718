//! Reusable network pieces on flat f32 slices: matrix multiply, a linear layer, activations and
//! losses (`bce_with_logits`, `square_error`, `softmax_cross_entropy`), the
//! [`Layer`](layer::Layer) trait with its finite-difference check, and the layer catalogue
//! ([`layers`]). Pure math: no I/O, no tables.
//!
//! Parameters live in one flat vector (the dense vector the servers hold) and every layer knows
//! its offsets into it, so a pull lands straight in the model and the gradient vector pushes
//! without conversion. Matrices are row-major, one sample per row.
//!
//! Why hand-written layers over the `gemm` crate: `../shared/research/deps.md` measured it at
//! PyTorch+MKL speed on this machine (32k samples/s per thread on the CTR-DNN) with a 79 s clean
//! build, where candle was 30% slower and burn took 13 minutes to build. Every layer writes its
//! own backward, held to finite differences, and flat `Vec<f32>` buffers are exactly what the
//! servers move. gemm's `x86-v4` feature lets it use AVX-512 where the CPU has it (checked at run
//! time).
//!
//! The matrix multiply runs single-threaded: a trainer runs data-parallel replicas over the
//! batch's rows instead (`--threads`), because the same measurements showed intra-op threading
//! collapsing when another process holds a core, which is always so when servers and trainers
//! share a machine.
//!
//! Gradients are sums over the batch (losses return sums too); the server divides by the
//! number of samples, so several trainers' pushes add up exactly like one larger batch.

/// Most vectors one tensor holds per sample (a sequence's positions, a concat's fields).
pub const MAX_FIELDS: usize = 1 << 16;

/// Most floats one tensor holds per sample (64 MiB).
pub const MAX_TENSOR_FLOATS: usize = 1 << 24;

#[cfg(target_arch = "x86_64")]
pub mod bf16;
pub mod layer;
pub mod layers;
pub mod record;
mod small;

use std::cell::Cell;

use crate::table::{DenseParam, Init};

/// What a matrix product's operands are rounded to; sums are f32 in both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// f32 operands (the default).
    #[default]
    #[serde(alias = "fp32", alias = "float32")]
    F32,
    /// bf16 operands, f32 sums: `vdpbf16ps` where the CPU has AVX512_BF16.
    #[serde(alias = "bfloat16")]
    Bf16,
}

impl Precision {
    /// The precision named `name` (`f32`, `fp32`, `float32`; `bf16`, `bfloat16`).
    pub fn parse(name: &str) -> Result<Precision, String> {
        match name {
            "f32" | "fp32" | "float32" => Ok(Precision::F32),
            "bf16" | "bfloat16" => Ok(Precision::Bf16),
            other => Err(format!("unknown precision {other:?} (f32, bf16)")),
        }
    }

    /// The precision's name in a job file.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }

    /// Whether this CPU computes at `self`; `Err` says why not (its products then stay f32).
    pub fn check_cpu(self) -> Result<(), String> {
        if self == Precision::F32 || bf16_available() {
            Ok(())
        } else {
            Err("precision = \"bf16\" needs a CPU with avx512_bf16; this one has none, so products stay f32".into())
        }
    }
}

/// Whether this CPU has bf16 products (AVX512_BF16).
pub fn bf16_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return bf16::available();
    #[cfg(not(target_arch = "x86_64"))]
    return false;
}

thread_local! {
    /// The precision of this thread's products: set around a training step by
    /// [`with_precision`], so evaluation, prediction and serving stay f32 whatever a job trains in.
    static PRECISION: Cell<Precision> = const { Cell::new(Precision::F32) };
}

/// Runs `f` with this thread's matrix products at `precision` (bf16 only where
/// [`bf16_available`]), then restores the thread's previous precision.
pub fn with_precision<R>(precision: Precision, f: impl FnOnce() -> R) -> R {
    struct Restore(Precision);
    impl Drop for Restore {
        fn drop(&mut self) {
            PRECISION.set(self.0);
        }
    }
    let _restore = Restore(PRECISION.replace(precision));
    f()
}

/// `dst (m x n) = [dst +] a (m x k) * b (k x n)`; `a` and `b` are given with (row, column)
/// strides, so transposes cost nothing. In bf16 inside [`with_precision`] where the CPU has it.
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
    if k == 0 {
        // An empty sum: nothing to add, or zeros.
        if !accumulate {
            dst[..m * n].fill(0.0);
        }
        return;
    }
    assert!(a.len() > last(a_strides.0, a_strides.1, m, k), "matmul: lhs too small");
    assert!(b.len() > last(b_strides.0, b_strides.1, k, n), "matmul: rhs too small");
    record::note(m, n, k, a_strides, b_strides);
    let started = record::start();
    let product = Operands { m, n, k, a, a_strides, b, b_strides };
    if PRECISION.get() == Precision::Bf16 && bf16_available() {
        #[cfg(target_arch = "x86_64")]
        bf16::matmul(&product, dst, accumulate);
    } else if small::fits(&product) {
        small::matmul(&product, dst, accumulate);
    } else {
        gemm_f32(&product, dst, accumulate);
    }
    record::done(started, m, n, k);
}

/// The operands of a product [`matmul`] has checked: `a (m x k)` and `b (k x n)` with their
/// (row, column) strides, `m`, `n` and `k` positive.
#[derive(Clone, Copy)]
pub(crate) struct Operands<'a> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: &'a [f32],
    pub a_strides: (usize, usize),
    pub b: &'a [f32],
    pub b_strides: (usize, usize),
}

/// [`matmul`] in f32 by the `gemm` crate.
fn gemm_f32(p: &Operands, dst: &mut [f32], accumulate: bool) {
    // SAFETY: `matmul`'s asserts keep every index gemm computes from the given sizes and strides
    // inside the three slices; dst does not alias a or b (it is a distinct &mut).
    unsafe {
        gemm::gemm(
            p.m,
            p.n,
            p.k,
            dst.as_mut_ptr(),
            1,
            p.n as isize,
            accumulate,
            p.a.as_ptr(),
            p.a_strides.1 as isize,
            p.a_strides.0 as isize,
            p.b.as_ptr(),
            p.b_strides.1 as isize,
            p.b_strides.0 as isize,
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
            DenseParam::new(format!("{name}.w"), input * output, Init::Uniform { scale }),
            DenseParam::new(format!("{name}.b"), output, Init::Uniform { scale }),
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

    /// Writes `x W + b` into `g` (a `Gemm` with the layer's weights as constants); returns
    /// the value's name.
    pub fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &str) -> String {
        let (i, o) = (self.input, self.output);
        let w = g.floats("w", &[i, o], &params[self.w..self.w + i * o]);
        let b = g.floats("b", &[o], &params[self.b..self.b + o]);
        g.op("Gemm", &[x, &w, &b], Vec::new())
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

    /// Adds `dW = x^T dy` and `db = sum dy` into `grads`, and `dx = dy W^T` into `dx` if asked.
    pub fn backward(
        &self,
        params: &[f32],
        x: &[f32],
        dy: &[f32],
        rows: usize,
        grads: &mut [f32],
        dx: Option<&mut [f32]>,
    ) {
        let o = self.output;
        let db = &mut grads[self.b..self.b + o];
        dy[..rows * o].chunks_exact(o).for_each(|d| add_row(db, d));
        self.weight_and_input_grads(params, x, dy, rows, grads, dx);
    }

    /// `act`'s backward through this layer's output `y` and `db = sum dz` in one pass over the
    /// gradient `dy` (made `dz` in place), then `dW = x^T dz` into `grads` and `dx = dz W^T`
    /// into `dx` if asked: [`Activation::backward`] then [`Linear::backward`], with one pass
    /// over the batch's gradient instead of two. The sums are added in the same order, so the
    /// result is the same to the bit.
    #[allow(clippy::too_many_arguments)]
    pub fn backward_through(
        &self,
        act: Activation,
        y: &[f32],
        params: &[f32],
        x: &[f32],
        dy: &mut [f32],
        rows: usize,
        grads: &mut [f32],
        dx: Option<&mut [f32]>,
    ) {
        let o = self.output;
        debug_assert!(y.len() >= rows * o, "an output for every row");
        let db = &mut grads[self.b..self.b + o];
        for (d, y) in dy[..rows * o].chunks_exact_mut(o).zip(y[..rows * o].chunks_exact(o)) {
            act.backward(y, d);
            add_row(db, d);
        }
        self.weight_and_input_grads(params, x, dy, rows, grads, dx);
    }

    /// Adds `dW = x^T dy` into `grads`, and `dx = dy W^T` into `dx` if asked.
    fn weight_and_input_grads(
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
        if let Some(dx) = dx {
            self.input_grad(params, dy, rows, dx, true);
        }
    }

    /// `dx = dy W^T`, added into `dx` or (`accumulate` false) written over it.
    pub fn input_grad(&self, params: &[f32], dy: &[f32], rows: usize, dx: &mut [f32], accumulate: bool) {
        let (i, o) = (self.input, self.output);
        matmul(rows, i, o, dx, accumulate, dy, (o, 1), &params[self.w..self.w + i * o], (1, o));
    }
}

/// Adds one row of a batch's gradient into the bias gradient `db`.
fn add_row(db: &mut [f32], d: &[f32]) {
    db.iter_mut().zip(d).for_each(|(g, d)| *g += d);
}

/// Element-wise non-linearity after a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Activation {
    /// max(0, z).
    Relu,
    /// 1 / (1 + e^-z).
    Sigmoid,
    /// tanh(z).
    Tanh,
    /// z.
    Identity,
}

impl Activation {
    /// Applies the activation in place.
    pub fn forward(self, z: &mut [f32]) {
        match self {
            Activation::Relu => z.iter_mut().for_each(|v| *v = v.max(0.0)),
            Activation::Sigmoid => z.iter_mut().for_each(|v| *v = sigmoid(*v)),
            Activation::Tanh => z.iter_mut().for_each(|v| *v = v.tanh()),
            Activation::Identity => {}
        }
    }

    /// The activation named `name` in a job file.
    pub fn parse(name: &str) -> Result<Activation, String> {
        match name {
            "relu" => Ok(Activation::Relu),
            "sigmoid" => Ok(Activation::Sigmoid),
            "tanh" => Ok(Activation::Tanh),
            "identity" | "none" => Ok(Activation::Identity),
            other => Err(format!("unknown activation {other:?} (relu, sigmoid, tanh, identity)")),
        }
    }

    /// Writes the activation of `x` into the ONNX value `out`.
    pub fn export_onnx(self, g: &mut crate::onnx::Graph, x: &str, out: &str) {
        match self {
            Activation::Relu => g.op_to("Relu", &[x], Vec::new(), out),
            Activation::Sigmoid => g.op_to("Sigmoid", &[x], Vec::new(), out),
            Activation::Tanh => g.op_to("Tanh", &[x], Vec::new(), out),
            Activation::Identity => g.identity(x, out),
        }
    }

    /// Turns `dy` (gradient w.r.t. the activation's output `y`) into the gradient w.r.t. its input.
    pub fn backward(self, y: &[f32], dy: &mut [f32]) {
        match self {
            // A select, not a conditional store: the compiler made the store a branch per
            // float, mispredicted on half of them, where a select is one vector mask.
            Activation::Relu => dy.iter_mut().zip(y).for_each(|(d, &y)| *d = if y <= 0.0 { 0.0 } else { *d }),
            Activation::Sigmoid => dy.iter_mut().zip(y).for_each(|(d, &y)| *d *= y * (1.0 - y)),
            Activation::Tanh => dy.iter_mut().zip(y).for_each(|(d, &y)| *d *= 1.0 - y * y),
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

/// Logits `v` turned into their softmax in place, shifted by the largest so no exponent
/// overflows (a logit of -inf gets probability 0).
pub fn softmax(v: &mut [f32]) {
    let max = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0f32;
    for p in v.iter_mut() {
        *p = (*p - max).exp();
        sum += *p;
    }
    let inv = 1.0 / sum;
    v.iter_mut().for_each(|p| *p *= inv);
}

/// Softmax cross-entropy over `classes` logits per sample with integer class labels: returns
/// the summed `-ln p(label)` and writes `d loss / d logit = softmax - onehot`; with
/// `true_probs`, appends each sample's `p(label)` there. Labels must be checked to lie in
/// `0..classes` beforehand.
pub fn softmax_cross_entropy(
    logits: &[f32],
    labels: &[f32],
    classes: usize,
    dlogits: &mut [f32],
    mut true_probs: Option<&mut Vec<f32>>,
) -> f64 {
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
        if let Some(p) = true_probs.as_deref_mut() {
            p.push(d[label]);
        }
        d[label] -= 1.0;
    }
    loss
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backward_through_gives_the_two_passes_gradients_to_the_bit() {
        let (rows, input, output) = (5, 3, 4);
        let (layer, _) = Linear::new("", input, output, 0);
        let wave = |n: usize, k: f32| (0..n).map(|i| (i as f32 * k).sin() * 2.0).collect::<Vec<f32>>();
        let (params, x, dy) = (wave(layer.len(), 0.7), wave(rows * input, 1.3), wave(rows * output, 2.1));
        let mut y = wave(rows * output, 0.4);
        y[3] = f32::NAN;
        y[5] = 0.0;
        for act in [Activation::Relu, Activation::Sigmoid, Activation::Tanh, Activation::Identity] {
            let (mut g1, mut g2) = (wave(layer.len(), 0.1), wave(layer.len(), 0.1));
            let (mut dx1, mut dx2) = (vec![0.5; rows * input], vec![0.5; rows * input]);
            let mut dz = dy.clone();
            act.backward(&y, &mut dz);
            layer.backward(&params, &x, &dz, rows, &mut g1, Some(&mut dx1));
            let mut fused = dy.clone();
            layer.backward_through(act, &y, &params, &x, &mut fused, rows, &mut g2, Some(&mut dx2));
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
            assert_eq!(bits(&fused), bits(&dz), "{act:?}");
            assert_eq!(bits(&g2), bits(&g1), "{act:?}");
            assert_eq!(bits(&dx2), bits(&dx1), "{act:?}");
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
    fn bf16_products_happen_inside_with_precision_alone_and_where_the_cpu_has_them() {
        assert_eq!(Precision::parse("bfloat16"), Ok(Precision::Bf16));
        assert_eq!(Precision::parse("fp32"), Ok(Precision::F32));
        assert_eq!(Precision::parse("fp8"), Err("unknown precision \"fp8\" (f32, bf16)".into()));
        assert_eq!(Precision::Bf16.check_cpu().is_ok(), bf16_available());
        // 1 + 2^-10 is 1 in bf16.
        let product = || {
            let mut c = [0.0f32];
            matmul(1, 1, 1, &mut c, false, &[1.0 + 1.0 / 1024.0], (1, 1), &[1.0], (1, 1));
            c[0]
        };
        let bf16 = with_precision(Precision::Bf16, || (product(), with_precision(Precision::F32, product)));
        let rounded = if bf16_available() { 1.0 } else { 1.0 + 1.0 / 1024.0 };
        assert_eq!(bf16, (rounded, 1.0 + 1.0 / 1024.0), "nested f32 stays f32");
        assert_eq!(product(), 1.0 + 1.0 / 1024.0, "the thread's precision is restored");
    }

    #[test]
    fn softmax_cross_entropy_matches_finite_differences_and_is_stable() {
        let logits = [0.5f32, -1.0, 2.0, 300.0, 0.0, -300.0];
        let labels = [2.0f32, 1.0];
        let mut d = [0.0f32; 6];
        let l = softmax_cross_entropy(&logits, &labels, 3, &mut d, None);
        assert!(l.is_finite() && (l - (0.24131 + 300.0)).abs() < 1e-3, "{l}");
        let eps = 1e-2f32;
        for k in 0..3 {
            let (mut hi, mut lo) = (logits, logits);
            hi[k] += eps;
            lo[k] -= eps;
            let mut scratch = [0.0f32; 6];
            let numeric = (softmax_cross_entropy(&hi, &labels, 3, &mut scratch, None)
                - softmax_cross_entropy(&lo, &labels, 3, &mut scratch, None))
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
