//! Lost and missing trainers: a server names the trainer it waits for and fails after its
//! timeout, a trainer asks a refused wait again within its recovery window, and one restarted
//! mid-step counts once.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use crate::robustness::{header, spec};
use crate::util::*;
use oar::client::{Client, ClientConfig, ClientError, StepHeader, TableGrads, TableIds};
use oar::protocol::{read_frame_blocking, FrameBuf, Hello, Request, Response, RowCreation, PROTOCOL_VERSION};

/// Starts `oar pserver` for 2 trainers with a 2 s timeout; returns it and its address.
fn pserver_for_two(mode: &str) -> (std::process::Child, String) {
    pserver_for_two_with(mode, &[])
}

/// [`pserver_for_two`] with `extra` flags.
fn pserver_for_two_with(mode: &str, extra: &[&str]) -> (std::process::Child, String) {
    pserver_for_two_at("0", &[&["--mode", mode][..], extra].concat())
}

/// `oar pserver` for 2 trainers with a 2 s timeout, at `port` (0: any), with `flags`.
fn pserver_for_two_at(port: &str, flags: &[&str]) -> (std::process::Child, String) {
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_oar"));
    server.args(["pserver", "--host", "127.0.0.1", "--port", port, "--num_gradient_servers", "2", "--timeout", "2"]);
    server_ready(server.args(flags).stderr(std::process::Stdio::piped()))
}

pub(crate) fn trainer(id: u64, addr: &str) -> Client {
    trainer_within(id, addr, None, 0)
}

/// Trainer `id` with the recovery window `recover` (`None`: none), using `sparse_ports` ports
/// after the server's first for its rows.
fn trainer_within(id: u64, addr: &str, recover: Option<Duration>, sparse_ports: usize) -> Client {
    let config = ClientConfig {
        trainer: Some(id),
        recover,
        ports_num_for_sparse: sparse_ports,
        ..ClientConfig::new(vec![addr.to_string()], "oar", Duration::from_secs(5), Duration::from_secs(30))
    };
    Client::connect(&config).unwrap()
}

/// A server told to exit when its trainers are done does not wait forever for one that never
/// comes: after --timeout it fails, naming it (trainer 0 arrived through its handshake).
#[test]
fn a_server_names_the_trainer_that_never_connected_and_exits() {
    let (server, addr) = pserver_for_two("async");
    let _trainer0 = trainer(0, &addr);
    let out = server.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("trainer(s) [1] of 2 never connected within 2s"), "{err}");
}

/// A trainer that disconnects without closing (crashed, killed) fails the server at once
/// instead of leaving it waiting for that trainer's close.
#[test]
fn a_trainer_lost_without_closing_fails_the_server() {
    let (server, addr) = pserver_for_two("async");
    let mut t0 = trainer(0, &addr);
    t0.declare(&spec()).unwrap();
    let t1 = trainer(1, &addr);
    drop(t1);
    let out = server.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    // Stopped by a lost peer, not failed on its own: status 3 (`oar::base::exit::PEER_LOST`).
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("trainer 1 disconnected without closing"), "{err}");
}

/// With --trainer-rejoin, a trainer lost without closing may come back (a supervisor restarted
/// it). Its first life died with its sync push pending (the other trainer had not pushed): the
/// server cannot see that connection end while the push waits; the restart sends the same step
/// again, which takes the first copy's place: the step counts it once, and the job ends
/// normally.
#[test]
fn a_trainer_restarted_with_its_sync_push_pending_counts_once_and_the_job_ends() {
    let (mut server, addr) = pserver_for_two_with("sync", &["--trainer-rejoin", "60"]);
    let stderr = server.stderr.take().unwrap();
    let log = std::thread::spawn(move || std::io::read_to_string(stderr).unwrap());
    let mut t0 = trainer(0, &addr);
    t0.declare(&spec()).unwrap();
    let dense = vec![0.0f32; spec().dense.total()];

    let mut first_life = TcpStream::connect(&addr).unwrap();
    let hello =
        Hello { version: PROTOCOL_VERSION, job: "oar".into(), num_servers: 1, server_index: 0, trainer: 1, epoch: 0 };
    first_life.write_all(&Request::Hello(hello).encode().to_vec()).unwrap();
    let mut buf = FrameBuf::default();
    let kind = read_frame_blocking(&mut first_life, &mut buf, 1 << 20).unwrap();
    assert!(matches!(Response::decode(kind, buf.payload()).unwrap(), Response::Welcome { .. }));
    let push = dense_push(1, &dense);
    first_life.write_all(&Request::Push(push).encode().to_vec()).unwrap();
    let mut tool =
        Client::connect(&ClientConfig::new(vec![addr.clone()], "oar", Duration::from_secs(5), Duration::from_secs(30)))
            .unwrap();
    while tool.stats().unwrap()[0].pushes < 1 {
        std::thread::yield_now(); // until the server holds the push
    }
    drop(first_life);

    let mut t1 = trainer(1, &addr);
    t1.declare(&spec()).unwrap();
    let again = dense.clone();
    let second_life = std::thread::spawn(move || t1.push(&header(1), Some(&again), &[]).map(|_| t1));
    t0.push(&header(0), Some(&dense), &[]).unwrap();
    let mut t1 = second_life.join().unwrap().expect("the restart's push is served, not refused as a second one");
    let stats = tool.stats().unwrap().remove(0);
    assert_eq!(stats.version, 1, "one update from the step");
    // Three pushes of the whole dense vector arrived (one of them dropped unapplied).
    assert_eq!((stats.pushes, stats.push_bytes), (3, 3 * 4 * dense.len() as u64));
    t0.close(0).unwrap();
    t1.close(1).unwrap();
    let status = server.wait().unwrap();
    let log = log.join().unwrap();
    assert!(status.success(), "{log}");
    assert_eq!(stats.applied_samples, vec![1, 1], "each trainer's step applied once: {log}");
    // Whichever reached the server first: the restart's copy took the first one's place in the
    // waiting step, or trainer 0's push completed the step and the copy was a repeat.
    assert!(stats.repeats <= 1, "{stats:?}");
}

/// A sync `oar pserver` (2 s timeout; with `sparse_port`, a second port for rows only) and its
/// two trainers, declared: trainer 0 with the recovery window `window`, trainer 1 without.
fn sync_pair(window: Duration, sparse_port: bool) -> (std::process::Child, String, Client, Client) {
    let (server, addr) = if sparse_port {
        let port = free_ports(2).to_string();
        pserver_for_two_at(&port, &["--mode", "sync", "--ports_num_for_sparse", "1"])
    } else {
        pserver_for_two("sync")
    };
    let sparse_ports = usize::from(sparse_port);
    let mut t0 = trainer_within(0, &addr, Some(window), sparse_ports);
    t0.declare(&spec()).unwrap();
    let mut t1 = trainer_within(1, &addr, None, sparse_ports);
    t1.declare(&spec()).unwrap();
    (server, addr, t0, t1)
}

/// A trainer with a recovery window, waiting in a sync step for another trainer that is late
/// (here: has not pushed yet; in a job, one recovering a lost server), is refused when the
/// server's --timeout (2 s) ends, and asks again while its window lasts: the step completes
/// when the other pushes, and the server counts each trainer's sample once. Before, the
/// refusal failed the trainer at once, though the one it waited for was on its way back.
#[test]
fn a_sync_step_past_the_servers_timeout_is_asked_again_within_the_recovery_window() {
    asks_a_sync_step_again(false);
}

/// The same with the push split in two halves (dense on the first port, rows on a sparse-only
/// one), each refused: both refusals are read before the push is sent again, so the next
/// step's halves and a pull's rows are answered in turn on each port.
#[test]
fn a_split_sync_push_past_the_servers_timeout_is_asked_again_on_both_ports() {
    asks_a_sync_step_again(true);
}

/// Pushes `dense` and one row of table 0.
fn push_with_a_row(t: &mut Client, header: &StepHeader, dense: &[f32]) -> Result<(), ClientError> {
    let dim = spec().sparse[0].dim;
    let grads = vec![0.0f32; dim];
    t.push(header, Some(dense), &[TableGrads { table: 0, dim, ids: &[7], counts: &[1.0, 0.0], grads: &grads }])?;
    Ok(())
}

fn asks_a_sync_step_again(sparse_port: bool) {
    let (server, addr, mut t0, mut t1) = sync_pair(Duration::from_secs(60), sparse_port);
    let dense = vec![0.0f32; spec().dense.total()];
    let d = dense.clone();
    let waiting = std::thread::spawn(move || push_with_a_row(&mut t0, &header(0), &d).map(|_| t0));
    let mut tool =
        Client::connect(&ClientConfig::new(vec![addr.clone()], "oar", Duration::from_secs(5), Duration::from_secs(30)))
            .unwrap();
    // Until trainer 0's push (one frame, or two halves) arrives a second time: refused after
    // the timeout and asked again (or until its call ends, which fails the test below).
    let frames = if sparse_port { 2 } else { 1 };
    while tool.stats().unwrap()[0].pushes < 2 * frames && !waiting.is_finished() {
        std::thread::yield_now();
    }
    if waiting.is_finished() {
        let ended = waiting.join().unwrap().err();
        panic!("trainer 0's push ended before trainer 1 pushed: {ended:?}");
    }
    push_with_a_row(&mut t1, &header(1), &dense).unwrap();
    let mut t0 = waiting.join().unwrap().expect("the step completes once trainer 1 pushes");
    // A pull and a second step on the same connections: every port answers its own request.
    for t in [&mut t0, &mut t1] {
        let (mut all, mut pulled) = (Vec::new(), vec![Vec::new()]);
        let rows = [TableIds { table: 0, dim: spec().sparse[0].dim, ids: &[7] }];
        t.pull(Some(&mut all), &rows, &mut pulled, RowCreation::Create).unwrap();
    }
    let second = |t: usize| StepHeader { step: 1, base_version: 1, ..header(t) };
    let d = dense.clone();
    let next = std::thread::spawn(move || push_with_a_row(&mut t0, &second(0), &d).map(|_| t0));
    push_with_a_row(&mut t1, &second(1), &dense).unwrap();
    let mut t0 = next.join().unwrap().unwrap();
    let stats = tool.stats().unwrap().remove(0);
    assert_eq!(stats.version, 2, "one update from each step");
    assert_eq!(stats.applied_samples, vec![2, 2], "each trainer's steps applied once");
    t0.close(0).unwrap();
    t1.close(1).unwrap();
    let out = server.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
}

/// Past its window, the trainer stops with the server's refusal, which names the trainer it
/// waited for, and how long it asked again.
#[test]
fn a_barrier_still_refused_after_the_recovery_window_names_the_missing_trainer() {
    let err = refused_barrier(Duration::from_millis(500));
    assert!(err.contains("; asked again for "), "{err}");
    assert!(err.contains("s, past the recovery window of 500ms (--recover-timeout)"), "{err}");
}

/// A window of 0 (`--recover-timeout 0`) is no window: the refusal comes back as the server gave
/// it, not asked again (before, the trainer said it would ask again "for up to 0ns").
#[test]
fn a_recovery_window_of_zero_returns_the_servers_refusal_as_it_came() {
    let err = refused_barrier(Duration::ZERO);
    assert!(!err.contains("asked again") && !err.contains("recovery window"), "{err}");
}

/// Trainer 0, with the recovery window `window`, meets trainer 1 (which never comes) at a
/// barrier: the refusal, which must name trainer 1. Both then close and the server ends well.
fn refused_barrier(window: Duration) -> String {
    let (server, _, mut t0, mut t1) = sync_pair(window, false);
    let err = t0.barrier(0, 1).unwrap_err().to_string();
    assert!(err.contains("barrier 1 timed out after 2s waiting for trainer(s) [1]"), "{err}");
    t0.close(0).unwrap();
    t1.close(1).unwrap();
    let out = server.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    err
}

/// A real `oar train` whose server gave up waiting for the other trainer (a sync step past the
/// server's `--timeout`, then past the trainer's recovery window) stopped for that trainer, not
/// on its own error: exit status 3, so a launcher names the missing trainer first and may
/// restart this one (before: status 1, "not restarted").
#[test]
fn a_trainer_refused_for_a_missing_trainer_exits_as_a_peer_lost() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 200, 10);
    let (mut server, addr) = pserver_for_two("sync");
    // Trainer 1 connects and then never pushes.
    let t1 = trainer(1, &addr);
    let out = oar(&[
        "train",
        "--mode",
        "sync",
        "--servers",
        &addr,
        "--trainers",
        "2",
        "--trainer-id",
        "0",
        "--hidden",
        "8",
        "--recover-timeout",
        "0.5",
        "--train",
        train.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("waiting for trainer(s) [1]") && err.contains("past the recovery window"), "{err}");
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    drop(t1);
    server.kill().unwrap();
    server.wait().unwrap();
}

/// `--trainer-rejoin 0` waits for no lost trainer: the server fails at once, said as a server
/// without a window says it (before: "did not come back within 0ns").
#[test]
fn a_trainer_rejoin_of_zero_fails_the_server_as_without_a_window() {
    let (server, addr) = pserver_for_two_with("async", &["--trainer-rejoin", "0"]);
    trainer_1_goes_and_the_server_fails_saying(server, &addr, "trainer 1 disconnected without closing (it failed or");
}

/// A lost trainer that does not come back within --trainer-rejoin fails the server, naming it.
#[test]
fn a_lost_trainer_that_does_not_come_back_in_time_fails_the_server_naming_it() {
    let (server, addr) = pserver_for_two_with("async", &["--trainer-rejoin", "0.5"]);
    waits_half_a_second_for_trainer_1(server, &addr);
}

/// Trainer 0 declares, trainer 1 connects and goes without closing: the server, which must
/// wait half a second for it, then fails naming it.
fn waits_half_a_second_for_trainer_1(server: std::process::Child, addr: &str) {
    let says = "trainer 1 disconnected without closing and did not come back within 500ms";
    trainer_1_goes_and_the_server_fails_saying(server, addr, says);
}

/// Trainer 0 declares, trainer 1 connects and goes without closing: the server fails as a peer
/// lost (exit 3), saying `says`.
fn trainer_1_goes_and_the_server_fails_saying(server: std::process::Child, addr: &str, says: &str) {
    let mut t0 = trainer(0, addr);
    t0.declare(&spec()).unwrap();
    drop(trainer(1, addr));
    let out = server.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains(says), "{err}");
}

/// Under `oar train` in a server role (Paddle's variables, as a Fleet job starts every process),
/// the job's recovery window is also how long the server waits for a trainer lost without
/// closing: a cut link costs each side the other, and a trainer that waits for its server must
/// find the server waiting for it. Without the window the server fails at once (above).
#[test]
fn a_server_role_of_oar_train_waits_the_jobs_recovery_window_for_a_lost_trainer() {
    let vars = [
        ("TRAINING_ROLE", "PSERVER"),
        ("POD_IP", "127.0.0.1"),
        ("PADDLE_PORT", "0"),
        ("PADDLE_PSERVERS_IP_PORT_LIST", "127.0.0.1:0"),
        ("PADDLE_TRAINERS_NUM", "2"),
        ("OAR_MODE", "async"),
        ("OAR_TIMEOUT", "2"),
        ("OAR_RECOVER_TIMEOUT", "0.5"),
    ];
    let (server, addr) = server_ready(
        std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
            .arg("train")
            .env_clear()
            .envs(vars)
            .stderr(std::process::Stdio::piped()),
    );
    waits_half_a_second_for_trainer_1(server, &addr);
}

/// Under mpirun or srun (`--num-servers`, the role from the engine's rank), a server rank waits
/// the job's recovery window for a lost trainer as the other server roles do. Here rank 0 is
/// `oar train`'s server; the test itself is ranks 1 and 2, the trainers, at the rendezvous.
#[test]
fn an_engine_rank_server_waits_the_jobs_recovery_window_for_a_lost_trainer() {
    let rendezvous = format!("127.0.0.1:{}", free_ports(1));
    let flags = ["train", "--num-servers", "1", "--rendezvous", &rendezvous, "--mode", "async"];
    let server = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(flags)
        .args(["--timeout", "5", "--recover-timeout", "0.5"])
        .env_clear()
        .env("OMPI_COMM_WORLD_RANK", "0")
        .env("OMPI_COMM_WORLD_SIZE", "3")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let ranks: Vec<_> = (1..3)
        .map(|rank| {
            let at = rendezvous.clone();
            std::thread::spawn(move || {
                let me = oar::run::rendezvous::Rank { rank, size: 3, source: "the test" };
                oar::run::rendezvous::register(&at, me, &|_| String::new(), Duration::from_secs(30), None, "oar")
            })
        })
        .collect();
    let lists: Vec<Vec<String>> = ranks.into_iter().map(|r| r.join().unwrap().unwrap()).collect();
    assert_eq!(lists[0], lists[1]);
    waits_half_a_second_for_trainer_1(server, &lists[0][0]);
}
