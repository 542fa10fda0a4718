//! Element-wise and shape layers: activations, dropout, concatenation and addition.

use super::{dropout_backward, dropout_forward, one_input};
use crate::nn::layer::{Ctx, Layer, LayerArgs, Shape};
use crate::nn::Activation;

/// The backward of an element-wise layer: `dy` transformed by `map` (in `scratch`), added into
/// the one input's gradient if it is asked for.
fn add_mapped(dx: &mut [Option<&mut [f32]>], dy: &[f32], scratch: &mut [f32], map: impl FnOnce(&mut [f32])) {
    if let Some(dx) = dx[0].as_deref_mut() {
        let g = &mut scratch[..dy.len()];
        g.copy_from_slice(dy);
        map(g);
        dx.iter_mut().zip(g.iter()).for_each(|(d, g)| *d += g);
    }
}

/// An activation as a layer of its own (`relu`, `sigmoid`, `tanh`).
#[derive(Debug)]
pub struct ActivationLayer {
    shape: Shape,
    activation: Activation,
}

/// `relu` / `sigmoid` / `tanh`: no settings.
pub fn activation_layer(
    args: &mut LayerArgs,
    inputs: &[Shape],
    activation: Activation,
) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    Ok(Box::new(ActivationLayer { shape: one_input(inputs)?, activation }))
}

impl Layer for ActivationLayer {
    fn output(&self) -> Shape {
        self.shape
    }

    fn scratch(&self) -> usize {
        self.shape.size()
    }

    fn forward(&self, _: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        y.copy_from_slice(x[0]);
        self.activation.forward(y);
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        self.activation.export_onnx(g, x[0], y);
        Ok(())
    }

    fn backward(
        &self,
        _: &Ctx,
        _: &[f32],
        _: &[&[f32]],
        y: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        _: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        add_mapped(dx, dy, scratch, |g| self.activation.backward(y, g));
    }
}

/// Dropout: in training each value is zeroed with probability `rate` and the kept ones scaled
/// by 1 / (1 - rate); in evaluation the identity.
#[derive(Debug)]
pub struct DropoutLayer {
    shape: Shape,
    rate: f32,
    salt: u64,
}

/// `dropout`: `rate` (required, in [0, 1)).
pub fn dropout(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    let rate = args.f32("rate")?.ok_or("needs rate")?;
    args.finish()?;
    if !(0.0..1.0).contains(&rate) {
        return Err(format!("rate must be in [0, 1), got {rate}"));
    }
    Ok(Box::new(DropoutLayer { shape: one_input(inputs)?, rate, salt: args.salt() }))
}

impl Layer for DropoutLayer {
    fn output(&self) -> Shape {
        self.shape
    }

    fn uses_seeds(&self) -> bool {
        true
    }

    fn scratch(&self) -> usize {
        self.shape.size()
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        y.copy_from_slice(x[0]);
        dropout_forward(ctx, self.salt, self.rate, self.shape.size(), y);
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        g.identity(x[0], y);
        Ok(())
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
        add_mapped(dx, dy, scratch, |g| dropout_backward(ctx, self.salt, self.rate, self.shape.size(), g));
    }
}

/// Concatenation of each sample's parts, in input order.
#[derive(Debug)]
pub struct ConcatLayer {
    sizes: Vec<usize>,
    shape: Shape,
}

/// `concat`: no settings. Inputs of one `dim` make a field tensor (their fields added up), so
/// embeddings and `weight_multiply` outputs concatenate into the fields of an `fm`; otherwise
/// the output is flat.
pub fn concat(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    if inputs.len() < 2 {
        return Err("takes two or more inputs".into());
    }
    let sizes: Vec<usize> = inputs.iter().map(Shape::size).collect();
    let dim = inputs[0].dim;
    let shape = if inputs.iter().all(|s| s.dim == dim) {
        Shape { fields: inputs.iter().map(|s| s.fields).sum(), dim }
    } else {
        Shape::flat(sizes.iter().sum())
    };
    Ok(Box::new(ConcatLayer { sizes, shape }))
}

impl Layer for ConcatLayer {
    fn output(&self) -> Shape {
        self.shape
    }

    fn forward(&self, ctx: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        let width = self.shape.size();
        for r in 0..ctx.rows {
            let mut at = r * width;
            for (input, &w) in x.iter().zip(&self.sizes) {
                y[at..at + w].copy_from_slice(&input[r * w..(r + 1) * w]);
                at += w;
            }
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        // Sample-major bytes: concatenating the flat [N, size] views is the field concatenation too.
        g.op_to("Concat", x, vec![crate::onnx::Attr::Int("axis", 1)], y);
        Ok(())
    }

    fn backward(
        &self,
        ctx: &Ctx,
        _: &[f32],
        _: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        _: &mut [f32],
        _: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        let width = self.shape.size();
        let mut offset = 0;
        for (d, &w) in dx.iter_mut().zip(&self.sizes) {
            if let Some(d) = d.as_deref_mut() {
                for r in 0..ctx.rows {
                    let src = &dy[r * width + offset..r * width + offset + w];
                    d[r * w..(r + 1) * w].iter_mut().zip(src).for_each(|(a, b)| *a += b);
                }
            }
            offset += w;
        }
    }
}

/// Element-wise sum of inputs of one size (a model's logits from several parts).
#[derive(Debug)]
pub struct AddLayer {
    shape: Shape,
}

/// `add`: no settings; every input must have the same size.
pub fn add(args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
    args.finish()?;
    if inputs.len() < 2 {
        return Err("takes two or more inputs".into());
    }
    if let Some(other) = inputs.iter().find(|s| s.size() != inputs[0].size()) {
        return Err(format!("inputs must have one size: {} and {}", inputs[0], other));
    }
    Ok(Box::new(AddLayer { shape: inputs[0] }))
}

impl Layer for AddLayer {
    fn output(&self) -> Shape {
        self.shape
    }

    fn forward(&self, _: &Ctx, _: &[f32], x: &[&[f32]], y: &mut [f32], _: &mut [f32]) {
        y.copy_from_slice(x[0]);
        for input in &x[1..] {
            y.iter_mut().zip(input.iter()).for_each(|(a, b)| *a += b);
        }
    }

    fn export_onnx(&self, g: &mut crate::onnx::Graph, _: &[f32], x: &[&str], y: &str) -> Result<(), String> {
        g.op_to("Sum", x, Vec::new(), y);
        Ok(())
    }

    fn backward(
        &self,
        _: &Ctx,
        _: &[f32],
        _: &[&[f32]],
        _: &[f32],
        dy: &[f32],
        _: &mut [f32],
        _: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        for d in dx.iter_mut().flatten() {
            d.iter_mut().zip(dy).for_each(|(a, b)| *a += b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::layer::check_layer;

    use super::super::test_args as args;

    #[test]
    fn element_wise_and_shape_layers_match_finite_differences() {
        let s = Shape { fields: 3, dim: 2 };
        for a in [Activation::Relu, Activation::Sigmoid, Activation::Tanh] {
            check_layer(activation_layer(&mut args("{}"), &[s], a).unwrap().as_ref(), &[s], 3, 1).unwrap();
        }
        check_layer(dropout(&mut args(r#"{"rate": 0.4}"#), &[s]).unwrap().as_ref(), &[s], 3, 2).unwrap();
        let parts = [s, Shape { fields: 1, dim: 2 }, Shape::flat(5)];
        let c = concat(&mut args("{}"), &parts).unwrap();
        assert_eq!(c.output(), Shape::flat(13));
        check_layer(c.as_ref(), &parts, 3, 3).unwrap();
        assert_eq!(concat(&mut args("{}"), &parts[..2]).unwrap().output(), Shape { fields: 4, dim: 2 });
        let same = [s, Shape::flat(6), s];
        check_layer(add(&mut args("{}"), &same).unwrap().as_ref(), &same, 3, 4).unwrap();
    }

    #[test]
    fn dropout_drops_about_its_rate_and_only_in_training() {
        let layer = dropout(&mut args(r#"{"rate": 0.25}"#), &[Shape::flat(1000)]).unwrap();
        let x = vec![1.0f32; 2000];
        let seeds = [11u64, 12];
        let mut y = vec![0.0; 2000];
        layer.forward(&Ctx { rows: 2, train: true, seeds: &seeds }, &[], &[&x], &mut y, &mut []);
        let dropped = y.iter().filter(|v| **v == 0.0).count();
        assert!((400..600).contains(&dropped), "{dropped} of 2000 dropped");
        assert!(y.iter().all(|v| *v == 0.0 || (*v - 1.0 / 0.75).abs() < 1e-6));
        assert_ne!(y[..1000], y[1000..], "two samples get different masks");
        layer.forward(&Ctx { rows: 2, train: false, seeds: &seeds }, &[], &[&x], &mut y, &mut []);
        assert_eq!(y, x);
    }

    #[test]
    fn mismatched_inputs_are_refused() {
        assert!(add(&mut args("{}"), &[Shape::flat(2), Shape::flat(3)]).unwrap_err().contains("one size"));
        assert!(concat(&mut args("{}"), &[Shape::flat(2)]).unwrap_err().contains("two or more"));
        assert!(dropout(&mut args(r#"{"rate": 1.5}"#), &[Shape::flat(2)]).is_err());
    }
}
