//! The `oar` command line: parses and validates flags, builds configs, and calls the library's
//! role functions. Errors are printed once, on one line, with exit code 1 (2 for usage errors).
//!
//! It lives in the library so a program can run it with layer types of its own:
//! [`main_with`] takes the [`Registry`] every job file is checked and trained with, and
//! `oar launch` starts its servers and trainers from the running binary, so they know those
//! types too (`examples/custom_layer/`). `src/main.rs` is `main_with` with the built-ins.

use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;

use crate::base::env::{ClusterEnv, Role};
use crate::data::resolve_files;
use crate::model::Registry;
use crate::protocol::Mode;
use crate::server::ServerConfig;
use crate::train::job_config::JobConfig;
use crate::train::TrainConfig;

mod args;
mod args_job;
mod limits;
mod report;
mod roles;
mod secret;
mod status;
mod tls_args;

use args::*;
use args_job::*;
use report::*;
use roles::*;

/// Runs the `oar` command line with the layer types of `registry`, then exits the process.
pub fn main_with(registry: Registry) {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let launched = std::env::var_os("OAR_LAUNCHED").is_some();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .with_ansi(!launched && std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = run(cli.command, launched, &registry) {
        // One write: ranks under mpirun or srun share a stderr, and a line written in pieces
        // can be interleaved with another rank's.
        let line = format!("oar: error: {e:#}\n");
        let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
        std::process::exit(status::status(&e));
    }
}

/// When the reader of this process's output goes away (`oar gen ... | head -1`), `println!`
/// panics on the broken pipe; exit as Unix tools do there (status 141, as SIGPIPE would give)
/// without a panic message. SIGPIPE itself stays ignored, as Rust sets it: a closed socket or
/// `pipe_command` pipe must be an error the code reports, never a silent death.
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info)
    }));
}

fn run(command: Command, launched: bool, registry: &Registry) -> anyhow::Result<()> {
    if let Command::Bench(a) = &command {
        limits::seconds("seconds", a.seconds)?;
        limits::seconds("checkpoint-every", a.checkpoint_every)?;
    }
    match command {
        Command::Pserver(a) => pserver(a, &ClusterEnv::from_process()?),
        Command::Train(a) => train(*a, launched, registry),
        Command::Cluster { engine: ClusterCommand::Ssh(a) } => {
            let bytes = crate::base::state_file::read_named(&a.hosts, crate::train::job_config::MAX_JOB_FILE_BYTES)
                .map_err(|e| anyhow::anyhow!("hosts file {}: {}", a.hosts.display(), e.reason()))?;
            let text = String::from_utf8(bytes)
                .with_context(|| format!("hosts file {}: not UTF-8 text", a.hosts.display()))?;
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
        Command::Cluster { engine: ClusterCommand::K8s(a) } => {
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
        Command::Launch(a) => {
            let job = a.job.resolve(registry)?;
            let train = match (a.train, &job.train.online) {
                (Some(t), None) => t,
                (None, Some(online)) => online.clone(),
                (Some(_), Some(_)) => anyhow::bail!("--train and --online both name the training data: give one"),
                (None, None) => anyhow::bail!("no training data: give --train, or --online DIR --days FROM..TO"),
            };
            // Checked here, so a bad period is one line, not every server failing at start.
            if let Some(every) = a.checkpoint_every {
                anyhow::ensure!(
                    !limits::seconds("checkpoint-every", every)?.is_zero(),
                    "--checkpoint-every must be above 0"
                );
            }
            let config = crate::run::launch::LaunchConfig {
                servers: a.servers,
                workers: a.workers,
                mode: a.mode,
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
                exe: std::env::current_exe().context("cannot find the oar binary")?,
                progress_bar: !a.no_progress,
                registry: registry.clone(),
                child_env: Vec::new(),
                secret_file: a.secret_file,
                tls: a.tls,
                open: false,
                shared_secret: false,
            };
            let s = crate::run::launch::run(&config)?;
            print_summary(&format!("oar launch ({})", config.mode), &s);
            println!("logs and summary.json in {}", config.logs.display());
            Ok(())
        }
        Command::Predict(a) => {
            let saved = crate::serve::predict::load(&a.model, registry)?;
            crate::serve::predict::check_pipe_command(&saved.schema, &a.model, a.trust_pipe_command)?;
            let files = a.data.iter().map(|d| resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
            let inputs: Vec<&std::path::Path> = files.iter().map(|f| f.as_path()).collect();
            let to_stdout = a.out.as_os_str() == "-";
            if !to_stdout {
                crate::base::state_file::check_output(&a.out, &inputs)?;
            }
            let bar = files_bar(&files);
            if a.no_progress {
                bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
            }
            // Written beside the destination and renamed into place: a failed run leaves no
            // half file behind.
            let tmp = a.out.with_file_name(format!(
                ".{}.{}.tmp",
                a.out.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default(),
                std::process::id()
            ));
            let config = crate::serve::predict::PredictConfig {
                files,
                batch_size: a.batch_size,
                threads: a.threads,
                skip_bad_lines: a.skip_bad_lines,
            };
            let run = || -> anyhow::Result<crate::serve::predict::PredictReport> {
                if to_stdout {
                    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
                    return crate::serve::predict::predict(&saved, &config, &mut out, &|bytes| bar.set_position(bytes));
                }
                let file = crate::base::state_file::create_new(&tmp, 0o644)?;
                let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
                let r = crate::serve::predict::predict(&saved, &config, &mut out, &|bytes| bar.set_position(bytes))?;
                drop(out);
                std::fs::rename(&tmp, &a.out).with_context(|| format!("cannot write {}", a.out.display()))?;
                Ok(r)
            };
            let r = run().inspect_err(|_| {
                let _ = std::fs::remove_file(&tmp);
            })?;
            bar.finish_and_clear();
            let heads = saved.model.head_names().join(", ");
            let said = format!(
                "model pass {}: {} lines of scores ({heads}) written to {}{}",
                saved.manifest.pass,
                r.samples,
                if to_stdout { "standard output".into() } else { a.out.display().to_string() },
                if r.bad_lines > 0 { format!("; {} bad lines skipped", r.bad_lines) } else { String::new() }
            );
            // The scores went to standard output: what is said of them goes beside it.
            if to_stdout {
                eprintln!("{said}");
            } else {
                println!("{said}");
            }
            Ok(())
        }
        Command::Export(a) => {
            let saved = crate::serve::predict::load(&a.model, registry)?;
            let config =
                crate::serve::model_export::ExportConfig { out: a.out.clone(), complete_limit: a.complete_limit };
            let m = crate::serve::model_export::export(&saved, &a.model, &config)?;
            let rows: u64 = m.tables.iter().map(|t| t.rows).sum();
            let complete = match &m.model_skipped {
                None => "model.onnx, ".to_string(),
                Some(why) => format!("(no model.onnx: {why}) "),
            };
            println!(
                "model pass {}: exported to {}: dense.onnx, {complete}tables.safetensors ({rows} rows in {} tables), manifest.json",
                m.pass,
                a.out.display(),
                m.tables.len()
            );
            Ok(())
        }
        Command::Serve(a) => crate::serve::run(
            &crate::serve::ServeConfig {
                model: a.model.clone(),
                addr: a.addr.clone(),
                name: a.name.clone(),
                poll: std::time::Duration::from_millis(a.poll_ms.max(1)),
                limits: limits::serve_limits(&a)?,
            },
            registry,
        ),
        Command::Eval(a) => {
            let files = a.data.iter().map(|d| resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
            let crate::serve::predict::Saved { manifest, model, schema, shard, .. } =
                crate::serve::predict::load(&a.model, registry)?;
            crate::serve::predict::check_pipe_command(&schema, &a.model, a.trust_pipe_command)?;
            let mut store = crate::train::Store::local(shard);
            let heads =
                crate::train::evaluate_heads(&mut store, &model, &schema, &files, a.batch_size, a.skip_bad_lines)?;
            println!("model pass {}: {} samples, {}", manifest.pass, heads[0].samples, heads[0]);
            if heads.len() > 1 {
                for (name, r) in model.head_names().iter().zip(&heads) {
                    println!("  head {name}: {r}");
                }
            }
            Ok(())
        }
        Command::Bench(a) if a.quality => crate::bench::quality::run(&crate::bench::quality::QualityConfig {
            real: a.real,
            folds: a.folds,
            sizes: a.sizes,
            seeds: a.seeds,
            batch: a.batch,
            train: match &a.config {
                Some(path) => JobConfig::from_file(path)?.train,
                None => Default::default(),
            },
            exe: std::env::current_exe().context("cannot find the oar binary")?,
        }),
        Command::Bench(a) if a.recovery => crate::bench::recovery::run(&crate::bench::recovery::RecoveryConfig {
            data: a.data.context("--recovery needs --data DIR (train/ and test/)")?,
            runs: a.runs,
            every: a.checkpoint_every,
            exe: std::env::current_exe().context("cannot find the oar binary")?,
        }),
        Command::Bench(a) if a.security => crate::bench::security::run(&crate::bench::security::SecurityConfig {
            data: a.data,
            rounds: a.runs,
            seconds: a.seconds / 4.0,
            dense_floats: a.dense_floats,
            exe: std::env::current_exe().context("cannot find the oar binary")?,
        }),
        Command::Plot(a) => {
            let out = a.out.unwrap_or_else(|| a.metrics.with_file_name("curves.png"));
            let points = crate::observe::curves::plot::draw_file(&a.metrics, &out)?;
            println!("{points} points drawn to {}", out.display());
            Ok(())
        }
        Command::Secret(a) => secret::run(a),
        Command::Shrink(a) => {
            let timeout = limits::whole_seconds("timeout", a.timeout.max(1))?;
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
        Command::Tls(a) => {
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
        Command::Bench(a) => crate::bench::run(&crate::bench::BenchConfig {
            dense_floats: a.dense_floats,
            sparse_keys: a.sparse_keys,
            sparse_rows: a.sparse_rows,
            baselines: a.baseline_exe,
            data: a.data,
            lines: a.lines,
            seconds: a.seconds,
            exe: std::env::current_exe().context("cannot find the oar binary")?,
            skip_training: a.skip_training,
            models: a.models,
            only: a.model,
            rounds: a.rounds,
        }),
        Command::Split(a) => {
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
        Command::Data { what: DataCommand::Get(a) } => {
            let cache = a.cache.unwrap_or_else(crate::data::fetch::default_cache);
            let bar = indicatif::ProgressBar::new_spinner();
            bar.set_style(
                indicatif::ProgressStyle::with_template("{spinner} {msg} {bytes} ({bytes_per_sec})")
                    .expect("valid template"),
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
        Command::Data { what: DataCommand::Stats(a) } => {
            let job = match &a.config {
                Some(path) => crate::train::job_config::JobConfig::from_file(path)?,
                None => crate::train::job_config::JobConfig::default(),
            };
            let files = a.data.iter().map(|d| resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
            let inputs: Vec<&std::path::Path> = files.iter().map(|f| f.as_path()).chain(a.config.as_deref()).collect();
            crate::base::state_file::check_output(&a.out, &inputs)?;
            let bar = files_bar(&files);
            let stats = crate::data::read::transform::compute(files, &job.data, job.model.shorthand_shape(), &|b| {
                bar.set_position(b)
            })?;
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
        Command::Data { what: DataCommand::Prepare(a) } => {
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
        Command::Gen { what: GenCommand::Criteo(a) } => {
            let started = Instant::now();
            let r = crate::data::gen::generate(&gen_config(&a))?;
            print_generated(&a, &r, started);
            Ok(())
        }
        Command::Gen { what: GenCommand::Sequences(a) } => {
            let started = Instant::now();
            let r = crate::data::gen::sequences::generate(&gen_config(&a.gen), a.effect)?;
            print_generated(&a.gen, &r.report, started);
            println!(
                "read it with examples/zoo/din.toml (DIN), dien.toml, bst_din_format.toml or din_base.toml (the pooled history)"
            );
            Ok(())
        }
        Command::Gen { what: GenCommand::Conversions(a) } => {
            let started = Instant::now();
            let r = crate::data::gen::conversions::generate(&gen_config(&a))?;
            print_generated(&a, &r.report, started);
            println!("labels: click and ctcvr; read it with examples/zoo/esmm.toml (or esmm_base.toml: CTCVR alone)");
            Ok(())
        }
        Command::Gen { what: GenCommand::Interactions(a) } => {
            let started = Instant::now();
            let r = crate::data::gen::interactions::generate(&gen_config(&a.gen), a.effect)?;
            print_generated(&a.gen, &r.report, started);
            println!("read it with examples/zoo/fm.toml, ffm.toml, xdeepfm.toml, autoint.toml or examples/ctr_dnn.toml (no pairs)");
            Ok(())
        }
        Command::Gen { what: GenCommand::Tasks(a) } => {
            let started = Instant::now();
            let r = crate::data::gen::tasks::generate(&gen_config(&a.gen), &a.relation())?;
            print_generated(&a.gen, &r.report, started);
            println!(
                "labels: task1 and task2 (planted AUCs {}); read it with examples/zoo/mmoe_tasks.toml, ple_tasks.toml or shared_bottom_tasks.toml",
                r.planted["oracle_test_auc"]
            );
            Ok(())
        }
        Command::Gen { what: GenCommand::Stream(a) } => {
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
        Command::Gen { what: GenCommand::Slots(a) } => {
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
    }
}

fn gen_config(a: &GenArgs) -> crate::data::gen::GenConfig {
    crate::data::gen::GenConfig {
        lines: a.lines,
        test_lines: a.test_lines,
        seed: a.seed,
        parts: a.parts,
        out: a.out.clone(),
    }
}

/// Runs a parameter server: flags, then `OAR_*`, then PaddlePaddle's variables, then defaults.
fn pserver(a: PserverArgs, env: &ClusterEnv) -> anyhow::Result<()> {
    let (config, addrs) = server_config(a, env)?;
    let stats = crate::server::serve_blocking(&addrs, config)?;
    log_stopped(&stats);
    report_stopped(&stats)
}

fn train(a: TrainArgs, launched: bool, registry: &Registry) -> anyhow::Result<()> {
    let Some(config) = trainer_config(a, registry)? else { return Ok(()) }; // a server: it has served
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
        report::print_days(&report.days);
    }
    Ok(())
}

/// A progress bar over the bytes of `files`.
fn files_bar(files: &[std::path::PathBuf]) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(crate::data::read::files::total_bytes(files));
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} ({bytes_per_sec}, {eta})")
            .expect("valid template"),
    );
    bar
}
