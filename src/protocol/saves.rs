//! What a base or delta save is, on the wire and in files: its kind, and what one server wrote
//! (written by the `export` module).

use serde::{Deserialize, Serialize};

/// Which rows a save keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExportKind {
    /// Every row whose score reaches `base_threshold`; starts every row's delta score again.
    Base,
    /// The rows pushed since the last save (see [`crate::table::Accessor::in_delta`]), and the
    /// ids removed since.
    Delta,
}

impl ExportKind {
    /// The kind named `name` in files, if any.
    pub fn from_name(name: &str) -> Option<ExportKind> {
        [ExportKind::Base, ExportKind::Delta].into_iter().find(|k| k.name() == name)
    }

    /// The kind's name in files and messages.
    pub fn name(self) -> &'static str {
        match self {
            ExportKind::Base => "base",
            ExportKind::Delta => "delta",
        }
    }
}

/// What one server wrote.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Exported {
    /// File name inside the save's folder.
    pub file: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Rows written per table.
    pub rows: Vec<u64>,
    /// Ids named as removed per table (a delta).
    pub deleted: Vec<u64>,
    /// A delta was asked for and nothing was written: this server cannot name every id removed
    /// since the last save (it was restored from a checkpoint, or its removal log outgrew its
    /// bound), so the save must be a base.
    #[serde(default)]
    pub base_needed: bool,
}
