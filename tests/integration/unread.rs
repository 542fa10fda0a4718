//! A peer that asks and never reads: a server writes each reply within the job's `--timeout`,
//! then closes the connection and lets go of what it held for it. A tool's pulls that it never
//! read held 264 MiB each, for as long as its connections stayed open.

use std::io::Write;
use std::time::Duration;

use crate::util::*;
use oar::client::{Client, ClientConfig};
use oar::protocol::{read_frame_blocking, DenseSelection, FrameBuf, Hello, Pull, Request, RowCreation, SparseIds};

#[test]
fn a_reply_not_read_within_the_timeout_closes_its_connection() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let args = ["--index", "0", "--num-servers", "1", "--trainers", "1", "--job", "unread", "--keep-serving"];
    let stderr = std::process::Stdio::from(std::fs::File::create(&log).unwrap());
    let (mut server, addr) = pserver_ready(&[&args[..], &["--mode", "async", "--timeout", "1"]].concat(), stderr);
    let config =
        ClientConfig { trainer: Some(0), ..ClientConfig::new(vec![addr.clone()], "unread", secs(5), secs(10)) };
    // The job's trainer, connected throughout (a trainer gone without closing ends the job).
    let mut trainer = Client::connect(&config).unwrap();
    trainer.declare(&crate::robustness::spec()).unwrap();

    // A peer with a small receive window asks for 2 million rows (tens of MiB, far past what the
    // kernel's buffers take) and reads nothing.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.connect(&addr.parse::<std::net::SocketAddr>().unwrap().into()).unwrap();
    let mut peer: std::net::TcpStream = socket.into();
    let hello = Hello {
        version: oar::protocol::PROTOCOL_VERSION,
        job: "unread".into(),
        num_servers: 1,
        server_index: 0,
        trainer: u64::MAX,
        epoch: 0,
    };
    peer.write_all(&Request::Hello(hello).encode().to_vec()).unwrap();
    let ids: Vec<u64> = (1..=2_000_000).collect();
    let pull = Pull {
        dense: DenseSelection::None,
        create: RowCreation::Peek,
        sparse: vec![SparseIds { table: 0, ids: ids.as_slice().into() }],
    };
    peer.write_all(&Request::Pull(pull).encode().to_vec()).unwrap();
    let said = || std::fs::read_to_string(&log).unwrap_or_default();
    wait_until(60, "the server gave up on the unread reply", || said().contains("read no reply for 1s (--timeout)"));

    // Read now: the welcome, then a reply cut short by the close.
    peer.set_read_timeout(Some(secs(60))).unwrap();
    let mut buf = FrameBuf::default();
    read_frame_blocking(&mut peer, &mut buf, 1 << 16).expect("the welcome");
    let cut = read_frame_blocking(&mut peer, &mut buf, 1 << 30);
    assert!(cut.is_err(), "the whole reply arrived: the connection was not closed");
    // The server goes on.
    assert_eq!(trainer.stats().unwrap()[0].version, 0);
    server.kill().unwrap();
    server.wait().unwrap();
}

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}
