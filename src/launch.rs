//! `oar launch`: a whole cluster on one machine. Starts N servers and M trainers as child
//! processes of this same binary (configured by flags and a job file, exactly as a person would
//! start them), one log file each, a progress bar, and stops every child on Ctrl-C or as soon as
//! any child fails, naming it and quoting its last log line.
//! Servers bind port 0 and report their address (`OAR_READY`, see [`crate::supervise`]), so
//! ports are never guessed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::config::JobConfig;
use crate::server::Mode;
use crate::supervise::{
    check_children, interrupt_flag, kill_all, spawn, summarize, wait_for_servers, wait_for_trainers, Keeper, Proc,
    Ready,
};

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
    /// Servers checkpoint in the background every this many seconds into `output/checkpoints`.
    pub checkpoint_every: Option<f64>,
    /// Servers that die (or hang) are restarted from their latest checkpoint, and trainers that
    /// die from their recorded position, this many times in all; the others wait meanwhile.
    pub max_restarts: usize,
    /// Folder of the log files.
    pub logs: PathBuf,
    /// The `oar` binary to start.
    pub exe: PathBuf,
    /// Show a progress bar.
    pub progress_bar: bool,
    /// Layer types the job may name (children are this same binary, so they have them too).
    pub registry: crate::model::Registry,
    /// Environment given to every child besides this process's own (e.g. `OAR_FAULT` for the
    /// recovery benchmark).
    pub child_env: Vec<(String, String)>,
}

pub use crate::supervise::LaunchSummary;

/// Runs the job and returns its summary; on any failure every child is stopped first.
pub fn run(config: &LaunchConfig) -> anyhow::Result<LaunchSummary> {
    anyhow::ensure!(config.servers > 0 || config.mode == Mode::Local, "--servers must be at least 1");
    anyhow::ensure!(config.workers > 0, "--workers must be at least 1");
    config.job.validate_with(&config.registry)?;
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
    let interrupted = interrupt_flag();

    let mut procs: Vec<Proc> = Vec::new();
    let mut keeper = JobKeeper::new(config, &job_id);
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
            // Trainer 0 saves each pass there: the one folder saves from the network may use.
            if let Some(o) = &config.output {
                args.extend(["--save-root".into(), o.display().to_string()]);
            }
            if let Some(every) = config.checkpoint_every {
                let o = config.output.as_ref().context("--checkpoint-every needs --output")?;
                let dir = o.join("checkpoints").display().to_string();
                args.extend(["--checkpoint-dir".into(), dir, "--checkpoint-every".into(), every.to_string()]);
            }
            if config.max_restarts > 0 {
                args.extend(["--trainer-rejoin".into(), RECOVER_SECONDS.to_string()]);
            }
            let log = config.logs.join(format!("server.{i}.log"));
            procs.push(spawn(keeper.command(&args), &format!("server {i}"), log, Some((i, tx.clone())))?);
            keeper.args.push(args);
        }
        let mut addrs = vec![String::new(); config.servers];
        let deadline = Instant::now() + Duration::from_secs(60);
        while addrs.iter().any(|a| a.is_empty()) {
            check_children(&mut procs, &interrupted, &mut crate::supervise::FailFast)?;
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Ready(i, addr)) => addrs[i] = addr,
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
        keeper.watch(addrs, tx, rx);
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
            if config.max_restarts > 0 {
                args.extend(["--recover-timeout".into(), RECOVER_SECONDS.to_string()]);
                args.extend(["--position-dir".into(), positions_dir(config).display().to_string()]);
            }
            let log = config.logs.join(format!("worker.{w}.log"));
            procs.push(spawn(keeper.command(&args), &format!("worker {w}"), log, None)?);
            keeper.worker_args.push(args);
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
        wait_for_trainers(&mut procs, first_worker, &interrupted, &mut keeper, &bar, |bytes, _| bytes.min(total))?;
        bar.finish_and_clear();
        wait_for_servers(&mut procs, first_worker, &interrupted, &mut keeper)?;
        let restarts = std::mem::take(&mut keeper.restarts);
        summarize(config.servers, &procs[first_worker..], started.elapsed().as_secs_f64(), &config.logs, restarts)
    })();
    keeper.stop();
    if result.is_err() {
        kill_all(&mut procs);
    } else {
        kill_all(&mut procs[..config.servers]);
    }
    result
}

/// A child running this same binary.
fn child(exe: &Path, args: &[String], env: &[(String, String)]) -> Command {
    let mut cmd = Command::new(exe);
    cmd.args(args).envs(env.iter().cloned()).env("OAR_LAUNCHED", "1").stdin(std::process::Stdio::null());
    cmd
}

/// Where trainers record their positions: beside the servers' checkpoints, else with the logs.
fn positions_dir(config: &LaunchConfig) -> PathBuf {
    match &config.output {
        Some(o) => o.join("checkpoints"),
        None => config.logs.join("positions"),
    }
}

/// Seconds trainers wait for a restarted server, and servers for a restarted trainer, before
/// failing.
const RECOVER_SECONDS: u64 = 60;
/// A server that answers no heartbeat for this many probes in a row is taken for hung.
const HEARTBEAT_MISSES: u32 = 3;
/// Time between heartbeats, and the longest wait for each.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// A server's place as the heartbeat sees it.
#[derive(Clone, Default)]
struct Watched {
    addr: String,
    epoch: u64,
    /// Listening (its `OAR_READY` seen since it last started).
    ready: bool,
    /// Heartbeats missed in a row.
    misses: u32,
}

/// Keeps the processes of a launch going: a heartbeat thread probes each server, the keeper
/// kills one that stopped answering (a stopped or hung process), and restarts a server that
/// died from its newest checkpoint under the next epoch, on the same port, while trainers wait;
/// a trainer that died is restarted to go on from its recorded position while servers wait for
/// it to rejoin (up to `--max-restarts` restarts in all).
struct JobKeeper {
    servers: usize,
    max_restarts: usize,
    job: String,
    exe: PathBuf,
    env: Vec<(String, String)>,
    logs: PathBuf,
    checkpoints: Option<PathBuf>,
    /// Each server's command line as first started.
    args: Vec<Vec<String>>,
    /// Each trainer's command line as first started.
    worker_args: Vec<Vec<String>>,
    /// Restarts of each trainer so far.
    worker_lives: Vec<u64>,
    watched: std::sync::Arc<std::sync::Mutex<Vec<Watched>>>,
    ready: Option<(mpsc::Sender<Ready>, mpsc::Receiver<Ready>)>,
    /// Why the keeper killed a server, by index.
    killed: Vec<Option<String>>,
    restarts: Vec<crate::supervise::Restart>,
    started: Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
}

impl JobKeeper {
    fn new(config: &LaunchConfig, job: &str) -> JobKeeper {
        JobKeeper {
            servers: config.servers,
            max_restarts: config.max_restarts,
            job: job.to_string(),
            exe: config.exe.clone(),
            env: config.child_env.clone(),
            logs: config.logs.clone(),
            checkpoints: config.checkpoint_every.and(config.output.as_ref()).map(|o| o.join("checkpoints")),
            args: Vec::new(),
            worker_args: Vec::new(),
            worker_lives: vec![0; config.workers],
            watched: Default::default(),
            ready: None,
            killed: vec![None; config.servers],
            restarts: Vec::new(),
            started: Instant::now(),
            stop: Default::default(),
            heartbeat: None,
        }
    }

    /// A child of this launch running `args`.
    fn command(&self, args: &[String]) -> Command {
        child(&self.exe, args, &self.env)
    }

    /// Starts the heartbeat on the listening servers.
    fn watch(&mut self, addrs: Vec<String>, tx: mpsc::Sender<Ready>, rx: mpsc::Receiver<Ready>) {
        *self.watched.lock().expect("no panics under this lock") =
            addrs.into_iter().map(|addr| Watched { addr, ready: true, ..Watched::default() }).collect();
        self.ready = Some((tx, rx));
        let (watched, stop, job, servers) = (self.watched.clone(), self.stop.clone(), self.job.clone(), self.servers);
        self.heartbeat = std::thread::Builder::new()
            .name("oar-heartbeat".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let places = watched.lock().expect("no panics under this lock").clone();
                    for (i, w) in places.iter().enumerate().filter(|(_, w)| w.ready) {
                        let answered =
                            crate::client::probe(&w.addr, &job, i, servers, w.epoch, HEARTBEAT_TIMEOUT).is_ok();
                        let mut all = watched.lock().expect("no panics under this lock");
                        // Counted only against the process probed (not one restarted meanwhile).
                        if all[i].epoch == w.epoch && all[i].ready {
                            all[i].misses = if answered { 0 } else { all[i].misses + 1 };
                        }
                    }
                    std::thread::sleep(HEARTBEAT_EVERY);
                }
            })
            .ok();
    }

    fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
    }

    /// The restarted server's command line: the first one on the port it had, at the next
    /// epoch, from its newest checkpoint, told which trainers have already closed.
    fn restart_args(&self, i: usize, epoch: u64, procs: &mut [Proc]) -> Vec<String> {
        let addr = self.watched.lock().expect("no panics under this lock")[i].addr.clone();
        let port = addr.rsplit_once(':').map_or("0", |(_, p)| p).to_string();
        let mut args = self.args[i].clone();
        if let Some(at) = args.iter().position(|a| a == "--port") {
            args[at + 1] = port;
        }
        let from_checkpoint = self.checkpoints.as_ref().filter(|d| crate::shard_checkpoints::has_checkpoints(d, i));
        if let Some(dir) = from_checkpoint {
            if let Some(at) = args.iter().position(|a| a == "--resume") {
                args.drain(at..at + 2);
            }
            args.extend(["--resume".into(), dir.display().to_string()]);
        }
        let closed: Vec<String> = procs[self.servers..]
            .iter_mut()
            .enumerate()
            .filter_map(|(w, p)| matches!(p.child.try_wait(), Ok(Some(s)) if s.success()).then(|| w.to_string()))
            .collect();
        if !closed.is_empty() {
            args.extend(["--trainers-closed".into(), closed.join(",")]);
        }
        args.extend(["--epoch".into(), epoch.to_string()]);
        args
    }
}

impl JobKeeper {
    /// Restarts failed trainer `w` (child `i`) to rejoin from its recorded position.
    fn restart_worker(
        &mut self,
        procs: &mut [Proc],
        i: usize,
        w: usize,
        status: std::process::ExitStatus,
    ) -> anyhow::Result<()> {
        self.worker_lives[w] += 1;
        let life = self.worker_lives[w];
        let mut args = self.worker_args[w].clone();
        args.push("--rejoin".into());
        let cause = status.to_string();
        tracing::warn!(worker = w, life, "worker {w} failed ({cause}); restarting it");
        eprintln!("worker {w} failed ({cause}); restarting it to go on from its recorded position");
        let log = self.logs.join(format!("worker.{w}.restart-{life}.log"));
        procs[i] = spawn(self.command(&args), &format!("worker {w} (restart {life})"), log, None)?;
        let from = args.iter().position(|a| a == "--position-dir").map(|at| args[at + 1].clone());
        self.restarts.push(crate::supervise::Restart {
            process: format!("worker {w}"),
            epoch: life,
            at_seconds: self.started.elapsed().as_secs_f64(),
            cause,
            from,
        });
        Ok(())
    }
}

impl Keeper for JobKeeper {
    fn tick(&mut self, procs: &mut [Proc]) -> anyhow::Result<()> {
        if let Some((_, rx)) = &self.ready {
            while let Ok(Ready(i, _)) = rx.try_recv() {
                let mut watched = self.watched.lock().expect("no panics under this lock");
                watched[i].ready = true;
                watched[i].misses = 0;
            }
        }
        let hung: Vec<usize> = {
            let watched = self.watched.lock().expect("no panics under this lock");
            (0..watched.len()).filter(|&i| watched[i].ready && watched[i].misses >= HEARTBEAT_MISSES).collect()
        };
        for i in hung {
            let silent = HEARTBEAT_MISSES as u64 * (HEARTBEAT_EVERY + HEARTBEAT_TIMEOUT).as_secs();
            let why = format!("it answered no heartbeat for about {silent} s (stopped or hung), so it was killed");
            tracing::error!(server = i, "server {i}: {why}");
            self.killed[i] = Some(why);
            self.watched.lock().expect("no panics under this lock")[i].ready = false;
            // SIGKILL ends a stopped process too; its sockets close, so trainers notice at once.
            let _ = procs[i].child.kill();
            let _ = procs[i].child.wait();
        }
        Ok(())
    }

    fn restart(&mut self, procs: &mut [Proc], i: usize, status: std::process::ExitStatus) -> anyhow::Result<bool> {
        if self.restarts.len() >= self.max_restarts || self.ready.is_none() {
            return Ok(false);
        }
        if i >= self.servers {
            let w = i - self.servers;
            if w >= self.worker_args.len() {
                return Ok(false); // failed while the trainers were still being started
            }
            self.restart_worker(procs, i, w, status)?;
            return Ok(true);
        }
        let epoch = self.watched.lock().expect("no panics under this lock")[i].epoch + 1;
        let args = self.restart_args(i, epoch, procs);
        let cause = self.killed[i].take().unwrap_or_else(|| status.to_string());
        let at = self.started.elapsed().as_secs_f64();
        tracing::warn!(server = i, epoch, "server {i} failed ({cause}); restarting it");
        eprintln!("server {i} failed ({cause}); restarting it as epoch {epoch}");
        let log = self.logs.join(format!("server.{i}.epoch-{epoch}.log"));
        let tx = self.ready.as_ref().map(|(tx, _)| tx.clone()).expect("checked above");
        procs[i] = spawn(self.command(&args), &format!("server {i} (epoch {epoch})"), log, Some((i, tx)))?;
        {
            let mut watched = self.watched.lock().expect("no panics under this lock");
            watched[i].epoch = epoch;
            watched[i].ready = false;
            watched[i].misses = 0;
        }
        let from = args.iter().position(|a| a == "--resume").map(|at| args[at + 1].clone());
        self.restarts.push(crate::supervise::Restart {
            process: format!("server {i}"),
            epoch,
            at_seconds: at,
            cause,
            from,
        });
        Ok(true)
    }

    fn cause(&self, i: usize) -> Option<String> {
        self.killed.get(i).cloned().flatten()
    }
}
