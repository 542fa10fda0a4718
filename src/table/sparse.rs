//! One server's rows of a sparse embedding table.
//!
//! Layout (chosen from the measurements in `../shared/research/deps.md`): the table is split into
//! [`STRIPES`] stripes, each behind its own mutex; a stripe is a hashbrown index (foldhash)
//! from id to row number plus a slab of fixed-size chunks holding rows `[weights | optimizer
//! state]` contiguously. The slab keeps memory near the payload (no doubling copies of whole
//! rows when the index grows) and a batch takes each stripe's lock once: positions are grouped
//! by stripe first, so two requests touching different stripes never wait on each other.

use parking_lot::Mutex;

use super::index::IdIndex;
use super::{SparseSpec, TableError};
use crate::layout::{group_positions, mix64, stripe_of, STRIPES};

/// Rows per slab chunk: big enough to amortize allocation, small enough to waste little.
const CHUNK_ROWS: usize = 4096;
/// Row number standing for "no such row".
const ABSENT: u32 = u32::MAX;
/// How many rows ahead a batched copy prefetches.
const PREFETCH_DISTANCE: usize = 8;

struct Stripe {
    index: IdIndex,
    chunks: Vec<Box<[f32]>>,
    rows: usize,
}

impl Stripe {
    fn row_mut(&mut self, row: u32, row_len: usize) -> &mut [f32] {
        let (c, r) = (row as usize / CHUNK_ROWS, row as usize % CHUNK_ROWS);
        &mut self.chunks[c][r * row_len..(r + 1) * row_len]
    }

    fn row(&self, row: u32, row_len: usize) -> &[f32] {
        let (c, r) = (row as usize / CHUNK_ROWS, row as usize % CHUNK_ROWS);
        &self.chunks[c][r * row_len..(r + 1) * row_len]
    }

    /// Stores a new row for `id` (absent until now), initialized by `init`; returns its number.
    fn insert(&mut self, id: u64, row_len: usize, init: impl FnOnce(&mut [f32])) -> u32 {
        let r = self.rows as u32;
        if self.rows % CHUNK_ROWS == 0 {
            self.chunks.push(vec![0.0; CHUNK_ROWS * row_len].into_boxed_slice());
        }
        self.rows += 1;
        self.index.insert(id, r);
        init(self.row_mut(r, row_len));
        r
    }

    /// The row of `id`, created (by `init`) if absent.
    fn get_or_insert(&mut self, id: u64, row_len: usize, init: impl FnOnce(&mut [f32])) -> &mut [f32] {
        let row = match self.index.get(id) {
            Some(r) => r,
            None => self.insert(id, row_len, init),
        };
        self.row_mut(row, row_len)
    }

    /// Hints the CPU to start loading the first `len` floats of row `row`: every cache line they
    /// touch (rows are not line-aligned, so even a 40-byte span may cross a line).
    #[inline]
    fn prefetch(&self, row: u32, row_len: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        if row != ABSENT {
            let (c, r) = (row as usize / CHUNK_ROWS, row as usize % CHUNK_ROWS);
            let span = &self.chunks[c][r * row_len..r * row_len + len];
            let (first, last) = (span.as_ptr() as usize, span.as_ptr() as usize + len * 4 - 1);
            for line in (first & !63..=last).step_by(64) {
                // SAFETY: prefetching is only a hint; every line holds part of the live row.
                unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.max(first) as *const i8) };
            }
        }
    }
}

/// One server's rows of one sparse table.
pub struct SparseTable {
    spec: SparseSpec,
    row_len: usize,
    stripes: Vec<Mutex<Stripe>>,
}

impl SparseTable {
    /// An empty table.
    pub fn new(spec: SparseSpec) -> SparseTable {
        let row_len = spec.dim + spec.optimizer.state_len(spec.dim);
        let stripes = (0..STRIPES)
            .map(|_| Mutex::new(Stripe { index: IdIndex::default(), chunks: Vec::new(), rows: 0 }))
            .collect();
        SparseTable { spec, row_len, stripes }
    }

    /// The table's spec.
    pub fn spec(&self) -> &SparseSpec {
        &self.spec
    }

    /// Floats per stored row (weights plus optimizer state).
    pub fn row_len(&self) -> usize {
        self.row_len
    }

    /// Number of rows held.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().rows).sum()
    }

    /// True if no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn init_full_row(&self, id: u64, row: &mut [f32]) {
        let dim = self.spec.dim;
        self.spec.init_row(id, &mut row[..dim]);
        self.spec.optimizer.init_state(&mut row[dim..]);
    }

    /// Copies the weights of `ids` into `out` (`ids.len() * dim` floats). Absent rows are created
    /// when `create` is set; otherwise their initial value is returned and nothing is stored
    /// (evaluation must not grow the model).
    pub fn pull(&self, ids: &[u64], out: &mut [f32], create: bool) -> Result<(), TableError> {
        let dim = self.spec.dim;
        check_len("pulled rows", ids.len() * dim, out.len())?;
        let mut found: Vec<u32> = Vec::new();
        self.for_each_stripe(ids, |stripe, positions, hashes| {
            self.resolve(stripe, ids, positions, hashes, create, &mut found);
            for (k, (&p, &r)) in positions.iter().zip(&found).enumerate() {
                if let Some(&ahead) = found.get(k + PREFETCH_DISTANCE) {
                    stripe.prefetch(ahead, self.row_len, dim);
                }
                let dst = &mut out[p as usize * dim..(p as usize + 1) * dim];
                if r == ABSENT {
                    self.spec.init_row(ids[p as usize], dst);
                } else {
                    copy_small(dst, &stripe.row(r, self.row_len)[..dim]);
                }
            }
        });
        Ok(())
    }

    /// Applies the optimizer to the rows of `ids` given gradient sums `grads` (`dim` per id),
    /// multiplied by `scale`. Ids must be unique within one call.
    pub fn push(&self, ids: &[u64], grads: &[f32], scale: f32) -> Result<(), TableError> {
        let dim = self.spec.dim;
        check_len("sparse gradient", ids.len() * dim, grads.len())?;
        let opt = self.spec.optimizer;
        let mut found: Vec<u32> = Vec::new();
        self.for_each_stripe(ids, |stripe, positions, hashes| {
            self.resolve(stripe, ids, positions, hashes, true, &mut found);
            for (k, (&p, &r)) in positions.iter().zip(&found).enumerate() {
                if let Some(&ahead) = found.get(k + PREFETCH_DISTANCE) {
                    stripe.prefetch(ahead, self.row_len, self.row_len);
                }
                let (w, state) = stripe.row_mut(r, self.row_len).split_at_mut(dim);
                opt.update(w, state, &grads[p as usize * dim..(p as usize + 1) * dim], scale);
            }
        });
        Ok(())
    }

    /// Visits every stored row `[weights | state]` with its id, stripe by stripe.
    pub fn for_each_row(&self, mut f: impl FnMut(u64, &[f32])) {
        for stripe in &self.stripes {
            let s = stripe.lock();
            for (id, r) in s.index.iter() {
                f(id, s.row(r, self.row_len));
            }
        }
    }

    /// Stores a full row `[weights | state]` for `id` (used when loading a checkpoint).
    pub fn insert_row(&self, id: u64, row: &[f32]) -> Result<(), TableError> {
        check_len("checkpoint row", self.row_len, row.len())?;
        let mut s = self.stripes[stripe_of(id)].lock();
        s.get_or_insert(id, self.row_len, |_| {}).copy_from_slice(row);
        Ok(())
    }

    /// Phase one of a batched pull or push on one stripe: the row number of every position
    /// (created when `create`, else [`ABSENT`]) into `found`. The index probes are independent of
    /// each other and the slots of later keys are prefetched, so their cache misses overlap; the
    /// caller's second phase then walks the rows, prefetching them the same way.
    fn resolve(
        &self,
        stripe: &mut Stripe,
        ids: &[u64],
        positions: &[u32],
        hashes: &[u64],
        create: bool,
        found: &mut Vec<u32>,
    ) {
        found.clear();
        found.extend(positions.iter().enumerate().map(|(k, &p)| {
            if let Some(&ahead) = positions.get(k + PREFETCH_DISTANCE) {
                stripe.index.prefetch(hashes[ahead as usize]);
            }
            let id = ids[p as usize];
            match stripe.index.get_hashed(id, hashes[p as usize]) {
                Some(r) => r,
                None if create => stripe.insert(id, self.row_len, |r| self.init_full_row(id, r)),
                None => ABSENT,
            }
        }));
    }

    /// Groups the positions of `ids` by stripe and calls `f(stripe, positions, hashes)` once
    /// per touched stripe, holding that stripe's lock only for the call; `hashes[i]` is
    /// `mix64(ids[i])`, computed once for both the stripe and the slot.
    fn for_each_stripe(&self, ids: &[u64], mut f: impl FnMut(&mut Stripe, &[u32], &[u64])) {
        // The grouping buffers are per thread and reused: a server thread serves batch after batch.
        thread_local! {
            static GROUPING: std::cell::RefCell<(Vec<u64>, Vec<u32>, Vec<usize>)> = Default::default();
        }
        GROUPING.with_borrow_mut(|(hashes, order, starts)| {
            hashes.clear();
            hashes.extend(ids.iter().map(|&id| mix64(id)));
            // Same bits as `stripe_of`, from the precomputed hash.
            group_positions(ids.len(), STRIPES, |i| hashes[i] as usize & (STRIPES - 1), order, starts);
            debug_assert!(ids.first().is_none_or(|&id| stripe_of(id) == hashes[0] as usize & (STRIPES - 1)));
            for (s, stripe) in self.stripes.iter().enumerate() {
                let positions = &order[starts[s]..starts[s + 1]];
                if !positions.is_empty() {
                    f(&mut stripe.lock(), positions, hashes);
                }
            }
        })
    }
}

/// Copies a row of a few floats. `copy_from_slice` of a length known only at run time becomes a
/// call to `memcpy`, which for 40 bytes costs more than the copy (it was 12% of a server's pull
/// time); fixed-size pieces compile to plain vector moves.
#[inline(always)]
fn copy_small(dst: &mut [f32], src: &[f32]) {
    let (mut d, mut s) = (dst.chunks_exact_mut(8), src.chunks_exact(8));
    for (a, b) in (&mut d).zip(&mut s) {
        let a: &mut [f32; 8] = a.try_into().expect("chunks of 8");
        *a = b.try_into().expect("chunks of 8");
    }
    let (d, s) = (d.into_remainder(), s.remainder());
    let (mut d4, mut s4) = (d.chunks_exact_mut(4), s.chunks_exact(4));
    for (a, b) in (&mut d4).zip(&mut s4) {
        let a: &mut [f32; 4] = a.try_into().expect("chunks of 4");
        *a = b.try_into().expect("chunks of 4");
    }
    for (a, b) in d4.into_remainder().iter_mut().zip(s4.remainder()) {
        *a = *b;
    }
}

fn check_len(what: &str, expected: usize, got: usize) -> Result<(), TableError> {
    if expected == got {
        Ok(())
    } else {
        Err(TableError::LengthMismatch { what: what.into(), expected, got })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{Init, Optimizer};

    fn table() -> SparseTable {
        SparseTable::new(SparseSpec {
            name: "emb".into(),
            dim: 3,
            seed: 9,
            init: Init::Uniform { scale: 0.1 },
            optimizer: Optimizer::sgd(1.0),
        })
    }

    #[test]
    fn pull_creates_rows_from_the_seed_and_push_updates_them() {
        let t = table();
        let ids = [5u64, 1 << 40, 77];
        let mut out = vec![0.0; 9];
        t.pull(&ids, &mut out, true).unwrap();
        assert_eq!(t.len(), 3);
        let mut want = [0.0; 3];
        t.spec().init_row(77, &mut want);
        assert_eq!(&out[6..9], &want);

        t.push(&[77], &[2.0, 4.0, 6.0], 0.5).unwrap();
        let mut row = vec![0.0; 3];
        t.pull(&[77], &mut row, true).unwrap();
        for j in 0..3 {
            assert!((row[j] - (want[j] - (j as f32 + 1.0))).abs() < 1e-6);
        }
    }

    #[test]
    fn pull_without_create_stores_nothing() {
        let t = table();
        let mut out = vec![0.0; 3];
        t.pull(&[123], &mut out, false).unwrap();
        assert!(t.is_empty());
        let mut want = [0.0; 3];
        t.spec().init_row(123, &mut want);
        assert_eq!(out, want);
    }

    #[test]
    fn many_rows_span_chunks_and_survive_a_round_trip() {
        let t = table();
        let ids: Vec<u64> = (0..3 * CHUNK_ROWS as u64 * STRIPES as u64 / 16).collect();
        let mut out = vec![0.0; ids.len() * 3];
        t.pull(&ids, &mut out, true).unwrap();
        let copy = table();
        t.for_each_row(|id, row| copy.insert_row(id, row).unwrap());
        let mut again = vec![0.0; ids.len() * 3];
        copy.pull(&ids, &mut again, false).unwrap();
        assert_eq!(out, again);
        assert_eq!(copy.len(), ids.len());
    }

    #[test]
    fn wrong_lengths_are_typed_errors() {
        let t = table();
        let err = t.push(&[1, 2], &[0.0; 5], 1.0).unwrap_err();
        assert_eq!(err, TableError::LengthMismatch { what: "sparse gradient".into(), expected: 6, got: 5 });
    }
}
