//! `oar export`: a saved model in forms other tools read, in one folder.
//!
//! | file | what |
//! |---|---|
//! | `dense.onnx` | the dense graph: inputs the pooled embeddings and the dense features |
//! | `model.onnx` | the complete model: inputs each slot's ids, lookups and pooling inside (when the tables fit, see [`ExportConfig::complete_limit`]) |
//! | `tables.safetensors` | per table `T.ids` (u64 `[n]`, ascending) and `T.weights` (f32 `[n, dim]`), the rows of a base save |
//! | `manifest.json` | inputs, outputs, tables, embeddings (layer, table, slots, pooling), the data schema, each file's sha256 |
//!
//! The graphs' inputs and outputs are described in [`crate::model::Model::to_onnx`]. The tables'
//! rows are every row in id order, their weights as an evaluation pull reads them, written in the
//! base save's format (`persist::export::encode_tables`). Every file is written atomically and
//! the manifest last, so a reader that finds the manifest finds the files it names; a server
//! watching the folder reloads when the manifest changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use sha2::Digest;

use crate::data::Schema;
use crate::model::{OnnxTable, Pooling, Port};
use crate::serve::predict::Saved;
use crate::table::TableExport;

/// The manifest's format version.
pub const FORMAT: u32 = 1;

/// How to export.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    /// The folder to write (created; files of an earlier export replaced).
    pub out: PathBuf,
    /// The most bytes of table data the complete model may hold; beyond it only the dense
    /// graph is written (a protobuf file cannot exceed 2 GiB, and serving keeps large tables in
    /// a key-value store anyway). 0: never write it.
    pub complete_limit: u64,
}

/// One table in the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestTable {
    /// Its name; its tensors are `NAME.ids` and `NAME.weights` in `tables.safetensors`.
    pub name: String,
    /// Floats per row.
    pub dim: usize,
    /// Rows exported.
    pub rows: u64,
    /// What an id without a row reads as.
    pub unknown: String,
}

/// One embedding layer in the manifest: the dense graph's input of that name is the pooled
/// rows of these slots, concatenated in this order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestEmbedding {
    /// The layer (and the dense graph's input).
    pub layer: String,
    /// The table looked up.
    pub table: String,
    /// The slots, in output order.
    pub slots: Vec<String>,
    /// `sum`, `mean` or `sqrt_n` (of a bag's weighted rows; mean and sqrt_n divide by the
    /// number of ids, at least 1).
    pub pooling: Pooling,
    /// A sequence's length `L`: instead of pooling, each bag's last `L` weighted rows in order,
    /// zeros after them, the slots side by side per position (`[N, L x slots x dim]`); its
    /// mask (1 for a real position, by the first slot) is the input `LAYER.mask` `[N, L]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<usize>,
}

/// One head in the manifest.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestHead {
    /// The graphs' output.
    pub output: String,
    /// `log_loss` (a click probability), `square` (a value) or `softmax` (class
    /// probabilities; `oar predict` writes the true class's).
    pub loss: crate::model::Loss,
    /// The label column it was trained on.
    pub label: String,
}

/// The data schema in the manifest: enough to turn a data line into the graphs' inputs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ManifestData {
    /// `criteo`, `plain`, `slots` or `multislot`.
    pub format: crate::data::Format,
    /// Label columns.
    pub labels: Vec<String>,
    /// Dense columns (name, width), in the order of the `dense` input.
    pub dense: Vec<crate::data::DenseColumn>,
    /// Slots, in the data's order.
    pub slots: Vec<String>,
    /// Whether a slot's raw ids are mixed with the slot (`mix64(raw ^ (slot + 1).reverse_bits())`).
    pub hash_slots: bool,
    /// Multislot: the line's fields in order (names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// The scaling of the dense values after the format's own transform (`(x - shift) *
    /// scale`), which the graphs apply to their `dense` input themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dense_scaling: Option<(Vec<f32>, Vec<f32>)>,
    /// A command the job piped its files through (an export's reader must do the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipe_command: Option<String>,
}

/// `manifest.json` of an export.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExportManifest {
    /// [`FORMAT`].
    pub format: u32,
    /// The saved model exported (as given).
    pub source: String,
    /// Its passes completed.
    pub pass: u32,
    /// Its job.
    pub job: String,
    /// The dense graph's inputs.
    pub dense_inputs: Vec<Port>,
    /// The complete model's inputs (none when it was not written).
    pub model_inputs: Vec<Port>,
    /// Why the complete model was not written, if it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_skipped: Option<String>,
    /// The heads, in order.
    pub heads: Vec<ManifestHead>,
    /// The tables.
    pub tables: Vec<ManifestTable>,
    /// The embedding layers.
    pub embeddings: Vec<ManifestEmbedding>,
    /// The data schema.
    pub data: ManifestData,
    /// Each file's sha256 (hex).
    pub files: HashMap<String, String>,
}

/// What an id without a row reads as, everywhere a saved model is scored.
pub const UNKNOWN_RULE: &str = "zeros";

/// Every row of every table of `saved`, ids ascending, weights as an evaluation pull reads them.
pub fn tables(saved: &Saved) -> anyhow::Result<Vec<TableExport>> {
    let mut out = Vec::new();
    for table in &saved.shard.sparse {
        let mut ids = Vec::with_capacity(table.len());
        table.for_each_row(|id, _| ids.push(id));
        ids.sort_unstable();
        let dim = table.spec().dim;
        let mut weights = vec![0.0; ids.len() * dim];
        for (ids, w) in ids.chunks(1 << 16).zip(weights.chunks_mut((1 << 16) * dim)) {
            table.pull(ids, w, false).map_err(|e| anyhow::anyhow!("table {}: {e}", table.spec().name))?;
        }
        out.push(TableExport { ids, weights, deleted: Vec::new() });
    }
    Ok(out)
}

fn data_of(schema: &Schema) -> ManifestData {
    ManifestData {
        format: schema.format,
        labels: schema.labels.clone(),
        dense: schema.dense.clone(),
        slots: schema.slots.clone(),
        hash_slots: schema.hash_slots,
        fields: schema.field_names(),
        dense_scaling: schema.dense_affine.as_ref().map(|a| (a.shift.clone(), a.scale.clone())),
        pipe_command: schema.pipe_command.clone(),
    }
}

/// The largest ONNX file: a protobuf message is at most 2 GiB - 1 (ONNX's external data, which
/// would lift it, is not written).
pub const MAX_ONNX_BYTES: usize = (1 << 31) - 1;

/// Refuses an `out` folder that would overwrite a saved model: the saved model's own folder or
/// one holding it (an export's `manifest.json` at a job folder's root would be found before
/// its passes), or any folder holding a saved pass's `manifest.json`. An earlier export's
/// folder is fine.
fn check_out(out: &Path, source: &Path) -> anyhow::Result<()> {
    anyhow::ensure!(
        !crate::base::state_file::is_within(source, out),
        "--out {} holds the saved model {} it would overwrite: export elsewhere",
        out.display(),
        source.display()
    );
    // Checked before anything is written: a folder at one of the names failed the export
    // half way, after dense.onnx was replaced.
    for name in ["dense.onnx", "model.onnx", "tables.safetensors", "manifest.json"] {
        let path = out.join(name);
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
            anyhow::bail!("--out {}: {} is a folder, where the export writes a file", out.display(), path.display());
        }
    }
    let manifest = out.join("manifest.json");
    // Read as a state file: a pipe, a device or a link there is refused, not waited on or
    // followed, and a huge file not read whole.
    if let Some(text) = crate::base::state_file::read(&manifest, crate::persist::checkpoint::MAX_MANIFEST_BYTES)
        .with_context(|| format!("--out {}: its manifest.json cannot be checked", out.display()))?
    {
        anyhow::ensure!(
            serde_json::from_slice::<ExportManifest>(&text).is_ok(),
            "--out {}: {} is not an export's (a saved model's?), and an export would overwrite it",
            out.display(),
            manifest.display()
        );
    }
    Ok(())
}

/// Exports `saved` (read from `source`) into `config.out`; returns the manifest written.
pub fn export(saved: &Saved, source: &Path, config: &ExportConfig) -> anyhow::Result<ExportManifest> {
    check_out(&config.out, source)?;
    let (model, params) = (&saved.model, &saved.params);
    let affine = saved.schema.dense_affine.as_ref();
    let dense = model.to_onnx(params, None, affine).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        dense.bytes.len() <= MAX_ONNX_BYTES,
        "the dense graph takes {} bytes, over ONNX's 2 GiB for one file (its external data is not written)",
        dense.bytes.len()
    );
    let tables = tables(saved)?;
    let table_bytes: u64 = tables.iter().map(|t| 4 * t.weights.len() as u64 + 16 * t.ids.len() as u64).sum();
    let (complete, model_skipped) = if config.complete_limit == 0 {
        (None, Some("not asked for (--complete-limit 0)".to_string()))
    } else if table_bytes.saturating_add(dense.bytes.len() as u64) > MAX_ONNX_BYTES as u64 {
        let why = format!(
            "the tables ({table_bytes} bytes) and the dense graph would take more than ONNX's 2 GiB for one file; \
             look rows up in tables.safetensors and run dense.onnx"
        );
        (None, Some(why))
    } else if table_bytes > config.complete_limit {
        let why = format!(
            "the tables hold {table_bytes} bytes, more than --complete-limit {}; look rows up in tables.safetensors and run dense.onnx",
            config.complete_limit
        );
        (None, Some(why))
    } else {
        let views: Vec<OnnxTable> = tables.iter().map(|t| OnnxTable { ids: &t.ids, weights: &t.weights }).collect();
        (Some(model.to_onnx(params, Some(&views), affine).map_err(anyhow::Error::msg)?), None)
    };
    let out = &config.out;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut files = HashMap::new();
    let mut write = |name: &str, bytes: &[u8]| -> anyhow::Result<()> {
        crate::base::state_file::write_atomic(&out.join(name), bytes)?;
        files.insert(name.to_string(), crate::security::auth::to_hex(&sha2::Sha256::digest(bytes)));
        Ok(())
    };
    write("dense.onnx", &dense.bytes)?;
    if let Some(m) = &complete {
        write("model.onnx", &m.bytes)?;
    } else if out.join("model.onnx").exists() {
        // An earlier export's complete model would not match these tables.
        std::fs::remove_file(out.join("model.onnx")).with_context(|| format!("cannot remove {}", out.display()))?;
    }
    let specs = &saved.shard.spec.sparse;
    let named: Vec<(&str, usize, &TableExport)> =
        specs.iter().zip(&tables).map(|(s, t)| (s.name.as_str(), s.dim, t)).collect();
    let metadata = HashMap::from([
        ("kind".to_string(), "base".to_string()),
        ("source".to_string(), "oar export".to_string()),
        ("pass".to_string(), saved.manifest.pass.to_string()),
    ]);
    write(
        "tables.safetensors",
        &crate::persist::export::encode_tables(&named, false, metadata).map_err(anyhow::Error::msg)?,
    )?;
    let input = model.input();
    let manifest = ExportManifest {
        format: FORMAT,
        source: source.display().to_string(),
        pass: saved.manifest.pass,
        job: saved.manifest.job.clone(),
        dense_inputs: dense.inputs,
        model_inputs: complete.map(|m| m.inputs).unwrap_or_default(),
        model_skipped,
        heads: (0..model.losses().len())
            .map(|h| ManifestHead {
                output: model.score_name(h),
                loss: model.losses()[h],
                label: input.labels[model.label_column(h)].clone(),
            })
            .collect(),
        tables: specs
            .iter()
            .zip(&tables)
            .map(|(s, t)| ManifestTable {
                name: s.name.clone(),
                dim: s.dim,
                rows: t.ids.len() as u64,
                unknown: UNKNOWN_RULE.into(),
            })
            .collect(),
        embeddings: model
            .embeddings()
            .into_iter()
            .map(|(layer, e)| ManifestEmbedding {
                layer,
                table: model.tables()[e.table].name.clone(),
                slots: e.slots.iter().map(|&s| input.slots[s].clone()).collect(),
                pooling: e.pooling,
                sequence: e.sequence,
            })
            .collect(),
        data: data_of(&saved.schema),
        files,
    };
    let json = serde_json::to_vec_pretty(&manifest).expect("a manifest serializes");
    crate::base::state_file::write_atomic(&out.join("manifest.json"), &json)?;
    Ok(manifest)
}
