//! `oar._oar`, the extension module of oar's Python package (`oar-ps` on PyPI, `import oar`):
//! the command line, job files read and checked, and saved models scored into numpy, each a
//! thin call into the `oar` library with the GIL released. Jobs themselves (launch, train,
//! serve) run as child processes of `python -m oar` (see `python/oar/jobs.py`), so a crash or a
//! Ctrl-C never takes the interpreter with it. Errors are `oar.errors` exceptions carrying
//! oar's one-line message.

use std::path::{Path, PathBuf};

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray2};
use pyo3::prelude::*;

use oar::model::Registry;
use oar::train::job_config::JobConfig;

mod tables;

pyo3::import_exception!(oar.errors, OarError);
pyo3::import_exception!(oar.errors, ConfigError);

/// oar's error chain on one line, as the command line prints it.
fn message(e: &anyhow::Error) -> String {
    format!("{e:#}")
}

fn oar_error(e: anyhow::Error) -> PyErr {
    OarError::new_err(message(&e))
}

fn config_error(e: anyhow::Error) -> PyErr {
    ConfigError::new_err(message(&e))
}

/// Runs oar's command line on `argv` (the program's name first), its children running
/// `program` (`[sys.executable, "-m", "oar"]`); exits the process with oar's status on an error.
#[pyfunction]
fn cli_main(py: Python<'_>, argv: Vec<String>, program: Vec<String>) -> PyResult<()> {
    let Some((path, prefix)) = program.split_first() else {
        return Err(pyo3::exceptions::PyValueError::new_err("program: empty"));
    };
    let program = oar::base::program::Program { path: PathBuf::from(path), prefix: prefix.to_vec() };
    let argv = argv.into_iter().map(Into::into).collect();
    py.detach(move || oar::cli::main_from(Registry::with_builtin(), argv, program));
    Ok(())
}

/// Checks `job` as `oar train --config` would, with the built-in layer types.
fn checked(job: JobConfig) -> PyResult<JobConfig> {
    job.validate_with(&Registry::with_builtin()).map_err(config_error)?;
    Ok(job)
}

/// The job file at `path`, read and checked: its settings as a dict, every default filled in.
#[pyfunction]
fn job_from_file(py: Python<'_>, path: PathBuf) -> PyResult<Py<PyAny>> {
    let job = py.detach(|| JobConfig::from_file(&path)).map_err(config_error)?;
    let job = checked(job)?;
    Ok(pythonize::pythonize(py, &job)?.unbind())
}

/// A job's settings (a dict, as [`job_from_file`] gives them or a part of them) checked and
/// written as a job file's TOML.
#[pyfunction]
fn job_to_toml(job: &Bound<'_, PyAny>) -> PyResult<String> {
    let job: JobConfig = pythonize::depythonize(job).map_err(|e| ConfigError::new_err(format!("job: {e}")))?;
    let job = checked(job)?;
    toml::to_string_pretty(&job).map_err(|e| ConfigError::new_err(format!("job: {e}")))
}

/// A job's settings as [`job_from_file`] gives them: checked, every default filled in.
#[pyfunction]
fn job_normalized(py: Python<'_>, job: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let job: JobConfig = pythonize::depythonize(job).map_err(|e| ConfigError::new_err(format!("job: {e}")))?;
    let job = checked(job)?;
    Ok(pythonize::pythonize(py, &job)?.unbind())
}

/// PaddleRec's `config.yaml` at `path` read as oar reads it (`oar train --paddlerec-config`):
/// a dict of the job (checked), the run's settings (`train`, `test`, `output`, `mode`: None
/// where the config has none) and the keys not used with why (`unused`, pairs).
#[pyfunction]
#[pyo3(signature = (path, model = None))]
fn paddlerec(py: Python<'_>, path: PathBuf, model: Option<String>) -> PyResult<Py<PyAny>> {
    let rec = py.detach(|| oar::train::paddlerec::from_file(&path, model.as_deref())).map_err(config_error)?;
    let job = checked(rec.job)?;
    let text = |p: Option<PathBuf>| p.map(|p| p.display().to_string());
    let read = serde_json::json!({
        "job": serde_json::to_value(&job).map_err(|e| OarError::new_err(e.to_string()))?,
        "flags": {
            "train": text(rec.train),
            "test": text(rec.test),
            "output": text(rec.output),
            "mode": rec.mode.map(|m| m.to_string()),
        },
        "unused": rec.unused,
    });
    Ok(pythonize::pythonize(py, &read)?.unbind())
}

/// The layer types a graph may name besides `embedding`: the registry's.
#[pyfunction]
fn layer_types() -> Vec<String> {
    Registry::with_builtin().names().into_iter().map(String::from).collect()
}

/// Every head's score of every sample, samples in rows: an array `[samples, heads]`.
fn score_array(py: Python<'_>, heads: usize, flat: Vec<f32>) -> PyResult<Bound<'_, PyArray2<f32>>> {
    let rows = flat.len().checked_div(heads).unwrap_or(0);
    let array = Array2::from_shape_vec((rows, heads), flat).map_err(|e| OarError::new_err(e.to_string()))?;
    Ok(array.into_pyarray(py))
}

/// The scores `oar predict` writes for data `files` (files or folders), as an array
/// `[samples, heads]` in input order.
#[pyfunction]
#[pyo3(signature = (model, files, batch_size = 4096, threads = 0, skip_bad_lines = false))]
fn predict_files<'py>(
    py: Python<'py>,
    model: PathBuf,
    files: Vec<PathBuf>,
    batch_size: usize,
    threads: usize,
    skip_bad_lines: bool,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (heads, flat) = py
        .detach(|| -> anyhow::Result<(usize, Vec<f32>)> {
            let saved = oar::serve::predict::load(&model, &Registry::with_builtin())?;
            oar::serve::predict::check_pipe_command(&saved.schema, &model, false)?;
            let files = files.iter().map(|d| oar::data::resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
            let threads =
                if threads == 0 { std::thread::available_parallelism().map_or(1, |n| n.get()) } else { threads };
            let config = oar::serve::predict::PredictConfig { files, batch_size, threads, skip_bad_lines };
            // The scores' text is what `oar predict` writes, each number read back as the same f32.
            let mut text = Vec::new();
            oar::serve::predict::predict(&saved, &config, &mut text, &|_| {})?;
            let heads = saved.model.head_names().len();
            Ok((heads, parse_scores(&text)?))
        })
        .map_err(oar_error)?;
    score_array(py, heads, flat)
}

/// The numbers of `oar predict`'s output text, line after line.
fn parse_scores(text: &[u8]) -> anyhow::Result<Vec<f32>> {
    let text = std::str::from_utf8(text)?;
    text.split(['\t', '\n'])
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<f32>().map_err(|e| anyhow::anyhow!("a score {s:?}: {e}")))
        .collect()
}

/// The scores of data `lines` in the job's format (what `oar serve` takes as `lines`), as an
/// array `[samples, heads]`.
#[pyfunction]
fn predict_lines<'py>(py: Python<'py>, model: PathBuf, lines: Vec<String>) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (heads, flat) = py.detach(|| score_lines(&model, &lines)).map_err(oar_error)?;
    score_array(py, heads, flat)
}

fn score_lines(model: &Path, lines: &[String]) -> anyhow::Result<(usize, Vec<f32>)> {
    let saved = oar::serve::predict::load(model, &Registry::with_builtin())?;
    let batch = oar::serve::predict::lines_batch(&saved.schema, lines.iter().map(|l| l.as_bytes()))
        .map_err(anyhow::Error::msg)?;
    let heads = oar::serve::predict::Scorer::default().scores_in_parts(&saved, &batch)?;
    // Samples in rows: every head's score of a sample side by side.
    let flat = (0..batch.len()).flat_map(|r| heads.iter().map(move |h| h[r])).collect();
    Ok((heads.len(), flat))
}

/// `oar eval`'s figures for data `files`: per head, a dict (samples, loss, AUC, ...).
#[pyfunction]
#[pyo3(signature = (model, files, batch_size = 4096, skip_bad_lines = false))]
fn evaluate(
    py: Python<'_>,
    model: PathBuf,
    files: Vec<PathBuf>,
    batch_size: usize,
    skip_bad_lines: bool,
) -> PyResult<Py<PyAny>> {
    let reports = py
        .detach(|| -> anyhow::Result<Vec<(String, oar::observe::metrics::EvalReport)>> {
            let saved = oar::serve::predict::load(&model, &Registry::with_builtin())?;
            oar::serve::predict::check_pipe_command(&saved.schema, &model, false)?;
            let files = files.iter().map(|d| oar::data::resolve_files(d)).collect::<Result<Vec<_>, _>>()?.concat();
            let names = saved.model.head_names();
            let mut store = oar::train::Store::local(saved.shard);
            let heads = oar::train::evaluate_heads(
                &mut store,
                &saved.model,
                &saved.schema,
                &files,
                batch_size,
                skip_bad_lines,
            )?;
            Ok(names.into_iter().zip(heads).collect())
        })
        .map_err(oar_error)?;
    let map: std::collections::BTreeMap<String, _> = reports.into_iter().collect();
    Ok(pythonize::pythonize(py, &map)?.unbind())
}

/// The version of oar this module was built from.
#[pyfunction]
fn version() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

#[pymodule]
fn _oar(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cli_main, m)?)?;
    m.add_function(wrap_pyfunction!(job_from_file, m)?)?;
    m.add_function(wrap_pyfunction!(job_to_toml, m)?)?;
    m.add_function(wrap_pyfunction!(job_normalized, m)?)?;
    m.add_function(wrap_pyfunction!(layer_types, m)?)?;
    m.add_function(wrap_pyfunction!(paddlerec, m)?)?;
    m.add_function(wrap_pyfunction!(predict_files, m)?)?;
    m.add_function(wrap_pyfunction!(predict_lines, m)?)?;
    m.add_function(wrap_pyfunction!(evaluate, m)?)?;
    m.add_function(wrap_pyfunction!(version, m)?)?;
    m.add_class::<tables::Tables>()?;
    Ok(())
}
