//! `oar predict` and `oar eval`'s shared start: a saved model loaded with the model and data
//! description its manifest carries ([`load`]; a manifest's `pipe_command` runs only with
//! `--trust-pipe-command`, [`check_pipe_command`]), and its scores for data files written one
//! line per sample, in input order, computed on several threads ([`predict`]). A [`Scorer`] holds
//! one thread's buffers and scores a batch per head; `oar serve` scores with it too.
//!
//! One rule for ids without a row: evaluation, `oar predict`, the export's lookups and `oar serve`
//! read such an id as zeros (a serving key-value store's default), so every path that scores a
//! saved model gives the same number; only training pulls create rows or return their seeded
//! initial values.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use anyhow::Context;

use crate::base::batch::Batch;
use crate::data::{Reader, ReaderConfig, Schema};
use crate::model::{Model, Registry, Work};
use crate::persist::checkpoint::Manifest;
use crate::protocol::RowCreation;
use crate::table::Shard;
use crate::train::{pull_rows, Lookups};

/// A saved model ready to score data.
pub struct Saved {
    /// Its manifest.
    pub manifest: Manifest,
    /// The network, rebuilt from the manifest's description.
    pub model: Model,
    /// How its data files are read.
    pub schema: Schema,
    /// Its parameters, every server's shard merged.
    pub shard: Shard,
    /// Its dense parameters, read out of the shard once.
    pub params: Vec<f32>,
}

/// Refuses a saved model whose manifest names a `pipe_command` unless `trusted`
/// (`--trust-pipe-command`): the command would run on this machine over every data file, and
/// a model from elsewhere is not a job file its user wrote. When trusted, says the command
/// before it runs, escaped, so control characters in it cannot hide the line.
pub fn check_pipe_command(schema: &Schema, dir: &std::path::Path, trusted: bool) -> anyhow::Result<()> {
    let Some(command) = &schema.pipe_command else { return Ok(()) };
    anyhow::ensure!(
        trusted,
        "{}: the saved model reads its data through the pipe_command {command:?} its manifest names: \
         run it only if you trust the model's source, with --trust-pipe-command",
        dir.display()
    );
    eprintln!(
        "oar: the data is read through the saved model's pipe_command {command:?} (its manifest, in {})",
        dir.display()
    );
    Ok(())
}

/// Loads the saved model in `dir` (an output folder or one of its pass folders), checking that
/// its parameters fit its description.
pub fn load(dir: &Path, registry: &Registry) -> anyhow::Result<Saved> {
    let (manifest, shard) = crate::persist::checkpoint::load_merged(dir)?;
    let model_config: crate::model::ModelConfig = serde_json::from_value(manifest.model["model"].clone())
        .with_context(|| format!("{}: the manifest's model description is not one this oar reads", dir.display()))?;
    // Models saved before `[data]` existed were Criteo models.
    let data: crate::data::DataConfig = match manifest.model.get("data") {
        Some(d) => serde_json::from_value(d.clone())
            .with_context(|| format!("{}: manifest has an unreadable data config", dir.display()))?,
        None => crate::data::DataConfig::default(),
    };
    let (model, schema) = crate::train::job_config::build_model(&model_config, &data, registry)
        .with_context(|| format!("{}: the saved model", dir.display()))?;
    let dims = |tables: &mut dyn Iterator<Item = (String, usize)>| tables.collect::<Vec<_>>();
    anyhow::ensure!(
        model.table_spec(shard.spec.dense.optimizer, shard.spec.dense.optimizer).dense == shard.spec.dense
            && dims(&mut model.tables().iter().map(|t| (t.name.clone(), t.dim)))
                == dims(&mut shard.spec.sparse.iter().map(|t| (t.name.clone(), t.dim))),
        "{}: the saved parameters do not fit the saved model description (layers or tables differ)",
        dir.display()
    );
    let mut params = Vec::new();
    shard.dense.lock().read(&mut params);
    Ok(Saved { manifest, model, schema, shard, params })
}

/// What [`predict`] did.
#[derive(Clone, Debug, Default)]
pub struct PredictReport {
    /// Lines written (samples scored).
    pub samples: u64,
    /// Data lines skipped as bad (with `skip_bad_lines`).
    pub bad_lines: u64,
}

/// How to score.
pub struct PredictConfig {
    /// Data files, read in this order.
    pub files: Vec<PathBuf>,
    /// Samples per batch.
    pub batch_size: usize,
    /// Threads computing scores.
    pub threads: usize,
    /// Skip and count bad lines instead of failing.
    pub skip_bad_lines: bool,
}

/// Writes to `out` one line per sample of `config.files`, in input order: every head's score
/// (the numbers `oar eval`'s metrics use: a click probability, a regression value, or the true
/// class's probability), tab-separated in the heads' order, each written so it reads back as
/// the same f32. `on_progress(bytes read)` is called as batches finish.
pub fn predict(
    saved: &Saved,
    config: &PredictConfig,
    out: &mut dyn Write,
    on_progress: &dyn Fn(u64),
) -> anyhow::Result<PredictReport> {
    let (model, shard, params) = (&saved.model, &saved.shard, &saved.params);
    anyhow::ensure!(config.batch_size > 0, "--batch-size must be at least 1");
    model.check_memory(config.batch_size, config.threads.max(1)).map_err(anyhow::Error::msg)?;
    let reader = Reader::spawn(
        config.files.clone(),
        ReaderConfig { skip_bad_lines: config.skip_bad_lines, ..ReaderConfig::new(&saved.schema, config.batch_size) },
    );
    let progress = reader.progress();
    let threads = config.threads.max(1);
    let (work_tx, work_rx) = mpsc::sync_channel::<(u64, Batch)>(2 * threads);
    let work_rx = Arc::new(parking_lot::Mutex::new(work_rx));
    let (done_tx, done_rx) = mpsc::channel::<(u64, anyhow::Result<(usize, String)>)>();
    let mut report = PredictReport::default();
    std::thread::scope(|s| -> anyhow::Result<()> {
        // Owned here: a write that fails returns from this closure and drops it, so the workers'
        // sends fail, they stop, and the feeder's do too. Held outside, every batch was still
        // read and scored before the error was reported.
        let done_rx = done_rx;
        for _ in 0..threads {
            let (work_rx, done_tx, params) = (work_rx.clone(), done_tx.clone(), params);
            s.spawn(move || {
                let mut scorer = Scorer::default();
                loop {
                    let next = work_rx.lock().recv();
                    let Ok((seq, batch)) = next else { break };
                    if done_tx.send((seq, scorer.lines(model, shard, params, &batch))).is_err() {
                        break;
                    }
                }
            });
        }
        // Only the workers hold the work queue: should they all stop, the feeder's sends fail
        // and it stops too instead of waiting forever.
        drop(work_rx);
        drop(done_tx);
        // Batches go out numbered; their lines are written back in that order.
        let feeder = s.spawn(move || -> anyhow::Result<()> {
            for (seq, batch) in reader.enumerate() {
                if work_tx.send((seq as u64, batch?)).is_err() {
                    break; // the writer stopped on an error, reported below
                }
            }
            Ok(())
        });
        let mut waiting = std::collections::BTreeMap::new();
        let mut next = 0u64;
        for (seq, lines) in done_rx.iter() {
            waiting.insert(seq, lines);
            while let Some(lines) = waiting.remove(&next) {
                let (samples, lines) = lines?;
                report.samples += samples as u64;
                out.write_all(lines.as_bytes()).context("writing the predictions")?;
                on_progress(progress.bytes.load(std::sync::atomic::Ordering::Relaxed));
                next += 1;
            }
        }
        feeder.join().expect("the feeding thread does not panic")?;
        anyhow::ensure!(waiting.is_empty(), "{} batches were scored but not written", waiting.len());
        Ok(())
    })?;
    out.flush().context("writing the predictions")?;
    report.bad_lines = progress.bad_lines.load(std::sync::atomic::Ordering::Relaxed);
    Ok(report)
}

/// Samples scored at a time by [`Scorer::scores_in_parts`]: a request's activations take what
/// this many do, however many samples it holds (one of 1,000,000 took 10 GB scored whole).
pub const SCORE_ROWS: usize = 4096;

/// Data `lines` in `schema`'s format (a line end at the end of one is dropped) as one batch; an
/// error names the line by its index (`lines[i]: ...`).
pub fn lines_batch<'a>(schema: &Schema, lines: impl IntoIterator<Item = &'a [u8]>) -> Result<Batch, String> {
    let mut parser = crate::data::parser(schema);
    let mut batch = Batch::new(schema.labels.len(), schema.dense_width, schema.slots.len());
    for (i, line) in lines.into_iter().enumerate() {
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        parser.parse(line, &mut batch).map_err(|e| format!("lines[{i}]: {e}"))?;
    }
    Ok(batch)
}

/// One thread's buffers for scoring batches of a saved model (`oar predict`, `oar serve`).
#[derive(Default)]
pub struct Scorer {
    lookups: Lookups,
    rows: Vec<Vec<f32>>,
    work: Work,
}

impl Scorer {
    /// Every head's scores of `batch` (per head, one per sample): the numbers `oar predict`
    /// writes, `params` being the model's dense parameters.
    pub fn scores(
        &mut self,
        model: &Model,
        shard: &Shard,
        params: &[f32],
        batch: &Batch,
    ) -> anyhow::Result<&[Vec<f32>]> {
        model.check_batch(batch).map_err(anyhow::Error::msg)?;
        self.lookups.run(batch, model.table_slots(), None);
        self.rows.resize_with(model.tables().len(), Vec::new);
        let dims: Vec<usize> = model.tables().iter().map(|t| t.dim).collect();
        // Ids without a row read as zeros, and no row is created.
        pull_rows(shard, &self.lookups.ids(&dims), &mut self.rows, RowCreation::Peek)?;
        model.evaluate(params, batch, &self.lookups.rows(&self.rows), &mut self.work);
        Ok(&self.work.head_probs)
    }

    /// Every head's scores of `batch` (per head, one per sample), [`SCORE_ROWS`] samples at a
    /// time, so its activations take what that many do however many samples it holds.
    pub fn scores_in_parts(&mut self, saved: &Saved, batch: &Batch) -> anyhow::Result<Vec<Vec<f32>>> {
        let mut scores = vec![Vec::with_capacity(batch.len()); saved.model.head_names().len()];
        for start in (0..batch.len()).step_by(SCORE_ROWS) {
            let part = batch.slice(start..(start + SCORE_ROWS).min(batch.len()));
            let heads = self.scores(&saved.model, &saved.shard, &saved.params, &part)?;
            scores.iter_mut().zip(heads).for_each(|(s, h)| s.extend_from_slice(h));
        }
        Ok(scores)
    }

    /// The output lines of `batch`, with their number.
    fn lines(
        &mut self,
        model: &Model,
        shard: &Shard,
        params: &[f32],
        batch: &Batch,
    ) -> anyhow::Result<(usize, String)> {
        let heads = self.scores(model, shard, params, batch)?;
        let mut text = String::with_capacity(batch.len() * 12 * heads.len());
        for i in 0..batch.len() {
            for (h, probs) in heads.iter().enumerate() {
                if h > 0 {
                    text.push('\t');
                }
                use std::fmt::Write;
                let _ = write!(text, "{}", probs[i]);
            }
            text.push('\n');
        }
        Ok((batch.len(), text))
    }
}
