//! One stripe of a sparse table: its ids and weights ([`Records`]), each row's state (statistics
//! then optimizer state) in a slab of fixed-size chunks, and the lifecycle of rows: creation,
//! admission counts, eviction of the lowest-score row near a newcomer when the stripe is full,
//! and removal by a shrink. A removed row's state row is reused by the next new row.

use super::accessor::{Accessor, STATS};
use super::admit::{self, CountFilter, Entry};
use super::records::Records;
use super::SparseSpec;
use crate::layout::mix64;

/// State rows per slab chunk: big enough to amortize allocation, small enough to waste little.
pub const CHUNK_ROWS: usize = 4096;
/// Occupied slots a full stripe looks through, from a newcomer's home slot, for the row it
/// evicts (HierarchicalKV evicts the lowest score of a 128-slot bucket; linear probing keeps
/// neighbours in a run, so a few dozen are the same idea).
const EVICT_WINDOW: usize = 32;

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
}

impl Lifecycle {
    /// Adds another stripe's counts.
    pub fn add(&mut self, o: &Lifecycle) {
        self.admitted += o.admitted;
        self.filtered += o.filtered;
        self.evicted += o.evicted;
        self.no_room += o.no_room;
        self.shrunk_score += o.shrunk_score;
        self.shrunk_unseen += o.shrunk_unseen;
    }
}

/// One stripe's rows.
pub struct Stripe {
    pub(super) records: Records,
    /// State (statistics, then optimizer state), `state_len` floats per row, in chunks.
    state: Vec<Box<[f32]>>,
    /// State rows handed out so far (live or free).
    rows: usize,
    /// State rows of removed ids, reused first.
    free: Vec<u32>,
    /// Sighting counts of ids not admitted yet (`count_filter_entry`).
    filter: Option<CountFilter>,
    /// Draws made for `probability_entry`.
    draws: u64,
    /// Ids removed since the last base or delta save, once the table has been saved so (a
    /// delta names them); `None` before, so a table never saved this way logs nothing.
    removed: Option<Vec<u64>>,
    /// What happened to rows here.
    pub(super) counts: Lifecycle,
}

impl Stripe {
    /// An empty stripe for `spec`, with its share of the admission filter.
    pub fn new(spec: &SparseSpec, stripes: usize) -> Stripe {
        let filter = match spec.entry {
            Entry::Count(_) => Some(CountFilter::new(spec.filter_capacity.div_ceil(stripes))),
            _ => None,
        };
        Stripe {
            records: Records::new(spec.dim),
            state: Vec::new(),
            rows: 0,
            free: Vec::new(),
            filter,
            draws: 0,
            removed: None,
            counts: Lifecycle::default(),
        }
    }

    /// Bytes of the admission filter.
    pub fn filter_bytes(&self) -> usize {
        self.filter.as_ref().map_or(0, CountFilter::bytes)
    }

    /// The state of `row`, writable.
    #[inline]
    pub fn state_mut(&mut self, row: u32, state_len: usize) -> &mut [f32] {
        let (c, r) = (row as usize / CHUNK_ROWS, row as usize % CHUNK_ROWS);
        &mut self.state[c][r * state_len..(r + 1) * state_len]
    }

    /// The state of `row`.
    #[inline]
    pub fn state(&self, row: u32, state_len: usize) -> &[f32] {
        let (c, r) = (row as usize / CHUNK_ROWS, row as usize % CHUNK_ROWS);
        &self.state[c][r * state_len..(r + 1) * state_len]
    }

    /// The weights of `slot` and the state of its row, both writable.
    #[inline]
    pub fn row_mut(&mut self, slot: usize, state_len: usize) -> (&mut [f32], &mut [f32]) {
        let row = self.records.row(slot) as usize;
        let (c, r) = (row / CHUNK_ROWS, row % CHUNK_ROWS);
        (self.records.weights_mut(slot), &mut self.state[c][r * state_len..(r + 1) * state_len])
    }

    /// Hints the CPU to start loading the state of `row`, every line it spans.
    #[inline]
    pub fn prefetch_state(&self, row: u32, state_len: usize) {
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

    /// Adds `id` (absent) in the empty slot `at` (from `find`, after `reserve`): weights from
    /// the seed, statistics at zero, a fresh optimizer state. Returns the slot.
    pub fn create(&mut self, spec: &SparseSpec, state_len: usize, at: usize, id: u64) -> usize {
        let row = match self.free.pop() {
            Some(row) => row,
            None => {
                if self.rows % CHUNK_ROWS == 0 {
                    self.state.push(vec![0.0; CHUNK_ROWS * state_len].into_boxed_slice());
                }
                self.rows += 1;
                (self.rows - 1) as u32
            }
        };
        self.records.put(at, id, row);
        spec.init_row(id, self.records.weights_mut(at));
        let state = self.state_mut(row, state_len);
        Accessor::init(state);
        spec.optimizer.init_state(&mut state[STATS..]);
        at
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

    /// Removes the id in `slot`, keeping its state row for reuse. Slots of other ids may move.
    pub fn remove(&mut self, slot: usize) {
        if let Some(log) = &mut self.removed {
            log.push(self.records.id(slot));
        }
        let row = self.records.remove(slot);
        self.free.push(row);
    }

    /// The rows a base (`delta` false) or delta save keeps, appended as ids and weights as a
    /// pull reads them; their delta scores start again (a base restarts every row's). Returns
    /// the ids removed since the last such save (none for a base) and starts a new log.
    pub fn export(
        &mut self,
        spec: &SparseSpec,
        state_len: usize,
        delta: bool,
        ids: &mut Vec<u64>,
        weights: &mut Vec<f32>,
    ) -> Vec<u64> {
        let accessor = &spec.accessor;
        let slots: Vec<usize> = self.records.occupied().collect();
        for slot in slots {
            let (id, row) = (self.records.id(slot), self.records.row(slot));
            let stats = &self.state(row, state_len)[..STATS];
            let keep = if delta { accessor.in_delta(stats) } else { accessor.in_base(stats) };
            if keep {
                let live = accessor.embedx_live(stats);
                ids.push(id);
                let at = weights.len();
                weights.extend_from_slice(self.records.weights(slot));
                if !live {
                    weights[at + 1..].fill(0.0);
                }
            }
            if keep || !delta {
                Accessor::saved(&mut self.state_mut(row, state_len)[..STATS]);
            }
        }
        let removed = self.removed.replace(Vec::new()).unwrap_or_default();
        if delta {
            removed
        } else {
            Vec::new()
        }
    }

    /// Evicts the lowest-score row among the occupied slots from `hash`'s home on, skipping
    /// ids `keep` protects (rows of the batch being applied). False if every candidate is kept.
    pub fn evict_near(&mut self, accessor: &Accessor, state_len: usize, hash: u64, keep: impl Fn(u64) -> bool) -> bool {
        let mut best: Option<(f32, u64)> = None;
        for slot in self.records.occupied_from(hash).take(EVICT_WINDOW) {
            let id = self.records.id(slot);
            if keep(id) {
                continue;
            }
            let score = accessor.row_score(self.state(self.records.row(slot), state_len));
            if best.is_none_or(|(s, _)| score < s) {
                best = Some((score, id));
            }
        }
        let Some((_, victim)) = best.or_else(|| {
            // The neighbourhood holds only protected rows: any other row of the stripe.
            let any = self.records.occupied().find(|&s| !keep(self.records.id(s)))?;
            Some((0.0, self.records.id(any)))
        }) else {
            return false;
        };
        let slot = self.records.find(victim, mix64(victim)).expect("the victim is held");
        self.remove(slot);
        self.counts.evicted += 1;
        true
    }

    /// One shrink of every row: statistics decayed after `days` days, and rows the accessor
    /// condemns removed; returns how many.
    pub fn shrink(&mut self, accessor: &Accessor, state_len: usize, days: u32) -> u64 {
        let mut condemned = Vec::new();
        let slots: Vec<usize> = self.records.occupied().collect();
        for slot in slots {
            let (id, row) = (self.records.id(slot), self.records.row(slot));
            match accessor.shrink(self.state_mut(row, state_len), days) {
                super::accessor::Verdict::Keep => {}
                super::accessor::Verdict::LowScore => {
                    self.counts.shrunk_score += 1;
                    condemned.push(id);
                }
                super::accessor::Verdict::Unseen => {
                    self.counts.shrunk_unseen += 1;
                    condemned.push(id);
                }
            }
        }
        for &id in &condemned {
            let slot = self.records.find(id, mix64(id)).expect("a condemned id is held");
            self.remove(slot);
        }
        condemned.len() as u64
    }
}
