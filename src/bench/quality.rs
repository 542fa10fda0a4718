//! `oar bench --quality`: does distributed training learn as well as local training, at every
//! data size? Local (1 thread), sync, async and GEO 2 servers x 2 workers (real processes, as
//! `oar launch`) train the CTR-DNN on the same data: the real Criteo sample rotated through
//! folds, and generated sets of the given sizes under several seeds. Each distributed run is
//! paired with the local run on the same fold or seed, and the table gives the mean and the
//! standard deviation of the paired AUC differences, so the gap is read beside its spread.
//!
//! Samples per update match: local, async and GEO take `batch` samples per step; sync trainers
//! take `batch / 2` each, merged into one update of `batch`. GEO exchanges every
//! `geo_k_steps` steps (the training settings'); the bytes per sample that crossed the network
//! to and from the servers are given for async and GEO.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::training::{train_cluster, train_local, TrainRun};
use crate::protocol::Mode;
use crate::train::job_config::JobConfig;

/// What `oar bench --quality` runs.
#[derive(Clone, Debug)]
pub struct QualityConfig {
    /// The real Criteo sample (a TSV file), rotated through `folds` folds; skipped if absent.
    pub real: Option<PathBuf>,
    /// Folds of the real sample (each the test set once, the rest the training set).
    pub folds: usize,
    /// Generated data set sizes (training lines; the test set is a tenth of it).
    pub sizes: Vec<u64>,
    /// Seeds per generated size (data and model initialization).
    pub seeds: u64,
    /// Samples per update.
    pub batch: usize,
    /// Training settings of every run (batch size and log interval are set here).
    pub train: crate::train::job_config::TrainSettings,
    /// The `oar` binary, for the launched clusters.
    pub exe: PathBuf,
    /// Instead of the 2x2 table: async at these trainer counts, the dense parameters async
    /// and synchronous (`sync_dense`), against local ([`super::trainers`]).
    pub many_trainers: Vec<usize>,
    /// Instead of the 2x2 table: bf16 products against f32, local and async 2x2
    /// ([`super::precision`]).
    pub bf16: bool,
}

/// One pairing of local, sync, async and GEO runs.
struct Trio {
    local: TrainRun,
    sync: TrainRun,
    async_: TrainRun,
    geo: TrainRun,
}

/// Mean and sample standard deviation.
pub(super) fn mean_sd(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = if v.len() > 1 { v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

fn trio(config: &QualityConfig, data: &Path, logs: &Path, seed: u64) -> anyhow::Result<Trio> {
    let (exe, batch) = (&config.exe, config.batch);
    let mut job = JobConfig { train: config.train.clone(), ..JobConfig::default() };
    job.model.seed = seed;
    job.train.log_every = 0;
    job.train.batch_size = batch;
    let local = train_local(data, 1, job.clone(), "quality")?;
    let async_ = train_cluster(Mode::Async, data, exe, logs, job.clone(), "quality")?;
    let geo = train_cluster(Mode::Geo, data, exe, logs, job.clone(), "quality")?;
    job.train.batch_size = batch / 2;
    let sync = train_cluster(Mode::Sync, data, exe, logs, job, "quality")?;
    Ok(Trio { local, sync, async_, geo })
}

/// Writes fold `k` of `lines` as `dir/train/part-*` (the other folds, in `parts` files) and
/// `dir/test/part-00000`.
fn write_fold(lines: &[&str], folds: usize, k: usize, parts: usize, dir: &Path) -> anyhow::Result<()> {
    let (start, end) = (k * lines.len() / folds, (k + 1) * lines.len() / folds);
    let train: Vec<&str> = lines[..start].iter().chain(&lines[end..]).copied().collect();
    for sub in ["train", "test"] {
        std::fs::create_dir_all(dir.join(sub))?;
    }
    let write = |path: PathBuf, part: &[&str]| -> anyhow::Result<()> {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
        part.iter().try_for_each(|l| writeln!(f, "{l}"))?;
        Ok(())
    };
    for p in 0..parts {
        let part = &train[p * train.len() / parts..(p + 1) * train.len() / parts];
        write(dir.join(format!("train/part-{p:05}")), part)?;
    }
    write(dir.join("test/part-00000"), &lines[start..end])
}

/// Runs `measure(data, logs, seed)` on every data set `config` names, each written into a
/// temporary folder (`parts` training files) and removed after: the real sample's folds (the
/// seed is the fold's number from 1) and each generated size under each seed. Returns the
/// measurements by data set, each named for the table.
pub(super) fn over_data_sets<T>(
    config: &QualityConfig,
    name: &str,
    parts: usize,
    mut measure: impl FnMut(&Path, &Path, u64) -> anyhow::Result<T>,
) -> anyhow::Result<Vec<(String, Vec<T>)>> {
    let tmp = std::env::temp_dir().join(format!("oar-{name}-{}", std::process::id()));
    let logs = tmp.join("logs");
    let mut rows = Vec::new();
    if let Some(real) = config.real.as_deref().filter(|p| p.is_file()) {
        let text = std::fs::read_to_string(real)?;
        let lines: Vec<&str> = text.lines().collect();
        let mut runs = Vec::new();
        for k in 0..config.folds {
            let dir = tmp.join(format!("fold-{k}"));
            write_fold(&lines, config.folds, k, parts, &dir)?;
            runs.push(measure(&dir, &logs, k as u64 + 1)?);
            let _ = std::fs::remove_dir_all(&dir);
        }
        // Named by its file: --real takes any lines of the format, generated ones too.
        let name = real.file_name().map_or_else(|| real.display().to_string(), |n| n.to_string_lossy().into_owned());
        rows.push((format!("{name}, {} lines, {} folds", lines.len(), config.folds), runs));
    }
    for &size in config.sizes.iter().filter(|&&s| s > 0) {
        let mut runs = Vec::new();
        for seed in 1..=config.seeds {
            let dir = tmp.join(format!("gen-{size}-{seed}"));
            crate::data::gen::generate(&crate::data::gen::GenConfig {
                lines: size,
                test_lines: (size / 10).max(1000),
                seed,
                parts,
                out: dir.clone(),
            })?;
            runs.push(measure(&dir, &logs, seed)?);
            let _ = std::fs::remove_dir_all(&dir);
        }
        rows.push((format!("generated, {size} lines, {} seeds", config.seeds), runs));
    }
    let _ = std::fs::remove_dir_all(&tmp);
    Ok(rows)
}

/// Runs the comparison and prints one row per data set.
pub fn run(config: &QualityConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.batch >= 2 && config.folds >= 2 && config.seeds >= 1,
        "--quality needs batch >= 2, folds >= 2, seeds >= 1"
    );
    // Local training here is one pass: a job file's other pass count would reach only the
    // launched runs, and their differences would compare unlike runs.
    let passes = config.train.passes;
    anyhow::ensure!(passes == 1, "--quality compares one pass, but the --config job file sets passes = {passes}");
    if !config.many_trainers.is_empty() {
        return super::trainers::run(config);
    }
    if config.bf16 {
        return super::precision::run(config);
    }
    let rows = over_data_sets(config, "quality", 2, |dir, logs, seed| trio(config, dir, logs, seed))?;
    println!(
        "CTR-DNN, 1 pass, {} samples per update; async: pull_ahead {}, sync_warmup {}, scale_stale_steps {}; geo: geo_k_steps {}; sync, async and geo 2x2 against local, paired by fold or seed (mean +- sd)",
        config.batch,
        config.train.pull_ahead,
        config.train.sync_warmup,
        config.train.scale_stale_steps,
        config.train.geo_k_steps
    );
    println!(
        "| data | local AUC | sync - local | async - local | async predicted / actual CTR | async log-loss - local | geo - local | geo predicted / actual CTR | geo log-loss - local | bytes per sample, async / geo |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, trios) in &rows {
        let auc = |r: &TrainRun| r.auc.unwrap_or(f64::NAN);
        let local: Vec<f64> = trios.iter().map(|t| auc(&t.local)).collect();
        let sync: Vec<f64> = trios.iter().map(|t| auc(&t.sync) - auc(&t.local)).collect();
        let asy: Vec<f64> = trios.iter().map(|t| auc(&t.async_) - auc(&t.local)).collect();
        let ctr: Vec<f64> = trios.iter().filter_map(|t| t.async_.ctr.map(|(p, a)| p / a)).collect();
        let ll: Vec<f64> = trios.iter().map(|t| t.async_.log_loss - t.local.log_loss).collect();
        let geo: Vec<f64> = trios.iter().map(|t| auc(&t.geo) - auc(&t.local)).collect();
        let geo_ctr: Vec<f64> = trios.iter().filter_map(|t| t.geo.ctr.map(|(p, a)| p / a)).collect();
        let geo_ll: Vec<f64> = trios.iter().map(|t| t.geo.log_loss - t.local.log_loss).collect();
        let bytes =
            |r: fn(&Trio) -> &TrainRun| mean_sd(&trios.iter().map(|t| r(t).bytes_per_sample).collect::<Vec<_>>()).0;
        let f = |v: &[f64], d: usize| {
            let (m, s) = mean_sd(v);
            format!("{m:+.d$} +- {s:.d$}")
        };
        let (lm, ls) = mean_sd(&local);
        println!(
            "| {name} | {lm:.4} +- {ls:.4} | {} | {} | {} | {} | {} | {} | {} | {:.0} / {:.0} |",
            f(&sync, 4),
            f(&asy, 4),
            f(&ctr, 3).trim_start_matches('+'),
            f(&ll, 4),
            f(&geo, 4),
            f(&geo_ctr, 3).trim_start_matches('+'),
            f(&geo_ll, 4),
            bytes(|t| &t.async_),
            bytes(|t| &t.geo)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_file_of_another_pass_count_is_refused_before_any_run() {
        let train = crate::train::job_config::TrainSettings { passes: 2, ..Default::default() };
        let config = QualityConfig {
            real: None,
            folds: 2,
            sizes: vec![1000],
            seeds: 1,
            batch: 512,
            train,
            exe: "/nonexistent/oar".into(),
            many_trainers: vec![16],
            bf16: false,
        };
        let err = run(&config).unwrap_err().to_string();
        assert!(err.contains("compares one pass, but the --config job file sets passes = 2"), "{err}");
    }
}
