//! KServe v2's binary tensor extension, the pure part: a request body split into its JSON and
//! the inputs' bytes, and a response's outputs put after its JSON. No I/O.
//!
//! A request with the header `Inference-Header-Content-Length: N` has N bytes of JSON first; the
//! rest of the body holds, in the order of the inputs, the elements of every input whose
//! `parameters.binary_data_size` gives their byte count: fixed-size elements little-endian, a
//! `BYTES` element as a 4-byte little-endian length and then its bytes. A response does the same
//! for the outputs asked for binary ([`super::v2::wanted`]), and its
//! `Inference-Header-Content-Length` says where its JSON ends. This is what NVIDIA's
//! `tritonclient` sends and asks for by default.
//!
//! Every byte count a request declares is checked against the bytes that arrived and against
//! the tensor's shape before anything is read; bytes left over are refused, as is an input
//! with both `data` and binary bytes.

use super::v2::{BadRequest, InferRequest, InferResponse, Input, Tensor};

/// A parsed `infer` request: its JSON, and per input its binary bytes if they came so.
pub struct Request<'a> {
    /// The request's JSON.
    pub head: InferRequest,
    raw: Vec<Option<&'a [u8]>>,
}

impl Request<'_> {
    /// Input `i`: its JSON and its bytes.
    pub(super) fn input(&self, i: usize) -> Input<'_> {
        Input { t: &self.head.inputs[i], raw: self.raw[i] }
    }
}

/// Reads an `infer` body: all JSON when `header_len` (the request's
/// `Inference-Header-Content-Length`) is absent, else that many bytes of JSON and then the
/// inputs' binary data.
pub fn parse<'a>(body: &'a [u8], header_len: Option<&str>) -> Result<Request<'a>, BadRequest> {
    let (json, mut tail) = match header_len {
        None => (body, &[][..]),
        Some(h) => {
            let n: usize =
                h.trim().parse().map_err(|_| format!("Inference-Header-Content-Length {h:?} is not a byte count"))?;
            if n > body.len() {
                return Err(format!("Inference-Header-Content-Length {n} is past the body's {} bytes", body.len()));
            }
            body.split_at(n)
        }
    };
    let head: InferRequest = serde_json::from_slice(json).map_err(|e| format!("not an infer request: {e}"))?;
    let mut raw = Vec::with_capacity(head.inputs.len());
    for t in &head.inputs {
        let params = t.parameters.as_ref();
        if params.is_some_and(|p| p.keys().any(|k| k.starts_with("shared_memory"))) {
            return Err(format!("input {:?}: shared memory is not supported; send the data in the request", t.name));
        }
        let size = match params.and_then(|p| p.get("binary_data_size")) {
            None => None,
            Some(v) => Some(
                v.as_u64().ok_or_else(|| format!("input {:?}: binary_data_size {v} is not a byte count", t.name))?,
            ),
        };
        match (size, &t.data) {
            (None, Some(_)) => raw.push(None),
            (None, None) => return Err(format!("input {:?}: neither data nor binary_data_size", t.name)),
            (Some(_), Some(_)) => return Err(format!("input {:?}: both data and binary_data_size", t.name)),
            (Some(n), None) => {
                if n > tail.len() as u64 {
                    return Err(format!(
                        "input {:?}: binary_data_size {n}, but {} bytes of binary data remain in the body",
                        t.name,
                        tail.len()
                    ));
                }
                let (mine, rest) = tail.split_at(n as usize);
                raw.push(Some(mine));
                tail = rest;
            }
        }
    }
    if !tail.is_empty() {
        return Err(format!("{} bytes of binary data that no input's binary_data_size claims", tail.len()));
    }
    Ok(Request { head, raw })
}

/// A tensor's binary elements of `N` bytes each, once their count is checked against its shape.
pub(super) fn fixed<'a, const N: usize>(
    t: &Tensor,
    raw: &'a [u8],
) -> Result<impl Iterator<Item = [u8; N]> + 'a, BadRequest> {
    let want = t.shape.iter().try_fold(N as u64, |a, &d| a.checked_mul(d));
    if want != Some(raw.len() as u64) {
        return Err(format!(
            "input {:?}: {} bytes of binary data, but shape {:?} of {} takes {N} bytes per element",
            t.name,
            raw.len(),
            t.shape,
            t.datatype
        ));
    }
    Ok(raw.chunks_exact(N).map(|c| <[u8; N]>::try_from(c).expect("chunks of N bytes")))
}

/// A binary `BYTES` tensor's elements, each a 4-byte little-endian length and its bytes, as many
/// as its shape says.
pub(super) fn strings<'a>(t: &Tensor, mut raw: &'a [u8]) -> Result<Vec<&'a [u8]>, BadRequest> {
    let mut out = Vec::new();
    while let Some((len, rest)) = raw.split_first_chunk::<4>() {
        let len = u32::from_le_bytes(*len) as usize;
        if len > rest.len() {
            return Err(format!("input {:?}: element {} claims {len} bytes, {} remain", t.name, out.len(), rest.len()));
        }
        out.push(&rest[..len]);
        raw = &rest[len..];
    }
    if !raw.is_empty() {
        return Err(format!("input {:?}: {} bytes after its last element", t.name, raw.len()));
    }
    if t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) != Some(out.len() as u64) {
        return Err(format!("input {:?}: shape {:?} does not match its {} elements", t.name, t.shape, out.len()));
    }
    Ok(out)
}

/// A response's body, and where its JSON ends when binary outputs follow it.
#[derive(Debug)]
pub struct Answer {
    /// The JSON, then the binary outputs' bytes.
    pub body: Vec<u8>,
    /// The JSON's length (`Inference-Header-Content-Length`) when binary outputs follow.
    pub header_len: Option<usize>,
}

impl Answer {
    /// `head`'s JSON followed by `tail`, the binary outputs' bytes in their order.
    pub fn new(head: &InferResponse, tail: Vec<u8>) -> Answer {
        let mut body = serde_json::to_vec(head).expect("JSON values serialize");
        // Every output in the JSON: nothing follows it.
        if head.outputs.iter().all(|o| o.data.is_some()) {
            return Answer { body, header_len: None };
        }
        let header_len = Some(body.len());
        body.extend_from_slice(&tail);
        Answer { body, header_len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(json: &serde_json::Value, tail: &[u8]) -> (Vec<u8>, String) {
        let mut b = serde_json::to_vec(json).unwrap();
        let n = b.len().to_string();
        b.extend_from_slice(tail);
        (b, n)
    }

    #[test]
    fn binary_inputs_are_cut_from_the_tail_in_order() {
        let json = serde_json::json!({"inputs": [
            {"name": "a.ids", "shape": [1, 2], "datatype": "INT64", "parameters": {"binary_data_size": 16}},
            {"name": "dense", "shape": [1, 1], "datatype": "FP32", "data": [0.5]},
            {"name": "lines", "shape": [2], "datatype": "BYTES", "parameters": {"binary_data_size": 11}},
        ]});
        let mut tail = Vec::new();
        tail.extend(7u64.to_le_bytes());
        tail.extend(u64::MAX.to_le_bytes());
        tail.extend(2u32.to_le_bytes());
        tail.extend(b"ab");
        tail.extend(1u32.to_le_bytes());
        tail.extend(b"c");
        let (b, n) = body(&json, &tail);
        let r = parse(&b, Some(&n)).unwrap();
        let ids: Vec<[u8; 8]> = fixed::<8>(&r.head.inputs[0], r.input(0).raw.unwrap()).unwrap().collect();
        assert_eq!(ids, [7u64.to_le_bytes(), u64::MAX.to_le_bytes()]);
        assert!(r.input(1).raw.is_none());
        assert_eq!(strings(&r.head.inputs[2], r.input(2).raw.unwrap()).unwrap(), [&b"ab"[..], b"c"]);
    }

    #[test]
    fn declared_sizes_that_do_not_add_up_are_refused() {
        let input = |size: serde_json::Value| serde_json::json!({"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "parameters": {"binary_data_size": size}}]});
        let refused = |json: serde_json::Value, tail: &[u8], header: Option<&str>| {
            let (b, n) = body(&json, tail);
            parse(&b, Some(header.unwrap_or(&n))).err().expect("refused")
        };
        assert!(refused(input(9.into()), &[0; 8], None).contains("8 bytes of binary data remain"));
        assert!(refused(input(4.into()), &[0; 8], None).contains("4 bytes of binary data that no input"));
        assert!(refused(input(u64::MAX.into()), &[0; 8], None).contains("binary_data_size 18446744073709551615"));
        assert!(refused(input((-1).into()), &[], None).contains("is not a byte count"));
        assert!(refused(input(8.into()), &[0; 8], Some("999999")).contains("past the body"));
        assert!(refused(input(8.into()), &[0; 8], Some("-3")).contains("is not a byte count"));
        let both = serde_json::json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1],
            "parameters": {"binary_data_size": 4}}]});
        assert!(refused(both, &[0; 4], None).contains("both data and binary_data_size"));
        let shm = serde_json::json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32",
            "parameters": {"shared_memory_region": "r"}}]});
        assert!(refused(shm, &[], None).contains("shared memory is not supported"));
        // A size that arrived but does not fit the shape, and strings that run past the end.
        let t = Tensor { name: "x".into(), shape: vec![3], datatype: "FP32".into(), data: None, parameters: None };
        assert!(fixed::<4>(&t, &[0; 8]).err().unwrap().contains("shape [3] of FP32"));
        let huge = Tensor { shape: vec![u64::MAX, 2], ..t.clone() };
        assert!(fixed::<4>(&huge, &[0; 8]).is_err());
        let mut torn = 100u32.to_le_bytes().to_vec();
        torn.extend(b"abc");
        assert!(strings(&t, &torn).unwrap_err().contains("claims 100 bytes, 3 remain"));
        assert!(strings(&t, &[1, 0]).unwrap_err().contains("2 bytes after its last element"));
    }

    #[test]
    fn an_answer_with_binary_outputs_says_where_its_json_ends() {
        let out = |data: Option<serde_json::Value>| Tensor {
            name: "p".into(),
            shape: vec![1, 1],
            datatype: "FP32".into(),
            data,
            parameters: None,
        };
        let head = |o| InferResponse { model_name: "m".into(), model_version: "1".into(), id: None, outputs: vec![o] };
        let json = Answer::new(&head(out(Some(serde_json::json!([0.5])))), Vec::new());
        assert_eq!(json.header_len, None);
        let binary = Answer::new(&head(out(None)), 0.5f32.to_le_bytes().to_vec());
        let n = binary.header_len.unwrap();
        assert!(serde_json::from_slice::<InferResponse>(&binary.body[..n]).is_ok());
        assert_eq!(binary.body[n..], 0.5f32.to_le_bytes());
    }
}
