//! What a process of a job is, from its flags, `OAR_*` and PaddlePaddle's variables and an
//! engine's rank: a server's configuration and listen addresses (`server_config`), whether a
//! `--recoverable` server or trainer is a restart and of what (`recover_server`,
//! `recoverable_trainer`), the server settings of an `oar train` that turns out to be a server,
//! and an engine rank's place through the rendezvous (`engine_rank`, with Slurm's and one
//! host's default rendezvous addresses). Unit-tested.
//!
//! `--recoverable`: an engine that restarts a process (Kubernetes' restart policies, `oar cluster
//! ssh --max-restarts`) can only run the same command line again, so each process works out what
//! it is from the job's checkpoint folder (`OUTPUT/checkpoints`), keyed by `--job`. `oar launch
//! --max-restarts` starts its children the same way, adding only a server's port and epoch, so
//! there is one restart path.
//!
//! - A server that finds its folder claimed by this job (`server-K/fence.json`) is a restart: it
//!   takes the next epoch and resumes from its newest checkpoint if that one is this job's
//!   (`entry.json` names the job; checkpoints of the job that cannot be read are refused unless
//!   `--start-empty`); as every restarted server, it reads `trainers.json` for the trainers that
//!   had closed or ended the pass, and it waits `--recover-timeout` (60 s) for a lost trainer. No
//!   claim of this job: a fresh start.
//! - A trainer that finds `trainer-K.position` of this job rejoins from it (as `--rejoin`), and
//!   waits `--recover-timeout` (60 s) for a lost server.
//! - Once a run has finished (every trainer closed), its servers mark it (`finished.json`) and its
//!   trainers their records, so the same command lines run again are a new run: the finished
//!   run's server folder is moved aside, never resumed. Another `--job` starts afresh in the same
//!   folder.

use std::time::Duration;

use anyhow::Context;

use super::args_job::*;
use crate::base::env::{ClusterEnv, Role};
use crate::data::resolve_files;
use crate::model::Registry;
use crate::protocol::Mode;
use crate::server::ServerConfig;
use crate::train::job_config::JobConfig;
use crate::train::TrainConfig;

/// The IPv4 address of network interface `name`.
pub(super) fn nic_address(name: &str) -> anyhow::Result<String> {
    let all = if_addrs::get_if_addrs().context("cannot list the network interfaces")?;
    if let Some(i) = all.iter().find(|i| i.name == name && i.ip().is_ipv4()) {
        return Ok(i.ip().to_string());
    }
    let mut names: Vec<&str> = all.iter().map(|i| i.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    anyhow::bail!(
        "--nics {name}: no network interface of that name with an IPv4 address (there are: {})",
        names.join(", ")
    )
}

/// A server's configuration and listen addresses from its arguments and the environment.
pub(super) fn server_config(a: PserverArgs, env: &ClusterEnv) -> anyhow::Result<(ServerConfig, Vec<String>)> {
    let host = match (&a.nics, &a.host) {
        (Some(nic), _) => nic_address(nic)?,
        (None, Some(host)) => host.clone(),
        (None, None) => env.host.clone().unwrap_or_else(|| "0.0.0.0".into()),
    };
    let port = a.ports.port.or(env.port).unwrap_or(crate::base::env::DEFAULT_PORT);
    let ports_num = a.ports.ports_num.or(env.ports_num).unwrap_or(1);
    let sparse = a.ports.ports_num_for_sparse.or(env.ports_num_for_sparse).unwrap_or(0);
    let ports = crate::train::ports_per_server(ports_num, sparse)?;
    anyhow::ensure!(
        port != 0 || ports == 1,
        "--port 0 picks one free port; with --ports_num/--ports_num_for_sparse give an explicit --port"
    );
    anyhow::ensure!(port as usize + ports - 1 <= u16::MAX as usize, "--port {port} + {ports} ports goes past 65535");
    let num_servers = a.num_servers.or(env.servers.as_ref().map(Vec::len)).unwrap_or(0);
    let index = a.index.or(env.server_index);
    anyhow::ensure!(
        num_servers > 0 || index.is_none(),
        "--index needs --num-servers (or leave both out: the server then learns them from the trainers)"
    );
    let mut a = a;
    if a.recoverable {
        recover_server(&mut a, index, num_servers)?;
    }
    let config = ServerConfig {
        metrics_addr: a.metrics_addr.clone(),
        index: index.unwrap_or(0),
        num_servers,
        trainers: a.trainers.or(env.trainers).unwrap_or(1),
        mode: a.mode,
        job: a.job,
        max_frame: a.max_frame_mb << 20,
        timeout: super::limits::whole_seconds("timeout", a.timeout)?,
        lag_ratio: a.lag_ratio,
        // A warm start loads as a resume does; a restart's checkpoint (set as resume) wins.
        resume: a.resume.or(a.init_model),
        exit_when_done: !a.keep_serving,
        sparse_ports: sparse,
        save_root: match (a.save_root, &a.save_dir) {
            (Some(root), _) => root,
            // The model's folder, as `final` is `--output`'s for a PSERVER role; "." for a bare name.
            (None, Some(dir)) => match dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                Some(parent) => parent.to_path_buf(),
                None => ".".into(),
            },
            (None, None) => ".".into(),
        },
        save_dir: a.save_dir,
        checkpoints: match a.checkpoint_dir {
            Some(dir) => {
                let every = super::limits::seconds("checkpoint-every", a.checkpoint_every)?;
                anyhow::ensure!(!every.is_zero(), "--checkpoint-every must be a positive number of seconds");
                Some(crate::server::shard_checkpoints::Policy { dir, every, keep: a.checkpoint_keep })
            }
            None => None,
        },
        epoch: a.epoch,
        closed: a.trainers_closed,
        limits: a.limits.limits()?,
        secret: a.secret_file.as_deref().map(crate::security::auth::Secret::read).transpose()?,
        tls: a.tls.server()?,
        rejoin: match a.trainer_rejoin {
            Some(secs) => Some(super::limits::seconds("trainer-rejoin", secs)?),
            None => None,
        },
    };
    config.validate()?;
    let addrs: Vec<String> = (0..ports_num + sparse).map(|k| format!("{host}:{}", port as usize + k)).collect();
    Ok((config, addrs))
}

/// `--recoverable`: what an earlier process of this job left in the checkpoint folder decides
/// the epoch and what to resume from (see [`crate::server::shard_checkpoints::earlier_life`]); the
/// server then reads there where the trainers were.
pub(super) fn recover_server(a: &mut PserverArgs, index: Option<usize>, num_servers: usize) -> anyhow::Result<()> {
    let dir = a
        .checkpoint_dir
        .clone()
        .context("--recoverable goes on from checkpoints: give --checkpoint-dir (or --output, under oar train)")?;
    let index = index
        .filter(|_| num_servers > 0)
        .context("--recoverable needs the server's place to find its checkpoints: give --index and --num-servers")?;
    a.trainer_rejoin = a.trainer_rejoin.or(Some(RECOVER_SECONDS));
    let Some(life) = crate::server::shard_checkpoints::earlier_life(&dir, index, &a.job)? else {
        tracing::info!(dir = %dir.display(), job = %a.job, "no earlier process of this server: starting afresh");
        return Ok(());
    };
    if life.finished {
        // The same job run again after it finished: a new run, never the old one's restart.
        let aside = crate::server::shard_checkpoints::set_aside(&dir, index)
            .with_context(|| format!("moving the finished run's state in {} aside", dir.display()))?;
        tracing::warn!(job = %a.job, aside = %aside.display(), "this job finished here before: a new run starts afresh");
        return Ok(());
    }
    a.epoch = a.epoch.max(life.epoch + 1);
    if life.checkpoint {
        a.resume = Some(dir.clone());
    } else if !life.unreadable.is_empty() {
        let named: Vec<String> = life.unreadable.iter().map(|(p, why)| format!("{} ({why})", p.display())).collect();
        anyhow::ensure!(
            a.start_empty,
            "this restart finds {} checkpoint(s) of job '{}' and can read none of them: {}; it refuses to start \
             with empty tables (give --start-empty to, losing what this server trained)",
            named.len(),
            a.job,
            named.join("; ")
        );
        tracing::warn!(unreadable = ?named, "--start-empty: no checkpoint can be read, starting with empty tables");
    }
    tracing::warn!(
        dir = %dir.display(),
        job = %a.job,
        epoch = a.epoch,
        from = ?a.resume,
        "an earlier process of this server of this job was here: going on from it (another --job starts afresh)"
    );
    Ok(())
}

/// `--recoverable` for a trainer: record the position beside the servers' checkpoints, wait for
/// restarted servers, and rejoin when a record of this trainer of this job is there.
pub(super) fn recoverable_trainer(mut config: TrainConfig) -> anyhow::Result<TrainConfig> {
    let dir = match (&config.positions, &config.output) {
        (Some(dir), _) => dir.clone(),
        (None, Some(output)) => output.join("checkpoints"),
        (None, None) => anyhow::bail!("--recoverable records the trainer's position: give --output or --position-dir"),
    };
    config.recover = config.recover.or(Some(Duration::from_secs_f64(RECOVER_SECONDS)));
    match crate::train::position::Position::read(&dir, config.trainer_id)? {
        Some(p) if p.job == config.job && p.finished => {
            tracing::warn!(job = %p.job, "this trainer finished this job before: a new run starts afresh")
        }
        Some(p) if p.job == config.job => {
            // Checked before connecting: a record this run cannot go on from fails at once.
            p.check_passes(&dir, config.passes)?;
            p.check_order(&dir, &config.order())?;
            config.rejoin = true
        }
        Some(p) => tracing::info!(job = %p.job, "a position record of another job: starting afresh"),
        None => {}
    }
    config.positions = Some(dir);
    Ok(config)
}

/// Seconds a recoverable process waits for a lost peer to be restarted (`--recoverable`).
pub(super) const RECOVER_SECONDS: f64 = 60.0;

/// Seconds between a server's checkpoints when restarts are on and no period was given.
pub(super) const RESTART_CHECKPOINT_SECONDS: f64 = 30.0;

/// The server settings of an `oar train` command line whose process turns out to be a server
/// (a PSERVER role, or a server rank under an engine).
pub(super) fn server_role_args(a: &TrainArgs, job: &JobConfig) -> PserverArgs {
    PserverArgs {
        host: a.server.host.clone(),
        nics: a.server.nics.clone(),
        ports: a.ports.clone(),
        // A server role of `oar train` serves its metrics where the trainer would have.
        metrics_addr: a.metrics_addr.clone(),
        index: None,
        num_servers: None,
        trainers: a.trainers,
        mode: a.mode.filter(|m| *m != Mode::Local).unwrap_or(Mode::Sync),
        job: a.job_id.clone(),
        timeout: job.train.timeout_secs,
        lag_ratio: job.train.lag_ratio,
        resume: a.resume.clone(),
        init_model: a.init_model.clone(),
        keep_serving: a.server.keep_serving,
        // The model's folder: trainers save into it after each pass, servers at the end.
        save_dir: a.output.as_ref().map(|o| o.join("final")),
        save_root: a.output.clone(),
        max_frame_mb: 256,
        checkpoint_dir: (a.recoverable || a.server.checkpoint_every.is_some())
            .then(|| a.output.as_ref().map(|o| o.join("checkpoints")))
            .flatten(),
        checkpoint_every: a.server.checkpoint_every.unwrap_or(30.0),
        checkpoint_keep: 3,
        epoch: 0,
        trainers_closed: Vec::new(),
        // One recovery window for the whole job: a cut link costs each side the other (the
        // server's keepalive gives up on a silent trainer after about a minute), and a trainer
        // that waits for its server to come back must find the server waiting for it too.
        trainer_rejoin: a.recover_timeout,
        recoverable: a.recoverable,
        start_empty: a.server.start_empty,
        limits: a.server.limits.clone(),
        secret_file: a.secret_file.clone(),
        tls: a.tls.clone(),
    }
}

/// The first host of a Slurm node list (`n[1-3,5]` -> `n1`, `a,b` -> `a`).
pub(super) fn first_slurm_host(list: &str) -> Option<String> {
    let list = list.trim();
    let (name, rest) = match list.find(['[', ',']) {
        Some(i) if list.as_bytes()[i] == b'[' => (&list[..i], &list[i + 1..]),
        Some(i) => return Some(list[..i].to_string()).filter(|h| !h.is_empty()),
        None => return Some(list.to_string()).filter(|h| !h.is_empty()),
    };
    let first = rest.split([',', '-', ']']).next()?;
    Some(format!("{name}{first}"))
}

/// Slurm's default rendezvous: the step's first node (where block distribution puts rank 0) and
/// a port from the job id, so two jobs sharing a first node do not collide (as Lightning does).
pub(super) fn slurm_rendezvous(var: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    let nodes = var("SLURM_STEP_NODELIST").or_else(|| var("SLURM_JOB_NODELIST"))?;
    let job: u64 = var("SLURM_JOB_ID").and_then(|j| j.parse().ok()).unwrap_or(0);
    Some(format!("{}:{}", first_slurm_host(&nodes)?, 15_000 + job % 10_000))
}

/// An MPI job whose ranks all run on this host (its local size is its size) meets on loopback,
/// at a port derived from the job, so that `mpirun -n 4 oar train --servers 2` needs no flag:
/// Open MPI's job id, or under MPICH's Hydra, which exports none, the pid of the proxy that
/// starts every local rank (their common parent).
pub(super) fn single_host_rendezvous(var: &dyn Fn(&str) -> Option<String>, parent: u32) -> Option<String> {
    let all_here = |local: &str, size: &str| match (var(local), var(size)) {
        (Some(l), Some(s)) => l.trim() == s.trim(),
        _ => false,
    };
    let job = if all_here("OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE") {
        var("OMPI_MCA_ess_base_jobid").or_else(|| var("PMIX_NAMESPACE"))?
    } else if all_here("MPI_LOCALNRANKS", "PMI_SIZE") {
        format!("hydra-{parent}")
    } else {
        return None;
    };
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let hash = job.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    Some(format!("127.0.0.1:{}", 15_000 + hash % 10_000))
}

/// An engine rank's `--secret-file`: a path naming `{rank}` is this rank's own file (a job
/// script's per-rank files: the master for the server ranks `0..S`, trainer t's credential for
/// rank S+t, made with `oar secret`), so each rank is handed only its own.
fn per_rank(
    file: Option<std::path::PathBuf>,
    var: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<std::path::PathBuf>> {
    let Some(file) = file else { return Ok(None) };
    let text = file.to_string_lossy();
    if !text.contains("{rank}") {
        return Ok(Some(file));
    }
    let rank = crate::run::rendezvous::rank_from(var)?
        .with_context(|| format!("--secret-file {text} names {{rank}}, but no engine rank was found"))?;
    Ok(Some(std::path::PathBuf::from(text.replace("{rank}", &rank.rank.to_string()))))
}

/// Under an engine: registers at the rendezvous. A server rank serves until the trainers are
/// done and returns `None`; a trainer rank returns (servers, its trainer id, trainers).
pub(super) fn engine_rank(
    a: &TrainArgs,
    job: &JobConfig,
    num_servers: usize,
) -> anyhow::Result<Option<(Vec<String>, usize, usize)>> {
    let rank = crate::run::rendezvous::rank_from(&|k| std::env::var(k).ok())?.context(
        "--num-servers makes ranks 0..N-1 servers, but no rank was found: run under mpirun or srun \
         (OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)",
    )?;
    anyhow::ensure!(
        num_servers >= 1 && num_servers < rank.size,
        "--num-servers {num_servers} with {} ranks leaves no trainer (or no server)",
        rank.size
    );
    let var = |k: &str| std::env::var(k).ok();
    let from_slurm = a.rendezvous.is_none() && slurm_rendezvous(&var).is_some();
    let rendezvous = a
        .rendezvous
        .clone()
        .or_else(|| slurm_rendezvous(&var))
        .or_else(|| single_host_rendezvous(&var, std::os::unix::process::parent_id()))
        .context(
            "give --rendezvous HOST:PORT (rank 0's host and a free port there): this engine gives no addresses \
             and its ranks are not all on this host",
        )?;
    let at = rendezvous.clone();
    let hint = move |e: anyhow::Error| {
        if from_slurm {
            e.context(format!(
                "the rendezvous defaults to Slurm's first node, {at}; give --rendezvous HOST:PORT if node names do not resolve"
            ))
        } else {
            e
        }
    };
    let timeout = super::limits::whole_seconds("timeout", job.train.timeout_secs)?;
    let secret = a.secret_file.as_deref().map(crate::security::auth::Secret::read).transpose()?;
    tracing::info!(rank = rank.rank, size = rank.size, source = rank.source, %rendezvous, "joining the job");
    if rank.rank >= num_servers {
        let servers = crate::run::rendezvous::register(
            &rendezvous,
            rank,
            &|_| String::new(),
            timeout,
            secret.as_ref(),
            &a.job_id,
        )
        .map_err(hint)?;
        return Ok(Some((servers, rank.rank - num_servers, rank.size - num_servers)));
    }
    let listener = std::net::TcpListener::bind("0.0.0.0:0").context("cannot listen")?;
    let port = listener.local_addr()?.port();
    let hosting = if rank.rank == 0 {
        let rport = rendezvous
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse::<u16>().ok())
            .with_context(|| format!("--rendezvous {rendezvous}: expected HOST:PORT"))?;
        let l = std::net::TcpListener::bind(("0.0.0.0", rport))
            .with_context(|| format!("rank 0 cannot listen on the rendezvous port {rport}"))?;
        let size = rank.size;
        let (secret, job) = (secret.clone(), a.job_id.clone());
        Some(std::thread::spawn(move || crate::run::rendezvous::host(l, size, num_servers, timeout, secret, &job)))
    } else {
        None
    };
    let own = |ip| format!("{ip}:{port}");
    let servers =
        crate::run::rendezvous::register(&rendezvous, rank, &own, timeout, secret.as_ref(), &a.job_id).map_err(hint)?;
    if let Some(h) = hosting {
        h.join().map_err(|_| anyhow::anyhow!("the rendezvous thread panicked"))??;
    }
    tracing::info!(servers = ?servers, "rendezvous complete");
    let args = PserverArgs {
        index: Some(rank.rank),
        num_servers: Some(num_servers),
        trainers: Some(rank.size - num_servers),
        ..server_role_args(a, job)
    };
    let (config, _) = server_config(args, &ClusterEnv::default())?;
    let stats = crate::server::serve_bound(vec![listener], config)?;
    super::report::log_stopped(&stats);
    super::report::report_stopped(&stats)?;
    Ok(None)
}

/// What an `oar train` process is, from its flags, `OAR_*` and PaddlePaddle's variables and
/// an engine's rank: a server (it serves here and `None` is returned once it is done), or a
/// trainer with this configuration.
pub(super) fn trainer_config(mut a: TrainArgs, registry: &Registry) -> anyhow::Result<Option<TrainConfig>> {
    let env = ClusterEnv::from_process()?;
    // Read before the role is known, under its own name: a server role takes it as its window
    // for lost trainers, where a bad value would be named `--trainer-rejoin`.
    let recover = a.recover_timeout.map(|s| super::limits::seconds("recover-timeout", s)).transpose()?;
    // `--servers S`, a count rather than addresses, means `--num-servers S` (engine ranks).
    if let [count] = a.servers.as_slice() {
        if let (Ok(n), None) = (count.parse::<usize>(), a.num_servers) {
            a.num_servers = Some(n);
            a.servers.clear();
        }
    }
    let (job, rec) = a.job.resolve(registry)?;
    if let Some(rec) = rec {
        // PaddleRec's runner settings, where no flag gave them.
        (a.train, a.test, a.output) =
            (a.train.take().or(rec.train), a.test.take().or(rec.test), a.output.take().or(rec.output));
    }
    if env.role == Some(Role::Pserver) {
        // One command line for both roles, as with PaddlePaddle's Fluid and Fleet launchers.
        return super::jobs::pserver(server_role_args(&a, &job), &env).map(|_| None);
    }
    if a.use_gpu.or(env.use_gpu) == Some(true) {
        anyhow::bail!(
            "use_gpu is true (--use_gpu, OAR_USE_GPU or PADDLE_INIT_USE_GPU), but oar trains on CPUs only: set it to false"
        );
    }
    // Under mpirun/srun with --num-servers: the rendezvous decides the role.
    let (mut engine_servers, mut engine_trainer, mut engine_trainers) = (None, None, None);
    if let (Some(n), true) = (a.num_servers, a.servers.is_empty() && env.servers.is_none()) {
        a.secret_file = per_rank(a.secret_file.take(), &|k| std::env::var(k).ok())?;
        match engine_rank(&a, &job, n)? {
            None => return Ok(None), // a server rank, done serving
            Some((servers, id, trainers)) => {
                (engine_servers, engine_trainer, engine_trainers) = (Some(servers), Some(id), Some(trainers))
            }
        }
    }
    let port = a.ports.port.or(env.port).unwrap_or(crate::base::env::DEFAULT_PORT);
    let servers: Vec<String> = if let Some(list) = engine_servers {
        list
    } else if a.servers.is_empty() {
        env.servers.clone().unwrap_or_default()
    } else {
        a.servers.iter().map(|s| if s.contains(':') { s.clone() } else { format!("{s}:{port}") }).collect()
    };
    let mode = if job.train.is_local {
        Mode::Local
    } else {
        a.mode.unwrap_or(if servers.is_empty() { Mode::Local } else { Mode::Sync })
    };
    let mut threads = job.train.threads;
    if a.job.threads.is_none() {
        threads = env.trainer_count.unwrap_or(threads);
    }
    // Online: the days' files, trained split by split; else passes over --train.
    let online = job.online()?;
    let (train_files, passes) = match &online {
        Some(o) => (o.all_files(), o.passes()),
        None => {
            let train = a.train.clone().context("no training data: give --train (or OAR_TRAIN), or --online")?;
            (resolve_files(&train)?, job.train.passes)
        }
    };
    let test_files = match &a.test {
        Some(t) => resolve_files(t)?,
        None => Vec::new(),
    };
    let timeout = super::limits::whole_seconds("timeout", job.train.timeout_secs)?;
    let trainers = engine_trainers.or(a.trainers).or(env.trainers).unwrap_or(1);
    let config = TrainConfig {
        secret: a.secret_file.as_deref().map(crate::security::auth::Secret::read).transpose()?,
        tls: a.tls.client()?,
        mode,
        servers: if mode == Mode::Local { Vec::new() } else { servers },
        ports_num: a.ports.ports_num.or(env.ports_num).unwrap_or(1),
        ports_num_for_sparse: a.ports.ports_num_for_sparse.or(env.ports_num_for_sparse).unwrap_or(0),
        trainer_id: engine_trainer.or(a.trainer_id).or(env.trainer_id).unwrap_or(0),
        trainers,
        train_files,
        test_files,
        batch_size: job.train.batch_size,
        passes,
        online,
        threads,
        model: job.model.clone(),
        data: job.data.clone(),
        dense_optimizer: job.dense_optimizer,
        sparse_optimizer: job.sparse_optimizer,
        output: a.output.clone(),
        resume: a.resume,
        init_model: a.init_model,
        log_every: job.train.log_every,
        metrics_addr: a.metrics_addr.clone(),
        metrics_csv: a.metrics_csv.clone().or_else(|| a.output.as_ref().map(|o| o.join("metrics.csv"))),
        metrics_every: job.train.metrics_every,
        tensorboard: job.train.tensorboard.clone(),
        job: a.job_id,
        skip_bad_lines: job.train.skip_bad_lines,
        nonfinite: a.server.limits.nonfinite,
        connect_timeout: timeout.min(Duration::from_secs(60)),
        reply_timeout: timeout + Duration::from_secs(30),
        delay: job.train.delay,
        pull_ahead: job.train.pull_ahead,
        shuffle: job.train.shuffle()?,
        sync_warmup: job.train.sync_warmup,
        scale_stale_steps: job.train.scale_stale_steps,
        sync_dense: job.train.sync_dense(mode, trainers)?,
        sync_dense_parts: job.train.sync_dense_parts(trainers)?,
        sync_dense_ramp: job.train.sync_dense_ramp,
        geo_k_steps: job.train.geo_k_steps,
        clip_grad_norm: job.train.clip_grad_norm,
        precision: job.train.precision,
        delta_every: job.train.delta_every,
        recover,
        positions: a.position_dir,
        rejoin: a.rejoin,
    };
    Ok(Some(if a.recoverable { recoverable_trainer(config)? } else { config }))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_secret_file_naming_the_rank_is_each_ranks_own() {
        let slurm =
            |k: &str| (k == "SLURM_PROCID").then(|| "3".to_string()).or((k == "SLURM_NTASKS").then(|| "4".into()));
        let file = |f: &str| Some(std::path::PathBuf::from(f));
        assert_eq!(super::per_rank(file("creds/rank-{rank}"), &slurm).unwrap(), file("creds/rank-3"));
        assert_eq!(super::per_rank(file("secret"), &slurm).unwrap(), file("secret"), "one file for every rank");
        assert_eq!(super::per_rank(None, &slurm).unwrap(), None);
        let e = super::per_rank(file("rank-{rank}"), &|_| None).unwrap_err().to_string();
        assert!(e.contains("names {rank}, but no engine rank was found"), "{e}");
    }

    #[test]
    fn the_first_slurm_host_of_compressed_lists() {
        assert_eq!(super::first_slurm_host("n[1-3,5]").as_deref(), Some("n1"));
        assert_eq!(super::first_slurm_host("node07,node09").as_deref(), Some("node07"));
        assert_eq!(super::first_slurm_host("solo").as_deref(), Some("solo"));
        assert_eq!(super::first_slurm_host("").as_deref(), None);
    }

    #[test]
    fn a_single_host_mpi_job_meets_on_loopback_at_a_port_from_the_job() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let ompi = |jobid: &'static str| {
            let vars: &'static [(&'static str, &'static str)] = match jobid {
                "1" => &[
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_MCA_ess_base_jobid", "1"),
                ],
                _ => &[
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_MCA_ess_base_jobid", "2"),
                ],
            };
            super::single_host_rendezvous(&env(vars), 7).unwrap()
        };
        assert!(ompi("1").starts_with("127.0.0.1:"));
        assert_ne!(ompi("1"), ompi("2"), "two jobs on one host meet apart");
        let spread = env(&[
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_MCA_ess_base_jobid", "1"),
        ]);
        assert_eq!(super::single_host_rendezvous(&spread, 7), None, "ranks on two hosts need --rendezvous");
        let hydra = env(&[("MPI_LOCALNRANKS", "4"), ("PMI_SIZE", "4")]);
        assert_eq!(super::single_host_rendezvous(&hydra, 7), super::single_host_rendezvous(&hydra, 7));
        assert_ne!(super::single_host_rendezvous(&hydra, 7), super::single_host_rendezvous(&hydra, 8));
        assert_eq!(super::single_host_rendezvous(&env(&[]), 7), None);
    }

    #[test]
    fn the_slurm_rendezvous_is_the_first_node_and_a_port_from_the_job_id() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| vars.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let step =
            env(&[("SLURM_STEP_NODELIST", "gpu[07-09]"), ("SLURM_JOB_NODELIST", "x"), ("SLURM_JOB_ID", "123456")]);
        assert_eq!(super::slurm_rendezvous(&step).as_deref(), Some("gpu07:18456"));
        let job = env(&[("SLURM_JOB_NODELIST", "a,b")]);
        assert_eq!(super::slurm_rendezvous(&job).as_deref(), Some("a:15000"));
        assert_eq!(super::slurm_rendezvous(&env(&[])), None);
    }
}
