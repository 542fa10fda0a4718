//! Async mode's staleness controls: the synchronous warm-up and staleness-scaled steps, on
//! real servers through real TCP.

use std::time::Duration;

use crate::util::*;
use oar::client::{Client, ClientConfig, StepHeader, TableGrads, TableIds};
use oar::protocol::Mode;
use oar::protocol::{Apply, RowCreation};
use oar::server::ServerConfig;

const B: usize = 32;
const STEPS: u64 = 6;

/// Two trainers against two servers on `train`, one pass, saving into `out`.
fn two_by_two(mode: Mode, train: &std::path::Path, out: &std::path::Path, set: &dyn Fn(&mut oar::train::TrainConfig)) {
    let cluster = start_cluster(2, 2, mode, None);
    let configs = (0..2)
        .map(|t| {
            let mut c = train_config(mode, &cluster, t, 2, train);
            c.output = Some(out.to_path_buf());
            set(&mut c);
            c
        })
        .collect();
    let reports = run_trainers(configs);
    for r in &reports {
        assert_eq!(r.samples, STEPS * B as u64, "trainer {}: every sample trained once", r.trainer);
    }
    for s in cluster {
        s.handle.join().unwrap();
    }
}

/// The warm-up is sync training at the same samples per update: two async trainers of batch
/// 2B whose warm-up covers the pass split each batch into the two halves that sync trainers of
/// batch B read, and give their model bit for bit.
#[test]
fn an_async_warm_up_covering_the_pass_trains_as_sync_trainers_of_half_the_batch() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    two_by_two(Mode::Sync, &train, &dir.path().join("sync"), &|c| c.batch_size = B);
    two_by_two(Mode::Async, &train, &dir.path().join("warm"), &|c| {
        c.batch_size = 2 * B;
        c.sync_warmup = STEPS;
    });
    two_by_two(Mode::Async, &train, &dir.path().join("cold"), &|c| {
        c.batch_size = 2 * B;
        c.sync_warmup = 0;
    });
    let (sync, warm) = (load_params(&dir.path().join("sync")), load_params(&dir.path().join("warm")));
    assert_same_params(&sync, &warm, 0.0);
    assert_ne!(load_params(&dir.path().join("cold")).dense, sync.dense, "without the warm-up async differs");
}

/// A warm-up shorter than the pass hands over to async pushes: every sample is still trained
/// once, and only the pushes after the warm-up are counted as async (with their staleness).
#[test]
fn a_short_warm_up_hands_over_to_async_pushes() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    let cluster = start_cluster(2, 2, Mode::Async, None);
    let configs = (0..2)
        .map(|t| {
            let mut c = train_config(Mode::Async, &cluster, t, 2, &train);
            c.batch_size = 2 * B;
            // Two merged updates: each trainer's first batch of 2B, in halves.
            c.sync_warmup = 2;
            c
        })
        .collect();
    let reports = run_trainers(configs);
    for r in &reports {
        assert_eq!(r.samples, STEPS * B as u64);
        // 3 batches of 2B per trainer: 1 split for the warm-up, 2 pushed async.
        assert_eq!(r.staleness.count(), 2, "trainer {}: {}", r.trainer, r.staleness);
    }
    for s in cluster {
        s.handle.join().unwrap();
    }
}

/// One server in `mode` for `trainers`, staying up after they leave, the client settings to
/// reach it, and a small CTR-DNN's tables with SGD at lr 1 (steps computable by hand).
fn sgd_server(mode: Mode, trainers: usize) -> (impl Sized, ClientConfig, oar::table::TableSpec) {
    let server = start_server(ServerConfig { exit_when_done: false, ..server_config(0, 1, trainers, mode) });
    let config = ClientConfig::new(vec![server.addr.clone()], "test", Duration::from_secs(5), Duration::from_secs(30));
    let spec = criteo_model(&oar::model::ModelConfig { hidden: Some(vec![4]), ..Default::default() })
        .table_spec(oar::table::Optimizer::sgd(1.0), oar::table::Optimizer::sgd(1.0));
    (server, config, spec)
}

/// A push marked `StalenessScaled` that arrives `k > 1` updates stale moves the dense weights
/// `1/k` as far as a fresh one; `Now` pushes are never scaled.
#[test]
fn a_stale_push_takes_a_dense_step_divided_by_its_staleness() {
    let (_server, config, spec) = sgd_server(Mode::Async, 1);
    let mut c = Client::connect(&config.as_trainer(0)).unwrap();
    c.declare(&spec).unwrap();
    let ones = vec![1.0f32; spec.dense.total()];
    let mut dense = Vec::new();
    let mut pull = |c: &mut Client| {
        c.pull(Some(&mut dense), &[], &mut [], RowCreation::Create).unwrap();
        dense[0]
    };
    // SGD with lr 1 on a gradient of ones over one sample: each full step subtracts 1.
    // (lag_ratio 1.5 x 1 trainer: pushes up to 2 updates stale are applied.)
    let mut steps = Vec::new();
    let mut before = pull(&mut c);
    let pushes =
        [(0, Apply::Now), (0, Apply::StalenessScaled), (0, Apply::StalenessScaled), (3, Apply::StalenessScaled)];
    for (step, (base_version, apply)) in pushes.into_iter().enumerate() {
        let header = StepHeader { trainer: 0, step: step as u64, pass: 1, base_version, samples: 1, apply };
        let report = c.push(&header, Some(&ones), &[]).unwrap();
        let after = pull(&mut c);
        steps.push((report.staleness, before - after));
        before = after;
    }
    // Staleness 0, 1, 2, 0: only the push 2 updates stale is scaled.
    let want = [(0, 1.0), (1, 1.0), (2, 0.5), (0, 1.0)];
    for ((got_stale, got_step), (stale, step)) in steps.iter().zip(want) {
        assert_eq!(*got_stale, stale, "{steps:?}");
        assert!((got_step - step).abs() < 1e-6, "{steps:?}");
    }
    c.close(0).unwrap();
}

/// The delayed local mode measures the warm-up and the scaled steps too: with both, the first
/// steps are applied at once and later ones late with smaller dense steps, deterministically.
#[test]
fn delayed_local_updates_honour_the_warm_up_and_the_scaled_steps() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 1, 8 * B as u64, 10);
    let run = |name: &str, warmup: u64, scaled: bool| {
        let mut c = train_config(Mode::Local, &[], 0, 1, &train);
        c.delay = 2;
        c.sync_warmup = warmup;
        c.scale_stale_steps = scaled;
        c.output = Some(dir.path().join(name));
        let r = oar::train::run(&c, &|_, _| {}).unwrap();
        (r.staleness.count(), load_params(&dir.path().join(name)))
    };
    let (n_plain, plain) = run("plain", 0, false);
    let (n_warm, warm) = run("warm", 3, false);
    let (_, scaled) = run("scaled", 0, true);
    let (_, scaled_again) = run("scaled-again", 0, true);
    assert_eq!((n_plain, n_warm), (8, 5), "the 3 warm-up steps are not delayed");
    assert_ne!(plain.dense, warm.dense);
    assert_ne!(plain.dense, scaled.dense);
    assert_same_params(&scaled, &scaled_again, 0.0);
}

/// The two halves of a split async push (dense and sparse, sent on two connections) are judged
/// for staleness together: the sparse half, arriving after its dense half moved the version,
/// is applied with it rather than discarded (counted at the server: no discarded push). The
/// halves are sent in that order on one connection to a real server process, lag bound 1.
#[test]
fn the_halves_of_a_split_async_push_are_applied_or_discarded_together() {
    use oar::protocol::{read_frame_blocking, FrameBuf, Hello, Push, PushOutcome, PushPart, Request, Response};
    use oar::protocol::{SparseGrads, PROTOCOL_VERSION};
    use std::borrow::Cow;
    use std::io::Write;
    let args = ["--mode", "async", "--trainers", "1", "--lag-ratio", "1", "--job", "halves"];
    let (mut server, addr) = pserver_ready(&args, std::process::Stdio::null());
    let config = ClientConfig::new(vec![addr.clone()], "halves", Duration::from_secs(5), Duration::from_secs(10));
    let mut client = Client::connect(&config.as_trainer(0)).unwrap();
    let spec = crate::robustness::spec();
    client.declare(&spec).unwrap();
    let dense = spec.dense.total();
    let dim = spec.sparse[0].dim;
    // Step 0 moves the server to version 1.
    let header = StepHeader { trainer: 0, step: 0, pass: 1, base_version: 0, samples: 4, apply: Apply::Now };
    client.push(&header, Some(&vec![0.0; dense]), &[]).unwrap();

    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let mut buf = FrameBuf::default();
    let mut ask = |request: Request| {
        s.write_all(&request.encode().to_vec()).unwrap();
        let kind = read_frame_blocking(&mut s, &mut buf, 1 << 20).unwrap();
        Response::decode(kind, buf.payload()).map(|r| format!("{r:?}")).unwrap()
    };
    let hello = Hello {
        version: PROTOCOL_VERSION,
        job: "halves".into(),
        num_servers: 1,
        server_index: 0,
        trainer: 0,
        epoch: 0,
    };
    assert!(ask(Request::Hello(hello)).contains("Welcome"));
    // Step 1 computed at version 0: one behind when its dense half arrives, two when its sparse
    // half does, with 1 allowed.
    let half = |part, dense: Vec<Cow<'static, [f32]>>, sparse| Push {
        trainer: 0,
        step: 1,
        pass: 1,
        base_version: 0,
        samples: 4,
        part,
        apply: Apply::Now,
        dense,
        sparse,
    };
    let dense_half = half(PushPart::Dense, vec![Cow::Owned(vec![0.0; dense])], Vec::new());
    let grads = SparseGrads {
        table: 0,
        ids: Cow::Owned(vec![7]),
        counts: Cow::Owned(vec![1.0, 0.0]),
        grads: Cow::Owned(vec![0.5; dim]),
    };
    let sparse_half = half(PushPart::Sparse, Vec::new(), vec![grads]);
    let applied = format!("{:?}", PushOutcome::Applied);
    let first = ask(Request::Push(dense_half));
    assert!(first.contains(&applied), "the dense half, one behind: {first}");
    let second = ask(Request::Push(sparse_half));
    assert!(second.contains(&applied), "the sparse half is judged with its dense half: {second}");
    drop(s);
    let stats = client.stats().unwrap();
    assert_eq!((stats[0].discarded, stats[0].applied_samples.clone()), (0, vec![8]), "{:?}", stats[0]);
    client.close(0).unwrap();
    assert!(server.wait().unwrap().success());
}

/// `sync_dense` (`Apply::DenseMerged`), by hand with SGD at lr 1 on one server: a push's rows
/// are applied at once, so the other trainer pulls them while the dense part still waits; once
/// both trainers pushed, the dense part moves once by the mean over both pushes' samples; a
/// push sent again changes nothing. Counted at the server: each trainer's sample once.
#[test]
fn a_dense_merged_push_applies_its_rows_at_once_and_waits_for_every_trainers_dense_part() {
    let (_server, config, spec) = sgd_server(Mode::Async, 2);
    let dim = spec.sparse[0].dim;
    let mut a = Client::connect(&config.clone().as_trainer(0)).unwrap();
    let mut b = Client::connect(&config.as_trainer(1)).unwrap();
    a.declare(&spec).unwrap();
    b.declare(&spec).unwrap();
    let ids = [7u64];
    let pull = |c: &mut Client| {
        let (mut dense, mut rows) = (Vec::new(), vec![Vec::new()]);
        c.pull(Some(&mut dense), &[TableIds { table: 0, dim, ids: &ids }], &mut rows, RowCreation::Create).unwrap();
        (dense, rows.remove(0))
    };
    let (dense0, row0) = pull(&mut a);
    let ones = vec![1.0f32; dense0.len()];
    let (row_grad, counts) = (vec![1.0f32; dim], [1.0f32, 0.0]);
    let grads = [TableGrads { table: 0, dim, ids: &ids, counts: &counts, grads: &row_grad }];
    let header =
        |trainer| StepHeader { trainer, step: 0, pass: 1, base_version: 0, samples: 1, apply: Apply::DenseMerged };
    let minus = |v: &[f32], d: f32| v.iter().map(|x| x - d).collect::<Vec<f32>>();
    std::thread::scope(|s| {
        let first = s.spawn(|| a.push(&header(0), Some(&ones), &grads).unwrap());
        // Trainer 0's push waits in the step; the server's counters say when its rows are in.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while b.stats().unwrap()[0].keys_pushed == 0 {
            assert!(std::time::Instant::now() < deadline, "trainer 0's rows never applied");
            std::thread::yield_now();
        }
        let (dense, row) = pull(&mut b);
        assert_eq!(row, minus(&row0, 1.0), "trainer 0's rows are applied at once");
        assert_eq!(dense, dense0, "the dense part waits for trainer 1's");
        b.push(&header(1), Some(&ones), &grads).unwrap();
        first.join().unwrap();
    });
    let want = (minus(&dense0, 1.0), minus(&minus(&row0, 1.0), 1.0));
    assert_eq!(pull(&mut a), want, "dense: one step on the mean of both; rows: one step each");
    a.push(&header(0), Some(&ones), &grads).unwrap();
    assert_eq!(pull(&mut b), want, "a push sent again is answered, not applied");
    let stats = b.stats().unwrap().remove(0);
    assert_eq!((stats.version, stats.keys_pushed), (1, 2), "one dense update, each trainer's row once");
    assert_eq!((stats.applied_samples.as_slice(), stats.repeats), (&[1, 1][..], 1), "{stats:?}");
    a.close(0).unwrap();
    b.close(1).unwrap();
}

/// With the rows held still (a sparse learning rate of 1e-30, whose steps round away), async
/// trainers in `sync_dense` train the dense part as sync trainers do, bit for bit: one merged
/// update per step of both; and so do trainers whose one batch of 3B is cut in three steps,
/// and trainers in a `sync_dense_ramp` as long as the pass, whose batches of B are cut in two:
/// they train as sync trainers of B / 2.
#[test]
fn sync_dense_trains_the_dense_part_as_sync_mode_does() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, STEPS * B as u64, 10);
    let still = |c: &mut oar::train::TrainConfig| {
        c.batch_size = B;
        c.sparse_optimizer = oar::table::Optimizer::sgd(1e-30);
    };
    two_by_two(Mode::Sync, &train, &dir.path().join("sync"), &still);
    two_by_two(Mode::Async, &train, &dir.path().join("hybrid"), &|c| {
        still(c);
        c.sync_warmup = 0;
        c.sync_dense = true;
        c.sync_dense_ramp = 0;
    });
    two_by_two(Mode::Async, &train, &dir.path().join("async"), &|c| {
        still(c);
        c.sync_warmup = 0;
    });
    two_by_two(Mode::Async, &train, &dir.path().join("cut"), &|c| {
        still(c);
        c.batch_size = 3 * B;
        c.sync_warmup = 0;
        c.sync_dense = true;
        c.sync_dense_parts = 3;
        // Steps of B throughout, as sync mode's: no halved steps first.
        c.sync_dense_ramp = 0;
    });
    // A ramp over the whole pass: every batch of B in two steps of B / 2, by step number.
    two_by_two(Mode::Sync, &train, &dir.path().join("sync-half"), &|c| {
        still(c);
        c.batch_size = B / 2;
    });
    two_by_two(Mode::Async, &train, &dir.path().join("ramp"), &|c| {
        still(c);
        c.sync_warmup = 0;
        c.sync_dense = true;
        c.sync_dense_ramp = 2 * STEPS;
    });
    let (sync, hybrid) = (load_params(&dir.path().join("sync")), load_params(&dir.path().join("hybrid")));
    assert_same_params(&sync, &hybrid, 0.0);
    assert_same_params(&sync, &load_params(&dir.path().join("cut")), 0.0);
    let (half, ramp) = (load_params(&dir.path().join("sync-half")), load_params(&dir.path().join("ramp")));
    assert_same_params(&half, &ramp, 0.0);
    assert_ne!(half.dense, sync.dense, "steps of B / 2 differ from steps of B");
    assert_ne!(load_params(&dir.path().join("async")).dense, sync.dense, "plain async differs");
}

/// A dense-merged push is an async job's: a sync server refuses it, naming why, and its rows
/// are not applied.
#[test]
fn a_sync_server_refuses_a_dense_merged_push() {
    let (_server, config, spec) = sgd_server(Mode::Sync, 1);
    let dim = spec.sparse[0].dim;
    let mut c = Client::connect(&config.clone().as_trainer(0)).unwrap();
    c.declare(&spec).unwrap();
    let (ids, counts, grad) = ([7u64], [1.0f32, 0.0], vec![1.0f32; dim]);
    let grads = [TableGrads { table: 0, dim, ids: &ids, counts: &counts, grads: &grad }];
    let header = StepHeader { trainer: 0, step: 0, pass: 1, base_version: 0, samples: 1, apply: Apply::DenseMerged };
    let e = c.push(&header, None, &grads).unwrap_err().to_string();
    assert!(e.contains("dense-merged pushes are whole pushes of an async job (sync job"), "{e}");
    let mut c = Client::connect(&config.as_trainer(0)).unwrap();
    c.attach(&spec);
    assert_eq!(c.stats().unwrap()[0].keys_pushed, 0, "its rows were not applied");
}

/// A push whose gradients or counts do not match its ids (2 counts and `dim` floats an id) is
/// refused by the client in one clear error, and the server applies nothing; the same push
/// with matching lengths goes through one server whole, counted there.
#[test]
fn a_push_whose_gradients_do_not_match_its_ids_is_refused_before_it_is_sent() {
    let (_server, config, spec) = sgd_server(Mode::Async, 1);
    let dim = spec.sparse[0].dim;
    let mut c = Client::connect(&config.as_trainer(0)).unwrap();
    c.declare(&spec).unwrap();
    let ids = [3u64, 9];
    let (counts, grads) = ([1.0f32, 0.0, 1.0, 0.0], vec![0.5f32; 2 * dim]);
    let header = StepHeader { trainer: 0, step: 0, pass: 1, base_version: 0, samples: 2, apply: Apply::Now };
    for (counts, grads) in [(&counts[..2], &grads[..]), (&counts[..], &grads[..dim])] {
        let bad = [TableGrads { table: 0, dim, ids: &ids, counts, grads }];
        let err = c.push(&header, None, &bad).unwrap_err().to_string();
        assert!(err.contains("2 ids with") && err.contains("per id"), "{err}");
    }
    assert_eq!(c.stats().unwrap()[0].keys_pushed, 0, "nothing reached the server");
    c.push(&header, None, &[TableGrads { table: 0, dim, ids: &ids, counts: &counts, grads: &grads }]).unwrap();
    assert_eq!(c.stats().unwrap()[0].keys_pushed, 2, "both rows applied once, by the server's count");
}
