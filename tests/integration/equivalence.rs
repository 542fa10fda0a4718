//! Sync training is exact data parallelism: it matches local training with the combined batch,
//! does not depend on the number of servers, and survives a save/stop/resume unchanged.

use std::io::Write;

use crate::util::*;
use oar::protocol::Mode;

const B: usize = 32;
const STEPS: u64 = 6;

/// Interleaves the two trainers' files block by block, so that local batch k of size 2B holds
/// exactly trainer 0's batch k followed by trainer 1's batch k.
fn interleave(train: &std::path::Path, out: &std::path::Path) {
    let read = |f: &str| std::fs::read_to_string(train.join(f)).unwrap().lines().map(String::from).collect::<Vec<_>>();
    let (a, b) = (read("part-00000"), read("part-00001"));
    std::fs::create_dir_all(out).unwrap();
    let mut f = std::fs::File::create(out.join("part-00000")).unwrap();
    for (ca, cb) in a.chunks(B).zip(b.chunks(B)) {
        for line in ca.iter().chain(cb) {
            writeln!(f, "{line}").unwrap();
        }
    }
}

fn sync_run(
    servers: usize,
    train: &std::path::Path,
    out: &std::path::Path,
    passes: u32,
    resume: Option<&std::path::Path>,
) {
    sync_run_model(servers, train, out, passes, resume, &|_| {})
}

fn sync_run_model(
    servers: usize,
    train: &std::path::Path,
    out: &std::path::Path,
    passes: u32,
    resume: Option<&std::path::Path>,
    model: &dyn Fn(&mut oar::train::TrainConfig),
) {
    let cluster = start_cluster(servers, 2, Mode::Sync, resume);
    let configs = (0..2)
        .map(|t| {
            let mut c = train_config(Mode::Sync, &cluster, t, 2, train);
            model(&mut c);
            c.output = Some(out.to_path_buf());
            c.passes = passes;
            c.resume = resume.map(|r| r.to_path_buf());
            c
        })
        .collect();
    let reports = run_trainers(configs);
    assert!(reports.iter().all(|r| r.samples == (passes as u64 - resume.map_or(0, |_| 1)) * STEPS * B as u64));
    for s in cluster {
        s.handle.join().unwrap();
    }
}

#[test]
fn two_sync_trainers_of_batch_b_equal_local_training_with_batch_2b() {
    sync_equals_local(&|_| {}, 1e-5);
}

/// Paddle's dense `DAdamD2Sum` (`[dense_optimizer] kind = "adam_d2sum"`) runs on the servers'
/// blocks as on the local table, its state split by block.
#[test]
fn paddles_dense_adam_d2sum_trains_the_same_in_sync_2x2_as_locally() {
    sync_equals_local(&|c| c.dense_optimizer = oar::table::Optimizer::adam_d2sum(1e-3), 1e-5);
}

/// Sync 2 x B against local 2B for a model set by `model` (on generated data), every value
/// within `rel` (of itself or of the values' scale: the order of float summation differs).
fn sync_equals_local(model: &dyn Fn(&mut oar::train::TrainConfig), rel: f32) {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    sync_equals_local_on(model, rel, dir.path(), &train);
}

/// [`sync_equals_local`] on `train`'s two parts of `STEPS x B` lines, working in `dir`.
fn sync_equals_local_on(
    model: &dyn Fn(&mut oar::train::TrainConfig),
    rel: f32,
    dir: &std::path::Path,
    train: &std::path::Path,
) {
    let train = train.to_path_buf();
    let dir = tempfile::tempdir_in(dir).unwrap();
    sync_run_model(2, &train, &dir.path().join("dist"), 1, None, model);
    assert_same_params(&load_params(&dir.path().join("dist")), &local_run(model, dir.path(), &train), rel);
}

/// Local training of `train`'s two parts interleaved, at batch 2B (what sync 2 x B equals),
/// working in a new folder in `dir`; returns the model.
fn local_run(model: &dyn Fn(&mut oar::train::TrainConfig), dir: &std::path::Path, train: &std::path::Path) -> Params {
    let dir = tempfile::tempdir_in(dir).unwrap();
    let local_train = dir.path().join("local-data");
    interleave(train, &local_train);
    let mut c = train_config(Mode::Local, &[], 0, 1, &local_train);
    model(&mut c);
    c.batch_size = 2 * B;
    c.output = Some(dir.path().join("local"));
    let report = oar::train::run(&c, &|_, _| {}).unwrap();
    assert_eq!(report.samples, 2 * STEPS * B as u64);
    load_params(&dir.path().join("local"))
}

/// bf16 products (`precision = "bf16"`): sync 2 x B equals local 2B as closely as in f32 (both
/// round the same operands to bf16; only the order of the f32 sums differs), and the model is
/// not the f32 one, so the products really were bf16.
#[test]
fn sync_2x2_equals_local_in_bf16_and_differs_from_f32() {
    if !oar::nn::bf16_available() {
        eprintln!("skipped: this CPU has no avx512_bf16 (bf16 products fall back to f32)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    let bf16 = |c: &mut oar::train::TrainConfig| c.precision = oar::nn::Precision::Bf16;
    sync_equals_local_on(&bf16, 1e-5, dir.path(), &train);
    let (half, full) = (local_run(&bf16, dir.path(), &train), local_run(&|_| {}, dir.path(), &train));
    let moved =
        half.dense.iter().zip(&full.dense).filter(|(h, f)| (*h - *f).abs() > 1e-5 * h.abs().max(f.abs())).count();
    assert!(moved * 10 > full.dense.len(), "bf16 moved only {moved} of {} dense values", full.dense.len());
}

/// The zoo's job file `name`'s model (with its own optimizers' kinds, the sparse one given the
/// positive initial accumulator of `train_config`, see there).
fn zoo_model(name: &'static str) -> impl Fn(&mut oar::train::TrainConfig) {
    move |c| {
        let job = oar::train::job_config::JobConfig::from_file(&zoo_job(name)).unwrap();
        c.model = job.model;
        c.data = job.data;
        c.dense_optimizer = job.dense_optimizer;
        c.sparse_optimizer = oar::table::Optimizer { initial_accumulator: 0.1, ..job.sparse_optimizer };
    }
}

#[test]
fn deepfm_and_dcn_train_the_same_in_sync_2x2_as_locally_at_the_doubled_batch() {
    sync_equals_local(&zoo_model("deepfm"), 1e-5);
    sync_equals_local(&zoo_model("dcn"), 1e-5);
}

/// The models added with their own data families: each trains on two parts of that family's
/// generated lines (`oar gen sequences`, `tasks`, `conversions`; Criteo lines for GateNet)
/// exactly as locally at the doubled batch. DIEN with its auxiliary loss is not among them:
/// its `pipe_command` samples negatives from the earlier lines of the same file, so the
/// interleaved file gives other negatives than the two parts. DIEN holds 2 of its 34,626 dense
/// values beyond 1e-5 (5.7e-5 against 5.4e-5, and -1.8e-5 against -1.7e-5: values near zero,
/// whose Adam steps magnify the order of summation of near-zero gradients); 1e-4 holds them.
#[test]
fn sequence_multitask_and_gate_models_train_the_same_in_sync_2x2_as_locally_at_the_doubled_batch() {
    use oar::data::gen::{conversions, sequences, tasks, GenConfig};
    let dir = tempfile::tempdir().unwrap();
    let config = |name: &str| GenConfig {
        lines: 2 * STEPS * B as u64,
        test_lines: 10,
        seed: 3,
        parts: 2,
        out: dir.path().join(name),
    };
    sequences::generate(&config("sequences"), sequences::Effect::Order).unwrap();
    tasks::generate(&config("tasks"), &tasks::Relation::new(tasks::Effect::Experts, 0.0)).unwrap();
    conversions::generate(&config("conversions")).unwrap();
    let (criteo, _) = gen_data(&dir.path().join("criteo"), 2, STEPS * B as u64, 10);
    let train = |family: &str| dir.path().join(family).join("train");
    let cases = [
        ("din", train("sequences"), 1e-5),
        ("dien", train("sequences"), 1e-4),
        ("bst_din_format", train("sequences"), 1e-5),
        ("mmoe_tasks", train("tasks"), 1e-5),
        ("ple_tasks", train("tasks"), 1e-5),
        ("esmm", train("conversions"), 1e-5),
        ("gatenet", criteo, 1e-5),
    ];
    for (name, data, rel) in cases {
        eprintln!("{name}: sync 2 x {B} against local {}", 2 * B);
        sync_equals_local_on(&zoo_model(name), rel, dir.path(), &data);
    }
}

#[test]
fn ffm_xdeepfm_and_autoint_train_the_same_in_sync_2x2_as_locally_at_the_doubled_batch() {
    // Adam's normalized step magnifies the summation order of near-zero gradients. AutoInt,
    // started as FuxiCTR starts it, holds 1 of its 433,220 dense values beyond 1e-5 (7.5e-7
    // apart at 0.049; with its numeric vectors in +-0.05, 3.6e-6 at 0.041); 1e-4 holds them.
    // xDeepFM, its MLP started Glorot-uniform, holds 2 of 479,200 values beyond 1e-5 (5e-7
    // apart at 0.010, 2e-6 at 0.020); 1e-4 holds them.
    for (name, rel) in [("ffm", 1e-5), ("xdeepfm", 1e-4), ("autoint", 1e-4)] {
        sync_equals_local(&zoo_model(name), rel);
    }
}

#[test]
fn deepfm_and_dcn_train_the_same_model_on_one_and_three_servers() {
    for name in ["deepfm", "dcn"] {
        let dir = tempfile::tempdir().unwrap();
        let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
        sync_run_model(1, &train, &dir.path().join("one"), 1, None, &zoo_model(name));
        sync_run_model(3, &train, &dir.path().join("three"), 1, None, &zoo_model(name));
        let (one, three) = (load_params(&dir.path().join("one")), load_params(&dir.path().join("three")));
        assert!(one.rows.iter().any(|r| r.0 == 1) || name == "dcn", "{name}: the second table was saved");
        assert_same_params(&one, &three, 0.0);
    }
}

#[test]
fn one_server_and_three_servers_train_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    sync_run(1, &train, &dir.path().join("one"), 1, None);
    sync_run(3, &train, &dir.path().join("three"), 1, None);
    // The gradients are merged in trainer order and every value is initialized from its global
    // position, so the two runs agree bit for bit.
    assert_same_params(&load_params(&dir.path().join("one")), &load_params(&dir.path().join("three")), 0.0);
}

/// Saved after pass 1 by 2 servers, the model goes on for pass 2 with fresh servers and
/// trainers, 2 of them, and also 3 and 1 (each server then takes its rows and blocks from every
/// shard file): every pass 2 equals the uninterrupted run's bit for bit.
#[test]
fn save_stop_and_resume_on_any_number_of_servers_gives_the_model_of_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    let straight = dir.path().join("straight");
    sync_run(2, &train, &straight, 2, None);
    let expected = load_params(&straight.join("pass-0002"));

    let stopped = dir.path().join("stopped");
    sync_run(2, &train, &stopped, 1, None);
    let before = load_params(&stopped.join("pass-0001"));
    for servers in [2, 3, 1] {
        let out = dir.path().join(format!("on-{servers}"));
        sync_run(servers, &train, &out, 2, Some(&stopped.join("pass-0001")));
        let m = oar::persist::checkpoint::Manifest::find(&out).unwrap().0;
        assert_eq!((m.pass, m.num_servers), (2, servers));
        let after = load_params(&out.join("pass-0002"));
        assert_same_params(&expected, &after, 0.0);
        assert_ne!(before.dense, after.dense, "pass 2 must have changed the model");
    }
}

#[test]
fn a_mismatched_or_corrupt_checkpoint_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    let saved = dir.path().join("saved");
    sync_run(2, &train, &saved, 1, None);

    // A trainer whose model differs from the saved one is refused before it trains.
    let mut c = train_config(Mode::Local, &[], 0, 1, &train);
    c.model.hidden = Some(vec![16]);
    c.resume = Some(saved.clone());
    let err = oar::train::run(&c, &|_, _| {}).unwrap_err().to_string();
    assert!(err.contains("pass-0001") && err.contains("tables differ"), "{err}");

    // Servers and trainers that start from different models are refused at the declaration:
    // a trainer resuming against fresh servers, a fresh trainer against resumed servers, and a
    // trainer warm-started from another save (each compares its manifest's SHA-256).
    let other = dir.path().join("other");
    sync_run(2, &train, &other, 2, None);
    let cases = [
        (None, Some(&saved), None, "this server loaded none: start the servers with --resume too"),
        (Some(&saved), None, None, "but the trainer starts afresh"),
        (Some(&saved), None, Some(&other), "this server loaded another"),
    ];
    for (served, resume, init, expected) in cases {
        let cluster = start_cluster(1, 1, Mode::Sync, served.map(|p| p.as_path()));
        let mut c = train_config(Mode::Sync, &cluster, 0, 1, &train);
        c.resume = resume.cloned();
        c.init_model = init.cloned();
        c.passes = 3;
        let err = format!("{:#}", oar::train::run(&c, &|_, _| {}).unwrap_err());
        assert!(err.contains(expected), "{expected}: {err}");
    }

    // A damaged shard is named.
    let shard = saved.join("pass-0001/server-1.shard");
    let mut bytes = std::fs::read(&shard).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 1;
    std::fs::write(&shard, bytes).unwrap();
    let err = oar::persist::checkpoint::load_merged(&saved).err().unwrap().to_string();
    assert!(err.contains("server-1.shard") && err.contains("CRC-32 mismatch"), "{err}");
}

/// Regression: with 3 files over 2 trainers, trainer 1 pushes half as many steps per pass; its
/// second pass used to be refused ("pushed step 20, the server is at step 40").
#[test]
fn sync_training_with_uneven_shards_runs_several_passes() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 3, 4 * B as u64, 10);
    let cluster = start_cluster(2, 2, Mode::Sync, None);
    let configs = (0..2)
        .map(|t| {
            let mut c = train_config(Mode::Sync, &cluster, t, 2, &train);
            c.passes = 2;
            c
        })
        .collect();
    let reports = run_trainers(configs);
    // Trainer 0 reads parts 0 and 2, trainer 1 part 1, in each of the two passes.
    assert_eq!(reports[0].samples, 2 * 2 * 4 * B as u64);
    assert_eq!(reports[1].samples, 2 * 4 * B as u64);
    for s in cluster {
        assert_eq!(s.handle.join().unwrap().version, 2 * 8, "one update per step of the longer shard");
    }
}

/// `--threads` splits each batch over replicas and sums their gradients: the model is the one
/// trained with one thread (within float summation order), and a last batch shorter than twice
/// the threads (5 samples over 4 threads) is split into fewer parts instead of panicking.
#[test]
fn threads_split_batches_without_changing_the_model_even_a_short_last_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 3 * B as u64 + 5, 10);
    let run = |threads: usize| {
        let mut c = train_config(Mode::Local, &[], 0, 1, &train);
        c.threads = threads;
        c.output = Some(dir.path().join(format!("t{threads}")));
        assert_eq!(oar::train::run(&c, &|_, _| {}).unwrap().samples, 3 * B as u64 + 5);
        load_params(&dir.path().join(format!("t{threads}")))
    };
    let one = run(1);
    assert_same_params(&run(4), &one, 1e-5);
    assert_same_params(&run(3), &one, 1e-5);
}

/// Local training with updates applied `delay` steps late (a stand-in for async staleness) is
/// deterministic: two runs give the same model bit for bit, it differs from undelayed training,
/// and other modes refuse the setting.
#[test]
fn delayed_local_updates_are_deterministic_and_only_local() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 8 * B as u64, 10);
    let run = |name: &str, delay: usize| {
        let mut c = train_config(Mode::Local, &[], 0, 1, &train);
        c.delay = delay;
        c.sync_warmup = 0; // every update delayed
        c.output = Some(dir.path().join(name));
        let r = oar::train::run(&c, &|_, _| {}).unwrap();
        // Every one of the 8 updates is applied (the last ones at the end of the pass), each
        // `delay` updates late.
        let expected = if delay == 0 { vec![] } else { [vec![0; delay], vec![8]].concat() };
        assert_eq!(r.staleness.0, expected);
        load_params(&dir.path().join(name))
    };
    let (a, b, none) = (run("a", 3), run("b", 3), run("none", 0));
    assert_same_params(&a, &b, 0.0);
    assert_ne!(a.dense, none.dense, "a delay changes the training");
    let mut c = train_config(Mode::Sync, &[], 0, 1, &train);
    c.servers = vec!["127.0.0.1:1".into()];
    c.delay = 2;
    let err = oar::train::run(&c, &|_, _| {}).unwrap_err().to_string();
    assert!(err.contains("--delay") && err.contains("local-mode"), "{err}");
}

/// The `[model]` of a job file holding `text`, written into `dir`.
fn model_from(dir: &std::path::Path, text: &str) -> oar::model::ModelConfig {
    let job = dir.join("job.toml");
    std::fs::write(&job, text).unwrap();
    oar::train::job_config::JobConfig::from_file(&job).unwrap().model
}

/// Paddle's data_norm normalizes with the servers' statistics, not the batch's, so sync
/// training stays data parallelism exactly: 2 x B equals local 2B, statistics included.
#[test]
fn data_norm_trains_the_same_in_sync_2x2_as_locally_at_the_doubled_batch() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_from(
        dir.path(),
        r#"
[model]
output = "fc"
loss = "log_loss"
tables = [{ name = "v", dim = 8 }]
layers = [
  { name = "emb", type = "embedding", table = "v", slots = "C1..C26" },
  { name = "dn", type = "data_norm", input = "dense", prior = 10.0 },
  { name = "x", type = "concat", inputs = ["emb", "dn"] },
  { name = "fc", type = "mlp", input = "x", hidden = [32, 16], out = 1 },
]
"#,
    );
    sync_equals_local(&move |c| c.model = model.clone(), 1e-5);
}

/// Under `count_filter_entry:2` an id seen once before a stop and once after it gets its row
/// after the resume as in the uninterrupted run: the servers' admission filters are in the
/// checkpoint (format 3).
#[test]
fn save_stop_and_resume_under_count_admission_gives_the_same_model() {
    let dir = tempfile::tempdir().unwrap();
    let model = model_from(
        dir.path(),
        r#"
[model]
output = "fc"
loss = "log_loss"
tables = [{ name = "v", dim = 8, entry = "count_filter_entry:2" }]
layers = [
  { name = "emb", type = "embedding", table = "v", slots = "C1..C26" },
  { name = "x", type = "concat", inputs = ["emb", "dense"] },
  { name = "fc", type = "mlp", input = "x", hidden = [16], out = 1 },
]
"#,
    );
    let set = move |c: &mut oar::train::TrainConfig| c.model = model.clone();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    let straight = dir.path().join("straight");
    sync_run_model(2, &train, &straight, 2, None, &set);
    let stopped = dir.path().join("stopped");
    sync_run_model(2, &train, &stopped, 1, None, &set);
    sync_run_model(2, &train, &stopped, 2, Some(&stopped), &set);
    let (a, b) = (load_params(&straight.join("pass-0002")), load_params(&stopped.join("pass-0002")));
    let first = load_params(&stopped.join("pass-0001"));
    assert!(
        first.rows.len() < a.rows.len(),
        "pass 2's second sightings admit ids: {} then {}",
        first.rows.len(),
        a.rows.len()
    );
    assert_same_params(&a, &b, 0.0);
}
