//! Defining a model in Rust: [`GraphBuilder`] writes the same [`ModelConfig`] a job file's
//! `[model]` holds, entry for entry, so a model defined in code can be printed as a job file
//! (`toml::to_string(&config)`) and a job file's model rebuilt in code.

use serde_json::{json, Value};

use super::config::{HeadConfig, LayerConfig, ModelConfig, TableConfig};
use super::embedding::Pooling;
use crate::observe::metrics::Loss;

/// Builds a layer-graph [`ModelConfig`].
///
/// ```
/// use oar::model::{GraphBuilder, Loss, Pooling};
/// use serde_json::json;
///
/// let mut g = GraphBuilder::new();
/// g.table("v", 10);
/// let emb = g.embedding("emb", "v", &["C1..C26"], Pooling::Sum);
/// let x = g.layer("x", "concat", &[&emb, "dense"], json!({}));
/// let logit = g.layer("deep", "mlp", &[&x], json!({ "hidden": [64, 32], "out": 1 }));
/// g.output(&logit, Loss::LogLoss);
/// let config = g.build();
/// assert_eq!(config.layers.len(), 3);
/// ```
#[derive(Clone, Debug, Default)]
pub struct GraphBuilder {
    config: ModelConfig,
}

impl GraphBuilder {
    /// An empty graph (default seed and block size).
    pub fn new() -> GraphBuilder {
        GraphBuilder { config: ModelConfig::default() }
    }

    /// Sets the initializers' seed.
    pub fn seed(&mut self, seed: u64) -> &mut Self {
        self.config.seed = seed;
        self
    }

    /// Adds a sparse table with the job's sparse optimizer; returns it for further settings.
    pub fn table(&mut self, name: &str, dim: usize) -> &mut TableConfig {
        self.config.tables.push(TableConfig { name: name.into(), dim, ..TableConfig::default() });
        self.config.tables.last_mut().expect("just pushed")
    }

    /// Adds an `embedding` layer over `slots` (names or ranges) of `table`; returns its tensor.
    pub fn embedding(&mut self, name: &str, table: &str, slots: &[&str], pooling: Pooling) -> String {
        let pooling = serde_json::to_value(pooling).expect("a pooling serializes");
        self.layer(name, "embedding", &[], json!({ "table": table, "slots": slots, "pooling": pooling }))
    }

    /// Adds a layer of type `kind` over `inputs` with its `settings` (a JSON object, the keys
    /// of the job file); returns its output tensor's name.
    pub fn layer(&mut self, name: &str, kind: &str, inputs: &[&str], settings: Value) -> String {
        let (input, inputs) = match inputs {
            [one] => (Some(one.to_string()), Vec::new()),
            many => (None, many.iter().map(|s| s.to_string()).collect()),
        };
        let settings = match settings {
            Value::Object(map) => map,
            Value::Null => Default::default(),
            other => panic!("layer {name}: settings must be a JSON object, got {other}"),
        };
        self.config.layers.push(LayerConfig { name: name.into(), kind: kind.into(), input, inputs, settings });
        name.to_string()
    }

    /// Trains tensor `output` with `loss` against the first label.
    pub fn output(&mut self, output: &str, loss: Loss) -> &mut Self {
        self.config.output = Some(output.into());
        self.config.loss = Some(loss);
        self
    }

    /// Adds a head (multi-task): `output` trained with `loss` against label `label`, its loss
    /// weighted by `weight` in the sum.
    pub fn head(&mut self, output: &str, loss: Loss, label: &str, weight: f32) -> &mut Self {
        self.config.heads.push(HeadConfig { output: output.into(), loss, label: Some(label.into()), weight });
        self
    }

    /// Adds a value head: `output`, one value per sample, is that sample's loss itself (a
    /// layer's own, as `next_item_loss`'s), weighted by `weight` in the sum; it takes no label.
    pub fn value_head(&mut self, output: &str, weight: f32) -> &mut Self {
        self.config.heads.push(HeadConfig { output: output.into(), loss: Loss::Value, label: None, weight });
        self
    }

    /// The model config.
    pub fn build(&self) -> ModelConfig {
        self.config.clone()
    }
}
