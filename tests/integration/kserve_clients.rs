//! `oar serve` as stock KServe v2 clients speak it: NVIDIA's `tritonclient[http]` (the reference
//! client), through `examples/serve/triton_client.py`, with its defaults (binary tensors in and
//! out) and with JSON, with and without a model version in the URLs, from raw lines and from
//! typed tensors: every way gives `oar predict`'s scores. Its metadata, configuration,
//! statistics and repository-index calls answer, the statistics counting exactly what was
//! scored. Needs a Python with tritonclient (CI installs it); skips with a message without one.
//! Binary bodies that lie about their sizes are refused with a message, by a plain HTTP client.

use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use crate::serve::{post, predicted, serve, trained, typed_request};
use crate::util::python_with;

/// A Python with tritonclient, if there is one.
fn python() -> Option<String> {
    python_with("tritonclient.http, numpy")
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/serve/triton_client.py")
}

/// Runs the client script with `args`; its output when it succeeds, its error when it fails.
fn client(py: &str, args: &[&str]) -> Result<String, String> {
    let o = std::process::Command::new(py).arg(script()).args(args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    if o.status.success() {
        Ok(out)
    } else {
        Err(err)
    }
}

fn read_scores(file: &Path) -> Vec<f32> {
    std::fs::read_to_string(file).unwrap().lines().map(|l| l.parse().unwrap()).collect()
}

fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max)
}

#[test]
fn tritonclient_defaults_json_and_versions_get_the_scores_of_oar_predict() {
    let Some(py) = python() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, test) = trained(dir.path(), "1");
    let want = predicted(&model, &test, dir.path());
    let s = serve(&model, &[]);
    let url = s.url.trim_start_matches("http://").to_string();
    let out = dir.path().join("scores.tsv");
    let (test, out_s) = (test.to_str().unwrap(), out.to_str().unwrap());

    // Raw lines in batches of 256 (3 requests each): binary (tritonclient's default) or JSON,
    // the version in the URLs or not.
    for (how, extra) in [
        ("binary", vec![]),
        ("JSON, version 1", vec!["--json", "--version", "1"]),
        ("binary, version 1", vec!["--version", "1"]),
    ] {
        let mut args = vec!["--url", &url, "--data", test, "--out", out_s];
        args.extend(extra);
        client(&py, &args).unwrap_or_else(|e| panic!("{how}: {e}"));
        let w = worst(&read_scores(&out), &want);
        assert!(w <= 1e-6, "{how}: served scores differ from oar predict's by {w}");
    }
    // Typed tensors (UINT64 ids, FP32 dense) as numpy arrays, binary and JSON.
    let request = dir.path().join("typed.json");
    std::fs::write(&request, typed_request(&lines[..100]).to_string()).unwrap();
    for extra in [vec![], vec!["--json"]] {
        let mut args = vec!["--url", &url, "--request", request.to_str().unwrap(), "--out", out_s];
        args.extend(extra.iter().copied());
        client(&py, &args).unwrap_or_else(|e| panic!("typed {extra:?}: {e}"));
        let w = worst(&read_scores(&out), &want[..100]);
        assert!(w <= 1e-6, "typed {extra:?}: served scores differ from oar predict's by {w}");
    }

    // What the server says of itself, through tritonclient's own calls, the version named.
    let said: Value =
        serde_json::from_str(&client(&py, &["--url", &url, "--describe", "--version", "1"]).unwrap()).unwrap();
    assert_eq!((&said["live"], &said["ready"], &said["model_ready"]), (&json!(true), &json!(true), &json!(true)));
    assert!(said["server"]["extensions"].as_array().unwrap().contains(&json!("binary_tensor_data")), "{said}");
    assert_eq!(said["metadata"]["versions"], json!(["1"]));
    assert_eq!(said["config"]["name"], "oar");
    assert_eq!(said["config"]["output"][0]["name"], "fc.score");
    assert_eq!(said["index"], json!([{ "name": "oar", "version": "1", "state": "READY", "reason": "" }]));
    // Counted by the server: 9 requests of lines (600 samples each way) and 2 typed of 100.
    let stats = &said["stats"]["model_stats"][0];
    assert_eq!(
        (stats["execution_count"].as_u64(), stats["inference_count"].as_u64()),
        (Some(11), Some(2000)),
        "{said}"
    );
    assert_eq!(stats["inference_stats"]["success"]["count"], 11);
    assert_eq!(stats["inference_stats"]["fail"]["count"], 0);

    // A version the server does not serve: tritonclient's error carries the server's reason.
    let e = client(&py, &["--url", &url, "--describe", "--version", "7"]).unwrap_err();
    assert!(e.contains("has no version \"7\": this server serves its pass 1"), "{e}");
}

/// A binary body as tritonclient frames it: `json`, then `tail`; its header length.
fn binary_post(url: &str, json: &Value, tail: &[u8], header: Option<&str>) -> (u16, String) {
    let mut body = serde_json::to_vec(json).unwrap();
    let n = body.len().to_string();
    body.extend_from_slice(tail);
    let r = ureq::post(url)
        .set("Inference-Header-Content-Length", header.unwrap_or(&n))
        .timeout(std::time::Duration::from_secs(60))
        .send_bytes(&body);
    match r {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
        Err(e) => panic!("{url}: {e}"),
    }
}

#[test]
fn binary_bodies_that_lie_about_their_sizes_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, _) = trained(dir.path(), "1");
    let s = serve(&model, &[]);
    let infer = format!("{}/v2/models/oar/infer", s.url);
    let line = lines[0].as_bytes();
    let mut element = (line.len() as u32).to_le_bytes().to_vec();
    element.extend_from_slice(line);
    let input = |size: Value, shape: u64| json!({ "inputs": [{ "name": "lines", "shape": [shape], "datatype": "BYTES", "parameters": { "binary_data_size": size } }] });
    let n = element.len() as u64;
    // The honest one first: answered, binary out.
    assert_eq!(binary_post(&infer, &input(n.into(), 1), &element, None).0, 200);
    for (json, header, says) in [
        (input((n + 1).into(), 1), None, "bytes of binary data remain"),
        (input((n - 1).into(), 1), None, "claims"),
        (input(n.into(), 2), None, "does not match its 1 elements"),
        (input(u64::MAX.into(), 1), None, "binary_data_size 18446744073709551615"),
        (input(n.into(), 1), Some("99999999"), "past the body"),
        (input(n.into(), 1), Some("x"), "not a byte count"),
    ] {
        let (code, body) = binary_post(&infer, &json, &element, header);
        assert_eq!(code, 400, "{json} {header:?}: {body}");
        assert!(body.contains(says), "{json} {header:?}: {body}");
    }
    let (code, body) = {
        let r = ureq::post(&infer).set("Content-Encoding", "gzip").send_bytes(b"\x1f\x8b");
        match r {
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            other => panic!("a gzip body: {other:?}"),
        }
    };
    assert_eq!(code, 415);
    assert!(body.contains("uncompressed request bodies only"), "{body}");
    // The JSON's length said twice, two ways: refused, where the first was used.
    let mut body = serde_json::to_vec(&input(n.into(), 1)).unwrap();
    let json_len = body.len();
    body.extend_from_slice(&element);
    let mut raw = std::net::TcpStream::connect(s.url.trim_start_matches("http://")).unwrap();
    let head = format!(
        "POST /v2/models/oar/infer HTTP/1.1\r\nHost: oar\r\nContent-Length: {}\r\nConnection: close\r\n\
         Inference-Header-Content-Length: {json_len}\r\nInference-Header-Content-Length: 3\r\n\r\n",
        body.len()
    );
    std::io::Write::write_all(&mut raw, &[head.as_bytes(), &body].concat()).unwrap();
    raw.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut raw, &mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("comes more than once"), "{answer}");
    let request = json!({ "inputs": [{ "name": "lines", "shape": [1], "datatype": "BYTES", "data": [lines[0]] }] });
    assert_eq!(post(&infer, &request.to_string()).0, 200, "still serving");
}
