//! Fully connected layers: `linear` (one matrix, optional bias and activation) and `mlp` (a stack
//! of them with activations and dropout between, the deep part of most CTR models).

use super::{dropout_backward, dropout_forward};
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::{Activation, Linear};
use crate::table::{DenseParam, Init};

/// `y = act(x W + b)`; with `per_field`, the same `W` and `b` applied to each of a field
/// tensor's vectors (a transformer's position-wise layer).
#[derive(Debug)]
pub struct LinearLayer {
    linear: Linear,
    bias: bool,
    activation: Activation,
    init: LinearInit,
    /// Vectors per sample it maps one by one (1: the whole input as one vector).
    fields: usize,
}

/// How a `linear` layer's parameters start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearInit {
    /// PyTorch's default: weights and bias uniform in +-1/sqrt(inputs).
    Uniform,
    /// All zero (a linear term on raw features).
    Zeros,
    /// Glorot-uniform weights, zero bias (Keras's start).
    Xavier,
    /// Glorot-normal weights (the same variance, `2 / (inputs + outputs)`), zero bias:
    /// FuxiCTR's start (`BaseModel.reset_parameters`, `xavier_normal_`).
    XavierNormal,
}

impl LinearInit {
    /// The (weights, bias) initializers of an `inputs` x `outputs` layer.
    pub fn of(self, inputs: usize, outputs: usize) -> (Init, Init) {
        let (i, o) = (inputs as f32, outputs as f32);
        match self {
            LinearInit::Uniform => {
                let u = Init::Uniform { scale: 1.0 / i.sqrt() };
                (u, u)
            }
            LinearInit::Zeros => (Init::Zeros, Init::Zeros),
            LinearInit::Xavier => (Init::Uniform { scale: (6.0 / (i + o)).sqrt() }, Init::Zeros),
            LinearInit::XavierNormal => (Init::Normal { std: (2.0 / (i + o)).sqrt() }, Init::Zeros),
        }
    }

    /// The job file's `init` setting among `uniform`, `xavier` and `xavier_normal` (for stacks
    /// of hidden layers).
    pub fn parse_hidden(args: &mut LayerArgs) -> Result<LinearInit, String> {
        Self::parse(args, false)
    }

    /// The job file's `init` setting; `"zeros"` only where `zeros` allows it.
    fn parse(args: &mut LayerArgs, zeros: bool) -> Result<LinearInit, String> {
        let init = match args.string("init")?.as_deref() {
            None | Some("uniform") => LinearInit::Uniform,
            Some("zeros") if zeros => LinearInit::Zeros,
            Some("xavier") => LinearInit::Xavier,
            Some("xavier_normal") => LinearInit::XavierNormal,
            Some(other) => {
                let names = if zeros { "\"uniform\", \"zeros\", \"xavier\"" } else { "\"uniform\", \"xavier\"" };
                return Err(format!("init must be {names} or \"xavier_normal\", got {other:?}"));
            }
        };
        Ok(init)
    }
}

/// `linear`: `out` (required), `bias = true`, `activation = "identity"`, `init = "uniform"`
/// (PyTorch's default, +-1/sqrt(inputs), for a hidden layer), `"zeros"` (weights and bias at
/// zero, for a linear term on raw features, as the reference LR parts start near zero: a random
/// start on unscaled inputs is a random logit the first steps must undo), `"xavier"`
/// (Glorot-uniform weights, zero bias) or `"xavier_normal"` (Glorot-normal, FuxiCTR's); `per_field = false` (true: `(F, D) -> (F, out)`, each
/// vector mapped by the same weights).
pub fn linear(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let [input] = inputs else { return Err("takes one input".into()) };
    let out = args.required_usize("out")?;
    let bias = args.bool("bias")?.unwrap_or(true);
    let activation = args.activation("activation")?.unwrap_or(Activation::Identity);
    let init = LinearInit::parse(args, true)?;
    let per_field = args.bool("per_field")?.unwrap_or(false);
    args.finish()?;
    if out == 0 {
        return Err("out must be positive".into());
    }
    let (fields, width) = if per_field { (input.fields, input.dim) } else { (1, input.size()) };
    let (linear, _) = Linear::new("", width, out, 0);
    Ok(Box::new(LinearLayer { linear, bias, activation, init, fields }))
}

impl Layer for LinearLayer {
    fn output(&self) -> Shape {
        Shape { fields: self.fields, dim: self.linear.output }
    }

    fn params(&self) -> Vec<DenseParam> {
        let (i, o) = (self.linear.input, self.linear.output);
        let (w, b) = self.init.of(i, o);
        let mut p = vec![DenseParam::new("w", i * o, w)];
        if self.bias {
            p.push(DenseParam::new("b", o, b));
        }
        p
    }

    fn scratch(&self) -> usize {
        self.fields * self.linear.output
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        let rows = ctx.rows * self.fields;
        if self.bias {
            self.linear.forward(params, x[0], rows, y);
        } else {
            let (i, o) = (self.linear.input, self.linear.output);
            crate::nn::matmul(rows, o, i, y, false, x[0], (i, 1), &params[..i * o], (o, 1));
        }
        self.activation.forward(y);
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        let (i, o) = (self.linear.input, self.linear.output);
        let input = if self.fields > 1 { g.reshape(x[0], &[-1, i as i64]) } else { x[0].to_string() };
        let z = if self.bias {
            self.linear.export_onnx(g, params, &input)
        } else {
            let w = g.floats("w", &[i, o], &params[..i * o]);
            g.op("MatMul", &[&input, &w], Vec::new())
        };
        if self.fields > 1 {
            let act = format!("{y}/act");
            self.activation.export_onnx(g, &z, &act);
            g.reshape_to(&act, &[-1, (self.fields * o) as i64], y);
        } else {
            self.activation.export_onnx(g, &z, y);
        }
        Ok(())
    }

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
    ) {
        let (i, o, rows) = (self.linear.input, self.linear.output, ctx.rows * self.fields);
        let dz = &mut scratch[..rows * o];
        dz.copy_from_slice(dy);
        if self.bias {
            self.linear.backward_through(self.activation, y, params, x[0], dz, rows, grads, dx[0].as_deref_mut());
        } else {
            self.activation.backward(y, dz);
            crate::nn::matmul(i, o, rows, &mut grads[..i * o], true, x[0], (1, i), dz, (o, 1));
            if let Some(dx) = dx[0].as_deref_mut() {
                crate::nn::matmul(rows, i, o, dx, true, dz, (o, 1), &params[..i * o], (1, o));
            }
        }
    }
}

/// A stack of fully connected layers: hidden layers with `activation` (and dropout after it in
/// training), then an optional output layer with `out_activation` and no dropout.
#[derive(Debug)]
pub struct MlpLayer {
    layers: Vec<Linear>,
    activations: Vec<Activation>,
    /// Whether the last layer is an output layer (else the last hidden output is the output).
    has_out: bool,
    dropout: f32,
    salt: u64,
    /// Where each hidden layer's activated output starts in a sample's scratch (its dropped
    /// copy, with dropout, follows it).
    saved_at: Vec<usize>,
    saved: usize,
    widest: usize,
    init: LinearInit,
}

/// `mlp`: `hidden = [..]`, `activation = "relu"`, `dropout = 0`, `out` (optional final width),
/// `out_activation = "identity"`, `init = "uniform"` (PyTorch's default, +-1/sqrt(inputs) for
/// weights and biases), `"xavier"` (Glorot-uniform weights, zero biases, as Keras starts) or
/// `"xavier_normal"` (Glorot-normal, as FuxiCTR starts). Parameters are named `0.w`, `0.b`, `1.w`, ... by layer.
pub fn mlp(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let [input] = inputs else { return Err("takes one input".into()) };
    let hidden = args.usize_list("hidden")?.unwrap_or_default();
    let activation = args.activation("activation")?.unwrap_or(Activation::Relu);
    let dropout = args.f32("dropout")?.unwrap_or(0.0);
    let out = args.usize("out")?;
    let out_activation = args.activation("out_activation")?.unwrap_or(Activation::Identity);
    let init = LinearInit::parse_hidden(args)?;
    args.finish()?;
    if hidden.contains(&0) || out == Some(0) {
        return Err("layer widths must be positive".into());
    }
    if hidden.is_empty() && out.is_none() {
        return Err("needs hidden widths, out, or both".into());
    }
    if !(0.0..1.0).contains(&dropout) {
        return Err(format!("dropout must be in [0, 1), got {dropout}"));
    }
    Ok(Box::new(
        MlpLayer::new(input.size(), &hidden, activation, dropout, out, out_activation, args.salt()).with_init(init),
    ))
}

impl MlpLayer {
    /// The stack `input -> hidden.. -> out`.
    pub fn new(
        input: usize,
        hidden: &[usize],
        activation: Activation,
        dropout: f32,
        out: Option<usize>,
        out_activation: Activation,
        salt: u64,
    ) -> MlpLayer {
        let mut widths = vec![input];
        widths.extend(hidden);
        widths.extend(out);
        let (mut layers, mut activations, mut at) = (Vec::new(), Vec::new(), 0);
        for (l, w) in widths.windows(2).enumerate() {
            let (layer, _) = Linear::new("", w[0], w[1], at);
            at += layer.len();
            layers.push(layer);
            activations.push(if out.is_some() && l + 2 == widths.len() { out_activation } else { activation });
        }
        let copies = if dropout > 0.0 { 2 } else { 1 };
        let (mut saved_at, mut saved) = (Vec::new(), 0);
        for &h in hidden {
            saved_at.push(saved);
            saved += copies * h;
        }
        let widest = *widths.iter().max().expect("at least input and one layer");
        MlpLayer {
            layers,
            activations,
            has_out: out.is_some(),
            dropout,
            salt,
            saved_at,
            saved,
            widest,
            init: LinearInit::Uniform,
        }
    }

    /// The stack, its layers started by `init`.
    pub fn with_init(mut self, init: LinearInit) -> MlpLayer {
        self.init = init;
        self
    }

    fn hidden(&self) -> usize {
        self.layers.len() - self.has_out as usize
    }

    /// Hidden layer `l`'s activated output and, with dropout, its dropped copy (the next
    /// layer's input), in the scratch of all rows.
    fn spans(&self, l: usize, rows: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let w = self.layers[l].output;
        let at = rows * self.saved_at[l];
        let act = at..at + rows * w;
        let next = if self.dropout > 0.0 { act.end..act.end + rows * w } else { act.clone() };
        (act, next)
    }
}

impl Layer for MlpLayer {
    fn output(&self) -> Shape {
        Shape::flat(self.layers.last().expect("an mlp has a layer").output)
    }

    fn params(&self) -> Vec<DenseParam> {
        let mut p = Vec::new();
        for (l, layer) in self.layers.iter().enumerate() {
            let (w, b) = self.init.of(layer.input, layer.output);
            p.push(DenseParam::new(format!("{l}.w"), layer.input * layer.output, w));
            p.push(DenseParam::new(format!("{l}.b"), layer.output, b));
        }
        p
    }

    fn scratch(&self) -> usize {
        self.saved + 2 * self.widest
    }

    fn uses_seeds(&self) -> bool {
        self.dropout > 0.0
    }

    fn forward(&self, ctx: &Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        let rows = ctx.rows;
        let (saved, _) = scratch.split_at_mut(rows * self.saved);
        for l in 0..self.layers.len() {
            let layer = &self.layers[l];
            let input_span = if l == 0 { None } else { Some(self.spans(l - 1, rows).1) };
            if l < self.hidden() {
                let (act, next) = self.spans(l, rows);
                let (before, after) = saved.split_at_mut(act.start);
                let input = match &input_span {
                    None => x[0],
                    Some(r) => &before[r.clone()],
                };
                let out = &mut after[..act.len()];
                layer.forward(params, input, rows, out);
                self.activations[l].forward(out);
                if self.dropout > 0.0 {
                    let (a, d) = after.split_at_mut(act.len());
                    d[..next.len()].copy_from_slice(a);
                    dropout_forward(ctx, self.salt ^ l as u64, self.dropout, layer.output, &mut d[..next.len()]);
                }
            } else {
                let input = match &input_span {
                    None => x[0],
                    Some(r) => &saved[r.clone()],
                };
                layer.forward(params, input, rows, y);
                self.activations[l].forward(y);
            }
        }
        if !self.has_out {
            let (_, next) = self.spans(self.hidden() - 1, rows);
            y.copy_from_slice(&saved[next]);
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, params: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        // Dropout is the identity in evaluation, so the stack is Gemm and activation in turn.
        let mut h = x[0].to_string();
        for (l, (layer, act)) in self.layers.iter().zip(&self.activations).enumerate() {
            let z = layer.export_onnx(g, params, &h);
            if l + 1 == self.layers.len() {
                act.export_onnx(g, &z, y);
            } else {
                let a = format!("{z}.act");
                act.export_onnx(g, &z, &a);
                h = a;
            }
        }
        Ok(())
    }

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
    ) {
        let rows = ctx.rows;
        let (saved, work) = scratch.split_at_mut(rows * self.saved);
        // Two gradient buffers in turn: the current layer's output gradient is read from one
        // while its input gradient is written over the other, so nothing is zeroed or copied.
        let (mut grad, mut next) = work.split_at_mut(rows * self.widest);
        let n = self.layers.len();
        let top = self.layers[n - 1].output;
        grad[..rows * top].copy_from_slice(dy);
        if !self.has_out && self.dropout > 0.0 {
            dropout_backward(ctx, self.salt ^ (n - 1) as u64, self.dropout, top, &mut grad[..rows * top]);
        }
        for l in (0..n).rev() {
            let layer = &self.layers[l];
            let g = &mut grad[..rows * layer.output];
            let out = if l < self.hidden() { &saved[self.spans(l, rows).0] } else { y };
            let act = self.activations[l];
            if l == 0 {
                layer.backward_through(act, out, params, x[0], g, rows, grads, dx[0].as_deref_mut());
            } else {
                let (_, input) = self.spans(l - 1, rows);
                layer.backward_through(act, out, params, &saved[input], g, rows, grads, None);
                let gi = &mut next[..rows * layer.input];
                layer.input_grad(params, g, rows, gi, false);
                if self.dropout > 0.0 {
                    dropout_backward(ctx, self.salt ^ (l - 1) as u64, self.dropout, layer.input, gi);
                }
                std::mem::swap(&mut grad, &mut next);
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
    fn a_per_field_linear_maps_each_vector_alike() {
        let layer = linear(&mut args(r#"{"out": 1, "per_field": true}"#), &[Shape { fields: 3, dim: 2 }]).unwrap();
        assert_eq!(layer.output(), Shape { fields: 3, dim: 1 });
        let mut y = [0.0; 3];
        let mut scratch = vec![0.0; layer.scratch()];
        let ctx = Ctx { rows: 1, train: false, seeds: &[] };
        // w = (1, 10), b = 0.5: each field's (a, b) -> a + 10 b + 0.5.
        layer.forward(&ctx, &[1.0, 10.0, 0.5], &[&[1.0, 2.0, 3.0, 4.0, -1.0, 0.0]], &mut y, &mut scratch);
        assert_eq!(y, [21.5, 43.5, -0.5]);
    }

    #[test]
    fn linear_gradients_match_finite_differences() {
        for json in [
            r#"{"out": 3}"#,
            r#"{"out": 2, "bias": false, "activation": "tanh"}"#,
            r#"{"out": 4, "activation": "sigmoid"}"#,
            r#"{"out": 4, "activation": "tanh", "per_field": true}"#,
            r#"{"out": 2, "bias": false, "per_field": true}"#,
        ] {
            let layer = linear(&mut args(json), &[Shape { fields: 2, dim: 3 }]).unwrap();
            check_layer(layer.as_ref(), &[Shape { fields: 2, dim: 3 }], 4, 7).unwrap_or_else(|e| panic!("{json}: {e}"));
        }
    }

    #[test]
    fn mlp_gradients_match_finite_differences() {
        for json in [
            r#"{"hidden": [7, 6], "out": 1}"#,
            r#"{"hidden": [5], "activation": "sigmoid", "out": 3, "out_activation": "tanh"}"#,
            r#"{"hidden": [6, 5], "dropout": 0.3, "out": 2}"#,
            r#"{"hidden": [6, 4], "dropout": 0.25}"#,
            r#"{"out": 2}"#,
        ] {
            let layer = mlp(&mut args(json), &[Shape::flat(5)]).unwrap();
            check_layer(layer.as_ref(), &[Shape::flat(5)], 4, 3).unwrap_or_else(|e| panic!("{json}: {e}"));
        }
    }

    #[test]
    fn bad_settings_are_named() {
        assert!(mlp(&mut args(r#"{"hidden": [4], "widht": 3}"#), &[Shape::flat(5)]).unwrap_err().contains("widht"));
        assert!(mlp(&mut args(r#"{"hidden": [4, 0]}"#), &[Shape::flat(5)]).unwrap_err().contains("positive"));
        assert!(linear(&mut args(r#"{}"#), &[Shape::flat(5)]).unwrap_err().contains("needs out"));
        assert!(linear(&mut args(r#"{"out": 1, "activation": "swish"}"#), &[Shape::flat(5)])
            .unwrap_err()
            .contains("swish"));
    }
}
