//! Writing ONNX graphs: a [`Graph`] builder that names values, holds weights as initializers and
//! encodes a model file (opset 17, `ai.onnx.ml` 3), and the [`proto`] messages it encodes.
//!
//! Values are named under the scope of the layer being written, so two layers' nodes never clash;
//! weights are initializers with their raw little-endian bytes; `op`, `reshape`, `reduce_sum` and
//! their kin add the nodes a layer's form needs. Every tensor of an oar model is written as a 2-D
//! `[N, size]` f32 value (the batch first), the same sample-major bytes the trainer's buffers
//! hold; a layer that needs its fields reshapes to `[N, F, D]` inside its own nodes.
//!
//! oar writes ONNX for other tools and never runs it: prediction and `oar serve` score with
//! oar's own forward pass, whose numbers `oar predict` writes.

pub mod proto;

use prost::Message;

use proto::{
    attribute_type, data_type, AttributeProto, Dimension, GraphProto, ModelProto, NodeProto, OperatorSetIdProto,
    StringStringEntryProto, TensorProto, TensorShapeProto, TensorTypeProto, TypeProto, ValueInfoProto,
};

/// The default-domain operator set written.
pub const OPSET: i64 = 17;
/// The `ai.onnx.ml` operator set written (LabelEncoder with int64 keys and values).
pub const ML_OPSET: i64 = 3;
/// The IR version of opset 17.
pub const IR_VERSION: i64 = 8;
/// The symbolic batch dimension of inputs and outputs.
pub const BATCH: &str = "N";

/// An attribute of a node.
pub enum Attr {
    /// An integer.
    Int(&'static str, i64),
    /// A list of integers.
    Ints(&'static str, Vec<i64>),
    /// A float.
    Float(&'static str, f32),
    /// A string.
    Str(&'static str, String),
}

impl Attr {
    fn proto(self) -> AttributeProto {
        let mut a = AttributeProto::default();
        match self {
            Attr::Int(name, i) => (a.name, a.i, a.r#type) = (name.into(), i, attribute_type::INT),
            Attr::Ints(name, v) => (a.name, a.ints, a.r#type) = (name.into(), v, attribute_type::INTS),
            Attr::Float(name, f) => (a.name, a.f, a.r#type) = (name.into(), f, attribute_type::FLOAT),
            Attr::Str(name, v) => (a.name, a.s, a.r#type) = (name.into(), v.into_bytes(), attribute_type::STRING),
        }
        a
    }
}

/// A dimension of a graph input or output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Dim {
    /// A known size.
    Fixed(usize),
    /// A size known when the graph runs, by name (the batch is [`BATCH`]).
    Named(String),
}

impl Dim {
    /// The batch dimension.
    pub fn batch() -> Dim {
        Dim::Named(BATCH.into())
    }
}

/// The type of a graph input or output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    /// f32.
    Float,
    /// i64.
    Int64,
}

impl Elem {
    fn code(self) -> i32 {
        match self {
            Elem::Float => data_type::FLOAT,
            Elem::Int64 => data_type::INT64,
        }
    }
}

/// A graph under construction. Values made by [`Graph::op`] get fresh names under the current
/// [`scope`](Graph::scope) (the layer being written), so two layers' nodes never clash.
#[derive(Default)]
pub struct Graph {
    graph: GraphProto,
    scope: String,
    counter: usize,
    uses_ml: bool,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Graph {
        Graph::default()
    }

    /// Names values made from here on after `scope` (a layer's name).
    pub fn scope(&mut self, scope: &str) {
        self.scope = scope.to_string();
    }

    fn fresh(&mut self, hint: &str) -> String {
        self.counter += 1;
        format!("{}/{hint}_{}", self.scope, self.counter)
    }

    /// Adds node `op` (default domain) reading `inputs`, writing a fresh value, which it returns.
    pub fn op(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attr>) -> String {
        let out = self.fresh(&op.to_lowercase());
        self.op_to(op, inputs, attrs, &out);
        out
    }

    /// Adds node `op` reading `inputs` and writing the value named `out`.
    pub fn op_to(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attr>, out: &str) {
        self.node("", op, inputs, attrs, &[out]);
    }

    /// Adds node `op` with several outputs, named `outputs` (`""` for an optional one left out).
    pub fn op_outputs(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attr>, outputs: &[&str]) {
        self.node("", op, inputs, attrs, outputs);
    }

    /// Adds node `op` of the `ai.onnx.ml` domain, writing a fresh value.
    pub fn ml_op(&mut self, op: &str, inputs: &[&str], attrs: Vec<Attr>) -> String {
        self.uses_ml = true;
        let out = self.fresh(&op.to_lowercase());
        self.node("ai.onnx.ml", op, inputs, attrs, &[&out]);
        out
    }

    fn node(&mut self, domain: &str, op: &str, inputs: &[&str], attrs: Vec<Attr>, outputs: &[&str]) {
        let name = format!("{}:{op}", outputs.iter().find(|o| !o.is_empty()).copied().unwrap_or(op));
        self.graph.node.push(NodeProto {
            input: inputs.iter().map(|s| s.to_string()).collect(),
            output: outputs.iter().map(|s| s.to_string()).collect(),
            name,
            op_type: op.to_string(),
            attribute: attrs.into_iter().map(Attr::proto).collect(),
            domain: domain.to_string(),
        });
    }

    /// A constant f32 tensor of shape `dims`; returns its name.
    pub fn floats(&mut self, hint: &str, dims: &[usize], data: &[f32]) -> String {
        debug_assert_eq!(dims.iter().product::<usize>(), data.len());
        let name = self.fresh(hint);
        self.graph.initializer.push(TensorProto {
            dims: dims.iter().map(|&d| d as i64).collect(),
            data_type: data_type::FLOAT,
            name: name.clone(),
            raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        name
    }

    /// A constant i64 vector; returns its name.
    pub fn ints(&mut self, hint: &str, data: &[i64]) -> String {
        let name = self.fresh(hint);
        self.graph.initializer.push(TensorProto {
            dims: vec![data.len() as i64],
            data_type: data_type::INT64,
            name: name.clone(),
            raw_data: data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        });
        name
    }

    /// A constant f32 scalar; returns its name.
    pub fn scalar(&mut self, hint: &str, v: f32) -> String {
        self.floats(hint, &[], &[v])
    }

    /// `x` reshaped to `shape` (`-1` for the batch).
    pub fn reshape(&mut self, x: &str, shape: &[i64]) -> String {
        let s = self.ints("shape", shape);
        self.op("Reshape", &[x, &s], Vec::new())
    }

    /// `x` reshaped to `shape` into the value named `out`.
    pub fn reshape_to(&mut self, x: &str, shape: &[i64], out: &str) {
        let s = self.ints("shape", shape);
        self.op_to("Reshape", &[x, &s], Vec::new(), out);
    }

    /// `ReduceSum` of `x` over `axes`.
    pub fn reduce_sum(&mut self, x: &str, axes: &[i64], keepdims: bool) -> String {
        let a = self.ints("axes", axes);
        self.op("ReduceSum", &[x, &a], vec![Attr::Int("keepdims", keepdims as i64)])
    }

    /// Copies `x` into the value named `out`.
    pub fn identity(&mut self, x: &str, out: &str) {
        self.op_to("Identity", &[x], Vec::new(), out);
    }

    /// Declares a graph input.
    pub fn input(&mut self, name: &str, elem: Elem, dims: &[Dim]) {
        let v = value_info(name, elem, dims);
        self.graph.input.push(v);
    }

    /// Declares a graph output.
    pub fn output(&mut self, name: &str, elem: Elem, dims: &[Dim]) {
        let v = value_info(name, elem, dims);
        self.graph.output.push(v);
    }

    /// The model file's bytes, with `metadata` as its metadata properties.
    pub fn encode(mut self, name: &str, metadata: &[(String, String)]) -> Vec<u8> {
        self.graph.name = name.to_string();
        let mut opset_import = vec![OperatorSetIdProto { domain: String::new(), version: OPSET }];
        if self.uses_ml {
            opset_import.push(OperatorSetIdProto { domain: "ai.onnx.ml".into(), version: ML_OPSET });
        }
        ModelProto {
            ir_version: IR_VERSION,
            opset_import,
            producer_name: "oar".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            model_version: 1,
            doc_string: String::new(),
            graph: Some(self.graph),
            metadata_props: metadata
                .iter()
                .map(|(k, v)| StringStringEntryProto { key: k.clone(), value: v.clone() })
                .collect(),
        }
        .encode_to_vec()
    }
}

fn value_info(name: &str, elem: Elem, dims: &[Dim]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|d| match d {
            Dim::Fixed(n) => Dimension { dim_value: Some(*n as i64), dim_param: None },
            Dim::Named(s) => Dimension { dim_value: None, dim_param: Some(s.clone()) },
        })
        .collect();
    ValueInfoProto {
        name: name.to_string(),
        r#type: Some(TypeProto {
            tensor_type: Some(TensorTypeProto { elem_type: elem.code(), shape: Some(TensorShapeProto { dim }) }),
        }),
    }
}

/// An `ai.onnx.ml.LabelEncoder`'s attributes mapping int64 `keys` to int64 `values`, others
/// to `default`.
pub fn label_encoder_attrs(keys: Vec<i64>, values: Vec<i64>, default: i64) -> Vec<Attr> {
    vec![Attr::Ints("keys_int64s", keys), Attr::Ints("values_int64s", values), Attr::Int("default_int64", default)]
}
