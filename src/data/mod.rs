//! Training data: which files a trainer reads, how lines become [`Batch`]es, and generated
//! data for demos and benchmarks.
//!
//! A job's `[data]` section ([`DataConfig`]) is resolved once into a validated [`Schema`]: the
//! line format, the label names, the dense columns and the sparse slots. [`parser`] picks the
//! [`LineParser`] of the format: [`criteo`](format::criteo) (one-hot), [`plain`](format::plain) and [`slots`](format::slots) (multi-hot,
//! optionally weighted). Every parser is atomic: a bad line appends nothing to the batch.
//!
//! Parsing runs on a reader thread that prefetches batches into a bounded channel, so the
//! training thread only ever waits on a ready batch. Errors name the file and line.

pub mod fetch;
pub mod format;
pub mod gen;
pub mod prepare;
pub mod read;
pub mod schema;

pub use crate::base::batch::Batch;
pub use read::files::{list_files, resolve_files, shard_files};
pub use read::reader::{DataError, Reader, ReaderConfig};
pub use read::transform::{DenseStats, DenseTransform, StatsSource};
pub use schema::{expand_names, DenseColumn, LabelBound, Schema};

use serde::{Deserialize, Serialize};

/// The line format of data files.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    /// Criteo TSV: label, 13 integers, 26 hex categorical values ([`criteo`](format::criteo)); the default.
    #[default]
    Criteo,
    /// Whitespace-separated label columns, dense columns and bag columns ([`plain`](format::plain)).
    Plain,
    /// PaddleRec's slot format: `name:value` tokens, a repeated slot name being a multi-valued
    /// slot ([`slots`](format::slots)).
    Slots,
    /// Paddle's MultiSlot text, what `pipe_command` generators (`MultiSlotDataGenerator`)
    /// print: per field in order, a count then that many values ([`multislot`](format::multislot)).
    Multislot,
}

/// How a job's data files are read: the `[data]` section of a job file. Every key is optional;
/// [`Schema::resolve`] fills the defaults of the format and checks the rest.
///
/// ```toml
/// [data]
/// format = "slots"
/// labels = ["click"]
/// dense = [{ name = "dense_feature", width = 13 }]
/// slots = ["1..26"]
/// ```
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// The line format (default `criteo`).
    pub format: Format,
    /// A shell command run over each file (the file on its stdin); its output is read instead
    /// of the file (PaddlePaddle's `pipe_command`, e.g. `"zcat"` or `"grep -v ^#"`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipe_command: Option<String>,
    /// Seconds the `pipe_command` may print nothing before it is killed and the job fails
    /// naming it (default 300, at most a day).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pipe_timeout: Option<u64>,
    /// Label names. `slots`: the label tokens (default `["click"]`); `plain`: one per leading
    /// label column (default `["label"]`); `criteo`: only `["label"]`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<Vec<String>>,
    /// Dense columns. `slots`: dense token names, each appearing `width` times per line (an
    /// absent name gives zeros); `plain`: consecutive column groups after the labels (default:
    /// one column group `dense` of `model.dense_features`); `criteo`: widths adding up to 13.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense: Option<Vec<DenseColumn>>,
    /// Slot names in bag order; an entry may be a range, `"C1..C26"` or `"1..26"`, expanded in
    /// place (see [`expand_names`]). Required by `slots`; `plain` defaults to `"1"`..`"N"` with
    /// N = `model.slots`; `criteo` allows 26 names (default `C1..C26`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub slots: Option<Vec<String>>,
    /// Whether ids are mixed with their slot ([`schema::slot_id`]) so equal raw ids of different
    /// slots differ. `slots`: default true; `plain`: default false (ids used as they are, e.g.
    /// word indices shared across slots); `criteo`: always hashed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hash_slots: Option<bool>,
    /// `multislot` only: the fields of a line in order, label, dense and slot names (ranges
    /// allowed), each exactly once; default: the labels, then the slots, then the dense
    /// columns (PaddleRec's readers: `click 1 .. 26 dense_feature`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<String>>,
    /// Scaling of the dense values after the format's own transform: `standardize` or `minmax`
    /// with `dense_stats` (default none; see [`transform`](read::transform)).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_transform: Option<DenseTransform>,
    /// The training files' dense statistics (`oar data stats`' file, relative to the job file;
    /// a saved model holds the numbers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dense_stats: Option<StatsSource>,
}

/// Turns one line into one sample. Implementations keep their scratch buffers between lines
/// and are atomic: on error nothing is appended and the reason names the token or column.
pub trait LineParser: Send {
    /// Parses `line` (without its newline) and appends its sample to `batch`.
    fn parse(&mut self, line: &[u8], batch: &mut Batch) -> Result<(), String>;
}

/// The parser of `schema`'s format (each reader thread makes its own).
pub fn parser(schema: &Schema) -> Box<dyn LineParser> {
    let inner: Box<dyn LineParser> = match schema.format {
        Format::Criteo => Box::new(format::criteo::CriteoParser),
        Format::Plain => Box::new(format::plain::PlainParser::new(schema)),
        Format::Slots => Box::new(format::slots::SlotsParser::new(schema)),
        Format::Multislot => Box::new(format::multislot::MultiSlotParser::new(schema)),
    };
    match &schema.dense_affine {
        None => inner,
        Some(affine) => Box::new(read::transform::Scaled { inner, affine: affine.clone() }),
    }
}

/// A decimal u64 (digits only, no sign), or None.
#[inline]
pub(crate) fn parse_u64(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 20 {
        return None;
    }
    let mut x = 0u64;
    for &c in v {
        let d = c.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        x = x.checked_mul(10)?.checked_add(d as u64)?;
    }
    Some(x)
}

/// Largest magnitude a label, dense value or weight in the data may have: the bound a push's
/// values must keep (`table::MAX_PUSHED`). A finite value far beyond it (`3e38`) overflows the
/// first layer, and the job then failed on a refused push that named a step, not the line.
pub const MAX_VALUE: f32 = 1e18;

/// `v` as a decimal number within ±[`MAX_VALUE`], or `None`.
#[inline]
pub(crate) fn parse_f32(v: &[u8]) -> Option<f32> {
    // Fast path for the common short forms `0`, `1`, `0.5`.
    match v {
        b"0" => return Some(0.0),
        b"1" => return Some(1.0),
        _ => {}
    }
    let x: f32 = std::str::from_utf8(v).ok()?.parse().ok()?;
    // `x.abs() <= MAX` is false for a NaN as for an infinity.
    (x.abs() <= MAX_VALUE).then_some(x)
}

/// `v` as text for error messages (lossy, cut to 40 bytes).
pub(crate) fn quote(v: &[u8]) -> String {
    let cut = &v[..v.len().min(40)];
    let more = if v.len() > 40 { "..." } else { "" };
    format!("{:?}{more}", String::from_utf8_lossy(cut))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_parse_strictly() {
        assert_eq!(parse_u64(b"18446744073709551615"), Some(u64::MAX));
        for bad in [&b""[..], b"18446744073709551616", b"-1", b"+1", b"1x", b" 1"] {
            assert_eq!(parse_u64(bad), None, "{}", quote(bad));
        }
        assert_eq!(parse_f32(b"0.00497512437811"), Some(0.004_975_124_4));
        assert_eq!(parse_f32(b"-1e-2"), Some(-0.01));
        assert_eq!(
            (parse_f32(b"nan"), parse_f32(b"inf"), parse_f32(b"1e99"), parse_f32(b"")),
            (None, None, None, None)
        );
        assert_eq!((parse_f32(b"-1e18"), parse_f32(b"3e38"), parse_f32(b"-1.1e18")), (Some(-1e18), None, None));
    }

    #[test]
    fn old_data_sections_parse_and_serialize_unchanged() {
        let d: DataConfig = toml::from_str("format = \"plain\"\npipe_command = \"zcat\"\n").unwrap();
        assert_eq!(d, DataConfig { format: Format::Plain, pipe_command: Some("zcat".into()), ..DataConfig::default() });
        assert_eq!(serde_json::to_string(&DataConfig::default()).unwrap(), r#"{"format":"criteo"}"#);
        let old: DataConfig = serde_json::from_str(r#"{"format":"criteo","pipe_command":null}"#).unwrap();
        assert_eq!(old, DataConfig::default());
        let err = toml::from_str::<DataConfig>("format = \"slots\"\nslot = [\"a\"]\n").unwrap_err().to_string();
        assert!(err.contains("slot"), "{err}");
    }

    #[test]
    fn a_full_slots_section_round_trips_through_toml_and_json() {
        let text = "format = \"slots\"\nlabels = [\"click\"]\ndense = [{ name = \"dense_feature\", width = 13 }]\nslots = [\"1..26\"]\nhash_slots = false\n";
        let d: DataConfig = toml::from_str(text).unwrap();
        assert_eq!(d.format, Format::Slots);
        assert_eq!(d.dense.as_ref().unwrap()[0], DenseColumn { name: "dense_feature".into(), width: 13 });
        assert_eq!(toml::from_str::<DataConfig>(&toml::to_string(&d).unwrap()).unwrap(), d);
        assert_eq!(serde_json::from_str::<DataConfig>(&serde_json::to_string(&d).unwrap()).unwrap(), d);
        assert!(toml::from_str::<DataConfig>("dense = [{ name = \"d\", width = 1, wide = 2 }]").is_err());
    }
}
