//! One server's rows of a sparse embedding table.
//!
//! The table is split into [`STRIPES`] stripes, each behind its own mutex, and a batch takes
//! each stripe's lock once: positions are grouped by stripe first, so two requests touching
//! different stripes never wait on each other. A stripe holds each id's weights inline in its
//! hash slots ([`Records`]: a pull costs one cache miss per cold id) and the optimizer state in a
//! slab of fixed-size chunks indexed by the slot's row number (only pushes touch it). Batches are
//! served in passes that prefetch the slots and state rows of the ids a few positions ahead, so
//! the cache misses of a batch overlap. Layout measurements: `../shared/research/deps.md` and
//! `oar bench`.

use parking_lot::Mutex;

use super::records::Records;
use super::{SparseSpec, TableError};
use crate::layout::{group_positions, mix64, stripe_of, STRIPES};

/// State rows per slab chunk: big enough to amortize allocation, small enough to waste little.
const CHUNK_ROWS: usize = 4096;
/// Slot number standing for "no such id".
const ABSENT: usize = usize::MAX;
/// How many positions ahead a batch prefetches.
const PREFETCH_DISTANCE: usize = 8;

struct Stripe {
    records: Records,
    /// Optimizer state, `state_len` floats per row, in chunks.
    state: Vec<Box<[f32]>>,
    rows: usize,
}

impl Stripe {
    fn state_mut(&mut self, row: u32, state_len: usize) -> &mut [f32] {
        let (c, r) = (row as usize / CHUNK_ROWS, row as usize % CHUNK_ROWS);
        &mut self.state[c][r * state_len..(r + 1) * state_len]
    }

    fn state(&self, row: u32, state_len: usize) -> &[f32] {
        let (c, r) = (row as usize / CHUNK_ROWS, row as usize % CHUNK_ROWS);
        &self.state[c][r * state_len..(r + 1) * state_len]
    }

    /// Hints the CPU to start loading the state of `row`, every line it spans.
    #[inline]
    fn prefetch_state(&self, row: u32, state_len: usize) {
        #[cfg(target_arch = "x86_64")]
        if state_len > 0 {
            let span = self.state(row, state_len);
            let (first, last) = (span.as_ptr() as usize, span.as_ptr() as usize + state_len * 4 - 1);
            for line in (first & !63..=last).step_by(64) {
                // SAFETY: prefetching is only a hint; every line holds part of the live state.
                unsafe {
                    std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(line.max(first) as *const i8)
                };
            }
        }
    }
}

/// One server's rows of one sparse table.
pub struct SparseTable {
    spec: SparseSpec,
    state_len: usize,
    stripes: Vec<Mutex<Stripe>>,
}

impl SparseTable {
    /// An empty table.
    pub fn new(spec: SparseSpec) -> SparseTable {
        let state_len = spec.optimizer.state_len(spec.dim);
        let stripes = (0..STRIPES)
            .map(|_| Mutex::new(Stripe { records: Records::new(spec.dim), state: Vec::new(), rows: 0 }))
            .collect();
        SparseTable { spec, state_len, stripes }
    }

    /// The table's spec.
    pub fn spec(&self) -> &SparseSpec {
        &self.spec
    }

    /// Floats per full row (weights plus optimizer state), as checkpoints store it.
    pub fn row_len(&self) -> usize {
        self.spec.dim + self.state_len
    }

    /// Number of rows held.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().records.len()).sum()
    }

    /// True if no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Adds `id` (absent) to a stripe: a slot from `find`'s `Err(at)` (after `reserve`) with its
    /// weights initialized from the seed, and a fresh state row.
    fn create(&self, stripe: &mut Stripe, at: usize, id: u64) -> usize {
        let row = stripe.rows as u32;
        if stripe.rows % CHUNK_ROWS == 0 {
            stripe.state.push(vec![0.0; CHUNK_ROWS * self.state_len].into_boxed_slice());
        }
        stripe.rows += 1;
        stripe.records.put(at, id, row);
        self.spec.init_row(id, stripe.records.weights_mut(at));
        self.spec.optimizer.init_state(stripe.state_mut(row, self.state_len));
        at
    }

    /// The slot of every position (created when `create`, else [`ABSENT`]) into `found`. The
    /// probes are independent of each other and later slots are prefetched, so their cache
    /// misses overlap.
    fn resolve(
        &self,
        stripe: &mut Stripe,
        ids: &[u64],
        positions: &[u32],
        hashes: &[u64],
        create: bool,
        found: &mut Vec<usize>,
    ) {
        if create {
            // No slot moves while the batch is resolved.
            stripe.records.reserve(positions.len());
        }
        found.clear();
        for (k, &p) in positions.iter().enumerate() {
            if let Some(&ahead) = positions.get(k + PREFETCH_DISTANCE) {
                stripe.records.prefetch(hashes[ahead as usize]);
            }
            let id = ids[p as usize];
            found.push(match stripe.records.find(id, hashes[p as usize]) {
                Ok(slot) => slot,
                Err(at) if create => self.create(stripe, at, id),
                Err(_) => ABSENT,
            });
        }
    }

    /// Copies the weights of `ids` into `out` (`ids.len() * dim` floats). Absent rows are created
    /// when `create` is set; otherwise their initial value is returned and nothing is stored
    /// (evaluation must not grow the model).
    pub fn pull(&self, ids: &[u64], out: &mut [f32], create: bool) -> Result<(), TableError> {
        let dim = self.spec.dim;
        check_len("pulled rows", ids.len() * dim, out.len())?;
        let mut found = Vec::new();
        self.for_each_stripe(ids, |stripe, positions, hashes| {
            self.resolve(stripe, ids, positions, hashes, create, &mut found);
            // The probes brought the slots, and with them the weights, into the cache.
            for (&p, &slot) in positions.iter().zip(&found) {
                let dst = &mut out[p as usize * dim..(p as usize + 1) * dim];
                if slot == ABSENT {
                    self.spec.init_row(ids[p as usize], dst);
                } else {
                    copy_small(dst, stripe.records.weights(slot));
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
        let (mut found, mut rows) = (Vec::new(), Vec::new());
        self.for_each_stripe(ids, |stripe, positions, hashes| {
            self.resolve(stripe, ids, positions, hashes, true, &mut found);
            rows.clear();
            rows.extend(found.iter().map(|&slot| stripe.records.row(slot)));
            for (k, (&p, &slot)) in positions.iter().zip(&found).enumerate() {
                if let Some(&ahead) = rows.get(k + PREFETCH_DISTANCE) {
                    stripe.prefetch_state(ahead, self.state_len);
                }
                let Stripe { records, state, .. } = &mut *stripe;
                let (c, r) = (rows[k] as usize / CHUNK_ROWS, rows[k] as usize % CHUNK_ROWS);
                let st = &mut state[c][r * self.state_len..(r + 1) * self.state_len];
                opt.update(records.weights_mut(slot), st, &grads[p as usize * dim..(p as usize + 1) * dim], scale);
            }
        });
        Ok(())
    }

    /// Visits every stored row `[weights | state]` with its id, stripe by stripe.
    pub fn for_each_row(&self, mut f: impl FnMut(u64, &[f32])) {
        let mut full = Vec::with_capacity(self.row_len());
        for stripe in &self.stripes {
            let s = stripe.lock();
            for slot in s.records.occupied() {
                full.clear();
                full.extend_from_slice(s.records.weights(slot));
                full.extend_from_slice(s.state(s.records.row(slot), self.state_len));
                f(s.records.id(slot), &full);
            }
        }
    }

    /// Stores a full row `[weights | state]` for `id` (used when loading a checkpoint).
    pub fn insert_row(&self, id: u64, row: &[f32]) -> Result<(), TableError> {
        check_len("checkpoint row", self.row_len(), row.len())?;
        let mut s = self.stripes[stripe_of(id)].lock();
        s.records.reserve(1);
        let slot = match s.records.find(id, mix64(id)) {
            Ok(slot) => slot,
            Err(at) => self.create(&mut s, at, id),
        };
        let dim = self.spec.dim;
        s.records.weights_mut(slot).copy_from_slice(&row[..dim]);
        let r = s.records.row(slot);
        s.state_mut(r, self.state_len).copy_from_slice(&row[dim..]);
        Ok(())
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
        // Enough rows for several state chunks per stripe.
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
