//! The trainer: reads its share of the data, and per batch deduplicates ids per table, pulls
//! parameters, runs forward/backward (split over `threads` data-parallel replicas; in async mode
//! against servers the threads are Hogwild workers instead, each on its own batches), pushes
//! gradient sums, and records every head's metrics. After each pass it meets the other trainers
//! at a barrier, trainer 0 saves the model and evaluates it on the test files, and everyone meets
//! again.
//!
//! The same loop runs locally (parameters in an in-process [`Shard`], no sockets) or against
//! servers (through a [`Client`]); only [`Store`] differs.
//!
//! [`run_with`] is a short driver over `job.rs`'s phases, pass after pass: where a run starts (a
//! resume, a rejoin's recorded position, a warm start), opening the store, then each pass and its
//! end. [`evaluate`] scores the model a store holds on files, creating no rows.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use parking_lot::Mutex;

mod ahead;
mod comms;
mod config;
mod day_end;
mod geo;
pub mod init_model;
mod job;
pub mod job_config;
pub mod online;
pub mod paddlerec;
mod pass;
pub mod position;
mod report;
mod saves;
mod step;
mod store;
pub mod telemetry;
mod warmup;

pub use config::{ports_per_server, TrainConfig, MAX_PORTS};
use day_end::{catch_up_day_ends, day_end_fault, DayEndPoint};
use pass::PassLoop;
use position::{Position, PositionLog};
pub use report::{AllTrainersAuc, DayReport, HeadReport, PassReport, StepTimes, TrainReport};
use saves::save_for_serving;
pub use store::{pull_rows, Lookups, StepHeader, Store, TableLookup};
use warmup::WarmupPlan;

use crate::base::batch::Batch;
use crate::client::{Client, ClientConfig};
use crate::data::{shard_files, Reader, ReaderConfig, Schema};
use crate::model::{Model, Registry, Work};
use crate::observe::metrics::EvalReport;
use crate::observe::metrics::{AucBuckets, PassMetrics, Staleness};
use crate::persist::checkpoint::{pass_dir_name, Manifest, FORMAT_VERSION};
use crate::protocol::Mode;
use crate::protocol::RowCreation;
use crate::table::{Shard, TableSpec};

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
    // `oar eval`'s own --batch-size is checked here too: a billion aborted allocating 2.4 GB.
    anyhow::ensure!(batch_size > 0, "--batch-size must be at least 1");
    model.check_memory(batch_size, 1).map_err(anyhow::Error::msg)?;
    let dims = dims(model);
    let mut params = Vec::new();
    store.pull(Some(&mut params), &[], &mut [], RowCreation::Peek)?;
    let reader =
        Reader::spawn(files.to_vec(), ReaderConfig { skip_bad_lines, ..ReaderConfig::new(schema, batch_size) });
    let progress = reader.progress();
    let (mut lookups, mut rows, mut work) = (Lookups::default(), Vec::new(), Work::default());
    rows.resize_with(dims.len(), Vec::new);
    let mut metrics = HeadMetrics::new(model);
    for batch in reader {
        let batch = batch?;
        model.check_batch(&batch).map_err(anyhow::Error::msg)?;
        lookups.run(&batch, model.table_slots(), model.click_column());
        store.pull(None, &lookups.ids(&dims), &mut rows, RowCreation::Peek)?;
        model.evaluate(&params, &batch, &lookups.rows(&rows), &mut work);
        metrics.observe(model, &batch, &work.heads());
    }
    let reports: Vec<EvalReport> = metrics.0.iter().map(PassMetrics::report).collect();
    let bad = progress.bad_lines.load(Relaxed);
    if bad > 0 {
        tracing::warn!("{bad} bad line(s) skipped in {}", files_named(files));
    }
    // Figures over no sample (a log-loss of NaN, "one class only") would pass for a result.
    anyhow::ensure!(reports[0].samples > 0, "no sample to evaluate in {}{}", files_named(files), skipped(bad));
    Ok(reports)
}

/// `files` for a message: the first few, and how many in all.
fn files_named(files: &[PathBuf]) -> String {
    let first: Vec<String> = files.iter().take(3).map(|f| f.display().to_string()).collect();
    let more = if files.len() > 3 { format!(" and {} more", files.len() - 3) } else { String::new() };
    format!("{} file(s): {}{more}", files.len(), first.join(", "))
}

/// ` (N bad lines skipped)` when any were.
fn skipped(bad: u64) -> String {
    if bad > 0 {
        format!(" ({bad} bad line(s) skipped)")
    } else {
        String::new()
    }
}

/// One [`PassMetrics`] per head.
struct HeadMetrics(Vec<PassMetrics>);

impl HeadMetrics {
    fn new(model: &Model) -> HeadMetrics {
        HeadMetrics(model.losses().into_iter().map(PassMetrics::new).collect())
    }

    /// The first head's AUC over its last `n` predictions (a window of steps).
    fn recent_auc(&self, n: usize) -> Option<f64> {
        let m = &self.0[0];
        let tail = m.probs.len().saturating_sub(n);
        crate::observe::metrics::auc(&m.probs[tail..], &m.labels[tail..])
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

/// Trains as configured, with the layer types of `registry` (a program's own layers): the
/// phases of `train/job.rs`, pass after pass.
pub fn run_with(
    config: &TrainConfig,
    registry: &Registry,
    on_progress: &dyn Fn(u64, u64),
) -> anyhow::Result<TrainReport> {
    let (config, from) = job::with_stats(config)?;
    let mut job = job::Job::start(&config, registry, from)?;
    for pass in job.passes() {
        let trained = job.train_pass(pass, on_progress)?;
        job.end_of_pass(pass, trained)?;
    }
    job.finish()
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
        order: config.order(),
    };
    let (Some(dir), true) = (&config.positions, config.rejoin) else { return Ok(fresh) };
    match Position::load(dir, &config.job, config.trainer_id)? {
        Some(p) => {
            p.check_passes(dir, config.passes)?;
            p.check_order(dir, &fresh.order)?;
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

/// Connects (or builds the local store) and returns it with the first pass to train: after the
/// saved pass for a resume, the first for a warm start (`from`'s tables already checked).
fn open_store(
    config: &TrainConfig,
    spec: &TableSpec,
    from: Option<&init_model::StartModel>,
    warm: Option<&str>,
) -> anyhow::Result<(Store, u32)> {
    let resumed = match (&config.resume, from) {
        (Some(_), Some(from)) => {
            let (manifest, pass_dir) = (&from.manifest, &from.pass_dir);
            if let Some(o) = &config.online {
                let saved = manifest.model.get("online").map(|v| serde_json::from_value(v.clone())).transpose();
                let saved = saved.with_context(|| format!("{}: the manifest's online calendar", pass_dir.display()))?;
                o.check_resume(manifest.pass, saved.as_ref()).with_context(|| pass_dir.display().to_string())?;
            }
            Some(manifest.pass)
        }
        _ => None,
    };
    // Compared before adding one: a manifest's pass of u32::MAX wrapped to a first pass of 0.
    let done = resumed.unwrap_or(0);
    anyhow::ensure!(
        done < config.passes,
        "the saved model has {done} pass(es) already: nothing to train; ask for more with --passes"
    );
    let first_pass = done + 1;
    let store = match config.mode {
        // A warm start's servers load its model; here the trainer is the one.
        Mode::Local => match from {
            Some(from) => {
                from.manifest.check_size(&from.pass_dir)?;
                let shard = from.manifest.load_to_continue(&from.pass_dir, 0, 1)?;
                Store::Local(Box::new(shard), config.nonfinite)
            }
            None => Store::Local(Box::new(Shard::new(spec.clone(), 0, 1)), config.nonfinite),
        },
        _ => {
            if config.secret.as_ref().is_some_and(|s| s.is_master()) {
                tracing::warn!(
                    "this trainer holds the job's master secret, so it could act as any process of the job \
                     (insiders are not told apart): give each trainer its own credential (oar secret; oar launch \
                     does)"
                );
            }
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
                tls: config.tls.clone(),
            })?;
            let calendar = config.online.as_ref().map(|o| o.listing()).transpose()?.unwrap_or_default();
            let mut model = description(config, None, warm);
            // A rejoining trainer's servers may have saved passes since into the folder it
            // started from, or restarted from their checkpoints: only a first start is compared.
            model["start_model"] = match from {
                _ if config.rejoin => "rejoining".into(),
                Some(from) => from.record(),
                None => serde_json::Value::Null,
            };
            client.declare_with(crate::protocol::Declaration { spec: spec.clone(), model, calendar })?;
            Store::Remote(Box::new(client))
        }
    };
    Ok((store, first_pass))
}

/// What a saved model's manifest says about the model and how it was trained (`warm`: the
/// model its job, or the job it resumes, started from with `--init-model`).
fn description(config: &TrainConfig, steps: Option<u64>, warm: Option<&str>) -> serde_json::Value {
    let mut d = serde_json::json!({
        "model": config.model.with_shorthand_defaults(),
        "data": config.data,
        "batch_size": config.batch_size,
        "mode": config.mode,
    });
    if let Some(steps) = steps {
        d["steps"] = steps.into();
    }
    if let Some(warm) = warm {
        d["init_model"] = warm.into();
    }
    d
}
