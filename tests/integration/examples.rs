//! The seed examples, shortened, through the real `oar` binary: UCI housing linear regression
//! (local vs sync on 2 servers x 2 trainers) and the PTB N-gram word model (local and async
//! 2 x 2). They need the real data sets in `../shared/data`: without it they say so and skip.

use std::path::{Path, PathBuf};

use crate::util::{number_after, oar, shared_data};

fn ok(args: &[&str]) -> String {
    let out = oar(args);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "oar {}:\n{text}", args.join(" "));
    text
}

fn example(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name).display().to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn launch(config: &str, mode: &str, train: &str, test: &Path, logs: &Path, extra: &[&str]) -> String {
    let mut args = vec!["launch", "--config", config, "--servers", "2", "--workers", "2", "--mode", mode];
    args.extend(["--train", train, "--test", s(test), "--logs", s(logs), "--no-progress"]);
    args.extend(extra);
    ok(&args)
}

#[test]
fn uci_housing_linear_regression_local_and_sync_agree() {
    let Some(shared) = shared_data() else {
        eprintln!("skipped: ../shared/data (UCI housing) is absent");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("uci");
    let src = shared.join("uci_housing/housing.data");
    let prep = ok(&["data", "prepare", "uci-housing", "--src", s(&src), "--out", s(&data)]);
    let least_squares = number_after(&prep, "least squares test MSE ");
    let mean = number_after(&prep, "train-mean predictor test MSE ");
    assert!((least_squares - 32.8).abs() < 0.05 && (mean - 93.3).abs() < 0.05, "{prep}");
    let (train, test) = (data.join("train.txt"), data.join("test.txt"));
    let config = example("uci_housing.toml");

    let local =
        number_after(&ok(&["train", "--config", &config, "--train", s(&train), "--test", s(&test)]), "test MSE ");
    // Two trainers of 10 samples per step make the local run's 20 per step.
    ok(&["split", "--parts", "2", s(&train)]);
    let parts = format!("{}-*", train.display());
    let sync = launch(&config, "sync", &parts, &test, &dir.path().join("logs"), &["--batch-size", "10"]);
    let sync = number_after(&sync, "test MSE ");
    assert!(local < 45.0 && sync < 45.0, "both far below the train-mean predictor's {mean}: {local} {sync}");
    assert!((local - sync).abs() < 0.1 * local, "local {local} and sync {sync} agree");
}

#[test]
fn ptb_ngram_word_model_learns_locally_and_on_two_servers() {
    let Some(shared) = shared_data() else {
        eprintln!("skipped: ../shared/data (Penn Treebank) is absent");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("ptb");
    let prep = ok(&["data", "prepare", "imikolov", "--src", s(&shared.join("ptb")), "--out", s(&data)]);
    assert!(prep.contains("dictionary: 2073 words"), "{prep}");
    // Shortened: the first 60,000 of the 803,522 training 5-grams, half the test 5-grams.
    let head = |from: &Path, to: PathBuf, n: usize| {
        let text = std::fs::read_to_string(from).unwrap();
        let lines: Vec<&str> = text.lines().take(n).collect();
        std::fs::write(&to, lines.join("\n") + "\n").unwrap();
        to
    };
    let train = head(&data.join("train.txt"), dir.path().join("train.txt"), 60_000);
    let test = head(&data.join("test.txt"), dir.path().join("test.txt"), 30_000);
    let config = example("imikolov.toml");

    let local = ok(&["train", "--config", &config, "--train", s(&train), "--test", s(&test)]);
    let local = number_after(&local, "test perplexity ");
    ok(&["split", "--parts", "2", s(&train)]);
    let parts = format!("{}-*", train.display());
    let async_run = launch(&config, "async", &parts, &test, &dir.path().join("logs"), &[]);
    let distributed = number_after(&async_run, "test perplexity ");
    // A uniform guess over the dictionary scores 2073; the full example beats the add-one
    // bigram (133) in one pass (see docs/src/getting-started.md).
    assert!(local < 300.0 && distributed < 300.0, "local {local}, 2x2 async {distributed}");
}

/// Every job file shipped under `examples/` reads and validates (model graph, tables, data
/// layout, optimizers), so none rots unnoticed; the custom-layer job needs its own program's
/// layer type and is checked by that example.
#[test]
fn every_example_job_file_reads_and_validates() {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, found);
            } else if path.extension().is_some_and(|e| e == "toml") {
                found.push(path);
            }
        }
    }
    let mut jobs = Vec::new();
    walk(&Path::new(env!("CARGO_MANIFEST_DIR")).join("examples"), &mut jobs);
    jobs.retain(|p| !p.ends_with("custom_layer.toml"));
    assert!(jobs.len() > 40, "{} job files", jobs.len());
    for job in jobs {
        let config = oar::train::job_config::JobConfig::from_file(&job).unwrap_or_else(|e| panic!("{e:#}"));
        config.validate().unwrap_or_else(|e| panic!("{}: {e:#}", job.display()));
    }
}
