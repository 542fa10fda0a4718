//! Row statistics and the rules on them, as PaddlePaddle's `CtrCommonAccessor` defines them:
//! every row counts the shows and clicks pushed for it, the days since it was last pushed and a
//! delta score since the last delta save; `shrink` decays the counts and says which rows to
//! delete; the score ranks rows for eviction and the save rules say which rows a base or a delta
//! save for serving keeps; an optional threshold holds back a row's `embedx` part (every weight
//! after the first) until the row has been seen enough. Pure functions on a row's four statistics
//! floats.
//!
//! A show is one occurrence of the id in a sample; a click is that sample's label of the model's
//! first log-loss head (0 or 1, or a soft label). A model with no log-loss head (regression,
//! softmax) pushes no clicks, so a row's score is `nonclk_coeff * show`: how often it was seen.
//!
//! The statistics live inside the row, after its weights, in the cache line a pull reads
//! (`mem/rows.rs`), so an `embedx_threshold` costs pulls nothing more; the unseen days too where
//! the line has room. Pushes carry each id's shows and clicks beside its gradient sum, counted by
//! the trainer from the batch and summed in trainer order by a sync step like the gradients:
//! Paddle carries them the same way, as the first floats of its push value.

use serde::{Deserialize, Serialize};

/// Floats of statistics in every row's state: show, click, delta score, unseen days.
pub const STATS: usize = 4;
const SHOW: usize = 0;
const CLICK: usize = 1;
const DELTA: usize = 2;
const UNSEEN: usize = 3;

/// A table's statistics rules, named and defaulted as Paddle's `ctr_accessor_param` is by
/// `the_one_ps.py` (what a Fleet user gets without setting them).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Accessor {
    /// Weight of a show without a click in the score.
    pub nonclk_coeff: f32,
    /// Weight of a click in the score.
    pub click_coeff: f32,
    /// Factor on show and click at each shrink.
    pub show_click_decay_rate: f32,
    /// A shrink deletes rows whose score is below this.
    pub delete_threshold: f32,
    /// A shrink deletes rows unseen for more days than this.
    pub delete_after_unseen_days: f32,
    /// Rows whose score is below this read and train only their first weight (Paddle's
    /// `embed_w`); the rest (`embedx`) reads as zeros until the row is seen enough. 0: off.
    pub embedx_threshold: f32,
    /// A base or delta save keeps rows whose score reaches this.
    pub base_threshold: f32,
    /// A delta save keeps rows whose delta score reaches this.
    pub delta_threshold: f32,
    /// A delta save keeps rows unseen for at most this many days.
    pub delta_keep_days: f32,
}

impl Default for Accessor {
    fn default() -> Self {
        Accessor {
            nonclk_coeff: 0.1,
            click_coeff: 1.0,
            show_click_decay_rate: 1.0,
            delete_threshold: 0.0,
            delete_after_unseen_days: 30.0,
            embedx_threshold: 0.0,
            base_threshold: 0.0,
            delta_threshold: 0.0,
            delta_keep_days: 16.0,
        }
    }
}

/// What a shrink decided for one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The row stays.
    Keep,
    /// The row's score fell below `delete_threshold`.
    LowScore,
    /// The row was unseen for more than `delete_after_unseen_days`.
    Unseen,
}

impl Accessor {
    /// Checks the numbers: finite, the decay in (0, 1], days and thresholds not negative.
    pub fn validate(&self, table: &str) -> Result<(), String> {
        let all = [
            self.nonclk_coeff,
            self.click_coeff,
            self.show_click_decay_rate,
            self.delete_threshold,
            self.delete_after_unseen_days,
            self.embedx_threshold,
            self.base_threshold,
            self.delta_threshold,
            self.delta_keep_days,
        ];
        if all.iter().any(|v| !v.is_finite()) {
            return Err(format!("sparse table {table}: accessor values must be finite: {self:?}"));
        }
        if !(self.show_click_decay_rate > 0.0 && self.show_click_decay_rate <= 1.0) {
            return Err(format!(
                "sparse table {table}: show_click_decay_rate {} is not in (0, 1]",
                self.show_click_decay_rate
            ));
        }
        if self.delete_after_unseen_days < 0.0 || self.delta_keep_days < 0.0 {
            return Err(format!("sparse table {table}: day counts must not be negative"));
        }
        Ok(())
    }

    /// Paddle's `ShowClickScore`: `nonclk_coeff * (show - click) + click_coeff * click`.
    #[inline]
    pub fn score(&self, show: f32, click: f32) -> f32 {
        self.nonclk_coeff * (show - click) + self.click_coeff * click
    }

    /// A row's score from its statistics.
    #[inline]
    pub fn row_score(&self, stats: &[f32]) -> f32 {
        self.score(stats[SHOW], stats[CLICK])
    }

    /// A push of `show` occurrences and `click` clicks (Paddle's `Update`): the counts and the
    /// delta score grow, and the row was seen today.
    #[inline]
    pub fn update(&self, stats: &mut [f32], show: f32, click: f32) {
        stats[SHOW] += show;
        stats[CLICK] += click;
        stats[DELTA] += self.score(show, click);
        stats[UNSEEN] = 0.0;
    }

    /// Whether the row's `embedx` part is live (always, with no threshold).
    #[inline]
    pub fn embedx_live(&self, stats: &[f32]) -> bool {
        self.embedx_threshold <= 0.0 || self.row_score(stats) >= self.embedx_threshold
    }

    /// One shrink of one row (Paddle's `Shrink`), after `days` more days have passed (0 for a
    /// shrink within the day): unseen days grow by `days`, show and click decay, and the row
    /// is deleted when its score is below `delete_threshold` or it was unseen too long.
    pub fn shrink(&self, stats: &mut [f32], days: u32) -> Verdict {
        stats[UNSEEN] += days as f32;
        stats[SHOW] *= self.show_click_decay_rate;
        stats[CLICK] *= self.show_click_decay_rate;
        if self.row_score(stats) < self.delete_threshold {
            Verdict::LowScore
        } else if stats[UNSEEN] > self.delete_after_unseen_days {
            Verdict::Unseen
        } else {
            Verdict::Keep
        }
    }

    /// Whether a base save keeps the row: its score reaches `base_threshold`.
    pub fn in_base(&self, stats: &[f32]) -> bool {
        self.row_score(stats) >= self.base_threshold
    }

    /// Whether a delta save keeps the row (Paddle's save mode 1): pushed since the last save
    /// (a positive delta score) by at least `delta_threshold`, in the base, and seen within
    /// `delta_keep_days`.
    pub fn in_delta(&self, stats: &[f32]) -> bool {
        stats[DELTA] > 0.0
            && stats[DELTA] >= self.delta_threshold
            && self.in_base(stats)
            && stats[UNSEEN] <= self.delta_keep_days
    }

    /// A shrink changed what a save writes of the row (its `embedx` part went dead): the next
    /// delta carries it, as though it had been pushed (Paddle's rule for rows seen more than
    /// `delta_keep_days` ago still keeps it out).
    pub fn changed(&self, stats: &mut [f32]) {
        stats[DELTA] = stats[DELTA].max(self.delta_threshold).max(f32::MIN_POSITIVE);
    }

    /// After a save that kept the row: its delta score starts again.
    pub fn saved(stats: &mut [f32]) {
        stats[DELTA] = 0.0;
    }

    /// The statistics of a new row: nothing seen yet.
    pub fn init(stats: &mut [f32]) {
        stats[..STATS].fill(0.0);
    }
}

/// A row's statistics, for tools and tests.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RowStats {
    /// Shows, decayed by each shrink.
    pub show: f32,
    /// Clicks, decayed by each shrink.
    pub click: f32,
    /// Score gathered since the last delta save.
    pub delta_score: f32,
    /// Days since the row was last pushed.
    pub unseen_days: f32,
}

impl RowStats {
    /// Reads the statistics at the front of a row's state.
    pub fn of(stats: &[f32]) -> RowStats {
        RowStats { show: stats[SHOW], click: stats[CLICK], delta_score: stats[DELTA], unseen_days: stats[UNSEEN] }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paddle_online() -> Accessor {
        // PaddleRec's online config values.
        Accessor {
            show_click_decay_rate: 0.98,
            delete_threshold: 0.8,
            base_threshold: 1.5,
            delta_threshold: 0.25,
            embedx_threshold: 10.0,
            ..Accessor::default()
        }
    }

    #[test]
    fn defaults_are_the_ones_fleet_sets() {
        let a = Accessor::default();
        assert_eq!((a.nonclk_coeff, a.click_coeff, a.show_click_decay_rate), (0.1, 1.0, 1.0));
        assert_eq!((a.delete_threshold, a.delete_after_unseen_days, a.delta_keep_days), (0.0, 30.0, 16.0));
        assert_eq!((a.base_threshold, a.delta_threshold, a.embedx_threshold), (0.0, 0.0, 0.0));
        assert!(a.validate("t").is_ok());
    }

    #[test]
    fn pushes_count_shows_clicks_and_the_delta_score() {
        let a = Accessor::default();
        let mut s = [0.0, 0.0, 0.0, 3.0];
        a.update(&mut s, 4.0, 1.0);
        // 0.1 * (4 - 1) + 1 * 1 = 1.3
        assert_eq!(RowStats::of(&s), RowStats { show: 4.0, click: 1.0, delta_score: 1.3, unseen_days: 0.0 });
        a.update(&mut s, 2.0, 0.0);
        assert_eq!((s[0], s[1]), (6.0, 1.0));
        assert!((s[2] - 1.5).abs() < 1e-6, "1.3 + 0.1 * 2");
        assert!((a.row_score(&s) - 1.5).abs() < 1e-6);
    }

    #[test]
    fn shrink_decays_then_deletes_low_scores_and_long_unseen_rows() {
        let a = paddle_online();
        // show 10, click 0: score 1.0, decayed to 0.98 >= 0.8: kept.
        let mut s = [10.0, 0.0, 0.0, 0.0];
        assert_eq!(a.shrink(&mut s, 1), Verdict::Keep);
        assert_eq!((s[0], s[3]), (9.8, 1.0));
        // show 8.1: score 0.81, decayed 0.7938 < 0.8: deleted.
        let mut s = [8.1, 0.0, 0.0, 0.0];
        assert_eq!(a.shrink(&mut s, 0), Verdict::LowScore);
        // A clicked row is kept however long... until 30 unseen days pass.
        let mut s = [1.0, 1.0, 0.0, 30.0];
        assert_eq!(a.shrink(&mut s, 0), Verdict::Keep, "30 days is not more than 30");
        assert_eq!(a.shrink(&mut s, 1), Verdict::Unseen);
        // A push makes it seen today again.
        a.update(&mut s, 1.0, 0.0);
        assert_eq!(s[3], 0.0);
    }

    #[test]
    fn with_paddles_defaults_a_shrink_only_deletes_rows_unseen_for_30_days() {
        let a = Accessor::default();
        let mut s = [0.0; 4];
        for _ in 0..30 {
            assert_eq!(a.shrink(&mut s, 1), Verdict::Keep);
        }
        assert_eq!(a.shrink(&mut s, 1), Verdict::Unseen);
    }

    #[test]
    fn base_and_delta_saves_keep_the_rows_paddles_rules_name() {
        let a = paddle_online(); // base 1.5, delta 0.25, keep 16 days
        let mut s = [0.0; 4];
        a.update(&mut s, 10.0, 1.0); // score 0.9 + 1 = 1.9, delta 1.9
        assert!(a.in_base(&s) && a.in_delta(&s));
        Accessor::saved(&mut s);
        assert!(a.in_base(&s) && !a.in_delta(&s), "nothing pushed since the save");
        a.update(&mut s, 2.0, 0.0); // delta 0.2 < 0.25
        assert!(!a.in_delta(&s));
        a.update(&mut s, 1.0, 0.0); // delta 0.3
        assert!(a.in_delta(&s));
        s[3] = 17.0;
        assert!(!a.in_delta(&s), "unseen for more than delta_keep_days");
        let mut low = [0.0; 4];
        a.update(&mut low, 10.0, 0.0); // score 1.0 < 1.5
        assert!(!a.in_base(&low) && !a.in_delta(&low));
        // Fleet's defaults: every row is in the base, every pushed row in the delta.
        let d = Accessor::default();
        let mut one = [0.0; 4];
        assert!(d.in_base(&one) && !d.in_delta(&one));
        d.update(&mut one, 1.0, 0.0);
        assert!(d.in_delta(&one));
    }

    #[test]
    fn embedx_waits_for_its_threshold() {
        let a = paddle_online();
        let mut s = [0.0; 4];
        assert!(!a.embedx_live(&s));
        a.update(&mut s, 99.0, 0.0); // 9.9
        assert!(!a.embedx_live(&s));
        a.update(&mut s, 1.0, 0.0); // 10.0
        assert!(a.embedx_live(&s));
        assert!(Accessor::default().embedx_live(&[0.0; 4]));
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let bad = Accessor { show_click_decay_rate: 1.5, ..Accessor::default() };
        assert!(bad.validate("emb").unwrap_err().contains("show_click_decay_rate 1.5"));
        let bad = Accessor { nonclk_coeff: f32::NAN, ..Accessor::default() };
        assert!(bad.validate("emb").unwrap_err().contains("finite"));
    }
}
