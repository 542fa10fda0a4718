//! oar's Python package (`pyproject.toml`, `crates/oar-py`, `python/oar`): its pytest suite
//! (`python/tests`) run by a Python that has the package installed, `OAR_PACKAGE_PYTHON`
//! (`.ci/run` installs it into a fresh virtual environment from this repository). The suite
//! starts real processes: jobs launched from Python, servers, Ctrl-C. Skips with a message
//! without such a Python.

use std::path::Path;

#[test]
fn the_python_packages_own_tests_pass() {
    let Ok(py) = std::env::var("OAR_PACKAGE_PYTHON") else {
        eprintln!(
            "skipped: OAR_PACKAGE_PYTHON names no Python with oar-ps installed (.ci/run installs it: pip install .)"
        );
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = std::process::Command::new(&py)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "python/tests"])
        .current_dir(root)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the Python package's tests failed:\n{text}");
    assert!(text.contains(" passed"), "{text}");
    eprintln!("{}", text.lines().last().unwrap_or_default());
}
