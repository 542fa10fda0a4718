//! One stripe of a sparse table: its packed rows ([`Rows`]: id, weights, statistics, optimizer
//! state), the index from ids to rows ([`Index`]), and the lifecycle of rows: creation,
//! admission counts (the table's count filter, per stripe), eviction of the lowest-score row near
//! a newcomer when the stripe is full, removal by a shrink's sweep, and the counts of all of it
//! ([`Lifecycle`]). A removed row's place in the slab takes the slab's last row, and its id goes
//! into a log of removed ids that the next delta save names (at most [`MAX_REMOVED`]: past it the
//! log is dropped and the next save is a base).
//!
//! Capacity eviction is near the newcomer, not a global LRU: a new row evicts the row with the
//! lowest score (the accessor's) among the 32 index slots of its home bucket and the next, never a
//! row of the batch being applied, as HierarchicalKV evicts the lowest score of the new key's
//! 128-slot bucket. No global list to keep in order, O(32) per eviction, and the victim is a row
//! the accessor's score ranks low.

use super::accessor::{Accessor, Verdict};
use super::admit::{self, AdmissionState, CountFilter, Entry};
use super::mem::index::{Index, MAX_ROWS};
use super::mem::rows::Rows;
use super::SparseSpec;
use crate::base::layout::mix64;

/// Most ids a stripe's removal log holds (512 KiB): past it the log is dropped and the next
/// save for serving is a base, so heavy churn between saves cannot grow a server without bound.
pub const MAX_REMOVED: usize = 1 << 16;

/// What a table's rows went through, counted where it happened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lifecycle {
    /// New ids given a row.
    pub admitted: u64,
    /// Pushes of ids not (yet) admitted: their gradients were dropped.
    pub filtered: u64,
    /// Rows evicted to make room under the capacity.
    pub evicted: u64,
    /// Admitted ids left without a row: the stripe was full of this very batch's rows.
    pub no_room: u64,
    /// Rows deleted by a shrink for a low score.
    pub shrunk_score: u64,
    /// Rows deleted by a shrink for being unseen too long.
    pub shrunk_unseen: u64,
    /// Pending ids (counted, not admitted) a shrink made the count filter forget: unseen too long.
    #[serde(default)]
    pub forgotten: u64,
}

impl Lifecycle {
    /// Every count by its name, as the metrics name the events.
    pub fn events(&self) -> impl Iterator<Item = (&'static str, u64)> {
        [
            ("admitted", self.admitted),
            ("filtered", self.filtered),
            ("evicted", self.evicted),
            ("no_room", self.no_room),
            ("shrunk_score", self.shrunk_score),
            ("shrunk_unseen", self.shrunk_unseen),
            ("forgotten", self.forgotten),
        ]
        .into_iter()
    }

    /// Adds another stripe's counts.
    pub fn add(&mut self, o: &Lifecycle) {
        self.admitted += o.admitted;
        self.filtered += o.filtered;
        self.evicted += o.evicted;
        self.no_room += o.no_room;
        self.shrunk_score += o.shrunk_score;
        self.shrunk_unseen += o.shrunk_unseen;
        self.forgotten += o.forgotten;
    }
}

/// One stripe's rows.
pub struct Stripe {
    index: Index,
    pub(super) rows: Rows,
    /// Sighting counts of ids not admitted yet (`count_filter_entry`).
    filter: Option<CountFilter>,
    /// Draws made for `probability_entry`.
    draws: u64,
    /// Ids removed (or gone from the base set) since the last base or delta save, once the
    /// table has been saved so (a delta names them); `None` before, so a table never saved this
    /// way in this process (a fresh one, or one restored from a checkpoint) logs nothing and
    /// its next save must be a base, and `None` again once the log outgrows [`MAX_REMOVED`].
    removed: Option<Vec<u64>>,
    /// What happened to rows here.
    pub(super) counts: Lifecycle,
}

impl Stripe {
    /// An empty stripe for `spec`, with its share of the admission filter.
    pub fn new(spec: &SparseSpec) -> Stripe {
        let cells = spec.filter_cells_per_stripe();
        let filter = (cells > 0).then(|| CountFilter::new(cells));
        Stripe {
            index: Index::new(),
            rows: Rows::new(spec.dim, spec.optimizer.state_len(spec.dim)),
            filter,
            draws: 0,
            removed: None,
            counts: Lifecycle::default(),
        }
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True if no row is held.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// What admission remembers between pushes, for a checkpoint: the draws made for
    /// `probability_entry` and the count filter's cells and days (none without one).
    pub fn admission(&self) -> AdmissionState {
        let (cells, days) = self.filter.as_ref().map_or((&[][..], &[][..]), CountFilter::cells);
        AdmissionState { draws: self.draws, cells: cells.to_vec(), days: days.to_vec() }
    }

    /// Takes back what [`admission`](Self::admission) gave.
    pub fn restore_admission(&mut self, state: &AdmissionState) -> Result<(), String> {
        self.draws = state.draws;
        match &mut self.filter {
            Some(f) => f.restore(&state.cells, &state.days),
            None if state.cells.is_empty() => Ok(()),
            None => Err(format!("{} admission filter cells for a table without a count filter", state.cells.len())),
        }
    }

    /// Bytes of the admission filter.
    pub fn filter_bytes(&self) -> usize {
        self.filter.as_ref().map_or(0, CountFilter::bytes)
    }

    /// The row of `id` (whose `mix64` is `hash`).
    #[inline(always)]
    pub fn find(&self, id: u64, hash: u64) -> Option<u32> {
        self.index.find(id, hash, |r| self.rows.id(r))
    }

    /// Hints the CPU to start loading the index bucket of `hash`.
    #[inline(always)]
    pub fn prefetch_index(&self, hash: u64) {
        self.index.prefetch(hash);
    }

    /// The row a `find` for `hash` most likely reads (from the tags of its index bucket, which
    /// should be in the cache already), prefetched: what a pull reads, or all of it (`whole`).
    #[inline(always)]
    pub fn guess(&self, hash: u64, whole: bool) -> Option<u32> {
        let row = self.index.guess(hash)?;
        self.rows.prefetch(row, whole);
        Some(row)
    }

    /// `find`, trying the row `guess` named first.
    #[inline(always)]
    pub fn find_guessed(&self, id: u64, hash: u64, guess: Option<u32>) -> Option<u32> {
        match guess {
            Some(row) if self.rows.id(row) == id => Some(row),
            _ => self.find(id, hash),
        }
    }

    /// Adds `id` (absent; its `mix64` is `hash`): weights from the seed, statistics at zero, a
    /// fresh optimizer state. Returns its row, or `None` when the stripe numbers no more rows.
    pub fn create(&mut self, spec: &SparseSpec, id: u64, hash: u64) -> Option<u32> {
        if self.rows.len() >= MAX_ROWS {
            self.counts.no_room += 1;
            return None;
        }
        let row = self.rows.push(id);
        let rows = &self.rows;
        self.index.insert(hash, row, |r| mix64(rows.id(r)));
        let r = self.rows.row_mut(row);
        spec.init_row(id, r.weights);
        spec.optimizer.init_state(r.state);
        Some(row)
    }

    /// Whether an absent id pushed with `show` sightings gets a row now.
    pub fn admit(&mut self, entry: Entry, id: u64, hash: u64, show: f32) -> bool {
        let sightings = show.clamp(1.0, admit::MAX_COUNT as f32) as u32;
        let admitted = match entry {
            Entry::All => true,
            Entry::Count(n) => self.filter.as_mut().is_none_or(|f| f.sight(hash, sightings, n)),
            Entry::Probability(p) => {
                self.draws += 1;
                admit::draw(p, id, self.draws, sightings)
            }
        };
        if !admitted {
            self.counts.filtered += 1;
        }
        admitted
    }

    /// Whether a delta save can name every id removed since the last save (else the next save
    /// must be a base).
    pub fn can_delta(&self) -> bool {
        self.removed.is_some()
    }

    /// Logs `id` as gone from what a base save would hold, for the next delta.
    fn log_removed(&mut self, id: u64) {
        if let Some(log) = &mut self.removed {
            if log.len() >= MAX_REMOVED {
                self.removed = None;
            } else {
                log.push(id);
            }
        }
    }

    /// Removes `row`; the slab's last row takes its number.
    pub fn remove(&mut self, row: u32) {
        let id = self.rows.id(row);
        self.log_removed(id);
        self.index.remove(mix64(id), row);
        if let Some((moved, from)) = self.rows.swap_remove(row) {
            self.index.renumber(mix64(moved), from, row);
        }
    }

    /// The rows a base (`delta` false) or delta save keeps, appended as ids and weights as a
    /// pull reads them; their delta scores start again (a base restarts every row's). Returns
    /// the ids removed since the last such save (none for a base) and starts a new log.
    pub fn export(&mut self, spec: &SparseSpec, delta: bool, ids: &mut Vec<u64>, weights: &mut Vec<f32>) -> Vec<u64> {
        let accessor = &spec.accessor;
        for row in 0..self.rows.len() as u32 {
            let stats = self.rows.stats(row);
            let keep = if delta { accessor.in_delta(&stats) } else { accessor.in_base(&stats) };
            if keep {
                ids.push(self.rows.id(row));
                let at = weights.len();
                weights.extend_from_slice(self.rows.weights(row));
                if !accessor.embedx_live(&stats) {
                    weights[at + 1..].fill(0.0);
                }
            }
            if keep || !delta {
                let mut s = stats;
                Accessor::saved(&mut s);
                self.rows.row_mut(row).set_stats(&s);
            }
        }
        let removed = self.removed.replace(Vec::new()).unwrap_or_default();
        if delta {
            removed
        } else {
            Vec::new()
        }
    }

    /// Evicts the lowest-score row of the two index buckets from `hash`'s home on, skipping
    /// ids `keep` protects (rows of the batch being applied). False if every row is kept.
    pub fn evict_near(&mut self, accessor: &Accessor, hash: u64, keep: impl Fn(u64) -> bool) -> bool {
        let mut best: Option<(f32, u32)> = None;
        for row in self.index.near(hash) {
            if keep(self.rows.id(row)) {
                continue;
            }
            let score = accessor.row_score(&self.rows.stats(row));
            if best.is_none_or(|(s, _)| score < s) {
                best = Some((score, row));
            }
        }
        // The neighbourhood holds only protected rows: any other row of the stripe.
        let victim = best.map(|(_, row)| row).or_else(|| (0..self.rows.len() as u32).find(|&r| !keep(self.rows.id(r))));
        let Some(victim) = victim else {
            return false;
        };
        self.remove(victim);
        self.counts.evicted += 1;
        true
    }

    /// One shrink of every row: statistics decayed after `days` days, and rows the accessor
    /// condemns removed; returns how many. The count filter's pending ids age by the same days
    /// and are forgotten once unseen for more than `forget_after` days. A kept row the decay
    /// takes out of the base set is logged as removed, and one whose `embedx` part it kills is
    /// marked for the next delta, so base + deltas stay equal to a fresh base.
    pub fn shrink(&mut self, accessor: &Accessor, forget_after: f32, days: u32) -> u64 {
        if let Some(f) = &mut self.filter {
            self.counts.forgotten += f.age(days, forget_after);
        }
        let mut deleted = 0;
        let mut row = 0;
        // A removed row's number takes the last row, not yet visited: visit it next.
        while (row as usize) < self.rows.len() {
            let mut stats = self.rows.stats(row);
            let (in_base, live) = (accessor.in_base(&stats), accessor.embedx_live(&stats));
            let verdict = accessor.shrink(&mut stats, days);
            if verdict == Verdict::Keep && live && !accessor.embedx_live(&stats) {
                accessor.changed(&mut stats);
            }
            self.rows.row_mut(row).set_stats(&stats);
            match verdict {
                Verdict::Keep => {
                    if in_base && !accessor.in_base(&stats) {
                        self.log_removed(self.rows.id(row));
                    }
                    row += 1;
                    continue;
                }
                Verdict::LowScore => self.counts.shrunk_score += 1,
                Verdict::Unseen => self.counts.shrunk_unseen += 1,
            }
            self.remove(row);
            deleted += 1;
        }
        let rows = &self.rows;
        self.index.fit(|r| mix64(rows.id(r)));
        deleted
    }
}
