//! The interaction family (`oar gen interactions`): models built on dot products of embeddings
//! learn a planted pairwise model that a DNN over the concatenated embeddings learns slowly.
//! FM and xDeepFM on one vector per value (`pairs`), the field-aware FM on one per value and
//! partner field (`field-pairs`), which an FM of dimension 10 cannot hold. Seed 1 here; docs/src/measurements/2026-11-models.md
//! "More models" has 5 seeds and the reference library's figures.

use crate::util::*;
use oar::data::gen::interactions::Effect;
use oar::protocol::Mode;

/// Generates 100,000 training and 20,000 test lines of `effect` (seed 1) into `dir`; returns
/// the planted model's test AUC.
fn generate(dir: &std::path::Path, effect: Effect) -> f64 {
    let config = oar::data::gen::GenConfig { lines: 100_000, test_lines: 20_000, seed: 1, parts: 2, out: dir.into() };
    oar::data::gen::interactions::generate(&config, effect).unwrap().report.oracle_test_auc.unwrap()
}

/// Test AUC of `job` trained on `dir` in `mode` on `trainers` trainers (and as many servers),
/// one pass at batch 256.
fn auc(job: &std::path::Path, dir: &std::path::Path, mode: Mode, trainers: usize) -> f64 {
    let test = oar::data::resolve_files(&dir.join("test")).unwrap();
    let config = |cluster: &[TestServer], t| {
        let mut c = job_config(job, mode, cluster, t, trainers, &dir.join("train"));
        c.passes = 1;
        c.batch_size = 256;
        c.test_files = test.clone();
        c
    };
    let report = match mode {
        Mode::Local => oar::train::run(&config(&[], 0), &|_, _| {}).unwrap(),
        _ => train_on_cluster(trainers, trainers, mode, config).swap_remove(0),
    };
    report.passes[0].test.as_ref().unwrap().auc.unwrap()
}

#[test]
fn fm_and_xdeepfm_learn_planted_pairs_and_ffm_field_aware_ones_that_a_dnn_misses() {
    let dnn_job = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/ctr_dnn.toml");
    let local = |job: &std::path::Path, dir: &std::path::Path| auc(job, dir, Mode::Local, 1);

    let pairs = tempfile::tempdir().unwrap();
    let oracle = generate(pairs.path(), Effect::Pairs);
    let (dnn, fm, xdeepfm) =
        (local(&dnn_job, pairs.path()), local(&zoo_job("fm"), pairs.path()), local(&zoo_job("xdeepfm"), pairs.path()));
    eprintln!("pairs: DNN {dnn:.4}, FM {fm:.4}, xDeepFM {xdeepfm:.4}, planted model {oracle:.4}");
    assert!(fm > dnn + 0.02 && fm < oracle, "FM {fm} vs DNN {dnn}, planted {oracle}");
    assert!(xdeepfm > dnn + 0.01, "xDeepFM {xdeepfm} vs DNN {dnn}");

    let field_pairs = tempfile::tempdir().unwrap();
    let oracle = generate(field_pairs.path(), Effect::FieldPairs);
    let (dnn, fm, ffm) = (
        local(&dnn_job, field_pairs.path()),
        local(&zoo_job("fm"), field_pairs.path()),
        local(&zoo_job("ffm"), field_pairs.path()),
    );
    eprintln!("field pairs: DNN {dnn:.4}, FM {fm:.4}, FFM {ffm:.4}, planted model {oracle:.4}");
    assert!(ffm > dnn + 0.015 && ffm > fm + 0.02 && ffm < oracle, "FFM {ffm} vs DNN {dnn}, FM {fm}, planted {oracle}");
    // The field-aware FM on 2 servers x 2 trainers (async) keeps its lead over the local DNN.
    let two_by_two = auc(&zoo_job("ffm"), field_pairs.path(), Mode::Async, 2);
    eprintln!("FFM 2x2 async: {two_by_two:.4}");
    assert!(two_by_two > dnn + 0.01, "2x2 async FFM {two_by_two} vs the local DNN {dnn}");
}

/// `examples/zoo/paired.sh`, which states AutoInt+'s margin over its DNN (`autoint_base.toml`)
/// in docs/src/measurements/2026-11-models.md, run as a user runs it: each seed's two AUCs, then means and the paired
/// difference computed from them; a job that fails stops it with that job and seed named.
#[test]
fn paired_script_states_a_model_against_its_baseline_seed_by_seed() {
    let dir = tempfile::tempdir().unwrap();
    let config =
        oar::data::gen::GenConfig { lines: 4_000, test_lines: 2_000, seed: 1, parts: 1, out: dir.path().into() };
    oar::data::gen::interactions::generate(&config, Effect::Pairs).unwrap();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // Run from the data's folder, as `paired.sh JOB BASE .`: paths are the caller's.
    let run = |job: &str, seeds: &[&str]| {
        std::process::Command::new("bash")
            .arg(root.join("examples/zoo/paired.sh"))
            .args([root.join(job), root.join("examples/zoo/autoint_base.toml"), ".".into()])
            .args(seeds)
            .env("OAR", env!("CARGO_BIN_EXE_oar"))
            .current_dir(dir.path())
            .output()
            .unwrap()
    };
    let o = run("examples/zoo/autoint.toml", &["1", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    let seeds: Vec<(f64, f64)> = out
        .lines()
        .filter(|l| l.starts_with("seed "))
        .map(|l| {
            let v: Vec<f64> = l.split(": ").nth(1).unwrap().split(' ').map(|x| x.parse().unwrap()).collect();
            (v[0], v[1])
        })
        .collect();
    assert_eq!(seeds.len(), 2, "{out}");
    assert!(seeds.iter().all(|&(a, b)| a > 0.5 && b > 0.5), "{out}");
    // In the script's order of operations, so the printed rounding is the same.
    let diff = (0.0 + (seeds[0].0 - seeds[0].1) + (seeds[1].0 - seeds[1].1)) / 2.0;
    let wins = seeds.iter().filter(|(a, b)| a > b).count();
    let want = format!("paired autoint.toml - autoint_base.toml: {diff:+.4}, standard error");
    assert!(out.contains(&want) && out.contains(&format!("{wins} of 2 seeds won")), "{out}\nwanted {want}");
    // Two seeds: the differences' sample sd over sqrt(2) is half their distance.
    let se: f64 = out.split("standard error ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    let d = |i: usize| seeds[i].0 - seeds[i].1;
    assert!((se - (d(0) - d(1)).abs() / 2.0).abs() < 1e-4, "{out}");

    let o = run("examples/zoo/no_such_job.toml", &["3"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("no_such_job.toml, seed 3:"), "{}", text(&o));
}
