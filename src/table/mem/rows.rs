//! The rows of one sparse-table stripe, packed and numbered 0..len with no holes (a removed
//! row's place takes the last row, so the slab never holds dead rows, a sweep reads memory in
//! order, and the index ([`super::index`]) can be rebuilt from the slab alone).
//!
//! A row is `[id | weights | show, click, delta score | unseen days | optimizer state]` in
//! 4-byte words, cut by [`Layout`] into a hot part, which a pull reads, in 64-byte aligned
//! chunks, and where that saves memory a cold part (the optimizer state, which only pushes
//! read) and the unseen days as a `u16` beside the chunk. The rule keeps a pull of a dim-10 row
//! to one cache line: with per-dimension Adagrad the hot part `[id | 10 weights | 3 statistics
//! | unseen]` is exactly 64 bytes and the 40 bytes of state are cold (104 bytes a row); with
//! row-wise Adagrad `[id | 10 weights | 3 statistics | accumulator]` is 64 bytes and the unseen
//! days take 2 (66). Hot and cold parts are each [`Chunked`] by their own size, in blocks of
//! huge pages; the unseen days are a `u16` per row beside each hot chunk. Unseen days are whole
//! days; they saturate at 65,535.

use super::chunked::Chunked;
use crate::table::accessor::STATS;

/// Words before the weights: the id's two halves.
const ID_WORDS: usize = 2;
/// Statistics words in a row besides the unseen days: show, click, delta score.
const STAT_WORDS: usize = STATS - 1;
/// Words of a cache line.
const LINE_WORDS: usize = 16;
/// Most padding words a hot part is given to start every row on a cache line.
const MAX_PAD: usize = 3;

/// Where a row's optimizer state and unseen days live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Words per row in the hot part.
    pub hot: usize,
    /// Words per row in the cold part (the optimizer state, when it is cold).
    pub cold: usize,
    /// The state's first word in the hot part, or `None` when it is cold.
    pub state_at: Option<usize>,
    /// The unseen days' word in the hot part, or `None` when they are a `u16` beside the chunk.
    pub unseen_at: Option<usize>,
}

impl Layout {
    /// The layout of rows of `dim` weights and `state` optimizer words: hot rows whole cache
    /// lines where that costs at most `MAX_PAD` (3) words of padding, else one unpadded part.
    pub fn of(dim: usize, state: usize) -> Layout {
        let base = ID_WORDS + dim + STAT_WORDS;
        let lines = |w: usize| w.next_multiple_of(LINE_WORDS);
        if lines(base + 1 + state) - (base + 1 + state) <= MAX_PAD {
            // Everything in whole lines.
            Layout { hot: lines(base + 1 + state), cold: 0, state_at: Some(base + 1), unseen_at: Some(base) }
        } else if state > 0 && (base + state).is_multiple_of(LINE_WORDS) {
            // The state fills the lines exactly; the unseen days go beside them.
            Layout { hot: base + state, cold: 0, state_at: Some(base), unseen_at: None }
        } else if lines(base + 1) - (base + 1) <= MAX_PAD {
            // What a pull reads in whole lines, the state cold.
            Layout { hot: lines(base + 1), cold: state, state_at: None, unseen_at: Some(base) }
        } else {
            Layout { hot: base + 1 + state, cold: 0, state_at: Some(base + 1), unseen_at: Some(base) }
        }
    }

    /// Bytes a row takes.
    pub fn row_bytes(&self) -> usize {
        4 * (self.hot + self.cold) + if self.unseen_at.is_none() { 2 } else { 0 }
    }
}

/// One stripe's packed rows.
pub struct Rows {
    /// What a pull reads: `[id | weights | statistics | ...]`, `layout.hot` words a row.
    hot: Chunked,
    /// The optimizer state when it is cold, `layout.cold` words a row.
    cold: Chunked,
    /// Unseen days beside each hot chunk, when the layout has no word for them.
    unseen: Vec<Box<[u16]>>,
    len: usize,
    dim: usize,
    state: usize,
    layout: Layout,
}

/// Where a row's unseen days are, writable.
enum UnseenMut<'a> {
    Word(&'a mut u32),
    Short(&'a mut u16),
}

/// A row's parts, writable.
pub struct RowMut<'a> {
    /// The weights.
    pub weights: &'a mut [f32],
    /// Show, click and delta score.
    pub stats: &'a mut [f32],
    /// The optimizer state.
    pub state: &'a mut [f32],
    unseen: UnseenMut<'a>,
}

impl RowMut<'_> {
    /// The four statistics as the accessor reads them.
    #[inline]
    pub fn stats4(&self) -> [f32; STATS] {
        let unseen = match &self.unseen {
            UnseenMut::Word(w) => **w as f32,
            UnseenMut::Short(s) => **s as f32,
        };
        [self.stats[0], self.stats[1], self.stats[2], unseen]
    }

    /// Stores the four statistics the accessor wrote (unseen days as whole days).
    #[inline]
    pub fn set_stats(&mut self, s: &[f32; STATS]) {
        self.stats.copy_from_slice(&s[..STAT_WORDS]);
        match &mut self.unseen {
            UnseenMut::Word(w) => **w = days(s[STAT_WORDS]) as u32,
            UnseenMut::Short(v) => **v = days(s[STAT_WORDS]),
        }
    }
}

impl Rows {
    /// An empty slab for rows of `dim` weights and `state` optimizer floats.
    pub fn new(dim: usize, state: usize) -> Rows {
        let layout = Layout::of(dim, state);
        Rows {
            hot: Chunked::new(layout.hot),
            cold: Chunked::new(layout.cold),
            unseen: Vec::new(),
            len: 0,
            dim,
            state,
            layout,
        }
    }

    /// Rows per hot chunk.
    pub fn chunk_rows(&self) -> usize {
        self.hot.per_chunk()
    }

    /// Rows held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no row is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes a row takes in the slab.
    pub fn row_bytes(&self) -> usize {
        self.layout.row_bytes()
    }

    /// Where `row`'s hot part starts (`layout.hot` words).
    #[inline(always)]
    fn hot_ptr(&self, row: u32) -> *mut u32 {
        self.hot.ptr(row)
    }

    /// Where `row`'s cold part starts (`layout.cold` words).
    #[inline(always)]
    fn cold_ptr(&self, row: u32) -> *mut u32 {
        self.cold.ptr(row)
    }

    #[inline(always)]
    fn hot(&self, row: u32) -> &[u32] {
        // SAFETY: `hot_ptr` points at `layout.hot` words of a live chunk, which `&self` keeps
        // alive and unwritten.
        unsafe { std::slice::from_raw_parts(self.hot_ptr(row), self.layout.hot) }
    }

    #[inline(always)]
    fn hot_mut(&mut self, row: u32) -> &mut [u32] {
        // SAFETY: as in `hot`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.hot_ptr(row), self.layout.hot) }
    }

    #[inline]
    fn cold(&self, row: u32) -> &[u32] {
        // SAFETY: as in `hot`, for the cold part.
        unsafe { std::slice::from_raw_parts(self.cold_ptr(row), self.layout.cold) }
    }

    fn cold_mut(&mut self, row: u32) -> &mut [u32] {
        // SAFETY: as in `hot_mut`, for the cold part.
        unsafe { std::slice::from_raw_parts_mut(self.cold_ptr(row), self.layout.cold) }
    }

    /// The id of `row`.
    #[inline(always)]
    pub fn id(&self, row: u32) -> u64 {
        let w = self.hot(row);
        (w[1] as u64) << 32 | w[0] as u64
    }

    /// The weights of `row`.
    #[inline(always)]
    pub fn weights(&self, row: u32) -> &[f32] {
        bytemuck::cast_slice(&self.hot(row)[ID_WORDS..ID_WORDS + self.dim])
    }

    /// The four statistics of `row` as the accessor reads them: show, click, delta score,
    /// unseen days.
    #[inline]
    pub fn stats(&self, row: u32) -> [f32; STATS] {
        let hot = self.hot(row);
        let w = &hot[ID_WORDS + self.dim..];
        let unseen = match self.layout.unseen_at {
            Some(at) => hot[at] as f32,
            None => {
                let (c, r) = self.hot.place(row);
                self.unseen[c][r] as f32
            }
        };
        [f32::from_bits(w[0]), f32::from_bits(w[1]), f32::from_bits(w[2]), unseen]
    }

    /// The optimizer state of `row`.
    fn state(&self, row: u32) -> &[f32] {
        match self.layout.state_at {
            Some(at) => bytemuck::cast_slice(&self.hot(row)[at..at + self.state]),
            None => bytemuck::cast_slice(self.cold(row)),
        }
    }

    /// Every part of `row`, writable.
    #[inline]
    pub fn row_mut(&mut self, row: u32) -> RowMut<'_> {
        let (c, r) = self.hot.place(row);
        let (dim, state, layout) = (self.dim, self.state, self.layout);
        // SAFETY: as in `hot` and `cold`; the two parts are disjoint memory (the `unseen` box
        // borrowed below is a third), and `&mut self` makes them the only references.
        let (hot, cold) = unsafe {
            (
                std::slice::from_raw_parts_mut(self.hot_ptr(row), layout.hot),
                std::slice::from_raw_parts_mut(self.cold_ptr(row), layout.cold),
            )
        };
        let (head, tail) = hot.split_at_mut(ID_WORDS + dim + STAT_WORDS);
        let (weights, stats) = head[ID_WORDS..].split_at_mut(dim);
        let (weights, stats): (&mut [f32], &mut [f32]) =
            (bytemuck::cast_slice_mut(weights), bytemuck::cast_slice_mut(stats));
        let base = ID_WORDS + dim + STAT_WORDS;
        // In the hot tail the unseen word, when there, comes first.
        let (unseen_word, tail) = match layout.unseen_at {
            Some(_) => {
                let (u, t) = tail.split_at_mut(1);
                (Some(&mut u[0]), t)
            }
            None => (None, tail),
        };
        let state_words: &mut [u32] = match layout.state_at {
            Some(at) => {
                let skip = at - base - usize::from(unseen_word.is_some());
                &mut tail[skip..skip + state]
            }
            None => cold,
        };
        let unseen = match unseen_word {
            Some(w) => UnseenMut::Word(w),
            None => UnseenMut::Short(&mut self.unseen[c][r]),
        };
        RowMut { weights, stats, state: bytemuck::cast_slice_mut(state_words), unseen }
    }

    /// Hints the CPU to start loading `row`: what a pull reads (`whole` false) or all a push
    /// touches.
    #[inline(always)]
    pub fn prefetch(&self, row: u32, whole: bool) {
        let hot = self.hot(row);
        prefetch_words(if whole { hot } else { &hot[..ID_WORDS + self.dim] });
        if whole {
            self.prefetch_rest(row);
        }
    }

    /// The prefetches of a push beyond the hot part: the cold state and the unseen days.
    #[inline]
    fn prefetch_rest(&self, row: u32) {
        if self.layout.cold > 0 {
            prefetch_words(self.cold(row));
        }
        if self.layout.unseen_at.is_none() {
            let (c, r) = self.hot.place(row);
            let u = &self.unseen[c][r];
            prefetch_ptr(u as *const u16 as usize);
        }
    }

    /// Appends a row for `id`, every other word zero; returns its number.
    pub fn push(&mut self, id: u64) -> u32 {
        let row = self.len as u32;
        assert!(self.len < 1 << 24, "a stripe numbers its rows in 24 bits");
        self.len += 1;
        self.hot.grow_to(self.len);
        self.cold.grow_to(self.len);
        while self.layout.unseen_at.is_none() && self.unseen.len() < self.hot.chunks() {
            self.unseen.push(bytemuck::allocation::zeroed_slice_box(self.hot.per_chunk()));
        }
        // The place may hold a row removed before: clear every part.
        if self.layout.unseen_at.is_none() {
            let (c, r) = self.hot.place(row);
            self.unseen[c][r] = 0;
        }
        self.cold_mut(row).fill(0);
        self.hot_mut(row).fill(0);
        self.set_id(row, id);
        row
    }

    /// Removes `row`: the last row moves into its place. Returns the moved row's id and former
    /// number, if another row moved.
    pub fn swap_remove(&mut self, row: u32) -> Option<(u64, u32)> {
        let last = self.len as u32 - 1;
        let moved = if row != last {
            self.copy_row(last, row);
            Some((self.id(row), last))
        } else {
            None
        };
        self.len -= 1;
        // Chunks wholly past the end go back, but one spare (a shrink then a few new rows
        // does not reallocate).
        self.hot.shrink_to(self.len);
        self.cold.shrink_to(self.len);
        self.unseen.truncate(self.hot.chunks());
        moved
    }

    /// Copies every stored part of row `from` over row `to` (`to` < `from`), as stored.
    fn copy_row(&mut self, from: u32, to: u32) {
        assert_ne!(from, to);
        let ((fc, fr), (tc, tr), l) = (self.hot.place(from), self.hot.place(to), self.layout);
        // SAFETY: two different rows' parts are disjoint, each inside its live chunk (`hot_ptr`,
        // `cold_ptr`), and `&mut self` makes these the only accesses.
        unsafe {
            std::ptr::copy_nonoverlapping(self.hot_ptr(from), self.hot_ptr(to), l.hot);
            std::ptr::copy_nonoverlapping(self.cold_ptr(from), self.cold_ptr(to), l.cold);
        }
        if self.layout.unseen_at.is_none() {
            self.unseen[tc][tr] = self.unseen[fc][fr];
        }
    }

    fn set_id(&mut self, row: u32, id: u64) {
        let hot = self.hot_mut(row);
        hot[0] = id as u32;
        hot[1] = (id >> 32) as u32;
    }

    /// `row` in the checkpoint layout `[weights | statistics | optimizer state]`, appended.
    pub fn full_row(&self, row: u32, out: &mut Vec<f32>) {
        out.extend_from_slice(self.weights(row));
        out.extend_from_slice(&self.stats(row));
        out.extend_from_slice(self.state(row));
    }

    /// Overwrites `row` from the checkpoint layout (`full.len()` must match).
    pub fn set_full_row(&mut self, row: u32, full: &[f32]) {
        let dim = self.dim;
        let mut r = self.row_mut(row);
        r.weights.copy_from_slice(&full[..dim]);
        let stats: [f32; STATS] = full[dim..dim + STATS].try_into().expect("four statistics");
        r.set_stats(&stats);
        r.state.copy_from_slice(&full[dim + STATS..]);
    }
}

/// Prefetches every cache line `words` span.
#[inline(always)]
fn prefetch_words(words: &[u32]) {
    if let (Some(first), Some(last)) = (words.first(), words.last()) {
        // A plain loop over line addresses: a stepped inclusive range compiled to a dozen
        // compares a line, on the path of every pulled id.
        let (mut line, end) = (first as *const u32 as usize & !63, last as *const u32 as usize & !63);
        loop {
            prefetch_ptr(line);
            if line >= end {
                break;
            }
            line += 64;
        }
    }
}

#[inline(always)]
fn prefetch_ptr(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: prefetching is only a hint and never faults; callers pass addresses in the slab's
    // pages (a line's start, which may lie just before an unaligned allocation).
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

/// Unseen days as stored: whole days, saturating at `u16::MAX` (a NaN reads as 0).
#[inline]
pub fn days(v: f32) -> u16 {
    v as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_keep_ids_weights_statistics_and_state_through_chunks_and_removals() {
        let mut rows = Rows::new(3, 2);
        // Eleven words, unpadded: padding to 16 would waste more than 3.
        assert_eq!(rows.row_bytes(), 44);
        let n = 2 * rows.chunk_rows() + 5;
        // Unseen days (index 6) are whole days below 65,536.
        let full = |k: usize| -> Vec<f32> {
            (0..9).map(|j| if j == 6 { (k % 1000) as f32 } else { (k * 10 + j) as f32 }).collect()
        };
        for k in 0..n {
            let id = u64::MAX - k as u64;
            let r = rows.push(id);
            assert_eq!(r as usize, k);
            rows.set_full_row(r, &full(k));
        }
        let mut out = Vec::new();
        rows.full_row(7, &mut out);
        assert_eq!(out, full(7));
        assert_eq!(rows.id(7), u64::MAX - 7);
        // Removing row 7 moves the last row into it, with its unseen days.
        assert_eq!(rows.swap_remove(7), Some((u64::MAX - (n as u64 - 1), n as u32 - 1)));
        out.clear();
        rows.full_row(7, &mut out);
        assert_eq!(out, full(n - 1));
        // Emptying the slab gives its chunks back but one spare.
        while !rows.is_empty() {
            rows.swap_remove(0);
        }
        assert_eq!(rows.hot.chunks(), 1);
    }

    #[test]
    fn a_row_of_dim_10_with_one_state_float_is_one_aligned_cache_line() {
        let mut rows = Rows::new(10, 1);
        assert_eq!(rows.row_bytes(), 66);
        for id in 0..100 {
            rows.push(id);
        }
        assert!((0..100).all(|r| (rows.hot(r).as_ptr() as usize).is_multiple_of(64)));
    }

    #[test]
    fn layouts_put_what_a_pull_reads_in_whole_lines_where_it_costs_little() {
        // Per-dimension Adagrad, dim 10: [id 2 | 10 | 3 | unseen] = 16 words hot, 10 cold.
        assert_eq!(Layout::of(10, 10), Layout { hot: 16, cold: 10, state_at: None, unseen_at: Some(15) });
        assert_eq!(Layout::of(10, 10).row_bytes(), 104);
        // Row-wise Adagrad: [id 2 | 10 | 3 | accumulator] = 16, the unseen days beside.
        assert_eq!(Layout::of(10, 1), Layout { hot: 16, cold: 0, state_at: Some(15), unseen_at: None });
        assert_eq!(Layout::of(10, 1).row_bytes(), 66);
        // SGD: 16 words, nothing else.
        assert_eq!(Layout::of(10, 0), Layout { hot: 16, cold: 0, state_at: Some(16), unseen_at: Some(15) });
        // Dim 8, per-dimension: 14 hot words padded to 16, 8 cold.
        assert_eq!(Layout::of(8, 8).row_bytes(), 64 + 32);
        // Dim 64: padding would cost 10 words, so one unpadded part.
        assert_eq!(Layout::of(64, 64), Layout { hot: 134, cold: 0, state_at: Some(70), unseen_at: Some(69) });
    }

    #[test]
    fn every_layout_keeps_each_part_apart() {
        // Rows of up to a whole block (one a chunk), and enough of them for pooled chunks.
        let layouts = [(10, 10), (10, 1), (10, 0), (8, 8), (64, 64), (3, 2), (1, 0), (13, 4), (5000, 0), (9000, 0)];
        for (dim, state) in layouts {
            let mut rows = Rows::new(dim, state);
            let n = (2 * rows.chunk_rows() + 5).max(300);
            let full = |k: usize| -> Vec<f32> {
                (0..dim + STATS + state)
                    .map(|j| if j == dim + 3 { (k % 7) as f32 } else { (k * 100 + j) as f32 })
                    .collect()
            };
            for k in 0..n {
                let r = rows.push(k as u64 * 31);
                rows.set_full_row(r, &full(k));
            }
            rows.swap_remove(5);
            let mut out = Vec::new();
            for r in 0..rows.len() as u32 {
                let k = if r == 5 { n - 1 } else { r as usize };
                out.clear();
                rows.full_row(r, &mut out);
                assert_eq!(out, full(k), "dim {dim} state {state} row {r}");
                assert_eq!(rows.id(r), k as u64 * 31);
            }
            // A new row in a removed row's place starts clear.
            let r = rows.push(7);
            out.clear();
            rows.full_row(r, &mut out);
            assert!(out.iter().all(|&v| v == 0.0), "dim {dim} state {state}");
        }
    }

    #[test]
    fn unseen_days_are_whole_days_that_saturate() {
        assert_eq!((days(3.0), days(-1.0), days(f32::NAN), days(1e9)), (3, 0, 0, u16::MAX));
        for state in [0, 1] {
            let mut rows = Rows::new(13, state);
            let r = rows.push(5);
            rows.row_mut(r).set_stats(&[1.0, 0.0, 0.5, 12.0]);
            assert_eq!(rows.stats(r), [1.0, 0.0, 0.5, 12.0]);
            rows.row_mut(r).set_stats(&[1.0, 0.0, 0.5, 1e9]);
            assert_eq!(rows.stats(r)[STATS - 1], 65_535.0);
        }
    }
}
