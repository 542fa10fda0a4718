//! Async mode's synchronous warm-up: what is left of it in a pass and where the reader starts
//! ([`WarmupPlan`]), and the splitting of reader batches into one synchronous step per trainer
//! ([`Warmup`]); the same cut ([`Split`]) gives `sync_dense` its smaller steps at many trainers.
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
        // Sync mode has no warm-up: every step is synchronous, one whole batch each.
        let warms = first && config.mode != Mode::Sync;
        let total = if warms { config.sync_warmup.div_ceil(parts) * parts } else { 0 };
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

/// Reader batches cut into near-equal steps: into `parts` each (the warm-up's one part per
/// trainer), or into as few as keep each within `at_most` samples (`sync_dense`'s smaller steps
/// at many trainers, [`crate::train::job_config::TrainSettings::sync_dense_parts`]; a short last
/// batch is not cut into tiny steps, whose merged updates would be noisy).
pub(super) struct Split {
    pub(super) parts: usize,
    pub(super) at_most: usize,
    /// Parts of the next batch to leave out (trained before a restart).
    pub(super) parts_done: usize,
    /// Parts of the current batch not trained yet.
    pub(super) queue: std::collections::VecDeque<Batch>,
}

impl Split {
    /// Every batch cut in `parts` (1: whole).
    pub(super) fn parts(parts: usize) -> Split {
        Split { parts: parts.max(1), at_most: usize::MAX, parts_done: 0, queue: Default::default() }
    }

    /// Batches cut into steps of at most `at_most` samples.
    pub(super) fn at_most(at_most: usize) -> Split {
        Split { at_most: at_most.max(1), ..Split::parts(1) }
    }

    /// The next part, or `None` at the reader's end.
    pub(super) fn next(&mut self, reader: &mut Reader) -> anyhow::Result<Option<Batch>> {
        if self.queue.is_empty() {
            let Some(batch) = reader.next() else { return Ok(None) };
            let batch = batch?;
            let ranges = cut(batch.len(), self.parts, self.at_most);
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
        let part = self.split.next(reader)?;
        if part.is_some() {
            self.steps = self.steps.saturating_sub(1);
        }
        Ok(part)
    }
}

#[cfg(test)]
mod tests {
    use super::cut;

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
