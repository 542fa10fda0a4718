//! Pushes: every one checked first (its tables, its lengths, finite numbers within ±1e18), then
//! applied at once (async) or gathered into the sync step (sync mode, and async mode's warm-up)
//! and applied once committed, each (trainer, step) once: a push sent again is answered from
//! its trainer's ledger (see [`super::sync`]).
//!
//! Async: a push is applied at once, or discarded when too stale, and the two halves of a split
//! push (dense and sparse ports) share one verdict, the first's. Sync and merged: a push is held
//! in the step and applied once every active trainer has committed its own (a lone server
//! commits on arrival), so a step is applied on every server or on none.
//!
//! Locks, always in this order: `sync` (the pending step), `gate` (shared by every update,
//! exclusive for a checkpoint's snapshot, so a checkpoint holds whole steps and the ledgers that
//! match them), then one trainer's ledger.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::sync::{Offered, SyncStep};
use super::{table_err, Answer, Reply, State};
use crate::protocol::{Apply, ErrorCode, Mode, NonFinite, Push, PushOutcome, PushPart, Response, SparseGrads};
use crate::table::Shard;

/// Applies one push (or several merged) to the shard; gradients are sums over `samples`, the
/// dense learning rate times `dense_lr_factor`.
fn apply(
    shard: &Shard,
    dense: &[f32],
    sparse: &[SparseGrads],
    samples: u64,
    dense_lr_factor: f32,
) -> Result<(), (ErrorCode, String)> {
    let sparse = sparse.iter().map(|s| (s.table as usize, &s.ids[..], &s.counts[..], &s.grads[..]));
    shard.apply(dense, sparse, samples, dense_lr_factor).map_err(table_err)
}

/// Checks a push against this server's tables and for numbers that would poison them, before
/// anything is merged or applied: `Ok(false)` for a non-finite push the server skips.
fn check(state: &State, shard: &Shard, push: &Push<'_>) -> Result<bool, (ErrorCode, String)> {
    let trainer = push.trainer;
    if trainer >= state.config.trainers as u64 {
        return Err((ErrorCode::State, format!("trainer {trainer} is not in 0..{}", state.config.trainers)));
    }
    bounded(state, push).map_err(|m| (ErrorCode::State, format!("trainer {trainer}'s push refused: {m}")))?;
    let dense = push.dense_len();
    let own = shard.dense_len;
    if dense != 0 && dense != own {
        return Err((
            ErrorCode::Table,
            format!("trainer {trainer} pushed {dense} dense floats, this server holds {own}"),
        ));
    }
    for s in &push.sparse {
        let dim = shard.table(s.table as usize).map_err(table_err)?.spec().dim;
        if Some(s.grads.len()) != s.ids.len().checked_mul(dim) {
            let m = format!("table {}: {} ids but {} gradient floats", s.table, s.ids.len(), s.grads.len());
            return Err((ErrorCode::Table, m));
        }
        if Some(s.counts.len()) != s.ids.len().checked_mul(2) {
            let m = format!(
                "table {}: {} ids but {} show and click floats (2 per id)",
                s.table,
                s.ids.len(),
                s.counts.len()
            );
            return Err((ErrorCode::Table, m));
        }
        // A NaN count is not negative: the check for non-finite numbers names it.
        if !crate::table::every_float(&s.counts, |c| c >= 0.0 || c.is_nan()) {
            let m = format!("table {}: a negative show or click count", s.table);
            return Err((ErrorCode::Table, m));
        }
    }
    let sparse = push.sparse.iter().flat_map(|s| [&s.grads[..], &s.counts[..]]);
    if crate::table::all_pushable(push.dense.iter().map(|c| &c[..]).chain(sparse)) {
        return Ok(true);
    }
    let policy = state.config.limits.nonfinite;
    {
        // Skipped, a step counts once: a copy sent again (a broken connection, a restarted
        // trainer) is answered as the first was. Refused, every copy is refused and counted.
        let mut ledger = state.ledgers[trainer as usize].lock();
        if policy == NonFinite::Skip && !ledger.first_nonfinite(push.step, push.part) {
            return Ok(false);
        }
        ledger.nonfinite += 1;
    }
    let message = format!(
        "trainer {trainer}'s push of its step {} holds {}: refused before it touched the model ({})",
        push.step,
        crate::table::NOT_PUSHABLE,
        crate::table::NONFINITE_HINT
    );
    policy.refuse(message).map(|()| false).map_err(|m| {
        tracing::error!("{m}");
        (ErrorCode::NonFinite, m)
    })
}

/// Why a push's own numbers are refused before they touch any state, if they are: its step
/// within its trainer's window ([`crate::server::ledger::WINDOW`]), its pass at most one past the pass
/// the trainers are in, its samples those of one batch.
fn bounded(state: &State, push: &Push<'_>) -> Result<(), String> {
    if let Some(why) = state.ledgers[push.trainer as usize].lock().refuses(push.step) {
        return Err(why);
    }
    let bound = state.pass_bound(Some(push.trainer));
    if push.pass > bound {
        return Err(format!("it is of pass {}, the trainers are in pass {} at most", push.pass, bound - 1));
    }
    if push.samples == 0 || push.samples > crate::protocol::MAX_SAMPLES {
        return Err(format!("{} samples: a batch holds 1 to {}", push.samples, crate::protocol::MAX_SAMPLES));
    }
    Ok(())
}

fn pushed(outcome: PushOutcome, version: u64) -> Reply {
    Ok(Answer::Response(Response::Pushed { outcome, version }))
}

fn outcome(discarded: bool) -> PushOutcome {
    if discarded {
        PushOutcome::Discarded
    } else {
        PushOutcome::Applied
    }
}

/// Gradient bytes a push carries.
fn push_bytes(push: &Push<'_>) -> u64 {
    let sparse: usize = push.sparse.iter().map(|s| s.ids.len() * 8 + s.grads.len() * 4).sum();
    (push.dense_len() * 4 + sparse) as u64
}

/// An async push: applied at once unless too stale (discarded) or already handled (a repeat).
pub(super) fn push_async(state: &State, push: Push<'_>) -> Reply {
    let shard = state.shard()?;
    let c = &state.counters;
    c.pushes.fetch_add(1, Relaxed);
    c.push_bytes.fetch_add(push_bytes(&push), Relaxed);
    let skip = !check(state, &shard, &push)?;
    let _gate = state.gate.read();
    // Held across the apply: a trainer's resend cannot overtake its first copy.
    let mut ledger = state.ledgers[push.trainer as usize].lock();
    if let Some(discarded) = ledger.repeat(push.step, push.part) {
        ledger.repeats += 1;
        return pushed(outcome(discarded), c.version.load(Relaxed));
    }
    let version = c.version.load(Relaxed);
    if skip {
        ledger.record(push.step, push.part, push.samples, true);
        return pushed(PushOutcome::Discarded, version);
    }
    let geo = state.config.mode == Mode::Geo;
    if geo && push.apply != Apply::Now {
        let m = format!("trainer {}'s push refused: a GEO job's pushes are changes added as they come", push.trainer);
        return Err((ErrorCode::State, m));
    }
    let max_lag = (state.config.lag_ratio * state.config.trainers as f64).ceil() as u64;
    let behind = version.saturating_sub(push.base_version);
    if push.part != PushPart::Sparse {
        c.staleness.0[(behind as usize).min(crate::observe::metrics::Staleness::BUCKETS - 1)].fetch_add(1, Relaxed);
    }
    // The halves of a split push share one verdict, the first's: the second, arriving after
    // the first moved the version, would otherwise be judged staler than the push is.
    // A GEO push is a trainer's share of its change, already taken from its copy: never stale.
    if ledger.other_half(push.step, push.part).unwrap_or(behind > max_lag && !geo) {
        c.discarded.fetch_add(1, Relaxed);
        ledger.record(push.step, push.part, push.samples, true);
        return pushed(PushOutcome::Discarded, version);
    }
    c.keys_pushed.fetch_add(push.sparse.iter().map(|s| s.ids.len() as u64).sum(), Relaxed);
    // Sparse rows keep their step: a row's own staleness is not the server's version count.
    let factor = push.apply.dense_lr_factor(behind);
    apply(&shard, &push.dense_contiguous(), &push.sparse, push.samples, factor)?;
    ledger.record(push.step, push.part, push.samples, false);
    drop(ledger);
    if geo {
        // After the change is in the tables: a trainer told of a row reads the row with it.
        let mut changes = state.changes(&shard);
        push.sparse.iter().for_each(|s| changes.record(s.table, &s.ids));
    }
    // The sparse half of a split push is part of the update its dense half counts.
    let version = if push.part == PushPart::Sparse { version } else { c.version.fetch_add(1, Relaxed) + 1 };
    state.injected_fault(version);
    pushed(PushOutcome::Applied, version)
}

/// A push into the sync step. On a server of several it is held and answered `Held` at once:
/// its step is applied once every active trainer has committed (see [`commit`]). On a lone
/// server it is committed on arrival, parked until the step is applied, and answered then.
pub(super) async fn push_sync(state: &Arc<State>, push: Push<'_>) -> Reply {
    let shard = state.shard()?;
    state.counters.pushes.fetch_add(1, Relaxed);
    state.counters.push_bytes.fetch_add(push_bytes(&push), Relaxed);
    // A skipped non-finite push still takes its place in the step, without gradients: the
    // step must not wait for it (its samples count as discarded when the step is applied).
    let push = if check(state, &shard, &push)? {
        push.into_owned()
    } else {
        Push { dense: Vec::new(), sparse: Vec::new(), ..push }.into_owned()
    };
    hold(state, &shard, push).await
}

/// An async job's push of a trainer in `sync_dense` (`Apply::DenseMerged`): its rows are
/// applied at once, as an async push's, and recorded as the step's sparse part; its dense part
/// goes into the sync step, which records the whole step once applied. A push sent again finds
/// its rows recorded and only offers its dense part again, so each part counts once.
pub(super) async fn push_dense_merged(state: &Arc<State>, push: Push<'_>) -> Reply {
    let shard = state.shard()?;
    let c = &state.counters;
    c.pushes.fetch_add(1, Relaxed);
    c.push_bytes.fetch_add(push_bytes(&push), Relaxed);
    if state.config.mode != Mode::Async || push.part != PushPart::Whole {
        let m = format!(
            "trainer {}'s push refused: dense-merged pushes are whole pushes of an async job ({} job, {:?} part)",
            push.trainer, state.config.mode, push.part
        );
        return Err((ErrorCode::State, m));
    }
    let pushable = check(state, &shard, &push)?;
    {
        let _gate = state.gate.read();
        let mut ledger = state.ledgers[push.trainer as usize].lock();
        if ledger.repeat(push.step, PushPart::Sparse).is_none() {
            if pushable {
                c.keys_pushed.fetch_add(push.sparse.iter().map(|s| s.ids.len() as u64).sum(), Relaxed);
                apply(&shard, &[], &push.sparse, push.samples, 1.0)?;
            }
            ledger.record(push.step, PushPart::Sparse, push.samples, !pushable);
        }
    }
    // A skipped non-finite push still takes its place in the step, without gradients.
    let dense = if pushable { push.dense } else { Vec::new() };
    let merged = Push { dense, sparse: Vec::new(), ..push };
    hold(state, &shard, merged.into_owned()).await
}

/// Holds a checked push in the sync step (see [`push_sync`]) and answers it.
async fn hold(state: &Arc<State>, shard: &Shard, push: Push<'static>) -> Reply {
    let trainer = push.trainer;
    state.unanswered_fault_on_arrival(trainer);
    let lone = state.place.lock().is_some_and(|(_, servers)| servers == 1);
    let mut applied = state.applied.subscribe();
    // Trainers with fewer batches per pass than others have pushed fewer steps, so their own
    // step counts say nothing about which step this is; a trainer cannot be a step ahead, as
    // it waits for each push's reply.
    let step = {
        let mut pending = state.sync.lock();
        let offered = {
            let ledger = state.ledgers[trainer as usize].lock();
            pending.offer(push, &ledger, lone).map_err(|m| (ErrorCode::State, m))?
        };
        match offered {
            Offered::Repeat { discarded } => return repeat(state, trainer, discarded, pending.step),
            Offered::Half(_) | Offered::Pending(_) if !lone => return pushed(PushOutcome::Held, pending.step),
            Offered::Half(step) => step,
            Offered::Pending(step) => {
                complete_step(state, shard, &mut pending)?;
                step
            }
            Offered::NotHeld => unreachable!("an offer is held or refused"),
        }
    };
    wait_applied(state, &mut applied, trainer, step).await
}

/// Trainer `trainer` commits its push of `step`, held by every server: parked until the step
/// is applied, then answered as the push would have been. A commit of a step this server does
/// not hold (restarted from a checkpoint since the push) is answered `NotHeld`.
pub(super) async fn commit(state: &Arc<State>, trainer: u64, step: u64) -> Reply {
    let shard = state.shard()?;
    if trainer >= state.config.trainers as u64 {
        return Err((ErrorCode::State, format!("trainer {trainer} is not in 0..{}", state.config.trainers)));
    }
    let mut applied = state.applied.subscribe();
    let step = {
        let mut pending = state.sync.lock();
        let offered = pending.commit(trainer, step, &state.ledgers[trainer as usize].lock());
        match offered {
            Offered::Repeat { discarded } => return repeat(state, trainer, discarded, pending.step),
            Offered::NotHeld => return pushed(PushOutcome::NotHeld, pending.step),
            Offered::Pending(step) | Offered::Half(step) => {
                complete_step(state, &shard, &mut pending)?;
                step
            }
        }
    };
    wait_applied(state, &mut applied, trainer, step).await
}

/// A push or commit of a step handled already, answered with its first outcome.
fn repeat(state: &State, trainer: u64, discarded: bool, version: u64) -> Reply {
    state.ledgers[trainer as usize].lock().repeats += 1;
    tracing::info!(trainer, "a push sent again was answered with its first outcome");
    pushed(outcome(discarded), version)
}

/// Waits (within the server's timeout, naming who is missing) until the sync step `step` is
/// applied, and answers `trainer`'s push in it.
async fn wait_applied(
    state: &Arc<State>,
    applied: &mut tokio::sync::watch::Receiver<u64>,
    trainer: u64,
    step: u64,
) -> Reply {
    // Only whether it timed out: the watch's `Ref` must not live on across an await.
    let timed_out = tokio::time::timeout(state.config.timeout, applied.wait_for(|&n| n > step)).await.is_err();
    if timed_out {
        let missing = state.sync.lock().waiting_for(&state.active());
        return Err((
            ErrorCode::Timeout,
            format!(
                "sync step {step} timed out after {:?} waiting for trainer(s) {missing:?} to push or commit",
                state.config.timeout
            ),
        ));
    }
    if let Some(error) = state.step_errors.lock().get(&step) {
        return Err(error.clone());
    }
    state.unanswered_fault_on_reply(trainer, step + 1).await;
    pushed(PushOutcome::Applied, step + 1)
}

/// If every active trainer has pushed the pending step, merges the pushes in trainer order,
/// applies one update, records each push in its trainer's ledger and wakes the waiters. An
/// error applying it is every waiter's answer.
pub(super) fn complete_step(state: &State, shard: &Shard, pending: &mut SyncStep) -> Result<(), (ErrorCode, String)> {
    if !pending.ready(&state.active()) {
        return Ok(());
    }
    let _gate = state.gate.read();
    let step = pending.step;
    let pushes = pending.take();
    // Trainers whose step was skipped as non-finite (a copy of it, or of one of its halves):
    // none of it is applied, and its samples count as discarded.
    let skipped: BTreeSet<u64> = pushes
        .values()
        .filter(|p| state.ledgers[p.trainer as usize].lock().skipped(p.step))
        .map(|p| p.trainer)
        .collect();
    let applied = || pushes.values().filter(|p| !skipped.contains(&p.trainer));
    let samples: u64 = applied().map(|p| p.samples).sum();
    let mut dense: Vec<f32> = Vec::new();
    // Every dense part has the server's length (checked when offered).
    for p in applied().filter(|p| !p.dense.is_empty()) {
        let d = p.dense_contiguous();
        if dense.is_empty() {
            dense = d.into_owned();
        } else {
            dense.iter_mut().zip(d.iter()).for_each(|(a, b)| *a += b);
        }
    }
    let result = merge_sparse(shard, applied()).and_then(|sparse| {
        let keys: u64 = sparse.iter().map(|s| s.ids.len() as u64).sum();
        state.counters.keys_pushed.fetch_add(keys, Relaxed);
        apply(shard, &dense, &sparse, samples, 1.0)
    });
    for p in pushes.values() {
        let discarded = result.is_err() || skipped.contains(&p.trainer);
        state.ledgers[p.trainer as usize].lock().record(p.step, PushPart::Whole, p.samples, discarded);
    }
    if let Err(e) = &result {
        tracing::error!(step, "sync step not applied: {}", e.1);
        let mut errors = state.step_errors.lock();
        errors.insert(step, e.clone());
        // Only the waiters of recent steps read them.
        while errors.len() > 16 {
            errors.pop_first();
        }
    }
    let version = state.counters.version.fetch_add(1, Relaxed) + 1;
    state.injected_fault(version);
    state.applied.send_replace(pending.step);
    result
}

/// Sums the sparse gradients of several pushes per (table, id), visiting pushes in trainer order
/// so the floating-point sums are reproducible.
fn merge_sparse<'a>(
    shard: &Shard,
    pushes: impl Iterator<Item = &'a Push<'static>>,
) -> Result<Vec<SparseGrads<'static>>, (ErrorCode, String)> {
    /// One table's merged gradients: id -> position in `ids`/`counts`/`grads`.
    #[derive(Default)]
    struct Merged {
        index: hashbrown::HashMap<u64, usize>,
        ids: Vec<u64>,
        counts: Vec<f32>,
        grads: Vec<f32>,
    }
    let mut merged: BTreeMap<u32, Merged> = BTreeMap::new();
    for p in pushes {
        for s in &p.sparse {
            let dim = shard.table(s.table as usize).map_err(table_err)?.spec().dim;
            let Merged { index, ids, counts, grads } = merged.entry(s.table).or_default();
            for (k, &id) in s.ids.iter().enumerate() {
                let (c, g) = (&s.counts[2 * k..2 * k + 2], &s.grads[k * dim..(k + 1) * dim]);
                match index.get(&id) {
                    Some(&at) => {
                        counts[2 * at..2 * at + 2].iter_mut().zip(c).for_each(|(a, b)| *a += b);
                        grads[at * dim..(at + 1) * dim].iter_mut().zip(g).for_each(|(a, b)| *a += b);
                    }
                    None => {
                        index.insert(id, ids.len());
                        ids.push(id);
                        counts.extend_from_slice(c);
                        grads.extend_from_slice(g);
                    }
                }
            }
        }
    }
    let tables = merged.into_iter();
    Ok(tables
        .map(|(table, m)| SparseGrads { table, ids: m.ids.into(), counts: m.counts.into(), grads: m.grads.into() })
        .collect())
}
