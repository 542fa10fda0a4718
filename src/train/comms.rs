//! How a trainer's workers talk to the parameters ([`Comms`]): the next batch with its pulled
//! parameters, in line or pulled ahead by the communication thread, and the push of each step's
//! gradients (merged during the warm-up, delayed in local mode's `delay`); and the batches
//! prepared for it ([`Prepared`]: ids deduplicated per table).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use parking_lot::Mutex;

use super::ahead::{Ahead, PushJob};
use super::geo::{ExchangeHeader, GeoCopy};
use super::position::PositionLog;
use super::step::Replica;
use super::warmup::{Split, Warmup};
use super::{Lookups, StepHeader, StepTimes, Store};
use crate::base::batch::Batch;
use crate::client::PushReport;
use crate::data::Reader;
use crate::model::Model;
use crate::observe::metrics::Staleness;
use crate::protocol::{Apply, RowCreation};

/// A batch with its ids deduplicated per table.
pub(super) struct Prepared {
    pub(super) batch: Batch,
    pub(super) lookups: Lookups,
}

pub(super) fn next_prepared(reader: &mut Reader, model: &Model) -> anyhow::Result<Option<Prepared>> {
    let Some(batch) = reader.next() else { return Ok(None) };
    prepare(batch?, model).map(Some)
}

fn prepare(batch: Batch, model: &Model) -> anyhow::Result<Prepared> {
    model.check_batch(&batch).map_err(anyhow::Error::msg)?;
    let mut lookups = Lookups::default();
    lookups.run(&batch, model.table_slots(), model.click_column());
    Ok(Prepared { batch, lookups })
}

/// How a worker gets its next batch with parameters and sends its gradients.
pub(super) enum Comms<'a, 'b> {
    /// Pull and push in line, the reader and the store shared by the pass's workers (sync,
    /// local, and async with several threads: Hogwild).
    Direct {
        reader: &'a Mutex<Reader>,
        store: &'a Mutex<&'b mut Store>,
        params: Vec<f32>,
        rows: Vec<Vec<f32>>,
        /// Updates computed but not applied yet (local mode's `delay`), oldest first.
        delayed: std::collections::VecDeque<PushJob>,
        delay: usize,
        /// Steps before this one are applied at once despite `delay` (the warm-up).
        delay_from: u64,
        /// Set while async mode's synchronous warm-up lasts: its steps are pushed as sync.
        warmup: Option<Warmup>,
        /// After it, how reader batches are cut into steps (`sync_dense`'s smaller steps; else whole).
        split: Split,
    },
    /// GEO: the trainer's own copy of what it touches, trained step after step and exchanged
    /// with the servers every `k` steps ([`GeoCopy`]).
    Geo {
        reader: &'a Mutex<Reader>,
        store: &'a Mutex<&'b mut Store>,
        copy: Box<GeoCopy>,
        rows: Vec<Vec<f32>>,
        header: ExchangeHeader<'a>,
    },
    /// Async with one thread: the next batch's pull runs while this one computes.
    Ahead {
        reader: &'a Mutex<Reader>,
        ahead: Ahead<'a>,
        next: Option<Box<Prepared>>,
        params: Vec<f32>,
        rows: Vec<Vec<f32>>,
    },
}

impl Comms<'_, '_> {
    /// The next batch, the version of its parameters (now in `params`/`rows`), its step and its
    /// number in `positions` (when recorded); `None` at the end of the pass. Steps are numbered
    /// in the order batches leave the reader, as positions are: a restarted trainer numbers the
    /// same batch with the same step, which is how servers know a push sent again.
    pub(super) fn next(
        &mut self,
        model: &Model,
        dims: &[usize],
        times: &mut StepTimes,
        step: &AtomicU64,
        positions: Option<&Mutex<PositionLog>>,
    ) -> anyhow::Result<Option<Next>> {
        let t0 = Instant::now();
        let take = |p: &Prepared| positions.map(|log| log.lock().take(p.batch.len() as u64));
        match self {
            Comms::Direct { reader, store, params, rows, warmup, split, .. } => {
                // Numbered under the reader's lock: in the order batches leave the reader.
                let mut r = reader.lock();
                let batch = match warmup {
                    Some(w) => w.next(&mut r)?,
                    None => split.next(&mut r, step.load(Relaxed))?,
                };
                let p = batch.map(|b| prepare(b, model)).transpose()?;
                let Some(p) = p else { return Ok(None) };
                let number = take(&p);
                let step = step.fetch_add(1, Relaxed);
                drop(r);
                let t1 = Instant::now();
                rows.resize_with(dims.len(), Vec::new);
                let version = store.lock().pull(Some(params), &p.lookups.ids(dims), rows, RowCreation::Create)?;
                times.data += (t1 - t0).as_secs_f64();
                times.pull += t1.elapsed().as_secs_f64();
                Ok(Some((p, version, step, number)))
            }
            Comms::Geo { reader, store, copy, rows, header } => {
                let mut r = reader.lock();
                let Some(p) = next_prepared(&mut r, model)? else { return Ok(None) };
                let number = take(&p);
                let step = step.fetch_add(1, Relaxed);
                drop(r);
                let t1 = Instant::now();
                let mut store = store.lock();
                // Due after the last step: done once a next batch shows the pass goes on (the
                // pass's last exchange is `finish`'s).
                if copy.due() {
                    copy.exchange(&mut store, header)?;
                }
                copy.fetch(&mut store, &p.lookups, rows)?;
                times.data += (t1 - t0).as_secs_f64();
                times.pull += t1.elapsed().as_secs_f64();
                Ok(Some((p, 0, step, number)))
            }
            Comms::Ahead { reader, ahead, next, params, rows } => {
                let Some(current) = next.take() else { return Ok(None) };
                let pulled = ahead.pulled()?;
                let spare = (std::mem::replace(params, pulled.dense), std::mem::replace(rows, pulled.rows));
                let t1 = Instant::now();
                *next = next_prepared(&mut reader.lock(), model)?.map(Box::new);
                if let Some(n) = next {
                    ahead.pull(n.lookups.unique_ids(), spare.0, spare.1)?;
                }
                times.pull += (t1 - t0).as_secs_f64();
                times.data += t1.elapsed().as_secs_f64();
                let number = take(&current);
                Ok(Some((*current, pulled.version, step.fetch_add(1, Relaxed), number)))
            }
        }
    }

    pub(super) fn params(&self) -> (&[f32], &[Vec<f32>]) {
        match self {
            Comms::Direct { params, rows, .. } | Comms::Ahead { params, rows, .. } => (params, rows),
            Comms::Geo { copy, rows, .. } => (&copy.params, rows),
        }
    }

    /// Sends one step's gradients; says how many servers discarded them and how stale they
    /// arrived (`None`: not known yet, the communication thread counts it).
    pub(super) fn push(
        &mut self,
        header: StepHeader,
        r: &Replica,
        lookups: &Lookups,
        dims: &[usize],
        number: Option<u64>,
    ) -> anyhow::Result<Option<PushReport>> {
        match self {
            Comms::Direct { store, warmup: Some(_), .. } => {
                let header = StepHeader { apply: Apply::Merged, ..header };
                store.lock().push(&header, &r.grads, &lookups.grads(dims, &r.row_grads))?;
                Ok(None) // a merged step: never stale, not part of the async histogram
            }
            Comms::Direct { store, delay: 0, .. } => {
                Ok(Some(store.lock().push(&header, &r.grads, &lookups.grads(dims, &r.row_grads))?))
            }
            Comms::Direct { store, delay_from, .. } if header.step < *delay_from => {
                store.lock().push(&header, &r.grads, &lookups.grads(dims, &r.row_grads))?;
                Ok(None) // the delayed mode's stand-in for the warm-up: not stale
            }
            Comms::Direct { store, delayed, delay, .. } => {
                delayed.push_back(push_job(header, r, lookups, None));
                if delayed.len() <= *delay {
                    return Ok(None); // applied later: counted when it is
                }
                let job = delayed.pop_front().expect("longer than the delay");
                Ok(Some(store.lock().push_late(&job.header, &job.dense, &job_grads(&job, dims), *delay as u64)?))
            }
            Comms::Ahead { ahead, .. } => {
                ahead.push(push_job(header, r, lookups, number))?;
                Ok(None)
            }
            Comms::Geo { copy, .. } => {
                copy.step(&r.grads, &r.row_grads, lookups, header.samples)?;
                Ok(None) // the servers hear of it at the next exchange
            }
        }
    }

    /// Ends the pass's communication; returns what was not counted yet: discarded pushes and
    /// the staleness of pushes.
    pub(super) fn finish(self, dims: &[usize]) -> anyhow::Result<(u64, Staleness)> {
        match self {
            Comms::Direct { store, delayed, delay, .. } => {
                // The pass ends with every computed update applied.
                let mut staleness = Staleness::default();
                for job in delayed {
                    store.lock().push_late(&job.header, &job.dense, &job_grads(&job, dims), delay as u64)?;
                    staleness.add(delay as u64);
                }
                Ok((0, staleness))
            }
            Comms::Ahead { ahead, .. } => ahead.finish(),
            Comms::Geo { store, mut copy, header, .. } => {
                // The pass's last steps' share; the copy goes with the pass (see `train::geo`).
                copy.exchange(&mut store.lock(), &header)?;
                Ok((0, Staleness::default()))
            }
        }
    }
}

/// The next batch (see [`Comms::next`]): the batch, its parameters' version, its step and its
/// number in the position log.
pub(super) type Next = (Prepared, u64, u64, Option<u64>);

/// One step's gradients, owned (for the communication thread or a delayed update).
fn push_job(header: StepHeader, r: &Replica, lookups: &Lookups, number: Option<u64>) -> PushJob {
    let tables = lookups.tables.iter().zip(&r.row_grads).map(|(l, g)| (l.unique.clone(), l.counts.clone(), g.clone()));
    PushJob { header, dense: r.grads.clone(), tables: tables.collect(), number }
}

/// A job's sparse gradients as a push sends them.
fn job_grads<'a>(job: &'a PushJob, dims: &[usize]) -> Vec<crate::client::TableGrads<'a>> {
    let tables = job.tables.iter().enumerate();
    tables
        .map(|(t, (ids, counts, grads))| crate::client::TableGrads {
            table: t as u32,
            dim: dims[t],
            ids,
            counts,
            grads,
        })
        .collect()
}
