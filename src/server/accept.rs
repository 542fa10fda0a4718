//! One port's accept loop: each connection within `--max-connections` (the oldest silent one
//! making room) and its address's `--max-pending-per-address`, served on a task of its own.

use std::sync::Arc;

use tokio::net::TcpListener;

use super::{conn, State};

/// Accepts connections on `listener` (port number `port`; `sparse_only` for a sparse-only
/// port) until the task is aborted.
pub(super) async fn accept(state: Arc<State>, port: usize, listener: TcpListener, sparse_only: bool) {
    let mut quiet = conn::Quiet::default();
    loop {
        let (socket, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of descriptors (or another passing failure): wait a little rather than
                // spin on the error, and say so once a second at most.
                quiet.warn(format_args!("accept failed: {e}"));
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let open = match conn::Open::count(&state) {
            Some(open) => Some(open),
            // Every place taken: the oldest connection that has not spoken yet makes room (a
            // moment over the bound, until it has closed).
            None if state.waiting.close_oldest() => Some(conn::Open::over(&state)),
            None => None,
        };
        let Some(open) = open else {
            let message = format!(
                "the server has {} connections open, the most it takes (--max-connections)",
                state.config.limits.max_connections
            );
            quiet.warn(format_args!("connection from {peer} refused: {message}"));
            tokio::spawn(conn::refuse_busy(socket, message));
            continue;
        };
        let Some(pending) = state.pending.hold(peer.ip()) else {
            let message = format!(
                "{} has {} connections not yet through their handshake, the most one address may hold \
                 (--max-pending-per-address)",
                peer.ip(),
                state.pending.most()
            );
            quiet.warn(format_args!("connection from {peer} refused: {message}"));
            tokio::spawn(conn::refuse_busy(socket, message));
            continue;
        };
        let state = state.clone();
        let ticket = state.waiting.enter();
        tokio::spawn(async move {
            let served = conn::serve_connection(state.clone(), socket, port, sparse_only, pending, ticket);
            if let Err(e) = served.await {
                state.broken.lock().warn(format_args!("connection from {peer} closed on error: {e}"));
            }
            drop(open);
        });
    }
}
