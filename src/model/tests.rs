//! Graph building errors, the shorthand's expansion, and whole-model gradients against finite
//! differences (embedding lookups, fan-out, several tables and heads together).

use super::*;
use crate::train::Lookups;

fn input(slots: usize, dense: usize, labels: &[&str]) -> Input {
    Input {
        labels: labels.iter().map(|s| s.to_string()).collect(),
        dense_width: dense,
        slots: (1..=slots).map(|s| format!("C{s}")).collect(),
    }
}

fn parse(text: &str) -> ModelConfig {
    #[derive(serde::Deserialize)]
    struct Job {
        model: ModelConfig,
    }
    toml::from_str::<Job>(text).unwrap_or_else(|e| panic!("{e}")).model
}

/// The built-in layers and `linear_loss` ([`OwnLoss`]).
fn registry() -> Registry {
    Registry::default().register("linear_loss", own_loss)
}

fn build_err(text: &str) -> String {
    Model::build(&parse(text), &input(3, 2, &["click"]), &registry()).unwrap_err()
}

#[test]
fn bad_graphs_are_one_clear_error_naming_the_layer() {
    let head = "[model]\noutput = \"out\"\ntables = [{ name = \"v\", dim = 4 }]\n";
    let cases = [
        ("layers = [{ name = \"out\", type = \"linear\", input = \"nope\", out = 1 }]", "layer \"out\": unknown input \"nope\""),
        (
            "layers = [{ name = \"a\", type = \"relu\", input = \"b\" }, { name = \"b\", type = \"relu\", input = \"a\" }, { name = \"out\", type = \"linear\", input = \"a\", out = 1 }]",
            "the layers a, b depend on each other in a cycle",
        ),
        (
            "layers = [{ name = \"e\", type = \"embedding\", table = \"v\" }, { name = \"out\", type = \"add\", inputs = [\"e\", \"dense\"] }]",
            "layer \"out\" (add): inputs must have one size",
        ),
        ("layers = [{ name = \"out\", type = \"convolution\", input = \"dense\" }]", "unknown type \"convolution\""),
        ("layers = [{ name = \"out\", type = \"linear\", input = \"dense\", out = 1, widht = 3 }]", "layer \"out\" (linear): unknown setting(s) widht"),
        (
            "layers = [{ name = \"x\", type = \"relu\", input = \"dense\" }, { name = \"out\", type = \"linear\", input = \"dense\", out = 1 }]",
            "layer \"x\" feeds no head",
        ),
        ("layers = [{ name = \"out\", type = \"linear\", input = \"dense\", out = 3 }]", "head \"out\": LogLoss needs an output of width 1, it has 3"),
        (
            "layers = [{ name = \"e\", type = \"embedding\", table = \"v\", slots = \"C9\" }, { name = \"out\", type = \"linear\", input = \"e\", out = 1 }]",
            "layer \"e\" (embedding): unknown slot \"C9\" (the data's slots: C1, C2, C3)",
        ),
        (
            "layers = [{ name = \"e\", type = \"embedding\", table = \"w\" }, { name = \"out\", type = \"linear\", input = \"e\", out = 1 }]",
            "unknown table \"w\" (tables: v)",
        ),
        ("hidden = [4]\nlayers = [{ name = \"out\", type = \"linear\", input = \"dense\", out = 1 }]", "`hidden` belongs to the shorthand form"),
        ("layers = [{ name = \"dense\", type = \"relu\", input = \"dense\" }]", "the layer name \"dense\" is taken"),
        ("layers = [{ name = \"out\", type = \"fm\", input = \"dense\" }]", "layer \"out\" (fm)"),
        ("layers = [{ name = \"\", type = \"relu\", input = \"dense\" }]", "layer 1 has no name"),
        (
            "layers = [{ name = \"n\", type = \"layer_norm\", input = \"dense\", eps = inf }, { name = \"out\", type = \"linear\", input = \"n\", out = 1 }]",
            "eps must be a finite number, not NaN or an infinity",
        ),
        (
            "layers = [{ name = \"n\", type = \"layer_norm\", input = \"dense\", eps = 1e300 }, { name = \"out\", type = \"linear\", input = \"n\", out = 1 }]",
            "eps = 1e300 is beyond what a 32-bit float holds",
        ),
    ];
    for (layers, expected) in cases {
        let err = build_err(&format!("{head}{layers}\n"));
        assert!(err.contains(expected), "expected {expected:?} in: {err}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

/// A cycle with a long chain hanging off it is named at once, the chain left out: the search
/// for a cycle was cubic in the layers (20,000 layers: minutes).
#[test]
fn a_cycle_under_a_long_chain_is_named_without_the_chain() {
    let mut layers = vec![
        "{ name = \"c0\", type = \"relu\", input = \"c1\" }".to_string(),
        "{ name = \"c1\", type = \"relu\", input = \"c0\" }".to_string(),
        "{ name = \"d0\", type = \"relu\", input = \"c0\" }".to_string(),
    ];
    let n = 20_000;
    layers.extend((1..n).map(|k| format!("{{ name = \"d{k}\", type = \"relu\", input = \"d{}\" }}", k - 1)));
    // Written in reverse, so the order found is not the file's.
    layers.push(format!("{{ name = \"out\", type = \"linear\", input = \"d{}\", out = 1 }}", n - 1));
    layers.reverse();
    let text = format!(
        "[model]\noutput = \"out\"\ntables = [{{ name = \"v\", dim = 4 }}]\nlayers = [{}]\n",
        layers.join(",\n")
    );
    let err = build_err(&text);
    assert!(err.ends_with("the layers c1, c0 depend on each other in a cycle"), "{}", &err[..err.len().min(300)]);
    // An unknown input among them names the first tensors, not all 20,004.
    let err = build_err(&text.replace("input = \"c1\"", "input = \"nope\""));
    assert!(err.contains("unknown input \"nope\"") && err.ends_with("and 19984 more)") && err.len() < 1000, "{err}");
    // Without the cycle the same chain builds, each layer after its input.
    let text = text
        .replace("name = \"c1\", type = \"relu\", input = \"c0\"", "name = \"c1\", type = \"relu\", input = \"dense\"");
    Model::build(&parse(&text), &input(3, 2, &["click"]), &Registry::default()).unwrap();
}

#[test]
fn the_shorthand_expands_to_the_graph_of_models_saved_before() {
    let c = ModelConfig::default();
    let model = Model::build(&c, &input(26, 13, &["label"]), &Registry::default()).unwrap();
    let spec = model.table_spec(crate::table::Optimizer::adam(1e-3), crate::table::Optimizer::adagrad(0.05));
    let names: Vec<&str> = spec.dense.params.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["fc.0.w", "fc.0.b", "fc.1.w", "fc.1.b", "fc.2.w", "fc.2.b", "fc.3.w", "fc.3.b"]);
    assert_eq!(spec.dense.params[0].len, 273 * 400);
    assert_eq!((spec.sparse.len(), spec.sparse[0].name.as_str(), spec.sparse[0].dim), (1, "embedding", 10));
    let graph = parse(include_str!("../../examples/ctr_dnn_graph.toml"));
    let same = Model::build(&graph, &input(26, 13, &["label"]), &Registry::default()).unwrap();
    assert_eq!(
        same.table_spec(Default::default(), Default::default()),
        model.table_spec(Default::default(), Default::default())
    );
    // UCI housing: no slots, no hidden layer; the table is still declared (as it was).
    let uci = ModelConfig { slots: Some(0), hidden: Some(vec![]), loss: Some(Loss::Square), ..Default::default() };
    let m = Model::build(&uci, &input(0, 13, &["label"]), &Registry::default()).unwrap();
    assert_eq!(m.summary(), "fc (1); 14 dense parameters");
}

/// A batch of 3 samples over 3 slots, multi-hot with weights and an empty bag.
fn batch() -> Batch {
    let mut b = Batch::new(2, 2, 3);
    type Sample<'a> = (&'a [f32], &'a [f32], [&'a [u64]; 3]);
    let samples: [Sample; 3] = [
        (&[1.0, 0.0], &[0.5, -1.0], [&[1], &[2, 3], &[4]]),
        (&[0.0, 1.0], &[1.5, 0.25], [&[2], &[], &[1, 1]]),
        (&[1.0, 1.0], &[-0.5, 2.0], [&[5], &[3], &[6, 2, 7]]),
    ];
    for (labels, dense, bags) in samples {
        b.labels.extend_from_slice(labels);
        b.dense.extend_from_slice(dense);
        for (k, bag) in bags.iter().enumerate() {
            let weights: Vec<f32> = (0..bag.len()).map(|i| 0.5 + i as f32).collect();
            b.push_bag(bag, (k == 2).then_some(&weights[..]));
        }
    }
    b
}

/// A linear layer whose output counts as a loss of its own, so a `value` head may take it: the
/// value head's gradient path, tested without the sequence `next_item_loss` needs.
#[derive(Debug)]
struct OwnLoss(Box<dyn crate::nn::layer::Layer>);

impl crate::nn::layer::Layer for OwnLoss {
    fn output(&self) -> Shape {
        self.0.output()
    }
    fn params(&self) -> Vec<crate::table::DenseParam> {
        self.0.params()
    }
    fn scratch(&self) -> usize {
        self.0.scratch()
    }
    fn is_loss(&self) -> bool {
        true
    }
    fn forward(&self, ctx: &crate::nn::layer::Ctx, params: &[f32], x: &[&[f32]], y: &mut [f32], scratch: &mut [f32]) {
        self.0.forward(ctx, params, x, y, scratch)
    }
    #[allow(clippy::too_many_arguments)]
    fn backward(
        &self,
        ctx: &crate::nn::layer::Ctx,
        params: &[f32],
        x: &[&[f32]],
        y: &[f32],
        dy: &[f32],
        scratch: &mut [f32],
        grads: &mut [f32],
        dx: &mut [Option<&mut [f32]>],
    ) {
        self.0.backward(ctx, params, x, y, dy, scratch, grads, dx)
    }
}

fn own_loss(
    args: &mut crate::nn::layer::LayerArgs,
    inputs: &[Shape],
) -> Result<Box<dyn crate::nn::layer::Layer>, String> {
    Ok(Box::new(OwnLoss(Registry::default().build("linear", args, inputs)?)))
}

#[test]
fn a_value_head_takes_only_a_loss_a_layer_computes() {
    let text = "[model]\nheads = [{ output = \"ctr\", loss = \"log_loss\" }, { output = \"own\", loss = \"value\" }]\n\
                layers = [{ name = \"ctr\", type = \"linear\", input = \"dense\", out = 1 }, \
                { name = \"own\", type = \"linear\", input = \"dense\", out = 1 }]\n";
    let err = build_err(text);
    assert!(
        err.contains("a value head minimizes a loss a layer computes (next_item_loss), and \"own\" is not one"),
        "{err}"
    );
    let text = text.replace("name = \"own\", type = \"linear\"", "name = \"own\", type = \"linear_loss\"");
    Model::build(&parse(&text), &input(3, 2, &["click"]), &registry()).unwrap();
}

#[test]
fn whole_model_gradients_match_finite_differences() {
    let text = r#"
[model]
heads = [{ output = "ctr", loss = "log_loss", label = "click" }, { output = "cvr", loss = "log_loss", label = "buy", weight = 0.5 }, { output = "own", loss = "value", weight = 0.3 }]
tables = [{ name = "v", dim = 3 }, { name = "w", dim = 1 }]
layers = [
  { name = "emb", type = "embedding", table = "v", slots = "C1..C3", pooling = "mean" },
  { name = "tags", type = "embedding", table = "v", slots = ["C3", "C2"], pooling = "sqrt_n" },
  { name = "wide", type = "embedding", table = "w", slots = "C1..C3" },
  { name = "lr", type = "reduce_sum", input = "wide", over = "all" },
  { name = "fm", type = "fm", input = "emb" },
  { name = "x", type = "concat", inputs = ["emb", "tags", "dense"] },
  { name = "deep", type = "mlp", input = "x", hidden = [5], activation = "tanh", out = 1 },
  { name = "ctr", type = "add", inputs = ["lr", "fm", "deep"] },
  { name = "cvr", type = "linear", input = "x", out = 1 },
  { name = "own", type = "linear_loss", input = "x", out = 1 },
]
"#;
    let model = Model::build(&parse(text), &input(3, 2, &["click", "buy"]), &registry()).unwrap();
    let b = batch();
    let mut lookups = Lookups::default();
    lookups.run(&b, model.table_slots(), model.click_column());
    let spec = model.table_spec(Default::default(), Default::default());
    let mut params = vec![0.0; spec.dense.total()];
    spec.dense.init_range(0, &mut params);
    let mut rows: Vec<Vec<f32>> = spec
        .sparse
        .iter()
        .zip(&lookups.tables)
        .map(|(t, l)| {
            let mut r = vec![0.0; l.unique.len() * t.dim];
            l.unique.iter().enumerate().for_each(|(i, &id)| t.init_row(id, &mut r[i * t.dim..(i + 1) * t.dim]));
            r.iter_mut().for_each(|v| *v *= 20.0);
            r
        })
        .collect();
    let mut work = Work::default();
    let mut grads = vec![0.0; params.len()];
    let mut row_grads: Vec<Vec<f32>> = rows.iter().map(|r| vec![0.0; r.len()]).collect();
    model.train_step(
        &params,
        &b,
        &lookups.rows(&rows),
        0,
        &mut work,
        Grads { dense: &mut grads, rows: &mut row_grads },
    );
    let loss =
        |params: &[f32], rows: &[Vec<f32>]| model.evaluate(params, &b, &lookups.rows(rows), &mut Work::default());
    let eps = 1e-2f32;
    let close = |n: f64, a: f32| (n - a as f64).abs() <= 2e-3 + 1e-2 * n.abs();
    for k in 0..params.len() {
        let (mut hi, mut lo) = (params.clone(), params.clone());
        hi[k] += eps;
        lo[k] -= eps;
        let n = (loss(&hi, &rows) - loss(&lo, &rows)) / (2.0 * eps as f64);
        assert!(
            close(n, grads[k]),
            "dense {k} ({:?}): {n} vs {}",
            spec.dense.params.iter().map(|p| &p.name).collect::<Vec<_>>(),
            grads[k]
        );
    }
    for t in 0..rows.len() {
        for k in 0..rows[t].len() {
            let keep = rows[t][k];
            rows[t][k] = keep + eps;
            let hi = loss(&params, &rows);
            rows[t][k] = keep - eps;
            let lo = loss(&params, &rows);
            rows[t][k] = keep;
            let n = (hi - lo) / (2.0 * eps as f64);
            assert!(close(n, row_grads[t][k]), "table {t} float {k}: {n} vs {}", row_grads[t][k]);
        }
    }
    assert_eq!(work.head_probs.len(), 3);
}

#[test]
fn a_value_head_is_its_own_loss_without_a_label() {
    let text = |label: &str| {
        format!(
            "[model]\nheads = [{{ output = \"out\", loss = \"log_loss\" }}, {{ output = \"own\", loss = \"value\"{label} }}]\n\
             layers = [{{ name = \"out\", type = \"linear\", input = \"dense\", out = 1 }}, {{ name = \"own\", type = \"linear_loss\", input = \"dense\", out = 1 }}]\n"
        )
    };
    // One label column serves the log-loss head; the value head needs none.
    assert!(Model::build(&parse(&text("")), &input(0, 2, &["click"]), &registry()).is_ok());
    let model = Model::build(&parse(&text("")), &input(3, 2, &["click", "buy"]), &registry()).unwrap();
    assert_eq!(model.losses(), vec![Loss::LogLoss, Loss::Value]);
    let err = build_err(&text(", label = \"click\""));
    assert!(err.contains("head \"own\": a value head is its own loss and takes no label"), "{err}");
    let err = build_err(&text(", weight = -1.0"));
    assert!(err.contains("head \"own\": weight must be positive"), "{err}");
    // Served: the log-loss head, and the slots it reads; C3 feeds only the value head.
    let served = parse(
        "[model]\nheads = [{ output = \"out\", loss = \"log_loss\" }, { output = \"own\", loss = \"value\" }]\n\
         tables = [{ name = \"v\", dim = 2 }]\n\
         layers = [{ name = \"a\", type = \"embedding\", table = \"v\", slots = [\"C1\", \"C2\"] }, \
         { name = \"b\", type = \"embedding\", table = \"v\", slots = [\"C3\"] }, \
         { name = \"out\", type = \"linear\", input = \"a\", out = 1 }, { name = \"ab\", type = \"concat\", inputs = [\"a\", \"b\"] }, \
         { name = \"own\", type = \"linear_loss\", input = \"ab\", out = 1 }]\n",
    );
    let served = Model::build(&served, &input(3, 2, &["click"]), &registry()).unwrap();
    assert_eq!((served.scored_heads(), served.scored_slots()), (vec![0], vec![true, true, false]));
    let mut built = crate::model::GraphBuilder::new();
    built.value_head("own", 0.5);
    let head = &built.build().heads[0];
    assert_eq!((head.loss, head.label.clone()), (Loss::Value, None));
    let wide = text("").replace("out = 1 }]\n", "out = 2 }]\n");
    assert!(build_err(&wide).contains("Value needs an output of width 1, it has 2"), "{}", build_err(&wide));
    // Its gradient is 1 per sample (times its weight, 1 here): the bias of the layer that
    // writes it gets the batch's 3 samples.
    let b = batch();
    let mut work = Work::default();
    let params: Vec<f32> = (0..model.dense_len()).map(|k| 0.1 * k as f32 - 0.2).collect();
    let mut grads = vec![0.0; params.len()];
    model.train_step(&params, &b, &[], 0, &mut work, Grads { dense: &mut grads, rows: &mut [] });
    let at: usize = model.params().iter().take_while(|p| p.name != "own.b").map(|p| p.len).sum();
    assert_eq!(grads[at], 3.0);
}
