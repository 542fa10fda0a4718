//! Prometheus metrics: a real server and real trainers serve `/metrics`, scraped over HTTP
//! (ureq) and read by a Prometheus text parser (prometheus-parse); what the server reports is
//! checked against what the trainers sent; `oar launch` collects every process's endpoint.

use std::io::BufRead;
use std::process::{Child, Command, Stdio};

use crate::util::*;
use prometheus_parse::{Scrape, Value};

/// Starts `oar` with `args` and returns it with the addresses it announced on `OAR_READY`
/// and `OAR_METRICS` (only the lines asked for, in the order the process prints them).
fn start(args: &[&str], want: &[&str]) -> (Child, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(args)
        .env_remove("OAR_LAUNCHED")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut got = Vec::new();
    for w in want {
        let addr = lines
            .by_ref()
            .map(|l| l.unwrap())
            .find_map(|l| l.strip_prefix(&format!("{w} ")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {w} line"));
        got.push(addr);
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, got)
}

/// A scrape as a classic client makes it (no `Accept` for OpenMetrics): the text format 0.0.4,
/// read by a classic parser.
pub fn scrape(addr: &str) -> Scrape {
    let resp = ureq::get(&format!("http://{addr}/metrics")).call().unwrap();
    assert_eq!(resp.content_type(), "text/plain", "{:?}", resp.header("content-type"));
    assert!(resp.header("content-type").unwrap().contains("version=0.0.4"));
    let body = resp.into_string().unwrap();
    assert!(!body.contains("# EOF") && !body.contains("# UNIT"), "{body}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap()
}

/// A scrape as Prometheus makes it, asking for OpenMetrics first: the body as text.
pub fn scrape_openmetrics(addr: &str) -> String {
    let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                  text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let resp = ureq::get(&format!("http://{addr}/metrics")).set("Accept", accept).call().unwrap();
    assert_eq!(resp.content_type(), "application/openmetrics-text");
    let body = resp.into_string().unwrap();
    assert!(body.ends_with("# EOF\n"), "{body}");
    body
}

/// Every help line ends in one period, and every counter is typed one in the classic text (a
/// `HELP`/`TYPE` naming `foo` over a sample `foo_total` read as an untyped sample without help).
pub fn check_classic(addr: &str) {
    let body = ureq::get(&format!("http://{addr}/metrics")).call().unwrap().into_string().unwrap();
    for line in body.lines().filter(|l| l.starts_with("# HELP ")) {
        assert!(line.ends_with('.') && !line.ends_with(".."), "{line}");
    }
    let s = Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).unwrap();
    for x in s.samples.iter().filter(|x| x.metric.ends_with("_total")) {
        assert!(matches!(x.value, Value::Counter(_)), "{} is {:?}", x.metric, x.value);
        assert!(s.docs.contains_key(&x.metric), "{} has no help", x.metric);
    }
    promtool_check(&body);
}

/// `promtool check metrics` on `body`, when promtool is installed (Debian's `prometheus`
/// package; `.ci/run` installs it): no finding at all.
fn promtool_check(body: &str) {
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        eprintln!("promtool not found: the metrics are not checked by it (install Debian's prometheus package)");
        return;
    };
    use std::io::Write;
    child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics: {said}\n{body}");
}

/// The value of the sample `name` (with label `label` if given).
pub fn value(s: &Scrape, name: &str, label: Option<(&str, &str)>) -> f64 {
    let sample = s
        .samples
        .iter()
        .find(|x| x.metric == name && label.is_none_or(|(k, v)| x.labels.get(k) == Some(v)))
        .unwrap_or_else(|| {
            panic!("no {name} {label:?} in {:?}", s.samples.iter().map(|x| &x.metric).collect::<Vec<_>>())
        });
    match &sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
        other => panic!("{name} is {other:?}"),
    }
}

pub fn histogram_count(s: &Scrape, name: &str) -> f64 {
    let sample = s.samples.iter().find(|x| x.metric == name).unwrap_or_else(|| panic!("no histogram {name}"));
    let Value::Histogram(buckets) = &sample.value else { panic!("{name} is not a histogram") };
    buckets.iter().map(|b| b.count).fold(0.0, f64::max)
}

#[test]
fn servers_and_trainers_serve_metrics_that_a_prometheus_parser_reads_and_that_match_what_was_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 1000, 0);
    let base = ["--host", "127.0.0.1", "--port", "0", "--trainers", "2", "--mode", "sync", "--job", "m"];
    let (mut server, got) = start(
        &[&["pserver"][..], &base[..], &["--keep-serving", "--metrics-addr", "127.0.0.1:0"]].concat(),
        &["OAR_READY", "OAR_METRICS"],
    );
    let (addr, server_metrics) = (got[0].clone(), got[1].clone());
    let trainer = |id: &str| {
        let part = train.join(format!("part-0000{id}")).display().to_string();
        let args = ["train", "--servers", &addr, "--trainers", "2", "--trainer-id", id, "--mode", "sync", "--job", "m"];
        let more = [
            "--train",
            &part,
            "--hidden",
            "8",
            "--batch-size",
            "100",
            "--metrics-addr",
            "127.0.0.1:0",
            "--metrics-every",
            "2",
        ];
        start(&[&args[..], &more[..]].concat(), &["OAR_METRICS"])
    };
    // Trainer 0 alone waits at its first sync step for trainer 1: its endpoint answers meanwhile.
    let (mut t0, t0_metrics) = trainer("0");
    let s = scrape(&t0_metrics[0]);
    assert_eq!(value(&s, "oar_trainer", None), 0.0);
    for name in ["oar_trained_samples_total", "oar_steps_total", "oar_pass", "oar_resident_memory_bytes"] {
        assert!(value(&s, name, None) >= 0.0, "{name}");
    }
    histogram_count(&s, "oar_push_seconds");
    check_classic(&t0_metrics[0]);
    let (mut t1, _) = trainer("1");
    assert!(t0.wait().unwrap().success() && t1.wait().unwrap().success());

    // Counted where it was applied: 2 trainers x 1000 samples in steps of 100.
    let s = scrape(&server_metrics);
    assert_eq!(value(&s, "oar_applied_samples_total", None), 2000.0);
    assert_eq!(value(&s, "oar_updates_total", None), 10.0, "sync: one update per step");
    assert_eq!(value(&s, "oar_pushes_total", None), 20.0);
    let pulls = value(&s, "oar_pulls_total", None);
    assert!(pulls >= 20.0);
    assert_eq!(histogram_count(&s, "oar_pull_seconds"), pulls, "every pull timed once");
    assert_eq!(histogram_count(&s, "oar_push_seconds"), 20.0);
    let stats: oar::protocol::ServerStats = {
        let config = oar::client::ClientConfig::new(
            vec![addr.clone()],
            "m",
            std::time::Duration::from_secs(10),
            std::time::Duration::from_secs(10),
        );
        oar::client::Client::connect(&config).unwrap().stats().unwrap().remove(0)
    };
    assert_eq!(value(&s, "oar_rows", Some(("table", "embedding"))), stats.rows[0] as f64);
    // Every id of the one table got a row when first pulled, as the server counted it.
    assert_eq!(value(&s, "oar_row_events_total", Some(("event", "admitted"))), stats.lifecycle[0].admitted as f64);
    assert_eq!(stats.lifecycle[0].admitted, stats.rows[0] as u64);
    for event in ["filtered", "evicted", "no_room", "shrunk_score", "shrunk_unseen", "forgotten"] {
        assert_eq!(value(&s, "oar_row_events_total", Some(("event", event))), 0.0, "{event}");
    }
    assert!(value(&s, "oar_resident_memory_bytes", None) > 1e6);
    assert!(value(&s, "oar_checkpoint_age_seconds", None).is_nan(), "no background checkpoints");
    // The same figures as OpenMetrics for a scraper that asks, and as clean classic text.
    let om = scrape_openmetrics(&server_metrics);
    assert!(om.contains("# TYPE oar_applied_samples counter\noar_applied_samples_total 2000"), "{om}");
    check_classic(&server_metrics);
    server.kill().unwrap();
    server.wait().unwrap();
}

/// A peer that can reach a server's metrics port cannot hold it: 80 connections that send
/// nothing (more than the 64 served at once) are closed after 10 s, and a scrape waiting
/// behind them is answered. Before, each idle connection stayed open for good, and enough of
/// them would have taken the server's file descriptors from its trainers and checkpoints.
#[test]
fn idle_connections_to_a_metrics_port_are_closed_and_scrapes_still_answered() {
    use std::io::Read;
    let base = ["--host", "127.0.0.1", "--port", "0", "--trainers", "1", "--job", "m"];
    let (mut server, got) = start(
        &[&["pserver"][..], &base[..], &["--keep-serving", "--metrics-addr", "127.0.0.1:0"]].concat(),
        &["OAR_METRICS"],
    );
    let metrics = got[0].clone();
    // 80 connections from one address: 16 (its share) are held until they idle out, the other
    // 64 are answered 503 at once; the listener takes and counts them in the order they came.
    let idle: Vec<std::net::TcpStream> = (0..80).map(|_| std::net::TcpStream::connect(&metrics).unwrap()).collect();
    // Another address is answered meanwhile.
    let other = crate::util::request_from(
        "127.0.0.2",
        &metrics,
        "GET /metrics HTTP/1.1\r\nHost: m\r\nConnection: close\r\n\r\n",
    );
    assert!(other.0.starts_with("HTTP/1.1 200"), "{}", other.0);
    let m = Scrape::parse(other.1.lines().map(|l| Ok(l.to_string()))).unwrap();
    assert_eq!(value(&m, "oar_applied_samples_total", None), 0.0);
    assert_eq!(value(&m, "oar_http_connections_turned_away_total", None), 64.0);
    let mut turned_away = 0;
    for mut c in idle {
        // A bound far above the 10 s, so a server that never closes them fails the test.
        c.set_read_timeout(Some(std::time::Duration::from_secs(120))).unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).expect("the idle connection was closed by the server");
        turned_away += rest.starts_with(b"HTTP/1.1 503") as usize;
    }
    assert_eq!(turned_away, 64);
    // With its share free again, the address is served.
    assert_eq!(value(&scrape(&metrics), "oar_applied_samples_total", None), 0.0, "the scrape behind them was answered");
    server.kill().unwrap();
    server.wait().unwrap();
}

/// `oar launch --metrics-port-base P` puts every process's metrics where Prometheus is told to
/// look: server i at P + i, trainer w at P + servers + w, as the summary lists them. A base that
/// runs past port 65535 is one clear error before anything starts.
#[test]
fn launch_puts_every_metrics_endpoint_at_its_given_port() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 500, 0);
    let base = free_ports(4);
    let logs = dir.path().join("logs");
    let (train, logs_arg, base_arg) = (train.display().to_string(), logs.display().to_string(), base.to_string());
    let args = ["launch", "--servers", "2", "--workers", "2", "--train", &train, "--hidden", "8", "--logs", &logs_arg];
    let out = oar(&[&args[..], &["--no-progress", "--metrics-port-base", &base_arg]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(logs.join("summary.json")).unwrap()).unwrap();
    let got: Vec<(String, String)> = serde_json::from_value(summary["metrics"].clone()).unwrap();
    let want: Vec<(String, String)> = ["server 0", "server 1", "worker 0", "worker 1"]
        .iter()
        .enumerate()
        .map(|(k, name)| (name.to_string(), format!("http://127.0.0.1:{}/metrics", base as usize + k)))
        .collect();
    assert_eq!(got, want);

    let out = oar(&[&args[..], &["--no-progress", "--metrics-port-base", "65534"]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("--metrics-port-base 65534: 2 servers and 2 workers need ports 65534..=65537"));
}
