//! Async mode's communication thread: pulls the parameters of the next batch while the current
//! one computes, and pushes gradients while the next one computes.
//!
//! Jobs run in the order they are sent over the trainer's one connection per server, so a pull
//! sent before a push never sees that push: a trainer computes from parameters that lack its
//! own latest update (one step of extra staleness, as PaddlePaddle's async communicator), and in
//! exchange its core never idles while servers work. Sync mode must not use this: there, the
//! pull of step t+1 has to follow the barrier of step t.
//!
//! Off by default (`pull_ahead`): it buys the CTR-DNN about 12% more samples/s at the same AUC,
//! but the extra step cost every sequence and multi-task model of the zoo 0.01-0.07 AUC against
//! local training, where pulling after each push keeps them within 0.007 (docs/src/modes.md): a
//! default must not depend on the model being easy. The default `lag_ratio` of 2.5
//! (PaddlePaddle's 1.5) leaves room for this pipeline, where a push is normally about
//! `trainers + 1` updates behind.

use std::sync::mpsc::{channel, sync_channel, Receiver, SyncSender};
use std::thread::{Scope, ScopedJoinHandle};

use parking_lot::Mutex;

use super::position::PositionLog;
use super::store::StepHeader;
use crate::client::{Client, TableGrads, TableIds};
use crate::observe::metrics::Staleness;
use crate::protocol::RowCreation;

/// Parameters pulled for one batch.
pub struct Pulled {
    /// Server version they were read at (for the staleness check of the matching push).
    pub version: u64,
    /// The dense vector.
    pub dense: Vec<f32>,
    /// Per table, the rows of the batch's unique ids.
    pub rows: Vec<Vec<f32>>,
}

/// A push's content, owned so it can cross to the communication thread.
pub struct PushJob {
    /// Who pushes which step.
    pub header: StepHeader,
    /// Dense gradient sums.
    pub dense: Vec<f32>,
    /// Per table, the unique ids, their shows and clicks, and their gradient sums.
    pub tables: Vec<(Vec<u64>, Vec<f32>, Vec<f32>)>,
    /// The batch's number in the trainer's position log, recorded once the push is answered.
    pub number: Option<u64>,
}

enum Job {
    Pull { ids: Vec<Vec<u64>>, dense: Vec<f32>, rows: Vec<Vec<f32>> },
    Push(PushJob),
}

/// The communication thread and its channels.
pub struct Ahead<'scope> {
    jobs: Option<SyncSender<Job>>,
    pulled: Receiver<Pulled>,
    thread: Option<ScopedJoinHandle<'scope, anyhow::Result<(u64, Staleness)>>>,
}

impl<'scope> Ahead<'scope> {
    /// Starts the thread in `scope`; it uses `client` until [`Ahead::finish`]. `dims[t]` is
    /// table `t`'s row width. A push is recorded in `positions` once a server has answered it,
    /// never when it is only queued: a push lost with a killed trainer is sent again by its
    /// restart, and one answered is not.
    pub fn start<'env>(
        scope: &'scope Scope<'scope, 'env>,
        client: &'scope mut Client,
        dims: Vec<usize>,
        positions: Option<&'scope Mutex<PositionLog>>,
    ) -> Ahead<'scope> {
        // Two jobs in flight at most: the next pull and the last push.
        let (jobs, rx) = sync_channel::<Job>(2);
        let (tx, pulled) = channel();
        let thread = std::thread::Builder::new()
            .name("oar-comm".into())
            .spawn_scoped(scope, move || {
                let (mut discarded, mut staleness) = (0u64, Staleness::default());
                for job in rx {
                    let result: Result<(), crate::client::ClientError> = match job {
                        Job::Pull { ids, mut dense, mut rows } => {
                            let tables: Vec<TableIds> = ids
                                .iter()
                                .enumerate()
                                .map(|(t, ids)| TableIds { table: t as u32, dim: dims[t], ids })
                                .collect();
                            rows.resize_with(ids.len(), Vec::new);
                            client.pull(Some(&mut dense), &tables, &mut rows, RowCreation::Create).map(|version| {
                                // The trainer may have stopped waiting: nothing to do then.
                                let _ = tx.send(Pulled { version, dense, rows });
                            })
                        }
                        Job::Push(p) => {
                            let tables: Vec<TableGrads> = p
                                .tables
                                .iter()
                                .enumerate()
                                .map(|(t, (ids, counts, grads))| TableGrads {
                                    table: t as u32,
                                    dim: dims[t],
                                    ids,
                                    counts,
                                    grads,
                                })
                                .collect();
                            match client.push(&p.header, Some(&p.dense), &tables) {
                                Ok(r) => {
                                    discarded += r.discarded as u64;
                                    staleness.add(r.staleness);
                                    if let (Some(log), Some(n)) = (positions, p.number) {
                                        log.lock().done(n)?;
                                    }
                                    Ok(())
                                }
                                Err(e) => Err(e),
                            }
                        }
                    };
                    result?;
                }
                Ok((discarded, staleness))
            })
            .expect("spawning a thread only fails when the OS is out of resources");
        Ahead { jobs: Some(jobs), pulled, thread: Some(thread) }
    }

    fn send(&mut self, job: Job) -> anyhow::Result<()> {
        let sent = self.jobs.as_ref().expect("jobs are only taken by finish").send(job);
        if sent.is_err() {
            return Err(self.failure());
        }
        Ok(())
    }

    /// The communication thread has stopped: returns its error.
    fn failure(&mut self) -> anyhow::Error {
        self.jobs = None;
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Err(e))) => e,
            Some(Err(_)) => anyhow::anyhow!("the communication thread panicked"),
            _ => anyhow::anyhow!("the communication thread stopped"),
        }
    }

    /// Starts pulling the parameters of every table's `ids`, reusing `dense` and `rows` as
    /// buffers.
    pub fn pull(&mut self, ids: Vec<Vec<u64>>, dense: Vec<f32>, rows: Vec<Vec<f32>>) -> anyhow::Result<()> {
        self.send(Job::Pull { ids, dense, rows })
    }

    /// Waits for the oldest requested pull.
    pub fn pulled(&mut self) -> anyhow::Result<Pulled> {
        match self.pulled.recv() {
            Ok(p) => Ok(p),
            Err(_) => Err(self.failure()),
        }
    }

    /// Queues a push.
    pub fn push(&mut self, job: PushJob) -> anyhow::Result<()> {
        self.send(Job::Push(job))
    }

    /// Waits for every queued job; returns the number of discarded pushes and how stale the
    /// pushes arrived.
    pub fn finish(mut self) -> anyhow::Result<(u64, Staleness)> {
        self.jobs = None;
        match self.thread.take().expect("finish is called once").join() {
            Ok(result) => result,
            Err(_) => Err(anyhow::anyhow!("the communication thread panicked")),
        }
    }
}
