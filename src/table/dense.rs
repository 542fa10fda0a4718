//! The dense blocks one server owns, with their optimizer state.
//!
//! The flat dense vector is cut into fixed-size blocks dealt round-robin to servers (see
//! [`crate::base::layout::DenseLayout`]); on the wire a server's blocks travel concatenated in block
//! order, so a pull or push is one contiguous array per server.
//!
//! Weights sit behind an `Arc` so a pull can take a snapshot of every block by reference and
//! write it to the socket after the lock is released, without copying megabytes; an update
//! that meets a block still being sent copies that one block first (`Arc::make_mut`).

use std::sync::Arc;

use super::{DenseSpec, Optimizer, TableError};
use crate::base::layout::DenseLayout;

/// One block: its place in the flat vector, its weights and its optimizer state.
pub struct Block {
    /// Block number in the flat vector.
    pub index: usize,
    /// Offset of the block's first float in the flat vector.
    pub start: usize,
    /// Weights (shared with pull replies still being sent).
    pub weights: Arc<[f32]>,
    /// Optimizer state (`optimizer.state_len(weights.len())` floats).
    pub state: Vec<f32>,
    /// The block's floats that are summary statistics ([`super::Update::Summary`]): block-local
    /// ranges and their decay.
    summaries: Vec<(std::ops::Range<usize>, f32)>,
}

/// The dense blocks of one server.
pub struct DenseShard {
    /// Owned blocks in increasing block order.
    pub blocks: Vec<Block>,
    optimizer: Optimizer,
    len: usize,
}

impl DenseShard {
    /// Initial blocks of server `index` among `num_servers`.
    pub fn new(spec: &DenseSpec, index: usize, num_servers: usize) -> DenseShard {
        let layout: DenseLayout = spec.layout(num_servers);
        let optimizer = spec.optimizer;
        let summaries = super::summaries(&spec.params);
        let blocks: Vec<Block> = layout
            .blocks_of(index)
            .map(|b| {
                let range = layout.block_range(b);
                let mut weights = vec![0.0; range.len()];
                spec.init_range(range.start, &mut weights);
                let mut state = vec![0.0; optimizer.state_len(range.len())];
                optimizer.init_state(&mut state);
                let summaries = summaries
                    .iter()
                    .filter(|(r, _)| r.start < range.end && range.start < r.end)
                    .map(|(r, decay)| {
                        (r.start.max(range.start) - range.start..r.end.min(range.end) - range.start, *decay)
                    })
                    .collect();
                Block { index: b, start: range.start, weights: Arc::from(weights), state, summaries }
            })
            .collect();
        let len = blocks.iter().map(|b| b.weights.len()).sum();
        DenseShard { blocks, optimizer, len }
    }

    /// Number of floats this server owns.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if this server owns no dense float.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The owned blocks' weights by reference, in block order: a consistent snapshot that later
    /// updates do not change.
    pub fn snapshot(&self) -> Vec<Arc<[f32]>> {
        self.blocks.iter().map(|b| b.weights.clone()).collect()
    }

    /// Appends the owned weights, block after block, to `out`.
    pub fn read(&self, out: &mut Vec<f32>) {
        for b in &self.blocks {
            out.extend_from_slice(&b.weights);
        }
    }

    /// Replaces the owned weights with `values`, in the order [`read`](Self::read) gives them;
    /// the optimizer's state stays (a GEO trainer's copy taking in the servers' values).
    pub fn write(&mut self, values: &[f32]) -> Result<(), TableError> {
        if values.len() != self.len {
            return Err(TableError::LengthMismatch {
                what: "dense values".into(),
                expected: self.len,
                got: values.len(),
            });
        }
        let mut off = 0;
        for b in &mut self.blocks {
            let n = b.weights.len();
            Arc::make_mut(&mut b.weights).copy_from_slice(&values[off..off + n]);
            off += n;
        }
        Ok(())
    }

    /// Applies the optimizer to every owned block; `grads` holds gradient sums for the owned
    /// floats in wire order, `scale` turns them into means. Summary statistics take their
    /// sums as they are: `p = decay * p + sum`.
    /// The optimizer's learning rate is multiplied by `lr_factor` for this update.
    pub fn apply(&mut self, grads: &[f32], scale: f32, lr_factor: f32) -> Result<(), TableError> {
        if grads.len() != self.len {
            return Err(TableError::LengthMismatch {
                what: "dense gradient".into(),
                expected: self.len,
                got: grads.len(),
            });
        }
        let optimizer = Optimizer { lr: self.optimizer.lr * lr_factor, ..self.optimizer };
        let mut off = 0;
        for b in &mut self.blocks {
            let n = b.weights.len();
            let g = &grads[off..off + n];
            // GEO's sum adds a change to every float, statistics too.
            let summaries = if optimizer.kind == super::OptimizerKind::Sum { &[][..] } else { &b.summaries[..] };
            let summed: Vec<f32> = summaries
                .iter()
                .flat_map(|(r, decay)| r.clone().map(move |i| (i, *decay)))
                .map(|(i, decay)| decay * b.weights[i] + g[i])
                .collect();
            let weights = Arc::make_mut(&mut b.weights);
            optimizer.update(weights, &mut b.state, g, scale);
            // The optimizer ran over the statistics too (one pass over the block is faster than
            // cutting it); their values are replaced by the rule's.
            let mut summed = summed.into_iter();
            for (r, _) in summaries {
                for (w, v) in weights[r.clone()].iter_mut().zip(&mut summed) {
                    *w = v;
                }
            }
            off += n;
        }
        Ok(())
    }
}
