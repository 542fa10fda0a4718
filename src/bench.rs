//! `oar bench`: the performance figures, each measured side by side with a baseline in one run.
//!
//! (a) dense push+pull through a real server over loopback TCP, against a raw TCP copy of the
//!     same bytes (client sends N bytes, server echoes N bytes) in the same process;
//! (b) sparse pull and push keys/s through one server, against the same table driven
//!     in-memory without the network;
//! (c) CTR-DNN training samples/s locally (1 and 2 threads) and with 2 servers x 2 workers
//!     launched as processes, with the test AUC reached.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::client::{Client, ClientConfig, TableGrads, TableIds};
use crate::protocol::RowCreation;
use crate::server::{Mode, ServerConfig};
use crate::table::{DenseParam, DenseSpec, Init, Optimizer, SparseSpec, TableSpec};

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Dense floats moved per push and per pull.
    pub dense_floats: usize,
    /// Keys per sparse request.
    pub sparse_keys: usize,
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
}

fn start_server(spec_trainers: usize) -> anyhow::Result<(String, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
            tx.send(listener.local_addr().expect("bound").to_string()).expect("report address");
            let config = ServerConfig {
                index: 0,
                num_servers: 1,
                trainers: spec_trainers,
                mode: Mode::Async,
                job: "bench".into(),
                max_frame: 1 << 30,
                timeout: Duration::from_secs(60),
                lag_ratio: 1e9,
                resume: None,
                exit_when_done: true,
            };
            let _ = crate::server::run(listener, config, std::future::pending()).await;
        })
    });
    Ok((rx.recv()?, handle))
}

fn connect(addr: &str, spec: &TableSpec) -> anyhow::Result<Client> {
    let mut c = Client::connect(&ClientConfig {
        servers: vec![addr.to_string()],
        job: "bench".into(),
        connect_timeout: Duration::from_secs(10),
        reply_timeout: Duration::from_secs(60),
    })?;
    c.declare(spec)?;
    Ok(c)
}

/// Raw loopback TCP: the client sends `bytes`, the server reads them all and sends them back.
fn raw_tcp_gbps(bytes: usize, seconds: f64) -> anyhow::Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = listener.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; bytes];
        loop {
            if s.read_exact(&mut buf).is_err() {
                return Ok(());
            }
            s.write_all(&buf)?;
        }
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let (out, mut back) = (vec![1u8; bytes], vec![0u8; bytes]);
    let (started, mut rounds) = (Instant::now(), 0u64);
    while started.elapsed().as_secs_f64() < seconds || rounds < 3 {
        s.write_all(&out)?;
        s.read_exact(&mut back)?;
        rounds += 1;
    }
    let gbps = (2 * bytes) as f64 * rounds as f64 / started.elapsed().as_secs_f64() / 1e9;
    drop(s);
    let _ = echo.join();
    Ok(gbps)
}

/// Dense push then pull of `floats` floats through a server, GB/s of payload both ways.
fn dense_gbps(floats: usize, seconds: f64) -> anyhow::Result<f64> {
    let spec = TableSpec {
        dense: DenseSpec {
            params: vec![DenseParam { name: "w".into(), len: floats, init: Init::Zeros }],
            block_size: 1 << 16,
            seed: 1,
            optimizer: Optimizer::sgd(1e-6),
        },
        sparse: vec![],
    };
    let (addr, server) = start_server(1)?;
    let mut c = connect(&addr, &spec)?;
    let grads = vec![1.0f32; floats];
    let mut dense = Vec::new();
    let (started, mut rounds) = (Instant::now(), 0u64);
    while started.elapsed().as_secs_f64() < seconds || rounds < 3 {
        c.push(0, rounds, 1, 0, 1, Some(&grads), &[])?;
        c.pull(Some(&mut dense), &[], &mut [], RowCreation::Create)?;
        rounds += 1;
    }
    let gbps = (2 * floats * 4) as f64 * rounds as f64 / started.elapsed().as_secs_f64() / 1e9;
    c.close(0)?;
    let _ = server.join();
    Ok(gbps)
}

/// Sparse figures: (pull keys/s, push keys/s) through a server, and the same in memory.
fn sparse_rates(keys: usize, seconds: f64) -> anyhow::Result<[f64; 4]> {
    let table = SparseSpec {
        name: "emb".into(),
        dim: 10,
        seed: 1,
        init: Init::Uniform { scale: 0.01 },
        optimizer: Optimizer::adagrad(0.05),
    };
    let spec = TableSpec {
        dense: DenseSpec { params: vec![], block_size: 1024, seed: 1, optimizer: Optimizer::sgd(0.1) },
        sparse: vec![table.clone()],
    };
    // Batches of distinct ids drawn from a 10M id space, so the table grows as in training.
    let batches: Vec<Vec<u64>> = (0..64u64)
        .map(|b| (0..keys as u64).map(|i| crate::layout::mix64(b * keys as u64 + i) % 10_000_000).collect())
        .map(|mut v: Vec<u64>| {
            v.sort_unstable();
            v.dedup();
            v
        })
        .collect();
    let grads = vec![0.01f32; keys * 10];
    let run = |pull: &mut dyn FnMut(&[u64]) -> anyhow::Result<()>| -> anyhow::Result<f64> {
        let (started, mut n, mut i) = (Instant::now(), 0usize, 0usize);
        while started.elapsed().as_secs_f64() < seconds / 4.0 || i < 3 {
            let ids = &batches[i % batches.len()];
            pull(ids)?;
            n += ids.len();
            i += 1;
        }
        Ok(n as f64 / started.elapsed().as_secs_f64())
    };
    let (addr, server) = start_server(1)?;
    let mut c = connect(&addr, &spec)?;
    let mut rows = [Vec::new()];
    let net_pull = run(&mut |ids| {
        c.pull(None, &[TableIds { table: 0, dim: 10, ids }], &mut rows, RowCreation::Create)
            .map(|_| ())
            .map_err(Into::into)
    })?;
    let net_push = run(&mut |ids| {
        let g = TableGrads { table: 0, dim: 10, ids, grads: &grads[..ids.len() * 10] };
        c.push(0, 0, 1, 0, 1, None, &[g]).map(|_| ()).map_err(Into::into)
    })?;
    c.close(0)?;
    let _ = server.join();
    let mem = crate::table::SparseTable::new(table);
    let mut out = vec![0.0f32; keys * 10];
    let mem_pull = run(&mut |ids| mem.pull(ids, &mut out[..ids.len() * 10], true).map_err(Into::into))?;
    let mem_push = run(&mut |ids| mem.push(ids, &grads[..ids.len() * 10], 1.0).map_err(Into::into))?;
    Ok([net_pull, net_push, mem_pull, mem_push])
}

/// One training measurement.
struct TrainRun {
    name: String,
    samples_per_sec: f64,
    loop_samples_per_sec: f64,
    auc: Option<f64>,
}

fn train_local(data: &Path, threads: usize) -> anyhow::Result<TrainRun> {
    let job = crate::config::JobConfig::default();
    let started = Instant::now();
    let config = crate::train::TrainConfig {
        mode: Mode::Local,
        servers: vec![],
        trainer_id: 0,
        trainers: 1,
        train_files: crate::config::resolve_files(&data.join("train"))?,
        test_files: crate::config::resolve_files(&data.join("test"))?,
        batch_size: job.train.batch_size,
        passes: 1,
        threads,
        model: job.model,
        dense_optimizer: job.dense_optimizer,
        sparse_optimizer: job.sparse_optimizer,
        output: None,
        resume: None,
        log_every: 0,
        job: "bench".into(),
        skip_bad_lines: false,
        connect_timeout: Duration::from_secs(10),
        reply_timeout: Duration::from_secs(600),
    };
    let r = crate::train::run(&config, &|_, _| {})?;
    let wall = started.elapsed().as_secs_f64();
    Ok(TrainRun {
        name: format!("local, {threads} thread(s)"),
        samples_per_sec: r.samples as f64 / wall,
        loop_samples_per_sec: r.samples as f64 / r.train_seconds,
        auc: r.passes.last().and_then(|p| p.test.as_ref()).and_then(|t| t.auc),
    })
}

fn train_cluster(data: &Path, exe: &Path, logs: &Path) -> anyhow::Result<TrainRun> {
    let s = crate::launch::run(&crate::launch::LaunchConfig {
        servers: 2,
        workers: 2,
        mode: Mode::Async,
        job: crate::config::JobConfig::default(),
        train: data.join("train"),
        test: Some(data.join("test")),
        output: None,
        resume: None,
        logs: logs.to_path_buf(),
        exe: exe.to_path_buf(),
        progress_bar: false,
    })?;
    Ok(TrainRun {
        name: "2 servers x 2 workers, async".into(),
        samples_per_sec: s.samples_per_sec,
        loop_samples_per_sec: s.train_loop_samples_per_sec,
        auc: s.test_auc,
    })
}

/// Runs every measurement and prints the table.
pub fn run(config: &BenchConfig) -> anyhow::Result<()> {
    let bytes = config.dense_floats * 4;
    println!("(a) dense push+pull of {:.1} MiB each way, loopback TCP", bytes as f64 / (1 << 20) as f64);
    let raw = raw_tcp_gbps(bytes, config.seconds)?;
    let oar = dense_gbps(config.dense_floats, config.seconds)?;
    println!("    raw TCP copy (send N, echo N)     {raw:7.2} GB/s");
    println!("    oar push + pull through a server  {oar:7.2} GB/s   = {:.0}% of raw TCP", 100.0 * oar / raw);

    println!("(b) sparse rows of dim 10, {} keys per request, one server", config.sparse_keys);
    let [net_pull, net_push, mem_pull, mem_push] = sparse_rates(config.sparse_keys, config.seconds)?;
    println!(
        "    pull through the server   {:6.2} M keys/s   (in-memory table {:6.2} M keys/s, ratio {:.2})",
        net_pull / 1e6,
        mem_pull / 1e6,
        net_pull / mem_pull
    );
    println!(
        "    push (Adagrad) through it {:6.2} M keys/s   (in-memory table {:6.2} M keys/s, ratio {:.2})",
        net_push / 1e6,
        mem_push / 1e6,
        net_push / mem_push
    );
    if config.skip_training {
        return Ok(());
    }
    let tmp = std::env::temp_dir().join(format!("oar-bench-{}", std::process::id()));
    let data = match &config.data {
        Some(d) => d.clone(),
        None => {
            let out = tmp.join("data");
            let r = crate::data::gen::generate(&crate::data::gen::GenConfig {
                lines: config.lines,
                test_lines: (config.lines / 10).max(1000),
                seed: 1,
                parts: 4,
                out: out.clone(),
            })?;
            println!(
                "    (generated {} lines; oracle test AUC {:.4})",
                r.train_lines,
                r.oracle_test_auc.unwrap_or(f64::NAN)
            );
            out
        }
    };
    println!(
        "(c) CTR-DNN training, 1 pass over {}, batch 512, end to end (start-up and test included)",
        data.display()
    );
    let runs = [train_local(&data, 1)?, train_local(&data, 2)?, train_cluster(&data, &config.exe, &tmp.join("logs"))?];
    let base = runs[0].samples_per_sec;
    for r in &runs {
        println!(
            "    {:32} {:8.0} samples/s ({:5.2}x local 1 thread; {:8.0} in the training loop)  test AUC {:.4}",
            r.name,
            r.samples_per_sec,
            r.samples_per_sec / base,
            r.loop_samples_per_sec,
            r.auc.unwrap_or(f64::NAN)
        );
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(())
}
