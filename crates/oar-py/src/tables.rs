//! `oar._oar.Tables`: one trainer's connection to a job's running servers, for a network that
//! runs in Python (PyTorch, Paddle, numpy). Rows and dense blocks are pulled into numpy arrays,
//! gradient sums pushed from them; the servers apply them with their own optimizers and row
//! lifecycle, exactly as a native trainer's. The connection is `oar::client::Client`, the one a
//! native trainer uses: the same handshake, credential, timeouts and exactly-once steps.
//!
//! Every call that can block releases the GIL. The client sits behind a mutex, so a second
//! thread's call waits for the first rather than interleaving frames on the sockets.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use numpy::ndarray::Array2;
use numpy::{IntoPyArray, PyArray1, PyArray2, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use serde::Deserialize;

use oar::client::{Client, ClientConfig, PushReport, StepHeader, TableGrads, TableIds};
use oar::model::TableConfig;
use oar::protocol::{Apply, RowCreation};
use oar::table::{DenseParam, DenseSpec, Init, Optimizer, TableSpec};
use oar::train::job_config::JobConfig;

use crate::{ConfigError, OarError};

/// What a Python trainer declares: the job file's table syntax, and its own dense parameters.
/// What it leaves out means what a job file's leaving it out means.
#[derive(Deserialize)]
#[serde(default, deny_unknown_fields)]
struct SpecArgs {
    /// Sparse tables, as a job file's `[model] tables`.
    tables: Vec<TableConfig>,
    /// Dense parameters kept on the servers (none: the network keeps its own).
    dense: Vec<DenseArg>,
    sparse_optimizer: Optimizer,
    dense_optimizer: Optimizer,
    seed: u64,
    block_size: usize,
    embedding_init: f32,
}

impl Default for SpecArgs {
    fn default() -> Self {
        let job = JobConfig::default();
        SpecArgs {
            tables: Vec::new(),
            dense: Vec::new(),
            sparse_optimizer: job.sparse_optimizer,
            dense_optimizer: job.dense_optimizer,
            seed: job.model.seed,
            block_size: job.model.block_size,
            embedding_init: job.model.embedding_init,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DenseArg {
    name: String,
    len: usize,
    #[serde(default = "zeros")]
    init: Init,
}

fn zeros() -> Init {
    Init::Zeros
}

impl SpecArgs {
    /// The tables as servers hold them, with the job file's defaults and checks.
    fn spec(&self) -> Result<TableSpec, String> {
        let sparse = self
            .tables
            .iter()
            .enumerate()
            .map(|(i, t)| t.spec(self.seed.wrapping_add(i as u64), self.embedding_init, self.sparse_optimizer))
            .collect();
        let params = self.dense.iter().map(|d| DenseParam::new(d.name.clone(), d.len, d.init)).collect();
        let dense = DenseSpec { params, block_size: self.block_size, seed: self.seed, optimizer: self.dense_optimizer };
        let spec = TableSpec { dense, sparse };
        spec.validate()?;
        let mut names = std::collections::HashSet::new();
        if let Some(t) = spec.sparse.iter().find(|t| !names.insert(t.name.as_str())) {
            return Err(format!("two tables are named {:?}", t.name));
        }
        Ok(spec)
    }
}

/// One table's part of a push: unique ids, gradient sums `[n, dim]`, shows and clicks `[n, 2]`.
type TableGradArrays<'py> = (PyReadonlyArray1<'py, u64>, PyReadonlyArray2<'py, f32>, PyReadonlyArray2<'py, f32>);

struct Inner {
    client: Option<Client>,
    trainer: u64,
    /// The last step pushed (steps count from 1) and the pass under way (from 1).
    step: u64,
    pass: u32,
    /// Barriers met so far.
    barriers: u64,
}

/// A trainer's connection to a job's servers, for a network that runs in Python.
#[pyclass(module = "oar._oar", name = "Tables")]
pub struct Tables {
    inner: Mutex<Inner>,
    spec: TableSpec,
    apply: Apply,
}

fn oar_err(e: impl std::fmt::Display) -> PyErr {
    OarError::new_err(e.to_string())
}

impl Tables {
    fn table(&self, name: &str) -> PyResult<(u32, usize)> {
        let found = self.spec.sparse.iter().position(|t| t.name == name);
        let Some(i) = found else {
            let names: Vec<&str> = self.spec.sparse.iter().map(|t| t.name.as_str()).collect();
            return Err(PyValueError::new_err(format!("no table '{name}': the tables are {}", names.join(", "))));
        };
        Ok((i as u32, self.spec.sparse[i].dim))
    }

    /// Runs `f` on the open client, the GIL released.
    fn with_client<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut Inner) -> Result<T, String> + Send,
    ) -> PyResult<T> {
        py.detach(|| {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if inner.client.is_none() {
                return Err("the connection is closed".to_string());
            }
            f(&mut inner)
        })
        .map_err(OarError::new_err)
    }
}

/// A C-ordered array's elements (a Fortran-ordered or strided one is refused: its memory is not
/// in the order the values are read).
fn c_order<'a, T: numpy::Element, D: numpy::ndarray::Dimension>(
    a: &'a numpy::PyReadonlyArray<'_, T, D>,
    what: &str,
) -> PyResult<&'a [T]> {
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err(format!("{what}: a C-contiguous array, please (np.ascontiguousarray)")));
    }
    a.as_slice().map_err(|e| PyValueError::new_err(format!("{what}: {e}")))
}

#[pymethods]
impl Tables {
    /// Connects as trainer `trainer` of job `job` to `servers` and declares `spec` (a dict:
    /// `tables` in the job file's syntax, `dense` parameters `{name, len, init}` kept on the
    /// servers, `sparse_optimizer`, `dense_optimizer`, `seed`, `block_size`, `embedding_init`);
    /// with the job's TLS, `tls_ca` (and `tls_name`, the name the servers' certificate holds).
    #[new]
    #[pyo3(signature = (servers, spec, *, trainer, job = "oar".to_string(), secret_file = None, tls_ca = None,
                        tls_name = oar::security::tls::DEFAULT_NAME.to_string(),
                        connect_timeout = 60.0, reply_timeout = 600.0, scale_stale = false))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        servers: Vec<String>,
        spec: &Bound<'_, PyAny>,
        trainer: u64,
        job: String,
        secret_file: Option<PathBuf>,
        tls_ca: Option<PathBuf>,
        tls_name: String,
        connect_timeout: f64,
        reply_timeout: f64,
        scale_stale: bool,
    ) -> PyResult<Tables> {
        let args: SpecArgs = pythonize::depythonize(spec).map_err(|e| ConfigError::new_err(format!("spec: {e}")))?;
        let spec = args.spec().map_err(|e| ConfigError::new_err(format!("spec: {e}")))?;
        // Bounded as the command line's waits are: far past any job's, far from a clock's overflow.
        let max = oar::train::job_config::MAX_SECONDS;
        let seconds = |s: f64, what: &str| match Duration::try_from_secs_f64(s) {
            Ok(d) if d.as_secs() <= max => Ok(d),
            _ => Err(PyValueError::new_err(format!("{what}: {s} seconds; a wait is 0 to {max} seconds"))),
        };
        let mut config = ClientConfig::new(
            servers,
            &job,
            seconds(connect_timeout, "connect_timeout")?,
            seconds(reply_timeout, "reply_timeout")?,
        )
        .as_trainer(trainer);
        let declared = spec.clone();
        let client = py
            .detach(|| -> anyhow::Result<Client> {
                if let Some(path) = &secret_file {
                    config.secret = Some(oar::security::auth::Secret::read(path)?);
                }
                if let Some(ca) = &tls_ca {
                    config.tls = Some(oar::security::tls::client_config(ca, &tls_name)?);
                }
                config.identity()?;
                let mut client = Client::connect(&config)?;
                let model = serde_json::json!({ "python": true });
                client.declare_model(&declared, model)?;
                Ok(client)
            })
            .map_err(|e| OarError::new_err(format!("{e:#}")))?;
        let apply = if scale_stale { Apply::StalenessScaled } else { Apply::Now };
        let inner = Inner { client: Some(client), trainer, step: 0, pass: 1, barriers: 0 };
        Ok(Tables { inner: Mutex::new(inner), spec, apply })
    }

    /// The tables' names and floats per row, in declaration order.
    #[getter]
    fn tables(&self) -> Vec<(String, usize)> {
        self.spec.sparse.iter().map(|t| (t.name.clone(), t.dim)).collect()
    }

    /// Floats of the dense parameters kept on the servers.
    #[getter]
    fn dense_len(&self) -> usize {
        self.spec.dense.total()
    }

    /// The last step pushed (0 before the first) and the pass under way.
    #[getter]
    fn position(&self) -> (u64, u32) {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        (inner.step, inner.pass)
    }

    /// Rows of `ids` (unique u64 ids, a 1-d array) of table `table`: a float32 array
    /// `[len(ids), dim]`, and the servers' version the rows are of (for the push of their
    /// gradients). Absent rows are created (`create=False`: zeros, nothing stored).
    #[pyo3(signature = (table, ids, create = true))]
    fn pull<'py>(
        &self,
        py: Python<'py>,
        table: &str,
        ids: PyReadonlyArray1<'py, u64>,
        create: bool,
    ) -> PyResult<(Bound<'py, PyArray2<f32>>, u64)> {
        let (index, dim) = self.table(table)?;
        let ids = c_order(&ids, "ids")?;
        let create = if create { RowCreation::Create } else { RowCreation::Peek };
        let (rows, version) = self.with_client(py, |inner| {
            let mut rows = vec![Vec::new()];
            let tables = [TableIds { table: index, dim, ids }];
            let client = inner.client.as_mut().expect("checked open");
            let version = client.pull(None, &tables, &mut rows, create).map_err(|e| e.to_string())?;
            Ok((rows.pop().unwrap_or_default(), version))
        })?;
        let rows = Array2::from_shape_vec((ids.len(), dim), rows).map_err(oar_err)?;
        Ok((rows.into_pyarray(py), version))
    }

    /// The dense parameters kept on the servers, one flat float32 array, and their version.
    fn pull_dense<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyArray1<f32>>, u64)> {
        let (dense, version) = self.with_client(py, |inner| {
            let mut dense = Vec::new();
            let client = inner.client.as_mut().expect("checked open");
            let version =
                client.pull(Some(&mut dense), &[], &mut [], RowCreation::Create).map_err(|e| e.to_string())?;
            Ok((dense, version))
        })?;
        Ok((dense.into_pyarray(py), version))
    }

    /// Pushes one step: per table, `(ids, grads, counts)` (unique u64 ids; float32 gradient sums
    /// `[len(ids), dim]`; float32 shows and clicks `[len(ids), 2]`), the dense gradient (float32,
    /// `dense_len` floats) if the servers keep dense parameters, the version the step's pulls
    /// returned (the lowest), and the samples the sums cover. Returns `(discarded, staleness)`:
    /// servers that discarded the push as too stale, and how many updates old it arrived.
    #[pyo3(signature = (grads, *, base_version, samples, dense = None))]
    fn push<'py>(
        &self,
        py: Python<'py>,
        grads: BTreeMap<String, TableGradArrays<'py>>,
        base_version: u64,
        samples: usize,
        dense: Option<PyReadonlyArray1<'py, f32>>,
    ) -> PyResult<(usize, u64)> {
        let mut tables = Vec::with_capacity(grads.len());
        for (name, (ids, g, counts)) in &grads {
            let (index, dim) = self.table(name)?;
            let n = ids.len();
            if g.shape() != [n, dim] || counts.shape() != [n, 2] {
                return Err(PyValueError::new_err(format!(
                    "table '{name}': {n} ids take gradients [{n}, {dim}] and counts [{n}, 2], not {:?} and {:?}",
                    g.shape(),
                    counts.shape()
                )));
            }
            let (ids, g, counts) = (c_order(ids, "ids")?, c_order(g, "grads")?, c_order(counts, "counts")?);
            tables.push(TableGrads { table: index, dim, ids, counts, grads: g });
        }
        let dense = dense.as_ref().map(|d| c_order(d, "dense")).transpose()?;
        if dense.is_some_and(|d| d.len() != self.spec.dense.total()) {
            let n = dense.map_or(0, <[f32]>::len);
            return Err(PyValueError::new_err(format!(
                "dense: {n} floats, the servers keep {}",
                self.spec.dense.total()
            )));
        }
        if dense.is_none() && tables.is_empty() {
            return Err(PyTypeError::new_err("push: nothing to push (no tables, no dense gradient)"));
        }
        let apply = self.apply;
        let report: PushReport = self.with_client(py, |inner| {
            let header = StepHeader {
                trainer: inner.trainer as usize,
                step: inner.step + 1,
                pass: inner.pass,
                base_version,
                samples,
                apply,
            };
            let client = inner.client.as_mut().expect("checked open");
            let report = client.push(&header, dense, &tables).map_err(|e| e.to_string())?;
            inner.step += 1;
            Ok(report)
        })?;
        Ok((report.discarded, report.staleness))
    }

    /// Ends the pass under way on every server (a sync job's servers wait for every trainer's).
    fn end_pass(&self, py: Python<'_>) -> PyResult<u32> {
        self.with_client(py, |inner| {
            let (trainer, pass) = (inner.trainer as usize, inner.pass);
            inner.client.as_mut().expect("checked open").end_pass(trainer, pass).map_err(|e| e.to_string())?;
            inner.pass += 1;
            Ok(pass)
        })
    }

    /// Waits until every trainer of the job has called `barrier` as often (at server 0, within
    /// the servers' `--timeout`, whose error names who is missing).
    fn barrier(&self, py: Python<'_>) -> PyResult<u64> {
        self.with_client(py, |inner| {
            inner.barriers += 1;
            let (trainer, epoch) = (inner.trainer as usize, inner.barriers);
            inner.client.as_mut().expect("checked open").barrier(trainer, epoch).map_err(|e| e.to_string())?;
            Ok(epoch)
        })
    }

    /// Every server's counters (a dict each: version, pushes, applied samples per trainer, rows
    /// per table, ...).
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let stats = self
            .with_client(py, |inner| inner.client.as_mut().expect("checked open").stats().map_err(|e| e.to_string()))?;
        Ok(pythonize::pythonize(py, &stats)?.unbind())
    }

    /// Tells every server this trainer is done (when every trainer has, they save the model
    /// and stop); the connection is closed. Closing again does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            let trainer = inner.trainer as usize;
            match inner.client.take() {
                Some(mut client) => client.close(trainer).map_err(|e| e.to_string()),
                None => Ok(()),
            }
        })
        .map_err(OarError::new_err)
    }
}
