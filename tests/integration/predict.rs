//! `oar predict`: a saved model's scores, one line per input line in input order, every head's
//! score, the very numbers `oar eval` computes its metrics from.

use std::path::Path;

use crate::util::*;

/// The scores in `file`, one column per head.
fn columns(file: &Path, heads: usize) -> Vec<Vec<f32>> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut cols = vec![Vec::new(); heads];
    for line in text.lines() {
        let fields: Vec<&str> = line.split('\t').collect();
        assert_eq!(fields.len(), heads, "one score per head: {line:?}");
        for (c, f) in cols.iter_mut().zip(fields) {
            c.push(f.parse().unwrap());
        }
    }
    cols
}

/// Trains `job` (None: the default CTR-DNN) locally on `data`, predicts its test set on 2
/// threads in batches of 100 (batches finish out of order), and checks every head's scores give
/// exactly the AUC that evaluating the saved model gives.
fn predict_matches_eval(dir: &Path, data: &Path, job: Option<&Path>, heads: usize) {
    let out = dir.join("model");
    let (train, test) = (data.join("train"), data.join("test"));
    let strings = [train.display().to_string(), out.display().to_string()];
    let mut args = vec!["train", "--train", &strings[0], "--output", &strings[1]];
    let config = job.map(|j| j.display().to_string());
    match &config {
        Some(c) => args.extend(["--config", c]),
        None => args.extend(["--hidden", "8"]),
    }
    let o = oar(&args);
    assert!(o.status.success(), "{}", text(&o));
    let scores = dir.join("scores.tsv");
    let (test_arg, scores_arg) = (test.display().to_string(), scores.display().to_string());
    let o = oar(&[
        "predict",
        "--model",
        &strings[1],
        "--data",
        &test_arg,
        "--out",
        &scores_arg,
        "--threads",
        "2",
        "--batch-size",
        "100",
        "--no-progress",
        "--trust-pipe-command",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let cols = columns(&scores, heads);

    let saved = oar::serve::predict::load(&out, &Default::default()).unwrap();
    let files = oar::data::resolve_files(&test).unwrap();
    assert!(text(&o).contains(&format!("{} lines of scores", cols[0].len())), "{}", text(&o));
    let mut store = oar::train::Store::local(saved.shard);
    let evals = oar::train::evaluate_heads(&mut store, &saved.model, &saved.schema, &files, 4096, false).unwrap();
    assert_eq!(evals.len(), heads);
    // The labels, read as the model reads them.
    let mut labels = vec![Vec::new(); heads];
    for batch in oar::data::Reader::spawn(files, oar::data::ReaderConfig::new(&saved.schema, 4096)) {
        let batch = batch.unwrap();
        for (h, l) in labels.iter_mut().enumerate() {
            l.extend_from_slice(&saved.model.labels(&batch, h));
        }
    }
    for h in 0..heads {
        assert_eq!(cols[h].len(), evals[h].samples, "one line per test line");
        assert_eq!(
            oar::observe::metrics::auc(&cols[h], &labels[h]),
            evals[h].auc,
            "head {h}: the scores oar eval uses"
        );
    }
}

#[test]
fn predict_writes_the_scores_oar_eval_uses_in_input_order() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 1, 3000, 1000);
    predict_matches_eval(dir.path(), &dir.path().join("data"), None, 1);
}

#[test]
fn predict_writes_every_heads_score_of_a_multi_task_model() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("slots");
    let o = oar(&[
        "gen",
        "slots",
        "--lines",
        "3000",
        "--test-lines",
        "1000",
        "--parts",
        "1",
        "--out",
        &data.display().to_string(),
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/multi_task.toml");
    predict_matches_eval(dir.path(), &data, Some(&job), 2);
}

#[test]
fn predict_names_a_bad_line_and_a_missing_model() {
    let dir = tempfile::tempdir().unwrap();
    let o = oar(&["predict", "--model", "/nonexistent/model", "--data", "/dev/null", "--out", "/dev/null"]);
    assert!(!o.status.success() && text(&o).contains("/nonexistent/model"), "{}", text(&o));
    gen_data(&dir.path().join("data"), 1, 500, 0);
    let (train, out) = (dir.path().join("data/train"), dir.path().join("model"));
    let o = oar(&[
        "train",
        "--train",
        &train.display().to_string(),
        "--output",
        &out.display().to_string(),
        "--hidden",
        "8",
    ]);
    assert!(o.status.success(), "{}", text(&o));
    let bad = dir.path().join("bad.txt");
    std::fs::write(&bad, "0\t1\nnot-a-label\t2\n").unwrap();
    let scores = dir.path().join("scores.tsv").display().to_string();
    let o = oar(&[
        "predict",
        "--model",
        &out.display().to_string(),
        "--data",
        &bad.display().to_string(),
        "--out",
        &scores,
    ]);
    assert!(!o.status.success() && text(&o).contains("bad.txt:2"), "{}", text(&o));
    assert!(!Path::new(&scores).exists(), "a failed run leaves no half file");
}

#[test]
fn standardized_dense_values_travel_with_the_model() {
    // `oar data stats` over the training files, a job that standardizes with them: the saved
    // model carries the numbers, so prediction and evaluation need no statistics file, and give
    // the same figures; a job naming a missing statistics file is refused naming it.
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 1, 3000, 1000);
    let s = |p: &Path| p.display().to_string();
    let stats = dir.path().join("stats.json");
    let o = oar(&["data", "stats", "--data", &s(&dir.path().join("data/train")), "--out", &s(&stats)]);
    assert!(o.status.success() && text(&o).contains("3000 samples, 13 dense values"), "{}", text(&o));
    let parsed: oar::data::DenseStats = serde_json::from_slice(&std::fs::read(&stats).unwrap()).unwrap();
    assert_eq!((parsed.count, parsed.mean.len()), (3000, 13));
    assert!(parsed.std.iter().all(|&v| v > 0.0), "{parsed:?}");
    let job = dir.path().join("job.toml");
    let zoo = std::fs::read_to_string(zoo_job("deepfm")).unwrap();
    assert!(zoo.contains("dense_transform = \"standardize\""), "the zoo's DeepFM standardizes");
    let with = zoo.replace("[data]", "[data]\ndense_stats = \"stats.json\"");
    std::fs::write(&job, with).unwrap();
    let data = dir.path().join("data");
    predict_matches_eval(dir.path(), &data, Some(&job), 1);
    let manifest = std::fs::read_to_string(dir.path().join("model/pass-0001/manifest.json")).unwrap();
    assert!(
        manifest.contains("\"dense_transform\": \"standardize\"") && manifest.contains("\"mean\""),
        "the numbers are saved"
    );
    std::fs::remove_file(&stats).unwrap();
    let o = oar(&["eval", "--model", &s(&dir.path().join("model")), "--data", &s(&data.join("test"))]);
    assert!(o.status.success() && text(&o).contains("1000 samples, AUC"), "{}", text(&o));
    let o = oar(&["train", "--config", &s(&job), "--train", &s(&data.join("train"))]);
    assert!(!o.status.success() && text(&o).contains("dense_stats") && text(&o).contains("stats.json"), "{}", text(&o));
}

/// `--out -` writes the scores to standard output; an output path that is a link to somewhere
/// outside its own folder (`/dev/stdout`, run as root, was replaced by a file) is never
/// replaced, and one to a file beside it is.
#[test]
fn predict_writes_to_standard_output_and_never_replaces_a_link_elsewhere_or_its_model() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(&dir.path().join("data"), 1, 300, 0);
    let (train, model) = (dir.path().join("data/train"), dir.path().join("model"));
    let s = |p: &Path| p.display().to_string();
    let o = oar(&["train", "--train", &s(&train), "--output", &s(&model), "--hidden", "8"]);
    assert!(o.status.success(), "{}", text(&o));
    let predict =
        |out: &str| oar(&["predict", "--model", &s(&model), "--data", &s(&train), "--out", out, "--no-progress"]);
    let o = predict("-");
    assert!(o.status.success(), "{}", text(&o));
    let lines = String::from_utf8(o.stdout).unwrap();
    assert_eq!(lines.lines().count(), 300, "one score a line on standard output");
    assert!(lines.lines().all(|l| l.parse::<f32>().is_ok_and(|p| (0.0..=1.0).contains(&p))), "{lines}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("300 lines of scores"));

    let (elsewhere, link) = (dir.path().join("elsewhere"), dir.path().join("out/scores.tsv"));
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::create_dir_all(link.parent().unwrap()).unwrap();
    std::fs::write(elsewhere.join("keep.tsv"), "kept").unwrap();
    std::os::unix::fs::symlink(elsewhere.join("keep.tsv"), &link).unwrap();
    for out in [s(&link), "/dev/stdout".to_string()] {
        let o = predict(&out);
        let err = text(&o);
        assert!(!o.status.success() && err.contains("outside its own folder") && err.contains("--out -"), "{err}");
    }
    assert!(std::fs::symlink_metadata("/dev/stdout").unwrap().file_type().is_symlink());
    assert_eq!(std::fs::read_to_string(elsewhere.join("keep.tsv")).unwrap(), "kept");
    // A link to a file beside it is replaced by the scores (the file it named stays).
    std::fs::write(dir.path().join("out/old.tsv"), "old").unwrap();
    std::fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink("old.tsv", &link).unwrap();
    assert!(predict(&s(&link)).status.success());
    assert!(std::fs::symlink_metadata(&link).unwrap().is_file());
    assert_eq!(std::fs::read_to_string(dir.path().join("out/old.tsv")).unwrap(), "old");
    // Scores never go inside the saved model they come from: they replaced its shard or its
    // manifest, and the next load failed.
    let pass =
        std::fs::read_dir(&model).unwrap().flatten().map(|e| e.path()).find(|p| p.join("manifest.json").exists());
    let pass = pass.expect("a saved pass");
    let before = std::fs::read(pass.join("manifest.json")).unwrap();
    for out in [pass.join("manifest.json"), pass.join("server-0.shard"), model.join("scores.tsv")] {
        let o = predict(&s(&out));
        let err = text(&o);
        assert!(!o.status.success() && err.contains("is inside the saved model"), "{}: {err}", out.display());
    }
    assert_eq!(std::fs::read(pass.join("manifest.json")).unwrap(), before);
    assert!(predict("-").status.success(), "the model still loads");
}
