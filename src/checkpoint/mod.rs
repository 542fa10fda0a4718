//! Checkpoints: one shard file per server plus a manifest, written atomically.
//!
//! Layout of a saved model directory (`--output DIR`):
//! ```text
//! DIR/latest                  name of the newest complete pass directory
//! DIR/pass-0001/manifest.json model config, pass, layout, and every shard's size and CRC-32
//! DIR/pass-0001/server-0.shard
//! DIR/pass-0001/server-1.shard
//! ```
//! A shard file is `b"OARSHRD1"`, a length-prefixed JSON header (spec, server index, number of
//! servers, row counts), the dense blocks (weights then optimizer state, block by block), every
//! sparse table's ids then rows, every sparse table's admission state (format 3: per stripe, the
//! draws made for `probability_entry` and the count filter's cells; format 4 adds each cell's
//! days since its id was last seen), and a trailing CRC-32 of
//! all preceding bytes. Every file is written to `NAME.tmp`, synced, then renamed, and the
//! manifest is written last: a directory with a manifest is complete, and a crash never leaves
//! a half-written file under a real name.

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::table::{Shard, TableSpec};

const SHARD_MAGIC: &[u8; 8] = b"OARSHRD1";
/// Version of the checkpoint format (2: sparse rows carry their statistics; 3: the admission
/// state follows the rows, so a restarted server remembers the sightings of ids not admitted
/// yet; 4: the count filter's cells carry the days since their id was last seen, so a restarted
/// server forgets pending sightings on the same day as an uninterrupted one).
pub const FORMAT_VERSION: u32 = 4;
/// The oldest format this build reads: format 1's sparse rows have no statistics, which read as
/// nothing seen yet.
pub const OLDEST_FORMAT: u32 = 1;
/// Largest manifest read (64 MiB): a manifest lists one small entry per server (at most 65,536),
/// so a larger file is not one oar wrote.
const MAX_MANIFEST_BYTES: u64 = 64 << 20;

/// Floats per stored sparse row of `t` in checkpoint format `format`.
fn stored_row_len(t: &crate::table::SparseSpec, format: u32) -> usize {
    if format == 1 {
        t.row_len() - crate::table::accessor::STATS
    } else {
        t.row_len()
    }
}

/// Errors reading or writing checkpoints; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// A file could not be read or written.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        cause: std::io::Error,
    },
    /// A file's content is damaged or not a checkpoint.
    #[error("{path}: corrupt checkpoint: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint does not fit the job that loads it.
    #[error("{path}: checkpoint does not match this job: {reason}")]
    Mismatch {
        /// The file.
        path: PathBuf,
        /// What differs.
        reason: String,
    },
    /// A small state file beside the checkpoints could not be read or written.
    #[error(transparent)]
    State(#[from] crate::state_file::StateFileError),
    /// A newer epoch of this server has claimed its checkpoint folder: this process was replaced.
    #[error("this server (epoch {epoch}) has been replaced by epoch {newer}, which now owns its checkpoints")]
    Superseded {
        /// This process's epoch.
        epoch: u64,
        /// The newer one.
        newer: u64,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> CheckpointError + '_ {
    move |cause| CheckpointError::Io { path: path.to_path_buf(), cause }
}

/// The file name of server `index`'s shard.
pub fn shard_file_name(index: usize) -> String {
    format!("server-{index}.shard")
}

/// The directory name of pass `pass` (1-based).
pub fn pass_dir_name(pass: u32) -> String {
    format!("pass-{pass:04}")
}

#[derive(Serialize, Deserialize)]
struct ShardHeader {
    format: u32,
    server_index: usize,
    num_servers: usize,
    spec: TableSpec,
    dense_blocks: usize,
    sparse_rows: Vec<usize>,
}

impl ShardHeader {
    /// The bytes of values a shard file with this header holds after it, or why no valid file
    /// has this header (a bad spec, a place outside the job, sizes beyond any model's).
    fn payload_bytes(&self) -> Result<u64, String> {
        let spec = &self.spec;
        spec.validate()?;
        if self.num_servers == 0 || self.server_index >= self.num_servers {
            return Err(format!("server {} of {}", self.server_index, self.num_servers));
        }
        if spec.sparse.len() > crate::table::MAX_TABLES || spec.sparse.iter().any(|t| t.dim > crate::table::MAX_DIM) {
            return Err("more or wider sparse tables than any server holds".into());
        }
        if self.sparse_rows.len() != spec.sparse.len() {
            return Err("sparse table count does not match the spec".into());
        }
        if crate::table::empty_sparse_bytes(spec) > crate::table::MAX_EMPTY_TABLE_BYTES {
            return Err("its empty tables alone would take more memory than any server's budget".into());
        }
        let too_big = || "sizes beyond any model".to_string();
        let total =
            spec.dense.params.iter().try_fold(0u64, |sum, p| sum.checked_add(p.len as u64)).ok_or_else(too_big)?;
        // This server's floats, counted without walking its blocks (a hostile block size of 1
        // would make that walk endless): every owned block is whole but perhaps the last one.
        let (bs, n, index) = (spec.dense.block_size as u64, self.num_servers as u64, self.server_index as u64);
        let blocks = total.div_ceil(bs);
        let owned = if index < blocks { (blocks - 1 - index) / n + 1 } else { 0 };
        let mut floats = owned.checked_mul(bs).ok_or_else(too_big)?;
        if blocks > 0 && (blocks - 1) % n == index {
            floats -= blocks * bs - total;
        }
        if owned != self.dense_blocks as u64 {
            return Err("dense block count does not match the spec".into());
        }
        // A block's optimizer state is `a` floats per weight plus `c` (Adam's step count).
        let (c, a) = (spec.dense.optimizer.state_len(0) as u64, spec.dense.optimizer.state_len(1) as u64);
        let a = a - c;
        let values = floats.checked_mul(1 + a).and_then(|v| v.checked_add(c * owned)).ok_or_else(too_big)?;
        let mut bytes = values.checked_mul(4).ok_or_else(too_big)?;
        for (t, &rows) in spec.sparse.iter().zip(&self.sparse_rows) {
            let row = stored_row_len(t, self.format) as u64;
            let table = (rows as u64).checked_mul(8 + 4 * row).ok_or_else(too_big)?;
            bytes = bytes.checked_add(table).ok_or_else(too_big)?;
        }
        if self.format >= 3 {
            for t in &spec.sparse {
                bytes = bytes.checked_add(admission_bytes(t, self.format)).ok_or_else(too_big)?;
            }
        }
        Ok(bytes)
    }
}

/// Bytes of a table's admission state in a shard file of `format`: per stripe the draws (8)
/// and the filter's cells (2 each, and from format 4 a byte of days each).
fn admission_bytes(t: &crate::table::SparseSpec, format: u32) -> u64 {
    let per_cell = if format >= 4 { 3 } else { 2 };
    crate::layout::STRIPES as u64 * (8 + per_cell * t.filter_cells_per_stripe() as u64)
}

/// A writer that keeps the CRC-32 of everything written.
struct CrcWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: u64,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// A copy of a shard taken under short locks (the dense blocks under the dense lock, each table
/// stripe under its own lock, one after another), to be written without holding any: training
/// goes on while it is written. A server takes it while no update is being applied (its update
/// gate, see `server::State::cut`), so a checkpoint holds whole updates, sync or async.
pub struct ShardSnapshot {
    header: ShardHeader,
    /// Per owned block: weights (shared until the next update copies them) and optimizer state.
    dense: Vec<(std::sync::Arc<[f32]>, Vec<f32>)>,
    /// Per table: ids and their full rows `[weights | state]`.
    sparse: Vec<(Vec<u64>, Vec<f32>)>,
    /// Per table, per stripe: the admission state.
    admission: Vec<Vec<crate::table::admit::AdmissionState>>,
}

impl ShardSnapshot {
    /// Copies `shard`.
    pub fn take(shard: &Shard) -> ShardSnapshot {
        let dense: Vec<_> = shard.dense.lock().blocks.iter().map(|b| (b.weights.clone(), b.state.clone())).collect();
        let sparse: Vec<(Vec<u64>, Vec<f32>)> = shard
            .sparse
            .iter()
            .map(|t| {
                let (mut ids, mut data) = (Vec::new(), Vec::new());
                t.for_each_row(|id, row| {
                    ids.push(id);
                    data.extend_from_slice(row);
                });
                (ids, data)
            })
            .collect();
        let admission = shard.sparse.iter().map(|t| t.admission()).collect();
        let header = ShardHeader {
            format: FORMAT_VERSION,
            server_index: shard.index,
            num_servers: shard.num_servers,
            spec: shard.spec.clone(),
            dense_blocks: dense.len(),
            sparse_rows: sparse.iter().map(|(ids, _)| ids.len()).collect(),
        };
        ShardSnapshot { header, dense, sparse, admission }
    }
}

/// Writes `shard` to `dir/server-{index}.shard` atomically; returns (file name, bytes, CRC-32).
pub fn write_shard(shard: &Shard, dir: &Path) -> Result<(String, u64, u32), CheckpointError> {
    write_snapshot(&ShardSnapshot::take(shard), dir)
}

/// Writes a snapshot to `dir/server-{index}.shard` atomically (a temporary file, synced, then
/// renamed); returns (file name, bytes, CRC-32).
pub fn write_snapshot(snapshot: &ShardSnapshot, dir: &Path) -> Result<(String, u64, u32), CheckpointError> {
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let name = shard_file_name(snapshot.header.server_index);
    let path = dir.join(&name);
    let tmp = dir.join(format!("{name}.tmp"));
    // A temporary file left by a killed writer, or a link planted there, is removed (never
    // followed), and the new one is created fresh: the shard is written only here.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&tmp)(e)),
        _ => {}
    }
    let file = crate::state_file::create_new(&tmp, 0o644)?;
    let mut w = CrcWriter { inner: BufWriter::with_capacity(1 << 20, file), crc: crc32fast::Hasher::new(), bytes: 0 };
    let write = |w: &mut CrcWriter<BufWriter<File>>| -> std::io::Result<()> {
        let json = serde_json::to_vec(&snapshot.header).expect("a shard header always serializes");
        w.write_all(SHARD_MAGIC)?;
        w.write_all(&(json.len() as u64).to_le_bytes())?;
        w.write_all(&json)?;
        for (weights, state) in &snapshot.dense {
            w.write_all(bytemuck::cast_slice(&weights[..]))?;
            w.write_all(bytemuck::cast_slice(state))?;
        }
        for (ids, data) in &snapshot.sparse {
            w.write_all(bytemuck::cast_slice(ids))?;
            w.write_all(bytemuck::cast_slice(data))?;
        }
        for stripes in &snapshot.admission {
            for s in stripes {
                w.write_all(&s.draws.to_le_bytes())?;
                w.write_all(bytemuck::cast_slice(&s.cells))?;
                w.write_all(&s.days)?;
            }
        }
        let crc = w.crc.clone().finalize();
        w.inner.write_all(&crc.to_le_bytes())?;
        w.inner.flush()?;
        w.inner.get_ref().sync_all()
    };
    write(&mut w).map_err(io_err(&tmp))?;
    let crc = w.crc.clone().finalize();
    let bytes = w.bytes + 4;
    drop(w);
    std::fs::rename(&tmp, &path).map_err(io_err(&path))?;
    crate::state_file::sync_dir(dir)?;
    Ok((name, bytes, crc))
}

/// Reads a shard file, checking its CRC-32, and rebuilds the shard.
pub fn read_shard(path: &Path) -> Result<Shard, CheckpointError> {
    read_shard_checked(path, None)
}

/// [`read_shard`] of a file a manifest or a checkpoint entry records as `bytes` long with
/// CRC-32 `crc32`: a file of another size is refused before it is read, and one of another
/// CRC (another job's or another save's shard under this name) before it is used.
pub fn read_recorded_shard(path: &Path, bytes: u64, crc32: u32) -> Result<Shard, CheckpointError> {
    read_shard_checked(path, Some((bytes, crc32)))
}

fn read_shard_checked(path: &Path, record: Option<(u64, u32)>) -> Result<Shard, CheckpointError> {
    let corrupt = |reason: String| CheckpointError::Corrupt { path: path.to_path_buf(), reason };
    let mismatch = |reason: String| CheckpointError::Mismatch { path: path.to_path_buf(), reason };
    let (file, size) = crate::state_file::open_sized(path, false)?.ok_or_else(|| corrupt("missing".into()))?;
    if let Some((recorded, _)) = record.filter(|&(recorded, _)| recorded != size) {
        return Err(mismatch(format!(
            "the file is {size} bytes, its record {recorded}: not the shard that was saved here"
        )));
    }
    let mut bytes = Vec::new();
    // Read no further than the size found (a file still growing is not trusted past it).
    file.take(size).read_to_end(&mut bytes).map_err(io_err(path))?;
    if bytes.len() < 20 || &bytes[..8] != SHARD_MAGIC {
        return Err(corrupt("not an oar shard file (bad magic)".into()));
    }
    let (body, trailer) = bytes.split_at(bytes.len() - 4);
    let stored = u32::from_le_bytes(trailer.try_into().expect("4 bytes"));
    let actual = crc32fast::hash(body);
    if stored != actual {
        return Err(corrupt(format!("CRC-32 mismatch (stored {stored:08x}, computed {actual:08x})")));
    }
    if let Some((_, recorded)) = record.filter(|&(_, recorded)| recorded != stored) {
        return Err(mismatch(format!(
            "CRC-32 {stored:08x}, its record {recorded:08x}: another save's shard (another job's, or another pass's)"
        )));
    }
    let hlen = body
        .get(8..16)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        .ok_or_else(|| corrupt("truncated at byte 8".into()))?;
    let header_bytes = usize::try_from(hlen)
        .ok()
        .and_then(|h| body.get(16..16usize.checked_add(h)?))
        .ok_or_else(|| corrupt(format!("a header of {hlen} bytes runs past the file's end")))?;
    let header: ShardHeader = serde_json::from_slice(header_bytes).map_err(|e| corrupt(format!("header: {e}")))?;
    if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&header.format) {
        return Err(corrupt(format!(
            "format {} (this build reads {OLDEST_FORMAT} to {FORMAT_VERSION})",
            header.format
        )));
    }
    let mut pos = 16 + header_bytes.len();
    // Everything the header says is checked against the bytes that follow before anything is
    // allocated from it: a header is as hostile as any input.
    let expected = header.payload_bytes().map_err(|m| corrupt(format!("header: {m}")))?;
    if expected != (body.len() - pos) as u64 {
        let held = body.len() - pos;
        return Err(corrupt(format!("the header describes {expected} bytes of values, the file holds {held}")));
    }
    let mut take = |n: usize| -> Result<&[u8], CheckpointError> {
        let s = body.get(pos..pos + n).ok_or_else(|| corrupt(format!("truncated at byte {pos}")))?;
        pos += n;
        Ok(s)
    };
    let shard = Shard::new(header.spec, header.server_index, header.num_servers);
    {
        let mut dense = shard.dense.lock();
        if dense.blocks.len() != header.dense_blocks {
            return Err(corrupt("dense block count does not match the spec".into()));
        }
        for b in &mut dense.blocks {
            let w = take(b.weights.len() * 4)?;
            std::sync::Arc::make_mut(&mut b.weights).copy_from_slice(&bytemuck::pod_collect_to_vec::<u8, f32>(w));
            let s = take(b.state.len() * 4)?;
            b.state.copy_from_slice(&bytemuck::pod_collect_to_vec::<u8, f32>(s));
        }
    }
    if header.sparse_rows.len() != shard.sparse.len() {
        return Err(corrupt("sparse table count does not match the spec".into()));
    }
    for (t, &rows) in shard.sparse.iter().zip(&header.sparse_rows) {
        let ids: Vec<u64> = bytemuck::pod_collect_to_vec(take(rows * 8)?);
        let stored = stored_row_len(t.spec(), header.format);
        let data: Vec<f32> = bytemuck::pod_collect_to_vec(take(rows * stored * 4)?);
        let (dim, mut full) = (t.spec().dim, vec![0.0; t.row_len()]);
        for (id, row) in ids.iter().zip(data.chunks_exact(stored.max(1))) {
            // Weights, then the statistics (zeros where the format has none), then the state.
            full[..dim].copy_from_slice(&row[..dim]);
            full[t.row_len() - (stored - dim)..].copy_from_slice(&row[dim..]);
            t.insert_row(*id, &full).map_err(|e| corrupt(e.to_string()))?;
        }
    }
    if header.format >= 3 {
        for t in &shard.sparse {
            let cells = t.spec().filter_cells_per_stripe();
            let mut state = Vec::with_capacity(crate::layout::STRIPES);
            for _ in 0..crate::layout::STRIPES {
                let draws = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
                let cells_read = bytemuck::pod_collect_to_vec::<u8, u16>(take(2 * cells)?);
                // Format 3 kept no days: every pending id counts as seen on the day of the restart.
                let days = if header.format >= 4 { take(cells)?.to_vec() } else { Vec::new() };
                state.push(crate::table::admit::AdmissionState { draws, cells: cells_read, days });
            }
            t.restore_admission(&state).map_err(|e| corrupt(format!("table {}: {e}", t.spec().name)))?;
        }
    }
    if pos != body.len() {
        return Err(corrupt(format!("{} unexpected trailing bytes", body.len() - pos)));
    }
    Ok(shard)
}

/// One shard's entry in a manifest.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShardEntry {
    /// File name in the pass directory.
    pub file: String,
    /// Size in bytes.
    pub bytes: u64,
    /// CRC-32 of the whole file as reported by the server that wrote it.
    pub crc32: u32,
}

/// What a saved model is: written last, so its presence marks a complete checkpoint.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// Checkpoint format version.
    pub format: u32,
    /// Job id that wrote it.
    pub job: String,
    /// Number of passes completed.
    pub pass: u32,
    /// Number of servers (one shard each).
    pub num_servers: usize,
    /// The model's parameter spec.
    pub spec: TableSpec,
    /// The model and training configuration, as the trainer saw it.
    pub model: serde_json::Value,
    /// The shard files, by server index.
    pub shards: Vec<ShardEntry>,
}

impl Manifest {
    /// Writes the manifest into `dir` atomically, then points `dir/../latest` at `dir`.
    pub fn write(&self, dir: &Path) -> Result<(), CheckpointError> {
        let json = serde_json::to_vec_pretty(self).expect("a manifest always serializes");
        crate::state_file::write_atomic(&dir.join("manifest.json"), &json)?;
        if let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) {
            crate::state_file::write_atomic(&parent.join("latest"), name.to_string_lossy().as_bytes())?;
        }
        Ok(())
    }

    /// Finds and reads the manifest of `dir`: a pass directory, or an output directory whose
    /// `latest` names one. Returns the manifest and its pass directory.
    pub fn find(dir: &Path) -> Result<(Manifest, PathBuf), CheckpointError> {
        let pass_dir = if dir.join("manifest.json").exists() {
            dir.to_path_buf()
        } else {
            let latest = dir.join("latest");
            // A state file: no link followed, no wait on a named pipe, a few bytes at most.
            let name = crate::state_file::read(&latest, 4096)?.ok_or_else(|| CheckpointError::Io {
                path: dir.to_path_buf(),
                cause: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no manifest.json and no 'latest' file: not a saved model",
                ),
            })?;
            let name = String::from_utf8_lossy(&name);
            let name = name.trim();
            if !plain_name(name) {
                return Err(CheckpointError::Corrupt {
                    path: latest,
                    reason: format!("names {name:?}, not a pass folder beside it"),
                });
            }
            dir.join(name)
        };
        let path = pass_dir.join("manifest.json");
        let bytes = crate::state_file::read(&path, MAX_MANIFEST_BYTES)?
            .ok_or_else(|| io_err(&path)(std::io::ErrorKind::NotFound.into()))?;
        let m: Manifest = serde_json::from_slice(&bytes)
            .map_err(|e| CheckpointError::Corrupt { path: path.clone(), reason: e.to_string() })?;
        if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&m.format) {
            return Err(CheckpointError::Corrupt { path, reason: format!("format {}", m.format) });
        }
        if m.shards.len() != m.num_servers {
            return Err(CheckpointError::Corrupt { path, reason: "shard list does not match num_servers".into() });
        }
        if let Some(e) = m.shards.iter().find(|e| !plain_name(&e.file)) {
            return Err(CheckpointError::Corrupt {
                path,
                reason: format!("shard {:?} is not a file beside it", e.file),
            });
        }
        Ok((m, pass_dir))
    }

    /// Checks, before anything is allocated from it, that this manifest's spec is one a table
    /// can be built from and that its dense parameters are no more than its shard files hold
    /// (each the size it records): the spec of an edited or damaged manifest once made a
    /// reader allocate until the machine ran out of memory.
    pub fn check_size(&self, pass_dir: &Path) -> Result<(), CheckpointError> {
        let path = pass_dir.join("manifest.json");
        let corrupt = |reason: String| CheckpointError::Corrupt { path: path.clone(), reason };
        self.spec.validate().map_err(|m| corrupt(format!("spec: {m}")))?;
        let (tables, widest) = (self.spec.sparse.len(), self.spec.sparse.iter().map(|t| t.dim).max().unwrap_or(0));
        if tables > crate::table::MAX_TABLES || widest > crate::table::MAX_DIM {
            return Err(corrupt(format!(
                "its spec has {tables} sparse tables with rows of up to {widest} floats: at most {} of {}",
                crate::table::MAX_TABLES,
                crate::table::MAX_DIM
            )));
        }
        let mut on_disk = 0u64;
        for e in &self.shards {
            let file = pass_dir.join(&e.file);
            let (_, size) = crate::state_file::open_sized(&file, false)?
                .ok_or_else(|| io_err(&file)(std::io::ErrorKind::NotFound.into()))?;
            if size != e.bytes {
                return Err(CheckpointError::Mismatch {
                    path: file,
                    reason: format!("the file is {size} bytes, its record in manifest.json {}", e.bytes),
                });
            }
            on_disk = on_disk.saturating_add(size);
        }
        let floats = self.spec.dense.params.iter().fold(0u64, |n, p| n.saturating_add(p.len as u64));
        if floats.saturating_mul(4) > on_disk {
            return Err(corrupt(format!(
                "its spec has {floats} dense floats, more than its shard files' {on_disk} bytes hold"
            )));
        }
        Ok(())
    }

    /// Reads server `index`'s shard from `pass_dir` (below the manifest's count, checked when
    /// it was read), checking it against this manifest.
    pub fn load_shard(&self, pass_dir: &Path, index: usize) -> Result<Shard, CheckpointError> {
        let entry = &self.shards[index];
        let path = pass_dir.join(&entry.file);
        let shard = read_recorded_shard(&path, entry.bytes, entry.crc32)?;
        let mismatch = |reason: String| CheckpointError::Mismatch { path: path.clone(), reason };
        if shard.index != index || shard.num_servers != self.num_servers {
            return Err(mismatch(format!(
                "shard is server {} of {}, manifest expects server {index} of {}",
                shard.index, shard.num_servers, self.num_servers
            )));
        }
        if shard.spec != self.spec {
            return Err(mismatch("shard's table spec differs from the manifest's".into()));
        }
        Ok(shard)
    }
}

/// Passes already in the saved model a job resumes from (0 when it starts afresh).
pub fn passes_done(resume: Option<&Path>) -> Result<u32, CheckpointError> {
    match resume {
        Some(dir) => Ok(Manifest::find(dir)?.0.pass),
        None => Ok(0),
    }
}

/// Loads every shard of the saved model at `dir` into one shard (server 0 of 1): for offline
/// evaluation, and for local training resumed from a distributed run.
pub fn load_merged(dir: &Path) -> Result<(Manifest, Shard), CheckpointError> {
    let (manifest, pass_dir) = Manifest::find(dir)?;
    manifest.check_size(&pass_dir)?;
    let merged = Shard::new(manifest.spec.clone(), 0, 1);
    for index in 0..manifest.num_servers {
        let shard = manifest.load_shard(&pass_dir, index)?;
        let mut target = merged.dense.lock();
        for block in &shard.dense.lock().blocks {
            // With one server, block b is the b-th block, covering the same range.
            let t = &mut target.blocks[block.index];
            std::sync::Arc::make_mut(&mut t.weights).copy_from_slice(&block.weights);
            t.state.copy_from_slice(&block.state);
        }
        for (t, from) in merged.sparse.iter().zip(&shard.sparse) {
            let mut result = Ok(());
            from.for_each_row(|id, row| {
                if result.is_ok() {
                    result = t.insert_row(id, row);
                }
            });
            result.map_err(|e| CheckpointError::Corrupt {
                path: pass_dir.join(&manifest.shards[index].file),
                reason: e.to_string(),
            })?;
        }
    }
    Ok((manifest, merged))
}

/// One server's entry of a final save, with the job and pass it is for.
#[derive(Serialize, Deserialize)]
struct FinalEntry {
    #[serde(default)]
    job: String,
    #[serde(default)]
    pass: u32,
    #[serde(flatten)]
    entry: ShardEntry,
}

/// Saves one server's shard into `dir` when training ends, without any trainer's help: the
/// shard file, then an entry file beside it; whichever server finds every entry present writes
/// the manifest (two may both write it, atomically and identically). `dir` must be shared by
/// all servers (one machine, or a shared file system).
pub fn save_server_final(
    shard: &Shard,
    dir: &Path,
    job: &str,
    pass: u32,
    model: &serde_json::Value,
) -> Result<bool, CheckpointError> {
    let (file, bytes, crc32) = write_shard(shard, dir)?;
    let entry = FinalEntry { job: job.to_string(), pass, entry: ShardEntry { file, bytes, crc32 } };
    let entry_path = |i: usize| dir.join(format!("server-{i}.entry.json"));
    crate::state_file::write_atomic(
        &entry_path(shard.index),
        &serde_json::to_vec(&entry).expect("an entry always serializes"),
    )?;
    let mut shards = Vec::with_capacity(shard.num_servers);
    for i in 0..shard.num_servers {
        let path = entry_path(i);
        // Another server's entry not written yet: that server completes the manifest.
        let Some(bytes) = crate::state_file::read(&path, 1 << 16)? else { return Ok(false) };
        let other: FinalEntry =
            serde_json::from_slice(&bytes).map_err(|e| CheckpointError::Corrupt { path, reason: e.to_string() })?;
        // An entry an earlier run left here (another job's, another pass's, or one whose shard
        // has been rewritten since) is not this save's: that server completes the manifest.
        let on_disk = std::fs::symlink_metadata(dir.join(&other.entry.file)).map(|m| m.len()).ok();
        if other.job != job || other.pass != pass || on_disk != Some(other.entry.bytes) {
            return Ok(false);
        }
        shards.push(other.entry);
    }
    let manifest = Manifest {
        format: FORMAT_VERSION,
        job: job.to_string(),
        pass,
        num_servers: shard.num_servers,
        spec: shard.spec.clone(),
        model: model.clone(),
        shards,
    };
    manifest.write(dir)?;
    Ok(true)
}

/// Whether `name`, read from a file, names a file or folder right beside it: not a path that
/// could lead anywhere else.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

#[cfg(test)]
mod tests;
