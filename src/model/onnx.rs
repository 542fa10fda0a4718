//! A [`Model`] as ONNX: the dense graph, whose inputs are the pooled embeddings and the dense
//! features, or the complete model, whose inputs are each slot's ids and which looks them up in
//! its tables and pools them itself. Both compute what [`Model::evaluate`] computes, the heads'
//! scores as `oar predict` writes them.
//!
//! Inputs (`N` the batch): `dense` f32 `[N, dense width]`; in the dense graph one f32
//! `[N, slots x dim]` per embedding layer, named after it; in the complete model, per slot `S`
//! an embedding layer reads, `S.ids` int64 `[N, K]` (the slot's ids as the data reader makes
//! them, bit-cast to int64, each sample's bag padded to the longest), `S.weights` f32 `[N, K]`
//! (1 for an unweighted id, 0 for padding) and `S.lengths` int64 `[N]` (ids per bag). An id
//! without a row reads as zeros, as in `oar predict`. Outputs: per head `H.score` (`H` its
//! tensor): the click probability `[N, 1]` (log-loss), the value `[N, 1]` (square) or the
//! class probabilities `[N, C]` (softmax).
//!
//! The complete model holds each table's rows: one `LabelEncoder` per table maps ids to row
//! numbers (an id without a row to a row of zeros), a `Gather` reads the rows, and the embedding
//! layer's pooling follows. Every other layer writes itself through `Layer::export_onnx`; a
//! layer without an ONNX form is refused, by name.

use std::collections::HashMap;

use super::embedding::{Embedding, Pooling};
use super::graph::{Model, Op, DENSE};
use crate::observe::metrics::Loss;
use crate::onnx::{label_encoder_attrs, Attr, Dim, Elem, Graph};

/// One table's rows for a complete model: ids ascending, `dim` weights per id.
#[derive(Clone, Copy, Debug)]
pub struct OnnxTable<'a> {
    /// Row ids, ascending.
    pub ids: &'a [u64],
    /// Their weights.
    pub weights: &'a [f32],
}

/// A graph input or output, for the manifest.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Port {
    /// Its name.
    pub name: String,
    /// `float32` or `int64`.
    pub dtype: String,
    /// Its shape; `-1` is the batch or a bag's padded length.
    pub shape: Vec<i64>,
}

impl Port {
    fn new(name: &str, elem: Elem, shape: &[i64]) -> Port {
        let dtype = match elem {
            Elem::Float => "float32",
            Elem::Int64 => "int64",
        };
        Port { name: name.to_string(), dtype: dtype.into(), shape: shape.to_vec() }
    }
}

/// An ONNX model's bytes and its inputs and outputs.
pub struct OnnxModel {
    /// The encoded `ModelProto`.
    pub bytes: Vec<u8>,
    /// Its inputs.
    pub inputs: Vec<Port>,
    /// Its outputs, in the heads' order.
    pub outputs: Vec<Port>,
}

/// Collects the ports as they are declared.
struct Ports {
    g: Graph,
    inputs: Vec<Port>,
    outputs: Vec<Port>,
}

impl Ports {
    fn input(&mut self, name: &str, elem: Elem, shape: &[i64]) {
        // -1 first is the batch; later, a bag's padded length, named per input.
        let dims: Vec<Dim> = shape
            .iter()
            .enumerate()
            .map(|(i, &d)| match (i, d) {
                (_, d) if d >= 0 => Dim::Fixed(d as usize),
                (0, _) => Dim::batch(),
                _ => Dim::Named(format!("{name}.K")),
            })
            .collect();
        self.g.input(name, elem, &dims);
        self.inputs.push(Port::new(name, elem, shape));
    }
}

impl Model {
    /// The name of head `h`'s output in an export.
    pub fn score_name(&self, h: usize) -> String {
        format!("{}.score", self.tensor_name(self.heads[h].tensor))
    }

    /// The model as ONNX with parameters `params`: the dense graph (`tables` `None`) or the
    /// complete model with `tables` (one per model table). Errors name the layer that has no
    /// ONNX form.
    pub fn to_onnx(
        &self,
        params: &[f32],
        tables: Option<&[OnnxTable]>,
        dense_affine: Option<&crate::data::read::transform::Affine>,
    ) -> Result<OnnxModel, String> {
        if let Some(h) = self.heads.iter().position(|h| h.loss == Loss::Value) {
            return Err(format!(
                "head {:?} is a training-only loss (loss = \"value\"), which oar export cannot leave out",
                self.tensor_name(self.heads[h].tensor)
            ));
        }
        let mut p = Ports { g: Graph::new(), inputs: Vec::new(), outputs: Vec::new() };
        // The dense values as the format gives them; the data's scaling, if any, is the graph's.
        let mut dense = "dense".to_string();
        if self.nodes.iter().any(|n| n.inputs.contains(&DENSE)) {
            let w = self.input.dense_width;
            p.input("dense", Elem::Float, &[-1, w as i64]);
            if let Some(a) = dense_affine {
                p.g.scope("dense");
                let shift = p.g.floats("shift", &[w], &a.shift);
                let scale = p.g.floats("scale", &[w], &a.scale);
                let centred = p.g.op("Sub", &["dense", &shift], Vec::new());
                dense = p.g.op("Mul", &[&centred, &scale], Vec::new());
            }
        }
        let kinds: HashMap<String, String> = match self.config.graph() {
            Ok(g) => g.layers.into_iter().map(|l| (l.name, l.kind)).collect(),
            Err(_) => HashMap::new(),
        };
        let mut lookups = Lookups::default();
        for node in &self.nodes {
            p.g.scope(&node.name);
            match &node.op {
                Op::Embedding(e) => match tables {
                    None => {
                        p.input(&node.name, Elem::Float, &[-1, e.width() as i64]);
                        if let Some(len) = e.sequence {
                            p.input(&format!("{}.mask", node.name), Elem::Float, &[-1, len as i64]);
                        }
                    }
                    Some(tables) => lookups.pool(&mut p, self, e, &tables[e.table], &node.name),
                },
                Op::Layer(layer) => {
                    let names: Vec<String> = node
                        .inputs
                        .iter()
                        .map(|&t| if t == DENSE { dense.clone() } else { self.tensor_name(t) })
                        .collect();
                    let xs: Vec<&str> = names.iter().map(String::as_str).collect();
                    layer.export_onnx(&mut p.g, &params[node.params.clone()], &xs, &node.name).map_err(|e| {
                        let kind = kinds.get(&node.name).map_or("custom", String::as_str);
                        format!("layer {:?} ({kind}) cannot be exported: {e}", node.name)
                    })?;
                }
            }
        }
        for (h, head) in self.heads.iter().enumerate() {
            p.g.scope("heads");
            let x = if head.tensor == DENSE { dense.clone() } else { self.tensor_name(head.tensor) };
            let out = self.score_name(h);
            match head.loss {
                Loss::LogLoss => p.g.op_to("Sigmoid", &[&x], Vec::new(), &out),
                Loss::Square => p.g.identity(&x, &out),
                Loss::Softmax => p.g.op_to("Softmax", &[&x], vec![Attr::Int("axis", 1)], &out),
                Loss::Value => unreachable!("refused above"),
            }
            p.g.output(&out, Elem::Float, &[Dim::batch(), Dim::Fixed(head.width)]);
            p.outputs.push(Port::new(&out, Elem::Float, &[-1, head.width as i64]));
        }
        let kind = if tables.is_some() { "complete model" } else { "dense graph" };
        let bytes = p.g.encode(&format!("oar {kind}"), &[("oar.graph".into(), kind.into())]);
        Ok(OnnxModel { bytes, inputs: p.inputs, outputs: p.outputs })
    }
}

/// The values a complete model shares between embedding layers: per table its weights (a zero
/// row appended for unknown ids), per (table, slot) the rows of the slot's ids, per slot its
/// inputs.
#[derive(Default)]
struct Lookups {
    weights: HashMap<usize, String>,
    rows: HashMap<(usize, usize), String>,
    slots: HashMap<usize, (String, String, String)>,
}

impl Lookups {
    /// Slot `s`'s (ids, weights as [N, K, 1], lengths as f32 [N, 1]) values, declaring its inputs.
    fn slot(&mut self, p: &mut Ports, model: &Model, s: usize) -> (String, String, String) {
        if let Some(v) = self.slots.get(&s) {
            return v.clone();
        }
        let name = &model.input.slots[s];
        let (ids, w, len) = (format!("{name}.ids"), format!("{name}.weights"), format!("{name}.lengths"));
        p.input(&ids, Elem::Int64, &[-1, -1]);
        p.input(&w, Elem::Float, &[-1, -1]);
        p.input(&len, Elem::Int64, &[-1]);
        let axes = p.g.ints("axes", &[2]);
        let w3 = p.g.op("Unsqueeze", &[&w, &axes], Vec::new());
        let lf = p.g.op("Cast", &[&len], vec![Attr::Int("to", crate::onnx::proto::data_type::FLOAT as i64)]);
        let one = p.g.scalar("one", 1.0);
        let lf = p.g.op("Max", &[&lf, &one], Vec::new());
        let lf = p.g.reshape(&lf, &[-1, 1]);
        let v = (ids, w3, lf);
        self.slots.insert(s, v.clone());
        v
    }

    /// Looks up the ids of every slot read in table `t` at once (one LabelEncoder holds the
    /// table's keys, however many slots read it), then cuts the rows back into each slot's.
    fn look_up(&mut self, p: &mut Ports, model: &Model, t: usize, table: &OnnxTable, weights: &str) {
        let slots: Vec<usize> = (0..model.input.slots.len()).filter(|&s| model.table_slots[t][s]).collect();
        let ids: Vec<String> = slots.iter().map(|&s| self.slot(p, model, s).0).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let all = p.g.op("Concat", &refs, vec![Attr::Int("axis", 1)]);
        let keys: Vec<i64> = table.ids.iter().map(|&id| id as i64).collect();
        let values: Vec<i64> = (0..keys.len() as i64).collect();
        let unknown = keys.len() as i64;
        let index = p.g.ml_op("LabelEncoder", &[&all], label_encoder_attrs(keys, values, unknown));
        let rows = p.g.op("Gather", &[weights, &index], vec![Attr::Int("axis", 0)]);
        if slots.len() == 1 {
            self.rows.insert((t, slots[0]), rows);
            return;
        }
        let (axis, at) = (p.g.ints("axis", &[1]), p.g.ints("one", &[1]));
        let mut start = p.g.ints("zero", &[0]);
        for (&s, ids) in slots.iter().zip(&ids) {
            let shape = p.g.op("Shape", &[ids], Vec::new());
            let k = p.g.op("Gather", &[&shape, &at], vec![Attr::Int("axis", 0)]);
            let end = p.g.op("Add", &[&start, &k], Vec::new());
            let part = p.g.op("Slice", &[&rows, &start, &end, &axis], Vec::new());
            self.rows.insert((t, s), part);
            start = end;
        }
    }

    /// Writes embedding layer `e`'s pooled output as the value `out`.
    fn pool(&mut self, p: &mut Ports, model: &Model, e: &Embedding, table: &OnnxTable, out: &str) {
        let weights = match self.weights.get(&e.table) {
            Some(w) => w.clone(),
            None => {
                let mut data = table.weights.to_vec();
                data.extend(std::iter::repeat_n(0.0, e.dim));
                let w = p.g.floats(&format!("table_{}", e.table), &[table.ids.len() + 1, e.dim], &data);
                self.weights.insert(e.table, w.clone());
                w
            }
        };
        let mut pooled = Vec::new();
        for (j, &s) in e.slots.iter().enumerate() {
            let (_, w3, len) = self.slot(p, model, s);
            let rows = match self.rows.get(&(e.table, s)) {
                Some(r) => r.clone(),
                None => {
                    self.look_up(p, model, e.table, table, &weights);
                    self.rows[&(e.table, s)].clone()
                }
            };
            let weighted = p.g.op("Mul", &[&rows, &w3], Vec::new());
            if let Some(l) = e.sequence {
                let name = &model.input.slots[s];
                let (seq, mask) = sequence(p, &weighted, &format!("{name}.lengths"), l);
                if j == 0 {
                    p.g.identity(&mask, &format!("{out}.mask"));
                }
                pooled.push(seq);
                continue;
            }
            let sum = p.g.reduce_sum(&weighted, &[1], false);
            let v = match e.pooling {
                Pooling::Sum => sum,
                Pooling::Mean => p.g.op("Div", &[&sum, &len], Vec::new()),
                Pooling::SqrtN => {
                    let root = p.g.op("Sqrt", &[&len], Vec::new());
                    p.g.op("Div", &[&sum, &root], Vec::new())
                }
            };
            pooled.push(v);
        }
        let refs: Vec<&str> = pooled.iter().map(String::as_str).collect();
        match e.sequence {
            None => p.g.op_to("Concat", &refs, vec![Attr::Int("axis", 1)], out),
            Some(l) => {
                // Per position, the slots side by side: (N, L, S x D), flat.
                let joined = p.g.op("Concat", &refs, vec![Attr::Int("axis", 2)]);
                p.g.reshape_to(&joined, &[-1, (l * e.slots.len() * e.dim) as i64], out);
            }
        }
    }
}

/// A slot's weighted rows `rows` `[N, K, D]` (bags padded to `K`) as `len` ordered positions
/// `[N, len, D]` and their mask `[N, len]`, as [`Embedding::forward`] places them: position `p`
/// of a bag of `n` ids holds id `max(n - len, 0) + p` when that is below `n`, else zeros.
fn sequence(p: &mut Ports, rows: &str, lengths: &str, len: usize) -> (String, String) {
    let g = &mut p.g;
    // A zero row in front, so padding reads index 0 (and a batch of empty bags, K = 0, works).
    let pads = g.ints("pads", &[0, 1, 0, 0, 0, 0]);
    let padded = g.op("Pad", &[rows, &pads], Vec::new());
    let n = g.reshape(lengths, &[-1, 1]);
    let l = g.ints("len", &[len as i64]);
    let start = g.op("Sub", &[&n, &l], Vec::new());
    let zero = g.ints("zero", &[0]);
    let start = g.op("Max", &[&start, &zero], Vec::new());
    let positions = g.ints("positions", &(0..len as i64).collect::<Vec<_>>());
    let index = g.op("Add", &[&start, &positions], Vec::new());
    let real = g.op("Less", &[&index, &n], Vec::new());
    let one = g.ints("one", &[1]);
    let shifted = g.op("Add", &[&index, &one], Vec::new());
    let index = g.op("Where", &[&real, &shifted, &zero], Vec::new());
    let axes = g.ints("axes", &[2]);
    let index = g.op("Unsqueeze", &[&index, &axes], Vec::new());
    let seq = g.op("GatherND", &[&padded, &index], vec![Attr::Int("batch_dims", 1)]);
    let mask = g.op("Cast", &[&real], vec![Attr::Int("to", crate::onnx::proto::data_type::FLOAT as i64)]);
    (seq, mask)
}
