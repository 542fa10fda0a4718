//! `oar cluster ssh` against a real sshd serving two "hosts" (127.0.0.2 and 127.0.0.3, with
//! keys and configuration generated in a temporary folder). `oar cluster k8s` is in `k8s.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::util::*;

/// An sshd listening on 127.0.0.2 and 127.0.0.3 (same port), and the client configuration
/// that reaches it; stopped by PID when dropped.
struct Hosts {
    dir: PathBuf,
    _sshd: Daemons,
}

impl Hosts {
    /// `None` (with the reason printed) when sshd cannot run here.
    fn start(dir: &Path) -> Option<Hosts> {
        let missing: Vec<_> = ["/usr/sbin/sshd", "ssh", "ssh-keygen"].into_iter().filter(|p| !installed(p)).collect();
        if !missing.is_empty() {
            eprintln!("skipped: {missing:?} not installed (.ci/run installs Debian's openssh-server)");
            return None;
        }
        // sshd insists on its privilege-separation folder.
        if let Err(e) = std::fs::create_dir_all("/run/sshd") {
            eprintln!("skipped: cannot create /run/sshd for sshd: {e}");
            return None;
        }
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();
        for key in ["hostkey", "clientkey"] {
            let ok = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key))
                .status()
                .unwrap()
                .success();
            assert!(ok, "ssh-keygen failed");
        }
        std::fs::copy(dir.join("clientkey.pub"), dir.join("authorized_keys")).unwrap();
        let port = free_ports(1);
        let d = dir.display();
        std::fs::write(
            dir.join("sshd_config"),
            format!(
                "ListenAddress 127.0.0.2:{port}\nListenAddress 127.0.0.3:{port}\nHostKey {d}/hostkey\n\
                 PidFile {d}/sshd.pid\nAuthorizedKeysFile {d}/authorized_keys\nPermitRootLogin prohibit-password\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            ),
        )
        .unwrap();
        std::fs::write(
            dir.join("ssh_config"),
            format!(
                "Host 127.0.0.*\n  Port {port}\n  User {}\n  IdentityFile {d}/clientkey\n  IdentitiesOnly yes\n  \
                 StrictHostKeyChecking no\n  UserKnownHostsFile {d}/known_hosts\n  BatchMode yes\n  LogLevel ERROR\n",
                user.trim()
            ),
        )
        .unwrap();
        let mut sshd = Daemons::default();
        let mut cmd = Command::new("/usr/sbin/sshd");
        cmd.arg("-D").arg("-f").arg(dir.join("sshd_config")).arg("-E").arg(dir.join("sshd.log"));
        sshd.start("sshd", &mut cmd, &dir.join("sshd.out")).unwrap();
        wait_until(30, "sshd to listen on 127.0.0.2 and 127.0.0.3", || {
            sshd.check_running();
            ["127.0.0.2", "127.0.0.3"].iter().all(|h| std::net::TcpStream::connect((*h, port)).is_ok())
        });
        std::fs::write(dir.join("hosts"), "# two hosts on loopback\n127.0.0.2\n127.0.0.3\n").unwrap();
        Some(Hosts { dir: dir.to_path_buf(), _sshd: sshd })
    }

    /// `oar cluster ssh` over these hosts with the workspace `ws` at `rws` on the hosts.
    fn launch(&self, ws: &Path, rws: &Path, options: &[&str], train_args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_oar"));
        cmd.args(["cluster", "ssh", "--no-progress", "--port", &free_ports(1).to_string()])
            .args(options)
            .arg("--hosts")
            .arg(self.dir.join("hosts"))
            .arg("--ssh-config")
            .arg(self.dir.join("ssh_config"))
            .arg("--workspace")
            .arg(ws)
            .arg("--remote-workspace")
            .arg(rws)
            .arg("--")
            .args(train_args)
            .env("RUST_LOG", "warn");
        cmd
    }
}

/// A workspace with `parts` training files of `lines` lines each and a test file.
fn workspace(dir: &Path, parts: usize, lines: u64) -> PathBuf {
    let ws = dir.join("ws");
    gen_data(&ws.join("data"), parts, lines, 1000);
    ws
}

#[test]
fn cluster_ssh_runs_servers_and_trainers_on_two_hosts_to_a_saved_model() {
    let dir = tempfile::tempdir().unwrap();
    let Some(hosts) = Hosts::start(dir.path()) else { return };
    let ws = workspace(dir.path(), 2, 3000);
    let rws = dir.path().join("remote-ws");
    let args = ["--mode", "async", "--hidden", "16", "--batch-size", "200", "--timeout", "60"];
    let out = hosts
        .launch(&ws, &rws, &["--dispatch"], &args)
        .args(["--train", "data/train", "--test", "data/test", "--output", "model"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("oar cluster ssh on 2 hosts: 2 servers x 2 workers, 6000 samples"), "{stdout}");
    assert!(stdout.contains("test AUC"), "{stdout}");
    // Each server listened on its own host's address; every log is in the remote workspace.
    for (i, host) in ["127.0.0.2", "127.0.0.3"].iter().enumerate() {
        let log = std::fs::read_to_string(rws.join(format!("log/server.{i}.log"))).unwrap();
        assert!(log.contains(&format!("OAR_READY {host}:")), "server {i}:\n{log}");
        // Each trainer was handed its own credential, not the job's master secret.
        let trainer = std::fs::read_to_string(rws.join(format!("log/trainer.{i}.log"))).unwrap();
        assert!(!trainer.contains("master secret"), "trainer {i}:\n{trainer}");
    }
    // The workspace and the binary were dispatched; the servers saved the final model there.
    assert!(rws.join("data/train/part-00001").exists() && rws.join(".oar/oar").exists());
    let manifest = std::fs::read_to_string(rws.join("model/final/manifest.json")).unwrap();
    assert!(manifest.contains("\"num_servers\": 2"), "{manifest}");
    assert!(ws.join("log/launcher/summary.json").exists(), "local copies of the logs and the summary");
    // The job's secret and credentials are gone from the hosts once it stopped.
    let left: Vec<_> = std::fs::read_dir(rws.join(".oar"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("secret.") || n.starts_with("credential."))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // Without --dispatch the deployed workspace and binary are used: the local data is gone.
    std::fs::remove_dir_all(ws.join("data")).unwrap();
    let out = hosts
        .launch(&ws, &rws, &["--oar-bin", "./.oar/oar"], &args)
        .args(["--train", "data/train", "--output", "model-again"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(rws.join("model-again/final/manifest.json").exists());
}

/// A job of `passes` passes over 2 x 20,000 lines under `oar cluster ssh` with `options`, the
/// train arguments `extra` and the remote workspace `dir/remote-ws`, returned once both remote
/// trainers train and `ready(remote workspace)` holds, with the text that its remote processes
/// carry in their environment.
fn start_job(
    hosts: &Hosts,
    dir: &Path,
    passes: &str,
    options: &[&str],
    extra: &[&str],
    ready: impl Fn(&Path) -> bool,
) -> (std::process::Child, String) {
    let ws = workspace(dir, 2, 20_000);
    let rws = dir.join("remote-ws");
    let args = ["--mode", "async", "--hidden", "16", "--batch-size", "100", "--passes", passes, "--timeout", "60"];
    let mut launcher = hosts
        .launch(&ws, &rws, options, &args)
        .args(["--train", "data/train", "--output", "model"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The remote processes carry the launcher's job id, `oar-ssh-<launcher pid>-...`.
    let needle = format!("OAR_JOB=oar-ssh-{}-", launcher.id());
    let training = |t: usize| {
        std::fs::read_to_string(rws.join(format!("log/trainer.{t}.log"))).is_ok_and(|l| l.contains("OAR_PROGRESS"))
    };
    let mut ended = None;
    wait_until(120, "both remote trainers to train", || {
        ended = launcher.try_wait().unwrap();
        ended.is_some() || (training(0) && training(1) && ready(&rws))
    });
    if ended.is_some() {
        panic!("the launcher ended early:\n{}", text(&launcher.wait_with_output().unwrap()));
    }
    assert!(processes_mentioning(&needle).len() >= 4, "2 servers and 2 trainers run remotely");
    (launcher, needle)
}

/// A long job (500 passes): it ends only when stopped.
fn start_long_job(hosts: &Hosts, dir: &Path) -> (std::process::Child, String) {
    start_job(hosts, dir, "500", &["--dispatch"], &[], |_| true)
}

/// Trainer 1 is killed (SIGKILL) on its host mid-run: the job fails naming it, and afterwards
/// nothing of the job runs on either host.
#[test]
fn killing_a_remote_trainer_fails_the_job_and_stops_every_remote_process() {
    let dir = tempfile::tempdir().unwrap();
    let Some(hosts) = Hosts::start(dir.path()) else { return };
    let (launcher, needle) = start_long_job(&hosts, dir.path());
    let trainer1 = remote_process(&needle, &["TRAINING_ROLE=TRAINER", "PADDLE_TRAINER_ID=1"]);
    // SAFETY: signalling a process this test's job started.
    assert_eq!(unsafe { libc::kill(trainer1 as i32, libc::SIGKILL) }, 0);

    let out = launcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("trainer 1 on 127.0.0.3 failed (exit status: 137)"), "{err}");
    assert_eq!(processes_mentioning(&needle), Vec::<u32>::new(), "remote processes left running");
}

/// The remote process of the job `needle` whose environment holds every one of `vars`.
fn remote_process(needle: &str, vars: &[&str]) -> u32 {
    let found: Vec<u32> = processes_mentioning(needle)
        .into_iter()
        .filter(|pid| {
            let read = |f: &str| std::fs::read(format!("/proc/{pid}/{f}")).unwrap_or_default();
            let environ = String::from_utf8_lossy(&read("environ")).into_owned();
            read("cmdline").starts_with(b"./.oar/oar\0train")
                && vars.iter().all(|v| environ.split('\0').any(|e| e == *v))
        })
        .collect();
    assert_eq!(found.len(), 1, "one remote process with {vars:?}: {found:?}");
    found[0]
}

/// With --max-restarts, server 1 and trainer 1 killed (SIGKILL) on their host mid-run are
/// started again there with their command lines and go on (the server from its checkpoint under
/// the next epoch, the trainer from its recorded position): the job finishes with every sample
/// trained, the model saved and both restarts in the summary.
#[test]
fn cluster_ssh_restarts_a_killed_server_and_trainer_where_they_ran() {
    let dir = tempfile::tempdir().unwrap();
    let Some(hosts) = Hosts::start(dir.path()) else { return };
    let rws = dir.path().join("remote-ws");
    // A complete checkpoint: `ckpt-NNNNNN`, not the `ckpt-NNNNNN.tmp` folder still being written
    // (a kill then leaves the restarted server nothing to resume from).
    let checkpointed = |rws: &Path| {
        std::fs::read_dir(rws.join("model/checkpoints/server-1")).is_ok_and(|d| {
            d.flatten().any(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("ckpt-") && !name.ends_with(".tmp")
            })
        })
    };
    let options = ["--dispatch", "--max-restarts", "2"];
    let extra = ["--test", "data/test", "--checkpoint-every", "0.3"];
    let (launcher, needle) = start_job(&hosts, dir.path(), "4", &options, &extra, checkpointed);
    let server1 = remote_process(&needle, &["TRAINING_ROLE=PSERVER", "POD_IP=127.0.0.3"]);
    let trainer1 = remote_process(&needle, &["TRAINING_ROLE=TRAINER", "PADDLE_TRAINER_ID=1"]);
    for pid in [server1, trainer1] {
        // SAFETY: signalling a process this test's job started.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGKILL) }, 0);
    }

    let out = launcher.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("2 servers x 2 workers, 160000 samples"), "{stdout}");
    for who in ["server 1 on 127.0.0.3", "trainer 1 on 127.0.0.3"] {
        assert!(stdout.contains(&format!("restarted {who} (exit status: 137)")), "{who}: {stdout}");
    }
    let server = std::fs::read_to_string(rws.join("log/server.1.restart-1.log")).unwrap();
    assert!(server.contains("going on from it") && server.contains("epoch=1"), "{server}");
    assert!(server.contains("resumed shard from a checkpoint"), "{server}");
    let trainer = std::fs::read_to_string(rws.join("log/trainer.1.restart-1.log")).unwrap();
    assert!(trainer.contains("rejoining: going on after the last recorded step"), "{trainer}");
    let manifest = std::fs::read_to_string(rws.join("model/final/manifest.json")).unwrap();
    assert!(manifest.contains("\"num_servers\": 2"), "{manifest}");
    assert_eq!(processes_mentioning(&needle), Vec::<u32>::new(), "remote processes left running");
}

/// Ctrl-C to the launcher stops every remote process: nothing else would (a remote process
/// outlives its ssh client), so this shows the stop by remote PID.
#[test]
fn interrupting_cluster_ssh_stops_every_remote_process_by_pid() {
    let dir = tempfile::tempdir().unwrap();
    let Some(hosts) = Hosts::start(dir.path()) else { return };
    let (launcher, needle) = start_long_job(&hosts, dir.path());
    // SAFETY: signalling our own child process.
    assert_eq!(unsafe { libc::kill(launcher.id() as i32, libc::SIGINT) }, 0);
    let out = launcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(String::from_utf8_lossy(&out.stderr).contains("interrupted"), "{}", text(&out));
    assert_eq!(processes_mentioning(&needle), Vec::<u32>::new(), "remote processes left running");
}

/// Should the launcher itself be killed (SIGKILL: no chance to clean up), the remote wrappers
/// see their ssh session's stdin end and stop their processes.
#[test]
fn killing_the_launcher_itself_stops_every_remote_process() {
    let dir = tempfile::tempdir().unwrap();
    let Some(hosts) = Hosts::start(dir.path()) else { return };
    let (mut launcher, needle) = start_long_job(&hosts, dir.path());
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    wait_until(60, "the remote processes to stop", || processes_mentioning(&needle).is_empty());
}
