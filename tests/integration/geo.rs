//! GEO-SGD (`--mode geo`): one trainer's GEO run is local training; several trainers' changes
//! all reach the servers, each sample once, counted where applied; a job's trainers and
//! servers agree on the mode or are refused.

use oar::protocol::Mode;

use crate::util::*;

const B: usize = 32;

/// With one trainer, GEO's copy is local training and every exchange gives the servers that
/// copy (`old + (latest - old)`, equal but for rounding): the saved model is local training's,
/// whatever the steps between exchanges, with the job's own optimizers (Adam, Adagrad).
#[test]
fn one_geo_trainer_ends_with_local_trainings_model_whatever_k() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 7 * B as u64 + 5, 10);
    let mut local = train_config(Mode::Local, &[], 0, 1, &train);
    local.output = Some(dir.path().join("local"));
    oar::train::run(&local, &|_, _| {}).unwrap();
    let expected = load_params(&dir.path().join("local"));
    for k in [1, 3, 100] {
        let out = dir.path().join(format!("geo-{k}"));
        let reports = train_on_cluster(2, 1, Mode::Geo, |cluster, t| {
            let mut c = train_config(Mode::Geo, cluster, t, 1, &train);
            c.geo_k_steps = k;
            c.output = Some(out.clone());
            c
        });
        assert_eq!(reports[0].samples, 7 * B as u64 + 5);
        assert_same_params(&load_params(&out), &expected, 1e-5);
    }
}

/// Two servers, two trainers, exchanges after 1 and 2 steps then every 3, and at the pass's
/// end: every sample trained reaches both servers once (their ledgers, not the trainers, count
/// it), each server applies exactly the exchanges the trainers made, and the model learns.
#[test]
fn geo_2x2_applies_every_exchange_once_and_learns() {
    let dir = tempfile::tempdir().unwrap();
    let per_trainer = 20 * 64 + 10; // 21 batches of 64: exchanges after 1, 3, 6, 9, ..., 18, and 21
    let (train, test) = gen_data(&dir.path().join("data"), 2, per_trainer, 4000);
    let logs = dir.path().join("logs");
    let (out, summary) = launch(
        &logs,
        &[
            "--servers",
            "2",
            "--workers",
            "2",
            "--mode",
            "geo",
            "--geo-k-steps",
            "3",
            "--batch-size",
            "64",
            "--train",
            train.to_str().unwrap(),
            "--test",
            test.to_str().unwrap(),
        ],
    );
    assert!(out.contains("oar launch (geo)"), "{out}");
    assert_eq!(summary.server_stats.len(), 2);
    for (k, s) in summary.server_stats.iter().enumerate() {
        assert_eq!(s.applied_samples, vec![per_trainer; 2], "server {k} took every sample once: {s:?}");
        assert_eq!(s.discarded_samples, vec![0; 2], "server {k}: a GEO change is never stale");
        assert_eq!(s.version, 2 * 8, "server {k}: 7 exchanges and the pass end's per trainer");
    }
    let auc = summary.test.as_ref().expect("a test report").auc.expect("an AUC");
    assert!(auc > 0.55, "test AUC {auc}: {out}");
}

/// A GEO job's servers add changes and any other job's run an optimizer: a trainer of the
/// other kind is refused at its declaration, naming the mode, before it changes anything; and
/// asking which rows changed is GEO's only.
#[test]
fn a_trainer_in_another_mode_than_its_servers_is_refused_naming_both() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 64, 10);
    let cases = [
        (Mode::Geo, Mode::Async, "this is a GEO job: its servers add changes"),
        (Mode::Async, Mode::Geo, "are sum, GEO's, and this job's mode is async"),
    ];
    for (servers, trainer, message) in cases {
        let cluster = start_cluster(1, 1, servers, None);
        let mut c = train_config(trainer, &cluster, 0, 1, &train);
        c.connect_timeout = std::time::Duration::from_secs(5);
        let err = format!("{:#}", oar::train::run(&c, &|_, _| {}).unwrap_err());
        assert!(err.contains(message), "{servers} servers, {trainer} trainer: {err}");
        drop(cluster); // the server waits for its trainer until its timeout: not joined
    }
    let cluster = start_cluster(1, 1, Mode::Async, None);
    let config = oar::client::ClientConfig::new(
        vec![cluster[0].addr.clone()],
        "test",
        std::time::Duration::from_secs(5),
        std::time::Duration::from_secs(5),
    )
    .as_trainer(0);
    let mut client = oar::client::Client::connect(&config).unwrap();
    let spec = criteo_model(&Default::default())
        .table_spec(oar::table::Optimizer::adam(1e-3), oar::table::Optimizer::adagrad(0.05));
    client.declare(&spec).unwrap();
    let err = client.changed(0, spec.sparse.len()).unwrap_err().to_string();
    assert!(err.contains("that is GEO's, and this job's mode is async"), "{err}");
    client.close(0).unwrap();
    cluster.into_iter().for_each(|s| drop(s.handle.join().unwrap()));
}
