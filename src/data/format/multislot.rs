//! Paddle's MultiSlot text (`format = "multislot"`): what a `pipe_command` generator built on
//! `MultiSlotDataGenerator` prints, one sample per line; for each field in order (`[data]
//! fields`), the number of its values, then the values, all whitespace-separated:
//!
//! ```text
//! 1 0   1 737395   2 210498 210499   13 0.0 0.005 ..
//! ```
//!
//! (`click` = 0; slot `1` holds one id, slot `2` two; then the 13 values of `dense_feature`.)
//!
//! - a label field has a count of 1 and a decimal number;
//! - a dense field has a count equal to its column's width;
//! - a slot field has any count of u64 decimal ids (0: an empty bag, which Paddle's generator
//!   would refuse to print but is read here as one), mixed with their slot ([`slot_id`]) unless
//!   `hash_slots = false`.
//!
//! A line with fewer or more values than its fields declare is an error naming the field.

use crate::data::schema::{slot_id, Field};
use crate::data::{parse_f32, parse_u64, quote, Batch, LineParser, Schema};

/// The most values one field may announce: a count beyond it is taken for a damaged line, not
/// an allocation.
pub const MAX_COUNT: u64 = 1 << 20;

/// The multislot [`LineParser`] of a schema.
#[derive(Clone, Debug)]
pub struct MultiSlotParser {
    fields: Vec<Field>,
    /// Per field, its name, for messages.
    names: Vec<String>,
    /// Per dense column, its first value in the sample and its width.
    columns: Vec<(usize, usize)>,
    hash: bool,
    // Per-line scratch.
    labels: Vec<f32>,
    dense: Vec<f32>,
    ids: Vec<Vec<u64>>,
}

impl MultiSlotParser {
    /// The parser of `schema` (whose format should be multislot).
    pub fn new(schema: &Schema) -> MultiSlotParser {
        let mut columns = Vec::new();
        let mut start = 0;
        for c in &schema.dense {
            columns.push((start, c.width));
            start += c.width;
        }
        let names = schema.field_names();
        MultiSlotParser {
            fields: schema.fields.clone(),
            names,
            columns,
            hash: schema.hash_slots,
            labels: vec![0.0; schema.labels.len()],
            dense: vec![0.0; schema.dense_width],
            ids: vec![Vec::new(); schema.slots.len()],
        }
    }
}

impl LineParser for MultiSlotParser {
    fn parse(&mut self, line: &[u8], batch: &mut Batch) -> Result<(), String> {
        let mut tokens = line.split(u8::is_ascii_whitespace).filter(|t| !t.is_empty());
        let n = self.fields.len();
        for (k, (&field, name)) in self.fields.iter().zip(&self.names).enumerate() {
            let Some(count) = tokens.next() else {
                return Err(format!("field {name:?} is missing: the line ends after {k} of its {n} fields"));
            };
            let count = parse_u64(count)
                .filter(|&c| c <= MAX_COUNT)
                .ok_or_else(|| format!("field {name:?}: count {} is not a number up to {MAX_COUNT}", quote(count)))?
                as usize;
            let mut value = |i: usize| {
                tokens.next().ok_or_else(|| format!("field {name:?}: the line ends after {i} of its {count} values"))
            };
            match field {
                Field::Label(i) => {
                    if count != 1 {
                        return Err(format!("label {name:?} has {count} values, not 1"));
                    }
                    let v = value(0)?;
                    self.labels[i] = parse_f32(v)
                        .ok_or_else(|| format!("label {name:?}: {} is not a number within ±1e18", quote(v)))?;
                }
                Field::Dense(c) => {
                    let (start, width) = self.columns[c];
                    if count != width {
                        return Err(format!("dense {name:?} has {count} values, not its width {width}"));
                    }
                    for j in 0..width {
                        let v = value(j)?;
                        self.dense[start + j] = parse_f32(v)
                            .ok_or_else(|| format!("dense {name:?}: {} is not a number within ±1e18", quote(v)))?;
                    }
                }
                Field::Slot(s) => {
                    self.ids[s].clear();
                    for j in 0..count {
                        let v = value(j)?;
                        let raw = parse_u64(v)
                            .ok_or_else(|| format!("slot {name:?}: id {} is not an unsigned integer", quote(v)))?;
                        self.ids[s].push(if self.hash { slot_id(s, raw) } else { raw });
                    }
                }
            }
        }
        if let Some(extra) = tokens.next() {
            let more = 1 + tokens.count();
            return Err(format!(
                "{more} value(s) after the last field, from {}: the line holds more fields than [data] declares",
                quote(extra)
            ));
        }
        batch.labels.extend_from_slice(&self.labels);
        batch.dense.extend_from_slice(&self.dense);
        for ids in &self.ids {
            batch.push_bag(ids, None);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataConfig, DenseColumn, Format};

    fn schema(fields: Option<&[&str]>, hash: bool) -> Schema {
        let data = DataConfig {
            format: Format::Multislot,
            dense: Some(vec![DenseColumn { name: "dense_feature".into(), width: 2 }]),
            slots: Some(vec!["1..3".into()]),
            hash_slots: Some(hash),
            fields: fields.map(|f| f.iter().map(|s| s.to_string()).collect()),
            ..DataConfig::default()
        };
        Schema::resolve(&data, None).unwrap()
    }

    fn parse(schema: &Schema, lines: &[&str]) -> Result<Batch, String> {
        let mut p = MultiSlotParser::new(schema);
        let mut b = schema.new_batch();
        for l in lines {
            p.parse(l.as_bytes(), &mut b)?;
        }
        Ok(b)
    }

    #[test]
    fn reads_paddlerecs_default_order_and_a_declared_one() {
        // PaddleRec's order: click, the sparse slots, then the dense feature.
        let s = schema(None, false);
        let b = parse(&s, &["1 1   1 7   2 8 9   0   2 0.5 0.25", "1 0 1 4 1 5 1 6 2 1 2"]).unwrap();
        assert_eq!(b.labels, [1.0, 0.0]);
        assert_eq!(b.dense, [0.5, 0.25, 1.0, 2.0]);
        let bags: Vec<Vec<u64>> = (0..6).map(|k| b.bag(k).map(|i| b.ids[i]).collect()).collect();
        assert_eq!(bags, [vec![7], vec![8, 9], vec![], vec![4], vec![5], vec![6]]);
        // The same sample in another declared order, ids hashed per slot.
        let s = schema(Some(&["dense_feature", "3", "1..2", "click"]), true);
        let b = parse(&s, &["2 0.5 0.25 0 1 7 2 8 9 1 1"]).unwrap();
        assert_eq!((b.labels.clone(), b.dense.clone()), (vec![1.0], vec![0.5, 0.25]));
        assert_eq!(b.ids, [slot_id(0, 7), slot_id(1, 8), slot_id(1, 9)]);
    }

    #[test]
    fn damaged_lines_name_their_field_and_append_nothing() {
        let s = schema(None, false);
        for (line, says) in [
            ("1 1 1 7 2 8 9 0", "field \"dense_feature\" is missing: the line ends after 4 of its 5 fields"),
            ("1 1 1 7 2 8", "field \"2\": the line ends after 1 of its 2 values"),
            ("2 1 0 1 7 2 8 9 0 2 0.5 0.25", "label \"click\" has 2 values, not 1"),
            ("1 x 1 7 2 8 9 0 2 0.5 0.25", "label \"click\": \"x\" is not a number within ±1e18"),
            ("1 1 1 -7 2 8 9 0 2 0.5 0.25", "slot \"1\": id \"-7\" is not an unsigned integer"),
            ("1 1 1 7 2 8 9 0 3 0.5 0.25 1", "dense \"dense_feature\" has 3 values, not its width 2"),
            ("1 1 1 7 2 8 9 0 2 0.5 nan", "dense \"dense_feature\": \"nan\" is not a number within ±1e18"),
            ("1 1 1 7 2 8 9 0 2 0.5 0.25 3", "1 value(s) after the last field, from \"3\""),
            ("1 1 99999999999 7", "count \"99999999999\" is not a number up to 1048576"),
        ] {
            let mut p = MultiSlotParser::new(&s);
            let mut b = s.new_batch();
            let err = p.parse(line.as_bytes(), &mut b).unwrap_err();
            assert!(err.contains(says), "{line:?}: {err}");
            assert!(b.is_empty() && b.ids.is_empty() && b.dense.is_empty(), "{line:?} appended nothing");
        }
    }

    #[test]
    fn a_field_order_names_every_declared_field_once() {
        let resolve = |fields: &[&str]| {
            let data = DataConfig {
                format: Format::Multislot,
                slots: Some(vec!["a".into(), "b".into()]),
                fields: Some(fields.iter().map(|s| s.to_string()).collect()),
                ..DataConfig::default()
            };
            Schema::resolve(&data, None)
        };
        assert_eq!(resolve(&["b", "click", "a"]).unwrap().fields, [Field::Slot(1), Field::Label(0), Field::Slot(0)]);
        assert!(resolve(&["a", "click"]).unwrap_err().contains("\"b\" is declared but has no place"));
        assert!(resolve(&["a", "a", "b", "click"]).unwrap_err().contains("\"a\" is named twice"));
        assert!(resolve(&["a", "b", "c", "click"]).unwrap_err().contains("\"c\" is not a declared"));
        let plain = DataConfig { fields: Some(vec!["a".into()]), ..DataConfig::default() };
        assert!(Schema::resolve(&plain, None).unwrap_err().contains("only the multislot format"));
    }
}
