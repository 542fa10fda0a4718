//! A trainer's configuration ([`TrainConfig`]): every setting one trainer needs, its serde
//! defaults, and its validation.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::data::DataConfig;
use crate::model::ModelConfig;
use crate::nn::Precision;
use crate::protocol::Mode;
use crate::table::Optimizer;

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
    /// Start from this saved model's parameters and optimizer state, passes numbered afresh
    /// (a warm start, [`super::init_model`]).
    pub init_model: Option<PathBuf>,
    /// Log metrics every this many steps (0: only at the end of a pass).
    pub log_every: u64,
    /// Serve this trainer's Prometheus metrics here (port 0: any free port).
    pub metrics_addr: Option<String>,
    /// Append training curves here ([`crate::observe::curves`]): a point every `metrics_every` steps
    /// and at the end of each pass.
    pub metrics_csv: Option<PathBuf>,
    /// Steps between two curve points (0: only pass points).
    pub metrics_every: u64,
    /// Also write the curve points as TensorBoard event files under `DIR/trainer-K/`.
    pub tensorboard: Option<PathBuf>,
    /// Job id (servers refuse other jobs).
    pub job: String,
    /// Skip and count bad data lines instead of failing.
    pub skip_bad_lines: bool,
    /// Local mode: what a step whose gradients hold a NaN, an infinity or a value beyond ±1e18 does, as the servers'
    /// `--nonfinite` (never applied: `fail` stops training naming it, `skip` leaves it out).
    #[serde(default)]
    pub nonfinite: crate::protocol::NonFinite,
    /// How long to keep trying to reach the servers.
    pub connect_timeout: Duration,
    /// Longest wait for any reply (covers sync steps and barriers).
    pub reply_timeout: Duration,
    /// Local mode: apply each update this many steps after it was computed (0: at once), so
    /// the effect of staleness is measured without a network, deterministically.
    #[serde(default)]
    pub delay: usize,
    /// Async mode with one thread: pull the next batch's parameters while this one computes
    /// (off by default: see [`crate::train::job_config::TrainSettings::pull_ahead`]).
    #[serde(default)]
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
    /// Async mode: after the warm-up, each step's dense gradients are merged with every
    /// trainer's into one update (answered once applied, so the next pull sees it), its rows
    /// applied at once (see [`crate::train::job_config::TrainSettings::sync_dense`]).
    #[serde(default)]
    pub sync_dense: bool,
    /// `sync_dense`: each full batch after the warm-up is cut into this many steps, a short
    /// last one into as few steps of that size as hold it (see
    /// [`crate::train::job_config::TrainSettings::sync_dense_parts`]).
    #[serde(default = "one")]
    pub sync_dense_parts: usize,
    /// `sync_dense`: the first this many steps after the warm-up cut each full batch in twice
    /// `sync_dense_parts` (see [`crate::train::job_config::TrainSettings::sync_dense_ramp`]).
    #[serde(default = "default_sync_dense_ramp")]
    pub sync_dense_ramp: u64,
    /// GEO mode: local steps between two exchanges with the servers (Paddle's `k_steps`).
    #[serde(default = "default_geo_k_steps")]
    pub geo_k_steps: u64,
    /// Clip each step's mean gradient to this L2 norm (see [`crate::train::job_config::TrainSettings`]).
    #[serde(default)]
    pub clip_grad_norm: Option<f32>,
    /// The matrix products' operands in training (see
    /// [`crate::train::job_config::TrainSettings::precision`]).
    #[serde(default)]
    pub precision: Precision,
    /// Save the tables for serving every this many passes (see
    /// [`crate::train::job_config::TrainSettings::delta_every`]).
    #[serde(default)]
    pub delta_every: Option<u32>,
    /// Online training's calendar; `passes` is then its passes in all.
    #[serde(default)]
    pub online: Option<crate::train::job_config::Online>,
    /// Under a supervisor that restarts failed servers: how long to wait for a lost server to
    /// come back before failing (`None`: fail at once).
    #[serde(default)]
    pub recover: Option<Duration>,
    /// Shuffle each pass's lines: `Some(window)` lines held at once (`u64::MAX`: the whole
    /// share), `None`: read in order ([`crate::data::read::shuffle`]).
    #[serde(default)]
    pub shuffle: Option<u64>,
    /// Record this trainer's position in its data in this folder after every step (see
    /// [`position`](super::position)).
    #[serde(default)]
    pub positions: Option<PathBuf>,
    /// A restart of a trainer that failed: go on from the position recorded in `positions`.
    #[serde(default)]
    pub rejoin: bool,
    /// The job's secret, proved to every server before anything else (see [`crate::security::auth`]).
    #[serde(skip)]
    pub secret: Option<crate::security::auth::Secret>,
    /// TLS to the servers (`--tls-ca`); `None`: plain TCP.
    #[serde(skip)]
    pub tls: Option<crate::security::tls::ClientTls>,
}

fn one() -> usize {
    1
}

fn default_sync_warmup() -> u64 {
    crate::train::job_config::DEFAULT_SYNC_WARMUP
}

fn default_geo_k_steps() -> u64 {
    crate::train::job_config::DEFAULT_GEO_K_STEPS
}

fn default_sync_dense_ramp() -> u64 {
    crate::train::job_config::DEFAULT_SYNC_DENSE_RAMP
}

fn default_scale_stale_steps() -> bool {
    crate::train::job_config::DEFAULT_SCALE_STALE_STEPS
}

/// Most ports one server listens on (`--ports_num` + `--ports_num_for_sparse`).
pub const MAX_PORTS: usize = 256;

/// The ports per server `--ports_num` and `--ports_num_for_sparse` make, checked: at least
/// one general port, at most [`MAX_PORTS`] in all (a sum near `usize::MAX` wrapped to 0
/// connections, and the trainer panicked).
pub fn ports_per_server(ports_num: usize, sparse: usize) -> anyhow::Result<usize> {
    anyhow::ensure!(ports_num >= 1, "--ports_num must be at least 1");
    match ports_num.checked_add(sparse) {
        Some(n) if n <= MAX_PORTS => Ok(n),
        _ => anyhow::bail!(
            "--ports_num {ports_num} + --ports_num_for_sparse {sparse}: at most {MAX_PORTS} ports per server"
        ),
    }
}

impl TrainConfig {
    /// `sync_dense`: the most samples a step after the warm-up holds, a full batch cut in
    /// `sync_dense_parts`.
    pub fn sync_dense_step(&self) -> usize {
        self.batch_size.div_ceil(self.sync_dense_parts.max(1))
    }

    /// How this trainer's reader shuffles `pass` (`None`: in order): the lines it may hold
    /// within a third of the memory the process may still take when the pass starts (the rest
    /// is for the batches, the model's rows as the pass adds them, and other trainers on the
    /// machine).
    pub fn shuffle_for(&self, pass: u32) -> Option<crate::data::read::shuffle::ShuffleConfig> {
        let window = self.shuffle?;
        let available = crate::model::available_memory().unwrap_or(u64::MAX);
        Some(crate::data::read::shuffle::ShuffleConfig {
            window,
            seed: crate::data::read::shuffle::pass_seed(self.model.seed, pass, self.trainer_id),
            max_bytes: available / 3,
        })
    }

    /// The order this trainer reads its lines in, as its position record states it: `None` for
    /// the files' order, else the shuffle's seed and window.
    pub fn order(&self) -> Option<String> {
        let window = crate::data::read::shuffle::window_text(self.shuffle?);
        Some(format!("shuffled by seed {} within {window}", self.model.seed))
    }

    /// Checks the configuration; messages name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.batch_size > 0, "--batch-size must be at least 1");
        // Servers refuse a push claiming more samples than this.
        anyhow::ensure!(
            self.batch_size as u64 <= crate::protocol::MAX_SAMPLES,
            "--batch-size {} is over the most a push may hold, {}",
            self.batch_size,
            crate::protocol::MAX_SAMPLES
        );
        anyhow::ensure!(self.passes > 0, "--passes must be at least 1");
        anyhow::ensure!(self.delta_every != Some(0), "--delta-every must be at least 1");
        anyhow::ensure!(
            self.delta_every.is_none() || self.output.is_some(),
            "--delta-every saves for serving into the output folder: give --output"
        );
        if let (Some(out), true) = (&self.output, self.delta_every.is_some() || self.online.is_some()) {
            // The done-file lists a save per line, its fields split by tabs: a path holding
            // either broke the file at the second save, and could add lines a serving system
            // would follow.
            anyhow::ensure!(
                !out.to_string_lossy().contains(['\t', '\n', '\r']),
                "--output {out:?} holds a tab or a line break, which the done-file of saves for serving cannot hold"
            );
        }
        anyhow::ensure!(self.threads > 0, "--threads must be at least 1");
        anyhow::ensure!(self.trainers > 0, "--trainers must be at least 1");
        ports_per_server(self.ports_num, self.ports_num_for_sparse)?;
        let max = crate::base::layout::MAX_PEERS;
        anyhow::ensure!(self.trainers <= max, "--trainers is {}, more than {max}", self.trainers);
        anyhow::ensure!(self.servers.len() <= max, "{} servers, more than {max}", self.servers.len());
        anyhow::ensure!(
            self.trainer_id < self.trainers,
            "--trainer-id {} must be below --trainers {}",
            self.trainer_id,
            self.trainers
        );
        anyhow::ensure!(!self.train_files.is_empty(), "no training files (--train)");
        if let Some(out) = self.output.as_ref().and_then(|o| std::fs::canonicalize(o).ok()) {
            // The job writes its curves, passes and `latest` there: a later run listing the same
            // folder for data read them as data (a folder below `--output` is fine).
            let inside = self
                .train_files
                .iter()
                .chain(&self.test_files)
                .find(|f| std::fs::canonicalize(f).is_ok_and(|f| f.parent() == Some(out.as_path())));
            if let Some(f) = inside {
                anyhow::bail!(
                    "--output {} is the folder of the data file {}: the job's own files there would be read as data next time; save elsewhere",
                    out.display(),
                    f.display()
                );
            }
        }
        if let (Some(init), Some(out)) = (&self.init_model, &self.output) {
            // A warm start is a new job: its passes would overwrite the model it starts from.
            let (o, i) = (std::fs::canonicalize(out).ok(), std::fs::canonicalize(init).ok());
            let inside = o.is_some() && (o == i || o.as_deref() == i.as_deref().and_then(std::path::Path::parent));
            anyhow::ensure!(
                !inside,
                "--init-model {} is in --output {}: a warm start is a new job whose passes would overwrite it; save elsewhere",
                init.display(),
                out.display()
            );
        }
        anyhow::ensure!(
            !self.rejoin || self.positions.is_some(),
            "--rejoin goes on from a recorded position: give --position-dir"
        );
        anyhow::ensure!(
            self.delay == 0 || self.mode == Mode::Local,
            "--delay (delayed updates) is a local-mode measurement; {:?} mode has real staleness",
            self.mode
        );
        anyhow::ensure!(
            self.mode != Mode::Geo || !self.rejoin,
            "--mode geo: a trainer's change not sent yet lives in its memory, so a restarted GEO trainer cannot take up \
             where it was; trainer restarts (--rejoin, --max-restarts) are for sync and async jobs"
        );
        anyhow::ensure!(self.geo_k_steps > 0, "--geo-k-steps must be at least 1");
        // An exchange says how many samples its change covers: within what a push may claim.
        anyhow::ensure!(
            self.mode != Mode::Geo
                || self.geo_k_steps.saturating_mul(self.batch_size as u64) <= crate::protocol::MAX_SAMPLES,
            "--geo-k-steps {} x --batch-size {} samples per exchange: at most {} (fewer steps between exchanges)",
            self.geo_k_steps,
            self.batch_size,
            crate::protocol::MAX_SAMPLES
        );
        match self.mode {
            Mode::Local => {
                anyhow::ensure!(self.trainers == 1, "local mode runs one trainer; use --threads for parallelism")
            }
            _ => anyhow::ensure!(!self.servers.is_empty(), "{:?} mode needs --servers", self.mode),
        }
        self.dense_optimizer.validate_named("dense").map_err(anyhow::Error::msg)?;
        self.sparse_optimizer.validate_named("sparse").map_err(anyhow::Error::msg)?;
        Ok(())
    }
}
