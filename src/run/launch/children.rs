//! The command lines `oar launch` starts its children with: a server's and a trainer's flags,
//! each trainer's credential file, and where trainers record their positions.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use super::LaunchConfig;

/// Server `i`'s command line.
pub(super) fn server_args(config: &LaunchConfig, i: usize, job_id: &str) -> anyhow::Result<Vec<String>> {
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
        job_id.to_string(),
        "--timeout".into(),
        config.job.train.timeout_secs.to_string(),
        "--lag-ratio".into(),
        config.job.train.lag_ratio.to_string(),
        "--metrics-addr".into(),
        metrics_addr(config, i),
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
    Ok(args)
}

/// The metrics address of the launch's process `k` (servers first, then trainers).
fn metrics_addr(config: &LaunchConfig, k: usize) -> String {
    match config.metrics_port_base {
        Some(base) => format!("127.0.0.1:{}", base as usize + k),
        None => "127.0.0.1:0".into(),
    }
}

/// What a trainer is told besides the launch's settings.
pub(super) struct Trainer<'a> {
    /// The servers' addresses, comma-separated.
    pub(super) servers: &'a str,
    /// The job file.
    pub(super) job_file: &'a Path,
    /// The curves' file every trainer appends to.
    pub(super) metrics_csv: &'a Path,
}

/// Trainer `w`'s command line; with the job's `master` secret, its own credential made for it.
pub(super) fn trainer_args(
    config: &LaunchConfig,
    w: usize,
    job_id: &str,
    to: &Trainer,
    master: Option<&crate::security::auth::Secret>,
) -> anyhow::Result<Vec<String>> {
    let mut args: Vec<String> = vec![
        "train".into(),
        "--config".into(),
        to.job_file.display().to_string(),
        "--mode".into(),
        config.mode.to_string(),
        "--servers".into(),
        to.servers.to_string(),
        "--trainer-id".into(),
        w.to_string(),
        "--trainers".into(),
        config.workers.to_string(),
        "--job".into(),
        job_id.to_string(),
        "--train".into(),
        config.train.display().to_string(),
    ];
    if let Some(t) = &config.test {
        args.extend(["--test".into(), t.display().to_string()]);
    }
    // Each trainer holds its own credential, not the job's master secret: it can act
    // for itself only (see `auth`). Its restarts take the same file. (With
    // `shared_secret`, it reads the master from `OAR_SECRET_FILE`, as every child does.)
    if let Some(secret) = master.filter(|_| !config.shared_secret) {
        let file = credential_file(config, secret, job_id, w)?;
        args.extend(["--secret-file".into(), file.display().to_string()]);
    }
    if let Some(o) = &config.output {
        args.extend(["--output".into(), o.display().to_string()]);
    }
    args.extend(["--metrics-csv".into(), to.metrics_csv.display().to_string()]);
    args.extend(["--metrics-addr".into(), metrics_addr(config, config.servers + w)]);
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
    Ok(args)
}

/// Where trainers record their positions: beside the servers' checkpoints, else with the logs.
pub(super) fn positions_dir(config: &LaunchConfig) -> PathBuf {
    match &config.output {
        Some(o) => o.join("checkpoints"),
        None => config.logs.join("positions"),
    }
}

/// Seconds trainers wait for a restarted server, and servers for a restarted trainer, before
/// failing.
pub(super) const RECOVER_SECONDS: u64 = 60;

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

/// A child running `program` (this same binary, or `python -m oar`).
pub(super) fn child(program: &crate::base::program::Program, args: &[String], env: &[(String, String)]) -> Command {
    let mut cmd = program.command();
    cmd.args(args).envs(env.iter().cloned()).env("OAR_LAUNCHED", "1").stdin(std::process::Stdio::null());
    cmd
}
