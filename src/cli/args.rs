//! The `oar` command line's grammar ([`Cli`]): its commands and subcommands, and the flags of
//! the commands that are not a job's processes (`cluster`, `data`, `gen`, `split`, `eval`,
//! `predict`); those of `pserver`, `train` and `launch` are in `args_job`, those of `bench` in
//! `args_bench`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use super::args_bench::BenchArgs;
use super::args_job::{LaunchArgs, PserverArgs, TrainArgs};

#[derive(Parser)]
#[command(name = "oar", version = super::VERSION, about = "A parameter-server system for distributed training")]
pub(super) struct Cli {
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Subcommand)]
pub(super) enum Command {
    /// Run a parameter server.
    Pserver(PserverArgs),
    /// Run one trainer (local mode, or against running servers).
    Train(Box<TrainArgs>),
    /// Run a whole cluster on this machine: N servers and M trainers as child processes.
    Launch(LaunchArgs),
    /// Evaluate a saved model on data files: prints AUC and log-loss.
    Eval(EvalArgs),
    /// Score data files with a saved model: one line per sample, every head's score.
    Predict(PredictArgs),
    /// Export a saved model for other tools: the dense graph and the complete model as ONNX,
    /// the tables as safetensors, a manifest (see src/serve/model_export.rs).
    Export(ExportArgs),
    /// Serve a saved model over HTTP with KServe's v2 inference protocol, reloading newer saves.
    Serve(ServeArgs),
    /// Measure throughput against baselines, side by side (recorded figures: docs/src/measurements/).
    Bench(BenchArgs),
    /// Generate data sets.
    Gen {
        #[command(subcommand)]
        what: GenCommand,
    },
    /// Make a job's TLS files: a certificate authority and a server certificate issued by it.
    Tls(TlsGenArgs),
    /// Derive one process's credential from the job's master secret (trainer t, a tool or an
    /// operator): it proves that identity and no other.
    Secret(super::secret::SecretArgs),
    /// Shrink the sparse tables of running servers: decay every row's show and click counts,
    /// delete rows whose score fell below `delete_threshold` or unseen for more than
    /// `delete_after_unseen_days` (each table's accessor settings).
    Shrink(ShrinkArgs),
    /// Split a file by line into N balanced parts FILE-00000 .. (for sharding over trainers).
    Split(SplitArgs),
    /// Draw a job's training curves (a trainer's --metrics-csv file) to a PNG.
    Plot(PlotArgs),
    /// Print a completion script for a shell (bash, zsh, fish, elvish, powershell), e.g.
    /// `oar completions bash > ~/.local/share/bash-completion/completions/oar`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Write man pages for oar and each of its commands into a folder (oar.1, oar-launch.1, ...).
    Man {
        /// The folder (created if missing).
        #[arg(long, default_value = "man")]
        out: PathBuf,
    },
    /// Print the reference of every command and flag, as Markdown (the book's reference chapter
    /// is this output).
    Reference,
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
pub(super) enum ClusterCommand {
    /// Start servers and trainers on the hosts of a hosts file over ssh; logs under each host's
    /// workspace log/; every remote process is stopped on Ctrl-C or any failure.
    Ssh(SshArgs),
    /// Print Kubernetes manifests (headless Service, server StatefulSet, trainer Indexed Job; or
    /// a Kubeflow PaddleJob) that run `oar train` with the given arguments.
    K8s(K8sArgs),
}

#[derive(Args)]
pub(super) struct SshArgs {
    /// Hosts file: one ssh destination (host or user@host) per line, # comments.
    #[arg(long)]
    pub(super) hosts: PathBuf,
    /// The job's folder (data, job files); the same path on the hosts unless --remote-workspace.
    #[arg(long)]
    pub(super) workspace: PathBuf,
    /// The workspace's path on the hosts [default: the --workspace path].
    #[arg(long)]
    pub(super) remote_workspace: Option<String>,
    /// Copy the workspace (without log/) and this oar binary to every host first.
    #[arg(long)]
    pub(super) dispatch: bool,
    /// Parameter servers per host.
    #[arg(long, default_value_t = 1)]
    pub(super) servers_per_host: usize,
    /// Trainers per host.
    #[arg(long, default_value_t = 1)]
    pub(super) trainers_per_host: usize,
    /// First server port on each host (more servers per host take the next ports).
    #[arg(long, default_value_t = crate::base::env::DEFAULT_PORT)]
    pub(super) port: u16,
    /// ssh client configuration file (ssh -F): ports, users, keys.
    #[arg(long)]
    pub(super) ssh_config: Option<PathBuf>,
    /// The oar binary on the hosts [default: the dispatched copy with --dispatch, else oar].
    #[arg(long)]
    pub(super) oar_bin: Option<String>,
    /// Local copies of every process's log [default: WORKSPACE/log/launcher].
    #[arg(long)]
    pub(super) logs: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub(super) no_progress: bool,
    /// Restart a server or trainer that fails, on its host with its command line, at most this
    /// many times in all: every process is then --recoverable (servers checkpoint into
    /// OUTPUT/checkpoints on their host, trainers record their position there; needs --output).
    #[arg(long, default_value_t = 0)]
    pub(super) max_restarts: usize,
    /// Arguments of `oar train` for every server and trainer (after --).
    #[arg(last = true)]
    pub(super) train_args: Vec<String>,
}

#[derive(Args)]
pub(super) struct K8sArgs {
    /// Job name (a DNS-1035 label): objects are named after it.
    #[arg(long)]
    pub(super) name: String,
    /// Number of parameter servers.
    #[arg(long)]
    pub(super) servers: usize,
    /// Number of trainers.
    #[arg(long)]
    pub(super) workers: usize,
    /// Container image with `oar` on its PATH.
    #[arg(long)]
    pub(super) image: String,
    /// Servers' port.
    #[arg(long, default_value_t = crate::base::env::DEFAULT_PORT)]
    pub(super) port: u16,
    /// A PersistentVolumeClaim (data and model) mounted in every pod, also the working folder.
    #[arg(long)]
    pub(super) volume_claim: Option<String>,
    /// Where --volume-claim is mounted.
    #[arg(long, default_value = "/oar")]
    pub(super) mount_path: String,
    /// CPU request and limit per pod (e.g. 2).
    #[arg(long)]
    pub(super) cpus: Option<String>,
    /// Print a Kubeflow training-operator PaddleJob (Master = servers, Worker = trainers).
    #[arg(long)]
    pub(super) paddlejob: bool,
    /// Let Kubernetes restart a failed trainer container (server containers are always
    /// restarted) at most this many times; every pod is then --recoverable and goes on from
    /// OUTPUT/checkpoints on the volume (needs --volume-claim).
    #[arg(long, default_value_t = 0)]
    pub(super) max_restarts: usize,
    /// Arguments of `oar train` for every pod (after --).
    #[arg(last = true)]
    pub(super) train_args: Vec<String>,
}

#[derive(Args)]
pub(super) struct SplitArgs {
    /// Number of parts.
    #[arg(long)]
    pub(super) parts: usize,
    /// The file.
    pub(super) file: PathBuf,
}

#[derive(Subcommand)]
pub(super) enum DataCommand {
    /// Download a public data set (uci_housing, ptb) into the cache, checking checksums.
    Get(GetArgs),
    /// Turn a raw data set into plain-format train/test files, as PaddlePaddle prepares it.
    Prepare(PrepareArgs),
    /// The dense values' statistics over training files (count, mean, std, min, max per value,
    /// after the format's own transform), for `[data] dense_transform`.
    Stats(StatsArgs),
}

#[derive(Args)]
pub(super) struct StatsArgs {
    /// The job file whose `[data]` reads the files [default: Criteo].
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    /// Data files or folders.
    #[arg(long, required = true, num_args = 1..)]
    pub(super) data: Vec<PathBuf>,
    /// The statistics file (JSON), named by `[data] dense_stats`.
    #[arg(long)]
    pub(super) out: PathBuf,
}

#[derive(Args)]
pub(super) struct GetArgs {
    /// The data set.
    pub(super) name: String,
    /// Cache folder [default: $OAR_DATA_HOME, else ~/.cache/oar/data].
    #[arg(long)]
    pub(super) cache: Option<PathBuf>,
    /// Fetch from this mirror (URL/SET/FILE) instead of the canonical hosts.
    #[arg(long, env = "OAR_DATA_MIRROR")]
    pub(super) mirror: Option<String>,
    /// Seconds a host may send nothing (connecting, or mid-download) before the download
    /// fails naming it.
    #[arg(long, default_value_t = 60)]
    pub(super) read_timeout: u64,
}

#[derive(Args)]
pub(super) struct PrepareArgs {
    /// The data set.
    #[arg(value_enum)]
    pub(super) name: PrepareName,
    /// The raw data: housing.data (uci-housing) or the folder holding ptb.train.txt[.gz] and
    /// ptb.valid.txt (imikolov).
    #[arg(long)]
    pub(super) src: PathBuf,
    /// Output folder.
    #[arg(long)]
    pub(super) out: PathBuf,
    /// imikolov: keep words seen more than this many times.
    #[arg(long, default_value_t = 50)]
    pub(super) min_count: u64,
    /// imikolov: words per sample (n-1 context words and the next word).
    #[arg(long, default_value_t = 5)]
    pub(super) n: usize,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(super) enum PrepareName {
    /// UCI housing (Boston) for linear regression.
    UciHousing,
    /// Penn Treebank N-grams for the word model.
    Imikolov,
}

#[derive(Subcommand)]
pub(super) enum GenCommand {
    /// Criteo-format lines from a planted logistic model.
    Criteo(GenArgs),
    /// Multi-hot lines in the slots format (one-hot, multi-valued and weighted slots) from a
    /// planted model with per-slot pooling; meta.json has the `[data]` section to read them.
    Slots(GenArgs),
    /// Behaviour sequences in PaddleRec's DIN format from a planted model where the click
    /// depends on how much of the history shares the candidate's category (`--effect share`)
    /// or of its recent half only (`--effect order`, which only order-aware models can see).
    Sequences(SequencesArgs),
    /// Impressions with a click and a conversion after it, in PaddleRec's Ali-CCP format, from
    /// a planted model where the same ids drive both (ESMM's setting).
    Conversions(GenArgs),
    /// Criteo-format lines from a planted model whose click depends on pairs of 12 of the 26
    /// fields: one vector per value (`--effect pairs`, an FM's model) or one per value and
    /// partner field (`--effect field-pairs`, a field-aware FM's).
    Interactions(InteractionsArgs),
    /// Two binary tasks over 100 dense inputs whose relation `--correlation` sets: the MMoE
    /// paper's synthetic setting (`--effect sines`) or a planted mixture of experts
    /// (`--effect experts`), in the plain format.
    Tasks(TasksArgs),
    /// An online job's logs: a folder of Criteo-format lines per day (OUT/YYYYMMDD/part-*) from
    /// a planted model that drifts; new ids arrive every day and old ones go quiet.
    Stream(StreamArgs),
}

#[derive(Args)]
pub(super) struct SequencesArgs {
    #[command(flatten)]
    pub(super) gen: GenArgs,
    /// The planted effect.
    #[arg(long, value_enum, default_value_t)]
    pub(super) effect: crate::data::gen::sequences::Effect,
}

#[derive(Args)]
pub(super) struct InteractionsArgs {
    #[command(flatten)]
    pub(super) gen: GenArgs,
    /// The planted interaction.
    #[arg(long, value_enum, default_value_t)]
    pub(super) effect: crate::data::gen::interactions::Effect,
}

#[derive(Args)]
pub(super) struct TasksArgs {
    #[command(flatten)]
    pub(super) gen: GenArgs,
    /// The planted task relation.
    #[arg(long, value_enum, default_value_t)]
    pub(super) effect: crate::data::gen::tasks::Effect,
    /// Correlation of the two tasks' linear parts (`sines`, `wiggle`), or about that of their gates'
    /// rows (`experts`), in [-1, 1].
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub(super) correlation: f64,
    /// Sine terms per task's score (`sines`; the paper's 10 unless asked), 1 to 100.
    #[arg(long, default_value_t = crate::data::gen::tasks::SINES)]
    pub(super) sines: usize,
    /// Slope of each click probability in the standardized score: the higher, the less noise
    /// in the labels.
    #[arg(long, default_value_t = crate::data::gen::tasks::SHARPNESS)]
    pub(super) sharpness: f64,
    /// Multiplies each sine's frequency (`sines`: 1 is the paper's; `wiggle`: 1 is 6), in (0, 10].
    #[arg(long, default_value_t = 1.0)]
    pub(super) frequency: f64,
}

impl TasksArgs {
    /// The relation asked for.
    pub(super) fn relation(&self) -> crate::data::gen::tasks::Relation {
        crate::data::gen::tasks::Relation {
            effect: self.effect,
            correlation: self.correlation,
            sines: self.sines,
            sharpness: self.sharpness,
            frequency: self.frequency,
        }
    }
}

#[derive(Args)]
pub(super) struct StreamArgs {
    /// Days.
    #[arg(long)]
    pub(super) days: u32,
    /// Lines per day.
    #[arg(long)]
    pub(super) lines_per_day: u64,
    /// Part files per day.
    #[arg(long, default_value_t = 4)]
    pub(super) parts: usize,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// The first day, YYYYMMDD.
    #[arg(long, default_value = "20260101")]
    pub(super) start: String,
    /// Output folder.
    #[arg(long)]
    pub(super) out: PathBuf,
}

#[derive(Args)]
pub(super) struct EvalArgs {
    /// A saved model (output folder or one of its pass folders).
    #[arg(long)]
    pub(super) model: PathBuf,
    /// Data files or folders.
    #[arg(long, required = true, num_args = 1..)]
    pub(super) data: Vec<PathBuf>,
    /// Samples per batch.
    #[arg(long, default_value_t = 4096)]
    pub(super) batch_size: usize,
    /// Skip and count bad data lines instead of failing.
    #[arg(long)]
    pub(super) skip_bad_lines: bool,
    /// Run the `pipe_command` the saved model's manifest names over the data: a model from
    /// elsewhere runs a command on this machine only when asked (without this, such a model is
    /// refused, naming its command).
    #[arg(long)]
    pub(super) trust_pipe_command: bool,
}

#[derive(Args)]
pub(super) struct PredictArgs {
    /// A saved model (output folder or one of its pass folders).
    #[arg(long)]
    pub(super) model: PathBuf,
    /// Data files or folders, in the saved model's data format.
    #[arg(long, required = true, num_args = 1..)]
    pub(super) data: Vec<PathBuf>,
    /// Where the scores go (`-`: standard output): one line per input line, every head's score
    /// tab-separated.
    #[arg(long)]
    pub(super) out: PathBuf,
    /// Samples per batch.
    #[arg(long, default_value_t = 4096)]
    pub(super) batch_size: usize,
    /// Threads computing scores [default: the machine's cores].
    #[arg(long, default_value_t = std::thread::available_parallelism().map_or(1, |n| n.get()))]
    pub(super) threads: usize,
    /// Skip and count bad data lines instead of failing (they get no output line).
    #[arg(long)]
    pub(super) skip_bad_lines: bool,
    /// No progress bar.
    #[arg(long)]
    pub(super) no_progress: bool,
    /// Run the `pipe_command` the saved model's manifest names over the data: a model from
    /// elsewhere runs a command on this machine only when asked (without this, such a model is
    /// refused, naming its command).
    #[arg(long)]
    pub(super) trust_pipe_command: bool,
}

#[derive(Args)]
pub(super) struct TlsGenArgs {
    /// Folder to write ca.pem (for --tls-ca), cert.pem (--tls-cert) and key.pem (--tls-key)
    /// into; existing files are never overwritten.
    #[arg(long)]
    pub(super) out: PathBuf,
    /// The name the server certificate is issued for (--tls-name).
    #[arg(long, default_value = crate::security::tls::DEFAULT_NAME)]
    pub(super) name: String,
}

#[derive(Args)]
pub(super) struct ExportArgs {
    /// A saved model (output folder or one of its pass folders).
    #[arg(long)]
    pub(super) model: PathBuf,
    /// The export folder (created; an earlier export's files there are replaced).
    #[arg(long)]
    pub(super) out: PathBuf,
    /// The most bytes of tables the complete model (model.onnx) may hold; beyond it only
    /// dense.onnx and the tables are written; 0 never writes it.
    #[arg(long, default_value_t = 1 << 30)]
    pub(super) complete_limit: u64,
}

#[derive(Args)]
pub(super) struct ServeArgs {
    /// A saved model: a training job's output folder (newer passes are picked up as they are
    /// saved) or one of its pass folders.
    #[arg(long)]
    pub(super) model: PathBuf,
    /// Where to listen (port 0: any free port, printed as `OAR_SERVE HOST:PORT`).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub(super) addr: String,
    /// The model's name in the URLs (/v2/models/NAME/infer).
    #[arg(long, default_value = "oar")]
    pub(super) name: String,
    /// Milliseconds between checks of the model folder for a newer save.
    #[arg(long, default_value_t = 1000)]
    pub(super) poll_ms: u64,
    /// The largest request body, in MiB (a parsed body takes many times its size: 16 MiB holds
    /// some 40,000 Criteo lines).
    #[arg(long, default_value_t = 16)]
    pub(super) max_body_mib: usize,
    /// The most request-body bytes held at once over all connections, in MiB (waiting or
    /// being scored); a body without room is answered 503 with Retry-After at once.
    #[arg(long, default_value_t = 256)]
    pub(super) max_buffered_mib: usize,
    /// Connections served at once; more wait until one ends.
    #[arg(long, default_value_t = 1024)]
    pub(super) max_connections: usize,
    /// Connections served at once from one address; more are answered 503 (behind a proxy,
    /// whose connections all come from its address, raise it up to --max-connections)
    /// [default: 256, or --max-connections if lower].
    #[arg(long)]
    pub(super) max_connections_per_address: Option<usize>,
    /// Seconds a connection may take to send a request's head (an idle one is closed after
    /// them) or its body after the head.
    #[arg(long, default_value_t = 30.0)]
    pub(super) read_timeout: f64,
}

#[derive(Args)]
pub(super) struct PlotArgs {
    /// The curves: the metrics.csv the trainers wrote (OUTPUT/metrics.csv, or LOGS/metrics.csv
    /// under oar launch without --output).
    #[arg(long)]
    pub(super) metrics: PathBuf,
    /// The picture [default: curves.png beside the CSV file].
    #[arg(long)]
    pub(super) out: Option<PathBuf>,
}

#[derive(Args)]
pub(super) struct ShrinkArgs {
    /// The servers, host:port in server-index order, comma-separated.
    #[arg(long, env = "OAR_SERVERS", value_delimiter = ',', required = true)]
    pub(super) servers: Vec<String>,
    /// Job id (must match the servers').
    #[arg(long = "job", env = "OAR_JOB", default_value = "oar")]
    pub(super) job_id: String,
    /// Days passed since the last shrink that counted days: every row's unseen days grow by
    /// this first (1 at a day's end; 0 within a day).
    #[arg(long, default_value_t = 0)]
    pub(super) days: u32,
    /// The job's secret file, when the servers have one: an operator's credential (`oar
    /// secret --operator`) or the master.
    #[arg(long, env = "OAR_SECRET_FILE")]
    pub(super) secret_file: Option<PathBuf>,
    /// TLS to the servers: --tls-ca (and --tls-name).
    #[command(flatten)]
    pub(super) tls: crate::cli::tls_args::TlsArgs,
    /// Seconds to wait for each server to connect and to answer.
    #[arg(long, default_value_t = 600)]
    pub(super) timeout: u64,
}

#[derive(Args)]
pub(super) struct GenArgs {
    /// Training lines.
    #[arg(long)]
    pub(super) lines: u64,
    /// Test lines.
    #[arg(long, default_value_t = 100_000)]
    pub(super) test_lines: u64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub(super) seed: u64,
    /// Training part files.
    #[arg(long, default_value_t = 4)]
    pub(super) parts: usize,
    /// Output folder.
    #[arg(long)]
    pub(super) out: PathBuf,
}
