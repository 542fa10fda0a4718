//! Quality metrics over a pass: exact AUC (ties get their average rank) and log-loss.

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

/// Predictions and labels collected over a pass, for exact metrics at its end.
#[derive(Default, Clone, Debug)]
pub struct PassMetrics {
    /// Predicted probabilities.
    pub probs: Vec<f32>,
    /// Labels.
    pub labels: Vec<f32>,
}

impl PassMetrics {
    /// Records one batch.
    pub fn observe(&mut self, probs: &[f32], labels: &[f32]) {
        self.probs.extend_from_slice(probs);
        self.labels.extend_from_slice(labels);
    }

    /// AUC over everything recorded.
    pub fn auc(&self) -> Option<f64> {
        auc(&self.probs, &self.labels)
    }

    /// Log-loss over everything recorded.
    pub fn log_loss(&self) -> f64 {
        log_loss(&self.probs, &self.labels)
    }

    /// Number of samples recorded.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True if nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auc_matches_hand_counts() {
        // Pairs (pos, neg): (0.8,0.1) win, (0.8,0.4) win, (0.35,0.1) win, (0.35,0.4) loss -> 3/4.
        assert_eq!(auc(&[0.1, 0.4, 0.35, 0.8], &[0.0, 0.0, 1.0, 1.0]), Some(0.75));
        // A tie counts one half.
        assert_eq!(auc(&[0.5, 0.5], &[0.0, 1.0]), Some(0.5));
        assert_eq!(auc(&[0.5, 0.7], &[1.0, 1.0]), None);
    }

    #[test]
    fn log_loss_of_a_coin_is_ln2() {
        assert!((log_loss(&[0.5, 0.5], &[0.0, 1.0]) - std::f64::consts::LN_2).abs() < 1e-12);
    }
}
