//! Trainer 0's day end as a rejoin sees it: the points where the fault tests kill it, and the
//! day ends a rejoining trainer 0 sends again (each server applies a day end once).

use anyhow::Context;

use super::{Position, Store, TrainConfig};

/// The points of trainer 0's day end where the fault tests kill it (see [`crate::base::fault`]).
#[derive(Clone, Copy)]
pub(super) enum DayEndPoint {
    BeforeShrink = 1,
    Shrunk = 2,
    SavedForServing = 3,
    Saved = 4,
}

/// Fires a fault planned for trainer 0 at `point` of a day's end.
pub(super) fn day_end_fault(point: DayEndPoint) {
    crate::base::fault::at_trainer(0, crate::base::fault::Moment::DayEnd(point as u64));
}

/// Sends again the shrinks of the day ends this run passed before `start` (a rejoining
/// trainer 0): each server applies a day end once, so the ones it holds are repeats, and a
/// server restored meanwhile from a checkpoint older than one of them gets it now.
pub(super) fn catch_up_day_ends(config: &TrainConfig, store: &mut Store, start: &Position) -> anyhow::Result<()> {
    let (Some(o), Store::Remote(_), 0, true) = (&config.online, &*store, config.trainer_id, config.rejoin) else {
        return Ok(());
    };
    for pass in (start.first_pass..start.pass).filter(|&p| o.slot(p).day_end) {
        store.shrink_day_end(pass).with_context(|| format!("sending again the day end after pass {pass}"))?;
    }
    Ok(())
}
