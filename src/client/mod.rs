//! The trainer's side of the wire: one blocking TCP connection per server and port, a request
//! split by owner and sent to all servers before any reply is read (so the servers work
//! concurrently), replies reassembled in the caller's order.
//!
//! Blocking sockets rather than tokio: a trainer thread has nothing else to do while it waits,
//! and write-all-then-read-all gives the same overlap across servers without a runtime. Every
//! connect and every reply is bounded by a timeout whose error names the server and address.
//!
//! Requests take a server's general ports in turn. With sparse-only ports a pull or push is split
//! into a dense half and a sparse half, sent together: two messages, not two protocols. The
//! halves carry a `PushPart` tag; async servers apply each half on arrival (the dense half counts
//! as the update), sync servers join a trainer's halves before the step can complete, so a split
//! step trains exactly like a whole one.
//!
//! Dense traffic without copies: a push sends each server's blocks from where they lie in the
//! trainer's gradient vector (a vectored write), the server applies them from its receive buffer,
//! and a pull's reply borrows `Arc` snapshots of the blocks, which the client reads from the
//! socket straight into their places in the flat vector. `oar bench` measures push+pull at 87% of
//! a raw loopback TCP echo of the same bytes; the rest is the optimizer pass over the pushed
//! gradient.
//!
//! With recovery on (`--recover-timeout`), a server lost mid-call (a broken connection, nobody
//! listening, a `Fenced` or older-epoch answer) is reconnected until the window ends, told the
//! trainer's declaration and ended pass again, and sent only its own part of the call again
//! (`recover.rs`). The client keeps the epoch it met per server and refuses an older one, and
//! judges each push's staleness against the version that server answered (a restarted server's
//! count is lower). [`probe`] is a supervisor's heartbeat: a handshake and a `Stats` request.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use crate::base::layout::{group_by_server, DenseLayout};
use crate::persist::checkpoint::ShardEntry;
use crate::protocol::{
    read_reply_blocking, Apply, Declaration, DenseSelection, Frame, ProtocolError, Pull, Request, Response,
    RowCreation, SparseIds, ValuesArray, DEFAULT_MAX_FRAME,
};
use crate::table::TableSpec;

mod conn;
mod error;
mod geo;
mod open;
mod operate;
mod pass_auc;
mod push;
mod ready;
mod recover;

use conn::{Conn, Deadline};
pub use error::ClientError;
pub use geo::Changed;

/// Nanoseconds the process's clients spent on servers' replies once their requests were
/// written (the servers' work, the transport, reading the replies): `oar bench --roofline`
/// splits a distributed step by it. Two clock reads and one relaxed add per call.
static REPLY_NANOS: AtomicU64 = AtomicU64::new(0);

/// Seconds the process's clients have spent on replies after writing their requests, all
/// threads together.
pub fn reply_seconds() -> f64 {
    REPLY_NANOS.load(Relaxed) as f64 * 1e-9
}

/// Where the servers are and how long to wait for them.
#[derive(Clone, Debug)]
pub struct ClientConfig {
    /// Server addresses, by server index.
    pub servers: Vec<String>,
    /// Job id presented in the handshake.
    pub job: String,
    /// How long to keep trying to connect to each server.
    pub connect_timeout: Duration,
    /// How long to wait for any reply (must exceed the servers' sync/barrier timeout).
    pub reply_timeout: Duration,
    /// Consecutive ports per server from each address's port (`--ports_num`); requests are
    /// spread over them in turn.
    pub ports_num: usize,
    /// Further ports per server, after those, that carry only sparse traffic
    /// (`--ports_num_for_sparse`): with them, pulls and pushes are split into a dense half on a
    /// general port and a sparse half on a sparse port, sent together.
    pub ports_num_for_sparse: usize,
    /// This client's trainer id, told to servers in the handshake (`None` for tools).
    pub trainer: Option<u64>,
    /// With a supervisor that restarts failed servers (`oar launch --max-restarts`): how long
    /// to wait for a lost server to come back, reconnecting and sending it the unanswered
    /// request again; also how long to go on asking a server that gave up waiting for other
    /// trainers (a sync step or barrier past its `--timeout`), which may be recovering too.
    /// `None`: a lost server or such a refusal fails the call at once.
    pub recover: Option<Duration>,
    /// The job's secret, proved to each server (and each server's proof checked) before the
    /// handshake; `None` for servers without one.
    pub secret: Option<crate::security::auth::Secret>,
    /// TLS to the servers (`--tls-ca`); `None`: plain TCP.
    pub tls: Option<crate::security::tls::ClientTls>,
}

impl ClientConfig {
    /// The identity this client proves: its credential's, checked against what it acts as (its
    /// job, its trainer id or none); with the master secret, the master (which may act as any).
    pub fn identity(&self) -> Result<crate::security::auth::Identity, ClientError> {
        use crate::security::auth::Identity;
        let Some(secret) = self.secret.as_ref().filter(|s| !s.is_master()) else { return Ok(Identity::Master) };
        let identity = secret.identity();
        if let Some(job) = secret.job().filter(|j| *j != self.job) {
            return Err(ClientError::Usage(format!(
                "the credential (--secret-file) is for job '{job}', this process is of job '{}'",
                self.job
            )));
        }
        let fits = match (identity, self.trainer) {
            (Identity::Trainer(t), Some(mine)) => t == mine,
            (Identity::Tool | Identity::Operator, None) => true,
            _ => false,
        };
        if !fits {
            let me = self.trainer.map_or("a tool".to_string(), |t| format!("trainer {t}"));
            let theirs = identity.label();
            return Err(ClientError::Usage(format!(
                "the credential (--secret-file) is {theirs}'s, this process is {me}"
            )));
        }
        Ok(identity)
    }

    /// One port per server, no sparse-only ports, not a trainer (a tool: it may read, not
    /// change the model; see [`ClientConfig::as_trainer`]).
    pub fn new(servers: Vec<String>, job: &str, connect_timeout: Duration, reply_timeout: Duration) -> ClientConfig {
        ClientConfig {
            servers,
            job: job.to_string(),
            connect_timeout,
            reply_timeout,
            ports_num: 1,
            ports_num_for_sparse: 0,
            trainer: None,
            recover: None,
            secret: None,
            tls: None,
        }
    }
}

impl ClientConfig {
    /// This configuration for trainer `t` of the job: servers take pushes, declarations,
    /// saves, pass ends and closes only from a trainer's connection, and only for itself.
    pub fn as_trainer(self, t: u64) -> ClientConfig {
        ClientConfig { trainer: Some(t), ..self }
    }
}

/// Sparse ids of one table to pull.
pub struct TableIds<'a> {
    /// Table index.
    pub table: u32,
    /// Floats per row.
    pub dim: usize,
    /// Unique ids.
    pub ids: &'a [u64],
}

/// Sparse gradient sums of one table to push.
pub struct TableGrads<'a> {
    /// Table index.
    pub table: u32,
    /// Floats per row.
    pub dim: usize,
    /// Unique ids.
    pub ids: &'a [u64],
    /// Shows and clicks per id (2 floats each), for the row statistics.
    pub counts: &'a [f32],
    /// `dim` floats per id.
    pub grads: &'a [f32],
}

/// Who pushes which step: the numbers every push carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepHeader {
    /// Trainer id.
    pub trainer: usize,
    /// The trainer's step number (for messages; sync servers number steps themselves).
    pub step: u64,
    /// Pass number.
    pub pass: u32,
    /// Server version the gradients were computed from (the staleness check).
    pub base_version: u64,
    /// Samples the gradient sums cover.
    pub samples: usize,
    /// How async servers apply it.
    pub apply: Apply,
}

/// What a push reports back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PushReport {
    /// Servers that discarded the push as stale.
    pub discarded: usize,
    /// How many updates the parameters behind the push were old when it arrived (the most over
    /// servers; 0 in sync mode).
    pub staleness: u64,
}

/// Connections to every server of a job.
pub struct Client {
    /// `conns[port][server]`: the general ports first, then the sparse-only ones.
    conns: Vec<Vec<Conn>>,
    general: usize,
    turn: usize,
    layout: Option<DenseLayout>,
    order: Vec<u32>,
    starts: Vec<usize>,
    config: ClientConfig,
    /// The newest epoch met per server.
    epochs: Vec<u64>,
    /// Per server, how far its version was ahead of the lowest at the last pull: servers count
    /// their own updates, and a restarted one counts on from its checkpoint, so each push's
    /// staleness is judged against the version that server had.
    ahead: Vec<u64>,
    /// What a reconnection repeats so a restarted server knows this trainer's state: the
    /// declaration, the last pass this trainer ended, and the day ends it shrank the tables at
    /// (a server restored from a checkpoint taken before one applies it then; one that holds
    /// it answers a repeat).
    declared: Option<Declaration>,
    ended: Option<(u64, u64)>,
    day_ends: Vec<u64>,
}

impl Client {
    /// Connects to every server (retrying until `connect_timeout`) and performs the handshake.
    pub fn connect(config: &ClientConfig) -> Result<Client, ClientError> {
        if config.servers.is_empty() {
            return Err(ClientError::Usage("no servers given".into()));
        }
        if config.ports_num == 0 {
            return Err(ClientError::Usage("--ports_num must be at least 1".into()));
        }
        let n = config.servers.len();
        let mut conns = Vec::new();
        let mut epochs = vec![0; n];
        let ports = config
            .ports_num
            .checked_add(config.ports_num_for_sparse)
            .ok_or_else(|| ClientError::Usage("--ports_num + --ports_num_for_sparse is too large".into()))?;
        for port in 0..ports {
            let mut row = Vec::with_capacity(n);
            for (index, met) in epochs.iter_mut().enumerate() {
                let (conn, epoch) = open::open(config, index, port, 0, config.connect_timeout)?;
                *met = (*met).max(epoch);
                row.push(conn);
            }
            conns.push(row);
        }
        Ok(Client {
            conns,
            general: config.ports_num,
            turn: 0,
            layout: None,
            order: Vec::new(),
            starts: Vec::new(),
            config: config.clone(),
            epochs,
            ahead: vec![0; n],
            declared: None,
            ended: None,
            day_ends: Vec::new(),
        })
    }

    fn servers(&self) -> usize {
        self.conns[0].len()
    }

    /// The port (row of `conns`) for the next request: general ports in turn, or with
    /// `sparse`, sparse-only ports in turn when there are any.
    fn pick(&mut self, sparse: bool) -> usize {
        self.turn = self.turn.wrapping_add(1);
        let extra = self.conns.len() - self.general;
        if sparse && extra > 0 {
            self.general + self.turn % extra
        } else {
            self.turn % self.general
        }
    }

    fn has_sparse_ports(&self) -> bool {
        self.conns.len() > self.general
    }

    /// Sends one frame per server (all before reading, so the servers work concurrently), then
    /// hands each server's reply to `each` in server order.
    fn round<T>(
        &mut self,
        request: &Request,
        what: &'static str,
        mut each: impl FnMut(&Conn, Response) -> Result<T, ClientError>,
    ) -> Result<Vec<T>, ClientError> {
        let port = self.pick(false);
        let parts: Vec<_> = (0..self.servers()).map(|_| vec![(port, request.encode())]).collect();
        self.exchange(&parts, |conns, s| {
            let conn = &mut conns[port][s];
            let kind = conn.read()?;
            let conn = &*conn;
            each(conn, conn.reply(kind, what)?)
        })
    }

    /// Sends the same request to every server and expects `Done` from each.
    fn broadcast_done(&mut self, request: &Request, what: &'static str) -> Result<(), ClientError> {
        self.round(request, what, |conn, reply| match reply {
            Response::Done => Ok(()),
            other => Err(conn.unexpected(what, &other)),
        })?;
        Ok(())
    }

    /// Declares the model's tables on every server (creating them, or checking they match).
    pub fn declare(&mut self, spec: &TableSpec) -> Result<(), ClientError> {
        self.declare_model(spec, serde_json::Value::Null)
    }

    /// [`Client::declare`], also telling the servers what the model is (written into the
    /// manifest of the model they save when every trainer has closed).
    pub fn declare_model(&mut self, spec: &TableSpec, model: serde_json::Value) -> Result<(), ClientError> {
        self.declare_with(Declaration { spec: spec.clone(), model, calendar: Vec::new() })
    }

    /// Declares as `declaration` says (an online trainer's includes its calendar).
    pub fn declare_with(&mut self, declaration: Declaration) -> Result<(), ClientError> {
        let spec = declaration.spec.clone();
        self.declared = Some(declaration.clone());
        self.broadcast_done(&Request::Declare(declaration), "the table declaration")?;
        self.layout = Some(spec.dense.layout(self.servers()));
        Ok(())
    }

    /// Uses tables that the job's trainers declare, without declaring them: how a tool (a
    /// client that is not a trainer, which servers do not let declare) reads the model.
    pub fn attach(&mut self, spec: &TableSpec) {
        self.layout = Some(spec.dense.layout(self.servers()));
    }

    fn layout(&self) -> Result<DenseLayout, ClientError> {
        self.layout.ok_or_else(|| ClientError::Usage("declare the tables before pulling or pushing".into()))
    }

    /// Pulls the full dense vector into `dense` (if given) and the rows of `tables` into
    /// `rows[t]` (`ids.len() * dim` floats each, in the caller's id order). Returns the lowest
    /// server version seen. On an error, what `dense` and `rows` hold is unspecified: a reply's
    /// arrays are read straight into them before the whole reply is checked.
    pub fn pull(
        &mut self,
        dense: Option<&mut Vec<f32>>,
        tables: &[TableIds],
        rows: &mut [Vec<f32>],
        create: RowCreation,
    ) -> Result<u64, ClientError> {
        let layout = self.layout()?;
        if rows.len() != tables.len() {
            return Err(ClientError::Usage(format!("{} row buffers for {} tables", rows.len(), tables.len())));
        }
        let n = self.servers();
        let split = dense.is_some() && !tables.is_empty() && self.has_sparse_ports();
        let selection = if dense.is_some() { DenseSelection::All } else { DenseSelection::None };
        let mut per_server: Vec<Pull> =
            (0..n).map(|_| Pull { dense: selection, create, sparse: Vec::with_capacity(tables.len()) }).collect();
        let mut groupings = Vec::with_capacity(tables.len());
        for t in tables {
            if n == 1 {
                // The one server's part is the whole batch, sent from where it lies; its rows
                // come back in the caller's order (no grouping).
                per_server[0].sparse.push(SparseIds { table: t.table, ids: Cow::Borrowed(t.ids) });
                groupings.push(None);
            } else {
                group_by_server(t.table, t.ids, n, &mut self.order, &mut self.starts);
                for (s, pull) in per_server.iter_mut().enumerate() {
                    let part = &self.order[self.starts[s]..self.starts[s + 1]];
                    let ids = part.iter().map(|&p| t.ids[p as usize]).collect();
                    pull.sparse.push(SparseIds { table: t.table, ids: Cow::Owned(ids) });
                }
                groupings.push(Some((self.order.clone(), self.starts.clone())));
            }
            rows[groupings.len() - 1].resize(t.ids.len() * t.dim, 0.0);
        }
        // Split: the dense half on a general port, the rows on a sparse-only port, both sent
        // before either reply is read.
        let (first, second) =
            if split { (self.pick(false), Some(self.pick(true))) } else { (self.pick(dense.is_none()), None) };
        let requests: Vec<Vec<(usize, Request)>> = per_server
            .into_iter()
            .map(|pull| match second {
                Some(port) => {
                    let dense_half = Pull { dense: DenseSelection::All, create, sparse: Vec::new() };
                    let rows_half = Pull { dense: DenseSelection::None, ..pull };
                    vec![(first, Request::Pull(dense_half)), (port, Request::Pull(rows_half))]
                }
                None => vec![(first, Request::Pull(pull))],
            })
            .collect();
        let parts: Vec<Vec<(usize, Frame)>> =
            requests.iter().map(|r| r.iter().map(|(port, req)| (*port, req.encode())).collect()).collect();
        let mut dense = dense;
        if let Some(d) = dense.as_deref_mut() {
            d.resize(layout.total, 0.0);
        }
        let versions = self.exchange(&parts, |conns, s| {
            let no_tables: &[TableIds] = &[];
            let (first_tables, first_rows) =
                if second.is_some() { (no_tables, &mut [][..]) } else { (tables, &mut *rows) };
            let mut version = receive_values(
                &mut conns[first][s],
                &layout,
                dense.as_deref_mut(),
                first_tables,
                &groupings,
                first_rows,
            )?;
            if let Some(port) = second {
                let v = receive_values(&mut conns[port][s], &layout, None, tables, &groupings, rows)?;
                version = version.min(v);
            }
            Ok(version)
        })?;
        let lowest = versions.iter().copied().min().unwrap_or(0);
        for (ahead, v) in self.ahead.iter_mut().zip(&versions) {
            *ahead = v - lowest;
        }
        Ok(lowest)
    }

    /// Waits at server 0's barrier until every active trainer has reached `epoch`.
    pub fn barrier(&mut self, trainer: usize, epoch: u64) -> Result<(), ClientError> {
        self.on_first(&Request::Barrier { trainer: trainer as u64, epoch }, |conn| conn.expect_done("a barrier"))
    }

    /// Tells every server this trainer has no more steps in `pass`.
    pub fn end_pass(&mut self, trainer: usize, pass: u32) -> Result<(), ClientError> {
        self.ended = Some((trainer as u64, pass as u64));
        self.broadcast_done(&Request::EndPass { trainer: trainer as u64, pass: pass as u64 }, "an end of pass")
    }

    /// Asks every server to write its shard into `dir`; returns the shard entries by server.
    pub fn save(&mut self, dir: &str) -> Result<Vec<ShardEntry>, ClientError> {
        let request = Request::Save { dir: dir.to_string() };
        self.round(&request, "a save", |conn, reply| match reply {
            Response::Saved { file, bytes, crc32 } => Ok(ShardEntry { file, bytes, crc32 }),
            other => Err(conn.unexpected("a save", &other)),
        })
    }

    /// Tells every server this trainer is done.
    pub fn close(&mut self, trainer: usize) -> Result<(), ClientError> {
        self.broadcast_done(&Request::Close { trainer: trainer as u64 }, "a close")
    }
}

/// A supervisor's heartbeat: whether server `index` of `config.servers` (of epoch `epoch`)
/// answers a handshake and a stats request within the config's timeouts. A stopped or hung
/// process accepts the connection (the kernel does) but never answers.
pub fn probe(config: &ClientConfig, index: usize, epoch: u64) -> Result<(), ClientError> {
    let (mut conn, _) = open::open(config, index, 0, epoch, config.connect_timeout)?;
    conn.send(&Request::Stats.encode())?;
    let kind = conn.read()?;
    match conn.reply(kind, "a heartbeat")? {
        Response::Stats(_) => Ok(()),
        other => Err(conn.unexpected("a heartbeat", &other)),
    }
}

/// Reads one pull reply from `conn` (server `conn.index`): dense blocks straight into their
/// places in `dense` (when given), rows of `tables` into `rows` by the grouping positions (none:
/// straight from the socket, as they come).
/// Returns the server's version.
fn receive_values(
    conn: &mut Conn,
    layout: &DenseLayout,
    mut dense: Option<&mut Vec<f32>>,
    tables: &[TableIds],
    groupings: &[Option<(Vec<u32>, Vec<usize>)>],
    rows: &mut [Vec<f32>],
) -> Result<u64, ClientError> {
    let s = conn.index;
    let mut dense_placed = false;
    let mut rows_placed = vec![false; tables.len()];
    let kind = {
        let mut into_place =
            |r: &mut dyn std::io::Read, array: ValuesArray, floats: usize| -> Result<bool, ProtocolError> {
                match array {
                    ValuesArray::Dense => {
                        let Some(out) = dense.as_deref_mut().filter(|_| floats == layout.len_of(s)) else {
                            return Ok(false);
                        };
                        for b in layout.blocks_of(s) {
                            std::io::Read::read_exact(r, bytemuck::cast_slice_mut(&mut out[layout.block_range(b)]))?;
                        }
                        dense_placed = true;
                    }
                    // Only rows in the caller's order (no grouping), and only as many as asked.
                    ValuesArray::Rows(t) => {
                        let (Some(None), Some(out)) = (groupings.get(t), rows.get_mut(t)) else { return Ok(false) };
                        if floats != out.len() {
                            return Ok(false);
                        }
                        std::io::Read::read_exact(r, bytemuck::cast_slice_mut(&mut out[..]))?;
                        rows_placed[t] = true;
                    }
                }
                Ok(true)
            };
        let mut within = Deadline::new(&mut conn.stream, &mut conn.armed, conn.reply_timeout);
        read_reply_blocking(&mut within, &mut conn.buf, DEFAULT_MAX_FRAME, &mut into_place).map_err(|e| conn.fail(e))?
    };
    let conn = &*conn;
    let reply = conn.reply(kind, "a pull")?;
    let Response::Values { version, dense: d, sparse } = reply else {
        return Err(conn.unexpected("a pull", &reply));
    };
    if let (Some(out), false) = (dense, dense_placed) {
        scatter_dense(layout, s, &d, out).map_err(|m| conn.mismatch("a dense pull", m))?;
    }
    if sparse.len() != tables.len() {
        return Err(conn.mismatch("a pull", format!("{} tables instead of {}", sparse.len(), tables.len())));
    }
    for (t, (table, got)) in tables.iter().zip(sparse).enumerate() {
        if rows_placed[t] {
            continue;
        }
        // No grouping: the one server's rows, in the caller's order.
        let positions = groupings[t].as_ref().map(|(order, starts)| &order[starts[s]..starts[s + 1]]);
        let dim = table.dim;
        let expected = positions.map_or(table.ids.len(), <[u32]>::len) * dim;
        if got.len() != expected {
            let m = format!("{} floats instead of {expected}", got.len());
            return Err(conn.mismatch("a sparse pull", m));
        }
        let out = &mut rows[t];
        let Some(positions) = positions else {
            out.copy_from_slice(&got);
            continue;
        };
        for (k, &p) in positions.iter().enumerate() {
            let p = p as usize;
            out[p * dim..(p + 1) * dim].copy_from_slice(&got[k * dim..(k + 1) * dim]);
        }
    }
    Ok(version)
}

/// Writes `server`'s concatenated blocks `part` into their places in the flat vector `full`.
pub fn scatter_dense(layout: &DenseLayout, server: usize, part: &[f32], full: &mut [f32]) -> Result<(), String> {
    if part.len() != layout.len_of(server) || full.len() != layout.total {
        return Err(format!("dense part of {} floats, expected {}", part.len(), layout.len_of(server)));
    }
    let mut off = 0;
    for b in layout.blocks_of(server) {
        let r = layout.block_range(b);
        full[r.clone()].copy_from_slice(&part[off..off + r.len()]);
        off += r.len();
    }
    Ok(())
}
