//! The trainer: reads its share of the data, and per batch deduplicates ids per table, pulls
//! parameters, runs forward/backward (split over `threads` data-parallel replicas; in async mode
//! against servers the threads are Hogwild workers instead, each on its own batches), pushes
//! gradient sums, and records every head's metrics. After each pass it meets the other trainers at a barrier, trainer 0
//! saves the model and evaluates it on the test files, and everyone meets again.
//!
//! The same loop runs locally (parameters in an in-process [`Shard`], no sockets) or against
//! servers (through a [`Client`]); only [`Store`] differs.

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
pub mod init_model;
pub mod online;
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

use crate::batch::Batch;
use crate::checkpoint::{pass_dir_name, Manifest, FORMAT_VERSION};
use crate::client::{Client, ClientConfig};
use crate::data::{shard_files, Reader, ReaderConfig, Schema};
use crate::metrics::EvalReport;
use crate::metrics::{AucBuckets, PassMetrics, Staleness};
use crate::model::{Model, Registry, Work};
use crate::protocol::RowCreation;
use crate::server::Mode;
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
        crate::metrics::auc(&m.probs[tail..], &m.labels[tail..])
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
    // Dense statistics not given: a job that starts from a saved model (resumed or warm) takes
    // that model's; an offline one those of all its training files (as `oar train` computes
    // them), saved with the model.
    let filled;
    let from = init_model::StartModel::open(config.resume.as_deref(), config.init_model.as_deref())?;
    let stats = match (&from, &config.online) {
        (Some(from), _) => Some(from.data(&config.data)?),
        (None, None) => {
            crate::data::transform::fill_stats(&config.data, &config.train_files, config.model.shorthand_shape())?
        }
        (None, Some(_)) => None,
    };
    let config = match stats {
        Some(data) => {
            filled = TrainConfig { data, ..config.clone() };
            &filled
        }
        None => config,
    };
    config.validate()?;
    let started = Instant::now();
    let (model, schema) = crate::config::build_model(&config.model, &config.data, registry)?;
    model.check_memory(config.batch_size, config.threads).map_err(anyhow::Error::msg)?;
    model.check_delay(config.delay).map_err(anyhow::Error::msg)?;
    let spec = model.table_spec(config.dense_optimizer, config.sparse_optimizer);
    spec.validate().map_err(anyhow::Error::msg)?;
    let me = config.trainer_id;
    // The done-file trainer 0 appends to is checked before training, not after the first day.
    if let (0, Some(out), true) = (me, &config.output, config.delta_every.is_some() || config.online.is_some()) {
        crate::export::done_lines(&out.join("donefile.txt"))?;
    }
    if let Some(o) = &config.online {
        o.check_shares(config.trainers, me)?;
    }
    crate::fault::set_trainer_life(u64::from(config.rejoin));
    if let Some(from) = &from {
        from.check_spec(&spec)?;
    }
    let warm = init_model::lineage(config.init_model.as_deref(), from.as_ref());
    let (mut store, first_pass) = open_store(config, &spec, from.as_ref(), warm.as_deref())?;
    let files = shard_files(&config.train_files, config.trainers, me);
    anyhow::ensure!(
        !files.is_empty(),
        "trainer {me} of {} has no training file: give at least as many files as trainers",
        config.trainers
    );
    let start = start_position(config, first_pass)?;
    catch_up_day_ends(config, &mut store, &start)?;
    let positions = match &config.positions {
        Some(dir) => Some(Mutex::new(PositionLog::create(dir, start.clone())?)),
        None => None,
    };
    let (telemetry, _metrics) = match &config.metrics_addr {
        Some(addr) => {
            let t = Arc::new(telemetry::TrainerTelemetry::new(me));
            let shown = t.clone();
            (Some(t), Some(crate::telemetry::Exporter::start(addr, Arc::new(move || shown.render()))?))
        }
        None => (None, None),
    };
    let shuffle = config.order().unwrap_or_else(|| "off".into());
    tracing::info!(trainer = me, files = files.len(), mode = ?config.mode, %shuffle, first_pass = start.pass, model = %model.summary(), "training");

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
        clipped_steps: 0,
        days: Vec::new(),
    };
    let (mut step, mut bytes_before) = (start.step, 0u64);
    let curves =
        crate::curves::CurveLog::open_all(config.metrics_csv.as_deref(), config.tensorboard.as_deref(), me as u32)?;
    let mut exports = crate::export::ExportPlan { delta_every: config.delta_every, based: false };
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
        // Online: this pass's split of its day, this trainer's share of it.
        let pass_files = match &config.online {
            Some(o) => shard_files(o.files(pass), config.trainers, me),
            None => files.clone(),
        };
        let named = files_named(&pass_files);
        let reader = Reader::spawn(
            pass_files,
            ReaderConfig {
                skip_bad_lines: config.skip_bad_lines,
                skip: plan.reader_skip,
                shuffle: config.shuffle_for(pass),
                ..ReaderConfig::new(&schema, config.batch_size)
            },
        );
        let progress = reader.progress();
        let pass_loop = PassLoop {
            config,
            model: &model,
            pass,
            step: AtomicU64::new(step),
            plan,
            positions: positions.as_ref(),
            curves: curves.as_ref().map(|log| (log, started)),
            telemetry: telemetry.as_deref(),
        };
        if let Some(t) = &telemetry {
            t.pass.store(pass as u64, Relaxed);
        }
        let metrics = pass_loop.run(&mut store, reader, &mut report, &|samples| {
            on_progress(bytes_before + progress.bytes.load(Relaxed), samples)
        })?;
        step = pass_loop.step.load(Relaxed);
        bytes_before += progress.bytes.load(Relaxed);
        let bad = progress.bad_lines.load(Relaxed);
        report.bad_lines += bad;
        let trains: Vec<EvalReport> = metrics.0.iter().map(PassMetrics::report).collect();
        // A pass over no sample (empty files, or every line bad) trained nothing, yet saved and
        // announced a model as if it had; a rejoining trainer past its last sample is fine.
        anyhow::ensure!(
            trains[0].samples > 0 || resumed > 0,
            "pass {pass}: trainer {me} read no sample from its {named}{}: nothing to train on",
            skipped(bad)
        );
        for (name, t) in model.head_names().iter().zip(&trains) {
            tracing::info!(trainer = me, pass, samples = t.samples, head = %name, "pass done: {t}");
        }
        if report.staleness.count() > 0 {
            tracing::info!(trainer = me, pass, "push staleness so far: {}", report.staleness);
        }
        // The pass's AUC over every trainer: each sends server 0 its histogram, the end-of-pass
        // barrier waits for all, then each reads them merged.
        let first = &metrics.0[0];
        let buckets = (!first.probs.is_empty()).then(|| AucBuckets::of(&first.probs, &first.labels));
        if let (Store::Remote(client), Some(b)) = (&mut store, &buckets) {
            client.pass_auc(me, pass, b).with_context(|| format!("sending pass {pass}'s AUC histogram"))?;
        }
        let (tests, day) =
            end_pass(config, &mut store, &model, &schema, &spec, pass, step, warm.as_deref(), &mut exports)?;
        let all_trainers = match (&mut store, buckets) {
            (Store::Remote(client), Some(_)) => {
                let g = client.global_auc(pass).with_context(|| format!("reading pass {pass}'s AUC"))?;
                Some(AllTrainersAuc::of(&g.buckets, g.trainers))
            }
            (Store::Local(..), Some(b)) => Some(AllTrainersAuc::of(&b, vec![me as u64])),
            (_, None) => None,
        };
        if let Some(a) = &all_trainers {
            tracing::info!(trainer = me, pass, samples = a.samples, trainers = ?a.trainers, "pass figures over all trainers (Paddle's buckets): {a}");
        }
        let heads = if trains.len() > 1 {
            let names = model.head_names();
            (0..trains.len())
                .map(|h| HeadReport { output: names[h].clone(), train: trains[h].clone(), test: tests.get(h).cloned() })
                .collect()
        } else {
            Vec::new()
        };
        let next_day = day.as_ref().and_then(|d| d.next_day.clone());
        if let Some(mut day) = day {
            day.train_auc = all_trainers.as_ref().and_then(|a| a.auc);
            let next = day.next_day.as_ref().map_or("-".to_string(), |e| e.to_string());
            tracing::info!(date = %day.date, rows = ?day.rows, shrunk = day.shrunk_rows, "day done; next day's first split: {next}");
            report.days.push(day);
        }
        let done = PassReport { pass, train: trains[0].clone(), test: tests.first().cloned(), heads, all_trainers };
        if let Some(t) = &telemetry {
            t.pass_loss.store(done.train.loss.to_bits(), Relaxed);
            t.pass_auc.store(done.train.auc.unwrap_or(f64::NAN).to_bits(), Relaxed);
        }
        if let Some(log) = &curves {
            let seconds = started.elapsed().as_secs_f64();
            for p in done.curve_points(me as u32, step, report.samples, seconds, next_day.as_ref()) {
                log.write(&p);
            }
        }
        report.passes.push(done);
    }
    if let Store::Remote(client) = &mut store {
        client.close(me)?;
    }
    if let Some(p) = &positions {
        p.lock().finish()?;
    }
    report.wall_seconds = started.elapsed().as_secs_f64();
    if report.clipped_steps > 0 {
        let max = config.clip_grad_norm.unwrap_or_default();
        tracing::info!(trainer = me, steps = report.clipped_steps, "steps' gradients clipped to norm {max}");
    }
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

/// Barrier, the saves and evaluation (trainer 0), barrier.
#[allow(clippy::too_many_arguments)]
fn end_pass(
    config: &TrainConfig,
    store: &mut Store,
    model: &Model,
    schema: &Schema,
    spec: &TableSpec,
    pass: u32,
    step: u64,
    warm: Option<&str>,
    exports: &mut crate::export::ExportPlan,
) -> anyhow::Result<(Vec<EvalReport>, Option<DayReport>)> {
    let me = config.trainer_id;
    if let Store::Remote(client) = store {
        client.end_pass(me, pass)?;
        client.barrier(me, 2 * pass as u64 - 1).with_context(|| format!("end of pass {pass}"))?;
    }
    let mut tests = Vec::new();
    let mut day = None;
    // Online: the pass's day and its number within the day; a day ends with a shrink.
    let slot = config.online.as_ref().map(|o| (o, o.slot(pass)));
    let (date, day_pass, day_end) = match slot {
        Some((o, s)) => (o.date_number(s.day), s.pass, s.day_end),
        None => (0, pass, false),
    };
    if me == 0 {
        if let (Some((o, s)), true) = (slot, day_end) {
            day_end_fault(DayEndPoint::BeforeShrink);
            let shrunk_rows =
                store.shrink_day_end(pass).with_context(|| format!("the shrink at the end of day {date}"))?;
            day_end_fault(DayEndPoint::Shrunk);
            day = Some(DayReport { date: o.days[s.day].0.clone(), shrunk_rows, ..DayReport::default() });
        }
        if let Some(out) = &config.output {
            // Before the pass's checkpoint: a crash between the two redoes the pass, saves
            // again and announces the save once; the other order could lose its line.
            if let Some(kind) = exports.due(day_pass, day_end) {
                save_for_serving(out, store, spec, kind, date, day_pass)?;
            }
            if day_end {
                day_end_fault(DayEndPoint::SavedForServing);
            }
            let dir = out.join(pass_dir_name(pass));
            // A link planted at the pass's name had the save's files written wherever it led.
            anyhow::ensure!(
                !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.file_type().is_symlink()),
                "{} is a symbolic link: a save does not go through one",
                dir.display()
            );
            if saves::saved_before(&dir, &config.job, pass, config.rejoin)? {
                tracing::info!(pass, dir = %dir.display(), "the pass was saved before this trainer restarted: kept as it is");
            } else {
                let shards = store.save(&dir).with_context(|| format!("saving pass {pass} to {}", dir.display()))?;
                let mut model = description(config, Some(step), warm);
                if let Some((o, _)) = slot {
                    // Where a resume must count from (`Online::check_resume`).
                    model["online"] = serde_json::to_value(o.saved_day(pass))?;
                }
                let manifest = Manifest {
                    format: FORMAT_VERSION,
                    job: config.job.clone(),
                    pass,
                    num_servers: shards.len(),
                    spec: spec.clone(),
                    model,
                    shards,
                };
                manifest.write(&dir)?;
                tracing::info!(pass, dir = %dir.display(), "model saved");
            }
            if day_end {
                day_end_fault(DayEndPoint::Saved);
            }
        }
        if !config.test_files.is_empty() {
            let batch = config.batch_size.max(1024);
            tests = evaluate_heads(store, model, schema, &config.test_files, batch, config.skip_bad_lines)?;
            for (name, r) in model.head_names().iter().zip(&tests) {
                tracing::info!(pass, samples = r.samples, head = %name, "test: {r}");
            }
        }
        if let (Some((o, s)), Some(d)) = (slot, day.as_mut()) {
            // The day's model on the next day's first split, before any training on it.
            if let Some(next) = o.next_first_split(s.day) {
                let batch = config.batch_size.max(1024);
                let heads = evaluate_heads(store, model, schema, next, batch, config.skip_bad_lines)?;
                d.next_day = heads.into_iter().next();
            }
            for (rows, rss, peak) in store.footprint()? {
                d.rows.push(rows);
                d.rss_bytes.push(rss);
                d.peak_rss_bytes.push(peak);
            }
        }
    }
    if let Store::Remote(client) = store {
        client.barrier(me, 2 * pass as u64).with_context(|| format!("after saving pass {pass}"))?;
    }
    Ok((tests, day))
}
