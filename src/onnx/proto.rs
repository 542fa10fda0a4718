//! The messages of `onnx.proto` that an inference graph needs, declared for `prost` with the
//! field numbers of the ONNX specification (onnx/onnx `onnx/onnx.proto`, IR version 8).
//!
//! Why by hand: the generated alternatives bring either a protobuf compiler at build time
//! (`prost-build`) or a second protobuf runtime and a 10 000-line generated file
//! (`onnx-protobuf`, `tract-onnx`) or a whole inference engine, for the nine messages oar writes;
//! declared here they take about 200 lines. Fields oar never sets are left out; protobuf readers
//! skip what a message does not carry, and CI checks every written file with `onnx.checker` and
//! runs it in onnxruntime.

/// A whole model file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ModelProto {
    /// IR version of the file format.
    #[prost(int64, tag = "1")]
    pub ir_version: i64,
    /// Operator sets the graph uses.
    #[prost(message, repeated, tag = "8")]
    pub opset_import: Vec<OperatorSetIdProto>,
    /// The writing tool.
    #[prost(string, tag = "2")]
    pub producer_name: String,
    /// Its version.
    #[prost(string, tag = "3")]
    pub producer_version: String,
    /// The model's own version.
    #[prost(int64, tag = "5")]
    pub model_version: i64,
    /// Free text.
    #[prost(string, tag = "6")]
    pub doc_string: String,
    /// The computation.
    #[prost(message, optional, tag = "7")]
    pub graph: Option<GraphProto>,
    /// Key-value metadata.
    #[prost(message, repeated, tag = "14")]
    pub metadata_props: Vec<StringStringEntryProto>,
}

/// One operator set and its version (`""` is the default ONNX domain).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OperatorSetIdProto {
    /// The domain (`""`, `ai.onnx.ml`).
    #[prost(string, tag = "1")]
    pub domain: String,
    /// Its version.
    #[prost(int64, tag = "2")]
    pub version: i64,
}

/// A key-value pair of metadata.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StringStringEntryProto {
    /// The key.
    #[prost(string, tag = "1")]
    pub key: String,
    /// The value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// A graph: nodes in topological order, constant tensors, inputs and outputs.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphProto {
    /// The nodes, each after the producers of its inputs.
    #[prost(message, repeated, tag = "1")]
    pub node: Vec<NodeProto>,
    /// The graph's name.
    #[prost(string, tag = "2")]
    pub name: String,
    /// Constant tensors (weights).
    #[prost(message, repeated, tag = "5")]
    pub initializer: Vec<TensorProto>,
    /// Free text.
    #[prost(string, tag = "10")]
    pub doc_string: String,
    /// The graph's inputs.
    #[prost(message, repeated, tag = "11")]
    pub input: Vec<ValueInfoProto>,
    /// The graph's outputs.
    #[prost(message, repeated, tag = "12")]
    pub output: Vec<ValueInfoProto>,
}

/// One operator application.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeProto {
    /// Input value names.
    #[prost(string, repeated, tag = "1")]
    pub input: Vec<String>,
    /// Output value names.
    #[prost(string, repeated, tag = "2")]
    pub output: Vec<String>,
    /// The node's name.
    #[prost(string, tag = "3")]
    pub name: String,
    /// The operator.
    #[prost(string, tag = "4")]
    pub op_type: String,
    /// Its attributes.
    #[prost(message, repeated, tag = "5")]
    pub attribute: Vec<AttributeProto>,
    /// The operator's domain (`""` or `ai.onnx.ml`).
    #[prost(string, tag = "7")]
    pub domain: String,
}

/// An attribute's type (`AttributeProto.AttributeType`).
pub mod attribute_type {
    /// A float.
    pub const FLOAT: i32 = 1;
    /// An integer.
    pub const INT: i32 = 2;
    /// A string.
    pub const STRING: i32 = 3;
    /// A list of integers.
    pub const INTS: i32 = 7;
}

/// A named attribute of a node.
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttributeProto {
    /// The attribute's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// A float value.
    #[prost(float, tag = "2")]
    pub f: f32,
    /// An integer value.
    #[prost(int64, tag = "3")]
    pub i: i64,
    /// A string value.
    #[prost(bytes = "vec", tag = "4")]
    pub s: Vec<u8>,
    /// A list of integers.
    #[prost(int64, repeated, tag = "8")]
    pub ints: Vec<i64>,
    /// Which of the fields holds the value ([`attribute_type`]).
    #[prost(int32, tag = "20")]
    pub r#type: i32,
}

/// A tensor's element type (`TensorProto.DataType`).
pub mod data_type {
    /// f32.
    pub const FLOAT: i32 = 1;
    /// i32.
    pub const INT32: i32 = 6;
    /// i64.
    pub const INT64: i32 = 7;
}

/// A constant tensor, its bytes little-endian in `raw_data`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorProto {
    /// The shape.
    #[prost(int64, repeated, tag = "1")]
    pub dims: Vec<i64>,
    /// The element type ([`data_type`]).
    #[prost(int32, tag = "2")]
    pub data_type: i32,
    /// The tensor's name.
    #[prost(string, tag = "8")]
    pub name: String,
    /// The elements, little-endian, row-major.
    #[prost(bytes = "vec", tag = "9")]
    pub raw_data: Vec<u8>,
}

/// A graph input or output: a name and a type.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfoProto {
    /// The value's name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Its type.
    #[prost(message, optional, tag = "2")]
    pub r#type: Option<TypeProto>,
}

/// A value's type; oar's values are all tensors.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypeProto {
    /// The tensor type.
    #[prost(message, optional, tag = "1")]
    pub tensor_type: Option<TensorTypeProto>,
}

/// A tensor type (`TypeProto.Tensor`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorTypeProto {
    /// The element type ([`data_type`]).
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    /// The shape.
    #[prost(message, optional, tag = "2")]
    pub shape: Option<TensorShapeProto>,
}

/// A shape.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorShapeProto {
    /// The dimensions.
    #[prost(message, repeated, tag = "1")]
    pub dim: Vec<Dimension>,
}

/// One dimension: a number or a symbolic name (the batch).
#[derive(Clone, PartialEq, prost::Message)]
pub struct Dimension {
    /// A known size.
    #[prost(int64, optional, tag = "1")]
    pub dim_value: Option<i64>,
    /// A symbolic size.
    #[prost(string, optional, tag = "2")]
    pub dim_param: Option<String>,
}
