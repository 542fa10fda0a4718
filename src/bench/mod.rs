//! `oar bench`: the performance figures, each measured side by side with a baseline in one run.
//!
//! (a) dense push+pull through a real server over loopback TCP, against a raw TCP copy of the
//!     same bytes (client sends N bytes, server echoes N bytes) in the same process;
//! (b) sparse pull and push keys/s through one server, against the same table driven
//!     in-memory without the network, and beside the servers of other builds
//!     (`--baseline-exe`, in alternating `--rounds`: `sparse.rs`);
//! (c) CTR-DNN training samples/s locally (1 and 2 threads) and with 2 servers x 2 workers
//!     launched as processes, with the test AUC reached, the model written as shorthand and as a
//!     layer graph side by side.
//!
//! With `--models`, instead: the model zoo's table, every zoo model locally and on 2 servers x
//! 2 workers. The other measurements are `quality.rs` (`--quality`: local against sync and async),
//! `recovery.rs` (`--recovery`: what surviving a killed server or trainer costs) and `security.rs`
//! (`--security`: what the secret and TLS cost) and `hosts.rs` (`--hosts`: training across
//! network namespaces on shaped, lossy links) and `paddle.rs` (`--paddle`: the CTR-DNN beside
//! PaddlePaddle's parameter-server mode).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::client::{Client, ClientConfig, StepHeader};
use crate::protocol::Mode;
use crate::protocol::RowCreation;
use crate::table::{DenseParam, DenseSpec, Init, Optimizer, TableSpec};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Dense floats moved per push and per pull.
    pub dense_floats: usize,
    /// Keys per sparse request.
    pub sparse_keys: usize,
    /// Rows in the sparse table before measuring.
    pub sparse_rows: usize,
    /// Other `oar` binaries whose servers (b) measures beside this build's, alternating.
    pub baselines: Vec<PathBuf>,
    /// Training data set for (c): a folder with `train/` and `test/`; generated if absent.
    pub data: Option<PathBuf>,
    /// Lines to generate for (c) when no data set is given.
    pub lines: u64,
    /// Seconds to spend on each of (a) and (b).
    pub seconds: f64,
    /// The `oar` binary, for the launched cluster of (c).
    pub exe: PathBuf,
    /// Skip (c).
    pub skip_training: bool,
    /// In (b), leave the server and the client to the scheduler instead of placing each on a
    /// core of its own.
    pub shared_cores: bool,
    /// Instead of (a) to (c): every zoo model, locally and on 2 servers x 2 workers (with
    /// `baselines`, each baseline's 2 x 2 beside this build's, alternating).
    pub models: bool,
    /// With `models`: only these zoo models (names as the table prints them); empty: all.
    pub only: Vec<String>,
    /// Alternating rounds of (b), each measuring every build (medians, and ratios paired by
    /// round, are reported); with `models` and `baselines`, rounds per model.
    pub rounds: usize,
}

/// The model zoo's job files (`examples/zoo/`, and the CTR-DNN), built in.
pub const ZOO: [(&str, &str); 12] = [
    ("LR", include_str!("../../examples/zoo/lr.toml")),
    ("FM", include_str!("../../examples/zoo/fm.toml")),
    ("Wide&Deep", include_str!("../../examples/zoo/wide_deep.toml")),
    ("DeepFM", include_str!("../../examples/zoo/deepfm.toml")),
    ("DCN", include_str!("../../examples/zoo/dcn.toml")),
    ("DCN-V2", include_str!("../../examples/zoo/dcn_v2.toml")),
    ("DLRM", include_str!("../../examples/zoo/dlrm.toml")),
    ("FFM", include_str!("../../examples/zoo/ffm.toml")),
    ("xDeepFM", include_str!("../../examples/zoo/xdeepfm.toml")),
    ("AutoInt+", include_str!("../../examples/zoo/autoint.toml")),
    ("GateNet", include_str!("../../examples/zoo/gatenet.toml")),
    ("CTR-DNN", CTR_DNN),
];

/// The CTR-DNN's job file (`examples/ctr_dnn.toml`), which most measurements train.
pub const CTR_DNN: &str = include_str!("../../examples/ctr_dnn.toml");

/// An `oar pserver` child process, so its CPU time can be read from `/proc`.
pub(super) struct ServerProc {
    pub(super) addr: String,
    child: std::process::Child,
}

impl ServerProc {
    fn start(exe: &Path) -> anyhow::Result<ServerProc> {
        ServerProc::start_with(exe, &[])
    }

    /// A server with further flags (a secret file, TLS files).
    pub(super) fn start_with(exe: &Path, extra: &[String]) -> anyhow::Result<ServerProc> {
        ServerProc::start_on(exe, extra, None)
    }

    /// A server with further flags, on core `cpu` only if given.
    pub(super) fn start_on(exe: &Path, extra: &[String], cpu: Option<usize>) -> anyhow::Result<ServerProc> {
        use std::io::BufRead;
        let mut command = std::process::Command::new(exe);
        if let Some(cpu) = cpu {
            cores::start_on(&mut command, cpu);
        }
        let mut child = command
            .args([
                "pserver",
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--job",
                "bench",
                "--trainers",
                "1",
                "--mode",
                "async",
            ])
            // Stopped by the bench itself: no waiting for (or failing on) trainers.
            .args(["--lag-ratio", "1e9", "--max-frame-mb", "1024", "--keep-serving"])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let mut line = String::new();
        std::io::BufReader::new(stdout).read_line(&mut line)?;
        let addr = line.strip_prefix("OAR_READY ").map(|a| a.trim().to_string());
        match addr {
            Some(addr) => Ok(ServerProc { addr, child }),
            None => {
                let _ = child.kill();
                anyhow::bail!("the benchmark server did not start (printed {line:?})")
            }
        }
    }

    /// CPU seconds (user + system) the server has used so far.
    fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()))?;
        // Fields after the command name (which may hold spaces) start at ") ".
        let rest = &stat[stat.rfind(')').unwrap_or(0) + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
        // USER_HZ is 100 on Linux (the kernel ABI fixes it for /proc).
        Ok(ticks / 100.0)
    }

    /// The server's resident memory, bytes.
    fn rss_bytes(&self) -> anyhow::Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        Ok(crate::observe::metrics::status_memory(&status).0)
    }

    /// Stops the server now (as dropping it does).
    pub(super) fn stop(self) {
        drop(self)
    }
}

/// A bench that fails leaves no server behind (they run with `--keep-serving`).
impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One dense round trip as trainer 0: a push of `grads` as step `step` (each its own step:
/// servers answer a step sent again without applying it), then a pull of the whole vector.
pub(super) fn dense_round(c: &mut Client, grads: &[f32], dense: &mut Vec<f32>, step: &mut u64) -> anyhow::Result<()> {
    c.push(&StepHeader { step: *step, ..one_sample() }, Some(grads), &[])?;
    c.pull(Some(dense), &[], &mut [], RowCreation::Create)?;
    *step += 1;
    Ok(())
}

/// A push of one sample's gradients by trainer 0 in pass 1.
fn one_sample() -> StepHeader {
    StepHeader { trainer: 0, step: 0, pass: 1, base_version: 0, samples: 1, apply: Default::default() }
}

fn connect(addr: &str, spec: &TableSpec) -> anyhow::Result<Client> {
    connect_with(
        ClientConfig::new(vec![addr.to_string()], "bench", Duration::from_secs(10), Duration::from_secs(60)),
        spec,
    )
}

/// Connects as trainer 0 with `config` and declares `spec`.
pub(super) fn connect_with(config: ClientConfig, spec: &TableSpec) -> anyhow::Result<Client> {
    let mut c = Client::connect(&config.as_trainer(0))?;
    c.declare(spec)?;
    Ok(c)
}

/// An echo server for the raw TCP baseline: reads `bytes`, sends them back, until EOF.
fn raw_echo(bytes: usize) -> anyhow::Result<(TcpStream, std::thread::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || {
        let Ok((mut s, _)) = listener.accept() else { return };
        let _ = s.set_nodelay(true);
        let mut buf = vec![0u8; bytes];
        while s.read_exact(&mut buf).is_ok() {
            if s.write_all(&buf).is_err() {
                return;
            }
        }
    });
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    Ok((s, echo))
}

/// Runs `round` for `seconds` (at least 3 times); returns rounds per second.
pub(super) fn rate(seconds: f64, mut round: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    let (started, mut n) = (Instant::now(), 0u64);
    while started.elapsed().as_secs_f64() < seconds || n < 3 {
        round()?;
        n += 1;
    }
    Ok(n as f64 / started.elapsed().as_secs_f64())
}

/// Runs `a` then `b`, or `b` then `a` with `b_first`: rounds that alternate which side goes
/// first, as the first thing measured in a round runs about 5% slower.
pub(super) fn in_turn<T>(
    b_first: bool,
    a: impl FnOnce() -> anyhow::Result<T>,
    b: impl FnOnce() -> anyhow::Result<T>,
) -> anyhow::Result<(T, T)> {
    if b_first {
        let b = b()?;
        Ok((a()?, b))
    } else {
        let a = a()?;
        Ok((a, b()?))
    }
}

/// The median of `v` (not empty): of an even count, the mean of the two middle values. The
/// upper middle value alone, taken before, made 2 or 4 rounds' ratios of this build over a
/// baseline read high.
pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(super::median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(super::median(vec![0.75, 1.25]), 1.0);
        assert_eq!(super::median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(super::median(vec![7.0]), 7.0);
    }
}

/// Dense push+pull of `floats` floats through a server vs a raw TCP echo of the same bytes,
/// alternating five times; returns the median GB/s of each (payload bytes, both ways).
fn dense_gbps(exe: &Path, floats: usize, seconds: f64) -> anyhow::Result<(f64, f64)> {
    let spec = TableSpec {
        dense: DenseSpec {
            params: vec![DenseParam::new("w", floats, Init::Zeros)],
            block_size: 1 << 16,
            seed: 1,
            optimizer: Optimizer::sgd(1e-6),
        },
        sparse: vec![],
    };
    let server = ServerProc::start(exe)?;
    let mut c = connect(&server.addr, &spec)?;
    let (mut raw, echo) = raw_echo(floats * 4)?;
    let grads = vec![1.0f32; floats];
    let (out, mut back) = (vec![1u8; floats * 4], vec![0u8; floats * 4]);
    let (mut dense, mut step) = (Vec::new(), 0u64);
    let (mut raws, mut oars) = (Vec::new(), Vec::new());
    let per_round = (2 * floats * 4) as f64 / 1e9;
    for _ in 0..5 {
        raws.push(
            per_round
                * rate(seconds / 10.0, || {
                    raw.write_all(&out)?;
                    raw.read_exact(&mut back)?;
                    Ok(())
                })?,
        );
        oars.push(per_round * rate(seconds / 10.0, || dense_round(&mut c, &grads, &mut dense, &mut step))?);
    }
    drop(raw);
    let _ = echo.join();
    c.close(0)?;
    server.stop();
    Ok((median(raws), median(oars)))
}

pub mod blas;
mod cores;
pub mod delay;
pub mod hosts;
pub mod netns;
pub mod paddle;
pub mod peak;
pub mod precision;
pub mod quality;
pub mod recovery;
pub mod roofline;
pub mod scale;
pub mod security;
mod sparse;
pub mod trainers;
mod training;
pub mod transfer;
pub mod zoo_products;
pub use sparse::SparseDraws;

use sparse::sparse_rates;
pub use training::ctr_dnn_graph;
pub(super) use training::two_by_two;
use training::{models, train_cluster, train_local};

/// Runs every measurement and prints the table.
pub fn run(config: &BenchConfig) -> anyhow::Result<()> {
    if config.models {
        let data =
            config.data.as_deref().ok_or_else(|| anyhow::anyhow!("--models needs --data DIR (train/ and test/)"))?;
        return models(data, config);
    }
    dense(config)?;
    sparse(config)?;
    if config.skip_training {
        return Ok(());
    }
    let tmp = std::env::temp_dir().join(format!("oar-bench-{}", std::process::id()));
    let data = bench_data(config.data.as_deref(), config.lines, 4, &tmp)?;
    let logs = tmp.join("logs");
    let shorthand = ctr_dnn_forms(config, &data, &logs)?;
    async_controls(config, &data, &logs, &shorthand)?;
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}

/// (a) Dense push and pull through a server against raw TCP.
fn dense(config: &BenchConfig) -> anyhow::Result<()> {
    let bytes = config.dense_floats * 4;
    println!("(a) dense push+pull of {:.1} MiB each way, loopback TCP", bytes as f64 / (1 << 20) as f64);
    let (raw, oar) = dense_gbps(&config.exe, config.dense_floats, config.seconds)?;
    println!("    raw TCP copy (send N, echo N)     {raw:7.2} GB/s   (median of 5 alternating runs)");
    println!("    oar push + pull through a server  {oar:7.2} GB/s   = {:.0}% of raw TCP", 100.0 * oar / raw);

    Ok(())
}

/// (b) The sparse table through one server of this build and of each baseline, and in memory.
fn sparse(config: &BenchConfig) -> anyhow::Result<()> {
    let rounds = config.rounds.max(1);
    println!(
        "(b) sparse rows of dim 10, {} rows inserted per table, then batches of {} Zipf-like keys, one server (medians of {rounds} alternating rounds)",
        config.sparse_rows, config.sparse_keys
    );
    let placement = if config.shared_cores {
        None
    } else {
        cores::Placement::here().unwrap_or_else(|e| {
            tracing::warn!("cannot read which cores this process may use ({e}): the scheduler places the bench");
            None
        })
    };
    let sizes = (config.sparse_rows, config.sparse_keys);
    let r = sparse_rates(&config.exe, &config.baselines, sizes, config.seconds, rounds, placement)?;
    println!(
        "    ({} keys drawn per batch hold {} unique ids on average; deps.md counts the drawn keys, trainers send unique ones)",
        config.sparse_keys, r.unique
    );
    match r.placement {
        Some(p) => println!(
            "    (each server on CPU {}, the client and the table in memory on CPU {}, as on separate hosts; --shared-cores leaves them to the scheduler)",
            p.server, p.client
        ),
        None if config.shared_cores => println!("    (the server and the client where the scheduler puts them)"),
        None => println!("    (one CPU: the server and the client share it)"),
    }
    let this = &r.builds[0];
    for b in &r.builds {
        let ratio = |k: usize| {
            if std::ptr::eq(b, this) {
                String::new()
            } else {
                let (mid, lo, hi) = this.ratios(b, k);
                format!(" (this build: {mid:.2}x, rounds {lo:.2}-{hi:.2}x)")
            }
        };
        println!("    {}:", b.name);
        println!(
            "      memory per row (resident memory grown by the inserts: index, id, weights, statistics, state): {:.1} bytes per-dimension Adagrad, {:.1} bytes row-wise Adagrad",
            b.bytes_per_row[0], b.bytes_per_row[1]
        );
        println!("      insert (new ids)         {:6.2} M keys/s", b.insert / 1e6);
        let names = [
            format!("pull {} ids as drawn", config.sparse_keys),
            format!("pull {} unique ids", r.unique),
            format!("push {} unique ids", r.unique),
        ];
        for (k, what) in names.iter().enumerate() {
            let (net, core, handling) = b.ops[k];
            // Builds that count the server's handling: its share of the wall time, and this
            // build's rate against the same table in memory.
            let split = if handling > 0.0 {
                format!(
                    "; the server's handler {:.0}% of the time (the rest: sockets, loopback, client)",
                    handling * 100.0
                )
            } else {
                String::new()
            };
            let of_memory = if std::ptr::eq(b, this) {
                let (mid, lo, hi) = r.of_memory(b, k);
                format!(" = {mid:.2} of the table in memory (rounds {lo:.2}-{hi:.2})")
            } else {
                String::new()
            };
            println!(
                "      {what:24} {:6.2} M keys/s through the server{of_memory}; {:5.2} M per server CPU second{split}{}",
                net / 1e6,
                core / 1e6,
                ratio(k)
            );
        }
    }
    println!(
        "    this build's table in memory: insert {:.2}, pull as drawn {:.2}, pull unique {:.2}, push unique {:.2} M keys/s",
        r.mem[0] / 1e6,
        r.mem[1] / 1e6,
        r.mem[2] / 1e6,
        r.mem[3] / 1e6
    );
    Ok(())
}

/// The training data: `--data`, or a generated Criteo-like set under `tmp`.
pub(super) fn bench_data(data: Option<&Path>, lines: u64, parts: usize, tmp: &Path) -> anyhow::Result<PathBuf> {
    Ok(match data {
        Some(d) => d.to_path_buf(),
        None => {
            let out = tmp.join("data");
            let r = crate::data::gen::generate(&crate::data::gen::GenConfig {
                lines,
                test_lines: (lines / 10).max(1000),
                seed: 1,
                parts,
                out: out.clone(),
            })?;
            println!(
                "    (generated {} lines; oracle test AUC {:.4})",
                r.train_lines,
                r.oracle_test_auc.unwrap_or(f64::NAN)
            );
            out
        }
    })
}

/// (c) The CTR-DNN trained locally and on a 2x2 cluster, as shorthand and as layer graph;
/// returns the shorthand job.
fn ctr_dnn_forms(
    config: &BenchConfig,
    data: &Path,
    logs: &Path,
) -> anyhow::Result<crate::train::job_config::JobConfig> {
    println!(
        "(c) CTR-DNN training, 1 pass over {}, batch 512, end to end (start-up and test included)",
        data.display()
    );
    let shorthand = crate::train::job_config::JobConfig::default();
    // The same optimizers as the default job's, to the last hyper-parameter, so both forms are
    // the very same model (a job file's `kind = "adagrad"` keeps Adam's default epsilon).
    let graph = crate::train::job_config::JobConfig {
        dense_optimizer: shorthand.dense_optimizer,
        sparse_optimizer: shorthand.sparse_optimizer,
        ..ctr_dnn_graph()
    };
    let runs = [
        train_local(data, 1, shorthand.clone(), "shorthand")?,
        train_local(data, 1, graph.clone(), "layer graph")?,
        train_local(data, 2, shorthand.clone(), "shorthand")?,
        train_cluster(Mode::Async, data, &config.exe, logs, shorthand.clone(), "shorthand")?,
        train_cluster(Mode::Async, data, &config.exe, logs, graph, "layer graph")?,
    ];
    let base = runs[0].samples_per_sec;
    for r in &runs {
        println!(
            "    {:45} {:8.0} samples/s ({:5.2}x local 1 thread; {:8.0} in the training loop)  test AUC {:.4}",
            r.name,
            r.samples_per_sec,
            r.samples_per_sec / base,
            r.loop_samples_per_sec,
            r.auc.unwrap_or(f64::NAN)
        );
    }
    println!(
        "    the layer graph form runs at {:.1}% (local) and {:.1}% (2x2) of the shorthand's samples/s (target >= 95%)",
        100.0 * runs[1].samples_per_sec / runs[0].samples_per_sec,
        100.0 * runs[4].samples_per_sec / runs[3].samples_per_sec
    );
    Ok(shorthand)
}

/// What async mode's staleness controls cost: the default job against plain async, in
/// alternating runs so that the machine's drift hits both alike.
fn async_controls(
    config: &BenchConfig,
    data: &Path,
    logs: &Path,
    shorthand: &crate::train::job_config::JobConfig,
) -> anyhow::Result<()> {
    let t = &shorthand.train;
    let plain = crate::train::job_config::JobConfig {
        train: crate::train::job_config::TrainSettings { sync_warmup: 0, scale_stale_steps: false, ..t.clone() },
        ..shorthand.clone()
    };
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        without.push(train_cluster(Mode::Async, data, &config.exe, logs, plain.clone(), "plain")?.samples_per_sec);
        with.push(train_cluster(Mode::Async, data, &config.exe, logs, shorthand.clone(), "default")?.samples_per_sec);
    }
    let (with, without) = (median(with), median(without));
    println!(
        "    async 2x2 with its defaults (sync warm-up {} updates, staleness-scaled steps {}) {with:.0} samples/s, plain async {without:.0}: {:.1}% (medians of 3 alternating runs; target >= 95%)",
        t.sync_warmup,
        t.scale_stale_steps,
        100.0 * with / without
    );
    Ok(())
}
