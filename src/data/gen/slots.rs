//! `oar gen slots`: multi-hot data in the [`slots`](crate::data::format::slots) format from a planted model,
//! for demos and tests of pooled embeddings (the multi-hot counterpart of [`crate::data::gen`], and
//! built the same way: every draw is a pure function of (seed, stream, line), parts are written
//! in parallel, the planted model's test AUC and log-loss go to `meta.json`).
//!
//! A line is `click:Y d:x1 .. d:x4` then the bags of six slots (ids are u32 decimals, an
//! absent slot is an empty bag):
//!
//! | slot    | bag length                    | ids (Zipf exponent) | pooling of the per-id weights |
//! |---------|-------------------------------|---------------------|-------------------------------|
//! | `user`  | 1                             | 100,000 (1.1)       | sum (one id)                  |
//! | `item`  | 1                             | 50,000 (1.1)        | sum (one id)                  |
//! | `site`  | 1                             | 40 (0.8)            | sum (one id)                  |
//! | `hist`  | 0 (10 %), else 1..=20 uniform | 50,000 (1.1)        | mean (empty: 0)               |
//! | `tags`  | 0..=5 uniform                 | 1,000 (0.8)         | sum                           |
//! | `query` | 0 (30 %), else 1..=8 uniform  | 20,000 (1.1)        | weighted sum, `query:id:w` with w in {0.01, .., 1.00} |
//!
//! The label is Bernoulli(sigmoid(logit)) with `logit = bias + Σ_j w_j x_j + Σ_slots
//! pool(β_slot(id))`: dense values are standard normals (written with 4 decimals, the written
//! value is the one used), β is a normal weight per (slot, id). A logistic regression with one
//! weight per id, pooled per slot as in the table, can represent the planted model exactly.

use std::io::Write;

use serde::Serialize;

use crate::base::layout::mix64;
use crate::data::gen::{sigmoid, write_meta, write_parts, zipf, Draws, GenConfig, GenReport};
use crate::data::{DataConfig, DenseColumn, Format};

/// How the planted model pools the per-id weights of a bag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// The sum of the ids' weights.
    Sum,
    /// Their mean (an empty bag pools to 0).
    Mean,
    /// The sum of each id's weight times its `slot:id:weight` weight.
    WeightedSum,
}

impl Pooling {
    /// The name (as in `meta.json`).
    pub fn name(self) -> &'static str {
        match self {
            Pooling::Sum => "sum",
            Pooling::Mean => "mean",
            Pooling::WeightedSum => "weighted_sum",
        }
    }
}

/// One generated slot.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct SlotSpec {
    /// The slot (token) name.
    pub name: &'static str,
    /// Distinct ids.
    pub vocab: u32,
    /// Exponent of the Zipf law of the ids' ranks.
    pub zipf: f64,
    /// Standard deviation of the planted per-id weights.
    pub weight_std: f64,
    /// Pooling of the planted model.
    pub pooling: Pooling,
    /// Share of empty bags.
    pub empty: f64,
    /// Bag length range of the other bags (uniform, inclusive).
    pub min_len: u32,
    /// See `min_len`.
    pub max_len: u32,
}

const fn slot(
    name: &'static str,
    vocab: u32,
    zipf: f64,
    weight_std: f64,
    pooling: Pooling,
    empty: f64,
    lens: (u32, u32),
) -> SlotSpec {
    SlotSpec { name, vocab, zipf, weight_std, pooling, empty, min_len: lens.0, max_len: lens.1 }
}

/// The generated slots, in bag order.
pub const SLOTS: [SlotSpec; 6] = [
    slot("user", 100_000, 1.1, 0.5, Pooling::Sum, 0.0, (1, 1)),
    slot("item", 50_000, 1.1, 0.5, Pooling::Sum, 0.0, (1, 1)),
    slot("site", 40, 0.8, 0.4, Pooling::Sum, 0.0, (1, 1)),
    slot("hist", 50_000, 1.1, 1.0, Pooling::Mean, 0.1, (1, 20)),
    slot("tags", 1000, 0.8, 0.35, Pooling::Sum, 0.0, (0, 5)),
    slot("query", 20_000, 1.1, 0.5, Pooling::WeightedSum, 0.3, (1, 8)),
];
/// The dense token name.
pub const DENSE_NAME: &str = "d";
/// Planted weights of the dense values.
pub const DENSE_W: [f64; 4] = [0.4, -0.3, 0.2, 0.25];
/// Planted bias.
pub const BIAS: f64 = -1.6;
/// The label token name.
pub const LABEL: &str = "click";

/// What `oar gen slots` wrote: the usual report, the planted model's shape and the `[data]`
/// section that reads the files.
#[derive(Clone, Debug, Serialize)]
pub struct SlotsGenReport {
    /// Lines, CTR, oracle AUC and log-loss.
    #[serde(flatten)]
    pub report: GenReport,
    /// The slots with their pooling.
    pub slots: Vec<SlotSpec>,
    /// The dense column.
    pub dense: DenseColumn,
    /// The planted weights of its values.
    pub dense_weights: Vec<f64>,
    /// Planted bias.
    pub bias: f64,
    /// The `[data]` section to read the data with.
    pub data: DataConfig,
}

/// The `[data]` section of the generated files.
pub fn data_config() -> DataConfig {
    DataConfig {
        format: Format::Slots,
        labels: Some(vec![LABEL.into()]),
        dense: Some(vec![DenseColumn { name: DENSE_NAME.into(), width: DENSE_W.len() }]),
        slots: Some(SLOTS.iter().map(|s| s.name.to_string()).collect()),
        ..DataConfig::default()
    }
}

/// The planted weight of id rank `r` of slot `s`.
fn weight(seed: u64, s: usize, r: u32) -> f64 {
    let d = Draws { base: mix64(seed ^ 0xb0a7 ^ mix64(((s as u64 + 1) << 32) | r as u64)) };
    SLOTS[s].weight_std * d.normal(0)
}

/// The id written for rank `r` of slot `s`: a bijective affine map on 32 bits.
fn raw_id(seed: u64, s: usize, r: u32) -> u32 {
    let h = mix64(seed ^ (0x5107_0000 + s as u64));
    r.wrapping_mul((h as u32) | 1).wrapping_add((h >> 32) as u32)
}

/// Writes line `line` of `stream` into `out` and returns (label, planted probability).
fn write_line(seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    let d = Draws::new(seed ^ 0x510b, stream, line);
    let w = |r: std::io::Result<()>| r.expect("writing to a Vec cannot fail");
    out.extend_from_slice(LABEL.as_bytes());
    out.extend_from_slice(b":0");
    let label_at = out.len() - 1;
    let mut logit = BIAS;
    for (j, wj) in DENSE_W.iter().enumerate() {
        let x = (d.normal(j as u64) * 1e4).round() / 1e4;
        logit += wj * x;
        w(write!(out, " {DENSE_NAME}:{x:.4}"));
    }
    for (s, spec) in SLOTS.iter().enumerate() {
        let k = s as u64;
        let len = if d.uniform(200 + k) < spec.empty {
            0
        } else {
            let span = (spec.max_len - spec.min_len + 1) as f64;
            spec.min_len + ((d.uniform(100 + k) * span) as u32).min(spec.max_len - spec.min_len)
        };
        let mut pooled = 0.0;
        for i in 0..len as u64 {
            let r = zipf(d.uniform(1000 * (k + 1) + i), spec.vocab, spec.zipf);
            let id = raw_id(seed, s, r);
            let beta = weight(seed, s, r);
            if spec.pooling == Pooling::WeightedSum {
                let cents = 1 + (d.uniform(1000 * (k + 1) + 500 + i) * 100.0).min(99.0) as u32;
                pooled += beta * cents as f64 / 100.0;
                w(write!(out, " {}:{id}:{}.{:02}", spec.name, cents / 100, cents % 100));
            } else {
                pooled += beta;
                w(write!(out, " {}:{id}", spec.name));
            }
        }
        if spec.pooling == Pooling::Mean && len > 0 {
            pooled /= len as f64;
        }
        logit += pooled;
    }
    out.push(b'\n');
    let p = sigmoid(logit);
    let label = d.uniform(999) < p;
    if label {
        out[label_at] = b'1';
    }
    (label as u8 as f32, p)
}

/// Generates the data set described by `config` (same layout as `oar gen criteo`).
pub fn generate(config: &GenConfig) -> anyhow::Result<SlotsGenReport> {
    let report = write_parts(config, &write_line)?;
    let r = SlotsGenReport {
        report,
        slots: SLOTS.to_vec(),
        dense: DenseColumn { name: DENSE_NAME.into(), width: DENSE_W.len() },
        dense_weights: DENSE_W.to_vec(),
        bias: BIAS,
        data: data_config(),
    };
    write_meta(config, &r)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{parser, Schema};

    fn lines(seed: u64, n: u64) -> (Vec<u8>, Vec<f32>, Vec<f32>) {
        let (mut text, mut labels, mut probs) = (Vec::new(), Vec::new(), Vec::new());
        for line in 0..n {
            let (y, p) = write_line(seed, 2, line, &mut text);
            labels.push(y);
            probs.push(p as f32);
        }
        (text, labels, probs)
    }

    #[test]
    fn lines_are_reproducible_per_seed_and_parse_as_multi_hot() {
        let (a, labels, _) = lines(1, 2000);
        assert_eq!(a, lines(1, 2000).0);
        assert_ne!(a, lines(2, 2000).0);
        let schema = Schema::resolve(&data_config(), None).unwrap();
        let mut p = parser(&schema);
        let mut b = schema.new_batch();
        for line in a.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
            p.parse(line, &mut b).unwrap();
        }
        assert_eq!((b.len(), b.slots, b.dense_width), (2000, 6, 4));
        assert_eq!(b.labels, labels);
        let bag_lens = |s: usize| -> Vec<usize> { (0..b.len()).map(|r| b.bag(r * 6 + s).len()).collect() };
        for (s, spec) in SLOTS.iter().enumerate() {
            let lens = bag_lens(s);
            if spec.max_len == 1 {
                assert!(lens.iter().all(|&n| n == 1), "{} is one-hot", spec.name);
            } else {
                assert!(lens.contains(&0) && lens.iter().any(|&n| n > 1), "{} is multi-hot", spec.name);
                assert!(lens.iter().all(|&n| n <= spec.max_len as usize));
            }
        }
        let query = (0..b.len()).flat_map(|r| b.bag(r * 6 + 5));
        assert!(query.clone().all(|i| b.weight(i) > 0.0 && b.weight(i) <= 1.0));
        assert!(query.clone().any(|i| b.weight(i) < 1.0));
        let hist = (0..b.len()).flat_map(|r| b.bag(r * 6 + 3));
        assert!(hist.clone().all(|i| b.weight(i) == 1.0), "unweighted slots have weight 1");
        let ctr = labels.iter().sum::<f32>() / 2000.0;
        assert!((0.15..0.45).contains(&ctr), "ctr {ctr}");
    }

    #[test]
    fn the_planted_model_separates_the_labels() {
        let (_, labels, probs) = lines(7, 20_000);
        let auc = crate::observe::metrics::auc(&probs, &labels).unwrap();
        assert!(auc > 0.72, "oracle AUC {auc}");
    }

    #[test]
    fn generate_writes_parts_and_a_readable_meta() {
        let dir = tempfile::tempdir().unwrap();
        let config = GenConfig { lines: 300, test_lines: 100, seed: 3, parts: 3, out: dir.path().into() };
        let r = generate(&config).unwrap();
        assert_eq!((r.report.train_lines, r.report.test_lines), (300, 100));
        let meta: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("meta.json")).unwrap()).unwrap();
        let data: DataConfig = serde_json::from_value(meta["data"].clone()).unwrap();
        assert_eq!(data, data_config());
        assert_eq!(meta["slots"][3]["pooling"], "mean");
        assert_eq!(meta["slots"][5]["pooling"], "weighted_sum");
        assert!(meta["oracle_test_auc"].as_f64().unwrap() > 0.5);
        let files = crate::data::list_files(&dir.path().join("train")).unwrap();
        assert_eq!(files.len(), 3);
        let schema = Schema::resolve(&data, None).unwrap();
        let read: usize = crate::data::Reader::spawn(files, crate::data::ReaderConfig::new(&schema, 64))
            .map(|b| b.unwrap().len())
            .sum();
        assert_eq!(read, 300);
    }
}
