//! Anonymous memory mappings for the sparse table's large arrays (a small stripe's index and
//! first row chunk, and the huge pages of [`super::pool`]).
//!
//! Written here (over `libc`) for three things the global allocator does not give: pages that
//! the kernel zeroes on first touch, so a small stripe's first chunk costs memory only as rows
//! reach it (Rust's `alloc_zeroed` writes every byte of an over-aligned block, and an empty
//! index is all zeros); memory that goes back to the system when unmapped (a pooled block's
//! page only once all its blocks are back); and 2 MiB huge pages
//! (`MADV_HUGEPAGE` on a mapping aligned to them), because a pull of a cold id costs a page walk
//! as well as a cache miss, and under a virtual machine's nested paging the walk is the larger
//! part.

use std::ptr::NonNull;

/// Bytes of a huge page.
pub const HUGE: usize = 2 << 20;

/// A zeroed anonymous mapping of `len` bytes (at least one page).
pub struct Pages {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned memory like a `Box<[u8]>`; access goes through `&`/`&mut`.
unsafe impl Send for Pages {}
// SAFETY: as above.
unsafe impl Sync for Pages {}

impl Pages {
    /// Maps `len` zeroed bytes, starting on a huge-page boundary when `huge_aligned`. Running
    /// out of address space aborts, as a failed allocation does.
    pub fn zeroed(len: usize, huge_aligned: bool) -> Pages {
        let len = len.max(1);
        let extra = if huge_aligned { HUGE } else { 0 };
        // SAFETY: an anonymous private mapping with no address hint has no preconditions.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len + extra,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(std::alloc::Layout::from_size_align(len, 4096).expect("a valid layout"));
        }
        let start = raw as usize;
        let aligned = if huge_aligned { start.next_multiple_of(HUGE) } else { start };
        if huge_aligned {
            // Give back the unaligned head and the tail beyond `len`.
            let (head, end) = (aligned - start, (aligned + len).next_multiple_of(4096));
            // SAFETY: both ranges lie inside the mapping just made and are page-aligned.
            unsafe {
                if head > 0 {
                    libc::munmap(raw, head);
                }
                if start + len + extra > end {
                    libc::munmap(end as *mut libc::c_void, start + len + extra - end);
                }
            }
        }
        Pages { ptr: NonNull::new(aligned as *mut u8).expect("mmap returns non-null"), len }
    }

    /// The mapping as `T`s (`T` must be plain data no stricter aligned than a page).
    pub fn as_slice<T: bytemuck::Pod>(&self) -> &[T] {
        // SAFETY: the mapping is `len` readable bytes, page-aligned, and zero or written as `T`s.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr() as *const T, self.len / std::mem::size_of::<T>()) }
    }

    /// The mapping as `T`s, writable.
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self) -> &mut [T] {
        // SAFETY: as above, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr() as *mut T, self.len / std::mem::size_of::<T>()) }
    }

    /// The mapping's first byte.
    #[inline(always)]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Asks the kernel to back the mapping with huge pages as it is first touched (a hint:
    /// without huge pages to spare, or with them switched off, it keeps small ones).
    pub fn advise_huge(&self) {
        // SAFETY: advice on memory this mapping owns; a failure leaves the memory unchanged.
        unsafe { libc::madvise(self.ptr.as_ptr() as *mut libc::c_void, self.len, libc::MADV_HUGEPAGE) };
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the range was mapped by `zeroed` and is unmapped once, here.
        unsafe { libc::munmap(self.ptr.as_ptr() as *mut libc::c_void, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_start_zeroed_aligned_and_hold_what_is_written() {
        let mut p = Pages::zeroed(HUGE, true);
        assert_eq!(p.as_slice::<u32>().as_ptr() as usize % HUGE, 0);
        assert!(p.as_slice::<u64>().iter().all(|&v| v == 0));
        p.as_mut_slice::<u32>()[12345] = 7;
        p.advise_huge();
        assert_eq!(p.as_slice::<u32>()[12345], 7, "advice keeps the contents");
        let small = Pages::zeroed(100, false);
        assert_eq!(small.as_slice::<u32>().len(), 25);
    }
}
