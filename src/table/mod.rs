//! Server-side model state: the part of every table that one server owns (a [`Shard`]).
//!
//! A [`TableSpec`] describes the whole model's parameters. The dense parameters (`DenseParam`s,
//! cut into blocks) each have an initializer and an `Update`: the dense optimizer, or Paddle's
//! summary rule for the statistics a layer keeps (`data_norm`'s counts and sums). Each sparse
//! embedding table has a `SparseSpec` of its own: its dim, initializer, optimizer and learning
//! rate, its accessor (the row statistics and their rules), its admission entry and its capacity.
//! Trainers deduplicate ids per table, and the same id in two tables is two rows.
//!
//! Initial values depend only on a counter, (seed, global position) for dense floats and (table
//! seed, id) for sparse rows, never on how many servers there are or on the order pushes arrive
//! in; with sync steps summed in trainer order, 1 server and 3 servers train the very same model,
//! which the integration tests check bit for bit.
//!
//! This module does no I/O and knows nothing of the network: the server, the local trainer and
//! the offline evaluator all use it directly. The memory under the sparse rows, and every
//! `unsafe` block of the tables but the call of the optimizers' AVX2 build (after the CPU is
//! checked), is [`mem`]'s.

pub mod accessor;
pub mod admit;
pub mod dense;
pub mod init;
pub mod mem;
pub mod optim;
pub mod paddle_rules;
pub mod sparse;
pub mod stripe;

#[cfg(test)]
mod lifecycle_tests;

use serde::{Deserialize, Serialize};

pub use accessor::{Accessor, RowStats};
pub use admit::Entry;
pub use dense::DenseShard;
pub use init::Init;
pub use optim::{Optimizer, OptimizerKind};
pub use sparse::SparseTable;

use crate::base::layout::{mix64, DenseLayout};

/// One named dense parameter (a weight matrix or bias), a slice of the flat dense vector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseParam {
    /// Name, for messages and checkpoints.
    pub name: String,
    /// Number of floats.
    pub len: usize,
    /// Initializer.
    pub init: Init,
    /// How the servers update it.
    #[serde(default, skip_serializing_if = "Update::is_optimizer")]
    pub update: Update,
}

impl DenseParam {
    /// A parameter the dense optimizer trains.
    pub fn new(name: impl Into<String>, len: usize, init: Init) -> DenseParam {
        DenseParam { name: name.into(), len, init, update: Update::Optimizer }
    }

    /// A statistic the servers accumulate with Paddle's summary rule (see [`Update::Summary`]).
    pub fn summary(name: impl Into<String>, len: usize, init: Init, decay: f32) -> DenseParam {
        DenseParam { name: name.into(), len, init, update: Update::Summary { decay } }
    }
}

/// The flat ranges of the summary statistics among `params` (in flat-vector order), with their
/// decay.
pub fn summaries(params: &[DenseParam]) -> Vec<(std::ops::Range<usize>, f32)> {
    let mut start = 0;
    let mut out = Vec::new();
    for p in params {
        if let Update::Summary { decay } = p.update {
            out.push((start..start + p.len, decay));
        }
        start += p.len;
    }
    out
}

/// How the servers update a dense parameter from what trainers push for it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Update {
    /// The dense optimizer, on the pushed gradient sums' batch mean.
    #[default]
    Optimizer,
    /// Paddle's summary rule for non-trained statistics (`data_norm`'s batch size, sum and
    /// square sum, kept by its parameter servers): `p = decay * p + s`, with `s` the pushed sums
    /// as they are (no batch mean, no learning rate). Sums add over trainers and threads, so
    /// a sync step applies what one trainer with the whole batch would.
    Summary {
        /// Factor on the old value per update (Paddle's `summary_decay_rate`).
        decay: f32,
    },
}

impl Update {
    /// True for [`Update::Optimizer`].
    pub fn is_optimizer(&self) -> bool {
        *self == Update::Optimizer
    }
}

/// All dense parameters of a model, concatenated in order into one flat vector.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseSpec {
    /// The parameters, in their order in the flat vector.
    pub params: Vec<DenseParam>,
    /// Floats per block when the vector is dealt to servers.
    pub block_size: usize,
    /// Seed of the initializers.
    pub seed: u64,
    /// Optimizer applied to every dense float.
    pub optimizer: Optimizer,
}

impl DenseSpec {
    /// Total number of dense floats.
    pub fn total(&self) -> usize {
        self.params.iter().map(|p| p.len).sum()
    }

    /// The flat vector's layout over `num_servers` servers.
    pub fn layout(&self, num_servers: usize) -> DenseLayout {
        DenseLayout { total: self.total(), block_size: self.block_size, num_servers }
    }

    /// Writes the initial values of the flat range starting at `start` into `out`.
    pub fn init_range(&self, start: usize, out: &mut [f32]) {
        let mut param_start = 0;
        for p in &self.params {
            let (lo, hi) = (param_start.max(start), (param_start + p.len).min(start + out.len()));
            for g in lo..hi {
                out[g - start] = p.init.value(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ g as u64);
            }
            param_start += p.len;
        }
    }
}

/// One sparse embedding table: rows of `dim` floats keyed by u64 feature ids.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SparseSpec {
    /// Name, for messages and checkpoints.
    pub name: String,
    /// Floats per row.
    pub dim: usize,
    /// Seed of the row initializer.
    pub seed: u64,
    /// Initializer of new rows.
    pub init: Init,
    /// Optimizer of this table, with its own learning rate.
    pub optimizer: Optimizer,
    /// Row statistics and the rules on them (Paddle's `ctr_accessor_param`).
    #[serde(default)]
    pub accessor: Accessor,
    /// Admission of new ids (Paddle's entry attribute).
    #[serde(default)]
    pub entry: Entry,
    /// Most rows each server holds; a new row beyond it evicts the lowest-score row near it.
    /// None: unbounded.
    #[serde(default)]
    pub capacity: Option<u64>,
    /// Cells (3 bytes each) of each server's count filter, with `count_filter_entry`: ids
    /// counted at once before some lose their count.
    #[serde(default = "default_filter_capacity")]
    pub filter_capacity: usize,
    /// With `count_filter_entry`: a pending id unseen for more than this many days is
    /// forgotten. None: the accessor's `delete_after_unseen_days`, the rule rows follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter_forget_after_days: Option<f32>,
}

/// Default count-filter cells per table and server: 4 Mi ids, 12 MiB.
pub const DEFAULT_FILTER_CAPACITY: usize = 1 << 22;

fn default_filter_capacity() -> usize {
    DEFAULT_FILTER_CAPACITY
}

impl SparseSpec {
    /// A table of `dim` floats with Paddle's default statistics, every id admitted, no capacity.
    pub fn new(name: &str, dim: usize, seed: u64, init: Init, optimizer: Optimizer) -> SparseSpec {
        SparseSpec {
            name: name.into(),
            dim,
            seed,
            init,
            optimizer,
            accessor: Accessor::default(),
            entry: Entry::All,
            capacity: None,
            filter_capacity: DEFAULT_FILTER_CAPACITY,
            filter_forget_after_days: None,
        }
    }

    /// Days a pending id of the count filter may go unseen before it is forgotten.
    pub fn filter_forget_after(&self) -> f32 {
        self.filter_forget_after_days.unwrap_or(self.accessor.delete_after_unseen_days)
    }

    /// Floats per full row as checkpoints store it: weights, statistics, optimizer state.
    pub fn row_len(&self) -> usize {
        self.dim + accessor::STATS + self.optimizer.state_len(self.dim)
    }

    /// Cells of each stripe's admission filter (0 without a count filter): the table's
    /// `filter_capacity` dealt over the stripes, in whole buckets.
    pub fn filter_cells_per_stripe(&self) -> usize {
        match self.entry {
            Entry::Count(_) => admit::cells_for(self.filter_capacity.div_ceil(crate::base::layout::STRIPES)),
            _ => 0,
        }
    }

    /// Bytes of each server's admission filter for this table.
    pub fn filter_bytes(&self) -> u64 {
        match self.entry {
            Entry::Count(_) => 3 * self.filter_capacity as u64,
            _ => 0,
        }
    }

    /// Whether rows are created only by pushes (an admission rule or a capacity), never by a
    /// training pull.
    pub fn creates_on_push(&self) -> bool {
        !self.entry.admits_all() || self.capacity.is_some()
    }

    /// Writes the initial weights of row `id` into `out` (`dim` floats).
    pub fn init_row(&self, id: u64, out: &mut [f32]) {
        let base = mix64(self.seed ^ mix64(id));
        for (j, w) in out.iter_mut().enumerate() {
            *w = self.init.value(base.wrapping_add(j as u64));
        }
    }
}

/// One table's rows in a base or delta save, as a serving system loads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TableExport {
    /// Ids of the rows kept.
    pub ids: Vec<u64>,
    /// Their weights, `dim` floats each, as a pull reads them.
    pub weights: Vec<f32>,
    /// A delta's ids removed since the last save (a shrink or an eviction); none in a base.
    pub deleted: Vec<u64>,
}

/// Every parameter of a model: what trainers declare to servers and checkpoints record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSpec {
    /// The dense parameters.
    pub dense: DenseSpec,
    /// The sparse tables, addressed by their index.
    pub sparse: Vec<SparseSpec>,
}

impl TableSpec {
    /// The tables as GEO-SGD's servers hold them: every rule [`OptimizerKind::Sum`], so a push
    /// (a trainer's share of its change) is added as it is. Everything else as declared.
    pub fn summed(&self) -> TableSpec {
        let mut spec = self.clone();
        spec.dense.optimizer = Optimizer::sum();
        for t in &mut spec.sparse {
            t.optimizer = Optimizer::sum();
        }
        spec
    }

    /// How many of the rules (the dense one, then one per sparse table) are
    /// [`OptimizerKind::Sum`], and of how many: a GEO job's servers need all, others none.
    pub fn sum_rules(&self) -> (usize, usize) {
        let rules = std::iter::once(&self.dense.optimizer).chain(self.sparse.iter().map(|t| &t.optimizer));
        (rules.filter(|o| o.kind == OptimizerKind::Sum).count(), 1 + self.sparse.len())
    }

    /// Checks sizes and optimizers.
    pub fn validate(&self) -> Result<(), String> {
        if self.dense.block_size == 0 {
            return Err("dense block_size must be positive".into());
        }
        self.dense.optimizer.validate("dense")?;
        for p in &self.dense.params {
            p.init.check().map_err(|e| format!("dense parameter {}: {e}", p.name))?;
            if let Update::Summary { decay } = p.update {
                if !(0.0..=1.0).contains(&decay) {
                    return Err(format!("dense parameter {}: summary decay must be in [0, 1], got {decay}", p.name));
                }
            }
        }
        if self.dense.optimizer.kind.is_paddle() {
            return Err(format!(
                "the dense optimizer is sgd, adagrad, adam or adam_d2sum: {:?} is one of Paddle's sparse rules",
                self.dense.optimizer.kind
            ));
        }
        for t in &self.sparse {
            if t.optimizer.kind == OptimizerKind::AdamD2Sum {
                return Err(format!(
                    "sparse table {}: adam_d2sum is Paddle's dense rule; for Paddle's Adam on a sparse table use sparse_adam or sparse_shared_adam",
                    t.name
                ));
            }
            if t.dim == 0 {
                return Err(format!("sparse table {} has dim 0", t.name));
            }
            t.optimizer.validate(&format!("sparse table {}", t.name))?;
            t.init.check().map_err(|e| format!("sparse table {}: {e}", t.name))?;
            t.accessor.validate(&t.name)?;
            if t.accessor.embedx_threshold > 0.0 && t.optimizer.prefix_state_len(1).is_none() {
                return Err(format!(
                    "sparse table {}: embedx_threshold needs an optimizer whose state splits by weight (sgd, adagrad, sparse_naive or std_adagrad)",
                    t.name
                ));
            }
            if t.capacity == Some(0) {
                return Err(format!("sparse table {}: capacity 0 holds no row; leave it out for no bound", t.name));
            }
            if matches!(t.entry, Entry::Count(_)) && !(1..=1 << 32).contains(&t.filter_capacity) {
                return Err(format!("sparse table {}: filter_capacity must be in 1..=2^32", t.name));
            }
            if let Some(d) = t.filter_forget_after_days {
                if !(d.is_finite() && d >= 0.0) {
                    return Err(format!(
                        "sparse table {}: filter_forget_after_days must be a number of days, 0 or more, not {d}",
                        t.name
                    ));
                }
            }
        }
        // What a shard file of these tables may hold (a reader refuses more): a local job's
        // filter of 2^32 cells aborted on allocation where a server refused it.
        let empty = empty_sparse_bytes(self);
        if empty > MAX_EMPTY_TABLE_BYTES {
            return Err(format!(
                "the sparse tables take {} MiB before any row (admission filters: filter_capacity), more than the {} \
                 MiB a saved model's tables may: lower filter_capacity",
                empty >> 20,
                MAX_EMPTY_TABLE_BYTES >> 20
            ));
        }
        Ok(())
    }
}

/// The largest magnitude a pushed float may have. Finite values past it are a diverging
/// model's (or a hostile peer's), and they overflow where finite ones should not: two trainers'
/// 3e38 summed by a sync step, or two SGD steps of 3e38, made infinities and then NaNs in the
/// model. Bounded, the sum of any number of trainers' pushes is finite, as is a square of one
/// (1e36), so an optimizer's update of finite state stays finite.
pub const MAX_PUSHED: f32 = 1e18;

/// What [`all_pushable`] refuses, for messages.
pub const NOT_PUSHABLE: &str = "a NaN, an infinity or a value beyond ±1e18";

/// Whether every float of `values` is finite and at most [`MAX_PUSHED`] in magnitude: the rule a
/// push must pass before it touches a model, on a server (`server::push`) as in local training
/// (`train::store`).
pub fn all_pushable<'a>(values: impl IntoIterator<Item = &'a [f32]>) -> bool {
    // `!(x.abs() <= MAX)` is true for a NaN as for a value too large.
    values.into_iter().all(|v| every_float(v, |x| x.abs() <= MAX_PUSHED))
}

/// Whether `ok` holds for every float of `v`. Blocks of 64 are tested without an exit per
/// float, which the compiler makes vector compares: a push's 1.3 MB of gradients took about 4%
/// of its handling float by float.
pub fn every_float(v: &[f32], ok: impl Fn(f32) -> bool) -> bool {
    let (blocks, rest) = v.as_chunks::<64>();
    blocks.iter().all(|b| b.iter().fold(true, |all, &x| all & ok(x))) && rest.iter().all(|&x| ok(x))
}

/// What a refusal of a non-finite push tells the user to do.
pub const NONFINITE_HINT: &str =
    "a diverging model: lower the learning rate, or clip gradients; or input values too large for the model: scale them";

/// Widest sparse row a declaration or a shard file may hold, in floats: far beyond any
/// embedding in use, and small enough that an empty table's first slots stay small.
pub const MAX_DIM: usize = 1 << 16;
/// Most sparse tables a declaration or a shard file may hold.
pub const MAX_TABLES: usize = 4096;

/// Bytes the empty sparse tables of `spec` take before their first row (each table's 64
/// stripes of one index bucket and a stripe's bookkeeping; slab chunks come with rows), and
/// their admission filters: what a declaration or a shard file costs before anything it holds,
/// checked against a budget before it is allocated.
pub fn empty_sparse_bytes(spec: &TableSpec) -> u64 {
    let stripe = (64 + std::mem::size_of::<stripe::Stripe>()) as u64;
    spec.sparse.iter().map(|t| 64 * stripe + t.filter_bytes()).sum()
}

/// The most bytes the empty tables of a shard file may take: twice the servers' default
/// declaration budget (`--max-declare-mb`), so no file can make a reader allocate more.
pub const MAX_EMPTY_TABLE_BYTES: u64 = 2 << 30;

/// Errors of table operations; each names the table and what was wrong.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TableError {
    /// A request named a sparse table that does not exist.
    #[error("no sparse table {table} (this model has {count})")]
    UnknownTable {
        /// Requested index.
        table: usize,
        /// Number of sparse tables.
        count: usize,
    },
    /// An array had the wrong length.
    #[error("{what}: expected {expected} floats, got {got}")]
    LengthMismatch {
        /// Which array.
        what: String,
        /// Expected length.
        expected: usize,
        /// Actual length.
        got: usize,
    },
    /// One of a table's 64 stripes numbers no more rows (a row number has 24 bits).
    #[error("sparse table {table}: a stripe is full at {rows} rows")]
    StripeFull {
        /// The table.
        table: String,
        /// Rows the stripe holds.
        rows: usize,
    },
}

/// One server's share of every table: its dense blocks and its rows of every sparse table.
pub struct Shard {
    /// The model's full spec.
    pub spec: TableSpec,
    /// This server's index.
    pub index: usize,
    /// Number of servers the model is spread over.
    pub num_servers: usize,
    /// The dense blocks this server owns.
    pub dense: parking_lot::Mutex<DenseShard>,
    /// Dense floats this server owns (fixed at creation: checked per push without the lock).
    pub dense_len: usize,
    /// This server's rows of each sparse table.
    pub sparse: Vec<SparseTable>,
}

impl Shard {
    /// A freshly initialized shard for server `index` of `num_servers`.
    pub fn new(spec: TableSpec, index: usize, num_servers: usize) -> Shard {
        let dense = DenseShard::new(&spec.dense, index, num_servers);
        let sparse = spec.sparse.iter().map(|s| SparseTable::new(s.clone())).collect();
        let dense_len = dense.len();
        Shard { spec, index, num_servers, dense: parking_lot::Mutex::new(dense), dense_len, sparse }
    }

    /// Applies one update: dense gradient sums for the owned blocks (empty: none) and sparse
    /// gradient sums as (table, ids, shows and clicks, grads), all sums over `samples` samples.
    /// The dense optimizer's learning rate is multiplied by `dense_lr_factor` (staleness-scaled
    /// steps).
    pub fn apply<'a>(
        &self,
        dense: &[f32],
        sparse: impl IntoIterator<Item = (usize, &'a [u64], &'a [f32], &'a [f32])>,
        samples: u64,
        dense_lr_factor: f32,
    ) -> Result<(), TableError> {
        let scale = 1.0 / samples.max(1) as f32;
        if !dense.is_empty() {
            self.dense.lock().apply(dense, scale, dense_lr_factor)?;
        }
        for (table, ids, counts, grads) in sparse {
            self.table(table)?.push(ids, counts, grads, scale)?;
        }
        Ok(())
    }

    /// The sparse table at `table`, or a typed error.
    pub fn table(&self, table: usize) -> Result<&SparseTable, TableError> {
        self.sparse.get(table).ok_or(TableError::UnknownTable { table, count: self.sparse.len() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_depends_only_on_seed_and_position() {
        let spec = DenseSpec {
            params: vec![DenseParam::new("w", 10, Init::Uniform { scale: 0.5 }), DenseParam::new("b", 3, Init::Zeros)],
            block_size: 4,
            seed: 7,
            optimizer: Optimizer::sgd(0.1),
        };
        let mut all = vec![0.0; 13];
        spec.init_range(0, &mut all);
        let mut part = vec![0.0; 5];
        spec.init_range(8, &mut part);
        assert_eq!(&all[8..13], &part[..]);
        assert!(all[..10].iter().all(|v| v.abs() <= 0.5) && all[..10].iter().any(|v| *v != 0.0));
        assert_eq!(&all[10..], &[0.0; 3]);
    }

    #[test]
    fn summary_statistics_take_the_pushed_sums_with_their_decay_across_blocks_and_servers() {
        // w (3, sgd 0.5) then a statistic of 4 (decay 0.5) across blocks of 2 on 2 servers:
        // blocks [w0 w1] [w2 s0] [s1 s2] [s3]; server 0 owns blocks 0 and 2, server 1 1 and 3.
        let spec = DenseSpec {
            params: vec![
                DenseParam::new("w", 3, Init::Constant { value: 1.0 }),
                DenseParam::summary("s", 4, Init::Constant { value: 10.0 }, 0.5),
            ],
            block_size: 2,
            seed: 1,
            optimizer: Optimizer::sgd(0.5),
        };
        let mut servers: Vec<DenseShard> = (0..2).map(|i| DenseShard::new(&spec, i, 2)).collect();
        // Sums over 4 samples: the weights' gradients are means (scale 1/4), the statistic's
        // sums are taken as they are.
        servers[0].apply(&[4.0, 8.0, 1.0, 2.0], 0.25, 1.0).unwrap();
        servers[1].apply(&[4.0, 3.0, 4.0], 0.25, 1.0).unwrap();
        let read = |s: &DenseShard| {
            let mut v = Vec::new();
            s.read(&mut v);
            v
        };
        // Server 0: w0 = 1 - 0.5 * 1, w1 = 1 - 0.5 * 2; s1 = 5 + 1, s2 = 5 + 2.
        assert_eq!(read(&servers[0]), [0.5, 0.0, 6.0, 7.0]);
        // Server 1: w2 = 1 - 0.5 * 1; s0 = 5 + 3; s3 = 5 + 4.
        assert_eq!(read(&servers[1]), [0.5, 8.0, 9.0]);
        let bad = TableSpec {
            dense: DenseSpec { params: vec![DenseParam::summary("s", 1, Init::Zeros, f32::NAN)], ..spec },
            sparse: Vec::new(),
        };
        assert!(bad.validate().unwrap_err().contains("decay"));
    }

    #[test]
    fn sparse_rows_depend_on_id_and_seed() {
        let spec = SparseSpec::new("emb", 4, 1, Init::Uniform { scale: 0.01 }, Optimizer::adagrad(0.1));
        let (mut a, mut b, mut c) = ([0.0; 4], [0.0; 4], [0.0; 4]);
        spec.init_row(42, &mut a);
        spec.init_row(42, &mut b);
        spec.init_row(43, &mut c);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let other = SparseSpec { seed: 2, ..spec.clone() };
        other.init_row(42, &mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn a_push_must_be_finite_and_at_most_1e18_in_magnitude() {
        let ok: [&[f32]; 2] = [&[0.0, -1e18, 1e18], &[f32::MIN_POSITIVE]];
        assert!(all_pushable(ok));
        for bad in [f32::NAN, f32::INFINITY, -f32::INFINITY, 1.0001e18, -3e38] {
            assert!(!all_pushable([&[1.0, bad][..]]), "{bad}");
            // Checked in blocks of 64 and a rest: a bad float found at every place of either,
            // in the second array as in the first.
            for at in [0, 1, 63, 64, 127, 128, 129, 130] {
                let mut v = vec![1.0f32; 131];
                v[at] = bad;
                assert!(!all_pushable([&v[..]]) && !all_pushable([&[1.0][..], &v[..]]), "{bad} at {at}");
            }
        }
        assert!(all_pushable([&[1e18f32; 131][..]]));
        // Any sum of bounded pushes, and any square of one, stays finite in f32.
        assert!((MAX_PUSHED * MAX_PUSHED).is_finite() && (MAX_PUSHED * 65_536.0 * 65_536.0).is_finite());
    }
}
