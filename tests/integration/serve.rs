//! `oar serve`: a real `oar serve` process answers KServe v2 requests from a real HTTP client
//! (ureq) with `oar predict`'s scores, from raw lines and from typed tensors; refuses bad
//! requests with 400/404/413 and a message; and swaps in a newer save under load without
//! losing or failing a request (counted by the clients and by the versions they saw).

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use serde_json::{json, Value};

use crate::util::*;

/// A running `oar serve`, killed when dropped.
pub(crate) struct Serving {
    child: Child,
    pub(crate) url: String,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn serve(model: &Path, extra: &[&str]) -> Serving {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["serve", "--model", model.to_str().unwrap(), "--addr", "127.0.0.1:0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("OAR_SERVE ") {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(60)).expect("oar serve printed its address within 60 s");
    Serving { child, url: format!("http://{addr}") }
}

fn get(url: &str) -> (u16, Value) {
    answer(url, ureq::get(url).timeout(Duration::from_secs(30)).call())
}

pub(crate) fn post(url: &str, body: &str) -> (u16, Value) {
    let r = ureq::post(url).timeout(Duration::from_secs(60)).set("Content-Type", "application/json").send_string(body);
    answer(url, r)
}

/// A response's status and JSON body (an error status included).
fn answer(url: &str, r: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    match r {
        Ok(r) => (r.status(), serde_json::from_str(&r.into_string().unwrap()).unwrap()),
        Err(ureq::Error::Status(code, r)) => {
            (code, serde_json::from_str(&r.into_string().unwrap_or_default()).unwrap_or(Value::Null))
        }
        Err(e) => panic!("{url}: {e}"),
    }
}

fn lines_request(lines: &[String]) -> String {
    json!({ "id": "t", "inputs": [{ "name": "lines", "shape": [lines.len()], "datatype": "BYTES", "data": lines }] })
        .to_string()
}

/// The first output's scores of a 200 response.
fn scores(v: &Value) -> Vec<f32> {
    v["outputs"][0]["data"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
}

/// Trains the default CTR-DNN (small) on generated data for `passes`; returns the output
/// folder and the test lines.
pub(crate) fn trained(dir: &Path, passes: &str) -> (PathBuf, Vec<String>, PathBuf) {
    let (train, test) = gen_data(&dir.join("data"), 1, 4000, 600);
    let out = dir.join("model");
    let o = oar(&[
        "train",
        "--train",
        train.to_str().unwrap(),
        "--output",
        out.to_str().unwrap(),
        "--hidden",
        "8",
        "--passes",
        passes,
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let test = test.join("part-00000");
    let lines = std::fs::read_to_string(&test).unwrap().lines().map(String::from).collect();
    (out, lines, test)
}

pub(crate) fn predicted(model: &Path, test: &Path, dir: &Path) -> Vec<f32> {
    let out = dir.join("predicted.tsv");
    let o = oar(&[
        "predict",
        "--model",
        model.to_str().unwrap(),
        "--data",
        test.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--no-progress",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::read_to_string(out).unwrap().lines().map(|l| l.parse().unwrap()).collect()
}

/// A typed-tensor request (the export's inputs: `dense`, one id per slot) of Criteo `lines`,
/// built by the job's parser.
pub(crate) fn typed_request(lines: &[String]) -> Value {
    let schema = oar::data::Schema::criteo();
    let mut parser = oar::data::parser(&schema);
    let mut batch = oar::base::batch::Batch::new(1, 13, 26);
    for l in lines {
        parser.parse(l.as_bytes(), &mut batch).unwrap();
    }
    let n = lines.len();
    let mut inputs = vec![json!({ "name": "dense", "shape": [n, 13], "datatype": "FP32", "data": batch.dense })];
    for (s, name) in schema.slots.iter().enumerate() {
        let ids: Vec<u64> = (0..n).map(|r| batch.ids[batch.bag(r * 26 + s).start]).collect();
        inputs.push(json!({ "name": format!("{name}.ids"), "shape": [n, 1], "datatype": "UINT64", "data": ids }));
    }
    json!({ "inputs": inputs })
}

#[test]
fn serve_answers_kserve_v2_with_the_scores_of_oar_predict() {
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, test) = trained(dir.path(), "1");
    let want = predicted(&model, &test, dir.path());
    let s = serve(&model, &["--max-body-mib", "1"]);

    assert_eq!(get(&format!("{}/v2/health/live", s.url)), (200, json!({ "live": true })));
    assert_eq!(get(&format!("{}/v2/health/ready", s.url)), (200, json!({ "ready": true })));
    let (code, meta) = get(&format!("{}/v2/models/oar", s.url));
    assert_eq!(code, 200);
    assert_eq!(meta["versions"], json!(["1"]));
    assert_eq!(meta["outputs"][0]["name"], "fc.score");
    assert_eq!(get(&format!("{}/v2/models/oar/ready", s.url)).0, 200);
    let (code, body) = get(&format!("{}/v2/models/other", s.url));
    assert_eq!(code, 404);
    assert!(body["error"].as_str().unwrap().contains("no model \"other\""), "{body}");

    // Raw lines, in batches of 256 (and one of 1): oar predict's numbers.
    let infer = format!("{}/v2/models/oar/infer", s.url);
    let mut got = Vec::new();
    for chunk in lines.chunks(256) {
        let (code, r) = post(&infer, &lines_request(chunk));
        assert_eq!(code, 200, "{r}");
        assert_eq!(
            (r["model_name"].as_str(), r["model_version"].as_str(), r["id"].as_str()),
            (Some("oar"), Some("1"), Some("t"))
        );
        assert_eq!(r["outputs"][0]["shape"], json!([chunk.len(), 1]));
        got.extend(scores(&r));
    }
    let one = scores(&post(&infer, &lines_request(&lines[..1])).1);
    assert_eq!(got.len(), want.len());
    let worst =
        got.iter().chain(&one).zip(want.iter().chain(&want[..1])).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-6, "served scores differ from oar predict's by {worst}");

    // Typed tensors (the export's inputs), built from the same lines by the job's parser.
    let (code, r) = post(&infer, &typed_request(&lines[..100]).to_string());
    assert_eq!(code, 200, "{r}");
    let typed = scores(&r);
    let worst = typed.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-6, "typed-tensor scores differ from oar predict's by {worst}");

    // Bad requests: a clear 4xx with a message, and the server goes on.
    for (body, code, says) in [
        ("{not json", 400, "not an infer request"),
        (r#"{"inputs":[{"name":"lines","shape":[1],"datatype":"FP32","data":[1]}]}"#, 400, "BYTES expected"),
        (r#"{"inputs":[{"name":"lines","shape":[1],"datatype":"BYTES","data":["7\tx"]}]}"#, 400, "lines[0]"),
        (
            r#"{"inputs":[{"name":"dense","shape":[1,13],"datatype":"FP32","data":[1,2,3,4,5,6,7,8,9,10,11,12,13]}]}"#,
            400,
            "C1.ids\" is missing",
        ),
        // A typed value past the ±1e18 that lines and training keep: it saturated the scores.
        (
            r#"{"inputs":[{"name":"dense","shape":[1,13],"datatype":"FP32","data":[3.4e38,2,3,4,5,6,7,8,9,10,11,12,13]}]}"#,
            400,
            "is not a finite number within ±1e18",
        ),
        // An input twice: the second was ignored.
        (
            r#"{"inputs":[{"name":"dense","shape":[1,1],"datatype":"FP32","data":[1]},{"name":"dense","shape":[1,1],"datatype":"FP32","data":[2]}]}"#,
            400,
            "input \"dense\" comes twice (inputs 0 and 1)",
        ),
    ] {
        let (c, r) = post(&infer, body);
        assert_eq!(c, code, "{body}: {r}");
        assert!(r["error"].as_str().unwrap_or_default().contains(says), "{body}: {r}");
    }
    let huge = lines_request(&vec![lines[0].clone(); 20_000]);
    assert!(huge.len() > 1 << 20);
    // Refused: a 413, or the connection closed under the client still sending (hyper answers
    // 413 and closes without reading the rest).
    match ureq::post(&infer).set("Content-Type", "application/json").send_string(&huge) {
        Err(ureq::Error::Status(413, _)) | Err(ureq::Error::Transport(_)) => {}
        Ok(r) => panic!("a body over --max-body-mib was answered {}", r.status()),
        Err(e) => panic!("a body over --max-body-mib: {e}"),
    }
    assert_eq!(post(&infer, &lines_request(&lines[..1])).0, 200, "still serving");

    // Its Prometheus metrics, read by a Prometheus parser, count exactly what was asked: 6
    // requests scored (3 batches of the 600 lines, 1 line, 100 typed, 1 line), 702 samples, the
    // 6 bad bodies and the oversized one refused (by its declared length, unread), pass 1 served.
    let m = crate::telemetry::scrape(s.url.trim_start_matches("http://"));
    crate::telemetry::check_classic(s.url.trim_start_matches("http://"));
    let v = |name| crate::telemetry::value(&m, name, None);
    assert_eq!(v("oar_serve_requests_total"), 6.0);
    assert_eq!(v("oar_serve_samples_total"), 702.0);
    assert_eq!(v("oar_serve_refused_total"), 7.0);
    assert_eq!((v("oar_serve_reloads_total"), v("oar_serve_model_pass")), (0.0, 1.0));
    assert_eq!(crate::telemetry::histogram_count(&m, "oar_serve_request_seconds"), 6.0);
}

/// A client cannot hold `oar serve`: connections that send nothing are closed after
/// `--read-timeout` (an idle one stayed open for good: still open after 70 s), at most
/// `--max-connections` are served at once (a real client waits until one ends, then is
/// answered), a request whose body stops arriving is answered 408, and one whose chunks are
/// broken 400.
#[test]
fn idle_and_slow_clients_cannot_hold_the_server() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, _) = trained(dir.path(), "1");
    let s = serve(&model, &["--max-connections", "2", "--read-timeout", "1"]);
    let addr = s.url.trim_start_matches("http://").to_string();
    // Two connections that never send a byte take both places.
    let idle: Vec<std::net::TcpStream> = (0..2).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    // A real client meanwhile waits for a place, and is answered.
    let (infer, body) = (format!("{}/v2/models/oar/infer", s.url), lines_request(&lines[..1]));
    let client = std::thread::spawn(move || post(&infer, &body).0);
    for mut c in idle {
        // Closed by the server: the read ends (a bound far above the 1 s, so a hung server fails).
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).expect("the server closed the idle connection");
    }
    assert_eq!(client.join().unwrap(), 200, "the waiting client was answered");

    // A head that promises a body, then nothing more: 408, naming the flag.
    let mut slow = std::net::TcpStream::connect(&addr).unwrap();
    write!(slow, "POST /v2/models/oar/infer HTTP/1.1\r\nHost: oar\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{").unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut answer = String::new();
    slow.read_to_string(&mut answer).expect("answered and closed");
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 1s (--read-timeout)"), "{answer}");
    // A chunked body whose chunk size is no number: a bad request, where it was answered 413
    // "over --max-body-mib" for 4 bytes.
    let mut broken = std::net::TcpStream::connect(&addr).unwrap();
    write!(broken, "POST /v2/models/oar/infer HTTP/1.1\r\nHost: oar\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")
        .unwrap();
    broken.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut answer = String::new();
    broken.read_to_string(&mut answer).expect("answered and closed");
    assert!(answer.starts_with("HTTP/1.1 400") && answer.contains("the request body is broken"), "{answer}");
    let infer = format!("{}/v2/models/oar/infer", s.url);
    assert_eq!(post(&infer, &lines_request(&lines[..1])).0, 200, "still serving");
    let m = crate::telemetry::scrape(&addr);
    assert_eq!(crate::telemetry::value(&m, "oar_serve_refused_total", None), 2.0);
    // The two idle connections closed by the read timeout, at least (a pooled client
    // connection may have idled out too).
    assert!(crate::telemetry::value(&m, "oar_http_connections_closed_idle_total", None) >= 2.0);
}

#[test]
fn one_address_cannot_take_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let (model, _, _) = trained(dir.path(), "1");
    let s = serve(&model, &["--max-connections", "8", "--max-connections-per-address", "2"]);
    let addr = s.url.trim_start_matches("http://").to_string();
    // Two connections from 127.0.0.1 that send nothing hold its share. The listener takes
    // connections in the order they were made and counts each as it takes it, so the third
    // below is counted after these two, however slow the machine.
    let idle: Vec<std::net::TcpStream> = (0..2).map(|_| std::net::TcpStream::connect(&addr).unwrap()).collect();
    let ask = "GET /metrics HTTP/1.1\r\nHost: oar\r\nConnection: close\r\n\r\n";
    let (status, body) = crate::util::request_from("127.0.0.1", &addr, ask);
    assert!(status.starts_with("HTTP/1.1 503"), "{status}");
    assert!(
        body.contains("127.0.0.1 has 2 connections open") && body.contains("--max-connections-per-address"),
        "{body}"
    );
    // Another address is served meanwhile, and the process counts what it turned away.
    let (status, body) = crate::util::request_from("127.0.0.2", &addr, ask);
    assert!(status.starts_with("HTTP/1.1 200"), "{status}");
    let m = prometheus_parse::Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    assert_eq!(crate::telemetry::value(&m, "oar_http_connections_turned_away_total", None), 1.0);
    drop(idle);
    // A share above the total is refused at start, naming the flag.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["serve", "--model", model.to_str().unwrap(), "--addr", "127.0.0.1:0"])
        .args(["--max-connections", "4", "--max-connections-per-address", "5"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-connections-per-address must be 1 to --max-connections (4), not 5"), "{err}");
}

#[test]
fn a_newer_save_is_swapped_in_under_load_without_losing_a_request() {
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, test) = trained(dir.path(), "2");
    let pass = |p: u32| model.join(format!("pass-{p:04}"));
    assert!(pass(1).join("manifest.json").is_file() && pass(2).join("manifest.json").is_file());
    let second = predicted(&pass(2), &test, dir.path());
    // Serve pass 1 first, as if the job had saved only that far.
    oar::base::state_file::write_atomic(&model.join("latest"), b"pass-0001").unwrap();
    let s = serve(&model, &["--poll-ms", "20"]);
    let infer = format!("{}/v2/models/oar/infer", s.url);
    let body = Arc::new(lines_request(&lines[..32]));

    let (sent, answered, failed) =
        (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let (warm_tx, warm_rx) = mpsc::channel();
    let (seen_tx, seen_rx) = mpsc::channel();
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (infer, body, sent, answered, failed, stop) =
                (infer.clone(), body.clone(), sent.clone(), answered.clone(), failed.clone(), stop.clone());
            let (warm_tx, seen_tx) = (warm_tx.clone(), seen_tx.clone());
            std::thread::spawn(move || {
                let mut versions = Vec::new();
                let mut second_scores = None;
                while !stop.load(Ordering::SeqCst) {
                    sent.fetch_add(1, Ordering::SeqCst);
                    let (code, r) = post(&infer, &body);
                    if code != 200 || r["outputs"][0]["data"].as_array().map(Vec::len) != Some(32) {
                        failed.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    answered.fetch_add(1, Ordering::SeqCst);
                    let v: u32 = r["model_version"].as_str().unwrap().parse().unwrap();
                    if versions.last() != Some(&v) {
                        versions.push(v);
                    }
                    if versions.len() == 1 && versions[0] == 1 && answered.load(Ordering::SeqCst) >= 10 {
                        let _ = warm_tx.send(());
                    }
                    if v == 2 {
                        second_scores.get_or_insert_with(|| scores(&r));
                        let _ = seen_tx.send(());
                    }
                }
                (versions, second_scores)
            })
        })
        .collect();
    // Under load, the job "saves" pass 2.
    warm_rx.recv_timeout(Duration::from_secs(60)).expect("the clients were answered by pass 1");
    oar::base::state_file::write_atomic(&model.join("latest"), b"pass-0002").unwrap();
    for _ in 0..30 {
        seen_rx.recv_timeout(Duration::from_secs(60)).expect("pass 2 was served within 60 s of its save");
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let (versions, second_scores) = c.join().unwrap();
        assert_eq!(versions.first(), Some(&1), "each client saw pass 1 first: {versions:?}");
        assert_eq!(versions.last(), Some(&2), "and pass 2 last, never going back: {versions:?}");
        assert!(versions.len() == 2, "{versions:?}");
        let got = second_scores.unwrap();
        let worst = got.iter().zip(&second).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(worst <= 1e-6, "pass 2's served scores differ from its oar predict by {worst}");
    }
    let (sent, answered, failed) =
        (sent.load(Ordering::SeqCst), answered.load(Ordering::SeqCst), failed.load(Ordering::SeqCst));
    assert_eq!(failed, 0, "no request failed during the reload");
    assert_eq!(sent, answered, "every request sent was answered");
    let m = crate::telemetry::scrape(s.url.trim_start_matches("http://"));
    assert_eq!(crate::telemetry::value(&m, "oar_serve_reloads_total", None), 1.0);
    assert_eq!(crate::telemetry::value(&m, "oar_serve_model_pass", None), 2.0);
    assert_eq!(
        crate::telemetry::value(&m, "oar_serve_requests_total", None),
        answered as f64,
        "the server counted them too"
    );
    eprintln!("{answered} requests answered across the reload, none lost");
    // A `latest` naming no readable pass (a torn save, a folder gone) is reported once and
    // counted, and the model served stays; it used to be skipped without a word.
    oar::base::state_file::write_atomic(&model.join("latest"), b"pass-0009").unwrap();
    let failed_reloads = || {
        let m = crate::telemetry::scrape(s.url.trim_start_matches("http://"));
        crate::telemetry::value(&m, "oar_serve_failed_reloads_total", None)
    };
    wait_until(60, "the unreadable save counted", || failed_reloads() == 1.0);
    let (code, r) = post(&infer, &body);
    assert_eq!((code, r["model_version"].as_str()), (200, Some("2")), "{r}");
    assert_eq!(failed_reloads(), 1.0, "reported once, not at every look");
}

/// DIEN with its auxiliary loss (`dien_aux.toml`): the served model scores the click head only.
/// Its `value` head (a training loss) is not an output, and the negative behaviours that only
/// that head reads are not asked of a request; the scores are `oar predict`'s first column.
#[test]
fn a_value_head_and_the_slots_only_it_reads_are_not_served() {
    let Some(shared) = shared_data() else {
        eprintln!("skipped: ../shared/data is absent (DIEN reads PaddleRec's Amazon sample)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let amazon = shared.join("din/paddlerec_din_amazon_sample.txt");
    let (model, out) = (dir.path().join("model"), dir.path().join("predicted.tsv"));
    let s = |p: &Path| p.display().to_string();
    let o = oar(&["train", "--config", &s(&zoo_job("dien_aux")), "--train", &s(&amazon), "--output", &s(&model)]);
    assert!(o.status.success(), "{}", text(&o));
    let args = ["predict", "--model", &s(&model), "--data", &s(&amazon), "--out", &s(&out), "--no-progress"];
    let o = oar(&[&args[..], &["--trust-pipe-command"]].concat());
    assert!(o.status.success(), "{}", text(&o));
    let want: Vec<f32> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| l.split('\t').next().unwrap().parse().unwrap())
        .collect();

    let served = serve(&model, &[]);
    let (code, meta) = get(&format!("{}/v2/models/oar", served.url));
    assert_eq!(code, 200);
    assert_eq!(meta["outputs"], json!([{ "name": "logit.score", "datatype": "FP32", "shape": [-1, 1] }]), "{meta}");
    let inputs = meta["inputs"].to_string();
    assert!(inputs.contains("hist_item.ids") && !inputs.contains("neg_item"), "{inputs}");

    // The sample's lines as typed tensors, without the negatives: histories padded, with their
    // lengths; categories offset as the job's pipe_command writes them.
    let sample = std::fs::read_to_string(&amazon).unwrap();
    let rows: Vec<Vec<&str>> = sample.lines().map(|l| l.split(';').collect()).collect();
    let width = rows.iter().map(|r| r[0].split(' ').count()).max().unwrap();
    let (mut tensors, mut lengths) = (vec![Vec::new(), Vec::new()], Vec::new());
    for r in &rows {
        let bags = [r[0], r[1]].map(|b| b.split(' ').map(|v| v.parse::<u64>().unwrap()).collect::<Vec<_>>());
        lengths.push(bags[0].len() as i64);
        for (k, bag) in bags.iter().enumerate() {
            let offset = if k == 1 { 1_000_000_000 } else { 0 };
            tensors[k].extend((0..width).map(|i| bag.get(i).map_or(0, |v| v + offset)));
        }
    }
    let n = rows.len();
    let single = |k: usize, offset: u64| rows.iter().map(|r| r[k].parse::<u64>().unwrap() + offset).collect::<Vec<_>>();
    let request = json!({ "inputs": [
        { "name": "hist_item.ids", "shape": [n, width], "datatype": "UINT64", "data": tensors[0] },
        { "name": "hist_item.lengths", "shape": [n], "datatype": "INT64", "data": lengths },
        { "name": "hist_cate.ids", "shape": [n, width], "datatype": "UINT64", "data": tensors[1] },
        { "name": "hist_cate.lengths", "shape": [n], "datatype": "INT64", "data": lengths },
        { "name": "item.ids", "shape": [n, 1], "datatype": "UINT64", "data": single(2, 0) },
        { "name": "cate.ids", "shape": [n, 1], "datatype": "UINT64", "data": single(3, 1_000_000_000) },
    ]});
    let (code, r) = post(&format!("{}/v2/models/oar/infer", served.url), &request.to_string());
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["outputs"].as_array().unwrap().len(), 1, "{r}");
    let got = scores(&r);
    assert_eq!(got.len(), want.len());
    let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(worst <= 1e-6, "served scores differ from oar predict's by {worst}");
}

/// The peak resident memory of process `pid`, in MiB.
fn peak_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() >> 10
}

/// A request is scored 4,096 samples at a time: 10,200 lines (three parts) get `oar predict`'s
/// scores, and 300,000 typed samples are answered with the process's peak memory under 1.5 GB
/// (scored whole, 1,000,000 samples took 10.6 GB).
#[test]
fn a_large_request_is_scored_in_parts_within_bounded_memory() {
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, _) = trained(dir.path(), "1");
    let many: Vec<String> = lines.iter().cycle().take(10_200).cloned().collect();
    let file = dir.path().join("many.txt");
    std::fs::write(&file, many.join("\n") + "\n").unwrap();
    let want = predicted(&model, &file, dir.path());
    let s = serve(&model, &["--max-body-mib", "64"]);
    let infer = format!("{}/v2/models/oar/infer", s.url);
    let (code, r) = post(&infer, &lines_request(&many));
    assert_eq!(code, 200, "{r}");
    let got = scores(&r);
    assert_eq!(got.len(), want.len());
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6), "the parts' scores are oar predict's");

    let rows = 300_000;
    let mut inputs =
        vec![json!({ "name": "dense", "shape": [rows, 13], "datatype": "FP32", "data": vec![0; rows * 13] })];
    for slot in 1..=26 {
        let ids: Vec<u64> = (0..rows as u64).map(|i| i % 1000 + slot * 1000).collect();
        inputs.push(json!({ "name": format!("C{slot}.ids"), "shape": [rows, 1], "datatype": "INT64", "data": ids }));
    }
    let body = json!({ "inputs": inputs }).to_string();
    let (code, r) = post(&infer, &body);
    assert_eq!(code, 200, "{}", r["error"]);
    assert_eq!(scores(&r).len(), rows);
    let peak = peak_mib(s.child.id());
    eprintln!("peak memory {peak} MiB for {rows} samples");
    assert!(peak < 1536, "peak memory {peak} MiB for {rows} samples");
}

/// A client that sends requests and never reads the answers cannot hold its place: an answer
/// that cannot be written for `--read-timeout` ends the connection (two such clients held both
/// places of a server for good, and a real client waited for ever).
#[test]
fn clients_that_never_read_their_answers_cannot_hold_the_server() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, _) = trained(dir.path(), "1");
    let s = serve(&model, &["--max-connections", "2", "--read-timeout", "1"]);
    let addr = s.url.trim_start_matches("http://").to_string();
    let ask = b"GET /metrics HTTP/1.1\r\nHost: oar\r\n\r\n";
    // Requests until neither side's buffers take more: the server's answers then wait on us.
    let stalled: Vec<std::net::TcpStream> = (0..2)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(&addr).unwrap();
            c.set_nonblocking(true).unwrap();
            let mut sent = 0usize;
            loop {
                match c.write(ask) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("after {sent} bytes: {e}"),
                }
            }
            assert!(sent > ask.len(), "requests were taken");
            c
        })
        .collect();
    let infer = format!("{}/v2/models/oar/infer", s.url);
    assert_eq!(post(&infer, &lines_request(&lines[..1])).0, 200, "a real client is served");
    drop(stalled);
}

/// Request bodies held at once are bounded over all connections: a body takes room for the
/// bytes that have arrived, and a request without room is answered 503 with Retry-After at
/// once, naming the flag (before, 1,024 connections could each hold a 16 MiB body). A body's
/// declared length holds nothing (before, sixteen heads declaring 16 MiB and a byte each shut
/// every other client out), and the room comes back when the holder goes.
#[test]
fn request_bodies_held_at_once_are_bounded() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, _) = trained(dir.path(), "1");
    let s = serve(&model, &["--max-body-mib", "1", "--max-buffered-mib", "1"]);
    let addr = s.url.trim_start_matches("http://").to_string();
    let buffered = || crate::telemetry::value(&crate::telemetry::scrape(&addr), "oar_serve_buffered_bytes", None);
    assert_eq!(buffered(), 0.0);
    let infer = format!("{}/v2/models/oar/infer", s.url);
    let body = lines_request(&lines[..1]);
    // A head that promises a body of the whole room, then one byte of it: a KiB held, no more.
    let mut holder = std::net::TcpStream::connect(&addr).unwrap();
    write!(holder, "POST /v2/models/oar/infer HTTP/1.1\r\nHost: oar\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{{").unwrap();
    wait_until(60, "the first byte's room taken", || buffered() == 1024.0);
    assert_eq!(post(&infer, &body).0, 200, "a promise alone shuts nobody out");
    // All of it but the last byte: now the room is the holder's.
    holder.write_all(&vec![b' '; 1048574]).unwrap();
    wait_until(60, "the arrived body's room taken", || buffered() == 1048576.0);
    let r =
        ureq::post(&infer).timeout(Duration::from_secs(60)).set("Content-Type", "application/json").send_string(&body);
    match r {
        Err(ureq::Error::Status(503, r)) => {
            assert_eq!(r.header("retry-after"), Some("1"));
            let text = r.into_string().unwrap();
            assert!(text.contains("--max-buffered-mib"), "{text}");
        }
        Ok(r) => panic!("a body without room was answered {}", r.status()),
        Err(e) => panic!("a body without room: {e}"),
    }
    // The holder goes: its room comes back, and the same request is scored.
    drop(holder);
    wait_until(60, "the room given back", || buffered() == 0.0);
    assert_eq!(post(&infer, &body).0, 200);
    let bad = oar(&["serve", "--model", model.to_str().unwrap(), "--max-body-mib", "8", "--max-buffered-mib", "4"]);
    assert!(!bad.status.success());
    assert!(text(&bad).contains("--max-buffered-mib must be --max-body-mib (8) to"), "{}", text(&bad));
}

/// A client that hangs up does not give its scoring's turn away: a scoring that started holds
/// its turn to its end, so the turns bound the scorings at once. Before, the turn went with the
/// dropped handler while the scoring went on: clients that sent large requests and hung up ran
/// any number of them at once (8 took 2.5 GB; 12 aborted a server limited to 3 GB).
#[test]
fn a_client_that_hangs_up_keeps_its_scoring_within_the_turns() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (model, lines, _) = trained(dir.path(), "1");
    let s = serve(&model, &["--max-body-mib", "32", "--max-buffered-mib", "1024"]);
    let addr = s.url.trim_start_matches("http://").to_string();
    let metric = |sheet: &prometheus_parse::Scrape, name: &str| crate::telemetry::value(sheet, name, None);
    let turns = metric(&crate::telemetry::scrape(&addr), "oar_serve_scoring_turns");
    assert!(turns >= 2.0, "{turns}");
    // Two more requests than turns, of 60,000 lines each (about 16 MB), hung up on once every turn
    // scores (at once raced the reading of the bodies: a request could be dropped unscored).
    let many: Vec<String> = lines.iter().cycle().take(60_000).cloned().collect();
    let body = lines_request(&many);
    let mut clients = Vec::new();
    for _ in 0..turns as usize + 2 {
        let mut c = std::net::TcpStream::connect(&addr).unwrap();
        write!(c, "POST /v2/models/oar/infer HTTP/1.1\r\nHost: oar\r\nContent-Type: application/json\r\n").unwrap();
        write!(c, "Content-Length: {}\r\n\r\n", body.len()).unwrap();
        c.write_all(body.as_bytes()).unwrap();
        clients.push(c);
    }
    let mut most = 0.0f64;
    wait_until(60, "every turn scoring", || {
        most = most.max(metric(&crate::telemetry::scrape(&addr), "oar_serve_scoring"));
        most >= turns
    });
    drop(clients);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let sheet = crate::telemetry::scrape(&addr);
        let now = metric(&sheet, "oar_serve_scoring");
        most = most.max(now);
        // Hung-up requests still waiting for a turn may be dropped (their handlers go with
        // their connections), so the end is the first scorings' end.
        if now == 0.0 && metric(&sheet, "oar_serve_requests_total") >= 1.0 {
            break;
        }
        let answered = metric(&sheet, "oar_serve_requests_total");
        assert!(std::time::Instant::now() < deadline, "after 30 s: {now} scorings running, {answered} answered");
        std::thread::sleep(Duration::from_millis(2));
    }
    assert!(most <= turns, "{most} scorings at once, over the {turns} turns");
}
