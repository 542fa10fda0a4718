//! What a server resumes from (`--resume`, or a restart's checkpoint folder): its newest
//! readable checkpoint with the ledgers and day end in its cut, or a saved pass.

use super::{requests, ServerConfig};
use crate::persist::checkpoint::Manifest;
use crate::server::ledger::TrainerLedger;
use crate::table::Shard;

/// What a resumed shard comes with.
pub(super) struct Resumed {
    /// The updates it holds (0 for a saved pass).
    pub(super) version: u64,
    /// What it holds of each trainer's pushes (none for a saved pass).
    pub(super) ledgers: Vec<TrainerLedger>,
    /// The last day end whose shrink it holds (0 for a saved pass: a new run's day ends come
    /// after it).
    pub(super) day_end: u64,
    /// What it was loaded from.
    pub(super) start: requests::Start,
    /// The pass of the saved model it was loaded from (0 for none or a checkpoint): a resumed
    /// job's trainers go on at the pass after it.
    pub(super) saved_pass: u64,
}

/// The shard to resume from, and what it comes with.
pub(super) fn load_resume_shard(dir: &std::path::Path, config: &ServerConfig) -> anyhow::Result<(Shard, Resumed)> {
    // A checkpoint folder (background checkpoints): this server's newest readable one.
    if crate::server::shard_checkpoints::has_checkpoints(dir, config.index) {
        let (entry, shard) = crate::server::shard_checkpoints::load_latest(dir, config.index, &config.job)?;
        anyhow::ensure!(
            shard.num_servers == config.num_servers,
            "{}: checkpointed with {} servers, this job has {}",
            dir.display(),
            shard.num_servers,
            config.num_servers
        );
        tracing::info!(dir = %dir.display(), seq = entry.seq, version = entry.version, day_end = entry.day_end, "resumed shard from a checkpoint");
        let (version, ledgers, day_end) = (entry.version, entry.ledgers, entry.day_end);
        let start = requests::Start::Checkpoint;
        return Ok((shard, Resumed { version, ledgers, day_end, start, saved_pass: 0 }));
    }
    let (manifest, pass_dir) = Manifest::find(dir)?;
    manifest.check_size(&pass_dir)?;
    if manifest.num_servers != config.num_servers {
        tracing::info!(
            dir = %pass_dir.display(),
            saved_by = manifest.num_servers,
            servers = config.num_servers,
            "the model was saved by another number of servers: taking this server's rows from every shard file"
        );
    }
    let shard = manifest.load_to_continue(&pass_dir, config.index, config.num_servers)?;
    let rows: usize = shard.sparse.iter().map(|t| t.len()).sum();
    tracing::info!(dir = %pass_dir.display(), pass = manifest.pass, rows, "resumed shard");
    let start =
        requests::Start::Saved { path: pass_dir.clone(), digest: crate::persist::checkpoint::digest(&pass_dir)? };
    Ok((shard, Resumed { version: 0, ledgers: Vec::new(), day_end: 0, start, saved_pass: u64::from(manifest.pass) }))
}
