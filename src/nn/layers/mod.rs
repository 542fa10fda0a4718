//! The layer catalogue: every `type` a job file's `[model] layers` may name (besides the
//! built-in `embedding`), each a [`Factory`] building a [`Layer`](super::layer::Layer) for its input shapes.
//!
//! | type | inputs -> output | settings |
//! |---|---|---|
//! | `linear` | any -> `out` | `out`, `bias = true`, `activation = "identity"` |
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

mod cross;
mod dense;
mod dot;
mod fm;
mod reduce;
mod shape;
mod weight_multiply;

pub use cross::{cross, CrossKind, CrossLayer};
pub use dense::{linear, mlp, LinearLayer, MlpLayer};
pub use dot::{dot_interaction, DotInteractionLayer};
pub use fm::{fm, FmLayer};
pub use reduce::{reduce_sum, ReduceSumLayer};
pub use shape::{activation_layer, add, concat, dropout};
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
    ]
}

/// Whether dropout keeps value `j` of the sample whose seed is `seed`, in the layer salted
/// `salt`: a pure function, so backward recomputes the forward mask instead of storing it.
#[inline]
fn keeps(seed: u64, salt: u64, j: usize, rate: f32) -> bool {
    let h = crate::layout::mix64(seed ^ crate::layout::mix64(salt.wrapping_add(j as u64)));
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
