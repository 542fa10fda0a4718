//! What makes every sync update count once: the pure state of a server's sync step
//! ([`SyncStep`]), beside each trainer's [`TrainerLedger`]. No I/O, no locks: the handlers in
//! `server::push` hold them under the server's mutexes, and the unit tests below drive every
//! order of push, resend, close, pass end and restart through them.
//!
//! A push is known by (trainer, step): a trainer numbers its batches (and the warm-up's batch
//! parts) in the order they leave its reader, and a restarted trainer numbers them the same way
//! from its recorded position (`train::position`). So a push sent again by a restart, or by a
//! client whose connection broke before the reply, carries the step number of the first one,
//! and the ledger answers it with the first one's outcome instead of applying it twice.
//!
//! A step is applied on every server or on none: a server of several holds each push until its
//! trainer commits it, which the trainer does only once every server holds its push. So a
//! trainer that dies with its push at some servers and not others left no server moved, and
//! its restart computes the same batch from the same parameters; one that dies having
//! committed at some servers left its push held at all of them. Either way the first copy a
//! server holds is kept: a copy sent again is the same bytes (same batch, same parameters) or,
//! once some server applied the step, computed from moved parameters and not to be used.

use std::collections::BTreeMap;

use crate::protocol::{Push, PushPart};
use crate::server::ledger::TrainerLedger;

/// What became of a push offered to the sync step, or of a commit.
#[derive(Debug, PartialEq, Eq)]
pub enum Offered {
    /// It waits in the pending step, the server's step number `.0`, until that is applied.
    Pending(u64),
    /// A commit found no push of its step held: the trainer sends it again.
    NotHeld,
    /// The first half of a split push: it waits for its other half.
    Half(u64),
    /// Its step was handled already (applied, or discarded if `discarded`): answered at once.
    Repeat {
        /// The first push of the step was discarded rather than applied.
        discarded: bool,
    },
}

/// The server's pending synchronous step: the pushes of the step being gathered, the halves of
/// split pushes waiting for their other half, and where each trainer is in its passes.
///
/// Each trainer's position moves only on its own pushes and ends of pass (the server checks
/// that a request for trainer t comes from t), and a step waits for a trainer unless that
/// trainer has ended the pass of the step's pushes. So one trainer, however hostile, changes
/// whom a step waits for only as far as its own place goes: a far-future pass end or push
/// neither makes the step wait for trainers that have finished their pass, nor lets the
/// bound on the passes a request may name ([`Self::pass_bound`]) run away.
#[derive(Debug, Default)]
pub struct SyncStep {
    /// Steps applied (the server's version in sync mode).
    pub step: u64,
    /// Each trainer's push of the pending step, and whether it is committed.
    pushes: BTreeMap<u64, (Push<'static>, bool)>,
    /// The newest pass a trainer has pushed in or ended (what the final save records).
    pub pass: u64,
    /// The pass the trainers had reached before this server knew of them: a resumed saved
    /// model's, or the record a restarted server read.
    floor: u64,
    /// Each trainer's newest pass pushed in and newest pass ended (0: none yet).
    positions: BTreeMap<u64, Position>,
    halves: BTreeMap<u64, Push<'static>>,
}

/// Where one trainer is in its passes, as its own requests have said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Position {
    pushed: u64,
    ended: u64,
}

impl Position {
    fn newest(&self) -> u64 {
        self.pushed.max(self.ended)
    }
}

impl SyncStep {
    /// A sync step counting on from `step` applied ones (a restarted server's checkpoint).
    pub fn new(step: u64) -> SyncStep {
        SyncStep { step, ..SyncStep::default() }
    }

    /// Takes up where a record left the trainers: in `pass` or past it, `ended` having ended
    /// it (a restarted server), or past a saved model's pass `pass` (`ended` empty).
    pub fn restore(&mut self, pass: u64, ended: impl IntoIterator<Item = u64>) {
        self.pass = self.pass.max(pass);
        self.floor = self.floor.max(pass);
        for t in ended {
            self.positions.insert(t, Position { pushed: pass, ended: pass });
        }
    }

    /// The trainers that have ended the newest pass and pushed nothing since (the record
    /// beside the checkpoints: they wait at the barrier and will not tell a restart again).
    pub fn ended(&self) -> Vec<u64> {
        let done = |at: &Position| at.ended == self.pass && at.pushed <= at.ended;
        self.positions.iter().filter(|(_, at)| done(at)).map(|(t, _)| *t).collect()
    }

    /// The furthest pass a request from `sender` (a trainer, or `None` for anyone else) may
    /// name, `active` being the trainers that have not closed: one past the newest pass another
    /// active trainer is in, or past the floor. An honest trainer starts a pass only after a
    /// barrier every trainer reaches at the end of the one before, so it is never more than one
    /// pass ahead of the others; a trainer alone in its job is measured against itself.
    pub fn pass_bound(&self, sender: Option<u64>, active: &[u64]) -> u64 {
        let newest = |t: &u64| self.positions.get(t).map_or(0, Position::newest);
        let others = active.iter().filter(|t| Some(**t) != sender).map(newest).max();
        let furthest = others.unwrap_or_else(|| sender.as_ref().map_or(0, newest));
        furthest.max(self.floor).saturating_add(1)
    }

    fn enter_pass(&mut self, trainer: u64, pass: u64) {
        let at = self.positions.entry(trainer).or_default();
        at.pushed = at.pushed.max(pass);
        self.pass = self.pass.max(pass);
    }

    /// `trainer` has no more steps in `pass`.
    pub fn end_pass(&mut self, trainer: u64, pass: u64) {
        let at = self.positions.entry(trainer).or_default();
        at.ended = at.ended.max(pass);
        self.pass = self.pass.max(pass);
    }

    /// `trainer` closed: a half it sent is released (it will never send the other), and its
    /// place no longer bounds the others' passes.
    pub fn close(&mut self, trainer: u64) {
        self.halves.remove(&trainer);
        self.positions.remove(&trainer);
    }

    /// Offers `push`; `ledger` is its trainer's. A push of a step already handled is a repeat;
    /// one of the step already pending (sent again by a restarted process) leaves the first
    /// in place (see the module's note), so it counts once either way. `committed`: the push
    /// needs no commit (a job of one server).
    pub fn offer(&mut self, push: Push<'static>, ledger: &TrainerLedger, committed: bool) -> Result<Offered, String> {
        if let Some(discarded) = ledger.repeat(push.step, push.part) {
            return Ok(Offered::Repeat { discarded });
        }
        let trainer = push.trainer;
        self.enter_pass(trainer, push.pass);
        let whole = match push.part {
            PushPart::Whole => push,
            part => match self.halves.remove(&trainer) {
                Some(other) if other.step == push.step && other.part != part => {
                    let (dense, sparse) = if part == PushPart::Dense { (push, other) } else { (other, push) };
                    Push { part: PushPart::Whole, sparse: sparse.sparse, ..dense }
                }
                // A half sent again leaves the first.
                Some(other) if other.step == push.step => {
                    self.halves.insert(trainer, other);
                    return Ok(Offered::Half(self.step));
                }
                // A half of a newer step replaces one whose other half never came (its sender
                // died between the two, before it could commit).
                _ => {
                    self.halves.insert(trainer, push);
                    return Ok(Offered::Half(self.step));
                }
            },
        };
        if let Some((pending, held)) = self.pushes.get_mut(&trainer) {
            if pending.step != whole.step {
                return Err(format!(
                    "trainer {trainer} pushed its step {} while its step {} waits in step {}",
                    whole.step, pending.step, self.step
                ));
            }
            *held |= committed;
            return Ok(Offered::Pending(self.step));
        }
        if let Some((other, _)) = self.pushes.values().find(|(p, _)| !p.dense.is_empty()) {
            if !whole.dense.is_empty() && whole.dense_len() != other.dense_len() {
                return Err(format!(
                    "trainer {trainer} pushed {} dense floats, trainer {} {}",
                    whole.dense_len(),
                    other.trainer,
                    other.dense_len()
                ));
            }
        }
        self.pushes.insert(trainer, (whole, committed));
        Ok(Offered::Pending(self.step))
    }

    /// `trainer` commits its push of `step` (its own numbering): a repeat if the step was
    /// handled, `NotHeld` if no whole push of it is held here.
    pub fn commit(&mut self, trainer: u64, step: u64, ledger: &TrainerLedger) -> Offered {
        if let Some(discarded) = ledger.repeat(step, PushPart::Whole) {
            return Offered::Repeat { discarded };
        }
        match self.pushes.get_mut(&trainer) {
            Some((push, committed)) if push.step == step => {
                *committed = true;
                Offered::Pending(self.step)
            }
            _ => Offered::NotHeld,
        }
    }

    fn committed(&self, trainer: u64) -> bool {
        self.pushes.get(&trainer).is_some_and(|(_, committed)| *committed)
    }

    /// The pass of the pending step's pushes (their oldest: an honest step holds one pass, and a
    /// push of a pass ahead must not make the step wait for trainers that have finished the pass
    /// the others are still in).
    fn step_pass(&self) -> u64 {
        self.pushes.values().map(|(p, _)| p.pass).min().unwrap_or(self.pass)
    }

    /// Whether trainer `t` has ended pass `step_pass`.
    fn has_ended(&self, t: u64, step_pass: u64) -> bool {
        self.positions.get(&t).is_some_and(|at| at.ended >= step_pass && at.ended > 0)
    }

    /// Whether every trainer in `active` has committed its push of the pending step or ended
    /// the step's pass.
    pub fn ready(&self, active: &[u64]) -> bool {
        let pass = self.step_pass();
        !self.pushes.is_empty() && active.iter().all(|t| self.committed(*t) || self.has_ended(*t, pass))
    }

    /// The trainers of `active` the pending step waits for (to push, or to commit).
    pub fn waiting_for(&self, active: &[u64]) -> Vec<u64> {
        let pass = self.step_pass();
        active.iter().copied().filter(|t| !self.committed(*t) && !self.has_ended(*t, pass)).collect()
    }

    /// Takes the pending step's pushes, in trainer order, and counts the step.
    pub fn take(&mut self) -> BTreeMap<u64, Push<'static>> {
        self.step += 1;
        std::mem::take(&mut self.pushes).into_iter().map(|(t, (push, _))| (t, push)).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;
    use crate::protocol::{Apply, SparseGrads};

    fn push(trainer: u64, step: u64, part: PushPart, dense: f32) -> Push<'static> {
        Push {
            trainer,
            step,
            pass: 1,
            base_version: 0,
            samples: 10,
            part,
            apply: Apply::Now,
            dense: if part == PushPart::Sparse { vec![] } else { vec![Cow::Owned(vec![dense; 2])] },
            sparse: if part == PushPart::Dense {
                vec![]
            } else {
                vec![SparseGrads {
                    table: 0,
                    ids: Cow::Owned(vec![7]),
                    counts: Cow::Owned(vec![1.0, 0.0]),
                    grads: Cow::Owned(vec![dense]),
                }]
            },
        }
    }

    /// Applies the pending step as the server does: every push recorded in its trainer's ledger.
    fn apply(sync: &mut SyncStep, ledgers: &mut [TrainerLedger]) -> Vec<(u64, f32)> {
        let pushes = sync.take();
        for p in pushes.values() {
            ledgers[p.trainer as usize].record(p.step, PushPart::Whole, p.samples, false);
        }
        pushes.values().map(|p| (p.trainer, p.dense[0][0])).collect()
    }

    #[test]
    fn a_step_waits_for_every_active_trainer_and_merges_in_trainer_order() {
        let (mut sync, ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 2]);
        assert_eq!(sync.offer(push(1, 0, PushPart::Whole, 1.0), &ledgers[1], true), Ok(Offered::Pending(0)));
        assert!(!sync.ready(&[0, 1]));
        assert_eq!(sync.waiting_for(&[0, 1]), vec![0]);
        assert_eq!(sync.offer(push(0, 0, PushPart::Whole, 2.0), &ledgers[0], true), Ok(Offered::Pending(0)));
        assert!(sync.ready(&[0, 1]));
        assert_eq!(sync.take().keys().copied().collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(sync.step, 1);
    }

    /// The finding this module exists for: a trainer killed with its push pending, the step
    /// completed by the survivor with the dead process's push, and the restart sending the
    /// same step again. It is answered as applied, and the next step pairs as before.
    #[test]
    fn a_push_sent_again_after_its_step_was_applied_is_a_repeat() {
        let (mut sync, mut ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 2]);
        sync.offer(push(1, 0, PushPart::Whole, 1.0), &ledgers[1], true).unwrap(); // the dead process's
        sync.offer(push(0, 0, PushPart::Whole, 2.0), &ledgers[0], true).unwrap();
        assert!(sync.ready(&[0, 1]));
        apply(&mut sync, &mut ledgers);
        assert_eq!(
            sync.offer(push(1, 0, PushPart::Whole, 9.0), &ledgers[1], true),
            Ok(Offered::Repeat { discarded: false })
        );
        assert_eq!(ledgers[1].samples, 10, "applied once");
        sync.offer(push(0, 1, PushPart::Whole, 2.0), &ledgers[0], true).unwrap();
        assert!(!sync.ready(&[0, 1]), "the repeat did not stand in for step 1");
        sync.offer(push(1, 1, PushPart::Whole, 1.0), &ledgers[1], true).unwrap();
        assert_eq!(apply(&mut sync, &mut ledgers), vec![(0, 2.0), (1, 1.0)]);
        assert_eq!((ledgers[0].below, ledgers[1].below, sync.step), (2, 2, 2));
    }

    /// The other order: the restart sends the step again while the dead process's push still
    /// waits. The first stays; the step holds one push of each trainer.
    #[test]
    fn a_push_sent_again_while_its_step_waits_leaves_the_first_in_place() {
        let (mut sync, mut ledgers) = (SyncStep::new(5), vec![TrainerLedger::default(); 2]);
        sync.offer(push(1, 0, PushPart::Whole, 1.0), &ledgers[1], true).unwrap();
        assert_eq!(sync.offer(push(1, 0, PushPart::Whole, 1.5), &ledgers[1], true), Ok(Offered::Pending(5)));
        assert!(!sync.ready(&[0, 1]));
        sync.offer(push(0, 0, PushPart::Whole, 2.0), &ledgers[0], true).unwrap();
        assert_eq!(apply(&mut sync, &mut ledgers), vec![(0, 2.0), (1, 1.0)]);
        assert_eq!(ledgers[1].samples, 10);
    }

    #[test]
    fn halves_join_once_and_a_half_sent_again_leaves_the_first() {
        let (mut sync, mut ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 1]);
        assert_eq!(sync.offer(push(0, 0, PushPart::Dense, 1.0), &ledgers[0], true), Ok(Offered::Half(0)));
        // The sender died between its halves; its restart sends both again.
        assert_eq!(sync.offer(push(0, 0, PushPart::Dense, 3.0), &ledgers[0], true), Ok(Offered::Half(0)));
        assert!(!sync.ready(&[0]));
        assert_eq!(sync.offer(push(0, 0, PushPart::Sparse, 4.0), &ledgers[0], true), Ok(Offered::Pending(0)));
        let pushes = sync.take();
        assert_eq!(pushes[&0].part, PushPart::Whole);
        assert_eq!((pushes[&0].dense[0][0], pushes[&0].sparse[0].grads[0]), (1.0, 4.0));
        ledgers[0].record(0, PushPart::Whole, 10, false);
        assert_eq!(
            sync.offer(push(0, 0, PushPart::Sparse, 4.0), &ledgers[0], true),
            Ok(Offered::Repeat { discarded: false })
        );
    }

    #[test]
    fn ended_and_closed_trainers_no_longer_hold_a_step() {
        let (mut sync, ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 3]);
        sync.offer(push(0, 3, PushPart::Whole, 1.0), &ledgers[0], true).unwrap();
        sync.offer(push(2, 4, PushPart::Dense, 1.0), &ledgers[2], true).unwrap();
        sync.end_pass(1, 1);
        assert!(!sync.ready(&[0, 1, 2]));
        sync.close(2);
        assert!(sync.ready(&[0, 1]), "trainer 2 closed, 1 ended the pass");
        // A new pass forgets who ended the last one.
        sync.take();
        sync.offer(Push { pass: 2, ..push(0, 4, PushPart::Whole, 1.0) }, &ledgers[0], true).unwrap();
        assert!(!sync.ready(&[0, 1]));
    }

    /// One trainer's far-future pass end, or its push of a pass ahead, moves only its own
    /// place: the step still goes on without the trainers that ended the pass the others are in.
    #[test]
    fn one_trainers_pass_ahead_never_makes_a_step_wait_for_trainers_that_ended_theirs() {
        let (mut sync, ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 3]);
        sync.end_pass(0, 1);
        sync.end_pass(1, u64::MAX);
        sync.offer(push(2, 7, PushPart::Whole, 1.0), &ledgers[2], true).unwrap();
        assert!(sync.ready(&[0, 1, 2]), "waiting for {:?}", sync.waiting_for(&[0, 1, 2]));
        sync.take();
        // Trainer 1 pushes a step of pass 2 before trainer 2's next step of pass 1 arrives.
        sync.offer(Push { pass: 2, ..push(1, 8, PushPart::Whole, 1.0) }, &ledgers[1], true).unwrap();
        assert_eq!(sync.waiting_for(&[0, 1, 2]), vec![0, 2], "a step of pass 2 alone waits for everyone");
        sync.offer(push(2, 8, PushPart::Whole, 1.0), &ledgers[2], true).unwrap();
        assert!(sync.ready(&[0, 1, 2]), "trainer 0 ended pass 1, the pass trainer 2 is in");
    }

    /// The passes a trainer may name run one past the others', so no trainer alone walks the
    /// bound forward; a lone trainer is measured against itself, anyone else against all.
    #[test]
    fn the_pass_bound_runs_one_past_the_other_trainers() {
        let (mut sync, ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 2]);
        assert_eq!(sync.pass_bound(Some(1), &[0, 1]), 1, "nobody has started");
        sync.offer(push(0, 0, PushPart::Whole, 1.0), &ledgers[0], true).unwrap();
        sync.end_pass(0, 1);
        assert_eq!(sync.pass_bound(Some(1), &[0, 1]), 2);
        sync.end_pass(1, 2);
        assert_eq!(sync.pass_bound(Some(1), &[0, 1]), 2, "its own pass end does not move its bound");
        assert_eq!(sync.pass_bound(Some(0), &[0, 1]), 3);
        assert_eq!(sync.pass_bound(None, &[0, 1]), 3);
        assert_eq!(sync.pass_bound(Some(1), &[1]), 3, "trainer 0 closed: trainer 1 is alone");
        // A restarted server's record, or a resumed model's pass, is the floor.
        let mut restarted = SyncStep::new(0);
        restarted.restore(5, [1]);
        assert_eq!((restarted.pass_bound(Some(0), &[0, 1]), restarted.ended()), (6, vec![1]));
        restarted.offer(Push { pass: 5, ..push(0, 0, PushPart::Whole, 1.0) }, &ledgers[0], true).unwrap();
        assert!(restarted.ready(&[0, 1]), "trainer 1 ended pass 5 before the restart");
    }

    #[test]
    fn a_different_step_while_one_waits_or_a_different_dense_length_is_refused() {
        let (mut sync, ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 2]);
        sync.offer(push(0, 3, PushPart::Whole, 1.0), &ledgers[0], true).unwrap();
        let e = sync.offer(push(0, 4, PushPart::Whole, 1.0), &ledgers[0], true).unwrap_err();
        assert!(e.contains("pushed its step 4 while its step 3 waits"), "{e}");
        let mut short = push(1, 3, PushPart::Whole, 1.0);
        short.dense = vec![Cow::Owned(vec![1.0])];
        let e = sync.offer(short, &ledgers[1], true).unwrap_err();
        assert!(e.contains("pushed 1 dense floats, trainer 0 2"), "{e}");
        assert!(!sync.ready(&[0, 1]), "nothing was taken by the refusals");
    }

    /// Several servers: a step waits for every trainer's commit, a commit of a step not held
    /// asks for the push again, and a commit of a handled step is a repeat.
    #[test]
    fn a_step_of_several_servers_waits_for_every_commit() {
        let (mut sync, mut ledgers) = (SyncStep::new(0), vec![TrainerLedger::default(); 2]);
        assert_eq!(sync.commit(1, 0, &ledgers[1]), Offered::NotHeld, "nothing held yet");
        sync.offer(push(0, 0, PushPart::Whole, 1.0), &ledgers[0], false).unwrap();
        sync.offer(push(1, 0, PushPart::Whole, 2.0), &ledgers[1], false).unwrap();
        assert!(!sync.ready(&[0, 1]), "held, not committed");
        assert_eq!(sync.waiting_for(&[0, 1]), vec![0, 1]);
        assert_eq!(sync.commit(0, 0, &ledgers[0]), Offered::Pending(0));
        assert_eq!(sync.commit(1, 3, &ledgers[1]), Offered::NotHeld, "another step");
        assert_eq!(sync.waiting_for(&[0, 1]), vec![1]);
        // Trainer 1's restart sends the step again, computed from other parameters: the first stays.
        sync.offer(push(1, 0, PushPart::Whole, 9.0), &ledgers[1], false).unwrap();
        assert_eq!(sync.commit(1, 0, &ledgers[1]), Offered::Pending(0));
        assert!(sync.ready(&[0, 1]));
        assert_eq!(apply(&mut sync, &mut ledgers), vec![(0, 1.0), (1, 2.0)]);
        assert_eq!(sync.commit(1, 0, &ledgers[1]), Offered::Repeat { discarded: false });
    }
}
