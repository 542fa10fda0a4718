//! One server's rows of a sparse embedding table.
//!
//! The table is split into [`STRIPES`] stripes ([`Stripe`]), each behind its own mutex, and a
//! batch takes each stripe's lock once: positions are grouped by stripe first, so two requests
//! touching different stripes never wait on each other. A pull copies each row as soon as its
//! probe finds it, while it is still in the nearest cache. Under admission or a capacity a push
//! resolves its whole batch first, then admits, evicts and creates, so an eviction never takes a
//! row of the batch being applied. Saves for serving (base and delta) and the shrink go stripe by
//! stripe.
//!
//! Why written here, its hash table included: no crate offers batched access grouped by lock
//! stripe with control over the rows' layout, and dashmap measured 2-2.5x slower on this access
//! pattern. At 10M rows the table is bound by memory latency, so its layout is about cache
//! misses, and it is also most of a server's memory. History: a hashbrown index into a slab of
//! `[weights | state]` rows (three misses per cold pull, none prefetchable, about 4M keys per
//! server CPU second); then the id and weights in one 64-byte slot at a position computed from
//! the id (one prefetchable miss per pull, but 164 bytes a dim-10 Adagrad row: the slot at load
//! 0.35-0.7 plus a separate state row). Now rows packed without holes (`mem/rows.rs`), found
//! through an index of 4-byte slots (`mem/index.rs`), both in blocks of huge pages
//! (`mem/pool.rs`): measured in `oar bench` at 10M rows, 109.8 bytes a row with its index
//! (per-dimension Adagrad, dim 10) and 70.9 (row-wise Adagrad), against 164 and 128 before.
//!
//! The price is a second dependent miss per id, the index bucket then the row, so a batch runs
//! as a pipeline over each stripe's ids and hashes, gathered in stripe order first (gathered by
//! position they were a random read each, a third of an in-memory pull's time): the buckets of
//! the ids 48 positions ahead are prefetched, and the row a bucket's tag names 16 ahead, so the
//! misses of a batch overlap. A profile showed the prefetches themselves waiting for free
//! line-fill buffers, i.e. bound by misses in flight. `oar bench` measures the old layout's server
//! beside this one (`--baseline-exe`, in alternating `--rounds`, ratios paired by round): pulls
//! as drawn at 1.09x its keys/s, unique pulls 1.00x, pushes 1.30x (docs/src/measurements/2026-11-27-performance.md); end to
//! end, 2x2 CTR-DNN training on the reference set runs at 0.97x with 43% less server memory.

use parking_lot::Mutex;

use super::admit::AdmissionState;
use super::stripe::{Lifecycle, Stripe};
use super::{SparseSpec, TableError};
use crate::base::layout::{group_positions, mix64, stripe_of, STRIPES};

/// Row number standing for "no such id".
const ABSENT: u32 = u32::MAX;
/// How many positions ahead a batch prefetches rows.
const PREFETCH_DISTANCE: usize = 16;
/// How many positions ahead a batch prefetches index buckets: a bucket must have arrived when
/// its row is guessed, [`PREFETCH_DISTANCE`] ahead. Three times as far measured 2-4% faster in
/// memory than twice (`cargo bench --bench sparse_table`); four and six times, no faster.
const INDEX_AHEAD: usize = 48;

/// How a batch is resolved.
#[derive(Clone, Copy)]
struct Resolve {
    /// Create rows for ids without one (a training pull, or a push to a table that admits
    /// every id unbounded); otherwise leave them absent.
    create: bool,
    /// Prefetch all a push touches of each row, not only what a pull reads.
    whole: bool,
}

/// One stripe's share of a batch, in the batch's order: the positions in the batch, and their
/// ids and hashes side by side, so resolving them reads memory in order (gathered by position,
/// the ids and hashes of a 50,000-id batch were a random read each into 800 KB, about a third
/// of an in-memory pull's time).
#[derive(Clone, Copy)]
struct Group<'a> {
    positions: &'a [u32],
    ids: &'a [u64],
    hashes: &'a [u64],
}

/// One server's rows of one sparse table.
pub struct SparseTable {
    spec: SparseSpec,
    /// Most rows per stripe (the capacity dealt over the stripes).
    stripe_capacity: Option<usize>,
    stripes: Vec<Mutex<Stripe>>,
}

impl SparseTable {
    /// An empty table.
    pub fn new(spec: SparseSpec) -> SparseTable {
        let stripes = (0..STRIPES).map(|_| Mutex::new(Stripe::new(&spec))).collect();
        let stripe_capacity = spec.capacity.map(|c| (c as usize / STRIPES).max(1));
        SparseTable { spec, stripe_capacity, stripes }
    }

    /// The table's spec.
    pub fn spec(&self) -> &SparseSpec {
        &self.spec
    }

    /// Floats per full row (weights, statistics, optimizer state), as checkpoints store it.
    pub fn row_len(&self) -> usize {
        self.spec.row_len()
    }

    /// Number of rows held.
    pub fn len(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().len()).sum()
    }

    /// True if no row is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What rows went through: admissions, filtered pushes, evictions, shrinks.
    pub fn lifecycle(&self) -> Lifecycle {
        let mut all = Lifecycle::default();
        self.stripes.iter().for_each(|s| all.add(&s.lock().counts));
        all
    }

    /// Bytes of the admission filter.
    pub fn filter_bytes(&self) -> usize {
        self.stripes.iter().map(|s| s.lock().filter_bytes()).sum()
    }

    /// The row of every position (created when `how` says so, else [`ABSENT`]) into `found`.
    fn resolve(&self, stripe: &mut Stripe, group: Group, how: Resolve, found: &mut Vec<u32>) {
        found.clear();
        self.resolve_each(stripe, group, how, |_, _, row| found.push(row));
    }

    /// Calls `f(stripe, k, row)` for the group's positions in order (`k` indexes the group),
    /// with its row (created when `how` says so, else [`ABSENT`]), as soon as the row is found: what a pull copies is then
    /// still in the nearest cache. The probes are independent of each other: buckets and rows of
    /// later positions are prefetched, so their cache misses overlap.
    #[inline(always)]
    fn resolve_each(&self, stripe: &mut Stripe, group: Group, how: Resolve, mut f: impl FnMut(&Stripe, usize, u32)) {
        let Group { ids, hashes, .. } = group;
        // Each position's guessed row, made a distance ahead (when its bucket arrived) and
        // kept until the position is resolved.
        let mut guesses = [None; PREFETCH_DISTANCE];
        for &hash in hashes.iter().take(INDEX_AHEAD) {
            stripe.prefetch_index(hash);
        }
        for (k, &hash) in hashes.iter().take(PREFETCH_DISTANCE).enumerate() {
            guesses[k] = stripe.guess(hash, how.whole);
        }
        for (k, (&id, &hash)) in ids.iter().zip(hashes).enumerate() {
            let guess = guesses[k % PREFETCH_DISTANCE];
            if let Some(&far) = hashes.get(k + INDEX_AHEAD) {
                stripe.prefetch_index(far);
            }
            if let Some(&near) = hashes.get(k + PREFETCH_DISTANCE) {
                guesses[k % PREFETCH_DISTANCE] = stripe.guess(near, how.whole);
            }
            let row = match stripe.find_guessed(id, hash, guess) {
                Some(row) => row,
                None if how.create => match stripe.create(&self.spec, id, hash) {
                    Some(row) => {
                        stripe.counts.admitted += 1;
                        row
                    }
                    None => ABSENT,
                },
                None => ABSENT,
            };
            f(stripe, k, row);
        }
    }

    /// A push's resolution under admission and capacity: rows for the admitted absent ids,
    /// after evicting rows (never this batch's) when the stripe would outgrow its capacity.
    /// Ids left without a row stay [`ABSENT`].
    fn resolve_admitted(&self, stripe: &mut Stripe, group: Group, counts: &[f32], found: &mut Vec<u32>) {
        let Group { positions, ids, hashes } = group;
        self.resolve(stripe, group, Resolve { create: false, whole: true }, found);
        // The admitted newcomers, as indices into the group.
        let mut new: Vec<usize> = Vec::new();
        for (k, (&p, &row)) in positions.iter().zip(found.iter()).enumerate() {
            if row == ABSENT && stripe.admit(self.spec.entry, ids[k], hashes[k], counts[2 * p as usize]) {
                new.push(k);
            }
        }
        if new.is_empty() {
            return;
        }
        // Ids are unique within a push from oar's trainers, but not from any peer: a repeated
        // newcomer gets one row (found again below for its other positions), not one each.
        let before = new.len();
        let mut distinct = hashbrown::HashSet::with_capacity(new.len());
        new.retain(|&k| distinct.insert(ids[k]));
        let repeated = new.len() < before;
        if let Some(cap) = self.stripe_capacity {
            let over = (stripe.len() + new.len()).saturating_sub(cap);
            if over > 0 {
                let batch: hashbrown::HashSet<u64> = ids.iter().copied().collect();
                let mut evicted = 0;
                // Each newcomer evicts near its own home (a restored table may even be over).
                for k in 0..over {
                    let near = hashes[new[k % new.len()]];
                    if !stripe.evict_near(&self.spec.accessor, near, |id| batch.contains(&id)) {
                        break;
                    }
                    evicted += 1;
                }
                // Without room (the stripe is full of this batch's rows) the last newcomers wait.
                let room = new.len().saturating_sub(over - evicted);
                stripe.counts.no_room += (new.len() - room) as u64;
                new.truncate(room);
                // Evictions renumber rows: find this batch's rows again.
                self.resolve(stripe, group, Resolve { create: false, whole: true }, found);
            }
        }
        for k in new {
            if let Some(row) = stripe.create(&self.spec, ids[k], hashes[k]) {
                stripe.counts.admitted += 1;
                found[k] = row;
            }
        }
        if repeated {
            self.resolve(stripe, group, Resolve { create: false, whole: true }, found);
        }
    }

    /// Copies the weights of `ids` into `out` (`ids.len() * dim` floats). With `create` (a
    /// training pull) an absent row is created when the table creates rows on pulls, else its
    /// initial value is returned; without (evaluation, which must not grow the model) an absent
    /// row reads as zeros. Nothing absent is stored in either case but the first. A row below the
    /// accessor's `embedx_threshold` reads its first weight only, the rest as zeros.
    pub fn pull(&self, ids: &[u64], out: &mut [f32], create: bool) -> Result<(), TableError> {
        let dim = self.spec.dim;
        check_len("pulled rows", ids.len() * dim, out.len())?;
        let how = Resolve { create: create && !self.spec.creates_on_push(), whole: false };
        let gated = self.spec.accessor.embedx_threshold > 0.0;
        self.for_each_stripe(ids, |stripe, group| {
            self.resolve_each(stripe, group, how, |stripe, k, row| {
                let p = group.positions[k] as usize;
                let dst = &mut out[p * dim..(p + 1) * dim];
                if row == ABSENT && !create {
                    // Evaluation and prediction: an id without a row reads as zeros, the rule an
                    // export's lookups and a serving key-value store apply too.
                    dst.fill(0.0);
                } else if row == ABSENT {
                    self.spec.init_row(group.ids[k], dst);
                    if gated {
                        dst[1..].fill(0.0);
                    }
                } else {
                    // The probe has just read the row's id: its weights are in the nearest cache.
                    copy_small(dst, stripe.rows.weights(row));
                    if gated && !self.spec.accessor.embedx_live(&stripe.rows.stats(row)) {
                        dst[1..].fill(0.0);
                    }
                }
            });
        });
        Ok(())
    }

    /// Applies one push to the rows of `ids`: `counts` holds each id's shows and clicks (2
    /// floats per id), `grads` its gradient sums (`dim` per id), multiplied by `scale`. Ids must
    /// be unique within one call. An id without a row is created when admitted (its gradient
    /// then applied), or else only counted.
    pub fn push(&self, ids: &[u64], counts: &[f32], grads: &[f32], scale: f32) -> Result<(), TableError> {
        let dim = self.spec.dim;
        check_len("sparse gradient", ids.len() * dim, grads.len())?;
        check_len("shows and clicks", ids.len() * 2, counts.len())?;
        let (opt, accessor) = (&self.spec.optimizer, self.spec.accessor);
        let gated = accessor.embedx_threshold > 0.0;
        let gated_state = opt.prefix_state_len(1).unwrap_or(0);
        let admitting = self.spec.creates_on_push();
        let mut found = Vec::new();
        self.for_each_stripe(ids, |stripe, group| {
            if admitting {
                self.resolve_admitted(stripe, group, counts, &mut found);
            } else {
                self.resolve(stripe, group, Resolve { create: true, whole: true }, &mut found);
            }
            for (k, (&p, &row)) in group.positions.iter().zip(&found).enumerate() {
                if let Some(&ahead) = found.get(k + PREFETCH_DISTANCE) {
                    if ahead != ABSENT {
                        stripe.rows.prefetch(ahead, true);
                    }
                }
                if row == ABSENT {
                    continue;
                }
                let p = p as usize;
                let mut r = stripe.rows.row_mut(row);
                let mut stats = r.stats4();
                accessor.update(&mut stats, counts[2 * p], counts[2 * p + 1]);
                r.set_stats(&stats);
                let (g, show) = (&grads[p * dim..(p + 1) * dim], counts[2 * p]);
                if gated && !accessor.embedx_live(&stats) {
                    opt.update_sparse(&mut r.weights[..1], &mut r.state[..gated_state], &g[..1], scale, show);
                } else {
                    opt.update_sparse(r.weights, r.state, g, scale, show);
                }
            }
        });
        Ok(())
    }

    /// One shrink of every row (decay, then deletion by score or unseen days) after `days`
    /// more days; returns the rows it deleted.
    pub fn shrink(&self, days: u32) -> u64 {
        self.stripes.iter().map(|s| s.lock().shrink(&self.spec.accessor, self.spec.filter_forget_after(), days)).sum()
    }

    /// Whether a delta save of this table can name every id removed since its last save.
    pub fn can_delta(&self) -> bool {
        self.stripes.iter().all(|s| s.lock().can_delta())
    }

    /// A base (`delta` false) or delta save of this table (see [`Stripe::export`]): the kept
    /// rows' ids and weights, and for a delta the ids removed since the last save.
    pub fn export(&self, delta: bool) -> super::TableExport {
        let mut out = super::TableExport::default();
        for stripe in &self.stripes {
            let removed = stripe.lock().export(&self.spec, delta, &mut out.ids, &mut out.weights);
            out.deleted.extend(removed);
        }
        out
    }

    /// What admission remembers, stripe by stripe: the draws made and the count filter's cells
    /// (see [`Stripe::admission`]).
    pub fn admission(&self) -> Vec<AdmissionState> {
        self.stripes.iter().map(|s| s.lock().admission()).collect()
    }

    /// Takes back what [`admission`](Self::admission) gave (from a checkpoint).
    pub fn restore_admission(&self, state: &[AdmissionState]) -> Result<(), String> {
        if state.len() != self.stripes.len() {
            return Err(format!("admission state for {} stripes, the table has {}", state.len(), self.stripes.len()));
        }
        for (stripe, s) in self.stripes.iter().zip(state) {
            stripe.lock().restore_admission(s)?;
        }
        Ok(())
    }

    /// Visits every stored row `[weights | statistics | optimizer state]` with its id, stripe by
    /// stripe.
    pub fn for_each_row(&self, mut f: impl FnMut(u64, &[f32])) {
        let mut full = Vec::with_capacity(self.row_len());
        for stripe in &self.stripes {
            let s = stripe.lock();
            for row in 0..s.len() as u32 {
                full.clear();
                s.rows.full_row(row, &mut full);
                f(s.rows.id(row), &full);
            }
        }
    }

    /// Stores a full row `[weights | statistics | optimizer state]` for `id` (used when loading
    /// a checkpoint).
    pub fn insert_row(&self, id: u64, row: &[f32]) -> Result<(), TableError> {
        check_len("checkpoint row", self.row_len(), row.len())?;
        let hash = mix64(id);
        let mut s = self.stripes[stripe_of(id)].lock();
        let at = match s.find(id, hash) {
            Some(at) => at,
            None => s
                .create(&self.spec, id, hash)
                .ok_or_else(|| TableError::StripeFull { table: self.spec.name.clone(), rows: s.len() })?,
        };
        s.rows.set_full_row(at, row);
        Ok(())
    }

    /// Groups the positions of `ids` by stripe and calls `f(stripe, group)` once per touched
    /// stripe with its share of the batch ([`Group`]), holding that stripe's lock only for the
    /// call; each id's `mix64` is computed once, for both the stripe and the slot.
    fn for_each_stripe(&self, ids: &[u64], mut f: impl FnMut(&mut Stripe, Group)) {
        // The grouping buffers are per thread and reused: a server thread serves batch after batch.
        thread_local! {
            static GROUPING: std::cell::RefCell<Grouping> = Default::default();
        }
        GROUPING.with_borrow_mut(|g| {
            g.hashes.clear();
            g.hashes.extend(ids.iter().map(|&id| mix64(id)));
            // Same bits as `stripe_of`, from the precomputed hash.
            let hashes = &g.hashes;
            group_positions(ids.len(), STRIPES, |i| hashes[i] as usize & (STRIPES - 1), &mut g.order, &mut g.starts);
            debug_assert!(ids.first().is_none_or(|&id| stripe_of(id) == hashes[0] as usize & (STRIPES - 1)));
            g.ordered_ids.clear();
            g.ordered_ids.extend(g.order.iter().map(|&p| ids[p as usize]));
            g.ordered_hashes.clear();
            g.ordered_hashes.extend(g.order.iter().map(|&p| hashes[p as usize]));
            for (s, stripe) in self.stripes.iter().enumerate() {
                let at = g.starts[s]..g.starts[s + 1];
                if !at.is_empty() {
                    let group = Group {
                        positions: &g.order[at.clone()],
                        ids: &g.ordered_ids[at.clone()],
                        hashes: &g.ordered_hashes[at],
                    };
                    f(&mut stripe.lock(), group);
                }
            }
        })
    }
}

/// A thread's buffers for grouping a batch by stripe.
#[derive(Default)]
struct Grouping {
    /// Each id's hash, by position.
    hashes: Vec<u64>,
    /// Positions stripe by stripe, and where each stripe's part of them starts.
    order: Vec<u32>,
    starts: Vec<usize>,
    /// Ids and hashes in `order`.
    ordered_ids: Vec<u64>,
    ordered_hashes: Vec<u64>,
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
        SparseTable::new(SparseSpec::new("emb", 3, 9, Init::Uniform { scale: 0.1 }, Optimizer::sgd(1.0)))
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

        t.push(&[77], &[1.0, 0.0], &[2.0, 4.0, 6.0], 0.5).unwrap();
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
        out.fill(7.0);
        t.pull(&[123], &mut out, false).unwrap();
        assert!(t.is_empty());
        assert_eq!(out, [0.0; 3], "an id without a row reads as zeros in evaluation");
    }

    #[test]
    fn many_rows_span_chunks_and_survive_a_round_trip() {
        // Enough rows for several state chunks per stripe.
        let t = table();
        let per_chunk = crate::table::mem::rows::Rows::new(3, 0).chunk_rows();
        let ids: Vec<u64> = (0..(3 * per_chunk * STRIPES / 2) as u64).collect();
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
        let err = t.push(&[1, 2], &[0.0; 4], &[0.0; 5], 1.0).unwrap_err();
        assert_eq!(err, TableError::LengthMismatch { what: "sparse gradient".into(), expected: 6, got: 5 });
    }
}
