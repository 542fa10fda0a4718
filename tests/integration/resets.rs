//! Connections reset before the handshake's answer, as a process stopping or restarting behind
//! a server's address (or a Kubernetes service routing to a pod going away) resets them: a
//! trainer connects again until its connect deadline, trains, and every sample is counted once
//! by the server; one that never gets through fails naming the server, the deadline and the
//! reset. Real processes, through a relay that resets what it accepts.

use std::sync::atomic::Ordering::SeqCst;

use crate::util::*;

const JOB: &str = "resets-job";

/// Starts `oar pserver` for one async trainer of [`JOB`]; returns it, its address and its
/// log's name in `dir`.
fn server(dir: &std::path::Path) -> (std::process::Child, String, &'static str) {
    let port = free_ports(1).to_string();
    let args = ["pserver", "--host", "127.0.0.1", "--port", &port, "--trainers", "1", "--mode", "async", "--job", JOB];
    let log = "server.log";
    let child = spawn_oar(dir, &args, "", log);
    wait_until(30, "the server listens", || {
        std::fs::read_to_string(dir.join(log)).unwrap_or_default().contains("OAR_READY")
    });
    (child, format!("127.0.0.1:{port}"), log)
}

/// `oar train` of one async trainer on `train` against `servers`, with `--timeout` `timeout`.
fn trainer(dir: &std::path::Path, servers: &str, train: &std::path::Path, timeout: &str) -> std::process::Child {
    let train = train.display().to_string();
    let args = ["train", "--servers", servers, "--trainers", "1", "--mode", "async", "--hidden", "8"];
    let args = [&args[..], &["--job", JOB, "--train", &train, "--timeout", timeout]].concat();
    spawn_oar(dir, &args, "", "trainer.log")
}

#[test]
fn a_trainer_connects_again_after_resets_and_every_sample_counts_once() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 2000, 0);
    let (mut server, addr, log) = server(dir.path());
    let relay = Relay::resetting(addr, 3);
    let status = trainer(dir.path(), &relay.addr, &train, "30").wait().unwrap();
    let read = |f: &str| std::fs::read_to_string(dir.path().join(f)).unwrap_or_default();
    assert!(status.success(), "{}", read("trainer.log"));
    assert_eq!(relay.resets.load(SeqCst), 3);
    let warned = read("trainer.log").matches("closed before the handshake's answer").count();
    assert_eq!(warned, 3, "each reset is said: {}", read("trainer.log"));
    assert!(server.wait().unwrap().success(), "{}", read(log));
    // Counted at the source: the server applied (or, too stale, discarded) each sample once.
    let line = read(log).lines().find_map(|l| l.strip_prefix("OAR_RESULT ").map(String::from)).unwrap();
    let stats: oar::protocol::ServerStats = serde_json::from_str(&line).unwrap();
    assert_eq!(stats.applied_samples[0] + stats.discarded_samples[0], 2000, "{line}");
}

#[test]
fn a_server_that_resets_every_connection_is_named_after_the_connect_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 200, 0);
    let (mut server, addr, _) = server(dir.path());
    let relay = Relay::resetting(addr, usize::MAX);
    let status = trainer(dir.path(), &relay.addr, &train, "2").wait().unwrap();
    let log = std::fs::read_to_string(dir.path().join("trainer.log")).unwrap();
    assert!(!status.success(), "{log}");
    let line = log.lines().rev().find(|l| l.contains("cannot reach server 0")).unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains(&format!("at {} within 2s", relay.addr)), "{line}");
    // The closes this trainer saw, each one the relay reset.
    let said =
        line.split(" (").last().and_then(|s| s.strip_suffix(" connection(s) closed before the handshake's answer)"));
    let closes: usize = said.unwrap_or_else(|| panic!("{line}")).parse().unwrap();
    assert!((2..=relay.resets.load(SeqCst)).contains(&closes), "it connected again before giving up: {line}");
    let _ = server.kill();
    let _ = server.wait();
}
