//! What `oar serve` says of its model, in KServe v2's terms and Triton's extensions of them: the
//! metadata, the model configuration, the statistics and the repository index. Built from the
//! loaded model and the server's counters; no I/O.

use std::sync::atomic::Ordering;

use serde_json::{json, Value};

use super::{Loaded, Server};

/// The inputs a request may send: raw `lines`, or the typed tensors of the slots the model
/// reads (see [`super::v2`]); as `(name, datatype, shape)`.
fn inputs(m: &Loaded) -> Vec<(String, &'static str, Vec<i64>)> {
    let schema = &m.saved.schema;
    let mut inputs = vec![("lines".to_string(), "BYTES", vec![-1])];
    if schema.dense_width > 0 {
        inputs.push(("dense".into(), "FP32", vec![-1, schema.dense_width as i64]));
    }
    for (name, _) in schema.slots.iter().zip(&m.reads).filter(|(_, reads)| **reads) {
        inputs.push((format!("{name}.ids"), "INT64", vec![-1, -1]));
        inputs.push((format!("{name}.lengths"), "INT64", vec![-1]));
        inputs.push((format!("{name}.weights"), "FP32", vec![-1, -1]));
    }
    inputs
}

/// `GET /v2/models/NAME[/versions/V]`: the model's version, inputs and outputs.
pub(super) fn metadata(name: &str, m: &Loaded) -> Value {
    let tensor = |(name, datatype, shape): (String, &str, Vec<i64>)| json!({ "name": name, "datatype": datatype, "shape": shape });
    let outputs: Vec<_> = m.names.iter().map(|n| tensor((n.clone(), "FP32", vec![-1, 1]))).collect();
    json!({
        "name": name,
        "versions": [m.saved.manifest.pass.to_string()],
        "platform": "oar",
        "inputs": inputs(m).into_iter().map(tensor).collect::<Vec<_>>(),
        "outputs": outputs,
    })
}

/// `GET /v2/models/NAME[/versions/V]/config`: the model configuration as Triton writes it. The
/// first dimension of every tensor is the batch (`max_batch_size` 0 says so); every input is
/// optional, as a request sends `lines` or the typed tensors.
pub(super) fn config(name: &str, m: &Loaded) -> Value {
    let input = |(name, datatype, dims): (String, &str, Vec<i64>)| {
        json!({ "name": name, "data_type": format!("TYPE_{}", if datatype == "BYTES" { "STRING" } else { datatype }),
                "dims": dims, "optional": true })
    };
    let outputs: Vec<_> =
        m.names.iter().map(|n| json!({ "name": n, "data_type": "TYPE_FP32", "dims": [-1, 1] })).collect();
    json!({
        "name": name,
        "platform": "oar",
        "backend": "oar",
        "version_policy": { "latest": { "num_versions": 1 } },
        "max_batch_size": 0,
        "input": inputs(m).into_iter().map(input).collect::<Vec<_>>(),
        "output": outputs,
    })
}

/// `GET /v2/models[/NAME[/versions/V]]/stats`: Triton's statistics extension, with what oar
/// counts (answered and refused requests, their samples, the time answering took); the
/// phases oar does not time apart (queue, compute) are left out rather than reported as zero.
pub(super) fn stats(s: &Server, m: &Loaded) -> Value {
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    json!({ "model_stats": [{
        "name": s.name,
        "version": m.saved.manifest.pass.to_string(),
        "last_inference": n(&s.last_answer_ms),
        "inference_count": n(&s.samples),
        "execution_count": n(&s.answered),
        "inference_stats": {
            "success": { "count": n(&s.answered), "ns": n(&s.answered_ns) },
            "fail": { "count": n(&s.refused), "ns": 0 },
        },
        "batch_stats": [],
    }]})
}

/// `POST /v2/repository/index`: the one model this server serves, and its version.
pub(super) fn index(name: &str, m: &Loaded) -> Value {
    json!([{ "name": name, "version": m.saved.manifest.pass.to_string(), "state": "READY", "reason": "" }])
}
