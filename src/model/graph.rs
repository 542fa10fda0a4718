//! Building a [`Model`] from its config: tensors named after layers, sorted so every layer runs
//! after its inputs, shapes checked, parameters placed in the flat dense vector. Every error
//! names the layer (or head, or table) at fault and is reported before any process starts.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

use super::budget::Budget;
use super::config::{HeadConfig, LayerConfig, ModelConfig, TableConfig};
use super::embedding::{Embedding, Pooling};
use super::{Input, Registry};
use crate::nn::layer::{Layer, LayerArgs, Shape};
use crate::observe::metrics::Loss;
use crate::table::DenseParam;

/// The tensor of the batch's dense features.
pub(super) const DENSE: usize = 0;

/// What a node computes.
#[derive(Debug)]
pub(super) enum Op {
    /// A pooled lookup in a sparse table.
    Embedding(Embedding),
    /// A dense layer.
    Layer(Box<dyn Layer>),
}

/// One layer placed in the graph.
#[derive(Debug)]
pub(super) struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<usize>,
    pub output: usize,
    /// A sequence embedding's mask tensor (`NAME.mask`).
    pub mask: Option<usize>,
    /// Its slice of the flat dense parameters.
    pub params: Range<usize>,
}

/// A loss head, resolved.
#[derive(Clone, Debug)]
pub(super) struct Head {
    pub tensor: usize,
    pub loss: Loss,
    /// Label column.
    pub label: usize,
    pub weight: f32,
    /// Width of the head's tensor (classes for softmax).
    pub width: usize,
}

/// A model: its tables, its layer graph in running order and its heads.
#[derive(Debug)]
pub struct Model {
    pub(super) config: ModelConfig,
    pub(super) input: Input,
    pub(super) tables: Vec<TableConfig>,
    pub(super) shapes: Vec<Shape>,
    pub(super) nodes: Vec<Node>,
    pub(super) heads: Vec<Head>,
    pub(super) params: Vec<DenseParam>,
    /// Per tensor: whether it depends on parameters (so its gradient is needed).
    pub(super) needs_grad: Vec<bool>,
    /// Per table: which of the batch's slots any embedding layer looks up in it.
    pub(super) table_slots: Vec<Vec<bool>>,
    /// Whether a layer draws random numbers (per-sample seeds are computed only then).
    pub(super) random: bool,
    /// Floats a sample needs in training: outputs, their gradients, the layers' workspace.
    pub(super) floats_per_sample: usize,
}

impl Model {
    /// Builds `config` for data shaped as `input`, with the layer types of `registry`.
    pub fn build(config: &ModelConfig, input: &Input, registry: &Registry) -> Result<Model, String> {
        if config.block_size == 0 {
            return Err("model: block_size must be positive".into());
        }
        let g = config.graph()?;
        let heads = g.head_list()?;
        let table_index = index_tables(&g.tables)?;
        let mut tensor_of = name_tensors(&g.layers, registry)?;
        let mask_of = name_masks(&g.layers, &mut tensor_of)?;
        let inputs_of = wire_inputs(&g.layers, &tensor_of, input)?;
        // A mask is ready when its embedding is.
        let owner: HashMap<usize, usize> = mask_of.iter().map(|(&i, &t)| (t, i + 1)).collect();
        let ordering: Vec<Vec<usize>> =
            inputs_of.iter().map(|ins| ins.iter().map(|t| *owner.get(t).unwrap_or(t)).collect()).collect();
        let order = running_order(&g.layers, &ordering)?;
        let graph = Wiring {
            layers: &g.layers,
            tables: &g.tables,
            table_index: &table_index,
            inputs_of: &inputs_of,
            mask_of: &mask_of,
        };
        let placed = place(&graph, &order, input, registry)?;
        let resolved = resolve_heads(&heads, &tensor_of, &placed, input)?;
        // Every layer must lead to a head: a dangling one is almost always a typo.
        let used = reached(&placed.nodes, placed.shapes.len(), resolved.iter().map(|h| h.tensor));
        if let Some(node) = placed.nodes.iter().find(|n| !used[n.output]) {
            return Err(format!("model: layer {:?} feeds no head", node.name));
        }
        let random = placed.nodes.iter().any(|n| matches!(&n.op, Op::Layer(l) if l.uses_seeds()));
        Ok(Model {
            random,
            floats_per_sample: placed.budget.floats_per_sample(),
            config: config.clone(),
            input: input.clone(),
            tables: g.tables.clone(),
            shapes: placed.shapes,
            nodes: placed.nodes,
            heads: resolved,
            params: placed.params,
            needs_grad: placed.needs_grad,
            table_slots: placed.table_slots,
        })
    }
}

/// Each table's index by name; every table's dim checked and its name unique.
fn index_tables(tables: &[TableConfig]) -> Result<HashMap<String, usize>, String> {
    let mut table_index = HashMap::new();
    for (i, t) in tables.iter().enumerate() {
        if t.dim == 0 {
            return Err(format!("model: table {:?} has dim 0", t.name));
        }
        if t.dim > crate::table::MAX_DIM {
            return Err(format!("model: table {:?} has dim {}, more than {}", t.name, t.dim, crate::table::MAX_DIM));
        }
        if table_index.insert(t.name.clone(), i).is_some() {
            return Err(format!("model: two tables are named {:?}", t.name));
        }
    }
    Ok(table_index)
}

/// Each layer's output tensor by name: tensor 0 is the dense features, then one per layer, in
/// file order; every name unique and every type known.
fn name_tensors(layers: &[LayerConfig], registry: &Registry) -> Result<HashMap<String, usize>, String> {
    let mut tensor_of: HashMap<String, usize> = HashMap::from([("dense".to_string(), DENSE)]);
    for (i, l) in layers.iter().enumerate() {
        if l.name.is_empty() || l.name.chars().any(char::is_control) {
            return Err(format!("model: layer {} has no name, or one with a control character: {:?}", i + 1, l.name));
        }
        if l.name == "dense" || tensor_of.insert(l.name.clone(), i + 1).is_some() {
            return Err(format!("model: the layer name {:?} is taken (by `dense` or another layer)", l.name));
        }
        if l.kind != "embedding" && !registry.contains(&l.kind) {
            return Err(format!(
                "model: layer {:?} has unknown type {:?} (known: embedding, {})",
                l.name,
                l.kind,
                registry.names().join(", ")
            ));
        }
    }
    Ok(tensor_of)
}

/// A sequence embedding's mask is one more tensor, `NAME.mask`, after the layers': each
/// sequence layer's mask tensor, named in `tensor_of` too.
fn name_masks(layers: &[LayerConfig], tensor_of: &mut HashMap<String, usize>) -> Result<HashMap<usize, usize>, String> {
    let mut mask_of = HashMap::new();
    for (i, l) in layers.iter().enumerate() {
        if l.kind == "embedding" && l.settings.contains_key("sequence") {
            let t = layers.len() + 1 + mask_of.len();
            mask_of.insert(i, t);
            if tensor_of.insert(format!("{}.mask", l.name), t).is_some() {
                return Err(format!("model: the layer name \"{}.mask\" is taken by a sequence's mask", l.name));
            }
        }
    }
    Ok(mask_of)
}

/// Each layer's input tensors, every name resolved and each read once.
fn wire_inputs(
    layers: &[LayerConfig],
    tensor_of: &HashMap<String, usize>,
    input: &Input,
) -> Result<Vec<Vec<usize>>, String> {
    let mut inputs_of = Vec::new();
    for l in layers {
        let mut ids = Vec::new();
        for name in l.all_inputs() {
            let t = *tensor_of.get(name.as_str()).ok_or_else(|| {
                let mut known: Vec<&str> = tensor_of.keys().map(String::as_str).collect();
                known.sort_unstable();
                // The first ones: a graph of 200,000 layers made a message of 1.7 MB.
                let more = known.len().saturating_sub(20);
                known.truncate(20);
                let more = if more > 0 { format!(" and {more} more") } else { String::new() };
                format!("model: layer {:?}: unknown input {name:?} (tensors: {}{more})", l.name, known.join(", "))
            })?;
            if t == DENSE && input.dense_width == 0 {
                return Err(format!("model: layer {:?} reads `dense` but the data has no dense features", l.name));
            }
            if ids.contains(&t) {
                return Err(format!("model: layer {:?} takes {name:?} twice", l.name));
            }
            ids.push(t);
        }
        if l.kind == "embedding" && !ids.is_empty() {
            return Err(format!("model: layer {:?}: an embedding reads slots, not tensors (no input)", l.name));
        }
        if l.kind != "embedding" && ids.is_empty() {
            return Err(format!("model: layer {:?} has no input (`input` or `inputs`)", l.name));
        }
        inputs_of.push(ids);
    }
    Ok(inputs_of)
}

/// The named graph a model is placed from.
struct Wiring<'a> {
    layers: &'a [LayerConfig],
    tables: &'a [TableConfig],
    table_index: &'a HashMap<String, usize>,
    inputs_of: &'a [Vec<usize>],
    mask_of: &'a HashMap<usize, usize>,
}

/// The layers built and placed, in running order.
struct Placed {
    shapes: Vec<Shape>,
    needs_grad: Vec<bool>,
    nodes: Vec<Node>,
    params: Vec<DenseParam>,
    table_slots: Vec<Vec<bool>>,
    budget: Budget,
}

/// Builds every layer in running order: its output shape, its parameters' place in the flat
/// dense vector, whether its output needs a gradient, within the model's budget.
fn place(g: &Wiring, order: &[usize], input: &Input, registry: &Registry) -> Result<Placed, String> {
    let n_tensors = g.layers.len() + 1 + g.mask_of.len();
    let mut shapes = vec![Shape::flat(0); n_tensors];
    shapes[DENSE] = Shape::flat(input.dense_width);
    let mut needs_grad = vec![false; n_tensors];
    let (mut nodes, mut params) = (Vec::new(), Vec::new());
    let mut table_slots = vec![vec![false; input.slots.len()]; g.tables.len()];
    let mut budget = Budget::default();
    budget.add(shapes[DENSE], 0, 0).map_err(|e| format!("model: the dense features: {e}"))?;
    for &i in order {
        let l = &g.layers[i];
        let at = |e: String| format!("model: layer {:?} ({}): {e}", l.name, l.kind);
        let ins = &g.inputs_of[i];
        let op = if l.kind == "embedding" {
            let e = embedding(l, g.tables, g.table_index, input).map_err(at)?;
            for &s in &e.slots {
                table_slots[e.table][s] = true;
            }
            Op::Embedding(e)
        } else {
            let shapes_in: Vec<Shape> = ins.iter().map(|&t| shapes[t]).collect();
            let mut args = LayerArgs::new(&l.name, l.settings.clone());
            Op::Layer(registry.build(&l.kind, &mut args, &shapes_in).map_err(at)?)
        };
        let mask = g.mask_of.get(&i).copied();
        let (shape, own) = match &op {
            Op::Embedding(e) => match e.sequence {
                Some(len) => {
                    shapes[mask.expect("a sequence has a mask")] = Shape::flat(len);
                    (Shape { fields: len, dim: e.slots.len() * e.dim }, Vec::new())
                }
                None => (Shape { fields: e.slots.len(), dim: e.dim }, Vec::new()),
            },
            Op::Layer(layer) => (layer.output(), layer.params()),
        };
        let scratch = match &op {
            Op::Embedding(_) => 0,
            Op::Layer(layer) => layer.scratch(),
        };
        let len = own.iter().try_fold(0usize, |n, p| n.checked_add(p.len)).unwrap_or(usize::MAX);
        budget.add(shape, scratch, len).map_err(at)?;
        if shape.size() == 0 {
            return Err(at("its output is empty".into()));
        }
        let start: usize = params.iter().map(|p: &DenseParam| p.len).sum();
        params.extend(own.into_iter().map(|p| DenseParam { name: format!("{}.{}", l.name, p.name), ..p }));
        shapes[i + 1] = shape;
        needs_grad[i + 1] = matches!(op, Op::Embedding(_)) || len > 0 || ins.iter().any(|&t| needs_grad[t]);
        nodes.push(Node {
            name: l.name.clone(),
            op,
            inputs: ins.clone(),
            output: i + 1,
            mask,
            params: start..start + len,
        });
    }
    Ok(Placed { shapes, needs_grad, nodes, params, table_slots, budget })
}

/// Each head's tensor, loss, label column and weight, checked against the graph and the data.
fn resolve_heads(
    heads: &[HeadConfig],
    tensor_of: &HashMap<String, usize>,
    placed: &Placed,
    input: &Input,
) -> Result<Vec<Head>, String> {
    let mut resolved = Vec::new();
    for (h, head) in heads.iter().enumerate() {
        let what = format!("model: head {:?}", head.output);
        let &tensor = tensor_of.get(head.output.as_str()).ok_or_else(|| format!("{what}: no such tensor"))?;
        let width = placed.shapes[tensor].size();
        match head.loss {
            Loss::LogLoss | Loss::Square | Loss::Value if width != 1 => {
                return Err(format!("{what}: {:?} needs an output of width 1, it has {width}", head.loss))
            }
            Loss::Softmax if width < 2 => {
                return Err(format!("{what}: softmax needs 2 or more classes, it has {width}"))
            }
            _ => {}
        }
        if !head.weight.is_finite() || head.weight <= 0.0 {
            return Err(format!("{what}: weight must be positive"));
        }
        if head.loss == Loss::Value {
            if head.label.is_some() {
                return Err(format!("{what}: a value head is its own loss and takes no label"));
            }
            let is_loss =
                placed.nodes.iter().any(|n| n.output == tensor && matches!(&n.op, Op::Layer(l) if l.is_loss()));
            if !is_loss {
                return Err(format!(
                    "{what}: a value head minimizes a loss a layer computes (next_item_loss), and {:?} is not one",
                    head.output
                ));
            }
            // Never read by a value head's loss. Column 0 exists in every batch: a batch's
            // length is its label rows'.
            resolved.push(Head { tensor, loss: head.loss, label: 0, weight: head.weight, width });
            continue;
        }
        let label = match &head.label {
            Some(name) => input.labels.iter().position(|l| l == name).ok_or_else(|| {
                format!("{what}: no label {name:?} in the data (labels: {})", input.labels.join(", "))
            })?,
            None => h,
        };
        if label >= input.labels.len() {
            return Err(format!(
                "{what}: the data has {} label column(s); name the head's `label`",
                input.labels.len()
            ));
        }
        resolved.push(Head { tensor, loss: head.loss, label, weight: head.weight, width });
    }
    Ok(resolved)
}

/// Which of `n_tensors` tensors the tensors `ends` are computed from (themselves included),
/// through `nodes` in running order; a sequence embedding counts as used when only its mask is.
pub(super) fn reached(nodes: &[Node], n_tensors: usize, ends: impl Iterator<Item = usize>) -> Vec<bool> {
    let mut used = vec![false; n_tensors];
    ends.for_each(|t| used[t] = true);
    for node in nodes.iter().rev() {
        if used[node.output] || node.mask.is_some_and(|m| used[m]) {
            used[node.output] = true;
            node.inputs.iter().for_each(|&t| used[t] = true);
        }
    }
    used
}

/// The layers in an order where each comes after its inputs (file order among the ready ones),
/// or an error naming the layers caught in a cycle. Linear in the layers and their inputs (up
/// to a logarithm): a search among all layers for each one took minutes for a job file of
/// 20,000 layers hanging off a cycle.
fn running_order(layers: &[LayerConfig], inputs_of: &[Vec<usize>]) -> Result<Vec<usize>, String> {
    use std::cmp::Reverse;
    let n = layers.len();
    // Tensor t > DENSE is layer t - 1's output; an input read twice counts twice both ways.
    let mut waiting: Vec<usize> = inputs_of.iter().map(|ins| ins.iter().filter(|&&t| t != DENSE).count()).collect();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, ins) in inputs_of.iter().enumerate() {
        ins.iter().filter(|&&t| t != DENSE).for_each(|&t| readers[t - 1].push(i));
    }
    let mut ready: std::collections::BinaryHeap<Reverse<usize>> =
        (0..n).filter(|&i| waiting[i] == 0).map(Reverse).collect();
    let mut order = Vec::with_capacity(n);
    while let Some(Reverse(i)) = ready.pop() {
        order.push(i);
        for &j in &readers[i] {
            waiting[j] -= 1;
            if waiting[j] == 0 {
                ready.push(Reverse(j));
            }
        }
    }
    if order.len() == n {
        return Ok(order);
    }
    // The stuck layers are the cycles and what depends on them: peel off those that no stuck
    // layer reads until only the cycles remain.
    let mut stuck = vec![true; n];
    order.iter().for_each(|&i| stuck[i] = false);
    let mut read_by: Vec<usize> = (0..n).map(|i| readers[i].iter().filter(|&&j| stuck[j]).count()).collect();
    let mut peel: Vec<usize> = (0..n).filter(|&i| stuck[i] && read_by[i] == 0).collect();
    while let Some(i) = peel.pop() {
        stuck[i] = false;
        for &t in inputs_of[i].iter().filter(|&&t| t != DENSE) {
            read_by[t - 1] -= 1;
            if stuck[t - 1] && read_by[t - 1] == 0 {
                peel.push(t - 1);
            }
        }
    }
    let names: Vec<&str> = (0..n).filter(|&i| stuck[i]).map(|i| layers[i].name.as_str()).collect();
    Err(format!("model: the layers {} depend on each other in a cycle", names.join(", ")))
}

/// An `embedding` layer's settings: `table` (optional when the model has one table), `slots`
/// (a name, a range like `C1..C26`, or a list of them; default every slot) and `pooling`, or
/// `sequence = L` (ids kept in order, at most the last `L`; the mask is the tensor
/// `NAME.mask`).
fn embedding(
    l: &LayerConfig,
    tables: &[TableConfig],
    table_index: &HashMap<String, usize>,
    input: &Input,
) -> Result<Embedding, String> {
    let mut args = LayerArgs::new(&l.name, l.settings.clone());
    let table = match args.string("table")? {
        Some(name) => *table_index.get(&name).ok_or_else(|| {
            let known: Vec<&str> = tables.iter().map(|t| t.name.as_str()).collect();
            format!("unknown table {name:?} (tables: {})", known.join(", "))
        })?,
        None if tables.len() == 1 => 0,
        None => return Err("name its `table` (the model has several)".into()),
    };
    let pooling_name = args.string("pooling")?;
    let sequence = args.usize("sequence")?;
    match (sequence, &pooling_name) {
        (Some(0), _) => return Err("sequence (the longest sequence kept) must be positive".into()),
        (Some(_), Some(p)) => {
            return Err(format!("a sequence keeps its ids in order: it has no pooling (got pooling = {p:?})"))
        }
        _ => {}
    }
    let pooling = Pooling::parse(&pooling_name.unwrap_or_else(|| "sum".into()))?;
    let specs: Vec<String> = match l.settings.get("slots") {
        None => vec!["*".into()],
        Some(serde_json::Value::String(s)) => vec![s.clone()],
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().map(str::to_string).ok_or_else(|| format!("slots must be names, got {v}")))
            .collect::<Result<_, _>>()?,
        Some(v) => return Err(format!("slots must be a name, a range or a list of them, got {v}")),
    };
    args.string("slots").ok();
    args.finish()?;
    let by_name: BTreeMap<&str, usize> = input.slots.iter().enumerate().map(|(i, s)| (s.as_str(), i)).collect();
    let mut slots = Vec::new();
    for spec in specs {
        let names = if spec == "*" { input.slots.clone() } else { crate::data::schema::expand_names(&spec)? };
        for name in names {
            let s = *by_name
                .get(name.as_str())
                .ok_or_else(|| format!("unknown slot {name:?} (the data's slots: {})", summarize(&input.slots)))?;
            if slots.contains(&s) {
                return Err(format!("slot {name:?} is listed twice"));
            }
            slots.push(s);
        }
    }
    if slots.is_empty() {
        return Err("looks up no slot (the data has none)".into());
    }
    Ok(Embedding { table, dim: tables[table].dim, slots, pooling, sequence })
}

/// A short list of names for messages: all of them, or the first few and the last.
fn summarize(names: &[String]) -> String {
    match names.len() {
        0 => "none".into(),
        n if n <= 8 => names.join(", "),
        n => format!("{}, ... {} ({n} slots)", names[..3].join(", "), names[n - 1]),
    }
}
