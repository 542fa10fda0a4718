//! The model zoo trains end to end on real Criteo lines: every job file of `examples/zoo/` (and
//! the CTR-DNN, shorthand and layer graph), locally and on 2 servers x 2 trainers in async and
//! in sync mode, reaching a test AUC clearly above chance; `oar eval`'s code path reads each
//! saved model back and training resumes from it. Skipped, with a message, when
//! `../shared/data/criteo` is absent.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::util::*;
use oar::protocol::Mode;

/// The first 9,000 lines of the real Criteo sample as two training parts, the last 1,000 as the
/// test set.
fn criteo_split(dir: &Path) -> Option<(PathBuf, PathBuf)> {
    let src = shared_data()?.join("criteo/criteo_train_first10k.txt");
    let text = std::fs::read_to_string(src).ok()?;
    let lines: Vec<&str> = text.lines().collect();
    let (train, test) = (dir.join("train"), dir.join("test"));
    std::fs::create_dir_all(&train).unwrap();
    std::fs::create_dir_all(&test).unwrap();
    for (k, part) in lines[..9000].chunks(4500).enumerate() {
        let mut f = std::fs::File::create(train.join(format!("part-{k:05}"))).unwrap();
        part.iter().for_each(|l| writeln!(f, "{l}").unwrap());
    }
    let mut f = std::fs::File::create(test.join("part-00000")).unwrap();
    lines[9000..].iter().for_each(|l| writeln!(f, "{l}").unwrap());
    Some((train, test))
}

/// A trainer config for the zoo job `job`, at batch 256 (35 steps per pass of the 9,000 lines),
/// evaluated on `test`.
fn zoo_config(
    job: &Path,
    mode: Mode,
    servers: &[TestServer],
    id: usize,
    trainers: usize,
    train: &Path,
    test: &Path,
) -> oar::train::TrainConfig {
    let mut c = job_config(job, mode, servers, id, trainers, train);
    c.batch_size = 256;
    c.passes = 1;
    c.test_files = oar::data::resolve_files(test).unwrap();
    c
}

#[test]
fn every_zoo_model_trains_locally_and_on_two_servers_above_chance() {
    let dir = tempfile::tempdir().unwrap();
    let Some((train, test)) = criteo_split(dir.path()) else {
        eprintln!("skipped: ../shared/data/criteo is absent (the zoo test trains on real Criteo lines)");
        return;
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut jobs: Vec<(String, PathBuf)> = ZOO.iter().map(|n| (n.to_string(), zoo_job(n))).collect();
    jobs.push(("ctr_dnn".into(), root.join("examples/ctr_dnn.toml")));
    jobs.push(("ctr_dnn_graph".into(), root.join("examples/ctr_dnn_graph.toml")));
    jobs.push(("ctr_dnn_norm".into(), root.join("examples/ctr_dnn_norm.toml")));
    jobs.push(("gatenet_bit_ln".into(), gatenet_variant(dir.path())));
    let mut table = Vec::new();
    for (name, job) in &jobs {
        let mut local = zoo_config(job, Mode::Local, &[], 0, 1, &train, &test);
        local.output = Some(dir.path().join(format!("{name}-model")));
        let r = oar::train::run(&local, &|_, _| {}).unwrap();
        let local_auc = r.passes[0].test.as_ref().unwrap().auc.unwrap();

        let two_by_two = |mode: Mode| {
            let reports =
                train_on_cluster(2, 2, mode, |cluster, t| zoo_config(job, mode, cluster, t, 2, &train, &test));
            assert_eq!(reports.iter().map(|r| r.samples).sum::<u64>(), 9000, "{name} {mode:?}");
            reports[0].passes[0].test.as_ref().unwrap().auc.unwrap()
        };
        let async_auc = two_by_two(Mode::Async);
        let sync_auc = two_by_two(Mode::Sync);

        // The saved model evaluates offline to the figure the trainer printed.
        let saved = local.output.as_ref().unwrap();
        let (manifest, shard) = oar::persist::checkpoint::load_merged(saved).unwrap();
        let model_config: oar::model::ModelConfig = serde_json::from_value(manifest.model["model"].clone()).unwrap();
        let data: oar::data::DataConfig = serde_json::from_value(manifest.model["data"].clone()).unwrap();
        let (model, schema) = oar::train::job_config::build_model(&model_config, &data, &Default::default()).unwrap();
        let mut store = oar::train::Store::local(shard);
        let files = oar::data::resolve_files(&test).unwrap();
        let offline = oar::train::evaluate(&mut store, &model, &schema, &files, 1024, false).unwrap();
        assert!((offline.auc.unwrap() - local_auc).abs() < 1e-6, "{name}: offline {offline} vs online {local_auc}");

        // Resumed from the saved pass for a second one.
        let mut more = zoo_config(job, Mode::Local, &[], 0, 1, &train, &test);
        more.resume = local.output.clone();
        more.passes = 2;
        let r = oar::train::run(&more, &|_, _| {}).unwrap();
        assert_eq!((r.passes.len(), r.passes[0].pass, r.samples), (1, 2, 9000), "{name}: resumed for pass 2 only");

        table.push((name.clone(), local_auc, async_auc, sync_auc));
    }
    for (name, local, dist, sync) in &table {
        eprintln!("{name:14} local AUC {local:.4}  2x2 async AUC {dist:.4}  2x2 sync AUC {sync:.4}");
    }
    for (name, local, dist, sync) in &table {
        assert!(*local > 0.68, "{name}: local test AUC {local}");
        assert!(*dist > 0.62, "{name}: 2x2 async test AUC {dist}");
        assert!(*sync > 0.62, "{name}: 2x2 sync test AUC {sync}");
    }
}

/// PaddleRec's own AutoInt input (label, 39 indices, 39 values) read as stored through the job
/// file's `pipe_command`, each field's row weighted by its value: trains locally and on 2
/// servers x 2 trainers, above chance on the 112 lines held out.
#[test]
fn autoint_trains_on_paddlerecs_autoint_sample_as_stored() {
    let Some(shared) = shared_data() else {
        eprintln!("skipped: ../shared/data is absent (AutoInt reads PaddleRec's sample)");
        return;
    };
    let text = std::fs::read_to_string(shared.join("criteo/paddlerec_autoint_sample_train_512.txt")).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = (dir.path().join("train"), dir.path().join("test.txt"));
    std::fs::create_dir_all(&train).unwrap();
    for (k, part) in lines[..400].chunks(200).enumerate() {
        std::fs::write(train.join(format!("part-{k:05}")), part.join("\n") + "\n").unwrap();
    }
    std::fs::write(&test, lines[400..].join("\n") + "\n").unwrap();
    let config = |mode, servers: &[TestServer], id, trainers| {
        let mut c = job_config(&zoo_job("autoint_paddlerec"), mode, servers, id, trainers, &train);
        c.passes = 2;
        c.test_files = vec![test.clone()];
        c
    };
    let auc = |r: &oar::train::TrainReport| r.passes.last().unwrap().test.as_ref().unwrap().auc.unwrap();
    let local = oar::train::run(&config(Mode::Local, &[], 0, 1), &|_, _| {}).unwrap();
    assert_eq!(local.samples, 800);
    let reports = train_on_cluster(2, 2, Mode::Async, |cluster, t| config(Mode::Async, cluster, t, 2));
    assert_eq!(reports.iter().map(|r| r.samples).sum::<u64>(), 800);
    eprintln!("PaddleRec's AutoInt sample: local AUC {:.4}, 2x2 async {:.4}", auc(&local), auc(&reports[0]));
    assert!(auc(&local) > 0.6 && auc(&reports[0]) > 0.6, "{} {}", auc(&local), auc(&reports[0]));
}
