//! Trainer 0's saves at the end of a pass: for serving (a base or a delta of every server's
//! rows, announced in the done-file once complete; a base instead of a delta when a server cannot
//! name every row it removed since its last save), and the rule that a complete save is never
//! written over: a rejoining trainer 0 redoing its pass's end keeps the save it made before it
//! died, and an earlier run's save in the pass's folder is moved aside (servers refuse a save
//! into a complete one).

use std::path::Path;

use anyhow::Context;

use super::Store;
use crate::table::TableSpec;

/// Refuses a symbolic link at a save's folder: one planted there had the save's files written
/// wherever it led (servers check their own `--save-root`; a local trainer writes them itself).
pub(super) fn no_link_at(dir: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()),
        "{} is a symbolic link: a save does not go through one",
        dir.display()
    );
    Ok(())
}

/// Trainer 0's save for serving after `pass` of `day`, if one is due: every server's file, the
/// save's manifest, then its line in the done-file (announced once it is complete).
pub(super) fn save_for_serving(
    out: &std::path::Path,
    store: &mut Store,
    spec: &TableSpec,
    kind: crate::protocol::ExportKind,
    day: u32,
    pass: u32,
) -> anyhow::Result<()> {
    use crate::persist::export::{append_done, DoneLine, ExportManifest};
    use crate::protocol::ExportKind;
    let folder = |kind: ExportKind| out.join("serving").join(format!("{}-{day:03}-{pass:05}", kind.name()));
    let (mut kind, mut dir) = (kind, folder(kind));
    let done = out.join("donefile.txt");
    let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    if let Some(saved) = completed_serving(&folder(kind))? {
        // Saved before this trainer restarted: announced now if it was not yet, never again.
        anyhow::ensure!(
            (saved.kind, saved.day, saved.pass) == (kind, day, pass),
            "{}: it holds the {} save of day {} pass {}, not this one: a complete save is never written over",
            folder(kind).display(),
            saved.kind.name(),
            saved.day,
            saved.pass
        );
        append_done(&done, &DoneLine { day, pass, kind, path: folder(kind), unix_ms })?;
        tracing::info!(day, pass, kind = kind.name(), "saved for serving before this trainer restarted: kept as it is");
        return Ok(());
    }
    no_link_at(&out.join("serving"))?;
    no_link_at(&dir)?;
    let mut files = store.export(kind, &dir).with_context(|| format!("{} save into {}", kind.name(), dir.display()))?;
    if let Some(f) = files.iter().find(|f| f.base_needed) {
        // A server restored from a checkpoint (or past its removal log's bound) cannot name the
        // rows it removed: the others' delta files are dropped unannounced, and all save a base.
        tracing::warn!(server = %f.file, "a server cannot write a complete delta (restored from a checkpoint?): saving a base instead");
        std::fs::remove_dir_all(&dir)
            .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
            .with_context(|| format!("removing the unannounced delta {}", dir.display()))?;
        (kind, dir) = (ExportKind::Base, folder(ExportKind::Base));
        no_link_at(&dir)?;
        files = store.export(kind, &dir).with_context(|| format!("base save into {}", dir.display()))?;
    }
    let tables = spec.sparse.iter().map(|t| (t.name.clone(), t.dim)).collect();
    let manifest = ExportManifest { kind, day, pass, tables, files };
    crate::base::state_file::write_atomic(&dir.join("export.json"), &serde_json::to_vec_pretty(&manifest)?)?;
    append_done(&done, &DoneLine { day, pass, kind, path: dir.clone(), unix_ms })?;
    let rows: u64 = manifest.files.iter().flat_map(|f| &f.rows).sum();
    tracing::info!(day, pass, kind = kind.name(), rows, dir = %dir.display(), "saved for serving");
    Ok(())
}

/// The manifest of a complete save for serving in `dir` (its `export.json`, written last), if
/// there is one.
fn completed_serving(dir: &Path) -> anyhow::Result<Option<crate::persist::export::ExportManifest>> {
    let path = dir.join("export.json");
    Ok(crate::base::state_file::read_json(&path, crate::persist::checkpoint::MAX_MANIFEST_BYTES)?)
}

/// Whether pass `pass` of job `job` is saved in `dir` already (its manifest, written last, is
/// there) by this trainer before it restarted (`rejoin`): that save is kept as it is. Any other
/// complete save there (an earlier run's) is moved aside to `NAME.replaced-<unix ms>`, never
/// written over, and `false` is returned.
pub(super) fn saved_before(dir: &Path, job: &str, pass: u32, rejoin: bool) -> anyhow::Result<bool> {
    if std::fs::symlink_metadata(dir.join("manifest.json")).is_err() {
        return Ok(false);
    }
    let (saved, _) = crate::persist::checkpoint::Manifest::find(dir)?;
    if rejoin && saved.job == job && saved.pass == pass {
        return Ok(true);
    }
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis();
    let aside = dir.with_file_name(format!("{}.replaced-{ms}", dir.file_name().unwrap_or_default().to_string_lossy()));
    std::fs::rename(dir, &aside).with_context(|| format!("moving the earlier save {} aside", dir.display()))?;
    tracing::warn!(
        dir = %dir.display(),
        aside = %aside.display(),
        "the folder held a complete save of pass {} of job '{}': moved aside, not written over",
        saved.pass,
        saved.job
    );
    Ok(false)
}
