//! The flags of a job's processes: `oar pserver` ([`PserverArgs`]), `oar train` ([`TrainArgs`],
//! with its server-role settings), `oar launch` ([`LaunchArgs`]), the ports both sides share
//! ([`PortArgs`]), and the job settings `train` and `launch` share ([`JobArgs`]), resolved over
//! the `--config` job file.

use std::path::PathBuf;

use clap::Args;

use super::limits::LimitArgs;
use super::tls_args::TlsArgs;
use crate::model::Registry;
use crate::protocol::Mode;
use crate::table::OptimizerKind;
use crate::train::job_config::JobConfig;

#[derive(Args, Clone)]
pub(super) struct PserverArgs {
    /// Address to listen on (see also --nics) [default: PADDLE_CURRENT_IP, else 0.0.0.0].
    #[arg(long, env = "OAR_HOST")]
    pub(super) host: Option<String>,
    /// Listen on the IPv4 address of this network interface (e.g. eth0, lo).
    #[arg(long, env = "OAR_NICS")]
    pub(super) nics: Option<String>,
    #[command(flatten)]
    pub(super) ports: PortArgs,
    /// Serve Prometheus metrics at http://ADDR/metrics (HOST:PORT; port 0: any free port,
    /// printed as `OAR_METRICS addr`).
    #[arg(long, env = "OAR_METRICS_ADDR")]
    pub(super) metrics_addr: Option<String>,
    /// This server's index among all servers (found from the Paddle env, or learned from the
    /// first trainer's handshake when not given).
    #[arg(long, env = "OAR_SERVER_INDEX")]
    pub(super) index: Option<usize>,
    /// Number of servers in the job.
    #[arg(long, env = "OAR_NUM_SERVERS")]
    pub(super) num_servers: Option<usize>,
    /// Number of trainers: the sync barrier's size [default: 1].
    #[arg(long, alias = "num_gradient_servers", visible_alias = "num-gradient-servers", env = "OAR_TRAINERS")]
    pub(super) trainers: Option<usize>,
    /// sync or async.
    #[arg(long, env = "OAR_MODE", value_enum, default_value = "sync")]
    pub(super) mode: Mode,
    /// Job id trainers must present.
    #[arg(long, env = "OAR_JOB", default_value = "oar")]
    pub(super) job: String,
    /// Seconds a sync step or barrier waits for missing trainers.
    #[arg(long, env = "OAR_TIMEOUT", default_value_t = 300)]
    pub(super) timeout: u64,
    /// Async: discard pushes more than this x trainers updates stale
    /// (PaddlePaddle's async_lagged_grad_discard_ratio).
    #[arg(long, alias = "async_lagged_grad_discard_ratio", env = "OAR_LAG_RATIO", default_value_t = 2.5)]
    pub(super) lag_ratio: f64,
    /// Load this server's shard from a saved model before serving.
    #[arg(long, env = "OAR_RESUME")]
    pub(super) resume: Option<PathBuf>,
    /// Load this server's share of a saved model to start a new job from (the trainers' warm
    /// start, --init-model); loads as --resume does.
    #[arg(long, alias = "init_model_path", env = "OAR_INIT_MODEL", conflicts_with = "resume")]
    pub(super) init_model: Option<PathBuf>,
    /// Keep serving after every trainer has closed.
    #[arg(long, env = "OAR_KEEP_SERVING")]
    pub(super) keep_serving: bool,
    /// When every trainer has closed, save the model into this folder (every server its
    /// shard, plus the manifest); shared by all servers.
    #[arg(long, alias = "save_dir", env = "OAR_SAVE_DIR")]
    pub(super) save_dir: Option<PathBuf>,
    /// Trainers' saves after each pass may only write inside this folder (the model's
    /// --output) [default: --save_dir's parent, else the working directory].
    #[arg(long, env = "OAR_SAVE_ROOT")]
    pub(super) save_root: Option<PathBuf>,
    /// Largest accepted frame, in MiB.
    #[arg(long, env = "OAR_MAX_FRAME_MB", default_value_t = 256)]
    pub(super) max_frame_mb: usize,
    /// Checkpoint this server's shard in the background into this folder (under `server-K/`;
    /// --resume with it restarts from the newest readable checkpoint).
    #[arg(long, env = "OAR_CHECKPOINT_DIR")]
    pub(super) checkpoint_dir: Option<PathBuf>,
    /// Seconds between background checkpoints.
    #[arg(long, env = "OAR_CHECKPOINT_EVERY", default_value_t = 30.0)]
    pub(super) checkpoint_every: f64,
    /// Background checkpoints kept per server.
    #[arg(long, env = "OAR_CHECKPOINT_KEEP", default_value_t = 3)]
    pub(super) checkpoint_keep: usize,
    /// This process's incarnation of its place (a supervisor restarting the server gives one
    /// more each time): clients that met a newer one refuse this server, and it stops.
    #[arg(long, env = "OAR_EPOCH", default_value_t = 0)]
    pub(super) epoch: u64,
    /// Trainers that already closed (a restarted server is told them, comma-separated).
    #[arg(long, env = "OAR_TRAINERS_CLOSED", value_delimiter = ',')]
    pub(super) trainers_closed: Vec<u64>,
    /// Seconds a trainer that disconnected without closing has to come back (restarted by a
    /// supervisor) before the server fails; 0 is no wait [default: fail at once].
    #[arg(long, env = "OAR_TRAINER_REJOIN")]
    pub(super) trainer_rejoin: Option<f64>,
    /// This process may be a restart of a failed server, started again with the same command
    /// line (by an engine's restart policy or by hand): if --checkpoint-dir holds this job's
    /// state, go on from its newest checkpoint under the next epoch, knowing which trainers have
    /// closed; and wait --trainer-rejoin (default 60 s) for lost trainers.
    #[arg(long, env = "OAR_RECOVERABLE")]
    pub(super) recoverable: bool,
    /// With --recoverable: a restart that finds this job's checkpoints but can read none of
    /// them starts with empty tables instead of refusing to start (the model trained so far on
    /// this server is lost).
    #[arg(long, env = "OAR_START_EMPTY", requires = "recoverable")]
    pub(super) start_empty: bool,
    #[command(flatten)]
    pub(super) limits: LimitArgs,
    /// The job's secret (a file of 16 to 4096 bytes): every client must prove it holds it
    /// before anything else, and this server proves it to them. Without one, anyone who can
    /// reach the port can change the model.
    #[arg(long, env = "OAR_SECRET_FILE")]
    pub(super) secret_file: Option<PathBuf>,
    #[command(flatten)]
    pub(super) tls: TlsArgs,
}

/// A server's ports, as `oar pserver` listens on them and `oar train` reaches them.
#[derive(Args, Clone)]
pub(super) struct PortArgs {
    /// First port of every server (for bare hosts in --servers) [default: 7164, or PADDLE_PORT /
    /// PADDLE_PSERVER_PORT / PADDLE_INIT_PORT]; 0 makes a server pick a free port (printed).
    #[arg(long, env = "OAR_PORT")]
    pub(super) port: Option<u16>,
    /// Consecutive general ports per server; requests are spread over them [default: 1].
    #[arg(long = "ports-num", alias = "ports_num", env = "OAR_PORTS_NUM")]
    pub(super) ports_num: Option<usize>,
    /// Further ports per server, after those, that carry only sparse traffic [default: 0].
    #[arg(long = "ports-num-for-sparse", alias = "ports_num_for_sparse", env = "OAR_PORTS_NUM_FOR_SPARSE")]
    pub(super) ports_num_for_sparse: Option<usize>,
}

/// Job settings shared by `train` and `launch`: flag > env > --config file > default.
#[derive(Args, Clone)]
pub(super) struct JobArgs {
    /// TOML job file ([model], [dense_optimizer], [sparse_optimizer], [train]).
    #[arg(long, env = "OAR_CONFIG")]
    pub(super) config: Option<PathBuf>,
    /// PaddleRec's config.yaml as the job, for its rank models dnn, wide_deep and deepfm: the
    /// model hyper_parameters describe, its optimizer, PaddleRec's slot lines as the data; its
    /// runner's data folders, model_save_path, epochs, batch size, print_interval, thread_num
    /// and (oar launch) sync_mode where no flag gives them. Keys oar does not use are logged.
    #[arg(long, env = "OAR_PADDLEREC_CONFIG", conflicts_with = "config")]
    pub(super) paddlerec_config: Option<PathBuf>,
    /// The PaddleRec model of --paddlerec-config: dnn, wide_deep or deepfm [default: the
    /// config's folder name, as in PaddleRec's models/rank/NAME/config.yaml].
    #[arg(long, env = "OAR_PADDLEREC_MODEL", requires = "paddlerec_config")]
    pub(super) paddlerec_model: Option<String>,
    /// Samples per step per trainer.
    #[arg(long, env = "OAR_BATCH_SIZE")]
    pub(super) batch_size: Option<usize>,
    /// Passes over the data.
    #[arg(long, env = "OAR_PASSES")]
    pub(super) passes: Option<u32>,
    /// Compute threads per trainer (PaddlePaddle's trainer_count).
    #[arg(long, visible_alias = "trainer-count", alias = "trainer_count", env = "OAR_THREADS")]
    pub(super) threads: Option<usize>,
    /// Embedding width.
    #[arg(long, env = "OAR_EMBEDDING_DIM")]
    pub(super) embedding_dim: Option<usize>,
    /// Hidden layer widths, comma-separated.
    #[arg(long, env = "OAR_HIDDEN", value_delimiter = ',')]
    pub(super) hidden: Option<Vec<usize>>,
    /// Dense optimizer (a rule other than the job file's comes with its own settings, the
    /// file's learning rate and L2 kept).
    #[arg(long, env = "OAR_DENSE_OPTIMIZER", value_enum)]
    pub(super) dense_optimizer: Option<OptimizerKind>,
    /// Dense learning rate.
    #[arg(long, env = "OAR_DENSE_LR")]
    pub(super) dense_lr: Option<f32>,
    /// Dense L2 regularization.
    #[arg(long, env = "OAR_DENSE_L2")]
    pub(super) dense_l2: Option<f32>,
    /// Embedding optimizer (a rule other than the job file's comes with its own settings, the
    /// file's learning rate and L2 kept).
    #[arg(long, env = "OAR_SPARSE_OPTIMIZER", value_enum)]
    pub(super) sparse_optimizer: Option<OptimizerKind>,
    /// Embedding learning rate.
    #[arg(long, env = "OAR_SPARSE_LR")]
    pub(super) sparse_lr: Option<f32>,
    /// Embedding L2 regularization.
    #[arg(long, env = "OAR_SPARSE_L2")]
    pub(super) sparse_l2: Option<f32>,
    /// Seed of the initializers.
    #[arg(long, env = "OAR_SEED")]
    pub(super) seed: Option<u64>,
    /// Log metrics every this many steps.
    #[arg(long, env = "OAR_LOG_EVERY")]
    pub(super) log_every: Option<u64>,
    /// Steps between two points of the training curves (0: only pass points).
    #[arg(long, env = "OAR_METRICS_EVERY")]
    pub(super) metrics_every: Option<u64>,
    /// Also write the training curves as TensorBoard event files under DIR (trainer-K/).
    #[arg(long, env = "OAR_TENSORBOARD")]
    pub(super) tensorboard: Option<PathBuf>,
    /// Skip and count bad data lines instead of failing.
    #[arg(long, env = "OAR_SKIP_BAD_LINES")]
    pub(super) skip_bad_lines: bool,
    /// Seconds to wait for servers, sync steps and barriers.
    #[arg(long, env = "OAR_TIMEOUT")]
    pub(super) timeout: Option<u64>,
    /// Async: discard pushes more than this x trainers updates stale.
    #[arg(long, alias = "async_lagged_grad_discard_ratio", env = "OAR_LAG_RATIO")]
    pub(super) lag_ratio: Option<f64>,
    /// Shell command each data file is piped through (the file on its stdin), e.g. zcat.
    #[arg(long, alias = "pipe_command", env = "OAR_PIPE_COMMAND")]
    pub(super) pipe_command: Option<String>,
    /// Seconds the pipe command may print nothing before it is killed and the job fails
    /// naming it [default: 300].
    #[arg(long, env = "OAR_PIPE_TIMEOUT")]
    pub(super) pipe_timeout: Option<u64>,
    /// Local mode: apply each update this many steps after it was computed (measures the
    /// effect of async staleness without a network, deterministically).
    #[arg(long, env = "OAR_DELAY")]
    pub(super) delay: Option<usize>,
    /// Async mode with one thread: pull the next batch's parameters while this one computes
    /// (faster, one step staler) [default: false].
    #[arg(long, env = "OAR_PULL_AHEAD")]
    pub(super) pull_ahead: Option<bool>,
    /// Give each trainer's lines of a pass in a random order, a new one every pass (Paddle's
    /// local_shuffle); test files are read in order [default: false].
    #[arg(long, alias = "local_shuffle", env = "OAR_SHUFFLE", num_args = 0..=1, default_missing_value = "true")]
    pub(super) shuffle: Option<bool>,
    /// Lines a trainer holds to shuffle [default: all of its share of the pass].
    #[arg(long, env = "OAR_SHUFFLE_WINDOW")]
    pub(super) shuffle_window: Option<u64>,
    /// Async mode: make the first N updates synchronous steps (each trainer's batch split in
    /// as many parts as trainers, so an update covers the batch size), then go async.
    #[arg(long, env = "OAR_SYNC_WARMUP")]
    pub(super) sync_warmup: Option<u64>,
    /// Async mode: a push computed from parameters k > 1 updates old moves the dense weights
    /// with the learning rate / k.
    #[arg(long, env = "OAR_SCALE_STALE_STEPS")]
    pub(super) scale_stale_steps: Option<bool>,
    /// Async mode: keep the dense parameters synchronous among trainers (one merged update
    /// per step of all of them) while rows stay async [default: true from 8 trainers].
    #[arg(long, env = "OAR_SYNC_DENSE")]
    pub(super) sync_dense: Option<bool>,
    /// sync_dense: the samples one merged dense step covers at most; beyond it each trainer
    /// cuts its batches into smaller steps [default: 8 x the batch size].
    #[arg(long, env = "OAR_SYNC_DENSE_BATCH")]
    pub(super) sync_dense_batch: Option<usize>,
    /// sync_dense: merged steps after the warm-up that cover half of sync_dense_batch, so a
    /// short run gives the dense part enough updates; 0: none [default: 25].
    #[arg(long, env = "OAR_SYNC_DENSE_RAMP")]
    pub(super) sync_dense_ramp: Option<u64>,
    /// GEO mode: local steps between two exchanges with the servers [default: 100].
    #[arg(
        long,
        visible_alias = "k-steps",
        alias = "k_steps",
        alias = "geo_step",
        alias = "geo-step",
        env = "OAR_GEO_K_STEPS"
    )]
    pub(super) geo_k_steps: Option<u64>,
    /// Scale each step's gradients so the L2 norm of the batch's mean gradient is at most this
    /// [default: no clip].
    #[arg(long, env = "OAR_CLIP_GRAD_NORM")]
    pub(super) clip_grad_norm: Option<f32>,
    /// The matrix products' operands in training: f32, or bf16 (bf16 operands, f32 sums; needs
    /// a CPU with avx512_bf16, f32 with a warning elsewhere) [default: the job file's, f32].
    #[arg(long, env = "OAR_PRECISION", value_parser = crate::nn::Precision::parse)]
    pub(super) precision: Option<crate::nn::Precision>,
    /// Online training: a folder of day folders (YYYYMMDD/part-*, e.g. from `oar gen stream`)
    /// trained day after day by the same processes, instead of --train.
    #[arg(long, env = "OAR_ONLINE")]
    pub(super) online: Option<PathBuf>,
    /// Online training: the days, FROM..TO (YYYYMMDD, both included).
    #[arg(long, env = "OAR_DAYS")]
    pub(super) days: Option<String>,
    /// Online training: passes per day, each over one split of the day's files; each day ends
    /// with a shrink of the tables and a base save, and its model is evaluated on the next
    /// day's first split before training goes on [default: 1].
    #[arg(long, env = "OAR_PASSES_PER_DAY")]
    pub(super) passes_per_day: Option<u32>,
    /// Save the tables for serving every N passes (a delta; a base first) into
    /// OUTPUT/serving/, each announced in OUTPUT/donefile.txt.
    #[arg(long, alias = "save_delta_frequency", env = "OAR_DELTA_EVERY")]
    pub(super) delta_every: Option<u32>,
    /// Train in this process, without servers, whatever else the job says.
    #[arg(long, alias = "is_local", env = "OAR_IS_LOCAL", num_args = 0..=1, default_missing_value = "true")]
    pub(super) is_local: Option<bool>,
}

impl JobArgs {
    /// The job: its file, `--paddlerec-config`'s or the defaults, with the flags applied,
    /// checked; and with `--paddlerec-config` the config as read (its runner's settings, for the
    /// command to apply where no flag gave them), the file read once.
    pub(super) fn resolve(
        &self,
        registry: &Registry,
    ) -> anyhow::Result<(JobConfig, Option<crate::train::paddlerec::PaddleRecJob>)> {
        let rec = match &self.paddlerec_config {
            Some(path) => Some(crate::train::paddlerec::from_file(path, self.paddlerec_model.as_deref())?),
            None => None,
        };
        let job = match (&self.config, &rec) {
            (Some(path), _) => JobConfig::from_file(path)?,
            (None, Some(rec)) => {
                let path = self.paddlerec_config.as_deref().unwrap_or(std::path::Path::new(""));
                for (key, why) in &rec.unused {
                    tracing::info!("{}: {key} not used: {why}", path.display());
                }
                rec.job.clone()
            }
            (None, None) => JobConfig::default(),
        };
        Ok((self.with_flags(job, registry)?, rec))
    }

    /// `job` with the flags applied, checked.
    fn with_flags(&self, mut job: JobConfig, registry: &Registry) -> anyhow::Result<JobConfig> {
        let m = &mut job.model;
        if (self.embedding_dim.is_some() || self.hidden.is_some()) && !m.is_shorthand() {
            anyhow::bail!(
                "--embedding-dim and --hidden (OAR_EMBEDDING_DIM, OAR_HIDDEN) shape the shorthand model; this job's \
                 model is a layer graph: set its widths in the job file's layers"
            );
        }
        if self.embedding_dim.is_some() {
            m.embedding_dim = self.embedding_dim;
        }
        if self.hidden.is_some() {
            m.hidden = self.hidden.clone();
        }
        set(&mut m.seed, self.seed);
        for (opt, kind, lr, l2) in [
            (&mut job.dense_optimizer, self.dense_optimizer, self.dense_lr, self.dense_l2),
            (&mut job.sparse_optimizer, self.sparse_optimizer, self.sparse_lr, self.sparse_l2),
        ] {
            if let Some(kind) = kind {
                *opt = opt.with_kind(kind);
            }
            set(&mut opt.lr, lr);
            set(&mut opt.l2, l2);
        }
        let t = &mut job.train;
        set(&mut t.batch_size, self.batch_size);
        set(&mut t.passes, self.passes);
        set(&mut t.threads, self.threads);
        set(&mut t.log_every, self.log_every);
        set(&mut t.metrics_every, self.metrics_every);
        if let Some(dir) = &self.tensorboard {
            t.tensorboard = Some(dir.clone());
        }
        set(&mut t.timeout_secs, self.timeout);
        set(&mut t.lag_ratio, self.lag_ratio);
        set(&mut t.delay, self.delay);
        set(&mut t.pull_ahead, self.pull_ahead);
        set(&mut t.sync_warmup, self.sync_warmup);
        set(&mut t.shuffle, self.shuffle);
        if self.shuffle == Some(false) {
            // Turned off over a job file that shuffles: its window goes with it.
            t.shuffle_window = None;
        }
        if self.shuffle_window.is_some() {
            t.shuffle_window = self.shuffle_window;
        }
        set(&mut t.scale_stale_steps, self.scale_stale_steps);
        if self.sync_dense.is_some() {
            t.sync_dense = self.sync_dense;
        }
        if self.sync_dense_batch.is_some() {
            t.sync_dense_batch = self.sync_dense_batch;
        }
        set(&mut t.sync_dense_ramp, self.sync_dense_ramp);
        set(&mut t.geo_k_steps, self.geo_k_steps);
        if self.clip_grad_norm.is_some() {
            t.clip_grad_norm = self.clip_grad_norm;
        }
        set(&mut t.precision, self.precision);
        if self.delta_every.is_some() {
            t.delta_every = self.delta_every;
        }
        if self.online.is_some() {
            t.online = self.online.clone();
        }
        if self.days.is_some() {
            t.days = self.days.clone();
        }
        set(&mut t.passes_per_day, self.passes_per_day);
        t.skip_bad_lines |= self.skip_bad_lines;
        set(&mut t.is_local, self.is_local);
        if let Some(command) = &self.pipe_command {
            job.data.pipe_command = Some(command.clone());
        }
        if self.pipe_timeout.is_some() {
            job.data.pipe_timeout = self.pipe_timeout;
        }
        job.validate_with(registry)?;
        Ok(job)
    }
}

fn set<T>(slot: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *slot = v;
    }
}

#[derive(Args)]
pub(super) struct TrainArgs {
    #[command(flatten)]
    pub(super) job: JobArgs,
    /// The job's secret (a file of 16 to 4096 bytes), proved to every server and by every
    /// server before anything else; the same file for every process of the job.
    #[arg(long, env = "OAR_SECRET_FILE")]
    pub(super) secret_file: Option<PathBuf>,
    /// TLS: --tls-ca as a trainer, --tls-cert and --tls-key in the server role.
    #[command(flatten)]
    pub(super) tls: TlsArgs,
    /// local, sync or async [default: local without servers, sync with them].
    #[arg(long, env = "OAR_MODE", value_enum)]
    pub(super) mode: Option<Mode>,
    /// Servers in server-index order, comma-separated: host:port, or bare hosts on --port; a
    /// single number S means --num-servers S.
    #[arg(long, alias = "pservers", env = "OAR_SERVERS", value_delimiter = ',')]
    pub(super) servers: Vec<String>,
    #[command(flatten)]
    pub(super) ports: PortArgs,
    /// This trainer's id [default: 0].
    #[arg(long, alias = "trainer_id", env = "OAR_TRAINER_ID")]
    pub(super) trainer_id: Option<usize>,
    /// Number of trainers [default: 1].
    #[arg(long, alias = "num_gradient_servers", visible_alias = "num-gradient-servers", env = "OAR_TRAINERS")]
    pub(super) trainers: Option<usize>,
    /// Under an engine (mpirun, srun): ranks 0..N-1 become servers, the others trainers; they
    /// meet at --rendezvous (`--servers N` says the same).
    #[arg(long, env = "OAR_NUM_SERVERS")]
    pub(super) num_servers: Option<usize>,
    /// Under an engine: rank 0's host and a free port there, where every rank registers
    /// [default under Slurm: the step's first node, port 15000 + SLURM_JOB_ID % 10000; for an MPI
    /// job on one host: a loopback port derived from the job].
    #[arg(long, env = "OAR_RENDEZVOUS")]
    pub(super) rendezvous: Option<String>,
    /// Refused unless false: this is a CPU build.
    #[arg(long, alias = "use_gpu", env = "OAR_USE_GPU", num_args = 0..=1, default_missing_value = "true")]
    pub(super) use_gpu: Option<bool>,
    /// Training data: a file or a folder of part files.
    #[arg(long, env = "OAR_TRAIN")]
    pub(super) train: Option<PathBuf>,
    /// Test data evaluated after each pass (by trainer 0).
    #[arg(long, env = "OAR_TEST")]
    pub(super) test: Option<PathBuf>,
    /// Save the model here after each pass.
    #[arg(long, env = "OAR_OUTPUT")]
    pub(super) output: Option<PathBuf>,
    /// Serve this trainer's Prometheus metrics at http://ADDR/metrics (HOST:PORT; port 0: any
    /// free port, printed as `OAR_METRICS addr`).
    #[arg(long, env = "OAR_METRICS_ADDR")]
    pub(super) metrics_addr: Option<String>,
    /// Append training curves (loss and AUC every --metrics-every steps and per pass) to this
    /// CSV file [default: OUTPUT/metrics.csv with --output]; `oar plot` draws them.
    #[arg(long, env = "OAR_METRICS_CSV")]
    pub(super) metrics_csv: Option<PathBuf>,
    /// Continue from this saved model.
    #[arg(long, env = "OAR_RESUME")]
    pub(super) resume: Option<PathBuf>,
    /// Start from this saved model's parameters and optimizer state, numbering passes afresh
    /// from 1 (a warm start, PaddleRec's `init_model_path`: e.g. online training after an
    /// offline model); --resume goes on from a save's next pass instead.
    #[arg(long, alias = "init_model_path", env = "OAR_INIT_MODEL", conflicts_with = "resume")]
    pub(super) init_model: Option<PathBuf>,
    /// Job id (must match the servers').
    #[arg(long = "job", env = "OAR_JOB", default_value = "oar")]
    pub(super) job_id: String,
    /// Seconds to wait for a lost peer to come back before failing: a trainer for a lost
    /// server (restarted by a supervisor, or behind a link that comes back; it reconnects and
    /// repeats the unanswered request), or for a sync step or barrier that a server gave up on
    /// after its --timeout (it asks again); a server role for a trainer that disconnected
    /// without closing (as `oar pserver --trainer-rejoin`). Give every process of the job the
    /// same; 0 waits for nothing (the refusal or loss as it came).
    #[arg(long, env = "OAR_RECOVER_TIMEOUT")]
    pub(super) recover_timeout: Option<f64>,
    /// Record this trainer's position in its data in this folder after every step
    /// (`trainer-K.position`), so that a restart can go on from it.
    #[arg(long, env = "OAR_POSITION_DIR")]
    pub(super) position_dir: Option<PathBuf>,
    /// This trainer is a restart of one that failed: go on from the position recorded in
    /// --position-dir (servers started with --trainer-rejoin, or under oar train with
    /// --recover-timeout, wait for it).
    #[arg(long, env = "OAR_REJOIN", requires = "position_dir")]
    pub(super) rejoin: bool,
    /// This process may be a restart of a failed one, started again with the same command line
    /// (by an engine's restart policy or by hand). Servers checkpoint into OUTPUT/checkpoints
    /// and go on from there under the next epoch; trainers record their position there and
    /// rejoin from it; each side waits up to 60 s (--recover-timeout) for a lost other. State
    /// is kept per --job: another job id starts afresh.
    #[arg(long, env = "OAR_RECOVERABLE")]
    pub(super) recoverable: bool,
    /// Settings used when the environment says this process is a server
    /// (TRAINING_ROLE / PADDLE_TRAINING_ROLE = PSERVER).
    #[command(flatten)]
    pub(super) server: ServerRoleArgs,
}

/// Server settings of `oar train` started as a PSERVER by PaddlePaddle's environment.
#[derive(Args)]
pub(super) struct ServerRoleArgs {
    /// Server role: keep serving after every trainer has closed.
    #[arg(long, env = "OAR_KEEP_SERVING")]
    pub(super) keep_serving: bool,
    /// Server role: listen on this interface's address.
    #[arg(long, env = "OAR_NICS")]
    pub(super) nics: Option<String>,
    /// Server role: listen on this address [default: PADDLE_CURRENT_IP, else all].
    #[arg(long, env = "OAR_HOST")]
    pub(super) host: Option<String>,
    /// Server role: checkpoint the shard in the background every this many seconds into
    /// OUTPUT/checkpoints [default: 30 with --recoverable, else none].
    #[arg(long, env = "OAR_CHECKPOINT_EVERY")]
    pub(super) checkpoint_every: Option<f64>,
    /// Server role, with --recoverable: a restart that can read none of this job's checkpoints
    /// starts with empty tables instead of refusing to start.
    #[arg(long, env = "OAR_START_EMPTY")]
    pub(super) start_empty: bool,
    #[command(flatten)]
    pub(super) limits: LimitArgs,
}

#[derive(Args)]
pub(super) struct LaunchArgs {
    #[command(flatten)]
    pub(super) job: JobArgs,
    /// The job's secret for its processes [default: a new one in LOGS/secret].
    #[arg(long, env = "OAR_SECRET_FILE")]
    pub(super) secret_file: Option<PathBuf>,
    /// TLS between the processes: a certificate authority and a server certificate are made
    /// into LOGS/tls for this run and handed to every process.
    #[arg(long)]
    pub(super) tls: bool,
    /// Number of parameter servers (fleetrun's --server_num).
    #[arg(long, alias = "server_num", default_value_t = 2, value_parser = server_count)]
    pub(super) servers: usize,
    /// Metrics ports for Prometheus to scrape at known places: server i's at this port + i,
    /// trainer w's at this port + servers + w [default: any free port each, listed in the
    /// summary and summary.json].
    #[arg(long)]
    pub(super) metrics_port_base: Option<u16>,
    /// Number of trainers (fleetrun's --worker_num).
    #[arg(long, alias = "worker_num", default_value_t = 2)]
    pub(super) workers: usize,
    /// sync or async [default: --paddlerec-config's sync_mode, else async].
    #[arg(long, env = "OAR_MODE", value_enum)]
    pub(super) mode: Option<Mode>,
    /// Training data: a file or a folder of part files (not with --online).
    #[arg(long)]
    pub(super) train: Option<PathBuf>,
    /// Test data evaluated after each pass.
    #[arg(long)]
    pub(super) test: Option<PathBuf>,
    /// Save the model here after each pass.
    #[arg(long)]
    pub(super) output: Option<PathBuf>,
    /// Continue from this saved model.
    #[arg(long)]
    pub(super) resume: Option<PathBuf>,
    /// Start from this saved model's parameters and optimizer state, numbering passes afresh
    /// (a warm start; see `oar train --init-model`).
    #[arg(long, alias = "init_model_path", conflicts_with = "resume")]
    pub(super) init_model: Option<PathBuf>,
    /// Servers checkpoint their shards in the background every this many seconds, into
    /// OUTPUT/checkpoints (needs --output) [default: 30 with --max-restarts, else none].
    #[arg(long)]
    pub(super) checkpoint_every: Option<f64>,
    /// Restart a server that dies or stops answering, from its newest checkpoint, while the
    /// trainers wait for it, and a trainer that dies, from its recorded position in its data,
    /// while the servers wait for it: at most this many restarts in all (0: the job fails at
    /// once). Needs --output (checkpoints and positions live there).
    #[arg(long, default_value_t = 0)]
    pub(super) max_restarts: usize,
    /// Folder for the log files.
    #[arg(long, default_value = "logs")]
    pub(super) logs: PathBuf,
    /// No progress bar.
    #[arg(long)]
    pub(super) no_progress: bool,
    /// Print the progress on stdout as `OAR_LAUNCH_PROGRESS <bytes read> <bytes in all>` lines,
    /// one per whole percent, for a program that shows it (oar's Python package draws a bar).
    #[arg(long)]
    pub(super) progress_lines: bool,
}

/// `oar launch --servers N`: a count. fleetrun's `--servers` is a list of endpoints instead,
/// which `oar launch` has no use for (it starts its servers itself): say where such a list goes.
fn server_count(s: &str) -> Result<usize, String> {
    s.trim().parse().map_err(|_| {
        if s.contains(':') || s.contains(',') {
            format!(
                "{s:?} is a list of server endpoints (fleetrun's --servers); oar launch starts its servers on this \
                 machine and takes how many: --servers N (or --server_num N). To train against servers already \
                 running there, start each trainer with `oar train --servers {s}`"
            )
        } else {
            format!("{s:?} is not a number of servers")
        }
    })
}
