//! End-to-end runs of the `oar` binary: real processes over loopback TCP.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::*;

/// Real Criteo lines from `../shared/data/criteo/` (first 8,000 train in 4 parts, last 2,000
/// test), or generated lines when that folder is absent.
fn criteo_or_generated(dir: &Path) -> (PathBuf, PathBuf) {
    let Some(shared) = shared_data() else {
        eprintln!("../shared/data is absent: using generated Criteo-format data instead of real Criteo lines");
        return gen_data(dir, 4, 25_000, 10_000);
    };
    let text = std::fs::read_to_string(shared.join("criteo/criteo_train_first10k.txt")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let (train, test) = (dir.join("train"), dir.join("test"));
    std::fs::create_dir_all(&train).unwrap();
    std::fs::create_dir_all(&test).unwrap();
    for (i, chunk) in lines[..8000].chunks(2000).enumerate() {
        std::fs::write(train.join(format!("part-{i:05}")), chunk.join("\n") + "\n").unwrap();
    }
    std::fs::write(test.join("part-00000"), lines[8000..].join("\n") + "\n").unwrap();
    (train, test)
}

#[test]
fn launch_trains_criteo_on_two_servers_and_two_workers_and_eval_reads_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = criteo_or_generated(&dir.path().join("data"));
    let (logs, model) = (dir.path().join("logs"), dir.path().join("model"));
    // The CTR-DNN seed example's job file, as Getting started (docs/src/getting-started.md) runs it.
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ctr_dnn.toml");
    let out = oar(&[
        "launch",
        "--config",
        config.to_str().unwrap(),
        "--servers",
        "2",
        "--workers",
        "2",
        "--batch-size",
        "128",
        // 20 synchronous updates: each trainer's first 10 batches, split in halves.
        "--sync-warmup",
        "20",
        // Background checkpoints every 10 ms into model/checkpoints while training goes on.
        "--checkpoint-every",
        "0.01",
        "--no-progress",
        "--train",
        train.to_str().unwrap(),
        "--test",
        test.to_str().unwrap(),
        "--logs",
        logs.to_str().unwrap(),
        "--output",
        model.to_str().unwrap(),
    ]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let auc = number_after(&all, "test AUC ");
    assert!(auc > 0.65, "AUC {auc} is not clearly above chance:\n{all}");
    for log in ["server.0.log", "server.1.log", "worker.0.log", "worker.1.log", "summary.json"] {
        assert!(logs.join(log).exists(), "{log} missing");
    }
    // Async staleness is reported: in the summary, and in the servers' and trainers' logs, for
    // the pushes after the warm-up (2 trainers, each 4,000 lines in batches of 128).
    let pushes = 2 * (4000usize.div_ceil(128) - 10);
    assert!(all.contains(&format!("updates behind over {pushes} pushes")), "{all}");
    for log in ["server.0.log", "worker.1.log"] {
        let text = std::fs::read_to_string(logs.join(log)).unwrap();
        assert!(text.contains("staleness") && text.contains("updates behind"), "{log}: {text}");
    }
    let worker = std::fs::read_to_string(logs.join("worker.0.log")).unwrap();
    assert!(worker.contains("synchronous warm-up done"), "{worker}");
    assert!(model.join("pass-0001/manifest.json").exists());
    for server in 0..2 {
        let dir = model.join("checkpoints");
        let job =
            oar::server::shard_checkpoints::Fence::read(&oar::server::shard_checkpoints::server_dir(&dir, server))
                .unwrap()
                .unwrap()
                .job;
        let (entry, _) = oar::server::shard_checkpoints::load_latest(&dir, server, &job).unwrap();
        assert!(entry.seq >= 1 && entry.bytes > 0, "server {server}: {entry:?}");
    }

    // The saved model evaluated offline scores what trainer 0 measured after the pass.
    let out = oar(&["eval", "--model", model.to_str().unwrap(), "--data", test.to_str().unwrap()]);
    let all = text(&out);
    assert!(out.status.success(), "{all}");
    let offline = number_after(&all, "AUC ");
    assert!((offline - auc).abs() < 1e-4, "offline AUC {offline} vs {auc}");
}

/// Local training refuses a step whose gradients hold an infinity (a head weighted 1e38
/// overflows them) as the servers do, instead of training on to a model of NaNs and printing
/// a log-loss of NaN.
#[test]
fn local_training_stops_at_a_non_finite_step_naming_it_or_skips_it() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let cfg = oar::data::gen::GenConfig { lines: 600, test_lines: 100, seed: 1, parts: 1, out: data.clone() };
    oar::data::gen::tasks::generate(
        &cfg,
        &oar::data::gen::tasks::Relation::new(oar::data::gen::tasks::Effect::Experts, 0.0),
    )
    .unwrap();
    let job = std::fs::read_to_string(zoo_job("mmoe_tasks")).unwrap();
    let from = r#"{ output = "task1", loss = "log_loss", label = "task1" }"#;
    assert!(job.contains(from));
    let file = dir.path().join("job.toml");
    let weighted = r#"{ output = "task1", loss = "log_loss", label = "task1", weight = 1e38 }"#;
    std::fs::write(&file, job.replacen(from, weighted, 1)).unwrap();
    let (train, test) = (data.join("train"), data.join("test"));
    let out = oar(&["train", "--config", file.to_str().unwrap(), "--train", train.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the gradients of step 0 hold a NaN, an infinity or a value beyond ±1e18"), "{err}");
    // With `--nonfinite skip`, as on a server, every such step is left out and counted: the
    // model stays as it started, finite.
    let out =
        oar(&["train", "--config", file.to_str().unwrap(), "--train", train.to_str().unwrap(), "--nonfinite", "skip"]);
    assert!(out.status.success(), "{}", text(&out));
    let all = text(&out);
    assert!(all.contains("skipped (--nonfinite skip)"), "{all}");
    // 600 lines in batches of 256: all 3 steps skipped, the printed log-loss finite.
    assert!(all.contains("3 step(s) not applied"), "{all}");
    assert!(number_after(&all, "log-loss").is_finite(), "{all}");
    // The same job file unweighted trains.
    std::fs::write(&file, &job).unwrap();
    let args = ["train", "--config", file.to_str().unwrap(), "--train", train.to_str().unwrap()];
    let out = oar(&[&args[..], &["--test", test.to_str().unwrap()]].concat());
    assert!(out.status.success(), "{}", text(&out));
}

/// Counts that would write a million files or pass the calendar are refused before anything
/// is written.
#[test]
fn generators_and_the_splitter_refuse_absurd_counts_before_writing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let file = dir.path().join("lines.txt");
    std::fs::write(&file, "1\n2\n").unwrap();
    let cases: [(&[&str], &str); 7] = [
        (&["gen", "criteo", "--lines", "10", "--parts", "1000000"], "--parts is 1000000, more than the 65536 files"),
        // More parts than lines: some would be empty, leaving a trainer without data.
        (&["gen", "criteo", "--lines", "3", "--parts", "4"], "--parts 4 is more than the 3 train line(s)"),
        (&["gen", "slots", "--lines", "3", "--parts", "4"], "--parts 4 is more than the 3 train line(s)"),
        (
            &["gen", "stream", "--days", "1", "--lines-per-day", "3", "--parts", "4"],
            "--parts 4 is more than the 3 line(s) a day",
        ),
        (&["split", "--parts", "3", file.to_str().unwrap()], "2 line(s) cannot fill 3 parts"),
        (&["gen", "stream", "--days", "100000", "--lines-per-day", "1"], "--days is 100000, more than 36525"),
        (&["split", "--parts", "100000", file.to_str().unwrap()], "--parts is 100000, more than the 65536 files"),
    ];
    for (args, want) in cases {
        let mut all = args.to_vec();
        if args[0] == "gen" {
            all.extend(["--out", out.to_str().unwrap()]);
        }
        let o = oar(&all);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(want), "{args:?}: {}", text(&o));
        assert!(!out.exists(), "{args:?} wrote {}", out.display());
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "only the input file");
}

#[test]
fn a_trainer_whose_server_is_unreachable_fails_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 10, 10);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let out =
        oar(&["train", "--mode", "async", "--servers", &addr, "--timeout", "1", "--train", train.to_str().unwrap()]);
    // Stopped by a missing peer, not by its own fault: status 3, so a launcher names the
    // server's own failure first.
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("cannot reach server 0 at {addr}")), "{err}");
}

#[test]
fn the_launcher_stops_everyone_when_a_worker_fails_and_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 100, 10);
    std::fs::write(train.join("part-00001"), "0\t1\ngarbage line\n").unwrap();
    let logs = dir.path().join("logs");
    let out = oar(&[
        "launch",
        "--servers",
        "2",
        "--workers",
        "2",
        "--hidden",
        "8",
        "--no-progress",
        "--train",
        train.to_str().unwrap(),
        "--logs",
        logs.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("worker 1 failed"), "{err}");
    assert!(err.contains("part-00001:2: label must be 0 or 1"), "the last log line is quoted: {err}");
}

/// `oar ... | head -1`: a reader that closed its end before oar printed is not a panic; oar exits
/// with 141, as a process killed by SIGPIPE would.
#[test]
fn output_into_a_closed_pipe_exits_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = dir.path().join("gen");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["gen", "sequences", "--lines", "100", "--test-lines", "10", "--out", out.to_str().unwrap()])
        .stdout(writer)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(141), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn bench_models_refuses_a_model_the_zoo_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let o = oar(&["bench", "--models", "--data", data, "--model", "DCN", "--model", "NoSuchNet"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("NoSuchNet") && text(&o).contains("CTR-DNN"), "{}", text(&o));
}

/// `oar bench --models` against a baseline build (this binary again): each model's row gains
/// the baseline's 2x2 samples/s and the ratio, from rounds that alternate the two builds.
#[test]
fn bench_models_measures_a_baseline_build_beside_this_one() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data = data.to_str().unwrap();
    let gen = ["gen", "criteo", "--lines", "4000", "--test-lines", "1000", "--parts", "2", "--out", data];
    assert!(oar(&gen).status.success());
    let exe = env!("CARGO_BIN_EXE_oar");
    let o = oar(&["bench", "--models", "--model", "CTR-DNN", "--data", data, "--baseline-exe", exe, "--rounds", "2"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", text(&o));
    let header = out.lines().find(|l| l.starts_with("| model |")).unwrap_or_else(|| panic!("{out}"));
    assert!(header.ends_with(&format!("| {exe} 2x2 samples/s | ratio |")), "{header}");
    let row = out.lines().find(|l| l.starts_with("| CTR-DNN |")).unwrap_or_else(|| panic!("{out}"));
    let cells: Vec<f64> = row.split('|').map(str::trim).skip(2).filter_map(|c| c.parse().ok()).collect();
    // Local AUC, log-loss and samples/s; 2x2 AUC, log-loss and samples/s; the baseline's; the ratio.
    assert_eq!(cells.len(), 8, "{row}");
    // The ratio is the median of the rounds' ratios, not the ratio of the medians. For the same
    // binary it is a timing, so its value is not checked: three runs here gave 0.98 to 1.02,
    // and 1.32 while the median of two rounds was the upper one.
    assert!(cells.iter().all(|c| c.is_finite() && *c > 0.0), "{row}");
}

/// `oar bench` (b) against a baseline (this binary again, a server process of its own):
/// every op gets a ratio paired over the rounds asked for. Fewer rows than keys a batch: the
/// batches drawn are longer than the inserts.
#[test]
fn bench_measures_a_baseline_server_in_alternating_rounds() {
    let o = oar(&[
        "bench",
        "--skip-training",
        "--seconds",
        "0.2",
        "--dense-floats",
        "1024",
        "--sparse-rows",
        "400",
        "--sparse-keys",
        "500",
        "--rounds",
        "2",
        "--baseline-exe",
        env!("CARGO_BIN_EXE_oar"),
    ]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("medians of 2 alternating rounds"), "{out}");
    for op in ["ids as drawn", "unique ids"] {
        let lines: Vec<&str> = out.lines().filter(|l| l.contains(op) && l.contains("through the server")).collect();
        // Pull and push of unique ids, or the pull as drawn, for each of the two servers.
        assert!(lines.len() >= 2, "{out}");
        assert!(lines.iter().any(|l| l.contains("(this build: ") && l.contains("x, rounds ")), "{out}");
        assert!(lines.iter().any(|l| l.contains(" of the table in memory (rounds ")), "{out}");
        // The server's own count of its handling, as a share of the wall time.
        for line in lines {
            let key = "the server's handler ";
            let at = line.find(key).unwrap_or_else(|| panic!("{line}")) + key.len();
            let share: f64 = line[at..].split('%').next().unwrap().parse().unwrap();
            assert!(share > 0.0 && share <= 101.0, "{line}");
        }
    }
}

/// `oar bench --quality` and `--many-trainers` on a small generated set, as processes: each
/// prints its table of paired differences from real runs, and `--many-trainers` says each
/// run's result as it ends (the table comes after the last).
#[test]
fn bench_quality_and_many_trainers_print_tables_of_real_runs() {
    let o = oar(&["bench", "--quality", "--sizes", "3000", "--seeds", "1"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", text(&o));
    let row =
        out.lines().find(|l| l.starts_with("| generated, 3000 lines, 1 seeds |")).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(row.matches('|').count(), 11, "ten columns: {row}");
    let local: f64 = row.split('|').nth(2).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!((0.4..1.0).contains(&local), "a trained model's AUC: {row}");

    let o = oar(&["bench", "--quality", "--many-trainers", "2", "--sizes", "3000", "--seeds", "1"]);
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        out.lines().any(|l| l.starts_with("| generated, 3000 lines, 1 seeds |") && l.contains("| 2 x 1 |")),
        "{out}"
    );
    let log = String::from_utf8_lossy(&o.stderr);
    for run in
        ["local, 1 thread: test AUC", "2 trainers x 1 servers, dense async: test AUC", "dense synchronous: test AUC"]
    {
        assert!(log.contains(run), "each run says its result as it ends: {log}");
    }
}

#[test]
fn usage_errors_exit_with_code_2() {
    let out = oar(&["train", "--batch-size", "many"]);
    assert_eq!(out.status.code(), Some(2));
    let out = oar(&["train"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("give --train"), "{}", text(&out));
    // fleetrun's --servers is a list of endpoints: said so, with where such a list goes.
    let out = oar(&["launch", "--servers", "127.0.0.1:6170,127.0.0.1:6171", "--train", "x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("is a list of server endpoints (fleetrun's --servers)"), "{}", text(&out));
    assert!(text(&out).contains("oar train --servers 127.0.0.1:6170,127.0.0.1:6171"), "{}", text(&out));
}

/// `oar --version` names the release and the commit the binary was built from.
#[test]
fn the_version_names_the_commit() {
    let out = oar(&["--version"]);
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let want = format!("oar {} (commit {})", env!("CARGO_PKG_VERSION"), commit.as_deref().unwrap_or("unknown"));
    assert_eq!(said, want);
}

#[test]
fn an_interrupted_launch_stops_every_child() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 200_000, 10);
    let logs = dir.path().join("logs");
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["launch", "--servers", "2", "--workers", "2", "--no-progress", "--log-every", "1"])
        .args(["--train", train.to_str().unwrap(), "--logs", logs.to_str().unwrap()])
        .env_remove("OAR_LAUNCHED")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until both workers are training: their logs show a progress line.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let training =
        |w: usize| std::fs::read_to_string(logs.join(format!("worker.{w}.log"))).is_ok_and(|l| l.contains("progress"));
    while !(training(0) && training(1)) {
        assert!(std::time::Instant::now() < deadline, "workers did not start training");
        assert!(launcher.try_wait().unwrap().is_none(), "the launch ended before it was interrupted");
        std::thread::yield_now();
    }
    // Every child carries the launch's job id, `oar-<launcher pid>-...`, in its arguments.
    let needle = format!("oar-{}-", launcher.id());
    assert_eq!(processes_mentioning(&needle).len(), 4, "2 servers and 2 workers run");
    // SAFETY: sending a signal to our own child process.
    assert_eq!(unsafe { libc::kill(launcher.id() as i32, libc::SIGINT) }, 0);
    let out = launcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("interrupted"), "{err}");
    assert_eq!(processes_mentioning(&needle), Vec::<u32>::new(), "children left running");
}

/// A trainer and a server started in one folder with relative paths (`--output out`): the
/// pass the trainer saves lands in `out/pass-0001` beside its manifest, and loads back.
#[test]
fn relative_output_folders_save_where_they_say() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 1, 1000, 0);
    let port = free_ports(1).to_string();
    let oar_in = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_oar"));
        cmd.args(args).current_dir(dir.path()).env_remove("OAR_LAUNCHED");
        cmd.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        cmd
    };
    let server = oar_in(&["pserver", "--host", "127.0.0.1", "--port", &port, "--index", "0", "--num-servers", "1"])
        .args(["--trainers", "1", "--mode", "sync", "--job", "rel", "--save-root", "out"])
        .spawn()
        .unwrap();
    let trainer = oar_in(&["train", "--servers", &format!("127.0.0.1:{port}"), "--train", "data/train"])
        .args(["--output", "out", "--job", "rel", "--mode", "sync", "--hidden", "8"])
        .output()
        .unwrap();
    let server = server.wait_with_output().unwrap();
    assert!(trainer.status.success() && server.status.success(), "{}\n{}", text(&trainer), text(&server));
    assert!(dir.path().join("out/pass-0001/server-0.shard").is_file(), "the shard beside its manifest");
    assert!(!dir.path().join("out/out").exists());
    load_params(&dir.path().join("out"));
}

/// `--clip-grad-norm` bounds every step: with plain SGD and no weight decay the model ends at
/// most steps x learning rate x the bound from where it started, while unclipped it moves much
/// further; the trainer says how many steps it clipped.
#[test]
fn clip_grad_norm_bounds_how_far_each_step_moves_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 2048, 0);
    let train = train.display().to_string();
    let run = |name: &str, clip: Option<&str>| {
        let out = dir.path().join(name).display().to_string();
        let mut args = vec!["train", "--train", &train, "--output", &out, "--hidden", "8", "--batch-size", "64"];
        args.extend(["--dense-optimizer", "sgd", "--sparse-optimizer", "sgd", "--dense-lr", "0.5", "--sparse-lr"]);
        args.extend(["0.5", "--dense-l2", "0", "--sparse-l2", "0", "--seed", "7"]);
        if let Some(c) = clip {
            args.extend(["--clip-grad-norm", c]);
        }
        let out = oar(&args);
        assert!(out.status.success(), "{}", text(&out));
        (load_params(&dir.path().join(name)), text(&out))
    };
    let distance = |a: &Params, b: &Params| {
        assert_eq!(a.rows.len(), b.rows.len(), "the same rows");
        let dense = a.dense.iter().zip(&b.dense).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>();
        let rows = a.rows.iter().zip(&b.rows).flat_map(|(r, s)| r.2.iter().zip(&s.2));
        (dense + rows.map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>()).sqrt()
    };
    // A bound so small nothing moves: the initial model.
    let (start, _) = run("start", Some("1e-30"));
    let (clipped, log) = run("clipped", Some("0.001"));
    let (free, _) = run("free", None);
    let bound = 32.0 * 0.5 * 0.001; // 2048 / 64 steps x lr x the clip
    let (moved, unclipped) = (distance(&start, &clipped), distance(&start, &free));
    assert!(moved > 0.0 && moved <= bound * 1.001, "clipped steps moved the model {moved}, bound {bound}");
    assert!(unclipped > 10.0 * bound, "unclipped training moves further: {unclipped}");
    assert!(log.contains("steps=32") && log.contains("clipped to norm 0.001"), "{log}");
    let bad = oar(&["train", "--train", &train, "--clip-grad-norm", "0"]);
    assert!(!bad.status.success() && text(&bad).contains("clip_grad_norm must be a positive number"), "{}", text(&bad));
}

/// Numbers no job means (a count of 2^64 - 1 trainers, a period of 1e300 seconds) are one
/// error line and exit status 1 from every command, never a panic (status 101: a wrapped
/// duration, an allocation per trainer) or a launch of thousands of processes.
#[test]
fn absurd_counts_and_periods_are_one_error_line_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 20, 0);
    let (train, out) = (train.to_str().unwrap(), dir.path().join("out"));
    let (out, logs) = (out.to_str().unwrap(), dir.path().join("logs"));
    let logs = logs.to_str().unwrap();
    let max = "18446744073709551615";
    let cases: [(&[&str], &str); 11] = [
        (&["pserver", "--trainers", max, "--port", "0"], "--trainers is 18446744073709551615, more than 65536"),
        (&["pserver", "--trainers", "1", "--port", "0", "--timeout", max], "--timeout must be a number of seconds"),
        (&["pserver", "--trainers", "1", "--port", "0", "--trainer-rejoin", "1e300"], "not 1e300"),
        (
            &["pserver", "--trainers", "1", "--port", "0", "--checkpoint-dir", out, "--checkpoint-every", "1e300"],
            "--checkpoint-every must be a number of seconds in 0..=2592000",
        ),
        (&["train", "--train", train, "--timeout", max], "timeout is 18446744073709551615 s, more than 30 days"),
        (
            &["train", "--train", train, "--trainers", max, "--mode", "async", "--servers", "127.0.0.1:9"],
            "--trainers is",
        ),
        (&["launch", "--train", train, "--logs", logs, "--servers", "100000"], "more than the 1024 processes"),
        (&["launch", "--train", train, "--logs", logs, "--output", out, "--checkpoint-every", "1e300"], "not 1e300"),
        (&["bench", "--seconds", "1e300"], "--seconds must be a number of seconds"),
        (&["bench", "--roofline", "--batch", max], "--roofline takes --batch 1 to 262144"),
        (
            &["launch", "--train", train, "--logs", logs, "--mode", "sync", "--sync-dense", "true"],
            "sync_dense is an async-mode setting; this job's mode is sync",
        ),
    ];
    for (args, want) in cases {
        let o = oar(args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", text(&o));
        assert!(
            err.lines().last().is_some_and(|l| l.starts_with("oar: error: ") && l.contains(want)),
            "{args:?}: {err}"
        );
    }
    assert!(!Path::new(out).exists() && !Path::new(logs).exists(), "nothing was started");

    // A server role started by PaddlePaddle's variables (and `vars`) that must fail: its error.
    let server_role = |command: &str, vars: &[(&str, &str)]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
            .arg(command)
            .env_remove("OAR_LAUNCHED")
            .envs([
                ("TRAINING_ROLE", "PSERVER"),
                ("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:9"),
                ("POD_IP", "127.0.0.1"),
                ("PADDLE_PORT", "9"),
            ])
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(1), "{err}");
        err
    };
    // The same bound from PaddlePaddle's variables names the variable, not a flag never given.
    let err = server_role("pserver", &[("PADDLE_TRAINERS_NUM", max)]);
    assert!(err.contains("PADDLE_TRAINERS_NUM: 18446744073709551615 trainers, more than 65536"), "{err}");
    // A server role of `oar train` takes the job's recovery window as its own: a bad one is
    // named as given, not as `oar pserver`'s --trainer-rejoin.
    let err = server_role("train", &[("PADDLE_TRAINERS_NUM", "2"), ("OAR_RECOVER_TIMEOUT", "-1")]);
    assert!(err.contains("--recover-timeout must be a number of seconds in 0..="), "{err}");

    // Job-file numbers that are no number, or infinite: an infinite l2 or initializer scale
    // used to pass (`>= 0`) and train to NaN; each is now named, as a negative std is.
    let job = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ctr_dnn.toml")).unwrap();
    let edits = [
        ("lr = 1e-3\n", "lr = 1e-3\nl2 = inf\n", "dense optimizer (Adam): l2 is inf; it must be a finite number"),
        ("lr = 0.05\n", "lr = nan\n", "sparse table embedding optimizer (Adagrad): lr is NaN"),
        ("embedding_dim = 10\n", "embedding_dim = 10\nembedding_init = 1e300\n", "uniform initializer's scale is inf"),
        ("lr = 1e-3\n", "lr = 1e-3\nbeta1 = 2.0\n", "beta1 is 2; it must be a finite number in [0, 1)"),
    ];
    let file = dir.path().join("job.toml");
    let autoint =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/zoo/autoint.toml")).unwrap();
    let normal = "std = 1e-4 }";
    let edits = edits.into_iter().map(|(from, to, want)| (&job, from, to, want)).chain([
        (&autoint, normal, "std = -1e-4 }", "a normal initializer's std is -1e-4"),
        // Finite, but draws 6.8 standard deviations out would be infinite.
        (&autoint, normal, "std = 1e38 }", "a normal initializer's std is 1e38"),
    ]);
    for (job, from, to, want) in edits {
        assert!(job.contains(from));
        std::fs::write(&file, job.replacen(from, to, 1)).unwrap();
        let o = oar(&["train", "--config", file.to_str().unwrap(), "--train", train]);
        assert_eq!(o.status.code(), Some(1), "{to}: {}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(want), "{to}: {}", text(&o));
    }
}

/// The book's reference of every command and flag is what `oar reference` generates from the
/// command line's definitions, so a renamed or new flag fails here until the page follows
/// (`oar reference > docs/src/reference/cli.md`); man pages and completion scripts come from
/// the same definitions.
#[test]
fn the_reference_man_pages_and_completions_come_from_the_command_line_itself() {
    let out = oar(&["reference"]);
    assert!(out.status.success(), "{}", text(&out));
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/src/reference/cli.md");
    let committed = std::fs::read_to_string(&page).unwrap();
    assert!(
        committed == String::from_utf8_lossy(&out.stdout),
        "{} is not what `oar reference` prints: regenerate it with `oar reference > docs/src/reference/cli.md`",
        page.display()
    );
    assert!(committed.contains("## `oar launch`") && committed.contains("`--metrics-port-base <METRICS_PORT_BASE>`"));

    let dir = tempfile::tempdir().unwrap();
    let out = oar(&["man", "--out", dir.path().to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    for name in ["oar.1", "oar-launch.1", "oar-cluster-ssh.1", "oar-gen-criteo.1"] {
        let man = std::fs::read_to_string(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(man.contains(".TH"), "{name}");
    }
    // A link planted at a page's name is not written through, and a named pipe there is
    // refused at once (the write waited for a reader forever).
    let (elsewhere, link, pipe) = (dir.path().join("keep"), dir.path().join("oar.1"), dir.path().join("oar-train.1"));
    std::fs::write(&elsewhere, "kept").unwrap();
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &link).unwrap();
    let out = oar(&["man", "--out", dir.path().to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("a symbolic link"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&elsewhere).unwrap(), "kept");
    std::fs::remove_file(&link).unwrap();
    std::fs::remove_file(&pipe).unwrap();
    let c = std::ffi::CString::new(pipe.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let out = oar(&["man", "--out", dir.path().to_str().unwrap()]);
    assert!(!out.status.success() && text(&out).contains("a named pipe"), "{}", text(&out));
    for (shell, mark) in [("bash", "_oar()"), ("zsh", "#compdef oar"), ("fish", "complete -c oar")] {
        let out = oar(&["completions", shell]);
        assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains(mark), "{shell}");
    }
}

/// `precision` (`[train] precision`, `--precision`, `OAR_PRECISION`): bf16 trains with bf16
/// products where the CPU has them and in f32 with a warning that says why elsewhere, to the
/// same model either way (as `oar train` and as the job file say); an unknown name is one
/// error line, from the flag and from the file.
#[test]
fn precision_bf16_trains_from_the_flag_or_the_file_and_an_unknown_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 300, 0);
    let train = train.to_str().unwrap();
    let file = dir.path().join("job.toml");
    let run = |args: &[&str], out: &str| {
        let out = dir.path().join(out);
        let o = oar(
            &[&["train", "--train", train, "--batch-size", "64", "--output", out.to_str().unwrap()], args].concat()
        );
        assert!(o.status.success(), "{}", text(&o));
        let warned = String::from_utf8_lossy(&o.stderr).contains("needs a CPU with avx512_bf16");
        assert_eq!(warned, !oar::nn::bf16_available(), "{}", text(&o));
        let model = load_params(&out);
        (model.dense, model.rows)
    };
    std::fs::write(&file, "[train]\nprecision = \"bf16\"\n").unwrap();
    let from_file = run(&["--config", file.to_str().unwrap()], "file");
    let from_flag = run(&["--precision", "bf16"], "flag");
    assert_eq!(from_file, from_flag, "the file's bf16 and the flag's train the same model");
    let bad = oar(&["train", "--train", train, "--precision", "fp8"]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).contains("unknown precision \"fp8\" (f32, bf16)"), "{}", text(&bad));
    std::fs::write(&file, "[train]\nprecision = \"fp8\"\n").unwrap();
    let bad = oar(&["train", "--train", train, "--config", file.to_str().unwrap()]);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("job.toml:2:") && err.contains("unknown variant `fp8`") && err.lines().count() == 1, "{err}");
}
