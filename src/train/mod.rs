//! The trainer: reads its share of the data, and per batch deduplicates ids per table, pulls
//! parameters, runs forward/backward (split over `threads` data-parallel replicas; in async mode
//! against servers the threads are Hogwild workers instead, each on its own batches), pushes
//! gradient sums, and records every head's metrics. After each pass it meets the other trainers at a barrier, trainer 0
//! saves the model and evaluates it on the test files, and everyone meets again.
//!
//! The same loop runs locally (parameters in an in-process [`Shard`], no sockets) or against
//! servers (through a [`Client`]); only [`Store`] differs.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

mod ahead;
pub mod position;
mod step;
mod store;

use ahead::{Ahead, PushJob};
use position::{Position, PositionLog};
use step::{compute, Replica};
pub use store::{Lookups, StepHeader, Store, TableLookup};

use crate::batch::Batch;
use crate::checkpoint::{load_merged, pass_dir_name, Manifest, FORMAT_VERSION};
use crate::client::{Client, ClientConfig, PushReport};
use crate::data::{shard_files, DataConfig, Reader, ReaderConfig, Schema};
use crate::metrics::EvalReport;
use crate::metrics::{PassMetrics, Staleness};
use crate::model::{Model, ModelConfig, Registry, Work};
use crate::protocol::{Apply, RowCreation};
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
    /// Optimizer of the sparse tables (a table of the model may set its own).
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
    /// Local mode: apply each update this many steps after it was computed (0: at once), so
    /// the effect of staleness is measured without a network, deterministically.
    #[serde(default)]
    pub delay: usize,
    /// Async mode with one thread: pull the next batch's parameters while this one computes.
    #[serde(default = "yes")]
    pub pull_ahead: bool,
    /// Async mode: the first this many updates of a run are synchronous steps, each trainer's
    /// batch split in `trainers` parts so that an update covers `batch_size` samples as a local
    /// one does; then the pushes go async. Staleness hurts most while Adam's first steps are
    /// large: a short synchronous start keeps small data sets on local training's path.
    #[serde(default = "default_sync_warmup")]
    pub sync_warmup: u64,
    /// Async mode: a push computed from parameters `k > 1` updates old moves the dense weights
    /// with the learning rate divided by `k` (sparse rows keep their step: a row's staleness is
    /// not the server's update count). In local mode with `delay`, the same on delayed updates.
    #[serde(default = "default_scale_stale_steps")]
    pub scale_stale_steps: bool,
    /// Under a supervisor that restarts failed servers: how long to wait for a lost server to
    /// come back before failing (`None`: fail at once).
    #[serde(default)]
    pub recover: Option<Duration>,
    /// Record this trainer's position in its data in this folder after every step (see
    /// [`position`]).
    #[serde(default)]
    pub positions: Option<PathBuf>,
    /// A restart of a trainer that failed: go on from the position recorded in `positions`.
    #[serde(default)]
    pub rejoin: bool,
    /// The job's secret, proved to every server before anything else (see [`crate::auth`]).
    #[serde(skip)]
    pub secret: Option<crate::auth::Secret>,
}

/// The default of [`TrainConfig::sync_warmup`].
pub const DEFAULT_SYNC_WARMUP: u64 = 100;
/// The default of [`TrainConfig::scale_stale_steps`].
pub const DEFAULT_SCALE_STALE_STEPS: bool = true;

fn yes() -> bool {
    true
}

fn default_sync_warmup() -> u64 {
    DEFAULT_SYNC_WARMUP
}

fn default_scale_stale_steps() -> bool {
    DEFAULT_SCALE_STALE_STEPS
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
        anyhow::ensure!(
            !self.rejoin || self.positions.is_some(),
            "--rejoin goes on from a recorded position: give --position-dir"
        );
        anyhow::ensure!(
            self.delay == 0 || self.mode == Mode::Local,
            "--delay (delayed updates) is a local-mode measurement; {:?} mode has real staleness",
            self.mode
        );
        match self.mode {
            Mode::Local => {
                anyhow::ensure!(self.trainers == 1, "local mode runs one trainer; use --threads for parallelism")
            }
            _ => anyhow::ensure!(!self.servers.is_empty(), "{:?} mode needs --servers", self.mode),
        }
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
    /// With several heads: every head's figures, the first one's being `train` and `test`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heads: Vec<HeadReport>,
}

/// One head's figures over a pass.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct HeadReport {
    /// The head's output tensor.
    pub output: String,
    /// Training metrics over the pass.
    pub train: EvalReport,
    /// Test metrics after the pass.
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
    /// How many updates behind this trainer's pushes arrived (async; local with a delay).
    #[serde(default)]
    pub staleness: Staleness,
    /// Data lines skipped as bad.
    pub bad_lines: u64,
}

/// Seconds spent in each phase of the training loop, summed over steps.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize)]
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

impl std::ops::AddAssign for StepTimes {
    fn add_assign(&mut self, o: StepTimes) {
        self.data += o.data;
        self.pull += o.pull;
        self.compute += o.compute;
        self.push += o.push;
    }
}

/// Evaluates the model held by `store` on `files` (rows of unseen ids are not created): the
/// first head's figures.
pub fn evaluate(
    store: &mut Store,
    model: &Model,
    schema: &Schema,
    files: &[PathBuf],
    batch_size: usize,
    skip_bad_lines: bool,
) -> anyhow::Result<EvalReport> {
    Ok(evaluate_heads(store, model, schema, files, batch_size, skip_bad_lines)?.swap_remove(0))
}

/// Evaluates every head of the model held by `store` on `files`.
pub fn evaluate_heads(
    store: &mut Store,
    model: &Model,
    schema: &Schema,
    files: &[PathBuf],
    batch_size: usize,
    skip_bad_lines: bool,
) -> anyhow::Result<Vec<EvalReport>> {
    let dims = dims(model);
    let mut params = Vec::new();
    store.pull(Some(&mut params), &[], &mut [], RowCreation::Peek)?;
    let reader =
        Reader::spawn(files.to_vec(), ReaderConfig { skip_bad_lines, ..ReaderConfig::new(schema, batch_size) });
    let (mut lookups, mut rows, mut work) = (Lookups::default(), Vec::new(), Work::default());
    rows.resize_with(dims.len(), Vec::new);
    let mut metrics = HeadMetrics::new(model);
    for batch in reader {
        let batch = batch?;
        model.check_batch(&batch).map_err(anyhow::Error::msg)?;
        lookups.run(&batch, model.table_slots());
        store.pull(None, &lookups.ids(&dims), &mut rows, RowCreation::Peek)?;
        model.evaluate(&params, &batch, &lookups.rows(&rows), &mut work);
        metrics.observe(model, &batch, &work.heads());
    }
    Ok(metrics.0.iter().map(PassMetrics::report).collect())
}

/// One [`PassMetrics`] per head.
struct HeadMetrics(Vec<PassMetrics>);

impl HeadMetrics {
    fn new(model: &Model) -> HeadMetrics {
        HeadMetrics(model.losses().into_iter().map(PassMetrics::new).collect())
    }

    fn observe(&mut self, model: &Model, batch: &Batch, heads: &[(f64, Vec<f32>)]) {
        for (h, (m, (loss, probs))) in self.0.iter_mut().zip(heads).enumerate() {
            m.observe(*loss, probs, &model.labels(batch, h));
        }
    }

    fn merge(&mut self, other: &HeadMetrics) {
        self.0.iter_mut().zip(&other.0).for_each(|(a, b)| a.merge(b));
    }
}

fn dims(model: &Model) -> Vec<usize> {
    model.tables().iter().map(|t| t.dim).collect()
}

/// Trains as configured, with the built-in layer types. `on_progress(bytes, samples)` is called
/// with the totals so far (for progress bars).
pub fn run(config: &TrainConfig, on_progress: &dyn Fn(u64, u64)) -> anyhow::Result<TrainReport> {
    run_with(config, &Registry::default(), on_progress)
}

/// Trains as configured, with the layer types of `registry` (a program's own layers).
pub fn run_with(
    config: &TrainConfig,
    registry: &Registry,
    on_progress: &dyn Fn(u64, u64),
) -> anyhow::Result<TrainReport> {
    config.validate()?;
    let started = Instant::now();
    let (model, schema) = crate::config::build_model(&config.model, &config.data, registry)?;
    let spec = model.table_spec(config.dense_optimizer, config.sparse_optimizer);
    spec.validate().map_err(anyhow::Error::msg)?;
    let me = config.trainer_id;
    crate::fault::set_trainer_life(u64::from(config.rejoin));
    let (mut store, first_pass) = open_store(config, &spec)?;
    let files = shard_files(&config.train_files, config.trainers, me);
    anyhow::ensure!(
        !files.is_empty(),
        "trainer {me} of {} has no training file: give at least as many files as trainers",
        config.trainers
    );
    let start = start_position(config, first_pass)?;
    let positions = match &config.positions {
        Some(dir) => Some(Mutex::new(PositionLog::create(dir, start.clone())?)),
        None => None,
    };
    tracing::info!(trainer = me, files = files.len(), mode = ?config.mode, first_pass = start.pass, model = %model.summary(), "training");

    let mut report = TrainReport {
        trainer: me,
        samples: start.trained,
        train_seconds: 0.0,
        wall_seconds: 0.0,
        passes: Vec::new(),
        time: StepTimes::default(),
        discarded_pushes: 0,
        staleness: Staleness::default(),
        bad_lines: 0,
    };
    let (mut step, mut bytes_before) = (start.step, 0u64);
    for pass in start.pass..=config.passes {
        // A rejoining trainer goes on in the pass it was in, after the samples it pushed (and
        // in the warm-up, at the part after its last merged step).
        let resumed = if pass == start.pass { start.samples } else { 0 };
        let plan = WarmupPlan::new(config, pass == start.first_pass, step, resumed);
        if pass != start.pass {
            if let Some(p) = &positions {
                p.lock().start_pass(pass)?;
            }
        }
        let reader = Reader::spawn(
            files.clone(),
            ReaderConfig {
                skip_bad_lines: config.skip_bad_lines,
                skip: plan.reader_skip,
                ..ReaderConfig::new(&schema, config.batch_size)
            },
        );
        let progress = reader.progress();
        let pass_loop =
            PassLoop { config, model: &model, pass, step: AtomicU64::new(step), plan, positions: positions.as_ref() };
        let metrics = pass_loop.run(&mut store, reader, &mut report, &|samples| {
            on_progress(bytes_before + progress.bytes.load(Relaxed), samples)
        })?;
        step = pass_loop.step.load(Relaxed);
        bytes_before += progress.bytes.load(Relaxed);
        report.bad_lines += progress.bad_lines.load(Relaxed);
        let trains: Vec<EvalReport> = metrics.0.iter().map(PassMetrics::report).collect();
        for (name, t) in model.head_names().iter().zip(&trains) {
            tracing::info!(trainer = me, pass, samples = t.samples, head = %name, "pass done: {t}");
        }
        if report.staleness.count() > 0 {
            tracing::info!(trainer = me, pass, "push staleness so far: {}", report.staleness);
        }
        let tests = end_pass(config, &mut store, &model, &schema, &spec, pass, step)?;
        let heads = if trains.len() > 1 {
            let names = model.head_names();
            (0..trains.len())
                .map(|h| HeadReport { output: names[h].clone(), train: trains[h].clone(), test: tests.get(h).cloned() })
                .collect()
        } else {
            Vec::new()
        };
        report.passes.push(PassReport { pass, train: trains[0].clone(), test: tests.first().cloned(), heads });
    }
    if let Store::Remote(client) = &mut store {
        client.close(me)?;
    }
    if let Some(p) = &positions {
        p.lock().finish()?;
    }
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Where this run starts: the recorded position of a rejoining trainer, else the first pass's
/// beginning.
fn start_position(config: &TrainConfig, first_pass: u32) -> anyhow::Result<Position> {
    let fresh = Position {
        job: config.job.clone(),
        trainer: config.trainer_id,
        first_pass,
        pass: first_pass,
        step: 0,
        samples: 0,
        trained: 0,
        finished: false,
    };
    let (Some(dir), true) = (&config.positions, config.rejoin) else { return Ok(fresh) };
    match Position::load(dir, &config.job, config.trainer_id)? {
        Some(p) => {
            p.check_passes(dir, config.passes)?;
            tracing::warn!(
                trainer = p.trainer,
                pass = p.pass,
                step = p.step,
                samples = p.samples,
                "rejoining: going on after the last recorded step"
            );
            Ok(p)
        }
        None => {
            tracing::warn!(
                trainer = config.trainer_id,
                "rejoining with no recorded position: starting from the beginning"
            );
            Ok(fresh)
        }
    }
}

/// What async mode's synchronous warm-up still has to do in a pass, and where the reader starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WarmupPlan {
    /// Merged steps (batch parts) left.
    steps: u64,
    /// Parts of the first batch already trained (a trainer rejoining mid-batch).
    parts_done: usize,
    /// Samples the reader leaves out.
    reader_skip: u64,
}

impl WarmupPlan {
    /// The plan of a pass that is (`first`) or is not the run's first, for a trainer at `step`
    /// that has pushed `samples` of it. A warm-up reader batch is split in one part per trainer
    /// and each part is one step, so a warm-up of `sync_warmup` updates takes
    /// `ceil(sync_warmup / trainers)` whole batches.
    fn new(config: &TrainConfig, first: bool, step: u64, samples: u64) -> WarmupPlan {
        let parts = config.trainers as u64;
        // Sync mode has no warm-up: every step is synchronous, one whole batch each.
        let warms = first && config.mode != Mode::Sync;
        let total = if warms { config.sync_warmup.div_ceil(parts) * parts } else { 0 };
        if step >= total {
            return WarmupPlan { steps: 0, parts_done: 0, reader_skip: samples };
        }
        // Every warm-up batch before this one was whole and gave `parts` steps.
        WarmupPlan {
            steps: total - step,
            parts_done: (step % parts) as usize,
            reader_skip: step / parts * config.batch_size as u64,
        }
    }
}

/// A batch with its ids deduplicated per table.
struct Prepared {
    batch: Batch,
    lookups: Lookups,
}

fn next_prepared(reader: &mut Reader, model: &Model) -> anyhow::Result<Option<Prepared>> {
    let Some(batch) = reader.next() else { return Ok(None) };
    prepare(batch?, model).map(Some)
}

fn prepare(batch: Batch, model: &Model) -> anyhow::Result<Prepared> {
    model.check_batch(&batch).map_err(anyhow::Error::msg)?;
    let mut lookups = Lookups::default();
    lookups.run(&batch, model.table_slots());
    Ok(Prepared { batch, lookups })
}

/// Async mode's synchronous start: each reader batch is split in `parts` (one per trainer),
/// and each part is one synchronous step, so a merged update covers one batch of samples.
struct Warmup {
    /// Steps (parts) still to train.
    steps: u64,
    parts: usize,
    /// Parts of the next batch to leave out (trained before a restart).
    parts_done: usize,
    /// Parts of the current batch not trained yet.
    queue: std::collections::VecDeque<Batch>,
}

impl Warmup {
    /// The next part, or `None` once the warm-up's steps (or the reader's batches) are used up.
    fn next(&mut self, reader: &mut Reader) -> anyhow::Result<Option<Batch>> {
        if self.queue.is_empty() && self.steps > 0 {
            let Some(batch) = reader.next() else { return Ok(None) };
            let batch = batch?;
            let n = batch.len();
            // Only a shard's last batch can be shorter than `parts`: its empty parts are skipped.
            let ranges = (0..self.parts).map(|k| k * n / self.parts..(k + 1) * n / self.parts);
            let ranges = ranges.skip(std::mem::take(&mut self.parts_done));
            self.queue.extend(ranges.filter(|r| !r.is_empty()).map(|r| batch.slice(r)));
        }
        let part = self.queue.pop_front();
        if part.is_some() {
            self.steps = self.steps.saturating_sub(1);
        }
        Ok(part)
    }
}

/// How a worker gets its next batch with parameters and sends its gradients.
enum Comms<'a, 'b> {
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
    fn next(
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
            Comms::Direct { reader, store, params, rows, warmup, .. } => {
                // Numbered under the reader's lock: in the order batches leave the reader.
                let mut r = reader.lock();
                let p = match warmup {
                    Some(w) => w.next(&mut r)?.map(|b| prepare(b, model)).transpose()?,
                    None => next_prepared(&mut r, model)?,
                };
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

    fn params(&self) -> (&[f32], &[Vec<f32>]) {
        match self {
            Comms::Direct { params, rows, .. } | Comms::Ahead { params, rows, .. } => (params, rows),
        }
    }

    /// Sends one step's gradients; says how many servers discarded them and how stale they
    /// arrived (`None`: not known yet, the communication thread counts it).
    fn push(
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
        }
    }

    /// Ends the pass's communication; returns what was not counted yet: discarded pushes and
    /// the staleness of pushes.
    fn finish(self, dims: &[usize]) -> anyhow::Result<(u64, Staleness)> {
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
        }
    }
}

/// The next batch (see [`Comms::next`]): the batch, its parameters' version, its step and its
/// number in the position log.
type Next = (Prepared, u64, u64, Option<u64>);

/// One step's gradients, owned (for the communication thread or a delayed update).
fn push_job(header: StepHeader, r: &Replica, lookups: &Lookups, number: Option<u64>) -> PushJob {
    let tables = lookups.tables.iter().zip(&r.row_grads).map(|(l, g)| (l.unique.clone(), g.clone()));
    PushJob { header, dense: r.grads.clone(), tables: tables.collect(), number }
}

/// A job's sparse gradients as a push sends them.
fn job_grads<'a>(job: &'a PushJob, dims: &[usize]) -> Vec<crate::client::TableGrads<'a>> {
    let tables = job.tables.iter().enumerate();
    tables.map(|(t, (ids, grads))| crate::client::TableGrads { table: t as u32, dim: dims[t], ids, grads }).collect()
}

/// What one worker did in a pass.
struct WorkerReport {
    metrics: HeadMetrics,
    staleness: Staleness,
    times: StepTimes,
    samples: u64,
    discarded: u64,
    train_seconds: f64,
}

/// The steps of one pass.
struct PassLoop<'a> {
    config: &'a TrainConfig,
    model: &'a Model,
    pass: u32,
    step: AtomicU64,
    /// The synchronous updates to make before going async (async mode against servers).
    plan: WarmupPlan,
    /// Where the trainer's position is recorded after each push.
    positions: Option<&'a Mutex<PositionLog>>,
}

impl PassLoop<'_> {
    /// Trains on every batch of `reader`; returns the pass's training metrics. One worker
    /// splits each batch over `threads` replicas, except in async mode against servers: one
    /// thread pulls ahead ([`Ahead`]), several train Hogwild-style, each its own batches,
    /// sharing the reader and the connections (held only while a request is on the wire).
    fn run(
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
            let warmup = Warmup {
                steps: self.plan.steps,
                parts: c.trainers,
                parts_done: self.plan.parts_done,
                queue: Default::default(),
            };
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
        let remote_async = c.mode == Mode::Async && matches!(store, Store::Remote(_)) && warmup.is_none();
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
                (None, Some(store)) => all_comms.extend((0..workers).map(|_| {
                    Ok(Comms::Direct {
                        reader,
                        store,
                        params: Vec::new(),
                        rows: Vec::new(),
                        delayed: Default::default(),
                        delay: c.delay,
                        delay_from: self.plan.steps,
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
        let mut report = WorkerReport {
            metrics: HeadMetrics::new(model),
            staleness: Staleness::default(),
            times: StepTimes::default(),
            samples: 0,
            discarded: 0,
            train_seconds: 0.0,
        };
        let mut window = (0.0f64, 0usize, Instant::now());
        let apply = if c.scale_stale_steps { Apply::StalenessScaled } else { Apply::Now };
        let result = (|| -> anyhow::Result<()> {
            while !failed.load(Relaxed) {
                let t0 = Instant::now();
                let next = comms.next(model, dims, &mut report.times, &self.step, self.positions)?;
                let Some((p, version, step, number)) = next else { break };
                let t1 = Instant::now();
                let (params, rows) = comms.params();
                let (loss, heads) = compute(model, params, &p.batch, &p.lookups, rows, step, &mut replicas);
                let t2 = Instant::now();
                let n = p.batch.len();
                let header =
                    StepHeader { trainer: me, step, pass: self.pass, base_version: version, samples: n, apply };
                if let Some(pushed) = comms.push(header, &replicas[0], &p.lookups, dims, number)? {
                    report.discarded += pushed.discarded as u64;
                    if c.mode == Mode::Async || c.delay > 0 {
                        report.staleness.add(pushed.staleness);
                    }
                }
                // The communication thread records its pushes itself, once they are answered.
                if let (Some(log), Some(n), false) = (self.positions, number, matches!(comms, Comms::Ahead { .. })) {
                    log.lock().done(n)?;
                }
                // A restarted trainer runs clean: the planned fault was its first life's.
                crate::fault::at_trainer(me, crate::fault::Moment::Step(step + 1));
                let t3 = Instant::now();
                report.times.compute += (t2 - t1).as_secs_f64();
                report.times.push += (t3 - t2).as_secs_f64();
                report.train_seconds += (t3 - t0).as_secs_f64();
                report.metrics.observe(model, &p.batch, &heads);
                report.samples += n as u64;
                samples.fetch_add(n as u64, Relaxed);
                window.0 += loss;
                window.1 += n;
                // Hogwild workers do not log: each sees only its own share of the pass.
                let hogwild = c.mode == Mode::Async && c.threads > 1;
                if c.log_every > 0 && (step + 1) % c.log_every == 0 && !hogwild {
                    let m = &report.metrics.0[0];
                    let tail = m.probs.len().saturating_sub(window.1);
                    let auc = crate::metrics::auc(&m.probs[tail..], &m.labels[tail..]);
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
                recover: config.recover,
                secret: config.secret.clone(),
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
        "model": config.model.with_shorthand_defaults(),
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
    model: &Model,
    schema: &Schema,
    spec: &TableSpec,
    pass: u32,
    step: u64,
) -> anyhow::Result<Vec<EvalReport>> {
    let me = config.trainer_id;
    if let Store::Remote(client) = store {
        client.end_pass(me, pass)?;
        client.barrier(me, 2 * pass as u64 - 1).with_context(|| format!("end of pass {pass}"))?;
    }
    let mut tests = Vec::new();
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
            let batch = config.batch_size.max(1024);
            tests = evaluate_heads(store, model, schema, &config.test_files, batch, config.skip_bad_lines)?;
            for (name, r) in model.head_names().iter().zip(&tests) {
                tracing::info!(pass, samples = r.samples, head = %name, "test: {r}");
            }
        }
    }
    if let Store::Remote(client) = store {
        client.barrier(me, 2 * pass as u64).with_context(|| format!("after saving pass {pass}"))?;
    }
    Ok(tests)
}
