//! KServe's v2 inference protocol (the Open Inference Protocol), the pure part: an `infer`
//! request's JSON turned into a [`Batch`] of the served model's data, and the scores turned into
//! the response. No I/O: the HTTP edge is [`super`].
//!
//! A request carries either one BYTES input named `lines` (raw data lines in the job's format,
//! read by the job's own parser, label fields included and ignored) or typed tensors named as the
//! export's complete model's inputs: `dense` FP32 `[N, width]`, per slot `S.ids` INT64 or UINT64
//! `[N, K]`, optional `S.lengths` INT64 `[N]` (default `K`) and `S.weights` FP32 `[N, K]`
//! (default 1), and optionally one FP32 `[N]` per label column (a softmax head scores the class
//! named there; default 0).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::base::batch::Batch;
use crate::data::Schema;

pub use super::binary::{parse, Request};

/// The most samples one request may carry.
pub const MAX_ROWS: usize = 1 << 20;
/// Samples a typed request may ask for without a value among them.
pub const MOST_EMPTY_ROWS: usize = 1024;

/// One tensor of a request or response: its elements are `data` (JSON) or, with the binary
/// tensor extension, `parameters.binary_data_size` bytes after the JSON ([`super::binary`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Tensor {
    /// Its name.
    pub name: String,
    /// Its shape.
    pub shape: Vec<u64>,
    /// `BYTES`, `FP32`, `INT64`, `UINT64`, ...
    pub datatype: String,
    /// The elements, row-major (nested arrays are flattened); absent when they are binary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Its parameters: `binary_data_size` among them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Map<String, Value>>,
}

/// An output a request asks for, and how (`parameters.binary_data`).
#[derive(Clone, Debug, Deserialize)]
pub struct RequestedOutput {
    /// The output's name.
    pub name: String,
    /// Its parameters.
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
}

/// An `infer` request's JSON.
#[derive(Clone, Debug, Deserialize)]
pub struct InferRequest {
    /// Echoed in the response.
    #[serde(default)]
    pub id: Option<String>,
    /// The inputs.
    pub inputs: Vec<Tensor>,
    /// The outputs asked for (all of them when absent).
    #[serde(default)]
    pub outputs: Option<Vec<RequestedOutput>>,
    /// The request's parameters: `binary_data_output` among them.
    #[serde(default)]
    pub parameters: Option<Map<String, Value>>,
}

/// An `infer` response's JSON.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InferResponse {
    /// The model's name.
    pub model_name: String,
    /// The model's version: its passes completed.
    pub model_version: String,
    /// The request's id, if it had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// One output per head asked for.
    pub outputs: Vec<Tensor>,
}

/// Checks a served model's name (`oar serve --name`): it is a segment of every URL, so 1 to 64
/// letters, digits, `-`, `_` or `.`, not starting with `.` (an empty name or one holding `/`
/// was served at URLs no plain client could name).
pub fn check_model_name(name: &str) -> Result<(), BadRequest> {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    if (1..=64).contains(&name.len()) && name.chars().all(plain) && !name.starts_with('.') {
        return Ok(());
    }
    Err(format!("--name {name:?}: 1 to 64 letters, digits, '-', '_' or '.' (not first), as it is part of every URL"))
}

/// A request's error, answered with status 400 and `{"error": ...}`.
pub type BadRequest = String;

/// One input of a request: its JSON, and its bytes when they came binary.
#[derive(Clone, Copy)]
pub(super) struct Input<'a> {
    pub(super) t: &'a Tensor,
    pub(super) raw: Option<&'a [u8]>,
}

impl std::ops::Deref for Input<'_> {
    type Target = Tensor;
    fn deref(&self) -> &Tensor {
        self.t
    }
}

fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

/// The number of elements `shape` holds, if it fits in a `u64`.
fn count(shape: &[u64]) -> Option<u64> {
    shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d))
}

/// A JSON tensor's elements, checked against its shape.
fn elements(t: &Tensor) -> Result<Vec<&Value>, BadRequest> {
    let mut out = Vec::new();
    if let Some(data) = &t.data {
        flatten(data, &mut out);
    }
    if count(&t.shape) != Some(out.len() as u64) {
        return Err(format!("input {:?}: shape {:?} does not match its {} elements", t.name, t.shape, out.len()));
    }
    Ok(out)
}

fn floats(input: Input) -> Result<Vec<f32>, BadRequest> {
    let t = input.t;
    // Within the bound a data file's values keep (±1e18, as `lines` inputs and training read
    // them): a typed 3.4e38 saturated the scores to 0 or 1 where the same line was refused.
    let finite = |x: f64| {
        Some(x as f32).filter(|x| x.abs() <= crate::data::MAX_VALUE).ok_or_else(|| {
            format!("input {:?}: {x} is not a finite number within ±{:e}", t.name, crate::data::MAX_VALUE)
        })
    };
    match (t.datatype.as_str(), input.raw) {
        ("FP32", Some(raw)) => {
            super::binary::fixed::<4>(t, raw)?.map(|b| finite(f32::from_le_bytes(b) as f64)).collect()
        }
        ("FP64", Some(raw)) => super::binary::fixed::<8>(t, raw)?.map(|b| finite(f64::from_le_bytes(b))).collect(),
        ("FP32" | "FP64", None) => elements(t)?
            .iter()
            .map(|v| {
                v.as_f64().ok_or_else(|| format!("input {:?}: {v} is not a finite number", t.name)).and_then(finite)
            })
            .collect(),
        (other, _) => Err(format!("input {:?}: datatype {other} (FP32 expected)", t.name)),
    }
}

fn ints(input: Input) -> Result<Vec<u64>, BadRequest> {
    use super::binary::fixed;
    let t = input.t;
    // INT64 ids are the u64 ids bit-cast, as the export's graphs take them.
    match (t.datatype.as_str(), input.raw) {
        ("INT64" | "UINT64", Some(raw)) => Ok(fixed::<8>(t, raw)?.map(u64::from_le_bytes).collect()),
        ("INT32", Some(raw)) => Ok(fixed::<4>(t, raw)?.map(|b| i32::from_le_bytes(b) as i64 as u64).collect()),
        ("UINT32", Some(raw)) => Ok(fixed::<4>(t, raw)?.map(|b| u32::from_le_bytes(b) as u64).collect()),
        (kind @ ("INT64" | "INT32" | "UINT64" | "UINT32"), None) => {
            let signed = kind.starts_with('I');
            elements(t)?
                .iter()
                .map(|v| {
                    let x = if signed { v.as_i64().map(|i| i as u64) } else { v.as_u64() };
                    x.ok_or_else(|| format!("input {:?}: {v} is not a {kind}", t.name))
                })
                .collect()
        }
        (other, _) => Err(format!("input {:?}: datatype {other} (INT64 or UINT64 expected)", t.name)),
    }
}

/// The request's samples as a batch of `schema`'s data; `reads` are the slots the model looks
/// up (their ids are required in a typed request).
pub fn batch(req: &Request, schema: &Schema, reads: &[bool]) -> Result<Batch, BadRequest> {
    let inputs = &req.head.inputs;
    match inputs.as_slice() {
        [t] if t.name == "lines" => lines_batch(req.input(0), schema),
        _ if inputs.iter().any(|t| t.name == "lines") => {
            Err("input \"lines\" comes alone (raw lines, or typed tensors, not both)".into())
        }
        _ => typed_batch(req, schema, reads),
    }
}

fn lines_batch(input: Input, schema: &Schema) -> Result<Batch, BadRequest> {
    let t = input.t;
    if t.datatype != "BYTES" {
        return Err(format!("input \"lines\": datatype {} (BYTES expected)", t.datatype));
    }
    let lines: Vec<&[u8]> = match input.raw {
        Some(raw) => super::binary::strings(t, raw)?,
        None => elements(t)?
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().map(str::as_bytes).ok_or_else(|| format!("lines[{i}] is not a string")))
            .collect::<Result<_, _>>()?,
    };
    if lines.len() > MAX_ROWS {
        return Err(format!("{} lines, more than {MAX_ROWS} in one request", lines.len()));
    }
    if lines.is_empty() {
        return Err("no lines".into());
    }
    super::predict::lines_batch(schema, lines)
}

/// The position of the first input named `name`.
fn find_first(inputs: &[Tensor], name: &str) -> usize {
    inputs.iter().position(|t| t.name == name).unwrap_or_default()
}

fn typed_batch(req: &Request, schema: &Schema, reads: &[bool]) -> Result<Batch, BadRequest> {
    let find = |name: &str| req.head.inputs.iter().position(|t| t.name == name).map(|i| req.input(i));
    let known = |name: &str| {
        name == "dense"
            || schema.labels.iter().any(|l| l == name)
            || schema.slots.iter().any(|s| [".ids", ".lengths", ".weights"].iter().any(|x| format!("{s}{x}") == name))
    };
    let inputs = &req.head.inputs;
    if let Some(t) = inputs.iter().find(|t| !known(&t.name)) {
        return Err(format!(
            "unknown input {:?} (lines, dense, SLOT.ids, SLOT.lengths, SLOT.weights, a label)",
            t.name
        ));
    }
    // Each by name once: a second one was ignored without a word.
    if let Some((i, t)) = inputs.iter().enumerate().find(|(i, t)| inputs[..*i].iter().any(|o| o.name == t.name)) {
        return Err(format!("input {:?} comes twice (inputs {} and {i})", t.name, find_first(inputs, &t.name)));
    }
    let rows = inputs.first().and_then(|t| t.shape.first()).copied().ok_or("no inputs, or an input without a shape")?;
    let rows = usize::try_from(rows).unwrap_or(usize::MAX);
    if rows == 0 {
        return Err("no samples".into());
    }
    if rows > MAX_ROWS {
        return Err(format!("{rows} samples, more than {MAX_ROWS} in one request"));
    }
    if let Some(t) = inputs.iter().find(|t| t.shape.first() != Some(&(rows as u64))) {
        return Err(format!("input {:?}: {:?} samples, the first input has {rows}", t.name, t.shape.first()));
    }
    // Work follows the samples, so past a few they must come with the bytes: a few hundred
    // bytes of `[1048576, 0]` shapes otherwise asked for a million empty samples (30 s of
    // scoring). A sample of empty bags alone is still a sample (a user with no history).
    // From the shapes, which each input's elements are checked against when read below.
    let values = inputs.iter().map(|t| count(&t.shape).unwrap_or(u64::MAX)).fold(0u64, u64::saturating_add);
    if rows as u64 > values.max(MOST_EMPTY_ROWS as u64) {
        return Err(format!(
            "{rows} samples but {values} values in all the inputs: past {MOST_EMPTY_ROWS}, each sample needs at least one"
        ));
    }
    let mut batch = Batch::new(schema.labels.len(), schema.dense_width, schema.slots.len());
    let mut labels = vec![vec![0.0; rows]; schema.labels.len()];
    for (l, name) in schema.labels.iter().enumerate() {
        if let Some(t) = find(name) {
            labels[l] = floats(t)?;
            if labels[l].len() != rows {
                return Err(format!("input {name:?}: {rows} labels expected, found {}", labels[l].len()));
            }
        }
    }
    let dense = match (find("dense"), schema.dense_width) {
        (_, 0) => Vec::new(),
        (Some(t), w) if t.shape == [rows as u64, w as u64] => {
            // As the format gives them (the export's `dense` input); scaled as the reader would.
            let mut v = floats(t)?;
            if let Some(a) = &schema.dense_affine {
                a.apply(&mut v);
            }
            v
        }
        (Some(t), w) => return Err(format!("input \"dense\": shape {:?}, [{rows}, {w}] expected", t.shape)),
        (None, w) => return Err(format!("input \"dense\" (FP32 [{rows}, {w}]) is missing")),
    };
    // Per slot: ids [rows, k], lengths, weights.
    let mut slots = Vec::new();
    for (s, name) in schema.slots.iter().enumerate() {
        let Some(t) = find(&format!("{name}.ids")) else {
            if reads[s] {
                return Err(format!("input \"{name}.ids\" is missing (the model looks slot {name} up)"));
            }
            slots.push(None);
            continue;
        };
        let [_, k] = t.shape[..] else {
            return Err(format!("input \"{name}.ids\": shape {:?}, [N, K] expected", t.shape));
        };
        let ids = ints(t)?;
        let k = k as usize;
        let lengths = match find(&format!("{name}.lengths")) {
            Some(l) => ints(l)?.into_iter().map(|n| n as usize).collect(),
            None => vec![k; rows],
        };
        if lengths.len() != rows || lengths.iter().any(|&n| n > k) {
            return Err(format!("input \"{name}.lengths\": {rows} lengths of at most {k} expected"));
        }
        let weights = match find(&format!("{name}.weights")) {
            Some(w) if w.shape == t.shape => Some(floats(w)?),
            Some(w) => return Err(format!("input \"{name}.weights\": shape {:?}, as {name}.ids expected", w.shape)),
            None => None,
        };
        slots.push(Some((k, ids, lengths, weights)));
    }
    for r in 0..rows {
        batch.labels.extend(labels.iter().map(|l| l[r]));
        batch.dense.extend_from_slice(&dense[r * schema.dense_width..(r + 1) * schema.dense_width]);
        for slot in &slots {
            match slot {
                None => batch.push_bag(&[], None),
                Some((k, ids, lengths, weights)) => {
                    let at = r * k;
                    let n = lengths[r];
                    batch.push_bag(&ids[at..at + n], weights.as_ref().map(|w| &w[at..at + n]));
                }
            }
        }
    }
    Ok(batch)
}

/// The outputs a request asks for, as indices into the served `names`, each with whether its
/// elements go binary: every output when the request names none, binary when the request's
/// `binary_data_output` or the output's `binary_data` parameter says so (as `tritonclient` asks
/// by default).
pub fn wanted(req: &InferRequest, names: &[String]) -> Result<Vec<(usize, bool)>, BadRequest> {
    let flag = |params: &Option<Map<String, Value>>, key: &str| match params.as_ref().and_then(|p| p.get(key)) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(format!("parameter {key:?}: {other} is not true or false")),
    };
    let all_binary = flag(&req.parameters, "binary_data_output")?.unwrap_or(false);
    let asked = match &req.outputs {
        Some(list) if !list.is_empty() => list,
        _ => return Ok((0..names.len()).map(|i| (i, all_binary)).collect()),
    };
    let mut out: Vec<(usize, bool)> = Vec::with_capacity(asked.len());
    for o in asked {
        let Some(i) = names.iter().position(|n| *n == o.name) else {
            return Err(format!("unknown output {:?} (this model answers {})", o.name, names.join(", ")));
        };
        if out.iter().any(|&(j, _)| j == i) {
            return Err(format!("output {:?} asked for twice", o.name));
        }
        if o.parameters.as_ref().is_some_and(|p| p.contains_key("classification")) {
            return Err(format!("output {:?}: the classification extension is not supported", o.name));
        }
        out.push((i, flag(&o.parameters, "binary_data")?.unwrap_or(all_binary)));
    }
    Ok(out)
}

/// The response to a request that asked for `wanted` ([`wanted`]): one FP32 `[N, 1]` output per
/// head asked for, named as the export names them, its elements in the JSON or after it.
pub fn response(
    model_name: &str,
    version: u32,
    id: Option<String>,
    names: &[String],
    scores: &[Vec<f32>],
    wanted: &[(usize, bool)],
) -> super::binary::Answer {
    let mut tail = Vec::new();
    let outputs = wanted
        .iter()
        .map(|&(i, binary)| {
            let s = &scores[i];
            let (data, parameters) = if binary {
                tail.extend(s.iter().flat_map(|v| v.to_le_bytes()));
                let size = Map::from_iter([("binary_data_size".to_string(), Value::from(s.len() * 4))]);
                (None, Some(size))
            } else {
                (Some(Value::Array(s.iter().map(|&v| Value::from(v as f64)).collect())), None)
            };
            Tensor { name: names[i].clone(), shape: vec![s.len() as u64, 1], datatype: "FP32".into(), data, parameters }
        })
        .collect();
    let head = InferResponse { model_name: model_name.into(), model_version: version.to_string(), id, outputs };
    super::binary::Answer::new(&head, tail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(json: &str) -> Request<'static> {
        parse(json.to_string().leak().as_bytes(), None).unwrap()
    }

    #[test]
    fn a_model_name_is_one_plain_url_segment() {
        for good in ["oar", "ctr-dnn_v2.1", "A"] {
            assert!(check_model_name(good).is_ok(), "{good}");
        }
        for bad in ["", "a/b", ".hidden", "..", "a b", "é", &"x".repeat(65)] {
            assert!(check_model_name(bad).unwrap_err().contains("--name"), "{bad}");
        }
    }

    #[test]
    fn lines_are_read_by_the_jobs_parser() {
        let schema = Schema::criteo();
        let line = format!("1{}{}", "\t1".repeat(13), "\t68fd1e64".repeat(26));
        let r = req(&serde_json::json!({"inputs": [{"name": "lines", "shape": [2], "datatype": "BYTES", "data": [line, line]}]})
            .to_string());
        let b = batch(&r, &schema, &[true; 26]).unwrap();
        assert_eq!(b.len(), 2);
        let bad = req(r#"{"inputs":[{"name":"lines","shape":[1],"datatype":"BYTES","data":["2\tx"]}]}"#);
        assert!(batch(&bad, &schema, &[true; 26]).unwrap_err().starts_with("lines[0]: label"));
    }

    #[test]
    fn typed_tensors_make_the_same_bags() {
        let data = crate::data::DataConfig {
            format: crate::data::Format::Plain,
            slots: Some(vec!["a".into(), "b".into()]),
            dense: Some(vec![]),
            hash_slots: Some(false),
            ..Default::default()
        };
        let schema = Schema::resolve(&data, None).unwrap();
        let r = req(r#"{"inputs":[
            {"name":"a.ids","shape":[2,2],"datatype":"UINT64","data":[[7,8],[9,0]]},
            {"name":"a.lengths","shape":[2],"datatype":"INT64","data":[2,1]},
            {"name":"a.weights","shape":[2,2],"datatype":"FP32","data":[0.5,1,2,0]}]}"#);
        let b = batch(&r, &schema, &[true, false]).unwrap();
        assert_eq!(b.len(), 2);
        assert_eq!(&b.ids[b.bag(0)], &[7, 8]);
        assert_eq!(&b.ids[b.bag(2)], &[9]);
        assert!(b.bag(1).is_empty() && b.bag(3).is_empty());
        assert_eq!(b.weight(b.bag(0).start), 0.5);
        // A slot the model reads must be given; shapes must add up; names must be known.
        let missing = req(r#"{"inputs":[{"name":"b.ids","shape":[1,1],"datatype":"INT64","data":[1]}]}"#);
        assert!(batch(&missing, &schema, &[true, false]).unwrap_err().contains("\"a.ids\" is missing"));
        let torn = req(r#"{"inputs":[{"name":"a.ids","shape":[2,2],"datatype":"INT64","data":[1,2,3]}]}"#);
        assert!(batch(&torn, &schema, &[true, false]).unwrap_err().contains("does not match"));
        let huge =
            req(r#"{"inputs":[{"name":"a.ids","shape":[18446744073709551615,2],"datatype":"INT64","data":[1]}]}"#);
        assert!(batch(&huge, &schema, &[true, false]).is_err());
        let nan = req(r#"{"inputs":[{"name":"a.ids","shape":[1,1],"datatype":"INT64","data":[1]},
            {"name":"a.weights","shape":[1,1],"datatype":"FP32","data":["NaN"]}]}"#);
        assert!(batch(&nan, &schema, &[true, false]).unwrap_err().contains("not a finite number"));
        // Empty bags are samples, but a million of them must come with the bytes.
        let empty = |n: usize| {
            req(&format!(r#"{{"inputs":[{{"name":"a.ids","shape":[{n},0],"datatype":"INT64","data":[]}}]}}"#))
        };
        assert_eq!(batch(&empty(MOST_EMPTY_ROWS), &schema, &[true, false]).unwrap().len(), MOST_EMPTY_ROWS);
        let flood = batch(&empty(1 << 20), &schema, &[true, false]).unwrap_err();
        assert!(flood.contains("1048576 samples but 0 values"), "{flood}");
        let unknown = req(r#"{"inputs":[{"name":"c.ids","shape":[1,1],"datatype":"INT64","data":[1]}]}"#);
        assert!(batch(&unknown, &schema, &[true, false]).unwrap_err().starts_with("unknown input \"c.ids\""));
    }

    #[test]
    fn outputs_go_binary_when_asked_and_only_those_named() {
        let names = ["click".to_string(), "ctr".to_string()];
        let head = |json: &str| req(json).head;
        let none = r#""inputs":[{"name":"x","shape":[0],"datatype":"FP32","data":[]}]"#;
        assert_eq!(wanted(&head(&format!("{{{none}}}")), &names).unwrap(), [(0, false), (1, false)]);
        let all = head(&format!(r#"{{{none},"parameters":{{"binary_data_output":true}}}}"#));
        assert_eq!(wanted(&all, &names).unwrap(), [(0, true), (1, true)]);
        let one = head(&format!(r#"{{{none},"outputs":[{{"name":"ctr","parameters":{{"binary_data":true}}}}]}}"#));
        assert_eq!(wanted(&one, &names).unwrap(), [(1, true)]);
        for (outputs, says) in [
            (r#"[{"name":"cvr"}]"#, "unknown output \"cvr\" (this model answers click, ctr)"),
            (r#"[{"name":"ctr"},{"name":"ctr"}]"#, "asked for twice"),
            (r#"[{"name":"ctr","parameters":{"classification":2}}]"#, "classification"),
            (r#"[{"name":"ctr","parameters":{"binary_data":"yes"}}]"#, "is not true or false"),
        ] {
            let e = wanted(&head(&format!(r#"{{{none},"outputs":{outputs}}}"#)), &names).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let answer = response("m", 3, None, &names, &[vec![0.25], vec![0.5]], &[(1, true), (0, false)]);
        let n = answer.header_len.unwrap();
        let head: InferResponse = serde_json::from_slice(&answer.body[..n]).unwrap();
        assert_eq!(
            (head.outputs[0].name.as_str(), head.outputs[1].data.clone()),
            ("ctr", Some(serde_json::json!([0.25])))
        );
        assert_eq!(answer.body[n..], 0.5f32.to_le_bytes());
    }
}
