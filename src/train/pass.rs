//! The steps of one pass ([`PassLoop`]): the synchronous warm-up then the rest, each worker
//! (one, or several Hogwild workers in async mode against servers) pulling, computing and
//! pushing batch after batch through its [`Comms`], with progress reported from the calling
//! thread.
//!
//! One training loop: local, sync, async with the next pull overlapped, and Hogwild threads
//! differ only in how a worker gets a batch with its parameters and sends its gradients
//! ([`Comms`]: `Direct` or `Ahead`); the loop body (compute, push, metrics, timing) is written
//! once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::ahead::Ahead;
use super::comms::{next_prepared, Comms};
use super::geo::{ExchangeHeader, GeoCopy};
use super::position::PositionLog;
use super::step::{clip, compute, Replica};
use super::warmup::{Ramp, Split, Warmup, WarmupPlan};
use super::{dims, HeadMetrics, StepHeader, StepTimes, Store, TrainConfig, TrainReport};
use crate::data::Reader;
use crate::model::Model;
use crate::observe::curves::{CurveLog, Kind, Point};
use crate::observe::metrics::Staleness;
use crate::protocol::Apply;
use crate::protocol::Mode;

/// What one worker did in a pass.
struct WorkerReport {
    metrics: HeadMetrics,
    staleness: Staleness,
    times: StepTimes,
    samples: u64,
    discarded: u64,
    /// Steps whose gradients `clip_grad_norm` scaled down.
    clipped: u64,
    train_seconds: f64,
}

/// The steps of one pass.
pub(super) struct PassLoop<'a> {
    pub(super) config: &'a TrainConfig,
    pub(super) model: &'a Model,
    pub(super) pass: u32,
    pub(super) step: AtomicU64,
    /// GEO mode: this trainer's exchanges so far, across passes.
    pub(super) geo_exchanges: AtomicU64,
    /// The job's tables, with the rules a GEO trainer runs on its copy.
    pub(super) spec: &'a crate::table::TableSpec,
    /// The synchronous updates to make before going async (async mode against servers).
    pub(super) plan: WarmupPlan,
    /// Where the trainer's position is recorded after each push.
    pub(super) positions: Option<&'a Mutex<PositionLog>>,
    /// Where curve points go, and when the trainer started.
    pub(super) curves: Option<(&'a CurveLog, Instant)>,
    /// What the metrics endpoint shows.
    pub(super) telemetry: Option<&'a super::telemetry::TrainerTelemetry>,
}

impl PassLoop<'_> {
    /// Trains on every batch of `reader`; returns the pass's training metrics. One worker
    /// splits each batch over `threads` replicas, except in async mode against servers: one
    /// thread pulls ahead ([`Ahead`]), several train Hogwild-style, each its own batches,
    /// sharing the reader and the connections (held only while a request is on the wire).
    pub(super) fn run(
        &self,
        store: &mut Store,
        reader: Reader,
        report: &mut TrainReport,
        on_progress: &dyn Fn(u64),
    ) -> anyhow::Result<HeadMetrics> {
        let c = self.config;
        let reader = Mutex::new(reader);
        let mut metrics = HeadMetrics::new(self.model);
        if c.mode == Mode::Async && matches!(store, Store::Remote(_)) && self.plan.steps > 0 {
            let split = Split { parts_done: self.plan.parts_done, ..Split::parts(c.trainers) };
            let warmup = Warmup { steps: self.plan.steps, split };
            metrics.merge(&self.segment(store, &reader, Some(warmup), report, on_progress)?);
            tracing::info!(
                trainer = c.trainer_id,
                pass = self.pass,
                updates = self.plan.steps,
                "synchronous warm-up done: going async"
            );
        }
        metrics.merge(&self.segment(store, &reader, None, report, on_progress)?);
        Ok(metrics)
    }

    /// Trains on the batches of `reader` (with `warmup`: the warm-up's only).
    fn segment(
        &self,
        store: &mut Store,
        reader: &Mutex<Reader>,
        warmup: Option<Warmup>,
        report: &mut TrainReport,
        on_progress: &dyn Fn(u64),
    ) -> anyhow::Result<HeadMetrics> {
        let c = self.config;
        // Hogwild workers and pulls ahead are async's alone: a `sync_dense` step is one per
        // trainer, and its next pull must follow the merged update.
        let remote_async =
            c.mode == Mode::Async && matches!(store, Store::Remote(_)) && warmup.is_none() && !c.sync_dense;
        let workers = if remote_async { c.threads } else { 1 };
        let replicas = if remote_async { 1 } else { c.threads };
        let dims = dims(self.model);
        let samples_before = report.samples;
        let samples = AtomicU64::new(samples_before);
        let failed = AtomicBool::new(false);
        let started = Instant::now();
        let mut warmup = warmup;
        let (client, shared) = match store {
            Store::Remote(client) if remote_async && workers == 1 && c.pull_ahead => (Some(&mut **client), None),
            other => (None, Some(Mutex::new(other))),
        };
        let results: Vec<anyhow::Result<WorkerReport>> = std::thread::scope(|scope| {
            let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
            let mut all_comms = Vec::new();
            match (client, &shared) {
                (Some(client), _) => {
                    let mut ahead = Ahead::start(scope, client, dims.clone(), self.positions);
                    all_comms.push(next_prepared(&mut reader.lock(), self.model).and_then(|next| {
                        if let Some(n) = &next {
                            ahead.pull(n.lookups.unique_ids(), Vec::new(), Vec::new())?;
                        }
                        Ok(Comms::Ahead {
                            reader,
                            ahead,
                            next: next.map(Box::new),
                            params: Vec::new(),
                            rows: Vec::new(),
                        })
                    }))
                }
                (None, Some(store)) if c.mode == Mode::Geo => all_comms.push(Ok(Comms::Geo {
                    reader,
                    store,
                    copy: Box::new(GeoCopy::new(self.spec, c.trainers, c.geo_k_steps)),
                    rows: Vec::new(),
                    header: ExchangeHeader { trainer: c.trainer_id, pass: self.pass, exchanges: &self.geo_exchanges },
                })),
                (None, Some(store)) => all_comms.extend((0..workers).map(|_| {
                    Ok(Comms::Direct {
                        reader,
                        store,
                        params: Vec::new(),
                        rows: Vec::new(),
                        delayed: Default::default(),
                        delay: c.delay,
                        delay_from: self.plan.steps,
                        split: match (&warmup, c.sync_dense) {
                            (None, true) => Split::ramped(Ramp::new(c)),
                            _ => Split::parts(1),
                        },
                        warmup: warmup.take(),
                    })
                })),
                (None, None) => unreachable!("the store is either shared or the client's"),
            }
            let handles: Vec<_> = all_comms
                .into_iter()
                .map(|comms| {
                    let (dims, samples, failed, done) = (&dims, &samples, &failed, done_tx.clone());
                    scope.spawn(move || {
                        let r = comms.and_then(|comms| self.worker(comms, dims, replicas, samples, failed));
                        let _ = done.send(());
                        r
                    })
                })
                .collect();
            drop(done_tx);
            // Progress is reported from this thread: the callback need not be thread-safe.
            let mut finished = 0;
            while finished < handles.len() {
                match done_rx.recv_timeout(Duration::from_millis(100)) {
                    Ok(()) => finished += 1,
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                }
                on_progress(samples.load(Relaxed));
            }
            handles.into_iter().map(|h| h.join().expect("a trainer thread panicked")).collect()
        });
        let mut merged = HeadMetrics::new(self.model);
        for r in results {
            let r = r?;
            merged.merge(&r.metrics);
            report.time += r.times;
            report.samples += r.samples;
            report.discarded_pushes += r.discarded;
            report.clipped_steps += r.clipped;
            report.staleness.merge(&r.staleness);
            if workers == 1 {
                report.train_seconds += r.train_seconds;
            }
        }
        on_progress(report.samples);
        if workers > 1 {
            // The workers' steps overlap: the pass's wall time is the time spent training.
            report.train_seconds += started.elapsed().as_secs_f64();
            tracing::info!(trainer = c.trainer_id, pass = self.pass, threads = workers, "pass trained Hogwild-style");
        }
        Ok(merged)
    }

    /// One worker's share of the pass: batch after batch, pull, compute, push.
    fn worker(
        &self,
        mut comms: Comms,
        dims: &[usize],
        replicas: usize,
        samples: &AtomicU64,
        failed: &AtomicBool,
    ) -> anyhow::Result<WorkerReport> {
        let (c, model, me) = (self.config, self.model, self.config.trainer_id);
        let mut replicas: Vec<Replica> = (0..replicas).map(|_| Replica::default()).collect();
        let stats: Vec<_> = crate::table::summaries(model.params()).into_iter().map(|(r, _)| r).collect();
        let mut report = WorkerReport {
            metrics: HeadMetrics::new(model),
            staleness: Staleness::default(),
            times: StepTimes::default(),
            samples: 0,
            discarded: 0,
            clipped: 0,
            train_seconds: 0.0,
        };
        let mut window = (0.0f64, 0usize, Instant::now());
        // Loss sum and samples since the last curve point.
        let mut curve = (0.0f64, 0usize);
        let ramp = c.sync_dense.then(|| Ramp::new(c));
        let apply = match (c.sync_dense, c.scale_stale_steps) {
            (true, _) => Apply::DenseMerged,
            (false, true) => Apply::StalenessScaled,
            (false, false) => Apply::Now,
        };
        let result = (|| -> anyhow::Result<()> {
            while !failed.load(Relaxed) {
                let t0 = Instant::now();
                let next = comms.next(model, dims, &mut report.times, &self.step, self.positions)?;
                let Some((p, version, step, number)) = next else { break };
                let t1 = Instant::now();
                let (params, rows) = comms.params();
                let (loss, heads) =
                    compute(c.precision, model, params, &p.batch, &p.lookups, rows, step, &mut replicas);
                let t2 = Instant::now();
                let n = p.batch.len();
                if c.clip_grad_norm.is_some_and(|max| clip(&mut replicas[0], n, max, &stats)) {
                    report.clipped += 1;
                }
                // In the ramp, rows step as at the full step (see `Ramp::row_scale`).
                if let Some(scale) = ramp.and_then(|r| r.row_scale(step, n)) {
                    replicas[0].row_grads.iter_mut().flatten().for_each(|g| *g *= scale);
                }
                let header =
                    StepHeader { trainer: me, step, pass: self.pass, base_version: version, samples: n, apply };
                if let Some(pushed) = comms.push(header, &replicas[0], &p.lookups, dims, number)? {
                    report.discarded += pushed.discarded as u64;
                    if c.mode == Mode::Async || c.delay > 0 {
                        report.staleness.add(pushed.staleness);
                        if let Some(t) = self.telemetry {
                            t.staleness.lock().add(pushed.staleness);
                        }
                    }
                }
                // The communication thread records its pushes itself, once they are answered.
                if let (Some(log), Some(n), false) = (self.positions, number, matches!(comms, Comms::Ahead { .. })) {
                    log.lock().done(n)?;
                }
                // A restarted trainer runs clean: the planned fault was its first life's.
                crate::base::fault::at_trainer(me, crate::base::fault::Moment::Step(step + 1));
                let t3 = Instant::now();
                report.times.compute += (t2 - t1).as_secs_f64();
                report.times.push += (t3 - t2).as_secs_f64();
                report.train_seconds += (t3 - t0).as_secs_f64();
                report.metrics.observe(model, &p.batch, &heads);
                report.samples += n as u64;
                let so_far = samples.fetch_add(n as u64, Relaxed) + n as u64;
                window.0 += loss;
                window.1 += n;
                curve.0 += loss;
                curve.1 += n;
                // Hogwild workers do not log: each sees only its own share of the pass.
                let hogwild = c.mode == Mode::Async && c.threads > 1 && !c.sync_dense;
                if let Some(t) = self.telemetry {
                    t.samples.store(so_far, Relaxed);
                    t.steps.store(step + 1, Relaxed);
                    t.pull.observe(t1 - t0);
                    t.push.observe(t3 - t2);
                }
                let watched = self.curves.is_some() || self.telemetry.is_some();
                if watched && !hogwild && c.metrics_every > 0 && (step + 1) % c.metrics_every == 0 {
                    let loss = Some(curve.0 / curve.1 as f64).filter(|l| l.is_finite());
                    let auc = report.metrics.recent_auc(curve.1);
                    if let Some((log, started)) = self.curves {
                        log.write(&Point {
                            trainer: me as u32,
                            pass: self.pass,
                            step: step + 1,
                            samples: so_far,
                            seconds: started.elapsed().as_secs_f64(),
                            kind: Kind::Steps,
                            loss,
                            auc,
                        });
                    }
                    if let Some(t) = self.telemetry {
                        t.window(loss, auc);
                    }
                    curve = (0.0, 0);
                }
                if c.log_every > 0 && (step + 1) % c.log_every == 0 && !hogwild {
                    let auc = report.metrics.recent_auc(window.1);
                    tracing::info!(
                        trainer = me,
                        pass = self.pass,
                        step = step + 1,
                        loss = window.0 / window.1 as f64,
                        auc = auc.unwrap_or(f64::NAN),
                        samples_per_sec = (window.1 as f64 / window.2.elapsed().as_secs_f64()) as u64,
                        "progress"
                    );
                    window = (0.0, 0, Instant::now());
                }
            }
            Ok(())
        })();
        if result.is_err() {
            failed.store(true, Relaxed);
        }
        result?;
        let (discarded, staleness) = comms.finish(dims)?;
        report.discarded += discarded;
        report.staleness.merge(&staleness);
        Ok(report)
    }
}
