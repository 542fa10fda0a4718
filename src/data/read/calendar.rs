//! The calendar of an online job's data: a folder per day named `YYYYMMDD`, the day ranges
//! (`--days FROM..TO`) online training reads, and how a day's files are dealt into its passes.

use std::path::{Path, PathBuf};

use anyhow::Context;
use chrono::NaiveDate;

/// A date as its folder name.
pub fn folder_name(date: NaiveDate) -> String {
    date.format("%Y%m%d").to_string()
}

/// Parses a `YYYYMMDD` folder name.
pub fn parse_date(s: &str) -> anyhow::Result<NaiveDate> {
    NaiveDate::parse_from_str(s, "%Y%m%d").with_context(|| format!("{s:?} is not a date as YYYYMMDD"))
}

/// The days `FROM..TO` (both included, `YYYYMMDD`) of the stream in `dir`, each with its part
/// files in name order; every day's folder must exist and hold files.
pub fn days_in(dir: &Path, range: &str) -> anyhow::Result<Vec<(String, Vec<PathBuf>)>> {
    let (from, to) = range.split_once("..").with_context(|| format!("--days {range:?} is not FROM..TO"))?;
    let (from, to) = (parse_date(from.trim())?, parse_date(to.trim())?);
    anyhow::ensure!(from <= to, "--days {range}: {from} is after {to}");
    let mut days = Vec::new();
    let mut date = from;
    while date <= to {
        let name = folder_name(date);
        let folder = dir.join(&name);
        let files = crate::data::resolve_files(&folder)
            .with_context(|| format!("day {name} of the online stream {}", dir.display()))?;
        anyhow::ensure!(!files.is_empty(), "day folder {} holds no files", folder.display());
        days.push((name, files));
        date = date + chrono::Days::new(1);
    }
    Ok(days)
}

/// The files of pass `k` (0-based) of `passes` of a day: the day's files dealt in order into
/// `passes` consecutive splits (as many files as passes at least).
pub fn split(files: &[PathBuf], k: usize, passes: usize) -> &[PathBuf] {
    let n = files.len();
    &files[k * n / passes..(k + 1) * n / passes]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn day_ranges_name_existing_folders_in_order() {
        let dir = tempfile::tempdir().unwrap();
        for d in ["20261230", "20261231", "20270101"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
            std::fs::write(dir.path().join(d).join("part-00000"), "x\n").unwrap();
        }
        let days = days_in(dir.path(), "20261230..20270101").unwrap();
        let names: Vec<&str> = days.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["20261230", "20261231", "20270101"]);
        assert!(days_in(dir.path(), "20270101..20261230").unwrap_err().to_string().contains("after"));
        assert!(format!("{:#}", days_in(dir.path(), "20261229..20261230").unwrap_err()).contains("20261229"));
        assert!(days_in(dir.path(), "2026-12-30").is_err());
    }

    #[test]
    fn a_days_files_are_split_into_consecutive_passes() {
        let files: Vec<PathBuf> = (0..4).map(|i| PathBuf::from(format!("p{i}"))).collect();
        assert_eq!(split(&files, 0, 2), &files[0..2]);
        assert_eq!(split(&files, 1, 2), &files[2..4]);
        assert_eq!(split(&files, 2, 4), &files[2..3]);
    }
}
