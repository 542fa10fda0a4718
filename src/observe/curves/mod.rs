//! Training curves as a CSV file (`metrics.csv`, in the job's output folder, else the launcher's
//! logs folder): each trainer appends a [`Point`] every `metrics_every` steps (the loss and AUC of
//! its batches since the last point) and at the end of each pass (the pass's training figures,
//! the AUC over all trainers, the test set's, the next day's), so a long job can be watched and
//! plotted ([`plot`]) instead of read from logs. Hogwild workers (`threads` > 1 in async mode)
//! write only the pass points: each sees a share of the batches. `oar launch` draws `curves.png`
//! beside the file when the job ends and names it in its summary; `oar plot` draws any such file.
//! The same points can go to TensorBoard event files ([`tfevents`]).
//!
//! Several trainers append to one file ([`CurveLog`]): each point is one `write` of one line to
//! a file opened with `O_APPEND`, which Linux keeps whole on a local file system, so trainers need
//! no coordination; and a CSV opens anywhere (the `csv` crate writes and reads it). Reading
//! ([`read`], [`parse`]) checks every field and names the line of a malformed one, refuses a named
//! pipe before opening it, and lets a header line repeat (a file written by an older oar, whose
//! trainers could both find it empty and both write the header).

pub mod plot;
pub mod tfevents;

use std::io::Write;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// What a point measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The trainer's batches since its last point.
    Steps,
    /// The trainer's whole pass.
    Pass,
    /// The pass over every trainer's samples (Paddle's bucketed AUC; no loss).
    AllTrainers,
    /// The test files after the pass.
    Test,
    /// The day's model on the next day's first split (online training).
    NextDay,
}

/// One point of a curve: a line of `metrics.csv`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The trainer that wrote it.
    pub trainer: u32,
    /// The pass (numbered across days in online training).
    pub pass: u32,
    /// The trainer's steps so far.
    pub step: u64,
    /// Samples the trainer trained on so far in this run.
    pub samples: u64,
    /// Seconds since the trainer started.
    pub seconds: f64,
    /// What is measured.
    pub kind: Kind,
    /// Mean loss, when measured.
    pub loss: Option<f64>,
    /// AUC of the first head (log-loss models), when measured.
    pub auc: Option<f64>,
}

/// Errors reading a curves file, each naming the file (and the line).
#[derive(Debug, thiserror::Error)]
pub enum CurvesError {
    /// The file could not be opened or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not a point.
    #[error("{path}:{line}: not a curve point: {message}")]
    Line {
        /// The file.
        path: PathBuf,
        /// Its 1-based line number.
        line: u64,
        /// What was wrong.
        message: String,
    },
}

/// The header line of a curves file.
pub const HEADER: &str = "trainer,pass,step,samples,seconds,kind,loss,auc";

/// Where points go: a curves file they are appended to and, optionally, a TensorBoard event
/// file ([`tfevents`]).
pub struct CurveLog {
    file: Option<Mutex<std::fs::File>>,
    events: Option<Mutex<tfevents::EventFile>>,
    path: PathBuf,
}

impl CurveLog {
    /// Opens `path` for appending (created if absent, with its header line).
    pub fn open(path: &Path) -> std::io::Result<CurveLog> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        if let Err(e) = create_with_header(path) {
            // A file system without hard links, say: the header is then written below, as
            // before, by whichever trainer finds the file empty.
            tracing::debug!(file = %path.display(), "cannot create the curves file whole: {e}");
        }
        // Never a named pipe (whose opening would wait for its other end), nor through a link.
        let mut file = crate::base::state_file::append_plain(path).map_err(std::io::Error::other)?;
        if file.metadata()?.len() == 0 {
            // A file someone made empty, or one not created whole above.
            file.write_all(format!("{HEADER}\n").as_bytes())?;
        }
        Ok(CurveLog { file: Some(Mutex::new(file)), events: None, path: path.to_path_buf() })
    }

    /// Where trainer `trainer`'s points go: the curves file `csv`, TensorBoard event files under
    /// `tensorboard`, both, or neither (`None`). Errors name the file or folder.
    pub fn open_all(csv: Option<&Path>, tensorboard: Option<&Path>, trainer: u32) -> anyhow::Result<Option<CurveLog>> {
        use anyhow::Context;
        let mut log = match csv {
            Some(p) => CurveLog::open(p).with_context(|| format!("cannot open the curves file {}", p.display()))?,
            None => CurveLog { file: None, events: None, path: PathBuf::new() },
        };
        if let Some(dir) = tensorboard {
            let events = tfevents::EventFile::create(dir, trainer)
                .with_context(|| format!("cannot write TensorBoard events under {}", dir.display()))?;
            if csv.is_none() {
                log.path = events.path().to_path_buf();
            }
            log.events = Some(Mutex::new(events));
        }
        Ok((log.file.is_some() || log.events.is_some()).then_some(log))
    }

    /// Appends `point` as one line, and as scalars to the event file (a failure is logged, not
    /// fatal: training goes on).
    pub fn write(&self, point: &Point) {
        if let Some(file) = &self.file {
            let mut w = csv::WriterBuilder::new().has_headers(false).from_writer(Vec::new());
            let line = w.serialize(point).ok().and_then(|()| w.into_inner().ok());
            let result = match line {
                Some(line) => file.lock().write_all(&line),
                None => Err(std::io::Error::other("cannot format the point")),
            };
            if let Err(e) = result {
                tracing::warn!(file = %self.path.display(), "cannot append to the curves file: {e}");
            }
        }
        if let Some(events) = &self.events {
            let mut e = events.lock();
            if let Err(err) = e.write(point) {
                tracing::warn!(file = %e.path().display(), "cannot append to the TensorBoard events: {err}");
            }
        }
    }
}

/// Creates `path` holding only its header line, unless something is there already. The file
/// appears whole: the header is written under a private name, then linked to `path`, which
/// fails if another trainer got there first. (Checking for an empty file and then writing the
/// header let two trainers starting together both write it.)
fn create_with_header(path: &Path) -> std::io::Result<()> {
    if std::fs::symlink_metadata(path).is_ok() {
        return Ok(());
    }
    static OPENED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nth = OPENED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = path.file_name().map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    let private = path.with_file_name(format!(".{name}.{}.{nth}", std::process::id()));
    if let Err(e) = crate::base::state_file::write_new(&private, format!("{HEADER}\n").as_bytes(), 0o644) {
        let _ = std::fs::remove_file(&private); // a crashed writer's, of the same name
        return Err(std::io::Error::other(e));
    }
    let linked = std::fs::hard_link(&private, path);
    let _ = std::fs::remove_file(&private);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Most bytes of a curves file read (a point a line of about 80 bytes: millions of points).
pub const MAX_BYTES: u64 = 1 << 30;
/// Longest line of a curves file (oar writes under 100 bytes).
pub const MAX_LINE_BYTES: usize = 4096;
/// Most points drawn from one file (about 256 MiB of points).
pub const MAX_POINTS: usize = 4 << 20;

/// Reads every point of a curves file, a line at a time (the whole text held at once, with its
/// points and a copy of each line, took 7 times the file: a 1 GiB file aborted the process). A
/// last line without its newline is a point still being written by a running job, and is left
/// out.
pub fn read(path: &Path) -> Result<Vec<Point>, CurvesError> {
    let io = |source| CurvesError::Io { path: path.to_path_buf(), source };
    let (file, size) = crate::base::state_file::open_sized(path, false)
        .map_err(|e| io(std::io::Error::other(e.reason())))?
        .ok_or_else(|| io(std::io::ErrorKind::NotFound.into()))?;
    if size > MAX_BYTES {
        return Err(io(std::io::Error::other(format!(
            "{size} bytes, more than the {MAX_BYTES} a curves file may hold"
        ))));
    }
    parse(std::io::Read::take(file, MAX_BYTES), path)
}

/// Reads the points of curves text (`path` only names it in errors); a last line without its
/// newline is left out.
pub fn parse(text: impl std::io::Read, path: &Path) -> Result<Vec<Point>, CurvesError> {
    use std::io::{BufRead, Read};
    let mut r = std::io::BufReader::new(text);
    let mut points = Vec::new();
    let bad = |line: u64, message: String| CurvesError::Line { path: path.to_path_buf(), line, message };
    let mut line = Vec::new();
    for number in 1.. {
        line.clear();
        let n = r
            .by_ref()
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|source| CurvesError::Io { path: path.to_path_buf(), source })?;
        if line.last() != Some(&b'\n') {
            if n > MAX_LINE_BYTES {
                return Err(bad(number, format!("the line is longer than {MAX_LINE_BYTES} bytes")));
            }
            break; // the end, or a point still being written
        }
        let text = String::from_utf8_lossy(&line[..n - 1]);
        let fields: Vec<&str> = text.trim_end_matches('\r').split(',').collect();
        if fields.first() == Some(&"trainer") && fields.join(",") == HEADER {
            continue;
        }
        let point: Point = csv::StringRecord::from(fields).deserialize(None).map_err(|e| bad(number, e.to_string()))?;
        if point.loss.is_some_and(|v| !v.is_finite()) || point.auc.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            return Err(bad(number, "loss must be finite and AUC within [0, 1]".into()));
        }
        if points.len() == MAX_POINTS {
            return Err(bad(number, format!("more than {MAX_POINTS} points: draw part of the file")));
        }
        points.push(point);
    }
    Ok(points)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(trainer: u32, step: u64, kind: Kind) -> Point {
        Point { trainer, pass: 1, step, samples: step * 512, seconds: 0.5, kind, loss: Some(0.45), auc: Some(0.75) }
    }

    #[test]
    fn points_written_by_several_writers_read_back_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/metrics.csv");
        let (a, b) = (CurveLog::open(&path).unwrap(), CurveLog::open(&path).unwrap());
        a.write(&point(0, 50, Kind::Steps));
        b.write(&point(1, 50, Kind::Steps));
        let all = Point { loss: None, ..point(0, 90, Kind::AllTrainers) };
        a.write(&all);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(HEADER) && text.lines().count() == 4, "{text}");
        assert_eq!(read(&path).unwrap(), vec![point(0, 50, Kind::Steps), point(1, 50, Kind::Steps), all]);
    }

    #[test]
    fn writers_opening_a_new_file_together_write_one_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        let barrier = std::sync::Barrier::new(8);
        std::thread::scope(|s| {
            for t in 0..8 {
                let (path, barrier) = (&path, &barrier);
                s.spawn(move || {
                    barrier.wait();
                    CurveLog::open(path).unwrap().write(&point(t, 50, Kind::Steps));
                });
            }
        });
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().filter(|l| *l == HEADER).count(), 1, "{text}");
        assert!(text.starts_with(HEADER) && text.lines().count() == 9, "{text}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no private file is left behind");
    }

    #[test]
    fn a_repeated_header_is_skipped_and_a_bad_line_is_named() {
        let text = format!("{HEADER}\n{HEADER}\n0,1,50,25600,1.5,steps,0.45,0.75\n0,1,60,x,1.5,steps,,\n");
        let err = parse(text.as_bytes(), Path::new("m.csv")).unwrap_err().to_string();
        assert!(err.starts_with("m.csv:4: not a curve point"), "{err}");
        let text = format!("{HEADER}\n0,1,50,25600,1.5,pass,,0.75\n");
        let p = parse(text.as_bytes(), Path::new("m.csv")).unwrap();
        assert_eq!((p[0].kind, p[0].loss, p[0].auc), (Kind::Pass, None, Some(0.75)));
        for bad in ["0,1,50,1,1,steps,NaN,0.5", "0,1,50,1,1,steps,0.4,1.5", "0,1,50,1,1,epoch,0.4,0.5", "0,1"] {
            assert!(parse(format!("{bad}\n").as_bytes(), Path::new("m.csv")).is_err(), "{bad}");
        }
        // A line past the bound is named, not held: a 1 GiB line aborted the process.
        let long = format!("{HEADER}\n0,1,{}\n", "5".repeat(MAX_LINE_BYTES));
        let err = parse(long.as_bytes(), Path::new("m.csv")).unwrap_err().to_string();
        assert!(err.starts_with("m.csv:2: not a curve point: the line is longer than 4096 bytes"), "{err}");
    }

    #[test]
    fn a_line_still_being_written_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.csv");
        std::fs::write(&path, format!("{HEADER}\n0,1,50,25600,1.5,steps,0.45,0.75\n0,1,100,51")).unwrap();
        assert_eq!(read(&path).unwrap().len(), 1);
    }

    #[test]
    fn a_folder_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(CurveLog::open(dir.path()).is_err());
    }
}
