//! The measuring and tool commands: `bench`, `plot` and `tls`.

use anyhow::Context;

use super::args::*;
use super::args_bench::BenchArgs;
use crate::train::job_config::JobConfig;

/// `oar bench`: throughput beside its baselines, or (`--quality`, `--recovery`, `--security`,
/// `--hosts`, `--roofline`, `--paddle`) one of the other measurements.
pub(super) fn bench(a: BenchArgs) -> anyhow::Result<()> {
    super::limits::seconds("seconds", a.seconds)?;
    super::limits::seconds("checkpoint-every", a.checkpoint_every)?;
    if a.quality {
        return crate::bench::quality::run(&crate::bench::quality::QualityConfig {
            real: a.real,
            folds: a.folds,
            sizes: a.sizes,
            seeds: a.seeds,
            batch: a.batch,
            train: match &a.config {
                Some(path) => JobConfig::from_file(path)?.train,
                None => Default::default(),
            },
            exe: super::this_binary("oar bench")?,
            many_trainers: a.many_trainers,
            bf16: a.bf16,
        });
    }
    if a.recovery {
        return crate::bench::recovery::run(&crate::bench::recovery::RecoveryConfig {
            data: a.data.context("--recovery needs --data DIR (train/ and test/)")?,
            runs: a.runs,
            every: a.checkpoint_every,
            exe: super::this_binary("oar bench")?,
        });
    }
    if a.hosts {
        return crate::bench::hosts::run(&crate::bench::hosts::HostsConfig {
            data: a.data,
            lines: a.lines.unwrap_or(50_000),
            links: a.links,
            modes: a.modes,
            servers: a.servers,
            trainers: a.trainers,
            models: a.model,
            runs: a.runs,
            exe: super::this_binary("oar bench")?,
        });
    }
    if a.roofline {
        return crate::bench::roofline::run(&crate::bench::roofline::RooflineConfig {
            blas: a.blas,
            batch: a.batch,
            rounds: a.rounds,
            seconds: a.seconds / 10.0,
            data: a.data,
            // Recording a zoo model's shapes takes a few steps, not a long run.
            lines: a.lines.unwrap_or(if a.model.is_empty() { 200_000 } else { 20_000 }),
            models: a.model,
        });
    }
    if let Some(python) = a.paddle {
        return crate::bench::paddle::run(&crate::bench::paddle::PaddleConfig {
            python,
            data: a.data,
            lines: a.lines.unwrap_or(1_000_000),
            rounds: a.rounds,
            exe: super::this_binary("oar bench")?,
        });
    }
    if a.security {
        return crate::bench::security::run(&crate::bench::security::SecurityConfig {
            data: a.data,
            rounds: a.runs,
            seconds: a.seconds / 4.0,
            dense_floats: a.dense_floats,
            exe: super::this_binary("oar bench")?,
        });
    }
    crate::bench::run(&crate::bench::BenchConfig {
        dense_floats: a.dense_floats,
        sparse_keys: a.sparse_keys,
        sparse_rows: a.sparse_rows,
        baselines: a.baseline_exe,
        data: a.data,
        lines: a.lines.unwrap_or(1_000_000),
        seconds: a.seconds,
        exe: super::this_binary("oar bench")?,
        skip_training: a.skip_training,
        shared_cores: a.shared_cores,
        models: a.models,
        only: a.model,
        rounds: a.rounds,
    })
}

/// `oar plot`: training curves drawn to a PNG.
pub(super) fn plot(a: PlotArgs) -> anyhow::Result<()> {
    let out = a.out.unwrap_or_else(|| a.metrics.with_file_name("curves.png"));
    let points = crate::observe::curves::plot::draw_file(&a.metrics, &out)?;
    println!("{points} points drawn to {}", out.display());
    Ok(())
}

/// `oar tls`: a job's certificate authority and server certificate.
pub(super) fn tls(a: TlsGenArgs) -> anyhow::Result<()> {
    let files = crate::security::tls::generate(&a.out, &a.name)?;
    println!(
        "servers: --tls-cert {} --tls-key {}\ntrainers: --tls-ca {} (certificate name {})",
        files.cert.display(),
        files.key.display(),
        files.ca.display(),
        a.name
    );
    Ok(())
}
