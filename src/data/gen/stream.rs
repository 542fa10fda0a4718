//! `oar gen stream`: the logs of an online training job, a folder per day (`DIR/YYYYMMDD/part-*`)
//! of Criteo-format lines from a planted model that drifts (`gen::Drift`): the most frequent
//! values keep their ids, the rest sink a little each day so new ids keep arriving and old ones
//! go quiet, and every value's weight turns slowly. `meta.json` has each day's lines, click rate
//! and the planted model's own AUC on that day (the oracle).
//! The day folders' names and the ranges online training reads are [`calendar`](crate::data::read::calendar)'s.

use std::path::PathBuf;

use anyhow::Context;
use chrono::{Datelike, NaiveDate};

use crate::data::gen::{planted_line, write_part, Drift};
use crate::data::read::calendar::folder_name;
use crate::observe::metrics;

/// Streams of a day's lines: far from the fixed data set's (1 and 2).
const DAY_STREAM: u64 = 1 << 20;

/// What to generate.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// Days.
    pub days: u32,
    /// Lines per day.
    pub lines_per_day: u64,
    /// Part files per day.
    pub parts: usize,
    /// Seed of the planted model and the lines.
    pub seed: u64,
    /// The first day's date.
    pub start: NaiveDate,
    /// Output folder.
    pub out: PathBuf,
}

/// One generated day.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct DayMeta {
    /// `YYYYMMDD`, the folder's name.
    pub date: String,
    /// Lines written.
    pub lines: u64,
    /// Share of positive labels.
    pub ctr: f64,
    /// The planted model's AUC on the day's lines.
    pub oracle_auc: Option<f64>,
}

/// `meta.json` of a stream.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct StreamMeta {
    /// Seed used.
    pub seed: u64,
    /// Part files per day.
    pub parts: usize,
    /// The days, in order.
    pub days: Vec<DayMeta>,
}

/// Most days one stream holds (100 years): dates past the calendar type's range (the year
/// 262,143) would panic.
pub const MAX_DAYS: u32 = 36_525;

/// Writes the stream described by `config`, a day at a time (each day's parts in parallel).
pub fn generate(config: &StreamConfig, on_day: &dyn Fn(&DayMeta)) -> anyhow::Result<StreamMeta> {
    crate::data::read::files::check_parts(config.parts).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(config.days > 0, "--days must be at least 1");
    anyhow::ensure!(config.days <= MAX_DAYS, "--days is {}, more than {MAX_DAYS} (100 years)", config.days);
    crate::data::read::files::check_fill(config.parts, config.lines_per_day, "line(s) a day")
        .map_err(anyhow::Error::msg)?;
    // Folder names are YYYYMMDD: past 9999 they take more digits, which `--days` cannot name.
    let last = config.start + chrono::Days::new(config.days as u64 - 1);
    anyhow::ensure!(
        last.year() <= 9999,
        "--start {} with {} days runs past the year 9999 (day folders are YYYYMMDD)",
        folder_name(config.start),
        config.days
    );
    let mut days = Vec::new();
    for day in 0..config.days {
        let date = config.start + chrono::Days::new(day as u64);
        let dir = config.out.join(folder_name(date));
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        crate::data::read::files::check_no_stale_parts(&dir, "part-", config.parts).map_err(anyhow::Error::msg)?;
        let stream = DAY_STREAM + day as u64;
        // Balanced: ceil-divided ranges left the last parts short or empty (5 lines in 4 parts:
        // 2, 2, 1, 0), and an online trainer with an empty part read no sample.
        let mut start = 0;
        let parts: Vec<(std::ops::Range<u64>, PathBuf)> =
            crate::data::read::files::part_sizes(config.lines_per_day, config.parts)
                .enumerate()
                .map(|(i, n)| {
                    start += n;
                    (start - n..start, dir.join(format!("part-{i:05}")))
                })
                .collect();
        let written: Vec<_> = std::thread::scope(|scope| {
            let handles: Vec<_> = parts
                .iter()
                .map(|(range, path)| {
                    scope.spawn(move || write_part(&day_line, config.seed, stream, range.clone(), path))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a writer thread panicked")).collect()
        });
        let (mut labels, mut probs) = (Vec::new(), Vec::new());
        for (r, (_, path)) in written.into_iter().zip(&parts) {
            let (l, p) = r.with_context(|| format!("cannot write {}", path.display()))?;
            labels.extend(l);
            probs.extend(p);
        }
        let meta = DayMeta {
            date: folder_name(date),
            lines: config.lines_per_day,
            ctr: labels.iter().map(|&y| y as f64).sum::<f64>() / labels.len().max(1) as f64,
            oracle_auc: metrics::auc(&probs, &labels),
        };
        on_day(&meta);
        days.push(meta);
    }
    let meta = StreamMeta { seed: config.seed, parts: config.parts, days };
    let path = config.out.join("meta.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&meta)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(meta)
}

/// Writes line `line` of a day's stream: the day travels in the stream number, as the part
/// writers take a plain function.
fn day_line(seed: u64, stream: u64, line: u64, out: &mut Vec<u8>) -> (f32, f64) {
    planted_line(seed, stream, line, Some(Drift { day: (stream - DAY_STREAM) as u32 }), out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::read::calendar::parse_date;

    /// A stream running past 9999-12-31 is refused before anything is written: its folders
    /// took more digits than `--days` names.
    #[test]
    fn a_stream_past_the_year_9999_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = StreamConfig {
            days: 2,
            lines_per_day: 10,
            parts: 1,
            seed: 1,
            start: parse_date("99991231").unwrap(),
            out: dir.path().join("s"),
        };
        let err = generate(&config, &|_| {}).unwrap_err().to_string();
        assert!(err.contains("--start 99991231 with 2 days runs past the year 9999"), "{err}");
        assert!(!config.out.exists());
    }

    #[test]
    fn new_ids_arrive_every_day_and_the_head_keeps_its_ids() {
        let ids = |day: u32| {
            let mut out = Vec::new();
            for line in 0..3000 {
                planted_line(1, DAY_STREAM + day as u64, line, Some(Drift { day }), &mut out);
            }
            let mut batch = crate::base::batch::Batch::new(1, 13, 26);
            for l in out.split(|&c| c == b'\n').filter(|l| !l.is_empty()) {
                crate::data::format::criteo::parse_line(l, &mut batch).unwrap();
            }
            batch.ids.iter().copied().collect::<std::collections::HashSet<u64>>()
        };
        let (d0, d1, d5) = (ids(0), ids(1), ids(5));
        let new1 = d1.difference(&d0).count() as f64 / d1.len() as f64;
        let new5 = d5.difference(&d0).count() as f64 / d5.len() as f64;
        assert!(new1 > 0.05 && new5 > new1, "new ids: {new1:.3} after a day, {new5:.3} after five");
        assert!(d5.intersection(&d0).count() as f64 > 0.2 * d5.len() as f64, "the head stays");
    }
}
