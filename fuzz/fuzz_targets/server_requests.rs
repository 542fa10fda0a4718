//! The server's request handling, through a real server on loopback: each input is a stream of
//! frames sent after a valid handshake on a fresh server (sync mode, 2 trainers, short waits).
//! A panic in any server task aborts (libFuzzer's panic hook), so every one is found; the server
//! must answer or close, never hang: each input is bounded by a deadline.
#![no_main]

use std::io::{Read, Write};
use std::sync::OnceLock;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use oar::protocol::{Hello, Request, PROTOCOL_VERSION};
use oar::server::ServerConfig;
use oar::protocol::Mode;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap())
}

fn config(save_root: std::path::PathBuf) -> ServerConfig {
    ServerConfig {
        metrics_addr: None,
        index: 0,
        num_servers: 0, // learned from the handshake, as `oar pserver` without --num-servers
        trainers: 2,
        mode: Mode::Sync,
        job: "fuzz".into(),
        max_frame: 1 << 16,
        timeout: Duration::from_millis(20),
        lag_ratio: 1.5,
        resume: None,
        exit_when_done: false,
        sparse_ports: 0,
        save_dir: None,
        save_root,
        checkpoints: None,
        epoch: 0,
        closed: Vec::new(),
        rejoin: None,
        limits: oar::server::Limits::default(),
        secret: None,
        tls: None,
    }
}

fuzz_target!(|data: &[u8]| {
    let root = std::env::temp_dir().join(format!("oar-fuzz-{}", std::process::id()));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime().spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let _ = oar::server::run(vec![listener], config(root), async {
            let _ = stopped.await;
        })
        .await;
    });
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = Hello { version: PROTOCOL_VERSION, job: "fuzz".into(), num_servers: 1, server_index: 0, trainer: 0, epoch: 0 };
    let mut bytes = Request::Hello(hello).encode().to_vec();
    bytes.extend_from_slice(data);
    // The server may close early on a bad frame: a failed write is part of the game.
    let _ = s.write_all(&bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut sink = Vec::new();
    match s.read_to_end(&mut sink) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {
            panic!("the server neither answered nor closed within 5 s")
        }
        _ => {}
    }
    let _ = stop.send(());
    runtime().block_on(server).unwrap();
});
