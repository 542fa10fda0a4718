//! The flags of `oar bench`: which measurement runs ((a)-(c) by default, or one of --models,
//! --quality, --recovery, --security, --hosts, --roofline) and their settings.

use std::path::PathBuf;

use clap::Args;

#[derive(Args)]
pub(super) struct BenchArgs {
    /// Dense floats per push and pull in (a).
    #[arg(long, default_value_t = 4 << 20)]
    pub(super) dense_floats: usize,
    /// Keys per sparse request in (b).
    #[arg(long, default_value_t = 50_000)]
    pub(super) sparse_keys: usize,
    /// Rows inserted into the sparse table before (b) measures.
    #[arg(long, default_value_t = 10_000_000)]
    pub(super) sparse_rows: usize,
    /// Another oar binary (e.g. an earlier build) whose server (b) measures beside this
    /// build's in alternating rounds; repeatable.
    #[arg(long = "baseline-exe")]
    pub(super) baseline_exe: Vec<PathBuf>,
    /// Data set for (c): a folder with train/ and test/ (e.g. from gen_criteo_synth.py).
    #[arg(long)]
    pub(super) data: Option<PathBuf>,
    /// Lines to generate for (c) when --data is not given (default 1,000,000; with --hosts
    /// 50,000, which takes about 10 minutes over the default links there; with --roofline
    /// 200,000, or 20,000 with --model).
    #[arg(long)]
    pub(super) lines: Option<u64>,
    /// Seconds per measurement in (a) and (b).
    #[arg(long, default_value_t = 6.0)]
    pub(super) seconds: f64,
    /// Skip the training runs (c).
    #[arg(long)]
    pub(super) skip_training: bool,
    /// In (b), leave the server and the client where the scheduler puts them, instead of
    /// each on a core of its own (as on separate hosts)
    #[arg(long)]
    pub(super) shared_cores: bool,
    /// Instead: every zoo model (examples/zoo, the CTR-DNN) on --data, locally and on 2 servers
    /// x 2 workers, as a markdown table of test AUC, log-loss and samples/s.
    #[arg(long)]
    pub(super) models: bool,
    /// With --models: only this zoo model (as the table names it, e.g. DCN, CTR-DNN); with
    /// --hosts: sparse-heavy or dense-heavy; with --roofline: instead of its steps, this zoo
    /// model's matrix products (or every one's: all), recorded from a pass of --lines (default
    /// 20,000) and timed against --blas; repeatable.
    #[arg(long = "model")]
    pub(super) model: Vec<String>,
    /// Alternating rounds of (b), each measuring every build (medians, and ratios paired by
    /// round, are reported); with --models and --baseline-exe, rounds per model.
    #[arg(long, default_value_t = 3)]
    pub(super) rounds: usize,
    /// Instead: local vs sync vs async vs geo 2x2 quality of the CTR-DNN on --real (rotated through
    /// --folds) and generated sets of --sizes lines under --seeds seeds, as paired differences.
    #[arg(long)]
    pub(super) quality: bool,
    /// --quality: the real Criteo sample (TSV) to rotate through folds.
    #[arg(long)]
    pub(super) real: Option<PathBuf>,
    /// --quality: folds of the real sample.
    #[arg(long, default_value_t = 10)]
    pub(super) folds: usize,
    /// --quality: generated set sizes in training lines (0: none).
    #[arg(long, value_delimiter = ',', default_value = "200000,1000000")]
    pub(super) sizes: Vec<u64>,
    /// --quality: seeds per generated size.
    #[arg(long, default_value_t = 3)]
    pub(super) seeds: u64,
    /// --quality: samples per update; --roofline: rows per step.
    #[arg(long, default_value_t = 512)]
    pub(super) batch: usize,
    /// --quality: instead of the 2x2 table, async at these trainer counts (N trainers, N / 4
    /// servers), the dense parameters async and synchronous (sync_dense), against local.
    #[arg(long, value_delimiter = ',')]
    pub(super) many_trainers: Vec<usize>,
    /// --quality: instead of the 2x2 table, bf16 products against f32 (local and async 2x2):
    /// the AUC and log-loss differences and the speed ratio (needs a CPU with avx512_bf16).
    #[arg(long)]
    pub(super) bf16: bool,
    /// --quality: a job file whose [train] settings (e.g. pull_ahead) every run uses.
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    /// Instead: the cost of surviving a server on --data, 2x2 async: no checkpoints, checkpoints
    /// every --checkpoint-every s, and server 1 killed mid-pass and restarted, --runs each.
    #[arg(long)]
    pub(super) recovery: bool,
    /// --recovery: seconds between checkpoints.
    #[arg(long, default_value_t = 10.0)]
    pub(super) checkpoint_every: f64,
    /// --recovery, --security and --hosts: runs of each kind.
    #[arg(long, default_value_t = 3)]
    pub(super) runs: usize,
    /// Instead: what the secret and TLS cost against an open server, --runs alternating rounds:
    /// connections/s and dense GB/s through one server, and (with --data) 2x2 async training.
    #[arg(long)]
    pub(super) security: bool,
    /// Instead: --servers x --trainers (2 x 2, --modes), each in a network namespace of its own (needs
    /// root), on every --links shape, the CTR-DNN and a dense-heavy CTR-DNN, --runs rounds:
    /// round trips, samples/s end to end, bytes per sample, packets lost.
    #[arg(long)]
    pub(super) hosts: bool,
    /// --hosts: link shapes, RATE[+lossN][+delayD] each (unshaped, 100mbit, 1gbit, 10gbit;
    /// +loss1000 drops one packet in 1,000 each way; +delay500us delays trainers' and servers'
    /// bytes by 0.5 ms each way, through a delay line in each server's host, +delay0us by the
    /// line alone); the first is the others' baseline.
    #[arg(long, value_delimiter = ',', default_value = "unshaped,10gbit,1gbit,1gbit+loss1000,100mbit")]
    pub(super) links: Vec<crate::bench::netns::Link>,
    /// --hosts: the modes to run on every link (async, sync, geo at geo_k_steps 100); the
    /// first mode on the first link is the others' baseline.
    #[arg(long, value_delimiter = ',', default_value = "async")]
    pub(super) modes: Vec<crate::protocol::Mode>,
    /// Instead: how close training comes to the machine's limit: the CTR-DNN step's matrix
    /// products with oar's kernel and with --blas (GFLOP/s, one thread, --rounds alternating,
    /// --seconds / 10 each), then local training's matrix FLOP/s as a share of them and where a
    /// step's time went (on --data, or --lines generated, default 200,000).
    #[arg(long)]
    pub(super) roofline: bool,
    /// --roofline: the reference BLAS, a library with cblas_sgemm (loaded at run time).
    #[arg(long, default_value = crate::bench::blas::DEFAULT)]
    pub(super) blas: String,
    /// Instead: the CTR-DNN on 2 servers x 2 trainers, async, with oar and with PaddlePaddle 3.0's
    /// parameter-server mode, run by this Python (`pip install paddlepaddle==3.0.0 "protobuf<5"`),
    /// on --data (or --lines generated), --rounds alternating rounds: samples/s and test AUC.
    #[arg(long, value_name = "PYTHON")]
    pub(super) paddle: Option<PathBuf>,
    /// --hosts: servers, each on a host of its own.
    #[arg(long, default_value_t = 2)]
    pub(super) servers: usize,
    /// --hosts: trainers, each on a host of its own.
    #[arg(long, default_value_t = 2)]
    pub(super) trainers: usize,
}
