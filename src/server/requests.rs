//! The requests that are not pushes or membership: declaring the tables (costed against
//! `--max-declare-mb` before anything is allocated), pulls, saves, and the day end's shrink.
//! Saves (a pass's shard files, and base or delta saves for serving) are written only inside the
//! save root (a relative folder taken inside it, `..` refused, links resolved) and on a blocking
//! thread, off the async workers. A base or delta save is gathered under the update gate taken
//! exclusively, so it holds whole updates, and written after the gate is released. A shrink sweeps
//! the tables under the gate taken shared, beside pushes.

use std::borrow::Cow;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::{table_err, Answer, Reply, State};
use crate::persist::checkpoint::write_shard;
use crate::protocol::{Declaration, DenseSelection, ErrorCode, Pull, Response, RowCreation};
use crate::table::{Shard, MAX_DIM, MAX_TABLES};

/// What a server's shard was loaded from when it started.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Start {
    /// Nothing: a fresh model.
    Fresh,
    /// A saved model (`--resume` or `--init-model`): its pass folder and its manifest's SHA-256.
    Saved { path: PathBuf, digest: String },
    /// Its own background checkpoint (a restart): a continuation, not compared.
    Checkpoint,
}

/// Checks that a trainer starting from the saved model `declared` (its `start_model` record:
/// `None` for a fresh start) meets a server that loaded the same one. Servers started without
/// `--init-model` or `--resume` while their trainers had it trained a fresh model without a word.
pub(super) fn check_start(server: &Start, declared: Option<&serde_json::Value>) -> Result<(), String> {
    let named = |d: &serde_json::Value| {
        let (flag, path) = (d["flag"].as_str().unwrap_or("--init-model"), d["path"].as_str().unwrap_or("?"));
        (flag.to_string(), path.to_string(), d["manifest_sha256"].as_str().unwrap_or("").to_string())
    };
    match (server, declared.filter(|d| !d.is_null())) {
        (Start::Checkpoint, _) | (Start::Fresh, None) => Ok(()),
        (_, Some(serde_json::Value::String(s))) if s == "rejoining" => Ok(()),
        (Start::Fresh, Some(d)) => {
            let (flag, path, _) = named(d);
            Err(format!(
                "the trainer starts from the saved model {path} ({flag}) but this server loaded none: start the servers \
                 with {flag} too"
            ))
        }
        (Start::Saved { path, .. }, None) => Err(format!(
            "this server loaded the saved model {} but the trainer starts afresh: give the trainers --resume or \
             --init-model with it too",
            path.display()
        )),
        (Start::Saved { path, digest }, Some(d)) => {
            let (flag, theirs, their_digest) = named(d);
            if *digest == their_digest {
                return Ok(());
            }
            Err(format!(
                "the trainer starts from the saved model {theirs} ({flag}), this server loaded another, {}: give both \
                 the same",
                path.display()
            ))
        }
    }
}

/// The parts of a trainer's model description every trainer must declare alike.
const DESCRIBES_THE_MODEL: [&str; 2] = ["model", "data"];

/// Creates the shard from the first declaration; later ones must match it, and every one must
/// start from the saved model this server loaded ([`check_start`]). A declaration is checked
/// whole before anything of it is kept: a refused one leaves no model description or calendar
/// behind for the final manifest or the next trainer.
pub(super) fn declare(state: &State, declaration: Declaration) -> Reply {
    let Declaration { spec, model, calendar } = declaration;
    check_start(&state.start, model.get("start_model")).map_err(|m| (ErrorCode::Table, m))?;
    let mut slot = state.shard.lock();
    let created = match slot.as_ref() {
        Some(existing) if existing.spec != spec => {
            let m = "declared tables differ from the ones this server holds (another model or a changed config?)";
            return Err((ErrorCode::Table, m.into()));
        }
        Some(_) => None,
        None => {
            spec.validate().map_err(|m| (ErrorCode::Table, m))?;
            rules_fit_mode(&spec, state.config.mode).map_err(|m| (ErrorCode::Table, m))?;
            let place = *state.place.lock();
            let (index, servers) = place.ok_or((ErrorCode::State, "declare before the handshake".to_string()))?;
            fits_frames(&spec, servers, state.config.max_frame).map_err(|m| (ErrorCode::TooLarge, m))?;
            within_budget(&spec, servers, state.config.limits.max_declare_bytes)
                .map_err(|m| (ErrorCode::TooLarge, m))?;
            Some((spec, index, servers))
        }
    };
    let mut kept = state.calendar.lock();
    if !calendar.is_empty() && !kept.is_empty() {
        if let Some(why) = crate::protocol::ListedDay::first_difference(&kept, &calendar) {
            return Err((ErrorCode::Table, why));
        }
    }
    let mut described = state.model.lock();
    // The description the final save records says how the model is read (its layers and
    // activations, the data's columns): a later trainer's must say the same, or one trainer
    // declaring first could change silently how every saved pass is read.
    // A declaration without a description (a tool's, a test's) changes nothing kept.
    for part in DESCRIBES_THE_MODEL {
        let (kept_part, this) = (described.get(part), model.get(part));
        if kept_part.is_some() && this.is_some() && kept_part != this {
            let m = format!(
                "this trainer's [{part}] differs from the one this server holds, which the first trainer declared: \
                 every trainer of a job trains one model (another job file?)"
            );
            return Err((ErrorCode::Table, m));
        }
    }
    // Checked whole: now kept.
    if kept.is_empty() {
        *kept = calendar;
    }
    if described.is_null() {
        *described = model;
    }
    if let Some((spec, index, servers)) = created {
        *slot = Some(Arc::new(Shard::new(spec, index, servers)));
    }
    Ok(Answer::Response(Response::Done))
}

/// Refuses tables whose rules do not fit the job's mode: a GEO job's servers add changes
/// (every rule `sum`, which `--mode geo` trainers declare); any other job's run an optimizer on
/// gradients, which a `sum` rule would add as they are.
fn rules_fit_mode(spec: &crate::table::TableSpec, mode: crate::protocol::Mode) -> Result<(), String> {
    let (summed, rules) = spec.sum_rules();
    match mode {
        crate::protocol::Mode::Geo if summed != rules => Err(format!(
            "this is a GEO job: its servers add changes, so every rule is sum; {} of the {rules} declared are not \
             (a trainer not in --mode geo?)",
            rules - summed
        )),
        crate::protocol::Mode::Geo => Ok(()),
        mode if summed > 0 => Err(format!(
            "{summed} of the declared rules are sum, GEO's, and this job's mode is {mode} (a trainer in --mode geo?)"
        )),
        _ => Ok(()),
    }
}

/// GEO mode: the rows of this server's tables changed since `trainer` last asked.
pub(super) fn changed(state: &State, trainer: u64) -> Reply {
    if state.config.mode != crate::protocol::Mode::Geo {
        let m = format!(
            "trainer {trainer} asked which rows changed: that is GEO's, and this job's mode is {}",
            state.config.mode
        );
        return Err((ErrorCode::State, m));
    }
    let shard = state.shard()?;
    let changes = state.changes(&shard).take(trainer as usize);
    let (all, ids) = match changes {
        super::geo::Changes::All => (true, Vec::new()),
        super::geo::Changes::Ids(ids) => (false, ids.into_iter().map(Cow::Owned).collect()),
    };
    Ok(Answer::Response(Response::Changed { all, ids }))
}

/// Refuses tables whose values could not travel: this server's dense share must fit one pull
/// reply, and so must one row of every sparse table. It also bounds what a declaration from the
/// network can make the server allocate to what its frame limit allows.
fn fits_frames(spec: &crate::table::TableSpec, servers: usize, max_frame: usize) -> Result<(), String> {
    let max_floats = max_frame / 4;
    let total = spec.dense.params.iter().try_fold(0usize, |sum, p| sum.checked_add(p.len));
    // Blocks are dealt round-robin: no server holds more than its rounded-up share of them.
    // Checked: a declaration's numbers come from the network, and a product that wrapped
    // passed this check once (a share of 6 floats for 1.7e19 declared, then an abort).
    let bs = spec.dense.block_size.max(1);
    let share = total.and_then(|t| t.div_ceil(bs).div_ceil(servers.max(1)).checked_mul(bs).map(|s| s.min(t)));
    match share {
        Some(share) if share <= max_floats => {}
        _ => {
            return Err(format!(
                "the dense parameters ({} floats in all) would put more than the frame limit of {} MiB on a server: \
                 use more servers or a larger --max-frame-mb",
                total.map_or("too many".to_string(), |t| t.to_string()),
                max_frame >> 20
            ))
        }
    }
    if let Some(t) = spec.sparse.iter().find(|t| t.dim > max_floats) {
        return Err(format!("sparse table {}: rows of {} floats exceed the frame limit", t.name, t.dim));
    }
    Ok(())
}

/// Bytes an empty shard of `spec` takes on one of `servers` servers (dense weights with up to
/// two optimizer floats each; each sparse table's 64 stripes of 16 empty slots), checked
/// against `budget` before anything is allocated: a small declaration from the network must
/// not make a server allocate gigabytes.
fn within_budget(spec: &crate::table::TableSpec, servers: usize, budget: u64) -> Result<(), String> {
    if spec.sparse.len() > MAX_TABLES {
        return Err(format!("{} sparse tables declared: at most {MAX_TABLES}", spec.sparse.len()));
    }
    if let Some(t) = spec.sparse.iter().find(|t| t.dim > MAX_DIM) {
        return Err(format!("sparse table {}: rows of {} floats, at most {MAX_DIM}", t.name, t.dim));
    }
    let floats = spec.dense.params.iter().fold(0u64, |sum, p| sum.saturating_add(p.len as u64));
    let dense = (floats / servers.max(1) as u64).saturating_mul(12);
    let sparse = crate::table::empty_sparse_bytes(spec);
    let bytes = dense.saturating_add(sparse);
    if bytes > budget {
        return Err(format!(
            "the declared tables would take {} MiB on this server before any row: over its budget of {} MiB \
             (--max-declare-mb)",
            bytes >> 20,
            budget >> 20
        ));
    }
    Ok(())
}

/// Pulled values; `spare` holds the row buffers of the connection's last reply, for reuse.
pub(super) fn pull(state: &State, pull: Pull<'_>, mut spare: Vec<Vec<f32>>) -> Reply {
    let shard = state.shard()?;
    // The reply must fit one frame: refuse before allocating what it would take.
    let mut floats = if pull.dense == DenseSelection::All { shard.dense.lock().len() } else { 0 };
    for s in &pull.sparse {
        let dim = shard.table(s.table as usize).map_err(table_err)?.spec().dim;
        floats = s.ids.len().checked_mul(dim).and_then(|n| n.checked_add(floats)).unwrap_or(usize::MAX);
    }
    if floats > state.config.max_frame / 4 {
        let message = format!(
            "a pull of {floats} floats exceeds the frame limit of {} MiB: pull fewer ids at a time",
            state.config.max_frame >> 20
        );
        return Err((ErrorCode::TooLarge, message));
    }
    let c = &state.counters;
    c.pulls.fetch_add(1, Relaxed);
    let version = c.version.load(Relaxed);
    let dense = match pull.dense {
        DenseSelection::All => shard.dense.lock().snapshot(),
        DenseSelection::None => Vec::new(),
    };
    let mut sparse = Vec::with_capacity(pull.sparse.len());
    for s in &pull.sparse {
        let table = shard.table(s.table as usize).map_err(table_err)?;
        // Every float is overwritten by the pull, so stale values from the last reply may stay.
        let mut rows = spare.pop().unwrap_or_default();
        rows.resize(s.ids.len() * table.spec().dim, 0.0);
        table.pull(&s.ids, &mut rows, pull.create == RowCreation::Create).map_err(table_err)?;
        c.keys_pulled.fetch_add(s.ids.len() as u64, Relaxed);
        sparse.push(rows);
    }
    Ok(Answer::Values { version, dense, sparse })
}

/// Writes this server's shard into `dir` (inside the save root) on a blocking thread: a save
/// writes and syncs a whole shard, which must not hold up the requests of other connections.
pub(super) async fn save(state: &Arc<State>, dir: &str) -> Reply {
    let shard = state.shard()?;
    let root = state.config.save_root.clone();
    let target = inside(&root, Path::new(dir)).ok_or_else(|| {
        let m = format!("save to {dir} refused: not inside this server's --save-root {}", root.display());
        (ErrorCode::State, m)
    })?;
    never_over(&target, "manifest.json", "a completed pass")?;
    let written = tokio::task::spawn_blocking(move || write_shard(&shard, &target)).await;
    let (file, bytes, crc32) = written
        .map_err(|e| (ErrorCode::Io, format!("the save stopped: {e}")))?
        .map_err(|e| (ErrorCode::Io, e.to_string()))?;
    Ok(Answer::Response(Response::Saved { file, bytes, crc32 }))
}

/// Writes this server's base or delta save into `dir` (inside the save root, as a save): the
/// rows are gathered with updates held off, so the save is one moment of the table, and
/// written after.
pub(super) async fn export(state: &Arc<State>, dir: &str, kind: crate::protocol::ExportKind) -> Reply {
    let shard = state.shard()?;
    let root = state.config.save_root.clone();
    let target = inside(&root, Path::new(dir)).ok_or_else(|| {
        let m = format!("{} to {dir} refused: not inside this server's --save-root {}", kind.name(), root.display());
        (ErrorCode::State, m)
    })?;
    never_over(&target, "export.json", "a completed save for serving")?;
    let gate = Arc::clone(state);
    let written = tokio::task::spawn_blocking(move || {
        let tables = {
            let _gate = gate.gate.write();
            crate::persist::export::collect(&shard, kind)
        };
        match tables {
            Some(tables) => crate::persist::export::write(&shard, kind, &tables, &target),
            None => Ok(crate::persist::export::base_needed(&shard)),
        }
    })
    .await
    .map_err(|e| (ErrorCode::Io, format!("the {} save stopped: {e}", kind.name())))?
    .map_err(|e| (ErrorCode::Io, e.to_string()))?;
    tracing::info!(kind = kind.name(), rows = ?written.rows, deleted = ?written.deleted, "saved for serving");
    Ok(Answer::Response(Response::Stats(serde_json::to_string(&written).expect("a save's result serializes"))))
}

/// Refuses a save into `dir` when it holds `mark` (the file written last by a complete save of
/// that kind): completed work is never overwritten, by a trainer redoing a pass (it skips a
/// save that is there) or by anyone else.
fn never_over(dir: &Path, mark: &str, what: &str) -> Result<(), (ErrorCode, String)> {
    if std::fs::symlink_metadata(dir.join(mark)).is_ok() {
        let m = format!("a save into {} refused: it holds {what} ({mark}), never overwritten", dir.display());
        return Err((ErrorCode::State, m));
    }
    Ok(())
}

/// Most days one shrink may add to every row's unseen days: a century.
const MAX_SHRINK_DAYS: u64 = 36_500;

/// Shrinks every sparse table after `days` more days (off the async workers: a sweep of every
/// row), as an update: a checkpoint holds the table before or after it, never half of it. A
/// day end's shrink (`day_end` > 0, its pass) is applied once: one for a day end the shard
/// holds already is answered as a repeat, so a trainer restarted after sending it, or a client
/// sending it again to a server restored from a checkpoint, never shrinks a day twice.
pub(super) async fn shrink(state: &Arc<State>, days: u64, day_end: u64) -> Reply {
    let shard = state.shard()?;
    if days > MAX_SHRINK_DAYS {
        return Err((ErrorCode::State, format!("a shrink of {days} days refused: at most {MAX_SHRINK_DAYS}")));
    }
    // A day end is the end of a pass the trainers are in, or one before: a claim from the far
    // future would make the server refuse every real day end after it as a repeat.
    let bound = state.pass_bound(None);
    if day_end > bound {
        let m =
            format!("a day end's shrink after pass {day_end} refused: the trainers are in pass {} at most", bound - 1);
        return Err((ErrorCode::State, m));
    }
    let gate = Arc::clone(state);
    let swept = tokio::task::spawn_blocking(move || {
        let _gate = gate.gate.read();
        let mut last = gate.day_end.lock();
        let rows = |shard: &crate::table::Shard| shard.sparse.iter().map(|t| t.len() as u64).collect();
        if day_end > 0 && day_end <= *last {
            let deleted = vec![0; shard.sparse.len()];
            return crate::protocol::Shrunk { deleted, rows: rows(&shard), repeat: true };
        }
        let deleted: Vec<u64> = shard.sparse.iter().map(|t| t.shrink(days as u32)).collect();
        if day_end > 0 {
            *last = day_end;
            // Killed here, the server's checkpoints cannot hold the shrink (the gate is held).
            let me = crate::base::fault::Target::Server(gate.config.index);
            crate::base::fault::at(me, gate.config.epoch, crate::base::fault::Moment::Shrunk(day_end));
        }
        crate::protocol::Shrunk { deleted, rows: rows(&shard), repeat: false }
    })
    .await
    .map_err(|e| (ErrorCode::Io, format!("the shrink stopped: {e}")))?;
    if swept.repeat {
        tracing::info!(day_end, "the shrink of the day end after pass {day_end} is held already: not applied again");
    } else {
        tracing::info!(days, day_end, deleted = ?swept.deleted, rows = ?swept.rows, "shrink");
    }
    Ok(Answer::Response(Response::Stats(serde_json::to_string(&swept).expect("shrink result serializes"))))
}

/// `dir` (relative ones taken from `root`, never from the server's working directory) made
/// absolute if it lies inside `root`: a `..` anywhere is refused rather than resolved, and the
/// deepest part of it that exists already is resolved through symbolic links, so a link inside
/// the root cannot lead a save outside it.
pub fn inside(root: &Path, dir: &Path) -> Option<PathBuf> {
    if dir.components().any(|c| c == std::path::Component::ParentDir) {
        return None;
    }
    let root = std::path::absolute(root).ok()?;
    let dir = if dir.is_absolute() { dir.to_path_buf() } else { root.join(dir) };
    (dir.starts_with(&root) && resolved(&dir)?.starts_with(resolved(&root)?)).then_some(dir)
}

/// `path` with the deepest part of it that exists resolved through symbolic links, and the
/// rest (not there yet) as written.
fn resolved(path: &Path) -> Option<PathBuf> {
    let mut existing = path;
    while std::fs::symlink_metadata(existing).is_err() {
        existing = existing.parent()?;
    }
    Some(existing.canonicalize().ok()?.join(path.strip_prefix(existing).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trainer_and_a_server_must_start_from_the_same_saved_model() {
        let saved = Start::Saved { path: "m/pass-0001".into(), digest: "ab".into() };
        let record = |digest: &str| serde_json::json!({"flag": "--init-model", "path": "m/pass-0001", "manifest_sha256": digest});
        assert!(check_start(&saved, Some(&record("ab"))).is_ok());
        assert!(check_start(&Start::Fresh, None).is_ok());
        assert!(check_start(&Start::Fresh, Some(&serde_json::Value::Null)).is_ok());
        // Restarted servers and rejoining trainers go on from where they were.
        assert!(check_start(&Start::Checkpoint, Some(&record("ab"))).is_ok());
        assert!(check_start(&saved, Some(&"rejoining".into())).is_ok());
        let err = check_start(&Start::Fresh, Some(&record("ab"))).unwrap_err();
        assert!(err.contains("this server loaded none: start the servers with --init-model too"), "{err}");
        let err = check_start(&saved, None).unwrap_err();
        assert!(err.contains("loaded the saved model m/pass-0001 but the trainer starts afresh"), "{err}");
        let err = check_start(&saved, Some(&record("cd"))).unwrap_err();
        assert!(err.contains("this server loaded another, m/pass-0001"), "{err}");
    }

    /// A save lands inside the save root only: a relative folder is taken inside it (never
    /// from the server's working directory), `..` is refused, and a symbolic link inside the
    /// root that leads out of it is seen through.
    #[test]
    fn saves_stay_inside_the_root_through_links_and_relative_paths() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        std::fs::create_dir_all(root.join("pass-0001")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        assert_eq!(inside(&root, Path::new("pass-0002")), Some(root.join("pass-0002")));
        assert_eq!(inside(&root, &root.join("pass-0001")), Some(root.join("pass-0001")));
        assert_eq!(inside(&root, &root.join("link/pass-0001")), None, "a link out of the root");
        assert_eq!(inside(&root, &root.join("link")), None);
        assert_eq!(inside(&root, &root.join("../outside")), None);
        assert_eq!(inside(&root, &outside), None);
        // A root that does not exist yet (the first save creates it) still bounds the save.
        let fresh = dir.path().join("fresh");
        assert_eq!(inside(&fresh, &fresh.join("pass-0001")), Some(fresh.join("pass-0001")));
        assert_eq!(inside(&fresh, &outside), None);
    }
}
