//! Models: which tables they need and how one batch turns into a loss and gradients.
//!
//! [`CtrDnn`] is the Criteo click-through-rate network of PaddleRec's `rank/dnn`: each of the
//! 26 categorical slots looks up an embedding row (a sparse table on the servers), the rows are
//! concatenated with the 13 log-transformed integer features, and a ReLU MLP (400-400-400 by
//! default) ends in one logit trained with log-loss. Built from the reusable pieces in
//! [`crate::nn`]; knows nothing of servers or files.

use serde::{Deserialize, Serialize};

use crate::data::Batch;
use crate::nn::{bce_with_logits, gather_rows, scatter_add_rows, Activation, Mlp, MlpWork};
use crate::table::{DenseParam, DenseSpec, Init, Optimizer, SparseSpec, TableSpec};

/// Shape and initialization of the CTR-DNN.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Floats per embedding row.
    pub embedding_dim: usize,
    /// Hidden layer widths.
    pub hidden: Vec<usize>,
    /// Seed of every initializer.
    pub seed: u64,
    /// Half-width of the uniform initializer of embedding rows.
    pub embedding_init: f32,
    /// Dense floats per block dealt to servers.
    pub block_size: usize,
    /// Sparse slots per sample.
    pub slots: usize,
    /// Dense features per sample.
    pub dense_features: usize,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            embedding_dim: 10,
            hidden: vec![400, 400, 400],
            seed: 1,
            embedding_init: 0.05,
            block_size: 8192,
            slots: crate::data::criteo::SLOTS,
            dense_features: crate::data::criteo::DENSE,
        }
    }
}

impl ModelConfig {
    /// Checks the shape; messages name the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.embedding_dim == 0 || self.block_size == 0 || self.slots == 0 {
            return Err("model: embedding_dim, block_size and slots must be positive".into());
        }
        if self.hidden.contains(&0) {
            return Err("model: hidden layer widths must be positive".into());
        }
        Ok(())
    }
}

/// The CTR-DNN.
#[derive(Clone, Debug)]
pub struct CtrDnn {
    config: ModelConfig,
    mlp: Mlp,
    params: Vec<DenseParam>,
}

/// Per-thread buffers of a [`CtrDnn`], reused from step to step.
#[derive(Default)]
pub struct Work {
    x: Vec<f32>,
    mlp: MlpWork,
    dlogits: Vec<f32>,
    dx: Vec<f32>,
    /// Predicted click probabilities of the last batch.
    pub probs: Vec<f32>,
}

impl CtrDnn {
    /// The network for `config`.
    pub fn new(config: &ModelConfig) -> CtrDnn {
        let input = config.slots * config.embedding_dim + config.dense_features;
        let mut widths = vec![input];
        widths.extend(&config.hidden);
        widths.push(1);
        let (mlp, params) = Mlp::new("fc", &widths, Activation::Relu, Activation::Identity, 0);
        CtrDnn { config: config.clone(), mlp, params }
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn input_width(&self) -> usize {
        self.config.slots * self.config.embedding_dim + self.config.dense_features
    }

    /// The tables this model needs: the MLP's dense parameters and one embedding table.
    pub fn table_spec(&self, dense: Optimizer, sparse: Optimizer) -> TableSpec {
        TableSpec {
            dense: DenseSpec {
                params: self.params.clone(),
                block_size: self.config.block_size,
                seed: self.config.seed,
                optimizer: dense,
            },
            sparse: vec![SparseSpec {
                name: "embedding".into(),
                dim: self.config.embedding_dim,
                seed: self.config.seed,
                init: Init::Uniform { scale: self.config.embedding_init },
                optimizer: sparse,
            }],
        }
    }

    fn forward(&self, params: &[f32], batch: &Batch, rows: &[f32], index: &[u32], work: &mut Work) {
        let (n, width, dim) = (batch.len(), self.input_width(), self.config.embedding_dim);
        let emb = self.config.slots * dim;
        work.x.resize(n * width, 0.0);
        gather_rows(rows, index, self.config.slots, dim, &mut work.x, width);
        for r in 0..n {
            let d = batch.dense_width;
            work.x[r * width + emb..(r + 1) * width].copy_from_slice(&batch.dense[r * d..(r + 1) * d]);
        }
        self.mlp.forward(params, &work.x, n, &mut work.mlp);
    }

    /// Forward and backward on one batch. `rows` holds the embedding rows of the batch's unique
    /// ids and `index` maps each (sample, slot) to its unique row. Adds the dense gradient sums
    /// into `grads` and the per-row gradient sums into `row_grads`; returns the summed loss and
    /// leaves the predictions in `work.probs`.
    #[allow(clippy::too_many_arguments)]
    pub fn train_step(
        &self,
        params: &[f32],
        batch: &Batch,
        rows: &[f32],
        index: &[u32],
        work: &mut Work,
        grads: &mut [f32],
        row_grads: &mut [f32],
    ) -> f64 {
        let (n, width, dim) = (batch.len(), self.input_width(), self.config.embedding_dim);
        self.forward(params, batch, rows, index, work);
        work.dlogits.resize(n, 0.0);
        work.probs.resize(n, 0.0);
        let loss = bce_with_logits(work.mlp.output(), &batch.labels, &mut work.dlogits, &mut work.probs);
        work.dx.resize(n * width, 0.0);
        self.mlp.backward(params, &work.x, &work.dlogits, n, &mut work.mlp, grads, Some(&mut work.dx));
        scatter_add_rows(&work.dx, index, self.config.slots, dim, width, row_grads);
        loss
    }

    /// Predicted probabilities for one batch, left in `work.probs`.
    pub fn predict(&self, params: &[f32], batch: &Batch, rows: &[f32], index: &[u32], work: &mut Work) {
        self.forward(params, batch, rows, index, work);
        work.probs.clear();
        work.probs.extend(work.mlp.output().iter().map(|&z| crate::nn::sigmoid(z)));
    }
}
