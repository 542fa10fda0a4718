//! Background checkpoints of one server's shard. Every period a [`ShardSnapshot`] is taken
//! under short locks and written on the checkpoint thread ([`run`], through a [`Checkpointer`])
//! into `DIR/server-K/ckpt-NNNNNN/` (the shard file with its CRC-32, and `entry.json`), first
//! under a `.tmp` name that is renamed once complete, so a crash mid-write leaves only a temporary
//! folder, cleared at the next start. The last `keep` checkpoints are kept. A failed write (a full
//! disk) is logged and the next period tries again: training never waits for a checkpoint.
//! Loading ([`load_latest`]) takes the newest checkpoint whose CRC checks, and falls back to
//! older ones.
//!
//! Also the rest of what a restarted server reads from its folder. [`Fence`]: each server claims
//! its folder for (job, epoch) at start and publishes a checkpoint only while no newer epoch has
//! claimed it. [`Trainers`] (`trainers.json`): which trainers have closed and which have ended the
//! current pass, rewritten whenever that changes and read back by any restarted server (a trainer
//! that ended its pass waits at server 0's barrier and would never tell a restarted server 1
//! again). [`earlier_life`]: what an earlier process of the same job left (its last epoch, whether
//! the newest checkpoint is this job's, whether the run finished), which with [`Trainers`] is all
//! `--recoverable` needs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::base::state_file::{self, StateFileError, COUNTER_MAX};
use crate::persist::checkpoint::{
    read_recorded_shard, shard_file_name, write_snapshot, CheckpointError, ShardSnapshot,
};
use crate::server::ledger::TrainerLedger;
use crate::table::Shard;

/// Where and how often a server checkpoints its shard.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The job's checkpoint folder (each server writes under `server-K/` in it).
    pub dir: PathBuf,
    /// Time between checkpoints.
    pub every: Duration,
    /// Checkpoints kept per server (older ones are deleted once a newer one is complete).
    pub keep: usize,
}

/// What a checkpoint holds, written beside its shard file.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Entry {
    /// Sequence number (1, 2, ... over the folder's life, across restarts).
    pub seq: u64,
    /// Updates the server had applied when the snapshot was taken.
    pub version: u64,
    /// Shard file size in bytes.
    pub bytes: u64,
    /// Its CRC-32 (also the file's last four bytes).
    pub crc32: u32,
    /// Milliseconds since the Unix epoch when it was taken.
    pub unix_ms: u64,
    /// The epoch of the server process that wrote it.
    #[serde(default)]
    pub epoch: u64,
    /// The job of the server process that wrote it.
    #[serde(default)]
    pub job: String,
    /// What the server had done with each trainer's pushes, in the same cut as the shard: a
    /// restarted server answers a push it holds as a repeat, and applies one it does not.
    #[serde(default)]
    pub ledgers: Vec<TrainerLedger>,
    /// The last online day end (its pass) whose shrink the shard holds, in the same cut: a
    /// restarted server answers that shrink as a repeat, and applies a later one it is sent.
    #[serde(default)]
    pub day_end: u64,
}

/// What one checkpoint holds, taken at one moment with no update half applied (see the
/// server's `cut`): the shard's copy, the updates it holds and the matching ledgers.
pub struct Cut {
    /// The shard's copy.
    pub snapshot: ShardSnapshot,
    /// Updates applied when it was taken.
    pub version: u64,
    /// Per trainer, the pushes handled when it was taken.
    pub ledgers: Vec<TrainerLedger>,
    /// The last day end whose shrink it holds (0: none).
    pub day_end: u64,
}

impl Cut {
    /// A cut of `shard`, idle at `version` updates, with no ledgers (tools and tests; a
    /// serving server takes its cuts under its update gate).
    pub fn of(shard: &Shard, version: u64) -> Cut {
        Cut { snapshot: ShardSnapshot::take(shard), version, ledgers: Vec::new(), day_end: 0 }
    }
}

/// Which incarnation of a server may write its checkpoints: each server claims its folder for
/// its (job, epoch) in `fence.json` when it starts, and a checkpoint is published only while no
/// newer epoch of the same job has claimed it. A replaced server that wakes up (SIGCONT after a
/// SIGSTOP) therefore cannot publish a checkpoint over its successor's.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Fence {
    /// The job id.
    pub job: String,
    /// The server's epoch.
    pub epoch: u64,
}

/// The most bytes a `fence.json` or `trainers.json` holds.
const SMALL_FILE: u64 = 1 << 20;
/// The most bytes an `entry.json` holds (its ledgers: a few thousand steps per trainer).
const ENTRY_FILE: u64 = 256 << 20;

impl Fence {
    fn path(folder: &Path) -> PathBuf {
        folder.join("fence.json")
    }

    /// The claim in `folder`, checked (`None`: no claim yet).
    pub fn read(folder: &Path) -> Result<Option<Fence>, StateFileError> {
        let path = Self::path(folder);
        let Some(fence) = state_file::read_json::<Fence>(&path, SMALL_FILE)? else { return Ok(None) };
        state_file::bounded(&path, "epoch", fence.epoch, COUNTER_MAX)?;
        Ok(Some(fence))
    }

    /// The newer epoch of this job that has claimed `folder`, if one has.
    fn superseded_by(&self, folder: &Path) -> Result<Option<u64>, StateFileError> {
        let claimed = Self::read(folder)?;
        Ok(claimed.filter(|c| c.job == self.job && c.epoch > self.epoch).map(|c| c.epoch))
    }

    /// Claims `folder` for this epoch (unless a newer one has).
    fn claim(&self, folder: &Path) -> Result<(), CheckpointError> {
        if let Some(newer) = self.superseded_by(folder)? {
            return Err(CheckpointError::Superseded { epoch: self.epoch, newer });
        }
        std::fs::create_dir_all(folder).map_err(|cause| CheckpointError::Io { path: folder.to_path_buf(), cause })?;
        Ok(state_file::write_json(&Self::path(folder), self)?)
    }
}

/// Server `index`'s folder under the job's checkpoint folder.
pub fn server_dir(dir: &Path, index: usize) -> PathBuf {
    dir.join(format!("server-{index}"))
}

/// The complete checkpoints in a server's folder, oldest first.
fn complete(server_dir: &Path) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(server_dir) else { return Vec::new() };
    let mut found: Vec<(u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let seq: u64 = name.strip_prefix("ckpt-")?.parse().ok()?;
            if e.file_type().is_ok_and(|t| t.is_symlink()) {
                // Not one this server wrote: pruning or reading it would act on the link's target.
                tracing::warn!(folder = %e.path().display(), "ignored: a checkpoint that is a symbolic link");
                return None;
            }
            if seq > COUNTER_MAX {
                // Not one this server numbered: `ckpt-18446744073709551615` made the next number
                // wrap to 0, and every new checkpoint was pruned as the oldest on writing.
                tracing::warn!(folder = %e.path().display(), "ignored: a checkpoint number beyond {COUNTER_MAX}");
                return None;
            }
            Some((seq, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// Writes one server's checkpoints, numbering them on from those already in its folder.
pub struct Checkpointer {
    policy: Policy,
    index: usize,
    fence: Fence,
    next: u64,
    /// Checkpoints attempted by this process.
    attempts: u64,
}

impl Checkpointer {
    /// For server `index`, claiming its folder for `fence` (see [`Fence`]).
    pub fn new(policy: Policy, index: usize, fence: Fence) -> Result<Checkpointer, CheckpointError> {
        let folder = server_dir(&policy.dir, index);
        refuse_link(&folder)?;
        fence.claim(&folder)?;
        // A process killed mid-write left its temporary folder: never published, never needed.
        for e in std::fs::read_dir(&folder).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
        let next = complete(&folder).last().map_or(1, |(seq, _)| seq + 1);
        Ok(Checkpointer { policy, index, fence, next, attempts: 0 })
    }

    /// Writes `cut` as the next checkpoint, then drops the ones beyond `keep`. A failed attempt
    /// uses up its number.
    pub fn write(&mut self, cut: Cut) -> Result<Entry, CheckpointError> {
        let Cut { snapshot, version, ledgers, day_end } = cut;
        let seq = self.next;
        self.next += 1;
        self.attempts += 1;
        let folder = server_dir(&self.policy.dir, self.index);
        let name = format!("ckpt-{seq:06}");
        let tmp = folder.join(format!("{name}.tmp"));
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |cause| CheckpointError::Io { path, cause }
        };
        let publish = || -> Result<Entry, CheckpointError> {
            let (_, bytes, crc32) = write_snapshot(&snapshot, &tmp)?;
            let moment = crate::base::fault::Moment::Checkpoint(self.attempts);
            crate::base::fault::at(crate::base::fault::Target::Server(self.index), self.fence.epoch, moment);
            let unix_ms =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
            let (epoch, job) = (self.fence.epoch, self.fence.job.clone());
            let entry = Entry { seq, version, bytes, crc32, unix_ms: unix_ms as u64, epoch, job, ledgers, day_end };
            state_file::write_json(&tmp.join("entry.json"), &entry)?;
            if let Some(newer) = self.fence.superseded_by(&folder)? {
                return Err(CheckpointError::Superseded { epoch: self.fence.epoch, newer });
            }
            let done = folder.join(&name);
            std::fs::rename(&tmp, &done).map_err(io(&done))?;
            // The rename is durable once the folder holding it is synced.
            std::fs::File::open(&folder).and_then(|f| f.sync_all()).map_err(io(&folder))?;
            Ok(entry)
        };
        let entry = publish().inspect_err(|_| {
            let _ = std::fs::remove_dir_all(&tmp);
        })?;
        let all = complete(&folder);
        for (_, old) in &all[..all.len().saturating_sub(self.policy.keep.max(1))] {
            let _ = std::fs::remove_dir_all(old);
        }
        Ok(entry)
    }
}

/// Checkpoints every `policy.every` until `stop` is dropped (or sent to). `cut` takes a
/// consistent cut once tables are declared; `written` is called after each checkpoint is in
/// place. Runs on its own thread.
pub fn run(
    mut checkpointer: Checkpointer,
    cut: impl Fn() -> Option<Cut>,
    written: impl Fn(),
    stop: std::sync::mpsc::Receiver<()>,
) {
    // The first checkpoint as soon as the tables are declared: a server that dies before its
    // first period would otherwise leave a restart nothing to go on from (a loaded model, the
    // ledgers), and it would start empty.
    let mut wait = Duration::from_millis(20).min(checkpointer.policy.every);
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stop.recv_timeout(wait) {
        let (started, cpu) = (std::time::Instant::now(), thread_cpu_seconds());
        let Some(cut) = cut() else { continue };
        wait = checkpointer.policy.every;
        let version = cut.version;
        match checkpointer.write(cut) {
            Ok(e) => {
                written();
                tracing::info!(
                    seq = e.seq,
                    version,
                    bytes = e.bytes,
                    seconds = started.elapsed().as_secs_f64(),
                    cpu_seconds = thread_cpu_seconds() - cpu,
                    "checkpoint written"
                )
            }
            Err(e @ CheckpointError::Superseded { .. }) => return tracing::error!("checkpoints stop: {e}"),
            Err(e) => tracing::error!("checkpoint failed, training goes on: {e}"),
        }
    }
}

/// CPU time this thread has used: a checkpoint's cost to training is its CPU time (what it
/// takes from the trainers on a busy machine), not its wall time (mostly waiting for the disk).
fn thread_cpu_seconds() -> f64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec through a valid pointer.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) } == 0;
    if ok {
        t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
    } else {
        0.0
    }
}

/// Whether `dir` holds checkpoints of server `index`.
pub fn has_checkpoints(dir: &Path, index: usize) -> bool {
    !complete(&server_dir(dir, index)).is_empty()
}

/// What an earlier process of the same job left in a server's checkpoint folder: its epoch and
/// checkpoint (see [`earlier_life`]; where the trainers were is read by every restarted server,
/// [`Trainers::read`]).
#[derive(Clone, Debug, PartialEq)]
pub struct EarlierLife {
    /// The newest epoch that claimed the folder (the restart takes the next one).
    pub epoch: u64,
    /// The newest checkpoint in the folder is this job's (else the restart has none to go on
    /// from: an earlier job's checkpoints are never mistaken for this one's).
    pub checkpoint: bool,
    /// That run of the job finished (every trainer closed): this is a new run of the same job,
    /// not a restart, and starts afresh.
    pub finished: bool,
    /// Complete checkpoints whose record cannot be read (damaged, a link, too large), with why:
    /// a restart that can read none refuses to start empty by accident.
    pub unreadable: Vec<(PathBuf, String)>,
}

/// The mark a server leaves beside its checkpoints once every trainer of its run has closed.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
struct Finished {
    job: String,
}

/// Marks server `index`'s run of `job` under `dir` as finished: a later process of the same job
/// is a new run, not a restart.
pub fn mark_finished(dir: &Path, index: usize, job: &str) -> Result<(), StateFileError> {
    state_file::write_json(&server_dir(dir, index).join("finished.json"), &Finished { job: job.to_string() })
}

/// Moves server `index`'s folder under `dir` aside (to `server-K.run-<unix ms>`), so a new run
/// starts in an empty one and nothing of the earlier run is lost; returns where it went.
pub fn set_aside(dir: &Path, index: usize) -> std::io::Result<PathBuf> {
    let folder = server_dir(dir, index);
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    let aside = dir.join(format!("server-{index}.run-{ms}"));
    std::fs::rename(&folder, &aside)?;
    Ok(aside)
}

/// What `job`'s earlier processes left in server `index`'s folder under `dir`: `None` when no
/// process of this job has claimed it (a fresh start, or the folder of another job).
/// A claim that cannot be read (damaged, a link, a pipe) is an error naming the file, never a
/// fresh start: a restart that took itself for a new server would serve an empty shard.
pub fn earlier_life(dir: &Path, index: usize, job: &str) -> Result<Option<EarlierLife>, StateFileError> {
    let folder = server_dir(dir, index);
    refuse_link(&folder)?;
    let Some(fence) = Fence::read(&folder)?.filter(|f| f.job == job) else { return Ok(None) };
    let (mut checkpoint, mut unreadable) = (false, Vec::new());
    for (_, path) in complete(&folder) {
        match read_entry(&path) {
            Ok(e) => checkpoint |= e.job == job,
            Err(e) => unreadable.push((path, e.to_string())),
        }
    }
    let finished = state_file::read_json::<Finished>(&folder.join("finished.json"), SMALL_FILE)?;
    let finished = finished.is_some_and(|f| f.job == job);
    Ok(Some(EarlierLife { epoch: fence.epoch, checkpoint, finished, unreadable }))
}

/// Refuses a server's checkpoint folder that is a symbolic link: the server deletes and writes
/// in it, and through a link it would do so wherever the link leads.
fn refuse_link(folder: &Path) -> Result<(), StateFileError> {
    match std::fs::symlink_metadata(folder) {
        Ok(m) if m.file_type().is_symlink() => {
            Err(StateFileError::invalid(folder, "a symbolic link: a server's checkpoint folder is never one"))
        }
        _ => Ok(()),
    }
}

/// A checkpoint's `entry.json`, checked.
fn read_entry(checkpoint: &Path) -> Result<Entry, StateFileError> {
    let path = checkpoint.join("entry.json");
    let entry: Entry =
        state_file::read_json(&path, ENTRY_FILE)?.ok_or_else(|| StateFileError::invalid(&path, "missing"))?;
    state_file::bounded(&path, "version", entry.version, COUNTER_MAX)?;
    state_file::bounded(&path, "epoch", entry.epoch, COUNTER_MAX)?;
    for l in &entry.ledgers {
        state_file::bounded(&path, "a ledger's step", l.below, COUNTER_MAX)?;
        if l.recent.len() > crate::server::ledger::WINDOW || l.recent.keys().any(|&s| s > COUNTER_MAX) {
            return Err(StateFileError::invalid(&path, "a ledger holds more steps than any server keeps"));
        }
    }
    Ok(entry)
}

/// Where the trainers are, as a server records it beside its checkpoints whenever it changes
/// (a trainer ends a pass or closes): a restarted server must not wait for a trainer that has
/// ended its pass (it is waiting at the barrier) or closed (it has gone).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Trainers {
    /// The job.
    pub job: String,
    /// Trainers that have closed.
    pub closed: Vec<u64>,
    /// The newest pass a trainer has ended.
    pub pass: u64,
    /// The trainers that have ended it.
    pub ended: Vec<u64>,
}

impl Trainers {
    fn path(folder: &Path) -> PathBuf {
        folder.join("trainers.json")
    }

    /// The record of `job` in server `index`'s folder under `dir` for a job of `trainers`
    /// trainers, if there is one; a record naming trainers the job does not have is refused.
    pub fn read(dir: &Path, index: usize, job: &str, trainers: usize) -> Result<Option<Trainers>, StateFileError> {
        let path = Trainers::path(&server_dir(dir, index));
        let Some(t) = state_file::read_json::<Trainers>(&path, SMALL_FILE)?.filter(|t| t.job == job) else {
            return Ok(None);
        };
        state_file::bounded(&path, "pass", t.pass, COUNTER_MAX)?;
        if let Some(id) = t.closed.iter().chain(&t.ended).find(|&&id| id >= trainers as u64) {
            return Err(StateFileError::invalid(&path, format!("names trainer {id}, but the job has {trainers}")));
        }
        Ok(Some(t))
    }

    /// Records this in server `index`'s folder under `dir`, atomically.
    pub fn write(&self, dir: &Path, index: usize) -> Result<(), CheckpointError> {
        let folder = server_dir(dir, index);
        std::fs::create_dir_all(&folder).map_err(|cause| CheckpointError::Io { path: folder.clone(), cause })?;
        Ok(state_file::write_json(&Trainers::path(&folder), self)?)
    }
}

/// Loads server `index`'s newest checkpoint of `job` under `dir` whose files check, logging and
/// skipping any newer one that does not; another job's checkpoints are never loaded, even when
/// this job's are all damaged.
pub fn load_latest(dir: &Path, index: usize, job: &str) -> anyhow::Result<(Entry, Shard)> {
    let folder = server_dir(dir, index);
    let mut others = std::collections::BTreeSet::new();
    for (seq, path) in complete(&folder).into_iter().rev() {
        let entry = match read_entry(&path) {
            Ok(e) if e.job != job => {
                others.insert(e.job);
                continue;
            }
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(seq, "skipping a damaged checkpoint: {e}");
                continue;
            }
        };
        // The entry records the shard's size and CRC, and the folder the server: a file from
        // another checkpoint or another server's folder is as damaged as a torn one.
        match read_recorded_shard(&path.join(shard_file_name(index)), entry.bytes, entry.crc32) {
            Ok(shard) if shard.index == index => return Ok((entry, shard)),
            Ok(shard) => tracing::warn!(seq, "skipping a damaged checkpoint: its shard is server {}'s", shard.index),
            Err(e) => tracing::warn!(seq, "skipping a damaged checkpoint: {e}"),
        }
    }
    let others = if others.is_empty() {
        String::new()
    } else {
        format!(" (it holds checkpoints of job(s) {others:?}, never loaded for another job)")
    };
    anyhow::bail!("{}: no readable checkpoint of server {index} of job '{job}'{others}", folder.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder numbered beyond what a server numbers is not one of its checkpoints: it made
    /// the next number wrap to 0, and each new checkpoint was pruned as the oldest.
    #[test]
    fn a_checkpoint_number_beyond_the_counters_bound_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let server = server_dir(dir.path(), 0);
        for name in ["ckpt-18446744073709551615", "ckpt-000002", "ckpt-x"] {
            std::fs::create_dir_all(server.join(name)).unwrap();
        }
        let found: Vec<u64> = complete(&server).into_iter().map(|(seq, _)| seq).collect();
        assert_eq!(found, [2]);
    }
}
