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
//!
//! A shard file is written from a [`ShardSnapshot`], a copy taken under short locks, so no I/O
//! happens under a table lock and training goes on while it is written. The manifest, loading and
//! the servers' final save are `manifest.rs`'s; a server's background checkpoints use the same
//! shard files (`server/shard_checkpoints.rs`).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::table::{Shard, TableSpec};

mod manifest;
pub use manifest::*;

const SHARD_MAGIC: &[u8; 8] = b"OARSHRD1";
/// Version of the checkpoint format (2: sparse rows carry their statistics; 3: the admission
/// state follows the rows, so a restarted server remembers the sightings of ids not admitted
/// yet; 4: the count filter's cells carry the days since their id was last seen, so a restarted
/// server forgets pending sightings on the same day as an uninterrupted one).
pub const FORMAT_VERSION: u32 = 4;
/// The oldest format this build reads: format 1's sparse rows have no statistics, which read as
/// nothing seen yet.
pub const OLDEST_FORMAT: u32 = 1;
/// Largest manifest read (16 MiB): a manifest lists one small entry per server (at most 65,536)
/// and the model's description, so a larger file is not one oar wrote. Parsed, a manifest takes
/// up to 16 times its size (a 62 MB one of statistics took 2.9 GB).
pub(crate) const MAX_MANIFEST_BYTES: u64 = 16 << 20;

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
    State(#[from] crate::base::state_file::StateFileError),
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
    crate::base::layout::STRIPES as u64 * (8 + per_cell * t.filter_cells_per_stripe() as u64)
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
    let file = crate::base::state_file::create_new(&tmp, 0o644)?;
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
    crate::base::state_file::sync_dir(dir)?;
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
    let (file, size) = crate::base::state_file::open_sized(path, false)?.ok_or_else(|| corrupt("missing".into()))?;
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
    // Values are checked as the model's own updates are: a NaN or an infinity would score
    // every sample NaN, or hide behind a ReLU as constant scores, and fail training far from
    // its cause.
    let finite = |v: Vec<f32>, what: &str| match crate::table::every_float(&v, f32::is_finite) {
        true => Ok(v),
        false => Err(corrupt(format!("{what} that is not a finite number (NaN or infinity)"))),
    };
    let shard = Shard::new(header.spec, header.server_index, header.num_servers);
    {
        let mut dense = shard.dense.lock();
        if dense.blocks.len() != header.dense_blocks {
            return Err(corrupt("dense block count does not match the spec".into()));
        }
        for b in &mut dense.blocks {
            let w = finite(bytemuck::pod_collect_to_vec::<u8, f32>(take(b.weights.len() * 4)?), "a dense weight")?;
            std::sync::Arc::make_mut(&mut b.weights).copy_from_slice(&w);
            let s =
                finite(bytemuck::pod_collect_to_vec::<u8, f32>(take(b.state.len() * 4)?), "a dense optimizer state")?;
            b.state.copy_from_slice(&s);
        }
    }
    if header.sparse_rows.len() != shard.sparse.len() {
        return Err(corrupt("sparse table count does not match the spec".into()));
    }
    for (t, &rows) in shard.sparse.iter().zip(&header.sparse_rows) {
        let ids: Vec<u64> = bytemuck::pod_collect_to_vec(take(rows * 8)?);
        let stored = stored_row_len(t.spec(), header.format);
        let data = finite(bytemuck::pod_collect_to_vec(take(rows * stored * 4)?), "a sparse row")?;
        let (dim, mut full) = (t.spec().dim, vec![0.0; t.row_len()]);
        for (id, row) in ids.iter().zip(data.chunks_exact(stored.max(1))) {
            // Weights, then the statistics (zeros where the format has none), then the state.
            full[..dim].copy_from_slice(&row[..dim]);
            full[t.row_len() - (stored - dim)..].copy_from_slice(&row[dim..]);
            t.insert_row(*id, &full).map_err(|e| corrupt(e.to_string()))?;
        }
        // A row written twice is kept once: a file whose ids repeat is not a saved table.
        if t.len() != rows {
            return Err(corrupt(format!("table {:?} lists {rows} rows but {} distinct ids", t.spec().name, t.len())));
        }
    }
    if header.format >= 3 {
        for t in &shard.sparse {
            let cells = t.spec().filter_cells_per_stripe();
            let mut state = Vec::with_capacity(crate::base::layout::STRIPES);
            for _ in 0..crate::base::layout::STRIPES {
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

#[cfg(test)]
mod tests;
