//! `data_norm` and `batch_norm` keep their statistics on the servers (Paddle's summary rule):
//! counted at the source, every training sample adds to them exactly once, whatever the mode,
//! the number of trainers or threads.

use std::path::Path;

use crate::util::*;
use oar::protocol::Mode;

/// Embeddings and Paddle's data_norm on the 13 dense values, a hidden layer with batch norm;
/// both keep their statistics undecayed (`decay = 1`), so they are plain sums.
const JOB: &str = r#"
[model]
output = "out"
loss = "log_loss"
tables = [{ name = "v", dim = 4 }]
layers = [
  { name = "emb", type = "embedding", table = "v", slots = "C1..C26" },
  { name = "dn", type = "data_norm", input = "dense", decay = 1.0 },
  { name = "x", type = "concat", inputs = ["emb", "dn"] },
  { name = "h", type = "linear", input = "x", out = 8 },
  { name = "bn", type = "batch_norm", input = "h", decay = 1.0 },
  { name = "a", type = "relu", input = "bn" },
  { name = "out", type = "linear", input = "a", out = 1 },
]

[data]
format = "criteo"
"#;

/// The dense parameter named `name` in the model of `job`, from the flat vector `dense`.
fn param<'a>(job: &Path, dense: &'a [f32], name: &str) -> &'a [f32] {
    let job = oar::train::job_config::JobConfig::from_file(job).unwrap();
    let (model, _) = oar::train::job_config::build_model(&job.model, &job.data, &Default::default()).unwrap();
    let mut at = 0;
    for p in model.params() {
        if p.name == name {
            return &dense[at..at + p.len];
        }
        at += p.len;
    }
    panic!("no dense parameter {name}");
}

/// Per dense column, the sum of its values over every line of `files`, as the Criteo reader
/// turns them (ln(1 + max(x, 0)), empty 0), parsed here from the text.
fn column_sums(files: &[std::path::PathBuf]) -> (u64, Vec<f64>) {
    let (mut lines, mut sums) = (0u64, vec![0.0f64; 13]);
    for f in files {
        for line in std::fs::read_to_string(f).unwrap().lines() {
            let cols: Vec<&str> = line.split('\t').collect();
            for (k, v) in cols[1..14].iter().enumerate() {
                let x: i64 = if v.is_empty() { 0 } else { v.parse().unwrap() };
                sums[k] += oar::data::format::criteo::dense_value(x) as f64;
            }
            lines += 1;
        }
    }
    (lines, sums)
}

#[test]
fn the_servers_statistics_count_every_training_sample_once_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, 200, 10);
    let job = dir.path().join("job.toml");
    std::fs::write(&job, JOB).unwrap();
    let files = oar::data::resolve_files(&train).unwrap();
    let (lines, sums) = column_sums(&files);
    let passes = 2;
    let check = |out: &Path, what: &str| {
        let dense = load_params(out).dense;
        let samples = (passes as u64 * lines) as f32;
        // data_norm starts at Paddle's 1e4 samples, batch norm at 1.
        assert!(param(&job, &dense, "dn.count").iter().all(|&n| n == 1e4 + samples), "{what}: data_norm count");
        assert!(param(&job, &dense, "bn.count").iter().all(|&n| n == 1.0 + samples), "{what}: batch_norm count");
        for (k, (got, want)) in param(&job, &dense, "dn.sum").iter().zip(&sums).enumerate() {
            let want = passes as f64 * want;
            assert!((*got as f64 - want).abs() <= 1e-5 * want.abs().max(1.0), "{what}: column {k} sum {got} vs {want}");
        }
        // The square sums grew by at least each step's N * eps (data_norm) and stay finite.
        assert!(param(&job, &dense, "dn.square_sum").iter().all(|&q| q.is_finite() && q > 1e4));
    };

    let mut local = job_config(&job, Mode::Local, &[], 0, 1, &train);
    local.passes = passes;
    local.threads = 2;
    local.output = Some(dir.path().join("local"));
    oar::train::run(&local, &|_, _| {}).unwrap();
    check(&dir.path().join("local"), "local, 2 threads");

    for (mode, threads) in [(Mode::Sync, 2), (Mode::Async, 1), (Mode::Async, 2)] {
        let out = dir.path().join(format!("{mode:?}-{threads}"));
        let reports = train_on_cluster(2, 2, mode, |cluster, t| {
            let mut c = job_config(&job, mode, cluster, t, 2, &train);
            c.passes = passes;
            c.threads = threads;
            c.output = Some(out.clone());
            c
        });
        assert_eq!(reports.iter().map(|r| r.samples).sum::<u64>(), passes as u64 * lines);
        check(&out, &format!("{mode:?} 2x2, {threads} threads"));
    }
}

#[test]
fn a_model_with_batch_norm_evaluates_offline_with_the_servers_statistics() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(&dir.path().join("data"), 2, 4000, 1000);
    let job = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ctr_dnn_norm.toml");
    let out = dir.path().join("model");
    let reports = train_on_cluster(2, 2, Mode::Async, |cluster, t| {
        let mut c = job_config(&job, Mode::Async, cluster, t, 2, &train);
        c.batch_size = 128;
        c.test_files = oar::data::resolve_files(&test).unwrap();
        c.output = Some(out.clone());
        c
    });
    let online = reports[0].passes[0].test.as_ref().unwrap().auc.unwrap();
    assert!(online > 0.6, "test AUC {online}");
    // `oar eval` (a separate process) reads the saved statistics and scores as the trainer did.
    let s = |p: &Path| p.display().to_string();
    let o = oar(&["eval", "--model", &s(&out), "--data", &s(&test)]);
    assert!(o.status.success(), "{}", text(&o));
    let offline = number_after(&text(&o), "AUC ");
    assert!((offline - online).abs() < 1e-4, "offline {offline} vs trainer {online}");
}
