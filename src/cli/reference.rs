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
    // Never through a link planted at a page's name, nor blocked on a named pipe there.
    let mut out = crate::base::state_file::create_plain(&file)?;
    std::io::Write::write_all(&mut out, &bytes).with_context(|| format!("cannot write {}", file.display()))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// The Markdown files users read: the README and the book.
    fn docs() -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            for e in std::fs::read_dir(dir).unwrap().flatten() {
                let p = e.path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "md") {
                    out.push(p);
                }
            }
        }
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = vec![root.join("README.md")];
        walk(&root.join("docs/src"), &mut files);
        files
    }

    /// The shell lines of a Markdown text's `sh` blocks, continuation lines joined.
    fn shell_lines(text: &str) -> Vec<String> {
        let (mut out, mut inside, mut held) = (Vec::new(), false, String::new());
        for line in text.lines() {
            let fence = line.trim_start();
            if fence.starts_with("```") {
                let language = fence.trim_start_matches('`').split_whitespace().next();
                inside = !inside && matches!(language, Some("sh" | "bash" | "shell"));
                continue;
            }
            if !inside {
                continue;
            }
            let code = line.split(" #").next().unwrap_or("");
            if code.trim_start().starts_with('#') {
                continue;
            }
            match code.trim_end().strip_suffix('\\') {
                Some(part) => held.push_str(part),
                None => out.push(std::mem::take(&mut held) + code),
            }
        }
        out
    }

    /// Every `--flag` a command of `cli` takes, aliases included.
    fn flags(c: &clap::Command) -> Vec<String> {
        let mut names: Vec<String> = vec!["help".into()];
        for a in c.get_arguments() {
            names.extend(a.get_long().map(String::from));
            names.extend(a.get_all_aliases().unwrap_or_default().into_iter().map(String::from));
        }
        names
    }

    /// What is wrong with the `oar` invocations of one shell line: each names a command that
    /// exists and only flags it takes (after `--`, `oar cluster`'s trainer flags are `train`'s).
    fn check(line: &str, cli: &clap::Command) -> Vec<String> {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let mut problems = Vec::new();
        let mut k = 0;
        while k < tokens.len() {
            let t = tokens[k];
            let start = if t == "oar" || t.ends_with("/oar") {
                k + 1
            } else if t == "cargo" && tokens.get(k + 1) == Some(&"run") {
                match tokens[k..].iter().position(|&x| x == "--") {
                    Some(p) => k + p + 1,
                    None => break,
                }
            } else {
                k += 1;
                continue;
            };
            let mut c = cli;
            let mut at = start;
            while let Some(sub) = tokens.get(at).and_then(|w| c.find_subcommand(w)) {
                c = sub;
                at += 1;
            }
            if at == start && tokens.get(at).is_some_and(|w| !w.starts_with('-')) {
                problems.push(format!("`oar {}` is no command", tokens[at]));
            }
            let mut known = flags(c);
            while at < tokens.len() && !matches!(tokens[at], "|" | "&&" | ";" | ">" | "||") {
                let w = tokens[at].trim_start_matches('[').trim_end_matches(']');
                if w == "--" {
                    known = flags(cli.find_subcommand("train").unwrap());
                } else if let Some(name) = w.strip_prefix("--") {
                    let name = name.split('=').next().unwrap();
                    if !known.iter().any(|f| f == name) {
                        problems.push(format!("`--{name}` is no flag of `oar {}`", c.get_name()));
                    }
                }
                at += 1;
            }
            k = at;
        }
        problems
    }

    /// A renamed or removed command or flag fails here until the README and the book follow.
    #[test]
    fn every_oar_command_in_the_readme_and_the_book_names_real_commands_and_flags() {
        let mut cli = Cli::command();
        cli.build();
        let mut problems = Vec::new();
        let mut checked = 0;
        for file in docs() {
            let text = std::fs::read_to_string(&file).unwrap();
            for line in shell_lines(&text) {
                checked += line.split_whitespace().filter(|t| *t == "oar" || t.ends_with("/oar")).count();
                problems.extend(check(&line, &cli).into_iter().map(|p| format!("{}: {p}: {line}", file.display())));
            }
        }
        assert!(checked > 30, "only {checked} invocations found");
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    #[test]
    fn the_check_names_a_flag_no_command_takes() {
        let mut cli = Cli::command();
        cli.build();
        assert!(check("oar launch --servers 2 --train x", &cli).is_empty());
        assert!(check("cargo run --release -- gen criteo --lines 5 --out d && oar launch --output o", &cli).is_empty());
        assert!(check("oar cluster ssh --hosts h --workspace w -- --mode async --train t", &cli).is_empty());
        let p = check("oar launch --severs 2", &cli);
        assert_eq!(p, ["`--severs` is no flag of `oar launch`"]);
        assert_eq!(check("oar lanch", &cli), ["`oar lanch` is no command"]);
    }
}
