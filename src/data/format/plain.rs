//! The plain text format of prepared data sets: one sample per line, whitespace-separated
//! columns `label.. dense.. bag..`: the schema's labels, its dense values (the dense columns'
//! widths added up) and one column per slot. Labels and dense values are decimal numbers. A bag
//! column is one id (`7`), several comma-separated ids (`7,8,9`), each optionally weighted
//! (`7:0.5,8`), or `-` for an empty bag. Ids are unsigned integers used as they are (a word's
//! dictionary index, an already hashed feature) unless `hash_slots` mixes them with their slot.
//! The UCI housing and PTB N-gram examples are prepared into it by `oar data prepare`.

use crate::data::{parse_f32, parse_u64, quote, schema::slot_id, Batch, LineParser, Schema};

/// The plain-format [`LineParser`] of a schema.
#[derive(Clone, Debug)]
pub struct PlainParser {
    /// What each column is, for error messages (`label "y"`, `dense "x" value 2`, `slot "3"`).
    columns: Vec<String>,
    label_width: usize,
    dense_width: usize,
    hash: bool,
    values: Vec<f32>,
    ids: Vec<u64>,
    weights: Vec<f32>,
    /// Per bag: end in `ids`, and whether any id had an explicit weight.
    bags: Vec<(usize, bool)>,
}

impl PlainParser {
    /// The parser of `schema` (whose format should be plain).
    pub fn new(schema: &Schema) -> PlainParser {
        let mut columns: Vec<String> = schema.labels.iter().map(|n| format!("label {n:?}")).collect();
        for c in &schema.dense {
            if c.width == 1 {
                columns.push(format!("dense {:?}", c.name));
            } else {
                columns.extend((1..=c.width).map(|k| format!("dense {:?} value {k}", c.name)));
            }
        }
        columns.extend(schema.slots.iter().map(|n| format!("slot {n:?}")));
        PlainParser {
            columns,
            label_width: schema.labels.len(),
            dense_width: schema.dense_width,
            hash: schema.hash_slots,
            values: Vec::new(),
            ids: Vec::new(),
            weights: Vec::new(),
            bags: Vec::new(),
        }
    }

    fn shape(&self) -> String {
        let slots = self.columns.len() - self.label_width - self.dense_width;
        format!("labels {}, dense {}, bags {slots}", self.label_width, self.dense_width)
    }

    /// Parses bag column `f` of slot `slot` into the scratch ids and weights.
    fn bag(&mut self, slot: usize, f: &[u8]) -> Result<(), String> {
        let mut weighted = false;
        if f != b"-" {
            for item in f.split(|&c| c == b',') {
                let (id, w) = match item.iter().position(|&c| c == b':') {
                    Some(k) => (&item[..k], Some(&item[k + 1..])),
                    None => (item, None),
                };
                let Some(raw) = parse_u64(id) else {
                    return Err(format!("id {} is not an unsigned integer", quote(id)));
                };
                let w = match w {
                    None => 1.0,
                    Some(w) => {
                        weighted = true;
                        parse_f32(w)
                            .ok_or_else(|| format!("weight {} of id {raw} is not a number within ±1e18", quote(w)))?
                    }
                };
                self.ids.push(if self.hash { slot_id(slot, raw) } else { raw });
                self.weights.push(w);
            }
        }
        self.bags.push((self.ids.len(), weighted));
        Ok(())
    }
}

impl LineParser for PlainParser {
    fn parse(&mut self, line: &[u8], batch: &mut Batch) -> Result<(), String> {
        self.values.clear();
        self.ids.clear();
        self.weights.clear();
        self.bags.clear();
        let numbers = self.label_width + self.dense_width;
        let total = self.columns.len();
        let mut fields = line.split(u8::is_ascii_whitespace).filter(|f| !f.is_empty());
        for n in 0..total {
            let Some(f) = fields.next() else {
                return Err(format!(
                    "{total} columns expected ({}): column {} ({}) is missing",
                    self.shape(),
                    n + 1,
                    self.columns[n]
                ));
            };
            if n < numbers {
                match parse_f32(f) {
                    Some(v) => self.values.push(v),
                    None => {
                        return Err(format!(
                            "column {} ({}) is not a number within ±1e18: {}",
                            n + 1,
                            self.columns[n],
                            quote(f)
                        ))
                    }
                }
            } else if let Err(e) = self.bag(n - numbers, f) {
                return Err(format!("column {} ({}): {e}", n + 1, self.columns[n]));
            }
        }
        if fields.next().is_some() {
            return Err(format!("more than {total} columns ({})", self.shape()));
        }
        batch.labels.extend_from_slice(&self.values[..self.label_width]);
        batch.dense.extend_from_slice(&self.values[self.label_width..]);
        let mut start = 0;
        for &(end, weighted) in &self.bags {
            batch.push_bag(&self.ids[start..end], weighted.then(|| &self.weights[start..end]));
            start = end;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataConfig, DenseColumn, Format};

    fn schema(labels: &[&str], dense: usize, slots: usize, hash: bool) -> Schema {
        let data = DataConfig {
            format: Format::Plain,
            labels: Some(labels.iter().map(|s| s.to_string()).collect()),
            dense: Some(if dense > 0 { vec![DenseColumn { name: "x".into(), width: dense }] } else { vec![] }),
            slots: Some((1..=slots).map(|s| s.to_string()).collect()),
            hash_slots: Some(hash),
            ..DataConfig::default()
        };
        Schema::resolve(&data, None).unwrap()
    }

    #[test]
    fn parses_dense_and_id_columns_and_names_bad_ones() {
        let s = schema(&["label"], 2, 3, false);
        let mut p = PlainParser::new(&s);
        let mut b = s.new_batch();
        p.parse(b" 24.0  0.5 -1e-2 7 8 9 ", &mut b).unwrap();
        assert_eq!((b.labels.clone(), b.dense.clone(), b.ids.clone()), (vec![24.0], vec![0.5, -0.01], vec![7, 8, 9]));
        assert!(b.offsets.is_empty() && b.weights.is_empty(), "one id per bag stays one-hot");
        let before = b.clone();
        for (line, want) in [
            (&b"1 2 3 4 5"[..], "column 6 (slot \"3\") is missing"),
            (b"1 2 x 4 5 6", "column 3 (dense \"x\" value 2) is not a number within ±1e18: \"x\""),
            (b"1 2 3 4 -5 6", "column 5 (slot \"2\"): id \"-5\" is not an unsigned integer"),
            (b"1 2 3 4 5,,6 6", "column 5 (slot \"2\"): id \"\""),
            (b"1 2 3 4 5:x 6", "column 5 (slot \"2\"): weight \"x\" of id 5"),
            (b"1 2 3 4 5 6 7", "more than 6 columns (labels 1, dense 2, bags 3)"),
            (b"nan 2 3 4 5 6", "column 1 (label \"label\")"),
            (b"", "column 1 (label \"label\") is missing"),
        ] {
            let err = p.parse(line, &mut b).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        assert_eq!(b, before, "bad lines append nothing");
    }

    #[test]
    fn bags_may_hold_many_weighted_ids_or_none() {
        let s = schema(&["ctr", "cvr"], 1, 3, false);
        let mut p = PlainParser::new(&s);
        let mut b = s.new_batch();
        p.parse(b"1 0 0.5 4 - 1,2:0.5,3", &mut b).unwrap();
        p.parse(b"0 0 1.5 5 6 7", &mut b).unwrap();
        assert_eq!((b.len(), b.labels.clone(), b.dense.clone()), (2, vec![1.0, 0.0, 0.0, 0.0], vec![0.5, 1.5]));
        assert_eq!(b.ids, [4, 1, 2, 3, 5, 6, 7]);
        assert_eq!(b.offsets, [0, 1, 1, 4, 5, 6, 7]);
        assert_eq!(b.weights, [1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(b.label_column(1).collect::<Vec<_>>(), [0.0, 0.0]);
    }

    #[test]
    fn hashed_slots_tell_equal_raw_ids_apart() {
        let s = schema(&["y"], 0, 2, true);
        let mut p = PlainParser::new(&s);
        let mut b = s.new_batch();
        p.parse(b"1 7 7", &mut b).unwrap();
        assert_eq!(b.ids, [slot_id(0, 7), slot_id(1, 7)]);
    }
}
