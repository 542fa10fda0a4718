//! `oar gen sequences`: behaviour-sequence lines in PaddleRec's DIN format
//! (`hist_items;hist_cates;target_item;target_cate;label`, histories oldest first) from a
//! planted model whose effect a pooled history cannot show directly: the click depends on how
//! much of the user's history shares the candidate's category, an interaction between each
//! behaviour and the candidate (what DIN's target attention computes), not on the history's
//! average. Built like [`crate::data::gen`]: every draw a pure function of (seed, stream, line), the
//! planted model's test AUC in `meta.json`.
//!
//! Two planted effects (`--effect`):
//!
//! **share** (the default). A line is one user and one candidate:
//! - 200 categories of 100 items each (item `c * 100 + k` is in category `c`; ranks within a
//!   category are Zipf(1.1));
//! - the user has 2 interest categories (uniform); the history has 5..=40 behaviours (uniform),
//!   each from an interest category with probability 0.8, else from any category;
//! - the candidate comes from an interest category with probability 0.5, else from any;
//! - `logit = -2 + 6 * share + item_bias`, `share` the fraction of the history in the
//!   candidate's category, `item_bias` normal with standard deviation 0.3 per item.
//!
//! **order**: an effect that no pooling of the history can see, only its order (what a GRU or
//! a transformer with positions computes, DIEN and BST; DIN's attention sums over the positions
//! and is as blind as the mean). Same categories and items; the user's interest moved from an
//! old category to a current one (distinct, uniform):
//! - the history has exactly 20 behaviours: the older 10 each from the old interest with
//!   probability 0.8 (else any category), the recent 10 from the current one likewise;
//! - the candidate comes from the current interest, the old one or any category (1/3 each);
//! - `logit = -2 + 6 * recent_share + item_bias`, `recent_share` the fraction of the *recent*
//!   10 behaviours in the candidate's category. The old and the current interest hold the same
//!   share of the whole history, so a candidate of either looks alike to a pooled history.

use std::io::Write;

use crate::base::layout::mix64;
use crate::data::gen::{sigmoid, write_parts, zipf, Draws, GenConfig, PlantedReport};

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

/// The order effect's history length (the older and the recent half are equal).
pub const ORDER_HISTORY: u32 = 20;

/// Which planted effect `oar gen sequences` writes (see the module's documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Effect {
    /// The click depends on the share of the history in the candidate's category.
    #[default]
    Share,
    /// The click depends on the share of the recent half of the history only.
    Order,
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

/// Any category (uniform), from draw `k`.
fn any(d: &Draws, k: u64) -> u32 {
    ((d.uniform(k) * CATEGORIES as f64) as u32).min(CATEGORIES - 1)
}

/// One of `interests` (uniform) with probability `p`, else any category, from draws `k..k + 3`.
fn pick(d: &Draws, k: u64, p: f64, interests: &[u32]) -> u32 {
    if d.uniform(k) < p {
        let n = interests.len();
        interests[((d.uniform(k + 1) * n as f64) as usize).min(n - 1)]
    } else {
        any(d, k + 2)
    }
}

/// Writes the line and returns (label, planted probability) for the given logit.
fn finish(d: &Draws, history: &[(u32, u32)], target: (u32, u32), logit: f64, out: &mut Vec<u8>) -> (f32, f64) {
    let p = sigmoid(logit);
    let label = d.uniform(999) < p;
    let items: Vec<String> = history.iter().map(|(i, _)| i.to_string()).collect();
    let cats: Vec<String> = history.iter().map(|(_, c)| c.to_string()).collect();
    let (t, tc) = target;
    writeln!(out, "{};{};{t};{tc};{}", items.join(" "), cats.join(" "), label as u8)
        .expect("writing to a Vec cannot fail");
    (label as u8 as f32, p)
}

/// The fraction of `history` in category `c`.
fn share(history: &[(u32, u32)], c: u32) -> f64 {
    history.iter().filter(|(_, h)| *h == c).count() as f64 / history.len() as f64
}

/// Writes line `line` of `stream` (the share effect) into `out` and returns (label, planted
/// probability).
fn write_line(seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    let d = Draws::new(seed ^ 0x5e9, stream, line);
    let interests: Vec<u32> = (0..INTERESTS as u64).map(|k| any(&d, 10 + k)).collect();
    let span = HISTORY.1 - HISTORY.0 + 1;
    let len = HISTORY.0 + ((d.uniform(1) * span as f64) as u32).min(span - 1);
    let history: Vec<(u32, u32)> = (0..len as u64)
        .map(|i| {
            let c = pick(&d, 1000 + 4 * i, 0.8, &interests);
            (item(&d, 5000 + i, c), c)
        })
        .collect();
    let target_category = pick(&d, 20, 0.5, &interests);
    let target = item(&d, 30, target_category);
    let logit = BIAS + SHARE_WEIGHT * share(&history, target_category) + item_bias(seed, target);
    finish(&d, &history, (target, target_category), logit, out)
}

/// Writes line `line` of `stream` with the order effect.
fn write_order_line(seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    let d = Draws::new(seed ^ 0x0bde, stream, line);
    let old = any(&d, 10);
    // The current interest differs from the old one: one of the other categories, uniform.
    let current = (old + 1 + ((d.uniform(11) * (CATEGORIES - 1) as f64) as u32).min(CATEGORIES - 2)) % CATEGORIES;
    let half = ORDER_HISTORY as u64 / 2;
    let history: Vec<(u32, u32)> = (0..ORDER_HISTORY as u64)
        .map(|i| {
            let c = pick(&d, 1000 + 4 * i, 0.8, &[if i < half { old } else { current }]);
            (item(&d, 5000 + i, c), c)
        })
        .collect();
    let target_category = match ((d.uniform(20) * 3.0) as u32).min(2) {
        0 => current,
        1 => old,
        _ => any(&d, 21),
    };
    let target = item(&d, 30, target_category);
    let recent = share(&history[half as usize..], target_category);
    let logit = BIAS + SHARE_WEIGHT * recent + item_bias(seed, target);
    finish(&d, &history, (target, target_category), logit, out)
}

/// Generates the data set described by `config` with the planted `effect` (same layout as
/// `oar gen criteo`).
pub fn generate(config: &GenConfig, effect: Effect) -> anyhow::Result<PlantedReport> {
    let (report, history) = match effect {
        Effect::Share => (write_parts(config, &write_line)?, [HISTORY.0, HISTORY.1]),
        Effect::Order => (write_parts(config, &write_order_line)?, [ORDER_HISTORY; 2]),
    };
    let planted = serde_json::json!({
        "effect": format!("{effect:?}").to_lowercase(),
        "categories": CATEGORIES,
        "items_per_category": ITEMS_PER_CATEGORY,
        "interests": INTERESTS,
        "history": history,
        "bias": BIAS,
        "share_weight": SHARE_WEIGHT,
        "item_std": ITEM_STD,
        "format": "hist_items;hist_cates;target_item;target_cate;label (PaddleRec's DIN sample format)",
    });
    PlantedReport { report, planted }.save(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(seed: u64, n: u64) -> (String, Vec<f32>, Vec<f32>) {
        written(&write_line, seed, n)
    }

    fn written(write: crate::data::gen::WriteLine, seed: u64, n: u64) -> (String, Vec<f32>, Vec<f32>) {
        let (mut text, mut labels, mut probs) = (Vec::new(), Vec::new(), Vec::new());
        for line in 0..n {
            let (y, p) = write(seed, 2, line, &mut text);
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
        let auc = crate::observe::metrics::auc(&probs, &labels).unwrap();
        assert!(auc > 0.75, "oracle AUC {auc}");
    }

    /// (history categories, candidate category) of a line.
    fn parse(line: &str) -> (Vec<u32>, u32) {
        let f: Vec<&str> = line.split(';').collect();
        (f[1].split(' ').map(|v| v.parse().unwrap()).collect(), f[3].parse().unwrap())
    }

    #[test]
    fn the_order_effect_is_in_the_recent_half_and_invisible_to_the_whole_historys_share() {
        let (text, labels, probs) = written(&write_order_line, 3, 30_000);
        assert_eq!(text, written(&write_order_line, 3, 30_000).0);
        let (mut whole, mut recent) = (Vec::new(), Vec::new());
        // Lines whose candidate is one of the user's two interests (old or current): there the
        // whole history's share says nothing of the label, the recent half's says it all.
        let (mut whole_in, mut recent_in, mut labels_in) = (Vec::new(), Vec::new(), Vec::new());
        for (line, y) in text.lines().zip(&labels) {
            let (cats, c) = parse(line);
            assert_eq!(cats.len(), ORDER_HISTORY as usize, "{line}");
            let count = |h: &[u32]| h.iter().filter(|&&x| x == c).count() as f32 / h.len() as f32;
            let (w, r) = (count(&cats), count(&cats[10..]));
            whole.push(w);
            recent.push(r);
            if w >= 0.3 {
                whole_in.push(w);
                recent_in.push(r);
                labels_in.push(*y);
            }
        }
        let auc = |s: &[f32], y: &[f32]| crate::observe::metrics::auc(s, y).unwrap();
        let oracle = auc(&probs, &labels);
        assert!(oracle > 0.85, "oracle AUC {oracle}");
        assert!(auc(&recent, &labels) > auc(&whole, &labels) + 0.1);
        let (w, r) = (auc(&whole_in, &labels_in), auc(&recent_in, &labels_in));
        eprintln!("order effect: oracle {oracle:.4}; candidates of an interest: whole share {w:.4}, recent {r:.4}");
        assert!(labels_in.len() > 10_000 && (w - 0.5).abs() < 0.03 && r > 0.9, "whole {w}, recent {r}");
    }
}
