//! A restarted server never starts empty by accident, and never acts through a link: one that
//! finds its job's checkpoints and can read none refuses to start, naming them (`--start-empty`
//! starts it empty on purpose), and a checkpoint folder that is a symbolic link is refused
//! before anything is deleted or written in it.

use std::process::{Command, Stdio};

use crate::faults::recoverable_job;
use crate::util::*;

/// `oar pserver --recoverable` of the job `recoverable_job` runs, on `port`, with `extra`
/// flags: its output once it ends (it is killed once it listens).
fn restart(out: &std::path::Path, port: u16, extra: &[&str]) -> std::process::Output {
    let mut server = Command::new(env!("CARGO_BIN_EXE_oar"))
        .args(["pserver", "--host", "127.0.0.1", "--port", &port.to_string(), "--index", "0", "--num-servers", "1"])
        .args(["--trainers", "1", "--recoverable", "--mode", "sync", "--job", "rerun", "--checkpoint-dir"])
        .arg(out.join("checkpoints"))
        .args(extra)
        .env_remove("OAR_LAUNCHED")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(server.stdout.as_mut().unwrap()), &mut line).unwrap();
    if line.starts_with("OAR_READY") {
        server.kill().unwrap();
    }
    server.wait_with_output().unwrap()
}

#[test]
#[cfg_attr(not(feature = "faults"), ignore = "plants faults: run with --features faults")]
fn a_restart_that_can_read_none_of_its_checkpoints_refuses_to_start_empty() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1);
    let [server, trainer] = recoverable_job(dir.path(), port, "trainer0:kill@step=20", Some(20));
    assert_eq!((server.status.code(), trainer.status.code()), (None, None), "both killed");
    let out = dir.path().join("out");
    let folder = oar::server::shard_checkpoints::server_dir(&out.join("checkpoints"), 0);
    let mut damaged = 0;
    // A `.tmp` folder is a checkpoint the kill cut short: the restart clears it, as it should.
    let complete = |e: &std::fs::DirEntry| {
        let name = e.file_name().to_string_lossy().into_owned();
        name.starts_with("ckpt-") && !name.ends_with(".tmp")
    };
    for e in std::fs::read_dir(&folder).unwrap().flatten().filter(complete) {
        std::fs::write(e.path().join("entry.json"), b"{\"seq\": tor").unwrap();
        damaged += 1;
    }
    assert!(damaged > 0);
    let o = restart(&out, port, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{err}");
    assert!(err.contains(&format!("finds {damaged} checkpoint(s) of job 'rerun' and can read none of them")), "{err}");
    assert!(err.contains("ckpt-") && err.contains("give --start-empty"), "{err}");
    // On purpose: it starts, with empty tables, as the next epoch.
    let o = restart(&out, port, &["--start-empty"]);
    let log = text(&o);
    assert!(
        log.contains("parameter server listening") && log.contains("--start-empty: no checkpoint can be read"),
        "{log}"
    );
}

#[test]
fn a_checkpoint_folder_that_is_a_link_is_refused_before_anything_is_written_through_it() {
    let dir = tempfile::tempdir().unwrap();
    let (out, elsewhere) = (dir.path().join("out"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(out.join("checkpoints")).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    std::fs::write(elsewhere.join("ckpt-000001.tmp"), b"not the server's").unwrap();
    std::os::unix::fs::symlink(&elsewhere, out.join("checkpoints/server-0")).unwrap();
    for extra in [&["--start-empty"][..], &[]] {
        let o = restart(&out, free_ports(1), extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{err}");
        assert!(err.contains("server-0") && err.contains("a symbolic link"), "{err}");
    }
    // Without --recoverable, claiming the folder for checkpoints is refused the same way.
    let o = oar(&[
        "pserver",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--index",
        "0",
        "--num-servers",
        "1",
        "--trainers",
        "1",
        "--checkpoint-dir",
        &out.join("checkpoints").display().to_string(),
    ]);
    assert!(!o.status.success() && text(&o).contains("a symbolic link"), "{}", text(&o));
    let left: Vec<_> = std::fs::read_dir(&elsewhere).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left, ["ckpt-000001.tmp"], "nothing deleted or written through the link");
}
