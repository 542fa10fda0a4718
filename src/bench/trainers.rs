//! `oar bench --quality --many-trainers 16,32,64`: async training at many trainers against local
//! training, with the dense parameters async (every push applied on arrival) and synchronous
//! (`sync_dense`: one merged dense update per step of all trainers, rows async, batches cut so
//! that a merged step covers at most `sync_dense_batch` samples), on the real
//! Criteo sample rotated through folds and on generated sets under several seeds. N trainers get
//! N / 4 servers (1 to 16), as processes of one machine (`oar launch`); every run is paired with
//! the local run of its fold or seed, and the table gives the mean and standard deviation of the
//! paired AUC differences, beside the mean staleness and the samples/s end to end.

use std::path::Path;

use super::quality::{mean_sd, over_data_sets, QualityConfig};
use super::training::train_local;
use crate::protocol::Mode;
use crate::train::job_config::JobConfig;

/// One async run at N trainers.
struct Run {
    auc: f64,
    samples_per_sec: f64,
    staleness: f64,
}

/// One data set (a fold or a seed): the local run's AUC, and per trainer count the async run
/// and the `sync_dense` one.
type DataSet = (f64, Vec<(Run, Run)>);

/// Servers for `trainers` trainers: a server per 4 trainers, 1 to 16.
pub(super) fn servers_for(trainers: usize) -> usize {
    (trainers / 4).clamp(1, 16)
}

/// Async with `trainers` trainers on `data`, the dense parameters synchronous or not.
fn async_run(
    config: &QualityConfig,
    data: &Path,
    logs: &Path,
    job: &JobConfig,
    trainers: usize,
    sync_dense: bool,
) -> anyhow::Result<Run> {
    let mut job = job.clone();
    job.train.sync_dense = Some(sync_dense);
    let launch = crate::run::launch::LaunchConfig {
        servers: servers_for(trainers),
        workers: trainers,
        job,
        ..super::training::two_by_two(Mode::Async, data, &config.exe, logs)
    };
    let s = crate::run::launch::run(&launch)?;
    let run = Run {
        auc: s.test.as_ref().and_then(|t| t.auc).unwrap_or(f64::NAN),
        samples_per_sec: s.samples_per_sec,
        staleness: s.staleness.mean(),
    };
    // The table comes once every run is done (hours at 64 trainers): each run says so as it ends.
    tracing::info!(
        data = %data.display(),
        "{trainers} trainers x {} servers, dense {}: test AUC {:.4}, mean staleness {:.1}, {:.0} samples/s end to end",
        servers_for(trainers),
        if sync_dense { "synchronous" } else { "async" },
        run.auc,
        run.staleness,
        run.samples_per_sec
    );
    Ok(run)
}

/// Every trainer count's pair of runs on one data set (`seed` the model's), beside local.
fn pairs(config: &QualityConfig, data: &Path, logs: &Path, seed: u64) -> anyhow::Result<DataSet> {
    let mut job = JobConfig { train: config.train.clone(), ..JobConfig::default() };
    job.model.seed = seed;
    job.train.log_every = 0;
    job.train.batch_size = config.batch;
    let local = train_local(data, 1, job.clone(), "quality")?.auc.unwrap_or(f64::NAN);
    tracing::info!(data = %data.display(), "local, 1 thread: test AUC {local:.4}");
    let runs = config
        .many_trainers
        .iter()
        .map(|&n| Ok((async_run(config, data, logs, &job, n, false)?, async_run(config, data, logs, &job, n, true)?)));
    Ok((local, runs.collect::<anyhow::Result<_>>()?))
}

/// Runs the comparison and prints one row per data set and trainer count.
pub(super) fn run(config: &QualityConfig) -> anyhow::Result<()> {
    let most = config.many_trainers.iter().copied().max().unwrap_or(1);
    anyhow::ensure!(
        config.many_trainers.iter().all(|&n| (2..=crate::base::layout::MAX_PEERS).contains(&n)),
        "--many-trainers takes 2 to {} trainers",
        crate::base::layout::MAX_PEERS
    );
    let rows = over_data_sets(config, "many", most, |dir, logs, seed| pairs(config, dir, logs, seed))?;
    print_table(config, &rows);
    Ok(())
}

fn print_table(config: &QualityConfig, rows: &[(String, Vec<DataSet>)]) {
    println!(
        "CTR-DNN, 1 pass, batch {} per trainer; async (sync_warmup {}, scale_stale_steps {}) with the dense \
         parameters async or synchronous (sync_dense, each batch cut in steps of at most {} samples over all trainers, \
         half that for the first {} after the warm-up), N trainers and N / 4 servers, against local, paired by fold or \
         seed (mean +- sd)",
        config.batch,
        config.train.sync_warmup,
        config.train.scale_stale_steps,
        crate::train::job_config::TrainSettings { batch_size: config.batch, ..config.train.clone() }.sync_dense_cap(),
        config.train.sync_dense_ramp,
    );
    println!("| data | local AUC | trainers x servers | async - local | sync_dense - local | mean staleness, async / sync_dense | samples/s end to end, async / sync_dense |");
    println!("|---|---|---|---|---|---|---|");
    for (name, sets) in rows {
        let (lm, ls) = mean_sd(&sets.iter().map(|(local, _)| *local).collect::<Vec<_>>());
        for (i, &n) in config.many_trainers.iter().enumerate() {
            let of = |f: &dyn Fn(&(Run, Run)) -> f64| sets.iter().map(|(_, runs)| f(&runs[i])).collect::<Vec<f64>>();
            let gap = |f: &dyn Fn(&(Run, Run)) -> f64| {
                let d: Vec<f64> = sets.iter().map(|(local, runs)| f(&runs[i]) - local).collect();
                let (m, s) = mean_sd(&d);
                format!("{m:+.4} +- {s:.4}")
            };
            let mean = |f: &dyn Fn(&(Run, Run)) -> f64| mean_sd(&of(f)).0;
            println!(
                "| {name} | {lm:.4} +- {ls:.4} | {n} x {} | {} | {} | {:.1} / {:.1} | {:.0} / {:.0} |",
                servers_for(n),
                gap(&|r| r.0.auc),
                gap(&|r| r.1.auc),
                mean(&|r| r.0.staleness),
                mean(&|r| r.1.staleness),
                mean(&|r| r.0.samples_per_sec),
                mean(&|r| r.1.samples_per_sec),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_per_four_trainers_from_one_to_sixteen() {
        let s: Vec<usize> = [2, 4, 8, 16, 32, 64, 100].into_iter().map(super::servers_for).collect();
        assert_eq!(s, [1, 1, 2, 4, 8, 16, 16]);
    }
}
