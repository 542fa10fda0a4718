//! Async mode's synchronous warm-up: what is left of it in a pass and where the reader starts
//! ([`WarmupPlan`]), and the splitting of reader batches into one synchronous step per trainer
//! ([`Warmup`]); the same cut ([`Split`]) gives `sync_dense` its smaller steps at many trainers,
//! half as large again for the first steps after the warm-up ([`Ramp`]).
//!
//! Async quality comes from two controls, each measured by `oar bench --quality` (docs/src/modes.md has
//! the table). The first `sync_warmup` updates of a run (100 by default) are synchronous: every
//! trainer splits its batch into one part per trainer and pushes each part marked `Merged`,
//! which an async server handles as a sync step, since staleness hurts most while Adam's first
//! steps are large. After them, a push k > 1 updates stale takes a dense step of lr / k
//! (`scale_stale_steps`; the server knows k, and Adam would cancel a scaled gradient, so the step
//! is scaled). Which push gets which treatment is said by the push itself (`protocol::Apply`), so
//! servers need no setting and cannot disagree with trainers. The warm-up's end needs no message:
//! every trainer pushes the same number of merged steps (one whose data ends early sends
//! `EndPass`, as in sync mode), so all leave it at the same update.

use crate::base::batch::Batch;
use crate::data::Reader;
use crate::protocol::Mode;

use super::TrainConfig;

/// What async mode's synchronous warm-up still has to do in a pass, and where the reader starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WarmupPlan {
    /// Merged steps (batch parts) left.
    pub(super) steps: u64,
    /// Parts of the first batch already trained (a trainer rejoining mid-batch).
    pub(super) parts_done: usize,
    /// Samples the reader leaves out.
    pub(super) reader_skip: u64,
}

impl WarmupPlan {
    /// The plan of a pass that is (`first`) or is not the run's first, for a trainer at `step`
    /// that has pushed `samples` of it. A warm-up reader batch is split in one part per trainer
    /// and each part is one step, so a warm-up of `sync_warmup` updates takes
    /// `ceil(sync_warmup / trainers)` whole batches.
    pub(super) fn new(config: &TrainConfig, first: bool, step: u64, samples: u64) -> WarmupPlan {
        let parts = config.trainers as u64;
        let total = if first { warmup_steps(config.mode, config.trainers, config.sync_warmup) } else { 0 };
        if step >= total {
            return WarmupPlan { steps: 0, parts_done: 0, reader_skip: samples };
        }
        // Every warm-up batch before this one was whole and gave `parts` steps.
        WarmupPlan {
            steps: total - step,
            parts_done: (step % parts) as usize,
            reader_skip: step / parts * config.batch_size as u64,
        }
    }
}

/// The steps of a run's synchronous warm-up of `sync_warmup` updates among `trainers`: whole
/// batches, each one step per trainer. Sync mode has none: every step is synchronous, one
/// whole batch each.
pub(super) fn warmup_steps(mode: Mode, trainers: usize, sync_warmup: u64) -> u64 {
    let parts = trainers.max(1) as u64;
    if mode == Mode::Sync {
        return 0;
    }
    sync_warmup.div_ceil(parts) * parts
}

/// `sync_dense`'s first steps after the warm-up (`sync_dense_ramp`): from step `from` up to
/// step `until`, a step holds at most `early` samples, half of the `full` step after them, so
/// that a short run still gives the dense part enough merged updates. The rows, applied per
/// push, keep the full step's scale ([`Ramp::row_scale`]). The trainer's step number decides,
/// not the steps of this process, so a restarted trainer cuts as it would have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Ramp {
    pub(super) from: u64,
    pub(super) until: u64,
    pub(super) early: usize,
    pub(super) full: usize,
}

impl Ramp {
    /// `config`'s ramp: `sync_dense_ramp` steps of half [`TrainConfig::sync_dense_step`].
    pub(super) fn new(config: &TrainConfig) -> Ramp {
        let warmup = warmup_steps(config.mode, config.trainers, config.sync_warmup);
        Ramp::after(warmup, config.sync_dense_ramp, config.batch_size, config.sync_dense_parts)
    }

    /// `steps` steps after a warm-up of `warmup`, each full batch of `batch` cut in twice `parts`.
    fn after(warmup: u64, steps: u64, batch: usize, parts: usize) -> Ramp {
        let parts = parts.max(1);
        Ramp {
            from: warmup,
            until: warmup.saturating_add(steps),
            early: batch.div_ceil(parts.saturating_mul(2)).max(1),
            full: batch.div_ceil(parts).max(1),
        }
    }

    /// What a ramp step `step` of `samples` multiplies its row gradients' sums by: the servers
    /// divide them by the push's samples, and in the ramp they are divided by the full step's
    /// instead, so a row's update per sample stays what it is after the ramp. Measured: with the
    /// rows at the smaller step's scale, their Adagrad sums grew faster in the ramp and slowed
    /// them for the rest of the run (-0.0006 to -0.0007 AUC at 64 trainers on 1M generated
    /// lines, 3 seeds; docs/src/measurements/2026-12-02-real-criteo.md). `None` outside the ramp.
    pub(super) fn row_scale(&self, step: u64, samples: usize) -> Option<f32> {
        let inside = (self.from..self.until).contains(&step) && samples < self.full;
        inside.then(|| samples as f32 / self.full as f32)
    }
}

/// Reader batches cut into near-equal steps: into `parts` each (the warm-up's one part per
/// trainer), or into as few as keep each within the ramp's size for the step (`sync_dense`'s
/// smaller steps at many trainers, [`crate::train::job_config::TrainSettings::sync_dense_parts`];
/// a short last batch is not cut into tiny steps, whose merged updates would be noisy).
pub(super) struct Split {
    pub(super) parts: usize,
    /// Parts of the next batch to leave out (trained before a restart).
    pub(super) parts_done: usize,
    /// Parts of the current batch not trained yet.
    pub(super) queue: std::collections::VecDeque<Batch>,
    /// `sync_dense`'s step sizes, by step number.
    pub(super) ramp: Option<Ramp>,
}

impl Split {
    /// Every batch cut in `parts` (1: whole).
    pub(super) fn parts(parts: usize) -> Split {
        Split { parts: parts.max(1), parts_done: 0, queue: Default::default(), ramp: None }
    }

    /// Batches cut into steps of at most `ramp.early` samples before step `ramp.until`, of at
    /// most `ramp.full` after it.
    pub(super) fn ramped(ramp: Ramp) -> Split {
        Split { ramp: Some(ramp), ..Split::parts(1) }
    }

    /// The most samples a step of a batch that starts at step `step` holds.
    fn at_most_from(&self, step: u64) -> usize {
        match self.ramp {
            Some(r) if step < r.until => r.early,
            Some(r) => r.full,
            None => usize::MAX,
        }
    }

    /// The next part, or `None` at the reader's end; `step` is the trainer's next step.
    pub(super) fn next(&mut self, reader: &mut Reader, step: u64) -> anyhow::Result<Option<Batch>> {
        if self.queue.is_empty() {
            let Some(batch) = reader.next() else { return Ok(None) };
            let batch = batch?;
            let ranges = cut(batch.len(), self.parts, self.at_most_from(step));
            if ranges.len() == 1 {
                return Ok(Some(batch));
            }
            let ranges = ranges.into_iter().skip(std::mem::take(&mut self.parts_done));
            self.queue.extend(ranges.filter(|r| !r.is_empty()).map(|r| batch.slice(r)));
        }
        Ok(self.queue.pop_front())
    }
}

/// The sample ranges of a batch of `n` cut into `parts`, or into more where a part would hold
/// over `at_most` samples. Only a shard's last batch can be shorter than `parts`: some of its
/// ranges are then empty, and skipped.
fn cut(n: usize, parts: usize, at_most: usize) -> Vec<std::ops::Range<usize>> {
    let parts = parts.max(n.div_ceil(at_most.max(1))).max(1);
    (0..parts).map(|k| k * n / parts..(k + 1) * n / parts).collect()
}

/// Async mode's synchronous start: each reader batch is split in one part per trainer, and
/// each part is one synchronous step, so a merged update covers one batch of samples.
pub(super) struct Warmup {
    /// Steps (parts) still to train.
    pub(super) steps: u64,
    pub(super) split: Split,
}

impl Warmup {
    /// The next part, or `None` once the warm-up's steps (or the reader's batches) are used up.
    pub(super) fn next(&mut self, reader: &mut Reader) -> anyhow::Result<Option<Batch>> {
        if self.steps == 0 && self.split.queue.is_empty() {
            return Ok(None);
        }
        // The warm-up's split has no ramp: the step number does not matter to it.
        let part = self.split.next(reader, 0)?;
        if part.is_some() {
            self.steps = self.steps.saturating_sub(1);
        }
        Ok(part)
    }
}

#[cfg(test)]
mod tests {
    use super::{cut, warmup_steps, Mode, Ramp, Split};

    #[test]
    fn the_warmup_is_whole_batches_of_one_step_per_trainer_and_sync_has_none() {
        assert_eq!(warmup_steps(Mode::Async, 64, 100), 128, "2 batches of 64 steps");
        assert_eq!(warmup_steps(Mode::Async, 4, 100), 100);
        assert_eq!(warmup_steps(Mode::Async, 0, 3), 3, "no trainers counts as one");
        assert_eq!(warmup_steps(Mode::Sync, 64, 100), 0);
        assert_eq!(warmup_steps(Mode::Async, 16, 0), 0);
    }

    #[test]
    fn the_ramp_halves_the_steps_after_the_warmup_by_step_number() {
        // 64 trainers of 512, merged steps of 4,096: 8 parts of 64 samples, 32 in the ramp.
        let ramp = Ramp::after(128, 25, 512, 8);
        assert_eq!(ramp, Ramp { from: 128, until: 153, early: 32, full: 64 });
        let split = Split::ramped(ramp);
        let sizes: Vec<usize> = [128, 152, 153, 10_000].into_iter().map(|s| split.at_most_from(s)).collect();
        assert_eq!(sizes, [32, 32, 64, 64], "a restarted trainer at step 152 still cuts small");
        let lens = |r: Vec<std::ops::Range<usize>>| r.into_iter().map(|r| r.len()).collect::<Vec<_>>();
        assert_eq!(lens(cut(512, 1, split.at_most_from(140))), [32; 16]);
        // 8 trainers: whole batches of 512, halves in the ramp; none with `sync_dense_ramp` 0.
        assert_eq!(Ramp::after(104, 25, 512, 1).early, 256);
        let none = Split::ramped(Ramp::after(104, 0, 512, 1));
        assert_eq!(
            (none.at_most_from(103), none.at_most_from(104)),
            (256, 512),
            "the warm-up's steps are not this split's"
        );
        // The rows of a ramp step are scaled to the full step; before and after it, not.
        let scales: Vec<_> =
            [(127, 32), (128, 32), (152, 20), (152, 64), (153, 32)].map(|(s, n)| ramp.row_scale(s, n)).into();
        assert_eq!(scales, [None, Some(0.5), Some(0.3125), None, None]);
        // Steps of one sample stay one sample.
        assert_eq!(Split::ramped(Ramp::after(0, 5, 512, 512)).at_most_from(0), 1);
    }

    #[test]
    fn batches_are_cut_in_parts_or_in_steps_of_at_most_a_size() {
        let lens = |r: Vec<std::ops::Range<usize>>| r.into_iter().map(|r| r.len()).collect::<Vec<_>>();
        assert_eq!(lens(cut(512, 1, usize::MAX)), [512]);
        assert_eq!(lens(cut(512, 4, usize::MAX)), [128; 4], "the warm-up: a part per trainer");
        assert_eq!(lens(cut(2, 4, usize::MAX)), [0, 1, 0, 1], "a short last batch: empty parts");
        assert_eq!(lens(cut(512, 1, 128)), [128; 4], "sync_dense's steps");
        assert_eq!(lens(cut(512, 1, 171)), [170, 171, 171]);
        assert_eq!(lens(cut(18, 1, 128)), [18], "a short last batch is not cut into tiny steps");
        assert_eq!(lens(cut(265, 1, 64)), [53; 5]);
    }
}
