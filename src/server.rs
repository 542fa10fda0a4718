//! The parameter server: accepts trainer connections and serves pulls, pushes, barriers and
//! saves on its [`Shard`].
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
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::checkpoint::{write_shard, Manifest};
use crate::protocol::{
    encode_values, read_frame, write_frame, Apply, Declaration, DenseSelection, ErrorCode, FrameBuf, ProtocolError,
    Pull, Push, PushOutcome, PushPart, Request, Response, RowCreation, SparseGrads, NOT_A_TRAINER, PROTOCOL_VERSION,
};
use crate::table::Shard;

/// How pushes from several trainers are combined.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// One process, no servers.
    Local,
    /// A barrier per step: all trainers' gradients merged, then one update.
    Sync,
    /// Each push applied on arrival.
    Async,
}

impl std::fmt::Display for Mode {
    /// The flag spelling (`local`, `sync`, `async`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = clap::ValueEnum::to_possible_value(self).expect("every mode is a flag value");
        f.write_str(name.get_name())
    }
}

/// Everything a server needs to know, built and validated before it starts.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// This server's index.
    pub index: usize,
    /// Number of servers in the job; 0: learn index and count from the first trainer's
    /// handshake (PaddlePaddle v2's `paddle pserver` is not told its place either).
    pub num_servers: usize,
    /// Number of trainers (the sync barrier's size).
    pub trainers: usize,
    /// Sync or async.
    pub mode: Mode,
    /// Job id clients must present.
    pub job: String,
    /// Largest accepted frame payload.
    pub max_frame: usize,
    /// Longest wait at a sync step or barrier.
    pub timeout: Duration,
    /// Async: pushes more than `lag_ratio x trainers` updates stale are discarded.
    pub lag_ratio: f64,
    /// Load the shard from this saved model before serving.
    pub resume: Option<PathBuf>,
    /// Stop serving once every trainer has closed.
    pub exit_when_done: bool,
    /// How many of the listeners, counted from the last, carry only sparse traffic
    /// (`--ports_num_for_sparse`).
    pub sparse_ports: usize,
    /// When every trainer has closed, save the model here (each server its shard; the manifest
    /// by whichever server completes the set).
    pub save_dir: Option<PathBuf>,
    /// The folder that trainers' `Save` requests (a folder named over the network) must lie in.
    pub save_root: PathBuf,
    /// Checkpoint the shard in the background, as this says.
    pub checkpoints: Option<crate::shard_checkpoints::Policy>,
    /// This process's incarnation of its place: 0 at first, one more for each restart. A
    /// client that has met a newer epoch is refused, and the server stops (it has been replaced).
    pub epoch: u64,
    /// Trainers that closed before this server started (a restarted server is told them by its
    /// supervisor), so the job can end without them.
    pub closed: Vec<u64>,
    /// A trainer that disconnects without closing may come back (restarted by a supervisor)
    /// within this long, its pending sync push forgotten so it can send it again; `None`: the
    /// job fails at once, as it can never finish without it.
    pub rejoin: Option<Duration>,
}

impl ServerConfig {
    /// Checks the configuration; messages name the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.num_servers > 0 || self.resume.is_none(),
            "resuming needs the server's place: give --index and --num-servers"
        );
        anyhow::ensure!(
            self.num_servers == 0 || self.index < self.num_servers,
            "--index {} must be below --num-servers {}",
            self.index,
            self.num_servers
        );
        anyhow::ensure!(self.trainers > 0, "--trainers must be at least 1");
        anyhow::ensure!(self.mode != Mode::Local, "a server runs in sync or async mode, not local");
        anyhow::ensure!(self.lag_ratio > 0.0, "--lag-ratio must be positive");
        Ok(())
    }
}

/// Counters reported when the server stops and by `Request::Stats`.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize, Clone)]
pub struct ServerStats {
    /// Updates applied (sync: steps; async: pushes).
    pub version: u64,
    /// Async pushes discarded as too stale.
    pub discarded: u64,
    /// Pull requests served.
    pub pulls: u64,
    /// Push requests received.
    pub pushes: u64,
    /// Sparse keys pulled.
    pub keys_pulled: u64,
    /// Sparse keys pushed.
    pub keys_pushed: u64,
    /// Gradient bytes received in pushes (dense floats, sparse ids and floats), before any
    /// merging: what a trainer-side log of recent pushes would have to hold.
    #[serde(default)]
    pub push_bytes: u64,
    /// Rows held per sparse table.
    pub rows: Vec<usize>,
    /// Requests served per listening port, in port order.
    pub port_requests: Vec<u64>,
    /// Async: how many updates behind each push arrived.
    #[serde(default)]
    pub staleness: crate::metrics::Staleness,
}

#[derive(Default)]
struct Counters {
    version: AtomicU64,
    discarded: AtomicU64,
    pulls: AtomicU64,
    pushes: AtomicU64,
    keys_pulled: AtomicU64,
    keys_pushed: AtomicU64,
    push_bytes: AtomicU64,
    port_requests: Vec<AtomicU64>,
    staleness: [AtomicU64; crate::metrics::Staleness::BUCKETS],
}

#[derive(Default)]
struct SyncStep {
    step: u64,
    pushes: BTreeMap<u64, Push<'static>>,
    /// The pass the pending steps belong to, and the trainers that have ended it.
    pass: u64,
    ended: BTreeSet<u64>,
    /// First halves of split pushes (`PushPart::Dense`/`Sparse`) waiting for the other half.
    halves: BTreeMap<u64, Push<'static>>,
}

impl SyncStep {
    /// Moves to `pass` if it is newer: trainers only start a pass after the barrier that every
    /// trainer reaches at the end of the previous one, so nobody is still in the old pass.
    fn enter_pass(&mut self, pass: u64) {
        if pass > self.pass {
            self.pass = pass;
            self.ended.clear();
        }
    }
}

struct State {
    config: ServerConfig,
    /// (index, number of servers), once known.
    place: Mutex<Option<(usize, usize)>>,
    /// The model description of the first declaration, for the final manifest.
    model: Mutex<serde_json::Value>,
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

    /// A fault the tests planned for this server at this version (see [`crate::fault`]).
    fn injected_fault(&self, version: u64) {
        let me = crate::fault::Target::Server(self.config.index);
        crate::fault::at(me, self.config.epoch, crate::fault::Moment::Version(version));
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

    fn stats(&self) -> ServerStats {
        let c = &self.counters;
        ServerStats {
            version: c.version.load(Relaxed),
            discarded: c.discarded.load(Relaxed),
            pulls: c.pulls.load(Relaxed),
            pushes: c.pushes.load(Relaxed),
            keys_pulled: c.keys_pulled.load(Relaxed),
            keys_pushed: c.keys_pushed.load(Relaxed),
            push_bytes: c.push_bytes.load(Relaxed),
            rows: self.shard.lock().as_ref().map(|s| s.sparse.iter().map(|t| t.len()).collect()).unwrap_or_default(),
            port_requests: c.port_requests.iter().map(|n| n.load(Relaxed)).collect(),
            staleness: {
                let counts: Vec<u64> = c.staleness.iter().map(|n| n.load(Relaxed)).collect();
                let used = counts.iter().rposition(|n| *n > 0).map_or(0, |b| b + 1);
                crate::metrics::Staleness(counts[..used].to_vec())
            },
        }
    }
}

/// Serves `listeners` (the general ports, then `config.sparse_ports` sparse-only ones) until
/// `shutdown` resolves (or, with `exit_when_done`, until every trainer has closed). Returns the
/// final counters.
pub async fn run(
    listeners: Vec<TcpListener>,
    config: ServerConfig,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<ServerStats> {
    config.validate()?;
    anyhow::ensure!(
        listeners.len() > config.sparse_ports,
        "{} listeners for {} sparse-only ports: at least one general port is needed",
        listeners.len(),
        config.sparse_ports
    );
    let (shard, version) = match &config.resume {
        Some(dir) => {
            let (shard, version) = load_resume_shard(dir, &config)?;
            (Some(Arc::new(shard)), version)
        }
        None => (None, 0),
    };
    // A restart takes up where the trainers were when its predecessor last recorded it.
    let mut config = config;
    let mut sync = SyncStep { step: version, ..SyncStep::default() };
    let recorded = config.checkpoints.as_ref().filter(|_| config.epoch > 0);
    if let Some(t) = recorded.and_then(|p| crate::shard_checkpoints::Trainers::read(&p.dir, config.index, &config.job))
    {
        let new: Vec<u64> = t.closed.into_iter().filter(|c| !config.closed.contains(c)).collect();
        config.closed.extend(new);
        (sync.pass, sync.ended) = (t.pass, t.ended.into_iter().collect());
    }
    let ports = listeners.len();
    let place = (config.num_servers > 0).then_some((config.index, config.num_servers));
    let state = Arc::new(State {
        place: Mutex::new(place),
        model: Mutex::new(serde_json::Value::Null),
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
        config,
    });
    if state.config.epoch > 0 {
        let ended = state.sync.lock().ended.clone();
        tracing::info!(epoch = state.config.epoch, version, closed = ?state.config.closed, ?ended, "restarted server");
    }
    // Restarted after every trainer had closed (it died saving): only the final save is left.
    if state.config.exit_when_done && state.closed.lock().len() >= state.config.trainers {
        if let Some(dir) = &state.config.save_dir {
            save_final(&state, dir).map_err(|(_, m)| anyhow::anyhow!(m))?;
        }
        return Ok(state.stats());
    }
    let mut done = state.all_closed.subscribe();
    let exit_when_done = state.config.exit_when_done;
    let all_closed = async move {
        if exit_when_done {
            let _ = done.wait_for(|d| *d).await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    // A server told to exit when its trainers are done must not wait forever for trainers that
    // never come (a failed launch, a wrong address): after --timeout it names them and fails.
    let watched = state.clone();
    let arrival_deadline = async move {
        if exit_when_done {
            tokio::time::sleep(watched.config.timeout).await;
            let missing = watched.never_arrived();
            if !missing.is_empty() {
                return missing;
            }
        }
        std::future::pending().await
    };
    // A trainer that disconnects without closing can never finish the job (its close, its
    // share of the data, the final save): a server that would exit when its trainers are done
    // fails instead of waiting for it forever, or after the time it has to rejoin.
    let (mut lost, rejoin) = (state.lost.subscribe(), state.config.rejoin);
    let lost_trainer = async move {
        loop {
            if !exit_when_done {
                std::future::pending::<()>().await;
            }
            // The borrowed map is not Send: read it before any await.
            let first = lost.borrow_and_update().iter().min_by_key(|(_, at)| **at).map(|(t, at)| (*t, *at));
            match (first, rejoin) {
                (Some((t, _)), None) => return (t, None),
                (Some((t, at)), Some(window)) => {
                    let timed_out = tokio::select! {
                        _ = tokio::time::sleep_until((at + window).into()) => true,
                        changed = lost.changed() => changed.is_err(),
                    };
                    if timed_out && lost.borrow().contains_key(&t) {
                        return (t, Some(window));
                    }
                }
                (None, _) => {
                    if lost.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                }
            }
        }
    };
    // Checkpoints on their own thread: the snapshot takes short locks, the writing none. The
    // thread ends when `stop_checkpoints` is dropped: waited for on a normal stop (so no write
    // is cut off), left to end by itself when the server fails.
    let (stop_checkpoints, stopped) = std::sync::mpsc::channel::<()>();
    let mut checkpoint_thread = None;
    if let Some(policy) = state.config.checkpoints.clone() {
        let (watched, index) = (state.clone(), state.config.index);
        let fence = crate::shard_checkpoints::Fence { job: state.config.job.clone(), epoch: state.config.epoch };
        let shard = move || {
            let shard = watched.shard.lock().clone()?;
            Some((shard, watched.counters.version.load(Relaxed)))
        };
        let thread = std::thread::Builder::new()
            .name("oar-checkpoint".into())
            .spawn(move || crate::shard_checkpoints::run(policy, index, fence, shard, stopped))
            .context("starting the checkpoint thread")?;
        checkpoint_thread = Some(thread);
    }
    let mut fenced = state.fenced.subscribe();
    let replaced = async move {
        // The borrowed value is not Send: read it before any other await.
        let newer = fenced.wait_for(Option::is_some).await.map(|e| e.unwrap_or_default());
        match newer {
            Ok(epoch) => epoch,
            Err(_) => std::future::pending().await,
        }
    };
    let mut acceptors = tokio::task::JoinSet::new();
    for (port, listener) in listeners.into_iter().enumerate() {
        let state = state.clone();
        let sparse_only = port >= ports - state.config.sparse_ports;
        acceptors.spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((socket, peer)) => {
                        let state = state.clone();
                        tokio::spawn(async move {
                            if let Err(e) = serve_connection(state, socket, port, sparse_only).await {
                                tracing::warn!(%peer, error = %e, "connection closed on error");
                            }
                        });
                    }
                    Err(e) => tracing::warn!(error = %e, "accept failed"),
                }
            }
        });
    }
    tokio::select! {
        _ = shutdown => {}
        _ = all_closed => tracing::info!("every trainer has closed; stopping"),
        newer = replaced => {
            acceptors.abort_all();
            anyhow::bail!(
                "server {} epoch {} has been replaced by epoch {newer} (it was stopped or unreachable and restarted): \
                 this process stops without touching the job's state",
                state.config.index,
                state.config.epoch
            );
        }
        (trainer, window) = lost_trainer => {
            acceptors.abort_all();
            match window {
                None => anyhow::bail!(
                    "trainer {trainer} disconnected without closing (it failed or was stopped): the job cannot finish"
                ),
                Some(w) => anyhow::bail!(
                    "trainer {trainer} disconnected without closing and did not come back within {w:?} \
                     (--trainer-rejoin): the job cannot finish"
                ),
            }
        }
        missing = arrival_deadline => {
            acceptors.abort_all();
            anyhow::bail!(
                "trainer(s) {missing:?} of {} never connected within {:?} of this server starting (--timeout): \
                 check that they were started and can reach this server",
                state.config.trainers,
                state.config.timeout
            );
        }
    }
    acceptors.abort_all();
    drop(stop_checkpoints);
    if let Some(thread) = checkpoint_thread {
        let _ = tokio::task::spawn_blocking(move || thread.join()).await;
    }
    Ok(state.stats())
}

/// The shard to resume from, and the updates it holds (0 for a saved pass).
fn load_resume_shard(dir: &std::path::Path, config: &ServerConfig) -> anyhow::Result<(Shard, u64)> {
    // A checkpoint folder (background checkpoints): this server's newest readable one.
    if crate::shard_checkpoints::has_checkpoints(dir, config.index) {
        let (entry, shard) = crate::shard_checkpoints::load_latest(dir, config.index)?;
        anyhow::ensure!(
            shard.num_servers == config.num_servers,
            "{}: checkpointed with {} servers, this job has {}",
            dir.display(),
            shard.num_servers,
            config.num_servers
        );
        tracing::info!(dir = %dir.display(), seq = entry.seq, version = entry.version, "resumed shard from a checkpoint");
        return Ok((shard, entry.version));
    }
    let (manifest, pass_dir) = Manifest::find(dir)?;
    anyhow::ensure!(
        manifest.num_servers == config.num_servers,
        "{}: saved with {} servers, this job has {}; resume with the same number of servers",
        pass_dir.display(),
        manifest.num_servers,
        config.num_servers
    );
    let shard = manifest.load_shard(&pass_dir, config.index)?;
    tracing::info!(dir = %pass_dir.display(), pass = manifest.pass, "resumed shard");
    Ok((shard, 0))
}

/// Why a request may not use a sparse-only port, if it may not.
fn dense_on_sparse_port(request: &Request) -> Option<&'static str> {
    match request {
        Request::Pull(p) if p.dense == DenseSelection::All => Some("a dense pull"),
        Request::Push(p) if !p.dense.is_empty() => Some("a dense push"),
        _ => None,
    }
}

async fn serve_connection(
    state: Arc<State>,
    socket: TcpStream,
    port: usize,
    sparse_only: bool,
) -> Result<(), ProtocolError> {
    let mut trainer = None;
    let result = serve_requests(&state, socket, port, sparse_only, &mut trainer).await;
    if let Some(t) = trainer.filter(|t| *t < state.config.trainers as u64) {
        disconnected(&state, t);
    }
    result
}

/// Serves one connection's requests; `trainer` is set once a trainer's handshake succeeds.
async fn serve_requests(
    state: &Arc<State>,
    socket: TcpStream,
    port: usize,
    sparse_only: bool,
    trainer: &mut Option<u64>,
) -> Result<(), ProtocolError> {
    socket.set_nodelay(true)?;
    let (mut rd, mut wr) = socket.into_split();
    let mut buf = FrameBuf::default();
    // Pull replies are built in these buffers, reused so big replies never fault in fresh pages.
    let mut scratch = Scratch::default();
    let mut greeted = false;
    loop {
        let kind = match read_frame(&mut rd, &mut buf, state.config.max_frame).await {
            Ok(kind) => kind,
            Err(ProtocolError::Closed) => return Ok(()),
            Err(e @ ProtocolError::TooLarge { .. }) => {
                let reply = Response::Error { code: ErrorCode::TooLarge, message: e.to_string() };
                let _ = write_frame(&mut wr, &reply.encode()).await;
                return Err(e);
            }
            Err(e) => {
                let reply = Response::Error { code: ErrorCode::Malformed, message: e.to_string() };
                let _ = write_frame(&mut wr, &reply.encode()).await;
                return Err(e);
            }
        };
        let request = match Request::decode(kind, buf.payload()) {
            Ok(r) => r,
            Err(e) => {
                let reply = Response::Error { code: ErrorCode::Malformed, message: e.to_string() };
                let _ = write_frame(&mut wr, &reply.encode()).await;
                return Err(e);
            }
        };
        state.counters.port_requests[port].fetch_add(1, Relaxed);
        let hello_from = if let Request::Hello(h) = &request { Some(h.trainer) } else { None };
        let reply = match (&request, greeted) {
            (Request::Hello(_), _) => handle_hello(state, &request),
            (_, false) => Err((ErrorCode::State, "the first request must be Hello".to_string())),
            (r, true) if speaks_for(r).is_some_and(|t| !may_speak_for(state, *trainer, t)) => Err((
                ErrorCode::State,
                format!(
                    "request for trainer {} refused: this job has trainers 0..{} and this connection is {}",
                    speaks_for(r).unwrap_or_default(),
                    state.config.trainers,
                    match *trainer {
                        Some(t) if t != NOT_A_TRAINER => format!("trainer {t}'s"),
                        _ => "not a trainer's".to_string(),
                    }
                ),
            )),
            (r, true) if sparse_only && dense_on_sparse_port(r).is_some() => Err((
                ErrorCode::State,
                format!(
                    "{} on port #{port}, which carries only sparse traffic (--ports_num_for_sparse)",
                    dense_on_sparse_port(r).unwrap_or("dense traffic")
                ),
            )),
            _ => handle(state, request, &mut scratch).await,
        };
        let fatal = matches!(reply, Err((ErrorCode::Handshake | ErrorCode::State | ErrorCode::Fenced, _))) && !greeted;
        greeted |= reply.is_ok();
        if let (Ok(_), Some(t), None) = (&reply, hello_from, *trainer) {
            *trainer = Some(t);
            if t < state.config.trainers as u64 {
                connected(state, t);
            }
        }
        match reply.unwrap_or_else(|(code, message)| Answer::Response(Response::Error { code, message })) {
            Answer::Response(response) => write_frame(&mut wr, &response.encode()).await?,
            Answer::Values { version, dense, sparse } => {
                write_frame(&mut wr, &encode_values(version, &dense, &sparse)).await?;
                scratch.sparse = sparse;
            }
            Answer::LastClose => {
                write_frame(&mut wr, &Response::Done.encode()).await?;
                state.all_closed.send_replace(true);
            }
        }
        if fatal {
            return Ok(());
        }
    }
}

/// The trainer a request acts for (its close, pass end, barrier or push), if it acts for one.
fn speaks_for(request: &Request) -> Option<u64> {
    match request {
        Request::Close { trainer } | Request::EndPass { trainer, .. } | Request::Barrier { trainer, .. } => {
            Some(*trainer)
        }
        Request::Push(p) => Some(p.trainer),
        _ => None,
    }
}

/// Whether a connection whose handshake named `connection` may act for `trainer`: a trainer of
/// this job, and the connection's own one when it named a trainer (tools and benchmarks that
/// name none may act for any), so that a stray or buggy client cannot close, end or hold back
/// another trainer, or end the job early with an id beyond the job's trainers.
fn may_speak_for(state: &State, connection: Option<u64>, trainer: u64) -> bool {
    trainer < state.config.trainers as u64 && connection.is_none_or(|c| c == NOT_A_TRAINER || c == trainer)
}

fn handle_hello(state: &State, request: &Request) -> Reply {
    let Request::Hello(h) = request else { unreachable!("called for Hello only") };
    let c = &state.config;
    let refuse = |m: String| Err((ErrorCode::Handshake, m));
    if h.version != PROTOCOL_VERSION {
        return refuse(format!("protocol version {} not supported (server speaks {PROTOCOL_VERSION})", h.version));
    }
    if h.job != c.job {
        return refuse(format!("job '{}' does not match this server's job '{}'", h.job, c.job));
    }
    if h.epoch > c.epoch {
        state.fenced.send_replace(Some(h.epoch));
        let m = format!("server {} epoch {} has been replaced by epoch {}: it stops", c.index, c.epoch, h.epoch);
        return Err((ErrorCode::Fenced, m));
    }
    // A place learned from this handshake must be one that routes: an index among at least one
    // server (a zero count would poison the server for its life at the first declaration).
    if h.num_servers == 0 || h.server_index >= h.num_servers {
        return refuse(format!(
            "client routes to server {} of {}: not a place in a job",
            h.server_index, h.num_servers
        ));
    }
    let mut place = state.place.lock();
    state.arrive(h.trainer);
    let (index, servers) = *place.get_or_insert_with(|| {
        tracing::info!(index = h.server_index, servers = h.num_servers, "learned this server's place from a trainer");
        (h.server_index as usize, h.num_servers as usize)
    });
    if h.num_servers != servers as u64 || h.server_index != index as u64 {
        return refuse(format!(
            "client routes to server {} of {}, but this is server {index} of {servers}: check the server list order",
            h.server_index, h.num_servers
        ));
    }
    Ok(Answer::Response(Response::Welcome { server_index: index as u64, num_servers: servers as u64, epoch: c.epoch }))
}

/// A connection of trainer `t` was greeted. A trainer opens its connections before its first
/// push and keeps them, so a new one means the process that held `t` before is gone (or lost
/// its connection) and will send its unanswered push again: a pending sync push of `t` is
/// forgotten, or that step would count it twice. A lost trainer that connects again within
/// `--trainer-rejoin` has rejoined.
fn connected(state: &State, t: u64) {
    *state.connections.lock().entry(t).or_default() += 1;
    let mut back = false;
    state.lost.send_if_modified(|lost| {
        back = lost.remove(&t).is_some();
        back
    });
    let dropped = {
        let mut pending = state.sync.lock();
        pending.pushes.remove(&t).is_some() | pending.halves.remove(&t).is_some()
    };
    if back || dropped {
        tracing::warn!(trainer = t, pending_push_dropped = dropped, "trainer {t} rejoined");
    }
}

/// A connection of trainer `t` ended: with its last one gone before it closed, `t` is lost (it
/// failed or was killed). A connection of an earlier process of `t` that ends after a restarted
/// one connected does not count.
fn disconnected(state: &State, t: u64) {
    let last = {
        let mut connections = state.connections.lock();
        let n = connections.entry(t).or_default();
        *n = n.saturating_sub(1);
        *n == 0
    };
    if last && !state.closed.lock().contains(&t) {
        // Logged at once: under mpirun the server may be stopped before its final error line.
        tracing::error!("trainer {t} disconnected without closing");
        state.lost.send_modify(|lost| {
            lost.entry(t).or_insert_with(std::time::Instant::now);
        });
    }
}

/// Row buffers of a connection's last pull reply, handed back for the next one.
#[derive(Default)]
struct Scratch {
    sparse: Vec<Vec<f32>>,
}

async fn handle(state: &Arc<State>, request: Request<'_>, scratch: &mut Scratch) -> Reply {
    match request {
        Request::Hello(_) => unreachable!("handled by handle_hello"),
        Request::Declare(declaration) => declare(state, declaration),
        Request::Pull(pull) => self::pull(state, pull, std::mem::take(scratch)),
        // An async server merges the steps trainers mark synchronous: the warm-up, which every
        // trainer ends at the same step (see `TrainConfig::sync_warmup`), before any async push.
        Request::Push(push) if state.config.mode == Mode::Sync || push.apply == Apply::Merged => {
            push_sync(state, push).await
        }
        Request::Push(push) => push_async(state, push),
        Request::Barrier { trainer, epoch } => barrier(state, trainer, epoch).await,
        Request::Save { dir } => {
            let shard = state.shard()?;
            let root = &state.config.save_root;
            let dir = inside(root, std::path::Path::new(&dir)).ok_or_else(|| {
                let m = format!("save to {dir} refused: not inside this server's --save-root {}", root.display());
                (ErrorCode::State, m)
            })?;
            let (file, bytes, crc32) = write_shard(&shard, &dir).map_err(|e| (ErrorCode::Io, e.to_string()))?;
            Ok(Answer::Response(Response::Saved { file, bytes, crc32 }))
        }
        Request::EndPass { trainer, pass } => {
            let shard = state.shard()?;
            {
                let mut pending = state.sync.lock();
                pending.enter_pass(pass);
                if pass == pending.pass {
                    pending.ended.insert(trainer);
                }
                try_complete_step(state, &shard, &mut pending)?;
            }
            record_trainers(state);
            Ok(Answer::Response(Response::Done))
        }
        Request::Close { trainer } => close(state, trainer),
        Request::Stats => {
            Ok(Answer::Response(Response::Stats(serde_json::to_string(&state.stats()).expect("stats serialize"))))
        }
    }
}

fn declare(state: &State, declaration: Declaration) -> Reply {
    let Declaration { spec, model } = declaration;
    if !model.is_null() {
        let mut kept = state.model.lock();
        if kept.is_null() {
            *kept = model;
        }
    }
    let mut slot = state.shard.lock();
    if let Some(existing) = slot.as_ref() {
        if existing.spec != spec {
            return Err((
                ErrorCode::Table,
                "declared tables differ from the ones this server holds (another model or a changed config?)".into(),
            ));
        }
        return Ok(Answer::Response(Response::Done));
    }
    spec.validate().map_err(|m| (ErrorCode::Table, m))?;
    let (index, servers) = state.place.lock().ok_or((ErrorCode::State, "declare before the handshake".to_string()))?;
    fits_frames(&spec, servers, state.config.max_frame).map_err(|m| (ErrorCode::TooLarge, m))?;
    *slot = Some(Arc::new(Shard::new(spec, index, servers)));
    Ok(Answer::Response(Response::Done))
}

/// Refuses tables whose values could not travel: this server's dense share must fit one pull
/// reply, and so must one row of every sparse table. It also bounds what a declaration from the
/// network can make the server allocate to what its frame limit allows.
fn fits_frames(spec: &crate::table::TableSpec, servers: usize, max_frame: usize) -> Result<(), String> {
    let max_floats = max_frame / 4;
    let total = spec.dense.params.iter().try_fold(0usize, |sum, p| sum.checked_add(p.len));
    // Blocks are dealt round-robin: no server holds more than its rounded-up share of them.
    let share =
        total.map(|t| (t.div_ceil(spec.dense.block_size).div_ceil(servers.max(1)) * spec.dense.block_size).min(t));
    match share {
        Some(share) if share <= max_floats => {}
        _ => {
            return Err(format!(
                "the dense parameters ({} floats in all) would put more than the frame limit of {} MiB on a server: \
                 use more servers or a larger --max-frame-mb",
                total.map_or("too many".to_string(), |t| t.to_string()),
                max_frame >> 20
            ))
        }
    }
    if let Some(t) = spec.sparse.iter().find(|t| t.dim > max_floats) {
        return Err(format!("sparse table {}: rows of {} floats exceed the frame limit", t.name, t.dim));
    }
    Ok(())
}

fn pull(state: &State, pull: Pull<'_>, scratch: Scratch) -> Reply {
    let Scratch { sparse: mut spare } = scratch;
    let shard = state.shard()?;
    // The reply must fit one frame: refuse before allocating what it would take.
    let mut floats = if pull.dense == DenseSelection::All { shard.dense.lock().len() } else { 0 };
    for s in &pull.sparse {
        let dim = shard.table(s.table as usize).map_err(table_err)?.spec().dim;
        floats = s.ids.len().checked_mul(dim).and_then(|n| n.checked_add(floats)).unwrap_or(usize::MAX);
    }
    if floats > state.config.max_frame / 4 {
        let message = format!(
            "a pull of {floats} floats exceeds the frame limit of {} MiB: pull fewer ids at a time",
            state.config.max_frame >> 20
        );
        return Err((ErrorCode::TooLarge, message));
    }
    let c = &state.counters;
    c.pulls.fetch_add(1, Relaxed);
    let version = c.version.load(Relaxed);
    let dense = match pull.dense {
        DenseSelection::All => shard.dense.lock().snapshot(),
        DenseSelection::None => Vec::new(),
    };
    let mut sparse = Vec::with_capacity(pull.sparse.len());
    for s in &pull.sparse {
        let table = shard.table(s.table as usize).map_err(table_err)?;
        // Every float is overwritten by the pull, so stale values from the last reply may stay.
        let mut rows = spare.pop().unwrap_or_default();
        rows.resize(s.ids.len() * table.spec().dim, 0.0);
        table.pull(&s.ids, &mut rows, pull.create == RowCreation::Create).map_err(table_err)?;
        c.keys_pulled.fetch_add(s.ids.len() as u64, Relaxed);
        sparse.push(rows);
    }
    Ok(Answer::Values { version, dense, sparse })
}

/// `dir` made absolute if it lies inside `root`, judged on the paths as written: a `..` anywhere
/// is refused rather than resolved (symbolic links inside the root are trusted).
fn inside(root: &std::path::Path, dir: &std::path::Path) -> Option<PathBuf> {
    if dir.components().any(|c| c == std::path::Component::ParentDir) {
        return None;
    }
    let (root, dir) = (std::path::absolute(root).ok()?, std::path::absolute(dir).ok()?);
    dir.starts_with(&root).then_some(dir)
}

fn table_err(e: crate::table::TableError) -> (ErrorCode, String) {
    (ErrorCode::Table, e.to_string())
}

/// Applies one push (or several merged) to the shard; gradients are sums over `samples`, the
/// dense learning rate times `dense_lr_factor`.
fn apply(
    shard: &Shard,
    dense: &[f32],
    sparse: &[SparseGrads],
    samples: u64,
    dense_lr_factor: f32,
) -> Result<(), (ErrorCode, String)> {
    let sparse = sparse.iter().map(|s| (s.table as usize, &s.ids[..], &s.grads[..]));
    shard.apply(dense, sparse, samples, dense_lr_factor).map_err(table_err)
}

fn push_async(state: &State, push: Push<'_>) -> Reply {
    let shard = state.shard()?;
    let c = &state.counters;
    c.pushes.fetch_add(1, Relaxed);
    c.push_bytes.fetch_add(push_bytes(&push), Relaxed);
    let version = c.version.load(Relaxed);
    let max_lag = (state.config.lag_ratio * state.config.trainers as f64).ceil() as u64;
    let behind = version.saturating_sub(push.base_version);
    if push.part != PushPart::Sparse {
        c.staleness[(behind as usize).min(crate::metrics::Staleness::BUCKETS - 1)].fetch_add(1, Relaxed);
    }
    if behind > max_lag {
        c.discarded.fetch_add(1, Relaxed);
        return Ok(Answer::Response(Response::Pushed { outcome: PushOutcome::Discarded, version }));
    }
    c.keys_pushed.fetch_add(push.sparse.iter().map(|s| s.ids.len() as u64).sum(), Relaxed);
    // Sparse rows keep their step: a row's own staleness is not the server's version count.
    let factor = push.apply.dense_lr_factor(behind);
    apply(&shard, &push.dense_contiguous(), &push.sparse, push.samples, factor)?;
    // The sparse half of a split push is part of the update its dense half counts.
    let version = if push.part == PushPart::Sparse { version } else { c.version.fetch_add(1, Relaxed) + 1 };
    state.injected_fault(version);
    Ok(Answer::Response(Response::Pushed { outcome: PushOutcome::Applied, version }))
}

/// Gradient bytes a push carries.
fn push_bytes(push: &Push<'_>) -> u64 {
    let sparse: usize = push.sparse.iter().map(|s| s.ids.len() * 8 + s.grads.len() * 4).sum();
    (push.dense_len() * 4 + sparse) as u64
}

async fn push_sync(state: &Arc<State>, push: Push<'_>) -> Reply {
    let shard = state.shard()?;
    state.counters.pushes.fetch_add(1, Relaxed);
    state.counters.push_bytes.fetch_add(push_bytes(&push), Relaxed);
    let trainer = push.trainer;
    if trainer >= state.config.trainers as u64 {
        return Err((ErrorCode::State, format!("trainer {trainer} is not in 0..{}", state.config.trainers)));
    }
    let mut applied = state.applied.subscribe();
    // The push joins the server's pending step. Trainers with fewer batches per pass than others
    // have pushed fewer steps, so their own step counts say nothing about which step this is;
    // a trainer cannot be a step ahead, as it waits for each push's reply.
    let step = {
        let mut pending = state.sync.lock();
        let step = pending.step;
        pending.enter_pass(push.pass);
        let push = push.into_owned();
        let push = match push.part {
            PushPart::Whole => Some(push),
            part => match pending.halves.remove(&trainer) {
                None => {
                    pending.halves.insert(trainer, push);
                    None
                }
                Some(other) if other.part == part => {
                    return Err((
                        ErrorCode::State,
                        format!("trainer {trainer} sent the same half of step {step} twice"),
                    ));
                }
                Some(other) => {
                    let (dense, sparse) = if part == PushPart::Dense { (push, other) } else { (other, push) };
                    Some(Push { part: PushPart::Whole, sparse: sparse.sparse, ..dense })
                }
            },
        };
        if let Some(push) = push {
            if pending.pushes.insert(trainer, push).is_some() {
                return Err((ErrorCode::State, format!("trainer {trainer} pushed step {step} twice")));
            }
            try_complete_step(state, &shard, &mut pending)?;
        }
        step
    };
    let waited = tokio::time::timeout(state.config.timeout, applied.wait_for(|&n| n > step)).await;
    if waited.is_err() {
        let pending = state.sync.lock();
        let missing: Vec<u64> = state
            .active()
            .into_iter()
            .filter(|t| !pending.pushes.contains_key(t) && !pending.ended.contains(t))
            .collect();
        return Err((
            ErrorCode::Timeout,
            format!("sync step {step} timed out after {:?} waiting for trainer(s) {missing:?}", state.config.timeout),
        ));
    }
    Ok(Answer::Response(Response::Pushed { outcome: PushOutcome::Applied, version: step + 1 }))
}

/// If every active trainer has pushed the pending step, merges the pushes in trainer order,
/// applies one update and wakes the waiters.
fn try_complete_step(state: &State, shard: &Shard, pending: &mut SyncStep) -> Result<(), (ErrorCode, String)> {
    let active = state.active();
    if pending.pushes.is_empty() || !active.iter().all(|t| pending.pushes.contains_key(t) || pending.ended.contains(t))
    {
        return Ok(());
    }
    let pushes = std::mem::take(&mut pending.pushes);
    let samples: u64 = pushes.values().map(|p| p.samples).sum();
    let mut dense: Vec<f32> = Vec::new();
    for p in pushes.values().filter(|p| !p.dense.is_empty()) {
        let d = p.dense_contiguous();
        if dense.is_empty() {
            dense = d.into_owned();
        } else if dense.len() == d.len() {
            dense.iter_mut().zip(d.iter()).for_each(|(a, b)| *a += b);
        } else {
            let m = format!("trainer {} pushed {} dense floats, others {}", p.trainer, d.len(), dense.len());
            return Err((ErrorCode::Table, m));
        }
    }
    let sparse = merge_sparse(shard, pushes.values())?;
    let keys: u64 = sparse.iter().map(|s| s.ids.len() as u64).sum();
    let result = apply(shard, &dense, &sparse, samples, 1.0);
    state.counters.keys_pushed.fetch_add(keys, Relaxed);
    let version = state.counters.version.fetch_add(1, Relaxed) + 1;
    state.injected_fault(version);
    pending.step += 1;
    state.applied.send_replace(pending.step);
    result
}

/// Sums the sparse gradients of several pushes per (table, id), visiting pushes in trainer order
/// so the floating-point sums are reproducible.
fn merge_sparse<'a>(
    shard: &Shard,
    pushes: impl Iterator<Item = &'a Push<'static>>,
) -> Result<Vec<SparseGrads<'static>>, (ErrorCode, String)> {
    /// One table's merged gradients: id -> position in `ids`/`grads`.
    #[derive(Default)]
    struct Merged {
        index: hashbrown::HashMap<u64, usize>,
        ids: Vec<u64>,
        grads: Vec<f32>,
    }
    let mut merged: BTreeMap<u32, Merged> = BTreeMap::new();
    for p in pushes {
        for s in &p.sparse {
            let dim = shard.table(s.table as usize).map_err(table_err)?.spec().dim;
            if s.grads.len() != s.ids.len() * dim {
                return Err((
                    ErrorCode::Table,
                    format!("table {}: {} ids but {} gradient floats", s.table, s.ids.len(), s.grads.len()),
                ));
            }
            let Merged { index, ids, grads } = merged.entry(s.table).or_default();
            for (k, &id) in s.ids.iter().enumerate() {
                let g = &s.grads[k * dim..(k + 1) * dim];
                match index.get(&id) {
                    Some(&at) => grads[at * dim..(at + 1) * dim].iter_mut().zip(g).for_each(|(a, b)| *a += b),
                    None => {
                        index.insert(id, ids.len());
                        ids.push(id);
                        grads.extend_from_slice(g);
                    }
                }
            }
        }
    }
    Ok(merged.into_iter().map(|(table, m)| SparseGrads { table, ids: m.ids.into(), grads: m.grads.into() }).collect())
}

async fn barrier(state: &Arc<State>, trainer: u64, epoch: u64) -> Reply {
    state.barrier.lock().insert(trainer, epoch);
    state.changed.send_modify(|g| *g += 1);
    let mut changed = state.changed.subscribe();
    let missing = || -> Vec<u64> {
        let reached = state.barrier.lock();
        state.active().into_iter().filter(|t| reached.get(t).is_none_or(|&e| e < epoch)).collect()
    };
    let wait = async {
        loop {
            if missing().is_empty() {
                return;
            }
            if changed.changed().await.is_err() {
                return;
            }
        }
    };
    match tokio::time::timeout(state.config.timeout, wait).await {
        Ok(()) => Ok(Answer::Response(Response::Done)),
        Err(_) => Err((
            ErrorCode::Timeout,
            format!(
                "barrier {epoch} timed out after {:?} waiting for trainer(s) {:?}",
                state.config.timeout,
                missing()
            ),
        )),
    }
}

/// Records beside the checkpoints which trainers have ended the pass or closed, for a restart
/// of this server (see `shard_checkpoints::Trainers`): a trainer that ended its pass waits at
/// the barrier and will not tell a restarted server again.
fn record_trainers(state: &State) {
    let Some(policy) = &state.config.checkpoints else { return };
    // Held while writing, so records land in the order of the changes they hold.
    let pending = state.sync.lock();
    let record = crate::shard_checkpoints::Trainers {
        job: state.config.job.clone(),
        closed: state.closed.lock().iter().copied().collect(),
        pass: pending.pass,
        ended: pending.ended.iter().copied().collect(),
    };
    if let Err(e) = record.write(&policy.dir, state.config.index) {
        tracing::error!("cannot record where the trainers are (a restart of this server would wait for them): {e}");
    }
}

fn close(state: &Arc<State>, trainer: u64) -> Reply {
    let all = {
        let mut closed = state.closed.lock();
        closed.insert(trainer);
        closed.len() >= state.config.trainers
    };
    tracing::info!(trainer, "trainer closed");
    record_trainers(state);
    state.lost.send_if_modified(|lost| lost.remove(&trainer).is_some());
    // Its barrier position and any half-sent push are released with it.
    state.barrier.lock().remove(&trainer);
    state.sync.lock().halves.remove(&trainer);
    // A closed trainer no longer holds back a sync step or a barrier.
    if let Ok(shard) = state.shard() {
        let mut pending = state.sync.lock();
        try_complete_step(state, &shard, &mut pending)?;
    }
    state.changed.send_modify(|g| *g += 1);
    if all {
        if let Some(dir) = &state.config.save_dir {
            save_final(state, dir)?;
        }
        // Stop only after this reply is on the wire (see `serve_connection`), or the last
        // trainer's close could be cut off by the shutdown it causes.
        Ok(Answer::LastClose)
    } else {
        Ok(Answer::Response(Response::Done))
    }
}

/// Saves this server's shard into `dir` once every trainer has closed (see
/// [`crate::checkpoint::save_server_final`]).
fn save_final(state: &State, dir: &std::path::Path) -> Result<(), (ErrorCode, String)> {
    let shard = state.shard()?;
    let pass = state.sync.lock().pass as u32;
    let model = state.model.lock().clone();
    let complete = crate::checkpoint::save_server_final(&shard, dir, &state.config.job, pass, &model)
        .map_err(|e| (ErrorCode::Io, format!("saving the final model: {e}")))?;
    tracing::info!(dir = %dir.display(), pass, manifest_written = complete, "every trainer has closed: model saved");
    Ok(())
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
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
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
