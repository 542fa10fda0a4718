//! The resolved shape of a data set: a [`DataConfig`] with the defaults of its format filled in
//! and checked once, before any file is read.
//!
//! | format   | labels            | dense                         | slots                    | ids                |
//! |----------|-------------------|-------------------------------|--------------------------|--------------------|
//! | `criteo` | `["label"]` only  | `I` x 13 (widths adding to 13) | `C1..C26` (26 names)     | always hashed      |
//! | `plain`  | default `["label"]` | default `dense` x `model.dense_features` | default `1..N`, N = `model.slots` | raw (default) |
//! | `slots`  | default `["click"]` | default none                | required                 | hashed (default)   |
//!
//! Names are non-empty, without whitespace or `:`, and unique across labels, dense columns and
//! slots. A slot entry `"C1..C26"` or `"1..26"` is a range ([`expand_names`]).

use serde::{Deserialize, Serialize};

use super::{Batch, DataConfig, Format};
use crate::base::layout::mix64;

/// A named group of dense values: `width` consecutive values of each sample.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DenseColumn {
    /// The name (in the `slots` format: the token name, repeated `width` times per line).
    pub name: String,
    /// Values per sample.
    pub width: usize,
}

/// The most names one range may expand to.
pub const MAX_RANGE: u64 = 1 << 16;
/// The most slots a layout may have: 600 ranges of a 10 KB job file expanded to 39 million
/// names (2.3 GB) before this bound.
pub const MAX_SLOTS: usize = 1 << 16;
/// The most dense values per sample: widths near `u64::MAX` wrapped when added up.
pub const MAX_DENSE: usize = 1 << 20;

/// What a label column may hold, as the loss of the head reading it says; checked line by
/// line, so a bad label is named (or skipped with `--skip-bad-lines`) where it stands. A click
/// of 3e38 stopped a distributed job with a refused push, and one of -7 trained on silently.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LabelBound {
    /// Any finite number (a squared-error head's, or a column no head reads).
    #[default]
    Any,
    /// A probability, 0 to 1 (a log-loss head's).
    Probability,
    /// A class index below this (a softmax head's).
    Class(usize),
}

impl LabelBound {
    /// Why `y` is not a label of this kind, if it is not.
    fn check(self, y: f32) -> Result<(), String> {
        match self {
            LabelBound::Any => Ok(()),
            LabelBound::Probability if (0.0..=1.0).contains(&y) => Ok(()),
            LabelBound::Probability => Err(format!("{y:?}: a log-loss label is 0 to 1")),
            LabelBound::Class(n) if y >= 0.0 && y.fract() == 0.0 && (y as usize) < n => Ok(()),
            LabelBound::Class(n) => Err(format!("{y:?}: a softmax label is a class index below the output width {n}")),
        }
    }
}

/// A validated data layout (see the module doc).
#[derive(Clone, Debug, PartialEq)]
pub struct Schema {
    /// The line format.
    pub format: Format,
    /// Label names, one label per sample each (the batch's `label_width`).
    pub labels: Vec<String>,
    /// Dense columns in sample order.
    pub dense: Vec<DenseColumn>,
    /// Dense values per sample (the widths of `dense` added up).
    pub dense_width: usize,
    /// Slot names in bag order.
    pub slots: Vec<String>,
    /// Whether ids are mixed with their slot index ([`slot_id`]).
    pub hash_slots: bool,
    /// A shell command each file is piped through.
    pub pipe_command: Option<String>,
    /// Seconds the `pipe_command` may print nothing before it is killed and named.
    pub pipe_timeout: u64,
    /// `multislot`: what each field of a line fills, in line order (empty for other formats).
    pub fields: Vec<Field>,
    /// The scaling of the dense values after the format's own transform, if any.
    pub dense_affine: Option<super::read::transform::Affine>,
    /// What each label may hold (empty: any finite number), set from the model's heads.
    pub label_bounds: Vec<LabelBound>,
}

/// One field of a MultiSlot line: a count, then that many values for this target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Field {
    /// Label `i` (a count of 1).
    Label(usize),
    /// Dense column `c` (a count of its width).
    Dense(usize),
    /// Slot `s` (any count: its bag of ids).
    Slot(usize),
}

/// The id of raw id `raw` in slot `slot` when slots are hashed:
/// `mix64(raw ^ (slot + 1).reverse_bits())`. A bijection of the raw ids of each slot, and
/// injective over (slot, raw) pairs while raw ids stay below 2^(64 - b), b the bits of
/// `slot + 1` (2^59 for up to 31 slots), so equal raw ids of different slots get different ids.
#[inline]
pub fn slot_id(slot: usize, raw: u64) -> u64 {
    mix64(raw ^ (slot as u64 + 1).reverse_bits())
}

/// Checks one name; `key` is the `[data]` key it came from.
fn check_name(key: &str, name: &str) -> Result<(), String> {
    if name.is_empty() || name.contains(|c: char| c.is_whitespace() || c == ':') {
        return Err(format!("[data] {key}: name {name:?} must be non-empty, without whitespace or ':'"));
    }
    Ok(())
}

/// Splits `s` into a prefix and its trailing decimal digits.
fn split_number(s: &str) -> Option<(&str, &str)> {
    let digits = s.bytes().rev().take_while(u8::is_ascii_digit).count();
    (digits > 0).then(|| s.split_at(s.len() - digits))
}

/// Expands one slot entry: a plain name stands for itself; `P<a>..P<b>` (or `P<a>..<b>`) for
/// the names `P<a>`, `P<a+1>`, .., `P<b>` (inclusive, `a <= b`; a zero-padded `a` pads them
/// all to its width): `"C1..C26"` gives C1..C26, `"1..26"` gives 1..26, `"x3..x1"` is an error.
pub fn expand_names(spec: &str) -> Result<Vec<String>, String> {
    let Some((a, b)) = spec.split_once("..") else {
        check_name("slots", spec)?;
        return Ok(vec![spec.to_string()]);
    };
    let bad = |why: &str| format!("[data] slots: range {spec:?} {why} (ranges look like \"C1..C26\" or \"1..26\")");
    let (prefix, first) = split_number(a).ok_or_else(|| bad("does not start with a name ending in a number"))?;
    let last = b.strip_prefix(prefix).filter(|l| !l.is_empty()).unwrap_or(b);
    if last.is_empty() || !last.bytes().all(|c| c.is_ascii_digit()) {
        return Err(bad(&format!("does not end in {prefix:?} followed by a number")));
    }
    let (x, y): (u64, u64) = match (first.parse(), last.parse()) {
        (Ok(x), Ok(y)) => (x, y),
        _ => return Err(bad("has a number too large")),
    };
    if x > y {
        return Err(bad("runs backwards"));
    }
    if y - x >= MAX_RANGE {
        return Err(bad(&format!("has more than {MAX_RANGE} names")));
    }
    let width = if first.len() > 1 && first.starts_with('0') { first.len() } else { 0 };
    let names: Vec<String> = (x..=y).map(|n| format!("{prefix}{n:0width$}")).collect();
    for n in &names {
        check_name("slots", n)?;
    }
    Ok(names)
}

/// `prefix1..prefixN` (no names when `n` is 0).
/// The fields of a MultiSlot line: `order` (names or ranges) resolved against the declared
/// names, each exactly once; by default labels, slots, then dense columns.
fn field_order(
    order: Option<&[String]>,
    labels: &[String],
    dense: &[DenseColumn],
    slots: &[String],
) -> Result<Vec<Field>, String> {
    let every = labels
        .iter()
        .enumerate()
        .map(|(i, n)| (n.as_str(), Field::Label(i)))
        .chain(slots.iter().enumerate().map(|(i, n)| (n.as_str(), Field::Slot(i))))
        .chain(dense.iter().enumerate().map(|(i, c)| (c.name.as_str(), Field::Dense(i))));
    let Some(order) = order else { return Ok(every.map(|(_, f)| f).collect()) };
    let by_name: std::collections::HashMap<&str, Field> = every.clone().collect();
    let mut fields = Vec::new();
    // A set beside the list: with tens of thousands of slots, a search of the list per name
    // took billions of steps.
    let mut placed = std::collections::HashSet::new();
    for spec in order {
        for name in expand_names(spec).map_err(|e| e.replace("[data] slots", "[data] fields"))? {
            let field = *by_name
                .get(name.as_str())
                .ok_or_else(|| format!("[data] fields: {name:?} is not a declared label, dense column or slot"))?;
            if !placed.insert(field) {
                return Err(format!("[data] fields: {name:?} is named twice"));
            }
            fields.push(field);
        }
    }
    if let Some((name, _)) = every.into_iter().find(|(_, f)| !placed.contains(f)) {
        return Err(format!("[data] fields: {name:?} is declared but has no place in the line"));
    }
    Ok(fields)
}

fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{prefix}{i}")).collect()
}

impl Schema {
    /// The Criteo schema: label `label`, dense column `I` of width 13 (I1..I13), slots
    /// `C1`..`C26`, ids hashed.
    pub fn criteo() -> Schema {
        Schema {
            format: Format::Criteo,
            labels: vec!["label".into()],
            dense: vec![DenseColumn { name: "I".into(), width: super::format::criteo::DENSE }],
            dense_width: super::format::criteo::DENSE,
            slots: numbered("C", super::format::criteo::SLOTS),
            hash_slots: true,
            pipe_command: None,
            pipe_timeout: super::read::pipe::DEFAULT_SILENCE_SECS,
            fields: Vec::new(),
            dense_affine: None,
            label_bounds: Vec::new(),
        }
    }

    /// The names of a MultiSlot line's fields, in line order (empty for other formats).
    pub fn field_names(&self) -> Vec<String> {
        self.fields
            .iter()
            .map(|f| match *f {
                Field::Label(i) => self.labels[i].clone(),
                Field::Dense(c) => self.dense[c].name.clone(),
                Field::Slot(s) => self.slots[s].clone(),
            })
            .collect()
    }

    /// Resolves and checks `data`. `shorthand` = the model's legacy (slots, dense_features)
    /// counts, used for the plain format when `[data]` does not declare them (plain slot names
    /// default to "1".."N", dense to one column named "dense" of that width). Errors are one
    /// line naming the `[data]` key.
    pub fn resolve(data: &DataConfig, shorthand: Option<(usize, usize)>) -> Result<Schema, String> {
        let declared_slots = match &data.slots {
            Some(specs) => {
                let mut names = Vec::new();
                for s in specs {
                    names.extend(expand_names(s)?);
                    if names.len() > MAX_SLOTS {
                        return Err(format!("[data] slots: more than {MAX_SLOTS} slot names"));
                    }
                }
                Some(names)
            }
            None => None,
        };
        let (labels, dense, slots, hash_slots) = match data.format {
            Format::Criteo => {
                let c = Schema::criteo();
                if let Some(l) = data.labels.as_ref().filter(|l| **l != c.labels) {
                    return Err(format!("[data] labels: the criteo format has one label, \"label\" (found {l:?})"));
                }
                if let Some(d) = &data.dense {
                    let w = d.iter().fold(0usize, |w, c| w.saturating_add(c.width));
                    if w != c.dense_width {
                        return Err(format!(
                            "[data] dense: the criteo format has {} dense values (I1..I13) but the declared widths add up to {w}",
                            c.dense_width
                        ));
                    }
                }
                if let Some(s) = declared_slots.as_ref().filter(|s| s.len() != c.slots.len()) {
                    return Err(format!(
                        "[data] slots: the criteo format has {} slots (C1..C26) but {} are declared",
                        c.slots.len(),
                        s.len()
                    ));
                }
                if data.hash_slots == Some(false) {
                    return Err(
                        "[data] hash_slots: criteo ids are always hashed with their slot (remove hash_slots)".into()
                    );
                }
                // The model's shorthand counts read every column of the format or none: another
                // count was ignored, and the manifest recorded a model that was not trained.
                if let Some((slots, dense)) = shorthand {
                    let (has_slots, has_dense) = (c.slots.len(), c.dense_width);
                    for (key, n, has) in [("slots", slots, has_slots), ("dense_features", dense, has_dense)] {
                        if n != 0 && n != has {
                            return Err(format!(
                                "model.{key} = {n}: the criteo format has {has} (0 reads none of them; leave it out \
                                 for all)"
                            ));
                        }
                    }
                }
                (c.labels, data.dense.clone().unwrap_or(c.dense), declared_slots.unwrap_or(c.slots), true)
            }
            Format::Plain => {
                let slots = match (declared_slots, shorthand) {
                    (Some(s), _) => s,
                    (None, Some((n, _))) if n > MAX_SLOTS => {
                        return Err(format!("[data] slots: {n} slots (model.slots), at most {MAX_SLOTS}"))
                    }
                    (None, Some((n, _))) => numbered("", n),
                    (None, None) => {
                        return Err("[data] slots: the plain format needs its bag columns named, e.g. slots = [\"1..4\"] (or model.slots)".into());
                    }
                };
                let dense = match (&data.dense, shorthand) {
                    (Some(d), _) => d.clone(),
                    (None, Some((_, w))) if w > 0 => vec![DenseColumn { name: "dense".into(), width: w }],
                    (None, _) => Vec::new(),
                };
                let labels = data.labels.clone().unwrap_or_else(|| vec!["label".into()]);
                (labels, dense, slots, data.hash_slots.unwrap_or(false))
            }
            Format::Slots | Format::Multislot => {
                let Some(slots) = declared_slots else {
                    return Err(format!(
                        "[data] slots: the {} format needs its slot names declared, e.g. slots = [\"1..26\"]",
                        if data.format == Format::Slots { "slots" } else { "multislot" }
                    ));
                };
                let labels = data.labels.clone().unwrap_or_else(|| vec!["click".into()]);
                (labels, data.dense.clone().unwrap_or_default(), slots, data.hash_slots.unwrap_or(true))
            }
        };
        if labels.is_empty() {
            return Err("[data] labels: at least one label is needed".into());
        }
        let mut seen: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
        let named = labels
            .iter()
            .map(|n| ("labels", n))
            .chain(dense.iter().map(|c| ("dense", &c.name)))
            .chain(slots.iter().map(|n| ("slots", n)));
        for (key, name) in named {
            check_name(key, name)?;
            if let Some(first) = seen.insert(name, key) {
                return Err(format!("[data] {key}: {name:?} is declared twice (also in [data] {first})"));
            }
        }
        if let Some(c) = dense.iter().find(|c| c.width == 0) {
            return Err(format!("[data] dense: column {:?} has width 0", c.name));
        }
        let fields = match (data.format, &data.fields) {
            (Format::Multislot, order) => field_order(order.as_deref(), &labels, &dense, &slots)?,
            (_, None) => Vec::new(),
            (_, Some(_)) => return Err("[data] fields: only the multislot format has an order of fields".into()),
        };
        let dense_width = dense.iter().fold(0usize, |w, c| w.saturating_add(c.width));
        if dense_width > MAX_DENSE {
            return Err(format!("[data] dense: {dense_width} dense values per sample, at most {MAX_DENSE}"));
        }
        let pipe_timeout = data.pipe_timeout.unwrap_or(super::read::pipe::DEFAULT_SILENCE_SECS);
        super::read::pipe::check_silence(pipe_timeout)?;
        let transform = data.dense_transform.unwrap_or_default();
        let dense_affine = match (&data.dense_stats, transform) {
            (_, super::DenseTransform::None) => None,
            (None, _) => {
                return Err(
                    "[data] dense_transform needs dense_stats (the training files' statistics: oar data stats, or give --train and they are computed)".into()
                )
            }
            (Some(super::StatsSource::File(f)), _) => {
                return Err(format!("[data] dense_stats: {f:?} was not read (job files read it when they are read)"))
            }
            (Some(super::StatsSource::Inline(stats)), t) => super::read::transform::Affine::new(t, stats, dense_width)?,
        };
        Ok(Schema {
            format: data.format,
            dense_width,
            dense_affine,
            labels,
            dense,
            slots,
            hash_slots,
            pipe_command: data.pipe_command.clone(),
            pipe_timeout,
            fields,
            label_bounds: Vec::new(),
        })
    }

    /// Why a sample's `labels` do not fit [`label_bounds`](Self::label_bounds), naming the
    /// label, if they do not.
    pub fn check_labels(&self, labels: &[f32]) -> Result<(), String> {
        for ((bound, y), name) in self.label_bounds.iter().zip(labels).zip(&self.labels) {
            bound.check(*y).map_err(|e| format!("label {name:?} is {e}"))?;
        }
        Ok(())
    }

    /// The index of slot `name` (its bag's position in each sample).
    pub fn slot_index(&self, name: &str) -> Option<usize> {
        self.slots.iter().position(|s| s == name)
    }

    /// Labels per sample.
    pub fn label_width(&self) -> usize {
        self.labels.len()
    }

    /// An empty batch of this shape.
    pub fn new_batch(&self) -> Batch {
        Batch::new(self.labels.len(), self.dense_width, self.slots.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(format: Format) -> DataConfig {
        DataConfig { format, ..DataConfig::default() }
    }

    fn strings(v: &[&str]) -> Option<Vec<String>> {
        Some(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn ranges_expand_in_place_and_bad_ones_say_why() {
        assert_eq!(expand_names("C1..C3").unwrap(), ["C1", "C2", "C3"]);
        assert_eq!(expand_names("1..3").unwrap(), ["1", "2", "3"]);
        assert_eq!(expand_names("f8..10").unwrap(), ["f8", "f9", "f10"]);
        assert_eq!(expand_names("s08..s10").unwrap(), ["s08", "s09", "s10"]);
        assert_eq!(expand_names("x2..x2").unwrap(), ["x2"]);
        assert_eq!(expand_names("tags").unwrap(), ["tags"]);
        assert_eq!(expand_names("C1..C26").unwrap().len(), 26);
        for (bad, why) in [
            ("x3..x1", "backwards"),
            ("x..x3", "ending in a number"),
            ("x1..y3", "\"x\" followed by a number"),
            ("x1..", "followed by a number"),
            ("x1..99999999999999999999", "too large"),
            ("0..100000", "more than"),
            ("a b", "whitespace"),
            ("a:b", "':'"),
            ("", "non-empty"),
        ] {
            let err = expand_names(bad).unwrap_err();
            assert!(err.contains(why) && err.starts_with("[data] slots"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_criteo_schema_is_fixed_and_refuses_other_shapes() {
        let s = Schema::resolve(&DataConfig::default(), Some((26, 13))).unwrap();
        assert_eq!(s, Schema::criteo());
        assert_eq!((s.label_width(), s.dense_width, s.slots.len(), s.hash_slots), (1, 13, 26, true));
        assert_eq!(s.slot_index("C3"), Some(2));
        let named = DataConfig {
            labels: strings(&["label"]),
            dense: Some(vec![DenseColumn { name: "ints".into(), width: 13 }]),
            slots: strings(&["cat1..cat26"]),
            hash_slots: Some(true),
            ..data(Format::Criteo)
        };
        assert_eq!(Schema::resolve(&named, None).unwrap().slot_index("cat26"), Some(25));
        for (bad, key) in [
            (DataConfig { labels: strings(&["click"]), ..data(Format::Criteo) }, "[data] labels"),
            (DataConfig { labels: strings(&["label", "cvr"]), ..data(Format::Criteo) }, "[data] labels"),
            (
                DataConfig { dense: Some(vec![DenseColumn { name: "I".into(), width: 12 }]), ..data(Format::Criteo) },
                "[data] dense",
            ),
            (DataConfig { slots: strings(&["C1..C25"]), ..data(Format::Criteo) }, "[data] slots"),
            (DataConfig { hash_slots: Some(false), ..data(Format::Criteo) }, "[data] hash_slots"),
        ] {
            let err = Schema::resolve(&bad, None).unwrap_err();
            assert!(err.starts_with(key), "{err}");
        }
    }

    #[test]
    fn criteo_refuses_shorthand_counts_it_would_ignore() {
        let data = DataConfig::default();
        assert!(Schema::resolve(&data, Some((26, 13))).is_ok());
        assert!(Schema::resolve(&data, Some((0, 13))).is_ok());
        assert!(Schema::resolve(&data, Some((26, 0))).is_ok());
        let e = Schema::resolve(&data, Some((5, 13))).unwrap_err();
        assert!(e.starts_with("model.slots = 5: the criteo format has 26"), "{e}");
        let e = Schema::resolve(&data, Some((26, 100_000_000_000))).unwrap_err();
        assert!(e.starts_with("model.dense_features = 100000000000: the criteo format has 13"), "{e}");
    }

    #[test]
    fn plain_falls_back_on_the_model_shorthand() {
        let s = Schema::resolve(&data(Format::Plain), Some((4, 13))).unwrap();
        assert_eq!(s.labels, ["label"]);
        assert_eq!(s.dense, [DenseColumn { name: "dense".into(), width: 13 }]);
        assert_eq!(s.slots, ["1", "2", "3", "4"]);
        assert!(!s.hash_slots);
        let s = Schema::resolve(&data(Format::Plain), Some((0, 13))).unwrap();
        assert_eq!((s.slots.len(), s.dense_width), (0, 13));
        let s = Schema::resolve(&data(Format::Plain), Some((4, 0))).unwrap();
        assert!(s.dense.is_empty());
        let declared = DataConfig {
            labels: strings(&["ctr", "cvr"]),
            dense: Some(vec![DenseColumn { name: "a".into(), width: 2 }, DenseColumn { name: "b".into(), width: 3 }]),
            slots: strings(&["user", "w1..w3"]),
            hash_slots: Some(true),
            ..data(Format::Plain)
        };
        let s = Schema::resolve(&declared, Some((9, 9))).unwrap();
        assert_eq!((s.label_width(), s.dense_width, s.slots.len(), s.hash_slots), (2, 5, 4, true));
        assert_eq!(s.new_batch(), Batch::new(2, 5, 4));
        let err = Schema::resolve(&data(Format::Plain), None).unwrap_err();
        assert!(err.starts_with("[data] slots"), "{err}");
    }

    #[test]
    fn slots_need_declaring_and_names_must_be_unique() {
        let err = Schema::resolve(&data(Format::Slots), Some((26, 13))).unwrap_err();
        assert!(err.starts_with("[data] slots") && err.contains("declared"), "{err}");
        let paddle = DataConfig {
            labels: strings(&["click"]),
            dense: Some(vec![DenseColumn { name: "dense_feature".into(), width: 13 }]),
            slots: strings(&["1..26"]),
            ..data(Format::Slots)
        };
        let s = Schema::resolve(&paddle, None).unwrap();
        assert_eq!((s.label_width(), s.dense_width, s.slots.len(), s.hash_slots), (1, 13, 26, true));
        assert_eq!(s.slot_index("26"), Some(25));
        assert_eq!(s.slot_index("27"), None);
        let s = Schema::resolve(&DataConfig { slots: strings(&["a"]), ..data(Format::Slots) }, None).unwrap();
        assert_eq!((s.labels.clone(), s.dense_width), (vec!["click".to_string()], 0));

        for (bad, want) in [
            (DataConfig { slots: strings(&["1..26", "3"]), ..paddle.clone() }, "[data] slots: \"3\" is declared twice"),
            (DataConfig { slots: strings(&["click"]), ..paddle.clone() }, "also in [data] labels"),
            (DataConfig { slots: strings(&["x3..x1"]), ..paddle.clone() }, "runs backwards"),
            (DataConfig { labels: Some(vec![]), ..paddle.clone() }, "[data] labels: at least one"),
            (DataConfig { labels: strings(&["a:b"]), ..paddle.clone() }, "[data] labels: name \"a:b\""),
            (
                DataConfig { dense: Some(vec![DenseColumn { name: "d".into(), width: 0 }]), ..paddle.clone() },
                "[data] dense: column \"d\" has width 0",
            ),
        ] {
            let err = Schema::resolve(&bad, None).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn slot_ids_separate_slots_and_keep_raw_ids_apart() {
        assert_ne!(slot_id(0, 5), slot_id(1, 5));
        assert_ne!(slot_id(0, 5), slot_id(0, 6));
        let mut all: Vec<u64> = (0..30).flat_map(|s| (0..100).map(move |r| slot_id(s, r))).collect();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 3000);
    }

    /// Sizes from a job file or a saved model's manifest are bounded before anything is made
    /// of them: widths near u64::MAX wrapped to 13 when added up, and 600 ranges of a 10 KB
    /// file expanded to 39 million slot names.
    #[test]
    fn wrapped_widths_and_too_many_names_are_refused() {
        let wide = |w: usize| DenseColumn { name: "a".into(), width: w };
        let plain = DataConfig {
            dense: Some(vec![wide(usize::MAX), DenseColumn { name: "b".into(), width: 14 }]),
            slots: Some(vec!["s".into()]),
            ..data(Format::Plain)
        };
        let err = Schema::resolve(&plain, None).unwrap_err();
        assert!(err.contains("at most 1048576"), "{err}");
        let criteo = DataConfig { dense: plain.dense.clone(), ..data(Format::Criteo) };
        let err = Schema::resolve(&criteo, None).unwrap_err();
        assert!(err.contains("declared widths add up to 18446744073709551615"), "{err}");
        let ranges: Vec<String> = (0..3).map(|k| format!("a{k}x0..a{k}x65535")).collect();
        let many = DataConfig { slots: Some(ranges), ..data(Format::Slots) };
        let err = Schema::resolve(&many, None).unwrap_err();
        assert!(err.contains("more than 65536 slot names"), "{err}");
        let err = Schema::resolve(&data(Format::Plain), Some((1 << 40, 0))).unwrap_err();
        assert!(err.contains("at most 65536"), "{err}");
    }
}
