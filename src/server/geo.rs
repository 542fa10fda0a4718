//! GEO mode's record of which rows changed ([`ChangeLog`]): every trainer pulls back the rows
//! any trainer's push changed since it last asked (Paddle's `GeoRecorder`, which keeps a set per
//! trainer). Here one log of the pushed ids is shared, each trainer reading from its own cursor,
//! so the memory is the ids pushed since the slowest trainer last asked, not a copy per trainer.
//!
//! Bounded: when the log holds more than its capacity the oldest pushes are dropped and a
//! trainer that had not read them is told `all` (every row it holds may have changed), so a
//! trainer that never asks (stopped, or hostile) cannot make the server's memory grow. A server
//! restored from a checkpoint does not know what changed before it stopped: it tells every
//! trainer `all` once. Pure state, unit-tested; the server keeps one behind a lock.

use std::collections::VecDeque;

/// What [`ChangeLog::take`] answers a trainer.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Changes {
    /// Every row may have changed: the trainer pulls back all the rows it holds.
    All,
    /// The ids changed, per table, each sorted and once.
    Ids(Vec<Vec<u64>>),
}

/// The ids pushed, in order, with each trainer's place in them.
pub(super) struct ChangeLog {
    /// (sequence number, table, ids) per push part since the oldest cursor.
    entries: VecDeque<(u64, u32, Vec<u64>)>,
    /// The sequence number of the next entry.
    next: u64,
    /// Per trainer, the first entry it has not read; `None`: it cannot be told which rows
    /// changed (entries it had not read were dropped, or the server restarted).
    cursors: Vec<Option<u64>>,
    /// Ids held in `entries`.
    held: usize,
    /// Most ids held; past it the oldest entries go.
    capacity: usize,
    tables: usize,
}

impl ChangeLog {
    /// A log for `trainers` trainers over `tables` sparse tables, holding at most `capacity`
    /// ids; `restored`: the server's tables came from a checkpoint, so what changed before is
    /// not known.
    pub(super) fn new(trainers: usize, tables: usize, capacity: usize, restored: bool) -> ChangeLog {
        let cursor = if restored { None } else { Some(0) };
        ChangeLog { entries: VecDeque::new(), next: 0, cursors: vec![cursor; trainers], held: 0, capacity, tables }
    }

    /// Records that a push changed the rows of `ids` in `table`.
    pub(super) fn record(&mut self, table: u32, ids: &[u64]) {
        if ids.is_empty() || self.cursors.iter().all(Option::is_none) {
            return; // nobody could read it
        }
        self.entries.push_back((self.next, table, ids.to_vec()));
        self.next += 1;
        self.held += ids.len();
        while self.held > self.capacity {
            let Some((seq, _, dropped)) = self.entries.pop_front() else { break };
            self.held -= dropped.len();
            for c in &mut self.cursors {
                if c.is_some_and(|c| c <= seq) {
                    *c = None;
                }
            }
        }
    }

    /// The rows changed since `trainer` last asked (its own pushes included, as in Paddle: its
    /// copy of a row takes the others' changes and its own share back together); from now on
    /// it reads what comes next.
    pub(super) fn take(&mut self, trainer: usize) -> Changes {
        let Some(cursor) = self.cursors.get_mut(trainer) else { return Changes::All };
        let from = cursor.replace(self.next);
        let changes = match from {
            None => Changes::All,
            Some(from) => {
                let mut ids = vec![Vec::new(); self.tables];
                for (_, table, pushed) in self.entries.iter().filter(|(seq, _, _)| *seq >= from) {
                    if let Some(t) = ids.get_mut(*table as usize) {
                        t.extend_from_slice(pushed);
                    }
                }
                for t in &mut ids {
                    t.sort_unstable();
                    t.dedup();
                }
                Changes::Ids(ids)
            }
        };
        self.trim();
        changes
    }

    /// `trainer` has closed: it will not read again, and holds nothing back.
    pub(super) fn forget(&mut self, trainer: usize) {
        if let Some(c) = self.cursors.get_mut(trainer) {
            *c = None;
        }
        self.trim();
    }

    /// Ids held now.
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held
    }

    /// Drops the entries every trainer has read.
    fn trim(&mut self) {
        let oldest = self.cursors.iter().flatten().min().copied().unwrap_or(self.next);
        while self.entries.front().is_some_and(|(seq, _, _)| *seq < oldest) {
            let (_, _, dropped) = self.entries.pop_front().expect("a front entry");
            self.held -= dropped.len();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(c: Changes) -> Vec<Vec<u64>> {
        match c {
            Changes::Ids(ids) => ids,
            Changes::All => panic!("expected ids, got all"),
        }
    }

    #[test]
    fn each_trainer_reads_every_change_since_it_last_asked_once_sorted_and_per_table() {
        let mut log = ChangeLog::new(2, 2, 100, false);
        log.record(0, &[5, 3]);
        log.record(1, &[7]);
        assert_eq!(ids(log.take(0)), vec![vec![3, 5], vec![7]]);
        log.record(0, &[3, 1]);
        assert_eq!(ids(log.take(0)), vec![vec![1, 3], Vec::<u64>::new()]);
        // Trainer 1 has not asked yet: it reads all three pushes, 3 once.
        assert_eq!(ids(log.take(1)), vec![vec![1, 3, 5], vec![7]]);
        assert_eq!(log.held(), 0, "read by both: dropped");
        assert_eq!(ids(log.take(1)), vec![Vec::<u64>::new(), vec![]]);
    }

    #[test]
    fn a_trainer_that_falls_behind_the_capacity_is_told_all_once_and_holds_nothing_back() {
        let mut log = ChangeLog::new(2, 1, 4, false);
        log.record(0, &[1, 2]);
        assert_eq!(ids(log.take(0)), vec![vec![1, 2]]);
        log.record(0, &[3, 4]);
        log.record(0, &[5]); // 5 ids held: the first push goes, unread by trainer 1
        assert!(log.held() <= 4);
        assert_eq!(log.take(1), Changes::All);
        assert_eq!(ids(log.take(0)), vec![vec![3, 4, 5]]);
        assert_eq!(log.held(), 0);
        log.record(0, &[6]);
        assert_eq!(ids(log.take(1)), vec![vec![6]], "told all once, then followed again");
    }

    #[test]
    fn a_restored_server_tells_all_once_and_a_closed_or_unknown_trainer_holds_nothing() {
        let mut log = ChangeLog::new(2, 1, 10, true);
        log.record(0, &[1]);
        assert_eq!(log.held(), 0, "nobody can read it yet");
        assert_eq!(log.take(0), Changes::All);
        log.record(0, &[2]);
        assert_eq!(ids(log.take(0)), vec![vec![2]]);
        assert_eq!(log.take(1), Changes::All);
        log.record(0, &[3]);
        log.forget(1);
        assert_eq!(ids(log.take(0)), vec![vec![3]]);
        assert_eq!(log.held(), 0);
        assert_eq!(log.take(9), Changes::All, "a trainer beyond the job's is never told ids");
    }
}
