//! Base and delta saves for serving (Paddle's save modes 2 and 1): each server writes the rows it
//! keeps as safetensors, and the driver appends a line to a done-file that a serving system
//! follows.
//!
//! A server's file `server-<i>.safetensors` holds, per sparse table `T`, the tensors `T.ids`
//! (u64, `[n]`), `T.weights` (f32, `[n, dim]`: the weights a pull reads) and, in a delta,
//! `T.deleted` (u64, `[m]`: ids removed since the last save). Its metadata says `kind`
//! (`base` or `delta`), `server` and `num_servers`. A delta applied on its base (deletions
//! first, then the rows) gives the base saved at the same moment. The done-file has one line
//! per save: `day pass kind path unix_ms`, tab-separated.
//!
//! [`collect`] gathers the rows a save keeps (the caller holds updates off meanwhile) and
//! [`write()`] writes them without holding anything; [`read`] checks every length; [`ExportPlan`]
//! says which save is due (a base first, a delta every N passes, a base at a day's end); the
//! done-file is read and appended to as [`DoneLine`]s, each save announced once and durably.
//!
//! Why safetensors beside the checkpoints, not instead of them: a checkpoint keeps the optimizer
//! state and statistics so training can go on; a save for serving keeps only the weights a pull
//! reads, in a format other tools read (the `safetensors` crate), and a delta names the rows
//! removed since the last save, so applying the deltas on a base in order gives exactly the base
//! of that moment (tested with evictions and shrinks in between).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::protocol::{ExportKind, Exported};
use crate::table::{Shard, TableExport};

/// Errors of base and delta files; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A file could not be written or read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A state file (a save's file, the done-file) could not be written or read.
    #[error(transparent)]
    State(#[from] crate::base::state_file::StateFileError),
    /// A file is not a save oar wrote.
    #[error("{path}: not a base or delta save ({reason})")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// The file name of server `index`'s part of a save.
pub fn file_name(index: usize) -> String {
    format!("server-{index}.safetensors")
}

/// The rows of every table of `shard` a save of `kind` keeps (call with updates held off);
/// `None` for a delta of a shard that cannot name every id removed since its last save (see
/// [`Exported::base_needed`]): nothing is collected or reset then.
pub fn collect(shard: &Shard, kind: ExportKind) -> Option<Vec<TableExport>> {
    let delta = kind == ExportKind::Delta;
    if delta && !shard.sparse.iter().all(|t| t.can_delta()) {
        return None;
    }
    Some(shard.sparse.iter().map(|t| t.export(delta)).collect())
}

/// What a server answers for a delta it cannot write (see [`Exported::base_needed`]).
pub fn base_needed(shard: &Shard) -> Exported {
    Exported { file: file_name(shard.index), base_needed: true, ..Exported::default() }
}

/// Writes `tables` (from [`collect`]) as server `shard.index`'s file in `dir`, atomically.
pub fn write(shard: &Shard, kind: ExportKind, tables: &[TableExport], dir: &Path) -> Result<Exported, ExportError> {
    let path = dir.join(file_name(shard.index));
    let io = |source| ExportError::Io { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    let named: Vec<(&str, usize, &TableExport)> =
        shard.spec.sparse.iter().zip(tables).map(|(spec, t)| (spec.name.as_str(), spec.dim, t)).collect();
    let metadata = HashMap::from([
        ("kind".to_string(), kind.name().to_string()),
        ("server".to_string(), shard.index.to_string()),
        ("num_servers".to_string(), shard.num_servers.to_string()),
    ]);
    let bytes = encode_tables(&named, kind == ExportKind::Delta, metadata)
        .map_err(|reason| ExportError::Invalid { path: path.clone(), reason })?;
    crate::base::state_file::write_atomic(&path, &bytes)?;
    Ok(Exported {
        file: file_name(shard.index),
        bytes: bytes.len() as u64,
        rows: tables.iter().map(|t| t.ids.len() as u64).collect(),
        deleted: tables.iter().map(|t| t.deleted.len() as u64).collect(),
        base_needed: false,
    })
}

/// The safetensors bytes of `tables` (name, floats per row, rows): per table `T.ids`,
/// `T.weights` and, `with_deleted`, `T.deleted`; the one row format of saves and exports.
pub fn encode_tables(
    tables: &[(&str, usize, &TableExport)],
    with_deleted: bool,
    metadata: HashMap<String, String>,
) -> Result<Vec<u8>, String> {
    let mut views = Vec::new();
    for &(name, dim, t) in tables {
        let view = |dtype, shape, bytes| {
            safetensors::tensor::TensorView::new(dtype, shape, bytes).expect("shapes match the data")
        };
        let ids: &[u8] = bytemuck::cast_slice(&t.ids);
        views.push((format!("{name}.ids"), view(safetensors::Dtype::U64, vec![t.ids.len()], ids)));
        let weights: &[u8] = bytemuck::cast_slice(&t.weights);
        views.push((format!("{name}.weights"), view(safetensors::Dtype::F32, vec![t.ids.len(), dim], weights)));
        if with_deleted {
            let deleted: &[u8] = bytemuck::cast_slice(&t.deleted);
            views.push((format!("{name}.deleted"), view(safetensors::Dtype::U64, vec![t.deleted.len()], deleted)));
        }
    }
    safetensors::serialize(views, Some(metadata)).map_err(|e| e.to_string())
}

/// One server's file of a save, per table name: floats per row, and the rows.
pub type SavedTables = HashMap<String, (usize, TableExport)>;

/// Reads one server's file of a save: its kind and its tables (a reader for tools and tests;
/// every length is checked against the others).
pub fn read(path: &Path) -> Result<(ExportKind, SavedTables), ExportError> {
    let invalid = |reason: String| ExportError::Invalid { path: path.to_path_buf(), reason };
    let bytes = std::fs::read(path).map_err(|source| ExportError::Io { path: path.to_path_buf(), source })?;
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).map_err(|e| invalid(e.to_string()))?;
    let named = meta.metadata().as_ref().and_then(|m| m.get("kind")).map(String::as_str);
    let kind = named.and_then(ExportKind::from_name).ok_or_else(|| invalid(format!("kind {named:?}")))?;
    let file = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| invalid(e.to_string()))?;
    let mut tables = SavedTables::new();
    for (name, view) in file.tensors() {
        let (table, part) = name.rsplit_once('.').ok_or_else(|| invalid(format!("tensor {name:?}")))?;
        let entry = tables.entry(table.to_string()).or_default();
        match (part, view.dtype()) {
            ("ids", safetensors::Dtype::U64) => entry.1.ids = bytemuck::pod_collect_to_vec(view.data()),
            ("deleted", safetensors::Dtype::U64) => entry.1.deleted = bytemuck::pod_collect_to_vec(view.data()),
            ("weights", safetensors::Dtype::F32) if view.shape().len() == 2 => {
                entry.0 = view.shape()[1];
                entry.1.weights = bytemuck::pod_collect_to_vec(view.data());
            }
            _ => return Err(invalid(format!("tensor {name:?} of {:?}", view.dtype()))),
        }
    }
    if let Some((name, _)) = tables.iter().find(|(_, (dim, t))| t.ids.len() * dim != t.weights.len()) {
        return Err(invalid(format!("table {name}: ids and weights differ in length")));
    }
    Ok((kind, tables))
}

/// When a job saves for serving: a delta every `delta_every` passes, a base at each day's end
/// (online training), and a base instead of the first delta of a run (a delta needs a base
/// saved by the same servers' run: a restored table has no log of what it removed).
#[derive(Clone, Debug, Default)]
pub struct ExportPlan {
    /// Passes between deltas.
    pub delta_every: Option<u32>,
    /// Whether this run saved a base yet.
    pub based: bool,
}

impl ExportPlan {
    /// The save due after pass `pass` (counted within the day), if any.
    pub fn due(&mut self, pass: u32, day_end: bool) -> Option<ExportKind> {
        let delta = self.delta_every.is_some_and(|n| pass.is_multiple_of(n));
        let kind = if day_end || (delta && !self.based) {
            ExportKind::Base
        } else if delta {
            ExportKind::Delta
        } else {
            return None;
        };
        self.based |= kind == ExportKind::Base;
        Some(kind)
    }
}

/// A save's own description, `export.json` in its folder: what a serving system loads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExportManifest {
    /// Base or delta.
    pub kind: ExportKind,
    /// Day of online training (0 outside it).
    pub day: u32,
    /// Pass after which it was saved.
    pub pass: u32,
    /// The tables: name and floats per row.
    pub tables: Vec<(String, usize)>,
    /// Each server's file, by server index.
    pub files: Vec<Exported>,
}

/// One line of the done-file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DoneLine {
    /// Day of online training (0 outside it).
    pub day: u32,
    /// Pass (within the day in online training).
    pub pass: u32,
    /// Base or delta.
    pub kind: ExportKind,
    /// The save's folder.
    pub path: PathBuf,
    /// When it was complete, in milliseconds since the Unix epoch.
    pub unix_ms: u64,
}

impl DoneLine {
    fn render(&self) -> String {
        format!("{}\t{}\t{}\t{}\t{}\n", self.day, self.pass, self.kind.name(), self.path.display(), self.unix_ms)
    }

    /// Parses one line; None for one oar did not write.
    pub fn parse(line: &str) -> Option<DoneLine> {
        let mut f = line.split('\t');
        let day = f.next()?.parse().ok()?;
        let pass = f.next()?.parse().ok()?;
        let kind = ExportKind::from_name(f.next()?)?;
        let path = PathBuf::from(f.next()?);
        let unix_ms = f.next()?.parse().ok()?;
        f.next().is_none().then_some(DoneLine { day, pass, kind, path, unix_ms })
    }
}

/// Largest done-file read: 64 MiB, some 800,000 saves (a delta every 5 minutes for 7 years).
const MAX_DONE_BYTES: u64 = 64 << 20;

/// The done-file's lines (none if there is no file). A last line without its line break (a
/// write cut short) is refused: it still parsed when only its time was cut, and the next line
/// was appended onto it.
pub fn done_lines(done: &Path) -> Result<Vec<DoneLine>, ExportError> {
    let Some(bytes) = crate::base::state_file::read(done, MAX_DONE_BYTES)? else { return Ok(Vec::new()) };
    let invalid = |reason: String| ExportError::Invalid { path: done.to_path_buf(), reason };
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().collect();
    if !bytes.is_empty() && !bytes.ends_with(b"\n") {
        return Err(invalid(format!(
            "line {} {} has no line break at its end: a write was cut short; finish or remove it",
            lines.len(),
            excerpt(lines.last().unwrap_or(&""))
        )));
    }
    let parse = |(n, l): (usize, &&str)| {
        DoneLine::parse(l).ok_or_else(|| invalid(format!("line {} {} is not one oar writes", n + 1, excerpt(l))))
    };
    lines.iter().enumerate().map(parse).collect()
}

/// A line for a message: quoted, cut to 80 characters.
fn excerpt(line: &str) -> String {
    let cut: String = line.chars().take(80).collect();
    let more = if cut.len() < line.len() { format!("... ({} bytes)", line.len()) } else { String::new() };
    format!("{cut:?}{more}")
}

/// Appends `line` to the done-file, durably, unless a line of the same day, pass and kind is
/// there already (a pass redone after a crash saves again but is announced once).
pub fn append_done(done: &Path, line: &DoneLine) -> Result<(), ExportError> {
    let io = |source| ExportError::Io { path: done.to_path_buf(), source };
    if line.path.to_string_lossy().contains(['\t', '\n', '\r']) {
        let e = std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{:?}: a tab or a line break in a save's path", line.path),
        );
        return Err(io(e));
    }
    if done_lines(done)?.iter().any(|l| (l.day, l.pass, l.kind) == (line.day, line.pass, line.kind)) {
        return Ok(());
    }
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(done)
        .map_err(io)?;
    f.write_all(line.render().as_bytes()).and_then(|_| f.sync_all()).map_err(io)
}

#[cfg(test)]
#[path = "export_replay_tests.rs"]
mod replay_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::{DenseSpec, Init, Optimizer, SparseSpec, TableSpec};

    #[test]
    fn a_servers_file_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let spec = TableSpec {
            dense: DenseSpec { params: vec![], block_size: 8, seed: 1, optimizer: Optimizer::sgd(0.1) },
            sparse: vec![SparseSpec::new("emb", 2, 1, Init::Uniform { scale: 0.1 }, Optimizer::sgd(0.1))],
        };
        let shard = Shard::new(spec, 1, 2);
        let t = TableExport { ids: vec![5, u64::MAX], weights: vec![1.0, 2.0, 3.0, 4.0], deleted: vec![9] };
        let e = write(&shard, ExportKind::Delta, std::slice::from_ref(&t), dir.path()).unwrap();
        assert_eq!(
            (e.file.as_str(), e.rows.as_slice(), e.deleted.as_slice()),
            ("server-1.safetensors", &[2][..], &[1][..])
        );
        let (kind, tables) = read(&dir.path().join(&e.file)).unwrap();
        assert_eq!(kind, ExportKind::Delta);
        assert_eq!(tables["emb"], (2, t));
        std::fs::write(dir.path().join("junk"), b"not a save").unwrap();
        assert!(read(&dir.path().join("junk")).unwrap_err().to_string().contains("not a base or delta save"));
    }

    #[test]
    fn a_run_saves_a_base_first_then_deltas_and_a_base_at_each_days_end() {
        let mut plan = ExportPlan { delta_every: Some(2), based: false };
        let due: Vec<_> = (1..=6).map(|p| plan.due(p, p == 6)).collect();
        use ExportKind::*;
        assert_eq!(due, [None, Some(Base), None, Some(Delta), None, Some(Base)]);
        assert_eq!(ExportPlan::default().due(4, false), None);
    }

    #[test]
    fn the_done_file_announces_each_save_once() {
        let dir = tempfile::tempdir().unwrap();
        let done = dir.path().join("donefile.txt");
        let line = DoneLine { day: 3, pass: 2, kind: ExportKind::Delta, path: "/x/delta".into(), unix_ms: 7 };
        append_done(&done, &line).unwrap();
        append_done(&done, &DoneLine { unix_ms: 9, ..line.clone() }).unwrap();
        append_done(&done, &DoneLine { kind: ExportKind::Base, ..line.clone() }).unwrap();
        let lines = done_lines(&done).unwrap();
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], line);
        assert_eq!(std::fs::read_to_string(&done).unwrap().lines().next(), Some("3\t2\tdelta\t/x/delta\t7"));
        // A path that would break the file's lines is refused, the file untouched.
        let forged = DoneLine { pass: 3, path: "/x/d\n4\t1\tbase\t/evil\t1".into(), ..line };
        assert!(append_done(&done, &forged).unwrap_err().to_string().contains("a tab or a line break"));
        assert_eq!(done_lines(&done).unwrap().len(), 2);
        // Torn (its time cut short, no line break), then a line oar does not write.
        let whole = std::fs::read(&done).unwrap();
        std::fs::write(&done, &whole[..whole.len() - 3]).unwrap();
        let e = done_lines(&done).unwrap_err().to_string();
        assert!(e.contains("line 2 ") && e.contains("no line break"), "{e}");
        assert!(append_done(&done, &DoneLine { pass: 9, ..line.clone() }).is_err(), "nothing appended onto it");
        std::fs::write(&done, format!("{}\n", "x".repeat(1000))).unwrap();
        let e = done_lines(&done).unwrap_err().to_string();
        assert!(e.contains("line 1 ") && e.contains("(1000 bytes)") && e.len() < 300, "{e}");
    }
}
