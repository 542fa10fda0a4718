//! A peer that can reach a server's port: with the job's secret set it gets nothing (no request
//! served, nothing of the job told) and the job it attacks ends as it would have; without one,
//! it still cannot pin memory before a handshake, hold every connection, make a server allocate
//! gigabytes, or poison the model with a NaN.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::util::*;
use oar::client::{Client, ClientConfig, StepHeader};
use oar::protocol::ServerStats;
use oar::protocol::{auth, read_frame_blocking, FrameBuf, Hello, Request, Response, PROTOCOL_VERSION};
use oar::security::auth::{Identity, Secret};

pub(crate) const JOB: &str = "guarded-job-7f3a";

/// The reply to what a hostile peer sent on `s`: the error message (the server then closes).
fn refusal(mut s: TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut buf = FrameBuf::default();
    let kind = read_frame_blocking(&mut s, &mut buf, 1 << 20).expect("an answer");
    let Response::Error { message, .. } = Response::decode(kind, buf.payload()).unwrap() else { panic!("served") };
    let mut rest = [0u8; 1];
    assert_eq!(s.read(&mut rest).unwrap_or(0), 0, "closed after the refusal");
    message
}

/// Everything a peer without the secret might try against `addr`; each must be refused
/// without a word of the job.
fn attack(addr: &str) {
    let hello = |epoch| Hello {
        version: PROTOCOL_VERSION,
        job: JOB.into(),
        num_servers: 2,
        server_index: 0,
        trainer: 1,
        epoch,
    };
    let mut attempts: Vec<(&str, Vec<u8>)> = vec![
        // The job id is known: a Hello claiming a newer epoch would stop a server without a secret.
        ("a Hello claiming a newer epoch", Request::Hello(hello(1 << 40)).encode().to_vec()),
        ("a Close for trainer 0", Request::Close { trainer: 0 }.encode().to_vec()),
        ("a Stats request", Request::Stats.encode().to_vec()),
        // A frame header announcing 256 MiB.
        ("an oversized frame", (256u32 << 20).to_le_bytes().into_iter().chain([4, 0, 0, 0]).collect()),
    ];
    for (what, bytes) in attempts.drain(..) {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&bytes).unwrap();
        let m = refusal(s);
        assert!(m.contains("authentication required"), "{what}: {m}");
        assert!(!m.contains(JOB), "{what}: the job is not told: {m}");
    }
    // The challenge answered with another secret's proof.
    let mut s = TcpStream::connect(addr).unwrap();
    let ours = oar::security::auth::nonce();
    s.write_all(&auth::hello(&ours, Identity::Master, 0)).unwrap();
    let mut buf = FrameBuf::default();
    assert_eq!(read_frame_blocking(&mut s, &mut buf, 1 << 10).unwrap(), auth::AUTH_CHALLENGE);
    let (server, epoch, _) = auth::parse_challenge(buf.payload()).unwrap();
    let claim = oar::security::auth::Claim { job: JOB, identity: Identity::Master, server: 0, epoch };
    s.write_all(&auth::proof(&Secret::generate().client_proof(&claim, &server, &ours).unwrap())).unwrap();
    let m = refusal(s);
    assert_eq!(m, "authentication failed");
    // A client with another secret finds the server cannot prove it holds its secret.
    let config = ClientConfig {
        secret: Some(Secret::generate()),
        ..ClientConfig::new(vec![addr.to_string(); 2], JOB, Duration::from_secs(5), Duration::from_secs(5))
    };
    let err = Client::connect(&config).map(drop).unwrap_err().to_string();
    assert!(err.contains("the server did not prove it is server 0 of job"), "{err}");
    // Idle connections that never speak are closed after the handshake timeout.
    let idle: Vec<TcpStream> = (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
    idle.into_iter().for_each(closed_by_the_server);
}

/// What runs against the servers' addresses while the job is held mid-run.
pub(crate) type Attack = dyn Fn(&[String]);

/// Waits for the server to close `s` (whatever it says first), failing after 20 s.
fn closed_by_the_server(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    match s.read_to_end(&mut Vec::new()) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the server did not close an idle connection: {e}"),
    }
}

/// A 2 x 2 sync job whose processes share a secret (see [`GuardedJob::run`]).
pub(crate) struct GuardedJob {
    dir: PathBuf,
    train: PathBuf,
    secret: PathBuf,
    ports: u16,
}

impl GuardedJob {
    pub(crate) fn new(dir: &Path, train: &Path, secret: &Path) -> GuardedJob {
        GuardedJob { dir: dir.into(), train: train.into(), secret: secret.into(), ports: free_ports(2) }
    }

    pub(crate) fn addrs(&self) -> Vec<String> {
        (0..2).map(|k| format!("127.0.0.1:{}", self.ports + k)).collect()
    }

    /// Runs the 2 x 2 sync job; `during` runs while trainer 0 is stopped at its step 5.
    pub(crate) fn run(&self, during: Option<&Attack>) -> Vec<ServerStats> {
        let s = |v: &[&str]| v.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        let (secret, out) = (self.secret.display().to_string(), self.dir.join("out").display().to_string());
        let mut children = Vec::new();
        for k in 0..2u16 {
            let (port, index) = ((self.ports + k).to_string(), k.to_string());
            let args = s(&["pserver", "--host", "127.0.0.1", "--port", &port, "--index", &index, "--num-servers", "2"]);
            let more =
                s(&["--trainers", "2", "--mode", "sync", "--job", JOB, "--secret-file", &secret, "--save-root", &out]);
            let more2 = s(&["--handshake-timeout", "1"]);
            children.push((
                format!("server.{k}.log"),
                spawn_oar(&self.dir, &[args, more, more2].concat(), "", &format!("server.{k}.log")),
            ));
        }
        let servers = self.addrs().join(",");
        let train = self.train.display().to_string();
        for k in 0..2 {
            let id = k.to_string();
            let args = s(&["train", "--servers", &servers, "--trainers", "2", "--trainer-id", &id, "--mode", "sync"]);
            let more = s(&[
                "--job",
                JOB,
                "--secret-file",
                &secret,
                "--train",
                &train,
                "--output",
                &out,
                "--batch-size",
                "200",
            ]);
            let fault = if k == 0 && during.is_some() { "trainer0:stop@step=5" } else { "" };
            let log = format!("worker.{k}.log");
            children
                .push((log.clone(), spawn_oar(&self.dir, &[args, more, s(&["--hidden", "16"])].concat(), fault, &log)));
        }
        if let Some(during) = during {
            let secret = Secret::read(&self.secret).unwrap();
            let stats = || {
                let config = ClientConfig {
                    secret: Some(secret.clone()),
                    ..ClientConfig::new(self.addrs(), JOB, Duration::from_secs(5), Duration::from_secs(5))
                };
                Client::connect(&config).and_then(|mut c| c.stats()).unwrap_or_default()
            };
            // Trainer 0 stops itself after its 5th step: trainer 1's 6th push waits for it.
            wait_until(60, "trainer 0 stopped mid-job", || stats().iter().all(|s| s.version == 5 && s.pushes == 11));
            during(&self.addrs());
            // SAFETY: signalling our own child process.
            assert_eq!(unsafe { libc::kill(children[2].1.id() as i32, libc::SIGCONT) }, 0);
        }
        let mut stats = Vec::new();
        for (log, mut child) in children {
            let status = child.wait().unwrap();
            let text = std::fs::read_to_string(self.dir.join(&log)).unwrap();
            assert!(status.success(), "{log}:\n{text}");
            if let Some(line) =
                text.lines().find_map(|l| l.strip_prefix("OAR_RESULT ")).filter(|_| log.starts_with("server"))
            {
                stats.push(serde_json::from_str(line).unwrap());
            }
        }
        stats
    }
}

/// A 2 x 2 sync job whose processes share a secret, attacked mid-run by a peer without it on
/// both servers: every attempt is refused without a word of the job, no request of it is
/// served (the servers count exactly the requests of an undisturbed run) and the model is the
/// undisturbed run's bit for bit.
#[test]
fn with_a_secret_a_peer_without_it_gets_nothing_and_the_job_ends_undisturbed() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(&dir.path().join("data"), 2, 3000, 0);
    let secret = dir.path().join("secret");
    Secret::generate().write_new(&secret).unwrap();
    let (attacked, clean) = (dir.path().join("attacked"), dir.path().join("clean"));
    std::fs::create_dir_all(&attacked).unwrap();
    std::fs::create_dir_all(&clean).unwrap();
    let stats =
        GuardedJob::new(&attacked, &train, &secret).run(Some(&|addrs: &[String]| addrs.iter().for_each(|a| attack(a))));
    let undisturbed = GuardedJob::new(&clean, &train, &secret).run(None);
    // What the servers did is what they did undisturbed (the test's own stats reads aside).
    let work = |s: &[ServerStats]| {
        s.iter()
            .map(|s| (s.version, s.pulls, s.pushes, s.keys_pulled, s.keys_pushed, s.applied_samples.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(work(&stats), work(&undisturbed));
    assert_same_params(&load_params(&attacked.join("out")), &load_params(&clean.join("out")), 0.0);
    let log = std::fs::read_to_string(attacked.join("server.0.log")).unwrap();
    assert!(!log.contains("has no secret"), "{log}");
}

/// A server process killed and reaped when dropped, so a failing test leaves none behind
/// (`--keep-serving` servers never end by themselves).
struct Server(Child);

impl std::ops::Deref for Server {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn pserver(extra: &[&str]) -> (Server, String) {
    use std::io::BufRead;
    let mut server = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["pserver", "--host", "127.0.0.1", "--port", "0", "--index", "0", "--num-servers", "1", "--keep-serving"])
        .args(["--job", "open"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    (Server(server), line.trim().strip_prefix("OAR_READY ").unwrap().to_string())
}

pub(crate) fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    kb >> 10
}

/// Without a secret: frames announcing 256 MiB before a handshake pin nothing, connections
/// beyond `--max-connections` are refused with a clear error (and a slot frees when an idle
/// one times out), a small declaration of a huge table is refused before allocating, and a
/// push holding a NaN is refused before it touches the model.
#[test]
fn without_a_secret_a_peer_cannot_pin_memory_hold_every_connection_or_poison_the_model() {
    let (mut server, addr) = pserver(&["--max-connections", "8", "--handshake-timeout", "3"]);
    let pid = server.id();
    let before = rss_mib(pid);
    let announced: Vec<TcpStream> = (0..4)
        .map(|_| {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(&(256u32 << 20).to_le_bytes()).unwrap();
            s.write_all(&[4, 0, 0, 0]).unwrap();
            s
        })
        .collect();
    for s in announced {
        let m = refusal(s);
        assert!(m.contains("exceeds the maximum"), "{m}");
    }
    assert!(rss_mib(pid) < before + 64, "no memory pinned: {} MiB after, {before} before", rss_mib(pid));

    // Nine idle connections: at most eight take a slot (each closed after --handshake-timeout);
    // the rest are told at once why they are refused. (More than one may be refused: a slot of
    // the connections above may not have been given back yet when these arrive.)
    let idle: Vec<TcpStream> = (0..9).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let (mut told, mut held) = (0, 0);
    for mut s in idle {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut buf = FrameBuf::default();
        match read_frame_blocking(&mut s, &mut buf, 1 << 20) {
            Ok(kind) => {
                let Response::Error { message, .. } = Response::decode(kind, buf.payload()).unwrap() else { panic!() };
                assert!(message.contains("--max-connections"), "{message}");
                told += 1;
            }
            Err(_) => held += 1,
        }
        closed_by_the_server(s);
    }
    assert!(told >= 1 && held <= 8, "{told} refused with a reason, {held} held a slot");

    let config = ClientConfig {
        trainer: Some(0),
        ..ClientConfig::new(vec![addr.clone()], "open", Duration::from_secs(10), Duration::from_secs(10))
    };
    let mut c = Client::connect(&config).unwrap();
    let mut huge = crate::util::criteo_model(&oar::model::ModelConfig { hidden: Some(vec![4]), ..Default::default() })
        .table_spec(oar::table::Optimizer::sgd(1.0), oar::table::Optimizer::sgd(1.0));
    let spec = huge.clone();
    huge.sparse[0].dim = 262_144;
    let err = c.declare(&huge).unwrap_err().to_string();
    assert!(err.contains("rows of 262144 floats, at most 65536"), "{err}");
    assert!(rss_mib(pid) < before + 64, "nothing allocated: {} MiB", rss_mib(pid));

    c.declare(&spec).unwrap();
    let mut dense = Vec::new();
    c.pull(Some(&mut dense), &[], &mut [], oar::protocol::RowCreation::Peek).unwrap();
    let mut grads = vec![0.5f32; dense.len()];
    grads[3] = f32::NAN;
    let header = StepHeader { trainer: 0, step: 0, pass: 1, base_version: 0, samples: 1, apply: Default::default() };
    let err = c.push(&header, Some(&grads), &[]).unwrap_err().to_string();
    assert!(err.contains("holds a NaN, an infinity or a value beyond ±1e18: refused before it touched"), "{err}");
    // Finite but huge: two such pushes once summed (sync) or stepped (SGD) to an infinity, and
    // the model then held NaNs. Refused as a NaN is, by a new connection (a refusal ends one).
    grads[3] = 3e38;
    let mut c = Client::connect(&config).unwrap();
    c.declare(&spec).unwrap();
    let err = c.push(&header, Some(&grads), &[]).unwrap_err().to_string();
    assert!(err.contains("a value beyond ±1e18"), "{err}");
    let mut after = Vec::new();
    c.pull(Some(&mut after), &[], &mut [], oar::protocol::RowCreation::Peek).unwrap();
    assert_eq!(dense, after, "the model is untouched");
    let stats = c.stats().unwrap().remove(0);
    assert_eq!((stats.nonfinite, stats.version), (vec![2], 0));
    server.kill().unwrap();
    let _ = server.wait();
}

/// One address cannot take every place of a server with connections that never finish their
/// handshake: past `--max-pending-per-address` it is refused with a reason, while a client
/// already through its handshake keeps working and another address is served.
#[test]
fn one_address_cannot_hold_every_place_before_the_handshake() {
    // A trainer's client through its handshake first: it is not pending.
    let (_server, addr, mut c) = pending_share_of_2("16");
    // Two silent connections from 127.0.0.1 fill its pending share (the listener takes
    // connections in the order they were made and counts each as it takes it).
    let silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    let m = refusal(TcpStream::connect(&addr).unwrap());
    assert!(
        m.contains("127.0.0.1 has 2 connections not yet through their handshake")
            && m.contains("--max-pending-per-address"),
        "{m}"
    );
    // Another address gets through its handshake meanwhile.
    tool_hello(connect_from("127.0.0.2", &addr)).expect("welcomed");
    // The client through its handshake still works.
    assert_eq!(c.stats().unwrap().len(), 1);
    drop(silent);
}

/// A client refused `Busy` (silent connections from its own address hold that address's share
/// of places before the handshake) tries again until its connect timeout, and gets in once the
/// server closes them after its handshake timeout. Before, a trainer (re)connecting then failed
/// at once, so a peer sharing its address could stop it.
#[test]
fn a_client_refused_busy_tries_again_until_its_connect_timeout() {
    let (_server, addr) = pserver(&["--trainers", "1", "--max-pending-per-address", "2", "--handshake-timeout", "2"]);
    let silent: Vec<TcpStream> = (0..2).map(|_| TcpStream::connect(&addr).unwrap()).collect();
    // The share is full now (the listener counts connections in the order they were made).
    let m = refusal(TcpStream::connect(&addr).unwrap());
    assert!(m.contains("--max-pending-per-address"), "{m}");
    let config = ClientConfig {
        trainer: Some(0),
        ..ClientConfig::new(vec![addr.clone()], "open", Duration::from_secs(60), Duration::from_secs(10))
    };
    let mut c = Client::connect(&config).expect("in once the silent connections are closed");
    assert_eq!(c.stats().unwrap().len(), 1);
    for s in silent {
        closed_by_the_server(s);
    }
}

/// A server of one trainer with `--max-connections max`, 2 connections per address before the
/// handshake, and trainer 0's client through its handshake.
fn pending_share_of_2(max: &str) -> (Server, String, Client) {
    let (server, addr) = pserver(&[
        "--trainers",
        "1",
        "--max-connections",
        max,
        "--max-pending-per-address",
        "2",
        "--handshake-timeout",
        "60",
    ]);
    let config = ClientConfig {
        trainer: Some(0),
        ..ClientConfig::new(vec![addr.clone()], "open", Duration::from_secs(10), Duration::from_secs(10))
    };
    let c = Client::connect(&config).unwrap();
    (server, addr, c)
}

/// Sends a tool's `Hello` (no trainer) to job "open" on `stream`: welcomed, or the answer.
fn tool_hello(mut stream: TcpStream) -> Result<(), String> {
    stream.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let hello = Hello {
        version: PROTOCOL_VERSION,
        job: "open".into(),
        num_servers: 1,
        server_index: 0,
        trainer: oar::protocol::NOT_A_TRAINER,
        epoch: 0,
    };
    stream.write_all(&Request::Hello(hello).encode().to_vec()).unwrap();
    let mut buf = FrameBuf::default();
    let kind = read_frame_blocking(&mut stream, &mut buf, 1 << 20).unwrap();
    match Response::decode(kind, buf.payload()).unwrap() {
        Response::Welcome { .. } => Ok(()),
        other => Err(format!("{other:?}")),
    }
}

/// Silent connections from several addresses, each within its pending share, cannot keep a
/// newcomer out: with every place taken, a new connection closes the oldest one that has not
/// spoken (telling it why), and one that has spoken is never closed for another. Before, the
/// newcomer was refused, and a trainer reconnecting to a server was refused the same way.
#[test]
fn silent_connections_from_many_addresses_cannot_keep_a_newcomer_out() {
    let (_server, addr, mut c) = pending_share_of_2("8");
    // Eight silent connections, two from each of 127.0.0.2 to 127.0.0.5: with the trainer's,
    // more than every place (the listener takes them in the order they were made).
    let mut silent: Vec<TcpStream> =
        (2..=5).flat_map(|k| (0..2).map(move |_| format!("127.0.0.{k}"))).map(|a| connect_from(&a, &addr)).collect();
    tool_hello(connect_from("127.0.0.1", &addr)).expect("the newcomer is welcomed");
    // The oldest silent connection was closed for it, and told why.
    let m = refusal(silent.remove(0));
    assert!(m.contains("closed to take a newer connection") && m.contains("--max-connections"), "{m}");
    // The trainer, which had spoken, still works.
    assert_eq!(c.stats().unwrap().len(), 1);
    drop(silent);
}
