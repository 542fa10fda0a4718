//! Opening one connection to one port of one server: connect, TLS, the secret's proof and
//! the handshake, trying again while the server answers `Busy`.

use std::time::Duration;

use super::conn::{connect_with_retry, Conn, Wire};
use super::{ClientConfig, ClientError};
use crate::protocol::{ErrorCode, FrameBuf, Hello, Request, Response, NOT_A_TRAINER, PROTOCOL_VERSION};

/// Connects to server `index`'s `port`-th port and shakes hands, telling it the newest epoch
/// of it met so far; returns the connection and the server's epoch. A server that answers
/// `Busy` (every place, or this address's share of places before the handshake, taken:
/// perhaps by a peer's silent connections, which it closes after its handshake timeout) is
/// tried again with backoff until `connect_timeout`, as one still starting is, and so is a
/// connection closed or reset before the handshake's answer (a process stopping or restarting
/// behind the address, or a Kubernetes service routing to a pod going away); after the
/// deadline, the server is unreachable, naming the last close.
pub(super) fn open(
    config: &ClientConfig,
    index: usize,
    port: usize,
    met: u64,
    connect_timeout: Duration,
) -> Result<(Conn, u64), ClientError> {
    let deadline = std::time::Instant::now() + connect_timeout;
    let (mut pause, mut closed) = (Duration::from_millis(50), 0);
    let wait = |pause: &mut Duration| {
        std::thread::sleep(*pause);
        *pause = (*pause * 2).min(Duration::from_secs(1));
    };
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match open_once(config, index, port, met, left) {
            Err(ClientError::Refused { code: ErrorCode::Busy, message, .. }) if left > pause => {
                tracing::warn!(server = index, "server busy, trying again: {message}");
                wait(&mut pause);
            }
            Err(e) if e.closed_before_answer() && left > pause => {
                tracing::warn!(
                    server = index,
                    "the connection closed before the handshake's answer ({e}); connecting again"
                );
                closed += 1;
                wait(&mut pause);
            }
            // Out of time: named with the whole deadline, and the closes before, if any.
            Err(e) if e.closed_before_answer() || matches!(e, ClientError::Unreachable { .. }) => {
                let addr = port_plus(&config.servers[index], port).map_err(ClientError::Usage)?;
                let cause = match e {
                    ClientError::Unreachable { cause, .. } => cause,
                    e => {
                        closed += 1;
                        e.to_string()
                    }
                };
                let cause = match closed {
                    0 => cause,
                    n => format!("{cause} ({n} connection(s) closed before the handshake's answer)"),
                };
                return Err(ClientError::Unreachable { index, addr, timeout: connect_timeout, cause });
            }
            done => return done,
        }
    }
}

/// One attempt of [`open`], connecting within `connect_timeout`.
fn open_once(
    config: &ClientConfig,
    index: usize,
    port: usize,
    met: u64,
    connect_timeout: Duration,
) -> Result<(Conn, u64), ClientError> {
    let addr = port_plus(&config.servers[index], port).map_err(ClientError::Usage)?;
    let tcp = connect_with_retry(index, &addr, connect_timeout)?;
    let fail = |e: std::io::Error| ClientError::Protocol { index, addr: addr.clone(), cause: e.into() };
    tcp.set_read_timeout(Some(config.reply_timeout)).map_err(fail)?;
    tcp.set_nodelay(true).map_err(fail)?;
    let stream = Wire::new(tcp, config.tls.as_ref()).map_err(fail)?;
    let (reply_timeout, armed) = (config.reply_timeout, config.reply_timeout);
    let mut conn = Conn { index, addr, stream, buf: FrameBuf::default(), reply_timeout, armed };
    if let Some(secret) = &config.secret {
        conn.authenticate(secret, &config.job, config.identity()?)?;
    }
    let hello = Hello {
        version: PROTOCOL_VERSION,
        job: config.job.clone(),
        num_servers: config.servers.len() as u64,
        server_index: index as u64,
        trainer: config.trainer.unwrap_or(NOT_A_TRAINER),
        epoch: met,
    };
    conn.send(&Request::Hello(hello).encode())?;
    let kind = conn.read()?;
    match conn.reply(kind, "the handshake")? {
        Response::Welcome { epoch, .. } if epoch < met => {
            Err(ClientError::Replaced { index, addr: conn.addr.clone(), epoch, met })
        }
        Response::Welcome { epoch, .. } => Ok((conn, epoch)),
        other => Err(conn.unexpected("the handshake", &other)),
    }
}

/// `host:port` moved `k` ports up.
fn port_plus(addr: &str, k: usize) -> Result<String, String> {
    let (host, port) = addr.rsplit_once(':').ok_or_else(|| format!("server address {addr:?} has no :port"))?;
    let port: usize = port.parse().map_err(|_| format!("server address {addr:?} has a bad port"))?;
    let moved = port + k;
    if moved > u16::MAX as usize {
        return Err(format!("server address {addr:?}: port {moved} (port + {k}) is above 65535"));
    }
    Ok(format!("{host}:{moved}"))
}
