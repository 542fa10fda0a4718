//! One step's forward/backward, split over data-parallel replicas (`--threads`), and `clip`, the
//! optional clip of a step's mean gradient to `clip_grad_norm`.

use super::store::Lookups;
use crate::base::batch::Batch;
use crate::model::{Grads, Model, Work};
use crate::nn::{with_precision, Precision};

/// One data-parallel replica's buffers.
#[derive(Default)]
pub struct Replica {
    work: Work,
    /// Dense gradient sums.
    pub grads: Vec<f32>,
    /// Per table, the gradient sums of the batch's unique rows.
    pub row_grads: Vec<Vec<f32>>,
}

impl Replica {
    fn prepare(&mut self, dense: usize, lookups: &Lookups, dims: &[usize]) {
        self.grads.clear();
        self.grads.resize(dense, 0.0);
        self.row_grads.resize_with(dims.len(), Vec::new);
        for ((g, l), d) in self.row_grads.iter_mut().zip(&lookups.tables).zip(dims) {
            g.clear();
            g.resize(l.unique.len() * d, 0.0);
        }
    }
}

/// Scales a step's gradient sums (dense and rows) so that the L2 norm of the batch's mean
/// gradient (the sums over `samples`) is at most `max`; says whether it had to. A non-finite
/// gradient is left as it is, for the servers to refuse. The dense ranges `stats` hold summary
/// statistics' sums (`batch_norm`, `data_norm`), not gradients: they are neither counted nor
/// scaled.
pub fn clip(replica: &mut Replica, samples: usize, max: f32, stats: &[std::ops::Range<usize>]) -> bool {
    let trained = |i: usize| !stats.iter().any(|r| r.contains(&i));
    let dense = replica.grads.iter().enumerate().filter(|(i, _)| trained(*i)).map(|(_, g)| g);
    let all = dense.chain(replica.row_grads.iter().flatten());
    let norm = all.map(|g| (*g as f64).powi(2)).sum::<f64>().sqrt() / samples.max(1) as f64;
    if !(norm.is_finite() && norm > max as f64) {
        return false;
    }
    let scale = (max as f64 / norm) as f32;
    let dense = replica.grads.iter_mut().enumerate().filter(|(i, _)| trained(*i)).map(|(_, g)| g);
    dense.chain(replica.row_grads.iter_mut().flatten()).for_each(|g| *g *= scale);
    true
}

/// Per head, a step's summed loss and predictions in batch order.
pub type HeadOutputs = Vec<(f64, Vec<f32>)>;

/// Forward/backward of `batch` (step `step`) split over the replicas; `rows[t]` holds table
/// `t`'s rows of the batch's unique ids. Leaves the summed gradients in replica 0 and returns
/// the summed (head-weighted) loss and each head's loss and predictions. Matrix products are
/// at `precision` (see [`crate::nn::with_precision`]).
#[allow(clippy::too_many_arguments)]
pub fn compute(
    precision: Precision,
    model: &Model,
    params: &[f32],
    batch: &Batch,
    lookups: &Lookups,
    rows: &[Vec<f32>],
    step: u64,
    replicas: &mut [Replica],
) -> (f64, HeadOutputs) {
    let dims: Vec<usize> = model.tables().iter().map(|t| t.dim).collect();
    // Equal chunks of `chunk` rows; fewer parts than replicas when the batch is short (5 rows
    // over 4 replicas are 2 + 2 + 1, not a fourth, empty chunk).
    let chunk = batch.len().div_ceil(replicas.len().min(batch.len()).max(1)).max(1);
    let parts = batch.len().div_ceil(chunk).max(1);
    let run = |r: &mut Replica, part: &Batch, ids: std::ops::Range<usize>| {
        r.prepare(params.len(), lookups, &dims);
        let tables: Vec<_> = lookups
            .rows(rows)
            .into_iter()
            .map(|mut t| {
                if !t.index.is_empty() {
                    t.index = &t.index[ids.clone()];
                }
                t
            })
            .collect();
        let grads = Grads { dense: &mut r.grads, rows: &mut r.row_grads };
        with_precision(precision, || model.train_step(params, part, &tables, step, &mut r.work, grads))
    };
    let losses: Vec<f64> = if parts == 1 {
        vec![run(&mut replicas[0], batch, 0..batch.ids.len())]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = replicas[..parts]
                .iter_mut()
                .enumerate()
                .map(|(k, r)| {
                    let range = k * chunk..((k + 1) * chunk).min(batch.len());
                    let run = &run;
                    s.spawn(move || run(r, &batch.slice(range.clone()), batch.id_range(range)))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a compute thread panicked")).collect()
        })
    };
    let (first, rest) = replicas.split_at_mut(1);
    let mut heads: HeadOutputs = first[0].work.heads();
    for r in &rest[..parts - 1] {
        first[0].grads.iter_mut().zip(&r.grads).for_each(|(a, b)| *a += b);
        for (mine, theirs) in first[0].row_grads.iter_mut().zip(&r.row_grads) {
            mine.iter_mut().zip(theirs).for_each(|(a, b)| *a += b);
        }
        for ((loss, probs), (l, p)) in heads.iter_mut().zip(r.work.head_losses.iter().zip(&r.work.head_probs)) {
            *loss += l;
            probs.extend_from_slice(p);
        }
    }
    (losses.iter().sum(), heads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_bounds_the_mean_gradients_norm_and_leaves_small_or_broken_ones() {
        // Sums over 2 samples: mean gradient (3, 0) dense and (0, 4) in a row, norm 5.
        let replica = || Replica { work: Work::default(), grads: vec![6.0, 0.0], row_grads: vec![vec![0.0, 8.0]] };
        let mut r = replica();
        assert!(clip(&mut r, 2, 1.0, &[]));
        assert_eq!((r.grads.clone(), r.row_grads.clone()), (vec![1.2, 0.0], vec![vec![0.0, 1.6]]));
        let mut r = replica();
        assert!(!clip(&mut r, 2, 5.0, &[]), "a norm at the bound is left");
        assert_eq!(r.grads, [6.0, 0.0]);
        let mut r = replica();
        r.grads[1] = f32::NAN;
        assert!(!clip(&mut r, 2, 1.0, &[]), "NaN is the servers' to refuse");
        // A statistic's sum (dense float 1) is neither counted nor scaled.
        let mut r = replica();
        r.grads[1] = 1000.0;
        let stats = vec![std::ops::Range { start: 1, end: 2 }];
        assert!(clip(&mut r, 2, 1.0, &stats));
        assert_eq!((r.grads.clone(), r.row_grads.clone()), (vec![1.2, 1000.0], vec![vec![0.0, 1.6]]));
    }
}
