//! Training data: which files a trainer reads, how lines become [`Batch`]es, and generated
//! Criteo-format data for demos and benchmarks.
//!
//! Parsing runs on a reader thread that prefetches batches into a bounded channel, so the
//! training thread only ever waits on a ready batch. Errors name the file and line.

pub mod criteo;
pub mod files;
pub mod gen;
pub mod reader;

pub use files::{list_files, shard_files};
pub use reader::{DataError, Reader, ReaderConfig};

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
