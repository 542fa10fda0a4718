//! Models: what a job's `[model]` describes, built into a graph that turns a batch into losses
//! and gradients. Knows nothing of servers or files.
//!
//! A model is sparse tables ([`TableConfig`]), named layers whose outputs are named tensors
//! ([`LayerConfig`]: the built-in `embedding` pooled lookup, or any type of the [`Registry`],
//! whose built-ins are [`crate::nn::layers`]) and loss heads ([`HeadConfig`]). The tensor
//! `dense` holds the batch's dense features. [`Model::build`] checks the whole graph (unknown
//! tensors and types, cycles, width mismatches, dangling layers) before anything runs; a
//! [`Model`] then runs forward/backward on a batch ([`Model::train_step`]). Here too: what the
//! model reads from the data ([`Input`]) and the [`TableSpec`] its
//! servers hold ([`Model::table_spec`]).
//!
//! Why graphs of named layers in the job file, as HugeCTR has them
//! (`../shared/research/models.md` compares HugeCTR, PaddleRec, TorchRec, FuxiCTR and DeepCTR): a
//! layer's output tensor carries its name, a tensor may feed several layers (backward adds, so
//! no copies), and the graph is checked as a whole before any process starts, each error naming
//! the layer. A program adds layer types through its [`Registry`] and still runs all of `oar`
//! (`cli::main_with`); a job file naming a type the binary lacks is refused before anything
//! starts.
//!
//! The shorthand of earlier job files (`slots`, `embedding_dim`, `hidden`, `outputs`, `loss`)
//! expands into `embedding -> concat(dense) -> mlp -> loss` ([`ModelConfig::graph`]) with the
//! table and parameter names models were saved under before (`embedding`, `fc.0.w`, ...): the
//! three seed examples (CTR-DNN, UCI housing, PTB N-gram), old job files and models saved before
//! layer graphs run on the same code path as any graph, and the CTR-DNN written as a graph
//! (`examples/ctr_dnn_graph.toml`) is the very same model.

mod budget;
mod builder;
mod config;
mod embedding;
mod exec;
mod graph;
mod onnx;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use crate::nn::{MAX_FIELDS, MAX_TENSOR_FLOATS};
pub use crate::observe::metrics::Loss;
pub use budget::{available_memory, MAX_DENSE_PARAMS, MAX_SAMPLE_FLOATS};
pub use builder::GraphBuilder;
pub use config::{HeadConfig, LayerConfig, ModelConfig, TableConfig, SHORTHAND_TABLE};
pub use embedding::{Embedding, Pooling};
pub use exec::{Grads, TableRows, Work};
pub use graph::Model;
pub use onnx::{OnnxModel, OnnxTable, Port};

use crate::base::batch::Batch;
use crate::nn::layer::{Factory, Layer, LayerArgs, Shape};
use crate::table::{DenseParam, DenseSpec, Optimizer, TableSpec};

/// What a model reads from the data: label columns, dense width, slot names (in batch order).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// Label column names.
    pub labels: Vec<String>,
    /// Dense features per sample (the `dense` tensor's width).
    pub dense_width: usize,
    /// Slot names, in the order of a batch's bags.
    pub slots: Vec<String>,
}

/// The layer types a job file may name: the built-ins of [`crate::nn::layers`] plus any a
/// program registers (see `examples/custom_layer/`).
#[derive(Clone)]
pub struct Registry {
    factories: BTreeMap<String, Factory>,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::with_builtin()
    }
}

impl Registry {
    /// The built-in layer types.
    pub fn with_builtin() -> Registry {
        let factories = crate::nn::layers::builtin().into_iter().map(|(n, f)| (n.to_string(), f)).collect();
        Registry { factories }
    }

    /// Adds (or replaces) layer type `name`.
    pub fn register(mut self, name: &str, factory: Factory) -> Registry {
        self.factories.insert(name.to_string(), factory);
        self
    }

    /// Whether type `name` is known.
    pub fn contains(&self, name: &str) -> bool {
        self.factories.contains_key(name)
    }

    /// Every known type.
    pub fn names(&self) -> Vec<&str> {
        self.factories.keys().map(String::as_str).collect()
    }

    /// Builds a layer of type `name`.
    pub fn build(&self, name: &str, args: &mut LayerArgs, inputs: &[Shape]) -> Result<Box<dyn Layer>, String> {
        let factory = self.factories.get(name).ok_or_else(|| format!("unknown layer type {name:?}"))?;
        factory(args, inputs)
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.factories.keys()).finish()
    }
}

impl Model {
    /// The configuration the model was built from (as written, shorthand or not).
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The data shape it was built for.
    pub fn input(&self) -> &Input {
        &self.input
    }

    /// Its sparse tables, in table-index order.
    pub fn tables(&self) -> &[TableConfig] {
        &self.tables
    }

    /// Per table: which of the batch's slots are looked up in it.
    pub fn table_slots(&self) -> &[Vec<bool>] {
        &self.table_slots
    }

    /// The label column whose value is a sample's click for the row statistics: the first
    /// log-loss head's (None: the model has none, and pushes no clicks).
    pub fn click_column(&self) -> Option<usize> {
        self.heads.iter().find(|h| h.loss == Loss::LogLoss).map(|h| h.label)
    }

    /// The heads that score samples, in order: every head but the `value` ones (a training loss,
    /// not a score).
    pub fn scored_heads(&self) -> Vec<usize> {
        (0..self.heads.len()).filter(|&h| self.heads[h].loss != Loss::Value).collect()
    }

    /// Per slot of the data, whether the scored heads need it: a slot that only feeds a `value`
    /// head (DIEN's negative behaviours) is not asked of a sample to score.
    pub fn scored_slots(&self) -> Vec<bool> {
        let ends = self.scored_heads().into_iter().map(|h| self.heads[h].tensor);
        let used = graph::reached(&self.nodes, self.shapes.len(), ends);
        let mut slots = vec![false; self.input.slots.len()];
        for node in self.nodes.iter().filter(|n| used[n.output]) {
            if let graph::Op::Embedding(e) = &node.op {
                e.slots.iter().for_each(|&s| slots[s] = true);
            }
        }
        slots
    }

    /// The loss of each head, in order.
    pub fn losses(&self) -> Vec<Loss> {
        self.heads.iter().map(|h| h.loss).collect()
    }

    /// The loss of the first head (the one progress and reports follow).
    pub fn loss(&self) -> Loss {
        self.heads[0].loss
    }

    /// The output tensor of each head, in order.
    pub fn head_names(&self) -> Vec<String> {
        self.heads.iter().map(|h| self.tensor_name(h.tensor)).collect()
    }

    /// The name of tensor `t`: `dense`, the layer writing it, or `NAME.mask` (a sequence's).
    fn tensor_name(&self, t: usize) -> String {
        if t == graph::DENSE {
            return "dense".into();
        }
        if let Some(n) = self.nodes.iter().find(|n| n.mask == Some(t)) {
            return format!("{}.mask", n.name);
        }
        self.nodes.iter().find(|n| n.output == t).map(|n| n.name.clone()).expect("every tensor but dense has a node")
    }

    /// The label column head `head` is trained on.
    pub fn label_column(&self, head: usize) -> usize {
        self.heads[head].label
    }

    /// Every embedding layer, in running order, with its name.
    pub fn embeddings(&self) -> Vec<(String, Embedding)> {
        self.nodes
            .iter()
            .filter_map(|n| match &n.op {
                graph::Op::Embedding(e) => Some((n.name.clone(), e.clone())),
                graph::Op::Layer(_) => None,
            })
            .collect()
    }

    /// Head `head`'s labels of `batch`.
    pub fn labels<'a>(&self, batch: &'a Batch, head: usize) -> std::borrow::Cow<'a, [f32]> {
        if batch.label_width == 1 {
            std::borrow::Cow::Borrowed(&batch.labels)
        } else {
            std::borrow::Cow::Owned(batch.label_column(self.heads[head].label).collect())
        }
    }

    /// The dense parameters, in their order in the flat vector.
    pub fn params(&self) -> &[DenseParam] {
        &self.params
    }

    /// Number of dense floats.
    pub fn dense_len(&self) -> usize {
        self.params.iter().map(|p| p.len).sum()
    }

    /// Checks that training batches of `rows` samples on `threads` threads fit in this
    /// machine's available memory, so an oversized `batch_size` is an error, not a kill.
    pub fn check_memory(&self, rows: usize, threads: usize) -> Result<(), String> {
        budget::check_batch(self.floats_per_sample, self.dense_len(), rows, threads, available_memory())
    }

    /// Checks that `delay` held-back steps (local mode's delayed updates) are within bounds and
    /// fit in the memory available.
    pub fn check_delay(&self, delay: usize) -> Result<(), String> {
        budget::check_delay(delay, self.dense_len(), available_memory())
    }

    /// A one-line description of the layers in running order, with their output shapes.
    pub fn summary(&self) -> String {
        let parts: Vec<String> = self.nodes.iter().map(|n| format!("{} ({})", n.name, self.shapes[n.output])).collect();
        format!("{}; {} dense parameters", parts.join(" -> "), self.dense_len())
    }

    /// Every parameter the model needs: the dense ones of its layers and one sparse table per
    /// table, with the job's optimizers as defaults. Table `i`'s rows are seeded from
    /// `seed + i`, so the shorthand's one table keeps the seed of models saved before.
    pub fn table_spec(&self, dense: Optimizer, sparse: Optimizer) -> TableSpec {
        let c = &self.config;
        TableSpec {
            dense: DenseSpec { params: self.params.clone(), block_size: c.block_size, seed: c.seed, optimizer: dense },
            sparse: self
                .tables
                .iter()
                .enumerate()
                .map(|(i, t)| t.spec(c.seed.wrapping_add(i as u64), c.embedding_init, sparse))
                .collect(),
        }
    }

    /// What each label column may hold, as the losses of the heads reading it say (the
    /// reader checks every line against it).
    pub fn label_bounds(&self) -> Vec<crate::data::LabelBound> {
        use crate::data::LabelBound;
        let mut bounds = vec![LabelBound::Any; self.input.labels.len()];
        for head in &self.heads {
            match head.loss {
                Loss::LogLoss => bounds[head.label] = LabelBound::Probability,
                Loss::Softmax => bounds[head.label] = LabelBound::Class(head.width),
                Loss::Square | Loss::Value => {}
            }
        }
        bounds
    }

    /// Checks labels the heads' losses accept; the message names the sample and the setting.
    pub fn check_batch(&self, batch: &Batch) -> Result<(), String> {
        if batch.slots != self.input.slots.len() || batch.dense_width != self.input.dense_width {
            return Err(format!(
                "the data has {} slots and {} dense features per sample but the model was built for {} and {}",
                batch.slots,
                batch.dense_width,
                self.input.slots.len(),
                self.input.dense_width
            ));
        }
        for head in &self.heads {
            if head.loss != Loss::Softmax {
                continue;
            }
            let bad = batch
                .label_column(head.label)
                .enumerate()
                .find(|(_, y)| !(*y >= 0.0 && y.fract() == 0.0 && (*y as usize) < head.width));
            if let Some((r, y)) = bad {
                return Err(format!(
                    "sample {r} of the batch has label {y}: a softmax label must be a class index below the output width {}",
                    head.width
                ));
            }
        }
        Ok(())
    }
}
