//! `oar gen sequences`: behaviour-sequence lines in PaddleRec's DIN format
//! (`hist_items;hist_cates;target_item;target_cate;label`, histories oldest first) from a
//! planted model whose effect a pooled history cannot show directly: the click depends on how
//! much of the user's history shares the candidate's category, an interaction between each
//! behaviour and the candidate (what DIN's target attention computes), not on the history's
//! average. Built like [`super::gen`]: every draw a pure function of (seed, stream, line), the
//! planted model's test AUC in `meta.json`.
//!
//! A line is one user and one candidate:
//! - 200 categories of 100 items each (item `c * 100 + k` is in category `c`; ranks within a
//!   category are Zipf(1.1));
//! - the user has 2 interest categories (uniform); the history has 5..=40 behaviours (uniform),
//!   each from an interest category with probability 0.8, else from any category;
//! - the candidate comes from an interest category with probability 0.5, else from any;
//! - `logit = -2 + 6 * share + item_bias`, `share` the fraction of the history in the
//!   candidate's category, `item_bias` normal with standard deviation 0.3 per item.

use std::io::Write;

use serde::Serialize;

use super::gen::{write_meta, write_parts, zipf, Draws, GenConfig, GenReport};
use crate::layout::mix64;

/// Categories.
pub const CATEGORIES: u32 = 200;
/// Items per category.
pub const ITEMS_PER_CATEGORY: u32 = 100;
/// Interest categories per user.
pub const INTERESTS: u32 = 2;
/// History lengths (uniform, inclusive).
pub const HISTORY: (u32, u32) = (5, 40);
/// Planted bias.
pub const BIAS: f64 = -2.0;
/// Planted weight of the share of the history in the candidate's category.
pub const SHARE_WEIGHT: f64 = 6.0;
/// Standard deviation of the planted per-item bias.
pub const ITEM_STD: f64 = 0.3;

/// What `oar gen sequences` wrote: the usual report and the planted model's constants.
#[derive(Clone, Debug, Serialize)]
pub struct SequencesGenReport {
    /// Lines, CTR, oracle AUC and log-loss.
    #[serde(flatten)]
    pub report: GenReport,
    /// Categories, items per category, interests, history lengths, bias, share weight and
    /// item-bias spread, as in the module's documentation.
    pub planted: serde_json::Value,
}

/// A category and an item drawn from it (rank Zipf within the category).
fn item(d: &Draws, k: u64, category: u32) -> u32 {
    category * ITEMS_PER_CATEGORY + zipf(d.uniform(k), ITEMS_PER_CATEGORY, 1.1)
}

/// The planted bias of item `i`.
fn item_bias(seed: u64, i: u32) -> f64 {
    let d = Draws { base: mix64(seed ^ 0x17e3 ^ mix64(i as u64)) };
    ITEM_STD * d.normal(0)
}

/// Writes line `line` of `stream` into `out` and returns (label, planted probability).
fn write_line(seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    let d = Draws::new(seed ^ 0x5e9, stream, line);
    let w = |r: std::io::Result<()>| r.expect("writing to a Vec cannot fail");
    let any = |k: u64| ((d.uniform(k) * CATEGORIES as f64) as u32).min(CATEGORIES - 1);
    let interests: Vec<u32> = (0..INTERESTS as u64).map(|k| any(10 + k)).collect();
    let pick = |k: u64, p: f64| {
        if d.uniform(k) < p {
            interests[((d.uniform(k + 1) * INTERESTS as f64) as usize).min(INTERESTS as usize - 1)]
        } else {
            any(k + 2)
        }
    };
    let span = HISTORY.1 - HISTORY.0 + 1;
    let len = HISTORY.0 + ((d.uniform(1) * span as f64) as u32).min(span - 1);
    let history: Vec<(u32, u32)> = (0..len as u64)
        .map(|i| {
            let c = pick(1000 + 4 * i, 0.8);
            (item(&d, 5000 + i, c), c)
        })
        .collect();
    let target_category = pick(20, 0.5);
    let target = item(&d, 30, target_category);
    let share = history.iter().filter(|(_, c)| *c == target_category).count() as f64 / len as f64;
    let logit = BIAS + SHARE_WEIGHT * share + item_bias(seed, target);
    let p = 1.0 / (1.0 + (-logit).exp());
    let label = d.uniform(999) < p;
    let items: Vec<String> = history.iter().map(|(i, _)| i.to_string()).collect();
    let cats: Vec<String> = history.iter().map(|(_, c)| c.to_string()).collect();
    w(writeln!(out, "{};{};{target};{target_category};{}", items.join(" "), cats.join(" "), label as u8));
    (label as u8 as f32, p)
}

/// Generates the data set described by `config` (same layout as `oar gen criteo`).
pub fn generate(config: &GenConfig) -> anyhow::Result<SequencesGenReport> {
    let report = write_parts(config, write_line)?;
    let planted = serde_json::json!({
        "categories": CATEGORIES,
        "items_per_category": ITEMS_PER_CATEGORY,
        "interests": INTERESTS,
        "history": [HISTORY.0, HISTORY.1],
        "bias": BIAS,
        "share_weight": SHARE_WEIGHT,
        "item_std": ITEM_STD,
        "format": "hist_items;hist_cates;target_item;target_cate;label (PaddleRec's DIN sample format)",
    });
    let r = SequencesGenReport { report, planted };
    write_meta(config, &r)?;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(seed: u64, n: u64) -> (String, Vec<f32>, Vec<f32>) {
        let (mut text, mut labels, mut probs) = (Vec::new(), Vec::new(), Vec::new());
        for line in 0..n {
            let (y, p) = write_line(seed, 2, line, &mut text);
            labels.push(y);
            probs.push(p as f32);
        }
        (String::from_utf8(text).unwrap(), labels, probs)
    }

    #[test]
    fn lines_are_reproducible_and_in_paddlerecs_din_format() {
        let (a, labels, _) = lines(1, 2000);
        assert_eq!(a, lines(1, 2000).0);
        assert_ne!(a, lines(2, 2000).0);
        for (line, y) in a.lines().zip(&labels) {
            let f: Vec<&str> = line.split(';').collect();
            assert_eq!(f.len(), 5, "{line}");
            let items: Vec<u32> = f[0].split(' ').map(|v| v.parse().unwrap()).collect();
            let cats: Vec<u32> = f[1].split(' ').map(|v| v.parse().unwrap()).collect();
            assert!((5..=40).contains(&items.len()) && items.len() == cats.len(), "{line}");
            for (i, c) in items.iter().zip(&cats) {
                assert_eq!(i / ITEMS_PER_CATEGORY, *c, "an item's category is fixed: {line}");
            }
            let (t, tc): (u32, u32) = (f[2].parse().unwrap(), f[3].parse().unwrap());
            assert_eq!(t / ITEMS_PER_CATEGORY, tc);
            assert_eq!(f[4].parse::<f32>().unwrap(), *y);
        }
        let ctr = labels.iter().sum::<f32>() / 2000.0;
        assert!((0.2..0.5).contains(&ctr), "ctr {ctr}");
    }

    #[test]
    fn the_planted_model_separates_the_labels() {
        let (_, labels, probs) = lines(7, 20_000);
        let auc = crate::metrics::auc(&probs, &labels).unwrap();
        assert!(auc > 0.75, "oracle AUC {auc}");
    }
}
