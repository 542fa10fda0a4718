//! Running a [`Model`] on a batch: forward through the nodes in order, the heads' weighted losses
//! (a `value` head's loss is the value of its tensor, with gradient 1), and backward in reverse
//! order, each tensor's gradient accumulated from every layer it feeds, with every tensor's values
//! and gradients in reusable buffers. Each sample's dropout seed is made here, from its content and
//! the step.

use super::graph::{Model, Op, DENSE};
use crate::base::batch::Batch;
use crate::base::layout::mix64;
use crate::nn::layer::Ctx;
use crate::nn::{bce_with_logits, softmax_cross_entropy, square_error};
use crate::observe::metrics::Loss;

/// One table's share of a batch: where each of the batch's ids is among the table's unique ids
/// (`u32::MAX` for ids of slots this table is not looked up with), and the unique ids' rows.
#[derive(Clone, Copy, Debug)]
pub struct TableRows<'a> {
    /// Per position of `batch.ids`.
    pub index: &'a [u32],
    /// `dim` floats per unique id.
    pub rows: &'a [f32],
}

/// Where a training step adds its gradient sums.
pub struct Grads<'a> {
    /// The dense parameters' (the model's flat vector's length).
    pub dense: &'a mut [f32],
    /// Per table, the rows' of the batch's unique ids.
    pub rows: &'a mut [Vec<f32>],
}

/// Per-thread buffers of a [`Model`], reused from step to step.
#[derive(Default)]
pub struct Work {
    values: Vec<Vec<f32>>,
    grads: Vec<Vec<f32>>,
    scratch: Vec<Vec<f32>>,
    seeds: Vec<u64>,
    dloss: Vec<f32>,
    /// Per head, the last batch's predictions for per-sample metrics: click probabilities
    /// (log-loss) or values (square); for softmax the true class's probability in evaluation,
    /// nothing in training.
    pub head_probs: Vec<Vec<f32>>,
    /// Per head, the last batch's summed loss (not weighted).
    pub head_losses: Vec<f64>,
}

impl Work {
    /// Per head, the last batch's summed loss and predictions.
    pub fn heads(&self) -> Vec<(f64, Vec<f32>)> {
        self.head_losses.iter().zip(&self.head_probs).map(|(l, p)| (*l, p.clone())).collect()
    }
}

impl Model {
    /// Forward and backward on one batch of training step `step`. Adds the dense gradient sums
    /// into `grads.dense` and each table's row gradient sums into `grads.rows[table]` (aligned
    /// with its unique ids); returns the summed (head-weighted) loss and leaves the predictions
    /// in `work`.
    pub fn train_step(
        &self,
        params: &[f32],
        batch: &Batch,
        tables: &[TableRows],
        step: u64,
        work: &mut Work,
        grads: Grads,
    ) -> f64 {
        self.forward(params, batch, tables, Some(step), work);
        let loss = self.apply_losses(batch, work, true);
        self.backward(params, batch, tables, work, grads.dense, grads.rows);
        loss
    }

    /// Forward only (evaluation: dropout off): returns the summed loss of one batch and leaves
    /// its predictions in `work`.
    pub fn evaluate(&self, params: &[f32], batch: &Batch, tables: &[TableRows], work: &mut Work) -> f64 {
        self.forward(params, batch, tables, None, work);
        self.apply_losses(batch, work, false)
    }

    fn ctx<'a>(&self, batch: &Batch, step: Option<u64>, seeds: &'a mut Vec<u64>) -> Ctx<'a> {
        seeds.clear();
        if let (Some(step), true) = (step, self.random) {
            // A sample's seed depends on its content and the step only, so it draws the same
            // dropout mask whichever trainer or thread computes it (sync equals local).
            let salt = mix64(step ^ 0x5eed_d509);
            seeds.extend((0..batch.len()).map(|r| {
                let mut h = salt;
                let lw = batch.label_width;
                for &y in &batch.labels[r * lw..(r + 1) * lw] {
                    h = mix64(h ^ y.to_bits() as u64);
                }
                let dw = batch.dense_width;
                for &x in &batch.dense[r * dw..(r + 1) * dw] {
                    h = mix64(h ^ x.to_bits() as u64);
                }
                for i in batch.id_range(r..r + 1) {
                    h = mix64(h ^ batch.ids[i]);
                }
                h
            }));
        }
        Ctx { rows: batch.len(), train: step.is_some(), seeds }
    }

    fn forward(&self, params: &[f32], batch: &Batch, tables: &[TableRows], step: Option<u64>, work: &mut Work) {
        let rows = batch.len();
        work.values.resize_with(self.shapes.len(), Vec::new);
        work.scratch.resize_with(self.nodes.len(), Vec::new);
        let mut seeds = std::mem::take(&mut work.seeds);
        let ctx = self.ctx(batch, step, &mut seeds);
        for (k, node) in self.nodes.iter().enumerate() {
            let mut out = std::mem::take(&mut work.values[node.output]);
            out.resize(rows * self.shapes[node.output].size(), 0.0);
            match &node.op {
                Op::Embedding(e) => {
                    let t = &tables[e.table];
                    let mut mask = node.mask.map(|m| std::mem::take(&mut work.values[m])).unwrap_or_default();
                    mask.resize(rows * e.sequence.unwrap_or(0), 0.0);
                    e.forward(batch, t.index, t.rows, &mut out, &mut mask);
                    if let Some(m) = node.mask {
                        work.values[m] = mask;
                    }
                }
                Op::Layer(layer) => {
                    let xs: Vec<&[f32]> = node
                        .inputs
                        .iter()
                        .map(|&t| if t == DENSE { &batch.dense[..] } else { &work.values[t][..] })
                        .collect();
                    let scratch = &mut work.scratch[k];
                    scratch.resize(rows * layer.scratch(), 0.0);
                    layer.forward(&ctx, &params[node.params.clone()], &xs, &mut out, scratch);
                }
            }
            work.values[node.output] = out;
        }
        work.seeds = seeds;
    }

    /// Every head's loss on the last forward pass: the weighted sum is returned, predictions
    /// are kept, and in `training` each head's output gradient (times its weight) starts the
    /// backward pass on zeroed gradient buffers.
    fn apply_losses(&self, batch: &Batch, work: &mut Work, training: bool) -> f64 {
        let rows = batch.len();
        work.grads.resize_with(self.shapes.len(), Vec::new);
        for (t, g) in work.grads.iter_mut().enumerate() {
            g.clear();
            if training && self.needs_grad[t] {
                g.resize(rows * self.shapes[t].size(), 0.0);
            }
        }
        work.head_probs.resize_with(self.heads.len(), Vec::new);
        work.head_losses.resize(self.heads.len(), 0.0);
        let mut total = 0.0;
        for (h, head) in self.heads.iter().enumerate() {
            let out = &work.values[head.tensor];
            let labels = self.labels(batch, h);
            work.dloss.resize(out.len(), 0.0);
            let probs = &mut work.head_probs[h];
            let loss = match head.loss {
                Loss::LogLoss => {
                    probs.resize(rows, 0.0);
                    bce_with_logits(out, &labels, &mut work.dloss, probs)
                }
                Loss::Square => {
                    probs.clear();
                    probs.extend_from_slice(out);
                    square_error(out, &labels, &mut work.dloss)
                }
                Loss::Softmax => {
                    probs.clear();
                    // In evaluation, the true class's probability, for `oar predict`.
                    let true_probs = (!training).then_some(&mut *probs);
                    softmax_cross_entropy(out, &labels, head.width, &mut work.dloss, true_probs)
                }
                Loss::Value => {
                    probs.clear();
                    probs.extend_from_slice(out);
                    // Summed like the other losses: the servers divide by the sample count.
                    work.dloss.fill(1.0);
                    out.iter().map(|&v| v as f64).sum()
                }
            };
            work.head_losses[h] = loss;
            total += head.weight as f64 * loss;
            if training && self.needs_grad[head.tensor] {
                let w = head.weight;
                work.grads[head.tensor].iter_mut().zip(&work.dloss).for_each(|(g, d)| *g += w * d);
            }
        }
        total
    }

    fn backward(
        &self,
        params: &[f32],
        batch: &Batch,
        tables: &[TableRows],
        work: &mut Work,
        grads: &mut [f32],
        row_grads: &mut [Vec<f32>],
    ) {
        // The seeds forward drew for this step.
        let seeds = std::mem::take(&mut work.seeds);
        let ctx = Ctx { rows: batch.len(), train: true, seeds: &seeds };
        for (k, node) in self.nodes.iter().enumerate().rev() {
            if !self.needs_grad[node.output] {
                continue;
            }
            let dy = std::mem::take(&mut work.grads[node.output]);
            match &node.op {
                Op::Embedding(e) => e.backward(batch, tables[e.table].index, &dy, &mut row_grads[e.table]),
                Op::Layer(layer) => {
                    let mut dxs: Vec<Option<Vec<f32>>> = node
                        .inputs
                        .iter()
                        .map(|&t| self.needs_grad[t].then(|| std::mem::take(&mut work.grads[t])))
                        .collect();
                    {
                        let xs: Vec<&[f32]> = node
                            .inputs
                            .iter()
                            .map(|&t| if t == DENSE { &batch.dense[..] } else { &work.values[t][..] })
                            .collect();
                        let mut dx: Vec<Option<&mut [f32]>> = dxs.iter_mut().map(|d| d.as_deref_mut()).collect();
                        layer.backward(
                            &ctx,
                            &params[node.params.clone()],
                            &xs,
                            &work.values[node.output],
                            &dy,
                            &mut work.scratch[k],
                            &mut grads[node.params.clone()],
                            &mut dx,
                        );
                    }
                    for (&t, d) in node.inputs.iter().zip(dxs) {
                        if let Some(d) = d {
                            work.grads[t] = d;
                        }
                    }
                }
            }
            work.grads[node.output] = dy;
        }
        work.seeds = seeds;
    }
}
