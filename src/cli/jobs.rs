//! The commands that run a job's processes: `pserver`, `train`, `launch`, `cluster ssh`,
//! `cluster k8s`, and `shrink`, which talks to a running job's servers.

use std::time::{Duration, Instant};

use anyhow::Context;

use super::args::*;
use super::args_job::*;
use super::report::*;
use super::roles::*;
use crate::base::env::ClusterEnv;
use crate::model::Registry;

/// Runs a parameter server: flags, then `OAR_*`, then PaddlePaddle's variables, then defaults.
pub(super) fn pserver(a: PserverArgs, env: &ClusterEnv) -> anyhow::Result<()> {
    let (config, addrs) = server_config(a, env)?;
    let stats = crate::server::serve_blocking(&addrs, config)?;
    log_stopped(&stats);
    report_stopped(&stats)
}

/// `oar train`: one trainer (or, by Paddle's variables, a server), printing its report.
pub(super) fn train(a: TrainArgs, launched: bool, registry: &Registry) -> anyhow::Result<()> {
    // A server by Paddle's variables: it has served.
    let Some(config) = trainer_config(a, registry)? else { return Ok(()) };
    // Checked before the files are dealt by trainer (0 trainers divided by zero there).
    config.validate()?;
    let mine = crate::data::shard_files(&config.train_files, config.trainers, config.trainer_id);
    // A resumed job trains only the passes after the saved one.
    let passes =
        config.passes.saturating_sub(crate::persist::checkpoint::passes_done(config.resume.as_deref())?) as u64;
    let total = crate::data::read::files::total_bytes(&mine) * passes;
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
        if report.discarded_pushes > 0 {
            println!("{} step(s) not applied: stale, or non-finite under --nonfinite skip", report.discarded_pushes);
        }
        if report.bad_lines > 0 {
            println!("{} bad line(s) skipped (--skip-bad-lines)", report.bad_lines);
        }
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
        super::report::print_days(&report.days);
    }
    Ok(())
}

/// `oar cluster ssh`: the job on the hosts of a hosts file, over ssh.
pub(super) fn cluster_ssh(a: SshArgs) -> anyhow::Result<()> {
    if a.dispatch {
        super::this_binary("oar cluster ssh --dispatch")?;
    }
    let bytes = crate::base::state_file::read_named(&a.hosts, crate::train::job_config::MAX_JOB_FILE_BYTES)
        .map_err(|e| anyhow::anyhow!("hosts file {}: {}", a.hosts.display(), e.reason()))?;
    let text = String::from_utf8(bytes).with_context(|| format!("hosts file {}: not UTF-8 text", a.hosts.display()))?;
    let config = crate::run::cluster::ssh::SshConfig {
        hosts: crate::run::cluster::ssh::parse_hosts(&text, &a.hosts)?,
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
    let s = crate::run::cluster::ssh::run(&config)?;
    print_summary(&format!("oar cluster ssh on {} hosts", config.hosts.len()), &s);
    println!(
        "logs on each host under {}/log; local copies and summary.json in {}",
        config.remote_workspace.clone().unwrap_or_else(|| config.workspace.display().to_string()),
        config.logs.display()
    );
    Ok(())
}

/// `oar cluster k8s`: the manifests of the job, printed.
pub(super) fn cluster_k8s(a: K8sArgs) -> anyhow::Result<()> {
    let config = crate::run::cluster::k8s::K8sConfig {
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
        secret: Some(crate::security::auth::Secret::generate()),
    };
    print!("{}", crate::run::cluster::k8s::render(&config)?);
    Ok(())
}

/// `oar launch`: servers and trainers as children on this machine.
pub(super) fn launch(mut a: LaunchArgs, registry: &Registry) -> anyhow::Result<()> {
    let (job, rec) = a.job.resolve(registry)?;
    let mut mode = a.mode;
    if let Some(rec) = rec {
        // PaddleRec's runner settings, where no flag gave them.
        (a.train, a.test, a.output) = (a.train.or(rec.train), a.test.or(rec.test), a.output.or(rec.output));
        mode = mode.or(rec.mode);
    }
    let train = match (a.train, &job.train.online) {
        (Some(t), None) => t,
        (None, Some(online)) => online.clone(),
        (Some(_), Some(_)) => anyhow::bail!("--train and --online both name the training data: give one"),
        (None, None) => anyhow::bail!("no training data: give --train, or --online DIR --days FROM..TO"),
    };
    // Checked here, so a bad period is one line, not every server failing at start.
    if let Some(every) = a.checkpoint_every {
        anyhow::ensure!(
            !super::limits::seconds("checkpoint-every", every)?.is_zero(),
            "--checkpoint-every must be above 0"
        );
    }
    let config = crate::run::launch::LaunchConfig {
        servers: a.servers,
        workers: a.workers,
        mode: mode.unwrap_or(crate::protocol::Mode::Async),
        job,
        train,
        test: a.test,
        output: a.output,
        resume: a.resume,
        init_model: a.init_model,
        // A restarted server resumes from its newest checkpoint: restarts turn them on.
        checkpoint_every: a.checkpoint_every.or((a.max_restarts > 0).then_some(RESTART_CHECKPOINT_SECONDS)),
        max_restarts: a.max_restarts,
        logs: a.logs,
        program: super::this_program()?,
        progress_bar: !a.no_progress,
        progress_lines: a.progress_lines,
        registry: registry.clone(),
        child_env: Vec::new(),
        secret_file: a.secret_file,
        tls: a.tls,
        open: false,
        shared_secret: false,
        metrics_port_base: a.metrics_port_base,
    };
    let s = crate::run::launch::run(&config)?;
    print_summary(&format!("oar launch ({})", config.mode), &s);
    println!("logs and summary.json in {}", config.logs.display());
    Ok(())
}

/// `oar shrink`: every server of a running job shrinks its tables.
pub(super) fn shrink(a: ShrinkArgs) -> anyhow::Result<()> {
    let timeout = super::limits::whole_seconds("timeout", a.timeout.max(1))?;
    let config = crate::client::ClientConfig {
        secret: a.secret_file.as_deref().map(crate::security::auth::Secret::read).transpose()?,
        tls: a.tls.client()?,
        ..crate::client::ClientConfig::new(a.servers, &a.job_id, timeout, timeout)
    };
    let shrunk = crate::client::Client::connect(&config)?.shrink(a.days)?;
    for (server, s) in shrunk.iter().enumerate() {
        println!("server {server}: deleted {:?} rows, {:?} left (per table)", s.deleted, s.rows);
    }
    println!("OAR_RESULT {}", serde_json::to_string(&shrunk)?);
    Ok(())
}
