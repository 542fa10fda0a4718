//! Membership: barriers, pass ends, closes, the trainers' record beside the checkpoints, and
//! the final save once every trainer has closed, with the mark that the run finished. On
//! server 0, each trainer's AUC histogram of the last 3 passes, merged on request (the AUC over
//! all trainers).

use std::sync::Arc;

use super::push::complete_step;
use super::{Answer, Reply, State};
use crate::protocol::{ErrorCode, GlobalAuc, Response};

/// Waits until every active trainer has reached barrier `epoch`.
pub(super) async fn barrier(state: &Arc<State>, trainer: u64, epoch: u64) -> Reply {
    state.barrier.lock().insert(trainer, epoch);
    state.changed.send_modify(|g| *g += 1);
    let mut changed = state.changed.subscribe();
    let missing = || -> Vec<u64> {
        let reached = state.barrier.lock();
        state.active().into_iter().filter(|t| reached.get(t).is_none_or(|&e| e < epoch)).collect()
    };
    let wait = async {
        loop {
            if missing().is_empty() {
                return;
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    };
    match tokio::time::timeout(state.config.timeout, wait).await {
        Ok(()) => Ok(Answer::Response(Response::Done)),
        Err(_) => Err((
            ErrorCode::Timeout,
            format!(
                "barrier {epoch} timed out after {:?} waiting for trainer(s) {:?}",
                state.config.timeout,
                missing()
            ),
        )),
    }
}

/// Records beside the checkpoints which trainers have ended the pass or closed, for a restart
/// of this server (see `shard_checkpoints::Trainers`): a trainer that ended its pass waits at
/// the barrier and will not tell a restarted server again.
fn record_trainers(state: &State) {
    let Some(policy) = &state.config.checkpoints else { return };
    // Held while writing, so records land in the order of the changes they hold; the sync step
    // is locked only to read it, so pushes never wait for the disk.
    let _order = state.recording.lock();
    let record = {
        let pending = state.sync.lock();
        crate::server::shard_checkpoints::Trainers {
            job: state.config.job.clone(),
            closed: state.closed.lock().iter().copied().collect(),
            pass: pending.pass,
            ended: pending.ended(),
        }
    };
    if let Err(e) = record.write(&policy.dir, state.config.index) {
        tracing::error!("cannot record where the trainers are (a restart of this server would wait for them): {e}");
    }
}

/// `trainer` has no more steps in `pass`: the sync step stops waiting for it.
pub(super) fn end_pass(state: &Arc<State>, trainer: u64, pass: u64) -> Reply {
    let shard = state.shard()?;
    let bound = state.pass_bound(Some(trainer));
    if pass > bound {
        let m =
            format!("trainer {trainer}'s end of pass {pass} refused: the trainers are in pass {} at most", bound - 1);
        return Err((ErrorCode::State, m));
    }
    {
        let mut pending = state.sync.lock();
        pending.end_pass(trainer, pass);
        complete_step(state, &shard, &mut pending)?;
    }
    record_trainers(state);
    Ok(Answer::Response(Response::Done))
}

/// `trainer` is done; the last close saves the model and stops the server.
pub(super) fn close(state: &Arc<State>, trainer: u64) -> Reply {
    let all = {
        let mut closed = state.closed.lock();
        closed.insert(trainer);
        closed.len() >= state.config.trainers
    };
    tracing::info!(trainer, "trainer closed");
    record_trainers(state);
    state.lost.send_if_modified(|lost| lost.remove(&trainer).is_some());
    // Its barrier position, any half-sent push and its place in GEO's log go with it.
    state.barrier.lock().remove(&trainer);
    if let Some(log) = state.changes.lock().as_mut() {
        log.forget(trainer as usize);
    }
    // A closed trainer no longer holds back a sync step or a barrier.
    if let Ok(shard) = state.shard() {
        let mut pending = state.sync.lock();
        pending.close(trainer);
        complete_step(state, &shard, &mut pending)?;
    }
    state.changed.send_modify(|g| *g += 1);
    if all {
        if let Some(dir) = &state.config.save_dir {
            save_final(state, dir)?;
        }
        if let Some(policy) = &state.config.checkpoints {
            crate::server::shard_checkpoints::mark_finished(&policy.dir, state.config.index, &state.config.job)
                .map_err(|e| (ErrorCode::Io, format!("marking the run finished: {e}")))?;
        }
        // Stop only after this reply is on the wire (see `serve_connection`), or the last
        // trainer's close could be cut off by the shutdown it causes.
        Ok(Answer::LastClose)
    } else {
        Ok(Answer::Response(Response::Done))
    }
}

/// Saves this server's shard into `dir` once every trainer has closed (see
/// [`crate::persist::checkpoint::save_server_final`]).
pub(super) fn save_final(state: &State, dir: &std::path::Path) -> Result<(), (ErrorCode, String)> {
    let shard = state.shard()?;
    let pass = state.sync.lock().pass as u32;
    let model = state.model.lock().clone();
    let complete = crate::persist::checkpoint::save_server_final(&shard, dir, &state.config.job, pass, &model)
        .map_err(|e| (ErrorCode::Io, format!("saving the final model: {e}")))?;
    tracing::info!(dir = %dir.display(), pass, manifest_written = complete, "every trainer has closed: model saved");
    Ok(())
}

/// Passes whose AUC histograms a server keeps of each trainer: a pass's figure is read right
/// after its barrier.
const AUC_PASSES: usize = 3;

/// Keeps trainer `trainer`'s histogram of pass `pass` (a resend replaces it: counted once).
pub(super) fn pass_auc(state: &State, trainer: u64, pass: u64, pos: &[u64], neg: &[u64], sums: [f64; 3]) -> Reply {
    let want = crate::observe::metrics::AUC_BUCKETS;
    if pos.len() != want || neg.len() != want {
        // Checked before copying: a frame's arrays may be as long as its bound.
        let message = format!("an AUC histogram has {} and {} buckets, not {want}", pos.len(), neg.len());
        return Err((ErrorCode::Malformed, message));
    }
    let buckets = crate::observe::metrics::AucBuckets { pos: pos.to_vec(), neg: neg.to_vec(), sums };
    if !buckets.is_valid() {
        let message = format!(
            "an AUC histogram of {} samples (at most {}) with error sums {:?} its buckets do not allow",
            buckets.samples(),
            crate::observe::metrics::MAX_PASS_SAMPLES,
            buckets.sums
        );
        return Err((ErrorCode::Malformed, message));
    }
    let bound = state.pass_bound(Some(trainer));
    if pass > bound {
        let m =
            format!("trainer {trainer}'s AUC of pass {pass} refused: the trainers are in pass {} at most", bound - 1);
        return Err((ErrorCode::State, m));
    }
    let mut all = state.pass_auc.lock();
    all.entry(pass).or_default().insert(trainer, buckets);
    // Each trainer's own newest passes are kept: what one trainer sends never pushes out
    // another's histogram of the pass about to be read.
    let sent: Vec<u64> = all.iter().filter(|(_, by)| by.contains_key(&trainer)).map(|(p, _)| *p).collect();
    for old in &sent[..sent.len().saturating_sub(AUC_PASSES)] {
        let by = all.get_mut(old).expect("listed just above");
        by.remove(&trainer);
        if by.is_empty() {
            all.remove(old);
        }
    }
    Ok(Answer::Response(Response::Done))
}

/// Pass `pass`'s histograms merged, with the trainers that sent one ([`GlobalAuc`]).
pub(super) fn global_auc(state: &State, pass: u64) -> Reply {
    let all = state.pass_auc.lock();
    let Some(sent) = all.get(&pass) else {
        let kept: Vec<&u64> = all.keys().collect();
        return Err((ErrorCode::State, format!("no trainer sent an AUC histogram of pass {pass} (kept: {kept:?})")));
    };
    let mut global = GlobalAuc { trainers: sent.keys().copied().collect(), ..GlobalAuc::default() };
    for b in sent.values() {
        global.buckets.merge(b);
    }
    Ok(Answer::Response(Response::Stats(serde_json::to_string(&global).expect("a histogram serializes"))))
}
