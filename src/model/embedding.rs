//! The built-in `embedding` layer: each sample's bags of ids in some slots, looked up in one
//! sparse table and pooled into one vector per slot, giving a (slots x dim) field tensor; or,
//! with `sequence = L`, kept in order as an (L x slots*dim) tensor with a mask (behaviour
//! sequences for attention and recurrent layers).
//!
//! It is not a [`crate::nn::layer::Layer`]: its rows come from the parameter servers (pulled for
//! the batch's unique ids of its table) and its gradients go back to them as per-row sums.
//!
//! Pooling is sum, mean or sqrt-n, with per-id weights; backward adds each position's output
//! gradient onto its row's gradient sum. One-hot data is the case of bags of one id (no offsets
//! stored) on the same code path, with a copy instead of a loop. A sequence embedding (`sequence
//! = L`) keeps each bag's last `L` ids in order and writes a second tensor, `NAME.mask`, which
//! the graph places after the layers' tensors and orders with its embedding: masks are data, not
//! layers, so attention layers take them as an ordinary (gradient-free) input and the export
//! computes them from the bags' lengths.

use serde::{Deserialize, Serialize};

use crate::base::batch::Batch;

/// How a bag of rows becomes one vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Sum of the (weighted) rows.
    Sum,
    /// Sum divided by the number of ids.
    Mean,
    /// Sum divided by the square root of the number of ids.
    SqrtN,
}

impl Pooling {
    /// The job-file name's pooling.
    pub fn parse(name: &str) -> Result<Pooling, String> {
        match name {
            "sum" => Ok(Pooling::Sum),
            "mean" => Ok(Pooling::Mean),
            "sqrt_n" | "sqrtn" => Ok(Pooling::SqrtN),
            other => Err(format!("unknown pooling {other:?} (sum, mean, sqrt_n)")),
        }
    }

    /// The factor applied to the sum of a bag of `n` ids (an empty bag pools to zeros).
    #[inline]
    fn scale(self, n: usize) -> f32 {
        match (self, n) {
            (_, 0) | (Pooling::Sum, _) => 1.0,
            (Pooling::Mean, n) => 1.0 / n as f32,
            (Pooling::SqrtN, n) => 1.0 / (n as f32).sqrt(),
        }
    }
}

/// One `embedding` layer: which table, which of the batch's slots, how bags pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Embedding {
    /// Index of the table among the model's tables.
    pub table: usize,
    /// Floats per row.
    pub dim: usize,
    /// The batch's slot indices this layer looks up, in output field order.
    pub slots: Vec<usize>,
    /// Pooling of each bag.
    pub pooling: Pooling,
    /// With `Some(L)`, no pooling: each bag kept in order as `L` positions (see
    /// [`Embedding::forward`]).
    pub sequence: Option<usize>,
}

impl Embedding {
    /// Floats per sample of the output.
    pub fn width(&self) -> usize {
        self.sequence.unwrap_or(1) * self.slots.len() * self.dim
    }

    /// Where a sequence position `p` of a bag of `n` ids reads: the bag's last `L` ids (the
    /// most recent, behaviour logs being oldest first) fill positions `0..min(n, L)` in their
    /// order, the rest is padding (zeros, mask 0).
    #[inline]
    pub fn position(n: usize, len: usize, p: usize) -> Option<usize> {
        let start = n.saturating_sub(len);
        (start + p < n).then_some(start + p)
    }

    /// Pools the rows of every (sample, slot) bag into `y` (rows x slots x dim); a sequence
    /// embedding writes `y` (rows x L x slots*dim), each id's row times its weight, and
    /// `mask` (rows x L: 1 for a real position, by the first slot's bag). `index` maps each
    /// position of `batch.ids` to its row in `rows` (the table's unique ids of the batch).
    pub fn forward(&self, batch: &Batch, index: &[u32], rows: &[f32], y: &mut [f32], mask: &mut [f32]) {
        if let Some(len) = self.sequence {
            return self.forward_sequence(batch, index, rows, len, y, mask);
        }
        let (d, f, s) = (self.dim, self.slots.len(), batch.slots);
        for r in 0..batch.len() {
            for (j, &slot) in self.slots.iter().enumerate() {
                let out = &mut y[(r * f + j) * d..(r * f + j + 1) * d];
                let bag = batch.bag(r * s + slot);
                let scale = self.pooling.scale(bag.len());
                if bag.len() == 1 && batch.weights.is_empty() {
                    // One-hot: a copy (the common case of Criteo-like data).
                    let u = index[bag.start] as usize;
                    out.copy_from_slice(&rows[u * d..(u + 1) * d]);
                    continue;
                }
                out.fill(0.0);
                for i in bag {
                    let (u, w) = (index[i] as usize, batch.weight(i) * scale);
                    out.iter_mut().zip(&rows[u * d..(u + 1) * d]).for_each(|(o, v)| *o += w * v);
                }
            }
        }
    }

    fn forward_sequence(
        &self,
        batch: &Batch,
        index: &[u32],
        rows: &[f32],
        len: usize,
        y: &mut [f32],
        mask: &mut [f32],
    ) {
        let (d, f, s) = (self.dim, self.slots.len(), batch.slots);
        y.fill(0.0);
        for r in 0..batch.len() {
            for (j, &slot) in self.slots.iter().enumerate() {
                let bag = batch.bag(r * s + slot);
                for p in 0..len {
                    let at = ((r * len + p) * f + j) * d;
                    let Some(k) = Self::position(bag.len(), len, p) else { continue };
                    let (u, w) = (index[bag.start + k] as usize, batch.weight(bag.start + k));
                    y[at..at + d].iter_mut().zip(&rows[u * d..(u + 1) * d]).for_each(|(o, v)| *o = w * v);
                }
                if j == 0 {
                    for p in 0..len {
                        mask[r * len + p] = Self::position(bag.len(), len, p).map_or(0.0, |_| 1.0);
                    }
                }
            }
        }
    }

    /// Adds the gradient of every pooled vector, `dy` (rows x slots x dim; a sequence's rows x
    /// L x slots*dim), onto the gradient sums of the rows it came from.
    pub fn backward(&self, batch: &Batch, index: &[u32], dy: &[f32], row_grads: &mut [f32]) {
        let (d, f, s) = (self.dim, self.slots.len(), batch.slots);
        if let Some(len) = self.sequence {
            for r in 0..batch.len() {
                for (j, &slot) in self.slots.iter().enumerate() {
                    let bag = batch.bag(r * s + slot);
                    for p in 0..len {
                        let Some(k) = Self::position(bag.len(), len, p) else { break };
                        let at = ((r * len + p) * f + j) * d;
                        let (u, w) = (index[bag.start + k] as usize, batch.weight(bag.start + k));
                        let dst = &mut row_grads[u * d..(u + 1) * d];
                        dst.iter_mut().zip(&dy[at..at + d]).for_each(|(a, b)| *a += w * b);
                    }
                }
            }
            return;
        }
        for r in 0..batch.len() {
            for (j, &slot) in self.slots.iter().enumerate() {
                let g = &dy[(r * f + j) * d..(r * f + j + 1) * d];
                let bag = batch.bag(r * s + slot);
                let scale = self.pooling.scale(bag.len());
                for i in bag {
                    let (u, w) = (index[i] as usize, batch.weight(i) * scale);
                    let dst = &mut row_grads[u * d..(u + 1) * d];
                    if w == 1.0 {
                        dst.iter_mut().zip(g).for_each(|(a, b)| *a += b);
                    } else {
                        dst.iter_mut().zip(g).for_each(|(a, b)| *a += w * b);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two samples, two slots, multi-hot with weights and an empty bag, dim 2; rows are the
    /// unique ids' vectors.
    fn fixture() -> (Batch, Vec<u32>, Vec<f32>) {
        let mut b = Batch::new(1, 0, 2);
        b.labels.extend([1.0, 0.0]);
        b.push_bag(&[10], None);
        b.push_bag(&[11, 12], Some(&[1.0, 3.0]));
        b.push_bag(&[], None);
        b.push_bag(&[12, 10, 12], None);
        let index = vec![0, 1, 2, 2, 0, 2];
        let rows = vec![1.0, 2.0, 10.0, 20.0, 100.0, 200.0];
        (b, index, rows)
    }

    #[test]
    fn bags_pool_by_sum_mean_and_sqrt_n_and_empty_bags_are_zero() {
        let (b, index, rows) = fixture();
        let mut y = vec![0.0; 8];
        let e = |pooling| Embedding { table: 0, dim: 2, slots: vec![0, 1], pooling, sequence: None };
        e(Pooling::Sum).forward(&b, &index, &rows, &mut y, &mut []);
        assert_eq!(y, [1.0, 2.0, 310.0, 620.0, 0.0, 0.0, 201.0, 402.0]);
        e(Pooling::Mean).forward(&b, &index, &rows, &mut y, &mut []);
        assert_eq!(y, [1.0, 2.0, 155.0, 310.0, 0.0, 0.0, 67.0, 134.0]);
        e(Pooling::SqrtN).forward(&b, &index, &rows, &mut y, &mut []);
        assert!((y[6] - 201.0 / 3f32.sqrt()).abs() < 1e-3);
        let only_second = Embedding { table: 0, dim: 2, slots: vec![1], pooling: Pooling::Sum, sequence: None };
        let mut y = vec![0.0; 4];
        only_second.forward(&b, &index, &rows, &mut y, &mut []);
        assert_eq!(y, [310.0, 620.0, 201.0, 402.0]);
    }

    /// `e`'s row gradients against central differences of a fixed weighting of its output.
    fn check_gradients(e: &Embedding) {
        let (b, index, rows) = fixture();
        let (n, masks) = (b.len() * e.width(), b.len() * e.sequence.unwrap_or(0));
        let weights: Vec<f32> = (0..n).map(|k| (k as f32 - n as f32 / 2.0) / 8.0).collect();
        let loss = |rows: &[f32]| {
            let mut y = vec![0.0; n];
            e.forward(&b, &index, rows, &mut y, &mut vec![0.0; masks]);
            y.iter().zip(&weights).map(|(a, w)| (*a * w) as f64).sum::<f64>()
        };
        let mut grads = vec![0.0; rows.len()];
        e.backward(&b, &index, &weights, &mut grads);
        for k in 0..rows.len() {
            let (mut hi, mut lo) = (rows.clone(), rows.clone());
            hi[k] += 0.5;
            lo[k] -= 0.5;
            let numeric = loss(&hi) - loss(&lo);
            assert!((numeric - grads[k] as f64).abs() < 1e-3, "{e:?} row float {k}: {numeric} vs {}", grads[k]);
        }
    }

    #[test]
    fn gradients_match_finite_differences_for_every_pooling() {
        for pooling in [Pooling::Sum, Pooling::Mean, Pooling::SqrtN] {
            check_gradients(&Embedding { table: 0, dim: 2, slots: vec![1, 0], pooling, sequence: None });
        }
    }

    #[test]
    fn a_sequence_keeps_the_last_ids_in_order_padded_with_zeros_and_masked() {
        let (b, index, rows) = fixture();
        // Slot 1's bags: [11, 12] weighted 1 and 3; [12, 10, 12]. Length 2 keeps the last two.
        let e = Embedding { table: 0, dim: 2, slots: vec![1], pooling: Pooling::Sum, sequence: Some(2) };
        let (mut y, mut mask) = (vec![9.0; 8], vec![9.0; 4]);
        e.forward(&b, &index, &rows, &mut y, &mut mask);
        assert_eq!(y, [10.0, 20.0, 300.0, 600.0, 1.0, 2.0, 100.0, 200.0]);
        assert_eq!(mask, [1.0, 1.0, 1.0, 1.0]);
        // Length 3 over slots 0 and 1: slot 0's one id, then padding; mask by slot 0.
        let e = Embedding { table: 0, dim: 2, slots: vec![0, 1], pooling: Pooling::Sum, sequence: Some(3) };
        let (mut y, mut mask) = (vec![9.0; 24], vec![9.0; 6]);
        e.forward(&b, &index, &rows, &mut y, &mut mask);
        assert_eq!(y[..12], [1.0, 2.0, 10.0, 20.0, 0.0, 0.0, 300.0, 600.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(y[12..], [0.0, 0.0, 100.0, 200.0, 0.0, 0.0, 1.0, 2.0, 0.0, 0.0, 100.0, 200.0]);
        assert_eq!(mask, [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn a_sequences_gradient_matches_finite_differences() {
        check_gradients(&Embedding { table: 0, dim: 2, slots: vec![1, 0], pooling: Pooling::Sum, sequence: Some(2) });
    }
}
