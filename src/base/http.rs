//! The HTTP listener of `oar serve` and of every process's metrics endpoint, bounded so that
//! a client cannot hold it: at most
//! `connections` connections at once (more wait in the kernel's backlog until one ends), at
//! most `per_address` of them from one address (more are answered 503 and closed, so one peer
//! cannot take every place), a request head must arrive within `read_timeout` of the
//! connection waiting for one (an idle keep-alive connection included: hyper's header timer
//! starts when it waits for a head), and a request body within `read_timeout` of its head
//! ([`read_body`]). The process counts the connections closed idle and those turned away
//! ([`counts`], in every metrics sheet).
//!
//! An answer that cannot be written within `read_timeout` ends its connection too
//! (`tokio-io-timeout`'s stream): a client that sent requests and never read the answers held
//! its place for good. A connection turned away gets its 503 in one write, is shut for writing
//! and drained for at most a second (closed with its request unread, it would be reset and the
//! answer could be lost), at most 64 at once. A request body takes room in [`Bodies`], the bytes
//! all connections' bodies may hold at once, as its bytes arrive, never for the length it
//! declares, so a promise cannot shut others out; with no room left it is answered 503 at once.
//!
//! Why not `axum::serve`: it sets no timer, so hyper's header timeout never runs, and it takes
//! every connection offered. A client that opened connections and sent nothing held each one
//! for good (measured: an idle connection still open after 70 s), and enough of them would use
//! up the process's file descriptors: on a parameter server's or a trainer's metrics port, that
//! would have starved the job itself of sockets and files.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};

use crate::base::per_address::PerAddress;

/// How much of the server one client may hold, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Connections served at once from one address.
    pub per_address: usize,
    /// Longest wait for a request's head, or for its body after the head.
    pub read_timeout: Duration,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Most request-body bytes held at once over all connections ([`Bodies`]).
    pub buffered: usize,
}

/// Serves `app` on `listener` within `limits` until `shutdown` completes (connections in
/// flight end with the runtime).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::select! {
        _ = accept_loop(listener, app, limits) => {}
        _ = shutdown => {}
    }
}

/// Connections this process's listeners closed because no request head came within their read
/// timeout.
static CLOSED_IDLE: AtomicU64 = AtomicU64::new(0);
/// Connections this process's listeners turned away because their address held its share.
static TURNED_AWAY: AtomicU64 = AtomicU64::new(0);

/// (connections closed idle, connections turned away) by this process's HTTP listeners.
pub fn counts() -> (u64, u64) {
    (CLOSED_IDLE.load(Relaxed), TURNED_AWAY.load(Relaxed))
}

/// Turned-away connections being answered at once: past these, one is closed unanswered.
const ANSWERING: usize = 64;

/// Answers a connection over its address's share with a 503 and closes it. The answer is
/// written, the connection shut for writing, and what the peer sends read and dropped until it
/// closes (at most a second): closing with its request unread would reset the connection and
/// could lose the answer. At most [`ANSWERING`] at once, so a flood of connections holds no more
/// than that many sockets; past them one is closed unanswered.
fn turn_away(stream: tokio::net::TcpStream, ip: IpAddr, most: usize, answering: &Arc<tokio::sync::Semaphore>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    TURNED_AWAY.fetch_add(1, Relaxed);
    let Ok(permit) = answering.clone().try_acquire_owned() else { return };
    let body =
        format!("{ip} has {most} connections open, the most one address may hold (--max-connections-per-address)\n");
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    tokio::spawn(async move {
        let mut stream = stream;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(answer.as_bytes()).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 4096];
            let mut left = 64 << 10;
            while left > 0 {
                match stream.read(&mut sink).await? {
                    0 => break,
                    n => left -= n.min(left),
                }
            }
            std::io::Result::Ok(())
        })
        .await;
        drop(permit);
    });
}

async fn accept_loop(listener: tokio::net::TcpListener, app: axum::Router, limits: Limits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections.max(1)));
    let open = PerAddress::new(limits.per_address);
    let answering = Arc::new(tokio::sync::Semaphore::new(ANSWERING));
    loop {
        let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        let (stream, held) = match listener.accept().await {
            Ok((stream, peer)) => match open.hold(peer.ip()) {
                Some(held) => (stream, held),
                None => {
                    turn_away(stream, peer.ip(), limits.per_address, &answering);
                    continue;
                }
            },
            Err(e) => {
                // Out of file descriptors (or another passing failure): back off instead of
                // spinning on the error, as the connections held end.
                tracing::warn!("cannot accept a connection: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        let timeout = limits.read_timeout;
        // An answer that cannot be written for `--read-timeout` ends the connection: a client
        // that sent requests and never read the answers held its place for good.
        let mut stream = tokio_io_timeout::TimeoutStream::new(stream);
        stream.set_write_timeout(Some(timeout));
        tokio::spawn(async move {
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(Box::pin(stream)), service)
                .await;
            if let Err(e) = served {
                if e.is_timeout() {
                    CLOSED_IDLE.fetch_add(1, Relaxed);
                }
                tracing::debug!("connection ended: {e}");
            }
            // The address's count first: the place freed wakes the accept loop, which counts the
            // next connection against its address at once (a share equal to the total would
            // otherwise turn away a client that waited for this very place).
            drop(held);
            drop(slot);
        });
    }
}

/// The room for request bodies over all connections: each body takes room for its bytes as
/// they arrive, and gives it back when its request is answered (or scored, if later). Without
/// it, every connection could hold a body of the largest size at once: 1,024 connections of
/// 16 MiB each, 16 GiB. Room is taken for what arrived, not for what a body declares: sixteen
/// connections declaring 16 MiB each and sending a few bytes held all 256 MiB, and every
/// other client was refused, for as long as they kept sending nothing.
pub struct Bodies {
    /// Free room, in KiB.
    room: Arc<tokio::sync::Semaphore>,
    /// All the room, in KiB.
    total: usize,
}

impl Bodies {
    /// Room for `limits.buffered` bytes.
    pub fn new(limits: &Limits) -> Bodies {
        let total = limits.buffered.div_ceil(1024).min(tokio::sync::Semaphore::MAX_PERMITS);
        Bodies { room: Arc::new(tokio::sync::Semaphore::new(total)), total }
    }

    /// Bytes reserved now.
    pub fn held(&self) -> u64 {
        (self.total - self.room.available_permits()) as u64 * 1024
    }
}

/// A request body read within the bounds, holding its share of [`Bodies`] until dropped.
pub struct Buffered {
    bytes: Bytes,
    _room: tokio::sync::OwnedSemaphorePermit,
}

impl std::ops::Deref for Buffered {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Reads a request body of at most `limits.max_body` bytes arriving within
/// `limits.read_timeout`, with room in `bodies` for each part as it arrives; else the status
/// and message to answer (413: over the limit, refused by its declared length before reading;
/// 503: no room now, refused at once rather than held waiting, with a `Retry-After`; 408: too
/// slow).
pub async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limits: &Limits,
    bodies: &Bodies,
) -> Result<Buffered, (StatusCode, String)> {
    use http_body_util::BodyExt;
    let too_large = || {
        (StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over {} bytes (--max-body-mib)", limits.max_body))
    };
    let no_room = || {
        let message = format!(
            "no room for this body among the {} MiB of request bodies the server holds at once \
             (--max-buffered-mib): try again",
            bodies.total >> 10
        );
        (StatusCode::SERVICE_UNAVAILABLE, message)
    };
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return Err(too_large());
    }
    let mut room = bodies.room.clone().try_acquire_many_owned(0).map_err(|_| no_room())?;
    // The declared length as capacity costs address space only: pages are taken as bytes land.
    let mut bytes = Vec::with_capacity(declared.unwrap_or(0) as usize);
    let read = async {
        let mut body = body;
        while let Some(frame) = body.frame().await {
            // A broken body (a chunk size that is no number, the client's stream failed) is a
            // bad request, named as such.
            let frame = frame.map_err(|e| (StatusCode::BAD_REQUEST, format!("the request body is broken: {e}")))?;
            let Ok(data) = frame.into_data() else { continue };
            let len = bytes.len() + data.len();
            if len > limits.max_body {
                return Err(too_large());
            }
            let need = u32::try_from(len.div_ceil(1024)).unwrap_or(u32::MAX);
            if need > room.num_permits() as u32 {
                let more = bodies.room.clone().try_acquire_many_owned(need - room.num_permits() as u32);
                room.merge(more.map_err(|_| no_room())?);
            }
            bytes.extend_from_slice(&data);
        }
        Ok(())
    };
    match tokio::time::timeout(limits.read_timeout, read).await {
        Ok(Ok(())) => Ok(Buffered { bytes: Bytes::from(bytes), _room: room }),
        Ok(Err(answer)) => Err(answer),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {:?} (--read-timeout)", limits.read_timeout),
        )),
    }
}
