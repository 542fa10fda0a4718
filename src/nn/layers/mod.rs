//! The layer catalogue: every `type` a job file's `[model] layers` may name (besides the built-in
//! `embedding`), each a [`Factory`] building a [`Layer`](super::layer::Layer) for its input shapes.
//!
//! | type | inputs -> output | settings |
//! |---|---|---|
//! | `linear` | any -> `out`; (F, D) -> (F, `out`) with `per_field` | `out`, `bias = true`, `activation = "identity"`, `init = "uniform"`, `per_field = false` |
//! | `mlp` | any -> last width | `hidden`, `activation = "relu"`, `dropout = 0`, `out`, `out_activation` |
//! | `relu`, `sigmoid`, `tanh` | same shape | |
//! | `dropout` | same shape | `rate` (training only) |
//! | `concat` | N -> (sum of fields, D) if every D agrees, else flat | |
//! | `add` | N of one size -> that size | |
//! | `reduce_sum` | (F, D) -> D (`over = "fields"`) or 1 (`over = "all"`) | `over` |
//! | `fm` | (F, D) -> 1: factorization machine's second-order term | |
//! | `cross` | W -> W: DCN cross network | `layers`, `version = 1` (2: matrix form), `rank` (v2 low rank) |
//! | `dot_interaction` | D + (F, D) -> D + (F+1)F/2: DLRM pairwise dots | |
//! | `weight_multiply` | K -> (K, `dim`): each value times its own vector | `dim` |
//! | `ffm` | (F, F K) -> 1: field-aware FM's second-order term | |
//! | `cin` | (F, D) -> sum of `layers`: xDeepFM's compressed interaction network | `layers` |
//! | `self_attention` | (F, D) [+ mask F] -> (F, heads dim): AutoInt / BST | `heads = 2`, `dim`, `residual = true`, `scale = false`, `positions = false` |
//! | `gate` | (F, D) -> (F, D): GateNet's embedding gate | `mode = "vector"` (or `"bit"`) |
//! | `layer_norm` | any -> same: over each vector's D values | `eps = 1e-5` |
//! | `batch_norm` | any -> same: each value over the batch; statistics kept by the servers | `decay = 0.9`, `prior = 1`, `eps = 1e-5` |
//! | `data_norm` | any -> same: Paddle's data_norm, the servers' statistics in training too | `decay = 0.9999999`, `prior = 1e4`, `eps = 1e-4` |
//! | `mixture` | (E, D) + E -> D: experts mixed by a softmax gate (MMoE, PLE) | |
//! | `prob_product` | 1 + 1 -> 1: logit of sigmoid(a) sigmoid(b) (ESMM's CTCVR) | |
//! | `gru` | (L, E) [+ mask L] -> H (or (L, H) with `output = "all"`): DIEN's interest extractor | `hidden`, `output = "last"` |
//! | `augru` | (L, E) + scores L [+ mask L] -> H: DIEN's attention-update GRU | `hidden` |
//! | `next_item_loss` | (L, H) + (L, E) + negatives (L, E) [+ mask L] -> 1: DIEN's auxiliary loss, for a `value` head | `hidden = [100, 50]`, `activation = "relu"`, `init` |
//! | `target_attention` | E + (L, E) [+ mask L] -> E: DIN's activation unit | `hidden = [80, 40]`, `activation = "prelu"` (or `"dice"`), `softmax = false` |
//!
//! Initial values, per layer (each factory's doc has the settings):
//! - `linear`: PyTorch's default (uniform +-1/sqrt(inputs), weights and bias) for a hidden layer,
//!   or `init = "zeros"` for a linear term on raw features: a random start on unscaled inputs is
//!   a random logit the first steps must undo (docs/src/measurements/2026-11-models.md, "Sound starts").
//! - `mlp`: PyTorch's default for every layer, or `init = "xavier"` (Glorot-uniform weights, zero
//!   biases: Keras's start, which DeepFM, DLRM, xDeepFM and AutoInt+ need to reach FuxiCTR's AUC,
//!   measured against `examples/zoo/reference/`) or `"xavier_normal"` (FuxiCTR's own).
//! - `cross`: weights uniform +-1/sqrt(fan-in), biases zero (DCN's reference); `cin`: PyTorch's
//!   Conv1d default (uniform +-1/sqrt(fan-in)).
//! - `self_attention` and `gate`: uniform +-1/sqrt(D), no biases (AutoInt's and GateNet's
//!   projections; a gate starts near 1/2); `self_attention` also takes `"xavier"` or
//!   `"xavier_normal"` for its projections (`autoint.toml` takes the latter, FuxiCTR's AutoInt
//!   start); its position vectors stay +-1/sqrt(D).
//! - `target_attention`: as `mlp`, with PReLU slopes starting at 0.1 (FuxiCTR's DIN; PyTorch's
//!   0.25 measured 0.007 lower on `oar gen sequences`); `next_item_loss`: its MLP as `mlp`
//!   (`dien_aux.toml`: xavier, as FuxiCTR's).
//! - `layer_norm`: gain 1, bias 0; `batch_norm`: gain 1, bias 0, statistics of `prior = 1` sample
//!   of mean 0 and variance 1; `data_norm`: Paddle's 1e4 such samples (so on a small data set it
//!   barely normalizes at first, as in Paddle).
//! - `weight_multiply`: uniform +-0.05, like the embeddings beside which its output sits, or
//!   Glorot (`"xavier_normal"`: FuxiCTR's numeric fields, each an `nn.Linear(1, dim)`).
//! - `ffm`, `mixture`, `prob_product`: no parameters.
//!
//! Embedding rows are not a layer's: they take their table's `init`, by default uniform
//! +-`embedding_init` (0.05), or normal (FuxiCTR's N(0, 1e-4)), seeded by the id. Dense scaling
//! (`[data] dense_transform`) is the data's, not a layer's.
//!
//! Dropout (`dropout`, and `mlp`'s) draws its mask from each sample's seed, a hash of the sample's
//! content and the step (`model/exec.rs`), not from its place in a batch: a sample draws the same
//! mask whichever trainer or thread computes it, so sync training stays equal to local training
//! with dropout too, and backward recomputes the mask instead of storing it.

mod attention;
mod batch_norm;
mod cin;
mod cross;
mod dense;
mod dice;
mod dot;
mod ffm;
mod fm;
mod gate;
mod gru;
mod layer_norm;
mod mixture;
mod next_item;
mod prob_product;
mod reduce;
mod shape;
mod target_attention;
mod weight_multiply;

pub use attention::{self_attention, SelfAttentionLayer};
pub use batch_norm::{batch_norm, data_norm, NormKind, NormStatsLayer};
pub use cin::{cin, CinLayer};
pub use cross::{cross, CrossKind, CrossLayer};
pub use dense::{linear, mlp, LinearInit, LinearLayer, MlpLayer};
pub use dot::{dot_interaction, DotInteractionLayer};
pub use ffm::{ffm, FfmLayer};
pub use fm::{fm, FmLayer};
pub use gate::{gate, GateLayer, GateMode};
pub use gru::{augru, gru, GruLayer};
pub use layer_norm::{layer_norm, LayerNormLayer};
pub use mixture::{mixture, MixtureLayer};
pub use next_item::{next_item_loss, NextItemLossLayer};
pub use prob_product::{prob_product, ProbProductLayer};
pub use reduce::{reduce_sum, ReduceSumLayer};
pub use shape::{activation_layer, add, concat, dropout};
pub use target_attention::{target_attention, TargetAttentionLayer};
pub use weight_multiply::{weight_multiply, WeightMultiplyLayer};

use super::layer::{Ctx, Factory, Shape};

/// Every built-in layer type with its factory.
pub fn builtin() -> Vec<(&'static str, Factory)> {
    vec![
        ("linear", linear as Factory),
        ("mlp", mlp),
        ("relu", |a, i| activation_layer(a, i, super::Activation::Relu)),
        ("sigmoid", |a, i| activation_layer(a, i, super::Activation::Sigmoid)),
        ("tanh", |a, i| activation_layer(a, i, super::Activation::Tanh)),
        ("dropout", dropout),
        ("concat", concat),
        ("add", add),
        ("reduce_sum", reduce_sum),
        ("fm", fm),
        ("cross", cross),
        ("dot_interaction", dot_interaction),
        ("weight_multiply", weight_multiply),
        ("ffm", ffm),
        ("cin", cin),
        ("self_attention", self_attention),
        ("gate", gate),
        ("layer_norm", layer_norm),
        ("batch_norm", batch_norm),
        ("data_norm", data_norm),
        ("mixture", mixture),
        ("prob_product", prob_product),
        ("target_attention", target_attention),
        ("gru", gru),
        ("augru", augru),
        ("next_item_loss", next_item_loss),
    ]
}

/// Whether dropout keeps value `j` of the sample whose seed is `seed`, in the layer salted
/// `salt`: a pure function, so backward recomputes the forward mask instead of storing it.
#[inline]
fn keeps(seed: u64, salt: u64, j: usize, rate: f32) -> bool {
    let h = crate::base::layout::mix64(seed ^ crate::base::layout::mix64(salt.wrapping_add(j as u64)));
    ((h >> 40) as f32 / (1u64 << 24) as f32) >= rate
}

/// Training-mode dropout in place on `rows x width` values: dropped values become 0, kept ones
/// are scaled by 1 / (1 - rate). Evaluation leaves the values alone.
pub(crate) fn dropout_forward(ctx: &Ctx, salt: u64, rate: f32, width: usize, v: &mut [f32]) {
    if !ctx.train || rate == 0.0 {
        return;
    }
    let scale = 1.0 / (1.0 - rate);
    for (r, row) in v.chunks_exact_mut(width).enumerate() {
        for (j, x) in row.iter_mut().enumerate() {
            *x = if keeps(ctx.seeds[r], salt, j, rate) { *x * scale } else { 0.0 };
        }
    }
}

/// The gradient of [`dropout_forward`], in place (the same mask, recomputed).
pub(crate) fn dropout_backward(ctx: &Ctx, salt: u64, rate: f32, width: usize, g: &mut [f32]) {
    dropout_forward(ctx, salt, rate, width, g)
}

/// Whether a sequence mask's value marks a real position (masks hold 1 or 0; a value above 1/2
/// counts as 1), the one rule every masked layer and its export follow.
#[inline]
pub(crate) fn is_real(mask: f32) -> bool {
    mask > 0.5
}

/// [`is_real`] in ONNX: the bool tensor of mask `mask`'s real positions.
pub(crate) fn export_real(g: &mut crate::onnx::Graph, mask: &str) -> String {
    let half = g.scalar("half", 0.5);
    g.op("Greater", &[mask, &half], Vec::new())
}

/// A layer that leaves the shape alone, for the helpers below.
pub(crate) fn one_input(inputs: &[Shape]) -> Result<Shape, String> {
    match inputs {
        [one] => Ok(*one),
        _ => Err(format!("takes one input, got {}", inputs.len())),
    }
}

/// A layer's settings from JSON text, for tests.
#[cfg(test)]
pub(crate) fn test_args(json: &str) -> super::layer::LayerArgs {
    super::layer::LayerArgs::new("t", serde_json::from_str(json).unwrap())
}
