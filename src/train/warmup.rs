//! Async mode's synchronous warm-up: what is left of it in a pass and where the reader starts
//! ([`WarmupPlan`]), and the splitting of reader batches into one synchronous step per trainer
//! ([`Warmup`]).
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

/// Async mode's synchronous start: each reader batch is split in `parts` (one per trainer),
/// and each part is one synchronous step, so a merged update covers one batch of samples.
pub(super) struct Warmup {
    /// Steps (parts) still to train.
    pub(super) steps: u64,
    pub(super) parts: usize,
    /// Parts of the next batch to leave out (trained before a restart).
    pub(super) parts_done: usize,
    /// Parts of the current batch not trained yet.
    pub(super) queue: std::collections::VecDeque<Batch>,
}

impl Warmup {
    /// The next part, or `None` once the warm-up's steps (or the reader's batches) are used up.
    pub(super) fn next(&mut self, reader: &mut Reader) -> anyhow::Result<Option<Batch>> {
        if self.queue.is_empty() && self.steps > 0 {
            let Some(batch) = reader.next() else { return Ok(None) };
            let batch = batch?;
            let n = batch.len();
            // Only a shard's last batch can be shorter than `parts`: its empty parts are skipped.
            let ranges = (0..self.parts).map(|k| k * n / self.parts..(k + 1) * n / self.parts);
            let ranges = ranges.skip(std::mem::take(&mut self.parts_done));
            self.queue.extend(ranges.filter(|r| !r.is_empty()).map(|r| batch.slice(r)));
        }
        let part = self.queue.pop_front();
        if part.is_some() {
            self.steps = self.steps.saturating_sub(1);
        }
        Ok(part)
    }
}
