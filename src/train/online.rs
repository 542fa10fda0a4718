//! Online training's calendar: the same processes train day after day, each day's files split
//! into passes (PaddleRec's online trainer: a pass per split of the day's logs). Passes are
//! numbered across days (day 2's first pass follows day 1's last), so saves per pass, resume and
//! restarts work as for any job; this module says which day and split a pass is, and which files
//! the next day's first split holds (the day's model is judged on them).
//!
//! Every trainer declares the calendar it read (`listing`, as `protocol::ListedDay`s), and the
//! servers compare it with the first trainer's. A pass's manifest records its day
//! (`SavedDay`), and `check_resume` refuses a resume whose calendar would put the saved passes on
//! other days; `check_shares` refuses a split that leaves a trainer without a file.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use crate::train::job_config::Online;

/// Where a saved pass stands in its calendar, as the pass's manifest records it (`online`):
/// passes are numbered from the job's first day, so a resume must count from the same one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedDay {
    /// The job's first day (`YYYYMMDD`).
    pub first_day: String,
    /// The day the pass trained.
    pub day: String,
    /// Passes per day.
    pub passes_per_day: u32,
}

/// Where a pass falls in the calendar.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    /// Index of the day (0-based) in [`Online::days`].
    pub day: usize,
    /// The pass within its day (1-based).
    pub pass: u32,
    /// Whether it is its day's last pass.
    pub day_end: bool,
}

impl Online {
    /// Checks that every day splits into its passes.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.passes_per_day > 0, "--passes-per-day must be at least 1");
        anyhow::ensure!(!self.days.is_empty(), "no days to train");
        for (date, files) in &self.days {
            anyhow::ensure!(
                files.len() >= self.passes_per_day as usize,
                "day {date} has {} file(s), fewer than its {} passes (each pass trains a split of the day's files)",
                files.len(),
                self.passes_per_day
            );
        }
        Ok(())
    }

    /// The calendar as this trainer sees it now, day by day, for the servers to compare with
    /// the other trainers' (see [`crate::protocol::ListedDay`]): file names, not paths, so
    /// trainers may mount the stream at different places.
    pub fn listing(&self) -> anyhow::Result<Vec<crate::protocol::ListedDay>> {
        use sha2::Digest;
        let mut days = Vec::with_capacity(self.days.len());
        for (day, files) in &self.days {
            let (mut hash, mut bytes) = (sha2::Sha256::new(), 0u64);
            for f in files {
                let size = std::fs::metadata(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?.len();
                let name = f.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                hash.update(format!("{name}\0{size}\n").as_bytes());
                bytes += size;
            }
            let digest = crate::security::auth::to_hex(&hash.finalize());
            days.push(crate::protocol::ListedDay { day: day.clone(), files: files.len() as u64, bytes, digest });
        }
        Ok(days)
    }

    /// Every day's files, in order.
    pub fn all_files(&self) -> Vec<PathBuf> {
        self.days.iter().flat_map(|(_, f)| f.iter().cloned()).collect()
    }

    /// Passes in all.
    pub fn passes(&self) -> u32 {
        self.days.len() as u32 * self.passes_per_day
    }

    /// The day and split of pass `pass` (1-based, counted across days).
    pub fn slot(&self, pass: u32) -> Slot {
        let k = pass.saturating_sub(1);
        let within = k % self.passes_per_day + 1;
        Slot { day: (k / self.passes_per_day) as usize, pass: within, day_end: within == self.passes_per_day }
    }

    /// The date of day `day` as a number (`20260101`), as the done-file names it.
    pub fn date_number(&self, day: usize) -> u32 {
        self.days[day].0.parse().unwrap_or_default()
    }

    /// The files of pass `pass` (every trainer's; each reads its share).
    pub fn files(&self, pass: u32) -> &[PathBuf] {
        let slot = self.slot(pass);
        crate::data::read::calendar::split(&self.days[slot.day].1, slot.pass as usize - 1, self.passes_per_day as usize)
    }

    /// What a manifest records of pass `pass` (1-based, within the calendar).
    pub fn saved_day(&self, pass: u32) -> SavedDay {
        SavedDay {
            first_day: self.days[0].0.clone(),
            day: self.days[self.slot(pass).day].0.clone(),
            passes_per_day: self.passes_per_day,
        }
    }

    /// Checks that a saved model's pass `pass`, recorded as `saved` (`None`: a model not saved
    /// by online training), falls on the day it trained in this calendar. Passes are numbered
    /// from the first day, so a calendar starting on another day, split otherwise, or missing
    /// a day in between would go on at the wrong day, skipping or repeating days without a word.
    pub fn check_resume(&self, pass: u32, saved: Option<&SavedDay>) -> anyhow::Result<()> {
        let Some(saved) = saved else {
            anyhow::bail!(
                "the saved model's {pass} pass(es) were not trained online: online training numbers its passes from \
                 its first day, so it resumes only a model it saved; to start online training from this model, give \
                 --init-model instead of --resume"
            )
        };
        let SavedDay { first_day, day, passes_per_day } = saved;
        anyhow::ensure!(
            *passes_per_day == self.passes_per_day,
            "the saved model trained {passes_per_day} pass(es) a day, this job {}: resume with --passes-per-day \
             {passes_per_day}",
            self.passes_per_day
        );
        let (from, to) = (&self.days[0].0, &self.days[self.days.len() - 1].0);
        anyhow::ensure!(
            first_day == from,
            "the saved model's job began on day {first_day} and this calendar on {from}: passes are numbered from \
             the first day, so resume with --days {first_day}..{to}"
        );
        let at = self.slot(pass).day;
        if let Some((now, _)) = self.days.get(at) {
            anyhow::ensure!(
                now == day,
                "the saved model's pass {pass} trained day {day}, but in this calendar pass {pass} falls on day {now}: \
                 a day of the stream between {first_day} and {day} is missing or new"
            );
        }
        Ok(())
    }

    /// Checks that every split of every day gives trainer `me` of `trainers` a file: a pass
    /// over none is an error, met only once the job reached that day.
    pub fn check_shares(&self, trainers: usize, me: usize) -> anyhow::Result<()> {
        for pass in 1..=self.passes() {
            let split = self.files(pass);
            if crate::data::shard_files(split, trainers, me).is_empty() {
                let slot = self.slot(pass);
                anyhow::bail!(
                    "day {} split {} holds {} file(s), none of them trainer {me}'s of {trainers}: give each day at \
                     least --passes-per-day x trainers files, or fewer passes per day",
                    self.days[slot.day].0,
                    slot.pass,
                    split.len()
                );
            }
        }
        Ok(())
    }

    /// The first split of the day after `day`, on which `day`'s model is evaluated before
    /// training goes on; `None` after the last day.
    pub fn next_first_split(&self, day: usize) -> Option<&[PathBuf]> {
        let (_, files) = self.days.get(day + 1)?;
        Some(crate::data::read::calendar::split(files, 0, self.passes_per_day as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_days() -> Online {
        let files = |d: &str| (0..4).map(|i| PathBuf::from(format!("{d}/part-{i:05}"))).collect();
        Online { days: vec![("20260101".into(), files("a")), ("20260102".into(), files("b"))], passes_per_day: 2 }
    }

    #[test]
    fn a_resume_must_count_its_passes_from_the_same_first_day() {
        let o = two_days();
        let saved = o.saved_day(2);
        assert_eq!(saved, SavedDay { first_day: "20260101".into(), day: "20260101".into(), passes_per_day: 2 });
        o.check_resume(2, Some(&saved)).unwrap();
        o.check_resume(4, Some(&o.saved_day(4))).unwrap();
        let err = |o: &Online, pass, saved: Option<&SavedDay>| o.check_resume(pass, saved).unwrap_err().to_string();
        assert!(err(&o, 2, None).contains("not trained online"));
        // The next day alone: its passes would be numbered as the first day's.
        let later = Online { days: vec![o.days[1].clone()], passes_per_day: 2 };
        assert!(err(&later, 2, Some(&saved)).contains("resume with --days 20260101..20260102"));
        let split = Online { passes_per_day: 1, ..o.clone() };
        assert!(err(&split, 2, Some(&saved)).contains("--passes-per-day 2"));
        // Day 1 gone from the stream: pass 2 would now fall on day 2.
        let mut lost = o.clone();
        lost.days[0].0 = "20251231".into();
        lost.days.insert(1, ("20260101x".into(), lost.days[1].1.clone()));
        let shifted = SavedDay { first_day: "20251231".into(), day: "20260101".into(), passes_per_day: 2 };
        assert!(err(&lost, 4, Some(&shifted)).contains("falls on day 20260101x"));
        // A pass beyond this calendar is left to the count of passes to train.
        later.check_resume(9, Some(&SavedDay { first_day: "20260102".into(), ..saved })).unwrap();
    }

    #[test]
    fn every_split_must_give_every_trainer_a_file() {
        let o = two_days();
        o.check_shares(2, 1).unwrap();
        let e = o.check_shares(3, 2).unwrap_err().to_string();
        assert!(e.contains("day 20260101 split 1 holds 2 file(s), none of them trainer 2's of 3"), "{e}");
    }

    #[test]
    fn passes_run_across_days_split_by_split() {
        let o = two_days();
        assert_eq!(o.passes(), 4);
        assert_eq!(o.slot(1), Slot { day: 0, pass: 1, day_end: false });
        assert_eq!(o.slot(2), Slot { day: 0, pass: 2, day_end: true });
        assert_eq!(o.slot(3), Slot { day: 1, pass: 1, day_end: false });
        assert_eq!(o.files(3), &o.days[1].1[0..2]);
        assert_eq!(o.files(4), &o.days[1].1[2..4]);
        assert_eq!(o.next_first_split(0), Some(&o.days[1].1[0..2]));
        assert_eq!(o.next_first_split(1), None);
        assert_eq!(o.date_number(1), 20260102);
    }

    /// Two trainers' listings of one stream agree wherever it is mounted; a file one of them
    /// saw and the other did not is named by its day.
    #[test]
    fn listings_of_one_calendar_agree_and_a_file_more_is_named_by_its_day() {
        use crate::protocol::ListedDay;
        let (here, there) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let listed = |root: &std::path::Path, parts: usize| {
            let day = root.join("20260101");
            std::fs::create_dir_all(&day).unwrap();
            let files: Vec<PathBuf> = (0..parts).map(|i| day.join(format!("part-{i:05}"))).collect();
            files.iter().for_each(|f| std::fs::write(f, "1\t2\n").unwrap());
            Online { days: vec![("20260101".into(), files)], passes_per_day: 1 }.listing().unwrap()
        };
        let (a, b) = (listed(here.path(), 2), listed(there.path(), 2));
        assert_eq!(ListedDay::first_difference(&a, &b), None);
        assert_eq!((a[0].files, a[0].bytes), (2, 8));
        let more = listed(there.path(), 3);
        let why = ListedDay::first_difference(&a, &more).unwrap();
        assert!(
            why.contains(
                "day 20260101: 3 files of 12 bytes here, 2 files of 8 bytes for the trainer that declared first"
            ),
            "{why}"
        );
    }

    #[test]
    fn a_day_with_fewer_files_than_passes_is_refused() {
        let mut o = two_days();
        o.passes_per_day = 5;
        assert!(o.validate().unwrap_err().to_string().contains("day 20260101 has 4 file(s)"));
    }
}
