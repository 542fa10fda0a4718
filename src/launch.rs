//! `oar launch`: a whole cluster on one machine. Starts N servers and M trainers as child
//! processes of this same binary (configured by flags and a job file, exactly as a person would
//! start them), one log file each, a progress bar, and stops every child on Ctrl-C or as soon as
//! any child fails, naming it and quoting its last log line.
//!
//! Children talk to the launcher through their stdout: `OAR_READY <addr>` when a server
//! listens (servers bind port 0, so ports are never guessed), `OAR_PROGRESS <bytes> <samples>`
//! from trainers, and `OAR_RESULT <json>` when a trainer ends. Everything else goes to the log.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::config::JobConfig;
use crate::server::Mode;
use crate::train::TrainReport;

/// What to launch.
#[derive(Clone, Debug)]
pub struct LaunchConfig {
    /// Number of servers.
    pub servers: usize,
    /// Number of trainers.
    pub workers: usize,
    /// Sync or async.
    pub mode: Mode,
    /// The resolved job.
    pub job: JobConfig,
    /// Training data (file or folder).
    pub train: PathBuf,
    /// Test data (file or folder).
    pub test: Option<PathBuf>,
    /// Save the model here after each pass.
    pub output: Option<PathBuf>,
    /// Continue from this saved model.
    pub resume: Option<PathBuf>,
    /// Folder of the log files.
    pub logs: PathBuf,
    /// The `oar` binary to start.
    pub exe: PathBuf,
    /// Show a progress bar.
    pub progress_bar: bool,
}

/// The end-of-job summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LaunchSummary {
    /// Servers run.
    pub servers: usize,
    /// Trainers run.
    pub workers: usize,
    /// Samples trained on by all trainers.
    pub samples: u64,
    /// Whole job, start-up and evaluation included.
    pub wall_seconds: f64,
    /// `samples / wall_seconds`.
    pub samples_per_sec: f64,
    /// Samples per second inside the trainers' training loops (summed over trainers).
    pub train_loop_samples_per_sec: f64,
    /// Test figures after the last pass (trainer 0).
    pub test: Option<crate::metrics::EvalReport>,
    /// Async pushes discarded as stale.
    pub discarded_pushes: u64,
    /// Every trainer's report.
    pub reports: Vec<TrainReport>,
}

#[derive(Default)]
struct ChildState {
    last_line: String,
    bytes: u64,
    result: Option<String>,
}

struct Proc {
    name: String,
    child: Child,
    state: Arc<Mutex<ChildState>>,
    log: PathBuf,
}

enum Event {
    Ready(usize, String),
}

fn spawn(
    exe: &Path,
    name: &str,
    args: &[String],
    log: PathBuf,
    ready: Option<(usize, mpsc::Sender<Event>)>,
) -> anyhow::Result<Proc> {
    let mut child = Command::new(exe)
        .args(args)
        .env("OAR_LAUNCHED", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {name} ({})", exe.display()))?;
    let state = Arc::new(Mutex::new(ChildState::default()));
    let file = std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let file = Arc::new(Mutex::new(std::io::LineWriter::new(file)));
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    for (stream, is_stdout) in [(Box::new(stdout) as Box<dyn std::io::Read + Send>, true), (Box::new(stderr), false)] {
        let (state, file, ready) = (state.clone(), file.clone(), ready.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                if is_stdout {
                    if let Some(addr) = line.strip_prefix("OAR_READY ") {
                        if let Some((i, tx)) = &ready {
                            let _ = tx.send(Event::Ready(*i, addr.trim().to_string()));
                        }
                        continue;
                    }
                    if let Some(p) = line.strip_prefix("OAR_PROGRESS ") {
                        if let Some(b) = p.split_whitespace().next().and_then(|b| b.parse().ok()) {
                            state.lock().expect("no panics under this lock").bytes = b;
                        }
                        continue;
                    }
                    if let Some(r) = line.strip_prefix("OAR_RESULT ") {
                        state.lock().expect("no panics under this lock").result = Some(r.to_string());
                        continue;
                    }
                }
                let _ = writeln!(file.lock().expect("no panics under this lock"), "{line}");
                if !line.trim().is_empty() {
                    state.lock().expect("no panics under this lock").last_line = line;
                }
            }
        });
    }
    Ok(Proc { name: name.to_string(), child, state, log })
}

fn kill_all(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        let _ = p.child.kill();
    }
    for p in procs.iter_mut() {
        let _ = p.child.wait();
    }
}

fn failure(p: &Proc, status: std::process::ExitStatus) -> anyhow::Error {
    // Give the pipe readers a moment to flush the child's last words into its state.
    std::thread::sleep(Duration::from_millis(100));
    let last = p.state.lock().expect("no panics under this lock").last_line.clone();
    anyhow::anyhow!("{} failed ({status}); last log line: {last} (full log: {})", p.name, p.log.display())
}

/// Runs the job and returns its summary; on any failure every child is stopped first.
pub fn run(config: &LaunchConfig) -> anyhow::Result<LaunchSummary> {
    anyhow::ensure!(config.servers > 0 || config.mode == Mode::Local, "--servers must be at least 1");
    anyhow::ensure!(config.workers > 0, "--workers must be at least 1");
    config.job.validate()?;
    // Checked before any process starts: a worker without data would fail only after start-up.
    let files = crate::config::resolve_files(&config.train)?;
    for w in 0..config.workers {
        anyhow::ensure!(
            !crate::data::shard_files(&files, config.workers, w).is_empty(),
            "worker {w} would get no training file: {} holds {} file(s) for {} workers (trainer k reads \
             the files whose numeric suffix % workers == k); split the data into more parts",
            config.train.display(),
            files.len(),
            config.workers
        );
    }
    let started = Instant::now();
    std::fs::create_dir_all(&config.logs).with_context(|| format!("cannot create {}", config.logs.display()))?;
    let job_file = std::path::absolute(config.logs.join("job.toml"))?;
    config.job.to_file(&job_file)?;
    let job_id = format!("oar-{}-{}", std::process::id(), started.elapsed().as_nanos());
    let timeout = config.job.train.timeout_secs.to_string();
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = interrupted.clone();
        // Fails only if a handler is already set (a second launch in one process): keep that one.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    }

    let mut procs: Vec<Proc> = Vec::new();
    let result = (|| -> anyhow::Result<LaunchSummary> {
        let (tx, rx) = mpsc::channel();
        for i in 0..config.servers {
            let mut args: Vec<String> = vec![
                "pserver".into(),
                "--host".into(),
                "127.0.0.1".into(),
                "--port".into(),
                "0".into(),
                "--index".into(),
                i.to_string(),
                "--num-servers".into(),
                config.servers.to_string(),
                "--trainers".into(),
                config.workers.to_string(),
                "--mode".into(),
                config.mode.to_string(),
                "--job".into(),
                job_id.clone(),
                "--timeout".into(),
                timeout.clone(),
                "--lag-ratio".into(),
                config.job.train.lag_ratio.to_string(),
            ];
            if let Some(r) = &config.resume {
                args.extend(["--resume".into(), r.display().to_string()]);
            }
            let log = config.logs.join(format!("server.{i}.log"));
            procs.push(spawn(&config.exe, &format!("server {i}"), &args, log, Some((i, tx.clone())))?);
        }
        let mut addrs = vec![String::new(); config.servers];
        let deadline = Instant::now() + Duration::from_secs(60);
        while addrs.iter().any(|a| a.is_empty()) {
            check_children(&mut procs, &interrupted)?;
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Event::Ready(i, addr)) => addrs[i] = addr,
                Err(_) if Instant::now() > deadline => {
                    let missing: Vec<usize> = (0..config.servers).filter(|&i| addrs[i].is_empty()).collect();
                    anyhow::bail!(
                        "server(s) {missing:?} did not start listening within 60 s (see {})",
                        config.logs.display()
                    );
                }
                Err(_) => {}
            }
        }
        let servers = addrs.join(",");
        let first_worker = procs.len();
        for w in 0..config.workers {
            let mut args: Vec<String> = vec![
                "train".into(),
                "--config".into(),
                job_file.display().to_string(),
                "--mode".into(),
                config.mode.to_string(),
                "--servers".into(),
                servers.clone(),
                "--trainer-id".into(),
                w.to_string(),
                "--trainers".into(),
                config.workers.to_string(),
                "--job".into(),
                job_id.clone(),
                "--train".into(),
                config.train.display().to_string(),
            ];
            if let Some(t) = &config.test {
                args.extend(["--test".into(), t.display().to_string()]);
            }
            if let Some(o) = &config.output {
                args.extend(["--output".into(), o.display().to_string()]);
            }
            if let Some(r) = &config.resume {
                args.extend(["--resume".into(), r.display().to_string()]);
            }
            let log = config.logs.join(format!("worker.{w}.log"));
            procs.push(spawn(&config.exe, &format!("worker {w}"), &args, log, None)?);
        }

        // A resumed job trains only the passes after the saved one.
        let done = crate::checkpoint::passes_done(config.resume.as_deref())?;
        let passes = config.job.train.passes.saturating_sub(done) as u64;
        let total = crate::data::files::total_bytes(&files) * passes;
        let bar =
            if config.progress_bar { indicatif::ProgressBar::new(total) } else { indicatif::ProgressBar::hidden() };
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({eta}) {msg}",
            )
            .expect("the template is valid"),
        );
        let mut workers_done = vec![false; config.workers];
        loop {
            let done = check_children(&mut procs, &interrupted)?;
            for (w, d) in workers_done.iter_mut().enumerate() {
                *d |= done.contains(&(first_worker + w));
            }
            let bytes: u64 =
                procs[first_worker..].iter().map(|p| p.state.lock().expect("no panics under this lock").bytes).sum();
            bar.set_position(bytes.min(total));
            if workers_done.iter().all(|d| *d) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bar.finish_and_clear();
        // Servers stop by themselves once every trainer has closed; give them a moment.
        let deadline = Instant::now() + Duration::from_secs(30);
        while procs[..first_worker].iter_mut().any(|p| matches!(p.child.try_wait(), Ok(None)))
            && Instant::now() < deadline
        {
            check_children(&mut procs, &interrupted)?;
            std::thread::sleep(Duration::from_millis(50));
        }
        summarize(config, &procs[first_worker..], started.elapsed().as_secs_f64())
    })();
    if result.is_err() {
        kill_all(&mut procs);
    } else {
        kill_all(&mut procs[..config.servers]);
    }
    result
}

/// Returns the indices of children that exited successfully; fails (after stopping nothing:
/// the caller stops everyone) when one failed or Ctrl-C was pressed.
fn check_children(procs: &mut [Proc], interrupted: &AtomicBool) -> anyhow::Result<Vec<usize>> {
    if interrupted.load(Ordering::SeqCst) {
        anyhow::bail!("interrupted (Ctrl-C): stopping every server and worker");
    }
    let mut done = Vec::new();
    for (i, p) in procs.iter_mut().enumerate() {
        if let Some(status) = p.child.try_wait().with_context(|| format!("cannot wait for {}", p.name))? {
            if !status.success() {
                return Err(failure(p, status));
            }
            done.push(i);
        }
    }
    Ok(done)
}

fn summarize(config: &LaunchConfig, workers: &[Proc], wall: f64) -> anyhow::Result<LaunchSummary> {
    // The pipe readers may still be draining the last lines of an exited child.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut reports = Vec::new();
    for p in workers {
        let json = loop {
            if let Some(r) = p.state.lock().expect("no panics under this lock").result.clone() {
                break r;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} ended without reporting a result (see {})",
                p.name,
                p.log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        reports.push(
            serde_json::from_str::<TrainReport>(&json)
                .with_context(|| format!("{} reported a malformed result", p.name))?,
        );
    }
    let samples = reports.iter().map(|r| r.samples).sum();
    let loop_rate = reports.iter().map(|r| r.samples as f64 / r.train_seconds.max(1e-9)).sum();
    let test = reports.first().and_then(|r| r.passes.last()).and_then(|p| p.test.clone());
    let summary = LaunchSummary {
        servers: config.servers,
        workers: config.workers,
        samples,
        wall_seconds: wall,
        samples_per_sec: samples as f64 / wall,
        train_loop_samples_per_sec: loop_rate,
        test,
        discarded_pushes: reports.iter().map(|r| r.discarded_pushes).sum(),
        reports,
    };
    let path = config.logs.join("summary.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&summary)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(summary)
}
