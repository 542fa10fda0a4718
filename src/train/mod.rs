//! The trainer: reads its share of the data, and per batch deduplicates ids, pulls parameters,
//! runs forward/backward (split over `threads` data-parallel replicas), pushes gradient sums,
//! and records metrics. After each pass it meets the other trainers at a barrier, trainer 0
//! saves the model and evaluates it on the test files, and everyone meets again.
//!
//! The same loop runs locally (parameters in an in-process [`Shard`], no sockets) or against
//! servers (through a [`Client`]); only [`Store`] differs.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

mod ahead;
mod step;
mod store;

use ahead::{Ahead, PushJob};
use step::{compute, Replica};
pub use store::{Dedup, Store};

use crate::checkpoint::{load_merged, pass_dir_name, Manifest, FORMAT_VERSION};
use crate::client::{Client, ClientConfig};
use crate::data::{shard_files, Batch, DataConfig, Reader, ReaderConfig, Schema};
use crate::metrics::EvalReport;
use crate::metrics::PassMetrics;
use crate::model::{ModelConfig, Network, Work};
use crate::protocol::RowCreation;
use crate::server::Mode;
use crate::table::{Optimizer, Shard, TableSpec};

/// Everything one trainer needs, built and validated before it starts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Local, sync or async.
    pub mode: Mode,
    /// Server addresses by index (empty in local mode): each server's first port.
    pub servers: Vec<String>,
    /// Consecutive general ports per server (`--ports_num`).
    pub ports_num: usize,
    /// Sparse-only ports per server after the general ones (`--ports_num_for_sparse`).
    pub ports_num_for_sparse: usize,
    /// This trainer's id.
    pub trainer_id: usize,
    /// Number of trainers.
    pub trainers: usize,
    /// All training files (this trainer reads its share).
    pub train_files: Vec<PathBuf>,
    /// Test files, evaluated by trainer 0 after each pass.
    pub test_files: Vec<PathBuf>,
    /// Samples per step.
    pub batch_size: usize,
    /// Passes over the data.
    pub passes: u32,
    /// Data-parallel compute threads inside this trainer.
    pub threads: usize,
    /// The network.
    pub model: ModelConfig,
    /// How the data files are read.
    pub data: DataConfig,
    /// Optimizer of the dense parameters.
    pub dense_optimizer: Optimizer,
    /// Optimizer of the embedding table.
    pub sparse_optimizer: Optimizer,
    /// Save the model here after every pass.
    pub output: Option<PathBuf>,
    /// Continue from this saved model.
    pub resume: Option<PathBuf>,
    /// Log metrics every this many steps (0: only at the end of a pass).
    pub log_every: u64,
    /// Job id (servers refuse other jobs).
    pub job: String,
    /// Skip and count bad data lines instead of failing.
    pub skip_bad_lines: bool,
    /// How long to keep trying to reach the servers.
    pub connect_timeout: Duration,
    /// Longest wait for any reply (covers sync steps and barriers).
    pub reply_timeout: Duration,
}

impl TrainConfig {
    /// Checks the configuration; messages name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.batch_size > 0, "--batch-size must be at least 1");
        anyhow::ensure!(self.passes > 0, "--passes must be at least 1");
        anyhow::ensure!(self.threads > 0, "--threads must be at least 1");
        anyhow::ensure!(self.trainers > 0, "--trainers must be at least 1");
        anyhow::ensure!(
            self.trainer_id < self.trainers,
            "--trainer-id {} must be below --trainers {}",
            self.trainer_id,
            self.trainers
        );
        anyhow::ensure!(!self.train_files.is_empty(), "no training files (--train)");
        match self.mode {
            Mode::Local => {
                anyhow::ensure!(self.trainers == 1, "local mode runs one trainer; use --threads for parallelism")
            }
            _ => anyhow::ensure!(!self.servers.is_empty(), "{:?} mode needs --servers", self.mode),
        }
        self.model.validate().map_err(anyhow::Error::msg)?;
        self.dense_optimizer.validate("dense").map_err(anyhow::Error::msg)?;
        self.sparse_optimizer.validate("sparse").map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

/// What one pass did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PassReport {
    /// Pass number (1-based).
    pub pass: u32,
    /// Training metrics over the pass (predictions made before each update).
    pub train: EvalReport,
    /// Test metrics after the pass (trainer 0 only, when test files are given).
    pub test: Option<EvalReport>,
}

/// What a trainer did.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainReport {
    /// Trainer id.
    pub trainer: usize,
    /// Samples trained on.
    pub samples: u64,
    /// Seconds spent in training steps (excluding start-up, saving and evaluation).
    pub train_seconds: f64,
    /// Seconds from start to finish.
    pub wall_seconds: f64,
    /// Per-pass results.
    pub passes: Vec<PassReport>,
    /// Where the training loop's time went.
    pub time: StepTimes,
    /// Pushes the servers discarded as stale (async mode).
    pub discarded_pushes: u64,
    /// Data lines skipped as bad.
    pub bad_lines: u64,
}

/// Seconds spent in each phase of the training loop, summed over steps.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct StepTimes {
    /// Waiting for the reader's next batch.
    pub data: f64,
    /// Deduplicating ids and pulling parameters.
    pub pull: f64,
    /// Forward and backward.
    pub compute: f64,
    /// Pushing gradients (including the sync barrier).
    pub push: f64,
}

/// Evaluates the model held by `store` on `files` (rows of unseen ids are not created).
pub fn evaluate(
    store: &mut Store,
    model: &Network,
    data: &DataConfig,
    files: &[PathBuf],
    batch_size: usize,
    skip_bad_lines: bool,
) -> anyhow::Result<EvalReport> {
    let dim = model.config().embedding_dim;
    let mut params = Vec::new();
    store.pull(Some(&mut params), &[], &mut Vec::new(), dim, RowCreation::Peek)?;
    let reader =
        Reader::spawn(files.to_vec(), ReaderConfig { skip_bad_lines, ..reader_config(model, data, batch_size)? });
    let (mut dedup, mut rows, mut work) = (Dedup::default(), Vec::new(), Work::default());
    let mut metrics = PassMetrics::new(model.config().loss);
    for batch in reader {
        let batch = batch?;
        model.check_batch(&batch).map_err(anyhow::Error::msg)?;
        dedup.run(&batch.ids);
        store.pull(None, &dedup.unique, &mut rows, dim, RowCreation::Peek)?;
        let loss = model.evaluate(&params, &batch, &rows, &dedup.index, &mut work);
        metrics.observe(loss, &work.probs, &batch.labels);
    }
    Ok(metrics.report())
}

fn reader_config(model: &Network, data: &DataConfig, batch_size: usize) -> anyhow::Result<ReaderConfig> {
    let m = model.config();
    let schema = Schema::resolve(data, Some((m.slots, m.dense_features))).map_err(anyhow::Error::msg)?;
    Ok(ReaderConfig::new(&schema, batch_size))
}

/// Trains as configured. `on_progress(bytes, samples)` is called after every step with the
/// totals so far (for progress bars).
pub fn run(config: &TrainConfig, on_progress: &dyn Fn(u64, u64)) -> anyhow::Result<TrainReport> {
    config.validate()?;
    let started = Instant::now();
    let model = Network::new(&config.model);
    let spec = model.table_spec(config.dense_optimizer, config.sparse_optimizer);
    let me = config.trainer_id;
    let (mut store, first_pass) = open_store(config, &spec)?;
    let files = shard_files(&config.train_files, config.trainers, me);
    anyhow::ensure!(
        !files.is_empty(),
        "trainer {me} of {} has no training file: give at least as many files as trainers",
        config.trainers
    );
    tracing::info!(trainer = me, files = files.len(), mode = ?config.mode, first_pass, "training");

    let mut replicas: Vec<Replica> = (0..config.threads).map(|_| Replica::default()).collect();
    let mut report = TrainReport {
        trainer: me,
        samples: 0,
        train_seconds: 0.0,
        wall_seconds: 0.0,
        passes: Vec::new(),
        time: StepTimes::default(),
        discarded_pushes: 0,
        bad_lines: 0,
    };
    let (mut step, mut bytes_before) = (0u64, 0u64);
    for pass in first_pass..=config.passes {
        let reader = Reader::spawn(
            files.clone(),
            ReaderConfig {
                skip_bad_lines: config.skip_bad_lines,
                ..reader_config(&model, &config.data, config.batch_size)?
            },
        );
        let progress = reader.progress();
        let mut pass_loop =
            PassLoop { config, model: &model, pass, step, replicas: &mut replicas, report: &mut report };
        let metrics = pass_loop.run(&mut store, reader, &|samples| {
            on_progress(bytes_before + progress.bytes.load(std::sync::atomic::Ordering::Relaxed), samples)
        })?;
        step = pass_loop.step;
        bytes_before += progress.bytes.load(std::sync::atomic::Ordering::Relaxed);
        report.bad_lines += progress.bad_lines.load(std::sync::atomic::Ordering::Relaxed);
        let train = metrics.report();
        tracing::info!(trainer = me, pass, samples = train.samples, "pass done: {train}");
        let test = end_pass(config, &mut store, &model, &spec, pass, step)?;
        report.passes.push(PassReport { pass, train, test });
    }
    if let Store::Remote(client) = &mut store {
        client.close(me)?;
    }
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// A batch with its ids deduplicated.
struct Prepared {
    batch: Batch,
    ids: Dedup,
}

fn next_prepared(reader: &mut Reader) -> anyhow::Result<Option<Prepared>> {
    let Some(batch) = reader.next() else { return Ok(None) };
    let batch = batch?;
    let mut ids = Dedup::default();
    ids.run(&batch.ids);
    Ok(Some(Prepared { batch, ids }))
}

/// The steps of one pass.
struct PassLoop<'a> {
    config: &'a TrainConfig,
    model: &'a Network,
    pass: u32,
    step: u64,
    replicas: &'a mut [Replica],
    report: &'a mut TrainReport,
}

impl PassLoop<'_> {
    /// Trains on every batch of `reader`; returns the pass's training metrics. In async mode
    /// against servers, communication runs one batch ahead on its own thread ([`Ahead`]).
    fn run(&mut self, store: &mut Store, mut reader: Reader, on_progress: &dyn Fn(u64)) -> anyhow::Result<PassMetrics> {
        if self.config.mode == Mode::Async && matches!(store, Store::Remote(_)) && self.config.threads > 1 {
            return self.run_hogwild(store, reader, on_progress);
        }
        let (me, dim) = (self.config.trainer_id, self.config.model.embedding_dim);
        std::thread::scope(|scope| {
            let use_ahead = self.config.mode == Mode::Async && matches!(store, Store::Remote(_));
            let (mut ahead, mut direct) = if use_ahead {
                let Store::Remote(client) = store else { unreachable!("checked by use_ahead") };
                (Some(Ahead::start(scope, client, me, dim)), None)
            } else {
                (None, Some(store))
            };
            let mut metrics = PassMetrics::new(self.model.config().loss);
            let mut window = (0.0f64, 0usize, Instant::now());
            let (mut params, mut rows, mut spare) = (Vec::new(), Vec::new(), (Vec::new(), Vec::new()));
            let mut current = next_prepared(&mut reader)?;
            if let (Some(a), Some(c)) = (&mut ahead, &current) {
                a.pull(c.ids.unique.clone(), Vec::new(), Vec::new())?;
            }
            while let Some(cur) = current.take() {
                let t0 = Instant::now();
                let version = match (&mut ahead, &mut direct) {
                    (Some(a), _) => {
                        let p = a.pulled()?;
                        spare = (std::mem::replace(&mut params, p.dense), std::mem::replace(&mut rows, p.rows));
                        p.version
                    }
                    (None, Some(s)) => {
                        s.pull(Some(&mut params), &cur.ids.unique, &mut rows, dim, RowCreation::Create)?
                    }
                    (None, None) => unreachable!("one of the two is always set"),
                };
                let t1 = Instant::now();
                current = next_prepared(&mut reader)?;
                if let (Some(a), Some(n)) = (&mut ahead, &current) {
                    a.pull(n.ids.unique.clone(), std::mem::take(&mut spare.0), std::mem::take(&mut spare.1))?;
                }
                let t2 = Instant::now();
                let (batch, ids) = (&cur.batch, &cur.ids);
                self.model.check_batch(batch).map_err(anyhow::Error::msg)?;
                let (loss, probs) =
                    compute(self.model, &params, batch, &rows, &ids.index, self.replicas, ids.unique.len());
                let t3 = Instant::now();
                let r0 = &self.replicas[0];
                let (step, pass, n) = (self.step, self.pass, batch.len());
                match (&mut ahead, &mut direct) {
                    (Some(a), _) => a.push(PushJob {
                        step,
                        pass,
                        version,
                        samples: n,
                        dense: r0.grads.clone(),
                        ids: ids.unique.clone(),
                        row_grads: r0.row_grads.clone(),
                    })?,
                    (None, Some(s)) => {
                        self.report.discarded_pushes +=
                            s.push(me, step, pass, version, n, &r0.grads, &ids.unique, &r0.row_grads, dim)?
                    }
                    (None, None) => unreachable!("one of the two is always set"),
                }
                let t4 = Instant::now();
                let times = &mut self.report.time;
                times.pull += (t1 - t0).as_secs_f64();
                times.data += (t2 - t1).as_secs_f64();
                times.compute += (t3 - t2).as_secs_f64();
                times.push += (t4 - t3).as_secs_f64();
                self.report.train_seconds += (t4 - t0).as_secs_f64();
                metrics.observe(loss, &probs, &batch.labels);
                self.report.samples += n as u64;
                self.step += 1;
                window.0 += loss;
                window.1 += n;
                if self.config.log_every > 0 && self.step % self.config.log_every == 0 {
                    let rate = window.1 as f64 / window.2.elapsed().as_secs_f64();
                    let tail = metrics.probs.len().saturating_sub(window.1);
                    let auc = crate::metrics::auc(&metrics.probs[tail..], &metrics.labels[tail..]);
                    tracing::info!(
                        trainer = me,
                        pass,
                        step = self.step,
                        loss = window.0 / window.1 as f64,
                        auc = auc.unwrap_or(f64::NAN),
                        samples_per_sec = rate as u64,
                        "progress"
                    );
                    window = (0.0, 0, Instant::now());
                }
                on_progress(self.report.samples);
            }
            if let Some(a) = ahead {
                self.report.discarded_pushes += a.finish()?;
            }
            Ok(metrics)
        })
    }
}

impl PassLoop<'_> {
    /// Async mode with several threads, Hogwild-style: every thread takes the next batch, pulls,
    /// computes and pushes on its own, sharing the trainer's reader and connections (each
    /// request holds the connections only while it is on the wire and being answered), so one
    /// thread computes while another talks to the servers.
    fn run_hogwild(
        &mut self,
        store: &mut Store,
        reader: Reader,
        on_progress: &dyn Fn(u64),
    ) -> anyhow::Result<PassMetrics> {
        use parking_lot::Mutex;
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
        let (me, dim, pass) = (self.config.trainer_id, self.config.model.embedding_dim, self.pass);
        let model = self.model;
        let reader = Mutex::new(reader);
        let store = Mutex::new(store);
        let (step, samples, discarded) =
            (AtomicU64::new(self.step), AtomicU64::new(self.report.samples), AtomicU64::new(0));
        let failed = AtomicBool::new(false);
        let started = Instant::now();
        let results: Vec<anyhow::Result<(PassMetrics, StepTimes)>> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..self.config.threads)
                .map(|_| {
                    scope.spawn(|| {
                        let mut metrics = PassMetrics::new(model.config().loss);
                        let mut times = StepTimes::default();
                        let (mut params, mut rows, mut replica) = (Vec::new(), Vec::new(), [Replica::default()]);
                        let mut work = || -> anyhow::Result<()> {
                            loop {
                                if failed.load(Relaxed) {
                                    return Ok(());
                                }
                                let t0 = Instant::now();
                                let next = next_prepared(&mut reader.lock())?;
                                let Some(Prepared { batch, ids }) = next else { return Ok(()) };
                                model.check_batch(&batch).map_err(anyhow::Error::msg)?;
                                let t1 = Instant::now();
                                let version = store.lock().pull(
                                    Some(&mut params),
                                    &ids.unique,
                                    &mut rows,
                                    dim,
                                    RowCreation::Create,
                                )?;
                                let t2 = Instant::now();
                                let (loss, probs) =
                                    compute(model, &params, &batch, &rows, &ids.index, &mut replica, ids.unique.len());
                                let t3 = Instant::now();
                                let r0 = &replica[0];
                                let n = batch.len();
                                let s = step.fetch_add(1, Relaxed);
                                let stale = store.lock().push(
                                    me,
                                    s,
                                    pass,
                                    version,
                                    n,
                                    &r0.grads,
                                    &ids.unique,
                                    &r0.row_grads,
                                    dim,
                                )?;
                                discarded.fetch_add(stale, Relaxed);
                                let t4 = Instant::now();
                                times.data += (t1 - t0).as_secs_f64();
                                times.pull += (t2 - t1).as_secs_f64();
                                times.compute += (t3 - t2).as_secs_f64();
                                times.push += (t4 - t3).as_secs_f64();
                                metrics.observe(loss, &probs, &batch.labels);
                                samples.fetch_add(n as u64, Relaxed);
                            }
                        };
                        let result = work();
                        if result.is_err() {
                            failed.store(true, Relaxed);
                        }
                        result.map(|()| (metrics, times))
                    })
                })
                .collect();
            // Progress is reported from this thread: the callback need not be thread-safe.
            while !workers.iter().all(|w| w.is_finished()) {
                on_progress(samples.load(Relaxed));
                std::thread::sleep(Duration::from_millis(100));
            }
            workers.into_iter().map(|w| w.join().expect("a trainer thread panicked")).collect()
        });
        let mut merged = PassMetrics::new(self.model.config().loss);
        for r in results {
            let (metrics, times) = r?;
            merged.merge(&metrics);
            let t = &mut self.report.time;
            t.data += times.data;
            t.pull += times.pull;
            t.compute += times.compute;
            t.push += times.push;
        }
        self.step = step.load(Relaxed);
        self.report.samples = samples.load(Relaxed);
        self.report.discarded_pushes += discarded.load(Relaxed);
        self.report.train_seconds += started.elapsed().as_secs_f64();
        on_progress(self.report.samples);
        tracing::info!(trainer = me, pass, threads = self.config.threads, "pass trained Hogwild-style");
        Ok(merged)
    }
}

/// Connects (or builds the local store) and returns it with the first pass to train.
fn open_store(config: &TrainConfig, spec: &TableSpec) -> anyhow::Result<(Store, u32)> {
    let resumed = match &config.resume {
        Some(dir) => {
            let (manifest, pass_dir) = Manifest::find(dir)?;
            anyhow::ensure!(
                &manifest.spec == spec,
                "{}: the saved model's tables differ from this job's (model shape or optimizer changed)",
                pass_dir.display()
            );
            Some(manifest.pass)
        }
        None => None,
    };
    let first_pass = resumed.map_or(1, |p| p + 1);
    anyhow::ensure!(
        first_pass <= config.passes,
        "the saved model has {} pass(es) already: nothing to train; ask for more with --passes",
        first_pass - 1
    );
    let store = match config.mode {
        Mode::Local => match &config.resume {
            Some(dir) => Store::Local(Box::new(load_merged(dir)?.1)),
            None => Store::Local(Box::new(Shard::new(spec.clone(), 0, 1))),
        },
        _ => {
            let mut client = Client::connect(&ClientConfig {
                servers: config.servers.clone(),
                job: config.job.clone(),
                connect_timeout: config.connect_timeout,
                reply_timeout: config.reply_timeout,
                ports_num: config.ports_num,
                ports_num_for_sparse: config.ports_num_for_sparse,
                trainer: Some(config.trainer_id as u64),
            })?;
            client.declare_model(spec, description(config, None))?;
            Store::Remote(Box::new(client))
        }
    };
    Ok((store, first_pass))
}

/// What a saved model's manifest says about the model and how it was trained.
fn description(config: &TrainConfig, steps: Option<u64>) -> serde_json::Value {
    let mut d = serde_json::json!({
        "model": config.model,
        "data": config.data,
        "batch_size": config.batch_size,
        "mode": config.mode,
    });
    if let Some(steps) = steps {
        d["steps"] = steps.into();
    }
    d
}

/// Barrier, save and evaluation (trainer 0), barrier.
fn end_pass(
    config: &TrainConfig,
    store: &mut Store,
    model: &Network,
    spec: &TableSpec,
    pass: u32,
    step: u64,
) -> anyhow::Result<Option<EvalReport>> {
    let me = config.trainer_id;
    if let Store::Remote(client) = store {
        client.end_pass(me, pass)?;
        client.barrier(me, 2 * pass as u64 - 1).with_context(|| format!("end of pass {pass}"))?;
    }
    let mut test = None;
    if me == 0 {
        if let Some(out) = &config.output {
            let dir = out.join(pass_dir_name(pass));
            let shards = store.save(&dir).with_context(|| format!("saving pass {pass} to {}", dir.display()))?;
            let manifest = Manifest {
                format: FORMAT_VERSION,
                job: config.job.clone(),
                pass,
                num_servers: shards.len(),
                spec: spec.clone(),
                model: description(config, Some(step)),
                shards,
            };
            manifest.write(&dir)?;
            tracing::info!(pass, dir = %dir.display(), "model saved");
        }
        if !config.test_files.is_empty() {
            let r = evaluate(
                store,
                model,
                &config.data,
                &config.test_files,
                config.batch_size.max(1024),
                config.skip_bad_lines,
            )?;
            tracing::info!(pass, samples = r.samples, "test: {r}");
            test = Some(r);
        }
    }
    if let Store::Remote(client) = store {
        client.barrier(me, 2 * pass as u64).with_context(|| format!("after saving pass {pass}"))?;
    }
    Ok(test)
}
