//! Where a reader's lines go ([`Sink`]): parsed and checked into batches, held by the
//! [`Shuffler`] first when the pass is shuffled, and sent to the trainer less the samples a
//! rejoining trainer already pushed. Each sample is checked as it is parsed: its labels within
//! what the model's heads take (`Schema::label_bounds`, set when the job file's model is built),
//! at most [`MAX_LINE_IDS`] ids a line and [`MAX_BATCH_IDS`] a batch.

use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use crate::data::read::reader::{DataError, ReadProgress, ReaderConfig};
use crate::data::read::shuffle::Shuffler;
use crate::data::{Batch, LineParser, Schema};

/// The reader thread's end of the channel, leaving out the samples to skip.
pub(super) struct Out {
    pub(super) tx: std::sync::mpsc::SyncSender<Result<Batch, DataError>>,
    pub(super) skip: u64,
    /// Whether the consumer is gone (a send failed): reading stops.
    pub(super) gone: bool,
}

impl Out {
    /// Sends `batch` less the samples still to skip; false once the consumer is gone.
    pub(super) fn send(&mut self, batch: Batch) -> bool {
        let n = batch.len() as u64;
        if self.skip >= n {
            self.skip -= n;
            return true;
        }
        let batch = if self.skip > 0 { batch.slice(self.skip as usize..n as usize) } else { batch };
        self.skip = 0;
        self.gone = self.tx.send(Ok(batch)).is_err();
        !self.gone
    }
}

/// Where the lines read go: parsed into batches and sent, or first held by the shuffler.
pub(super) struct Sink<'a> {
    pub(super) config: &'a ReaderConfig,
    pub(super) files: &'a [PathBuf],
    pub(super) parser: Box<dyn LineParser>,
    pub(super) progress: &'a ReadProgress,
    pub(super) batch: Batch,
    pub(super) out: Out,
    pub(super) shuffler: Option<Shuffler>,
}

impl Sink<'_> {
    /// Takes line `number` of file `file`, `bytes` long in the input: parsed now, or held until
    /// the shuffler gives it back. False once the consumer is gone.
    pub(super) fn take(&mut self, file: usize, number: u64, bytes: u64, text: &[u8]) -> Result<bool, DataError> {
        let Some(shuffler) = &mut self.shuffler else {
            return self.parse(file, number, bytes, text);
        };
        match shuffler.push(file, number, bytes, text)? {
            Some(line) => self.parse(line.file, line.number, line.bytes, &line.text),
            None => Ok(true),
        }
    }

    /// Parses a line into the batch, sending the batch once full; a bad line is skipped and
    /// counted, or the error. False once the consumer is gone.
    fn parse(&mut self, file: usize, number: u64, bytes: u64, text: &[u8]) -> Result<bool, DataError> {
        // Counted as it is parsed, not as it is read: shuffling reads a share before its first batch.
        self.progress.bytes.fetch_add(bytes, Relaxed);
        let ids = self.batch.ids.len();
        let parsed = self
            .parser
            .parse(text, &mut self.batch)
            .and_then(|()| check_sample(&self.config.schema, &mut self.batch, ids));
        self.outcome(file, number, parsed)
    }

    /// What a line's parse comes to: counted, skipped, or the job's error.
    pub(super) fn outcome(&mut self, file: usize, number: u64, parsed: Result<(), String>) -> Result<bool, DataError> {
        match parsed {
            Ok(()) => {
                self.progress.samples.fetch_add(1, Relaxed);
            }
            Err(_) if self.config.skip_bad_lines => {
                self.progress.bad_lines.fetch_add(1, Relaxed);
                return Ok(true);
            }
            Err(reason) => {
                let reason = cut(reason);
                return Err(DataError::BadLine { path: self.files[file].clone(), line: number, reason });
            }
        }
        if self.batch.len() == self.config.batch_size {
            let full = std::mem::replace(&mut self.batch, self.config.schema.new_batch());
            return Ok(self.out.send(full));
        }
        Ok(true)
    }

    /// After the last file: the lines still held, the last batch, and the check that the
    /// samples to skip were there.
    pub(super) fn finish(&mut self) -> Result<(), DataError> {
        if let Some(s) = self.shuffler.as_ref().filter(|s| !s.is_empty()) {
            tracing::info!(
                lines = s.len(),
                mib = s.held_bytes() >> 20,
                "shuffling: the pass's lines are read; training on them in a random order"
            );
        }
        while let Some(line) = self.shuffler.as_mut().and_then(Shuffler::pop) {
            if !self.parse(line.file, line.number, line.bytes, &line.text)? {
                return Ok(());
            }
        }
        if !self.batch.is_empty() {
            let last = std::mem::replace(&mut self.batch, self.config.schema.new_batch());
            self.out.send(last);
        }
        if self.out.skip > 0 && !self.out.gone {
            // A position record from other (or fewer) data: the whole pass was skipped, and
            // the trainer ended it having trained nothing, status 0.
            let held = self.config.skip - self.out.skip;
            return Err(DataError::ShortOfSkip { asked: self.config.skip, held });
        }
        Ok(())
    }
}

/// A bad line's reason within 300 characters: a parser quotes the token it refused, and a
/// 60 MiB field came back whole, as 63 MB of error message.
fn cut(reason: String) -> String {
    const MOST: usize = 300;
    if reason.chars().nth(MOST).is_none() {
        return reason;
    }
    let kept: String = reason.chars().take(MOST).collect();
    format!("{kept}... (the reason cut from {} bytes)", reason.len())
}

/// Most ids one line may hold: a 64 MiB line of one-character ids held 16 million (128 MB
/// parsed), and a batch of such lines tens of gigabytes.
pub const MAX_LINE_IDS: usize = 1 << 20;
/// Most ids one batch may hold (128 MiB of ids).
pub const MAX_BATCH_IDS: usize = 1 << 24;

/// Checks the sample just parsed into `batch` (which held `ids_before` ids before it): its ids
/// within [`MAX_LINE_IDS`] and the batch's within [`MAX_BATCH_IDS`], its labels within the
/// model's bounds. A sample that fails is taken out again, and the reason returned.
fn check_sample(schema: &Schema, batch: &mut Batch, ids_before: usize) -> Result<(), String> {
    let ids = batch.ids.len() - ids_before;
    let labels = &batch.labels[batch.labels.len() - batch.label_width..];
    let checked = if ids > MAX_LINE_IDS {
        Err(format!("the line holds {ids} ids, at most {MAX_LINE_IDS}"))
    } else if batch.ids.len() > MAX_BATCH_IDS {
        Err(format!("with this line the batch would hold over {MAX_BATCH_IDS} ids: lower batch_size"))
    } else {
        schema.check_labels(labels)
    };
    checked.inspect_err(|_| batch.truncate(batch.len() - 1))
}

#[cfg(test)]
mod tests {
    use super::super::reader::{Reader, ReaderConfig};
    use super::super::shuffle::ShuffleConfig;
    use super::*;

    /// Two Criteo files of 300 and 400 lines, line k's first integer feature k.
    fn two_files(dir: &std::path::Path, bad_at: Option<u64>) -> Vec<PathBuf> {
        let write = |name: &str, range: std::ops::Range<u64>| {
            let path = dir.join(name);
            let text: String = range
                .map(|k| if Some(k) == bad_at { "x\n".to_string() } else { format!("{}\t{k}\n", k % 2) })
                .collect();
            std::fs::write(&path, text).unwrap();
            path
        };
        vec![write("a", 0..300), write("b", 300..700)]
    }

    /// The first dense value of every sample read, in order, and the reader's byte count.
    fn read(files: &[PathBuf], config: ReaderConfig) -> (Result<Vec<f32>, String>, u64) {
        let reader = Reader::spawn(files.to_vec(), config);
        let progress = reader.progress();
        let mut firsts = Vec::new();
        for batch in reader {
            match batch {
                Ok(b) => firsts.extend(b.dense.chunks(b.dense_width).map(|row| row[0])),
                Err(e) => return (Err(e.to_string()), progress.bytes.load(Relaxed)),
            }
        }
        (Ok(firsts), progress.bytes.load(Relaxed))
    }

    fn shuffled(seed: u64, max_bytes: u64) -> ReaderConfig {
        let shuffle = ShuffleConfig { window: u64::MAX, seed, max_bytes };
        ReaderConfig { shuffle: Some(shuffle), ..ReaderConfig::criteo(64) }
    }

    fn sorted(mut v: Vec<f32>) -> Vec<f32> {
        v.sort_by(f32::total_cmp);
        v
    }

    #[test]
    fn a_shuffled_pass_reads_every_line_once_in_its_seed_s_order_and_skips_the_same_samples_again() {
        let dir = tempfile::tempdir().unwrap();
        let files = two_files(dir.path(), None);
        let bytes: u64 = files.iter().map(|f| std::fs::metadata(f).unwrap().len()).sum();
        let (in_order, read_bytes) = read(&files, ReaderConfig::criteo(64));
        let in_order = in_order.unwrap();
        assert_eq!((in_order.len(), read_bytes), (700, bytes));
        let (a, a_bytes) = read(&files, shuffled(5, u64::MAX));
        let a = a.unwrap();
        assert_eq!(a_bytes, bytes, "every byte counted, as it is parsed");
        assert_eq!(sorted(a.clone()), sorted(in_order.clone()), "every line once");
        assert_ne!(a, in_order);
        assert_ne!(a[..300], in_order[..300], "the files' lines are mixed");
        assert_eq!(read(&files, shuffled(5, u64::MAX)).0.unwrap(), a, "the seed's order, again");
        assert_ne!(read(&files, shuffled(6, u64::MAX)).0.unwrap(), a);
        // A rejoining trainer leaves out what it pushed: the same samples, the rest in place.
        let skip = ReaderConfig { skip: 250, ..shuffled(5, u64::MAX) };
        assert_eq!(read(&files, skip).0.unwrap(), a[250..]);
    }

    #[test]
    fn a_shuffled_pass_names_a_bad_line_by_its_file_and_line_or_skips_it() {
        let dir = tempfile::tempdir().unwrap();
        let files = two_files(dir.path(), Some(304));
        let (got, _) = read(&files, shuffled(5, u64::MAX));
        let err = got.unwrap_err();
        assert!(err.starts_with(&format!("{}:5: ", files[1].display())), "{err}");
        let skipping = ReaderConfig { skip_bad_lines: true, ..shuffled(5, u64::MAX) };
        assert_eq!(read(&files, skipping).0.unwrap().len(), 699);
    }

    #[test]
    fn a_bad_line_s_reason_is_cut_whatever_the_token_it_quotes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a");
        std::fs::write(&path, format!("1\t{}\n", "9".repeat(100_000))).unwrap();
        let (got, _) = read(std::slice::from_ref(&path), ReaderConfig::criteo(4));
        let err = got.unwrap_err();
        assert!(err.starts_with(&format!("{}:1: ", path.display())) && err.len() < 600, "{} bytes", err.len());
        assert!(err.contains("... (the reason cut from"), "{err}");
    }

    #[test]
    fn a_share_beyond_the_memory_allowed_is_an_error_naming_the_window_setting() {
        let dir = tempfile::tempdir().unwrap();
        let files = two_files(dir.path(), None);
        let err = read(&files, shuffled(5, 10_000)).0.unwrap_err();
        assert!(err.starts_with("shuffling holds this trainer's lines in memory: "), "{err}");
        assert!(err.contains("--shuffle-window"), "{err}");
        let window = ShuffleConfig { window: 100, seed: 5, max_bytes: 10_000 };
        let windowed = ReaderConfig { shuffle: Some(window), ..ReaderConfig::criteo(64) };
        assert_eq!(read(&files, windowed).0.unwrap().len(), 700, "a window within the bound reads on");
    }
}
