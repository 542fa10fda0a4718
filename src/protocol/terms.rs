//! What servers and trainers agree on besides the frames: how a job combines pushes
//! ([`Mode`]), what a server does with a non-finite push ([`NonFinite`]), the most samples a push
//! may declare, and the counters a server reports ([`ServerStats`]). Here, below both, so that
//! neither the client nor the trainer needs the server to name them.

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
    /// GEO-SGD (Paddle's `k_steps` > 0): each trainer trains its own copy of the rows and dense
    /// blocks it touches for k steps, then sends its share of the change, which servers add.
    Geo,
}

impl std::fmt::Display for Mode {
    /// The flag spelling (`local`, `sync`, `async`, `geo`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = clap::ValueEnum::to_possible_value(self).expect("every mode is a flag value");
        f.write_str(name.get_name())
    }
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

/// Most samples one push may say it holds (a batch of 16 Mi samples): a claim beyond any batch
/// would make the samples counted wrap.
pub const MAX_SAMPLES: u64 = 1 << 24;

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
    /// Bytes of the requests this server read (frames, headers included; after the handshake),
    /// and of the replies it wrote: what crossed the network to and from it, but TCP's and TLS's own.
    #[serde(default)]
    pub frame_bytes_in: u64,
    /// See `frame_bytes_in`.
    #[serde(default)]
    pub frame_bytes_out: u64,
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
    /// Pushes refused for holding a NaN, an infinity or a value beyond ±1e18, per trainer (a
    /// skipped step once, however many copies of it come).
    #[serde(default)]
    pub nonfinite: Vec<u64>,
    /// The last online day end (its pass) whose shrink the tables hold (0: none).
    #[serde(default)]
    pub day_end: u64,
    /// Seconds spent serving pulls (reading rows, copying dense blocks), all requests.
    #[serde(default)]
    pub pull_seconds: f64,
    /// Seconds spent handling pushes (checks and the optimizers; a sync step's until it is
    /// applied), all requests.
    #[serde(default)]
    pub push_seconds: f64,
}
