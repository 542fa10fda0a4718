//! oar's Python package (`pyproject.toml`, `crates/oar-py`, `python/oar`): its pytest suite
//! (`python/tests`) run by a Python that has the package installed, `OAR_PACKAGE_PYTHON`
//! (`.ci/run` installs it into a fresh virtual environment from this repository). The suite
//! starts real processes: jobs launched from Python, servers, Ctrl-C. The PyTorch adapter's
//! tests run again in `OAR_TORCH_PYTHON` (Debian's python3-torch with the package: PyPI's
//! torch is 3 GB). Each skips with a message without such a Python.

use std::path::Path;

#[test]
fn the_python_packages_own_tests_pass() {
    pytest("OAR_PACKAGE_PYTHON", &["python/tests"]);
}

#[test]
fn the_pytorch_adapter_trains_as_pytorch_does() {
    pytest("OAR_TORCH_PYTHON", &["python/tests/test_frameworks.py", "-k", "torch"]);
}

/// Runs pytest on `args` with the Python `var` names; skips with a message without one.
fn pytest(var: &str, args: &[&str]) {
    let Ok(py) = std::env::var(var) else {
        eprintln!("skipped: {var} names no Python with oar-ps installed (.ci/run installs it: pip install .)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let o = std::process::Command::new(&py)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .args(args)
        .current_dir(root)
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "the Python package's tests failed:\n{text}");
    assert!(text.contains(" passed"), "{text}");
    eprintln!("{}", text.lines().last().unwrap_or_default());
}
