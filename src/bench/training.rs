//! The training runs `oar bench` times: the CTR-DNN locally and on 2 servers x 2 workers, and
//! (`--models`) the zoo's table, each model beside the same job on every baseline build.

use std::path::Path;
use std::time::{Duration, Instant};

use super::{median, BenchConfig, ZOO};
use crate::protocol::Mode;

/// One training measurement.
pub(super) struct TrainRun {
    pub(super) name: String,
    /// Samples trained, as the trainers reported them.
    pub(super) samples: u64,
    pub(super) samples_per_sec: f64,
    pub(super) loop_samples_per_sec: f64,
    pub(super) auc: Option<f64>,
    /// Test samples evaluated.
    pub(super) test_samples: u64,
    pub(super) log_loss: f64,
    /// Mean predicted and actual click rate on the test set.
    pub(super) ctr: Option<(f64, f64)>,
    /// Bytes to and from the servers per sample trained (their frames, counted by them).
    pub(super) bytes_per_sample: f64,
}

/// The CTR-DNN of `examples/ctr_dnn_graph.toml`: the default job's model written as a layer
/// graph.
pub fn ctr_dnn_graph() -> crate::train::job_config::JobConfig {
    toml::from_str(include_str!("../../examples/ctr_dnn_graph.toml")).expect("the example job file parses")
}

pub(super) fn train_local(
    data: &Path,
    threads: usize,
    job: crate::train::job_config::JobConfig,
    form: &str,
) -> anyhow::Result<TrainRun> {
    let started = Instant::now();
    let r = crate::train::run(&local_config(data, threads, job)?, &|_, _| {})?;
    let test = r.passes.last().and_then(|p| p.test.as_ref());
    let wall = started.elapsed().as_secs_f64();
    Ok(TrainRun {
        name: format!("local, {threads} thread(s), {form}"),
        samples: r.samples as u64,
        samples_per_sec: r.samples as f64 / wall,
        loop_samples_per_sec: r.samples as f64 / r.train_seconds,
        auc: test.and_then(|t| t.auc),
        test_samples: test.map_or(0, |t| t.samples as u64),
        log_loss: test.map_or(f64::NAN, |t| t.loss),
        ctr: test.and_then(|t| t.ctr),
        bytes_per_sample: 0.0,
    })
}

/// The benchmarks' local training: `job` on `threads` threads, one pass over `data`'s `train/`,
/// tested on its `test/`, nothing saved or logged.
pub(super) fn local_config(
    data: &Path,
    threads: usize,
    job: crate::train::job_config::JobConfig,
) -> anyhow::Result<crate::train::TrainConfig> {
    Ok(crate::train::TrainConfig {
        secret: None,
        tls: None,
        mode: Mode::Local,
        servers: vec![],
        ports_num: 1,
        ports_num_for_sparse: 0,
        trainer_id: 0,
        trainers: 1,
        train_files: crate::data::resolve_files(&data.join("train"))?,
        test_files: crate::data::resolve_files(&data.join("test"))?,
        batch_size: job.train.batch_size,
        passes: 1,
        threads,
        model: job.model,
        data: job.data,
        dense_optimizer: job.dense_optimizer,
        sparse_optimizer: job.sparse_optimizer,
        output: None,
        resume: None,
        init_model: None,
        log_every: 0,
        metrics_addr: None,
        metrics_csv: None,
        metrics_every: 0,
        tensorboard: None,
        job: "bench".into(),
        skip_bad_lines: false,
        nonfinite: Default::default(),
        recover: None,
        positions: None,
        rejoin: false,
        connect_timeout: Duration::from_secs(10),
        reply_timeout: Duration::from_secs(600),
        delay: job.train.delay,
        pull_ahead: job.train.pull_ahead,
        shuffle: job.train.shuffle()?,
        sync_warmup: job.train.sync_warmup,
        scale_stale_steps: job.train.scale_stale_steps,
        sync_dense: false,
        sync_dense_parts: 1,
        sync_dense_ramp: 0,
        geo_k_steps: job.train.geo_k_steps,
        clip_grad_norm: job.train.clip_grad_norm,
        precision: job.train.precision,
        delta_every: None,
        online: None,
    })
}

/// The benchmarks' launched job: 2 servers x 2 workers in `mode` over `data`'s `train/`, tested
/// on its `test/`, logs in `logs`, no output, restarts or TLS; callers change what they measure.
pub(crate) fn two_by_two(mode: Mode, data: &Path, exe: &Path, logs: &Path) -> crate::run::launch::LaunchConfig {
    crate::run::launch::LaunchConfig {
        servers: 2,
        workers: 2,
        mode,
        job: crate::train::job_config::JobConfig::default(),
        train: data.join("train"),
        test: Some(data.join("test")),
        output: None,
        resume: None,
        init_model: None,
        checkpoint_every: None,
        max_restarts: 0,
        logs: logs.to_path_buf(),
        program: crate::base::program::Program::binary(exe),
        progress_bar: false,
        progress_lines: false,
        registry: Default::default(),
        child_env: Vec::new(),
        secret_file: None,
        tls: false,
        open: false,
        shared_secret: false,
        metrics_port_base: None,
    }
}

/// 2 servers x 2 workers in `mode`, as processes.
pub(super) fn train_cluster(
    mode: Mode,
    data: &Path,
    exe: &Path,
    logs: &Path,
    job: crate::train::job_config::JobConfig,
    form: &str,
) -> anyhow::Result<TrainRun> {
    let s = crate::run::launch::run(&crate::run::launch::LaunchConfig { job, ..two_by_two(mode, data, exe, logs) })?;
    Ok(TrainRun {
        name: format!("2 servers x 2 workers, {mode}, {form}"),
        samples: s.samples,
        samples_per_sec: s.samples_per_sec,
        loop_samples_per_sec: s.train_loop_samples_per_sec,
        auc: s.test.as_ref().and_then(|t| t.auc),
        test_samples: s.test.as_ref().map_or(0, |t| t.samples as u64),
        log_loss: s.test.as_ref().map_or(f64::NAN, |t| t.loss),
        ctr: s.test.as_ref().and_then(|t| t.ctr),
        bytes_per_sample: s.server_stats.iter().map(|x| (x.frame_bytes_in + x.frame_bytes_out) as f64).sum::<f64>()
            / s.samples.max(1) as f64,
    })
}

/// Every zoo model (or those `config.only` names) on `data` (a folder with `train/` and
/// `test/`), 1 pass, locally (1 thread) and on 2 servers x 2 workers (async): a markdown table
/// of test AUC, log-loss and samples/s. With baselines, each model's 2 x 2 job also runs on
/// each baseline binary, alternating with this build for `config.rounds` rounds (which goes
/// first alternating too), and the table gives the medians of the end-to-end samples/s and
/// the median of their ratios paired by round; a baseline that cannot run
/// the job file (a layer or setting it predates) shows "-".
pub(super) fn models(data: &Path, config: &BenchConfig) -> anyhow::Result<()> {
    let logs = std::env::temp_dir().join(format!("oar-bench-models-{}", std::process::id()));
    let unknown: Vec<&String> = config.only.iter().filter(|n| !ZOO.iter().any(|(z, _)| z == n)).collect();
    anyhow::ensure!(unknown.is_empty(), "--model {unknown:?}: the zoo has {:?}", ZOO.map(|(n, _)| n));
    let rounds = if config.baselines.is_empty() { 1 } else { config.rounds.max(1) };
    println!("models on {}, 1 pass, batch 512, test set after the pass", data.display());
    let mut head =
        "| model | local AUC | local log-loss | local samples/s | 2x2 AUC | 2x2 log-loss | 2x2 samples/s |".to_string();
    for b in &config.baselines {
        head += &format!(" {} 2x2 samples/s | ratio |", b.display());
    }
    println!("{head}");
    println!("|---|---|---|---|---|---|---|{}", "---|---|".repeat(config.baselines.len()));
    for (name, text) in ZOO.iter().filter(|(n, _)| config.only.is_empty() || config.only.iter().any(|o| o == n)) {
        let job: crate::train::job_config::JobConfig = toml::from_str(text)?;
        let local = train_local(data, 1, job.clone(), name)?;
        let (mut ours, mut theirs) = (Vec::new(), vec![Some(Vec::new()); config.baselines.len()]);
        let mut dist = None;
        for round in 0..rounds {
            // Every other round measures the baselines first: the first job of a round ran
            // about 5% slower, which would otherwise count against this build every time.
            let run_ours = || -> anyhow::Result<()> {
                let run = train_cluster(Mode::Async, data, &config.exe, &logs, job.clone(), name)?;
                ours.push(run.samples_per_sec);
                dist.get_or_insert(run);
                Ok(())
            };
            let run_baselines = || -> anyhow::Result<()> {
                for (b, rates) in config.baselines.iter().zip(&mut theirs) {
                    match (rates.as_mut(), train_cluster(Mode::Async, data, b, &logs, job.clone(), name)) {
                        (Some(r), Ok(run)) => r.push(run.samples_per_sec),
                        (_, Err(e))
                            if crate::run::supervise::interrupt_flag().load(std::sync::atomic::Ordering::SeqCst) =>
                        {
                            return Err(e)
                        }
                        (_, Err(e)) => {
                            tracing::warn!(baseline = %b.display(), model = name, "the baseline cannot run this model: {e:#}");
                            *rates = None;
                        }
                        (None, Ok(_)) => {}
                    }
                }
                Ok(())
            };
            super::in_turn(round % 2 == 1, run_ours, run_baselines)?;
        }
        let dist = dist.expect("at least one round");
        let per_round = ours.clone();
        let ours = median(ours);
        let auc = |r: &TrainRun| r.auc.map_or("-".into(), |a| format!("{a:.4}"));
        let mut line = format!(
            "| {name} | {} | {:.4} | {:.0} | {} | {:.4} | {ours:.0} |",
            auc(&local),
            local.log_loss,
            local.samples_per_sec,
            auc(&dist),
            dist.log_loss,
        );
        for rates in theirs {
            line += &match rates {
                Some(r) => {
                    // Paired by round, so a drift of the machine between rounds cancels.
                    let paired = median(per_round.iter().zip(&r).map(|(a, b)| a / b).collect());
                    format!(" {:.0} | {paired:.2} |", median(r))
                }
                None => " - | - |".into(),
            };
        }
        println!("{line}");
    }
    let _ = std::fs::remove_dir_all(&logs);
    Ok(())
}
