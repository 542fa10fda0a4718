//! Blocks of 64 KiB cut from 2 MiB huge pages, shared by every stripe of every table, for the
//! sparse table's large arrays (index segments, row chunks).
//!
//! Why: a pull's cost is mostly address translation, not the cache misses themselves. An id's
//! index bucket and row are each a random access; in 4 KiB pages each also misses the TLB,
//! and under a virtual machine's nested paging that walk costs more than the miss (measured:
//! 34 ns a random line in 4 KiB pages, 20 ns in huge pages). A stripe's own arrays cannot be
//! huge pages: at 10M rows a stripe's index is 780 KiB and its last row chunk partly filled, and
//! rounding each of 64 stripes up to 2 MiB would cost more memory than the rows' targets allow
//! (about 13 bytes a row). So the stripes take their arrays in blocks from one pool whose pages
//! are huge: a stripe's index wastes at most the rest of its last block, its rows that and what a
//! block's size is not a multiple of (rows pool only where they fill 7/8 of a block), plus one
//! spare chunk kept after a shrink; and every block shares its page's translation. A stripe's
//! first row chunk and an index smaller than a block stay small mappings of their own ([`Span`]),
//! so a small table costs only what it touches.
//!
//! A block is taken from the fullest page with room, so blocks freed by a shrink are taken again
//! by later growth and pages empty out; a page goes back to the system as soon as none of its
//! blocks is taken. Index blocks and row blocks come from separate pools ([`INDEX`], [`ROWS`]):
//! an index is replaced whole at each rebuild, so its pages empty and go back, where rows would
//! keep them half full.
//!
//! Written by hand (over [`super::pages`]): allocators that use huge pages (jemalloc, mimalloc) do
//! so process-wide, not for chosen arrays, and give no fixed-size blocks.

use std::ptr::NonNull;

use parking_lot::Mutex;

use super::pages::{Pages, HUGE};

/// Bytes of a block.
pub const BLOCK: usize = 64 << 10;
/// Blocks of a huge page.
const PER_PAGE: usize = HUGE / BLOCK;
const FULL: u32 = u32::MAX >> (32 - PER_PAGE);

/// One huge page's blocks.
struct Page {
    pages: Pages,
    /// Blocks handed out, a bit each.
    taken: u32,
    /// Blocks never handed out (still as the kernel zeroed them).
    fresh: u32,
}

/// A pool of blocks.
pub struct Pool {
    pages: Mutex<Vec<Page>>,
}

/// The pool of index segments.
pub static INDEX: Pool = Pool::new();
/// The pool of row chunks.
pub static ROWS: Pool = Pool::new();

impl Pool {
    /// An empty pool.
    pub const fn new() -> Pool {
        Pool { pages: Mutex::new(Vec::new()) }
    }

    /// A block, all zero bytes when `zeroed` (else as its last holder left it).
    pub fn take(&'static self, zeroed: bool) -> Block {
        let mut pages = self.pages.lock();
        // The fullest page with room, so pages empty out as blocks come back.
        let best = pages.iter().enumerate().filter(|(_, p)| p.taken != FULL).max_by_key(|(_, p)| p.taken.count_ones());
        let at = match best {
            Some((at, _)) => at,
            None => {
                let page = Pages::zeroed(HUGE, true);
                page.advise_huge();
                pages.push(Page { pages: page, taken: 0, fresh: FULL });
                pages.len() - 1
            }
        };
        let page = &mut pages[at];
        let k = (!page.taken).trailing_zeros();
        let bit = 1 << k;
        page.taken |= bit;
        // SAFETY: block `k` lies inside the page's mapping, which lives until every block is back.
        let ptr = unsafe { NonNull::new_unchecked(page.pages.as_ptr().add(k as usize * BLOCK)) };
        if zeroed && page.fresh & bit == 0 {
            // SAFETY: the block is BLOCK writable bytes that nothing else holds.
            unsafe { ptr.as_ptr().write_bytes(0, BLOCK) };
        }
        page.fresh &= !bit;
        Block { ptr, pool: self }
    }

    /// Takes back the block at `ptr`; its page goes back to the system when no block is taken.
    fn give(&self, ptr: NonNull<u8>) {
        let mut pages = self.pages.lock();
        let addr = ptr.as_ptr() as usize;
        // Pages start on a huge-page boundary.
        let base = addr & !(HUGE - 1);
        let at = pages
            .iter()
            .position(|p| p.pages.as_ptr() as usize == base)
            .expect("a block comes back to the pool it came from");
        let page = &mut pages[at];
        page.taken &= !(1 << ((addr - base) / BLOCK));
        if page.taken == 0 {
            pages.swap_remove(at);
        }
    }

    /// Huge pages the pool holds.
    pub fn pages(&self) -> usize {
        self.pages.lock().len()
    }
}

impl Default for Pool {
    fn default() -> Self {
        Pool::new()
    }
}

/// A taken block, given back when dropped.
pub struct Block {
    ptr: NonNull<u8>,
    pool: &'static Pool,
}

// SAFETY: the block is owned memory like a `Box<[u8]>`; access goes through `&`/`&mut`.
unsafe impl Send for Block {}
// SAFETY: as above.
unsafe impl Sync for Block {}

impl Drop for Block {
    fn drop(&mut self) {
        self.pool.give(self.ptr);
    }
}

/// Memory of a table's array: a mapping of its own (4 KiB pages, zeroed as first touched, so a
/// small stripe costs only what it uses), or a pooled block.
pub struct Span {
    ptr: NonNull<u8>,
    len: usize,
    _owner: Owner,
}

/// What keeps a span's memory alive (and gives it back when dropped).
enum Owner {
    Own { _pages: Pages },
    Pooled { _block: Block },
}

// SAFETY: the span owns its memory (through `Owner`) like a `Box<[u8]>`; access goes through
// `&`/`&mut`.
unsafe impl Send for Span {}
// SAFETY: as above.
unsafe impl Sync for Span {}

impl Span {
    /// `len` zeroed bytes of their own mapping.
    pub fn own(len: usize) -> Span {
        let pages = Pages::zeroed(len, false);
        Span {
            ptr: NonNull::new(pages.as_ptr()).expect("a mapping is non-null"),
            len,
            _owner: Owner::Own { _pages: pages },
        }
    }

    /// A block of `pool` ([`BLOCK`] bytes), zeroed when `zeroed`.
    pub fn pooled(pool: &'static Pool, zeroed: bool) -> Span {
        let block = pool.take(zeroed);
        Span { ptr: block.ptr, len: BLOCK, _owner: Owner::Pooled { _block: block } }
    }

    /// The first byte.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes as `T`s (`T` plain data, its alignment at most 64).
    #[inline(always)]
    pub fn as_slice<T: bytemuck::Pod>(&self) -> &[T] {
        debug_assert!(std::mem::align_of::<T>() <= 64);
        // SAFETY: `len` readable bytes, aligned to at least 64, written only as plain data.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const T, self.len / std::mem::size_of::<T>()) }
    }

    /// The bytes as `T`s, writable.
    #[inline(always)]
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self) -> &mut [T] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr() as *mut T, self.len / std::mem::size_of::<T>()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_aligned_distinct_and_zeroed_when_asked_and_pages_go_back_when_empty() {
        static P: Pool = Pool::new();
        let mut blocks: Vec<Span> = (0..PER_PAGE + 1).map(|_| Span::pooled(&P, true)).collect();
        assert_eq!(P.pages(), 2, "32 blocks a page");
        let mut starts: Vec<usize> = blocks.iter().map(|b| b.as_slice::<u8>().as_ptr() as usize).collect();
        assert!(starts.iter().all(|s| s % BLOCK == 0));
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), PER_PAGE + 1);
        for b in &mut blocks {
            assert!(b.as_slice::<u64>().iter().all(|&v| v == 0));
            b.as_mut_slice::<u64>().fill(7);
        }
        // A block given back and taken again: zeroed only when asked.
        let at = blocks[3].as_slice::<u8>().as_ptr();
        blocks.swap_remove(3);
        let dirty = Span::pooled(&P, false);
        assert_eq!((dirty.as_slice::<u8>().as_ptr(), dirty.as_slice::<u64>()[0]), (at, 7));
        drop(dirty);
        let clean = Span::pooled(&P, true);
        assert_eq!((clean.as_slice::<u8>().as_ptr(), clean.as_slice::<u64>()[9]), (at, 0));
        blocks.push(clean);
        // The lone block of the second page goes back with its page.
        let page_of = |b: &Span| b.as_slice::<u8>().as_ptr() as usize & !(HUGE - 1);
        let lone =
            (0..blocks.len()).find(|&i| blocks.iter().filter(|b| page_of(b) == page_of(&blocks[i])).count() == 1);
        blocks.swap_remove(lone.expect("one page holds a single block"));
        assert_eq!(P.pages(), 1);
        blocks.clear();
        assert_eq!(P.pages(), 0);
    }

    #[test]
    fn an_own_span_is_zeroed_and_as_long_as_asked() {
        let mut s = Span::own(640);
        assert_eq!(s.as_slice::<u32>().len(), 160);
        s.as_mut_slice::<u32>()[159] = 3;
        assert_eq!(s.as_slice::<u32>()[..159].iter().sum::<u32>() + s.as_slice::<u32>()[159], 3);
    }
}
