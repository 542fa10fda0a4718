//! The job description shared by `oar train` and `oar launch`: model shape, optimizers and
//! training settings, read from a TOML file and overridden by flags or `OAR_*` environment
//! variables (precedence: flag > env > file > default). Resolved once, validated, then passed
//! down by value; nothing re-reads the environment later.
//!
//! [`JobConfig`] is the whole file: the model, the optimizers, the training settings and the
//! data. Its validation builds the model graph ([`build_model`], which also tells the data's
//! schema what labels the model's heads take), so a bad graph fails before any process starts.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::data::{DataConfig, Schema};
use crate::model::{Input, Model, ModelConfig, Registry};
use crate::nn::Precision;
use crate::table::Optimizer;

/// The default of `TrainConfig::sync_warmup`.
pub const DEFAULT_SYNC_WARMUP: u64 = 100;
/// The default of `TrainConfig::geo_k_steps`.
pub const DEFAULT_GEO_K_STEPS: u64 = 100;
/// The default of `TrainConfig::scale_stale_steps`.
pub const DEFAULT_SCALE_STALE_STEPS: bool = true;
/// From this many trainers on, async mode's dense parameters are synchronous by default
/// (`TrainSettings::sync_dense`).
pub const SYNC_DENSE_FROM_TRAINERS: usize = 8;
/// The default of `TrainSettings::sync_dense_batch`, in batches: a synchronous dense step
/// merges at most this many trainers' batches.
pub const SYNC_DENSE_BATCHES: usize = 8;
/// The default of `TrainSettings::sync_dense_ramp`: merged steps after the warm-up that cover
/// half of `sync_dense_batch`.
pub const DEFAULT_SYNC_DENSE_RAMP: u64 = 25;

/// The days to train and how each is split (what `train::online` reads of a pass).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Online {
    /// The days in order: the date (`YYYYMMDD`) and the day's files in name order.
    pub days: Vec<(String, Vec<PathBuf>)>,
    /// Passes per day, each over one split of the day's files.
    pub passes_per_day: u32,
}

/// Training settings of a job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSettings {
    /// Samples per step per trainer.
    pub batch_size: usize,
    /// Passes over the data.
    pub passes: u32,
    /// Data-parallel compute threads per trainer.
    pub threads: usize,
    /// Log metrics every this many steps.
    pub log_every: u64,
    /// Steps between two points of the training curves (`metrics.csv`; 0: only pass points).
    pub metrics_every: u64,
    /// Also write the curves as TensorBoard event files under this folder (`trainer-K/`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensorboard: Option<PathBuf>,
    /// Skip and count bad data lines instead of failing.
    pub skip_bad_lines: bool,
    /// Seconds to wait for servers, sync steps and barriers.
    pub timeout_secs: u64,
    /// Async: discard pushes more than this many x trainers updates stale.
    pub lag_ratio: f64,
    /// Train in-process without servers, whatever the command line says about servers.
    pub is_local: bool,
    /// Local mode only: apply each update this many steps after it was computed (a
    /// deterministic stand-in for async staleness).
    pub delay: usize,
    /// Async mode with one thread: pull the next batch's parameters while this one computes.
    /// It hides the network (about 12% more samples/s on the CTR-DNN) but adds about one step
    /// of staleness per trainer, which costs sequence and multi-task models 0.01-0.07 AUC
    /// (docs/src/modes.md): off by default.
    pub pull_ahead: bool,
    /// Async mode: the first this many updates are synchronous steps at the per-trainer batch
    /// / trainers, i.e. local training's updates, before the pushes go async.
    pub sync_warmup: u64,
    /// Async mode: divide the dense learning rate of a push `k > 1` updates stale by `k`.
    pub scale_stale_steps: bool,
    /// Async mode: the dense parameters synchronous among trainers (one update per step of
    /// all trainers, merged) while the rows stay async (PERSIA's hybrid). `None`: on from
    /// [`SYNC_DENSE_FROM_TRAINERS`] trainers, where late rows and a late dense part together cost
    /// AUC (docs/src/modes.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_dense: Option<bool>,
    /// `sync_dense`: the samples one merged dense step covers at most. Where trainers x
    /// `batch_size` is more, each trainer cuts its batches into steps of about
    /// `sync_dense_batch / trainers` samples, so the dense part still gets enough updates
    /// (docs/src/modes.md). `None`: [`SYNC_DENSE_BATCHES`] x `batch_size`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_dense_batch: Option<usize>,
    /// `sync_dense`: the first this many merged steps after the warm-up cover half of
    /// `sync_dense_batch`, a step between the warm-up's one batch and the full merged step,
    /// so that a short run still gives its dense part enough updates (docs/src/modes.md);
    /// 0: none.
    pub sync_dense_ramp: u64,
    /// GEO mode: local steps between two exchanges with the servers (Paddle's `k_steps`,
    /// PaddleRec's `geo_step`); at least 1.
    pub geo_k_steps: u64,
    /// Scale each step's gradients so that the L2 norm of the batch's mean gradient (dense and
    /// embedding rows together) is at most this (PaddlePaddle's `ClipGradByGlobalNorm`, applied
    /// per trainer batch as in its parameter-server mode); `None`: no clip.
    pub clip_grad_norm: Option<f32>,
    /// The matrix products' operands in training: `f32`, or `bf16` (bf16 operands, f32 sums,
    /// on CPUs with AVX512_BF16; f32 with a warning elsewhere). The weights, the optimizers and
    /// evaluation stay f32.
    pub precision: Precision,
    /// Save the tables for serving every this many passes (Paddle's `save_delta_frequency`):
    /// a delta, or a base when none was saved yet; needs an output folder. `None`: no such saves.
    pub delta_every: Option<u32>,
    /// Online training: the folder of day folders (`YYYYMMDD/part-*`, see `oar gen stream`)
    /// trained day after day instead of passes over the training files.
    pub online: Option<std::path::PathBuf>,
    /// Online training: the days to train, `FROM..TO` (`YYYYMMDD`, both included).
    pub days: Option<String>,
    /// Online training: passes per day, each over one split of the day's files.
    pub passes_per_day: u32,
    /// Give each trainer's lines of a pass in a random order, a new one every pass (PaddlePaddle's
    /// `local_shuffle`; see [`crate::data::read::shuffle`]). Test files are read in order.
    pub shuffle: bool,
    /// Lines a trainer holds to shuffle (`None`: all of its share of the pass, within the memory
    /// it may take).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shuffle_window: Option<u64>,
}

impl Default for TrainSettings {
    fn default() -> Self {
        TrainSettings {
            batch_size: 512,
            passes: 1,
            threads: 1,
            log_every: 200,
            metrics_every: 50,
            tensorboard: None,
            skip_bad_lines: false,
            timeout_secs: 300,
            lag_ratio: 2.5,
            is_local: false,
            delay: 0,
            pull_ahead: false,
            sync_warmup: DEFAULT_SYNC_WARMUP,
            scale_stale_steps: DEFAULT_SCALE_STALE_STEPS,
            sync_dense: None,
            sync_dense_batch: None,
            sync_dense_ramp: DEFAULT_SYNC_DENSE_RAMP,
            geo_k_steps: DEFAULT_GEO_K_STEPS,
            clip_grad_norm: None,
            precision: Precision::F32,
            delta_every: None,
            online: None,
            days: None,
            passes_per_day: 1,
            shuffle: false,
            shuffle_window: None,
        }
    }
}

impl TrainSettings {
    /// Whether a trainer of `trainers` in `mode` keeps the dense parameters synchronous
    /// (`sync_dense`): by default from [`SYNC_DENSE_FROM_TRAINERS`] on, unless it pulls ahead
    /// (which a synchronous dense step excludes); an error if asked of a mode other than async
    /// or together with `pull_ahead`.
    pub fn sync_dense(&self, mode: crate::protocol::Mode, trainers: usize) -> anyhow::Result<bool> {
        let asked = self.sync_dense;
        if asked == Some(true) && mode != crate::protocol::Mode::Async {
            anyhow::bail!("sync_dense is an async-mode setting; this job's mode is {mode}");
        }
        if asked == Some(true) && self.pull_ahead {
            anyhow::bail!("sync_dense and pull_ahead exclude each other: a synchronous dense step must be pulled after it is applied");
        }
        let auto = trainers >= SYNC_DENSE_FROM_TRAINERS && !self.pull_ahead;
        Ok(mode == crate::protocol::Mode::Async && asked.unwrap_or(auto))
    }

    /// In `sync_dense`, the steps each batch of a trainer of `trainers` is cut into: as few as
    /// keep a merged dense step within `sync_dense_batch` samples, at most one per sample.
    pub fn sync_dense_parts(&self, trainers: usize) -> anyhow::Result<usize> {
        anyhow::ensure!(self.sync_dense_batch != Some(0), "sync_dense_batch must be at least 1 sample");
        let merged = self.batch_size.saturating_mul(trainers);
        Ok(merged.div_ceil(self.sync_dense_cap().max(1)).clamp(1, self.batch_size.max(1)))
    }

    /// `sync_dense`: the samples one merged dense step covers at most, `sync_dense_batch` or
    /// by default [`SYNC_DENSE_BATCHES`] x `batch_size`.
    pub fn sync_dense_cap(&self) -> usize {
        self.sync_dense_batch.unwrap_or(self.batch_size.saturating_mul(SYNC_DENSE_BATCHES))
    }

    /// How trainers shuffle: `Some(window)` lines held at once (`u64::MAX`: a trainer's whole
    /// share), `None`: read in order.
    pub fn shuffle(&self) -> anyhow::Result<Option<u64>> {
        match (self.shuffle, self.shuffle_window) {
            (_, Some(0)) => anyhow::bail!("shuffle_window (--shuffle-window) must be at least 1 line"),
            (false, Some(w)) => {
                anyhow::bail!(
                    "shuffle_window (--shuffle-window) = {w} sets how shuffling holds lines, but shuffle is off: set \
                     shuffle = true (--shuffle)"
                )
            }
            (false, None) => Ok(None),
            (true, w) => Ok(Some(w.unwrap_or(u64::MAX))),
        }
    }
}

/// A whole job file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct JobConfig {
    /// The network.
    pub model: ModelConfig,
    /// Optimizer of the dense parameters.
    pub dense_optimizer: Optimizer,
    /// Optimizer of the embedding table.
    pub sparse_optimizer: Optimizer,
    /// Training settings.
    pub train: TrainSettings,
    /// How data files are read.
    pub data: DataConfig,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            model: ModelConfig::default(),
            dense_optimizer: Optimizer::adam(1e-3),
            sparse_optimizer: Optimizer::adagrad(0.05),
            train: TrainSettings::default(),
            data: DataConfig::default(),
        }
    }
}

/// Largest job file read (16 MiB): far above any real one (the zoo's are a few KiB), and a
/// bound on what a mistaken path (a log, a data file, `/dev/zero`) can make a process hold.
pub const MAX_JOB_FILE_BYTES: u64 = 16 << 20;

/// Longest any wait or period a job file or flag sets (30 days): far beyond any job's, and far
/// from the sizes where adding a duration to a clock overflows (a panic).
pub const MAX_SECONDS: u64 = 30 * 86_400;

/// A job file's TOML error as one line, `FILE:LINE:COLUMN: message`, the message cut to 300
/// characters and its control characters escaped: the parser's own report is six lines that
/// quote the source line whole (a 15 MB line came back as 31 MB of errors, escape codes and all).
fn toml_error(path: &Path, text: &str, e: &toml::de::Error) -> String {
    let at = match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
            format!(":{line}:{column}")
        }
        None => String::new(),
    };
    let message: String = e.message().trim().chars().flat_map(char::escape_debug).take(300).collect();
    format!("{}{at}: {message}", path.display())
}

impl JobConfig {
    /// Reads a TOML job file; unknown keys are errors that name the file.
    pub fn from_file(path: &Path) -> anyhow::Result<JobConfig> {
        let bytes = crate::base::state_file::read_named(path, MAX_JOB_FILE_BYTES)?;
        let text = String::from_utf8(bytes).map_err(|e| anyhow::anyhow!("{}: not UTF-8 text: {e}", path.display()))?;
        let mut job: JobConfig = toml::from_str(&text).map_err(|e| anyhow::anyhow!(toml_error(path, &text, &e)))?;
        // A statistics file is read now, so the job (and the model it saves) carries the numbers.
        if let Some(source @ crate::data::StatsSource::File(_)) = &job.data.dense_stats {
            let base = path.parent().unwrap_or(Path::new("."));
            let stats = source.resolve(base).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            job.data.dense_stats = Some(crate::data::StatsSource::Inline(stats));
        }
        Ok(job)
    }

    /// Writes the job as TOML (the launcher hands its resolved job to children this way).
    pub fn to_file(&self, path: &Path) -> anyhow::Result<()> {
        let text = toml::to_string_pretty(self)?;
        Ok(crate::base::state_file::write_atomic(path, text.as_bytes())?)
    }

    /// Checks everything with the built-in layer types; messages name the setting.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.validate_with(&Registry::default())
    }

    /// The online calendar, when the job trains online: its days' files found on disk.
    pub fn online(&self) -> anyhow::Result<Option<Online>> {
        let t = &self.train;
        match (&t.online, &t.days) {
            (None, None) => Ok(None),
            (Some(dir), Some(days)) => Ok(Some(Online {
                days: crate::data::read::calendar::days_in(dir, days)?,
                passes_per_day: t.passes_per_day,
            })),
            (Some(_), None) => anyhow::bail!("online training needs its days: --days FROM..TO (YYYYMMDD)"),
            (None, Some(_)) => anyhow::bail!("--days names the days of online training: give --online DIR too"),
        }
    }

    /// Checks everything, the model graph with `registry`'s layer types; messages name the
    /// setting (or layer).
    pub fn validate_with(&self, registry: &Registry) -> anyhow::Result<()> {
        // Statistics a scaling job does not give are computed when it starts (a server never
        // needs them): the rest is checked without them.
        let data = if self.data.needs_stats() { self.data.unscaled() } else { self.data.clone() };
        let (model, _) = build_model(&self.model, &data, registry)?;
        model.check_memory(self.train.batch_size, self.train.threads).map_err(anyhow::Error::msg)?;
        model.table_spec(self.dense_optimizer, self.sparse_optimizer).validate().map_err(anyhow::Error::msg)?;
        self.dense_optimizer.validate_named("dense").map_err(anyhow::Error::msg)?;
        self.sparse_optimizer.validate_named("sparse").map_err(anyhow::Error::msg)?;
        anyhow::ensure!(self.train.batch_size > 0, "batch_size must be at least 1");
        anyhow::ensure!(self.train.passes > 0, "passes must be at least 1");
        anyhow::ensure!(self.train.threads > 0, "threads must be at least 1");
        anyhow::ensure!(self.train.timeout_secs > 0, "timeout must be positive");
        anyhow::ensure!(
            self.train.timeout_secs <= MAX_SECONDS,
            "timeout is {} s, more than 30 days",
            self.train.timeout_secs
        );
        anyhow::ensure!(self.train.lag_ratio > 0.0, "lag_ratio must be positive");
        anyhow::ensure!(self.train.geo_k_steps > 0, "geo_k_steps must be at least 1");
        if let Some(online) = self.online()? {
            online.validate()?;
        }
        if self.train.delta_every == Some(0) {
            anyhow::bail!("delta_every must be at least 1 (passes between saves for serving)");
        }
        self.train.shuffle()?;
        self.train.sync_dense_parts(1)?;
        if let Some(c) = self.train.clip_grad_norm {
            anyhow::ensure!(c.is_finite() && c > 0.0, "clip_grad_norm must be a positive number, not {c}");
        }
        Ok(())
    }
}

/// The model `model` describes for data read as `data` says, with `registry`'s layer types, and
/// that data's resolved schema.
pub fn build_model(model: &ModelConfig, data: &DataConfig, registry: &Registry) -> anyhow::Result<(Model, Schema)> {
    let mut schema = Schema::resolve(data, model.shorthand_shape()).map_err(anyhow::Error::msg)?;
    let input = Input { labels: schema.labels.clone(), dense_width: schema.dense_width, slots: schema.slots.clone() };
    let model = Model::build(model, &input, registry).map_err(anyhow::Error::msg)?;
    schema.label_bounds = model.label_bounds();
    Ok((model, schema))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::OptimizerKind;

    #[test]
    fn a_toml_error_is_one_line_naming_file_line_and_column_without_the_source() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        let long = "7".repeat(100_000);
        std::fs::write(&path, format!("[train]\nbatch_size = 5\n[model]\nhidden = [{long}, \"\u{1b}[2K\"\n")).unwrap();
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:4:", path.display())), "{err}");
        assert!(!err.contains('\n') && !err.contains('\u{1b}') && err.len() < 1000, "{}", &err[..err.len().min(400)]);
    }

    #[test]
    fn a_job_file_round_trips_and_unknown_keys_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.toml");
        let mut job = JobConfig::default();
        job.train.batch_size = 64;
        job.sparse_optimizer.l2 = 8e-4;
        job.to_file(&path).unwrap();
        assert_eq!(JobConfig::from_file(&path).unwrap(), job);

        std::fs::write(&path, "[train]\nbatch_sise = 3\n").unwrap();
        let err = JobConfig::from_file(&path).unwrap_err().to_string();
        assert!(err.contains("job.toml") && err.contains("batch_sise"), "{err}");
    }

    #[test]
    fn shuffle_settings_resolve_to_a_window_or_are_refused_naming_the_key() {
        let train = |text: &str| toml::from_str::<JobConfig>(&format!("[train]\n{text}")).unwrap().train;
        assert_eq!(train("").shuffle().unwrap(), None);
        assert_eq!(train("shuffle = true").shuffle().unwrap(), Some(u64::MAX));
        assert_eq!(train("shuffle = true\nshuffle_window = 1000").shuffle().unwrap(), Some(1000));
        let err = train("shuffle_window = 1000").shuffle().unwrap_err().to_string();
        assert!(err.contains("shuffle is off: set shuffle = true"), "{err}");
        let err = train("shuffle = true\nshuffle_window = 0").shuffle().unwrap_err().to_string();
        assert_eq!(err, "shuffle_window (--shuffle-window) must be at least 1 line");
        let job = JobConfig { train: train("shuffle_window = 5"), ..JobConfig::default() };
        assert!(job.validate().is_err(), "a job file's validation runs it");
    }

    #[test]
    fn sync_dense_cuts_batches_so_a_merged_step_stays_within_its_cap() {
        let train = |text: &str| toml::from_str::<JobConfig>(&format!("[train]\n{text}")).unwrap().train;
        let parts = |t: &TrainSettings, n| t.sync_dense_parts(n).unwrap();
        let auto = train("");
        let cap = SYNC_DENSE_BATCHES;
        assert_eq!(parts(&auto, 2), 1);
        assert_eq!((parts(&auto, cap), parts(&auto, cap + 1), parts(&auto, 4 * cap)), (1, 2, 4));
        let fixed = train("batch_size = 100\nsync_dense_batch = 1000");
        assert_eq!((parts(&fixed, 10), parts(&fixed, 11), parts(&fixed, 48)), (1, 2, 5));
        assert_eq!(parts(&fixed, 1_000_000), 100, "never below one sample a step");
        let err = train("sync_dense_batch = 0").sync_dense_parts(4).unwrap_err().to_string();
        assert_eq!(err, "sync_dense_batch must be at least 1 sample");
    }

    #[test]
    fn sync_dense_is_on_from_eight_async_trainers_unless_said_and_refused_where_it_cannot_be() {
        use crate::protocol::Mode;
        let train = |text: &str| toml::from_str::<JobConfig>(&format!("[train]\n{text}")).unwrap().train;
        let auto = train("");
        let on = |t: &TrainSettings, mode, n| t.sync_dense(mode, n).unwrap();
        assert_eq!((on(&auto, Mode::Async, 7), on(&auto, Mode::Async, 8)), (false, true));
        assert!(!on(&auto, Mode::Sync, 64) && !on(&auto, Mode::Geo, 64) && !on(&auto, Mode::Local, 64));
        assert!(!on(&train("sync_dense = false"), Mode::Async, 64), "turned off");
        assert!(on(&train("sync_dense = true"), Mode::Async, 2), "turned on below eight");
        assert!(!on(&train("pull_ahead = true"), Mode::Async, 64), "pulling ahead keeps it off");
        let err = train("sync_dense = true").sync_dense(Mode::Geo, 4).unwrap_err().to_string();
        assert_eq!(err, "sync_dense is an async-mode setting; this job's mode is geo");
        let err = train("sync_dense = true\npull_ahead = true").sync_dense(Mode::Async, 4).unwrap_err().to_string();
        assert!(err.starts_with("sync_dense and pull_ahead exclude each other"), "{err}");
    }

    #[test]
    fn the_documented_adagrad_example_parses() {
        let job: JobConfig = toml::from_str("[sparse_optimizer]\nkind = \"adagrad\"\nlr = 3e-3\nl2 = 8e-4\n").unwrap();
        assert_eq!(job.sparse_optimizer.kind, OptimizerKind::Adagrad);
        assert_eq!(job.sparse_optimizer.lr, 3e-3);
        assert_eq!(job.sparse_optimizer.l2, 8e-4);
    }
}
