//! Data and layouts a model cannot take end in one clear error naming where they stand (or,
//! for lines, are skipped and counted with `--skip-bad-lines`), never in a job that stops
//! midway or one that reports success on part of its data.

use crate::util::*;

/// A click of 3e38 and a dense value of 3e38 in the slots format are named by file and line,
/// not met later as a refused push ("a diverging model": the dense value overflowed the first
/// layer), and `--skip-bad-lines` skips them.
#[test]
fn a_label_its_loss_cannot_take_is_a_bad_line() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("slots");
    let out =
        oar(&["gen", "slots", "--lines", "400", "--test-lines", "10", "--parts", "1", "--out", data.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let file = data.join("train/part-00000");
    let content = std::fs::read_to_string(&file).unwrap();
    let mut lines: Vec<String> = content.lines().map(String::from).collect();
    let (_, features) = lines[4].split_once(' ').unwrap();
    let features = features.to_string();
    lines[4] = format!("click:3e38 {features}");
    let (click, rest) = lines[9].split_once(' ').unwrap();
    let (_, rest) = rest.split_once(' ').unwrap();
    lines[9] = format!("{click} d:-3e38 {rest}");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let job = std::path::absolute("examples/multi_hot.toml").unwrap();
    let train_dir = data.join("train");
    let train = |extra: &[&str]| {
        let args = ["train", "--config", job.to_str().unwrap(), "--train", train_dir.to_str().unwrap()];
        oar(&[&args[..], extra].concat())
    };
    let out = train(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:5: label \"click\": \"3e38\" is not a number within ±1e18", file.display())),
        "{err}"
    );
    lines[4] = format!("click:2 {features}");
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = train(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:5: label \"click\" is 2.0: a log-loss label is 0 to 1", file.display())),
        "{err}"
    );
    lines[4] = lines[5].clone();
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();
    let out = train(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:10: dense \"d\": \"-3e38\" is not a number within ±1e18", file.display())),
        "{err}"
    );
    let out = train(&["--skip-bad-lines"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("trained 798 samples"), "399 lines a pass, two passes: {}", text(&out));
}

/// Scaling asked of data without dense values is refused when the job file is read: the
/// reader thread panicked, the job took it for the end of the data, and reported "trained 0
/// samples" with status 0.
#[test]
fn scaling_without_dense_values_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        "[model]\nslots = 1\ndense_features = 0\nhidden = [4]\n[data]\nformat = \"plain\"\nslots = [\"s\"]\n\
         dense_transform = \"standardize\"\ndense_stats = { count = 0, mean = [], std = [], min = [], max = [] }\n",
    )
    .unwrap();
    let data = dir.path().join("data.txt");
    std::fs::write(&data, "1\t3\n0\t4\n").unwrap();
    let out = oar(&["train", "--config", job.to_str().unwrap(), "--train", data.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("[data] dense_transform: the data has no dense values to scale"), "{}", text(&out));
    // Statistics no data gives: a negative std, a min above its max (scaled by 1 and saved
    // with the model, exit 0).
    let data = dir.path().join("dense.txt");
    std::fs::write(&data, "1 0.5 -\n0 1.5 -\n").unwrap();
    for (stats, transform, want) in [
        (
            "count = 2, mean = [1.0], std = [-1.0], min = [0.5], max = [1.5]",
            "standardize",
            "std of dense value 1 is -1",
        ),
        ("count = 2, mean = [1.0], std = [0.5], min = [5.0], max = [-5.0]", "minmax", "min 5 is above its max -5"),
    ] {
        let text_job = format!(
            "[model]\nslots = 1\ndense_features = 1\nhidden = [4]\n[data]\nformat = \"plain\"\nslots = [\"s\"]\n\
             dense = [{{ name = \"x\", width = 1 }}]\ndense_transform = \"{transform}\"\ndense_stats = {{ {stats} }}\n"
        );
        std::fs::write(&job, text_job).unwrap();
        let out = oar(&["train", "--config", job.to_str().unwrap(), "--train", data.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(1), "{}", text(&out));
        assert!(text(&out).contains(want), "{}", text(&out));
    }
}

/// `oar eval` and `oar predict` check their batch size against the machine as training does:
/// a billion aborted allocating 2.4 GB; 0 is refused too.
#[test]
fn eval_and_predict_refuse_a_batch_the_machine_cannot_hold() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(dir.path(), 1, 50, 10);
    let model = dir.path().join("model");
    let (model_arg, test_arg) = (model.to_str().unwrap(), test.to_str().unwrap());
    let out = oar(&["train", "--train", train.to_str().unwrap(), "--hidden", "4", "--output", model_arg]);
    assert!(out.status.success(), "{}", text(&out));
    let scores = dir.path().join("scores.txt");
    for batch in ["1000000000", "0"] {
        let runs = [
            oar(&["eval", "--model", model_arg, "--data", test_arg, "--batch-size", batch]),
            oar(&[
                "predict",
                "--model",
                model_arg,
                "--data",
                test_arg,
                "--out",
                scores.to_str().unwrap(),
                "--batch-size",
                batch,
            ]),
        ];
        for out in runs {
            assert_eq!(out.status.code(), Some(1), "{}", text(&out));
            let err = String::from_utf8_lossy(&out.stderr);
            let want = if batch == "0" { "--batch-size must be at least 1" } else { "lower batch_size" };
            assert!(err.contains(want), "{err}");
        }
    }
    assert!(!scores.exists(), "no scores file from a refused run");
}

/// An output folder whose path holds a tab or a line break is refused before training when
/// saves for serving are asked: the done-file lists them a line each, split by tabs (it broke
/// at the second save, and a line break could add lines a serving system follows).
#[test]
fn an_output_path_the_done_file_cannot_hold_is_refused_before_training() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 50, 10);
    let out_dir = dir.path().join("o\tx");
    let args = ["train", "--train", train.to_str().unwrap(), "--hidden", "4", "--passes", "2", "--delta-every", "1"];
    let out = oar(&[&args[..], &["--output", out_dir.to_str().unwrap()]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("holds a tab or a line break"), "{}", text(&out));
    assert!(!out_dir.exists(), "refused before anything was written");
}

/// `--output` the training data's own folder is refused before training: the job's curves,
/// pictures and `latest` landed beside the data, and the next run read `curves.png` as a bad
/// line. A folder below `--output` is fine.
#[test]
fn an_output_folder_that_is_the_datas_own_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 200, 10);
    let o = oar(&["train", "--train", train.to_str().unwrap(), "--hidden", "4", "--output", train.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("is the folder of the data file"), "{}", text(&o));
    assert_eq!(std::fs::read_dir(&train).unwrap().count(), 1, "nothing was written beside the data");
    let o =
        oar(&["train", "--train", train.to_str().unwrap(), "--hidden", "4", "--output", dir.path().to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
}

/// A pass or an evaluation over no sample is an error naming the files: an empty file trained
/// "0 samples", saved a model and exited 0, and `oar eval` printed a log-loss of NaN; with
/// every line bad and skipped, the skipped lines are counted in the error, and when some are
/// good, in the report.
#[test]
fn a_pass_or_an_evaluation_over_no_sample_is_an_error_naming_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let s = |p: &std::path::Path| p.display().to_string();
    let (train, test) = gen_data(&dir.path().join("data"), 1, 200, 50);
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "").unwrap();
    let model = dir.path().join("model");
    let o = oar(&["train", "--train", &s(&empty), "--hidden", "4", "--output", &s(&model)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains(&format!("read no sample from its 1 file(s): {}", s(&empty))), "{}", text(&o));
    assert!(!model.join("pass-0001").exists(), "no model saved");
    let garbage = dir.path().join("garbage.txt");
    std::fs::write(&garbage, "not a line\nnor this\n").unwrap();
    let o = oar(&["train", "--train", &s(&garbage), "--hidden", "4", "--skip-bad-lines"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("(2 bad line(s) skipped): nothing to train on"), "{}", text(&o));
    let mixed = dir.path().join("mixed.txt");
    let good = std::fs::read_to_string(train.join("part-00000")).unwrap();
    std::fs::write(&mixed, format!("{good}not a line\n")).unwrap();
    let o = oar(&["train", "--train", &s(&mixed), "--hidden", "4", "--skip-bad-lines", "--output", &s(&model)]);
    assert!(o.status.success() && text(&o).contains("1 bad line(s) skipped"), "{}", text(&o));
    let o = oar(&["eval", "--model", &s(&model), "--data", &s(&empty)]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains(&format!("no sample to evaluate in 1 file(s): {}", s(&empty))), "{}", text(&o));
    let o = oar(&["eval", "--model", &s(&model), "--data", &s(&test)]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn a_malformed_line_is_named_by_file_and_line_or_skipped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 50, 10);
    let file = train.join("part-00000");
    let mut text_lines: Vec<String> = std::fs::read_to_string(&file).unwrap().lines().map(String::from).collect();
    text_lines[2] = "1\tnot-a-number".into();
    std::fs::write(&file, text_lines.join("\n") + "\n").unwrap();

    let out = oar(&["train", "--train", train.to_str().unwrap(), "--hidden", "8"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:3: I1 is not an integer", file.display())), "{err}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "one clear line:\n{err}");

    let out = oar(&["train", "--train", train.to_str().unwrap(), "--hidden", "8", "--skip-bad-lines"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("trained 49 samples"), "{}", text(&out));
    // A launch says so too, on the console and not only in summary.json.
    let logs = dir.path().join("logs").display().to_string();
    let launch = ["launch", "--servers", "1", "--workers", "1", "--hidden", "8", "--no-progress", "--logs", &logs];
    let out = oar(&[&launch[..], &["--train", train.to_str().unwrap(), "--skip-bad-lines"]].concat());
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("1 bad line(s) skipped (--skip-bad-lines), per trainer: 1"), "{said}");
}

/// A named pipe or a device given as data is named at once: opening a pipe without a writer
/// blocks, and /dev/zero has no end (`oar train` said "Not a directory"; `oar split` waited, or
/// counted zeros, forever).
#[test]
fn a_named_pipe_or_a_device_as_data_is_named_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("stream");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string naming a new path in a fresh folder.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo = fifo.to_str().unwrap();
    // The same for a job file (it was read whole: /dev/zero until memory ran out), a hosts
    // file, and a saved model's `latest` planted as a pipe or its manifest as a link.
    let (train, _) = gen_data(dir.path(), 1, 20, 0);
    let train = train.to_str().unwrap();
    let saved = dir.path().join("saved");
    std::fs::create_dir(&saved).unwrap();
    let latest = std::ffi::CString::new(saved.join("latest").to_str().unwrap()).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(latest.as_ptr(), 0o600) }, 0);
    let pass = dir.path().join("pass");
    std::fs::create_dir(&pass).unwrap();
    std::os::unix::fs::symlink("/dev/zero", pass.join("manifest.json")).unwrap();
    let ws = dir.path().join("ws");
    let ws = ws.to_str().unwrap();
    let cases: [(&[&str], &str); 9] = [
        (&["train", "--train", fifo, "--threads", "1"], "stream: a named pipe, not a regular file or a folder"),
        (&["train", "--train", "/dev/zero", "--threads", "1"], "/dev/zero: a character device, not a regular file"),
        (&["split", fifo, "--parts", "2"], "stream: a named pipe, not a regular file: data is read from files"),
        (&["split", "/dev/zero", "--parts", "2"], "/dev/zero: a character device, not a regular file"),
        (&["train", "--config", fifo, "--train", train], "stream: not a regular file (a named pipe)"),
        (&["train", "--config", "/dev/zero", "--train", train], "/dev/zero: not a regular file (a device)"),
        (
            &["cluster", "ssh", "--hosts", fifo, "--workspace", ws, "--", "--train", train],
            "stream: not a regular file (a named pipe)",
        ),
        (&["eval", "--model", saved.to_str().unwrap(), "--data", train], "latest: not a regular file (a named pipe)"),
        (
            &["eval", "--model", pass.to_str().unwrap(), "--data", train],
            "manifest.json: not a regular file (a symbolic link)",
        ),
    ];
    for (args, want) in cases {
        let out = oar(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.lines().last().is_some_and(|l| l.starts_with("oar: error: ") && l.contains(want)),
            "{args:?}: {err}"
        );
    }
}

/// A line longer than the readers keep (64 MiB: a file without line breaks) is named by file
/// and line without being held, or skipped and counted; `oar split` moves it whole.
#[test]
fn a_line_too_long_to_keep_is_named_or_skipped_and_split_moves_it_whole() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 50, 10);
    let file = train.join("part-00000");
    let content = std::fs::read_to_string(&file).unwrap();
    let (first, rest) = content.split_once('\n').unwrap();
    let mut f = std::io::BufWriter::new(std::fs::File::create(&file).unwrap());
    writeln!(f, "{first}").unwrap();
    f.write_all(&vec![b'9'; (oar::data::read::reader::MAX_LINE_BYTES + 1) as usize]).unwrap();
    write!(f, "\n{rest}").unwrap();
    drop(f);

    let out = oar(&["train", "--train", train.to_str().unwrap(), "--hidden", "8"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:2: the line is longer than 64 MiB", file.display())), "{err}");
    let out = oar(&["train", "--train", train.to_str().unwrap(), "--hidden", "8", "--skip-bad-lines"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("trained 50 samples"), "{}", text(&out));

    let out = oar(&["split", "--parts", "2", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let sizes: Vec<u64> =
        (0..2).map(|k| std::fs::metadata(format!("{}-{k:05}", file.display())).unwrap().len()).collect();
    assert_eq!(sizes.iter().sum::<u64>(), std::fs::metadata(&file).unwrap().len());
    assert!(sizes[0] > oar::data::read::reader::MAX_LINE_BYTES, "the long line is in the first part: {sizes:?}");
}

/// A `pipe_command` that goes silent is killed, with everything it started, and named after
/// `--pipe-timeout` seconds, by `oar train` and by an async `oar launch` (whose other trainer
/// would otherwise wait on nobody); a command that is slow but keeps printing is not.
#[test]
fn a_silent_pipe_command_is_killed_and_named_after_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 20, 0);
    let train = train.display().to_string();
    // Prints its first line, then nothing: the pipeline's `sleep` must die too.
    let silent = "head -n 1; sleep 6017 | cat";
    let out = oar(&["train", "--train", &train, "--threads", "1", "--pipe-command", silent, "--pipe-timeout", "1"]);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(
        all.contains("part-00000: pipe_command `head -n 1; sleep 6017 | cat` printed nothing for 1 s and was killed"),
        "{all}"
    );
    wait_until(10, "the silent command's processes to end", || processes_mentioning("sleep 6017").is_empty());

    let logs = dir.path().join("logs");
    let out = oar(&[
        "launch",
        "--mode",
        "async",
        "--train",
        &train,
        "--pipe-command",
        "head -n 1; sleep 6018 | cat",
        "--pipe-timeout",
        "1",
        "--no-progress",
        "--logs",
        &logs.display().to_string(),
    ]);
    let all = text(&out);
    assert!(!out.status.success(), "{all}");
    assert!(all.contains("printed nothing for 1 s"), "{all}");
    // The cause first: the trainer's own error (status 1), then the servers' reports of losing
    // it (status 3), whatever order the processes ended in.
    assert!(all.contains("oar: error: worker "), "{all}");
    assert!(all.contains("(exit status: 3); last log line: oar: error: trainer "), "{all}");
    wait_until(10, "the silent commands' processes to end", || processes_mentioning("sleep 6018").is_empty());

    // Slow but never silent for a second: a line each 0.2 s, read to the end.
    let slow = "while read -r l; do printf '%s\\n' \"$l\"; sleep 0.2; done";
    let out = oar(&["train", "--train", &train, "--threads", "1", "--pipe-command", slow, "--pipe-timeout", "1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("40 samples") || text(&out).contains("samples 40"), "{}", text(&out));

    let out = oar(&["train", "--train", &train, "--pipe-command", "cat", "--pipe-timeout", "0"]);
    assert!(text(&out).contains("pipe_timeout is 0 s: it must be in 1..=86400"), "{}", text(&out));
}
