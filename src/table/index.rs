//! The id -> row index of one sparse-table stripe: an open-addressing hash table with linear
//! probing, written here because a lookup must cost one cache miss and be prefetchable.
//!
//! hashbrown keeps control bytes and buckets apart (two misses per cold lookup) and does not
//! expose where a key will land; here a slot is `(id, row)` in 16 bytes, its position is a pure
//! function of the id, and [`IdIndex::prefetch`] starts loading it while earlier keys are being
//! served, so the misses of a batch overlap instead of queueing.

use crate::layout::mix64;

const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
#[repr(C, align(16))]
struct Slot {
    id: u64,
    row: u32,
}

const VACANT: Slot = Slot { id: 0, row: EMPTY };

/// Map from feature id to row number (rows are numbered from 0 and never removed).
pub struct IdIndex {
    slots: Vec<Slot>,
    len: usize,
}

impl Default for IdIndex {
    fn default() -> Self {
        IdIndex { slots: vec![VACANT; 16], len: 0 }
    }
}

impl IdIndex {
    /// The first slot to probe for an id whose `mix64` is `hash`.
    #[inline]
    fn home(&self, hash: u64) -> usize {
        // Bits above the 6 that pick the stripe, so ids of one stripe spread over all slots.
        (hash >> 6) as usize & (self.slots.len() - 1)
    }

    /// Number of ids held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no id is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The row of `id`, if present.
    #[inline]
    pub fn get(&self, id: u64) -> Option<u32> {
        self.get_hashed(id, mix64(id))
    }

    /// [`IdIndex::get`] with `hash = mix64(id)` already computed.
    #[inline]
    pub fn get_hashed(&self, id: u64, hash: u64) -> Option<u32> {
        let mask = self.slots.len() - 1;
        let mut i = self.home(hash);
        loop {
            let s = self.slots[i];
            if s.row == EMPTY {
                return None;
            }
            if s.id == id {
                return Some(s.row);
            }
            i = (i + 1) & mask;
        }
    }

    /// Records `id -> row`; `id` must be absent.
    pub fn insert(&mut self, id: u64, row: u32) {
        debug_assert_ne!(row, EMPTY);
        // Keep the load factor at most 7/10 so probe runs stay short.
        if (self.len + 1) * 10 > self.slots.len() * 7 {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(mix64(id));
        while self.slots[i].row != EMPTY {
            i = (i + 1) & mask;
        }
        self.slots[i] = Slot { id, row };
        self.len += 1;
    }

    fn grow(&mut self) {
        let doubled = vec![VACANT; self.slots.len() * 2];
        let old = std::mem::replace(&mut self.slots, doubled);
        let mask = self.slots.len() - 1;
        for s in old.into_iter().filter(|s| s.row != EMPTY) {
            let mut i = self.home(mix64(s.id));
            while self.slots[i].row != EMPTY {
                i = (i + 1) & mask;
            }
            self.slots[i] = s;
        }
    }

    /// Hints the CPU to start loading the slot of the id whose `mix64` is `hash`.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let ptr = &self.slots[self.home(hash)] as *const Slot as *const i8;
            // SAFETY: prefetching is only a hint; the pointer is inside `slots`.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr) };
        }
    }

    /// Every (id, row) pair, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.slots.iter().filter(|s| s.row != EMPTY).map(|s| (s.id, s.row))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_every_id_through_growth() {
        let mut index = IdIndex::default();
        let ids: Vec<u64> = (0..100_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
        for (r, &id) in ids.iter().enumerate() {
            assert_eq!(index.get(id), None);
            index.insert(id, r as u32);
        }
        assert_eq!(index.len(), ids.len());
        for (r, &id) in ids.iter().enumerate() {
            assert_eq!(index.get(id), Some(r as u32));
        }
        assert_eq!(index.get(12345), None);
        let mut rows: Vec<u32> = index.iter().map(|(_, r)| r).collect();
        rows.sort();
        assert_eq!(rows, (0..100_000).collect::<Vec<u32>>());
    }

    #[test]
    fn id_zero_and_max_are_ordinary_ids() {
        let mut index = IdIndex::default();
        index.insert(0, 7);
        index.insert(u64::MAX, 8);
        assert_eq!(index.get(0), Some(7));
        assert_eq!(index.get(u64::MAX), Some(8));
    }
}
