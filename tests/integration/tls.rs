//! TLS between trainers and servers, end to end with real processes: what a relay on the path
//! sees, clients that do not speak it or trust another authority, and `oar launch --tls`.

use std::path::Path;
use std::time::Duration;

use crate::util::*;
use oar::client::{Client, ClientConfig};
use oar::protocol::ServerStats;
use oar::security::auth::Secret;

const JOB: &str = "tls-job-0xC0FFEE";

/// Samples the server applied or discarded as too stale, per trainer.
fn handled(s: &ServerStats) -> Vec<u64> {
    s.applied_samples.iter().zip(&s.discarded_samples).map(|(a, d)| a + d).collect()
}

fn server_stats(log: &str) -> ServerStats {
    let line = log.lines().find_map(|l| l.strip_prefix("OAR_RESULT ")).unwrap_or_else(|| panic!("no result:\n{log}"));
    serde_json::from_str(line).unwrap()
}

/// Trains one async trainer against one server through a relay, with or without TLS; returns
/// the server's stats and the relay.
fn train_through_a_relay(dir: &Path, train: &Path, secret: &Path, tls: Option<&Path>) -> (ServerStats, Relay) {
    let port = free_ports(1).to_string();
    let name = if tls.is_some() { "tls" } else { "plain" };
    let secret = secret.display().to_string();
    let mut args = vec!["pserver", "--host", "127.0.0.1", "--port", &port, "--trainers", "1", "--mode", "async"];
    args.extend(["--job", JOB, "--secret-file", &secret]);
    let (cert, key, ca) = tls.map_or_else(Default::default, |d| {
        let p = |f: &str| d.join(f).display().to_string();
        (p("cert.pem"), p("key.pem"), p("ca.pem"))
    });
    if tls.is_some() {
        args.extend(["--tls-cert", &cert, "--tls-key", &key]);
    }
    let log = format!("server.{name}.log");
    let mut server = spawn_oar(dir, &args, "", &log);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
    wait_until(30, "the server listens", || read(&log).contains("OAR_READY"));
    let tap = Relay::new(format!("127.0.0.1:{port}"));

    if tls.is_some() {
        // A client with the secret but without TLS gets nothing, and nothing stops the server.
        let config = ClientConfig {
            secret: Some(Secret::read(Path::new(&secret)).unwrap()),
            ..ClientConfig::new(vec![format!("127.0.0.1:{port}")], JOB, Duration::from_secs(5), Duration::from_secs(5))
        };
        let err = Client::connect(&config).map(drop).unwrap_err().to_string();
        assert!(err.contains("speaks TLS"), "{err}");
        // One trusting another authority refuses the server's certificate.
        let other = oar::security::tls::generate(&dir.join("other"), "oar").unwrap();
        let config = ClientConfig { tls: Some(oar::security::tls::client_config(&other.ca, "oar").unwrap()), ..config };
        let err = Client::connect(&config).map(drop).unwrap_err().to_string();
        assert!(err.contains("TLS handshake") && err.contains("certificate"), "{err}");
    }

    let (servers, train) = (tap.addr.clone(), train.display().to_string());
    let mut args = vec!["train", "--servers", &servers, "--trainers", "1", "--mode", "async", "--hidden", "8"];
    args.extend(["--job", JOB, "--secret-file", &secret, "--train", &train]);
    if tls.is_some() {
        args.extend(["--tls-ca", &ca]);
    }
    let tlog = format!("trainer.{name}.log");
    let status = spawn_oar(dir, &args, "", &tlog).wait().unwrap();
    assert!(status.success(), "{}", read(&tlog));
    assert!(server.wait().unwrap().success(), "{}", read(&log));
    (server_stats(&read(&log)), tap)
}

/// With TLS a relay on the path sees none of the job's frames (not even the job id of its
/// handshake, which it sees in the clear without TLS), training counts every sample once at
/// the server, and clients that do not speak TLS or trust another authority get nothing.
#[test]
fn tls_hides_the_jobs_frames_from_the_path_and_refuses_clients_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 1, 2000, 0);
    let out = oar(&["tls", "--out", &dir.path().join("tls").display().to_string()]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("--tls-ca"), "{}", text(&out));
    let again = oar(&["tls", "--out", &dir.path().join("tls").display().to_string()]);
    assert!(!again.status.success() && text(&again).contains("ca.pem"), "never over existing files: {}", text(&again));
    let secret = dir.path().join("secret");
    Secret::generate().write_new(&secret).unwrap();

    let (plain, tap) = train_through_a_relay(dir.path(), &train, &secret, None);
    assert_eq!(handled(&plain), vec![2000]);
    assert!(tap.saw(JOB.as_bytes()), "without TLS the handshake's job id crosses in the clear");

    let (tls, tap) = train_through_a_relay(dir.path(), &train, &secret, Some(&dir.path().join("tls")));
    assert_eq!(handled(&tls), vec![2000], "every sample applied (or, too stale, discarded) once");
    assert!(!tap.saw(JOB.as_bytes()), "with TLS the relay sees no frame in the clear");
    assert!(tap.seen.lock().unwrap().len() > 100_000, "the relay carried the job's traffic");
}

/// `oar launch --tls` makes the job's TLS files and every process speaks TLS: the job trains,
/// and its connections end cleanly.
#[test]
fn launch_with_tls_trains_and_keeps_its_key_private() {
    let dir = tempfile::tempdir().unwrap();
    let (train, _) = gen_data(dir.path(), 2, 1500, 0);
    let logs = dir.path().join("logs");
    let train = train.display().to_string();
    let (_, summary) = launch(&logs, &["--train", &train, "--tls", "--hidden", "8"]);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(logs.join("tls").join("key.pem")).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
    for k in 0..2 {
        let log = std::fs::read_to_string(logs.join(format!("server.{k}.log"))).unwrap();
        assert!(!log.contains("closed on error"), "trainers end TLS with its close_notify: {log}");
    }
    assert_eq!(summary.server_stats.len(), 2);
    for s in &summary.server_stats {
        assert_eq!(handled(s), vec![1500, 1500], "each server handled every sample once: {s:?}");
    }
}
