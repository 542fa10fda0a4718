//! `oar bench --quality --bf16`: does training with bf16 products learn as well as f32, and is
//! it faster? The CTR-DNN trains locally (one thread) and on 2 servers x 2 async workers (real
//! processes, as `oar launch`) in f32 and in bf16 (`precision = "bf16"`), one after the other
//! on the same data: the real Criteo sample's folds and generated sets under several seeds
//! (as `--quality` rotates them). The table gives the paired test-AUC and log-loss
//! differences (mean and standard deviation) and the median of the paired samples/s ratios.

use std::path::Path;

use super::quality::{mean_sd, over_data_sets, QualityConfig};
use super::training::{train_cluster, train_local, TrainRun};
use crate::nn::Precision;
use crate::protocol::Mode;
use crate::train::job_config::JobConfig;

/// One data set's runs: local and async 2x2, each in f32 and bf16.
struct Pair {
    local: [TrainRun; 2],
    async_: [TrainRun; 2],
}

fn pair(config: &QualityConfig, data: &Path, logs: &Path, seed: u64) -> anyhow::Result<Pair> {
    let job = |precision| {
        let mut job = JobConfig { train: config.train.clone(), ..JobConfig::default() };
        job.model.seed = seed;
        job.train.log_every = 0;
        job.train.batch_size = config.batch;
        job.train.precision = precision;
        job
    };
    let local = |p| train_local(data, 1, job(p), "precision");
    let async_ = |p| train_cluster(Mode::Async, data, &config.exe, logs, job(p), "precision");
    let local = [local(Precision::F32)?, local(Precision::Bf16)?];
    let async_ = [async_(Precision::F32)?, async_(Precision::Bf16)?];
    Ok(Pair { local, async_ })
}

/// Runs the comparison and prints one row per data set; refuses on a CPU without bf16
/// products, where both runs would be f32.
pub fn run(config: &QualityConfig) -> anyhow::Result<()> {
    Precision::Bf16.check_cpu().map_err(anyhow::Error::msg)?;
    let rows = over_data_sets(config, "precision", 2, |dir, logs, seed| pair(config, dir, logs, seed))?;
    println!(
        "CTR-DNN, 1 pass, {} samples per update: bf16 products against f32, local (1 thread) and async 2x2, paired by fold or seed (mean +- sd; speed: median of the pairs' ratios)",
        config.batch
    );
    println!(
        "| data | local f32 AUC | local bf16 - f32 AUC | local bf16 - f32 log-loss | async bf16 - f32 AUC | async bf16 - f32 log-loss | local bf16 / f32 samples/s | async bf16 / f32 samples/s |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, pairs) in &rows {
        let auc = |r: &TrainRun| r.auc.unwrap_or(f64::NAN);
        let diff = |runs: fn(&Pair) -> &[TrainRun; 2], of: &dyn Fn(&TrainRun) -> f64| {
            let v: Vec<f64> = pairs.iter().map(|p| of(&runs(p)[1]) - of(&runs(p)[0])).collect();
            let (m, s) = mean_sd(&v);
            format!("{m:+.4} +- {s:.4}")
        };
        let speed = |runs: fn(&Pair) -> &[TrainRun; 2]| {
            super::median(pairs.iter().map(|p| runs(p)[1].samples_per_sec / runs(p)[0].samples_per_sec).collect())
        };
        let (lm, ls) = mean_sd(&pairs.iter().map(|p| auc(&p.local[0])).collect::<Vec<_>>());
        println!(
            "| {name} | {lm:.4} +- {ls:.4} | {} | {} | {} | {} | {:.2} | {:.2} |",
            diff(|p| &p.local, &auc),
            diff(|p| &p.local, &|r| r.log_loss),
            diff(|p| &p.async_, &auc),
            diff(|p| &p.async_, &|r| r.log_loss),
            speed(|p| &p.local),
            speed(|p| &p.async_)
        );
    }
    Ok(())
}
