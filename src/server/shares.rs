//! Each peer's share of what a server holds for its connections: every trainer has one, and the
//! tools and operators one together. A share holds at most an eighth of `--max-connections`
//! connections, and an eighth of `--max-receive-mb` (two of the largest frames, if that is more)
//! in request buffers and in replies not yet read. So no one credential, however hostile (a
//! tool's that sends huge frames half way, opens connections and sits on them, or pulls and
//! never reads), takes what the job's trainers need: it meets its own share's bound, named.
//! Pure bookkeeping; `conn` takes a seat for a greeted connection and charges its bytes.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use crate::protocol::{BufferBudget, NOT_A_TRAINER};

/// One peer's share.
#[derive(Debug)]
pub(super) struct Share {
    /// Who it is, for messages: "trainer 3", "the tools and operators".
    pub(super) who: String,
    /// Bytes its connections' buffers and unread replies hold (a part of the server's whole).
    pub(super) bytes: Arc<BufferBudget>,
    open: AtomicUsize,
    most_open: usize,
}

/// A greeted connection's place in its share; given back when dropped.
#[derive(Debug)]
pub(super) struct Seat(Arc<Share>);

impl Seat {
    /// The share the seat is in.
    pub(super) fn share(&self) -> &Share {
        &self.0
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Relaxed);
    }
}

impl Share {
    /// A seat for one more connection, or why there is none.
    pub(super) fn sit(self: &Arc<Share>) -> Result<Seat, String> {
        let more = |n: usize| (n < self.most_open).then_some(n + 1);
        match self.open.fetch_update(Relaxed, Relaxed, more) {
            Ok(_) => Ok(Seat(self.clone())),
            Err(n) => Err(format!(
                "{} hold {n} connections, the most one peer may (an eighth of --max-connections)",
                self.who
            )),
        }
    }
}

/// Every peer's share of one server.
#[derive(Debug)]
pub(super) struct Shares {
    trainers: Vec<Arc<Share>>,
    others: Arc<Share>,
}

impl Shares {
    /// Shares of `whole` (all connections' bytes) for a job of `trainers` trainers.
    pub(super) fn new(trainers: usize, whole: &Arc<BufferBudget>, max_connections: usize, max_frame: usize) -> Shares {
        let bytes = (whole.most() / 8).max(max_frame.saturating_mul(2)).min(whole.most());
        let most_open = (max_connections / 8).max(8);
        let share = |who: String| {
            Arc::new(Share { who, bytes: BufferBudget::part(whole, bytes), open: AtomicUsize::new(0), most_open })
        };
        Shares {
            trainers: (0..trainers).map(|t| share(format!("trainer {t}'s connections"))).collect(),
            others: share("the tools' and operators' connections".into()),
        }
    }

    /// The share of the connection whose handshake named `trainer` ([`NOT_A_TRAINER`], or any
    /// id the job does not have: the tools' and operators').
    pub(super) fn of(&self, trainer: u64) -> &Arc<Share> {
        match usize::try_from(trainer) {
            Ok(t) if trainer != NOT_A_TRAINER && t < self.trainers.len() => &self.trainers[t],
            _ => &self.others,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_bounds_its_own_connections_and_bytes_and_leaves_the_others_theirs() {
        let whole = BufferBudget::new(800);
        let shares = Shares::new(2, &whole, 64, 10);
        let tools = shares.of(NOT_A_TRAINER);
        assert!(Arc::ptr_eq(tools, shares.of(7)), "an id the job does not have is a tool's");
        let seats: Vec<Seat> = (0..8).map(|_| tools.sit().unwrap()).collect();
        let e = tools.sit().unwrap_err();
        assert!(e.starts_with("the tools' and operators' connections hold 8 connections"), "{e}");
        shares.of(1).sit().expect("trainer 1 has its own seats");
        drop(seats);
        tools.sit().expect("a seat given back is free again");
        // An eighth of the whole each, and the whole bounds them together.
        assert_eq!(tools.bytes.take(101), Err((0, 100)));
        tools.bytes.take(100).unwrap();
        shares.of(0).bytes.take(100).unwrap();
        assert_eq!(whole.held(), 200);
        tools.bytes.give(100);
        assert_eq!((whole.held(), tools.bytes.held()), (100, 0));
        // Two frames at the least, never past the whole.
        assert_eq!(Shares::new(1, &whole, 64, 300).of(0).bytes.most(), 600);
        assert_eq!(Shares::new(1, &whole, 64, 3000).of(0).bytes.most(), 800);
    }
}
