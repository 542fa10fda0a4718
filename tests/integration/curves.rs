//! Training curves: every trainer of a launched job appends its points to `metrics.csv`, the
//! launcher draws them to a PNG named in its summary, `oar plot` draws them again, and a
//! damaged file or a named pipe in its place is refused with one line naming it.

use crate::util::*;
use oar::observe::curves::Kind;

fn png_size(path: &std::path::Path) -> (u32, u32) {
    let reader = png::Decoder::new(std::fs::File::open(path).unwrap()).read_info().unwrap();
    (reader.info().width, reader.info().height)
}

#[test]
fn a_launched_job_writes_every_trainers_curves_and_draws_them() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(dir.path(), 2, 3000, 1000);
    let logs = dir.path().join("logs");
    let (train, test) = (train.display().to_string(), test.display().to_string());
    let args = ["--mode", "sync", "--train", &train, "--test", &test, "--hidden", "8", "--passes", "2"];
    let (out, summary) = launch(&logs, &[&args[..], &["--batch-size", "100", "--metrics-every", "10"]].concat());
    let csv = logs.join("metrics.csv");
    let png = summary.curves.clone().expect("the summary names the curves");
    assert_eq!(png, logs.join("curves.png"));
    assert!(out.contains(&format!("training curves: {}", png.display())), "{out}");
    assert_eq!(png_size(&png), (1100, 800));
    // Every process served its metrics; the launcher printed and recorded each endpoint.
    let names: Vec<&str> = summary.metrics.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(names, ["server 0", "server 1", "worker 0", "worker 1"]);
    for (p, url) in &summary.metrics {
        assert!(url.starts_with("http://127.0.0.1:") && url.ends_with("/metrics"), "{url}");
        assert!(out.contains(&format!("{p}: metrics at {url}")), "{out}");
    }

    let points = oar::observe::curves::read(&csv).unwrap();
    for (t, report) in summary.reports.iter().enumerate() {
        let mine: Vec<_> = points.iter().filter(|p| p.trainer == t as u32).collect();
        // 3000 samples a pass in steps of 100: a point every 10 steps, 3 a pass.
        let steps: Vec<u64> = mine.iter().filter(|p| p.kind == Kind::Steps).map(|p| p.step).collect();
        assert_eq!(steps, [10, 20, 30, 40, 50, 60], "trainer {t}");
        assert!(mine.iter().filter(|p| p.kind == Kind::Steps).all(|p| p.samples == p.step * 100));
        // Each pass's point holds what the trainer reported for the pass.
        let passes: Vec<_> = mine.iter().filter(|p| p.kind == Kind::Pass).collect();
        assert_eq!(passes.len(), 2);
        for (p, r) in passes.iter().zip(&report.passes) {
            assert_eq!((p.pass, p.samples, p.auc), (r.pass, 3000 * r.pass as u64, r.train.auc));
            assert!((p.loss.unwrap() - r.train.loss).abs() < 1e-12);
        }
        let all: Vec<_> = mine.iter().filter(|p| p.kind == Kind::AllTrainers).collect();
        assert_eq!(all.len(), 2);
        let tests: Vec<_> = mine.iter().filter(|p| p.kind == Kind::Test).collect();
        if t == 0 {
            let last = report.passes.last().unwrap().test.clone().unwrap();
            assert_eq!((tests.len(), tests[1].auc), (2, last.auc));
        } else {
            assert!(tests.is_empty(), "only trainer 0 evaluates the test set");
        }
    }

    // `oar plot` draws the same file again, anywhere.
    let again = dir.path().join("again.png");
    let o = oar(&["plot", "--metrics", &csv.display().to_string(), "--out", &again.display().to_string()]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(png_size(&again), (1100, 800));

    // A damaged line is named; a named pipe is refused at once, not waited on.
    let bad = dir.path().join("bad.csv");
    let good = std::fs::read_to_string(&csv).unwrap();
    let mut lines: Vec<&str> = good.lines().collect();
    lines[2] = "0,1,20,two thousand,1.0,steps,0.5,0.7";
    std::fs::write(&bad, lines.join("\n")).unwrap();
    let o = oar(&["plot", "--metrics", &bad.display().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success() && err.contains(&format!("{}:3: not a curve point", bad.display())), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let fifo = dir.path().join("fifo.csv");
    let c = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    // SAFETY: mkfifo with a valid path and mode.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let o = oar(&["plot", "--metrics", &fifo.display().to_string()]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(!o.status.success() && err.contains("not a regular file"), "{err}");
    // Finite losses near f64's limits: refused with a reason (the drawing looped for good on
    // their infinite span; `timeout` ends a regression instead of the test hanging).
    let huge = dir.path().join("huge.csv");
    std::fs::write(
        &huge,
        format!(
            "{}\n0,1,50,100,1.0,steps,1.7e308,0.5\n0,1,60,200,1.0,steps,-1.7e308,0.6\n",
            oar::observe::curves::HEADER
        ),
    )
    .unwrap();
    let o = std::process::Command::new("timeout")
        .args(["60", env!("CARGO_BIN_EXE_oar"), "plot", "--metrics", &huge.display().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        !o.status.success()
            && o.status.code() != Some(124)
            && err.contains("loss values from")
            && err.contains("too far apart"),
        "{err}"
    );
}

#[test]
fn tensorboard_reads_the_same_curves_from_the_event_files() {
    // TensorBoard's own reader (its EventAccumulator) on the event files a launched 2x2 job wrote
    // gives, per trainer, the points of metrics.csv: same tags, steps and values (as f32).
    let Some(py) = python_with("tensorboard") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(dir.path(), 2, 2000, 500);
    let (logs, board) = (dir.path().join("logs"), dir.path().join("board"));
    let (train, test, b) = (train.display().to_string(), test.display().to_string(), board.display().to_string());
    let args = ["--mode", "sync", "--train", &train, "--test", &test, "--hidden", "8", "--passes", "2"];
    launch(&logs, &[&args[..], &["--batch-size", "100", "--metrics-every", "5", "--tensorboard", &b]].concat());
    let points = oar::observe::curves::read(&logs.join("metrics.csv")).unwrap();
    let reader = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
out = {}
for t in sys.argv[1:]:
    ea = EventAccumulator(t)
    ea.Reload()
    out[t] = {tag: [[e.step, e.value] for e in ea.Scalars(tag)] for tag in ea.Tags()["scalars"]}
print(json.dumps(out))
"#;
    for t in 0..2u32 {
        let run = board.join(format!("trainer-{t}"));
        let o = std::process::Command::new(&py).args(["-c", reader, run.to_str().unwrap()]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let read: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let scalars = &read[run.to_str().unwrap()];
        let mut want: std::collections::BTreeMap<String, Vec<(u64, f32)>> = Default::default();
        for p in points.iter().filter(|p| p.trainer == t) {
            for (tag, v) in oar::observe::curves::tfevents::tags(p) {
                want.entry(tag).or_default().push((p.step, v));
            }
        }
        assert!(want.contains_key("loss/steps") && want.contains_key("auc/pass"), "{want:?}");
        let tags: Vec<&String> = scalars.as_object().unwrap().keys().collect();
        assert_eq!(tags, want.keys().collect::<Vec<_>>(), "trainer {t}: the same tags");
        for (tag, values) in &want {
            let got: Vec<(u64, f32)> = scalars[tag]
                .as_array()
                .unwrap()
                .iter()
                .map(|e| (e[0].as_u64().unwrap(), e[1].as_f64().unwrap() as f32))
                .collect();
            assert_eq!(&got, values, "trainer {t} {tag}");
        }
    }
}
