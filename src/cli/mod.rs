//! The `oar` command line: parses and validates flags, builds configs, and calls the library's
//! role functions. Errors are printed once, on one line, with exit code 1 (2 for usage errors).
//!
//! It lives in the library so a program can run it with layer types of its own:
//! [`main_with`] takes the [`Registry`] every job file is checked and trained with, and
//! `oar launch` starts its servers and trainers from the running binary, so they know those
//! types too (`examples/custom_layer/`). `src/main.rs` is `main_with` with the built-ins.

use anyhow::Context;
use clap::Parser;

use crate::base::env::ClusterEnv;
use crate::base::program::Program;
use crate::model::Registry;

mod args;
mod args_bench;
mod args_job;
mod data_tools;
mod jobs;
mod limits;
mod reference;
mod report;
mod roles;
mod saved;
mod secret;
mod status;
mod tls_args;
mod tools;

use args::*;

/// `oar --version`: the release and the commit it was built from (see `build.rs`).
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("OAR_COMMIT"), ")");

/// What this process's children run: set once by [`main_from`].
static PROGRAM: std::sync::OnceLock<Program> = std::sync::OnceLock::new();

/// What `oar launch` starts its servers and trainers with.
fn this_program() -> anyhow::Result<Program> {
    match PROGRAM.get() {
        Some(p) => Ok(p.clone()),
        None => Program::this_binary().context("cannot find the oar binary"),
    }
}

/// The `oar` binary itself, for `what` (which copies it or runs it beside other builds): an
/// error under the Python package, whose process is Python's.
fn this_binary(what: &str) -> anyhow::Result<std::path::PathBuf> {
    let program = this_program()?;
    anyhow::ensure!(
        program.is_binary(),
        "{what} needs the oar binary (cargo install --path . in the repository), not the Python package's `oar`"
    );
    Ok(program.path)
}

/// Runs the `oar` command line with the layer types of `registry`, then exits the process.
pub fn main_with(registry: Registry) {
    let program = Program::this_binary().unwrap_or_else(|_| Program::binary("oar"));
    main_from(registry, std::env::args_os().collect(), program)
}

/// Runs the command line `argv` (its first element the program's name) with the layer types of
/// `registry`, its children running `program`; then exits the process. The Python package's
/// `oar` is this with Python's arguments and `python -m oar`.
pub fn main_from(registry: Registry, argv: Vec<std::ffi::OsString>, program: Program) {
    let _ = PROGRAM.set(program);
    quiet_on_closed_stdout();
    let cli = Cli::parse_from(argv);
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
    match command {
        Command::Pserver(a) => jobs::pserver(a, &ClusterEnv::from_process()?),
        Command::Train(a) => jobs::train(*a, launched, registry),
        Command::Launch(a) => jobs::launch(a, registry),
        Command::Cluster { engine: ClusterCommand::Ssh(a) } => jobs::cluster_ssh(a),
        Command::Cluster { engine: ClusterCommand::K8s(a) } => jobs::cluster_k8s(a),
        Command::Shrink(a) => jobs::shrink(a),
        Command::Predict(a) => saved::predict(a, registry),
        Command::Eval(a) => saved::eval(a, registry),
        Command::Export(a) => saved::export(a, registry),
        Command::Serve(a) => saved::serve(a, registry),
        Command::Split(a) => data_tools::split(a),
        Command::Data { what: DataCommand::Get(a) } => data_tools::get(a),
        Command::Data { what: DataCommand::Stats(a) } => data_tools::stats(a),
        Command::Data { what: DataCommand::Prepare(a) } => data_tools::prepare(a),
        Command::Gen { what: GenCommand::Criteo(a) } => data_tools::gen_criteo(a),
        Command::Gen { what: GenCommand::Slots(a) } => data_tools::gen_slots(a),
        Command::Gen { what: GenCommand::Sequences(a) } => data_tools::gen_sequences(a),
        Command::Gen { what: GenCommand::Conversions(a) } => data_tools::gen_conversions(a),
        Command::Gen { what: GenCommand::Interactions(a) } => data_tools::gen_interactions(a),
        Command::Gen { what: GenCommand::Tasks(a) } => data_tools::gen_tasks(a),
        Command::Gen { what: GenCommand::Stream(a) } => data_tools::gen_stream(a),
        Command::Bench(a) => tools::bench(a),
        Command::Plot(a) => tools::plot(a),
        Command::Tls(a) => tools::tls(a),
        Command::Secret(a) => secret::run(a),
        Command::Completions { shell } => {
            reference::completions(shell);
            Ok(())
        }
        Command::Man { out } => {
            let n = reference::man_pages(&out)?;
            println!("{n} man pages written to {}", out.display());
            Ok(())
        }
        Command::Reference => {
            print!("{}", reference::markdown());
            Ok(())
        }
    }
}
