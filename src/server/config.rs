//! What a server is told ([`ServerConfig`], its [`Limits`]).

use crate::protocol::{Mode, NonFinite};

use std::path::PathBuf;
use std::time::Duration;

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
        anyhow::ensure!(self.mode != Mode::Local, "a server runs in sync, async or geo mode, not local");
        anyhow::ensure!(self.lag_ratio > 0.0, "--lag-ratio must be positive");
        Ok(())
    }
}
