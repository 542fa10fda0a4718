//! The interaction family (`oar gen interactions`): models built on dot products of embeddings
//! learn a planted pairwise model that a DNN over the concatenated embeddings learns slowly.
//! FM and xDeepFM on one vector per value (`pairs`), the field-aware FM on one per value and
//! partner field (`field-pairs`), which an FM of dimension 10 cannot hold. Seed 1 here; README
//! "More models" has 5 seeds and the reference library's figures.

use crate::util::*;
use oar::data::gen_interactions::Effect;
use oar::server::Mode;

/// Generates 100,000 training and 20,000 test lines of `effect` (seed 1) into `dir`; returns
/// the planted model's test AUC.
fn generate(dir: &std::path::Path, effect: Effect) -> f64 {
    let config = oar::data::gen::GenConfig { lines: 100_000, test_lines: 20_000, seed: 1, parts: 2, out: dir.into() };
    oar::data::gen_interactions::generate(&config, effect).unwrap().report.oracle_test_auc.unwrap()
}

/// Test AUC of `job` trained on `dir` in `mode` on `trainers` trainers (and as many servers),
/// one pass at batch 256.
fn auc(job: &std::path::Path, dir: &std::path::Path, mode: Mode, trainers: usize) -> f64 {
    let test = oar::config::resolve_files(&dir.join("test")).unwrap();
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
