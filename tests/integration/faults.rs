//! The fault suite: real `oar launch` jobs (servers and trainers as processes on loopback) with a
//! fault injected at a chosen moment (`OAR_FAULT`, see `oar::base::fault`): a server killed (SIGKILL)
//! mid-pass or mid-checkpoint, a server stopped (SIGSTOP), a trainer killed. Each job must end
//! finished with its model saved, or fail with one clear line naming the process and the cause;
//! either way no process of it may remain.

use std::path::PathBuf;
use std::time::Duration;

use crate::util::*;
use oar::client::ClientConfig;
use oar::protocol::ErrorCode;
use oar::protocol::Mode;
use oar::run::launch::LaunchSummary;
use oar::server::shard_checkpoints::{Checkpointer, Fence, Policy};
use oar::server::ServerConfig;

/// A job folder with generated data: 2 parts of 25,000 lines (49 batches of 512 per trainer).
struct Job {
    dir: tempfile::TempDir,
    train: PathBuf,
    test: PathBuf,
    /// Training lines in all.
    samples: u64,
}

impl Job {
    fn new() -> Job {
        Job::with_parts(2, 25_000)
    }

    /// `parts` training files of `lines` each (trainer k reads the parts whose number % 2 == k).
    fn with_parts(parts: usize, lines: u64) -> Job {
        let dir = tempfile::tempdir().unwrap();
        let (train, test) = gen_data(&dir.path().join("data"), parts, lines, 4000);
        Job { dir, train, test, samples: parts as u64 * lines }
    }

    fn out(&self) -> PathBuf {
        self.dir.path().join("out")
    }

    fn logs(&self) -> PathBuf {
        self.dir.path().join("logs")
    }

    /// Runs `oar launch` 2 x 2 in `mode` with `fault` planted and `extra` flags.
    fn launch(&self, mode: &str, fault: &str, extra: &[&str]) -> std::process::Output {
        let (train, test, out, logs) = (self.train.clone(), self.test.clone(), self.out(), self.logs());
        // A short synchronous warm-up, so most of the 2 x 100 steps are async.
        let mut args: Vec<String> = ["launch", "--servers", "2", "--workers", "2", "--mode", mode, "--no-progress"]
            .iter()
            .chain(&["--sync-warmup", "20"])
            .map(|s| s.to_string())
            .collect();
        for (flag, path) in [("--train", &train), ("--test", &test), ("--output", &out), ("--logs", &logs)] {
            args.extend([flag.to_string(), path.display().to_string()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_oar"))
            .args(&args)
            .env_remove("OAR_LAUNCHED")
            .env("OAR_FAULT", fault)
            .output()
            .expect("oar runs");
        let left = processes_mentioning(&self.dir.path().display().to_string());
        assert!(left.is_empty(), "processes of the job remain: {left:?}\n{}", text(&output));
        output
    }

    fn summary(&self) -> LaunchSummary {
        serde_json::from_slice(&std::fs::read(self.logs().join("summary.json")).unwrap()).unwrap()
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs().join(name)).unwrap_or_default()
    }

    /// The job finished, saved its model, and restarted exactly `server` once from a checkpoint,
    /// and the workers `reconnecting` found it back.
    fn assert_recovered(&self, output: &std::process::Output, server: usize, reconnecting: &[usize]) -> LaunchSummary {
        assert!(output.status.success(), "{}", text(output));
        let s = self.summary();
        assert_eq!(s.restarts.len(), 1, "{:?}", s.restarts);
        let r = &s.restarts[0];
        assert_eq!((r.process.as_str(), r.epoch), (format!("server {server}").as_str(), 1));
        assert!(r.from.as_deref().is_some_and(|f| f.ends_with("checkpoints")), "{r:?}");
        assert_eq!(s.samples, self.samples, "every sample trained once");
        for w in reconnecting {
            let log = self.log(&format!("worker.{w}.log"));
            assert!(log.contains(&format!("server {server} is back")), "worker {w} did not reconnect:\n{log}");
        }
        assert!(self.out().join("pass-0001/manifest.json").is_file(), "the model was saved");
        let auc = s.test.as_ref().and_then(|t| t.auc).unwrap();
        assert!(auc > 0.68, "test AUC {auc} after the restart");
        s
    }
}

fn launch_failure(output: &std::process::Output) -> String {
    assert!(!output.status.success(), "the job should have failed:\n{}", text(output));
    String::from_utf8_lossy(&output.stderr).lines().last().unwrap_or_default().to_string()
}

#[test]
fn an_async_server_killed_mid_pass_is_restarted_from_its_checkpoint_and_the_job_finishes() {
    let job = Job::new();
    let out = job.launch("async", "server1:kill@version=60", &["--checkpoint-every", "0.2", "--max-restarts", "1"]);
    job.assert_recovered(&out, 1, &[0, 1]);
    let restarted = job.log("server.1.epoch-1.log");
    assert!(restarted.contains("resumed shard from a checkpoint"), "{restarted}");
}

/// In `sync_dense` a push's rows are applied on arrival and its dense part waits for the
/// step: a server restarted from its checkpoint has lost its pending steps, and each trainer's
/// rows are applied once all the same (the ledger in the checkpoint says which were).
#[test]
fn a_sync_dense_server_killed_mid_pass_is_restarted_from_its_checkpoint_and_the_job_finishes() {
    let job = Job::new();
    let extra = ["--checkpoint-every", "0.2", "--max-restarts", "1", "--sync-dense", "true"];
    // 20 warm-up updates, then one per step of both trainers: 59 in all.
    let out = job.launch("async", "server1:kill@version=40", &extra);
    let s = job.assert_recovered(&out, 1, &[0, 1]);
    assert_eq!(s.staleness.mean(), 0.0, "the dense part is never stale: {}", s.staleness);
}

#[test]
fn a_sync_server_killed_mid_pass_is_restarted_and_the_job_finishes() {
    let job = Job::new();
    let out = job.launch("sync", "server0:kill@version=30", &["--checkpoint-every", "0.2", "--max-restarts", "1"]);
    job.assert_recovered(&out, 0, &[0, 1]);
}

/// Uneven data in sync mode: trainer 1 (one part, 25 batches) ends its pass and waits at the
/// barrier on server 0 while trainer 0 (two parts, 49 batches) goes on alone. Server 1, killed
/// then, is restarted knowing from its folder that trainer 1 ended the pass (trainer 1 talks
/// to server 0 only and would not tell it again), so trainer 0's steps complete without it.
#[test]
fn a_sync_server_restarted_after_a_trainer_ended_its_pass_does_not_wait_for_it() {
    let job = Job::with_parts(3, 12_500);
    let extra = ["--checkpoint-every", "0.1", "--max-restarts", "1", "--timeout", "30"];
    let out = job.launch("sync", "server1:kill@version=40", &extra);
    job.assert_recovered(&out, 1, &[0]);
    let restarted = job.log("server.1.epoch-1.log");
    assert!(restarted.contains("ended=[1]"), "{restarted}");
}

/// Killed after writing its second checkpoint's shard file but before publishing it: the
/// restarted server loads the first, and the torn one is cleared away.
#[test]
fn a_server_killed_mid_checkpoint_restarts_from_the_previous_complete_one() {
    let job = Job::new();
    let out = job.launch("async", "server0:kill@checkpoint=2", &["--checkpoint-every", "0.2", "--max-restarts", "1"]);
    job.assert_recovered(&out, 0, &[0, 1]);
    let restarted = job.log("server.0.epoch-1.log");
    assert!(restarted.contains("resumed shard from a checkpoint") && restarted.contains("seq=1 "), "{restarted}");
    let folder = job.out().join("checkpoints/server-0");
    let torn: Vec<_> = std::fs::read_dir(&folder)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(torn.is_empty(), "a torn checkpoint remains: {torn:?}");
}

/// A sync step answered to trainer 0 but not to trainer 1 before its server dies: trainer 0
/// has pushed its next step to the dead server and to the live one, where that step waits for
/// trainer 1; trainer 1 sends its unanswered push again to the restarted server, where it waits
/// for trainer 0. Trainer 0 must bring the lost server back rather than wait on the live one,
/// or the two wait for each other until the sync timeout: whether the dead server is the first
/// whose reply it reads (server 0) or not (server 1).
#[test]
fn a_server_that_died_having_answered_only_one_trainer_is_recovered_without_a_deadlock() {
    for server in [0, 1] {
        let job = Job::new();
        let extra = ["--checkpoint-every", "0.2", "--max-restarts", "1", "--timeout", "60"];
        let out = job.launch("sync", &format!("server{server}:kill@unanswered=30"), &extra);
        job.assert_recovered(&out, server, &[0, 1]);
    }
}

/// A stopped server keeps its sockets open and answers nothing: the launcher's heartbeat finds
/// it, kills it (so the old process can never come back) and restarts it.
#[test]
fn a_stopped_server_is_found_by_the_heartbeat_killed_and_replaced() {
    let job = Job::new();
    let out = job.launch("async", "server1:stop@version=60", &["--checkpoint-every", "0.2", "--max-restarts", "1"]);
    let s = job.assert_recovered(&out, 1, &[0, 1]);
    assert!(s.restarts[0].cause.contains("no heartbeat"), "{:?}", s.restarts[0]);
}

#[test]
fn without_restarts_a_killed_server_ends_the_job_naming_it() {
    let job = Job::new();
    let out = job.launch("async", "server1:kill@version=60", &[]);
    let line = launch_failure(&out);
    assert!(line.contains("server 1 failed") && line.contains("SIGKILL"), "{line}");
    // The cause first; the others stopped because they lost it (exit status 3), none on its own.
    assert!(line.starts_with("oar: error: server 1 failed"), "{line}");
    assert!(!line.contains("exit status: 1)"), "{line}");
}

#[test]
fn without_restarts_a_stopped_server_ends_the_job_naming_it() {
    let job = Job::new();
    let out = job.launch("sync", "server0:stop@version=30", &[]);
    let line = launch_failure(&out);
    assert!(line.contains("server 0 failed") && line.contains("no heartbeat"), "{line}");
}

#[test]
fn without_restarts_a_killed_trainer_ends_the_job_naming_it() {
    let job = Job::new();
    let out = job.launch("async", "trainer1:kill@step=30", &[]);
    let line = launch_failure(&out);
    assert!(line.contains("worker 1 failed") && line.contains("SIGKILL"), "{line}");
    assert!(line.starts_with("oar: error: worker 1 failed"), "{line}");
    assert!(!line.contains("exit status: 1)"), "{line}");
}

impl Job {
    /// The job finished, saved its model, and restarted trainer `worker` once, which went on
    /// from its recorded position: every sample is trained once, as the servers count.
    fn assert_trainer_rejoined(&self, output: &std::process::Output, worker: usize) -> LaunchSummary {
        assert!(output.status.success(), "{}", text(output));
        let s = self.summary();
        assert_eq!(s.restarts.len(), 1, "{:?}", s.restarts);
        assert_eq!(s.restarts[0].process, format!("worker {worker}"));
        assert_eq!(s.samples, 50_000, "every sample trained once: {:?}", s.reports.iter().map(|r| r.samples));
        // Counted where it counts: each server took each trainer's 25,000 samples once
        // (applied, or discarded as too stale in async mode), the killed one's included.
        assert_eq!(s.server_stats.len(), 2);
        for (k, stats) in s.server_stats.iter().enumerate() {
            let took: Vec<u64> =
                stats.applied_samples.iter().zip(&stats.discarded_samples).map(|(a, d)| a + d).collect();
            assert_eq!(took, vec![25_000; 2], "server {k}: {stats:?}");
        }
        let log = self.log(&format!("worker.{worker}.restart-1.log"));
        assert!(log.contains("rejoining: going on after the last recorded step"), "{log}");
        for server in 0..2 {
            let log = self.log(&format!("server.{server}.log"));
            assert!(log.contains(&format!("trainer {worker} rejoined")), "server {server}:\n{log}");
        }
        assert!(self.out().join("pass-0001/manifest.json").is_file(), "the model was saved");
        let auc = s.test.as_ref().and_then(|t| t.auc).unwrap();
        assert!(auc > 0.68, "test AUC {auc} after the restart");
        s
    }
}

#[test]
fn an_async_trainer_killed_mid_pass_is_restarted_and_goes_on_from_its_position() {
    let job = Job::new();
    let out = job.launch("async", "trainer1:kill@step=40", &["--max-restarts", "1"]);
    job.assert_trainer_rejoined(&out, 1);
}

/// The same in `sync_dense`: the survivor's dense steps wait for the restarted trainer, which
/// sends its unanswered push again (its rows not applied twice) and goes on. Its batches are
/// cut in 4 steps of 128 (`--sync-dense-batch 341` < 2 x 512 / 3), in 8 of 64 for the 25 steps
/// after the 20 warm-up parts (`sync_dense_ramp`), and it is killed in the middle of a batch
/// of the ramp: after 2 whole batches and 6 steps of the third; it goes on by step number, the
/// ramp's last 3 steps and then steps of 128.
#[test]
fn a_sync_dense_trainer_killed_mid_pass_is_restarted_and_goes_on_from_its_position() {
    let job = Job::new();
    let flags = ["--max-restarts", "1", "--sync-dense", "true", "--sync-dense-batch", "341"];
    let out = job.launch("async", "trainer1:kill@step=42", &flags);
    let log = job.log("worker.1.log");
    assert!(log.contains("each batch cut in 4 step(s), in 8 for the first 25 after the warm-up"), "{log}");
    job.assert_trainer_rejoined(&out, 1);
}

/// Killed in the synchronous warm-up after an odd number of parts: the restarted trainer must
/// push the second part of the batch it was in, or the merged steps of the two trainers would
/// no longer pair up (and the job would hang).
#[test]
fn an_async_trainer_killed_in_the_warmup_rejoins_at_its_next_part() {
    let job = Job::new();
    let out = job.launch("async", "trainer0:kill@step=7", &["--max-restarts", "1"]);
    job.assert_trainer_rejoined(&out, 0);
}

/// In sync mode the survivor waits at the step; the restarted trainer pushes the batch after
/// its last one from the same parameters, so the model is the undisturbed run's, bit for bit.
/// Killed at step 10, inside what async mode's warm-up would be (`--sync-warmup 20`): sync
/// steps are whole batches all along.
#[test]
fn a_sync_trainer_killed_mid_pass_rejoins_at_the_barrier_and_the_model_is_unchanged() {
    let killed = Job::new();
    let out = killed.launch("sync", "trainer1:kill@step=10", &["--max-restarts", "1"]);
    let s = killed.assert_trainer_rejoined(&out, 1);
    let undisturbed = Job::new(); // the same generated data (a fixed seed)
    let plain = undisturbed.launch("sync", "", &[]);
    assert!(plain.status.success(), "{}", text(&plain));
    let u = undisturbed.summary();
    let (a, b) = (s.test.unwrap(), u.test.unwrap());
    assert_eq!((a.auc, a.loss), (b.auc, b.loss), "the restarted run's model differs");
}

/// Epoch fencing at the handshake: a client that has met epoch 1 of a server is refused by an
/// epoch-0 process, which then stops; a server of the current epoch is served as usual.
#[test]
fn a_replaced_server_is_fenced_by_a_client_that_met_its_successor() {
    let (tx, rx) = std::sync::mpsc::channel();
    let dir = tempfile::tempdir().unwrap();
    let policy =
        oar::server::shard_checkpoints::Policy { dir: dir.path().into(), every: Duration::from_secs(60), keep: 2 };
    let checkpoints = Some(policy.clone());
    let old = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap().to_string()).unwrap();
            let config = ServerConfig { exit_when_done: false, checkpoints, ..server_config(0, 1, 1, Mode::Async) };
            oar::server::run(vec![listener], config, std::future::pending()).await
        })
    });
    let addr: String = rx.recv().unwrap();
    let probe = |addr: &str, epoch: u64| {
        let config = ClientConfig::new(vec![addr.to_string()], "test", Duration::from_secs(5), Duration::from_secs(5));
        oar::client::probe(&config, 0, epoch)
    };
    // A claim of an epoch no restart recorded (a stray or hostile peer) stops nothing.
    let err = probe(&addr, 7).unwrap_err();
    assert!(matches!(err, oar::client::ClientError::Refused { code: ErrorCode::Handshake, .. }), "{err}");
    assert!(err.to_string().contains("epoch 7 claimed for server 0, which no restart of it recorded"), "{err}");
    probe(&addr, 0).unwrap();
    // Its successor claims the checkpoint folder before it serves; a client that met it then
    // reaches the old process.
    let fence = oar::server::shard_checkpoints::Fence { job: "test".into(), epoch: 1 };
    oar::server::shard_checkpoints::Checkpointer::new(policy, 0, fence).unwrap();
    let err = probe(&addr, 1).unwrap_err();
    assert!(matches!(err, oar::client::ClientError::Refused { code: ErrorCode::Fenced, .. }), "{err}");
    // The fenced server stops by itself, saying why.
    let stopped = old.join().unwrap().unwrap_err().to_string();
    assert!(stopped.contains("has been replaced by epoch 1"), "{stopped}");

    let current = start_server(ServerConfig { exit_when_done: false, epoch: 1, ..server_config(0, 1, 1, Mode::Async) });
    probe(&current.addr, 1).unwrap();
}

/// The checkpoint folder is fenced too: once epoch 1 has claimed it, epoch 0 (a stopped process
/// that was continued) can no longer publish a checkpoint there.
#[test]
fn a_replaced_server_cannot_publish_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let policy = Policy { dir: dir.path().to_path_buf(), every: Duration::from_secs(1), keep: 3 };
    let shard = crate::checkpoints::small_shard();
    let fence = |epoch| Fence { job: "job".into(), epoch };
    let mut old = Checkpointer::new(policy.clone(), 0, fence(0)).unwrap();
    old.write(oar::server::shard_checkpoints::Cut::of(&shard, 1)).unwrap();
    let mut new = Checkpointer::new(policy.clone(), 0, fence(1)).unwrap();
    let err = old.write(oar::server::shard_checkpoints::Cut::of(&shard, 2)).unwrap_err().to_string();
    assert!(err.contains("replaced by epoch 1"), "{err}");
    assert_eq!(new.write(oar::server::shard_checkpoints::Cut::of(&shard, 2)).unwrap().epoch, 1);
    // Another job's fence is not this job's: a fresh job may reuse the folder.
    let other = Fence { job: "another".into(), epoch: 0 };
    Checkpointer::new(policy, 0, other).unwrap();
    let published: Vec<String> = std::fs::read_dir(dir.path().join("server-0"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("ckpt-"))
        .collect();
    assert_eq!(published.len(), 2, "{published:?}");
}

/// A one-server, one-trainer sync job started by hand with `--recoverable` (as an engine would
/// start it) in `dir`, on `port`, with `fault` planted; returns (server, trainer) once both end.
pub(crate) fn recoverable_job(
    dir: &std::path::Path,
    port: u16,
    fault: &str,
    stop_server_at: Option<u64>,
) -> [std::process::Output; 2] {
    let out = dir.join("out");
    let (train, _) = gen_data(&dir.join("data"), 1, 10_000, 0);
    let oar = |args: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_oar"));
        cmd.args(args).args(["--recoverable", "--mode", "sync", "--job", "rerun"]).env("OAR_FAULT", fault);
        cmd.env_remove("OAR_LAUNCHED").stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
        cmd
    };
    let ckpt = out.join("checkpoints");
    let server = oar(&["pserver", "--host", "127.0.0.1", "--port", &port.to_string(), "--index", "0"])
        .args(["--num-servers", "1", "--trainers", "1", "--checkpoint-every", "0.05", "--checkpoint-dir"])
        .arg(&ckpt)
        .arg("--save-root")
        .arg(&out)
        .spawn()
        .unwrap();
    let trainer = oar(&["train", "--servers", &format!("127.0.0.1:{port}"), "--batch-size", "200", "--hidden", "16"])
        .arg("--train")
        .arg(&train)
        .arg("--output")
        .arg(&out)
        .spawn()
        .unwrap();
    let trainer = trainer.wait_with_output().unwrap();
    if let Some(version) = stop_server_at {
        // The trainer is dead and the server idle, waiting for it: once a checkpoint holds that
        // state, the server is killed too.
        let newest = || {
            let dir = oar::server::shard_checkpoints::server_dir(&ckpt, 0);
            let versions = std::fs::read_dir(dir).unwrap().flatten().filter_map(|e| {
                let entry = std::fs::read(e.path().join("entry.json")).ok()?;
                Some(serde_json::from_slice::<oar::server::shard_checkpoints::Entry>(&entry).ok()?.version)
            });
            versions.max()
        };
        wait_until(30, "a checkpoint of the server's last state", || newest() == Some(version));
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(server.id() as i32, libc::SIGKILL) }, 0);
    }
    [server.wait_with_output().unwrap(), trainer]
}

/// The whole job dies (trainer killed at step 20, then the idle server) and its command lines
/// are simply run again, as after a requeued batch job: the server finds its checkpoint and
/// goes on as epoch 1, the trainer finds its position and rejoins, and the model is the
/// undisturbed run's bit for bit.
#[test]
fn a_recoverable_job_run_again_after_dying_goes_on_where_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_ports(1);
    let [server, trainer] = recoverable_job(dir.path(), port, "trainer0:kill@step=20", Some(20));
    assert_eq!((server.status.code(), trainer.status.code()), (None, None), "both killed");
    let [server, trainer] = recoverable_job(dir.path(), port, "trainer0:kill@step=20", None);
    assert!(server.status.success() && trainer.status.success(), "{}\n{}", text(&server), text(&trainer));
    let log = text(&server);
    assert!(log.contains("going on from it") && log.contains("epoch=1"), "{log}");
    assert!(log.contains("resumed shard from a checkpoint") && log.contains("version=20"), "{log}");
    let log = text(&trainer);
    assert!(log.contains("rejoining: going on after the last recorded step"), "{log}");
    assert!(log.contains("trained 10000 samples"), "{log}");

    let undisturbed = tempfile::tempdir().unwrap();
    let [server, trainer] = recoverable_job(undisturbed.path(), free_ports(1), "", None);
    assert!(server.status.success() && trainer.status.success(), "{}\n{}", text(&server), text(&trainer));
    assert!(!text(&server).contains("going on from it"), "a fresh folder starts afresh");
    assert_same_params(&load_params(&dir.path().join("out")), &load_params(&undisturbed.path().join("out")), 0.0);
}

/// A finished `--recoverable` job run again with the same job id is a new run, not a restart of
/// the finished one: its server moves the old run's state aside and starts afresh, its trainer
/// trains its whole share again, and the model is the first run's bit for bit.
#[test]
fn a_finished_recoverable_job_run_again_is_a_new_run() {
    let dir = tempfile::tempdir().unwrap();
    let [server, trainer] = recoverable_job(dir.path(), free_ports(1), "", None);
    assert!(server.status.success() && trainer.status.success(), "{}\n{}", text(&server), text(&trainer));
    let first = load_params(&dir.path().join("out"));
    let [server, trainer] = recoverable_job(dir.path(), free_ports(1), "", None);
    assert!(server.status.success() && trainer.status.success(), "{}\n{}", text(&server), text(&trainer));
    let log = text(&server);
    assert!(log.contains("this job finished here before: a new run starts afresh"), "{log}");
    assert!(!log.contains("going on from it"), "{log}");
    let log = text(&trainer);
    assert!(log.contains("a new run starts afresh") && log.contains("trained 10000 samples"), "{log}");
    assert_same_params(&load_params(&dir.path().join("out")), &first, 0.0);
}

/// `oar launch --max-restarts` needs somewhere to checkpoint: without --output it is refused
/// before any process starts, never a restart from an empty shard.
#[test]
fn max_restarts_without_an_output_folder_is_refused() {
    let job = Job::with_parts(2, 100);
    let (train, logs) = (job.train.display().to_string(), job.logs().display().to_string());
    let out =
        oar(&["launch", "--servers", "1", "--workers", "2", "--max-restarts", "1", "--train", &train, "--logs", &logs]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--max-restarts needs --output and --checkpoint-every"), "{err}");
}

/// A trainer that stops on its own error (here a torn line in its part) is not restarted under
/// `--max-restarts`: it would read the same line again. The job fails at once naming the line
/// and why it was not restarted; before, the launcher restarted it into the same error until
/// its restarts ran out.
#[test]
fn a_trainer_that_fails_on_its_own_error_is_not_restarted_into_it() {
    let job = Job::new();
    let part = job.train.join("part-00001");
    let mut text_of_part = std::fs::read_to_string(&part).unwrap();
    let at = text_of_part.match_indices('\n').nth(99).unwrap().0 + 1;
    text_of_part.insert_str(at, "torn\n");
    std::fs::write(&part, text_of_part).unwrap();
    let out = job.launch("async", "", &["--checkpoint-every", "0.2", "--max-restarts", "2"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(!err.contains("restarting it"), "a restart:\n{err}");
    assert!(err.contains(oar::base::exit::NOT_RESTARTED), "{err}");
    assert!(err.contains("part-00001:101"), "the torn line is named:\n{err}");
}
