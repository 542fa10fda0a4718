//! Connections still waiting to send their first frame, oldest first, so a server with every
//! place taken can close the oldest of them to take a new connection. Without it, connections
//! that never speak, from enough addresses (each within `--max-pending-per-address`), held
//! every place, renewed each `--handshake-timeout`, and a trainer reconnecting was refused.
//! A connection that has spoken is never closed for another.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::sync::Notify;

const WAITING: u8 = 0;
const SPOKE: u8 = 1;
const CLOSED: u8 = 2;

/// The connections waiting, oldest first.
#[derive(Default)]
pub(super) struct Waiting {
    queue: Mutex<VecDeque<Weak<Ticket>>>,
}

/// One connection's place in [`Waiting`].
#[derive(Default)]
pub(super) struct Ticket {
    state: AtomicU8,
    closed: Notify,
}

impl Waiting {
    /// A new connection's ticket, at the back of the queue.
    pub(super) fn enter(&self) -> Arc<Ticket> {
        let ticket = Arc::new(Ticket::default());
        let mut queue = self.queue.lock();
        // Tickets of connections gone, or that spoke, are dropped from the front as they come:
        // the queue holds about the connections of one handshake timeout.
        while queue.front().is_some_and(|t| t.upgrade().is_none_or(|t| t.state.load(SeqCst) != WAITING)) {
            queue.pop_front();
        }
        queue.push_back(Arc::downgrade(&ticket));
        ticket
    }

    /// Closes the oldest connection still waiting for its first frame; `false` if none is.
    pub(super) fn close_oldest(&self) -> bool {
        let mut queue = self.queue.lock();
        while let Some(t) = queue.pop_front() {
            if let Some(t) = t.upgrade() {
                if t.state.compare_exchange(WAITING, CLOSED, SeqCst, SeqCst).is_ok() {
                    // A stored permit: the connection sees it even if not yet listening.
                    t.closed.notify_one();
                    return true;
                }
            }
        }
        false
    }
}

impl Ticket {
    /// The connection has sent its first frame: it is no longer closed for another. `false`
    /// if it was closed first.
    pub(super) fn spoke(&self) -> bool {
        self.state.compare_exchange(WAITING, SPOKE, SeqCst, SeqCst).is_ok() || self.state.load(SeqCst) == SPOKE
    }

    /// Completes when the connection is closed for another.
    pub(super) async fn closed(&self) {
        if self.state.load(SeqCst) != CLOSED {
            self.closed.notified().await;
        }
    }

    /// `f`, unless the connection is closed for another first (`None`).
    pub(super) async fn unless_closed<F: std::future::Future>(&self, f: F) -> Option<F::Output> {
        tokio::select! {
            biased;
            _ = self.closed() => None,
            out = f => Some(out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_waiting_connection_is_closed_and_one_that_spoke_never() {
        let waiting = Waiting::default();
        let (first, second, third) = (waiting.enter(), waiting.enter(), waiting.enter());
        assert!(first.spoke(), "the first speaks");
        assert!(waiting.close_oldest(), "the second is the oldest still waiting");
        assert_eq!(second.unless_closed(std::future::pending::<()>()).await, None);
        assert!(!second.spoke(), "closed first: it may not go on");
        drop(third);
        assert!(!waiting.close_oldest(), "the third is gone, the first spoke: none to close");
        assert!(first.spoke());
        assert_eq!(first.unless_closed(async { 7 }).await, Some(7));
        // Gone and spoken tickets leave the queue from its front.
        let fourth = waiting.enter();
        assert_eq!(waiting.queue.lock().len(), 1);
        assert!(waiting.close_oldest() && !fourth.spoke());
    }
}
