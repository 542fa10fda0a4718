//! The trainer: reads its share of the data, and per batch deduplicates ids, pulls parameters,
//! runs forward/backward (split over `threads` data-parallel replicas), pushes gradient sums,
//! and records metrics. After each pass it meets the other trainers at a barrier, trainer 0
//! saves the model and evaluates it on the test files, and everyone meets again.
//!
//! The same loop runs locally (parameters in an in-process [`Shard`], no sockets) or against
//! servers (through a [`Client`]); only [`Store`] differs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use hashbrown::HashMap;
use serde::{Deserialize, Serialize};

use crate::checkpoint::{load_merged, pass_dir_name, write_shard, Manifest, ShardEntry, FORMAT_VERSION};
use crate::client::{Client, ClientConfig, TableGrads, TableIds};
use crate::data::{shard_files, Batch, Reader, ReaderConfig};
use crate::metrics::PassMetrics;
use crate::model::{CtrDnn, ModelConfig, Work};
use crate::protocol::RowCreation;
use crate::server::Mode;
use crate::table::{Optimizer, Shard, TableSpec};

/// Everything one trainer needs, built and validated before it starts.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainConfig {
    /// Local, sync or async.
    pub mode: Mode,
    /// Server addresses by index (empty in local mode).
    pub servers: Vec<String>,
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

/// Quality of the model on a set of samples.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EvalReport {
    /// Samples evaluated.
    pub samples: usize,
    /// Exact AUC (None if one class is absent).
    pub auc: Option<f64>,
    /// Mean log-loss.
    pub log_loss: f64,
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
    /// Pushes the servers discarded as stale (async mode).
    pub discarded_pushes: u64,
    /// Data lines skipped as bad.
    pub bad_lines: u64,
}

/// Where parameters live: in this process, or on servers.
pub enum Store {
    /// All tables in-process (local mode, evaluation).
    Local(Box<Shard>),
    /// Tables on servers.
    Remote(Box<Client>),
}

impl Store {
    /// Pulls the dense vector (if asked) and the rows of `ids`; returns the parameter version.
    pub fn pull(
        &mut self,
        dense: Option<&mut Vec<f32>>,
        ids: &[u64],
        rows: &mut Vec<f32>,
        dim: usize,
        create: RowCreation,
    ) -> anyhow::Result<u64> {
        match self {
            Store::Local(shard) => {
                if let Some(d) = dense {
                    d.clear();
                    shard.dense.lock().read(d);
                }
                rows.resize(ids.len() * dim, 0.0);
                shard.sparse[0].pull(ids, rows, create == RowCreation::Create)?;
                Ok(0)
            }
            Store::Remote(client) => {
                let table = TableIds { table: 0, dim, ids };
                let mut out = [std::mem::take(rows)];
                let v = client.pull(dense, std::slice::from_ref(&table), &mut out, create)?;
                *rows = std::mem::take(&mut out[0]);
                Ok(v)
            }
        }
    }

    /// Pushes one step's gradient sums; returns the number of servers that discarded it.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        trainer: usize,
        step: u64,
        pass: u32,
        version: u64,
        samples: usize,
        dense: &[f32],
        ids: &[u64],
        row_grads: &[f32],
        dim: usize,
    ) -> anyhow::Result<u64> {
        match self {
            Store::Local(shard) => {
                let scale = 1.0 / samples as f32;
                shard.dense.lock().apply(dense, scale)?;
                shard.sparse[0].push(ids, row_grads, scale)?;
                Ok(0)
            }
            Store::Remote(client) => {
                let grads = TableGrads { table: 0, dim, ids, grads: row_grads };
                let r =
                    client.push(trainer, step, pass, version, samples, Some(dense), std::slice::from_ref(&grads))?;
                Ok(r.discarded as u64)
            }
        }
    }

    /// Saves every shard into `dir`.
    pub fn save(&mut self, dir: &Path) -> anyhow::Result<Vec<ShardEntry>> {
        match self {
            Store::Local(shard) => {
                let (file, bytes, crc32) = write_shard(shard, dir)?;
                Ok(vec![ShardEntry { file, bytes, crc32 }])
            }
            Store::Remote(client) => Ok(client.save(&dir.to_string_lossy())?),
        }
    }
}

/// Ids of a batch made unique, with each (sample, slot) mapped to its unique position.
#[derive(Default)]
pub struct Dedup {
    map: HashMap<u64, u32, foldhash::fast::FixedState>,
    /// Unique ids in first-seen order.
    pub unique: Vec<u64>,
    /// Position in `unique` of every id of the batch.
    pub index: Vec<u32>,
}

impl Dedup {
    /// Deduplicates `ids`.
    pub fn run(&mut self, ids: &[u64]) {
        self.map.clear();
        self.unique.clear();
        self.index.clear();
        for &id in ids {
            let next = self.unique.len() as u32;
            let at = *self.map.entry(id).or_insert(next);
            if at == next {
                self.unique.push(id);
            }
            self.index.push(at);
        }
    }
}

/// One data-parallel replica's buffers.
struct Replica {
    work: Work,
    grads: Vec<f32>,
    row_grads: Vec<f32>,
}

/// Forward/backward of `batch` split over the replicas; leaves the summed gradients in
/// replica 0 and returns (summed loss, predictions in batch order).
fn compute(
    model: &CtrDnn,
    params: &[f32],
    batch: &Batch,
    rows: &[f32],
    index: &[u32],
    replicas: &mut [Replica],
    unique: usize,
) -> (f64, Vec<f32>) {
    let dim = model.config().embedding_dim;
    let slots = batch.slots;
    let parts = replicas.len().min(batch.len()).max(1);
    let chunk = batch.len().div_ceil(parts);
    let prepare = |r: &mut Replica| {
        r.grads.clear();
        r.grads.resize(params.len(), 0.0);
        r.row_grads.clear();
        r.row_grads.resize(unique * dim, 0.0);
    };
    let losses: Vec<f64> = if parts == 1 {
        let r = &mut replicas[0];
        prepare(r);
        vec![model.train_step(params, batch, rows, index, &mut r.work, &mut r.grads, &mut r.row_grads)]
    } else {
        std::thread::scope(|s| {
            let handles: Vec<_> = replicas[..parts]
                .iter_mut()
                .enumerate()
                .map(|(k, r)| {
                    let range = k * chunk..((k + 1) * chunk).min(batch.len());
                    s.spawn(move || {
                        prepare(r);
                        let part = batch.slice(range.clone());
                        let idx = &index[range.start * slots..range.end * slots];
                        model.train_step(params, &part, rows, idx, &mut r.work, &mut r.grads, &mut r.row_grads)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a compute thread panicked")).collect()
        })
    };
    let (first, rest) = replicas.split_at_mut(1);
    let mut probs = first[0].work.probs.clone();
    for r in &rest[..parts - 1] {
        first[0].grads.iter_mut().zip(&r.grads).for_each(|(a, b)| *a += b);
        first[0].row_grads.iter_mut().zip(&r.row_grads).for_each(|(a, b)| *a += b);
        probs.extend_from_slice(&r.work.probs);
    }
    (losses.iter().sum(), probs)
}

/// Evaluates the model held by `store` on `files` (rows of unseen ids are not created).
pub fn evaluate(
    store: &mut Store,
    model: &CtrDnn,
    files: &[PathBuf],
    batch_size: usize,
    skip_bad_lines: bool,
) -> anyhow::Result<EvalReport> {
    let dim = model.config().embedding_dim;
    let mut params = Vec::new();
    store.pull(Some(&mut params), &[], &mut Vec::new(), dim, RowCreation::Peek)?;
    let reader = Reader::spawn(files.to_vec(), ReaderConfig { skip_bad_lines, ..ReaderConfig::criteo(batch_size) });
    let (mut dedup, mut rows, mut work, mut metrics) =
        (Dedup::default(), Vec::new(), Work::default(), PassMetrics::default());
    for batch in reader {
        let batch = batch?;
        dedup.run(&batch.ids);
        store.pull(None, &dedup.unique, &mut rows, dim, RowCreation::Peek)?;
        model.predict(&params, &batch, &rows, &dedup.index, &mut work);
        metrics.observe(&work.probs, &batch.labels);
    }
    Ok(EvalReport { samples: metrics.len(), auc: metrics.auc(), log_loss: metrics.log_loss() })
}

/// Trains as configured. `on_progress(bytes, samples)` is called after every step with the
/// totals so far (for progress bars).
pub fn run(config: &TrainConfig, on_progress: &dyn Fn(u64, u64)) -> anyhow::Result<TrainReport> {
    config.validate()?;
    let started = Instant::now();
    let model = CtrDnn::new(&config.model);
    let spec = model.table_spec(config.dense_optimizer, config.sparse_optimizer);
    let me = config.trainer_id;
    let (mut store, first_pass) = open_store(config, &spec)?;
    let dim = config.model.embedding_dim;
    let files = shard_files(&config.train_files, config.trainers, me);
    anyhow::ensure!(
        !files.is_empty(),
        "trainer {me} of {} has no training file: give at least as many files as trainers",
        config.trainers
    );
    tracing::info!(trainer = me, files = files.len(), mode = ?config.mode, first_pass, "training");

    let mut replicas: Vec<Replica> = (0..config.threads)
        .map(|_| Replica { work: Work::default(), grads: Vec::new(), row_grads: Vec::new() })
        .collect();
    let (mut dedup, mut params, mut rows) = (Dedup::default(), Vec::new(), Vec::new());
    let mut report = TrainReport {
        trainer: me,
        samples: 0,
        train_seconds: 0.0,
        wall_seconds: 0.0,
        passes: Vec::new(),
        discarded_pushes: 0,
        bad_lines: 0,
    };
    let (mut step, mut bytes_before) = (0u64, 0u64);
    for pass in first_pass..=config.passes {
        let reader = Reader::spawn(
            files.clone(),
            ReaderConfig { skip_bad_lines: config.skip_bad_lines, ..ReaderConfig::criteo(config.batch_size) },
        );
        let progress = reader.progress();
        let (mut metrics, mut window) = (PassMetrics::default(), (0.0f64, 0usize, Instant::now()));
        for batch in reader {
            let batch = batch?;
            let t0 = Instant::now();
            dedup.run(&batch.ids);
            let version = store.pull(Some(&mut params), &dedup.unique, &mut rows, dim, RowCreation::Create)?;
            let (loss, probs) =
                compute(&model, &params, &batch, &rows, &dedup.index, &mut replicas, dedup.unique.len());
            let r0 = &replicas[0];
            report.discarded_pushes +=
                store.push(me, step, pass, version, batch.len(), &r0.grads, &dedup.unique, &r0.row_grads, dim)?;
            report.train_seconds += t0.elapsed().as_secs_f64();
            metrics.observe(&probs, &batch.labels);
            report.samples += batch.len() as u64;
            step += 1;
            window.0 += loss;
            window.1 += batch.len();
            if config.log_every > 0 && step % config.log_every == 0 {
                let rate = window.1 as f64 / window.2.elapsed().as_secs_f64();
                let tail = metrics.probs.len() - window.1;
                let auc = crate::metrics::auc(&metrics.probs[tail..], &metrics.labels[tail..]);
                tracing::info!(
                    trainer = me,
                    pass,
                    step,
                    loss = window.0 / window.1 as f64,
                    auc = auc.unwrap_or(f64::NAN),
                    samples_per_sec = rate as u64,
                    "progress"
                );
                window = (0.0, 0, Instant::now());
            }
            on_progress(bytes_before + progress.bytes.load(std::sync::atomic::Ordering::Relaxed), report.samples);
        }
        bytes_before += progress.bytes.load(std::sync::atomic::Ordering::Relaxed);
        report.bad_lines += progress.bad_lines.load(std::sync::atomic::Ordering::Relaxed);
        let train = EvalReport { samples: metrics.len(), auc: metrics.auc(), log_loss: metrics.log_loss() };
        tracing::info!(
            trainer = me,
            pass,
            samples = train.samples,
            auc = train.auc.unwrap_or(f64::NAN),
            log_loss = train.log_loss,
            "pass done"
        );
        let test = end_pass(config, &mut store, &model, &spec, pass, step)?;
        report.passes.push(PassReport { pass, train, test });
    }
    if let Store::Remote(client) = &mut store {
        client.close(me)?;
    }
    report.wall_seconds = started.elapsed().as_secs_f64();
    Ok(report)
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
            })?;
            client.declare(spec)?;
            Store::Remote(Box::new(client))
        }
    };
    Ok((store, first_pass))
}

/// Barrier, save and evaluation (trainer 0), barrier.
fn end_pass(
    config: &TrainConfig,
    store: &mut Store,
    model: &CtrDnn,
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
                model: serde_json::json!({ "model": config.model, "batch_size": config.batch_size, "mode": config.mode, "steps": step }),
                shards,
            };
            manifest.write(&dir)?;
            tracing::info!(pass, dir = %dir.display(), "model saved");
        }
        if !config.test_files.is_empty() {
            let r = evaluate(store, model, &config.test_files, config.batch_size.max(1024), config.skip_bad_lines)?;
            tracing::info!(pass, samples = r.samples, auc = r.auc.unwrap_or(f64::NAN), log_loss = r.log_loss, "test");
            test = Some(r);
        }
    }
    if let Store::Remote(client) = store {
        client.barrier(me, 2 * pass as u64).with_context(|| format!("after saving pass {pass}"))?;
    }
    Ok(test)
}
