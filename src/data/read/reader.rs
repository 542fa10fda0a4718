//! A reader thread that turns a list of files into batches, ahead of the trainer, through a
//! bounded channel. Errors name the file and the line ([`DataError`]); at most
//! [`MAX_LINE_BYTES`] (64 MiB) of a line is kept. Each file is checked again as regular when it is
//! opened, and a panic on the thread is an error naming the file, never the end of the data.
//! What becomes of the lines is `sink.rs`'s.

use std::io::{BufRead, Read};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use crate::data::read::shuffle::{ShuffleConfig, ShuffleError, Shuffler};
use crate::data::read::sink::{Out, Sink};
pub use crate::data::read::sink::{MAX_BATCH_IDS, MAX_LINE_IDS};
use crate::data::{Batch, Schema};

/// A bad input: the file, the 1-based line, and what is wrong.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A line could not be parsed.
    #[error("{path}:{line}: {reason} (use --skip-bad-lines to skip and count such lines)")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: u64,
        /// What is wrong.
        reason: String,
    },
    /// The `pipe_command` over a file failed.
    #[error("{path}: pipe_command `{command}` {status}")]
    Pipe {
        /// The file.
        path: PathBuf,
        /// The command.
        command: String,
        /// How it ended.
        status: String,
    },
    /// A file could not be read.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// A listed file is no longer a regular file (replaced by a named pipe, say, after the
    /// files were listed): its message names the path and what it is.
    #[error("{0}")]
    NotAFile(String),
    /// Asked to leave out more samples than the files hold (a rejoining trainer's recorded
    /// position is beyond its data).
    #[error(
        "the recorded position is {asked} samples into this pass, but its files hold only {held}: \
         the record is of other data (or the files changed since)"
    )]
    ShortOfSkip {
        /// Samples to leave out.
        asked: u64,
        /// Samples the files held.
        held: u64,
    },
    /// Shuffling would hold more lines than the memory allowed to it.
    #[error(transparent)]
    Shuffle(#[from] ShuffleError),
    /// The reader thread stopped on a bug while reading a file: the data did not end there.
    #[error("{path}: reading stopped on an internal error ({reason}); the data did not end here (please report it)")]
    Crashed {
        /// The file being read.
        path: PathBuf,
        /// The panic's message.
        reason: String,
    },
}

/// How a reader batches and what it does with bad lines.
#[derive(Clone, Debug)]
pub struct ReaderConfig {
    /// Samples per batch (the last batch of a pass may be smaller).
    pub batch_size: usize,
    /// Skip and count bad lines instead of failing.
    pub skip_bad_lines: bool,
    /// Batches parsed ahead of the trainer.
    pub prefetch: usize,
    /// The data layout: line format and batch shape (the reader thread builds its parser).
    pub schema: Arc<Schema>,
    /// A shell command each file is piped through (the schema's, unless overridden).
    pub pipe_command: Option<String>,
    /// Longest the `pipe_command` may print nothing before it is killed and named.
    pub pipe_timeout: std::time::Duration,
    /// Samples to leave out at the start (a restarted trainer's already trained ones): the
    /// batch they end in is cut, the batches after it keep their places.
    pub skip: u64,
    /// Give the lines in a seeded random order ([`crate::data::read::shuffle`]) instead of the files'.
    pub shuffle: Option<ShuffleConfig>,
}

impl ReaderConfig {
    /// Criteo TSV lines in batches of `batch_size`.
    pub fn criteo(batch_size: usize) -> ReaderConfig {
        ReaderConfig::new(&Schema::criteo(), batch_size)
    }

    /// Batches of `batch_size` samples read as `schema` says.
    pub fn new(schema: &Schema, batch_size: usize) -> ReaderConfig {
        ReaderConfig {
            batch_size,
            skip_bad_lines: false,
            prefetch: 8,
            schema: Arc::new(schema.clone()),
            pipe_command: schema.pipe_command.clone(),
            pipe_timeout: std::time::Duration::from_secs(schema.pipe_timeout),
            skip: 0,
            shuffle: None,
        }
    }
}

/// Live counters of a reader, readable from any thread.
#[derive(Debug, Default)]
pub struct ReadProgress {
    /// Bytes consumed so far.
    pub bytes: AtomicU64,
    /// Samples parsed.
    pub samples: AtomicU64,
    /// Lines skipped as bad.
    pub bad_lines: AtomicU64,
}

/// Batches of a list of files, parsed on a background thread.
pub struct Reader {
    rx: Receiver<Result<Batch, DataError>>,
    progress: Arc<ReadProgress>,
}

impl Reader {
    /// Starts reading `files` in order.
    pub fn spawn(files: Vec<PathBuf>, config: ReaderConfig) -> Reader {
        let (tx, rx) = sync_channel(config.prefetch.max(1));
        let progress = Arc::new(ReadProgress::default());
        let p = progress.clone();
        std::thread::Builder::new()
            .name("oar-reader".into())
            .spawn(move || {
                if let Some(s) = &config.shuffle {
                    let window = crate::data::read::shuffle::window_text(s.window);
                    tracing::info!(
                        files = files.len(),
                        "shuffling: holding {window} of this pass in memory before training on them"
                    );
                }
                let crashed = tx.clone();
                let mut at = PathBuf::new();
                // A panic must not read as the end of the data (the channel closing): a job
                // then ended with part of its data, or none, and exit status 0.
                let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    let mut sink = Sink {
                        config: &config,
                        files: &files,
                        parser: crate::data::parser(&config.schema),
                        progress: &p,
                        batch: config.schema.new_batch(),
                        out: Out { tx, skip: config.skip, gone: false },
                        shuffler: config.shuffle.map(Shuffler::new),
                    };
                    let read = (0..files.len())
                        .try_for_each(|i| {
                            at.clone_from(&files[i]);
                            read_file(i, &mut sink)
                        })
                        .and_then(|()| sink.finish());
                    if let Err(e) = read {
                        let _ = sink.out.tx.send(Err(e));
                    }
                }));
                if let Err(panic) = read {
                    let reason = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "a panic".into());
                    let _ = crashed.send(Err(DataError::Crashed { path: at, reason }));
                }
            })
            .expect("spawning a thread only fails when the OS is out of resources");
        Reader { rx, progress }
    }

    /// The reader's live counters.
    pub fn progress(&self) -> Arc<ReadProgress> {
        self.progress.clone()
    }
}

impl Iterator for Reader {
    type Item = Result<Batch, DataError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.rx.recv().ok()
    }
}

/// Reads file `i` of the sink's list into it (nothing once the consumer is gone).
fn read_file(i: usize, sink: &mut Sink) -> Result<(), DataError> {
    if sink.out.gone {
        return Ok(());
    }
    let (path, config) = (&sink.files[i], sink.config);
    let io = |cause| DataError::Io { path: path.to_path_buf(), cause };
    // Checked again as it is opened: files are listed long before they are read (an online
    // day hours before), and a named pipe put in a file's place was waited on for good.
    let file = crate::data::read::files::open_regular(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::InvalidInput => DataError::NotAFile(e.to_string()),
        _ => io(e),
    })?;
    let Some(command) = &config.pipe_command else {
        return read_lines(i, std::io::BufReader::with_capacity(1 << 20, file), sink);
    };
    let (mut pipe, mut output) =
        crate::data::read::pipe::Pipe::spawn(command, file, config.pipe_timeout).map_err(io)?;
    let mut lines = std::io::BufReader::with_capacity(1 << 20, &mut output);
    let read = read_lines(i, &mut lines, sink);
    drop(lines);
    if read.is_err() || sink.out.gone {
        pipe.kill();
    }
    let status = pipe.finish(config.pipe_timeout).map_err(io)?;
    let pipe_error = |status| DataError::Pipe { path: path.to_path_buf(), command: command.clone(), status };
    if output.timed_out {
        return Err(pipe_error(crate::data::read::pipe::silence_message(config.pipe_timeout)));
    }
    read?;
    if sink.out.gone {
        return Ok(());
    }
    status.map_err(pipe_error)
}

/// Longest line a reader keeps (64 MiB): far above any real sample (a Criteo line is about 200
/// bytes, a PaddleRec history a few KiB), and the bound on what a file without line breaks, or a
/// `pipe_command` that never prints one, can make a trainer hold.
pub const MAX_LINE_BYTES: u64 = 64 << 20;

/// Reads the rest of a line (through its `\n`, or to the end) without keeping it; returns the
/// bytes read.
fn skip_rest_of_line(r: &mut impl BufRead) -> std::io::Result<u64> {
    let mut skipped = 0u64;
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(skipped);
        }
        let (n, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        r.consume(n);
        skipped += n as u64;
        if done {
            return Ok(skipped);
        }
    }
}

fn read_lines(i: usize, mut r: impl BufRead, sink: &mut Sink) -> Result<(), DataError> {
    let io = |cause| DataError::Io { path: sink.files[i].to_path_buf(), cause };
    let mut line = Vec::with_capacity(512);
    let mut number = 0u64;
    loop {
        line.clear();
        let n = r.by_ref().take(MAX_LINE_BYTES + 1).read_until(b'\n', &mut line).map_err(io)?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        let going = if n as u64 > MAX_LINE_BYTES && line.last() != Some(&b'\n') {
            let rest = skip_rest_of_line(&mut r).map_err(io)?;
            sink.progress.bytes.fetch_add(n as u64 + rest, Relaxed);
            sink.outcome(i, number, Err(format!("the line is longer than {} MiB", MAX_LINE_BYTES >> 20)))?
        } else {
            let text = line.strip_suffix(b"\n").unwrap_or(&line);
            if text.is_empty() {
                sink.progress.bytes.fetch_add(n as u64, Relaxed);
                continue;
            }
            sink.take(i, number, n as u64, text)?
        };
        if !going {
            // The consumer is gone: stop reading.
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_line_longer_than_the_bound_is_named_or_skipped_without_being_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let mut f = std::io::BufWriter::new(std::fs::File::create(&a).unwrap());
        write!(f, "1\t1\n0\t").unwrap();
        f.write_all(&vec![b'7'; MAX_LINE_BYTES as usize + 10]).unwrap();
        write!(f, "\n1\t3\n0\t4\n").unwrap();
        drop(f);
        let batches: Vec<_> = Reader::spawn(vec![a.clone()], ReaderConfig::criteo(2)).collect();
        let err = batches.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:2: the line is longer than 64 MiB", a.display())), "{err}");

        let reader = Reader::spawn(vec![a], ReaderConfig { skip_bad_lines: true, ..ReaderConfig::criteo(2) });
        let progress = reader.progress();
        let sizes: Vec<usize> = reader.map(|b| b.unwrap().len()).collect();
        assert_eq!(sizes, [2, 1], "the lines after the long one are read");
        assert_eq!(progress.bad_lines.load(Relaxed), 1);
        // A line of exactly the bound, its break after it, is kept.
        let mut r = std::io::Cursor::new([vec![b'x'; 10], b"\nnext".to_vec()].concat());
        assert_eq!(skip_rest_of_line(&mut r).unwrap(), 11);
        assert_eq!(r.position(), 11);
    }

    /// A panic on the reader thread is an error naming the file, not the end of the data: a
    /// job took it for the end and finished with part of its data, or none, and status 0.
    #[test]
    fn a_reader_that_stops_on_a_bug_is_an_error_not_the_end_of_the_data() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, "1\t1\n0\t2\n").unwrap();
        let mut schema = Schema::criteo();
        // Scaling of no values over 13: the parser's scaling panics (dividing rows by 0).
        schema.dense_affine = Some(crate::data::read::transform::Affine { shift: vec![], scale: vec![] });
        let got: Vec<_> = Reader::spawn(vec![a.clone()], ReaderConfig::new(&schema, 1)).collect();
        let err = got.last().expect("an error, not silence").as_ref().unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: reading stopped on an internal error", a.display())), "{err}");
        assert!(err.contains("the data did not end here"), "{err}");
    }

    /// A label outside what its head's loss takes, or a line of too many ids, is named by file
    /// and line, or skipped and counted, and leaves nothing of itself in the batch.
    #[test]
    fn labels_out_of_bounds_and_lines_of_too_many_ids_are_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let many = vec!["s:7"; MAX_LINE_IDS + 1].join(" ");
        std::fs::write(
            &a,
            format!("click:1 s:1\nclick:2 s:2\n{}\nclick:0 {many}\nclick:-1 s:4\nclick:0 s:5\n", "click:1 s:3"),
        )
        .unwrap();
        let data = crate::data::DataConfig {
            format: crate::data::Format::Slots,
            slots: Some(vec!["s".into()]),
            ..Default::default()
        };
        let mut schema = Schema::resolve(&data, None).unwrap();
        schema.label_bounds = vec![crate::data::LabelBound::Probability];
        let config = ReaderConfig::new(&schema, 8);
        let got: Vec<_> = Reader::spawn(vec![a.clone()], config.clone()).collect();
        let err = got.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}:2: label \"click\" is 2.0: a log-loss label is 0 to 1", a.display())),
            "{err}"
        );
        let reader = Reader::spawn(vec![a], ReaderConfig { skip_bad_lines: true, ..config });
        let progress = reader.progress();
        let batches: Vec<Batch> = reader.map(|b| b.unwrap()).collect();
        assert_eq!(progress.bad_lines.load(Relaxed), 3);
        assert_eq!((batches.len(), &batches[0].labels[..]), (1, &[1.0, 1.0, 0.0][..]));
        assert_eq!(batches[0].ids.len(), 3, "nothing of the bad lines is left");
    }

    /// Leaving out more samples than the files hold is an error, not an empty pass.
    #[test]
    fn skipping_past_the_end_of_the_data_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, "1\t1\n0\t2\n1\t3\n").unwrap();
        let got: Vec<_> = Reader::spawn(vec![a.clone()], ReaderConfig { skip: 2, ..ReaderConfig::criteo(2) }).collect();
        assert_eq!(got.len(), 1, "the sample after the two left out");
        assert_eq!(got[0].as_ref().unwrap().len(), 1);
        let got: Vec<_> = Reader::spawn(vec![a], ReaderConfig { skip: 1 << 40, ..ReaderConfig::criteo(2) }).collect();
        let err = got.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(err.contains("1099511627776 samples into this pass, but its files hold only 3"), "{err}");
    }

    /// A file that became a named pipe after it was listed is named, not waited on.
    #[test]
    fn a_listed_file_replaced_by_a_named_pipe_is_named_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, "1\t1\n").unwrap();
        let made = std::process::Command::new("mkfifo").arg(&b).status().unwrap();
        assert!(made.success());
        let got: Vec<_> = Reader::spawn(vec![a, b.clone()], ReaderConfig::criteo(4)).collect();
        let err = got.last().unwrap().as_ref().unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: a named pipe, not a regular file", b.display())), "{err}");
    }

    #[test]
    fn batches_span_files_and_bad_lines_are_named_or_counted() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, "1\t1\n0\t2\n1\t3\n").unwrap();
        let mut f = std::fs::File::create(&b).unwrap();
        write!(f, "0\t4\nbad\n1\t5").unwrap();

        let batches: Vec<_> = Reader::spawn(vec![a.clone(), b.clone()], ReaderConfig::criteo(2)).collect();
        assert_eq!(batches.len(), 3);
        assert_eq!(batches[0].as_ref().unwrap().len(), 2);
        assert_eq!(batches[1].as_ref().unwrap().len(), 2);
        let err = batches[2].as_ref().unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}:2: label", b.display())), "{err}");

        let reader = Reader::spawn(vec![a, b], ReaderConfig { skip_bad_lines: true, ..ReaderConfig::criteo(2) });
        let progress = reader.progress();
        let sizes: Vec<usize> = reader.map(|b| b.unwrap().len()).collect();
        assert_eq!(sizes, [2, 2, 1]);
        assert_eq!(progress.bad_lines.load(Relaxed), 1);
    }

    #[test]
    fn skipped_samples_cut_their_batch_and_later_batches_keep_their_places() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, (1..=7).map(|k| format!("{}\t{k}\n", k % 2)).collect::<String>()).unwrap();
        let labels = |skip| -> Vec<Vec<f32>> {
            let reader = Reader::spawn(vec![a.clone()], ReaderConfig { skip, ..ReaderConfig::criteo(3) });
            reader.map(|b| b.unwrap().labels).collect()
        };
        assert_eq!(labels(0), [vec![1.0, 0.0, 1.0], vec![0.0, 1.0, 0.0], vec![1.0]]);
        assert_eq!(labels(4), [vec![1.0, 0.0], vec![1.0]]);
        assert_eq!(labels(6), [vec![1.0]]);
        assert!(labels(7).is_empty(), "every sample left out: nothing, and no error");
        let beyond: Vec<_> =
            Reader::spawn(vec![a.clone()], ReaderConfig { skip: 9, ..ReaderConfig::criteo(3) }).collect();
        assert!(beyond[0].is_err(), "more left out than the files hold");
    }

    #[test]
    fn multi_hot_batches_split_at_batch_boundaries_across_files() {
        let dir = tempfile::tempdir().unwrap();
        let lines = [
            "click:1 d:0.5 a:1 b:2 b:3",
            "click:0 a:4 b:5:0.5",
            "click:1 a:6",
            "click:0 d:1 b:7 b:8 b:9 a:10",
            "click:1 a:11 b:12",
        ];
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        std::fs::write(&a, lines[..3].join("\n")).unwrap();
        std::fs::write(&b, lines[3..].join("\n") + "\n").unwrap();
        let data = crate::data::DataConfig {
            format: crate::data::Format::Slots,
            dense: Some(vec![crate::data::DenseColumn { name: "d".into(), width: 1 }]),
            slots: Some(vec!["a".into(), "b".into()]),
            hash_slots: Some(false),
            ..Default::default()
        };
        let schema = Schema::resolve(&data, None).unwrap();
        let batches: Vec<Batch> =
            Reader::spawn(vec![a, b], ReaderConfig::new(&schema, 2)).map(|b| b.unwrap()).collect();
        assert_eq!(batches.iter().map(Batch::len).collect::<Vec<_>>(), [2, 2, 1]);
        assert_eq!(batches[0].ids, [1, 2, 3, 4, 5]);
        assert_eq!(batches[0].offsets, [0, 1, 3, 4, 5]);
        assert_eq!(batches[0].weights, [1.0, 1.0, 1.0, 1.0, 0.5]);
        assert_eq!(batches[1].ids, [6, 10, 7, 8, 9]);
        assert_eq!(batches[1].offsets, [0, 1, 1, 2, 5], "each batch's offsets start at 0");
        assert!(batches[1].weights.is_empty(), "a batch without weighted ids has no weights");
        assert!(batches[2].offsets.is_empty(), "a batch of one id per bag stays one-hot");
        assert_eq!((batches[2].labels.clone(), batches[2].dense.clone()), (vec![1.0], vec![0.0]));

        let mut all = schema.new_batch();
        let mut parser = crate::data::parser(&schema);
        for line in lines {
            parser.parse(line.as_bytes(), &mut all).unwrap();
        }
        let mut joined = schema.new_batch();
        for b in &batches {
            joined.extend(b);
        }
        assert_eq!(joined, all);
        let mid = all.slice(2..4);
        assert_eq!((mid.ids, mid.offsets), (batches[1].ids.clone(), batches[1].offsets.clone()));
    }

    #[test]
    fn pipe_command_output_is_read_and_its_failure_named() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, "# comment\n1\t1\n# another\n0\t2\n").unwrap();
        let piped = |cmd: &str| ReaderConfig { pipe_command: Some(cmd.into()), ..ReaderConfig::criteo(10) };
        let batches: Vec<_> = Reader::spawn(vec![a.clone()], piped("grep -v '^#'")).map(|b| b.unwrap()).collect();
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].labels, [1.0, 0.0]);

        let err = Reader::spawn(vec![a.clone()], piped("echo boom >&2; exit 3")).find_map(|b| b.err()).unwrap();
        let msg = err.to_string();
        assert!(msg.contains(&a.display().to_string()) && msg.contains("exit") && msg.contains("boom"), "{msg}");
    }
}
