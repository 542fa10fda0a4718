//! What ends a server, each a future [`first`] selects over besides its shutdown signal: every
//! trainer closed, a trainer lost for good, trainers that never came, a newer epoch in its place.
//!
//! A job that cannot finish fails instead of hanging. A server that exits when its trainers are
//! done (the default) fails when a trainer never connects within `--timeout` (naming it: the
//! `Hello` carries the trainer id) or disconnects without closing and does not come back within
//! `--trainer-rejoin` (under `oar train`, the job's `--recover-timeout`; crashed or killed: its
//! share of the data and its close can never come). That is what makes a failing rank end an
//! MPI or Slurm job: every rank ends, within the windows, so the launcher sees the failure.

use std::sync::Arc;
use std::time::Duration;

use super::State;

/// Every trainer has closed (only for a server that exits when its trainers are done).
pub(super) async fn all_closed(state: Arc<State>) {
    let mut done = state.all_closed.subscribe();
    if state.config.exit_when_done {
        let _ = done.wait_for(|d| *d).await;
    } else {
        std::future::pending::<()>().await;
    }
}

/// A server told to exit when its trainers are done must not wait forever for trainers that
/// never come (a failed launch, a wrong address): after `--timeout`, the ones that never came.
pub(super) async fn never_arrived(state: Arc<State>) -> Vec<u64> {
    if state.config.exit_when_done {
        tokio::time::sleep(state.config.timeout).await;
        let missing = state.never_arrived();
        if !missing.is_empty() {
            return missing;
        }
    }
    std::future::pending().await
}

/// A trainer that disconnected without closing can never finish the job (its close, its share
/// of the data, the final save): a server that would exit when its trainers are done fails
/// instead of waiting for it forever, or after the time it has to rejoin. The trainer, and that
/// time if any.
pub(super) async fn lost_trainer(state: Arc<State>) -> (u64, Option<Duration>) {
    // A window of 0 waits for nothing: the same as no window (`--trainer-rejoin 0`).
    let (mut lost, rejoin) = (state.lost.subscribe(), state.config.rejoin.filter(|w| !w.is_zero()));
    loop {
        if !state.config.exit_when_done {
            std::future::pending::<()>().await;
        }
        // The borrowed map is not Send: read it before any await.
        let first = lost.borrow_and_update().iter().min_by_key(|(_, at)| **at).map(|(t, at)| (*t, *at));
        match (first, rejoin) {
            (Some((t, _)), None) => return (t, None),
            (Some((t, at)), Some(window)) => {
                let timed_out = tokio::select! {
                    _ = tokio::time::sleep_until((at + window).into()) => true,
                    changed = lost.changed() => changed.is_err(),
                };
                if timed_out && lost.borrow().contains_key(&t) {
                    return (t, Some(window));
                }
            }
            (None, _) => {
                if lost.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// A newer epoch of this server has claimed its place: that epoch.
pub(super) async fn replaced(state: Arc<State>) -> u64 {
    let mut fenced = state.fenced.subscribe();
    // The borrowed value is not Send: read it before any other await.
    let newer = fenced.wait_for(Option::is_some).await.map(|e| e.unwrap_or_default());
    match newer {
        Ok(epoch) => epoch,
        Err(_) => std::future::pending().await,
    }
}

/// Waits for whichever end comes first: the shutdown signal or every trainer closed (`Ok`), or
/// a failure naming its cause: a newer epoch in this server's place, a trainer lost for good,
/// trainers that never came.
pub(super) async fn first(state: &Arc<State>, shutdown: impl std::future::Future<Output = ()>) -> anyhow::Result<()> {
    tokio::select! {
        _ = shutdown => {}
        _ = all_closed(state.clone()) => tracing::info!("every trainer has closed; stopping"),
        newer = replaced(state.clone()) => {
            return Err(anyhow::anyhow!(
                "server {} epoch {} has been replaced by epoch {newer} (it was stopped or unreachable and restarted): \
                 this process stops without touching the job's state",
                state.config.index,
                state.config.epoch
            ));
        }
        (trainer, window) = lost_trainer(state.clone()) => {
            let lost = match window {
                None => format!("trainer {trainer} disconnected without closing (it failed or was stopped): the job cannot finish"),
                Some(w) => format!(
                    "trainer {trainer} disconnected without closing and did not come back within {w:?} \
                     (--trainer-rejoin; under oar train, the job's --recover-timeout): the job cannot finish"
                ),
            };
            return Err(crate::base::exit::PeerLost(lost).into());
        }
        missing = never_arrived(state.clone()) => {
            return Err(anyhow::anyhow!(
                "trainer(s) {missing:?} of {} never connected within {:?} of this server starting (--timeout): \
                 check that they were started and can reach this server",
                state.config.trainers,
                state.config.timeout
            ));
        }
    }
    Ok(())
}
