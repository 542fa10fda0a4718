//! Admission: whether a new id gets a row. Paddle's entry attributes: `count_filter_entry:N`
//! (a row on the Nth sighting) and `probability_entry:P` (each sighting admits with
//! probability P, as the KDD'13 "Poisson inclusion"; Paddle's legacy table admitted with 1 - P,
//! which its own documentation contradicts). Until an id is admitted it reads as its initial
//! value and its gradients are dropped; only its sightings are counted.
//!
//! The counts live in a fixed array of 16-bit cells (a 12-bit signature of the id and a 4-bit
//! count, as Monolith's hash filter), 8 cells to a bucket, each with a byte of days since its id
//! was last seen: the memory is `3 * filter_capacity` bytes per table and server whatever the
//! traffic. A full bucket gives the cell with the lowest count (the oldest among equals) to the
//! newcomer (that id starts counting again: admitted later, never early), and two ids of one
//! bucket with the same signature share a count (1 in 4,095 per pair: admitted early). An
//! admitted id's cell is freed.
//!
//! Pending sightings age as rows do: a shrink adds its days to every cell, and forgets the ids
//! unseen for more than the table's `delete_after_unseen_days` (Paddle's legacy table kept an
//! id's count in a row that its shrink deleted by the same rule). So `count_filter_entry:2`
//! admits an id seen twice within that many days, not an id seen once a month; the
//! sliding filters of the KDD'13 paper and Monolith forget old sightings too, Monolith by
//! rotating filter splits as they fill, where here the window is one a user already set for rows.
//! A table's `filter_forget_after_days` sets a window of the pending ids' own (0: a day's shrink
//! forgets them all, so only ids seen twice within a day are admitted).
//!
//! Written here: a counting Bloom filter crate counts without a bound on memory per id and evicts
//! nothing, and Monolith's design is about 20 lines.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::base::layout::mix64;

/// Cells per bucket: one cache line of 16-bit cells is 32, 8 keeps a probe short.
const BUCKET: usize = 8;
/// Mixed into an id's hash before its signature is taken: bits no routing uses.
const SIGNATURE_SALT: u64 = 0x5bd1_e995_a2f4_c3d7;
/// The highest count a cell holds, and so the highest `count_filter_entry`.
pub const MAX_COUNT: u32 = 15;

/// How a table admits new ids.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Entry {
    /// Every id gets a row at once (and a training pull creates it).
    #[default]
    All,
    /// A row on the id's Nth sighting (show), N in 1..=15.
    Count(u32),
    /// A row with probability P per sighting, P in (0, 1].
    Probability(f32),
}

impl Entry {
    /// Whether every id gets a row at once.
    pub fn admits_all(&self) -> bool {
        matches!(self, Entry::All)
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Entry::All => write!(f, "none"),
            Entry::Count(n) => write!(f, "count_filter_entry:{n}"),
            Entry::Probability(p) => write!(f, "probability_entry:{p}"),
        }
    }
}

impl FromStr for Entry {
    type Err = String;

    fn from_str(s: &str) -> Result<Entry, String> {
        let usage =
            "an entry is \"none\", \"count_filter_entry:N\" (N in 1..=15) or \"probability_entry:P\" (P in (0, 1])";
        match s.trim().split_once(':') {
            None if s.trim() == "none" => Ok(Entry::All),
            Some(("count_filter_entry", n)) => match n.trim().parse::<u32>() {
                Ok(n) if (1..=MAX_COUNT).contains(&n) => Ok(Entry::Count(n)),
                _ => Err(format!("{s:?}: {usage}")),
            },
            Some(("probability_entry", p)) => match p.trim().parse::<f32>() {
                Ok(p) if p > 0.0 && p <= 1.0 => Ok(Entry::Probability(p)),
                _ => Err(format!("{s:?}: {usage}")),
            },
            _ => Err(format!("{s:?}: {usage}")),
        }
    }
}

impl Serialize for Entry {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Entry, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

/// Sighting counts of ids not yet admitted, in fixed memory.
pub struct CountFilter {
    cells: Vec<u16>,
    /// Days since each cell's id was last seen, saturating at 255.
    days: Vec<u8>,
}

/// What admission remembers between pushes in one stripe, as a checkpoint keeps it: the draws
/// made for `probability_entry`, and the count filter's cells with their days (none without a
/// count filter).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AdmissionState {
    /// Draws made for `probability_entry`.
    pub draws: u64,
    /// The count filter's cells.
    pub cells: Vec<u16>,
    /// Days since each cell's id was last seen (empty: all zero, as format 3 checkpoints).
    pub days: Vec<u8>,
}

/// Cells of a filter asked for `capacity` (whole buckets, at least one).
pub fn cells_for(capacity: usize) -> usize {
    capacity.div_ceil(BUCKET).max(1) * BUCKET
}

impl CountFilter {
    /// A filter of at least `capacity` cells (whole buckets).
    pub fn new(capacity: usize) -> CountFilter {
        let cells = cells_for(capacity);
        CountFilter { cells: vec![0; cells], days: vec![0; cells] }
    }

    /// The cells and their days, as a checkpoint keeps them.
    pub fn cells(&self) -> (&[u16], &[u8]) {
        (&self.cells, &self.days)
    }

    /// Takes back cells and days a checkpoint kept; there must be as many as this filter has
    /// (no days: a checkpoint written before they were kept, every id seen today).
    pub fn restore(&mut self, cells: &[u16], days: &[u8]) -> Result<(), String> {
        if cells.len() != self.cells.len() {
            return Err(format!("an admission filter of {} cells for one of {}", cells.len(), self.cells.len()));
        }
        if !days.is_empty() && days.len() != cells.len() {
            return Err(format!("{} days for {} admission filter cells", days.len(), cells.len()));
        }
        self.cells.copy_from_slice(cells);
        if days.is_empty() {
            self.days.fill(0);
        } else {
            self.days.copy_from_slice(days);
        }
        Ok(())
    }

    /// Bytes the filter holds: 2 a cell and 1 for its days.
    pub fn bytes(&self) -> usize {
        self.cells.len() * 3
    }

    /// `days` more days for every pending id; those now unseen for more than `forget_after`
    /// days are forgotten (their sightings count no more). Returns how many were forgotten.
    /// Days saturate at 255, so under a threshold of 255 days or more an id is forgotten at
    /// 255: earlier than its row would be deleted, which only delays its admission.
    pub fn age(&mut self, days: u32, forget_after: f32) -> u64 {
        let mut forgotten = 0;
        for (cell, d) in self.cells.iter_mut().zip(self.days.iter_mut()) {
            if *cell == 0 {
                continue;
            }
            *d = (*d as u32 + days).min(u8::MAX as u32) as u8;
            // The rule rows follow (`Accessor::shrink`): unseen for more than the threshold.
            if *d as f32 > forget_after || *d == u8::MAX {
                (*cell, *d) = (0, 0);
                forgotten += 1;
            }
        }
        forgotten
    }

    fn place(&self, hash: u64) -> (usize, u16) {
        let buckets = self.cells.len() / BUCKET;
        // The signature from a second mix of the hash: its own top bits choose the id's server
        // (`layout::server_of_id`), so on one of S servers they take only 4096/S values and ids
        // of a bucket would share a count S times as often. 0 marks an empty cell.
        let sig = ((mix64(hash ^ SIGNATURE_SALT) >> 52) as u16 & 0x0fff).max(1);
        (((hash >> 6) % buckets as u64) as usize * BUCKET, sig)
    }

    /// Counts `sightings` more of the id whose `mix64` is `hash` and says whether it has now
    /// been seen `n` times; an admitted id leaves the filter.
    pub fn sight(&mut self, hash: u64, sightings: u32, n: u32) -> bool {
        let (start, sig) = self.place(hash);
        let bucket = &mut self.cells[start..start + BUCKET];
        let days = &mut self.days[start..start + BUCKET];
        let at = match bucket.iter().position(|c| c >> 4 == sig) {
            Some(at) => at,
            None => {
                // A free cell, or else the one with the lowest count, the oldest among those.
                let rank = |k: usize| match bucket[k] {
                    0 => (0, 0),
                    c => (1 + (c & 15), u8::MAX - days[k]),
                };
                let at = (0..BUCKET).min_by_key(|&k| rank(k)).unwrap_or(0);
                bucket[at] = sig << 4;
                at
            }
        };
        days[at] = 0;
        let count = ((bucket[at] & 15) as u32 + sightings).min(MAX_COUNT);
        if count >= n {
            bucket[at] = 0;
            true
        } else {
            bucket[at] = sig << 4 | count as u16;
            false
        }
    }
}

/// Whether one push of `sightings` occurrences admits the id under `probability`, drawn from
/// `(id, draw)`: reproducible for a given order of pushes.
pub fn draw(probability: f32, id: u64, draw: u64, sightings: u32) -> bool {
    let u = (mix64(id ^ mix64(draw)) >> 40) as f64 / (1u64 << 24) as f64;
    // Admitted unless every sighting failed: 1 - (1 - p)^k.
    u < 1.0 - (1.0 - probability as f64).powi(sightings.max(1) as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_parse_as_paddle_names_them_and_refuse_the_rest() {
        assert_eq!("count_filter_entry:2".parse(), Ok(Entry::Count(2)));
        assert_eq!("probability_entry:0.1".parse(), Ok(Entry::Probability(0.1)));
        assert_eq!("none".parse(), Ok(Entry::All));
        for bad in
            ["count_filter_entry:0", "count_filter_entry:16", "probability_entry:0", "probability_entry:1.5", "x"]
        {
            assert!(bad.parse::<Entry>().unwrap_err().contains("an entry is"), "{bad}");
        }
        assert_eq!(Entry::Count(3).to_string().parse(), Ok(Entry::Count(3)));
    }

    #[test]
    fn an_id_is_admitted_on_its_nth_sighting_and_then_leaves_the_filter() {
        let mut f = CountFilter::new(64);
        let h = mix64(42);
        assert!(!f.sight(h, 1, 3));
        assert!(!f.sight(h, 1, 3));
        assert!(f.sight(h, 1, 3), "third sighting");
        assert!(f.cells.iter().all(|&c| c == 0), "the admitted id's cell is free");
        // Several sightings in one push count at once.
        assert!(f.sight(mix64(7), 2, 2));
        assert!(!f.sight(mix64(8), 1, 2));
    }

    #[test]
    fn counts_saturate_and_a_full_bucket_gives_way_to_newcomers() {
        let mut f = CountFilter::new(8);
        assert_eq!(f.bytes(), 24);
        // Nine ids of distinct signatures into one bucket of eight: the ninth takes the
        // lowest-count cell.
        let mut sigs = std::collections::HashSet::new();
        let ids: Vec<u64> = (0..1000u64).filter(|&i| sigs.insert(f.place(mix64(i)).1)).take(9).collect();
        for (k, &id) in ids.iter().enumerate() {
            assert!(!f.sight(mix64(id), 1 + (k as u32 % 2), 15));
        }
        assert_eq!(f.cells.iter().filter(|&&c| c != 0).count(), 8);
        assert!(f.sight(mix64(ids[1]), 100, 15), "saturating at 15 admits");
    }

    #[test]
    fn memory_is_fixed_by_the_capacity() {
        let mut f = CountFilter::new(1000);
        let bytes = f.bytes();
        for id in 0..100_000u64 {
            f.sight(mix64(id), 1, 2);
        }
        assert_eq!(f.bytes(), bytes);
        assert_eq!(bytes, 3 * 1000);
    }

    #[test]
    fn a_pending_sighting_is_forgotten_after_the_unseen_days_rows_are_deleted_after() {
        let mut f = CountFilter::new(64);
        let (old, fresh) = (mix64(1), mix64(2));
        assert!(!f.sight(old, 1, 2));
        // Three days pass with threshold 3: "unseen for more than 3 days" is not yet true.
        assert_eq!(f.age(1, 3.0) + f.age(2, 3.0), 0);
        assert!(!f.sight(fresh, 1, 2));
        // A fourth day forgets `old` (4 > 3) but not `fresh` (1 day).
        assert_eq!(f.age(1, 3.0), 1);
        assert!(!f.sight(old, 1, 2), "its first sighting was forgotten: this is a first one again");
        assert!(f.sight(fresh, 1, 2), "seen again within the window: admitted");
        // Seeing an id resets its days: sightings 3 days apart add up, while `old`, not seen
        // again, is forgotten on the way.
        for _ in 0..5 {
            f.age(3, 3.0);
            assert!(!f.sight(mix64(3), 1, 15));
        }
        let (cells, days) = f.cells();
        let k = cells.iter().position(|&c| c & 15 == 5).expect("five sightings counted");
        assert_eq!(days[k], 0);
        // Days saturate at 255: a threshold of 255 or more forgets at 255 days, not never.
        assert_eq!(f.age(254, 300.0), 0);
        assert_eq!(f.age(1, 300.0), 1, "the one pending id is now 255 days unseen");
    }

    #[test]
    fn a_full_bucket_gives_the_oldest_of_its_lowest_counts_to_a_newcomer() {
        let mut f = CountFilter::new(8);
        let mut sigs = std::collections::HashSet::new();
        let ids: Vec<u64> = (0..1000u64).filter(|&i| sigs.insert(f.place(mix64(i)).1)).take(10).collect();
        let cell_of = |f: &CountFilter, id: u64| f.cells().0.iter().position(|&c| c >> 4 == f.place(mix64(id)).1);
        // Eight ids a day apart fill cells 0..7, ids[0] the oldest.
        for &id in &ids[..8] {
            assert!(!f.sight(mix64(id), 1, 15));
            f.age(1, 100.0);
        }
        // ids[0] is admitted (cell 0 freed) and a fresh ids[8] takes cell 0: now the first cell
        // is the newest, and the oldest count of 1 is ids[1]'s, in cell 1.
        assert!(f.sight(mix64(ids[0]), 15, 15));
        assert!(!f.sight(mix64(ids[8]), 1, 15));
        assert_eq!(cell_of(&f, ids[8]), Some(0));
        assert!(!f.sight(mix64(ids[9]), 1, 15));
        assert_eq!(cell_of(&f, ids[9]), Some(1), "the oldest lowest count gave way, not the first");
        assert_eq!(cell_of(&f, ids[1]), None);
        assert_eq!(cell_of(&f, ids[8]), Some(0));
    }

    #[test]
    fn restored_cells_keep_their_days_and_cells_without_days_start_at_zero() {
        let mut f = CountFilter::new(16);
        f.sight(mix64(5), 1, 3);
        f.age(2, 30.0);
        let (cells, days) = f.cells();
        let (cells, days) = (cells.to_vec(), days.to_vec());
        let mut g = CountFilter::new(16);
        g.restore(&cells, &days).unwrap();
        assert_eq!(g.cells(), (&cells[..], &days[..]));
        g.restore(&cells, &[]).unwrap();
        assert!(g.cells().1.iter().all(|&d| d == 0));
        assert!(g.restore(&cells, &days[..3]).unwrap_err().contains("3 days for 16"));
        assert!(g.restore(&cells[..8], &[]).unwrap_err().contains("8 cells for one of 16"));
    }

    #[test]
    fn probability_admits_at_the_rate_asked() {
        let admitted = (0..100_000u64).filter(|&id| draw(0.1, id, id, 1)).count();
        assert!((9_000..11_000).contains(&admitted), "{admitted}");
        // Two sightings at once: 1 - 0.9^2 = 0.19.
        let twice = (0..100_000u64).filter(|&id| draw(0.1, id, id, 2)).count();
        assert!((18_000..20_000).contains(&twice), "{twice}");
        assert!((0..1000u64).all(|id| draw(1.0, id, 0, 1)));
    }

    /// Ids that share a bucket share a count only when their 12-bit signatures meet (about 1 in
    /// 4,096 a pair), however many servers the job has: the signature takes no bit that picks
    /// the server. With the top bits of the id's hash, which also choose its server, 20,000 ids
    /// of server 0 each seen once were admitted at `count_filter_entry:2` 27 times with 1
    /// server and 7,414 times with 256.
    #[test]
    fn false_admissions_do_not_grow_with_the_number_of_servers() {
        let mut wrongly = Vec::new();
        for servers in [1usize, 8, 64, 256] {
            let mut filter = CountFilter::new(20_000);
            let ids = (0u64..).filter(|&id| crate::base::layout::server_of_id(id, servers) == 0).take(20_000);
            wrongly.push(ids.filter(|&id| filter.sight(mix64(id), 1, 2)).count());
        }
        // Cells hold a few ids a bucket on average: about 20 expected at any server count.
        eprintln!("wrongly admitted at 1, 8, 64, 256 servers: {wrongly:?}");
        assert!(wrongly.iter().all(|&n| n <= 60), "wrongly admitted at 1, 8, 64, 256 servers: {wrongly:?}");
    }
}
