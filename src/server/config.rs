//! What a server is told ([`ServerConfig`], [`Mode`]) and what it reports ([`ServerStats`]).

use std::path::PathBuf;
use std::time::Duration;

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
    /// Serve Prometheus metrics here (`--metrics-addr`; port 0: any free port).
    pub metrics_addr: Option<String>,
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
    pub checkpoints: Option<crate::server::shard_checkpoints::Policy>,
    /// This process's incarnation of its place: 0 at first, one more for each restart. A
    /// client that has met a newer epoch is refused, and the server stops (it has been replaced).
    pub epoch: u64,
    /// Trainers that closed before this server started (a restarted server is told them by its
    /// supervisor), so the job can end without them.
    pub closed: Vec<u64>,
    /// Bounds on what peers may make this server hold, and what it does with bad numbers.
    pub limits: Limits,
    /// The job's secret: every connection must prove it holds it before anything else
    /// (`None`: anyone who can reach the port may speak, Paddle-style manual starts).
    pub secret: Option<crate::security::auth::Secret>,
    /// TLS for every connection (`--tls-cert`, `--tls-key`): a client that does not speak it
    /// is refused at its first bytes. `None`: plain TCP.
    pub tls: Option<std::sync::Arc<rustls::ServerConfig>>,
    /// A trainer that disconnects without closing may come back (restarted by a supervisor)
    /// within this long and send its unanswered push again; `None`: the job fails at once, as
    /// it can never finish without it.
    pub rejoin: Option<Duration>,
}

/// What a server does with a push holding a NaN, an infinity or a value beyond ±1e18 (it never applies one).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NonFinite {
    /// Refuse it and fail the trainer that sent it, naming the step.
    #[default]
    Fail,
    /// Skip it (counted and logged); the trainer goes on.
    Skip,
}

impl NonFinite {
    /// What happens to a refused push that `message` describes: `Err(message)` under `fail`,
    /// `Ok(())` under `skip` (logged as a warning: it is left out). The one rule for servers and
    /// local training.
    pub fn refuse(self, message: String) -> Result<(), String> {
        match self {
            NonFinite::Fail => Err(message),
            NonFinite::Skip => {
                tracing::warn!("{message}; skipped (--nonfinite skip)");
                Ok(())
            }
        }
    }
}

/// Bounds on what a peer can make a server hold, and how long it waits for one.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest frame accepted before the handshake (a `Hello` is about 100 bytes).
    pub handshake_frame: usize,
    /// A new connection must send its `Hello` within this long.
    pub handshake_timeout: Duration,
    /// Connections open at once; more are refused with `Busy` (a trainer holds one per port).
    pub max_connections: usize,
    /// Connections one address may hold before their handshake completes; more are refused
    /// with `Busy`, so one peer cannot take every place while the job's trainers reconnect.
    pub max_pending_per_address: usize,
    /// TCP keepalive after this long idle (probes every third of it, three missed: the peer's
    /// host is gone); `None`: off.
    pub keepalive: Option<Duration>,
    /// Bytes the declared tables may take before any row (see `server::requests`).
    pub max_declare_bytes: u64,
    /// What to do with a push holding a NaN, an infinity or a value beyond ±1e18.
    pub nonfinite: NonFinite,
    /// Bytes the receive buffers of all connections may hold together.
    pub max_receive_bytes: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            handshake_frame: 64 << 10,
            handshake_timeout: Duration::from_secs(10),
            max_connections: 512,
            max_pending_per_address: 64,
            keepalive: Some(Duration::from_secs(30)),
            max_declare_bytes: 1 << 30,
            nonfinite: NonFinite::Fail,
            max_receive_bytes: 4 << 30,
        }
    }
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
        if let Some(s) = self.secret.as_ref().filter(|s| !s.is_master()) {
            anyhow::bail!(
                "--secret-file holds a credential ({}), not the job's master secret: a server derives every \
                 process's key from the master, so it takes the master",
                s.identity().label()
            );
        }
        anyhow::ensure!(
            self.trainers <= crate::base::layout::MAX_PEERS,
            "--trainers is {}, more than {}",
            self.trainers,
            crate::base::layout::MAX_PEERS
        );
        anyhow::ensure!(
            self.num_servers <= crate::base::layout::MAX_PEERS,
            "--num-servers is {}, more than {}",
            self.num_servers,
            crate::base::layout::MAX_PEERS
        );
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
    /// Per sparse table, what its rows went through: admitted, filtered, evicted, shrunk.
    #[serde(default)]
    pub lifecycle: Vec<crate::table::stripe::Lifecycle>,
    /// Per sparse table, bytes of its admission filter.
    #[serde(default)]
    pub filter_bytes: Vec<usize>,
    /// The server process's resident memory, bytes.
    #[serde(default)]
    pub rss_bytes: u64,
    /// Its peak resident memory so far, bytes.
    #[serde(default)]
    pub peak_rss_bytes: u64,
    /// Requests served per listening port, in port order.
    pub port_requests: Vec<u64>,
    /// Async: how many updates behind each push arrived.
    #[serde(default)]
    pub staleness: crate::observe::metrics::Staleness,
    /// Samples applied per trainer, counted where they were applied: each push once, however
    /// often it was sent (a restarted trainer's resend), none for a discarded or refused push.
    #[serde(default)]
    pub applied_samples: Vec<u64>,
    /// Samples per trainer whose push was discarded (async: too stale; or a non-finite push
    /// skipped): with `applied_samples`, every sample a trainer sent, each once.
    #[serde(default)]
    pub discarded_samples: Vec<u64>,
    /// Pushes sent again (by a restarted trainer, or after a broken connection) and answered
    /// with their first outcome instead of being applied twice.
    #[serde(default)]
    pub repeats: u64,
    /// Pushes refused for holding a NaN, an infinity or a value beyond ±1e18, per trainer.
    #[serde(default)]
    pub nonfinite: Vec<u64>,
    /// The last online day end (its pass) whose shrink the tables hold (0: none).
    #[serde(default)]
    pub day_end: u64,
}
