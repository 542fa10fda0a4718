//! Quality metrics over a pass: the mean loss, and per loss kind exact AUC (ties get their
//! average rank), mean squared error or perplexity.
//!
//! Also the figures that add up across processes: [`AucBuckets`], Paddle's AUC histogram of 4,096
//! buckets, which trainers' histograms add up exactly (the AUC over all trainers), with the sums
//! of absolute error, squared error and predictions that Paddle's `ctr_metric_bundle` adds for MAE,
//! RMSE, predicted CTR and COPC ([`CtrBundle`]); [`EvalReport`], an evaluation's figures by loss
//! (AUC and log-loss with the mean predicted and actual CTR, MSE, perplexity, or a value head's
//! mean loss); and [`Staleness`], a histogram of how many updates behind pushes arrived.

use serde::{Deserialize, Serialize};

/// What a head's output is trained against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Loss {
    /// One logit per sample, binary label, log-loss; quality is AUC and log-loss.
    LogLoss,
    /// One prediction per sample, real label, squared error; quality is the mean squared error.
    Square,
    /// One logit per class, the label is the class index, softmax cross-entropy; quality is
    /// perplexity.
    Softmax,
    /// One value per sample that is itself the sample's loss (a layer's own, as DIEN's
    /// auxiliary loss from `next_item_loss`): minimized as it is, with no label; quality is its
    /// mean. `oar eval` reports it and `oar predict` writes it as a column; `oar serve` leaves it
    /// out, with the slots only it reads; `oar export` refuses a model with such a head, naming
    /// it.
    Value,
}

/// Exact area under the ROC curve of `scores` for binary `labels` (1.0 = positive), by the
/// Mann-Whitney rank statistic with tied scores sharing their average rank. `None` when one
/// class is absent.
pub fn auc(scores: &[f32], labels: &[f32]) -> Option<f64> {
    let mut order: Vec<u32> = (0..scores.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| scores[a as usize].total_cmp(&scores[b as usize]));
    let (mut rank_sum, mut positives) = (0.0f64, 0u64);
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && scores[order[j + 1] as usize] == scores[order[i] as usize] {
            j += 1;
        }
        let avg_rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            if labels[k as usize] > 0.5 {
                rank_sum += avg_rank;
                positives += 1;
            }
        }
        i = j + 1;
    }
    let negatives = scores.len() as u64 - positives;
    if positives == 0 || negatives == 0 {
        return None;
    }
    let (p, n) = (positives as f64, negatives as f64);
    Some((rank_sum - p * (p + 1.0) / 2.0) / (p * n))
}

/// Mean binary log-loss of probabilities `probs`, clipped away from 0 and 1 by 1e-7.
pub fn log_loss(probs: &[f32], labels: &[f32]) -> f64 {
    if probs.is_empty() {
        return f64::NAN;
    }
    let sum: f64 = probs
        .iter()
        .zip(labels)
        .map(|(&p, &y)| {
            let p = (p as f64).clamp(1e-7, 1.0 - 1e-7);
            -(y as f64 * p.ln() + (1.0 - y as f64) * (1.0 - p).ln())
        })
        .sum();
    sum / probs.len() as f64
}

/// Losses, predictions and labels collected over a pass, for exact metrics at its end.
#[derive(Clone, Debug)]
pub struct PassMetrics {
    kind: Loss,
    loss_sum: f64,
    /// Predictions kept for AUC (log-loss models only).
    pub probs: Vec<f32>,
    /// Labels of `probs`.
    pub labels: Vec<f32>,
    samples: usize,
}

impl PassMetrics {
    /// Empty metrics of a model trained with `kind`.
    pub fn new(kind: Loss) -> PassMetrics {
        PassMetrics { kind, loss_sum: 0.0, probs: Vec::new(), labels: Vec::new(), samples: 0 }
    }

    /// Records one batch: its summed loss, predictions and labels.
    pub fn observe(&mut self, loss: f64, probs: &[f32], labels: &[f32]) {
        self.loss_sum += loss;
        self.samples += labels.len();
        if self.kind == Loss::LogLoss {
            self.probs.extend_from_slice(probs);
            self.labels.extend_from_slice(labels);
        }
    }

    /// Number of samples recorded.
    pub fn len(&self) -> usize {
        self.samples
    }

    /// Adds everything `other` recorded (another thread's share of the same pass).
    pub fn merge(&mut self, other: &PassMetrics) {
        self.loss_sum += other.loss_sum;
        self.samples += other.samples;
        self.probs.extend_from_slice(&other.probs);
        self.labels.extend_from_slice(&other.labels);
    }

    /// True if nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.samples == 0
    }

    /// The figures over everything recorded.
    pub fn report(&self) -> EvalReport {
        EvalReport {
            samples: self.samples,
            loss_kind: self.kind,
            loss: if self.samples == 0 { f64::NAN } else { self.loss_sum / self.samples as f64 },
            auc: if self.kind == Loss::LogLoss { auc(&self.probs, &self.labels) } else { None },
            ctr: (self.kind == Loss::LogLoss && !self.probs.is_empty()).then(|| {
                let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
                (mean(&self.probs), mean(&self.labels))
            }),
        }
    }
}

/// Buckets of Paddle's AUC: `paddle.static.auc`'s 4095 thresholds give 4096 buckets.
pub const AUC_BUCKETS: usize = 4096;

/// Most samples one trainer's histogram of one pass may count (2^48, hundreds of trillions):
/// far beyond any pass, and low enough that the histograms of every trainer a server admits
/// add up without saturating (two of u64::MAX samples made the merged MAE 2).
pub const MAX_PASS_SAMPLES: u64 = 1 << 48;

/// Paddle's bucketed AUC: per prediction bucket (`floor(p * 4095)`), the positive and negative
/// samples seen. Histograms of several trainers add up exactly, which is how `fleet.metrics.auc`
/// gets one AUC over all trainers' samples; [`AucBuckets::auc`] is its formula. Beside them, the
/// sums PaddleRec's `ctr_metric_bundle` adds over trainers for `fleet.metrics.mae`, `rmse` and
/// the predicted CTR ([`AucBuckets::bundle`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AucBuckets {
    /// Positive samples per bucket.
    pub pos: Vec<u64>,
    /// Negative samples per bucket.
    pub neg: Vec<u64>,
    /// Over the samples counted, the sums of `|p - y|`, `(p - y)^2` and `p`: Paddle's
    /// `abserr`, `sqrerr` and `prob`, with `p` as its bucket reads it (within [0, 1], NaN as 0)
    /// and `y` the label as its bucket reads it (1 above 0.5, else 0).
    #[serde(default)]
    pub sums: [f64; 3],
}

impl Default for AucBuckets {
    fn default() -> AucBuckets {
        AucBuckets { pos: vec![0; AUC_BUCKETS], neg: vec![0; AUC_BUCKETS], sums: [0.0; 3] }
    }
}

/// A pass's error figures over samples, from [`AucBuckets`]' sums (`ctr_metric_bundle`'s).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CtrBundle {
    /// Mean absolute error of the predictions (`fleet.metrics.mae`).
    pub mae: f64,
    /// Root mean squared error (`fleet.metrics.rmse`).
    pub rmse: f64,
    /// Mean prediction.
    pub predicted_ctr: f64,
    /// Share of positive labels.
    pub actual_ctr: f64,
    /// Clicks over predicted clicks, `actual_ctr / predicted_ctr` (PaddleRec's COPC; 1 is
    /// calibrated); `None` when nothing was predicted.
    pub copc: Option<f64>,
}

impl AucBuckets {
    /// The histogram of `probs` with their `labels` (a label above 0.5 is a positive).
    pub fn of(probs: &[f32], labels: &[f32]) -> AucBuckets {
        let mut b = AucBuckets::default();
        for (&p, &l) in probs.iter().zip(labels) {
            // A NaN prediction lands in bucket 0, as Paddle's integer cast puts it.
            let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) as f64 };
            let k = (p * (AUC_BUCKETS - 1) as f64) as usize;
            let y = if l > 0.5 {
                b.pos[k] += 1;
                1.0
            } else {
                b.neg[k] += 1;
                0.0
            };
            let e = p - y;
            b.sums[0] += e.abs();
            b.sums[1] += e * e;
            b.sums[2] += p;
        }
        b
    }

    /// Whether the histogram has Paddle's shape, at most [`MAX_PASS_SAMPLES`] samples, and sums
    /// its buckets allow: each sample's prediction lies within its bucket's width, which
    /// bounds every sum. What a peer sent is checked before use, so a wrong one cannot make
    /// the job's figures NaN, negative, above 1 or contrary to its own histogram.
    pub fn is_valid(&self) -> bool {
        if self.pos.len() != AUC_BUCKETS || self.neg.len() != AUC_BUCKETS || self.samples() > MAX_PASS_SAMPLES {
            return false;
        }
        let (mut lo, mut hi) = ([0.0f64; 3], [0.0f64; 3]);
        let width = 1.0 / (AUC_BUCKETS - 1) as f64;
        for k in 0..AUC_BUCKETS {
            // Predictions of bucket k lie in [a, b]; a positive's error is 1 - p, a negative's p.
            let (a, b) = (k as f64 * width, ((k + 1) as f64 * width).min(1.0));
            let (p, n) = (self.pos[k] as f64, self.neg[k] as f64);
            let bounds = [
                ((1.0 - b) * p + a * n, (1.0 - a) * p + b * n),
                ((1.0 - b).powi(2) * p + a * a * n, (1.0 - a).powi(2) * p + b * b * n),
                (a * (p + n), b * (p + n)),
            ];
            for (i, (l, h)) in bounds.into_iter().enumerate() {
                lo[i] += l;
                hi[i] += h;
            }
        }
        // Float rounding of a sum of this many terms, and f32 predictions at a bucket's edge.
        let slack = 1e-6 * (self.samples() as f64).max(1.0);
        self.sums.iter().enumerate().all(|(i, &s)| s.is_finite() && s >= lo[i] - slack && s <= hi[i] + slack)
    }

    /// Adds `other`'s counts and sums.
    pub fn merge(&mut self, other: &AucBuckets) {
        self.pos.iter_mut().zip(&other.pos).for_each(|(a, b)| *a = a.saturating_add(*b));
        self.neg.iter_mut().zip(&other.neg).for_each(|(a, b)| *a = a.saturating_add(*b));
        self.sums.iter_mut().zip(&other.sums).for_each(|(a, b)| *a += b);
    }

    /// The error figures over the samples counted; `None` without samples.
    pub fn bundle(&self) -> Option<CtrBundle> {
        let n = self.samples();
        if n == 0 {
            return None;
        }
        let (n, positives) = (n as f64, self.pos.iter().fold(0u64, |a, b| a.saturating_add(*b)) as f64);
        let predicted_ctr = self.sums[2] / n;
        let actual_ctr = positives / n;
        Some(CtrBundle {
            mae: self.sums[0] / n,
            rmse: (self.sums[1] / n).sqrt(),
            predicted_ctr,
            actual_ctr,
            // Paddle's `fleet_util` gives no COPC below a predicted CTR of 1e-6 either: a sum
            // of 5e-324 made it infinite.
            copc: (predicted_ctr > 1e-6).then(|| actual_ctr / predicted_ctr),
        })
    }

    /// Samples counted.
    pub fn samples(&self) -> u64 {
        self.pos.iter().chain(&self.neg).fold(0u64, |a, b| a.saturating_add(*b))
    }

    /// `fleet.metrics.auc`: the area under the ROC curve walked from the highest bucket down,
    /// samples of one bucket counting as ties; `None` without both classes.
    pub fn auc(&self) -> Option<f64> {
        let (mut area, mut pos, mut neg) = (0.0f64, 0.0f64, 0.0f64);
        for k in (0..self.pos.len().min(self.neg.len())).rev() {
            let (new_pos, new_neg) = (pos + self.pos[k] as f64, neg + self.neg[k] as f64);
            area += (new_neg - neg) * (pos + new_pos) / 2.0;
            (pos, neg) = (new_pos, new_neg);
        }
        (pos > 0.0 && neg > 0.0).then(|| area / (pos * neg))
    }
}

/// How many updates old the parameters behind each push were when the push arrived (async
/// staleness), counted per value; the last bucket holds everything from `BUCKETS - 1` up.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Staleness(pub Vec<u64>);

impl Staleness {
    /// Buckets kept: one per update behind up to 255, so that a job of 64 trainers, whose
    /// pushes are kept up to `lag_ratio` (2.5) x 64 = 160 updates behind, is counted exactly.
    pub const BUCKETS: usize = 256;

    /// Counts one push `updates` behind.
    pub fn add(&mut self, updates: u64) {
        let b = (updates as usize).min(Self::BUCKETS - 1);
        if self.0.len() <= b {
            self.0.resize(b + 1, 0);
        }
        self.0[b] += 1;
    }

    /// Adds another histogram's counts.
    pub fn merge(&mut self, other: &Staleness) {
        if self.0.len() < other.0.len() {
            self.0.resize(other.0.len(), 0);
        }
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| *a += b);
    }

    /// Pushes counted.
    pub fn count(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The mean staleness (0 over no pushes).
    pub fn mean(&self) -> f64 {
        match self.count() {
            0 => 0.0,
            n => self.0.iter().enumerate().map(|(b, c)| b as f64 * *c as f64).sum::<f64>() / n as f64,
        }
    }

    /// The smallest staleness at or below which a share `q` of the pushes lie.
    fn quantile(&self, q: f64) -> usize {
        let target = (q * self.count() as f64).ceil() as u64;
        let mut seen = 0;
        for (b, n) in self.0.iter().enumerate() {
            seen += n;
            if seen >= target.max(1) {
                return b;
            }
        }
        self.0.len().saturating_sub(1)
    }
}

impl std::fmt::Display for Staleness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.count();
        if n == 0 {
            return write!(f, "no pushes");
        }
        let mean = self.mean();
        let max = self.0.iter().rposition(|c| *c > 0).unwrap_or(0);
        let plus = if max == Self::BUCKETS - 1 { "+" } else { "" };
        let counts: Vec<String> =
            self.0.iter().enumerate().filter(|(_, c)| **c > 0).map(|(b, c)| format!("{b}:{c}")).collect();
        write!(
            f,
            "mean {mean:.2}, median {}, p90 {}, max {max}{plus} updates behind over {n} pushes ({})",
            self.quantile(0.5),
            self.quantile(0.9),
            counts.join(" ")
        )
    }
}

/// Quality of a model on a set of samples.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EvalReport {
    /// Samples evaluated.
    pub samples: usize,
    /// The model's loss.
    pub loss_kind: Loss,
    /// Mean loss per sample: log-loss, squared error (= MSE) or cross-entropy in nats; NaN
    /// over no samples (a trainer restarted at the end of a pass), which JSON writes as null.
    #[serde(deserialize_with = "nan_from_null")]
    pub loss: f64,
    /// Exact AUC (log-loss models; None if one class is absent).
    pub auc: Option<f64>,
    /// Log-loss models: the mean predicted click probability and the actual click rate
    /// (calibration: a model whose mean prediction is off the actual rate is biased).
    #[serde(default)]
    pub ctr: Option<(f64, f64)>,
}

/// A number that JSON may hold as null (how serde_json writes NaN).
fn nan_from_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(<Option<f64> as serde::Deserialize>::deserialize(d)?.unwrap_or(f64::NAN))
}

impl EvalReport {
    /// Perplexity `exp(cross-entropy)` (softmax models).
    pub fn perplexity(&self) -> Option<f64> {
        (self.loss_kind == Loss::Softmax).then(|| self.loss.exp())
    }

    /// Mean squared error (square-loss models).
    pub fn mse(&self) -> Option<f64> {
        (self.loss_kind == Loss::Square).then_some(self.loss)
    }
}

impl std::fmt::Display for EvalReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.loss_kind {
            Loss::LogLoss => {
                match self.auc {
                    Some(a) => write!(f, "AUC {a:.4} log-loss {:.4}", self.loss)?,
                    None => write!(f, "AUC undefined (one class only) log-loss {:.4}", self.loss)?,
                }
                match self.ctr {
                    Some((predicted, actual)) => write!(f, " predicted CTR {predicted:.4} (actual {actual:.4})"),
                    None => Ok(()),
                }
            }
            Loss::Square => write!(f, "MSE {:.3}", self.loss),
            Loss::Softmax => write!(f, "perplexity {:.2} (cross-entropy {:.4})", self.loss.exp(), self.loss),
            Loss::Value => write!(f, "loss {:.4}", self.loss),
        }
    }
}

/// This process's resident memory and its peak so far, in bytes (`VmRSS`, `VmHWM` of
/// /proc/self/status; zeros where there is none).
pub fn process_memory() -> (u64, u64) {
    status_memory(&std::fs::read_to_string("/proc/self/status").unwrap_or_default())
}

/// Resident memory and its peak (bytes) from the text of a `/proc/<pid>/status` file.
pub fn status_memory(status: &str) -> (u64, u64) {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_over_no_samples_goes_through_json() {
        // A trainer restarted at the very end of a pass trains nothing more in it.
        let empty = PassMetrics::new(Loss::LogLoss).report();
        assert!(empty.loss.is_nan());
        let json = serde_json::to_string(&empty).unwrap();
        let back: EvalReport = serde_json::from_str(&json).unwrap();
        assert!(back.loss.is_nan() && back.samples == 0 && back.auc.is_none(), "{json}");
    }

    #[test]
    fn auc_matches_hand_counts() {
        // Pairs (pos, neg): (0.8,0.1) win, (0.8,0.4) win, (0.35,0.1) win, (0.35,0.4) loss -> 3/4.
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]), Some(0.75));
        // A tie counts one half.
        assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), Some(0.5));
        assert_eq!(auc(&[0.5, 0.7], &[1.0, 1.0]), None);
    }

    #[test]
    fn staleness_histograms_count_merge_and_summarize() {
        let mut a = Staleness::default();
        [0, 2, 2, 3, 400].iter().for_each(|&t| a.add(t));
        let mut b = Staleness::default();
        b.add(1);
        a.merge(&b);
        assert_eq!(a.count(), 6);
        assert_eq!(a.0[255], 1, "400 lands in the last bucket");
        assert_eq!(
            a.to_string(),
            "mean 43.83, median 2, p90 255, max 255+ updates behind over 6 pushes (0:1 1:1 2:2 3:1 255:1)"
        );
        let mut sixty_four = Staleness::default();
        sixty_four.add(63);
        assert_eq!((sixty_four.0[63], sixty_four.mean()), (1, 63.0), "64 trainers' staleness counted exactly");
        assert_eq!((Staleness::default().to_string(), Staleness::default().mean()), ("no pushes".into(), 0.0));
    }

    #[test]
    fn log_loss_of_a_coin_is_ln2() {
        assert!((log_loss(&[0.5, 0.5], &[0.0, 1.0]) - std::f64::consts::LN_2).abs() < 1e-12);
    }

    #[test]
    fn bucketed_auc_is_paddles_and_merges_exactly() {
        // Predictions in distinct buckets: the exact AUC.
        let (probs, labels) = ([0.9f32, 0.8, 0.3, 0.7, 0.1, 0.2], [1.0f32, 0.0, 1.0, 1.0, 0.0, 0.0]);
        let all = AucBuckets::of(&probs, &labels);
        assert!((all.auc().unwrap() - auc(&probs, &labels).unwrap()).abs() < 1e-12);
        // Hand-computed: of 9 (positive, negative) pairs, 0.3 and 0.7 below 0.8 are misordered.
        assert!((all.auc().unwrap() - 7.0 / 9.0).abs() < 1e-12);
        // Two trainers' halves merged give the whole.
        let mut merged = AucBuckets::of(&probs[..3], &labels[..3]);
        merged.merge(&AucBuckets::of(&probs[3..], &labels[3..]));
        assert_eq!((&merged.pos, &merged.neg), (&all.pos, &all.neg));
        assert!(merged.sums.iter().zip(&all.sums).all(|(a, b)| (a - b).abs() < 1e-12));
        assert_eq!(merged.samples(), 6);
        // The error figures by hand: errors 0.1, 0.8, 0.7, 0.3, 0.1, 0.2 (labels 1 0 1 1 0 0).
        let b = merged.bundle().unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
        assert!(close(b.mae, 2.2 / 6.0), "{b:?}");
        assert!(close(b.rmse, (1.28f64 / 6.0).sqrt()), "{b:?}");
        assert!(close(b.predicted_ctr, 3.0 / 6.0) && close(b.actual_ctr, 0.5), "{b:?}");
        assert!(close(b.copc.unwrap(), 1.0), "{b:?}");
        assert_eq!(AucBuckets::default().bundle(), None);
        assert_eq!(AucBuckets::of(&[0.0], &[1.0]).bundle().unwrap().copc, None, "nothing predicted");
        // A NaN prediction counts as 0, as its bucket does.
        assert_eq!(AucBuckets::of(&[f32::NAN], &[1.0]).sums, [1.0, 1.0, 0.0]);
        // Sums no samples can make are refused, and so are sums contrary to the histogram:
        // near-perfect predictions with the errors of the worst ones.
        for sums in [[f64::NAN, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 0.0, 7.0], [6.0, 6.0, 0.0]] {
            assert!(!AucBuckets { sums, ..all.clone() }.is_valid(), "{sums:?}");
        }
        assert!(all.is_valid());
        let sure = AucBuckets::of(&[0.9999; 1000], &[1.0; 1000]);
        assert!(sure.is_valid());
        assert!(!AucBuckets { sums: [1000.0, 1000.0, 0.0], ..sure.clone() }.is_valid());
        let mut huge = AucBuckets::default();
        huge.pos[4095] = u64::MAX;
        assert!(!AucBuckets { sums: [0.0, 0.0, u64::MAX as f64], ..huge }.is_valid(), "beyond 2^48 samples");
        // Random predictions at bucket edges and inside stay valid, whatever the labels.
        let probs: Vec<f32> = (0..5000).map(|i| (i as f32 / 4999.0).powi(3)).collect();
        let labels: Vec<f32> = (0..5000).map(|i| (i % 3 == 0) as u8 as f32).collect();
        assert!(AucBuckets::of(&probs, &labels).is_valid());
        // Two predictions in one bucket (0.50001 and 0.50002) are a tie: half a pair.
        let tied = AucBuckets::of(&[0.50001, 0.50002], &[0.0, 1.0]);
        assert_eq!(tied.auc(), Some(0.5));
        assert_eq!(AucBuckets::of(&[0.4], &[1.0]).auc(), None, "one class only");
        assert!(!AucBuckets { pos: vec![1], neg: vec![], sums: [0.0; 3] }.is_valid());
    }
}
