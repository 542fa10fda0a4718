//! The [`Layer`] trait every dense layer of a model graph implements, the [`LayerArgs`] a layer
//! factory reads its job-file settings from (refusing any setting no read asked for), and
//! [`check_layer`], the finite-difference test every layer's backward pass is held to. A layer
//! also writes its evaluation-mode ONNX nodes (`Layer::export_onnx`); one without an ONNX form
//! keeps the default, which refuses, and `oar export` names it.
//!
//! A layer works on flat, sample-major f32 buffers: an input of [`Shape`] `{fields, dim}` holds
//! `fields x dim` floats per sample, samples one after another (`rows x fields x dim`), so
//! reshapes and flattening cost nothing and threads split a batch by rows. It owns no
//! parameters: the graph places the [`DenseParam`]s it declares in the model's flat dense vector
//! (so on the servers' blocks) and hands the layer its own slice on every call, so a pull lands
//! straight in the model, a layer cannot write over another's parameters, and a custom layer
//! needs no knowledge of servers. Backward *adds* into the parameter and input gradients (gemm
//! accumulates for free), so a tensor that feeds several layers needs no copies, and gradients
//! are sums over the batch (the servers divide by the number of samples).
//!
//! Not an autograd library: `../shared/research/deps.md` measured candle's autograd at 65% of
//! hand-written gemm on this network.

use crate::table::DenseParam;

/// One sample's part of a tensor: `fields` vectors of `dim` floats (a flat tensor has one
/// field). `(B, F, D)` and `(B, F * D)` are the same bytes, so reshapes cost nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shape {
    /// Vectors per sample.
    pub fields: usize,
    /// Floats per vector.
    pub dim: usize,
}

impl Shape {
    /// A flat tensor of `width` floats per sample.
    pub const fn flat(width: usize) -> Shape {
        Shape { fields: 1, dim: width }
    }

    /// Floats per sample.
    pub const fn size(&self) -> usize {
        self.fields * self.dim
    }
}

impl std::fmt::Display for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.fields == 1 {
            write!(f, "{}", self.dim)
        } else {
            write!(f, "{} x {}", self.fields, self.dim)
        }
    }
}

/// Largest whole-number layer setting (widths, lengths, heads, ...): far above any model's, and
/// low enough that the products layers form of their settings and input shapes cannot
/// overflow (a model's tensors hold at most [`crate::nn::MAX_FIELDS`] vectors and
/// [`crate::nn::MAX_TENSOR_FLOATS`] floats per sample), so a hostile job file gets an error,
/// not a wrapped size.
pub const MAX_SETTING: u64 = 1 << 16;

fn bounded(key: &str, n: u64) -> Result<usize, String> {
    if n > MAX_SETTING {
        return Err(format!("{key} is {n}, more than the {MAX_SETTING} oar allows"));
    }
    Ok(n as usize)
}

/// What a layer call may depend on besides its inputs and parameters.
#[derive(Clone, Copy, Debug)]
pub struct Ctx<'a> {
    /// Samples in the buffers.
    pub rows: usize,
    /// Training (dropout active) or evaluation.
    pub train: bool,
    /// One random seed per sample (in training, for models with a layer that
    /// [`uses_seeds`](Layer::uses_seeds); else empty), a function of the sample's content and
    /// the step: random layers (dropout) draw from it, so a sample gets the same mask whichever trainer, thread or
    /// batch position computes it, and sync training stays equal to local training.
    pub seeds: &'a [u64],
}

/// A dense layer of a model graph, built for known input shapes by a [`Factory`].
pub trait Layer: Send + Sync + std::fmt::Debug {
    /// Shape of the output.
    fn output(&self) -> Shape;

    /// Parameters, in the order of the layer's slice of the flat dense vector; names are local
    /// (the graph prefixes the layer's name).
    fn params(&self) -> Vec<DenseParam> {
        Vec::new()
    }

    /// Floats per sample the layer keeps from forward to backward, or needs as workspace.
    fn scratch(&self) -> usize {
        0
    }

    /// Whether the layer draws from [`Ctx::seeds`] in training (dropout): the seeds are only
    /// computed for models that have such a layer.
    fn uses_seeds(&self) -> bool {
        false
    }

    /// Whether the layer's output is a loss of its own (a `value` head minimizes it as it is,
    /// as `next_item_loss`'s): a value head on any other output trained the model to make that
    /// output as small as it could, without a word.
    fn is_loss(&self) -> bool {
        false
    }

    /// Computes `y` (rows x output size) from the inputs `x` (rows x each input's size).
    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]);

    /// Writes the layer's evaluation-mode computation (dropout off) into `g`: `x` names its
    /// inputs (`[N, size]` f32 each), `y` the value to write (`[N, output size]`). A layer
    /// without an ONNX form keeps this default, and `oar export` refuses the model naming it.
    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        let _ = (g, params, x, y);
        Err("has no ONNX form (a custom layer provides one by implementing Layer::export_onnx)".into())
    }

    /// Given `dy`, *adds* the parameter gradients into `grads` (the layer's own slice) and the
    /// input gradients into `dx[i]` (`None`: input `i` needs no gradient). `y` and `scratch` are
    /// as forward left them; backward runs once per forward and may use `scratch` up (the CIN
    /// writes a layer's gradients where its products were).
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        ctx: &Ctx,
        params: &[f32],
        x: &[&[f32]],
        y: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    );
}

/// Builds a layer from its job-file settings and its input shapes; the message of an error
/// need not name the layer (the graph adds it).
pub type Factory = fn(&mut LayerArgs, &[Shape]) -> Result<Box<dyn Layer>, String>;

/// The settings of one layer entry, read key by key; keys never read are errors, so a typo is
/// caught before training starts.
#[derive(Debug)]
pub struct LayerArgs {
    /// The layer's name (salts its random draws).
    pub name: String,
    values: serde_json::Map<String, serde_json::Value>,
    read: Vec<String>,
}

impl LayerArgs {
    /// Settings `values` of layer `name`.
    pub fn new(name: &str, values: serde_json::Map<String, serde_json::Value>) -> LayerArgs {
        LayerArgs { name: name.to_string(), values, read: Vec::new() }
    }

    fn get(&mut self, key: &str) -> Option<&serde_json::Value> {
        self.read.push(key.to_string());
        self.values.get(key)
    }

    /// A non-negative integer setting, at most [`MAX_SETTING`].
    pub fn usize(&mut self, key: &str) -> Result<Option<usize>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                let n = v.as_u64().ok_or_else(|| format!("{key} must be a whole number, got {v}"))?;
                Ok(Some(bounded(key, n)?))
            }
        }
    }

    /// A required non-negative integer setting.
    pub fn required_usize(&mut self, key: &str) -> Result<usize, String> {
        self.usize(key)?.ok_or_else(|| format!("needs {key}"))
    }

    /// A number setting.
    pub fn f32(&mut self, key: &str) -> Result<Option<f32>, String> {
        match self.get(key) {
            None => Ok(None),
            // A job file's `nan` or `inf` reaches here as null (JSON has neither).
            Some(serde_json::Value::Null) => Err(format!("{key} must be a finite number, not NaN or an infinity")),
            Some(v) => match v.as_f64() {
                Some(n) if n.is_finite() && n.abs() > f64::from(f32::MAX) => {
                    Err(format!("{key} = {n:e} is beyond what a 32-bit float holds"))
                }
                Some(n) => Ok(Some(n as f32)),
                None => Err(format!("{key} must be a number, got {v}")),
            },
        }
    }

    /// A boolean setting.
    pub fn bool(&mut self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v.as_bool().map(Some).ok_or_else(|| format!("{key} must be true or false, got {v}")),
        }
    }

    /// A string setting.
    pub fn string(&mut self, key: &str) -> Result<Option<String>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_str().map(|s| Some(s.to_string())).ok_or_else(|| format!("{key} must be a string, got {v}"))
            }
        }
    }

    /// A list of non-negative integers.
    pub fn usize_list(&mut self, key: &str) -> Result<Option<Vec<usize>>, String> {
        let bad = |v: &serde_json::Value| format!("{key} must be a list of whole numbers, got {v}");
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                let list = v.as_array().ok_or_else(|| bad(v))?;
                list.iter()
                    .map(|x| x.as_u64().ok_or_else(|| bad(v)).and_then(|n| bounded(key, n)))
                    .collect::<Result<_, _>>()
                    .map(Some)
            }
        }
    }

    /// An activation setting (`relu`, `sigmoid`, `tanh`, `identity`).
    pub fn activation(&mut self, key: &str) -> Result<Option<super::Activation>, String> {
        match self.string(key)? {
            None => Ok(None),
            Some(s) => super::Activation::parse(&s).map(Some),
        }
    }

    /// Errors on any key no read asked for.
    pub fn finish(&self) -> Result<(), String> {
        let mut unknown: Vec<&str> =
            self.values.keys().filter(|k| !self.read.iter().any(|r| r == *k)).map(String::as_str).collect();
        unknown.sort_unstable();
        match unknown.as_slice() {
            [] => Ok(()),
            keys => Err(format!("unknown setting(s) {}", keys.join(", "))),
        }
    }

    /// A seed derived from the layer's name, so two random layers draw differently.
    pub fn salt(&self) -> u64 {
        self.name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    }
}

/// Checks `layer`'s backward pass against central finite differences of its forward pass, on
/// `rows` samples of inputs of `inputs` shapes drawn from `seed` (in `train` mode, with fixed
/// per-sample seeds, so dropout masks hold still). The loss is a fixed random weighting of the
/// outputs. Returns the first mismatch, naming the parameter or input and the two values.
/// Summary statistics ([`Update::Summary`](crate::table::Update)) start at their initial
/// values and are not checked: what backward pushes for them are sums, not derivatives.
///
/// ```
/// use oar::nn::layer::{check_layer, LayerArgs, Shape};
/// let mut args = LayerArgs::new("fc", serde_json::from_str(r#"{"out": 3}"#).unwrap());
/// let layer = oar::nn::layers::linear(&mut args, &[Shape::flat(4)]).unwrap();
/// check_layer(layer.as_ref(), &[Shape::flat(4)], 5, 1).unwrap();
/// ```
pub fn check_layer(layer: &dyn Layer, inputs: &[Shape], rows: usize, seed: u64) -> Result<(), String> {
    let draw = |k: u64, n: usize, scale: f32| -> Vec<f32> {
        (0..n)
            .map(|i| {
                let u = (crate::base::layout::mix64(seed ^ crate::base::layout::mix64(k << 32 | i as u64)) >> 40)
                    as f32
                    / (1u64 << 24) as f32;
                scale * (2.0 * u - 1.0)
            })
            .collect()
    };
    let specs = layer.params();
    let total: usize = specs.iter().map(|p| p.len).sum();
    let mut params = draw(1, total, 0.5);
    let mut at = 0;
    let mut summary = vec![false; total];
    for p in &specs {
        if !p.update.is_optimizer() {
            for k in at..at + p.len {
                params[k] = p.init.value(k as u64);
                summary[k] = true;
            }
        }
        at += p.len;
    }
    let xs: Vec<Vec<f32>> = inputs.iter().enumerate().map(|(i, s)| draw(10 + i as u64, rows * s.size(), 1.0)).collect();
    let out = layer.output().size();
    let weights = draw(2, rows * out, 1.0);
    let seeds: Vec<u64> = (0..rows as u64).map(|r| crate::base::layout::mix64(seed + r)).collect();
    let ctx = Ctx { rows, train: true, seeds: &seeds };
    let mut scratch = vec![0.0; rows * layer.scratch()];
    let loss = |params: &[f32], xs: &[Vec<f32>], scratch: &mut Vec<f32>| -> f64 {
        let refs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
        let mut y = vec![0.0; rows * out];
        layer.forward(&ctx, params, &refs, &mut y, scratch);
        y.iter().zip(&weights).map(|(a, b)| *a as f64 * *b as f64).sum()
    };
    let refs: Vec<&[f32]> = xs.iter().map(|x| &x[..]).collect();
    let mut y = vec![0.0; rows * out];
    layer.forward(&ctx, &params, &refs, &mut y, &mut scratch);
    let mut grads = vec![0.0; total];
    let mut dxs: Vec<Vec<f32>> = xs.iter().map(|x| vec![0.0; x.len()]).collect();
    {
        let mut dx: Vec<Option<&mut [f32]>> = dxs.iter_mut().map(|d| Some(&mut d[..])).collect();
        layer.backward(&ctx, &params, &refs, &y, &weights, &mut scratch, &mut grads, &mut dx);
    }
    let eps = 1e-2f32;
    let close = |numeric: f64, analytic: f32| (numeric - analytic as f64).abs() <= 2e-3 + 1e-2 * numeric.abs();
    let mut names = Vec::new();
    for p in &specs {
        names.extend((0..p.len).map(|k| format!("parameter {}[{k}]", p.name)));
    }
    for k in (0..total).filter(|&k| !summary[k]) {
        let (mut hi, mut lo) = (params.clone(), params.clone());
        hi[k] += eps;
        lo[k] -= eps;
        let numeric = (loss(&hi, &xs, &mut scratch) - loss(&lo, &xs, &mut scratch)) / (2.0 * eps as f64);
        if !close(numeric, grads[k]) {
            return Err(format!("{}: finite difference {numeric:.6}, backward {:.6}", names[k], grads[k]));
        }
    }
    for (i, x) in xs.iter().enumerate() {
        for k in 0..x.len() {
            let (mut hi, mut lo) = (xs.clone(), xs.clone());
            hi[i][k] += eps;
            lo[i][k] -= eps;
            let numeric = (loss(&params, &hi, &mut scratch) - loss(&params, &lo, &mut scratch)) / (2.0 * eps as f64);
            if !close(numeric, dxs[i][k]) {
                return Err(format!("input {i}[{k}]: finite difference {numeric:.6}, backward {:.6}", dxs[i][k]));
            }
        }
    }
    Ok(())
}
