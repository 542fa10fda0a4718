//! Admission: whether a new id gets a row. Paddle's entry attributes: `count_filter_entry:N`
//! (a row on the Nth sighting) and `probability_entry:P` (each sighting admits with
//! probability P, as the KDD'13 "Poisson inclusion"; Paddle's legacy table admitted with 1 - P,
//! which its own documentation contradicts). Until an id is admitted it reads as its initial
//! value and its gradients are dropped; only its sightings are counted.
//!
//! The counts live in a fixed array of 16-bit cells (a 12-bit signature of the id and a 4-bit
//! count, as Monolith's hash filter), 8 cells to a bucket: its memory is `2 * filter_capacity`
//! bytes per table and server whatever the traffic. A full bucket gives the cell with the
//! lowest count to the newcomer (that id starts counting again: admitted later, never early),
//! and two ids of one bucket with the same signature share a count (1 in 4,095 per pair:
//! admitted early). An admitted id's cell is freed.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::layout::mix64;

/// Cells per bucket: one cache line of 16-bit cells is 32, 8 keeps a probe short.
const BUCKET: usize = 8;
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
}

/// Cells of a filter asked for `capacity` (whole buckets, at least one).
pub fn cells_for(capacity: usize) -> usize {
    capacity.div_ceil(BUCKET).max(1) * BUCKET
}

impl CountFilter {
    /// A filter of at least `capacity` cells (whole buckets).
    pub fn new(capacity: usize) -> CountFilter {
        CountFilter { cells: vec![0; cells_for(capacity)] }
    }

    /// The cells, as a checkpoint keeps them.
    pub fn cells(&self) -> &[u16] {
        &self.cells
    }

    /// Takes back cells a checkpoint kept; there must be as many as this filter has.
    pub fn restore(&mut self, cells: &[u16]) -> Result<(), String> {
        if cells.len() != self.cells.len() {
            return Err(format!("an admission filter of {} cells for one of {}", cells.len(), self.cells.len()));
        }
        self.cells.copy_from_slice(cells);
        Ok(())
    }

    /// Bytes the filter holds.
    pub fn bytes(&self) -> usize {
        self.cells.len() * 2
    }

    fn place(&self, hash: u64) -> (usize, u16) {
        let buckets = self.cells.len() / BUCKET;
        // The signature from bits the bucket choice does not use; 0 marks an empty cell.
        let sig = ((hash >> 52) as u16 & 0x0fff).max(1);
        (((hash >> 6) % buckets as u64) as usize * BUCKET, sig)
    }

    /// Counts `sightings` more of the id whose `mix64` is `hash` and says whether it has now
    /// been seen `n` times; an admitted id leaves the filter.
    pub fn sight(&mut self, hash: u64, sightings: u32, n: u32) -> bool {
        let (start, sig) = self.place(hash);
        let bucket = &mut self.cells[start..start + BUCKET];
        let at = match bucket.iter().position(|c| c >> 4 == sig) {
            Some(at) => at,
            None => {
                // A free cell, or else the one with the lowest count.
                let at =
                    (0..BUCKET).min_by_key(|&k| if bucket[k] == 0 { 0 } else { 1 + (bucket[k] & 15) }).unwrap_or(0);
                bucket[at] = sig << 4;
                at
            }
        };
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
        assert_eq!(f.bytes(), 16);
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
        assert_eq!(bytes, 2 * 1000);
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
}
