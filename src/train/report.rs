//! What a trainer reports: per pass ([`PassReport`], [`HeadReport`]), per run
//! ([`TrainReport`]), and where the training loop's time went ([`StepTimes`]).

use serde::{Deserialize, Serialize};

use crate::observe::metrics::{EvalReport, Staleness};

/// What one pass did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PassReport {
    /// Pass number (1-based).
    pub pass: u32,
    /// Training metrics over the pass (predictions made before each update).
    pub train: EvalReport,
    /// Test metrics after the pass (trainer 0 only, when test files are given).
    pub test: Option<EvalReport>,
    /// With several heads: every head's figures, the first one's being `train` and `test`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heads: Vec<HeadReport>,
    /// The pass's training AUC over every trainer's samples (the first head), bucketed as
    /// Paddle computes it (`fleet.metrics.auc`) and merged on server 0; `train.auc` is this
    /// trainer's own, exact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_trainers: Option<AllTrainersAuc>,
}

/// A pass's training AUC over all trainers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AllTrainersAuc {
    /// Paddle's bucketed AUC of the merged histogram.
    pub auc: Option<f64>,
    /// Samples in the histogram.
    pub samples: u64,
    /// Trainers whose histograms it merges.
    pub trainers: Vec<u64>,
    /// MAE, RMSE, predicted and actual CTR and COPC over the same samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<crate::observe::metrics::CtrBundle>,
}

impl AllTrainersAuc {
    /// The figures of `buckets`, the histograms of `trainers` merged.
    pub fn of(buckets: &crate::observe::metrics::AucBuckets, trainers: Vec<u64>) -> AllTrainersAuc {
        AllTrainersAuc { auc: buckets.auc(), samples: buckets.samples(), trainers, errors: buckets.bundle() }
    }
}

impl std::fmt::Display for AllTrainersAuc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.auc {
            Some(auc) => write!(f, "AUC {auc:.4}")?,
            None => write!(f, "AUC -")?,
        }
        if let Some(e) = &self.errors {
            let copc = e.copc.map_or("-".to_string(), |c| format!("{c:.4}"));
            write!(
                f,
                ", MAE {:.4}, RMSE {:.4}, predicted CTR {:.4} (actual {:.4}), COPC {copc}",
                e.mae, e.rmse, e.predicted_ctr, e.actual_ctr
            )?;
        }
        Ok(())
    }
}

/// One head's figures over a pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadReport {
    /// The head's output tensor.
    pub output: String,
    /// Training metrics over the pass.
    pub train: EvalReport,
    /// Test metrics after the pass.
    pub test: Option<EvalReport>,
}

/// What a trainer did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainReport {
    /// Trainer id.
    pub trainer: usize,
    /// Samples trained on.
    pub samples: u64,
    /// Seconds spent in training steps (excluding start-up, saving and evaluation).
    pub train_seconds: f64,
    /// Seconds from start to finish.
    pub wall_seconds: f64,
    /// Per-pass results.
    pub passes: Vec<PassReport>,
    /// Where the training loop's time went.
    pub time: StepTimes,
    /// Pushes discarded: by the servers as stale (async mode), or in local mode steps left out
    /// for a NaN, an infinity or a value beyond ±1e18 (`--nonfinite skip`).
    pub discarded_pushes: u64,
    /// How many updates behind this trainer's pushes arrived (async; local with a delay).
    #[serde(default)]
    pub staleness: Staleness,
    /// Data lines skipped as bad.
    pub bad_lines: u64,
    /// Steps whose gradients were scaled down by `clip_grad_norm`.
    #[serde(default)]
    pub clipped_steps: u64,
    /// Online training, trainer 0: every day's figures.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<DayReport>,
}

/// One day of online training, as trainer 0 saw it at the day's end.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct DayReport {
    /// The day, `YYYYMMDD`.
    pub date: String,
    /// The day's last pass: training AUC over every trainer's samples (Paddle's buckets).
    pub train_auc: Option<f64>,
    /// The day's model on the next day's first split, before training on it (none after the
    /// last day).
    pub next_day: Option<EvalReport>,
    /// Rows the day's shrink deleted.
    pub shrunk_rows: u64,
    /// Per server after the shrink: rows held (all tables).
    pub rows: Vec<u64>,
    /// Per server: resident memory, bytes.
    pub rss_bytes: Vec<u64>,
    /// Per server: peak resident memory so far, bytes.
    pub peak_rss_bytes: Vec<u64>,
}

/// Seconds spent in each phase of the training loop, summed over steps.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
pub struct StepTimes {
    /// Waiting for the reader's next batch.
    pub data: f64,
    /// Deduplicating ids and pulling parameters.
    pub pull: f64,
    /// Forward and backward.
    pub compute: f64,
    /// Pushing gradients (including the sync barrier).
    pub push: f64,
}

impl std::ops::AddAssign for StepTimes {
    fn add_assign(&mut self, o: StepTimes) {
        self.data += o.data;
        self.pull += o.pull;
        self.compute += o.compute;
        self.push += o.push;
    }
}

impl PassReport {
    /// The curve points of this pass's end, by trainer `trainer` after `step` steps and
    /// `samples` samples, `seconds` into its run: its pass figures, the AUC over all trainers,
    /// the test set's (trainer 0) and the next day's (online training).
    pub fn curve_points(
        &self,
        trainer: u32,
        step: u64,
        samples: u64,
        seconds: f64,
        next_day: Option<&EvalReport>,
    ) -> Vec<crate::observe::curves::Point> {
        use crate::observe::curves::{Kind, Point};
        let at = |kind, loss: Option<f64>, auc| Point {
            trainer,
            pass: self.pass,
            step,
            samples,
            seconds,
            kind,
            loss: loss.filter(|l| l.is_finite()),
            auc,
        };
        let mut points = vec![at(Kind::Pass, Some(self.train.loss), self.train.auc)];
        if let Some(a) = &self.all_trainers {
            points.push(at(Kind::AllTrainers, None, a.auc));
        }
        for (kind, e) in [(Kind::Test, self.test.as_ref()), (Kind::NextDay, next_day)] {
            if let Some(e) = e {
                points.push(at(kind, Some(e.loss), e.auc));
            }
        }
        points
    }
}
