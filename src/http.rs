//! The HTTP listener of `oar serve` and of every process's metrics endpoint, bounded so that
//! a client cannot hold it: at most
//! `connections` connections at once (more wait in the kernel's backlog until one ends), a
//! request head must arrive within `read_timeout` of the connection waiting for one (an idle
//! keep-alive connection included: hyper's header timer starts when it waits for a head), and a
//! request body within `read_timeout` of its head ([`read_body`]).
//!
//! Why not `axum::serve`: it sets no timer, so hyper's header timeout never runs, and it takes
//! every connection offered. A client that opened connections and sent nothing held each one
//! for good (measured: an idle connection still open after 70 s), and enough of them would use
//! up the process's file descriptors: on a parameter server's or a trainer's metrics port, that
//! would have starved the job itself of sockets and files.

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, StatusCode};

/// How much of the server one client may hold, and for how long.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Connections served at once.
    pub connections: usize,
    /// Longest wait for a request's head, or for its body after the head.
    pub read_timeout: Duration,
    /// Largest request body, in bytes.
    pub max_body: usize,
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

async fn accept_loop(listener: tokio::net::TcpListener, app: axum::Router, limits: Limits) {
    let slots = Arc::new(tokio::sync::Semaphore::new(limits.connections.max(1)));
    loop {
        let slot = slots.clone().acquire_owned().await.expect("the semaphore is never closed");
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
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
        tokio::spawn(async move {
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!("connection ended: {e}");
            }
            drop(slot);
        });
    }
}

/// Reads a request body of at most `limits.max_body` bytes arriving within
/// `limits.read_timeout`; else the status and message to answer (413: refused by its declared
/// length before reading; 408: too slow).
pub async fn read_body(headers: &HeaderMap, body: Body, limits: &Limits) -> Result<Bytes, (StatusCode, String)> {
    let too_large = || {
        (StatusCode::PAYLOAD_TOO_LARGE, format!("the request body is over {} bytes (--max-body-mib)", limits.max_body))
    };
    let declared = headers.get(axum::http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body as u64) {
        return Err(too_large());
    }
    match tokio::time::timeout(limits.read_timeout, axum::body::to_bytes(body, limits.max_body)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        // `to_bytes` fails for a body over the limit (without a declared length) or a broken one.
        Ok(Err(_)) => Err(too_large()),
        Err(_) => Err((
            StatusCode::REQUEST_TIMEOUT,
            format!("the request body did not arrive within {:?} (--read-timeout)", limits.read_timeout),
        )),
    }
}
