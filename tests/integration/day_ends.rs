//! Online day ends applied exactly once, end to end with `oar launch` (2 servers x 2 trainers,
//! sync, two days of two passes): trainer 0 killed at each point of a day's end and restarted
//! ends with the undisturbed job's tables; a server killed having applied the day's shrink, or
//! mid-day, is restored from a checkpoint that does not hold it and shrinks that day once. At
//! every save the rows a serving system holds (the done-file's saves applied in order) are the
//! rows the pass's save holds above `base_threshold`, counted from the servers' own files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::util::*;

/// Logistic regression over the 26 slots whose day-end shrink deletes rows seen about once and
/// takes rows seen about three times out of the base (`base_threshold` 0.25).
const JOB: &str = r#"
[model]
output = "logit"
loss = "log_loss"
tables = [{ name = "w", dim = 1, accessor = { show_click_decay_rate = 0.8, delete_threshold = 0.15, base_threshold = 0.25 } }]
layers = [
  { name = "wide", type = "embedding", table = "w", slots = "C1..C26" },
  { name = "s", type = "reduce_sum", input = "wide", over = "all" },
  { name = "d", type = "linear", input = "dense", out = 1 },
  { name = "logit", type = "add", inputs = ["s", "d"] },
]
[sparse_optimizer]
kind = "SparseAdaGradSGDRule"
lr = 0.3
[train]
batch_size = 200
"#;

struct Online {
    dir: tempfile::TempDir,
    stream: String,
    job: String,
}

impl Online {
    fn new() -> Online {
        let dir = tempfile::tempdir().unwrap();
        let stream = dir.path().join("stream").display().to_string();
        let o = oar(&["gen", "stream", "--days", "2", "--lines-per-day", "6000", "--out", &stream]);
        assert!(o.status.success(), "{}", text(&o));
        let job = dir.path().join("job.toml");
        std::fs::write(&job, JOB).unwrap();
        Online { dir, stream, job: job.display().to_string() }
    }

    /// Runs the job as `name` with `fault` planted (none if empty) and `extra` flags: its output
    /// folder and summary.
    fn launch(&self, name: &str, fault: &str, extra: &[&str]) -> (PathBuf, oar::run::launch::LaunchSummary) {
        let (out, logs) = (self.dir.path().join(name), self.dir.path().join(format!("{name}-logs")));
        let s = |p: &Path| p.display().to_string();
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
            .args(["launch", "--no-progress", "--config", &self.job, "--mode", "sync", "--online", &self.stream])
            .args(["--days", "20260101..20260102", "--passes-per-day", "2", "--delta-every", "1"])
            .args(["--output", &s(&out), "--logs", &s(&logs)])
            .args(extra)
            .env_remove("OAR_LAUNCHED")
            .env("OAR_FAULT", fault)
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}: {}", text(&o));
        let summary = serde_json::from_slice(&std::fs::read(logs.join("summary.json")).unwrap()).unwrap();
        (out, summary)
    }
}

/// Rows by id of every server's file of one save for serving.
fn saved_rows(dir: &Path, servers: usize) -> BTreeMap<u64, Vec<f32>> {
    let mut rows = BTreeMap::new();
    for s in 0..servers {
        let (_, tables) = oar::persist::export::read(&dir.join(oar::persist::export::file_name(s))).unwrap();
        let (dim, t) = &tables["w"];
        rows.extend(t.ids.iter().zip(t.weights.chunks_exact(*dim)).map(|(&id, w)| (id, w.to_vec())));
    }
    rows
}

/// The rows a base would hold, read from a pass's save (every row, with its statistics).
fn base_of_pass(dir: &Path, servers: usize) -> BTreeMap<u64, Vec<f32>> {
    let mut rows = BTreeMap::new();
    for s in 0..servers {
        let shard =
            oar::persist::checkpoint::read_shard(&dir.join(oar::persist::checkpoint::shard_file_name(s))).unwrap();
        let t = &shard.sparse[0];
        let (dim, accessor) = (t.spec().dim, &t.spec().accessor);
        t.for_each_row(|id, row| {
            if accessor.in_base(&row[dim..]) {
                rows.insert(id, row[..dim].to_vec());
            }
        });
    }
    rows
}

/// The saves announced, as (day, pass in the day, kind).
fn announced(out: &Path) -> Vec<(u32, u32, &'static str)> {
    let lines = oar::persist::export::done_lines(&out.join("donefile.txt")).unwrap();
    lines.iter().map(|l| (l.day, l.pass, l.kind.name())).collect()
}

/// Applies the done-file's saves in order, as a serving system does (a base replaces, a delta
/// deletes its removed ids then writes its rows), and checks after each that it holds the
/// rows the pass saved at the same moment keeps in its base.
fn check_serving(out: &Path) {
    let lines = oar::persist::export::done_lines(&out.join("donefile.txt")).unwrap();
    let mut served = BTreeMap::new();
    for (k, line) in lines.iter().enumerate() {
        for s in 0..2 {
            let (kind, tables) =
                oar::persist::export::read(&line.path.join(oar::persist::export::file_name(s))).unwrap();
            let (dim, t) = &tables["w"];
            if kind == oar::protocol::ExportKind::Base && s == 0 {
                served.clear();
            }
            for id in &t.deleted {
                served.remove(id);
            }
            served.extend(t.ids.iter().zip(t.weights.chunks_exact(*dim)).map(|(&id, w)| (id, w.to_vec())));
        }
        // One save for serving a pass: the k-th line is pass k + 1.
        let pass = out.join(oar::persist::checkpoint::pass_dir_name(k as u32 + 1));
        assert_eq!(served, base_of_pass(&pass, 2), "{}: the saves applied through {line:?}", out.display());
    }
}

#[test]
#[cfg_attr(not(feature = "faults"), ignore = "plants faults: run with --features faults")]
fn trainer_0_killed_at_each_point_of_a_day_end_ends_with_the_undisturbed_tables() {
    let job = Online::new();
    let (whole, undisturbed) = job.launch("whole", "", &[]);
    assert!(undisturbed.restarts.is_empty());
    check_serving(&whole);
    let last =
        |out: &Path| oar::persist::export::done_lines(&out.join("donefile.txt")).unwrap().last().unwrap().path.clone();
    let tables = saved_rows(&last(&whole), 2);
    let lifecycle =
        |s: &oar::run::launch::LaunchSummary| -> Vec<_> { s.server_stats.iter().map(|s| s.lifecycle[0]).collect() };
    assert!(lifecycle(&undisturbed).iter().all(|l| l.shrunk_score > 0), "{:?}", lifecycle(&undisturbed));
    // 1: before the shrink; 2: after it; 3: after the save for serving; 4: after the pass's.
    for point in 1..=4 {
        let name = format!("killed-{point}");
        let fault = format!("trainer0:kill@dayend={point}");
        let (out, killed) = job.launch(&name, &fault, &["--max-restarts", "1"]);
        assert_eq!(killed.restarts.len(), 1, "{name}: {:?}", killed.restarts);
        assert_eq!(announced(&out), announced(&whole), "{name}: every save announced once");
        assert_eq!(saved_rows(&last(&out), 2), tables, "{name}: the last base, bit for bit");
        // Counted by the servers: the day's shrink deleted as many rows as undisturbed, once.
        assert_eq!(lifecycle(&killed), lifecycle(&undisturbed), "{name}");
        assert!(killed.server_stats.iter().all(|s| s.day_end == 4), "{name}: both day ends recorded once");
        check_serving(&out);
    }
}

#[test]
#[cfg_attr(not(feature = "faults"), ignore = "plants faults: run with --features faults")]
fn a_server_killed_having_shrunk_the_day_is_restored_without_it_and_shrinks_it_once() {
    let job = Online::new();
    let extra = ["--max-restarts", "1", "--checkpoint-every", "0.2"];
    // Server 1 dies having applied the first day's shrink (after pass 2) before answering it:
    // none of its checkpoints holds that shrink.
    let (out, summary) = job.launch("server-shrunk", "server1:kill@shrunk=2", &extra);
    assert_eq!(summary.restarts.len(), 1, "{:?}", summary.restarts);
    assert_eq!(summary.restarts[0].process, "server 1");
    assert!(summary.server_stats.iter().all(|s| s.day_end == 4), "{:?}", summary.server_stats);
    // Its successor restored a checkpoint without that day end, and applied it when trainer 0
    // reconnected to it.
    let log = std::fs::read_to_string(out.with_file_name("server-shrunk-logs").join("server.1.epoch-1.log")).unwrap();
    assert!(log.contains("resumed shard from a checkpoint") && log.contains("day_end=0"), "{log}");
    assert!(log.contains("the shrink of the day end after pass 2 is held already"), "the answer it never sent: {log}");
    let applied = log.lines().filter(|l| l.contains("shrink days=1 day_end=2")).count();
    assert_eq!(applied, 1, "the successor applied day end 2 once:\n{log}");
    check_serving(&out);
}

#[test]
#[cfg_attr(not(feature = "faults"), ignore = "plants faults: run with --features faults")]
fn a_server_restored_mid_day_has_its_next_save_made_a_base() {
    let job = Online::new();
    let extra = ["--max-restarts", "1", "--checkpoint-every", "0.2"];
    // A pass is 8 sync steps: version 20 is in the second day's first pass, whose save would
    // be a delta; the restored server cannot name the rows it removed since the last save.
    let (out, summary) = job.launch("server-mid-day", "server1:kill@version=20", &extra);
    assert_eq!(summary.restarts.len(), 1, "{:?}", summary.restarts);
    assert_eq!(
        announced(&out),
        [(20260101, 1, "base"), (20260101, 2, "base"), (20260102, 1, "base"), (20260102, 2, "base")]
    );
    check_serving(&out);
}
