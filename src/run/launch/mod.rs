//! `oar launch`: a whole cluster on one machine. Starts N servers and M trainers as child
//! processes of this same binary (configured by flags and a job file, exactly as a person would
//! start them), one log file each, a progress bar, and stops every child on Ctrl-C or as soon as
//! any child fails, naming it and quoting its last log line.
//! Servers bind port 0 and report their address (`OAR_READY`, see [`crate::run::supervise`]), so
//! ports are never guessed.

use std::path::{Path, PathBuf};
use std::process::Command;
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
    /// The `oar` binary to start.
    pub exe: PathBuf,
    /// Show a progress bar.
    pub progress_bar: bool,
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
}

pub use crate::run::supervise::LaunchSummary;

/// Most processes (servers and workers) one `oar launch` starts.
pub const MAX_PROCESSES: usize = 1024;

/// Runs the job and returns its summary; on any failure every child is stopped first.
pub fn run(config: &LaunchConfig) -> anyhow::Result<LaunchSummary> {
    anyhow::ensure!(config.servers > 0 || config.mode == Mode::Local, "--servers must be at least 1");
    anyhow::ensure!(config.workers > 0, "--workers must be at least 1");
    // Every process runs on this machine (or one per host): a typo must not fork thousands.
    anyhow::ensure!(
        config.servers.saturating_add(config.workers) <= MAX_PROCESSES,
        "--servers {} and --workers {}: more than the {MAX_PROCESSES} processes one launch starts",
        config.servers,
        config.workers
    );
    // Never a silent fresh shard: a restarted server needs a checkpoint to go on from.
    anyhow::ensure!(
        config.max_restarts == 0 || (config.checkpoint_every.is_some() && config.output.is_some()),
        "--max-restarts needs --output and --checkpoint-every: a restarted server resumes from its newest \
         checkpoint in OUTPUT/checkpoints, and without one would start from an empty shard"
    );
    // Checked before any process starts: a worker without data would fail only after start-up.
    let online = config.job.online()?;
    let files = match &online {
        Some(o) => o.all_files(),
        None => crate::data::resolve_files(&config.train)?,
    };
    // Dense statistics a scaling job does not give: computed once here, and handed to every
    // child in the job file.
    let filled = match &online {
        None => crate::data::read::transform::fill_stats(&config.job.data, &files, config.job.model.shorthand_shape())?,
        Some(_) => None,
    };
    let job = match filled {
        Some(data) => crate::train::job_config::JobConfig { data, ..config.job.clone() },
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
    let started = Instant::now();
    std::fs::create_dir_all(&config.logs).with_context(|| format!("cannot create {}", config.logs.display()))?;
    let job_file = std::path::absolute(config.logs.join("job.toml"))?;
    job.to_file(&job_file)?;
    // The trainers' curves: beside the saved model (a resumed job goes on with them), else with
    // the logs, where an earlier run's are removed first.
    let metrics_csv = match &config.output {
        Some(o) => std::path::absolute(o.join("metrics.csv"))?,
        None => {
            let file = std::path::absolute(config.logs.join("metrics.csv"))?;
            let _ = std::fs::remove_file(&file);
            file
        }
    };
    let job_id = format!("oar-{}-{}", std::process::id(), started.elapsed().as_nanos());
    let timeout = config.job.train.timeout_secs.to_string();
    let interrupted = interrupt_flag();

    let mut procs: Vec<Proc> = Vec::new();
    let mut keeper = JobKeeper::new(config, &job_id);
    // Every child proves the job's secret to the servers (and they to it): a peer that can
    // reach their ports but has not the secret is served nothing.
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
                "--metrics-addr".into(),
                "127.0.0.1:0".into(),
            ];
            if let Some(r) = &config.resume {
                args.extend(["--resume".into(), r.display().to_string()]);
            }
            if let Some(m) = &config.init_model {
                args.extend(["--init-model".into(), m.display().to_string()]);
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
                // Restarted with the same command line, it works out from disk what it is.
                args.extend(["--trainer-rejoin".into(), RECOVER_SECONDS.to_string(), "--recoverable".into()]);
            }
            let log = config.logs.join(format!("server.{i}.log"));
            procs.push(spawn(keeper.command(&args), &format!("server {i}"), log, Some((i, tx.clone())))?);
            keeper.args.push(args);
        }
        let mut addrs = vec![String::new(); config.servers];
        let deadline = Instant::now() + Duration::from_secs(60);
        while addrs.iter().any(|a| a.is_empty()) {
            check_children(&mut procs, &interrupted, &mut crate::run::supervise::FailFast)?;
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
            // Each trainer holds its own credential, not the job's master secret: it can act
            // for itself only (see `auth`). Its restarts take the same file. (With
            // `shared_secret`, it reads the master from `OAR_SECRET_FILE`, as every child does.)
            if let Some(secret) = keeper.secret.as_ref().filter(|_| !config.shared_secret) {
                let file = credential_file(config, secret, &job_id, w)?;
                args.extend(["--secret-file".into(), file.display().to_string()]);
            }
            if let Some(o) = &config.output {
                args.extend(["--output".into(), o.display().to_string()]);
            }
            args.extend(["--metrics-csv".into(), metrics_csv.display().to_string()]);
            args.extend(["--metrics-addr".into(), "127.0.0.1:0".into()]);
            if let Some(r) = &config.resume {
                args.extend(["--resume".into(), r.display().to_string()]);
            }
            if let Some(m) = &config.init_model {
                args.extend(["--init-model".into(), m.display().to_string()]);
            }
            if config.max_restarts > 0 {
                args.extend(["--recover-timeout".into(), RECOVER_SECONDS.to_string(), "--recoverable".into()]);
                args.extend(["--position-dir".into(), positions_dir(config).display().to_string()]);
            }
            let log = config.logs.join(format!("worker.{w}.log"));
            procs.push(spawn(keeper.command(&args), &format!("worker {w}"), log, None)?);
            keeper.worker_args.push(args);
        }

        // A resumed job trains only the passes after the saved one.
        let done = crate::persist::checkpoint::passes_done(config.resume.as_deref())?;
        // Online, every file is read once; else every pass reads them all.
        let total = match &online {
            Some(o) => {
                let per_pass = crate::data::read::files::total_bytes(&files) / o.passes().max(1) as u64;
                per_pass * o.passes().saturating_sub(done) as u64
            }
            None => crate::data::read::files::total_bytes(&files) * config.job.train.passes.saturating_sub(done) as u64,
        };
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
        let curves = draw_curves(&metrics_csv);
        summarize(
            &procs[..first_worker],
            &procs[first_worker..],
            started.elapsed().as_secs_f64(),
            &config.logs,
            restarts,
            curves,
        )
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

mod keeper;
use keeper::JobKeeper;

/// Trainer `w`'s credential for job `job`, derived from the job's master secret into
/// `LOGS/credentials/trainer-W` (mode 0600; an earlier run's in a reused logs folder replaced).
fn credential_file(
    config: &LaunchConfig,
    master: &crate::security::auth::Secret,
    job: &str,
    w: usize,
) -> anyhow::Result<PathBuf> {
    let dir = std::path::absolute(config.logs.join("credentials"))?;
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = dir.join(format!("trainer-{w}"));
    let _ = std::fs::remove_file(&file);
    master.derive(job, crate::security::auth::Identity::Trainer(w as u64))?.write_new(&file)?;
    Ok(file)
}
