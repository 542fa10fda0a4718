//! Records of a fixed number of 4-byte words, numbered 0..len, in chunks: the storage under a
//! stripe's rows ([`super::rows`]), once for the part of a row a pull reads and once for the
//! optimizer state only a push reads.
//!
//! A chunk fills one 64 KiB block where records fill at least 7/8 of a block: the first chunk is
//! a mapping of its own, zeroed pages given as records reach them (a small stripe costs only
//! what it uses), the others blocks of the pool of huge pages ([`super::pool`]), so reaching a
//! record seldom costs a page walk. Records that fill a block poorly (some sizes over 7 KiB)
//! keep chunks of their own of about 2 MiB. Each part chunks by its own record size: a part of
//! 40-byte records sized by another part's 64-byte ones would leave 24 KiB of every block
//! unused, and in the global allocator's 4 KiB pages every push missed the TLB (measured:
//! push through a server 1.3x faster in huge pages).

use super::pages::HUGE;
use super::pool::{self, Span, BLOCK};

/// Records of `words` words each.
pub struct Chunked {
    /// The chunks' memory, only reached through `bases` (raw pointers taken without making a
    /// reference), so no reference to it ever invalidates those pointers.
    spans: Vec<Span>,
    /// Where each chunk starts: finding a record reads one word (of a small array that stays in
    /// the cache), not a chunk's whole record.
    bases: Vec<*mut u32>,
    words: usize,
    /// Records per chunk: as many as fit in a block, or for records that fill a block poorly,
    /// in a huge page's size (at least one).
    per_chunk: u32,
    /// Whether chunks after the first are pooled blocks.
    pooled: bool,
    /// [`inverse`] of `per_chunk`: a record's chunk is a multiply, not a division.
    magic: u64,
}

// SAFETY: `bases` only points into `spans`, which the value owns; access goes through `&`/`&mut`.
unsafe impl Send for Chunked {}
// SAFETY: as above.
unsafe impl Sync for Chunked {}

impl Chunked {
    /// No chunks yet, for records of `words` words (0: records that take no memory).
    pub fn new(words: usize) -> Chunked {
        let bytes = 4 * words.max(1);
        let per_block = BLOCK / bytes;
        // Pooled when records fill at least 7/8 of a block; else a block would waste too much,
        // and a chunk of its own holds a huge page's worth (not one record a mapping).
        let pooled = bytes * per_block >= BLOCK / 8 * 7;
        let per_chunk = if pooled { per_block } else { (HUGE / bytes).max(1) } as u32;
        Chunked { spans: Vec::new(), bases: Vec::new(), words, per_chunk, pooled, magic: inverse(per_chunk) }
    }

    /// Records per chunk.
    pub fn per_chunk(&self) -> usize {
        self.per_chunk as usize
    }

    /// Chunks held.
    pub fn chunks(&self) -> usize {
        self.spans.len()
    }

    /// The chunk of `record` and its place in it.
    #[inline(always)]
    pub fn place(&self, record: u32) -> (usize, usize) {
        // Division by a constant as a multiply by its rounded-up inverse in 40-bit fixed point:
        // exact because records number below 2^24 (the index's row field) and `per_chunk` is
        // below 2^16, so the inverse's error, times the record, stays under 2^-16 < 1 / per_chunk;
        // and the product stays under 2^64.
        debug_assert!((record as usize) < 1 << 24);
        let c = ((self.magic * record as u64) >> 40) as u32;
        (c as usize, (record - c * self.per_chunk) as usize)
    }

    /// Where `record` starts (`words` words; dangling for records of no words).
    #[inline(always)]
    pub fn ptr(&self, record: u32) -> *mut u32 {
        if self.words == 0 {
            return std::ptr::NonNull::dangling().as_ptr();
        }
        let (c, r) = self.place(record);
        assert!(r < self.per_chunk as usize);
        // SAFETY: chunk `c` exists (the indexing checks it) and holds `per_chunk` records from
        // its base, so the offset stays inside its memory.
        unsafe { self.bases[c].add(r * self.words) }
    }

    /// Adds chunks until records `0..len` have room (their words as the last holder left them).
    pub fn grow_to(&mut self, len: usize) {
        if self.words == 0 {
            return;
        }
        while self.spans.len() * self.per_chunk() < len {
            let span = if self.pooled && !self.spans.is_empty() {
                Span::pooled(&pool::ROWS, false)
            } else {
                Span::own(4 * self.per_chunk() * self.words)
            };
            self.bases.push(span.as_ptr() as *mut u32);
            self.spans.push(span);
        }
    }

    /// Gives back the chunks wholly past records `0..len`, but one spare (a shrink then a few
    /// new records does not reallocate).
    pub fn shrink_to(&mut self, len: usize) {
        while self.spans.len() > len.div_ceil(self.per_chunk()) + 1 {
            self.spans.pop();
            self.bases.pop();
        }
    }
}

/// `2^40 / d + 1`, the rounded-up inverse of `d` in 40-bit fixed point (see `Chunked::place`).
fn inverse(d: u32) -> u64 {
    (1 << 40) / d as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_s_chunk_is_its_number_divided_by_the_records_a_chunk_holds() {
        for per_chunk in [1u32, 2, 3, 7, 455, 1000, 1024, 1638, 16_384] {
            let c = Chunked { per_chunk, magic: inverse(per_chunk), ..Chunked::new(1) };
            let top = ((1 << 24) - 1) / per_chunk * per_chunk;
            for record in (0..1u32 << 24).step_by(997).chain([top - 1, top, (1 << 24) - 2, (1 << 24) - 1]) {
                assert_eq!(
                    c.place(record),
                    ((record / per_chunk) as usize, (record % per_chunk) as usize),
                    "{record} / {per_chunk}"
                );
            }
        }
    }

    #[test]
    fn records_fill_blocks_by_their_own_size_and_chunks_go_back_but_one() {
        // 40-byte records (per-dimension Adagrad's state at dim 10): 1,638 to a block.
        let mut c = Chunked::new(10);
        assert_eq!((c.per_chunk(), c.pooled), (1638, true));
        c.grow_to(3 * 1638 + 1);
        assert_eq!(c.chunks(), 4);
        // Every record is its own words, inside its chunk.
        for r in 0..(3 * 1638 + 1) as u32 {
            // SAFETY: record `r` has room (grow_to) and is `words` words long.
            unsafe { std::slice::from_raw_parts_mut(c.ptr(r), 10).fill(r) };
        }
        for r in 0..(3 * 1638 + 1) as u32 {
            // SAFETY: as above.
            assert!(unsafe { std::slice::from_raw_parts(c.ptr(r), 10) }.iter().all(|&w| w == r));
        }
        c.shrink_to(10);
        assert_eq!(c.chunks(), 2, "one chunk used, one spare");
        // 9,000-word records fill a block poorly: a huge page's worth each chunk.
        let big = Chunked::new(9000);
        assert_eq!((big.per_chunk(), big.pooled), (HUGE / 36_000, false));
        // Records of no words take no memory.
        let mut none = Chunked::new(0);
        none.grow_to(1 << 20);
        assert_eq!(none.chunks(), 0);
    }
}
