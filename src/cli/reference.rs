//! The command line described from its own definitions, so no description can drift from it:
//! `oar reference` (every command and flag as Markdown: the book's reference chapter),
//! `oar man` (man pages, by `clap_mangen`) and `oar completions` (by `clap_complete`).

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use super::args::Cli;

/// Every command and flag of `oar`, as Markdown: a section per command, a table of its flags.
pub(super) fn markdown() -> String {
    let mut out = String::from(
        "# Command-line reference\n\n\
         Generated from the command line's own definitions by `oar reference` (a test checks that\n\
         this page is its output). `oar COMMAND --help` says the same.\n",
    );
    let mut cli = Cli::command();
    cli.build();
    for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
        command(&mut out, sub, "oar");
    }
    out
}

/// One command's section, then its subcommands'.
fn command(out: &mut String, c: &clap::Command, parent: &str) {
    let name = format!("{parent} {}", c.get_name());
    let _ = write!(out, "\n## `{name}`\n\n");
    if let Some(about) = c.get_long_about().or(c.get_about()) {
        let _ = writeln!(out, "{}\n", about.to_string().trim());
    }
    let args: Vec<&clap::Arg> = c.get_arguments().filter(|a| !a.is_hide_set() && a.get_id() != "help").collect();
    if !args.is_empty() {
        out.push_str("| flag | what | default |\n|---|---|---|\n");
        for a in args {
            let _ = writeln!(out, "| {} | {} | {} |", flag(a), cell(&help(a)), cell(&default(a)));
        }
    }
    for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
        command(out, sub, &name);
    }
}

/// How a flag is written: `--long <VALUE>` (with `-s` and visible aliases), or `<NAME>` for a
/// positional argument.
fn flag(a: &clap::Arg) -> String {
    let takes = a.get_num_args().is_some_and(|n| n.takes_values());
    let value = match a.get_value_names() {
        Some(v) => v.iter().map(|n| format!("<{n}>")).collect::<Vec<_>>().join(" "),
        None => format!("<{}>", a.get_id().as_str().to_uppercase()),
    };
    let Some(long) = a.get_long() else { return format!("`{value}`") };
    let mut names = vec![format!("--{long}")];
    names.extend(a.get_short().map(|s| format!("-{s}")));
    names.extend(a.get_visible_aliases().unwrap_or_default().into_iter().map(|al| format!("--{al}")));
    let shown: Vec<String> =
        names.into_iter().map(|n| if takes { format!("`{n} {value}`") } else { format!("`{n}`") }).collect();
    shown.join(", ")
}

/// A flag's help, its environment variable and its values when they are a fixed list.
fn help(a: &clap::Arg) -> String {
    let mut text = a.get_long_help().or(a.get_help()).map(|h| h.to_string()).unwrap_or_default();
    let values: Vec<String> =
        a.get_possible_values().iter().filter(|v| !v.is_hide_set()).map(|v| v.get_name().to_string()).collect();
    if !values.is_empty() && a.get_num_args().is_some_and(|n| n.takes_values()) {
        let _ = write!(text, " Values: {}.", values.join(", "));
    }
    if let Some(env) = a.get_env() {
        let _ = write!(text, " Environment: `{}`.", env.to_string_lossy());
    }
    text.trim().to_string()
}

/// A flag's default, if it has one.
fn default(a: &clap::Arg) -> String {
    let d: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
    if d.is_empty() {
        String::new()
    } else {
        format!("`{}`", d.join(","))
    }
}

/// Text fit for one table cell: one line, pipes escaped.
fn cell(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ").replace('|', "\\|")
}

/// `oar man --out DIR`: `oar.1`, then `oar-COMMAND.1` for each command and subcommand.
pub(super) fn man_pages(dir: &Path) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut cli = Cli::command();
    cli.build();
    let mut written = 0;
    write_pages(&cli, "oar", dir, &mut written)?;
    Ok(written)
}

fn write_pages(c: &clap::Command, name: &str, dir: &Path, written: &mut usize) -> anyhow::Result<()> {
    let page = c.clone().name(name.to_string());
    let mut bytes = Vec::new();
    clap_mangen::Man::new(page).render(&mut bytes)?;
    let file = dir.join(format!("{name}.1"));
    std::fs::write(&file, bytes).with_context(|| format!("cannot write {}", file.display()))?;
    *written += 1;
    for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
        write_pages(sub, &format!("{name}-{}", sub.get_name()), dir, written)?;
    }
    Ok(())
}

/// `oar completions SHELL`: the completion script, on standard output.
pub(super) fn completions(shell: clap_complete::Shell) {
    // Written whole by `print!`, whose closed pipe the command line treats as Unix tools do;
    // `generate` itself panics on a write error.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "oar", &mut script);
    print!("{}", String::from_utf8_lossy(&script));
}
