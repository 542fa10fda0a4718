//! Which pushes of a trainer a server has handled: a push is known by (trainer, step), and a
//! push sent again (by a restarted trainer, which numbers its batches the same way from its
//! recorded position, or by a client whose connection broke before the reply) is answered with
//! the first one's outcome instead of being applied twice. A [`TrainerLedger`] is a watermark plus
//! a window of the steps handled out of order (at most [`WINDOW`] past it), each with the parts
//! handled and whether it was discarded, and the samples applied or discarded. Pure state: the
//! server keeps one per trainer and writes them into its checkpoints in the same cut as the shard.
//!
//! Exactly once, counted where it is applied: the step is numbered from the trainer's position, so
//! a restart numbers the same batch the same way, and the cut is taken under the update gate, so a
//! restarted server knows exactly which pushes its state holds. `ServerStats` counts per trainer
//! the samples the server applied and discarded; `oar launch` writes every server's counters into
//! `summary.json` (`server_stats`), and the tests check those, not what the trainers say they sent.
//! A server's own restart still loses the updates since its checkpoint: trainers resend only their
//! unanswered push.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::protocol::PushPart;

/// The dense half of a step (or the whole step's dense part) has been handled.
const DENSE: u8 = 1;
/// The sparse half has been handled.
const SPARSE: u8 = 2;
/// The step was discarded as too stale (async), not applied.
const DISCARDED: u8 = 4;
/// A copy of the step was skipped as non-finite (counted once, whatever copies come).
const NONFINITE: u8 = 8;

/// How far out of order a trainer's pushes may arrive: Hogwild threads push concurrently, at
/// most one step each in flight, so a few steps. A push this many steps or more past the oldest
/// step not yet handled is refused (never the watermark moved past work not done): a step from
/// the far future cannot make the real ones count as repeats.
pub const WINDOW: usize = 4096;

fn bits(part: PushPart) -> u8 {
    match part {
        PushPart::Whole => DENSE | SPARSE,
        PushPart::Dense => DENSE,
        PushPart::Sparse => SPARSE,
    }
}

/// What a server has done with one trainer's pushes: which steps it handled and how many
/// samples it applied. Kept in the server's checkpoints (taken in the same cut as the shard,
/// so a restarted server knows exactly which pushes its state holds).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrainerLedger {
    /// Every step below this one has been handled (or is too old to come again).
    pub below: u64,
    /// Steps at or above `below` handled so far, with the parts handled and whether discarded
    /// (and those with a non-finite copy skipped, once it came).
    pub recent: BTreeMap<u64, u8>,
    /// Samples of this trainer's pushes applied (each step once; a discarded push none).
    pub samples: u64,
    /// Samples of this trainer's pushes discarded (too stale, or skipped as non-finite).
    #[serde(default)]
    pub discarded_samples: u64,
    /// Pushes answered from the ledger without being applied again.
    pub repeats: u64,
    /// Pushes refused for holding a NaN, an infinity or a value beyond ±1e18 (a skipped step
    /// once, however many copies of it come).
    #[serde(default)]
    pub nonfinite: u64,
}

impl TrainerLedger {
    /// `Some(discarded)` if this part of `step` was handled already (a push sent again),
    /// `None` if it is new.
    pub fn repeat(&self, step: u64, part: PushPart) -> Option<bool> {
        if step < self.below {
            return Some(false);
        }
        let b = *self.recent.get(&step)?;
        (b & bits(part) == bits(part)).then_some(b & DISCARDED != 0)
    }

    /// For a half of a split push: `Some(discarded)` once its other half was judged (a split
    /// push is applied whole or discarded whole), else `None`.
    pub fn other_half(&self, step: u64, part: PushPart) -> Option<bool> {
        let other = match part {
            PushPart::Dense => SPARSE,
            PushPart::Sparse => DENSE,
            PushPart::Whole => return None,
        };
        let b = *self.recent.get(&step)?;
        (b & other != 0).then_some(b & DISCARDED != 0)
    }

    /// Why `step` is refused, if it is: at or past the window from the oldest step not handled
    /// yet (the steps below it still to come).
    pub fn refuses(&self, step: u64) -> Option<String> {
        let end = self.below.saturating_add(WINDOW as u64);
        (step >= end).then(|| {
            format!(
                "step {step} is past this trainer's window: its step {} is not handled yet and at most {WINDOW} steps \
                 may be outstanding",
                self.below
            )
        })
    }

    /// Whether this non-finite part of `step` is the step's first non-finite copy (marked, so
    /// that a copy sent again is not counted again); a part already handled is not.
    pub fn first_nonfinite(&mut self, step: u64, part: PushPart) -> bool {
        if self.repeat(step, part).is_some() {
            return false;
        }
        let b = self.recent.entry(step).or_insert(0);
        let first = *b & NONFINITE == 0;
        *b |= NONFINITE;
        first
    }

    /// Whether a copy of `step` was skipped as non-finite: the step applies none of it.
    pub fn skipped(&self, step: u64) -> bool {
        self.recent.get(&step).is_some_and(|b| b & NONFINITE != 0)
    }

    /// Records that this part of `step` was handled: applied over `samples` samples (counted
    /// once per step: with the whole push or its dense half), or discarded.
    pub fn record(&mut self, step: u64, part: PushPart, samples: u64, discarded: bool) {
        if step < self.below {
            return;
        }
        *self.recent.entry(step).or_insert(0) |= bits(part) | if discarded { DISCARDED } else { 0 };
        if part != PushPart::Sparse {
            let count = if discarded { &mut self.discarded_samples } else { &mut self.samples };
            *count = count.saturating_add(samples);
        }
        while let Some((&s, &b)) = self.recent.first_key_value() {
            if s != self.below || b & (DENSE | SPARSE) != DENSE | SPARSE {
                break;
            }
            self.recent.pop_first();
            self.below += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_counts_out_of_order_steps_and_halves_once_within_a_window() {
        let mut l = TrainerLedger::default();
        l.record(1, PushPart::Whole, 5, false); // Hogwild: step 1 before step 0
        assert_eq!((l.below, l.repeat(1, PushPart::Whole), l.repeat(0, PushPart::Whole)), (0, Some(false), None));
        l.record(0, PushPart::Dense, 5, false);
        assert_eq!(l.repeat(0, PushPart::Dense), Some(false));
        assert_eq!(l.repeat(0, PushPart::Sparse), None, "its sparse half is still to come");
        assert_eq!(l.other_half(0, PushPart::Sparse), Some(false), "judged with its dense half");
        assert_eq!(l.other_half(0, PushPart::Dense), None);
        l.record(0, PushPart::Sparse, 5, false);
        assert_eq!((l.below, l.recent.len(), l.samples), (2, 0, 10), "samples counted once per step");
        l.record(3, PushPart::Whole, 5, true);
        assert_eq!((l.repeat(3, PushPart::Whole), l.samples, l.discarded_samples), (Some(true), 10, 5), "discarded");
        l.record(2, PushPart::Whole, 5, false);
        assert_eq!((l.samples, l.below, l.recent.len()), (15, 4, 0), "once contiguous, only the count is kept");
        // A gap (step 4 not handled yet) holds the window: a step past it is refused, and the
        // watermark never moves past the step not done.
        for s in 5..(4 + WINDOW as u64) {
            assert_eq!(l.refuses(s), None, "{s}");
            l.record(s, PushPart::Whole, 1, false);
        }
        assert!(l.refuses(4 + WINDOW as u64).unwrap().contains("its step 4 is not handled yet"));
        assert!(l.refuses(u64::MAX).is_some() && l.refuses(1 << 60).is_some());
        assert_eq!((l.below, l.repeat(4, PushPart::Whole)), (4, None), "step 4 still to come");
        l.record(4, PushPart::Whole, 1, false);
        assert_eq!((l.recent.len(), l.below), (0, 4 + WINDOW as u64), "once it came, all count");
        // A non-finite step counts once, however many copies come, and marks nothing handled.
        let (far, whole) = (1 << 30, PushPart::Whole);
        assert!(
            l.first_nonfinite(far, whole) && !l.first_nonfinite(far, whole) && !l.first_nonfinite(far, PushPart::Dense)
        );
        assert_eq!((l.repeat(far, whole), l.other_half(far, PushPart::Dense)), (None, None));
        assert!(l.skipped(far) && !l.skipped(far + 1));
        l.record(far, whole, 1, true);
        assert_eq!(l.repeat(far, whole), Some(true));
        assert!(!l.first_nonfinite(3, whole), "below the watermark: handled");
        // Samples counted saturate rather than wrap.
        l.record(1 << 40, PushPart::Whole, u64::MAX, false);
        assert_eq!(l.samples, u64::MAX);
    }
}
