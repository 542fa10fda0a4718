//! The built-in `embedding` layer: each sample's bags of ids in some slots, looked up in one
//! sparse table and pooled into one vector per slot, giving a (slots x dim) field tensor.
//!
//! It is not a [`crate::nn::layer::Layer`]: its rows come from the parameter servers (pulled for
//! the batch's unique ids of its table) and its gradients go back to them as per-row sums.

use serde::{Deserialize, Serialize};

use crate::batch::Batch;

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
}

impl Embedding {
    /// Pools the rows of every (sample, slot) bag into `y` (rows x slots x dim). `index` maps
    /// each position of `batch.ids` to its row in `rows` (the table's unique ids of the batch).
    pub fn forward(&self, batch: &Batch, index: &[u32], rows: &[f32], y: &mut [f32]) {
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

    /// Adds the gradient of every pooled vector, `dy` (rows x slots x dim), onto the gradient
    /// sums of the rows it came from.
    pub fn backward(&self, batch: &Batch, index: &[u32], dy: &[f32], row_grads: &mut [f32]) {
        let (d, f, s) = (self.dim, self.slots.len(), batch.slots);
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
        let e = |pooling| Embedding { table: 0, dim: 2, slots: vec![0, 1], pooling };
        e(Pooling::Sum).forward(&b, &index, &rows, &mut y);
        assert_eq!(y, [1.0, 2.0, 310.0, 620.0, 0.0, 0.0, 201.0, 402.0]);
        e(Pooling::Mean).forward(&b, &index, &rows, &mut y);
        assert_eq!(y, [1.0, 2.0, 155.0, 310.0, 0.0, 0.0, 67.0, 134.0]);
        e(Pooling::SqrtN).forward(&b, &index, &rows, &mut y);
        assert!((y[6] - 201.0 / 3f32.sqrt()).abs() < 1e-3);
        let only_second = Embedding { table: 0, dim: 2, slots: vec![1], pooling: Pooling::Sum };
        let mut y = vec![0.0; 4];
        only_second.forward(&b, &index, &rows, &mut y);
        assert_eq!(y, [310.0, 620.0, 201.0, 402.0]);
    }

    #[test]
    fn gradients_match_finite_differences_for_every_pooling() {
        let (b, index, rows) = fixture();
        for pooling in [Pooling::Sum, Pooling::Mean, Pooling::SqrtN] {
            let e = Embedding { table: 0, dim: 2, slots: vec![1, 0], pooling };
            let weights: Vec<f32> = (0..8).map(|k| (k as f32 - 3.5) / 4.0).collect();
            let loss = |rows: &[f32]| {
                let mut y = vec![0.0; 8];
                e.forward(&b, &index, rows, &mut y);
                y.iter().zip(&weights).map(|(a, w)| (*a * w) as f64).sum::<f64>()
            };
            let mut grads = vec![0.0; rows.len()];
            e.backward(&b, &index, &weights, &mut grads);
            for k in 0..rows.len() {
                let (mut hi, mut lo) = (rows.clone(), rows.clone());
                hi[k] += 0.5;
                lo[k] -= 0.5;
                let numeric = (loss(&hi) - loss(&lo)) / 1.0;
                assert!(
                    (numeric - grads[k] as f64).abs() < 1e-3,
                    "{pooling:?} row float {k}: {numeric} vs {}",
                    grads[k]
                );
            }
        }
    }
}
