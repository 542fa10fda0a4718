//! The `[model]` section of a job file: tables, a graph of named layers, loss heads; or the
//! shorthand of earlier versions (`slots`, `embedding_dim`, `hidden`, ...), which
//! [`ModelConfig::graph`] expands into the same graph, so both forms run one code path.

use serde::{Deserialize, Serialize};

use crate::observe::metrics::Loss;

use crate::nn::Activation;
use crate::table::{Accessor, Entry, Init, Optimizer, SparseSpec};

/// One sparse embedding table of the model.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableConfig {
    /// Name, referred to by `embedding` layers.
    pub name: String,
    /// Floats per row (1 for the "wide" / LR part).
    pub dim: usize,
    /// Initializer of new rows [default: uniform in +-`embedding_init`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<Init>,
    /// This table's optimizer [default: the job's `sparse_optimizer`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimizer: Option<Optimizer>,
    /// This table's learning rate, overriding its optimizer's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f32>,
    /// Row statistics rules, Paddle's `ctr_accessor_param` names [default: Paddle's].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accessor: Option<Accessor>,
    /// Admission of new ids: `count_filter_entry:N`, `probability_entry:P` [default: every id].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry: Option<Entry>,
    /// Most rows per server; a new row beyond it evicts the lowest-score row near it
    /// [default: unbounded].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u64>,
    /// Cells (3 bytes each) of each server's count filter [default: 4 Mi].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_capacity: Option<usize>,
    /// Days a pending id of the count filter may go unseen before it is forgotten
    /// [default: the accessor's `delete_after_unseen_days`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_forget_after_days: Option<f32>,
}

impl TableConfig {
    /// The table as servers hold it: its rows seeded from `seed`, its settings or the job's
    /// defaults (`embedding_init`, the `sparse` optimizer) where it names none.
    pub fn spec(&self, seed: u64, embedding_init: f32, sparse: Optimizer) -> SparseSpec {
        let mut optimizer = self.optimizer.unwrap_or(sparse);
        if let Some(lr) = self.lr {
            optimizer.lr = lr;
        }
        let init = self.init.unwrap_or(Init::Uniform { scale: embedding_init });
        SparseSpec {
            accessor: self.accessor.unwrap_or_default(),
            entry: self.entry.unwrap_or_default(),
            capacity: self.capacity,
            filter_capacity: self.filter_capacity.unwrap_or(crate::table::DEFAULT_FILTER_CAPACITY),
            filter_forget_after_days: self.filter_forget_after_days,
            ..SparseSpec::new(&self.name, self.dim, seed, init, optimizer)
        }
    }
}

/// One layer of the graph: its name (also the name of its output tensor), its type, its input
/// tensors and its type's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LayerConfig {
    /// Name of the layer and of its output tensor.
    pub name: String,
    /// Layer type: `embedding` or a type of the registry ([`crate::nn::layers`]).
    #[serde(rename = "type")]
    pub kind: String,
    /// The input tensor, for one-input layers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<String>,
    /// The input tensors, for several-input layers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<String>,
    /// The type's own settings.
    #[serde(flatten)]
    pub settings: serde_json::Map<String, serde_json::Value>,
}

impl LayerConfig {
    /// Every input tensor named, `input` first.
    pub fn all_inputs(&self) -> Vec<String> {
        self.input.iter().chain(&self.inputs).cloned().collect()
    }
}

/// One loss head: an output tensor trained against one label column.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadConfig {
    /// The tensor holding the head's logits (or predictions).
    pub output: String,
    /// The loss.
    pub loss: Loss,
    /// The label column (a name of `[data] labels`) [default: the head's position; none for a
    /// `value` head].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Weight of this head's loss in the sum that is trained [default: 1].
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub weight: f32,
}

fn one() -> f32 {
    1.0
}

fn is_one(w: &f32) -> bool {
    *w == 1.0
}

/// The `[model]` section (defaults: the Criteo CTR-DNN in shorthand form).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// Seed of every initializer.
    pub seed: u64,
    /// Dense floats per block dealt to servers.
    pub block_size: usize,
    /// Half-width of the default uniform initializer of embedding rows.
    pub embedding_init: f32,
    /// The sparse tables.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tables: Vec<TableConfig>,
    /// The layer graph.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<LayerConfig>,
    /// Loss heads (several: a multi-task model trained on their weighted sum).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub heads: Vec<HeadConfig>,
    /// The single head's output tensor (with `layers`; or use `heads`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// The single head's loss [default: log_loss].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<Loss>,
    /// Shorthand: sparse slots per sample, all looked up in one table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<usize>,
    /// Shorthand: floats per embedding row [default: 10].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub embedding_dim: Option<usize>,
    /// Shorthand: dense features per sample [default: 13].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_features: Option<usize>,
    /// Shorthand: hidden layer widths [default: 400, 400, 400].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<Vec<usize>>,
    /// Shorthand: activation of the hidden layers [default: relu].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub activation: Option<Activation>,
    /// Shorthand: output width, the dictionary size for softmax [default: 1].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outputs: Option<usize>,
}

impl Default for ModelConfig {
    fn default() -> Self {
        ModelConfig {
            seed: 1,
            block_size: 8192,
            embedding_init: 0.05,
            tables: Vec::new(),
            layers: Vec::new(),
            heads: Vec::new(),
            output: None,
            loss: None,
            slots: None,
            embedding_dim: None,
            dense_features: None,
            hidden: None,
            activation: None,
            outputs: None,
        }
    }
}

/// The name of the shorthand form's one table (as in models saved before layer graphs).
pub const SHORTHAND_TABLE: &str = "embedding";

impl ModelConfig {
    /// Whether this is the shorthand form (no `layers`).
    pub fn is_shorthand(&self) -> bool {
        self.layers.is_empty()
    }

    /// The shorthand's (slots, dense features), which also shape the plain data format when
    /// `[data]` does not declare it; `None` for a layer graph.
    pub fn shorthand_shape(&self) -> Option<(usize, usize)> {
        self.is_shorthand().then(|| {
            (
                self.slots.unwrap_or(crate::data::format::criteo::SLOTS),
                self.dense_features.unwrap_or(crate::data::format::criteo::DENSE),
            )
        })
    }

    /// The config with the shorthand's defaults written out (for manifests, so a saved model's
    /// description does not depend on a later version's defaults); a layer graph unchanged.
    pub fn with_shorthand_defaults(&self) -> ModelConfig {
        let Some((slots, dense)) = self.shorthand_shape() else { return self.clone() };
        ModelConfig {
            slots: Some(slots),
            dense_features: Some(dense),
            embedding_dim: Some(self.embedding_dim.unwrap_or(10)),
            hidden: Some(self.hidden.clone().unwrap_or_else(|| vec![400, 400, 400])),
            activation: Some(self.activation.unwrap_or(Activation::Relu)),
            outputs: Some(self.outputs.unwrap_or(1)),
            loss: Some(self.loss.unwrap_or(Loss::LogLoss)),
            ..self.clone()
        }
    }

    /// The model as tables, layers and heads: itself, or the shorthand expanded to
    /// `embedding(all slots) -> concat(with dense) -> mlp -> loss` with the names of models
    /// saved before layer graphs (table `embedding`, parameters `fc.0.w`, ...), so those load.
    pub fn graph(&self) -> Result<ModelConfig, String> {
        if !self.is_shorthand() {
            let stray = [
                ("slots", self.slots.is_some()),
                ("embedding_dim", self.embedding_dim.is_some()),
                ("dense_features", self.dense_features.is_some()),
                ("hidden", self.hidden.is_some()),
                ("activation", self.activation.is_some()),
                ("outputs", self.outputs.is_some()),
            ];
            if let Some((key, _)) = stray.iter().find(|(_, set)| *set) {
                return Err(format!(
                    "model: `{key}` belongs to the shorthand form; a model with `layers` describes that in its layers"
                ));
            }
            return Ok(self.clone());
        }
        if !self.tables.is_empty() || !self.heads.is_empty() || self.output.is_some() {
            return Err("model: `tables`, `heads` and `output` need `layers` (the shorthand has its own)".into());
        }
        let full = self.with_shorthand_defaults();
        let (slots, dense) = (full.slots.unwrap_or_default(), full.dense_features.unwrap_or_default());
        let dim = full.embedding_dim.unwrap_or_default();
        let hidden = full.hidden.clone().unwrap_or_default();
        let outputs = full.outputs.unwrap_or_default();
        if slots + dense == 0 {
            return Err("model: a sample needs at least one slot or dense feature".into());
        }
        let layer = |name: &str, kind: &str, inputs: &[&str], settings: serde_json::Value| LayerConfig {
            name: name.into(),
            kind: kind.into(),
            input: (inputs.len() == 1).then(|| inputs[0].to_string()),
            inputs: if inputs.len() > 1 { inputs.iter().map(|s| s.to_string()).collect() } else { Vec::new() },
            settings: settings.as_object().cloned().unwrap_or_default(),
        };
        let mut layers = Vec::new();
        let x = match (slots, dense) {
            (0, _) => "dense",
            (_, 0) => "emb",
            _ => "x",
        };
        if slots > 0 {
            layers.push(layer("emb", "embedding", &[], serde_json::json!({ "table": SHORTHAND_TABLE })));
        }
        if slots > 0 && dense > 0 {
            layers.push(layer("x", "concat", &["emb", "dense"], serde_json::json!({})));
        }
        let activation = full.activation.unwrap_or(Activation::Relu);
        layers.push(layer(
            "fc",
            "mlp",
            &[x],
            serde_json::json!({ "hidden": hidden, "activation": activation, "out": outputs }),
        ));
        Ok(ModelConfig {
            tables: vec![TableConfig { name: SHORTHAND_TABLE.into(), dim, ..TableConfig::default() }],
            layers,
            heads: Vec::new(),
            output: Some("fc".into()),
            loss: full.loss,
            slots: None,
            embedding_dim: None,
            dense_features: None,
            hidden: None,
            activation: None,
            outputs: None,
            ..self.clone()
        })
    }

    /// The heads of a graph-form config: `heads`, or the single `output` with `loss`.
    pub fn head_list(&self) -> Result<Vec<HeadConfig>, String> {
        match (&self.heads[..], &self.output) {
            ([], Some(output)) => Ok(vec![HeadConfig {
                output: output.clone(),
                loss: self.loss.unwrap_or(Loss::LogLoss),
                label: None,
                weight: 1.0,
            }]),
            ([], None) => Err("model: name the output tensor (`output = \"...\"`) or give `heads`".into()),
            (heads, None) if self.loss.is_none() => Ok(heads.to_vec()),
            _ => Err("model: give either `output` (and `loss`) or `heads`, not both".into()),
        }
    }
}
