//! One step's forward/backward, split over data-parallel replicas (`--threads`).

use crate::data::Batch;
use crate::model::{Network, Work};

/// One data-parallel replica's buffers.
#[derive(Default)]
pub struct Replica {
    work: Work,
    /// Dense gradient sums.
    pub grads: Vec<f32>,
    /// Gradient sums of the batch's unique rows.
    pub row_grads: Vec<f32>,
}

/// Forward/backward of `batch` split over the replicas; leaves the summed gradients in
/// replica 0 and returns (summed loss, predictions in batch order).
pub fn compute(
    model: &Network,
    params: &[f32],
    batch: &Batch,
    rows: &[f32],
    index: &[u32],
    replicas: &mut [Replica],
    unique: usize,
) -> (f64, Vec<f32>) {
    let dim = model.config().embedding_dim;
    let slots = batch.slots;
    let parts = replicas.len().min(batch.len()).max(1);
    let chunk = batch.len().div_ceil(parts);
    let prepare = |r: &mut Replica| {
        r.grads.clear();
        r.grads.resize(params.len(), 0.0);
        r.row_grads.clear();
        r.row_grads.resize(unique * dim, 0.0);
    };
    let losses: Vec<f64> = if parts == 1 {
        let r = &mut replicas[0];
        prepare(r);
        vec![model.train_step(params, batch, rows, index, &mut r.work, &mut r.grads, &mut r.row_grads)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = replicas[..parts]
                .iter_mut()
                .enumerate()
                .map(|(k, r)| {
                    let range = k * chunk..((k + 1) * chunk).min(batch.len());
                    s.spawn(move || {
                        prepare(r);
                        let part = batch.slice(range.clone());
                        let idx = &index[range.start * slots..range.end * slots];
                        model.train_step(params, &part, rows, idx, &mut r.work, &mut r.grads, &mut r.row_grads)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a compute thread panicked")).collect()
        })
    };
    let (first, rest) = replicas.split_at_mut(1);
    let mut probs = first[0].work.probs.clone();
    for r in &rest[..parts - 1] {
        first[0].grads.iter_mut().zip(&r.grads).for_each(|(a, b)| *a += b);
        first[0].row_grads.iter_mut().zip(&r.row_grads).for_each(|(a, b)| *a += b);
        probs.extend_from_slice(&r.work.probs);
    }
    (losses.iter().sum(), probs)
}
