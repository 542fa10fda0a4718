//! `oar launch`: a whole cluster on one machine. Starts N servers and M trainers as child
//! processes of this same binary (configured by flags and a job file, exactly as a person would
//! start them), one log file each, a progress bar, and stops every child on Ctrl-C or as soon as
//! any child fails, naming it and quoting its last log line.
//! Servers bind port 0 and report their address (`OAR_READY`, see [`crate::run::supervise`]), so
//! ports are never guessed.

use std::path::{Path, PathBuf};

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::protocol::Mode;
use crate::run::supervise::{
    check_children, interrupt_flag, kill_all, spawn, summarize, wait_for_servers, wait_for_trainers, Proc, Ready,
};
use crate::train::job_config::JobConfig;

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
    /// Start from this saved model, numbering passes afresh (a warm start).
    pub init_model: Option<PathBuf>,
    /// Servers checkpoint in the background every this many seconds into `output/checkpoints`.
    pub checkpoint_every: Option<f64>,
    /// Servers that die (or hang) are restarted from their latest checkpoint, and trainers that
    /// die from their recorded position, this many times in all; the others wait meanwhile.
    pub max_restarts: usize,
    /// Folder of the log files.
    pub logs: PathBuf,
    /// What the servers and trainers run: the `oar` binary, or `python -m oar`.
    pub program: crate::base::program::Program,
    /// Show a progress bar.
    pub progress_bar: bool,
    /// Print the progress on stdout as `OAR_LAUNCH_PROGRESS <bytes read> <bytes in all>` lines
    /// (at each whole percent), for a program that shows it itself (oar's Python package).
    pub progress_lines: bool,
    /// Layer types the job may name (children are this same binary, so they have them too).
    pub registry: crate::model::Registry,
    /// Environment given to every child besides this process's own (e.g. `OAR_FAULT` for the
    /// recovery benchmark).
    pub child_env: Vec<(String, String)>,
    /// The job's secret; `None`: a new one is generated into `LOGS/secret` for this run.
    pub secret_file: Option<PathBuf>,
    /// TLS between the processes: a certificate authority and a server certificate are made
    /// into `LOGS/tls` for this run and handed to every child.
    pub tls: bool,
    /// No secret at all: the servers take anyone who reaches their ports. Only for the
    /// baseline of `oar bench --security`; `oar launch` has no flag for it.
    pub open: bool,
    /// Every trainer given the job's master secret rather than its own credential (as before
    /// credentials existed). Only for the baseline of `oar bench --security`.
    pub shared_secret: bool,
    /// The metrics ports: server i's at this port + i, trainer w's at this port + servers + w
    /// (`None`: any free port each, as printed in the summary).
    pub metrics_port_base: Option<u16>,
}

pub use crate::run::supervise::LaunchSummary;

/// Most processes (servers and workers) one `oar launch` starts.
pub const MAX_PROCESSES: usize = 1024;

/// Runs the job and returns its summary; on any failure every child is stopped first.
pub fn run(config: &LaunchConfig) -> anyhow::Result<LaunchSummary> {
    check(config)?;
    let plan = Plan::make(config)?;
    let mut launch = Launch::prepare(config, plan)?;
    let result = launch.supervise();
    launch.keeper.stop();
    if result.is_err() {
        kill_all(&mut launch.procs);
    } else {
        kill_all(&mut launch.procs[..config.servers]);
    }
    result
}

/// The counts and settings checked before anything is read or started.
fn check(config: &LaunchConfig) -> anyhow::Result<()> {
    anyhow::ensure!(config.servers > 0 || config.mode == Mode::Local, "--servers must be at least 1");
    anyhow::ensure!(config.workers > 0, "--workers must be at least 1");
    // Every process runs on this machine (or one per host): a typo must not fork thousands.
    anyhow::ensure!(
        config.servers.saturating_add(config.workers) <= MAX_PROCESSES,
        "--servers {} and --workers {}: more than the {MAX_PROCESSES} processes one launch starts",
        config.servers,
        config.workers
    );
    if let Some(base) = config.metrics_port_base {
        let last = base as usize + config.servers + config.workers - 1;
        anyhow::ensure!(
            base > 0 && last <= u16::MAX as usize,
            "--metrics-port-base {base}: {} servers and {} workers need ports {base}..={last}, past 65535",
            config.servers,
            config.workers
        );
    }
    // Refused here, before any child starts, rather than by each trainer as it starts.
    config.job.train.sync_dense(config.mode, config.workers)?;
    config.job.train.sync_dense_parts(config.workers)?;
    // Never a silent fresh shard: a restarted server needs a checkpoint to go on from.
    anyhow::ensure!(
        config.max_restarts == 0 || (config.checkpoint_every.is_some() && config.output.is_some()),
        "--max-restarts needs --output and --checkpoint-every: a restarted server resumes from its newest \
         checkpoint in OUTPUT/checkpoints, and without one would start from an empty shard"
    );
    Ok(())
}

/// What the job reads and the job file every child is given, settled before any child starts.
struct Plan {
    /// The online calendar, when the job trains day by day.
    online: Option<crate::train::online::Online>,
    /// Every training file.
    files: Vec<PathBuf>,
    /// The job, with the dense statistics a scaling job did not give filled in.
    job: JobConfig,
}

impl Plan {
    fn make(config: &LaunchConfig) -> anyhow::Result<Plan> {
        // Checked before any process starts: a worker without data would fail only after start-up.
        let online = config.job.online()?;
        let files = match &online {
            Some(o) => o.all_files(),
            None => crate::data::resolve_files(&config.train)?,
        };
        // Dense statistics a scaling job does not give: computed once here, and handed to every
        // child in the job file.
        let filled = match &online {
            None => {
                crate::data::read::transform::fill_stats(&config.job.data, &files, config.job.model.shorthand_shape())?
            }
            Some(_) => None,
        };
        let job = match filled {
            Some(data) => JobConfig { data, ..config.job.clone() },
            None => config.job.clone(),
        };
        job.validate_with(&config.registry)?;
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
        Ok(Plan { online, files, job })
    }

    /// The bytes the trainers will read: online, every file once; else every pass reads them
    /// all. A resumed job trains only the passes after the saved one.
    fn total_bytes(&self, config: &LaunchConfig) -> anyhow::Result<u64> {
        let done = crate::persist::checkpoint::passes_done(config.resume.as_deref())?;
        let bytes = crate::data::read::files::total_bytes(&self.files);
        Ok(match &self.online {
            Some(o) => bytes / o.passes().max(1) as u64 * o.passes().saturating_sub(done) as u64,
            None => bytes * config.job.train.passes.saturating_sub(done) as u64,
        })
    }
}

/// A launch under way: what every child is told, the children, and their keeper.
struct Launch<'a> {
    config: &'a LaunchConfig,
    plan: Plan,
    started: Instant,
    job_id: String,
    /// The job file every trainer reads, in the logs folder.
    job_file: PathBuf,
    /// The trainers' curves.
    metrics_csv: PathBuf,
    interrupted: std::sync::Arc<std::sync::atomic::AtomicBool>,
    procs: Vec<Proc>,
    keeper: JobKeeper,
}

impl<'a> Launch<'a> {
    /// The logs folder, the job file, the curves' file, the job's secret and TLS files.
    fn prepare(config: &'a LaunchConfig, plan: Plan) -> anyhow::Result<Launch<'a>> {
        let started = Instant::now();
        std::fs::create_dir_all(&config.logs).with_context(|| format!("cannot create {}", config.logs.display()))?;
        let job_file = std::path::absolute(config.logs.join("job.toml"))?;
        plan.job.to_file(&job_file)?;
        // The trainers' curves: beside the saved model (a resumed job goes on with them), else
        // with the logs, where an earlier run's are removed first.
        let metrics_csv = match &config.output {
            Some(o) => std::path::absolute(o.join("metrics.csv"))?,
            None => {
                let file = std::path::absolute(config.logs.join("metrics.csv"))?;
                let _ = std::fs::remove_file(&file);
                file
            }
        };
        let job_id = format!("oar-{}-{}", std::process::id(), started.elapsed().as_nanos());
        let mut keeper = JobKeeper::new(config, &job_id);
        guard(config, &mut keeper)?;
        let interrupted = interrupt_flag();
        Ok(Launch { config, plan, started, job_id, job_file, metrics_csv, interrupted, procs: Vec::new(), keeper })
    }

    /// Starts the servers, then the trainers, waits for them all and sums up.
    fn supervise(&mut self) -> anyhow::Result<LaunchSummary> {
        let (tx, rx) = mpsc::channel();
        for i in 0..self.config.servers {
            let args = children::server_args(self.config, i, &self.job_id)?;
            let log = self.config.logs.join(format!("server.{i}.log"));
            self.procs.push(spawn(self.keeper.command(&args), &format!("server {i}"), log, Some((i, tx.clone())))?);
            self.keeper.args.push(args);
        }
        let addrs = self.listening(&rx)?;
        let servers = addrs.join(",");
        let first_worker = self.procs.len();
        self.keeper.watch(addrs, tx, rx);
        for w in 0..self.config.workers {
            let to = children::Trainer { servers: &servers, job_file: &self.job_file, metrics_csv: &self.metrics_csv };
            let args = children::trainer_args(self.config, w, &self.job_id, &to, self.keeper.secret.as_ref())?;
            let log = self.config.logs.join(format!("worker.{w}.log"));
            self.procs.push(spawn(self.keeper.command(&args), &format!("worker {w}"), log, None)?);
            self.keeper.worker_args.push(args);
        }
        let total = self.plan.total_bytes(self.config)?;
        let bar = progress_bar(self.config.progress_bar, total);
        let shown = std::cell::Cell::new(None);
        let lines = self.config.progress_lines;
        wait_for_trainers(&mut self.procs, first_worker, &self.interrupted, &mut self.keeper, &bar, |bytes, _| {
            let done = bytes.min(total);
            let percent = (done as u128 * 100 / total.max(1) as u128) as u64;
            if lines && shown.replace(Some(percent)) != Some(percent) {
                println!("OAR_LAUNCH_PROGRESS {done} {total}");
            }
            done
        })?;
        if lines && shown.get() != Some(100) {
            println!("OAR_LAUNCH_PROGRESS {total} {total}"); // every trainer has finished its data
        }
        bar.finish_and_clear();
        wait_for_servers(&mut self.procs, first_worker, &self.interrupted, &mut self.keeper)?;
        let restarts = std::mem::take(&mut self.keeper.restarts);
        let curves = draw_curves(&self.metrics_csv);
        let (servers, workers) = self.procs.split_at(first_worker);
        summarize(servers, workers, self.started.elapsed().as_secs_f64(), &self.config.logs, restarts, curves)
    }

    /// Every server's address, as each reports it, within a minute (a child that fails first
    /// fails the launch).
    fn listening(&mut self, rx: &mpsc::Receiver<Ready>) -> anyhow::Result<Vec<String>> {
        let mut addrs = vec![String::new(); self.config.servers];
        let deadline = Instant::now() + Duration::from_secs(60);
        while addrs.iter().any(|a| a.is_empty()) {
            check_children(&mut self.procs, &self.interrupted, &mut crate::run::supervise::FailFast)?;
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(Ready(i, addr)) => addrs[i] = addr,
                Err(_) if Instant::now() > deadline => {
                    let missing: Vec<usize> = (0..self.config.servers).filter(|&i| addrs[i].is_empty()).collect();
                    anyhow::bail!(
                        "server(s) {missing:?} did not start listening within 60 s (see {})",
                        self.config.logs.display()
                    );
                }
                Err(_) => {}
            }
        }
        Ok(addrs)
    }
}

/// The job's guards: every child proves the job's secret to the servers (and they to it), so a
/// peer that can reach their ports but has not the secret is served nothing; with `tls`, a
/// certificate authority and a server certificate made for this run.
fn guard(config: &LaunchConfig, keeper: &mut JobKeeper) -> anyhow::Result<()> {
    let (secret, file) = match &config.secret_file {
        _ if config.open => (None, None),
        Some(file) => (Some(crate::security::auth::Secret::read(file)?), Some(std::path::absolute(file)?)),
        None => {
            let file = std::path::absolute(config.logs.join("secret"))?;
            let _ = std::fs::remove_file(&file); // an earlier run's, in a reused logs folder
            let secret = crate::security::auth::Secret::generate();
            secret.write_new(&file)?;
            (Some(secret), Some(file))
        }
    };
    if let Some(file) = file {
        keeper.env.push(("OAR_SECRET_FILE".into(), file.display().to_string()));
    }
    keeper.secret = secret;
    if config.tls {
        let dir = std::path::absolute(config.logs.join("tls"))?;
        let _ = std::fs::remove_dir_all(&dir); // an earlier run's, in a reused logs folder
        let files = crate::security::tls::generate(&dir, crate::security::tls::DEFAULT_NAME)?;
        for (var, path) in [("OAR_TLS_CERT", &files.cert), ("OAR_TLS_KEY", &files.key), ("OAR_TLS_CA", &files.ca)] {
            keeper.env.push((var.into(), path.display().to_string()));
        }
        keeper.tls = Some(crate::security::tls::client_config(&files.ca, crate::security::tls::DEFAULT_NAME)?);
    }
    Ok(())
}

/// The launch's progress bar over `total` bytes of training data (hidden when not wanted).
fn progress_bar(shown: bool, total: u64) -> indicatif::ProgressBar {
    let bar = if shown { indicatif::ProgressBar::new(total) } else { indicatif::ProgressBar::hidden() };
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {bytes}/{total_bytes} ({eta}) {msg}",
        )
        .expect("the template is valid"),
    );
    bar
}

/// Draws the trainers' curves beside their CSV file (`curves.png`); a failure is logged, not
/// fatal: the job itself went well.
fn draw_curves(csv: &Path) -> Option<PathBuf> {
    let png = csv.with_file_name("curves.png");
    match crate::observe::curves::plot::draw_file(csv, &png) {
        Ok(_) => Some(png),
        Err(e) => {
            tracing::warn!("no curves drawn: {e:#}");
            None
        }
    }
}

mod children;
mod keeper;
use keeper::JobKeeper;
