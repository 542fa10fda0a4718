//! The source tree's layers, enforced: ARCHITECTURE.md declares the top-level modules of
//! `src/` layer by layer, lowest first, and a module may refer only to modules of the layers
//! below its own (`use crate::x`, `crate::x::...` in code; comments, `#[cfg(test)]` modules and
//! test-only files are left out). So there is no import cycle between top-level modules, and
//! the document's diagram is the one the code has.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The layers of ARCHITECTURE.md's `layers` block, lowest first: `name: module module ...`.
fn declared(doc: &str) -> Vec<(String, Vec<String>)> {
    let block = doc.split("```layers\n").nth(1).expect("ARCHITECTURE.md has a ```layers block");
    let block = block.split("```").next().unwrap();
    let mut layers: Vec<(String, Vec<String>)> = block
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let (name, modules) = l.split_once(':').unwrap_or_else(|| panic!("a layer line is `name: modules`: {l}"));
            (name.trim().to_string(), modules.split_whitespace().map(String::from).collect())
        })
        .collect();
    // Written top-down, as the diagram reads; checked bottom-up.
    layers.reverse();
    layers
}

/// Every `.rs` file under `path` (or `path` itself), tests left out.
fn sources(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut out = Vec::new();
    for entry in std::fs::read_dir(path).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            out.extend(sources(&p));
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
            out.push(p);
        }
    }
    out
}

/// The top-level modules a file's code refers to: comments and an inline `#[cfg(test)]`
/// module (`mod tests {`, to the end of the file) left out.
fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]" && lines.peek().is_some_and(|next| next.trim_end().ends_with('{')) {
            break;
        }
        let line = line.split("//").next().unwrap();
        // `crate::x` anywhere, and `x` of a grouped `use crate::{x, y::z}`.
        for (at, _) in line.match_indices("crate::") {
            let rest = &line[at + "crate::".len()..];
            if let Some(group) = rest.strip_prefix('{') {
                let group = group.split('}').next().unwrap_or(group);
                found.extend(group.split(',').map(|p| p.trim().split("::").next().unwrap().to_string()));
            } else {
                found.push(rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect());
            }
        }
    }
    found
}

/// Each upward or sideways reference: (module, file, module it refers to).
fn violations(root: &Path) -> Vec<String> {
    let doc = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let layers = declared(&doc);
    let level: BTreeMap<&str, usize> =
        layers.iter().enumerate().flat_map(|(k, (_, ms))| ms.iter().map(move |m| (m.as_str(), k))).collect();
    let src = root.join("src");
    let mut problems = Vec::new();
    let mut modules = Vec::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let p = entry.unwrap().path();
        let name = p.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "lib" || name == "main" || name.ends_with("_tests") {
            continue;
        }
        modules.push((name, p));
    }
    for (name, _) in &modules {
        if !level.contains_key(name.as_str()) {
            problems.push(format!("src/{name}: in no layer of ARCHITECTURE.md"));
        }
    }
    for m in level.keys() {
        if !modules.iter().any(|(n, _)| n == m) {
            problems.push(format!("ARCHITECTURE.md's layers name `{m}`, which is no module of src/"));
        }
    }
    for (name, path) in &modules {
        let Some(&own) = level.get(name.as_str()) else { continue };
        for file in sources(path) {
            let text = std::fs::read_to_string(&file).unwrap();
            for r in references(&text) {
                let Some(&theirs) = level.get(r.as_str()) else { continue };
                if r != *name && theirs >= own {
                    let shown = file.strip_prefix(root).unwrap_or(&file).display().to_string();
                    problems.push(format!(
                        "{shown}: `{name}` ({}) refers to `{r}` ({}), which is not below it",
                        layers[own].0, layers[theirs].0
                    ));
                }
            }
        }
    }
    problems.sort();
    problems.dedup();
    problems
}

#[test]
fn every_module_refers_only_to_the_layers_below_its_own() {
    let problems = violations(Path::new(env!("CARGO_MANIFEST_DIR")));
    assert!(problems.is_empty(), "{} references break the layers:\n{}", problems.len(), problems.join("\n"));
}

/// The check itself: a planted upward reference (a table using the server) is named.
#[test]
fn a_planted_upward_reference_is_named() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let copy = tempfile::tempdir().unwrap();
    std::fs::copy(root.join("ARCHITECTURE.md"), copy.path().join("ARCHITECTURE.md")).unwrap();
    let src = copy.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    for entry in std::fs::read_dir(root.join("src")).unwrap() {
        let p = entry.unwrap().path();
        // Empty stand-ins: only the names of the top-level modules matter here.
        let stand_in = src.join(p.file_name().unwrap());
        if p.is_dir() {
            std::fs::create_dir_all(&stand_in).unwrap();
        } else {
            std::fs::write(&stand_in, "").unwrap();
        }
    }
    assert!(violations(copy.path()).is_empty());
    std::fs::write(src.join("table/planted.rs"), "use crate::server::State;\n// crate::cli in a comment\n").unwrap();
    let problems = violations(copy.path());
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("src/table/planted.rs: `table`") && problems[0].contains("refers to `server`"));
}
