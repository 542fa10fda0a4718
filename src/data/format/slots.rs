//! PaddleRec's slot format (`format = "slots"`): one sample per line, whitespace-separated
//! `name:value` tokens in any order, e.g.
//!
//! ```text
//! click:0 dense_feature:0.0 dense_feature:0.005 .. 1:737395 2:210498 2:210499 26:306163
//! ```
//!
//! - a label token (`click:1`) gives a label as a decimal number; each declared label must
//!   appear exactly once;
//! - a dense token (`dense_feature:0.5`) gives the next value of its dense column; a column of
//!   width `w` appears `w` times, or not at all (zeros);
//! - a slot token (`2:210498`) adds a u64 decimal id to its slot's bag: a repeated slot name is
//!   a multi-valued slot, an absent one an empty bag. oar's extension `slot:id:weight` (e.g.
//!   `tags:17:0.5`) gives the id a weight (default 1);
//! - tokens of undeclared names are skipped.
//!
//! Ids are mixed with their slot ([`slot_id`]) unless `hash_slots = false`. The parser keeps a
//! scratch bag per slot, so a line allocates nothing once the buffers have grown.

use hashbrown::HashMap;

use crate::data::{parse_f32, parse_u64, quote, schema::slot_id, Batch, LineParser, Schema};

/// What a token name stands for.
#[derive(Clone, Copy, Debug)]
enum Target {
    Label(usize),
    Dense(usize),
    Slot(usize),
}

/// Names that are small decimal numbers (PaddleRec's `1`..`26`) are looked up in a table.
const SMALL: usize = 1024;

/// `name` as a small number, if it is one written without leading zeros.
#[inline]
fn small_number(name: &[u8]) -> Option<usize> {
    if name.is_empty() || name.len() > 4 || (name.len() > 1 && name[0] == b'0') {
        return None;
    }
    parse_u64(name).map(|n| n as usize).filter(|&n| n < SMALL)
}

/// A dense column: name, first value in the sample, width.
#[derive(Clone, Debug)]
struct Column {
    name: String,
    start: usize,
    width: usize,
}

/// The slots-format [`LineParser`] of a schema.
#[derive(Clone, Debug)]
pub struct SlotsParser {
    small: Vec<Option<Target>>,
    named: HashMap<Box<[u8]>, Target, foldhash::fast::FixedState>,
    labels: Vec<String>,
    columns: Vec<Column>,
    slots: Vec<String>,
    hash: bool,
    // Per-line scratch.
    label_values: Vec<Option<f32>>,
    dense: Vec<f32>,
    dense_count: Vec<usize>,
    ids: Vec<Vec<u64>>,
    weights: Vec<Vec<f32>>,
    weighted: Vec<bool>,
}

impl SlotsParser {
    /// The parser of `schema` (whose format should be slots).
    pub fn new(schema: &Schema) -> SlotsParser {
        let mut columns = Vec::new();
        let mut start = 0;
        for c in &schema.dense {
            columns.push(Column { name: c.name.clone(), start, width: c.width });
            start += c.width;
        }
        let targets = (schema.labels.iter().enumerate().map(|(i, n)| (n, Target::Label(i))))
            .chain(schema.dense.iter().enumerate().map(|(i, c)| (&c.name, Target::Dense(i))))
            .chain(schema.slots.iter().enumerate().map(|(i, n)| (n, Target::Slot(i))));
        let mut small = Vec::new();
        let mut named = HashMap::with_hasher(foldhash::fast::FixedState::default());
        for (name, target) in targets {
            match small_number(name.as_bytes()) {
                Some(n) => {
                    if small.len() <= n {
                        small.resize(n + 1, None);
                    }
                    small[n] = Some(target);
                }
                None => {
                    named.insert(name.as_bytes().into(), target);
                }
            }
        }
        let s = schema.slots.len();
        SlotsParser {
            small,
            named,
            labels: schema.labels.clone(),
            columns,
            slots: schema.slots.clone(),
            hash: schema.hash_slots,
            label_values: vec![None; schema.labels.len()],
            dense: vec![0.0; schema.dense_width],
            dense_count: vec![0; schema.dense.len()],
            ids: vec![Vec::new(); s],
            weights: vec![Vec::new(); s],
            weighted: vec![false; s],
        }
    }

    #[inline]
    fn target(&self, name: &[u8]) -> Option<Target> {
        match small_number(name) {
            Some(n) => self.small.get(n).copied().flatten(),
            None => self.named.get(name).copied(),
        }
    }

    /// Applies one token to the scratch sample.
    #[inline]
    fn token(&mut self, target: Target, name: &[u8], value: &[u8]) -> Result<(), String> {
        match target {
            Target::Slot(s) => {
                let (id, w) = match value.iter().position(|&c| c == b':') {
                    Some(k) => (&value[..k], Some(&value[k + 1..])),
                    None => (value, None),
                };
                let raw = parse_u64(id)
                    .ok_or_else(|| format!("slot {}: id {} is not an unsigned integer", quote(name), quote(id)))?;
                let w = match w {
                    None => 1.0,
                    Some(w) => {
                        self.weighted[s] = true;
                        parse_f32(w).ok_or_else(|| {
                            format!(
                                "slot {}: weight {} of id {raw} is not a number within ±1e18",
                                quote(name),
                                quote(w)
                            )
                        })?
                    }
                };
                self.ids[s].push(if self.hash { slot_id(s, raw) } else { raw });
                self.weights[s].push(w);
            }
            Target::Label(i) => {
                if self.label_values[i].is_some() {
                    return Err(format!("label {} appears twice", quote(name)));
                }
                let v = parse_f32(value)
                    .ok_or_else(|| format!("label {}: {} is not a number within ±1e18", quote(name), quote(value)))?;
                self.label_values[i] = Some(v);
            }
            Target::Dense(c) => {
                let Column { start, width, .. } = self.columns[c];
                let n = self.dense_count[c];
                if n == width {
                    return Err(format!("dense {} appears more than {width} times", quote(name)));
                }
                self.dense[start + n] = parse_f32(value)
                    .ok_or_else(|| format!("dense {}: {} is not a number within ±1e18", quote(name), quote(value)))?;
                self.dense_count[c] = n + 1;
            }
        }
        Ok(())
    }

    fn clear(&mut self) {
        self.label_values.fill(None);
        self.dense.fill(0.0);
        self.dense_count.fill(0);
        for s in 0..self.slots.len() {
            self.ids[s].clear();
            self.weights[s].clear();
        }
        self.weighted.fill(false);
    }
}

impl LineParser for SlotsParser {
    fn parse(&mut self, line: &[u8], batch: &mut Batch) -> Result<(), String> {
        self.clear();
        let mut last: (&[u8], Option<Target>) = (&[], None);
        for tok in line.split(u8::is_ascii_whitespace).filter(|t| !t.is_empty()) {
            let Some(k) = tok.iter().position(|&c| c == b':') else {
                return Err(format!("token {} is not name:value", quote(tok)));
            };
            let (name, value) = (&tok[..k], &tok[k + 1..]);
            // A multi-valued slot repeats its name: look it up once.
            if name != last.0 {
                last = (name, self.target(name));
            }
            if let Some(target) = last.1 {
                self.token(target, name, value)?;
            }
        }
        if let Some(i) = self.label_values.iter().position(Option::is_none) {
            return Err(format!("label {:?} is missing", self.labels[i]));
        }
        for (c, &n) in self.columns.iter().zip(&self.dense_count) {
            if n != 0 && n != c.width {
                return Err(format!("dense {:?} appears {n} times, expected {} (or none)", c.name, c.width));
            }
        }
        batch.labels.extend(self.label_values.iter().map(|v| v.unwrap_or_default()));
        batch.dense.extend_from_slice(&self.dense);
        for s in 0..self.slots.len() {
            batch.push_bag(&self.ids[s], self.weighted[s].then_some(&self.weights[s][..]));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::{DataConfig, DenseColumn, Format};

    fn schema(labels: &[&str], dense: &[(&str, usize)], slots: &[&str], hash: bool) -> Schema {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        let data = DataConfig {
            format: Format::Slots,
            labels: Some(strings(labels)),
            dense: Some(dense.iter().map(|&(n, w)| DenseColumn { name: n.into(), width: w }).collect()),
            slots: Some(strings(slots)),
            hash_slots: Some(hash),
            ..DataConfig::default()
        };
        Schema::resolve(&data, None).unwrap()
    }

    #[test]
    fn multi_valued_weighted_absent_and_unknown_tokens() {
        let s = schema(&["click"], &[("d", 2), ("e", 1)], &["user", "tags", "query", "7"], false);
        let mut p = SlotsParser::new(&s);
        let mut b = s.new_batch();
        p.parse(b"click:1 d:0.5 d:-1 user:42 tags:3 tags:4 tags:3 junk:9 query:8:0.25 query:9 7:70\r", &mut b).unwrap();
        p.parse(b"7:71 user:43 click:0", &mut b).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(b.labels, [1.0, 0.0]);
        assert_eq!(b.dense, [0.5, -1.0, 0.0, 0.0, 0.0, 0.0], "absent dense columns are zeros");
        assert_eq!(b.ids, [42, 3, 4, 3, 8, 9, 70, 43, 71]);
        assert_eq!(b.offsets, [0, 1, 4, 6, 7, 8, 8, 8, 9], "absent slots are empty bags");
        assert_eq!(b.weights, [1.0, 1.0, 1.0, 1.0, 0.25, 1.0, 1.0, 1.0, 1.0]);
    }

    #[test]
    fn one_id_per_slot_stays_one_hot_and_ids_are_hashed_per_slot() {
        let s = schema(&["click"], &[], &["1", "2"], true);
        let mut p = SlotsParser::new(&s);
        let mut b = s.new_batch();
        p.parse(b"click:1 1:5 2:5", &mut b).unwrap();
        assert!(b.offsets.is_empty() && b.weights.is_empty());
        assert_eq!(b.ids, [slot_id(0, 5), slot_id(1, 5)]);
    }

    #[test]
    fn bad_lines_append_nothing_and_name_the_token() {
        let s = schema(&["click", "buy"], &[("d", 2)], &["1", "tags"], false);
        let mut p = SlotsParser::new(&s);
        let mut b = s.new_batch();
        p.parse(b"click:1 buy:0 d:1 d:2 1:5 tags:1:2", &mut b).unwrap();
        let before = b.clone();
        for (line, want) in [
            (&b"buy:0 1:5"[..], "label \"click\" is missing"),
            (b"click:1 buy:0 click:0", "label \"click\" appears twice"),
            (b"click:x buy:0", "label \"click\": \"x\" is not a number within ±1e18"),
            (b"click:1 buy:0 d:1", "dense \"d\" appears 1 times, expected 2"),
            (b"click:1 buy:0 d:1 d:2 d:3", "dense \"d\" appears more than 2 times"),
            (b"click:1 buy:0 d:1 d:nan", "dense \"d\": \"nan\""),
            (b"click:1 buy:0 1:-5", "slot \"1\": id \"-5\" is not an unsigned integer"),
            (b"click:1 buy:0 1:", "slot \"1\": id \"\""),
            (b"click:1 buy:0 tags:3:", "slot \"tags\": weight \"\" of id 3"),
            (b"click:1 buy:0 tags:3:1:2", "slot \"tags\": weight \"1:2\""),
            (b"click:1 buy:0 tags", "token \"tags\" is not name:value"),
            (b"click:1 buy:0 1:99999999999999999999", "slot \"1\": id"),
        ] {
            let err = p.parse(line, &mut b).unwrap_err();
            assert!(err.contains(want), "{err}");
        }
        assert_eq!(b, before, "bad lines append nothing");
        p.parse(b"click:0 buy:1", &mut b).unwrap();
        assert_eq!(b.len(), 2, "the parser recovers after bad lines");
        assert_eq!(b.bag(2), 2..2);
    }

    #[test]
    fn small_numbers_and_other_names_do_not_mix() {
        let s = schema(&["click"], &[], &["01", "1", "1000", "1024", "x"], false);
        let mut p = SlotsParser::new(&s);
        let mut b = s.new_batch();
        p.parse(b"click:1 1024:5 x:6 01:1 1:2 1000:4 0:9 001:9", &mut b).unwrap();
        assert_eq!(b.ids, [1, 2, 4, 5, 6]);
    }

    #[test]
    fn paddlerec_slot_sample_parses_completely() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../shared/data/criteo/paddlerec_slot_sample_train.txt");
        let Ok(text) = std::fs::read(&path) else {
            println!("skipped: {} is absent", path.display());
            return;
        };
        let data: DataConfig = toml::from_str(
            "format = \"slots\"\nlabels = [\"click\"]\ndense = [{ name = \"dense_feature\", width = 13 }]\nslots = [\"1..26\"]\n",
        )
        .unwrap();
        let s = Schema::resolve(&data, None).unwrap();
        let mut p = crate::data::parser(&s);
        let mut b = s.new_batch();
        for (n, line) in text.split(|&c| c == b'\n').filter(|l| !l.is_empty()).enumerate() {
            p.parse(line, &mut b).unwrap_or_else(|e| panic!("line {}: {e}", n + 1));
        }
        assert_eq!((b.len(), b.slots, b.dense_width, b.label_width), (80, 26, 13, 1));
        assert_eq!(b.ids.len(), 80 * 26, "one id per slot in the sample");
        assert!(b.offsets.is_empty() && b.weights.is_empty());
        assert_eq!(b.labels[0], 0.0);
        assert_eq!(b.dense[1], 0.004_975_124_4);
        assert_eq!(b.ids[0], slot_id(0, 737_395));
        assert_eq!(b.ids[25], slot_id(25, 306_163));
        assert!(b.labels.iter().all(|&y| y == 0.0 || y == 1.0));
    }
}
