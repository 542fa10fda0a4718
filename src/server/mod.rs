//! The parameter server: accepts trainer connections and serves pulls, pushes, barriers and
//! saves on its [`Shard`].
//!
//! [`run`] is a driver: `restore` (the state the server starts with, from its configuration, its
//! resume and its predecessor's record), the metrics endpoint, `start_checkpoints` (the checkpoint
//! thread, fed by `State::cut`), an accept loop per port (`accept.rs`), then whichever of
//! `ends.rs`'s futures comes first. A connection's frames go through `conn.rs` to the handlers of
//! `requests.rs`, `push.rs` and `members.rs`.
//!
//! Concurrency: one tokio task per connection; all state lives in one `State` shared by `Arc`
//! (no globals). Locks are parking_lot/std mutexes held only for in-memory work and never across
//! an `.await`; waiting (sync steps, barriers) goes through `watch` channels with a timeout whose
//! error names the trainers that did not arrive.
//!
//! Sync mode: a push for step `s` is parked until every active trainer has pushed step `s`; the
//! last arrival merges the gradients in trainer order (so the sum is the same whatever the
//! arrival order), applies one update, and every parked push is answered. Async mode: a push is
//! applied at once, unless it was computed from parameters more than `lag_ratio x trainers`
//! updates old, in which case it is discarded and counted; pushes marked `sync` (the warm-up's
//! steps) take the sync path there too.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use anyhow::Context;
use parking_lot::{Mutex, RwLock};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::protocol::{ErrorCode, Response, ServerStats};
use crate::server::ledger::TrainerLedger;
use crate::table::Shard;

mod accept;
mod config;
mod conn;
mod ends;
mod geo;
pub mod ledger;
mod members;
mod push;
mod replies;
mod requests;
mod resume;
mod senders;
pub mod shard_checkpoints;
mod shares;
pub mod sync;
mod telemetry;
mod waiting;

pub use config::{Limits, ServerConfig};
pub use requests::inside;
use resume::{load_resume_shard, Resumed};
use sync::SyncStep;

#[derive(Default)]
struct Counters {
    version: AtomicU64,
    discarded: AtomicU64,
    pulls: AtomicU64,
    pushes: AtomicU64,
    keys_pulled: AtomicU64,
    keys_pushed: AtomicU64,
    push_bytes: AtomicU64,
    /// Bytes of the requests read and the replies written (frames, headers included).
    frame_bytes_in: AtomicU64,
    frame_bytes_out: AtomicU64,
    port_requests: Vec<AtomicU64>,
    staleness: StalenessCounts,
}

/// Async pushes counted by how many updates behind they arrived (see `Staleness::BUCKETS`).
struct StalenessCounts([AtomicU64; crate::observe::metrics::Staleness::BUCKETS]);

impl Default for StalenessCounts {
    fn default() -> Self {
        StalenessCounts(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

struct State {
    config: ServerConfig,
    /// Connections ended by an error, logged once a second at most: a peer opening and
    /// breaking connections in a loop cannot flood the log.
    broken: Mutex<conn::Quiet>,
    /// Per pass (the last few), each trainer's histogram of its training predictions, for the
    /// pass's AUC over all trainers (`Request::PassAuc`, on server 0).
    pass_auc: Mutex<BTreeMap<u64, BTreeMap<u64, crate::observe::metrics::AucBuckets>>>,
    /// (index, number of servers), once known.
    place: Mutex<Option<(usize, usize)>>,
    /// The model description of the first declaration, for the final manifest.
    model: Mutex<serde_json::Value>,
    /// The online calendar of the first declaration that had one.
    calendar: Mutex<Vec<crate::protocol::ListedDay>>,
    /// What the shard was loaded from, for declarations to be compared with.
    start: requests::Start,
    shard: Mutex<Option<Arc<Shard>>>,
    counters: Counters,
    sync: Mutex<SyncStep>,
    /// Number of sync steps applied.
    applied: watch::Sender<u64>,
    /// Barrier epoch reached per trainer.
    barrier: Mutex<BTreeMap<u64, u64>>,
    /// Bumped whenever barrier or membership state changes, to wake waiters.
    changed: watch::Sender<u64>,
    closed: Mutex<BTreeSet<u64>>,
    all_closed: watch::Sender<bool>,
    /// Trainers whose handshake named them (`Hello::trainer`).
    arrived: Mutex<BTreeSet<u64>>,
    /// Open connections per trainer (a trainer holds one per server port).
    connections: Mutex<BTreeMap<u64, usize>>,
    /// Trainers whose last connection ended before they closed (failed or killed), and since
    /// when.
    lost: watch::Sender<BTreeMap<u64, std::time::Instant>>,
    /// The newer epoch of this server a client has met: this process has been replaced.
    fenced: watch::Sender<Option<u64>>,
    /// What this server has done with each trainer's pushes (see [`crate::server::ledger`]).
    ledgers: Vec<Mutex<TrainerLedger>>,
    /// The last online day end (its pass) whose shrink the shard holds: each day end's shrink
    /// is applied once (taken after `gate`, kept in the checkpoints' cut).
    day_end: Mutex<u64>,
    /// Shared by every update, exclusive for a checkpoint's snapshot: a checkpoint holds whole
    /// updates, and the ledgers and version that match them.
    gate: RwLock<()>,
    /// Why a sync step could not be applied, for its waiters (the last few steps).
    step_errors: Mutex<BTreeMap<u64, (ErrorCode, String)>>,
    /// Held while the trainers' record is written, so records land in order.
    recording: Mutex<()>,
    /// Connections open now (bounded by `--max-connections`).
    open: AtomicUsize,
    /// Connections per address whose handshake has not completed (bounded by
    /// `--max-pending-per-address`).
    pending: Arc<crate::base::per_address::PerAddress>,
    /// Connections that have not sent their first frame, oldest first: the oldest is closed to
    /// take a new connection when every place is taken.
    waiting: waiting::Waiting,
    /// Latencies and checkpoint times for the metrics endpoint.
    telemetry: telemetry::Telemetry,
    /// What every connection's receive buffer holds, within `--max-receive-mb`.
    buffers: std::sync::Arc<crate::protocol::BufferBudget>,
    /// Each peer's share of the connections and of `buffers` (see `shares`).
    shares: shares::Shares,
    /// GEO mode: the rows pushes changed, for each trainer to pull back; made on first use.
    changes: Mutex<Option<geo::ChangeLog>>,
    /// The tables came from a checkpoint or a saved model (what changed before is not known).
    restored: bool,
}

type Reply = Result<Answer, (ErrorCode, String)>;

/// What a handler answers: a response, or pulled values whose dense blocks are shared with the
/// table (sent without copying them).
enum Answer {
    Response(Response<'static>),
    Values {
        version: u64,
        dense: Vec<Arc<[f32]>>,
        sparse: Vec<Vec<f32>>,
    },
    /// `Done` to the close that leaves no trainer; the server stops once it is sent.
    LastClose,
}

impl From<Response<'static>> for Answer {
    fn from(r: Response<'static>) -> Answer {
        Answer::Response(r)
    }
}

impl State {
    fn shard(&self) -> Result<Arc<Shard>, (ErrorCode, String)> {
        self.shard.lock().clone().ok_or((ErrorCode::State, "no tables declared yet".to_string()))
    }

    /// A fault the tests planned for this server at this version (see [`crate::base::fault`]).
    fn injected_fault(&self, version: u64) {
        let me = crate::base::fault::Target::Server(self.config.index);
        crate::base::fault::at(me, self.config.epoch, crate::base::fault::Moment::Version(version));
    }

    /// The `unanswered` fault the tests planned (see [`crate::base::fault`]), as a sync push of
    /// `trainer` arrives: trainer 0's push at that version fires it.
    fn unanswered_fault_on_arrival(&self, trainer: u64) {
        if cfg!(feature = "faults") && trainer == 0 {
            let version = self.counters.version.load(std::sync::atomic::Ordering::Relaxed);
            let me = crate::base::fault::Target::Server(self.config.index);
            crate::base::fault::at(me, self.config.epoch, crate::base::fault::Moment::Unanswered(version));
        }
    }

    /// The `unanswered` fault, as `trainer`'s push in the step that made `version` is about to
    /// be answered: the reply is held back forever unless `trainer` is 0.
    async fn unanswered_fault_on_reply(&self, trainer: u64, version: u64) {
        let me = crate::base::fault::Target::Server(self.config.index);
        let moment = crate::base::fault::Moment::Unanswered(version);
        if trainer != 0 && crate::base::fault::is_planned(me, self.config.epoch, moment) {
            std::future::pending::<()>().await;
        }
    }

    /// The furthest pass a push, a pass end, an AUC histogram or a day end from `sender` (a
    /// trainer, or `None`) may name: one past the pass the other trainers are in, as far as
    /// this server knows (see [`SyncStep::pass_bound`]).
    fn pass_bound(&self, sender: Option<u64>) -> u64 {
        let active = self.active();
        self.sync.lock().pass_bound(sender, &active)
    }

    /// GEO mode's log of changed rows (made for `shard`'s tables on first use); its capacity
    /// is what one reply can carry, so an answer always fits a frame.
    fn changes(&self, shard: &Shard) -> parking_lot::MappedMutexGuard<'_, geo::ChangeLog> {
        parking_lot::MutexGuard::map(self.changes.lock(), |slot| {
            slot.get_or_insert_with(|| {
                let capacity = (self.config.max_frame / 8).saturating_sub(1024);
                geo::ChangeLog::new(self.config.trainers, shard.sparse.len(), capacity, self.restored)
            })
        })
    }

    fn active(&self) -> Vec<u64> {
        let closed = self.closed.lock();
        (0..self.config.trainers as u64).filter(|t| !closed.contains(t)).collect()
    }

    fn arrive(&self, trainer: u64) {
        if trainer < self.config.trainers as u64 {
            self.arrived.lock().insert(trainer);
        }
    }

    /// Expected trainers never heard from.
    fn never_arrived(&self) -> Vec<u64> {
        let arrived = self.arrived.lock();
        (0..self.config.trainers as u64).filter(|t| !arrived.contains(t)).collect()
    }

    /// `f` of every sparse table (none before the tables are declared).
    fn tables<T>(&self, f: impl Fn(&crate::table::SparseTable) -> T) -> Vec<T> {
        self.shard.lock().as_ref().map(|s| s.sparse.iter().map(f).collect()).unwrap_or_default()
    }

    fn stats(&self) -> ServerStats {
        let c = &self.counters;
        let (rss_bytes, peak_rss_bytes) = crate::observe::metrics::process_memory();
        ServerStats {
            rss_bytes,
            peak_rss_bytes,
            version: c.version.load(Relaxed),
            discarded: c.discarded.load(Relaxed),
            pulls: c.pulls.load(Relaxed),
            pushes: c.pushes.load(Relaxed),
            keys_pulled: c.keys_pulled.load(Relaxed),
            keys_pushed: c.keys_pushed.load(Relaxed),
            push_bytes: c.push_bytes.load(Relaxed),
            frame_bytes_in: c.frame_bytes_in.load(Relaxed),
            frame_bytes_out: c.frame_bytes_out.load(Relaxed),
            rows: self.tables(|t| t.len()),
            lifecycle: self.tables(|t| t.lifecycle()),
            filter_bytes: self.tables(|t| t.filter_bytes()),
            port_requests: c.port_requests.iter().map(|n| n.load(Relaxed)).collect(),
            staleness: {
                let counts: Vec<u64> = c.staleness.0.iter().map(|n| n.load(Relaxed)).collect();
                let used = counts.iter().rposition(|n| *n > 0).map_or(0, |b| b + 1);
                crate::observe::metrics::Staleness(counts[..used].to_vec())
            },
            applied_samples: self.ledgers.iter().map(|l| l.lock().samples).collect(),
            discarded_samples: self.ledgers.iter().map(|l| l.lock().discarded_samples).collect(),
            repeats: self.ledgers.iter().map(|l| l.lock().repeats).sum(),
            nonfinite: self.ledgers.iter().map(|l| l.lock().nonfinite).collect(),
            day_end: *self.day_end.lock(),
            pull_seconds: self.telemetry.pull.total_seconds(),
            push_seconds: self.telemetry.push.total_seconds(),
        }
    }

    /// A consistent cut for a checkpoint: the shard copied while no update is half applied,
    /// with the version and the ledgers that match it (`None` before tables are declared).
    fn cut(&self) -> Option<crate::server::shard_checkpoints::Cut> {
        let shard = self.shard.lock().clone()?;
        let _gate = self.gate.write();
        Some(crate::server::shard_checkpoints::Cut {
            snapshot: crate::persist::checkpoint::ShardSnapshot::take(&shard),
            version: self.counters.version.load(Relaxed),
            ledgers: self.ledgers.iter().map(|l| l.lock().clone()).collect(),
            day_end: *self.day_end.lock(),
        })
    }
}

fn table_err(e: crate::table::TableError) -> (ErrorCode, String) {
    (ErrorCode::Table, e.to_string())
}

/// Serves `listeners` (the general ports, then `config.sparse_ports` sparse-only ones) until
/// `shutdown` resolves (or, with `exit_when_done`, until every trainer has closed). Returns the
/// final counters.
pub async fn run(
    listeners: Vec<TcpListener>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<ServerStats> {
    let state = restore(listeners.len(), config)?;
    let _metrics = match &state.config.metrics_addr {
        Some(addr) => {
            let watched = state.clone();
            Some(crate::observe::telemetry::Exporter::start(addr, Arc::new(move || telemetry::render(&watched)))?)
        }
        None => None,
    };
    // Restarted after every trainer had closed (it died saving): only the final save is left.
    if state.config.exit_when_done && state.closed.lock().len() >= state.config.trainers {
        if let Some(dir) = &state.config.save_dir {
            members::save_final(&state, dir).map_err(|(_, m)| anyhow::anyhow!(m))?;
        }
        return Ok(state.stats());
    }
    // Checkpoints on their own thread: the snapshot takes short locks, the writing none. The
    // thread ends when `stop_checkpoints` is dropped: waited for on a normal stop (so no write
    // is cut off), left to end by itself when the server fails.
    let (stop_checkpoints, stopped) = std::sync::mpsc::channel::<()>();
    let checkpoint_thread = start_checkpoints(&state, stopped)?;
    let ports = listeners.len();
    let mut acceptors = tokio::task::JoinSet::new();
    for (port, listener) in listeners.into_iter().enumerate() {
        let sparse_only = port >= ports - state.config.sparse_ports;
        acceptors.spawn(accept::accept(state.clone(), port, listener, sparse_only));
    }
    let ended = ends::first(&state, shutdown).await;
    acceptors.abort_all();
    ended?;
    drop(stop_checkpoints);
    if let Some(thread) = checkpoint_thread {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    Ok(state.stats())
}

/// A server's state at start, from its configuration: checked (the listeners for its ports,
/// the secret), with the shard and ledgers it resumes from, and, for a restart, which trainers
/// had closed or ended the pass when its predecessor last recorded it.
fn restore(ports: usize, config: ServerConfig) -> anyhow::Result<Arc<State>> {
    config.validate()?;
    if config.secret.is_none() {
        tracing::warn!(
            "this server has no secret (--secret-file): anyone who can reach its port can read and change the \
             model or stop the job; launchers give their servers one (docs/src/security.md)"
        );
    }
    anyhow::ensure!(
        ports > config.sparse_ports,
        "{} listeners for {} sparse-only ports: at least one general port is needed",
        ports,
        config.sparse_ports
    );
    let (shard, Resumed { version, mut ledgers, day_end, start, saved_pass }) = match &config.resume {
        Some(dir) => {
            let (shard, resumed) = load_resume_shard(dir, &config)?;
            (Some(Arc::new(shard)), resumed)
        }
        None => {
            let start = requests::Start::Fresh;
            (None, Resumed { version: 0, ledgers: Vec::new(), day_end: 0, start, saved_pass: 0 })
        }
    };
    anyhow::ensure!(
        ledgers.len() <= config.trainers,
        "the checkpoint records pushes of {} trainers, this job has {}",
        ledgers.len(),
        config.trainers
    );
    ledgers.resize_with(config.trainers, TrainerLedger::default);
    // A restart takes up where the trainers were when its predecessor last recorded it.
    let mut config = config;
    let mut sync = SyncStep::new(version);
    // A resumed saved model's trainers go on at the pass after its own.
    sync.restore(saved_pass, []);
    let recorded = config.checkpoints.as_ref().filter(|_| config.epoch > 0);
    let record = match recorded {
        Some(p) => {
            crate::server::shard_checkpoints::Trainers::read(&p.dir, config.index, &config.job, config.trainers)?
        }
        None => None,
    };
    if let Some(t) = record {
        let new: Vec<u64> = t.closed.into_iter().filter(|c| !config.closed.contains(c)).collect();
        config.closed.extend(new);
        sync.restore(t.pass, t.ended);
    }
    let place = (config.num_servers > 0).then_some((config.index, config.num_servers));
    let restored = shard.is_some();
    let buffers = crate::protocol::BufferBudget::new(config.limits.max_receive_bytes);
    let state = Arc::new(State {
        broken: Mutex::new(conn::Quiet::default()),
        pass_auc: Mutex::new(BTreeMap::new()),
        place: Mutex::new(place),
        model: Mutex::new(serde_json::Value::Null),
        calendar: Mutex::new(Vec::new()),
        start,
        shard: Mutex::new(shard),
        // A shard restored from a checkpoint goes on counting from the updates it holds, so a
        // sync step or an async staleness check sees the versions it would have.
        counters: Counters {
            version: AtomicU64::new(version),
            port_requests: (0..ports).map(|_| AtomicU64::new(0)).collect(),
            ..Counters::default()
        },
        sync: Mutex::new(sync),
        applied: watch::channel(version).0,
        barrier: Mutex::new(BTreeMap::new()),
        changed: watch::channel(0).0,
        closed: Mutex::new(config.closed.iter().copied().collect()),
        all_closed: watch::channel(false).0,
        arrived: Mutex::new(config.closed.iter().copied().collect()),
        connections: Mutex::new(BTreeMap::new()),
        lost: watch::channel(BTreeMap::new()).0,
        fenced: watch::channel(None).0,
        ledgers: ledgers.into_iter().map(Mutex::new).collect(),
        day_end: Mutex::new(day_end),
        gate: RwLock::new(()),
        step_errors: Mutex::new(BTreeMap::new()),
        recording: Mutex::new(()),
        open: AtomicUsize::new(0),
        pending: crate::base::per_address::PerAddress::new(config.limits.max_pending_per_address),
        waiting: waiting::Waiting::default(),
        telemetry: telemetry::Telemetry::default(),
        shares: shares::Shares::new(config.trainers, &buffers, config.limits.max_connections, config.max_frame),
        buffers,
        changes: Mutex::new(None),
        restored,
        config,
    });
    if state.config.epoch > 0 {
        let ended = state.sync.lock().ended();
        tracing::info!(epoch = state.config.epoch, version, closed = ?state.config.closed, ?ended, "restarted server");
    }
    Ok(state)
}

/// Claims the checkpoint folder and starts the checkpoint thread, which ends once `stopped`'s
/// sender is dropped; `None` without checkpoints.
fn start_checkpoints(
    state: &Arc<State>,
    stopped: std::sync::mpsc::Receiver<()>,
) -> anyhow::Result<Option<std::thread::JoinHandle<()>>> {
    if let Some(policy) = state.config.checkpoints.clone() {
        let (watched, index) = (state.clone(), state.config.index);
        let fence =
            crate::server::shard_checkpoints::Fence { job: state.config.job.clone(), epoch: state.config.epoch };
        // Claimed before serving: a server that cannot own its checkpoint folder must not run
        // as though a restart could go on from it.
        let checkpointer = crate::server::shard_checkpoints::Checkpointer::new(policy, index, fence)
            .context("cannot claim the checkpoint folder (--checkpoint-dir)")?;
        let written = watched.clone();
        let cut = move || watched.cut();
        let on_written = move || *written.telemetry.last_checkpoint.lock() = Some(std::time::Instant::now());
        let thread = std::thread::Builder::new()
            .name("oar-checkpoint".into())
            .spawn(move || crate::server::shard_checkpoints::run(checkpointer, cut, on_written, stopped))
            .context("starting the checkpoint thread")?;
        return Ok(Some(thread));
    }
    Ok(None)
}

/// Binds `addrs` (the general ports, then `config.sparse_ports` sparse-only ones) and serves
/// them with [`serve_bound`].
pub fn serve_blocking(addrs: &[String], config: ServerConfig) -> anyhow::Result<ServerStats> {
    let mut listeners = Vec::with_capacity(addrs.len());
    for addr in addrs {
        listeners.push(std::net::TcpListener::bind(addr).with_context(|| format!("cannot listen on {addr}"))?);
    }
    serve_bound(listeners, config)
}

/// Serves already bound listeners until every trainer closes (or forever without
/// `exit_when_done`), printing `OAR_READY <first address>` on stdout once listening, for
/// launchers to read.
pub fn serve_bound(listeners: Vec<std::net::TcpListener>, config: ServerConfig) -> anyhow::Result<ServerStats> {
    // A thread per core the process may use (its cgroup's quota counts), at least two: a
    // server alone on a many-core host serves its trainers' connections on all of them (it
    // used two whatever the host), and one beside trainers on a small one keeps the two.
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(cores.max(2)).enable_all().build()?;
    rt.block_on(async {
        let ports = listeners.len();
        let mut bound = Vec::with_capacity(ports);
        for l in listeners {
            l.set_nonblocking(true)?;
            bound.push(TcpListener::from_std(l)?);
        }
        let first = bound.first().context("no address to listen on")?.local_addr()?;
        tracing::info!(address = %first, ports, sparse_ports = config.sparse_ports, index = config.index, servers = config.num_servers, trainers = config.trainers, mode = ?config.mode, "parameter server listening");
        println!("OAR_READY {first}");
        use std::io::Write;
        std::io::stdout().flush()?;
        run(bound, config, std::future::pending()).await
    })
}
