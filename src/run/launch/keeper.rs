//! The launcher's `Keeper` (`JobKeeper`): a heartbeat on every server, and the restarts of failed
//! servers and trainers (`oar launch --max-restarts N`, N restarts in all).
//!
//! The heartbeat thread probes every server each second (a handshake and a `Stats` request, 2 s
//! to answer); a server that misses three in a row is taken for stopped or hung and killed
//! (SIGKILL ends a stopped process too, so it can never come back), and then fails like any
//! other child. A failed server is started again with its first command line, which says
//! `--recoverable` as under the engines: the launcher adds only the port it had (the first one
//! asked for any free port) and the next epoch it counted, and the server goes on from its
//! newest checkpoint while the trainers wait. A failed trainer is started again with its first
//! command line too (log `worker.W.restart-N.log`) and goes on from its recorded position while
//! the servers wait. One that stopped on its own error is not restarted (see
//! `run/supervise.rs`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::children::child;
use super::LaunchConfig;
use crate::run::supervise::{spawn, Keeper, Proc, Ready};

/// A server that answers no heartbeat for this many probes in a row is taken for hung.
const HEARTBEAT_MISSES: u32 = 3;
/// Time between heartbeats, and the longest wait for each.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(1);
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(2);

/// A server's place as the heartbeat sees it.
#[derive(Clone, Default)]
struct Watched {
    addr: String,
    epoch: u64,
    /// Listening (its `OAR_READY` seen since it last started).
    ready: bool,
    /// Heartbeats missed in a row.
    misses: u32,
}

/// Keeps the processes of a launch going: a heartbeat thread probes each server, the keeper
/// kills one that stopped answering (a stopped or hung process), and restarts a server that
/// died from its newest checkpoint under the next epoch, on the same port, while trainers wait;
/// a trainer that died is restarted to go on from its recorded position while servers wait for
/// it to rejoin (up to `--max-restarts` restarts in all).
pub(super) struct JobKeeper {
    servers: usize,
    max_restarts: usize,
    job: String,
    program: crate::base::program::Program,
    pub(super) env: Vec<(String, String)>,
    /// The job's secret, for the heartbeat's probes.
    pub(super) secret: Option<crate::security::auth::Secret>,
    /// TLS to the servers (`oar launch --tls`), for the heartbeat's probes.
    pub(super) tls: Option<crate::security::tls::ClientTls>,
    logs: PathBuf,
    checkpoints: Option<PathBuf>,
    /// Each server's command line as first started.
    pub(super) args: Vec<Vec<String>>,
    /// Each trainer's command line as first started.
    pub(super) worker_args: Vec<Vec<String>>,
    /// Restarts of each trainer so far.
    worker_lives: Vec<u64>,
    watched: std::sync::Arc<std::sync::Mutex<Vec<Watched>>>,
    ready: Option<(mpsc::Sender<Ready>, mpsc::Receiver<Ready>)>,
    /// Why the keeper killed a server, by index.
    killed: Vec<Option<String>>,
    pub(super) restarts: Vec<crate::run::supervise::Restart>,
    started: Instant,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    heartbeat: Option<std::thread::JoinHandle<()>>,
}

impl JobKeeper {
    pub(super) fn new(config: &LaunchConfig, job: &str) -> JobKeeper {
        JobKeeper {
            servers: config.servers,
            max_restarts: config.max_restarts,
            job: job.to_string(),
            program: config.program.clone(),
            env: config.child_env.clone(),
            secret: None,
            tls: None,
            logs: config.logs.clone(),
            checkpoints: config.checkpoint_every.and(config.output.as_ref()).map(|o| o.join("checkpoints")),
            args: Vec::new(),
            worker_args: Vec::new(),
            worker_lives: vec![0; config.workers],
            watched: Default::default(),
            ready: None,
            killed: vec![None; config.servers],
            restarts: Vec::new(),
            started: Instant::now(),
            stop: Default::default(),
            heartbeat: None,
        }
    }

    /// A child of this launch running `args`.
    pub(super) fn command(&self, args: &[String]) -> Command {
        child(&self.program, args, &self.env)
    }

    /// Starts the heartbeat on the listening servers.
    pub(super) fn watch(&mut self, addrs: Vec<String>, tx: mpsc::Sender<Ready>, rx: mpsc::Receiver<Ready>) {
        *self.watched.lock().expect("no panics under this lock") =
            addrs.into_iter().map(|addr| Watched { addr, ready: true, ..Watched::default() }).collect();
        self.ready = Some((tx, rx));
        let (watched, stop, job, servers) = (self.watched.clone(), self.stop.clone(), self.job.clone(), self.servers);
        let (secret, tls) = (self.secret.clone(), self.tls.clone());
        self.heartbeat = std::thread::Builder::new()
            .name("oar-heartbeat".into())
            .spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let places = watched.lock().expect("no panics under this lock").clone();
                    let addrs = places.iter().map(|w| w.addr.clone()).collect();
                    let config = crate::client::ClientConfig {
                        secret: secret.clone(),
                        tls: tls.clone(),
                        ..crate::client::ClientConfig::new(addrs, &job, HEARTBEAT_TIMEOUT, HEARTBEAT_TIMEOUT)
                    };
                    debug_assert_eq!(places.len(), servers);
                    for (i, w) in places.iter().enumerate().filter(|(_, w)| w.ready) {
                        let answered = crate::client::probe(&config, i, w.epoch).is_ok();
                        let mut all = watched.lock().expect("no panics under this lock");
                        // Counted only against the process probed (not one restarted meanwhile).
                        if all[i].epoch == w.epoch && all[i].ready {
                            all[i].misses = if answered { 0 } else { all[i].misses + 1 };
                        }
                    }
                    std::thread::sleep(HEARTBEAT_EVERY);
                }
            })
            .ok();
    }

    pub(super) fn stop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = self.heartbeat.take() {
            let _ = h.join();
        }
    }

    /// The restarted server's command line: its first one (it is `--recoverable`, so it works
    /// out from its checkpoint folder what to resume from and which trainers have closed or
    /// ended the pass, as an engine's restart does), on the port it had (the first one asked
    /// for any free port), and at least at the next epoch (the keeper's count: a process that
    /// died before claiming its folder must not leave two lives one epoch).
    fn restart_args(&self, i: usize, epoch: u64) -> Vec<String> {
        let addr = self.watched.lock().expect("no panics under this lock")[i].addr.clone();
        let port = addr.rsplit_once(':').map_or("0", |(_, p)| p).to_string();
        let mut args = self.args[i].clone();
        if let Some(at) = args.iter().position(|a| a == "--port") {
            args[at + 1] = port;
        }
        args.extend(["--epoch".into(), epoch.to_string()]);
        args
    }

    /// The checkpoint folder a restarted server `i` goes on from, if it holds one of this job
    /// (for the summary: the server itself finds it).
    fn resumed_from(&self, i: usize) -> Option<String> {
        let dir = self.checkpoints.as_ref()?;
        let life = crate::server::shard_checkpoints::earlier_life(dir, i, &self.job);
        let life = life.inspect_err(|e| tracing::error!("{e}")).ok().flatten()?;
        life.checkpoint.then(|| dir.display().to_string())
    }
}

impl JobKeeper {
    /// Restarts failed trainer `w` (child `i`) to rejoin from its recorded position.
    fn restart_worker(
        &mut self,
        procs: &mut [Proc],
        i: usize,
        w: usize,
        status: std::process::ExitStatus,
    ) -> anyhow::Result<()> {
        self.worker_lives[w] += 1;
        let life = self.worker_lives[w];
        // Its first command line: `--recoverable`, it finds its position record and rejoins.
        let args = self.worker_args[w].clone();
        let cause = status.to_string();
        tracing::warn!(worker = w, life, "worker {w} failed ({cause}); restarting it");
        eprintln!("worker {w} failed ({cause}); restarting it to go on from its recorded position");
        let log = self.logs.join(format!("worker.{w}.restart-{life}.log"));
        procs[i] = spawn(self.command(&args), &format!("worker {w} (restart {life})"), log, None)?;
        let from = args.iter().position(|a| a == "--position-dir").map(|at| args[at + 1].clone());
        self.restarts.push(crate::run::supervise::Restart {
            process: format!("worker {w}"),
            epoch: life,
            at_seconds: self.started.elapsed().as_secs_f64(),
            cause,
            from,
        });
        Ok(())
    }
}

impl Keeper for JobKeeper {
    fn tick(&mut self, procs: &mut [Proc]) -> anyhow::Result<()> {
        if let Some((_, rx)) = &self.ready {
            while let Ok(Ready(i, _)) = rx.try_recv() {
                let mut watched = self.watched.lock().expect("no panics under this lock");
                watched[i].ready = true;
                watched[i].misses = 0;
            }
        }
        let hung: Vec<usize> = {
            let watched = self.watched.lock().expect("no panics under this lock");
            (0..watched.len()).filter(|&i| watched[i].ready && watched[i].misses >= HEARTBEAT_MISSES).collect()
        };
        for i in hung {
            let silent = HEARTBEAT_MISSES as u64 * (HEARTBEAT_EVERY + HEARTBEAT_TIMEOUT).as_secs();
            let why = format!("it answered no heartbeat for about {silent} s (stopped or hung), so it was killed");
            tracing::error!(server = i, "server {i}: {why}");
            self.killed[i] = Some(why);
            self.watched.lock().expect("no panics under this lock")[i].ready = false;
            // SIGKILL ends a stopped process too; its sockets close, so trainers notice at once.
            let _ = procs[i].child.kill();
            let _ = procs[i].child.wait();
        }
        Ok(())
    }

    fn restarts(&self) -> bool {
        self.max_restarts > 0
    }

    fn restart(&mut self, procs: &mut [Proc], i: usize, status: std::process::ExitStatus) -> anyhow::Result<bool> {
        if self.restarts.len() >= self.max_restarts || self.ready.is_none() {
            return Ok(false);
        }
        if i >= self.servers {
            let w = i - self.servers;
            if w >= self.worker_args.len() {
                return Ok(false); // failed while the trainers were still being started
            }
            self.restart_worker(procs, i, w, status)?;
            return Ok(true);
        }
        let epoch = self.watched.lock().expect("no panics under this lock")[i].epoch + 1;
        let args = self.restart_args(i, epoch);
        let from = self.resumed_from(i);
        let cause = self.killed[i].take().unwrap_or_else(|| status.to_string());
        let at = self.started.elapsed().as_secs_f64();
        tracing::warn!(server = i, epoch, "server {i} failed ({cause}); restarting it");
        eprintln!("server {i} failed ({cause}); restarting it as epoch {epoch}");
        let log = self.logs.join(format!("server.{i}.epoch-{epoch}.log"));
        let tx = self.ready.as_ref().map(|(tx, _)| tx.clone()).expect("checked above");
        procs[i] = spawn(self.command(&args), &format!("server {i} (epoch {epoch})"), log, Some((i, tx)))?;
        {
            let mut watched = self.watched.lock().expect("no panics under this lock");
            watched[i].epoch = epoch;
            watched[i].ready = false;
            watched[i].misses = 0;
        }
        self.restarts.push(crate::run::supervise::Restart {
            process: format!("server {i}"),
            epoch,
            at_seconds: at,
            cause,
            from,
        });
        Ok(true)
    }

    fn cause(&self, i: usize) -> Option<String> {
        self.killed.get(i).cloned().flatten()
    }
}
