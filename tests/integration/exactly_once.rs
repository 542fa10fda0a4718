//! Every update applied exactly once, counted where it is applied: a 2-server, 2-trainer job
//! started by hand (as an engine starts one, `--recoverable`), trainer 1 killed with its push
//! pending at both servers (`OAR_FAULT=trainer1:kill@sent=N`), then started again with the
//! same command line. Whichever comes first, the survivor completing the step with the dead
//! process's push or the restart sending it again, the step counts the push once: the model is
//! an undisturbed run's bit for bit, and each server applied every sample of the data once.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::Duration;

use crate::util::*;
use oar::client::{Client, ClientConfig};
use oar::server::ServerStats;

const LINES_PER_TRAINER: u64 = 8_000;
const BATCH: u64 = 200;
/// The step trainer 1 dies in, with its push sent.
const KILLED_AT: u64 = 15;

struct HandJob {
    dir: PathBuf,
    train: PathBuf,
    ports: u16,
    mode: &'static str,
    /// More trainer flags (`--shuffle`).
    extra: &'static [&'static str],
}

impl HandJob {
    fn new(dir: &Path, mode: &'static str, extra: &'static [&'static str]) -> HandJob {
        let (train, _) = gen_data(&dir.join("data"), 2, LINES_PER_TRAINER, 0);
        HandJob { dir: dir.to_path_buf(), train, ports: free_ports(2), mode, extra }
    }

    fn out(&self) -> PathBuf {
        self.dir.join("out")
    }

    fn addrs(&self) -> Vec<String> {
        (0..2).map(|k| format!("127.0.0.1:{}", self.ports + k)).collect()
    }

    fn oar(&self, args: &[&str], fault: &str, log: &str) -> Child {
        let all = [args, &["--recoverable", "--mode", self.mode, "--job", "exactly-once"]].concat();
        spawn_oar(&self.dir, &all, fault, log)
    }

    fn server(&self, k: u16) -> Child {
        let out = self.out();
        let port = (self.ports + k).to_string();
        let index = k.to_string();
        let args = ["pserver", "--host", "127.0.0.1", "--port", &port, "--index", &index, "--num-servers", "2"];
        let more = ["--trainers", "2", "--checkpoint-every", "600", "--checkpoint-dir"];
        let ckpt = out.join("checkpoints").display().to_string();
        let root = out.display().to_string();
        let all: Vec<&str> = args.iter().chain(&more).copied().chain([ckpt.as_str(), "--save-root", &root]).collect();
        self.oar(&all, "", &format!("server.{k}.log"))
    }

    fn trainer(&self, k: u16, fault: &str, log: &str) -> Child {
        let (servers, id) = (self.addrs().join(","), k.to_string());
        let (train, out) = (self.train.display().to_string(), self.out().display().to_string());
        let args = ["train", "--servers", &servers, "--trainers", "2", "--trainer-id", &id, "--train", &train];
        let more = ["--output", &out, "--batch-size", "200", "--hidden", "16", "--sync-warmup", "40"];
        let all: Vec<&str> = args.iter().chain(&more).chain(self.extra).copied().collect();
        self.oar(&all, fault, log)
    }

    fn stats(&self) -> Vec<ServerStats> {
        let config = ClientConfig::new(self.addrs(), "exactly-once", Duration::from_secs(5), Duration::from_secs(5));
        Client::connect(&config).and_then(|mut c| c.stats()).unwrap_or_default()
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    /// Waits for every child, asserting each succeeded; returns the servers' final counters.
    fn finish(&self, children: Vec<(&str, Child)>) -> Vec<ServerStats> {
        let mut stats = Vec::new();
        for (name, mut child) in children {
            let status = child.wait().unwrap();
            let log = self.log(name);
            assert!(status.success(), "{name} failed:\n{log}");
            if let Some(line) = log.lines().find_map(|l| l.strip_prefix("OAR_RESULT ")) {
                if name.starts_with("server") {
                    stats.push(serde_json::from_str(line).unwrap());
                }
            }
        }
        stats
    }

    /// An undisturbed run.
    fn undisturbed(&self) -> Vec<ServerStats> {
        let children = vec![
            ("server.0.log", self.server(0)),
            ("server.1.log", self.server(1)),
            ("worker.0.log", self.trainer(0, "", "worker.0.log")),
            ("worker.1.log", self.trainer(1, "", "worker.1.log")),
        ];
        self.finish(children)
    }

    /// Trainer 1 killed with its push of step `KILLED_AT` sent; `survivor_first`: the survivor
    /// completes that step before the restart starts, else the restart sends it again while it
    /// still waits (trainer 0 stopped meanwhile).
    fn disturbed(&self, survivor_first: bool) -> Vec<ServerStats> {
        let (s0, s1) = (self.server(0), self.server(1));
        // Trainer 0 stops itself before its own push of that step when the restart must come first.
        let t0_fault = if survivor_first { String::new() } else { format!("trainer0:stop@step={KILLED_AT}") };
        let t0 = self.trainer(0, &t0_fault, "worker.0.log");
        let mut t1 = self.trainer(1, &format!("trainer1:kill@sent={KILLED_AT}"), "worker.1.first.log");
        let status = t1.wait().unwrap();
        assert_eq!(status.code(), None, "trainer 1 was killed:\n{}", self.log("worker.1.first.log"));
        let pending = |s: &ServerStats| s.pushes == 2 * s.version + 1;
        if survivor_first {
            // The survivor's push completes the step with the dead process's push in it.
            wait_until(60, "the step completed by the survivor", || {
                self.stats().iter().filter(|s| s.version > KILLED_AT).count() == 2
            });
        } else {
            wait_until(60, "trainer 1's push pending at both servers", || {
                let stats = self.stats();
                stats.len() == 2 && stats.iter().all(|s| s.version == KILLED_AT && pending(s))
            });
        }
        let t1 = self.trainer(1, "", "worker.1.log");
        if !survivor_first {
            // The restart's copy of the push has arrived (a second push of trainer 1 in the step).
            wait_until(60, "the restart's push", || {
                self.stats().iter().filter(|s| s.pushes == 2 * s.version + 2).count() == 2
            });
            // SAFETY: signalling our own child process.
            assert_eq!(unsafe { libc::kill(t0.id() as i32, libc::SIGCONT) }, 0);
        }
        let children = vec![("server.0.log", s0), ("server.1.log", s1), ("worker.0.log", t0), ("worker.1.log", t1)];
        self.finish(children)
    }
}

fn assert_exactly_once(mode: &'static str, survivor_first: bool) {
    assert_exactly_once_with(mode, survivor_first, &[]);
}

/// As [`assert_exactly_once`], the trainers given `extra` flags; returns the disturbed run's model.
fn assert_exactly_once_with(mode: &'static str, survivor_first: bool, extra: &'static [&'static str]) -> Params {
    let disturbed = tempfile::tempdir().unwrap();
    let job = HandJob::new(disturbed.path(), mode, extra);
    let stats = job.disturbed(survivor_first);
    assert!(job.log("worker.1.log").contains("rejoining"), "{}", job.log("worker.1.log"));
    assert_eq!(stats.len(), 2, "both servers reported their counters");
    for (k, s) in stats.iter().enumerate() {
        let handled: Vec<u64> = s.applied_samples.iter().zip(&s.discarded_samples).map(|(a, d)| a + d).collect();
        assert_eq!(handled, vec![LINES_PER_TRAINER; 2], "server {k} took every sample once: {s:?}");
        if mode == "sync" {
            assert_eq!(s.applied_samples, vec![LINES_PER_TRAINER; 2], "server {k} applied every sample once: {s:?}");
        }
        assert_eq!(s.repeats, u64::from(survivor_first), "server {k}: the resent push answered from the ledger");
    }
    let params = load_params(&job.out());
    if mode == "async" {
        return params; // past the warm-up, async updates depend on timing: no reference to equal
    }
    for (k, s) in stats.iter().enumerate() {
        assert_eq!(s.version, LINES_PER_TRAINER / BATCH, "server {k}: one update per step");
    }
    let undisturbed = tempfile::tempdir().unwrap();
    let reference = HandJob::new(undisturbed.path(), mode, extra);
    let clean = reference.undisturbed();
    assert_eq!(
        clean.iter().map(|s| s.version).collect::<Vec<_>>(),
        stats.iter().map(|s| s.version).collect::<Vec<_>>()
    );
    assert_same_params(&params, &load_params(&reference.out()), 0.0);
    params
}

/// Sync: the survivor completes the step with the dead process's push; the restart's copy is
/// answered from the ledger, not applied again.
#[test]
fn sync_a_trainer_killed_with_its_push_pending_after_the_survivor_completes_the_step_counts_once() {
    assert_exactly_once("sync", true);
}

/// Sync: the restart sends the push again while the step still waits (the survivor stopped):
/// the copy takes the first one's place.
#[test]
fn sync_a_trainer_killed_with_its_push_pending_and_restarted_before_the_step_completes_counts_once() {
    assert_exactly_once("sync", false);
}

/// Async mode's synchronous warm-up (40 merged updates, so step 15 is inside it): the merged
/// steps of the two trainers stay paired and the job finishes.
#[test]
fn async_warmup_a_trainer_killed_with_its_merged_push_pending_counts_once_and_the_job_finishes() {
    assert_exactly_once("async", true);
}

/// A shuffled pass: the restarted trainer reads its share in the same order and leaves out the
/// samples it pushed, so each server applies every sample once and the model is the undisturbed
/// shuffled run's bit for bit; and the shuffle took effect (the model is not the unshuffled one's).
#[test]
fn sync_shuffled_a_trainer_killed_and_restarted_reads_the_same_order_and_counts_once() {
    let shuffled = assert_exactly_once_with("sync", true, &["--shuffle"]);
    let dir = tempfile::tempdir().unwrap();
    let in_order = HandJob::new(dir.path(), "sync", &[]);
    in_order.undisturbed();
    assert_ne!(shuffled.dense, load_params(&in_order.out()).dense, "the shuffled run trained another order");
}
