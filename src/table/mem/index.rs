//! The id -> row index of one sparse-table stripe: an open-addressing hash table of 4-byte slots
//! in 64-byte buckets (bucketized linear probing), written here because the index is most of a
//! row's memory overhead and no crate keeps it this small.
//!
//! A slot is `(row + 1) << 8 | tag`: the row's number in the stripe's slab ([`super::rows`])
//! and 8 bits of the id's hash, so a probe reads a row (to compare its id) only when the tag
//! matches; 0 is an empty slot and 1 a tombstone. A probe scans its home bucket, one cache line,
//! and moves to the next bucket only when that one has no empty slot, so at the load kept here
//! (at most 9/10 of the slots used, 4/5 after a rebuild) nearly every probe reads one line.
//! Buckets are chosen by multiplying 32 bits of the hash (`fastrange`), so their number need not
//! be a power of two and the index grows by an eighth at a time: 4.4 to 5 bytes per row, where
//! hashbrown (a control byte and a 4-byte entry per slot, sizes in powers of two) pays 5.7 to
//! 11.4.
//!
//! An index of a block (64 KiB) or more lives in blocks of the pool of huge pages
//! ([`super::pool`]): at 10M rows a stripe's index is 780 KiB, and in small pages nearly every
//! probe also missed the TLB (about an eighth of a pull's time, measured).
//!
//! A removal empties its slot, or leaves a tombstone where its bucket has no empty slot (a probe
//! must go on past it). The index is rebuilt from the slab alone: the rows grouped by home bucket
//! by a counting sort, then the buckets written in order. A bucket is chosen from bits 16..48 of
//! the hash, because the top bits pick the server and the low 6 the stripe: a first version chose
//! buckets from the top bits, so on each server only half of the buckets were anyone's home (a unit
//! test now checks the spread of one server's and one stripe's ids).
//!
//! The index never reads ids itself: callers pass the function from a row to its id.

use super::pool::{self, Span, BLOCK};

/// Slots per bucket: one cache line of `u32`.
pub const BUCKET: usize = 16;
const EMPTY: u32 = 0;
const TOMB: u32 = 1;
/// Most rows one stripe can number in a slot's 24 bits.
pub const MAX_ROWS: usize = (1 << 24) - 2;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Bucket([u32; BUCKET]);

// SAFETY: 16 plain u32s with no padding (the size is exactly the alignment); any bit pattern is valid.
unsafe impl bytemuck::Zeroable for Bucket {}
// SAFETY: as above.
unsafe impl bytemuck::Pod for Bucket {}

/// Buckets of a pooled segment: one block.
const SEG_BUCKETS: usize = BLOCK / 64;

/// The index of one stripe's rows.
pub struct Index {
    /// The buckets, zeroed (all slots empty) and given back on a rebuild: a mapping of their own
    /// while they take less than a block, else blocks of [`SEG_BUCKETS`] from the pool of huge
    /// pages ([`pool::INDEX`]), so a probe's bucket seldom costs a page walk.
    _segs: Vec<Span>,
    /// Where each of `segs` starts: a probe reads one word to find its bucket.
    bases: Box<[*mut Bucket]>,
    /// Number of buckets.
    nb: usize,
    /// Live slots.
    live: usize,
    /// Tombstones (removed slots in buckets that had no empty slot left).
    tombs: usize,
}

/// The tag of a hash: bits the bucket choice (16..48), the stripe (the low 6) and the server
/// (the top ones) do not use.
#[inline(always)]
fn tag(hash: u64) -> u32 {
    (hash >> 8) as u32 & 0xff
}

#[inline(always)]
fn row_of(slot: u32) -> u32 {
    (slot >> 8) - 1
}

// SAFETY: `bases` only points into `segs`, which the index owns; access goes through `&`/`&mut`.
unsafe impl Send for Index {}
// SAFETY: as above.
unsafe impl Sync for Index {}

impl Default for Index {
    fn default() -> Self {
        Index::new()
    }
}

impl Index {
    /// An empty index of one bucket.
    pub fn new() -> Index {
        Index::with_buckets(1)
    }

    fn with_buckets(nb: usize) -> Index {
        Index::with_buckets_zeroed(nb, true)
    }

    /// An index of `nb` buckets, whose pooled blocks are zeroed only when `zeroed` (else
    /// the caller writes every bucket before reading any).
    fn with_buckets_zeroed(nb: usize, zeroed: bool) -> Index {
        let segs = if nb * 64 < BLOCK {
            vec![Span::own(nb * 64)]
        } else {
            (0..nb.div_ceil(SEG_BUCKETS)).map(|_| Span::pooled(&pool::INDEX, zeroed)).collect()
        };
        let bases = segs.iter().map(|s| s.as_ptr() as *mut Bucket).collect();
        Index { _segs: segs, bases, nb, live: 0, tombs: 0 }
    }

    /// Where bucket `b` (below `nb`) is.
    #[inline(always)]
    fn bucket_ptr(&self, b: usize) -> *mut Bucket {
        assert!(b < self.nb);
        // SAFETY: bucket `b` (below `nb`) lies in segment `b / SEG_BUCKETS`, which `bases` points
        // at and `segs` keeps alive: its own mapping holds `nb` buckets, a block SEG_BUCKETS.
        unsafe { self.bases.get_unchecked(b / SEG_BUCKETS).add(b % SEG_BUCKETS) }
    }

    /// Bucket `b` (below `nb`).
    #[inline(always)]
    fn bucket(&self, b: usize) -> &Bucket {
        // SAFETY: `bucket_ptr` points at a live bucket, which `&self` keeps unwritten.
        unsafe { &*self.bucket_ptr(b) }
    }

    #[inline]
    fn bucket_mut(&mut self, b: usize) -> &mut [u32; BUCKET] {
        // SAFETY: as in `bucket`, and `&mut self` makes this the only reference.
        unsafe { &mut (*self.bucket_ptr(b)).0 }
    }

    /// Bytes the index's buckets take (a pooled index's last block may hold room for more).
    pub fn bytes(&self) -> usize {
        self.nb * 64
    }

    /// Live entries.
    pub fn len(&self) -> usize {
        self.live
    }

    /// True if no entry is live.
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    #[inline(always)]
    fn home(&self, hash: u64) -> usize {
        // Bits 16..48: the top bits pick the server and the low 6 the stripe, so within one
        // stripe of one server only these are spread evenly.
        (((hash >> 16) as u32 as u64 * self.nb as u64) >> 32) as usize
    }

    #[inline]
    fn next(&self, b: usize) -> usize {
        if b + 1 == self.nb {
            0
        } else {
            b + 1
        }
    }

    /// Hints the CPU to start loading the home bucket of `hash`.
    #[inline(always)]
    pub fn prefetch(&self, hash: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let ptr = self.bucket(self.home(hash)) as *const Bucket as *const i8;
            // SAFETY: prefetching is only a hint; the pointer is inside `buckets`.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr) };
        }
    }

    /// The slots of bucket `b` whose tag is `t` (a bit each), and whether it has an empty slot.
    /// Branch-free over the 16 slots: occupancy and tags are random, so branches would mispredict.
    #[inline(always)]
    fn scan(&self, b: usize, t: u32) -> (u32, bool) {
        let (mut hits, mut empty) = (0u32, 0u32);
        for (i, &s) in self.bucket(b).0.iter().enumerate() {
            hits |= (((s & 0xff) == t) & (s > TOMB)) as u32 * (1 << i);
            empty |= (s == EMPTY) as u32 * (1 << i);
        }
        (hits, empty != 0)
    }

    /// The row of the first slot in the home bucket of `hash` whose tag matches: most likely
    /// the row a `find` will read, so it can be prefetched before.
    #[inline(always)]
    pub fn guess(&self, hash: u64) -> Option<u32> {
        let b = self.home(hash);
        let (hits, _) = self.scan(b, tag(hash));
        (hits != 0).then(|| row_of(self.bucket(b).0[hits.trailing_zeros() as usize]))
    }

    /// The row holding `id` (whose `mix64` is `hash`), reading candidate rows' ids with `id_of`.
    #[inline]
    pub fn find(&self, id: u64, hash: u64, id_of: impl Fn(u32) -> u64) -> Option<u32> {
        let t = tag(hash);
        let mut b = self.home(hash);
        loop {
            let (mut hits, vacant) = self.scan(b, t);
            while hits != 0 {
                let row = row_of(self.bucket(b).0[hits.trailing_zeros() as usize]);
                if id_of(row) == id {
                    return Some(row);
                }
                hits &= hits - 1;
            }
            // A key is never stored past a bucket with an empty slot.
            if vacant {
                return None;
            }
            b = self.next(b);
        }
    }

    /// Adds `row` for an id (whose `mix64` is `hash`) known to be absent, growing the index
    /// (rehashing every row's id with `hash_of`) when it would pass 9/10 of its slots.
    pub fn insert(&mut self, hash: u64, row: u32, hash_of: impl Fn(u32) -> u64) {
        debug_assert!((row as usize) <= MAX_ROWS);
        if (self.live + self.tombs + 1) * 10 > self.nb * BUCKET * 9 {
            self.rebuild(self.live + 1, (0..self.live as u32).map(&hash_of));
        }
        self.place(hash, row);
        self.live += 1;
    }

    /// Stores `row` in the first free slot of its probe run (no id check).
    fn place(&mut self, hash: u64, row: u32) {
        let slot = (row + 1) << 8 | tag(hash);
        let mut b = self.home(hash);
        loop {
            if let Some(k) = self.bucket(b).0.iter().position(|&s| s <= TOMB) {
                let s = &mut self.bucket_mut(b)[k];
                let was = std::mem::replace(s, slot);
                if was == TOMB {
                    self.tombs -= 1;
                }
                return;
            }
            b = self.next(b);
        }
    }

    /// The bucket and position of the slot holding `row` (its id's hash is `hash`).
    fn locate(&self, hash: u64, row: u32) -> (usize, usize) {
        let mut b = self.home(hash);
        for _ in 0..self.nb {
            if let Some(k) = self.bucket(b).0.iter().position(|&s| s > TOMB && row_of(s) == row) {
                return (b, k);
            }
            b = self.next(b);
        }
        unreachable!("row {row} is indexed")
    }

    /// The rows indexed in the home bucket of `hash` and the bucket after it: a newcomer's
    /// neighbourhood, where it looks for a row to evict.
    pub fn near(&self, hash: u64) -> impl Iterator<Item = u32> + '_ {
        let (home, n) = (self.home(hash), self.nb);
        (0..n.min(2)).flat_map(move |k| self.bucket((home + k) % n).0.iter().filter(|&&s| s > TOMB).map(|&s| row_of(s)))
    }

    /// Removes the entry of `row` (whose id's hash is `hash`).
    pub fn remove(&mut self, hash: u64, row: u32) {
        let (b, k) = self.locate(hash, row);
        let bucket = self.bucket_mut(b);
        // No probe passes a bucket with an empty slot, so no key beyond it needs this slot
        // kept as a tombstone.
        if bucket.contains(&EMPTY) {
            bucket[k] = EMPTY;
        } else {
            bucket[k] = TOMB;
            self.tombs += 1;
        }
        self.live -= 1;
    }

    /// Points the entry of row `from` (whose id's hash is `hash`) at row `to`: the slab moved it.
    pub fn renumber(&mut self, hash: u64, from: u32, to: u32) {
        let (b, k) = self.locate(hash, from);
        let s = &mut self.bucket_mut(b)[k];
        *s = (to + 1) << 8 | (*s & 0xff);
    }

    /// Rebuilds the index for `rows` rows numbered 0.. whose hashes `hashes` yields in row
    /// order, sized so the rows fill 4/5 of the slots.
    ///
    /// The rows are grouped by home bucket first ([`crate::base::layout::group_positions`], a counting
    /// sort) and the buckets then
    /// written in order, each whole: placing the rows one by one wrote the new buckets at
    /// random and zeroed them first, and rebuilds were most of an insert's time (measured:
    /// 2.4x faster inserts at 10M rows). A bucket that gets more than its slots passes the
    /// rest on to the next, as a placement one by one would: no slot lies past a bucket with
    /// an empty slot.
    fn rebuild(&mut self, rows: usize, hashes: impl Iterator<Item = u64>) {
        let buckets = (rows * 5).div_ceil(4 * BUCKET).max(1);
        let live = self.live;
        // The old buckets go back to the pool before the new ones are taken.
        *self = Index::new();
        let mut fresh = Index { live, ..Index::with_buckets_zeroed(buckets, false) };
        let hashes: Vec<u64> = hashes.collect();
        let (mut order, mut start) = (Vec::new(), Vec::new());
        crate::base::layout::group_positions(
            hashes.len(),
            buckets,
            |row| fresh.home(hashes[row]),
            &mut order,
            &mut start,
        );
        let slot = |row: u32| (row + 1) << 8 | tag(hashes[row as usize]);
        // Rows passed on from earlier buckets: `order[from..]` up to this bucket's end not yet placed.
        let mut from = 0;
        for b in 0..buckets {
            let n = (start[b + 1] - from).min(BUCKET);
            let bucket = fresh.bucket_mut(b);
            for (s, &row) in bucket.iter_mut().zip(&order[from..from + n]) {
                *s = slot(row);
            }
            bucket[n..].fill(EMPTY);
            from += n;
        }
        // What the last bucket could not hold goes on from bucket 0, into its first empty slots.
        let mut b = 0;
        for &row in &order[from..] {
            loop {
                if let Some(k) = fresh.bucket(b).0.iter().position(|&s| s == EMPTY) {
                    fresh.bucket_mut(b)[k] = slot(row);
                    break;
                }
                b += 1;
            }
        }
        *self = fresh;
    }

    /// Whether the index is far larger than its rows need (after a shrink): below 2/5 used.
    fn oversized(&self) -> bool {
        self.nb > 1 && self.live * 5 < self.nb * BUCKET * 2
    }

    /// Rebuilds the index smaller when removals left it far larger than its rows need
    /// (rehashing every row's id with `hash_of`, as `insert` does when it grows).
    pub fn fit(&mut self, hash_of: impl Fn(u32) -> u64) {
        if self.oversized() {
            self.rebuild(self.live, (0..self.live as u32).map(hash_of));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::layout::mix64;

    /// An index over a row -> id vector, as a stripe keeps it.
    struct Table {
        index: Index,
        ids: Vec<u64>,
    }

    impl Table {
        fn new() -> Table {
            Table { index: Index::new(), ids: Vec::new() }
        }
        fn find(&self, id: u64) -> Option<u32> {
            self.index.find(id, mix64(id), |r| self.ids[r as usize])
        }
        fn add(&mut self, id: u64) {
            assert_eq!(self.find(id), None);
            let ids = &self.ids;
            self.index.insert(mix64(id), ids.len() as u32, |r| mix64(ids[r as usize]));
            self.ids.push(id);
        }
        /// Swap-remove, as the slab does.
        fn remove(&mut self, id: u64) {
            let row = self.find(id).unwrap();
            self.index.remove(mix64(id), row);
            let last = self.ids.len() as u32 - 1;
            if row != last {
                let moved = self.ids[last as usize];
                self.index.renumber(mix64(moved), last, row);
            }
            self.ids.swap_remove(row as usize);
        }
    }

    #[test]
    fn finds_every_id_through_growth_and_never_an_absent_one() {
        let mut t = Table::new();
        let ids: Vec<u64> = (0..50_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 3).collect();
        for &id in &ids {
            t.add(id);
        }
        for (row, &id) in ids.iter().enumerate() {
            assert_eq!(t.find(id), Some(row as u32));
        }
        assert!((0..50_000u64).all(|i| t.find(i.wrapping_mul(31) ^ (1 << 63)).is_none()));
        // Between 4/5 and 9/10 of the slots used: 4.4 to 5 bytes per row.
        let per_row = t.index.bytes() as f64 / ids.len() as f64;
        assert!((4.4..5.01).contains(&per_row), "{per_row} bytes per row");
    }

    #[test]
    fn ids_of_one_server_and_stripe_spread_over_every_bucket() {
        // Server 0 of 2 holds the hashes whose top bit is 0, stripe 0 those whose low 6 bits
        // are 0: probes must stay as short as for any ids.
        let mut t = Table::new();
        let ids: Vec<u64> =
            (0..2_000_000u64).filter(|&i| mix64(i) >> 63 == 0 && mix64(i) & 63 == 0).take(20_000).collect();
        for &id in &ids {
            t.add(id);
        }
        let far = ids
            .iter()
            .map(|&id| {
                let (b, home) = (t.index.locate(mix64(id), t.find(id).unwrap()).0, t.index.home(mix64(id)));
                (b + t.index.nb - home) % t.index.nb
            })
            .filter(|&d| d > 0)
            .count();
        assert!(far * 8 < ids.len(), "{far} of {} ids away from their home bucket", ids.len());
    }

    #[test]
    fn removals_keep_every_other_id_findable_and_reuse_their_slots() {
        let mut t = Table::new();
        let ids: Vec<u64> = (0..20_000u64).map(|i| mix64(i) ^ 9).collect();
        for &id in &ids {
            t.add(id);
        }
        let bytes = t.index.bytes();
        for round in 0..3u64 {
            // Remove a third, add as many new ones: the index neither grows nor loses an id.
            for &id in ids.iter().skip(round as usize).step_by(3) {
                t.remove(id);
            }
            for &id in ids.iter().skip(round as usize).step_by(3) {
                assert_eq!(t.find(id), None);
                t.add(id);
            }
            for &id in &ids {
                assert_eq!(t.ids[t.find(id).unwrap() as usize], id);
            }
        }
        assert_eq!(t.index.bytes(), bytes);
        assert_eq!(t.index.len(), ids.len());
    }

    #[test]
    fn a_full_bucket_keeps_a_tombstone_that_probes_pass_and_inserts_reuse() {
        // Hashes below 2^32 all have bucket 0 as home; the tag is the id's low byte.
        let hash = |id: u64| id << 8;
        let ids: Vec<u64> = (1..=17).collect();
        let mut index = Index::with_buckets(2);
        for (row, &id) in ids.iter().enumerate() {
            index.place(hash(id), row as u32);
            index.live += 1;
        }
        let id_of = |r: u32| ids[r as usize];
        // Bucket 0 is full, so id 17 went on to bucket 1.
        assert_eq!(index.locate(hash(17), 16).0, 1);
        index.remove(hash(5), 4);
        assert_eq!(index.tombs, 1, "bucket 0 had no empty slot left");
        assert_eq!(index.find(17, hash(17), id_of), Some(16), "a probe passes the tombstone");
        assert_eq!(index.find(5, hash(5), id_of), None);
        // A removal in bucket 1, which has empty slots, leaves none.
        index.remove(hash(17), 16);
        assert_eq!(index.tombs, 1);
        index.place(hash(5), 4);
        assert_eq!((index.tombs, index.locate(hash(5), 4).0), (0, 0), "the tombstone is reused");
    }

    #[test]
    fn a_rebuild_passes_a_crowded_bucket_on_and_wraps_past_the_last() {
        // Every hash has the last bucket as home (bits 16..48 all set); the tag is the id.
        let hash = |id: u64| 0xffff_ffffu64 << 16 | id << 8;
        let ids: Vec<u64> = (0..40).collect();
        let mut index = Index::new();
        index.live = ids.len();
        index.rebuild(ids.len(), ids.iter().map(|&id| hash(id)));
        assert_eq!(index.nb, 4);
        let id_of = |r: u32| ids[r as usize];
        // 16 in the last bucket, then buckets 0 and 1 from the start: each id is found, and
        // the probes stop at bucket 1, which has empty slots.
        let buckets: Vec<usize> = ids.iter().map(|&id| index.locate(hash(id), id as u32).0).collect();
        assert_eq!(buckets.iter().filter(|&&b| b == 3).count(), 16);
        assert_eq!(buckets.iter().filter(|&&b| b == 0).count(), 16);
        assert_eq!(buckets.iter().filter(|&&b| b == 1).count(), 8);
        assert!(ids.iter().all(|&id| index.find(id, hash(id), id_of) == Some(id as u32)));
        assert_eq!(index.find(99, hash(99), id_of), None);
        assert!(index.bucket(2).0.iter().all(|&s| s == EMPTY));
    }

    #[test]
    fn id_zero_and_max_are_ordinary_ids() {
        let mut t = Table::new();
        t.add(0);
        t.add(u64::MAX);
        assert_eq!((t.find(0), t.find(u64::MAX)), (Some(0), Some(1)));
        t.remove(0);
        assert_eq!((t.find(0), t.find(u64::MAX)), (None, Some(0)));
    }

    #[test]
    fn a_rebuild_after_a_shrink_returns_the_memory() {
        let mut t = Table::new();
        for id in 0..10_000u64 {
            t.add(id);
        }
        for id in 0..9_000u64 {
            t.remove(id);
        }
        assert!(t.index.oversized());
        let ids = t.ids.clone();
        t.index.rebuild(ids.len(), ids.iter().map(|&id| mix64(id)));
        assert!(!t.index.oversized());
        assert!(t.index.bytes() < 1_000 * 6);
        assert!((9_000..10_000u64).all(|i| t.find(i).is_some()));
    }
}
