//! Supervising the processes of a launcher (`oar launch`'s local children, `oar cluster ssh`'s
//! ssh clients): one log file each, the protocol lines children print on stdout, fail-fast
//! checks, Ctrl-C, and the end-of-job summary both launchers print.
//!
//! Children talk to their launcher through stdout: `OAR_READY <addr>` when a server listens,
//! `OAR_PROGRESS <bytes> <samples>` from trainers, `OAR_RESULT <json>` when a trainer ends, and
//! `OAR_PID <pid>` from the wrapper that starts a process on a remote host. Everything else goes
//! to the log.
//!
//! Why stdout: servers bind port 0 and say where they listen, so no port is ever guessed, and no
//! sleep decides readiness. `oar launch` and `oar cluster ssh` share this supervision: for ssh
//! the child is the local ssh client, whose output is the remote log streamed back, so the same
//! lines arrive from another host.
//!
//! What happens when a child fails is its launcher's `Keeper`'s call (`FailFast` by default:
//! the job ends naming every failed child, those that stopped because a peer was lost last). A
//! child that stopped on its own error (exit status 1 or 2: `base::exit::fails_again`) is never
//! restarted, whichever keeper. The summary counts the restarts made and carries every server's
//! counters (`server_stats`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::{Deserialize, Serialize};

use crate::train::TrainReport;

/// The end-of-job summary.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LaunchSummary {
    /// Servers run.
    pub servers: usize,
    /// Trainers run.
    pub workers: usize,
    /// Samples trained on by all trainers.
    pub samples: u64,
    /// Whole job, start-up and evaluation included.
    pub wall_seconds: f64,
    /// `samples / wall_seconds`.
    pub samples_per_sec: f64,
    /// Samples per second inside the trainers' training loops (summed over trainers).
    pub train_loop_samples_per_sec: f64,
    /// Test figures after the last pass (trainer 0; the first head's with several heads).
    pub test: Option<crate::observe::metrics::EvalReport>,
    /// With several heads: every head's figures over the last pass (trainer 0), in the model's
    /// order (the first head's test figures are `test`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub heads: Vec<crate::train::HeadReport>,
    /// The last pass's training AUC over every trainer's samples (Paddle's buckets, merged on
    /// server 0), as trainer 0 read it.
    #[serde(default)]
    pub train_auc_all_trainers: Option<crate::train::AllTrainersAuc>,
    /// Async pushes discarded as stale.
    pub discarded_pushes: u64,
    /// How many updates behind the trainers' pushes arrived (async).
    pub staleness: crate::observe::metrics::Staleness,
    /// Every trainer's report.
    pub reports: Vec<TrainReport>,
    /// Processes restarted during the job (`oar launch --max-restarts`).
    #[serde(default)]
    pub restarts: Vec<Restart>,
    /// Every server's counters when it stopped (its last process's), in server order: what
    /// the servers applied, counted where it was applied (`applied_samples` per trainer).
    #[serde(default)]
    pub server_stats: Vec<crate::protocol::ServerStats>,
    /// Online training: every day's figures (trainer 0's).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub days: Vec<crate::train::DayReport>,
    /// Every process's Prometheus endpoint (`oar launch`): (process, URL).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub metrics: Vec<(String, String)>,
    /// The training curves drawn from the trainers' `metrics.csv` (a PNG), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub curves: Option<std::path::PathBuf>,
}

/// One restart of a failed process.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Restart {
    /// Which (`server 1`).
    pub process: String,
    /// The epoch it was restarted as.
    pub epoch: u64,
    /// Seconds into the job.
    pub at_seconds: f64,
    /// Why it had to be.
    pub cause: String,
    /// What it resumed from (a checkpoint folder or a saved model), if anything.
    pub from: Option<String>,
}

/// What a child has said so far.
#[derive(Default)]
pub(crate) struct ChildState {
    pub last_line: String,
    pub bytes: u64,
    pub samples: u64,
    pub result: Option<String>,
    /// The process id on the remote host, from a remote wrapper's `OAR_PID` line.
    pub remote_pid: Option<u32>,
    /// Where it serves Prometheus metrics, from its `OAR_METRICS` line.
    pub metrics: Option<String>,
}

/// A supervised child process.
pub(crate) struct Proc {
    pub name: String,
    pub child: Child,
    pub state: Arc<Mutex<ChildState>>,
    pub log: PathBuf,
}

impl Proc {
    /// A snapshot of what the child has said.
    pub fn with_state<T>(&self, f: impl FnOnce(&ChildState) -> T) -> T {
        f(&self.state.lock().expect("no panics under this lock"))
    }
}

/// A server's `OAR_READY` line: (the server's index, its address).
pub(crate) struct Ready(pub usize, pub String);

/// Starts `cmd` with its output parsed for protocol lines and the rest written to `log` (its
/// stdin is the caller's choice, and a piped stdin stays open as long as the `Proc`).
pub(crate) fn spawn(
    mut cmd: Command,
    name: &str,
    log: PathBuf,
    ready: Option<(usize, mpsc::Sender<Ready>)>,
) -> anyhow::Result<Proc> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
    let state = Arc::new(Mutex::new(ChildState::default()));
    let file = crate::base::state_file::create_plain(&log)?;
    let file = Arc::new(Mutex::new(std::io::LineWriter::new(file)));
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    for stream in [Box::new(stdout) as Box<dyn std::io::Read + Send>, Box::new(stderr)] {
        let (state, file, ready, name) = (state.clone(), file.clone(), ready.clone(), name.to_string());
        std::thread::spawn(move || {
            for line in BufReader::new(stream).lines() {
                let Ok(line) = line else { break };
                let mut st = state.lock().expect("no panics under this lock");
                if let Some(addr) = line.strip_prefix("OAR_READY ") {
                    if let Some((i, tx)) = &ready {
                        let _ = tx.send(Ready(*i, addr.trim().to_string()));
                    }
                } else if let Some(p) = line.strip_prefix("OAR_PROGRESS ") {
                    let mut n = p.split_whitespace().map(|x| x.parse::<u64>().ok());
                    if let (Some(Some(b)), Some(Some(s))) = (n.next(), n.next()) {
                        (st.bytes, st.samples) = (b, s);
                    }
                } else if let Some(r) = line.strip_prefix("OAR_RESULT ") {
                    st.result = Some(r.to_string());
                } else if let Some(addr) = line.strip_prefix("OAR_METRICS ") {
                    let url = format!("http://{}/metrics", addr.trim());
                    eprintln!("{name}: metrics at {url}");
                    st.metrics = Some(url);
                } else if let Some(pid) = line.strip_prefix("OAR_PID ") {
                    st.remote_pid = pid.trim().parse().ok();
                } else {
                    let _ = writeln!(file.lock().expect("no panics under this lock"), "{line}");
                    if !line.trim().is_empty() {
                        st.last_line = line;
                    }
                }
            }
        });
    }
    Ok(Proc { name: name.to_string(), child, state, log })
}

/// Kills (SIGKILL) and reaps every child.
pub(crate) fn kill_all(procs: &mut [Proc]) {
    for p in procs.iter_mut() {
        let _ = p.child.kill();
    }
    for p in procs.iter_mut() {
        let _ = p.child.wait();
    }
}

fn failure(p: &Proc, status: std::process::ExitStatus, cause: Option<String>) -> String {
    let last = p.with_state(|s| s.last_line.clone());
    let cause = cause.map(|c| format!(": {c}")).unwrap_or_default();
    format!("{} failed ({status}){cause}; last log line: {last} (full log: {})", p.name, p.log.display())
}

/// How a launcher keeps its children going: called on every poll, and for each child that
/// failed. The default gives up on the first failure.
pub(crate) trait Keeper {
    /// Every poll: may kill children found hung (they then fail like any other).
    fn tick(&mut self, _procs: &mut [Proc]) -> anyhow::Result<()> {
        Ok(())
    }
    /// Whether this keeper restarts failed children at all (`--max-restarts` above 0).
    fn restarts(&self) -> bool {
        false
    }
    /// Child `i` failed, and not on its own error ([`crate::base::exit::fails_again`], never
    /// restarted): `Ok(true)` once it has been restarted in its place.
    fn restart(&mut self, _procs: &mut [Proc], _i: usize, _status: std::process::ExitStatus) -> anyhow::Result<bool> {
        Ok(false)
    }
    /// Why child `i` failed, when the keeper knows more than its exit status (it killed it).
    fn cause(&self, _i: usize) -> Option<String> {
        None
    }
}

/// Fails the job as soon as any child fails.
pub(crate) struct FailFast;

impl Keeper for FailFast {}

/// The process's flag set by Ctrl-C (and SIGTERM), the same for every caller: a handler can be
/// set only once, and a second launch in one process (`oar bench` runs many) used to get a flag
/// of its own that nothing set, so Ctrl-C was swallowed.
pub(crate) fn interrupt_flag() -> Arc<AtomicBool> {
    static FLAG: std::sync::OnceLock<Arc<AtomicBool>> = std::sync::OnceLock::new();
    FLAG.get_or_init(|| {
        let interrupted = Arc::new(AtomicBool::new(false));
        let flag = interrupted.clone();
        // Fails only if a handler not of oar's is set; Ctrl-C then keeps that one.
        let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
        interrupted
    })
    .clone()
}

/// Returns the indices of children that exited successfully; fails (after stopping nothing:
/// the caller stops everyone) when one failed or Ctrl-C was pressed.
pub(crate) fn check_children(
    procs: &mut [Proc],
    interrupted: &AtomicBool,
    keeper: &mut dyn Keeper,
) -> anyhow::Result<Vec<usize>> {
    if interrupted.load(Ordering::SeqCst) {
        anyhow::bail!("interrupted (Ctrl-C): stopping every server and worker");
    }
    keeper.tick(procs)?;
    let mut done = Vec::new();
    let mut failed = Vec::new();
    for i in 0..procs.len() {
        let p = &mut procs[i];
        if let Some(status) = p.child.try_wait().with_context(|| format!("cannot wait for {}", p.name))? {
            if status.success() {
                done.push(i);
            } else if crate::base::exit::fails_again(&status) || !keeper.restart(procs, i, status)? {
                failed.push((i, status));
            }
        }
    }
    if failed.is_empty() {
        return Ok(done);
    }
    // Children that fail together are all named: a trainer's error and the servers' report of
    // losing it come within milliseconds (through different ssh sessions, in either order), so
    // the others get a moment to end too. It also lets the pipe readers flush last words.
    std::thread::sleep(Duration::from_millis(300));
    for (i, p) in procs.iter_mut().enumerate() {
        if let (false, Ok(Some(status))) = (failed.iter().any(|f| f.0 == i), p.child.try_wait()) {
            if !status.success() {
                failed.push((i, status));
            }
        }
    }
    // The cause first: a child that stopped because another was lost (exit status 3, set by
    // the child from its error's type) after the children that failed on their own.
    failed.sort_by_key(|&(_, status)| status.code() == Some(crate::base::exit::PEER_LOST));
    let cause = |i: usize, status: std::process::ExitStatus| {
        let left = keeper.restarts() && crate::base::exit::fails_again(&status);
        keeper.cause(i).or_else(|| left.then(|| crate::base::exit::NOT_RESTARTED.to_string()))
    };
    let all: Vec<String> = failed.iter().map(|&(i, status)| failure(&procs[i], status, cause(i, status))).collect();
    anyhow::bail!("{}", all.join("; also "))
}

/// Waits until every trainer in `procs[first_worker..]` has exited successfully, showing their
/// summed progress on `bar`; fails as soon as any child fails or Ctrl-C is pressed.
pub(crate) fn wait_for_trainers(
    procs: &mut [Proc],
    first_worker: usize,
    interrupted: &AtomicBool,
    keeper: &mut dyn Keeper,
    bar: &indicatif::ProgressBar,
    show: impl Fn(u64, u64) -> u64,
) -> anyhow::Result<()> {
    let mut workers_done = vec![false; procs.len() - first_worker];
    loop {
        let done = check_children(procs, interrupted, keeper)?;
        for (w, d) in workers_done.iter_mut().enumerate() {
            *d |= done.contains(&(first_worker + w));
        }
        let (bytes, samples) = procs[first_worker..]
            .iter()
            .map(|p| p.with_state(|s| (s.bytes, s.samples)))
            .fold((0, 0), |(b, s), (b1, s1)| (b + b1, s + s1));
        bar.set_position(show(bytes, samples));
        if workers_done.iter().all(|d| *d) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Servers stop by themselves once every trainer has closed: waits up to 30 s for
/// `procs[..servers]` to exit (failing if one fails).
pub(crate) fn wait_for_servers(
    procs: &mut [Proc],
    servers: usize,
    interrupted: &AtomicBool,
    keeper: &mut dyn Keeper,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while procs[..servers].iter_mut().any(|p| matches!(p.child.try_wait(), Ok(None))) && Instant::now() < deadline {
        check_children(procs, interrupted, keeper)?;
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// The trainers' reports and the job's figures, also written to `logs/summary.json`.
pub(crate) fn summarize(
    servers: &[Proc],
    workers: &[Proc],
    wall: f64,
    logs: &Path,
    restarts: Vec<Restart>,
    curves: Option<std::path::PathBuf>,
) -> anyhow::Result<LaunchSummary> {
    // The pipe readers may still be draining the last lines of an exited child.
    let deadline = Instant::now() + Duration::from_secs(5);
    let result = |p: &Proc| -> anyhow::Result<String> {
        loop {
            if let Some(r) = p.with_state(|s| s.result.clone()) {
                return Ok(r);
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} ended without reporting a result (see {})",
                p.name,
                p.log.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let mut reports = Vec::new();
    for p in workers {
        reports.push(
            serde_json::from_str::<TrainReport>(&result(p)?)
                .with_context(|| format!("{} reported a malformed result", p.name))?,
        );
    }
    let mut server_stats = Vec::new();
    for p in servers {
        server_stats.push(
            serde_json::from_str::<crate::protocol::ServerStats>(&result(p)?)
                .with_context(|| format!("{} reported malformed counters", p.name))?,
        );
    }
    let samples = reports.iter().map(|r| r.samples).sum();
    let loop_rate = reports.iter().map(|r| r.samples as f64 / r.train_seconds.max(1e-9)).sum();
    let last = reports.first().and_then(|r| r.passes.last());
    let test = last.and_then(|p| p.test.clone());
    let heads = last.map(|p| p.heads.clone()).unwrap_or_default();
    let train_auc_all_trainers = last.and_then(|p| p.all_trainers.clone());
    let summary = LaunchSummary {
        servers: servers.len(),
        workers: workers.len(),
        samples,
        wall_seconds: wall,
        samples_per_sec: samples as f64 / wall,
        train_loop_samples_per_sec: loop_rate,
        test,
        heads,
        train_auc_all_trainers,
        discarded_pushes: reports.iter().map(|r| r.discarded_pushes).sum(),
        staleness: reports.iter().fold(Default::default(), |mut all: crate::observe::metrics::Staleness, r| {
            all.merge(&r.staleness);
            all
        }),
        days: reports.first().map(|r| r.days.clone()).unwrap_or_default(),
        reports,
        restarts,
        server_stats,
        metrics: servers
            .iter()
            .chain(workers)
            .filter_map(|p| Some((p.name.clone(), p.with_state(|s| s.metrics.clone())?)))
            .collect(),
        curves,
    };
    crate::base::state_file::write_json(&logs.join("summary.json"), &summary)?;
    Ok(summary)
}
