//! The id -> weights store of one sparse-table stripe: an open-addressing hash table (linear
//! probing) whose slots hold each id's weights inline, written here because a pull must cost one
//! cache miss per id and be prefetchable.
//!
//! A slot is `[id: u64][row: u32][pad: u32][weights: f32 x dim]`, padded to whole 64-byte cache
//! lines, so for embeddings of up to 12 floats the probe that finds an id has already brought its
//! weights into the cache. (hashbrown keeps control bytes and buckets apart, and an index pointing
//! into a separate row slab adds a second miss: two or three misses per cold id, and none of them
//! prefetchable.) The slot's position is a pure function of the id, so a batch prefetches the
//! slots of the ids a few positions ahead and their misses overlap. `row` numbers the id's
//! optimizer state, kept apart in the stripe's slab because only pushes need it.

const EMPTY: u32 = u32::MAX;

#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

const BLANK: Line = Line([0, EMPTY as u64, 0, 0, 0, 0, 0, 0]);

/// Slots of ids with their inline weights.
pub struct Records {
    lines: Vec<Line>,
    /// Cache lines per slot.
    stride: usize,
    /// Number of slots (a power of two).
    slots: usize,
    len: usize,
    dim: usize,
}

impl Records {
    /// An empty store for weights of `dim` floats.
    pub fn new(dim: usize) -> Records {
        let stride = (16 + 4 * dim).div_ceil(64);
        Records { lines: vec![BLANK; 16 * stride], stride, slots: 16, len: 0, dim }
    }

    /// Number of ids held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if no id is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn home(&self, hash: u64) -> usize {
        // Bits above the 6 that pick the stripe, so ids of one stripe spread over all slots.
        (hash >> 6) as usize & (self.slots - 1)
    }

    #[inline]
    fn head(&self, slot: usize) -> &[u64; 8] {
        &self.lines[slot * self.stride].0
    }

    /// The id stored in `slot`.
    #[inline]
    pub fn id(&self, slot: usize) -> u64 {
        self.head(slot)[0]
    }

    /// The state row number of the id in `slot`.
    #[inline]
    pub fn row(&self, slot: usize) -> u32 {
        self.head(slot)[1] as u32
    }

    /// The slot holding `id` (whose `mix64` is `hash`), or `Err` with the empty slot where it
    /// would go.
    #[inline]
    pub fn find(&self, id: u64, hash: u64) -> Result<usize, usize> {
        let mut s = self.home(hash);
        loop {
            let head = self.head(s);
            if head[1] as u32 == EMPTY {
                return Err(s);
            }
            if head[0] == id {
                return Ok(s);
            }
            s = (s + 1) & (self.slots - 1);
        }
    }

    /// Makes room for `additional` more ids without moving slots while they are added (slot
    /// numbers returned by `find` stay valid until the next `reserve`).
    pub fn reserve(&mut self, additional: usize) {
        // Load factor at most 7/10 keeps probe runs short.
        let mut slots = self.slots;
        while (self.len + additional) * 10 > slots * 7 {
            slots *= 2;
        }
        if slots == self.slots {
            return;
        }
        let old = std::mem::replace(&mut self.lines, vec![BLANK; slots * self.stride]);
        let (old_slots, stride) = (self.slots, self.stride);
        self.slots = slots;
        for s in 0..old_slots {
            let rec = &old[s * stride..(s + 1) * stride];
            if rec[0].0[1] as u32 == EMPTY {
                continue;
            }
            let hash = crate::layout::mix64(rec[0].0[0]);
            let Err(at) = self.find(rec[0].0[0], hash) else { unreachable!("ids are unique") };
            self.lines[at * stride..(at + 1) * stride].copy_from_slice(rec);
        }
    }

    /// Stores `id` with state row `row` in the empty slot `at` (from `find`, after `reserve`);
    /// its weights start as zeros.
    pub fn put(&mut self, at: usize, id: u64, row: u32) {
        debug_assert!(row != EMPTY && self.row(at) == EMPTY);
        let start = at * self.stride;
        self.lines[start..start + self.stride].fill(Line([0; 8]));
        self.lines[start].0[0] = id;
        self.lines[start].0[1] = row as u64;
        self.len += 1;
    }

    /// The weights in `slot`.
    #[inline]
    pub fn weights(&self, slot: usize) -> &[f32] {
        let bytes: &[u8] = bytemuck::cast_slice(&self.lines[slot * self.stride..(slot + 1) * self.stride]);
        &bytemuck::cast_slice::<u8, f32>(bytes)[4..4 + self.dim]
    }

    /// The weights in `slot`, writable.
    #[inline]
    pub fn weights_mut(&mut self, slot: usize) -> &mut [f32] {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.lines[slot * self.stride..(slot + 1) * self.stride]);
        &mut bytemuck::cast_slice_mut::<u8, f32>(bytes)[4..4 + self.dim]
    }

    /// Hints the CPU to start loading the slot where the id whose `mix64` is `hash` would be.
    #[inline]
    pub fn prefetch(&self, hash: u64) {
        #[cfg(target_arch = "x86_64")]
        {
            let ptr = &self.lines[self.home(hash) * self.stride] as *const Line as *const i8;
            // SAFETY: prefetching is only a hint; the pointer is inside `lines`.
            unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(ptr) };
        }
    }

    /// Every occupied slot.
    pub fn occupied(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.slots).filter(|&s| self.row(s) != EMPTY)
    }

    /// Every occupied slot, from the home slot of `hash` on, around the table once.
    pub fn occupied_from(&self, hash: u64) -> impl Iterator<Item = usize> + '_ {
        let home = self.home(hash);
        (0..self.slots).map(move |k| (home + k) & (self.slots - 1)).filter(|&s| self.row(s) != EMPTY)
    }

    /// Removes the id in `slot` and returns its state row. Later ids of its probe run move
    /// back into the hole (backward-shift deletion: no tombstones, so probes stay as short as
    /// before), so other slot numbers change.
    pub fn remove(&mut self, slot: usize) -> u32 {
        let row = self.row(slot);
        debug_assert!(row != EMPTY);
        let (mask, stride) = (self.slots - 1, self.stride);
        let mut hole = slot;
        let mut s = (slot + 1) & mask;
        while self.row(s) != EMPTY {
            let home = self.home(crate::layout::mix64(self.id(s)));
            if may_fill(home, hole, s, self.slots) {
                self.lines.copy_within(s * stride..(s + 1) * stride, hole * stride);
                hole = s;
            }
            s = (s + 1) & mask;
        }
        self.lines[hole * stride..(hole + 1) * stride].fill(BLANK);
        self.len -= 1;
        row
    }
}

/// Whether the id in `slot`, whose home is `home`, may move back to `hole` in a table of
/// `slots` slots: linear probing keeps every id in the run from its home to its slot, so it may
/// move to a hole inside that run.
fn may_fill(home: usize, hole: usize, slot: usize, slots: usize) -> bool {
    let mask = slots - 1;
    (slot.wrapping_sub(home) & mask) >= (slot.wrapping_sub(hole) & mask)
}

// SAFETY: `Line` is 8 plain u64s with no padding; any bit pattern is valid.
unsafe impl bytemuck::Zeroable for Line {}
// SAFETY: as above; `repr(C, align(64))` adds no padding because the size is exactly 64.
unsafe impl bytemuck::Pod for Line {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::mix64;

    fn add(r: &mut Records, id: u64, row: u32) -> usize {
        r.reserve(1);
        let at = r.find(id, mix64(id)).unwrap_err();
        r.put(at, id, row);
        at
    }

    #[test]
    fn holds_every_id_and_its_weights_through_growth() {
        for dim in [1, 10, 12, 13, 40] {
            let mut r = Records::new(dim);
            let ids: Vec<u64> = (0..20_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).collect();
            for (k, &id) in ids.iter().enumerate() {
                assert!(r.find(id, mix64(id)).is_err());
                let at = add(&mut r, id, k as u32);
                r.weights_mut(at).fill(k as f32);
            }
            assert_eq!(r.len(), ids.len());
            for (k, &id) in ids.iter().enumerate() {
                let at = r.find(id, mix64(id)).unwrap();
                assert_eq!((r.id(at), r.row(at)), (id, k as u32));
                assert!(r.weights(at).iter().all(|&w| w == k as f32), "dim {dim}");
            }
            assert_eq!(r.occupied().count(), ids.len());
        }
    }

    #[test]
    fn removed_ids_leave_every_other_id_findable() {
        for dim in [1, 10, 40] {
            let mut r = Records::new(dim);
            let ids: Vec<u64> = (0..5_000u64).map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 5).collect();
            for (k, &id) in ids.iter().enumerate() {
                let at = add(&mut r, id, k as u32);
                r.weights_mut(at).fill(k as f32);
            }
            // Remove every third id; the rest keep their rows and weights wherever they moved.
            for (k, &id) in ids.iter().enumerate().filter(|(k, _)| k % 3 == 0) {
                let at = r.find(id, mix64(id)).unwrap();
                assert_eq!(r.remove(at), k as u32);
                assert!(r.find(id, mix64(id)).is_err());
            }
            assert_eq!(r.len(), ids.len() - ids.len().div_ceil(3));
            for (k, &id) in ids.iter().enumerate().filter(|(k, _)| k % 3 != 0) {
                let at = r.find(id, mix64(id)).unwrap();
                assert_eq!(r.row(at), k as u32);
                assert!(r.weights(at).iter().all(|&w| w == k as f32));
            }
            assert_eq!(r.occupied().count(), r.len());
            let from: Vec<usize> = r.occupied_from(mix64(ids[1])).collect();
            assert_eq!(from.len(), r.len());
        }
    }

    #[test]
    fn id_zero_and_max_are_ordinary_ids() {
        let mut r = Records::new(4);
        add(&mut r, 0, 7);
        add(&mut r, u64::MAX, 8);
        assert_eq!(r.row(r.find(0, mix64(0)).unwrap()), 7);
        assert_eq!(r.row(r.find(u64::MAX, mix64(u64::MAX)).unwrap()), 8);
    }
}
