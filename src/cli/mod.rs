//! The `oar` command line: parses and validates flags, builds configs, and calls the library's
//! role functions. Errors are printed once, on one line, with exit code 1 (2 for usage errors).
//!
//! It lives in the library so a program can run it with layer types of its own:
//! [`main_with`] takes the [`Registry`] every job file is checked and trained with, and
//! `oar launch` starts its servers and trainers from the running binary, so they know those
//! types too (`examples/custom_layer/`). `src/main.rs` is `main_with` with the built-ins.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::config::{resolve_files, JobConfig};
use crate::env::{ClusterEnv, Role};
use crate::model::Registry;
use crate::server::{Mode, ServerConfig};
use crate::table::OptimizerKind;
use crate::train::TrainConfig;

mod limits;
mod report;
mod roles;

use limits::LimitArgs;
use report::*;
use roles::*;

#[derive(Parser)]
#[command(name = "oar", version, about = "A parameter-server system for distributed training")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a parameter server.
    Pserver(PserverArgs),
    /// Run one trainer (local mode, or against running servers).
    Train(Box<TrainArgs>),
    /// Run a whole cluster on this machine: N servers and M trainers as child processes.
    Launch(LaunchArgs),
    /// Evaluate a saved model on data files: prints AUC and log-loss.
    Eval(EvalArgs),
    /// Measure throughput against baselines, side by side (see README for recorded figures).
    Bench(BenchArgs),
    /// Generate data sets.
    Gen {
        #[command(subcommand)]
        what: GenCommand,
    },
    /// Split a file by line into N balanced parts FILE-00000 .. (for sharding over trainers).
    Split(SplitArgs),
    /// Prepare public data sets for the examples.
    Data {
        #[command(subcommand)]
        what: DataCommand,
    },
    /// Run on a cluster: over ssh, or print Kubernetes manifests (mpirun and srun need no
    /// launcher: see `oar train --num-servers`).
    Cluster {
        #[command(subcommand)]
        engine: ClusterCommand,
    },
}

#[derive(Subcommand)]
enum ClusterCommand {
    /// Start servers and trainers on the hosts of a hosts file over ssh; logs under each host's
    /// workspace log/; every remote process is stopped on Ctrl-C or any failure.
    Ssh(SshArgs),
    /// Print Kubernetes manifests (headless Service, server StatefulSet, trainer Indexed Job; or
    /// a Kubeflow PaddleJob) that run `oar train` with the given arguments.
    K8s(K8sArgs),
}

#[derive(Args)]
struct SshArgs {
    /// Hosts file: one ssh destination (host or user@host) per line, # comments.
    #[arg(long)]
    hosts: PathBuf,
    /// The job's folder (data, job files); the same path on the hosts unless --remote-workspace.
    #[arg(long)]
    workspace: PathBuf,
    /// The workspace's path on the hosts [default: the --workspace path].
    #[arg(long)]
    remote_workspace: Option<String>,
    /// Copy the workspace (without log/) and this oar binary to every host first.
    #[arg(long)]
    dispatch: bool,
    /// Parameter servers per host.
    #[arg(long, default_value_t = 1)]
    servers_per_host: usize,
    /// Trainers per host.
    #[arg(long, default_value_t = 1)]
    trainers_per_host: usize,
    /// First server port on each host (more servers per host take the next ports).
    #[arg(long, default_value_t = crate::env::DEFAULT_PORT)]
    port: u16,
    /// ssh client configuration file (ssh -F): ports, users, keys.
    #[arg(long)]
    ssh_config: Option<PathBuf>,
    /// The oar binary on the hosts [default: the dispatched copy with --dispatch, else oar].
    #[arg(long)]
    oar_bin: Option<String>,
    /// Local copies of every process's log [default: WORKSPACE/log/launcher].
    #[arg(long)]
    logs: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Restart a server or trainer that fails, on its host with its command line, at most this
    /// many times in all: every process is then --recoverable (servers checkpoint into
    /// OUTPUT/checkpoints on their host, trainers record their position there; needs --output).
    #[arg(long, default_value_t = 0)]
    max_restarts: usize,
    /// Arguments of `oar train` for every server and trainer (after --).
    #[arg(last = true)]
    train_args: Vec<String>,
}

#[derive(Args)]
struct K8sArgs {
    /// Job name (a DNS-1035 label): objects are named after it.
    #[arg(long)]
    name: String,
    /// Number of parameter servers.
    #[arg(long)]
    servers: usize,
    /// Number of trainers.
    #[arg(long)]
    workers: usize,
    /// Container image with `oar` on its PATH.
    #[arg(long)]
    image: String,
    /// Servers' port.
    #[arg(long, default_value_t = crate::env::DEFAULT_PORT)]
    port: u16,
    /// A PersistentVolumeClaim (data and model) mounted in every pod, also the working folder.
    #[arg(long)]
    volume_claim: Option<String>,
    /// Where --volume-claim is mounted.
    #[arg(long, default_value = "/oar")]
    mount_path: String,
    /// CPU request and limit per pod (e.g. 2).
    #[arg(long)]
    cpus: Option<String>,
    /// Print a Kubeflow training-operator PaddleJob (Master = servers, Worker = trainers).
    #[arg(long)]
    paddlejob: bool,
    /// Let Kubernetes restart a failed trainer container (server containers are always
    /// restarted) at most this many times; every pod is then --recoverable and goes on from
    /// OUTPUT/checkpoints on the volume (needs --volume-claim).
    #[arg(long, default_value_t = 0)]
    max_restarts: usize,
    /// Arguments of `oar train` for every pod (after --).
    #[arg(last = true)]
    train_args: Vec<String>,
}

#[derive(Args)]
struct SplitArgs {
    /// Number of parts.
    #[arg(long)]
    parts: usize,
    /// The file.
    file: PathBuf,
}

#[derive(Subcommand)]
enum DataCommand {
    /// Download a public data set (uci_housing, ptb) into the cache, checking checksums.
    Get(GetArgs),
    /// Turn a raw data set into plain-format train/test files, as PaddlePaddle prepares it.
    Prepare(PrepareArgs),
}

#[derive(Args)]
struct GetArgs {
    /// The data set.
    name: String,
    /// Cache folder [default: $OAR_DATA_HOME, else ~/.cache/oar/data].
    #[arg(long)]
    cache: Option<PathBuf>,
    /// Fetch from this mirror (URL/<set>/<file>) instead of the canonical hosts.
    #[arg(long, env = "OAR_DATA_MIRROR")]
    mirror: Option<String>,
}

#[derive(Args)]
struct PrepareArgs {
    /// The data set.
    #[arg(value_enum)]
    name: PrepareName,
    /// The raw data: housing.data (uci-housing) or the folder holding ptb.train.txt[.gz] and
    /// ptb.valid.txt (imikolov).
    #[arg(long)]
    src: PathBuf,
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
    /// imikolov: keep words seen more than this many times.
    #[arg(long, default_value_t = 50)]
    min_count: u64,
    /// imikolov: words per sample (n-1 context words and the next word).
    #[arg(long, default_value_t = 5)]
    n: usize,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum PrepareName {
    /// UCI housing (Boston) for linear regression.
    UciHousing,
    /// Penn Treebank N-grams for the word model.
    Imikolov,
}

#[derive(Subcommand)]
enum GenCommand {
    /// Criteo-format lines from a planted logistic model.
    Criteo(GenArgs),
    /// Multi-hot lines in the slots format (one-hot, multi-valued and weighted slots) from a
    /// planted model with per-slot pooling; meta.json has the `[data]` section to read them.
    Slots(GenArgs),
}

#[derive(Args, Clone)]
struct PserverArgs {
    /// Address to listen on (see also --nics) [default: PADDLE_CURRENT_IP, else 0.0.0.0].
    #[arg(long, env = "OAR_HOST")]
    host: Option<String>,
    /// Listen on the IPv4 address of this network interface (e.g. eth0, lo).
    #[arg(long, env = "OAR_NICS")]
    nics: Option<String>,
    #[command(flatten)]
    ports: PortArgs,
    /// This server's index among all servers (found from the Paddle env, or learned from the
    /// first trainer's handshake when not given).
    #[arg(long, env = "OAR_SERVER_INDEX")]
    index: Option<usize>,
    /// Number of servers in the job.
    #[arg(long, env = "OAR_NUM_SERVERS")]
    num_servers: Option<usize>,
    /// Number of trainers: the sync barrier's size [default: 1].
    #[arg(long, alias = "num_gradient_servers", visible_alias = "num-gradient-servers", env = "OAR_TRAINERS")]
    trainers: Option<usize>,
    /// sync or async.
    #[arg(long, env = "OAR_MODE", value_enum, default_value = "sync")]
    mode: Mode,
    /// Job id trainers must present.
    #[arg(long, env = "OAR_JOB", default_value = "oar")]
    job: String,
    /// Seconds a sync step or barrier waits for missing trainers.
    #[arg(long, env = "OAR_TIMEOUT", default_value_t = 300)]
    timeout: u64,
    /// Async: discard pushes more than this x trainers updates stale
    /// (PaddlePaddle's async_lagged_grad_discard_ratio).
    #[arg(long, alias = "async_lagged_grad_discard_ratio", env = "OAR_LAG_RATIO", default_value_t = 2.5)]
    lag_ratio: f64,
    /// Load this server's shard from a saved model before serving.
    #[arg(long, env = "OAR_RESUME")]
    resume: Option<PathBuf>,
    /// Keep serving after every trainer has closed.
    #[arg(long, env = "OAR_KEEP_SERVING")]
    keep_serving: bool,
    /// When every trainer has closed, save the model into this folder (every server its
    /// shard, plus the manifest); shared by all servers.
    #[arg(long, alias = "save_dir", env = "OAR_SAVE_DIR")]
    save_dir: Option<PathBuf>,
    /// Trainers' saves after each pass may only write inside this folder (the model's
    /// --output) [default: --save_dir's parent, else the working directory].
    #[arg(long, env = "OAR_SAVE_ROOT")]
    save_root: Option<PathBuf>,
    /// Largest accepted frame, in MiB.
    #[arg(long, env = "OAR_MAX_FRAME_MB", default_value_t = 256)]
    max_frame_mb: usize,
    /// Checkpoint this server's shard in the background into this folder (under `server-K/`;
    /// --resume with it restarts from the newest readable checkpoint).
    #[arg(long, env = "OAR_CHECKPOINT_DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Seconds between background checkpoints.
    #[arg(long, env = "OAR_CHECKPOINT_EVERY", default_value_t = 30.0)]
    checkpoint_every: f64,
    /// Background checkpoints kept per server.
    #[arg(long, env = "OAR_CHECKPOINT_KEEP", default_value_t = 3)]
    checkpoint_keep: usize,
    /// This process's incarnation of its place (a supervisor restarting the server gives one
    /// more each time): clients that met a newer one refuse this server, and it stops.
    #[arg(long, env = "OAR_EPOCH", default_value_t = 0)]
    epoch: u64,
    /// Trainers that already closed (a restarted server is told them, comma-separated).
    #[arg(long, env = "OAR_TRAINERS_CLOSED", value_delimiter = ',')]
    trainers_closed: Vec<u64>,
    /// Seconds a trainer that disconnected without closing has to come back (restarted by a
    /// supervisor) before the server fails [default: fail at once].
    #[arg(long, env = "OAR_TRAINER_REJOIN")]
    trainer_rejoin: Option<f64>,
    /// This process may be a restart of a failed server, started again with the same command
    /// line (by an engine's restart policy or by hand): if --checkpoint-dir holds this job's
    /// state, go on from its newest checkpoint under the next epoch, knowing which trainers have
    /// closed; and wait --trainer-rejoin (default 60 s) for lost trainers.
    #[arg(long, env = "OAR_RECOVERABLE")]
    recoverable: bool,
    #[command(flatten)]
    limits: LimitArgs,
    /// The job's secret (a file of 16 to 4096 bytes): every client must prove it holds it
    /// before anything else, and this server proves it to them. Without one, anyone who can
    /// reach the port can change the model.
    #[arg(long, env = "OAR_SECRET_FILE")]
    secret_file: Option<PathBuf>,
}

/// A server's ports, as `oar pserver` listens on them and `oar train` reaches them.
#[derive(Args, Clone)]
struct PortArgs {
    /// First port of every server (for bare hosts in --servers) [default: 7164, or PADDLE_PORT /
    /// PADDLE_PSERVER_PORT / PADDLE_INIT_PORT]; 0 makes a server pick a free port (printed).
    #[arg(long, env = "OAR_PORT")]
    port: Option<u16>,
    /// Consecutive general ports per server; requests are spread over them [default: 1].
    #[arg(long = "ports-num", alias = "ports_num", env = "OAR_PORTS_NUM")]
    ports_num: Option<usize>,
    /// Further ports per server, after those, that carry only sparse traffic [default: 0].
    #[arg(long = "ports-num-for-sparse", alias = "ports_num_for_sparse", env = "OAR_PORTS_NUM_FOR_SPARSE")]
    ports_num_for_sparse: Option<usize>,
}

/// Job settings shared by `train` and `launch`: flag > env > --config file > default.
#[derive(Args, Clone)]
struct JobArgs {
    /// TOML job file ([model], [dense_optimizer], [sparse_optimizer], [train]).
    #[arg(long, env = "OAR_CONFIG")]
    config: Option<PathBuf>,
    /// Samples per step per trainer.
    #[arg(long, env = "OAR_BATCH_SIZE")]
    batch_size: Option<usize>,
    /// Passes over the data.
    #[arg(long, env = "OAR_PASSES")]
    passes: Option<u32>,
    /// Compute threads per trainer (PaddlePaddle's trainer_count).
    #[arg(long, visible_alias = "trainer-count", alias = "trainer_count", env = "OAR_THREADS")]
    threads: Option<usize>,
    /// Embedding width.
    #[arg(long, env = "OAR_EMBEDDING_DIM")]
    embedding_dim: Option<usize>,
    /// Hidden layer widths, comma-separated.
    #[arg(long, env = "OAR_HIDDEN", value_delimiter = ',')]
    hidden: Option<Vec<usize>>,
    /// Dense optimizer.
    #[arg(long, env = "OAR_DENSE_OPTIMIZER", value_enum)]
    dense_optimizer: Option<OptimizerKind>,
    /// Dense learning rate.
    #[arg(long, env = "OAR_DENSE_LR")]
    dense_lr: Option<f32>,
    /// Dense L2 regularization.
    #[arg(long, env = "OAR_DENSE_L2")]
    dense_l2: Option<f32>,
    /// Embedding optimizer.
    #[arg(long, env = "OAR_SPARSE_OPTIMIZER", value_enum)]
    sparse_optimizer: Option<OptimizerKind>,
    /// Embedding learning rate.
    #[arg(long, env = "OAR_SPARSE_LR")]
    sparse_lr: Option<f32>,
    /// Embedding L2 regularization.
    #[arg(long, env = "OAR_SPARSE_L2")]
    sparse_l2: Option<f32>,
    /// Seed of the initializers.
    #[arg(long, env = "OAR_SEED")]
    seed: Option<u64>,
    /// Log metrics every this many steps.
    #[arg(long, env = "OAR_LOG_EVERY")]
    log_every: Option<u64>,
    /// Skip and count bad data lines instead of failing.
    #[arg(long, env = "OAR_SKIP_BAD_LINES")]
    skip_bad_lines: bool,
    /// Seconds to wait for servers, sync steps and barriers.
    #[arg(long, env = "OAR_TIMEOUT")]
    timeout: Option<u64>,
    /// Async: discard pushes more than this x trainers updates stale.
    #[arg(long, alias = "async_lagged_grad_discard_ratio", env = "OAR_LAG_RATIO")]
    lag_ratio: Option<f64>,
    /// Shell command each data file is piped through (the file on its stdin), e.g. zcat.
    #[arg(long, alias = "pipe_command", env = "OAR_PIPE_COMMAND")]
    pipe_command: Option<String>,
    /// Local mode: apply each update this many steps after it was computed (measures the
    /// effect of async staleness without a network, deterministically).
    #[arg(long, env = "OAR_DELAY")]
    delay: Option<usize>,
    /// Async mode with one thread: pull the next batch's parameters while this one computes
    /// [default: true].
    #[arg(long, env = "OAR_PULL_AHEAD")]
    pull_ahead: Option<bool>,
    /// Async mode: make the first N updates synchronous steps (each trainer's batch split in
    /// as many parts as trainers, so an update covers the batch size), then go async.
    #[arg(long, env = "OAR_SYNC_WARMUP")]
    sync_warmup: Option<u64>,
    /// Async mode: a push computed from parameters k > 1 updates old moves the dense weights
    /// with the learning rate / k.
    #[arg(long, env = "OAR_SCALE_STALE_STEPS")]
    scale_stale_steps: Option<bool>,
    /// Train in this process, without servers, whatever else the job says.
    #[arg(long, alias = "is_local", env = "OAR_IS_LOCAL", num_args = 0..=1, default_missing_value = "true")]
    is_local: Option<bool>,
}

impl JobArgs {
    fn resolve(&self, registry: &Registry) -> anyhow::Result<JobConfig> {
        let mut job = match &self.config {
            Some(path) => JobConfig::from_file(path)?,
            None => JobConfig::default(),
        };
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
            set(&mut opt.kind, kind);
            set(&mut opt.lr, lr);
            set(&mut opt.l2, l2);
        }
        let t = &mut job.train;
        set(&mut t.batch_size, self.batch_size);
        set(&mut t.passes, self.passes);
        set(&mut t.threads, self.threads);
        set(&mut t.log_every, self.log_every);
        set(&mut t.timeout_secs, self.timeout);
        set(&mut t.lag_ratio, self.lag_ratio);
        set(&mut t.delay, self.delay);
        set(&mut t.pull_ahead, self.pull_ahead);
        set(&mut t.sync_warmup, self.sync_warmup);
        set(&mut t.scale_stale_steps, self.scale_stale_steps);
        t.skip_bad_lines |= self.skip_bad_lines;
        set(&mut t.is_local, self.is_local);
        if let Some(command) = &self.pipe_command {
            job.data.pipe_command = Some(command.clone());
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
struct TrainArgs {
    #[command(flatten)]
    job: JobArgs,
    /// The job's secret (a file of 16 to 4096 bytes), proved to every server and by every
    /// server before anything else; the same file for every process of the job.
    #[arg(long, env = "OAR_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// local, sync or async [default: local without servers, sync with them].
    #[arg(long, env = "OAR_MODE", value_enum)]
    mode: Option<Mode>,
    /// Servers in server-index order, comma-separated: host:port, or bare hosts on --port; a
    /// single number S means --num-servers S.
    #[arg(long, alias = "pservers", env = "OAR_SERVERS", value_delimiter = ',')]
    servers: Vec<String>,
    #[command(flatten)]
    ports: PortArgs,
    /// This trainer's id [default: 0].
    #[arg(long, alias = "trainer_id", env = "OAR_TRAINER_ID")]
    trainer_id: Option<usize>,
    /// Number of trainers [default: 1].
    #[arg(long, alias = "num_gradient_servers", visible_alias = "num-gradient-servers", env = "OAR_TRAINERS")]
    trainers: Option<usize>,
    /// Under an engine (mpirun, srun): ranks 0..N-1 become servers, the others trainers; they
    /// meet at --rendezvous (`--servers N` says the same).
    #[arg(long, env = "OAR_NUM_SERVERS")]
    num_servers: Option<usize>,
    /// Under an engine: rank 0's host and a free port there, where every rank registers
    /// [default under Slurm: the step's first node, port 15000 + SLURM_JOB_ID % 10000; for an MPI
    /// job on one host: a loopback port derived from the job].
    #[arg(long, env = "OAR_RENDEZVOUS")]
    rendezvous: Option<String>,
    /// Refused unless false: this is a CPU build.
    #[arg(long, alias = "use_gpu", env = "OAR_USE_GPU", num_args = 0..=1, default_missing_value = "true")]
    use_gpu: Option<bool>,
    /// Training data: a file or a folder of part files.
    #[arg(long, env = "OAR_TRAIN")]
    train: Option<PathBuf>,
    /// Test data evaluated after each pass (by trainer 0).
    #[arg(long, env = "OAR_TEST")]
    test: Option<PathBuf>,
    /// Save the model here after each pass.
    #[arg(long, env = "OAR_OUTPUT")]
    output: Option<PathBuf>,
    /// Continue from this saved model.
    #[arg(long, env = "OAR_RESUME")]
    resume: Option<PathBuf>,
    /// Job id (must match the servers').
    #[arg(long = "job", env = "OAR_JOB", default_value = "oar")]
    job_id: String,
    /// When a supervisor restarts failed servers: seconds to wait for a lost server to come
    /// back (reconnecting and repeating the unanswered request) before failing.
    #[arg(long, env = "OAR_RECOVER_TIMEOUT")]
    recover_timeout: Option<f64>,
    /// Record this trainer's position in its data in this folder after every step
    /// (`trainer-K.position`), so that a restart can go on from it.
    #[arg(long, env = "OAR_POSITION_DIR")]
    position_dir: Option<PathBuf>,
    /// This trainer is a restart of one that failed: go on from the position recorded in
    /// --position-dir (servers started with --trainer-rejoin wait for it).
    #[arg(long, env = "OAR_REJOIN", requires = "position_dir")]
    rejoin: bool,
    /// This process may be a restart of a failed one, started again with the same command line
    /// (by an engine's restart policy or by hand). Servers checkpoint into OUTPUT/checkpoints
    /// and go on from there under the next epoch; trainers record their position there and
    /// rejoin from it; each side waits up to 60 s (--recover-timeout, --trainer-rejoin) for a
    /// lost other. State is kept per --job: another job id starts afresh.
    #[arg(long, env = "OAR_RECOVERABLE")]
    recoverable: bool,
    /// Settings used when the environment says this process is a server
    /// (TRAINING_ROLE / PADDLE_TRAINING_ROLE = PSERVER).
    #[command(flatten)]
    server: ServerRoleArgs,
}

/// Server settings of `oar train` started as a PSERVER by PaddlePaddle's environment.
#[derive(Args)]
struct ServerRoleArgs {
    /// Server role: keep serving after every trainer has closed.
    #[arg(long, env = "OAR_KEEP_SERVING")]
    keep_serving: bool,
    /// Server role: listen on this interface's address.
    #[arg(long, env = "OAR_NICS")]
    nics: Option<String>,
    /// Server role: listen on this address [default: PADDLE_CURRENT_IP, else all].
    #[arg(long, env = "OAR_HOST")]
    host: Option<String>,
    /// Server role: checkpoint the shard in the background every this many seconds into
    /// OUTPUT/checkpoints [default: 30 with --recoverable, else none].
    #[arg(long, env = "OAR_CHECKPOINT_EVERY")]
    checkpoint_every: Option<f64>,
    #[command(flatten)]
    limits: LimitArgs,
}

#[derive(Args)]
struct LaunchArgs {
    #[command(flatten)]
    job: JobArgs,
    /// The job's secret for its processes [default: a new one in LOGS/secret].
    #[arg(long, env = "OAR_SECRET_FILE")]
    secret_file: Option<PathBuf>,
    /// Number of parameter servers.
    #[arg(long, default_value_t = 2)]
    servers: usize,
    /// Number of trainers.
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// sync or async.
    #[arg(long, env = "OAR_MODE", value_enum, default_value = "async")]
    mode: Mode,
    /// Training data: a file or a folder of part files.
    #[arg(long)]
    train: PathBuf,
    /// Test data evaluated after each pass.
    #[arg(long)]
    test: Option<PathBuf>,
    /// Save the model here after each pass.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Continue from this saved model.
    #[arg(long)]
    resume: Option<PathBuf>,
    /// Servers checkpoint their shards in the background every this many seconds, into
    /// OUTPUT/checkpoints (needs --output) [default: 30 with --max-restarts, else none].
    #[arg(long)]
    checkpoint_every: Option<f64>,
    /// Restart a server that dies or stops answering, from its newest checkpoint, while the
    /// trainers wait for it, and a trainer that dies, from its recorded position in its data,
    /// while the servers wait for it: at most this many restarts in all (0: the job fails at
    /// once). Needs --output (checkpoints and positions live there).
    #[arg(long, default_value_t = 0)]
    max_restarts: usize,
    /// Folder for the log files.
    #[arg(long, default_value = "logs")]
    logs: PathBuf,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
}

#[derive(Args)]
struct EvalArgs {
    /// A saved model (output folder or one of its pass folders).
    #[arg(long)]
    model: PathBuf,
    /// Data files or folders.
    #[arg(long, required = true, num_args = 1..)]
    data: Vec<PathBuf>,
    /// Samples per batch.
    #[arg(long, default_value_t = 4096)]
    batch_size: usize,
    /// Skip and count bad data lines instead of failing.
    #[arg(long)]
    skip_bad_lines: bool,
}

#[derive(Args)]
struct BenchArgs {
    /// Dense floats per push and pull in (a).
    #[arg(long, default_value_t = 4 << 20)]
    dense_floats: usize,
    /// Keys per sparse request in (b).
    #[arg(long, default_value_t = 50_000)]
    sparse_keys: usize,
    /// Rows inserted into the sparse table before (b) measures.
    #[arg(long, default_value_t = 10_000_000)]
    sparse_rows: usize,
    /// Data set for (c): a folder with train/ and test/ (e.g. from gen_criteo_synth.py).
    #[arg(long)]
    data: Option<PathBuf>,
    /// Lines to generate for (c) when --data is not given.
    #[arg(long, default_value_t = 1_000_000)]
    lines: u64,
    /// Seconds per measurement in (a) and (b).
    #[arg(long, default_value_t = 6.0)]
    seconds: f64,
    /// Skip the training runs (c).
    #[arg(long)]
    skip_training: bool,
    /// Instead: every zoo model (examples/zoo, the CTR-DNN) on --data, locally and on 2 servers
    /// x 2 workers, as a markdown table of test AUC, log-loss and samples/s.
    #[arg(long)]
    models: bool,
    /// Instead: local vs sync vs async 2x2 quality of the CTR-DNN on --real (rotated through
    /// --folds) and generated sets of --sizes lines under --seeds seeds, as paired differences.
    #[arg(long)]
    quality: bool,
    /// --quality: the real Criteo sample (TSV) to rotate through folds.
    #[arg(long)]
    real: Option<PathBuf>,
    /// --quality: folds of the real sample.
    #[arg(long, default_value_t = 10)]
    folds: usize,
    /// --quality: generated set sizes in training lines (0: none).
    #[arg(long, value_delimiter = ',', default_value = "200000,1000000")]
    sizes: Vec<u64>,
    /// --quality: seeds per generated size.
    #[arg(long, default_value_t = 3)]
    seeds: u64,
    /// --quality: samples per update.
    #[arg(long, default_value_t = 512)]
    batch: usize,
    /// --quality: a job file whose [train] settings (e.g. pull_ahead) every run uses.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Instead: the cost of surviving a server on --data, 2x2 async: no checkpoints, checkpoints
    /// every --checkpoint-every s, and server 1 killed mid-pass and restarted, --runs each.
    #[arg(long)]
    recovery: bool,
    /// --recovery: seconds between checkpoints.
    #[arg(long, default_value_t = 10.0)]
    checkpoint_every: f64,
    /// --recovery: runs of each kind.
    #[arg(long, default_value_t = 3)]
    runs: usize,
}

#[derive(Args)]
struct GenArgs {
    /// Training lines.
    #[arg(long)]
    lines: u64,
    /// Test lines.
    #[arg(long, default_value_t = 100_000)]
    test_lines: u64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Training part files.
    #[arg(long, default_value_t = 4)]
    parts: usize,
    /// Output folder.
    #[arg(long)]
    out: PathBuf,
}

/// Runs the `oar` command line with the layer types of `registry`, then exits the process.
pub fn main_with(registry: Registry) {
    let cli = Cli::parse();
    let launched = std::env::var_os("OAR_LAUNCHED").is_some();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(!launched && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = run(cli.command, launched, &registry) {
        // One write: ranks under mpirun or srun share a stderr, and a line written in pieces
        // can be interleaved with another rank's.
        let line = format!("oar: error: {e:#}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        std::process::exit(1);
    }
}

fn run(command: Command, launched: bool, registry: &Registry) -> anyhow::Result<()> {
    match command {
        Command::Pserver(a) => pserver(a, &ClusterEnv::from_process()?),
        Command::Train(a) => train(*a, launched, registry),
        Command::Cluster { engine: ClusterCommand::Ssh(a) } => {
            let text = std::fs::read_to_string(&a.hosts)
                .with_context(|| format!("cannot read the hosts file {}", a.hosts.display()))?;
            let config = crate::cluster::ssh::SshConfig {
                hosts: crate::cluster::ssh::parse_hosts(&text, &a.hosts)?,
                logs: a.logs.unwrap_or_else(|| a.workspace.join("log/launcher")),
                workspace: a.workspace,
                remote_workspace: a.remote_workspace,
                dispatch: a.dispatch,
                servers_per_host: a.servers_per_host,
                trainers_per_host: a.trainers_per_host,
                port: a.port,
                ssh_config: a.ssh_config,
                oar_bin: a.oar_bin,
                train_args: a.train_args,
                progress_bar: !a.no_progress,
                max_restarts: a.max_restarts,
            };
            let s = crate::cluster::ssh::run(&config)?;
            print_summary(&format!("oar cluster ssh on {} hosts", config.hosts.len()), &s);
            println!(
                "logs on each host under {}/log; local copies and summary.json in {}",
                config.remote_workspace.clone().unwrap_or_else(|| config.workspace.display().to_string()),
                config.logs.display()
            );
            Ok(())
        }
        Command::Cluster { engine: ClusterCommand::K8s(a) } => {
            let config = crate::cluster::k8s::K8sConfig {
                name: a.name,
                servers: a.servers,
                workers: a.workers,
                image: a.image,
                port: a.port,
                train_args: a.train_args,
                volume_claim: a.volume_claim,
                mount_path: a.mount_path,
                cpus: a.cpus,
                paddlejob: a.paddlejob,
                max_restarts: a.max_restarts,
                // A new secret per rendering: the manifests carry it in a Kubernetes Secret.
                secret: Some(crate::auth::Secret::generate()),
            };
            print!("{}", crate::cluster::k8s::render(&config)?);
            Ok(())
        }
        Command::Launch(a) => {
            let job = a.job.resolve(registry)?;
            let config = crate::launch::LaunchConfig {
                servers: a.servers,
                workers: a.workers,
                mode: a.mode,
                job,
                train: a.train,
                test: a.test,
                output: a.output,
                resume: a.resume,
                // A restarted server resumes from its newest checkpoint: restarts turn them on.
                checkpoint_every: a.checkpoint_every.or((a.max_restarts > 0).then_some(RESTART_CHECKPOINT_SECONDS)),
                max_restarts: a.max_restarts,
                logs: a.logs,
                exe: std::env::current_exe().context("cannot find the oar binary")?,
                progress_bar: !a.no_progress,
                registry: registry.clone(),
                child_env: Vec::new(),
                secret_file: a.secret_file,
            };
            let s = crate::launch::run(&config)?;
            print_summary(&format!("oar launch ({})", config.mode), &s);
            println!("logs and summary.json in {}", config.logs.display());
            Ok(())
        }
        Command::Eval(a) => {
            let mut files = Vec::new();
            for d in &a.data {
                files.extend(resolve_files(d)?);
            }
            let (manifest, shard) = crate::checkpoint::load_merged(&a.model)?;
            let model_config: crate::model::ModelConfig = serde_json::from_value(manifest.model["model"].clone())
                .with_context(|| {
                    format!("{}: the manifest's model description is not one this oar reads", a.model.display())
                })?;
            // Models saved before `[data]` existed were Criteo models.
            let data: crate::data::DataConfig = match manifest.model.get("data") {
                Some(d) => serde_json::from_value(d.clone())
                    .with_context(|| format!("{}: manifest has an unreadable data config", a.model.display()))?,
                None => crate::data::DataConfig::default(),
            };
            let (model, schema) = crate::config::build_model(&model_config, &data, registry)
                .with_context(|| format!("{}: the saved model", a.model.display()))?;
            let dims = |tables: &mut dyn Iterator<Item = (String, usize)>| tables.collect::<Vec<_>>();
            anyhow::ensure!(
                model.table_spec(shard.spec.dense.optimizer, shard.spec.dense.optimizer).dense == shard.spec.dense
                    && dims(&mut model.tables().iter().map(|t| (t.name.clone(), t.dim)))
                        == dims(&mut shard.spec.sparse.iter().map(|t| (t.name.clone(), t.dim))),
                "{}: the saved parameters do not fit the saved model description (layers or tables differ)",
                a.model.display()
            );
            let mut store = crate::train::Store::Local(Box::new(shard));
            let heads =
                crate::train::evaluate_heads(&mut store, &model, &schema, &files, a.batch_size, a.skip_bad_lines)?;
            println!("model pass {}: {} samples, {}", manifest.pass, heads[0].samples, heads[0]);
            if heads.len() > 1 {
                for (name, r) in model.head_names().iter().zip(&heads) {
                    println!("  head {name}: {r}");
                }
            }
            Ok(())
        }
        Command::Bench(a) if a.quality => crate::bench::quality::run(&crate::bench::quality::QualityConfig {
            real: a.real,
            folds: a.folds,
            sizes: a.sizes,
            seeds: a.seeds,
            batch: a.batch,
            train: match &a.config {
                Some(path) => JobConfig::from_file(path)?.train,
                None => Default::default(),
            },
            exe: std::env::current_exe().context("cannot find the oar binary")?,
        }),
        Command::Bench(a) if a.recovery => crate::bench::recovery::run(&crate::bench::recovery::RecoveryConfig {
            data: a.data.context("--recovery needs --data DIR (train/ and test/)")?,
            runs: a.runs,
            every: a.checkpoint_every,
            exe: std::env::current_exe().context("cannot find the oar binary")?,
        }),
        Command::Bench(a) => crate::bench::run(&crate::bench::BenchConfig {
            dense_floats: a.dense_floats,
            sparse_keys: a.sparse_keys,
            sparse_rows: a.sparse_rows,
            data: a.data,
            lines: a.lines,
            seconds: a.seconds,
            exe: std::env::current_exe().context("cannot find the oar binary")?,
            skip_training: a.skip_training,
            models: a.models,
        }),
        Command::Split(a) => {
            let (files, lines) = crate::data::files::split_file(&a.file, a.parts)?;
            println!(
                "split {} lines of {} into {} parts: {} .. {}",
                lines,
                a.file.display(),
                files.len(),
                files.first().map_or(String::new(), |f| f.display().to_string()),
                files.last().map_or(String::new(), |f| f.display().to_string())
            );
            Ok(())
        }
        Command::Data { what: DataCommand::Get(a) } => {
            let cache = a.cache.unwrap_or_else(crate::data::fetch::default_cache);
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})")
                    .expect("valid template"),
            );
            let f = crate::data::fetch::fetch(&a.name, &cache, a.mirror.as_deref(), &|file, bytes| {
                bar.set_message(file.to_string());
                bar.set_position(bytes);
            });
            bar.finish_and_clear();
            let f = f?;
            println!(
                "{}: {} file(s) downloaded, {} already cached, checksums verified, in {}",
                a.name,
                f.downloaded,
                f.cached,
                f.dir.display()
            );
            Ok(())
        }
        Command::Data { what: DataCommand::Prepare(a) } => {
            let p = match a.name {
                PrepareName::UciHousing => crate::data::prepare::uci_housing(&a.src, &a.out)?,
                PrepareName::Imikolov => crate::data::prepare::imikolov(&a.src, &a.out, a.min_count, a.n)?,
            };
            println!(
                "wrote {} ({} samples) and {} ({} samples)",
                p.train.display(),
                p.samples.0,
                p.test.display(),
                p.samples.1
            );
            if let Some((path, words)) = &p.dict {
                println!("dictionary: {words} words in {} (set model.outputs = {words})", path.display());
            }
            for (name, value) in &p.baselines {
                println!("baseline: {name} {value:.2}");
            }
            Ok(())
        }
        Command::Gen { what: GenCommand::Criteo(a) } => {
            let started = Instant::now();
            let r = crate::data::gen::generate(&gen_config(&a))?;
            print_generated(&a, &r, started);
            Ok(())
        }
        Command::Gen { what: GenCommand::Slots(a) } => {
            let started = Instant::now();
            let r = crate::data::gen_slots::generate(&gen_config(&a))?;
            print_generated(&a, &r.report, started);
            #[derive(serde::Serialize)]
            struct Job<'a> {
                data: &'a crate::data::DataConfig,
            }
            let pooling: Vec<String> = r.slots.iter().map(|s| format!("{} {}", s.name, s.pooling.name())).collect();
            println!("slots and their pooling: {}", pooling.join(", "));
            println!("read it with:\n{}", toml::to_string(&Job { data: &r.data })?.trim_end());
            Ok(())
        }
    }
}

fn gen_config(a: &GenArgs) -> crate::data::gen::GenConfig {
    crate::data::gen::GenConfig {
        lines: a.lines,
        test_lines: a.test_lines,
        seed: a.seed,
        parts: a.parts,
        out: a.out.clone(),
    }
}

/// Runs a parameter server: flags, then `OAR_*`, then PaddlePaddle's variables, then defaults.
fn pserver(a: PserverArgs, env: &ClusterEnv) -> anyhow::Result<()> {
    let (config, addrs) = server_config(a, env)?;
    let stats = crate::server::serve_blocking(&addrs, config)?;
    log_stopped(&stats);
    report_stopped(&stats)
}

fn train(a: TrainArgs, launched: bool, registry: &Registry) -> anyhow::Result<()> {
    let Some(config) = trainer_config(a, registry)? else { return Ok(()) }; // a server: it has served
    let mine = crate::data::shard_files(&config.train_files, config.trainers, config.trainer_id);
    // A resumed job trains only the passes after the saved one.
    let passes = config.passes.saturating_sub(crate::checkpoint::passes_done(config.resume.as_deref())?) as u64;
    let total = crate::data::files::total_bytes(&mine) * passes;
    let bar = if launched { indicatif::ProgressBar::hidden() } else { indicatif::ProgressBar::new(total) };
    bar.set_style(
        indicatif::ProgressStyle::with_template("[{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({eta})")
            .expect("valid template"),
    );
    let last = std::cell::Cell::new(Instant::now());
    let report = crate::train::run_with(&config, registry, &|bytes, samples| {
        if launched {
            if last.get().elapsed() > Duration::from_millis(200) {
                println!("OAR_PROGRESS {bytes} {samples}");
                last.set(Instant::now());
            }
        } else {
            bar.set_position(bytes.min(total));
        }
    })?;
    bar.finish_and_clear();
    if launched {
        println!("OAR_RESULT {}", serde_json::to_string(&report)?);
    } else {
        println!(
            "trained {} samples in {:.1} s ({:.0} samples/s in the training loop)",
            report.samples,
            report.wall_seconds,
            report.samples as f64 / report.train_seconds.max(1e-9)
        );
        let t = &report.time;
        println!(
            "training loop time: waiting for data {:.1} s, pull {:.1} s, forward/backward {:.1} s, push {:.1} s",
            t.data, t.pull, t.compute, t.push
        );
        for p in &report.passes {
            let test = p.test.as_ref().map_or(String::new(), |t| format!("; test {t}"));
            println!("pass {}: train {}{test}", p.pass, p.train);
            for h in &p.heads {
                let test = h.test.as_ref().map_or(String::new(), |t| format!("; test {t}"));
                println!("  head {}: train {}{test}", h.output, h.train);
            }
        }
    }
    Ok(())
}
