//! Bad frames, unknown places and unreachable servers end in clear errors, never hangs (missing
//! and lost trainers: `lost_trainers.rs`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::lost_trainers::trainer;
use crate::util::*;
use oar::client::{Client, ClientConfig, ClientError, StepHeader, TableIds};
use oar::protocol::Mode;
use oar::protocol::{
    read_frame_blocking, ErrorCode, FrameBuf, Hello, Push, Request, Response, RowCreation, PROTOCOL_VERSION,
};
use oar::server::ServerConfig;

/// Trainer `trainer`'s first push of one sample.
pub(crate) fn header(trainer: usize) -> StepHeader {
    StepHeader { trainer, step: 0, pass: 1, base_version: 0, samples: 1, apply: Default::default() }
}

/// Trainer 0's client.
fn client(addrs: &[String]) -> Client {
    let config = ClientConfig::new(addrs.to_vec(), "test", Duration::from_secs(5), Duration::from_secs(30));
    Client::connect(&config.as_trainer(0)).unwrap()
}

pub(crate) fn spec() -> oar::table::TableSpec {
    crate::util::criteo_model(&oar::model::ModelConfig { hidden: Some(vec![8]), ..Default::default() })
        .table_spec(oar::table::Optimizer::adam(1e-3), oar::table::Optimizer::adagrad(0.1))
}

/// Reads the server's reply to a bad frame, then expects the connection to be closed.
fn expect_error_then_close(mut s: TcpStream, what: &str) -> String {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = FrameBuf::default();
    let kind = read_frame_blocking(&mut s, &mut buf, 1 << 20).unwrap_or_else(|e| panic!("{what}: no error reply: {e}"));
    let reply = Response::decode(kind, buf.payload()).unwrap();
    let Response::Error { message, .. } = reply else { panic!("{what}: expected an error, got {reply:?}") };
    let mut rest = [0u8; 1];
    assert_eq!(s.read(&mut rest).unwrap(), 0, "{what}: the server must close the connection");
    message
}

#[test]
fn garbage_truncated_and_oversized_frames_leave_the_server_serving_others() {
    let server =
        start_server(ServerConfig { max_frame: 1 << 20, exit_when_done: false, ..server_config(0, 1, 1, Mode::Async) });
    let addr = server.addr.clone();
    let mut good = client(std::slice::from_ref(&addr));
    good.declare(&spec()).unwrap();

    // Garbage header (reserved bytes set).
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    let m = expect_error_then_close(s, "garbage");
    assert!(m.contains("malformed"), "{m}");

    // A frame larger than the server's maximum.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&[0, 0, 0, 0x10, 4, 0, 0, 0]).unwrap();
    let m = expect_error_then_close(s, "oversized");
    assert!(m.contains("exceeds the maximum"), "{m}");

    // A valid handshake followed by a push whose payload lies about its array length.
    let mut s = TcpStream::connect(&addr).unwrap();
    let hello =
        Hello { version: PROTOCOL_VERSION, job: "test".into(), num_servers: 1, server_index: 0, trainer: 0, epoch: 0 };
    s.write_all(&Request::Hello(hello).encode().to_vec()).unwrap();
    let mut buf = FrameBuf::default();
    read_frame_blocking(&mut s, &mut buf, 1 << 20).unwrap();
    let ones = [1.0; 4];
    let mut push = Request::Push(dense_push(0, &ones)).encode().to_vec();
    // The dense array's length follows seven u64 fields.
    push[8 + 56..8 + 64].copy_from_slice(&1_000_000u64.to_le_bytes());
    s.write_all(&push).unwrap();
    let m = expect_error_then_close(s, "lying length");
    assert!(m.contains("does not fit"), "{m}");

    // A truncated frame: the peer hangs up mid-payload.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&[100, 0, 0, 0, 1, 0, 0, 0, 1, 2, 3]).unwrap();
    drop(s);

    // A request before the handshake.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&Request::Stats.encode().to_vec()).unwrap();
    let mut buf = FrameBuf::default();
    let kind = read_frame_blocking(&mut s, &mut buf, 1 << 20).unwrap();
    assert!(matches!(Response::decode(kind, buf.payload()).unwrap(), Response::Error { .. }));

    // The well-behaved client is still served.
    let ids = [1u64, 2, 3];
    let mut rows = [Vec::new()];
    let mut dense = Vec::new();
    good.pull(Some(&mut dense), &[TableIds { table: 0, dim: 10, ids: &ids }], &mut rows, RowCreation::Create).unwrap();
    assert_eq!(rows[0].len(), 30);
    assert_eq!(good.stats().unwrap()[0].rows, vec![3]);
}

#[test]
fn a_handshake_for_another_job_or_layout_is_refused() {
    let server = start_server(ServerConfig { exit_when_done: false, ..server_config(0, 1, 1, Mode::Async) });
    let err = Client::connect(&ClientConfig::new(
        vec![server.addr.clone()],
        "another",
        Duration::from_secs(5),
        Duration::from_secs(5),
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(
        err.contains("job 'another' is not this server's job") && !err.contains("'test'"),
        "the server's own job is not told: {err}"
    );
    let err = Client::connect(&ClientConfig::new(
        vec![server.addr.clone(), server.addr.clone()],
        "test",
        Duration::from_secs(5),
        Duration::from_secs(5),
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains("server 0 of 2, but this is server 0 of 1"), "{err}");
}

#[test]
fn a_sync_step_missing_a_trainer_times_out_naming_it() {
    let server = start_server(ServerConfig {
        timeout: Duration::from_millis(300),
        // Not the never-arrived limit (it would stop the server first): the step's own timeout.
        exit_when_done: false,
        ..server_config(0, 1, 2, Mode::Sync)
    });
    let mut c = client(std::slice::from_ref(&server.addr));
    c.declare(&spec()).unwrap();
    let dense = vec![0.0; spec().dense.total()];
    let err = c.push(&header(0), Some(&dense), &[]).unwrap_err().to_string();
    assert!(err.contains("waiting for trainer(s) [1]"), "{err}");
    let err = c.barrier(0, 1).unwrap_err().to_string();
    assert!(err.contains("barrier 1") && err.contains("[1]"), "{err}");
}

#[test]
fn an_unreachable_server_is_named_after_the_timeout() {
    // A port that was free a moment ago: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr = format!("127.0.0.1:{port}");
    let started = std::time::Instant::now();
    let err = Client::connect(&ClientConfig::new(
        vec![addr.clone()],
        "test",
        Duration::from_millis(500),
        Duration::from_secs(5),
    ))
    .err()
    .unwrap()
    .to_string();
    assert!(err.contains(&format!("cannot reach server 0 at {addr}")), "{err}");
    assert!(started.elapsed() < Duration::from_secs(30), "the timeout must bound the wait");
}

/// Sends `hello` on a fresh connection and returns the server's error message (the connection
/// is then closed: a failed handshake ends it).
fn refused_hello(addr: &str, hello: Hello) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&Request::Hello(hello).encode().to_vec()).unwrap();
    expect_error_then_close(s, "bad hello")
}

/// A server that learns its place from the first handshake refuses one naming no place (zero
/// servers, or an index beyond the count) instead of keeping it and panicking at the next
/// declaration; a proper trainer then finds it healthy.
#[test]
fn a_handshake_naming_no_place_is_refused_and_leaves_the_server_healthy() {
    let server = start_server(ServerConfig { exit_when_done: false, ..server_config(0, 0, 1, Mode::Async) });
    for (num_servers, server_index) in [(0, 0), (2, 2)] {
        let hello =
            Hello { version: PROTOCOL_VERSION, job: "test".into(), num_servers, server_index, trainer: 0, epoch: 0 };
        let m = refused_hello(&server.addr, hello);
        assert!(m.contains("not a place in a job"), "{m}");
    }
    let mut c = client(std::slice::from_ref(&server.addr));
    c.declare(&spec()).unwrap();
    let mut dense = Vec::new();
    c.pull(Some(&mut dense), &[], &mut [], RowCreation::Create).unwrap();
    assert_eq!(dense.len(), spec().dense.total());
}

/// Close, end-of-pass, barrier and push act for one trainer: an id beyond the job's trainers is
/// refused (a `Close { trainer: 5 }` used to count toward "everyone closed" and end the job), as
/// is a trainer's connection acting for another trainer; a tool's connection (one that names no
/// trainer) may read but not declare, push, save or close; the refusal keeps the server's error
/// code, and the job then ends only when its real trainers close.
#[test]
fn requests_for_a_trainer_outside_the_job_or_another_trainer_are_refused() {
    // Job "oar", as `trainer` connects.
    let server = start_server(ServerConfig { job: "oar".into(), ..server_config(0, 1, 2, Mode::Async) });
    let config = ClientConfig::new(vec![server.addr.clone()], "oar", Duration::from_secs(5), Duration::from_secs(30));
    let mut tool = Client::connect(&config).unwrap();
    let state_error = |e: ClientError| match e {
        ClientError::Refused { code, message, .. } => {
            assert_eq!(code, ErrorCode::State, "{message}");
            message
        }
        other => panic!("expected a refusal, got {other}"),
    };
    let m = state_error(tool.declare(&spec()).unwrap_err());
    assert!(m.contains("a declaration refused: only this job's trainers (0..2)") && m.contains("a tool's"), "{m}");
    let (mut t0, mut t1) = (trainer(0, &server.addr), trainer(1, &server.addr));
    t0.declare(&spec()).unwrap();
    tool.attach(&spec());
    let m = state_error(tool.close(5).unwrap_err());
    assert!(m.contains("trainer 5 refused: this job has trainers 0..2"), "{m}");
    let m = state_error(tool.close(0).unwrap_err());
    assert!(m.contains("trainer 0 refused") && m.contains("a tool's"), "{m}");
    let m = state_error(tool.push(&header(0), None, &[]).unwrap_err());
    assert!(m.contains("trainer 0"), "{m}");
    let m = state_error(tool.save("/tmp/anywhere").unwrap_err());
    assert!(m.contains("a save refused"), "{m}");
    let mut rows = [Vec::new()];
    let ids = TableIds { table: 0, dim: 10, ids: &[1, 2] };
    let m = state_error(tool.pull(None, std::slice::from_ref(&ids), &mut rows, RowCreation::Create).unwrap_err());
    assert!(m.contains("a pull refused"), "{m}");
    tool.pull(None, &[ids], &mut rows, RowCreation::Peek).unwrap();
    assert_eq!(tool.stats().unwrap()[0].rows[0], 0, "the tool created no row");
    let m = state_error(t0.close(1).unwrap_err());
    assert!(m.contains("trainer 0's"), "{m}");
    t0.close(0).unwrap();
    assert!(!server.handle.is_finished(), "one of two trainers closed: the job goes on");
    t1.close(1).unwrap();
    server.handle.join().unwrap();
}

/// What a declaration or a pull from the network can make a server allocate is bounded by its
/// frame limit: a dense part too big for one reply and a pull whose reply would not fit are
/// refused with `TooLarge` before any allocation, and the server goes on serving.
#[test]
fn declarations_and_pulls_too_big_for_a_frame_are_refused_before_allocating() {
    let server =
        start_server(ServerConfig { max_frame: 1 << 20, exit_when_done: false, ..server_config(0, 1, 1, Mode::Async) });
    let mut c = client(std::slice::from_ref(&server.addr));
    let mut huge = spec();
    huge.dense.params[0].len = 1 << 40;
    let too_large = |e: ClientError| match e {
        ClientError::Refused { code, message, .. } => {
            assert_eq!(code, ErrorCode::TooLarge, "{message}");
            message
        }
        other => panic!("expected a refusal, got {other}"),
    };
    let m = too_large(c.declare(&huge).unwrap_err());
    assert!(m.contains("frame limit of 1 MiB"), "{m}");
    // Numbers whose share of blocks wrapped to 6 floats (and the budget to 4 bytes): the server
    // then asked for 6.7e18 bytes and aborted.
    let mut wrapping = spec();
    (wrapping.dense.params[0].len, wrapping.dense.block_size) = (16_909_515_400_900_422_315, 1_676_976_733_973_595_602);
    let m = too_large(c.declare(&wrapping).unwrap_err());
    assert!(m.contains("169095154009004223") && m.contains("frame limit"), "{m}");
    c.declare(&spec()).unwrap();
    // 30,000 rows of dim 10 are 1.2 MB of reply: over the 1 MiB limit.
    let ids: Vec<u64> = (0..30_000).collect();
    let mut rows = [Vec::new()];
    let m = too_large(
        c.pull(None, &[TableIds { table: 0, dim: 10, ids: &ids }], &mut rows, RowCreation::Create).unwrap_err(),
    );
    assert!(m.contains("pull fewer ids"), "{m}");
    assert_eq!(c.stats().unwrap()[0].rows, vec![0], "no row was created");
    c.pull(None, &[TableIds { table: 0, dim: 10, ids: &ids[..1000] }], &mut rows, RowCreation::Create).unwrap();
    assert_eq!(rows[0].len(), 10_000);
}

/// A `Save` names a folder over the network: the server writes only inside its save root (the
/// model's output folder), refusing a folder elsewhere or one that climbs out with `..`.
#[test]
fn a_save_outside_the_servers_save_root_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let server = start_server(ServerConfig {
        save_root: root.path().to_path_buf(),
        exit_when_done: false,
        ..server_config(0, 1, 1, Mode::Async)
    });
    let mut c = client(std::slice::from_ref(&server.addr));
    c.declare(&spec()).unwrap();
    let climbing = root.path().join("..").join(elsewhere.path().file_name().unwrap()).join("pass-0001");
    for dir in [elsewhere.path().join("pass-0001"), climbing] {
        let err = c.save(&dir.to_string_lossy()).unwrap_err().to_string();
        assert!(err.contains("not inside this server's --save-root"), "{err}");
    }
    assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0, "nothing written outside the root");
    let entries = c.save(&root.path().join("pass-0001").to_string_lossy()).unwrap();
    assert!(root.path().join("pass-0001").join(&entries[0].file).is_file());
}

/// Writes the fuzz targets' seed inputs (`fuzz/corpus/`): the frames of one training step
/// (declare, pull, push, commit, end of pass, barrier, save, stats, close) of a tiny model, together for
/// the server target and one by one for the decoder. Run by hand when the protocol changes:
/// `cargo test --release --test integration -- --ignored write_fuzz_seeds`.
#[test]
#[ignore]
fn write_fuzz_seeds() {
    use oar::protocol::{Apply, Declaration, DenseSelection, PushPart, SparseGrads, SparseIds};
    let model = oar::model::ModelConfig {
        slots: Some(2),
        embedding_dim: Some(2),
        dense_features: Some(1),
        hidden: Some(vec![2]),
        ..Default::default()
    };
    let spec = criteo_model(&model).table_spec(oar::table::Optimizer::adam(1e-3), oar::table::Optimizer::adagrad(0.1));
    let dense = vec![0.5f32; spec.dense.total()];
    let frames = [
        Request::Declare(Declaration { spec, model: serde_json::Value::Null, calendar: Vec::new() }),
        Request::Pull(oar::protocol::Pull {
            dense: DenseSelection::All,
            create: RowCreation::Create,
            sparse: vec![SparseIds { table: 0, ids: vec![1, 2, 3].into() }],
        }),
        Request::Push(Push {
            trainer: 0,
            step: 0,
            pass: 1,
            base_version: 0,
            samples: 2,
            part: PushPart::Whole,
            apply: Apply::Merged,
            dense: vec![dense.into()],
            sparse: vec![SparseGrads {
                table: 0,
                ids: vec![1, 2].into(),
                counts: vec![1.0, 1.0, 2.0, 0.0].into(),
                grads: vec![0.1; 4].into(),
            }],
        }),
        Request::Commit { trainer: 0, step: 0 },
        Request::EndPass { trainer: 0, pass: 1 },
        Request::Barrier { trainer: 0, epoch: 1 },
        Request::Save { dir: "seed-save".into() },
        Request::Stats,
        Request::PassAuc { trainer: 0, pass: 1, pos: vec![1; 8].into(), neg: vec![2; 8].into(), sums: [0.0; 3] },
        Request::GlobalAuc { pass: 1 },
        Request::Shrink { days: 1, day_end: 1 },
        Request::Export { dir: "seed-export".into(), kind: oar::protocol::ExportKind::Delta },
        Request::Close { trainer: 0 },
    ]
    .map(|r| r.encode().to_vec());
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    std::fs::create_dir_all(fuzz.join("server_requests")).unwrap();
    std::fs::create_dir_all(fuzz.join("frame_decode")).unwrap();
    std::fs::write(fuzz.join("server_requests/seed-training-step"), frames.concat()).unwrap();
    for (k, f) in frames.iter().enumerate() {
        std::fs::write(fuzz.join(format!("frame_decode/seed-{k}")), f).unwrap();
    }
}

/// `server::run` can be handed to `tokio::spawn` (the fuzz target does): its future is Send.
#[test]
fn the_server_future_is_send() {
    fn spawnable<T: Send + 'static>(_: T) {}
    spawnable(oar::server::run(Vec::new(), server_config(0, 1, 1, Mode::Async), std::future::pending::<()>()));
}

/// A peer posing as a server that announces a 256 MiB reply and then sends a byte every 50 ms
/// cannot hold a client: the whole reply must come within the reply timeout (each read's
/// socket timeout alone was reset by every byte, and `oar shrink --timeout 3` was still
/// waiting at 30 s with 256 MiB set aside for the announced frame).
#[test]
fn a_peer_trickling_a_reply_is_cut_off_at_the_reply_timeout() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let fake = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        // A frame header claiming 256 MiB, then a byte at a time until the client hangs up
        // (or a minute passes, far beyond the client's 2 s).
        s.write_all(&[0, 0, 0, 0x10, 4, 0, 0, 0]).unwrap();
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while std::time::Instant::now() < until && s.write_all(&[0]).is_ok() {
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let out = oar(&["shrink", "--servers", &addr, "--job", "test", "--timeout", "2"]);
    // Status 3: the server was lost (a timed-out reply counts as one).
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    assert!(text(&out).contains("no whole reply within 2s"), "{}", text(&out));
    fake.join().unwrap();
}

/// A peer posing as a server that answers a pull with rows of another count (fewer, more, a
/// count past its frame, or rows of two tables for one) poisons nothing: the client names the
/// fault. Rows of the count asked are read from the socket straight into the caller's array
/// (`protocol/placed.rs`); rows of another count are never placed, so that array keeps its
/// zeros, and a reply refused after its rows were placed (two tables) leaves them there, as a
/// failed pull leaves its arrays unspecified.
#[test]
fn a_pull_reply_with_rows_of_another_count_is_refused_clearly() {
    let spec = spec();
    let dim = spec.sparse[0].dim;
    let ids = [1u64, 2, 3];
    let values = |tables: &[Vec<f32>]| oar::protocol::encode_values(1, &[Vec::<f32>::new()], tables).to_vec();
    let mut past_the_frame = values(&[vec![0.5; 3 * dim]]);
    // The header, the version, the empty dense array's count and the count of tables: then the
    // table's count, made far larger than the frame.
    past_the_frame[32..40].copy_from_slice(&(u64::MAX / 4).to_le_bytes());
    let cases = [
        (values(&[vec![0.5; 2 * dim]]), format!("{} floats instead of {}", 2 * dim, 3 * dim), 0.0),
        (values(&[vec![0.5; 4 * dim]]), format!("{} floats instead of {}", 4 * dim, 3 * dim), 0.0),
        (past_the_frame, "does not fit".to_string(), 0.0),
        (values(&[vec![0.5; 3 * dim], vec![0.5; 3 * dim]]), "2 tables instead of 1".to_string(), 0.5),
    ];
    for (reply, says, left) in cases {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let fake = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = FrameBuf::default();
            read_frame_blocking(&mut s, &mut buf, 1 << 20).unwrap();
            let welcome = Response::Welcome { server_index: 0, num_servers: 1, epoch: 0 };
            oar::protocol::write_frame_blocking(&mut s, &welcome.encode()).unwrap();
            read_frame_blocking(&mut s, &mut buf, 1 << 20).unwrap();
            s.write_all(&reply).unwrap();
            // Open until the client hangs up.
            let _ = s.read(&mut [0u8; 1]);
        });
        let mut c =
            Client::connect(&ClientConfig::new(vec![addr], "test", Duration::from_secs(5), Duration::from_secs(5)))
                .unwrap();
        c.attach(&spec);
        let mut rows = [Vec::new()];
        let tables = [TableIds { table: 0, dim, ids: &ids }];
        let e = c.pull(None, &tables, &mut rows, RowCreation::Peek).unwrap_err().to_string();
        assert!(e.contains(&says), "{says}: {e}");
        assert_eq!(rows[0].len(), ids.len() * dim);
        assert!(rows[0].iter().all(|&v| v == left), "{says}: {:?}", rows[0]);
        drop(c);
        fake.join().unwrap();
    }
}

/// A push whose show and click counts hold a negative count or a NaN, wherever it lies among
/// them (the server tests them in blocks of 64 floats and a rest), is refused before it
/// touches the model: counted at the server, nothing was applied.
#[test]
fn a_push_with_a_negative_or_nan_count_anywhere_is_refused_and_applies_nothing() {
    let (mut server, addr) =
        pserver_ready(&["--trainers", "1", "--mode", "async", "--job", "test"], std::process::Stdio::null());
    let addrs = [addr];
    let spec = spec();
    let dim = spec.sparse[0].dim;
    let ids: Vec<u64> = (0..100).collect();
    let grads = vec![0.01f32; ids.len() * dim];
    // Trainer 0's first connection stays open: the server fails once its last one goes.
    let mut first = client(&addrs);
    first.declare(&spec).unwrap();
    let negative = "a negative show or click count";
    for (bad, at, says) in [
        (-1.0f32, 0, negative),
        (-1.0, 63, negative),
        (-0.5, 130, negative),
        (-1e-30, 199, negative),
        (f32::NAN, 70, oar::table::NOT_PUSHABLE),
        (f32::NAN, 199, oar::table::NOT_PUSHABLE),
    ] {
        // A fresh connection each: a client that met a refusal does not read its other replies.
        let mut c = client(&addrs);
        c.attach(&spec);
        let mut counts = vec![1.0f32; ids.len() * 2];
        counts[at] = bad;
        let g = oar::client::TableGrads { table: 0, dim, ids: &ids, counts: &counts, grads: &grads };
        let e = c.push(&header(0), None, &[g]).unwrap_err().to_string();
        assert!(e.contains(says), "{bad} at {at}: {e}");
    }
    let stats = first.stats().unwrap();
    assert_eq!((stats[0].version, stats[0].keys_pushed, stats[0].rows[0]), (0, 0, 0));
    server.kill().unwrap();
    server.wait().unwrap();
}
