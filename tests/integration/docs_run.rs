//! The shell examples of the README and the book run as written, so that a renamed flag, a
//! moved file or a changed output breaks the build, not a reader.
//!
//! Each page's `sh` blocks (and `python` ones, through `python3`) run in order as one bash script (`set -euo pipefail`) in a fresh
//! folder that holds the repository's `examples/` (and `../shared` beside it when the
//! repository has one), with the `oar` these tests built first on the PATH. A block's
//! info-string words say how it runs:
//! - `sh no-run`: shown, not run (it installs, or needs hosts or a cluster this machine is not);
//! - `sh needs=NAME`: run when NAME is here, else skipped with a message: `tritonclient` and
//!   `onnxruntime` (importable by `python3`), `oar-ps` (the Python package, in the Python
//!   `OAR_PACKAGE_PYTHON` names, which runs those blocks), `oar-paddle` (that Python, with
//!   Paddle), `oar-torch` (the package with PyTorch, in the Python `OAR_TORCH_PYTHON` names,
//!   which runs those blocks), `shared` (the data sets of
//!   `../shared`), or any program on the PATH (`mpirun`, ...).
//!
//! Two substitutions make a reader's commands this run's: `cargo run --release --` is `oar`
//! (the binary already built), and `cargo test` lines are left out (this is that run).
//! Background jobs a page starts (`oar serve ... &`) are killed when it ends, and a page that
//! runs past 20 minutes is stopped and named.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One `sh` or `python` block: where it starts, its info-string words after the language, its
/// text.
struct Block {
    line: usize,
    python: bool,
    words: Vec<String>,
    text: String,
}

/// The `sh`/`bash` and `python` blocks of a Markdown text (other languages' blocks are passed
/// over).
fn blocks(text: &str) -> Vec<Block> {
    enum In {
        Text,
        Shell(Block),
        Other,
    }
    let mut out = Vec::new();
    let mut state = In::Text;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```");
        state = match (state, fence) {
            (In::Text, Some(info)) => {
                let mut words = info.trim_start_matches('`').split_whitespace();
                match words.next() {
                    Some(language @ ("sh" | "bash" | "python")) => In::Shell(Block {
                        line: i + 1,
                        python: language == "python",
                        words: words.map(String::from).collect(),
                        text: String::new(),
                    }),
                    _ => In::Other,
                }
            }
            // A closing fence is bare: "```sh" inside a block is the block's text.
            (In::Shell(b), Some(rest)) if rest.trim_matches('`').trim().is_empty() => {
                out.push(b);
                In::Text
            }
            (In::Shell(mut b), _) => {
                b.text.push_str(line);
                b.text.push('\n');
                In::Shell(b)
            }
            (In::Other, Some(rest)) if rest.trim_matches('`').trim().is_empty() => In::Text,
            (other, _) => other,
        };
    }
    out
}

/// For a `needs=` word naming the Python package: the variable naming the Python that has it
/// and the module that Python must import (`oar-ps`: the package; `oar-paddle`: with Paddle;
/// `oar-torch`: with PyTorch, in an environment of its own).
fn package_python(need: &str) -> Option<(&'static str, &'static str)> {
    match need {
        "oar-ps" => Some(("OAR_PACKAGE_PYTHON", "oar")),
        "oar-paddle" => Some(("OAR_PACKAGE_PYTHON", "oar.paddle")),
        "oar-torch" => Some(("OAR_TORCH_PYTHON", "oar.torch")),
        _ => None,
    }
}

/// Whether `need` (a `needs=` word's value) is here.
fn present(need: &str, env_path: &str) -> bool {
    let python = |imports: &str| {
        Command::new("python3")
            .env("PATH", env_path)
            .args(["-c", &format!("import {imports}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    // The Python package, installed by .ci/run into environments of its own.
    if let Some((var, module)) = package_python(need) {
        return std::env::var(var).is_ok_and(|py| {
            Command::new(py).args(["-c", &format!("import {module}")]).output().is_ok_and(|o| o.status.success())
        });
    }
    match need {
        "tritonclient" => python("tritonclient.http, numpy"),
        "onnxruntime" => python("onnx, onnxruntime, numpy, safetensors"),
        "shared" => root().join("../shared/data").is_dir(),
        program => Command::new("sh")
            .env("PATH", env_path)
            .args(["-c", &format!("command -v {program}")])
            .output()
            .is_ok_and(|o| o.status.success()),
    }
}

/// A page's script: its runnable blocks in order, each announced on stderr; and what was
/// skipped, with why.
fn script(page: &str, text: &str, env_path: &str) -> (String, Vec<String>) {
    let mut script =
        String::from("set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\nshopt -s expand_aliases\n");
    let mut skipped = Vec::new();
    for b in blocks(text) {
        if b.words.iter().any(|w| w == "no-run") {
            continue;
        }
        let missing: Vec<&str> =
            b.words.iter().filter_map(|w| w.strip_prefix("needs=")).filter(|n| !present(n, env_path)).collect();
        if !missing.is_empty() {
            skipped.push(format!("{page}:{}: needs {}", b.line, missing.join(", ")));
            continue;
        }
        script.push_str(&format!("echo '== {page}:{}' >&2\n", b.line));
        if b.python {
            // The package's blocks run with the Python that has it.
            let package = b.words.iter().filter_map(|w| w.strip_prefix("needs=")).find_map(package_python);
            let python = package.map_or("python3".to_string(), |(var, _)| format!("\"${var}\""));
            script.push_str(&format!("{python} - <<'OAR_PYTHON_BLOCK'\n{}OAR_PYTHON_BLOCK\n", b.text));
            continue;
        }
        for line in b.text.lines() {
            if line.trim_start().starts_with("cargo test") {
                continue;
            }
            script.push_str(&line.replace("cargo run --release --", "oar"));
            script.push('\n');
        }
    }
    (script, skipped)
}

/// Runs `pages` (paths under the repository) in order in one folder, as a reader going through
/// them would; panics naming the block that failed and the end of its output.
fn run_pages(pages: &[PathBuf]) {
    let oar = PathBuf::from(env!("CARGO_BIN_EXE_oar"));
    let env_path = format!("{}:{}", oar.parent().unwrap().display(), std::env::var("PATH").unwrap_or_default());
    let work = tempfile::tempdir().unwrap();
    if root().join("../shared").is_dir() {
        std::os::unix::fs::symlink(root().join("../shared").canonicalize().unwrap(), work.path().join("shared"))
            .unwrap();
    }
    let dir = work.path().join("reader");
    std::fs::create_dir(&dir).unwrap();
    std::os::unix::fs::symlink(root().join("examples"), dir.join("examples")).unwrap();
    for page in pages {
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        let (script, skipped) = script(&name, &std::fs::read_to_string(page).unwrap(), &env_path);
        for s in &skipped {
            eprintln!("skipped {s} (not on this machine; .ci/run installs it)");
        }
        std::fs::write(dir.join("page.sh"), &script).unwrap();
        let started = std::time::Instant::now();
        let mut child = Command::new("timeout")
            .args(["--kill-after=10", "1200", "bash", "page.sh"])
            .current_dir(&dir)
            .env("PATH", &env_path)
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(dir.join("page.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("page.err")).unwrap())
            .spawn()
            .unwrap();
        let status = child.wait().unwrap();
        let err = std::fs::read_to_string(dir.join("page.err")).unwrap_or_default();
        let out = std::fs::read_to_string(dir.join("page.log")).unwrap_or_default();
        let block = err.lines().rfind(|l| l.starts_with("== ")).unwrap_or("== (before any block)");
        let tail =
            |s: &str| s.lines().rev().take(25).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join("\n");
        assert!(
            status.success(),
            "{name}: the example at {} failed ({status}{}):\n--- stdout\n{}\n--- stderr\n{}",
            block.trim_start_matches("== "),
            if status.code() == Some(124) { ", stopped after 20 minutes" } else { "" },
            tail(&out),
            tail(&err)
        );
        eprintln!("{name}: its examples ran in {:.0} s", started.elapsed().as_secs_f64());
    }
}

/// The book's chapters in `SUMMARY.md`'s order.
fn chapters() -> Vec<PathBuf> {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    summary
        .lines()
        .filter_map(|l| l.split("](").nth(1).and_then(|r| r.split(')').next()))
        .map(|l| src.join(l))
        .collect()
}

/// The README's examples, then the book's, each in a folder of its own; one after the other, as
/// both serve on the same port.
#[test]
fn the_readmes_and_the_books_examples_run() {
    run_pages(&[root().join("README.md")]);
    let chapters = chapters();
    assert!(chapters.len() > 10, "SUMMARY.md lists {} chapters", chapters.len());
    run_pages(&chapters);
}

#[test]
fn blocks_are_read_with_their_words_and_other_languages_are_left_alone() {
    let text = "x\n```toml\n[a]\n```\n```sh no-run\noar a\n```\n```sh needs=shared\noar b\n```\n```text\n```sh\n```\n```python\nprint(1)\n```\n";
    let b = blocks(text);
    assert_eq!(b.len(), 3, "{:?}", b.iter().map(|b| &b.text).collect::<Vec<_>>());
    assert!(b[2].python && !b[0].python && b[2].text == "print(1)\n");
    assert_eq!((b[0].line, b[0].words.clone(), b[0].text.as_str()), (5, vec!["no-run".to_string()], "oar a\n"));
    assert_eq!((b[1].line, b[1].words.clone(), b[1].text.as_str()), (8, vec!["needs=shared".to_string()], "oar b\n"));
}
