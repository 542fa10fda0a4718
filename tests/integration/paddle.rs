//! PaddlePaddle's pserver/trainer interfaces: every environment contract starts real `oar`
//! processes configured only by environment variables; multi-port servers, sparse-only ports,
//! `--nics`, stale-push discard with a deliberately slow trainer.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use oar::client::{Client, ClientConfig, StepHeader, TableGrads, TableIds};
use oar::protocol::Mode;
use oar::protocol::{Apply, RowCreation};

use crate::util::*;

/// `oar` with `args` and exactly the environment `vars` (plus PATH), nothing inherited.
fn command(args: &[&str], vars: &[(&str, String)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_oar"));
    c.args(args).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default()).env("RUST_LOG", "warn");
    for (k, v) in vars {
        c.env(k, v);
    }
    c
}

fn spawn(args: &[&str], vars: &[(&str, String)]) -> Child {
    command(args, vars).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("oar starts")
}

fn finish(child: Child) -> Output {
    child.wait_with_output().expect("oar ends")
}

/// A small generated Criteo job described by `OAR_*` variables (data and a tiny model).
fn job_vars(data: &Path) -> Vec<(&'static str, String)> {
    vec![
        ("OAR_TRAIN", data.join("train").display().to_string()),
        ("OAR_HIDDEN", "16".into()),
        ("OAR_BATCH_SIZE", "200".into()),
        ("OAR_TIMEOUT", "60".into()),
    ]
}

fn with(mut base: Vec<(&'static str, String)>, more: &[(&'static str, &str)]) -> Vec<(&'static str, String)> {
    base.extend(more.iter().map(|(k, v)| (*k, v.to_string())));
    base
}

/// Every process of a job ran to a clean exit; returns the trainers' outputs.
fn all_succeed(servers: Vec<Child>, trainers: Vec<Child>) -> Vec<String> {
    let outs: Vec<String> = trainers
        .into_iter()
        .map(|t| {
            let o = finish(t);
            assert!(o.status.success(), "a trainer failed:\n{}", text(&o));
            text(&o)
        })
        .collect();
    for s in servers {
        // Servers exit by themselves once every trainer has closed.
        let o = finish(s);
        assert!(o.status.success(), "a server failed:\n{}", text(&o));
    }
    outs
}

/// Also: the servers exit by themselves after the last trainer closes, having saved the model.
#[test]
fn fleet_contract_runs_two_servers_and_two_trainers_from_one_command_line() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(dir.path(), 2, 1500, 500);
    let model = dir.path().join("model");
    let model_dir = model.display().to_string();
    let (p0, p1) = (free_ports(1), free_ports(1));
    let list = format!("127.0.0.1:{p0},127.0.0.1:{p1}");
    let common = with(job_vars(dir.path()), &[("PADDLE_PSERVERS_IP_PORT_LIST", &list), ("PADDLE_TRAINERS_NUM", "2")]);
    let servers: Vec<Child> = [p0, p1]
        .iter()
        .map(|p| {
            let port = p.to_string();
            let vars = with(
                common.clone(),
                &[
                    ("TRAINING_ROLE", "PSERVER"),
                    ("POD_IP", "127.0.0.1"),
                    ("PADDLE_PORT", &port),
                    ("OAR_OUTPUT", &model_dir),
                ],
            );
            spawn(&["train"], &vars)
        })
        .collect();
    let trainers: Vec<Child> = ["0", "1"]
        .iter()
        .map(|id| spawn(&["train"], &with(common.clone(), &[("TRAINING_ROLE", "TRAINER"), ("PADDLE_TRAINER_ID", id)])))
        .collect();
    for out in all_succeed(servers, trainers) {
        assert!(out.contains("trained 1500 samples"), "{out}");
    }
    let manifest = std::fs::read_to_string(model.join("final/manifest.json")).unwrap();
    assert!(manifest.contains("\"pass\": 1") && manifest.contains("hidden"), "{manifest}");
    let test = dir.path().join("test");
    let out = command(&["eval", "--model", &model_dir, "--data", test.to_str().unwrap()], &[]).output().unwrap();
    assert!(out.status.success() && text(&out).contains("500 samples, AUC"), "{}", text(&out));
}

#[test]
fn fluid_contract_runs_servers_on_their_own_loopback_addresses() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(dir.path(), 2, 1500, 0);
    // Fluid gives every server the same port on its own IP: 127.0.0.1 and 127.0.0.2.
    let port = free_ports(1).to_string();
    let common = with(
        job_vars(dir.path()),
        &[("PADDLE_PSERVER_IPS", "127.0.0.1,127.0.0.2"), ("PADDLE_PSERVER_PORT", &port), ("PADDLE_TRAINERS", "2")],
    );
    let servers: Vec<Child> = ["127.0.0.1", "127.0.0.2"]
        .iter()
        .map(|ip| {
            spawn(&["train"], &with(common.clone(), &[("PADDLE_TRAINING_ROLE", "PSERVER"), ("PADDLE_CURRENT_IP", ip)]))
        })
        .collect();
    let trainers: Vec<Child> = ["0", "1"]
        .iter()
        .map(|id| {
            spawn(&["train"], &with(common.clone(), &[("PADDLE_TRAINING_ROLE", "TRAINER"), ("PADDLE_TRAINER_ID", id)]))
        })
        .collect();
    for out in all_succeed(servers, trainers) {
        assert!(out.contains("trained 1500 samples"), "{out}");
    }
}

#[test]
fn v2_contract_with_mpi_rank_trainer_count_and_several_ports() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(dir.path(), 2, 1500, 0);
    let port = free_ports(3);
    let p = port.to_string();
    let v2 = with(
        job_vars(dir.path()),
        &[
            ("PADDLE_INIT_PORT", &p),
            ("PADDLE_INIT_PORTS_NUM", "2"),
            ("PADDLE_INIT_PORTS_NUM_FOR_SPARSE", "1"),
            ("PADDLE_INIT_NUM_GRADIENT_SERVERS", "2"),
            ("PADDLE_INIT_PSERVERS", "127.0.0.1"),
            ("PADDLE_INIT_TRAINER_COUNT", "2"),
            ("PADDLE_INIT_USE_GPU", "0"),
        ],
    );
    // The v2 pserver is told neither its index nor the server count: it learns them from the
    // trainers' handshake.
    let server = spawn(&["pserver", "--host", "127.0.0.1"], &v2);
    let trainers = vec![
        spawn(&["train"], &with(v2.clone(), &[("PADDLE_INIT_TRAINER_ID", "0")])),
        // Open MPI's rank is the node id when the v2 id is absent.
        spawn(&["train"], &with(v2.clone(), &[("OMPI_COMM_WORLD_RANK", "1")])),
    ];
    for out in all_succeed(vec![server], trainers) {
        assert!(out.contains("trained 1500 samples"), "{out}");
    }

    let gpu = command(&["train"], &with(v2.clone(), &[("PADDLE_INIT_USE_GPU", "true")])).output().unwrap();
    assert_eq!(gpu.status.code(), Some(1));
    assert!(text(&gpu).contains("use_gpu") && text(&gpu).contains("CPU"), "{}", text(&gpu));
    let bad = command(&["train"], &with(v2, &[("PADDLE_INIT_NUM_GRADIENT_SERVERS", "two")])).output().unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad).contains("PADDLE_INIT_NUM_GRADIENT_SERVERS"), "{}", text(&bad));
    let lines = String::from_utf8_lossy(&bad.stderr).lines().count();
    assert_eq!(lines, 1, "one clear line: {}", text(&bad));
}

#[test]
fn a_malformed_fleet_variable_is_named() {
    let out = command(
        &["train"],
        &[
            ("TRAINING_ROLE", "TRAINER".into()),
            ("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:1".into()),
            ("PADDLE_TRAINERS_NUM", "2".into()),
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("PADDLE_TRAINER_ID: missing"), "{}", text(&out));
}

/// Counts that once panicked a trainer are one clear line each: 0 trainers (v2's variable and
/// the flag) divided by zero when the files were dealt, and a sparse port count near u64::MAX
/// wrapped the ports to none.
#[test]
fn zero_trainers_or_a_wrapping_port_count_is_one_clear_line() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 20, 5);
    let data = vec![("OAR_TRAIN", train.display().to_string())];
    let v2 = |more: &[(&'static str, &str)]| {
        with(with(data.clone(), &[("PADDLE_INIT_PSERVERS", "127.0.0.1"), ("PADDLE_INIT_PORT", "9")]), more)
    };
    let cases = [
        (v2(&[("PADDLE_INIT_NUM_GRADIENT_SERVERS", "0")]), vec!["train"], "PADDLE_INIT_NUM_GRADIENT_SERVERS"),
        (data.clone(), vec!["train", "--trainers", "0", "--servers", "127.0.0.1:9"], "--trainers must be at least 1"),
        (
            v2(&[("PADDLE_INIT_PORTS_NUM", "1"), ("PADDLE_INIT_PORTS_NUM_FOR_SPARSE", "18446744073709551615")]),
            vec!["train"],
            "at most 256 ports per server",
        ),
    ];
    for (vars, args, want) in cases {
        let out = command(&args, &vars).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", text(&out));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want) && !err.contains("panicked"), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one clear line: {err}");
    }
}

/// Reads the `OAR_READY <addr>` line of a server started by hand.
fn ready_addr(child: &mut Child) -> String {
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    line.trim().strip_prefix("OAR_READY ").unwrap_or_else(|| panic!("not ready: {line:?}")).to_string()
}

#[test]
fn three_ports_and_a_sparse_port_all_carry_traffic_and_the_sparse_port_only_sparse() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(dir.path(), 1, 3000, 0);
    let port = free_ports(4);
    let p = port.to_string();
    let mut server = spawn(
        &[
            "pserver",
            "--host",
            "127.0.0.1",
            "--port",
            &p,
            "--ports_num",
            "3",
            "--ports-num-for-sparse",
            "1",
            "--num_gradient_servers",
            "1",
            "--keep-serving",
        ],
        &[],
    );
    let addr = ready_addr(&mut server);
    assert_eq!(addr, format!("127.0.0.1:{port}"));
    let train = dir.path().join("train");
    let out = command(
        &[
            "train",
            "--servers",
            "127.0.0.1",
            "--port",
            &p,
            "--ports_num",
            "3",
            "--ports_num_for_sparse",
            "1",
            "--hidden",
            "16",
            "--train",
            train.to_str().unwrap(),
        ],
        &[],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));

    let mut c =
        Client::connect(&ClientConfig::new(vec![addr], "oar", Duration::from_secs(5), Duration::from_secs(5))).unwrap();
    let stats = c.stats().unwrap().remove(0);
    assert_eq!(stats.port_requests.len(), 4);
    assert!(stats.port_requests.iter().all(|&n| n > 5), "every port served the trainer: {:?}", stats.port_requests);

    // The sparse port refuses dense traffic.
    let sparse_port = format!("127.0.0.1:{}", port + 3);
    let config = ClientConfig::new(vec![sparse_port], "oar", Duration::from_secs(5), Duration::from_secs(5));
    let mut s = Client::connect(&config.as_trainer(0)).unwrap();
    let spec = crate::util::criteo_model(&oar::model::ModelConfig { hidden: Some(vec![16]), ..Default::default() })
        .table_spec(oar::table::Optimizer::adam(1e-3), oar::table::Optimizer::adagrad(0.05));
    s.declare(&spec).unwrap();
    let err = s.pull(Some(&mut Vec::new()), &[], &mut [], RowCreation::Peek).unwrap_err().to_string();
    assert!(err.contains("carries only sparse traffic"), "{err}");
    let mut rows = [Vec::new()];
    s.pull(None, &[TableIds { table: 0, dim: 10, ids: &[1, 2] }], &mut rows, RowCreation::Peek).unwrap();
    let _ = server.kill();
    let _ = server.wait();
}

#[test]
fn nics_binds_the_interface_address_or_names_a_missing_one() {
    let mut server = spawn(&["pserver", "--nics", "lo", "--port", "0", "--keep-serving"], &[]);
    let addr = ready_addr(&mut server);
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    let _ = server.kill();
    let _ = server.wait();
    let out = command(&["pserver", "--nics", "nosuch0"], &[]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out).contains("--nics nosuch0") && text(&out).contains("lo"), "{}", text(&out));
}

/// A slow trainer's push computed from parameters older than `lag_ratio x trainers` updates
/// is discarded and counted; a fresh one is applied.
#[test]
fn a_slow_trainers_stale_push_is_discarded_and_counted() {
    let mut config = server_config(0, 1, 2, Mode::Async);
    config.lag_ratio = 1.0; // at most 2 updates behind with 2 trainers
    let server = start_server(config);
    let spec = crate::util::criteo_model(&oar::model::ModelConfig { hidden: Some(vec![4]), ..Default::default() })
        .table_spec(oar::table::Optimizer::sgd(0.1), oar::table::Optimizer::sgd(0.1));
    let connect = |trainer: u64| {
        let config =
            ClientConfig::new(vec![server.addr.clone()], "test", Duration::from_secs(5), Duration::from_secs(5));
        let mut c = Client::connect(&config.as_trainer(trainer)).unwrap();
        c.declare(&spec).unwrap();
        c
    };
    let (mut slow, mut fast) = (connect(0), connect(1));
    let ids = [7u64];
    let pull = |c: &mut Client, dense: &mut Vec<f32>| {
        let mut rows = [Vec::new()];
        c.pull(Some(dense), &[TableIds { table: 0, dim: 10, ids: &ids }], &mut rows, RowCreation::Create).unwrap()
    };
    let mut dense = Vec::new();
    let slow_version = pull(&mut slow, &mut dense);
    let grads = vec![0.01f32; dense.len()];
    let rows = [0.01f32; 10];
    let push = |c: &mut Client, trainer: usize, step: u64, version: u64| {
        let header = StepHeader { trainer, step, pass: 1, base_version: version, samples: 1, apply: Apply::Now };
        let r = c
            .push(
                &header,
                Some(&grads),
                &[TableGrads { table: 0, dim: 10, ids: &ids, counts: &[1.0, 0.0], grads: &rows }],
            )
            .unwrap();
        (r.discarded, r.staleness)
    };
    for step in 0..3 {
        let v = pull(&mut fast, &mut dense);
        assert_eq!(push(&mut fast, 1, step, v), (0, 0));
    }
    assert_eq!(push(&mut slow, 0, 0, slow_version), (1, 3), "3 updates behind with a limit of 2: discarded");
    let v = pull(&mut slow, &mut dense);
    assert_eq!(push(&mut slow, 0, 1, v), (0, 0), "a fresh push is applied");
    let stats = slow.stats().unwrap().remove(0);
    assert_eq!((stats.discarded, stats.version), (1, 4));
    // The server counted how stale each push arrived: four fresh ones, one 3 updates behind.
    assert_eq!(stats.staleness.0, [4, 0, 0, 1]);
}

/// `trainer_count` threads in async mode train Hogwild-style over the trainer's shared
/// connections: every sample is trained once, every thread's pushes reach the server, and the
/// model learns.
#[test]
fn trainer_count_threads_train_hogwild_in_async_mode() {
    let dir = tempfile::tempdir().unwrap();
    let (train, test) = gen_data(dir.path(), 2, 10_000, 4_000);
    let server = start_server(server_config(0, 1, 1, Mode::Async));
    let mut config = train_config(Mode::Async, std::slice::from_ref(&server), 0, 1, &train);
    config.threads = 3;
    config.test_files = oar::data::resolve_files(&test).unwrap();
    let report = run_trainers(vec![config]).remove(0);
    assert_eq!(report.samples, 20_000);
    let stats = server.handle.join().unwrap();
    // One update per batch of 32 (625 batches), whichever thread pushed it.
    assert_eq!(stats.version + stats.discarded, 625);
    let auc = report.passes[0].test.as_ref().unwrap().auc.unwrap();
    assert!(auc > 0.6, "test AUC {auc}: clearly above chance");
}

/// Flags override Paddle's variables; `is_local` trains in-process although the environment
/// names servers; `pipe_command` reads gzipped files through `zcat`, giving the same model.
#[test]
fn flags_override_the_environment_and_is_local_and_pipe_command_work() {
    let dir = tempfile::tempdir().unwrap();
    gen_data(dir.path(), 1, 2000, 0);
    let part = dir.path().join("train/part-00000");
    let train = part.display().to_string();
    let fleet = with(
        job_vars(dir.path()),
        &[
            ("TRAINING_ROLE", "TRAINER"),
            ("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:9"),
            ("PADDLE_TRAINERS_NUM", "2"),
            ("PADDLE_TRAINER_ID", "1"),
        ],
    );
    // The environment's 2 trainers, id 1, would fail "local mode runs one trainer".
    let out = command(&["train", "--is_local", "--trainers", "1", "--trainer_id", "0", "--train", &train], &fleet)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let plain = text(&out);
    let out = command(&["train", "--is_local", "--train", &train], &fleet).output().unwrap();
    assert!(text(&out).contains("local mode runs one trainer"), "{}", text(&out));

    let gz = dir.path().join("gz");
    std::fs::create_dir_all(&gz).unwrap();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("gzip -c {} > {}", train, gz.join("part-00000").display()))
        .status()
        .unwrap();
    assert!(status.success());
    let zipped = gz.join("part-00000").display().to_string();
    let out = command(
        &["train", "--is_local", "--trainers", "1", "--trainer_id", "0", "--pipe_command", "zcat", "--train", &zipped],
        &fleet,
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let last = |t: &str| t.lines().rfind(|l| l.starts_with("pass 1:")).unwrap().to_string();
    assert_eq!(last(&text(&out)), last(&plain), "the same model from the gzipped file");
}
