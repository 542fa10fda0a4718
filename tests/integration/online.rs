//! Online training end to end: a drifting stream of day folders (`oar gen stream`), trained
//! day after day by `oar launch` on 2 servers x 2 trainers with a shrink and a base save at
//! each day's end, and by `oar train` killed mid-day and resumed: every save is announced once,
//! in order, and the resumed job ends with the same tables as an undisturbed one.

use std::path::Path;

use crate::util::*;

fn stream(dir: &Path, days: u32, lines: u64) -> String {
    let out = dir.join("stream");
    let o = oar(&[
        "gen",
        "stream",
        "--days",
        &days.to_string(),
        "--lines-per-day",
        &lines.to_string(),
        "--out",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    out.display().to_string()
}

/// The job: logistic regression (one dim-1 table over the 26 slots), the shrink deleting rows
/// whose decayed score falls below 0.15 (seen once).
fn job(dir: &Path) -> String {
    let path = dir.join("online.toml");
    std::fs::write(
        &path,
        r#"
[model]
output = "logit"
loss = "log_loss"
tables = [{ name = "w", dim = 1, accessor = { show_click_decay_rate = 0.9, delete_threshold = 0.15 } }]
layers = [
  { name = "wide", type = "embedding", table = "w", slots = "C1..C26" },
  { name = "s", type = "reduce_sum", input = "wide", over = "all" },
  { name = "d", type = "linear", input = "dense", out = 1 },
  { name = "logit", type = "add", inputs = ["s", "d"] },
]
[sparse_optimizer]
kind = "SparseAdaGradSGDRule"   # Paddle's row-wise Adagrad
lr = 0.3
[train]
batch_size = 200
"#,
    )
    .unwrap();
    path.display().to_string()
}

#[test]
fn launch_trains_day_after_day_evaluating_each_day_on_the_next_and_shrinking_at_its_end() {
    let dir = tempfile::tempdir().unwrap();
    let stream = stream(dir.path(), 3, 8_000);
    let (job, out) = (job(dir.path()), dir.path().join("out").display().to_string());
    let logs = dir.path().join("logs");
    let (printed, summary) = launch(
        &logs,
        &["--config", &job, "--mode", "sync", "--online", &stream, "--days", "20260101..20260103"]
            .into_iter()
            .chain(["--passes-per-day", "2", "--delta-every", "1", "--output", &out])
            .collect::<Vec<_>>(),
    );
    let days = &summary.days;
    let dates: Vec<&str> = days.iter().map(|d| d.date.as_str()).collect();
    assert_eq!(dates, ["20260101", "20260102", "20260103"], "{printed}");
    for d in &days[..2] {
        let next = d.next_day.as_ref().expect("evaluated on the next day");
        assert_eq!(next.samples, 4_000, "the next day's first split of two");
        assert!(next.auc.unwrap() > 0.58, "{next}");
    }
    assert!(days[2].next_day.is_none());
    // Each day's shrink halves the counts and deletes the rows seen about once, counted by the
    // servers: what they hold after the shrink is what they reported holding.
    assert!(days.iter().all(|d| d.shrunk_rows > 0 && d.rows.len() == 2 && d.peak_rss_bytes.iter().all(|&b| b > 0)));
    let deleted: u64 =
        summary.server_stats.iter().map(|s| s.lifecycle[0].shrunk_score + s.lifecycle[0].shrunk_unseen).sum();
    assert_eq!(deleted, days.iter().map(|d| d.shrunk_rows).sum::<u64>());
    let held: u64 = summary.server_stats.iter().map(|s| s.rows[0] as u64).sum();
    assert_eq!(held, days[2].rows.iter().sum::<u64>());
    assert!(printed.contains("next-day AUC"), "{printed}");
    // Each trainer was given its own credential, never the job's master secret.
    for w in 0..2u64 {
        let file = logs.join(format!("credentials/trainer-{w}"));
        let credential = oar::security::auth::Secret::read(&file).unwrap();
        assert_eq!((credential.is_master(), credential.identity()), (false, oar::security::auth::Identity::Trainer(w)));
        let log = std::fs::read_to_string(logs.join(format!("worker.{w}.log"))).unwrap();
        assert!(!log.contains("holds the job's master secret"), "{log}");
    }
    // Every pass saved for serving once, a base at each day's end.
    let done = oar::persist::export::done_lines(&Path::new(&out).join("donefile.txt")).unwrap();
    let saves: Vec<(u32, u32, &str)> = done.iter().map(|l| (l.day, l.pass, l.kind.name())).collect();
    assert_eq!(
        saves,
        [
            (20260101, 1, "base"),
            (20260101, 2, "base"),
            (20260102, 1, "delta"),
            (20260102, 2, "base"),
            (20260103, 1, "delta"),
            (20260103, 2, "base")
        ]
    );
}

/// Rows of a save's files (both kinds), by id.
fn save_rows(dir: &Path) -> std::collections::BTreeMap<u64, Vec<f32>> {
    let (_, tables) = oar::persist::export::read(&dir.join(oar::persist::export::file_name(0))).unwrap();
    let (dim, t) = &tables["w"];
    t.ids.iter().zip(t.weights.chunks_exact(*dim)).map(|(&id, w)| (id, w.to_vec())).collect()
}

#[test]
fn a_job_killed_mid_day_resumes_at_its_last_pass_and_announces_every_save_once() {
    let dir = tempfile::tempdir().unwrap();
    let stream = stream(dir.path(), 3, 6_000);
    let job = job(dir.path());
    let args = |out: &Path| -> Vec<String> {
        ["train", "--config", &job, "--online", &stream, "--days", "20260101..20260103", "--passes-per-day", "2"]
            .into_iter()
            .map(String::from)
            .chain(["--delta-every".into(), "1".into(), "--output".into(), out.display().to_string()])
            .collect()
    };
    let whole = dir.path().join("whole");
    let o = oar(&args(&whole).iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o));

    // Killed in day 2's second pass (a day is 30 steps of 200 lines), then resumed.
    let out = dir.path().join("out");
    let mut child = spawn_oar(dir.path(), &args(&out), "trainer0:kill@step=50", "killed.log");
    let status = child.wait().unwrap();
    assert!(!status.success(), "the fault killed it");
    let before = oar::persist::export::done_lines(&out.join("donefile.txt")).unwrap();
    assert_eq!(before.len(), 3, "saves through day 2's first pass");
    let mut again = args(&out);
    again.extend(["--resume".into(), out.display().to_string()]);
    let o = oar(&again.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(o.status.success(), "{}", text(&o));

    let announced = |dir: &Path| -> Vec<(u32, u32, String)> {
        let lines = oar::persist::export::done_lines(&dir.join("donefile.txt")).unwrap();
        lines.iter().map(|l| (l.day, l.pass, l.kind.name().to_string())).collect()
    };
    assert_eq!(announced(&out), announced(&whole), "no gap, no duplicate");
    // The last base of the resumed job holds the undisturbed job's rows, bit for bit.
    let last = |dir: &Path| {
        save_rows(&oar::persist::export::done_lines(&dir.join("donefile.txt")).unwrap().last().unwrap().path)
    };
    assert_eq!(last(&out), last(&whole));
}

#[test]
fn a_trainer_killed_mid_day_is_restarted_by_launch_and_every_sample_is_applied_once() {
    let dir = tempfile::tempdir().unwrap();
    let stream = stream(dir.path(), 3, 8_000);
    let (job, out) = (job(dir.path()), dir.path().join("out"));
    let logs = dir.path().join("logs");
    let s = |p: &Path| p.display().to_string();
    // A day is 2 passes of 2 parts, a part per trainer: 10 steps of 200 lines a pass. Trainer 1
    // dies in its 25th step, in day 2's first pass.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["launch", "--no-progress", "--config", &job, "--mode", "sync", "--online", &stream])
        .args(["--days", "20260101..20260103", "--passes-per-day", "2", "--delta-every", "1"])
        .args(["--output", &s(&out), "--logs", &s(&logs), "--max-restarts", "1"])
        .env_remove("OAR_LAUNCHED")
        .env("OAR_FAULT", "trainer1:kill@step=25")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let summary: oar::run::launch::LaunchSummary =
        serde_json::from_slice(&std::fs::read(logs.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary.restarts.len(), 1, "{}", text(&o));
    assert_eq!(summary.days.len(), 3);
    // Counted by the servers: each applied every sample of each trainer's 12,000 once.
    for s in &summary.server_stats {
        for t in 0..2 {
            assert_eq!(s.applied_samples[t] + s.discarded_samples[t], 12_000, "trainer {t}: {s:?}");
        }
    }
    let done = oar::persist::export::done_lines(&out.join("donefile.txt")).unwrap();
    let saves: Vec<(u32, u32)> = done.iter().map(|l| (l.day, l.pass)).collect();
    assert_eq!(saves, [(20260101, 1), (20260101, 2), (20260102, 1), (20260102, 2), (20260103, 1), (20260103, 2)]);
}

/// Trainers of an online job that list a day differently (a file added between their starts)
/// cannot train it apart: the second one's declaration is refused naming the day, and the job
/// ends, where before both trained, splits shifted, and the new file went untrained without a
/// word.
#[test]
fn a_trainer_listing_another_calendar_is_refused_naming_the_day() {
    let dir = tempfile::tempdir().unwrap();
    let stream = stream(dir.path(), 1, 1_000);
    let job = job(dir.path());
    let server = start_server(server_config(0, 1, 2, oar::protocol::Mode::Async));
    let train = |id: &str| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_oar"));
        c.args(["train", "--config", &job, "--online", &stream, "--days", "20260101..20260101"])
            .args(["--passes-per-day", "1", "--servers", &server.addr, "--job", "test", "--mode", "async"])
            .args(["--sync-warmup", "0", "--trainers", "2", "--trainer-id", id])
            .env_remove("OAR_LAUNCHED")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        c
    };
    // Trainer 0 lists the day, declares and trains its share (then waits for trainer 1 at the
    // pass's end): its updates at the server show it has declared.
    let first = train("0").spawn().unwrap();
    let config = oar::client::ClientConfig::new(
        vec![server.addr.clone()],
        "test",
        std::time::Duration::from_secs(10),
        std::time::Duration::from_secs(10),
    );
    let mut tool = oar::client::Client::connect(&config).unwrap();
    wait_until(60, "trainer 0's first update", || tool.stats().unwrap()[0].version > 0);
    drop(tool);
    let day = Path::new(&stream).join("20260101");
    let extra = day.join("part-00004");
    std::fs::copy(day.join("part-00003"), &extra).unwrap();
    let refused = train("1").output().unwrap();
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("the online calendar differs from the other trainers': day 20260101: 5 files")
            && err.contains("4 files of"),
        "{err}"
    );
    // The job cannot go on without trainer 1: trainer 0 is told so (status 3, a peer lost),
    // and the server ends naming it, rather than training on with a file nobody trains.
    let first = first.wait_with_output().unwrap();
    assert_eq!(first.status.code(), Some(3), "{}", text(&first));
    assert!(server.handle.join().is_err(), "the server ended with an error");
}

/// A resume counts its passes from the job's first day: the next day given alone (`--days`
/// from it) is refused naming the range to give, as is a model trained offline; the range from
/// the first day goes on at the next day. Before, the first trained only the last day ("nothing
/// to train" for two new days), the second skipped a day, both without a word.
#[test]
fn an_online_resume_goes_on_at_the_next_day_or_names_the_days_to_give() {
    let dir = tempfile::tempdir().unwrap();
    let stream = stream(dir.path(), 4, 1_000);
    let job = job(dir.path());
    let out = dir.path().join("out").display().to_string();
    let train = |days: &str, from: &str, extra: &[&str]| {
        let args = ["train", "--config", &job, "--online", &stream, "--days", days, "--output", from];
        oar(&[&args[..], extra].concat())
    };
    let o = train("20260101..20260102", &out, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let o = train("20260103..20260104", &out, &["--resume", &out]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("resume with --days 20260101..20260104"), "{}", text(&o));
    let o = train("20260101..20260104", &out, &["--resume", &out]);
    assert!(o.status.success(), "{}", text(&o));
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(Path::new(&out).join("pass-0004/manifest.json")).unwrap()).unwrap();
    assert_eq!(m["model"]["online"]["day"], "20260104", "{m}");
    assert!(!Path::new(&out).join("pass-0005").exists());
    // A model trained offline on the first day's files.
    let offline = dir.path().join("offline").display().to_string();
    let first = format!("{stream}/20260101");
    let o = oar(&["train", "--config", &job, "--train", &first, "--output", &offline]);
    assert!(o.status.success(), "{}", text(&o));
    let o = train("20260101..20260102", &offline, &["--resume", &offline]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("not trained online"), "{}", text(&o));
}

/// A done-file whose last line was cut short is refused when the job starts, naming the line,
/// before a day is trained: it was accepted, the next save's line was appended onto it, and
/// the job after that failed only once its day was trained, leaving a save unannounced.
#[test]
fn a_torn_done_file_is_refused_before_a_day_is_trained() {
    let dir = tempfile::tempdir().unwrap();
    let stream = stream(dir.path(), 3, 1_000);
    let job = job(dir.path());
    let out = dir.path().join("out");
    let train = |days: &str, extra: &[&str]| {
        let args = ["train", "--config", &job, "--online", &stream, "--days", days, "--delta-every", "1"];
        oar(&[&args[..], &["--output", &out.display().to_string()], extra].concat())
    };
    assert!(train("20260101..20260102", &[]).status.success());
    let done = out.join("donefile.txt");
    let whole = std::fs::read(&done).unwrap();
    std::fs::write(&done, &whole[..whole.len() - 6]).unwrap();
    let o = train("20260101..20260103", &["--resume", &out.display().to_string()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("has no line break at its end"), "{}", text(&o));
    assert!(!out.join("pass-0003").exists(), "no day trained");
    assert_eq!(std::fs::read(&done).unwrap(), whole[..whole.len() - 6], "the done-file untouched");
}

/// A split of a day that gives a trainer no file is refused before any day is trained, naming
/// the day: with 2 files a day in 2 passes and 2 trainers, trainer 1 met a pass over nothing.
#[test]
fn a_day_too_few_files_for_its_trainers_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("stream");
    let o = oar(&[
        "gen",
        "stream",
        "--days",
        "2",
        "--lines-per-day",
        "400",
        "--parts",
        "2",
        "--out",
        &out.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let job = job(dir.path());
    let logs = dir.path().join("logs").display().to_string();
    let o = oar(&[
        "launch",
        "--logs",
        &logs,
        "--no-progress",
        "--servers",
        "1",
        "--workers",
        "2",
        "--config",
        &job,
        "--online",
        &out.display().to_string(),
        "--days",
        "20260101..20260102",
        "--passes-per-day",
        "2",
    ]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("day 20260101 split 1 holds 1 file(s), none of them trainer 1's of 2"), "{}", text(&o));
}

/// A warm start: online training from a model trained offline on the first day (one process,
/// so one shard) by 2 servers x 2 trainers with `--init-model`. Counted in the saved tables:
/// the warm model holds every row of the offline model and every row a cold online run of the
/// same days learns, and each offline row the stream never showed again keeps its saved weight
/// bit for bit. Its passes are numbered from the calendar's first day, it scales its dense
/// values with the offline model's statistics, and statistics of its own that differ are
/// refused by name.
#[test]
fn online_training_starts_from_an_offline_model_with_init_model() {
    let dir = tempfile::tempdir().unwrap();
    let stream = stream(dir.path(), 4, 2_000);
    // No shrink (no accessor): the rows a day leaves unseen stay, to be counted.
    let text_of = std::fs::read_to_string(job(dir.path())).unwrap();
    let text_of = text_of.replace(", accessor = { show_click_decay_rate = 0.9, delete_threshold = 0.15 }", "");
    let (plain, job) = (dir.path().join("plain.toml"), dir.path().join("warm.toml"));
    std::fs::write(&plain, &text_of).unwrap();
    std::fs::write(&job, text_of + "[data]\ndense_transform = \"standardize\"\n").unwrap();
    let (plain, job) = (plain.display().to_string(), job.display().to_string());
    let path = |name: &str| dir.path().join(name).display().to_string();
    let (offline, cold, warm) = (path("offline"), path("cold"), path("warm"));
    let o = oar(&["train", "--config", &job, "--train", &format!("{stream}/20260101"), "--output", &offline]);
    assert!(o.status.success(), "{}", text(&o));
    // The rows the stream's days teach (online training scales only with statistics given).
    let online = ["--online", &stream, "--days", "20260102..20260103"];
    let o = oar(&[&["train", "--config", &plain][..], &online, &["--output", &cold]].concat());
    assert!(o.status.success(), "{}", text(&o));
    let args = [
        &["--config", &job][..],
        &online,
        &["--servers", "2", "--workers", "2", "--init-model", &offline, "--output", &warm],
    ]
    .concat();
    launch(&dir.path().join("logs"), &args);

    let manifest = |dir: &str| oar::persist::checkpoint::Manifest::find(Path::new(dir)).unwrap().0;
    let m = manifest(&warm);
    assert_eq!((m.pass, m.num_servers), (2, 2));
    assert_eq!(m.model["online"]["first_day"], "20260102", "{}", m.model);
    assert_eq!(m.model["init_model"], offline.as_str());
    assert_eq!(m.model["data"]["dense_stats"], manifest(&offline).model["data"]["dense_stats"]);

    let rows = |dir: &str| -> std::collections::BTreeMap<u64, Vec<f32>> {
        load_params(Path::new(dir)).rows.into_iter().map(|(_, id, w)| (id, w)).collect()
    };
    let (offline_rows, cold_rows, warm_rows) = (rows(&offline), rows(&cold), rows(&warm));
    let mut ids: Vec<u64> = offline_rows.keys().chain(cold_rows.keys()).copied().collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(warm_rows.keys().copied().collect::<Vec<_>>(), ids);
    let unseen: Vec<u64> = offline_rows.keys().filter(|id| !cold_rows.contains_key(id)).copied().collect();
    assert!(unseen.len() > 100, "{} offline rows the stream does not show again", unseen.len());
    for id in &unseen {
        let (a, b) = (&offline_rows[id], &warm_rows[id]);
        assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "row {id}: {a:?} against {b:?}");
    }

    // Resumed for the next day (in one process), its save still names the model it started
    // from: a resume used to drop the lineage from every manifest after it.
    let next = ["--online", &stream, "--days", "20260102..20260104", "--resume", &warm, "--output", &warm];
    let o = oar(&[&["train", "--config", &job][..], &next].concat());
    assert!(o.status.success(), "{}", text(&o));
    let m = manifest(&warm);
    assert_eq!(m.pass, 3);
    assert_eq!(m.model["init_model"], offline.as_str(), "{}", m.model);

    // Statistics of its own that differ from the model's are refused, naming the first.
    let stats = dir.path().join("stats.json");
    let mut s: serde_json::Value = manifest(&offline).model["data"]["dense_stats"].clone();
    s["mean"][0] = (s["mean"][0].as_f64().unwrap() + 1.0).into();
    std::fs::write(&stats, s.to_string()).unwrap();
    let other = dir.path().join("other.toml");
    let text_of = std::fs::read_to_string(&job).unwrap();
    std::fs::write(&other, text_of + "dense_stats = \"stats.json\"\n").unwrap();
    let args = ["train", "--config", other.to_str().unwrap(), "--online", &stream, "--days", "20260102..20260103"];
    let o = oar(&[&args[..], &["--init-model", &offline, "--output", &path("refused")]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("dense_stats differ from the saved model's (mean[0]"), "{}", text(&o));
    // A warm start saving into the model it starts from would overwrite it.
    let o = oar(&[&args[..], &["--init-model", &offline, "--output", &offline]].concat());
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("a warm start is a new job whose passes would overwrite it"), "{}", text(&o));
    // Both flags name a model to start from: one is asked for.
    let o = oar(&[&args[..], &["--init-model", &offline, "--resume", &offline]].concat());
    assert!(!o.status.success() && text(&o).contains("--init-model"), "{}", text(&o));
}
