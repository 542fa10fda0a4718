//! The network: which tables it needs and how one batch turns into a loss and gradients.
//!
//! One architecture covers the seed examples: each of `slots` sparse ids per sample looks up a
//! row of one shared embedding table (a sparse table on the servers), the rows are concatenated
//! with the sample's `dense_features`, and an MLP (`hidden` widths, `activation` between them)
//! ends in `outputs` values trained with `loss`:
//! - Criteo CTR-DNN (PaddleRec `rank/dnn`): 26 slots x dim 10 + 13 dense, ReLU 400-400-400,
//!   1 output, log-loss (the default);
//! - UCI housing linear regression: 0 slots, 13 dense, no hidden layer, 1 output, square error;
//! - PTB N-gram word model (PaddlePaddle's imikolov word2vec): 4 slots x dim 32, sigmoid 256,
//!   one output per dictionary word, softmax cross-entropy.
//!
//! Built from the reusable pieces in [`crate::nn`]; knows nothing of servers or files.

use serde::{Deserialize, Serialize};

use crate::data::Batch;
use crate::nn::{
    bce_with_logits, gather_rows, scatter_add_rows, softmax_cross_entropy, square_error, Activation, Mlp, MlpWork,
};
use crate::table::{DenseParam, DenseSpec, Init, Optimizer, SparseSpec, TableSpec};

/// What the network's outputs are trained against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// One logit per sample, binary label, log-loss; quality is AUC and log-loss.
    LogLoss,
    /// One prediction per sample, real label, squared error; quality is the mean squared error.
    Square,
    /// One logit per class, the label is the class index, softmax cross-entropy; quality is
    /// perplexity.
    Softmax,
}

/// Shape and initialization of the network (defaults: the Criteo CTR-DNN).
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
    /// Activation of the hidden layers.
    pub activation: Activation,
    /// Output width (the dictionary size for `softmax`).
    pub outputs: usize,
    /// The loss.
    pub loss: Loss,
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
            activation: Activation::Relu,
            outputs: 1,
            loss: Loss::LogLoss,
        }
    }
}

impl ModelConfig {
    /// Checks the shape; messages name the setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.embedding_dim == 0 || self.block_size == 0 || self.outputs == 0 {
            return Err("model: embedding_dim, block_size and outputs must be positive".into());
        }
        if self.slots + self.dense_features == 0 {
            return Err("model: a sample needs at least one slot or dense feature".into());
        }
        if self.loss != Loss::Softmax && self.outputs != 1 {
            return Err(format!("model: loss {:?} needs outputs = 1 (got {})", self.loss, self.outputs));
        }
        if self.hidden.contains(&0) {
            return Err("model: hidden layer widths must be positive".into());
        }
        Ok(())
    }
}

/// The network.
#[derive(Clone, Debug)]
pub struct Network {
    config: ModelConfig,
    mlp: Mlp,
    params: Vec<DenseParam>,
}

/// Per-thread buffers of a [`Network`], reused from step to step.
#[derive(Default)]
pub struct Work {
    x: Vec<f32>,
    mlp: MlpWork,
    dlogits: Vec<f32>,
    dx: Vec<f32>,
    /// Predictions of the last batch for per-sample metrics: click probabilities (log-loss) or
    /// values (square); empty for softmax.
    pub probs: Vec<f32>,
}

impl Network {
    /// The network for `config`.
    pub fn new(config: &ModelConfig) -> Network {
        let input = config.slots * config.embedding_dim + config.dense_features;
        let mut widths = vec![input];
        widths.extend(&config.hidden);
        widths.push(config.outputs);
        let (mlp, params) = Mlp::new("fc", &widths, config.activation, Activation::Identity, 0);
        Network { config: config.clone(), mlp, params }
    }

    /// Checks that a batch has this network's shape and labels its loss accepts; the message
    /// names the offending sample and the setting to change.
    pub fn check_batch(&self, batch: &Batch) -> Result<(), String> {
        let c = &self.config;
        if batch.slots != c.slots || batch.dense_width != c.dense_features {
            return Err(format!(
                "the data has {} slots and {} dense features per sample but the model expects {} and {} (model.slots, model.dense_features)",
                batch.slots, batch.dense_width, c.slots, c.dense_features
            ));
        }
        if c.loss == Loss::Softmax {
            if let Some((r, y)) = batch
                .labels
                .iter()
                .enumerate()
                .find(|(_, &y)| !(y >= 0.0 && y.fract() == 0.0 && (y as usize) < c.outputs))
            {
                return Err(format!(
                    "sample {r} of the batch has label {y}: a softmax label must be a class index below model.outputs = {}",
                    c.outputs
                ));
            }
        }
        Ok(())
    }

    /// Applies the loss to the last forward pass: summed loss, output gradients into
    /// `work.dlogits` and per-sample predictions into `work.probs`.
    fn loss(&self, labels: &[f32], work: &mut Work) -> f64 {
        let (n, out) = (labels.len(), self.config.outputs);
        work.dlogits.resize(n * out, 0.0);
        match self.config.loss {
            Loss::LogLoss => {
                work.probs.resize(n, 0.0);
                bce_with_logits(work.mlp.output(), labels, &mut work.dlogits, &mut work.probs)
            }
            Loss::Square => {
                work.probs.clear();
                work.probs.extend_from_slice(work.mlp.output());
                square_error(work.mlp.output(), labels, &mut work.dlogits)
            }
            Loss::Softmax => {
                work.probs.clear();
                softmax_cross_entropy(work.mlp.output(), labels, out, &mut work.dlogits)
            }
        }
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn input_width(&self) -> usize {
        self.config.slots * self.config.embedding_dim + self.config.dense_features
    }

    /// The tables this model needs: the MLP's dense parameters and one embedding table (empty
    /// when the model has no slots).
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
        let loss = self.loss(&batch.labels, work);
        work.dx.clear();
        work.dx.resize(n * width, 0.0);
        self.mlp.backward(params, &work.x, &work.dlogits, n, &mut work.mlp, grads, Some(&mut work.dx));
        scatter_add_rows(&work.dx, index, self.config.slots, dim, width, row_grads);
        loss
    }

    /// Forward only: returns the summed loss of one batch and leaves its predictions in
    /// `work.probs`.
    pub fn evaluate(&self, params: &[f32], batch: &Batch, rows: &[f32], index: &[u32], work: &mut Work) -> f64 {
        self.forward(params, batch, rows, index, work);
        self.loss(&batch.labels, work)
    }
}
