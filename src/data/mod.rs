//! Training data: which files a trainer reads, how lines become [`Batch`]es, and generated
//! Criteo-format data for demos and benchmarks.
//!
//! Parsing runs on a reader thread that prefetches batches into a bounded channel, so the
//! training thread only ever waits on a ready batch. Errors name the file and line.

pub mod criteo;
pub mod fetch;
pub mod files;
pub mod gen;
pub mod plain;
pub mod prepare;
pub mod reader;

pub use files::{list_files, shard_files};
pub use reader::{DataError, Reader, ReaderConfig};

use serde::{Deserialize, Serialize};

/// The line format of data files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Criteo TSV: label, 13 integers, 26 hex categorical values ([`criteo`]).
    Criteo,
    /// Whitespace-separated label, dense values and ids ([`plain`]).
    Plain,
}

/// How a job's data files are read: the `[data]` section of a job file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// The line format.
    pub format: Format,
    /// A shell command run over each file (the file on its stdin); its output is read instead
    /// of the file (PaddlePaddle's `pipe_command`, e.g. `"zcat"` or `"grep -v ^#"`).
    pub pipe_command: Option<String>,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig { format: Format::Criteo, pipe_command: None }
    }
}

/// A mini-batch in columnar form: `labels[r]`, `dense[r * dense_width ..]`, `ids[r * slots ..]`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// One label per sample.
    pub labels: Vec<f32>,
    /// Dense features, `dense_width` per sample.
    pub dense: Vec<f32>,
    /// Sparse feature ids, `slots` per sample (one id per slot).
    pub ids: Vec<u64>,
    /// Dense features per sample.
    pub dense_width: usize,
    /// Sparse slots per sample.
    pub slots: usize,
}

impl Batch {
    /// An empty batch of the given shape.
    pub fn new(dense_width: usize, slots: usize) -> Batch {
        Batch { dense_width, slots, ..Batch::default() }
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// True if the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Samples `range` as a new batch.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Batch {
        Batch {
            labels: self.labels[range.clone()].to_vec(),
            dense: self.dense[range.start * self.dense_width..range.end * self.dense_width].to_vec(),
            ids: self.ids[range.start * self.slots..range.end * self.slots].to_vec(),
            dense_width: self.dense_width,
            slots: self.slots,
        }
    }

    /// Appends all samples of `other` (same shape).
    pub fn extend(&mut self, other: &Batch) {
        self.labels.extend_from_slice(&other.labels);
        self.dense.extend_from_slice(&other.dense);
        self.ids.extend_from_slice(&other.ids);
    }
}
