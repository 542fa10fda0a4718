//! The README and the book hold together: every relative link (outside code) names a file that
//! exists, and the book's `SUMMARY.md` lists every chapter under `docs/src/` and only those.
//! (That every `oar` command line in them names real commands and flags is checked by a unit
//! test of `cli::reference`, which reads the command line's own definitions.)

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.md` file under `dir`.
fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(markdown_under(&p));
        } else if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out
}

/// The targets of a Markdown text's `](target)` links outside fenced code.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            code = !code;
            continue;
        }
        if code {
            continue;
        }
        for (at, _) in line.match_indices("](") {
            let rest = &line[at + 2..];
            if let Some(end) = rest.find(')') {
                out.push(rest[..end].to_string());
            }
        }
    }
    out
}

#[test]
fn every_relative_link_of_the_readme_and_the_book_names_a_file_that_exists() {
    let mut files = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    files.extend(markdown_under(&root().join("docs/src")));
    let mut broken = Vec::new();
    let mut seen = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in links(&text) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with('#') {
                continue;
            }
            seen += 1;
            let path = target.split('#').next().unwrap();
            if !file.parent().unwrap().join(path).exists() {
                broken.push(format!("{}: {target}", file.strip_prefix(root()).unwrap().display()));
            }
        }
    }
    assert!(seen > 20, "only {seen} relative links found");
    assert!(broken.is_empty(), "links to nothing:\n{}", broken.join("\n"));
}

#[test]
fn the_books_summary_lists_every_chapter_and_only_those() {
    let src = root().join("docs/src");
    let summary = std::fs::read_to_string(src.join("SUMMARY.md")).unwrap();
    let listed: Vec<PathBuf> = links(&summary).iter().map(|l| src.join(l)).collect();
    for l in &listed {
        assert!(l.exists(), "SUMMARY.md lists {}, which does not exist", l.display());
    }
    for chapter in markdown_under(&src) {
        let name = chapter.file_name().unwrap();
        assert!(name == "SUMMARY.md" || listed.contains(&chapter), "{} is in no SUMMARY.md entry", chapter.display());
    }
}
