//! Saved models: the manifest that names a pass's shard files, loading a saved model, and the
//! servers' final save that writes the manifest without a trainer. The shard files themselves are
//! [`super`]'s.
//!
//! Each shard file is checked against the size and CRC-32 its manifest records, and the model's
//! spec against the files before anything is allocated. A server loads its share of a model saved
//! by any number of servers ([`Manifest::load_resharded`]: its own file, or its rows and blocks
//! from every file, each file checked against the memory available); a job that trains on loads
//! it the same way, but on another number of servers refuses a table with a count filter (its
//! pending ids cannot move) or one whose rows would pass its capacity on a server
//! ([`Manifest::load_to_continue`]); evaluation loads a model whole ([`load_merged`]). A
//! manifest's SHA-256 ([`digest`]) says which saved model a process loaded, for servers and
//! trainers to compare.
//!
//! Servers save at the end without a coordinator ([`save_server_final`]): each writes its shard
//! and an entry file, and whichever finds every entry present writes the manifest (atomically; a
//! duplicate write is identical). This needs a folder shared by the servers, which one machine or
//! a cluster file system gives; servers never talk to each other.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{
    io_err, read_recorded_shard, write_shard, CheckpointError, FORMAT_VERSION, MAX_MANIFEST_BYTES, OLDEST_FORMAT,
};
use crate::table::{Shard, TableSpec};

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
        crate::base::state_file::write_atomic(&dir.join("manifest.json"), &json)?;
        if let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) {
            crate::base::state_file::write_atomic(&parent.join("latest"), name.to_string_lossy().as_bytes())?;
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
            let name = crate::base::state_file::read(&latest, 4096)?.ok_or_else(|| CheckpointError::Io {
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
        let bytes = crate::base::state_file::read(&path, MAX_MANIFEST_BYTES)?
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
            let (_, size) = crate::base::state_file::open_sized(&file, false)?
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

/// The SHA-256 (hex) of the manifest in `pass_dir`: which saved model a process loaded, for
/// servers and trainers to compare (a path may differ from machine to machine).
pub fn digest(pass_dir: &Path) -> Result<String, CheckpointError> {
    use sha2::Digest;
    let path = pass_dir.join("manifest.json");
    let bytes = crate::base::state_file::read(&path, MAX_MANIFEST_BYTES)?
        .ok_or_else(|| io_err(&path)(std::io::ErrorKind::NotFound.into()))?;
    Ok(crate::security::auth::to_hex(&sha2::Sha256::digest(&bytes)))
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
    let merged = manifest.load_resharded(&pass_dir, 0, 1)?;
    Ok((manifest, merged))
}

impl Manifest {
    /// Server `index` of `num_servers`'s share of this saved model, whatever number of servers
    /// saved it: its own shard file when the numbers agree, else the rows and dense blocks that
    /// [`crate::base::layout`] places on it, taken from every shard file in turn (so a job may go on
    /// with more or fewer servers than the one that saved). Call [`Manifest::check_size`] first.
    pub fn load_resharded(&self, pass_dir: &Path, index: usize, num_servers: usize) -> Result<Shard, CheckpointError> {
        if num_servers == self.num_servers {
            self.check_memory(pass_dir, index)?;
            return self.load_shard(pass_dir, index);
        }
        let target = Shard::new(self.spec.clone(), index, num_servers);
        for from in 0..self.num_servers {
            // Each server reads every shard file in turn, one at a time.
            self.check_memory(pass_dir, from)?;
            let shard = self.load_shard(pass_dir, from)?;
            let mut dense = target.dense.lock();
            for block in &shard.dense.lock().blocks {
                // Blocks are numbered over the whole vector whatever the server count, and each
                // server keeps its own in increasing order.
                if let Ok(at) = dense.blocks.binary_search_by_key(&block.index, |b| b.index) {
                    let t = &mut dense.blocks[at];
                    std::sync::Arc::make_mut(&mut t.weights).copy_from_slice(&block.weights);
                    t.state.copy_from_slice(&block.state);
                }
            }
            for (table, (t, saved)) in target.sparse.iter().zip(&shard.sparse).enumerate() {
                let mut result = Ok(());
                saved.for_each_row(|id, row| {
                    if result.is_ok() && crate::base::layout::server_of_row(table as u32, id, num_servers) == index {
                        result = t.insert_row(id, row);
                    }
                });
                result.map_err(|e| CheckpointError::Corrupt {
                    path: pass_dir.join(&self.shards[from].file),
                    reason: e.to_string(),
                })?;
            }
        }
        Ok(target)
    }

    /// [`Manifest::load_resharded`] for a job that goes on training from the save (a server's
    /// resume or warm start, a local one), refusing what cannot move to `num_servers` servers:
    /// a count filter (`count_filter_entry`) holds each server's pending ids by hash, so moved,
    /// ids seen before the save had to be seen again (a model that differed from an
    /// uninterrupted run's); and fewer servers must not hold more rows each than a table's
    /// capacity (its bound per server).
    pub fn load_to_continue(
        &self,
        pass_dir: &Path,
        index: usize,
        num_servers: usize,
    ) -> Result<Shard, CheckpointError> {
        if num_servers == self.num_servers {
            return self.load_resharded(pass_dir, index, num_servers);
        }
        let refuse = |reason: String| CheckpointError::Mismatch { path: pass_dir.join("manifest.json"), reason };
        if let Some(t) = self.spec.sparse.iter().find(|t| matches!(t.entry, crate::table::Entry::Count(_))) {
            return Err(refuse(format!(
                "saved by {} servers; table {}'s count filter (count_filter_entry) keeps each server's pending ids and \
                 cannot move to {num_servers}: go on with {} servers",
                self.num_servers, t.name, self.num_servers
            )));
        }
        let shard = self.load_resharded(pass_dir, index, num_servers)?;
        for t in &shard.sparse {
            if let Some(capacity) = t.spec().capacity.filter(|&c| t.len() as u64 > c) {
                return Err(refuse(format!(
                    "saved by {} servers; table {} puts {} rows on server {index} of {num_servers}, over its capacity of \
                     {capacity} per server: go on with more servers",
                    self.num_servers,
                    t.spec().name,
                    t.len()
                )));
            }
        }
        Ok(shard)
    }

    /// Checks that shard file `index` (read whole, then its rows kept) fits in the memory this
    /// process may take: a shard larger than that aborted the process on allocation.
    fn check_memory(&self, pass_dir: &Path, index: usize) -> Result<(), CheckpointError> {
        let bytes = self.shards[index].bytes;
        match crate::model::available_memory() {
            Some(room) if bytes > room => Err(CheckpointError::Mismatch {
                path: pass_dir.join(&self.shards[index].file),
                reason: format!(
                    "{} MiB to read, more than the {} MiB this process may still take",
                    bytes >> 20,
                    room >> 20
                ),
            }),
            _ => Ok(()),
        }
    }
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
    crate::base::state_file::write_atomic(
        &entry_path(shard.index),
        &serde_json::to_vec(&entry).expect("an entry always serializes"),
    )?;
    let mut shards = Vec::with_capacity(shard.num_servers);
    for i in 0..shard.num_servers {
        let path = entry_path(i);
        // Another server's entry not written yet: that server completes the manifest.
        let Some(bytes) = crate::base::state_file::read(&path, 1 << 16)? else { return Ok(false) };
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
