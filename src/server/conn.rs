//! One connection: TCP keepalive (it notices a peer whose host vanished), TLS accepted within
//! `--handshake-timeout` when configured, then one frame loop over the TCP or TLS halves alike.
//! With a secret, the challenge and response come before any other frame; then the handshake,
//! who the connection may act for, and dispatch of its requests to the handlers. Before its
//! `Hello` is accepted a connection may send one small frame within `--handshake-timeout`; after
//! it, frames up to `--max-frame-mb`.
//!
//! Who may send what (`Sender`): anyone reads (a pull that creates no row, the counters, the AUC
//! over all trainers); only a trainer of the job declares tables or pulls with row creation; only
//! trainer t pushes, commits, ends a pass, waits at a barrier or closes for t; only trainer 0 or
//! an operator saves, saves for serving or runs a day end's shrink; only an operator shrinks at
//! any other time (on a server without a secret, anyone). With a secret, the trainer a
//! connection acts for is the one its proof names, and a `Hello` naming another is refused.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use super::replies::{send, Scratch};
use super::senders::{dense_on_sparse_port, may_send, refusal};
use super::shares::Seat;
use super::waiting::Ticket;
use super::{members, push, requests, Answer, Reply, State};
use crate::base::per_address::Held;
use crate::protocol::{
    auth, read_frame, write_frame, Apply, ErrorCode, FrameBuf, ProtocolError, Request, Response, NOT_A_TRAINER,
    PROTOCOL_VERSION,
};
use crate::security::auth::Identity;

/// Serves one accepted connection until it closes.
pub(super) async fn serve_connection(
    state: Arc<State>,
    socket: TcpStream,
    port: usize,
    sparse_only: bool,
    pending: Held,
    ticket: Arc<Ticket>,
) -> Result<(), ProtocolError> {
    let mut trainer = None;
    let mut pending = Some(pending);
    let result = serve_requests(&state, socket, port, sparse_only, &mut trainer, (&mut pending, &ticket)).await;
    if let Some(t) = trainer.filter(|t| *t < state.config.trainers as u64) {
        disconnected(&state, t);
    }
    result
}

/// Serves one connection's requests; `trainer` is set once a trainer's handshake succeeds, and
/// `pending` (the connection's place among its address's connections not yet through their
/// handshake) is let go then.
async fn serve_requests(
    state: &Arc<State>,
    socket: TcpStream,
    port: usize,
    sparse_only: bool,
    trainer: &mut Option<u64>,
    pending: (&mut Option<Held>, &Ticket),
) -> Result<(), ProtocolError> {
    socket.set_nodelay(true)?;
    let limits = &state.config.limits;
    if let Some(every) = limits.keepalive {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(every)
            .with_interval((every / 3).max(std::time::Duration::from_secs(1)))
            .with_retries(3);
        socket2::SockRef::from(&socket).set_tcp_keepalive(&keepalive)?;
    }
    match &state.config.tls {
        None => {
            let (rd, wr) = socket.into_split();
            serve_frames(state, rd, wr, port, sparse_only, trainer, pending).await
        }
        Some(tls) => {
            // A peer that does not finish TLS within the handshake deadline holds nothing.
            let accept = tokio_rustls::TlsAcceptor::from(tls.clone()).accept(socket);
            let Some(accepted) = pending.1.unless_closed(tokio::time::timeout(limits.handshake_timeout, accept)).await
            else {
                return Ok(());
            };
            match accepted {
                Ok(Ok(stream)) => {
                    let (rd, wr) = tokio::io::split(stream);
                    serve_frames(state, rd, wr, port, sparse_only, trainer, pending).await
                }
                Ok(Err(e)) => Err(ProtocolError::Malformed(format!("TLS handshake failed: {e}"))),
                Err(_) => Err(ProtocolError::Malformed(format!(
                    "no TLS handshake within {:?} (--handshake-timeout)",
                    limits.handshake_timeout
                ))),
            }
        }
    }
}

/// Serves one connection's frames, over TCP or TLS: the secret's challenge, the `Hello`, then
/// requests until it closes.
async fn serve_frames<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    state: &Arc<State>,
    mut rd: R,
    mut wr: W,
    port: usize,
    sparse_only: bool,
    trainer: &mut Option<u64>,
    (pending, ticket): (&mut Option<Held>, &Ticket),
) -> Result<(), ProtocolError> {
    let mut buf = FrameBuf::budgeted(state.buffers.clone());
    let Step::Go(proven) = prove(state, &mut rd, &mut wr, &mut buf, ticket).await? else { return Ok(()) };
    // Pull replies are built in these buffers, reused so big replies never fault in fresh pages.
    let mut scratch = Scratch::default();
    let mut greeted = false;
    // Once greeted, the connection's place in its peer's share: its buffer and its replies
    // count against that share.
    let mut seat: Option<Seat> = None;
    loop {
        let Step::Go(request) = read_request(state, &mut rd, &mut wr, &mut buf, greeted, ticket).await? else {
            return Ok(());
        };
        state.counters.port_requests[port].fetch_add(1, Relaxed);
        let hello_from = if let Request::Hello(h) = &request { Some(h.trainer) } else { None };
        let peer = Peer { port, sparse_only, proven, trainer: *trainer, greeted };
        let mut reply = answer(state, request, &peer, &mut scratch).await;
        if let (Ok(_), Some(t), None) = (&reply, hello_from, &seat) {
            match state.shares.of(t).sit() {
                Ok(taken) => {
                    buf = FrameBuf::budgeted(taken.share().bytes.clone());
                    seat = Some(taken);
                }
                Err(m) => reply = Err((ErrorCode::Handshake, m)),
            }
        }
        // A refused request's frame is not kept; a large one is let go once the last frames no
        // longer need it.
        buf.shrink(reply.is_err());
        let fatal = matches!(reply, Err((ErrorCode::Handshake | ErrorCode::State | ErrorCode::Fenced, _))) && !greeted;
        greeted |= reply.is_ok();
        if greeted {
            // Through the handshake: no longer counted against the address's pending share.
            pending.take();
        }
        if let (Ok(_), Some(t), None) = (&reply, hello_from, *trainer) {
            *trainer = Some(t);
            if t < state.config.trainers as u64 {
                connected(state, t);
            }
        }
        send(state, &mut wr, reply, &mut scratch, seat.as_ref().map(Seat::share)).await?;
        if fatal {
            return Ok(());
        }
    }
}

/// Whether a connection goes on, with what a step found, or has ended (answered as it should be).
enum Step<T> {
    Go(T),
    End,
}

/// The secret's challenge and response within `--handshake-timeout`: who the connection proved
/// it is (`None` on a server without a secret: anyone), or its end when refused, too slow, or
/// closed for a newcomer.
async fn prove<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    state: &State,
    rd: &mut R,
    wr: &mut W,
    buf: &mut FrameBuf,
    ticket: &Ticket,
) -> Result<Step<Option<Identity>>, ProtocolError> {
    let Some(secret) = &state.config.secret else { return Ok(Step::Go(None)) };
    let proved = tokio::time::timeout(state.config.limits.handshake_timeout, authenticate(state, secret, rd, wr, buf));
    let Some(proved) = ticket.unless_closed(proved).await else {
        closed_for_another(wr).await?;
        return Ok(Step::End);
    };
    match proved {
        Ok(Ok(Some(identity))) => Ok(Step::Go(Some(identity))),
        // Refused (and told so, with nothing about the job) or too slow: closed.
        Ok(Ok(None)) | Err(_) => Ok(Step::End),
        Ok(Err(e)) => Err(e),
    }
}

/// The next request: before the `Hello`, one small frame within `--handshake-timeout`; after
/// it, frames up to `--max-frame-mb`. A frame that cannot be read or decoded is answered with
/// its error and ends the connection.
async fn read_request<'b, R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    state: &State,
    rd: &mut R,
    wr: &mut W,
    buf: &'b mut FrameBuf,
    greeted: bool,
    ticket: &Ticket,
) -> Result<Step<Request<'b>>, ProtocolError> {
    let limits = &state.config.limits;
    let read = if greeted {
        read_frame(rd, buf, state.config.max_frame).await
    } else {
        let first = read_frame(rd, buf, limits.handshake_frame);
        match ticket.unless_closed(tokio::time::timeout(limits.handshake_timeout, first)).await {
            None => {
                closed_for_another(wr).await?;
                return Ok(Step::End);
            }
            // Spoken: never closed for another from now on (unless it was just now).
            Some(Ok(read)) if ticket.spoke() => read,
            Some(Ok(_)) => {
                closed_for_another(wr).await?;
                return Ok(Step::End);
            }
            Some(Err(_)) => {
                return Err(ProtocolError::Malformed(format!(
                    "no handshake within {:?} (--handshake-timeout)",
                    limits.handshake_timeout
                )))
            }
        }
    };
    let kind = match read {
        Ok(auth::AUTH_HELLO) if !greeted => {
            let message = "this server has no secret (started without --secret-file): a client with one \
                           cannot check it is the job's server"
                .to_string();
            let _ = write_frame(wr, &Response::Error { code: ErrorCode::Handshake, message }.encode()).await;
            return Ok(Step::End);
        }
        Ok(kind) => kind,
        Err(ProtocolError::Closed) => return Ok(Step::End),
        Err(e @ (ProtocolError::TooLarge { .. } | ProtocolError::OverBudget { .. })) => {
            let reply = Response::Error { code: ErrorCode::TooLarge, message: e.to_string() };
            let _ = write_frame(wr, &reply.encode()).await;
            return Err(e);
        }
        Err(e) => {
            let reply = Response::Error { code: ErrorCode::Malformed, message: e.to_string() };
            let _ = write_frame(wr, &reply.encode()).await;
            return Err(e);
        }
    };
    state.counters.frame_bytes_in.fetch_add(buf.payload().len() as u64 + crate::protocol::HEADER_BYTES, Relaxed);
    match Request::decode(kind, buf.payload()) {
        Ok(r) => Ok(Step::Go(r)),
        Err(e) => {
            let reply = Response::Error { code: ErrorCode::Malformed, message: e.to_string() };
            let _ = write_frame(wr, &reply.encode()).await;
            Err(e)
        }
    }
}

/// What a connection is, as far as a request's answer depends on it.
struct Peer {
    port: usize,
    sparse_only: bool,
    /// Who it proved it is (`None`: a server without a secret).
    proven: Option<Identity>,
    /// The trainer its `Hello` named, once accepted.
    trainer: Option<u64>,
    greeted: bool,
}

/// `request`'s answer: the handshake, a refusal for who sent it or on which port, or the
/// handler's (timed for pulls and pushes).
async fn answer(state: &Arc<State>, request: Request<'_>, peer: &Peer, scratch: &mut Scratch) -> Reply {
    let (port, proven, trainer) = (peer.port, peer.proven, peer.trainer);
    match (&request, peer.greeted) {
        (Request::Hello(_), _) => handle_hello(state, &request, proven),
        (_, false) => Err((ErrorCode::State, "the first request must be Hello".to_string())),
        (r, true) if !may_send(state, trainer, proven, r) => {
            Err((ErrorCode::State, refusal(state, trainer, proven, r)))
        }
        (r, true) if peer.sparse_only && dense_on_sparse_port(r).is_some() => Err((
            ErrorCode::State,
            format!(
                "{} on port #{port}, which carries only sparse traffic (--ports_num_for_sparse)",
                dense_on_sparse_port(r).unwrap_or("dense traffic")
            ),
        )),
        _ => {
            let timed = match &request {
                Request::Pull(_) => Some(&state.telemetry.pull),
                Request::Push(_) => Some(&state.telemetry.push),
                _ => None,
            };
            let started = std::time::Instant::now();
            let reply = handle(state, request, scratch).await;
            if let Some(latency) = timed {
                latency.observe(started.elapsed());
            }
            reply
        }
    }
}

fn handle_hello(state: &State, request: &Request, proven: Option<Identity>) -> Reply {
    let Request::Hello(h) = request else { unreachable!("called for Hello only") };
    let c = &state.config;
    let refuse = |m: String| Err((ErrorCode::Handshake, m));
    if h.version != PROTOCOL_VERSION {
        return refuse(format!("protocol version {} not supported (server speaks {PROTOCOL_VERSION})", h.version));
    }
    // The trainer a connection acts for is the one it proved, never one it declares.
    let acts_for = match proven {
        Some(Identity::Trainer(t)) => Some(t),
        Some(Identity::Tool | Identity::Operator) => Some(NOT_A_TRAINER),
        Some(Identity::Master) | None => None,
    };
    if acts_for.is_some_and(|t| t != h.trainer) {
        let who = proven.map(Identity::label).unwrap_or_default();
        let named =
            if h.trainer == NOT_A_TRAINER { "no trainer".to_string() } else { format!("trainer {}", h.trainer) };
        return refuse(format!("this connection proved it is {who} and names {named}: refused"));
    }
    if h.job != c.job {
        // The server's own job id is not told: without a secret it is what a peer would need.
        return refuse(format!("job '{}' is not this server's job", h.job));
    }
    if h.epoch > c.epoch {
        // Only a successor that claimed this server's checkpoint folder stops it: a claim of an
        // epoch no restart recorded (a stray or hostile peer) is refused and changes nothing,
        // and a tool's claim is never heard.
        if recorded_epoch(state) < h.epoch || proven == Some(Identity::Tool) {
            return refuse(format!(
                "epoch {} claimed for server {}, which no restart of it recorded (it runs epoch {}): refused",
                h.epoch, c.index, c.epoch
            ));
        }
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
    // Only a trainer of the job (or the master's holder) teaches the server its place: a tool's
    // or an operator's first handshake naming another place would make every trainer's proof
    // fail, and send their operators looking at the secrets. Theirs is welcomed at the place
    // they name, which they only read through.
    let teaches = match proven {
        Some(Identity::Tool | Identity::Operator) => false,
        Some(Identity::Trainer(_) | Identity::Master) | None => true,
    };
    let claimed = (h.server_index as usize, h.num_servers as usize);
    let (index, servers) = match *place {
        Some(known) => known,
        None if !teaches => claimed,
        None => *place.insert({
            tracing::info!(
                index = h.server_index,
                servers = h.num_servers,
                "learned this server's place from a trainer"
            );
            claimed
        }),
    };
    if h.num_servers != servers as u64 || h.server_index != index as u64 {
        return refuse(format!(
            "client routes to server {} of {}, but this is server {index} of {servers}: check the server list order",
            h.server_index, h.num_servers
        ));
    }
    Ok(Answer::Response(Response::Welcome { server_index: index as u64, num_servers: servers as u64, epoch: c.epoch }))
}

/// The newest epoch of this server of this job recorded in its checkpoint folder's claim
/// (`fence.json`, written by every restart before it serves): 0 without checkpoints or a claim.
fn recorded_epoch(state: &State) -> u64 {
    let Some(policy) = &state.config.checkpoints else { return 0 };
    let folder = crate::server::shard_checkpoints::server_dir(&policy.dir, state.config.index);
    match crate::server::shard_checkpoints::Fence::read(&folder) {
        Ok(Some(fence)) if fence.job == state.config.job => fence.epoch,
        Ok(_) => 0,
        Err(e) => {
            tracing::warn!("cannot read this server's checkpoint claim: {e}");
            0
        }
    }
}

/// A connection of trainer `t` was greeted. A lost trainer that connects again within
/// `--trainer-rejoin` has rejoined. Its pending sync push, if any, stays: the restart sends the
/// same step again, which either takes its place or, once the step is applied, is answered from
/// the ledger (see [`super::sync`]), so it counts once either way.
fn connected(state: &State, t: u64) {
    *state.connections.lock().entry(t).or_default() += 1;
    let mut back = false;
    state.lost.send_if_modified(|lost| {
        back = lost.remove(&t).is_some();
        back
    });
    if back {
        tracing::warn!(trainer = t, "trainer {t} rejoined");
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

async fn handle(state: &Arc<State>, request: Request<'_>, scratch: &mut Scratch) -> Reply {
    match request {
        Request::Hello(_) => unreachable!("handled by handle_hello"),
        Request::Declare(declaration) => requests::declare(state, declaration),
        Request::Pull(pull) => requests::pull(state, pull, std::mem::take(&mut scratch.sparse)),
        // An async server merges the steps trainers mark synchronous: the warm-up, which every
        // trainer ends at the same step (see `TrainConfig::sync_warmup`), before any async push.
        // GEO pushes are added as they come, each checked in `push_async`.
        Request::Push(p) if state.config.mode == crate::protocol::Mode::Geo => push::push_async(state, p),
        Request::Push(p) if p.apply == Apply::DenseMerged => push::push_dense_merged(state, p).await,
        Request::Push(p) if state.config.mode == crate::protocol::Mode::Sync || p.apply == Apply::Merged => {
            push::push_sync(state, p).await
        }
        Request::Push(p) => push::push_async(state, p),
        Request::Commit { trainer, step } => push::commit(state, trainer, step).await,
        Request::Barrier { trainer, epoch } => members::barrier(state, trainer, epoch).await,
        Request::Save { dir } => requests::save(state, &dir).await,
        Request::EndPass { trainer, pass } => members::end_pass(state, trainer, pass),
        Request::Close { trainer } => members::close(state, trainer),
        Request::Stats => {
            Ok(Answer::Response(Response::Stats(serde_json::to_string(&state.stats()).expect("stats serialize"))))
        }
        Request::PassAuc { trainer, pass, pos, neg, sums } => members::pass_auc(state, trainer, pass, &pos, &neg, sums),
        Request::GlobalAuc { pass } => members::global_auc(state, pass),
        Request::Shrink { days, day_end } => requests::shrink(state, days, day_end).await,
        Request::Export { dir, kind } => requests::export(state, &dir, kind).await,
        Request::Changed { trainer } => requests::changed(state, trainer),
    }
}

/// The challenge and response that must open a connection to a server with a secret (see
/// [`crate::security::auth`]): `Ok(Some(identity))` once the client proved that identity of this job
/// (and was answered `Done`), `Ok(None)` once it was refused. A refusal says only that
/// authentication failed. The proofs name this server's index (so a proof relayed from another
/// server of the job fails) and its epoch.
async fn authenticate<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    state: &State,
    secret: &crate::security::auth::Secret,
    rd: &mut R,
    wr: &mut W,
    buf: &mut FrameBuf,
) -> Result<Option<Identity>, ProtocolError> {
    let refuse = |message: &str| Response::Error { code: ErrorCode::Handshake, message: message.to_string() };
    let small = 64;
    let hello = match read_frame(rd, buf, small).await {
        Ok(auth::AUTH_HELLO) => auth::parse_hello(buf.payload()),
        Ok(_) | Err(ProtocolError::TooLarge { .. }) => None,
        Err(e) => return Err(e),
    };
    let Some((client, identity, dialed)) = hello else {
        write_frame(
            wr,
            &refuse("authentication required: this job's servers take only clients with its secret").encode(),
        )
        .await?;
        return Ok(None);
    };
    // This server's own index when it knows it (a proof for another fails); else the one the
    // client dialed, which its Hello must then confirm.
    let server = state.place.lock().map_or(dialed, |(index, _)| index as u64);
    let c = &state.config;
    let claim = crate::security::auth::Claim { job: &c.job, identity, server, epoch: c.epoch };
    let ours = crate::security::auth::nonce();
    let proof = secret.server_proof(&claim, &client, &ours).expect("a server holds the master secret");
    wr.write_all(&auth::challenge(&ours, c.epoch, &proof)).await?;
    wr.flush().await?;
    let proved = match read_frame(rd, buf, small).await {
        Ok(auth::AUTH_PROOF) => secret.is_client_proof(&claim, &ours, &client, buf.payload()),
        Ok(_) | Err(ProtocolError::TooLarge { .. }) => false,
        Err(e) => return Err(e),
    };
    if !proved {
        write_frame(wr, &refuse("authentication failed").encode()).await?;
        return Ok(None);
    }
    write_frame(wr, &Response::Done.encode()).await?;
    Ok(Some(identity))
}

/// One open connection, counted against `--max-connections` until dropped.
pub(super) struct Open(Arc<State>);

impl Open {
    /// Counts a new connection, or `None` if the server has as many as it takes.
    pub(super) fn count(state: &Arc<State>) -> Option<Open> {
        let max = state.config.limits.max_connections;
        let taken = state.open.fetch_update(Relaxed, Relaxed, |n| (n < max).then_some(n + 1));
        taken.ok().map(|_| Open(state.clone()))
    }

    /// Counts a new connection over the bound, for one that another's closing makes room for.
    pub(super) fn over(state: &Arc<State>) -> Open {
        state.open.fetch_add(1, Relaxed);
        Open(state.clone())
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

/// Tells a connection closed to take a newer one why, briefly.
async fn closed_for_another<W: AsyncWrite + Unpin>(wr: &mut W) -> Result<(), ProtocolError> {
    let message = "closed to take a newer connection: every place of the server was taken (--max-connections) and \
                   this one had not sent its handshake"
        .to_string();
    let reply = Response::Error { code: ErrorCode::Busy, message };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), write_frame(wr, &reply.encode())).await;
    Ok(())
}

/// Tells a connection over a limit why it is closed (`message`, naming the flag), briefly, and
/// closes it.
pub(super) async fn refuse_busy(mut socket: TcpStream, message: String) {
    let reply = Response::Error { code: ErrorCode::Busy, message };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), write_frame(&mut socket, &reply.encode())).await;
}

/// A warning said at most once a second, with the count of the ones held back: a flood of
/// refused connections must not become a flood of log lines.
#[derive(Default)]
pub(super) struct Quiet {
    last: Option<std::time::Instant>,
    held: u64,
}

impl Quiet {
    /// Logs `message` unless one was logged less than a second ago.
    pub(super) fn warn(&mut self, message: std::fmt::Arguments) {
        let now = std::time::Instant::now();
        if self.last.is_some_and(|t| now - t < std::time::Duration::from_secs(1)) {
            self.held += 1;
            return;
        }
        tracing::warn!(held_back = self.held, "{message}");
        (self.last, self.held) = (Some(now), 0);
    }
}
