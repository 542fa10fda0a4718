//! Trainer 0's saves at the end of a pass: for serving (a base or a delta of every server's
//! rows, announced in the done-file once complete).

use anyhow::Context;

use super::Store;
use crate::table::TableSpec;

/// Trainer 0's save for serving after `pass` of `day`, if one is due: every server's file, the
/// save's manifest, then its line in the done-file (announced once it is complete).
pub(super) fn save_for_serving(
    out: &std::path::Path,
    store: &mut Store,
    spec: &TableSpec,
    kind: crate::export::ExportKind,
    day: u32,
    pass: u32,
) -> anyhow::Result<()> {
    use crate::export::{append_done, DoneLine, ExportKind, ExportManifest};
    let folder = |kind: ExportKind| out.join("serving").join(format!("{}-{day:03}-{pass:05}", kind.name()));
    let (mut kind, mut dir) = (kind, folder(kind));
    let mut files = store.export(kind, &dir).with_context(|| format!("{} save into {}", kind.name(), dir.display()))?;
    if let Some(f) = files.iter().find(|f| f.base_needed) {
        // A server restored from a checkpoint (or past its removal log's bound) cannot name the
        // rows it removed: the others' delta files are dropped unannounced, and all save a base.
        tracing::warn!(server = %f.file, "a server cannot write a complete delta (restored from a checkpoint?): saving a base instead");
        std::fs::remove_dir_all(&dir)
            .or_else(|e| if e.kind() == std::io::ErrorKind::NotFound { Ok(()) } else { Err(e) })
            .with_context(|| format!("removing the unannounced delta {}", dir.display()))?;
        (kind, dir) = (ExportKind::Base, folder(ExportKind::Base));
        files = store.export(kind, &dir).with_context(|| format!("base save into {}", dir.display()))?;
    }
    let tables = spec.sparse.iter().map(|t| (t.name.clone(), t.dim)).collect();
    let manifest = ExportManifest { kind, day, pass, tables, files };
    crate::state_file::write_atomic(&dir.join("export.json"), &serde_json::to_vec_pretty(&manifest)?)?;
    let unix_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_millis() as u64;
    append_done(&out.join("donefile.txt"), &DoneLine { day, pass, kind, path: dir.clone(), unix_ms })?;
    let rows: u64 = manifest.files.iter().flat_map(|f| &f.rows).sum();
    tracing::info!(day, pass, kind = kind.name(), rows, dir = %dir.display(), "saved for serving");
    Ok(())
}
