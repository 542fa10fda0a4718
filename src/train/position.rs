//! Where a trainer is in its data: recorded after every step, so that a trainer restarted after
//! a failure (`oar train --rejoin`) goes on from the batch after the last one it pushed instead
//! of training its share again or losing it.
//!
//! The record is one fixed-size block written in place (`pwrite`) with a checksum: a step costs
//! one small write to the page cache, a process killed at any instant leaves either the old or
//! the new record (a single write to a regular file is not interrupted by a signal), and a
//! record torn by a machine crash is caught by its checksum rather than misread.
//!
//! Batches count once every earlier one is pushed ([`PositionLog`]), as Hogwild threads finish
//! them out of order, so a restart skips only a prefix of its share: the reader leaves out the
//! samples already pushed, and a warm-up goes on at its next batch part. The record names the
//! order the lines were read in (the files' order, or a shuffle's seed and window), and a rejoin
//! that would read another order is refused.

use std::collections::BTreeMap;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};

/// Bytes of the record block: the JSON, a newline, the CRC-32 in hex, a newline, then spaces.
const RECORD: usize = 512;

/// A trainer's place in its data shard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    /// The job it belongs to (a record of another job is never resumed from).
    pub job: String,
    /// The trainer.
    pub trainer: usize,
    /// The run's first pass (the one with async mode's synchronous warm-up).
    pub first_pass: u32,
    /// The pass under way.
    pub pass: u32,
    /// Steps pushed in this run (all passes).
    pub step: u64,
    /// Samples of this pass's shard whose steps have been pushed: a restart skips them.
    pub samples: u64,
    /// Samples trained in this run (all passes), for the trainer's report.
    pub trained: u64,
    /// The run ended (the trainer closed): a later start of the same job is a new run.
    #[serde(default)]
    pub finished: bool,
    /// The order the trainer reads its lines in ([`super::TrainConfig::order`]; `None`: the
    /// files' order): `samples` counts a prefix of that order, which only a restart reading the
    /// same order may skip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub order: Option<String>,
}

impl Position {
    /// The record's file for `trainer` in `dir`.
    pub fn path(dir: &Path, trainer: usize) -> PathBuf {
        dir.join(format!("trainer-{trainer}.position"))
    }

    /// Reads the record of `trainer` of `job` in `dir`: `None` when there is none yet (the
    /// trainer failed before its first step); an error names a torn or foreign record.
    pub fn load(dir: &Path, job: &str, trainer: usize) -> anyhow::Result<Option<Position>> {
        let Some(pos) = Position::read(dir, trainer)? else { return Ok(None) };
        anyhow::ensure!(
            pos.job == job && pos.trainer == trainer,
            "{}: the record of trainer {} of job '{}', not of trainer {trainer} of '{job}'",
            Position::path(dir, trainer).display(),
            pos.trainer,
            pos.job
        );
        Ok(Some(pos))
    }

    /// Reads the record in `trainer`'s file in `dir`, of whichever job: `None` when there is none.
    pub fn read(dir: &Path, trainer: usize) -> anyhow::Result<Option<Position>> {
        let path = Position::path(dir, trainer);
        // Not followed if a link, not waited on if a pipe, not read past one record's size.
        let Some(bytes) = crate::base::state_file::read(&path, RECORD as u64)? else { return Ok(None) };
        let bad = |why: &str| anyhow::anyhow!("{}: {why}: the trainer cannot tell where it was", path.display());
        let text = std::str::from_utf8(&bytes).map_err(|_| bad("not a position record"))?;
        let mut lines = text.lines();
        let (json, crc) = (lines.next().unwrap_or_default(), lines.next().unwrap_or_default().trim());
        if format!("{:08x}", crc32fast::hash(json.as_bytes())) != crc {
            return Err(bad("checksum mismatch (a torn record)"));
        }
        let pos: Position = serde_json::from_str(json).map_err(|e| bad(&e.to_string()))?;
        let max = crate::base::state_file::COUNTER_MAX;
        if pos.step > max || pos.samples > max || pos.trained > max || pos.first_pass > pos.pass {
            return Err(bad("its counts are beyond any run's"));
        }
        Ok(Some(pos))
    }

    /// Checks that this record can be gone on from in a run of `passes` passes: a record of a
    /// later pass (another run's, or a damaged one) would make the trainer train nothing.
    pub fn check_passes(&self, dir: &Path, passes: u32) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.pass >= 1 && self.pass <= passes,
            "{}: the record is in pass {}, but this run has passes 1..={passes}: not this run's (start it afresh \
             without the record, or give the run's --passes)",
            Position::path(dir, self.trainer).display(),
            self.pass
        );
        Ok(())
    }

    /// Checks that this record's samples were read in `order`, the order this run reads its
    /// lines in: skipping as many of the lines in another order would skip other samples.
    pub fn check_order(&self, dir: &Path, order: &Option<String>) -> anyhow::Result<()> {
        let said = |o: &Option<String>| o.clone().unwrap_or_else(|| "in the files' order".into());
        anyhow::ensure!(
            &self.order == order,
            "{}: the record counts {} samples of pass {} read {}, but this run reads them {}: they are other \
             samples (rejoin with the first run's --shuffle, --shuffle-window and --seed)",
            Position::path(dir, self.trainer).display(),
            self.samples,
            self.pass,
            said(&self.order),
            said(order)
        );
        Ok(())
    }
}

/// Records a trainer's [`Position`] as its steps are pushed. Batches are numbered in the order
/// they leave the reader ([`PositionLog::take`]) and count once every batch before them is
/// pushed too ([`PositionLog::done`]): Hogwild threads finish them out of order, and a restart
/// must skip only a prefix of the shard.
pub struct PositionLog {
    file: std::fs::File,
    path: PathBuf,
    pos: Position,
    /// Batches taken and not yet counted: number -> (samples, pushed).
    open: BTreeMap<u64, (u64, bool)>,
    next: u64,
}

impl PositionLog {
    /// Opens (creating) `trainer`'s record in `dir`, starting from `pos`, and writes it.
    pub fn create(dir: &Path, pos: Position) -> anyhow::Result<PositionLog> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let path = Position::path(dir, pos.trainer);
        // Refused if a link, a pipe or a folder: the record is written in place, so a link
        // would have the file it points to overwritten.
        drop(crate::base::state_file::open(&path, false)?);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        let mut log = PositionLog { file, path, pos, open: BTreeMap::new(), next: 0 };
        log.write()?;
        Ok(log)
    }

    /// The position recorded so far.
    pub fn position(&self) -> &Position {
        &self.pos
    }

    /// The run ended: the record says so, for a later start of the same job.
    pub fn finish(&mut self) -> anyhow::Result<()> {
        self.pos.finished = true;
        self.write()
    }

    /// A new pass starts at the beginning of the shard.
    pub fn start_pass(&mut self, pass: u32) -> anyhow::Result<()> {
        self.pos.pass = pass;
        self.pos.samples = 0;
        self.open.clear();
        self.write()
    }

    /// A batch of `samples` left the reader: its number, for [`PositionLog::done`].
    pub fn take(&mut self, samples: u64) -> u64 {
        let n = self.next;
        self.next += 1;
        self.open.insert(n, (samples, false));
        n
    }

    /// Batch `n` has been pushed: the record moves past every pushed batch that follows the
    /// counted ones without a gap.
    pub fn done(&mut self, n: u64) -> anyhow::Result<()> {
        if let Some(b) = self.open.get_mut(&n) {
            b.1 = true;
        }
        let mut moved = false;
        while let Some(entry) = self.open.first_entry() {
            let (samples, pushed) = *entry.get();
            if !pushed {
                break;
            }
            entry.remove();
            self.pos.samples += samples;
            self.pos.trained += samples;
            self.pos.step += 1;
            moved = true;
        }
        if moved {
            self.write()?;
        }
        Ok(())
    }

    fn write(&mut self) -> anyhow::Result<()> {
        let json = serde_json::to_string(&self.pos).expect("a position serializes");
        let mut block = format!("{json}\n{:08x}\n", crc32fast::hash(json.as_bytes())).into_bytes();
        anyhow::ensure!(block.len() <= RECORD, "position record of {} bytes (job id too long?)", block.len());
        block.resize(RECORD, b' ');
        self.file
            .write_all_at(&block, 0)
            .with_context(|| format!("cannot record the position in {}", self.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(job: &str) -> Position {
        Position {
            job: job.into(),
            trainer: 1,
            first_pass: 1,
            pass: 1,
            step: 0,
            samples: 0,
            trained: 0,
            finished: false,
            // The longest a shuffled order reads: the record still fits its block.
            order: Some(format!("shuffled by seed {} within {} lines", u64::MAX, u64::MAX - 1)),
        }
    }

    #[test]
    fn batches_count_once_every_earlier_one_is_pushed_and_the_record_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(Position::load(dir.path(), "j", 1).unwrap(), None, "no record before the first step");
        let mut log = PositionLog::create(dir.path(), start("j")).unwrap();
        let (a, b, c) = (log.take(10), log.take(20), log.take(5));
        log.done(b).unwrap();
        assert_eq!(Position::load(dir.path(), "j", 1).unwrap().unwrap().samples, 0, "a gap before b");
        log.done(a).unwrap();
        let pos = Position::load(dir.path(), "j", 1).unwrap().unwrap();
        assert_eq!((pos.samples, pos.trained, pos.step), (30, 30, 2));
        log.done(c).unwrap();
        log.start_pass(2).unwrap();
        let d = log.take(7);
        log.done(d).unwrap();
        let pos = Position::load(dir.path(), "j", 1).unwrap().unwrap();
        assert_eq!((pos.pass, pos.samples, pos.trained, pos.step), (2, 7, 42, 4));
        assert_eq!(pos.order, start("j").order, "the order is kept with the record");

        let err = Position::load(dir.path(), "other", 1).unwrap_err().to_string();
        assert!(err.contains("not of trainer 1 of 'other'"), "{err}");
        let file = Position::path(dir.path(), 1);
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[12] ^= 1;
        std::fs::write(&file, bytes).unwrap();
        let err = Position::load(dir.path(), "j", 1).unwrap_err().to_string();
        assert!(err.contains("checksum mismatch") && err.contains("trainer-1.position"), "{err}");
    }
}
