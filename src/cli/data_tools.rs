//! The commands that make and check data: `split`, `data get`, `data stats`, `data prepare`
//! and the `gen` generators.

use std::time::Instant;

use super::args::*;
use super::report::*;
use crate::data::resolve_files;

/// `oar split`: one file into parts.
pub(super) fn split(a: SplitArgs) -> anyhow::Result<()> {
    let (files, lines) = crate::data::read::files::split_file(&a.file, a.parts)?;
    println!(
        "split {} lines of {} into {} parts: {} .. {}",
        lines,
        a.file.display(),
        files.len(),
        files.first().map_or(String::new(), |f| f.display().to_string()),
        files.last().map_or(String::new(), |f| f.display().to_string())
    );
    Ok(())
}

/// `oar data get`: a public data set downloaded and checked.
pub(super) fn get(a: GetArgs) -> anyhow::Result<()> {
    let cache = a.cache.unwrap_or_else(crate::data::fetch::default_cache);
    let bar = indicatif::ProgressBar::new_spinner();
    bar.set_style(
        indicatif::ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})").expect("valid template"),
    );
    anyhow::ensure!((1..=3600).contains(&a.read_timeout), "--read-timeout must be in 1..=3600 seconds");
    let timeout = std::time::Duration::from_secs(a.read_timeout);
    let f = crate::data::fetch::fetch(&a.name, &cache, a.mirror.as_deref(), timeout, &|file, bytes| {
        bar.set_message(file.to_string());
        bar.set_position(bytes);
    });
    bar.finish_and_clear();
    let f = f?;
    println!(
        "{}: {} file(s) downloaded, {} already cached, checksums verified, in {}",
        a.name,
        f.downloaded,
        f.cached,
        f.dir.display()
    );
    Ok(())
}

/// `oar data stats`: the dense values' statistics, for `dense_transform`.
pub(super) fn stats(a: StatsArgs) -> anyhow::Result<()> {
    let job = match &a.config {
        Some(path) => crate::train::job_config::JobConfig::from_file(path)?,
        None => crate::train::job_config::JobConfig::default(),
    };
    let files = a.data.iter().map(|d| resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
    let inputs: Vec<&std::path::Path> = files.iter().map(|f| f.as_path()).chain(a.config.as_deref()).collect();
    crate::base::state_file::check_output(&a.out, &inputs)?;
    let bar = files_bar(&files);
    let stats =
        crate::data::read::transform::compute(files, &job.data, job.model.shorthand_shape(), &|b| bar.set_position(b))?;
    bar.finish_and_clear();
    let json = serde_json::to_vec_pretty(&stats).expect("statistics serialize");
    crate::base::state_file::write_atomic(&a.out, &json)?;
    println!(
            "{} samples, {} dense values: statistics in {} (add to [data]: dense_transform = \"standardize\" or \"minmax\", dense_stats = {:?})",
            stats.count,
            stats.mean.len(),
            a.out.display(),
            a.out.display().to_string()
        );
    Ok(())
}

/// `oar data prepare`: a seed example's raw data as train and test files.
pub(super) fn prepare(a: PrepareArgs) -> anyhow::Result<()> {
    let p = match a.name {
        PrepareName::UciHousing => crate::data::prepare::uci_housing(&a.src, &a.out)?,
        PrepareName::Imikolov => crate::data::prepare::imikolov(&a.src, &a.out, a.min_count, a.n)?,
    };
    println!(
        "wrote {} ({} samples) and {} ({} samples)",
        p.train.display(),
        p.samples.0,
        p.test.display(),
        p.samples.1
    );
    if let Some((path, words)) = &p.dict {
        println!("dictionary: {words} words in {} (set model.outputs = {words})", path.display());
    }
    for (name, value) in &p.baselines {
        println!("baseline: {name} {value:.2}");
    }
    Ok(())
}

/// `oar gen criteo`.
pub(super) fn gen_criteo(a: GenArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let r = crate::data::gen::generate(&gen_config(&a))?;
    print_generated(&a, &r, started);
    Ok(())
}

/// `oar gen sequences`.
pub(super) fn gen_sequences(a: SequencesArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let r = crate::data::gen::sequences::generate(&gen_config(&a.gen), a.effect)?;
    print_generated(&a.gen, &r.report, started);
    println!(
            "read it with examples/zoo/din.toml (DIN), dien.toml, bst_din_format.toml or din_base.toml (the pooled history)"
        );
    Ok(())
}

/// `oar gen conversions`.
pub(super) fn gen_conversions(a: GenArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let r = crate::data::gen::conversions::generate(&gen_config(&a))?;
    print_generated(&a, &r.report, started);
    println!("labels: click and ctcvr; read it with examples/zoo/esmm.toml (or esmm_base.toml: CTCVR alone)");
    Ok(())
}

/// `oar gen interactions`.
pub(super) fn gen_interactions(a: InteractionsArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let r = crate::data::gen::interactions::generate(&gen_config(&a.gen), a.effect)?;
    print_generated(&a.gen, &r.report, started);
    println!(
        "read it with examples/zoo/fm.toml, ffm.toml, xdeepfm.toml, autoint.toml or examples/ctr_dnn.toml (no pairs)"
    );
    Ok(())
}

/// `oar gen tasks`.
pub(super) fn gen_tasks(a: TasksArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let r = crate::data::gen::tasks::generate(&gen_config(&a.gen), &a.relation())?;
    print_generated(&a.gen, &r.report, started);
    println!(
            "labels: task1 and task2 (planted AUCs {}); read it with examples/zoo/mmoe_tasks.toml, ple_tasks.toml or shared_bottom_tasks.toml",
            r.planted["oracle_test_auc"]
        );
    Ok(())
}

/// `oar gen stream`.
pub(super) fn gen_stream(a: StreamArgs) -> anyhow::Result<()> {
    use crate::data::gen::stream;
    let config = stream::StreamConfig {
        days: a.days,
        lines_per_day: a.lines_per_day,
        parts: a.parts,
        seed: a.seed,
        start: crate::data::read::calendar::parse_date(&a.start)?,
        out: a.out.clone(),
    };
    let meta = stream::generate(&config, &|d| {
        let oracle = d.oracle_auc.map_or("n/a".into(), |a| format!("{a:.4}"));
        println!("{}: {} lines, CTR {:.4}, planted model's AUC {oracle}", d.date, d.lines, d.ctr);
    })?;
    let (first, last) = (&meta.days[0].date, &meta.days[meta.days.len() - 1].date);
    println!("train it with: --online {} --days {first}..{last}", a.out.display());
    Ok(())
}

/// `oar gen slots`.
pub(super) fn gen_slots(a: GenArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let r = crate::data::gen::slots::generate(&gen_config(&a))?;
    print_generated(&a, &r.report, started);
    #[derive(serde::Serialize)]
    struct Job<'a> {
        data: &'a crate::data::DataConfig,
    }
    let pooling: Vec<String> = r.slots.iter().map(|s| format!("{} {}", s.name, s.pooling.name())).collect();
    println!("slots and their pooling: {}", pooling.join(", "));
    println!("read it with:\n{}", toml::to_string(&Job { data: &r.data })?.trim_end());
    Ok(())
}

/// The generators' shared settings from their flags.
fn gen_config(a: &GenArgs) -> crate::data::gen::GenConfig {
    crate::data::gen::GenConfig {
        lines: a.lines,
        test_lines: a.test_lines,
        seed: a.seed,
        parts: a.parts,
        out: a.out.clone(),
    }
}
